//! The host view across processes: core ownership between `nrt` processes (refusal naming
//! the owner, SIGKILL frees the cores at once), `nrt ls --json-output` and `nrt monitor`
//! checked field by field while another process holds a loaded model, and a Prometheus
//! scrape of `/metrics` over loopback, parsed; `nrt top` driven in a pseudo-terminal;
//! `tag_filter`; `NEURON_RT_INSPECT_ENABLE` profiling a process without a code change.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run_dir(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("nrt-run")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn nrt(dir: &PathBuf) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nrt"));
    for k in [
        "NRT_SIM_FAULTS",
        "NEURON_RT_VISIBLE_CORES",
        "NEURON_RT_NUM_CORES",
        "NRT_SIM_INSTANCE",
        "NRT_SIM_DEVICES",
        "NRT_SIM_CORES_PER_DEVICE",
        "NRT_SIM_DEVICE_MEMORY",
        "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS",
        "NEURON_PROCESS_TAG",
        "NEURON_RT_INSPECT_ENABLE",
        "NEURON_RT_INSPECT_OUTPUT_DIR",
        "NEURON_RT_INSPECT_DEVICE_PROFILE",
        "NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP",
    ] {
        c.env_remove(k);
    }
    c.env("NRT_RUNTIME_DIR", dir);
    c
}

fn output(c: &mut Command) -> Output {
    c.output().expect("run nrt")
}

