//! `nrt bench`: the project's benchmark harness. Every row is measured in this run:
//! per-execution latency (median, p99), executions per second, and heap allocations per
//! execution (from the counting allocator of the `nrt` binary).
//!
//! Without a model it runs the standard rows: the spinning round-trip limit of this machine
//! (two threads ping-ponging on atomics), the device-only round trip of an empty request,
//! the near-null model synchronously (steady state, 1 and 2 cores), the async surfaces at
//! several queue depths, and first-after-switch on each surface (two models alternating).

mod compute;
mod gemm;
mod surfaces;

use crate::args::{BenchArgs, Surface};
use crate::session::{self, Res, fmt_ns, percentiles};
use compute::{CoTenant, compute_row, processes_row};
use gemm::gemm_rows;
use nrt_runtime::builtin::near_null;
use nrt_runtime::{Placement, RuntimeConfig, TensorSet};
use std::time::{Duration, Instant};
use surfaces::{
    device_only, explicit_rows, implicit_rows, noting_device_threads, pingpong, switch_rows,
    sync_rows, threads_rows,
};

/// One result row (`--json` prints each as one JSON object per line).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub model: String,
    pub surface: String,
    pub depth: usize,
    pub cores: u32,
    pub n: usize,
    pub median_ns: f64,
    pub p99_ns: f64,
    pub execs_per_s: f64,
    pub allocs_per_exec: f64,
    /// CPU time of the calling thread (the one that submits and waits) per execution, in
    /// ns (`getrusage(RUSAGE_THREAD)` around the timed window).
    pub caller_cpu_ns: f64,
    /// The calling thread's share of one vCPU during the timed window (1.0 = it never
    /// stopped running: a spinning waiter).
    pub caller_cpu_share: f64,
    pub note: String,
}

