//! Rows of compiled sample models: synchronously on one runtime, in two processes at once,
//! and beside a busy-looping co-tenant process.

use super::*;
use crate::session::{self, Res, fmt_ns};
use nrt_runtime::RuntimeConfig;
use std::time::Duration;

/// A busy-looping process competing for the CPUs (a co-tenant) for as long as it lives.
pub(super) struct CoTenant(std::process::Child);

impl CoTenant {
    pub(super) fn start() -> Res<CoTenant> {
        let child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start a co-tenant process (sh): {e}"))?;
        // Let it start spinning before the row is timed.
        std::thread::sleep(Duration::from_millis(100));
        Ok(CoTenant(child))
    }
}

impl Drop for CoTenant {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A sample model compiled for `cores` cores, run synchronously on a runtime of that many
/// logical cores.
pub(super) fn compute_row(label: &str, onnx: &[u8], cores: u32, seconds: f64) -> Res<Row> {
    let opts = nrt_compiler::CompileOptions {
        cores,
        ..Default::default()
    };
    let c = nrt_compiler::compile(onnx, None, &opts).map_err(|e| format!("{label}: {e}"))?;
    let (d, rt) = session::runtime(Some(RuntimeConfig {
        logical_nc: cores,
        ..base_config()?
    }))?;
    let m = session::load(&rt, &c.model.encode(), 0)?;
    let before = d.thread_cpu_times();
    let mut r = sync_rows(&rt, &m, label, cores, seconds)?;
    let after = d.thread_cpu_times();
    // Includes the warm-up executions: a share, not an exact per-execution figure.
    let per: Vec<String> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| fmt_ns((*a - *b).as_nanos() as f64 / r.n.max(1) as f64))
        .collect();
    r.note = format!(
        "sample model; caller {:.1}% of a vCPU; device threads' CPU/exec (incl. warm-up) {}",
        r.caller_cpu_share * 100.0,
        per.join(" + ")
    );
    Ok(r)
}

/// Two processes, one core each, running the same model synchronously at the same time
/// (each `nrt bench MODEL` on its own runtime, `NEURON_RT_VISIBLE_CORES` 0 and 1): their
/// aggregate throughput.
pub(super) fn processes_row(label: &str, onnx: &[u8], seconds: f64) -> Res<Row> {
    let c = nrt_compiler::compile(onnx, None, &Default::default())
        .map_err(|e| format!("{label}: {e}"))?;
    let dir = std::env::temp_dir().join(format!("nrt-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{label}.ncm"));
    std::fs::write(&path, c.model.encode()).map_err(|e| format!("{}: {e}", path.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let children = (0..2)
        .map(|core| {
            std::process::Command::new(&exe)
                .arg("bench")
                .arg(&path)
                .args(["--json", "--seconds", &seconds.to_string()])
                .env("NEURON_RT_VISIBLE_CORES", core.to_string())
                .env("NRT_RUNTIME_DIR", dir.join("run"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", exe.display()))
        })
        .collect::<Res<Vec<_>>>()?;
    let mut per = Vec::new();
    for child in children {
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let j: serde_json::Value = text
            .lines()
            .find_map(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| format!("a {label} bench process printed no row ({})", out.status))?;
        let f = |k: &str| j.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        per.push((f("execs_per_s"), f("median_ns"), f("p99_ns"), f("n")));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let total: f64 = per.iter().map(|p| p.0).sum();
    Ok(Row {
        model: label.into(),
        surface: "processes".into(),
        depth: 1,
        cores: 1,
        n: per.iter().map(|p| p.3 as usize).sum(),
        median_ns: per.iter().map(|p| p.1).fold(0.0, f64::max),
        p99_ns: per.iter().map(|p| p.2).fold(0.0, f64::max),
        execs_per_s: total,
        allocs_per_exec: 0.0,
        caller_cpu_ns: 0.0,
        caller_cpu_share: 0.0,
        note: format!(
            "2 processes x 1 core, aggregate ({:.0} + {:.0} execs/s); median/p99: the slower",
            per[0].0, per[1].0
        ),
    })
}