fn ls_json(dir: &PathBuf) -> Value {
    let o = output(nrt(dir).args(["ls", "--json-output"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("one JSON array")
}

/// Starts `nrt idle` (loads the near-null model, runs it once, sits idle) and waits until
/// it is published. The caller kills and reaps it ([`kill9`]).
#[allow(
    clippy::zombie_processes,
    reason = "returned to the caller, which reaps it"
)]
fn holder(dir: &PathBuf, extra_env: &[(&str, &str)]) -> Child {
    let mut c = nrt(dir);
    c.args(["idle", "--seconds", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let child = c.spawn().unwrap();
    let t0 = Instant::now();
    loop {
        let j = ls_json(dir);
        let up = j.as_array().unwrap().iter().any(|d| {
            d["neuron_processes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["pid"] == child.id())
        });
        if up {
            // Its one execution is done once the model is loaded and it went idle.
            std::thread::sleep(Duration::from_millis(300));
            return child;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the holder never showed up"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill9(c: &mut Child) {
    // SAFETY: signalling a child we started and have not reaped.
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    c.wait().unwrap();
}

/// Issue 47 §4 and the first-hour decision: `nrt bench` holds its cores like every
/// subcommand that executes (it ran on a held core, and `nrt ls` did not list it), and
/// configures its runtime from the environment (a two-core NCM failed with
/// `NRT_LOAD_NOT_ENOUGH_NC` even with `NEURON_LOGICAL_NC_CONFIG=2`).
#[test]
fn bench_holds_its_cores_and_takes_the_environments_configuration() {
    let dir = run_dir("bench-own");
    let mut a = holder(&dir, &[]);
    let o = output(nrt(&dir).args(["bench", "--surface", "sync", "--seconds", "0.1"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("NeuronCore 0 is in use by pid {} (", a.id())),
        "{err}"
    );
    kill9(&mut a);
    // A two-core model, benched as compiled (no flag) and with the variable set.
    let work = run_dir("bench-2c-model");
    std::fs::create_dir_all(&work).unwrap();
    let ncm = work.join("near_null_2c.ncm");
    let o = output(
        Command::new(env!("CARGO_BIN_EXE_nrt"))
            .args(["samples", "--out"])
            .arg(&work),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = output(
        nrt(&dir)
            .args(["compile", "--cores", "2", "-o"])
            .arg(&ncm)
            .arg(work.join("mlp/model.onnx")),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for env in [None, Some("2")] {
        let mut c = nrt(&dir);
        c.arg("bench")
            .arg(&ncm)
            .args(["--seconds", "0.1", "--json"]);
        if let Some(v) = env {
            c.env("NEURON_LOGICAL_NC_CONFIG", v);
        }
        let o = output(&mut c);
        assert!(
            o.status.success(),
            "NEURON_LOGICAL_NC_CONFIG={env:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let row: Value =
            serde_json::from_slice(o.stdout.split(|&b| b == b'\n').next().unwrap()).unwrap();
        assert_eq!(row["cores"], 2, "{row}");
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[test]
fn a_held_core_is_refused_naming_the_owner_and_sigkill_frees_it() {
    let dir = run_dir("own");
    let mut a = holder(&dir, &[]);
    // A second process with no NEURON_RT_VISIBLE_CORES wants every core: refused.
    let o = output(nrt(&dir).args(["idle", "--seconds", "0"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("NeuronCore 0 is in use by pid {} (", a.id()))
            && err.contains("idle --seconds 60"),
        "{err}"
    );
    // It holds both cores: none is free, and the refusal says who holds them.
    assert!(
        err.contains(&format!("no NeuronCore of the 2 is free: pid {} (", a.id()))
            && err.contains(") holds 0-1"),
        "{err}"
    );
    kill9(&mut a);
    // A holder of core 0 alone: the refusal names core 1 as free, and how to take it.
    let mut a = holder(&dir, &[("NEURON_RT_VISIBLE_CORES", "0")]);
    let o = output(nrt(&dir).args(["idle", "--seconds", "0"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("free NeuronCores: 1; NEURON_RT_VISIBLE_CORES=1 selects it"),
        "{err}"
    );
    let o = output(
        nrt(&dir)
            .args(["idle", "--seconds", "0"])
            .env("NEURON_RT_VISIBLE_CORES", "1"),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    kill9(&mut a);
    // At once: the kernel released the locks with the process.
    let o = output(nrt(&dir).args(["idle", "--seconds", "0"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The dead process's record is gone as well.
    let j = ls_json(&dir);
    assert!(
        j[0]["neuron_processes"].as_array().unwrap().is_empty(),
        "{j}"
    );
}

#[test]
fn ls_and_monitor_report_a_running_process_field_by_field() {
    let dir = run_dir("view");
    let mut a = holder(&dir, &[("NEURON_RT_VISIBLE_CORES", "1")]);
    let pid = a.id();

    // nrt ls --json-output: one array, neuron-ls's fields.
    let j = ls_json(&dir);
    let devs = j.as_array().unwrap();
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!(d["neuron_device"], 0);
    assert_eq!(d["nc_count"], 2);
    assert_eq!(d["neuroncore_ids"], serde_json::json!([0, 1]));
    assert_eq!(d["memory_size"], 16u64 << 30);
    assert!(d["bdf"].as_str().unwrap().contains(':'));
    assert!(d["connected_to"].is_null());
    assert!(d["numa_node"].is_string());
    let p = &d["neuron_processes"][0];
    assert_eq!(p["pid"], pid);
    assert_eq!(p["neuroncore_ids"], serde_json::json!([1]));
    assert!(p["command"].as_str().unwrap().contains("idle --seconds 60"));
    // Ray counts the cores by summing nc_count.
    let o = output(
        nrt(&dir)
            .args(["ls", "--json-output"])
            .env("NRT_SIM_INSTANCE", "trn1.32xlarge"),
    );
    let big: Value = serde_json::from_slice(&o.stdout).unwrap();
    let total: u64 = big
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["nc_count"].as_u64().unwrap())
        .sum();
    assert_eq!((big.as_array().unwrap().len(), total), (16, 32));
    // The table.
    let o = output(nrt(&dir).arg("ls"));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains(&pid.to_string()) && table.contains("sim"),
        "{table}"
    );

    // nrt monitor: one JSON object per line, neuron-monitor's schema.
    let o = output(nrt(&dir).args(["monitor", "--period", "0.2", "--count", "2"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    let r: Value = serde_json::from_str(lines[0]).unwrap();
    let rt = &r["neuron_runtime_data"][0];
    assert_eq!(rt["pid"], pid);
    assert_eq!(rt["error"], "");
    let es = &rt["report"]["execution_stats"];
    let sum = &es["execution_summary"];
    assert_eq!(sum["completed"], 1, "{es}");
    for k in [
        "completed_with_err",
        "completed_with_num_err",
        "timed_out",
        "incorrect_input",
        "failed_to_queue",
    ] {
        assert_eq!(sum[k], 0, "{k}");
    }
    for k in [
        "generic",
        "numerical",
        "transient",
        "model",
        "runtime",
        "hardware",
    ] {
        assert_eq!(es["error_summary"][k], 0, "{k}");
    }
    let tl = &es["latency_stats"]["total_latency"];
    for k in ["p0", "p1", "p25", "p50", "p75", "p99", "p100"] {
        assert!(tl[k].as_f64().unwrap() > 0.0, "{k}: {tl}");
    }
    let mu = &rt["report"]["memory_used"]["neuron_runtime_used_bytes"];
    assert!(mu["neuron_device"].as_u64().unwrap() > 0);
    let nc1 = &mu["usage_breakdown"]["neuroncore_memory_usage"]["1"];
    assert!(
        nc1["model_code"].as_u64().unwrap() > 0 && nc1["runtime_memory"].as_u64().unwrap() > 0,
        "{nc1}"
    );
    assert!(nc1["tensors"].as_u64().unwrap() > 0, "{nc1}");
    let cores = &rt["report"]["neuroncore_counters"]["neuroncores_in_use"];
    assert!(cores["1"]["neuroncore_utilization"].is_number(), "{cores}");
    assert!(cores.get("0").is_none());
    assert!(rt["report"]["neuron_runtime_vcpu_usage"]["vcpu_usage"]["user"].is_number());
    let sys = &r["system_data"];
    assert!(sys["memory_info"]["memory_total_bytes"].as_u64().unwrap() > 0);
    assert!(sys["vcpu_usage"]["average_usage"]["idle"].is_number());
    assert_eq!(r["instance_info"]["instance_type"], "sim");
    let hw = &r["neuron_hardware_info"];
    assert_eq!(
        (
            hw["neuron_device_count"].as_u64(),
            hw["neuroncore_per_device_count"].as_u64()
        ),
        (Some(1), Some(2))
    );
    // The second report covers one period: nothing ran in it.
    let r2: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(
        r2["neuron_runtime_data"][0]["report"]["execution_stats"]["execution_summary"]["completed"],
        0
    );

    // A config file choosing one metric group.
    let cfg = dir.join("monitor.json");
    std::fs::write(&cfg, r#"{"period": "100ms", "neuron_runtimes": [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}]}], "system_metrics": [{"type": "memory_info"}]}"#).unwrap();
    let o = output(nrt(&dir).args(["monitor", "--count", "1", "-c"]).arg(&cfg));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rep = r["neuron_runtime_data"][0]["report"].as_object().unwrap();
    assert_eq!(rep.keys().collect::<Vec<_>>(), vec!["neuroncore_counters"]);
    assert_eq!(
        r["system_data"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec!["memory_info"]
    );
    kill9(&mut a);
}

/// A sample: metric name, labels, value.
type Sample = (String, Vec<(String, String)>, f64);

/// Parses the Prometheus text exposition format (0.0.4): `# HELP`/`# TYPE` lines, then
/// `name{label="value",...} number` samples. Returns (name, labels, value) triples.
fn parse_prometheus(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut typed = std::collections::HashSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let name = it.next().unwrap().to_owned();
            let kind = it.next().unwrap();
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            typed.insert(name);
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => {
                let l = l
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels {line:?}"));
                let labels = l
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(|kv| {
                        let (k, v) = kv
                            .split_once('=')
                            .unwrap_or_else(|| panic!("bad label {kv:?}"));
                        assert!(
                            v.starts_with('"') && v.ends_with('"') && v.len() >= 2,
                            "unquoted {kv:?}"
                        );
                        (k.to_owned(), v[1..v.len() - 1].to_owned())
                    })
                    .collect();
                (n.to_owned(), labels)
            }
            None => (series.to_owned(), Vec::new()),
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "{name}"
        );
        assert!(typed.contains(&name), "{name} has no # TYPE");
        out.push((name, labels, value));
    }
    out
}

#[test]
fn prometheus_metrics_over_loopback() {
    let dir = run_dir("prom");
    let mut a = holder(&dir, &[]);
    let mut mon = nrt(&dir)
        // The first report covers everything since the holder started; the scrape comes
        // before the next period.
        .args(["monitor", "--period", "30", "--prometheus", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(mon.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let url = line
        .split("http://")
        .nth(1)
        .expect("the address")
        .trim()
        .to_owned();
    let addr = url.trim_end_matches("/metrics").to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    std::thread::sleep(Duration::from_millis(300));
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let samples = parse_prometheus(body);
    let get = |n: &str, l: &[(&str, &str)]| {
        samples
            .iter()
            .find(|(name, labels, _)| {
                name == n
                    && l.iter()
                        .all(|(k, v)| labels.iter().any(|(a, b)| a == k && b == v))
            })
            .map(|s| s.2)
    };
    assert_eq!(
        get("execution_status_total", &[("status_type", "completed")]),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        get("execution_status_total", &[("status_type", "timed_out")]),
        Some(0.0)
    );
    assert!(
        get("execution_latency_seconds", &[("percentile", "p50")]).is_some_and(|v| v > 0.0),
        "{body}"
    );
    assert!(
        get("neuroncore_utilization_ratio", &[("neuroncore", "0")]).is_some(),
        "{body}"
    );
    assert!(
        get(
            "neuron_runtime_memory_used_bytes",
            &[("memory_location", "neuron_device")]
        )
        .is_some_and(|v| v > 0.0)
    );
    assert!(get("neuron_runtime_vcpu_usage_ratio", &[("usage_type", "user")]).is_some());
    assert!(get("system_vcpu_usage_ratio", &[("usage_type", "idle")]).is_some());
    assert!(get("system_memory_used_bytes", &[]).is_some_and(|v| v > 0.0));
    assert!(get("system_memory_total_bytes", &[]).is_some_and(|v| v > 0.0));
    assert!(get("system_vcpu_count", &[]).is_some_and(|v| v >= 1.0));
    assert_eq!(get("instance_info", &[("instance_type", "sim")]), Some(1.0));
    kill9(&mut mon);
    kill9(&mut a);
}

/// Starts `cmd` on a new pseudo-terminal of `cols` × `rows` (its controlling terminal, as
/// in a shell) and returns it with the terminal's master side.
fn spawn_in_pty(mut cmd: Command, cols: u16, rows: u16) -> (Child, std::fs::File) {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (mut master, mut slave) = (0, 0);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: out-pointers to two ints; no name buffer, default termios, a valid winsize.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two fresh descriptors that we now own.
    let (master, slave) = unsafe {
        (
            std::fs::File::from_raw_fd(master),
            OwnedFd::from_raw_fd(slave),
        )
    };
    cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: only async-signal-safe calls between fork and exec: a new session whose
    // controlling terminal is the pty on stdin.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn in a pty");
    drop(cmd); // our copies of the slave side
    (child, master)
}

#[test]
fn top_in_a_pseudo_terminal_shows_the_running_model_its_pid_and_core_and_quits_on_q() {
    use std::sync::{Arc, Mutex};
    let dir = run_dir("top");
    let mut a = holder(
        &dir,
        &[
            ("NEURON_RT_VISIBLE_CORES", "1"),
            ("NEURON_PROCESS_TAG", "serve-a"),
        ],
    );
    let pid = a.id();
    let mut cmd = nrt(&dir);
    cmd.args(["top", "--period", "0.2"])
        .env("TERM", "xterm-256color");
    let (cols, rows) = (160u16, 40u16);
    let (mut top, master) = spawn_in_pty(cmd, cols, rows);
    let screen = Arc::new(Mutex::new(vt100::Parser::new(
        std::num::NonZeroU16::new(rows).unwrap(),
        std::num::NonZeroU16::new(cols).unwrap(),
        0,
    )));
    let reader = {
        let screen = screen.clone();
        let mut m = master.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            // EIO once the last slave side closes (the child exited).
            while let Ok(n) = m.read(&mut buf) {
                if n == 0 {
                    break;
                }
                screen.lock().unwrap().process(&buf[..n]);
            }
        })
    };
    let text = || screen.lock().unwrap().screen().contents();
    let line_with =
        |t: &str, needle: &str| t.lines().find(|l| l.contains(needle)).map(str::to_owned);
    let t0 = Instant::now();
    let shown = loop {
        let t = text();
        // The holder's row in the core table: its core, owner and model.
        let core = line_with(&t, "core 1 ");
        if core
            .as_deref()
            .is_some_and(|l| l.contains(&format!("pid {pid}")) && l.contains("near-null"))
            && line_with(&t, "└ near-null (id 1)").is_some()
            // Its one execution is counted (it runs right after the load).
            && line_with(&t, "vnc 0 (core 1): 1 model(s), 1 executions").is_some()
        {
            break t;
        }
        if let Ok(Some(st)) = top.try_wait() {
            panic!("nrt top exited ({st}) before showing the holder:\n{t}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "nrt top never showed pid {pid} on core 1 with near-null:\n{t}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Core 0 is free; the process row has its tag, core and command; memory by category.
    assert!(
        line_with(&shown, "core 0 ").unwrap().contains("free"),
        "{shown}"
    );
    let row = line_with(&shown, "idle --seconds 60").expect(&shown);
    assert!(
        row.contains(&pid.to_string()) && row.contains("serve-a"),
        "{row}"
    );
    for cat in [
        "tensors",
        "constants",
        "model code",
        "scratchpad",
        "runtime",
        "host tensors",
    ] {
        assert!(line_with(&shown, cat).is_some(), "{cat} missing:\n{shown}");
    }
    // q quits, restoring the terminal.
    (&master).write_all(b"q").unwrap();
    let t0 = Instant::now();
    let st = loop {
        if let Some(st) = top.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "q did not quit:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(st.success(), "{st}: {}", text());
    drop(master);
    reader.join().unwrap();
    kill9(&mut a);
    // Without a terminal it says what to use instead.
    let o = output(nrt(&dir).arg("top"));
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("needs a terminal"));
}

#[test]
fn monitor_tag_filter_selects_runtimes_by_process_tag() {
    let dir = run_dir("tag");
    let mut a = holder(
        &dir,
        &[
            ("NEURON_RT_VISIBLE_CORES", "0"),
            ("NEURON_PROCESS_TAG", "serve-a"),
        ],
    );
    let mut b = holder(&dir, &[("NEURON_RT_VISIBLE_CORES", "1")]);
    let cfg = dir.join("monitor.json");
    let run = |filter: &str| -> Value {
        std::fs::write(
            &cfg,
            format!(
                r#"{{"period": "1s", "neuron_runtimes": [{{"tag_filter": "{filter}", "metrics": [{{"type": "execution_stats"}}]}}], "system_metrics": []}}"#
            ),
        )
        .unwrap();
        let o = output(nrt(&dir).args(["monitor", "--count", "1", "-c"]).arg(&cfg));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let tags = |r: &Value| -> Vec<String> {
        r["neuron_runtime_data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["neuron_runtime_tag"].as_str().unwrap().to_owned())
            .collect()
    };
    // The tagged process reports under its tag; the other under its pid.
    let r = run(".*");
    let mut all = tags(&r);
    all.sort();
    let mut want = vec!["serve-a".to_owned(), b.id().to_string()];
    want.sort();
    assert_eq!(all, want);
    let r = run("serve-.*");
    assert_eq!(tags(&r), vec!["serve-a"]);
    let rt = &r["neuron_runtime_data"][0];
    assert_eq!(rt["pid"], a.id());
    // Only the metrics that entry asks for.
    let rep = rt["report"].as_object().unwrap();
    assert_eq!(rep.keys().collect::<Vec<_>>(), vec!["execution_stats"]);
    // Anchored: a partial match is no match.
    assert!(tags(&run("serve")).is_empty());
    // A bad expression is refused, naming it.
    std::fs::write(
        &cfg,
        r#"{"neuron_runtimes": [{"tag_filter": "serve-(", "metrics": []}]}"#,
    )
    .unwrap();
    let o = output(nrt(&dir).args(["monitor", "--count", "1", "-c"]).arg(&cfg));
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("neuron_runtimes[0].tag_filter") && err.contains("\"serve-(\""),
        "{err}"
    );
    kill9(&mut a);
    kill9(&mut b);
}

#[test]
fn inspect_from_the_environment_profiles_a_process_without_code_changes() {
    let dir = run_dir("inspect");
    let out = dir.join("profiles");
    let o = output(
        nrt(&dir)
            .args(["idle", "--seconds", "0"])
            .env("NEURON_RT_INSPECT_ENABLE", "1")
            .env("NEURON_RT_INSPECT_OUTPUT_DIR", &out),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // One process directory, one file: the model's first execution (no warm-up asked).
    let procs: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
    assert_eq!(procs.len(), 1);
    assert!(
        procs[0]
            .file_name()
            .to_string_lossy()
            .starts_with("nrt_pid_")
    );
    let files: Vec<_> = std::fs::read_dir(procs[0].path())
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(files.len(), 1);
    assert_eq!(
        files[0].file_name().to_string_lossy(),
        "model_1_near-null_vnc_0_exec_1.json"
    );
    let j: Value = serde_json::from_slice(&std::fs::read(files[0].path()).unwrap()).unwrap();
    let ev = j["traceEvents"].as_array().unwrap();
    let spans: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
    assert!(spans.iter().all(|e| e["args"]["seq"] == 1), "{j}");
    let stages: Vec<&str> = spans
        .iter()
        .filter(|e| e["cat"] == "stage")
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(stages, ["validate", "bind", "stage", "doorbell", "harvest"]);
    assert!(spans.iter().any(|e| e["cat"] == "engine"), "{j}");
    // A malformed setting fails init, naming the variable.
    let o = output(
        nrt(&dir)
            .args(["idle", "--seconds", "0"])
            .env("NEURON_RT_INSPECT_ENABLE", "1")
            .env("NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP", "-1"),
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