impl Row {
    fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

struct Timing {
    samples: Vec<u64>,
    elapsed: Duration,
    allocs: u64,
    /// CPU time of the calling thread in the timed window.
    cpu: Duration,
}

/// CPU time (user + system) the calling thread has used.
fn thread_cpu() -> Duration {
    // SAFETY: `getrusage` fills the zeroed struct we pass; RUSAGE_THREAD (Linux ≥ 2.6.26)
    // cannot fail with a valid pointer.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn row(model: &str, surface: &str, depth: usize, cores: u32, t: Timing, note: &str) -> Row {
    let mut s = t.samples;
    let n = s.len();
    let (median, p99) = percentiles(&mut s);
    Row {
        model: model.into(),
        surface: surface.into(),
        depth,
        cores,
        n,
        median_ns: median,
        p99_ns: p99,
        execs_per_s: n as f64 / t.elapsed.as_secs_f64().max(1e-9),
        allocs_per_exec: t.allocs as f64 / n.max(1) as f64,
        caller_cpu_ns: t.cpu.as_nanos() as f64 / n.max(1) as f64,
        caller_cpu_share: t.cpu.as_secs_f64() / t.elapsed.as_secs_f64().max(1e-9),
        note: note.into(),
    }
}

/// Times `f` (one execution per call) for `seconds` after a warm-up.
fn time_calls(seconds: f64, mut f: impl FnMut() -> Res<()>) -> Res<Timing> {
    let warm = Instant::now() + Duration::from_millis(300);
    let mut k = 0;
    while Instant::now() < warm || k < 20 {
        f()?;
        k += 1;
    }
    let mut samples = Vec::with_capacity(4 << 20);
    let a0 = crate::allocations();
    let cpu0 = thread_cpu();
    // One clock read per call: each one ends a sample and starts the next (three reads per
    // call were ~90 ns here, a tenth of a near-null execution's rate).
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let mut t = start;
    while (samples.len() < 200 || t < end) && samples.len() < samples.capacity() {
        f()?;
        let now = Instant::now();
        samples.push((now - t).as_nanos() as u64);
        t = now;
    }
    let elapsed = t - start;
    let cpu = thread_cpu() - cpu0;
    Ok(Timing {
        samples,
        elapsed,
        allocs: crate::allocations() - a0,
        cpu,
    })
}

/// The configuration every row starts from: the environment's, as for every subcommand that
/// executes (`RuntimeConfig::from_env`: the bench holds its NeuronCores in the runtime
/// directory, so `nrt ls` lists it and a core another process holds is refused naming the
/// owner; `NEURON_RT_VISIBLE_CORES` picks them; `NRT_SIM_SYNC_ON_CALLER` benches the
/// software device's policies side by side). Each row then sets the surface it measures:
/// implicit async only where a row asks for it.
fn base_config() -> Res<RuntimeConfig> {
    let mut c = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    c.async_inflight = 0;
    Ok(c)
}

/// The logical-core size to run `ncm` on: `NEURON_LOGICAL_NC_CONFIG` when set (a mismatch
/// then fails with its error, as in the real runtime), else the model's own core count (a
/// model compiled with `--cores 2` needs no flag to bench).
fn cores_for(ncm: &[u8], base: &RuntimeConfig) -> u32 {
    if std::env::var_os("NEURON_LOGICAL_NC_CONFIG").is_some() {
        return base.lnc();
    }
    nrt_model::CompiledModel::core_count(ncm)
        .unwrap_or(1)
        .max(1)
}

pub fn print_table(rows: &[Row]) {
    println!(
        "{:<22} {:<17} {:>5} {:>5} {:>12} {:>12} {:>14} {:>10} {:>12}  note",
        "model", "surface", "depth", "cores", "median", "p99", "execs/s", "allocs/ex", "caller cpu"
    );
    for r in rows {
        println!(
            "{:<22} {:<17} {:>5} {:>5} {:>12} {:>12} {:>14.0} {:>10.3} {:>12}  {}",
            r.model,
            r.surface,
            r.depth,
            r.cores,
            fmt_ns(r.median_ns),
            fmt_ns(r.p99_ns),
            r.execs_per_s,
            r.allocs_per_exec,
            fmt_ns(r.caller_cpu_ns),
            r.note
        );
    }
}

pub fn main(a: &BenchArgs) -> Res<()> {
    let seconds = a.seconds;
    let json = a.json;
    let surface = a.surface;
    let depth = a.depth;
    if a.threads > 1
        && (a.gemm
            || surface.is_some_and(|s| s != Surface::Sync)
            || (a.model.is_none() && surface.is_none()))
    {
        return Err(format!(
            "--threads {} drives the synchronous surface: use it with --surface sync or with a              model (and no other --surface)",
            a.threads
        ));
    }
    let mut rows = Vec::new();
    // Progress on stderr (drawn only on a terminal) between rows — never ticking on its own,
    // so nothing draws (or allocates) inside a row's timed window.
    let bar = indicatif::ProgressBar::new_spinner();
    let emit = |r: Row, rows: &mut Vec<Row>| {
        if json {
            println!("{}", r.json());
        }
        bar.set_message(format!(
            "{} rows; last: {} {} depth {}",
            rows.len() + 1,
            r.model,
            r.surface,
            r.depth
        ));
        rows.push(r);
    };
    if a.gemm {
        for r in gemm_rows(seconds)? {
            emit(r, &mut rows);
        }
    } else if let Some(path) = &a.model {
        if !path.ends_with(".onnx") {
            a.compile.refuse_for_compiled(path)?;
        }
        let opts = session::compile_options(&a.compile)?;
        let p = session::prepare(path, &opts)?;
        let label = std::path::Path::new(path)
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let base = base_config()?;
        let cores = cores_for(&p.ncm, &base);
        let lnc = RuntimeConfig {
            logical_nc: cores,
            ..base
        };
        match surface.unwrap_or(Surface::Sync) {
            Surface::Sync => {
                let (_d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &p.ncm, 0)?;
                let r = if a.threads > 1 {
                    threads_rows(&rt, &m, &label, cores, a.threads.into(), seconds)?
                } else {
                    sync_rows(&rt, &m, &label, cores, seconds)?
                };
                emit(r, &mut rows);
            }
            Surface::Explicit => {
                let (_d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &p.ncm, 0)?;
                emit(
                    explicit_rows(&rt, &m, &label, depth.max(1), seconds)?,
                    &mut rows,
                );
            }
            Surface::Implicit => emit(
                implicit_rows(&label, &p.ncm, cores, depth.max(1), seconds)?,
                &mut rows,
            ),
        }
    } else if let Some(s) = surface {
        let (cores, ncm) = (a.compile.cores(), near_null(a.compile.cores()));
        let lnc = RuntimeConfig {
            logical_nc: cores,
            ..base_config()?
        };
        let r = match s {
            Surface::Sync => {
                let (d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &ncm, 0)?;
                if a.threads > 1 {
                    threads_rows(&rt, &m, "near-null", cores, a.threads.into(), seconds)?
                } else {
                    noting_device_threads(&d, || sync_rows(&rt, &m, "near-null", cores, seconds))?
                }
            }
            Surface::Explicit => {
                let (d, rt) = session::runtime(Some(lnc))?;
                let m = session::load(&rt, &ncm, 0)?;
                noting_device_threads(&d, || {
                    explicit_rows(&rt, &m, "near-null", depth.max(1), seconds)
                })?
            }
            Surface::Implicit => implicit_rows("near-null", &ncm, cores, depth.max(1), seconds)?,
        };
        emit(r, &mut rows);
    } else {
        emit(
            row(
                "spin-pingpong",
                "limit",
                1,
                0,
                pingpong(seconds),
                "two threads, one cache line",
            ),
            &mut rows,
        );
        emit(
            row(
                "empty-request",
                "device-only",
                1,
                1,
                device_only(seconds)?,
                "stage + doorbell + 5 END records",
            ),
            &mut rows,
        );
        {
            let (d, rt) = session::runtime(Some(base_config()?))?;
            let m = session::load(&rt, &near_null(1), 0)?;
            emit(
                noting_device_threads(&d, || sync_rows(&rt, &m, "near-null", 1, seconds))?,
                &mut rows,
            );
            let (ins, outs, _k) = session::io_tensors(&rt, &m)?;
            let mut hi = TensorSet::new();
            let mut ho = TensorSet::new();
            let x = rt
                .allocate_tensor(Placement::Host, -1, 16, "x")
                .map_err(|e| e.to_string())?;
            let y = rt
                .allocate_tensor(Placement::Host, -1, 16, "y")
                .map_err(|e| e.to_string())?;
            hi.add("x", &x);
            ho.add("y", &y);
            let _ = (ins, outs);
            let r = noting_device_threads(&d, || {
                let t = time_calls(seconds, || {
                    rt.execute(&m, &hi, &ho).map_err(|e| e.to_string())
                })?;
                Ok(row(
                    "near-null",
                    "sync-host",
                    1,
                    1,
                    t,
                    "host tensors, cloned",
                ))
            })?;
            emit(r, &mut rows);
            for depth in [1, 2, 4, 8, 16, 32] {
                emit(
                    noting_device_threads(&d, || {
                        explicit_rows(&rt, &m, "near-null", depth, seconds)
                    })?,
                    &mut rows,
                );
            }
        }
        for surface in ["sync", "explicit", "implicit"] {
            emit(switch_rows(surface, seconds)?, &mut rows);
        }
        {
            let (_d, rt) = session::runtime(Some(RuntimeConfig {
                logical_nc: 2,
                ..base_config()?
            }))?;
            let m = session::load(&rt, &near_null(2), 0)?;
            emit(sync_rows(&rt, &m, "near-null-2c", 2, seconds)?, &mut rows);
        }
        emit(
            implicit_rows("near-null", &near_null(1), 1, 8, seconds)?,
            &mut rows,
        );
        // A busy co-tenant process for the duration of these rows: sync and explicit depth 8
        // beside the quiet figures above.
        {
            let _busy = CoTenant::start()?;
            let (d, rt) = session::runtime(Some(base_config()?))?;
            let m = session::load(&rt, &near_null(1), 0)?;
            let mut r = noting_device_threads(&d, || {
                let mut r = sync_rows(&rt, &m, "near-null", 1, seconds)?;
                r.note = "one busy-looping process beside".into();
                Ok(r)
            })?;
            r.surface = "sync-cotenant".into();
            emit(r, &mut rows);
            let mut r = noting_device_threads(&d, || {
                let mut r = explicit_rows(&rt, &m, "near-null", 8, seconds)?;
                r.note = "one busy-looping process beside".into();
                Ok(r)
            })?;
            r.surface = "explicit-cotenant".into();
            emit(r, &mut rows);
        }
        // Compute: the sample models on one core and split across two (the caller's CPU
        // share is in the note), and two processes each running one core.
        let mlp_b64 = crate::samples::mlp(64, 512, 4);
        let encoder = crate::samples::transformer_block(128, 256, 4, 1024);
        for (label, onnx) in [("mlp_b64-sample", &mlp_b64), ("encoder-sample", &encoder)] {
            for cores in [1, 2] {
                emit(compute_row(label, onnx, cores, seconds)?, &mut rows);
            }
        }
        // The encoder beside a busy co-tenant process, on one core and split across two:
        // three runnable threads on two vCPUs, where a split that cannot run in parallel must
        // not cost more than one core (the device measures and serves the pair from one
        // thread then: nrt-sim's serve_mode).
        for cores in [1, 2] {
            let _busy = CoTenant::start()?;
            let mut r = compute_row("encoder-sample", &encoder, cores, seconds)?;
            r.surface = "sync-cotenant".into();
            r.note = format!("one busy-looping process beside; {}", r.note);
            emit(r, &mut rows);
        }
        emit(
            processes_row("mlp_b64-sample", &mlp_b64, seconds)?,
            &mut rows,
        );
    }
    bar.finish_and_clear();
    if !json {
        print_table(&rows);
        if let (Some(limit), Some(sync)) = (
            rows.iter().find(|r| r.surface == "limit"),
            rows.iter()
                .find(|r| r.surface == "sync" && r.model == "near-null"),
        ) {
            println!(
                "\nsync near-null round trip / spinning pingpong limit: {:.1}x",
                sync.median_ns / limit.median_ns.max(1.0)
            );
        }
        if let (Some(sync), Some(e8)) = (
            rows.iter()
                .find(|r| r.surface == "sync" && r.model == "near-null"),
            rows.iter()
                .find(|r| r.surface == "explicit" && r.depth == 8),
        ) {
            println!(
                "explicit async depth 8 / sync throughput: {:.1}x",
                e8.execs_per_s / sync.execs_per_s.max(1.0)
            );
        }
        let find = |m: &str, s: &str, d: usize, c: u32| {
            rows.iter()
                .find(|r| r.model == m && r.surface == s && r.depth == d && r.cores == c)
        };
        for (quiet, busy, d) in [
            ("sync", "sync-cotenant", 1),
            ("explicit", "explicit-cotenant", 8),
        ] {
            if let (Some(q), Some(b)) = (
                find("near-null", quiet, d, 1),
                find("near-null", busy, d, 1),
            ) {
                println!(
                    "{busy} / quiet throughput: {:.2}x",
                    b.execs_per_s / q.execs_per_s.max(1.0)
                );
            }
        }
        for m in ["mlp_b64-sample", "encoder-sample"] {
            if let (Some(one), Some(two)) = (find(m, "sync", 1, 1), find(m, "sync", 1, 2)) {
                println!(
                    "{m}: 2 cores / 1 core latency {:.2}x; caller CPU {:.1}% / {:.1}% of a vCPU",
                    two.median_ns / one.median_ns.max(1.0),
                    one.caller_cpu_share * 100.0,
                    two.caller_cpu_share * 100.0
                );
            }
        }
        if let (Some(one), Some(two)) = (
            find("encoder-sample", "sync-cotenant", 1, 1),
            find("encoder-sample", "sync-cotenant", 1, 2),
        ) {
            println!(
                "encoder-sample beside a co-tenant: 2 cores / 1 core throughput {:.2}x, p99 {:.2}x",
                two.execs_per_s / one.execs_per_s.max(1.0),
                two.p99_ns / one.p99_ns.max(1.0)
            );
        }
        if let (Some(one), Some(p)) = (
            find("mlp_b64-sample", "sync", 1, 1),
            find("mlp_b64-sample", "processes", 1, 1),
        ) {
            println!(
                "mlp_b64-sample: 2 processes / 1 process throughput {:.2}x",
                p.execs_per_s / one.execs_per_s.max(1.0)
            );
        }
    }
    Ok(())
}
