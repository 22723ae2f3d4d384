//! `nrt ls` and `nrt monitor`: the host view in the formats of `neuron-ls` and
//! `neuron-monitor` (and Prometheus), read from the records the runtimes publish in the
//! runtime directory (`NRT_RUNTIME_DIR`, see `nrt_runtime::host`).

use crate::args::{LsArgs, MonitorArgs};
use crate::procfs::{self, meminfo, proc_cpu};
use crate::session::Res;
use nrt_runtime::host::{self, ERROR_CLASS_NAMES, ProcessRecord, STATUS_NAMES, VcoreSnapshot};
use nrt_sim::HostShape;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn shape() -> Res<HostShape> {
    HostShape::from_env().map_err(|e| e.to_string())
}

/// The device family of an instance type (`neuron_hardware_info`).
fn device_type(h: &HostShape) -> (&'static str, &'static str, &'static str) {
    match h.instance_type.split('.').next().unwrap_or("") {
        "inf2" => ("inferentia2", "v3", "v2"),
        "trn1" | "trn1n" => ("trainium", "v3", "v2"),
        "trn2" => ("trainium2", "v4", "v3"),
        _ => ("nrt-sim", "v3", "v2"),
    }
}

fn bdf(d: u32) -> String {
    format!("{:02x}:{:02x}.0", d / 32, 0x10 + d % 32)
}

fn neighbours(h: &HostShape, d: u32) -> Value {
    match h.devices {
        1 => Value::Null,
        2 => json!([1 - d]),
        n => json!([(d + n - 1) % n, (d + 1) % n]),
    }
}

/// The `neuron-ls --json-output` array.
pub fn ls_json(h: &HostShape, recs: &[ProcessRecord]) -> Value {
    let cpd = h.cores_per_device;
    let devices: Vec<Value> = (0..h.devices)
        .map(|d| {
            let ids: Vec<u32> = (d * cpd..(d + 1) * cpd).collect();
            let procs: Vec<Value> = recs
                .iter()
                .filter_map(|r| {
                    let mine: Vec<u32> = r
                        .cores
                        .iter()
                        .copied()
                        .filter(|c| ids.contains(c))
                        .collect();
                    (!mine.is_empty()).then(|| {
                        json!({
                            "pid": r.pid,
                            "command": r.cmdline,
                            "neuroncore_ids": mine,
                            "neuron_runtime_version": env!("CARGO_PKG_VERSION"),
                        })
                    })
                })
                .collect();
            json!({
                "neuron_device": d,
                "bdf": bdf(d),
                "connected_to": neighbours(h, d),
                "nc_count": cpd,
                "neuroncore_ids": ids,
                "memory_size": h.device_memory,
                "numa_node": "-1",
                "neuron_processes": procs,
            })
        })
        .collect();
    Value::Array(devices)
}

/// The records of the runtimes in `dir`. A file named like a record that is not a usable one
/// (a link, a FIFO, the wrong size, values that do not add up) is named on stderr, once per
/// process; so is a directory a runtime would refuse (its records may be forged).
pub fn records(dir: &std::path::Path) -> Vec<ProcessRecord> {
    use std::collections::HashSet;
    use std::sync::Mutex;
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let Ok(d) = host::RuntimeDir::open_for_reading(dir) else {
        return Vec::new();
    };
    let scan = host::read_records_in(&d);
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    let said = said.get_or_insert_with(HashSet::new);
    if let Err(why) = d.check()
        && said.insert(String::new())
    {
        eprintln!(
            "nrt: warning: a runtime would refuse the runtime directory {} ({why}); what its records say may be forged",
            dir.display()
        );
    }
    for (name, why) in &scan.skipped {
        if said.insert(name.clone()) {
            eprintln!("nrt: skipping {}: {why}", dir.join(name).display());
        }
    }
    scan.records.into_iter().map(|(_, r)| r).collect()
}

/// `nrt ls`.
pub fn ls(a: &LsArgs) -> Res<()> {
    let h = shape()?;
    let recs = records(&host::runtime_dir_from_env());
    let j = ls_json(&h, &recs);
    if a.json_output {
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    let (ty, _, _) = device_type(&h);
    println!("instance-type: {} ({ty})", h.instance_type);
    println!(
        "{:>6} {:>5} {:>8} {:>10} {:>8} {:>8}  COMMAND",
        "DEVICE", "CORES", "MEMORY", "CONNECTED", "BDF", "PID"
    );
    for d in j.as_array().into_iter().flatten() {
        let conn = match &d["connected_to"] {
            Value::Array(v) => v
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(","),
            _ => "-".into(),
        };
        let procs = d["neuron_processes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let first = procs.first();
        println!(
            "{:>6} {:>5} {:>7}G {:>10} {:>8} {:>8}  {}",
            d["neuron_device"].to_string(),
            d["nc_count"].to_string(),
            d["memory_size"].as_u64().unwrap_or(0) >> 30,
            conn,
            d["bdf"].as_str().unwrap_or(""),
            first.map_or("-".into(), |p| p["pid"].to_string()),
            first.map_or(String::new(), |p| format!(
                "{} (cores {})",
                p["command"].as_str().unwrap_or(""),
                p["neuroncore_ids"]
            )),
        );
        for p in procs.iter().skip(1) {
            println!(
                "{:>6} {:>5} {:>8} {:>10} {:>8} {:>8}  {} (cores {})",
                "",
                "",
                "",
                "",
                "",
                p["pid"].to_string(),
                p["command"].as_str().unwrap_or(""),
                p["neuroncore_ids"]
            );
        }
    }
    Ok(())
}

//===------------------------------------------------------------------------------------===//
// monitor
//===------------------------------------------------------------------------------------===//

/// What the config file (`-c`) selects.
struct MonitorConfig {
    period: Duration,
    /// `neuron_runtimes`: a runtime is reported with the metrics of the first entry whose
    /// `tag_filter` (a regular expression; none = every runtime) matches its tag, and not at
    /// all when none matches.
    runtimes: Vec<(Option<regex::Regex>, Vec<String>)>,
    system_metrics: Vec<String>,
}

impl MonitorConfig {
    fn metrics_for(&self, tag: &str) -> Option<&[String]> {
        self.runtimes
            .iter()
            .find(|(f, _)| f.as_ref().is_none_or(|re| re.is_match(tag)))
            .map(|(_, m)| &m[..])
    }
}

/// The tag a runtime is reported under (`neuron_runtime_tag`): its `NEURON_PROCESS_TAG`, or
/// its pid when it has none.
fn runtime_tag(r: &ProcessRecord) -> String {
    if r.tag.is_empty() {
        r.pid.to_string()
    } else {
        r.tag.clone()
    }
}

const RUNTIME_METRICS: [&str; 4] = [
    "neuroncore_counters",
    "execution_stats",
    "memory_used",
    "neuron_runtime_vcpu_usage",
];
const SYSTEM_METRICS: [&str; 3] = ["vcpu_usage", "memory_info", "neuron_hw_counters"];

fn parse_period(s: &str) -> Res<Duration> {
    let t = s.trim();
    let (num, mul) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1.0)
    } else if let Some(v) = t.strip_suffix('m') {
        (v, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("period {} is not a duration (e.g. 5s, 500ms)", excerpt(s)))?;
    if !(0.01..=86400.0).contains(&(v * mul)) {
        return Err(format!(
            "period {} is out of range (10ms to 1 day)",
            excerpt(s)
        ));
    }
    Ok(Duration::from_secs_f64(v * mul))
}

/// The largest monitor config file read (neuron-monitor's are a few hundred bytes).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A config file's text: at most [`MAX_CONFIG_BYTES`], UTF-8.
fn read_config_text(path: &std::path::Path) -> Res<String> {
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!(
            "{}: a monitor config is at most {} bytes",
            path.display(),
            MAX_CONFIG_BYTES
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("{}: not UTF-8 text", path.display()))
}

/// What kind of JSON value `v` is, for errors.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// At most 80 characters of `s` (errors never echo a whole hostile value).
fn excerpt(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{:?}... ({} bytes)", &s[..i], s.len()),
        None => format!("{s:?}"),
    }
}

fn load_config(a: &MonitorArgs) -> Res<MonitorConfig> {
    let mut c = MonitorConfig {
        period: Duration::from_secs(5),
        runtimes: vec![(
            None,
            RUNTIME_METRICS.iter().map(|s| s.to_string()).collect(),
        )],
        system_metrics: SYSTEM_METRICS.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(path) = &a.config {
        let at = |field: &str, why: String| format!("{} ({field}): {why}", path.display());
        let text = read_config_text(path)?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let Value::Object(top) = &v else {
            return Err(at(
                "the file",
                format!("must be a JSON object, not {}", kind(&v)),
            ));
        };
        if let Some(p) = top.get("period") {
            let Value::String(p) = p else {
                return Err(at(
                    "period",
                    format!("must be a string such as \"5s\", not {}", kind(p)),
                ));
            };
            c.period = parse_period(p).map_err(|e| at("period", e))?;
        }
        // A list of `{"type": NAME}` objects.
        let types = |field: &str, x: &Value| -> Res<Vec<String>> {
            let Value::Array(items) = x else {
                return Err(at(
                    field,
                    format!(
                        "must be a list of {{\"type\": ...}} objects, not {}",
                        kind(x)
                    ),
                ));
            };
            items
                .iter()
                .enumerate()
                .map(|(i, m)| match m.get("type") {
                    Some(Value::String(t)) => Ok(t.clone()),
                    _ => Err(at(
                        &format!("{field}[{i}]"),
                        format!(
                            "must be an object with a string \"type\", not {}",
                            excerpt(&m.to_string())
                        ),
                    )),
                })
                .collect()
        };
        if let Some(rts) = top.get("neuron_runtimes") {
            let Value::Array(rts) = rts else {
                return Err(at(
                    "neuron_runtimes",
                    format!("must be a list, not {}", kind(rts)),
                ));
            };
            c.runtimes.clear();
            for (i, r) in rts.iter().enumerate() {
                let field = format!("neuron_runtimes[{i}]");
                if !r.is_object() {
                    return Err(at(&field, format!("must be an object, not {}", kind(r))));
                }
                let filter = match r.get("tag_filter") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(f)) => {
                        // Anchored, as neuron-monitor matches the whole tag.
                        Some(regex::Regex::new(&format!("^(?:{f})$")).map_err(|e| {
                            at(
                                &format!("{field}.tag_filter"),
                                format!("{}: {}", excerpt(f), excerpt(&e.to_string())),
                            )
                        })?)
                    }
                    Some(other) => {
                        return Err(at(
                            &format!("{field}.tag_filter"),
                            format!(
                                "must be a string (a regular expression), not {}",
                                kind(other)
                            ),
                        ));
                    }
                };
                let metrics = match r.get("metrics") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(m) => types(&format!("{field}.metrics"), m)?,
                };
                c.runtimes.push((filter, metrics));
            }
        }
        if let Some(s) = top.get("system_metrics") {
            c.system_metrics = types("system_metrics", s)?;
        }
    }
    if let Some(p) = a.period {
        if !(0.01..=86400.0).contains(&p) {
            return Err(format!("--period {p} is out of range (0.01 to 86400 s)"));
        }
        c.period = Duration::from_secs_f64(p);
    }
    Ok(c)
}

fn vcpus() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// What the previous period saw, for the deltas.
#[derive(Default)]
struct Prev {
    recs: HashMap<(u32, u64), Vec<VcoreSnapshot>>,
    cpu: HashMap<(u32, u64), (u64, u64)>,
    sys: Option<procfs::CpuTimes>,
}

fn sub(a: &[u64], b: Option<&[u64]>) -> Vec<u64> {
    a.iter()
        .enumerate()
        .map(|(i, x)| x.saturating_sub(b.and_then(|b| b.get(i)).copied().unwrap_or(0)))
        .collect()
}

fn latency_json(hist: &[u64]) -> Value {
    let mut m = serde_json::Map::new();
    for (k, p) in [
        ("p0", 0.0),
        ("p1", 1.0),
        ("p25", 25.0),
        ("p50", 50.0),
        ("p75", 75.0),
        ("p99", 99.0),
        ("p100", 100.0),
    ] {
        m.insert(
            k.into(),
            host::percentile(hist, p).map_or(Value::Null, |ns| json!(ns * 1e-9)),
        );
    }
    Value::Object(m)
}

/// One period's report for one runtime.
fn runtime_report(r: &ProcessRecord, prev: &mut Prev, period: f64, want: &[String]) -> Value {
    let key = (r.pid, r.start_unix_ns);
    let before = prev.recs.get(&key);
    let mut status = [0u64; 6];
    let mut errors = [0u64; 6];
    let mut lat_t = vec![0u64; host::HIST_BUCKETS];
    let mut lat_d = vec![0u64; host::HIST_BUCKETS];
    let mut cores = serde_json::Map::new();
    let mut mem_cores = serde_json::Map::new();
    let mut device_bytes = 0u64;
    let mut host_bytes = 0u64;
    for (i, v) in r.vcores.iter().enumerate() {
        let b = before.and_then(|b| b.get(i));
        for (k, d) in sub(&v.status, b.map(|b| &b.status[..])).iter().enumerate() {
            status[k] += d;
        }
        for (k, d) in sub(&v.errors, b.map(|b| &b.errors[..])).iter().enumerate() {
            errors[k] += d;
        }
        for (k, d) in sub(&v.lat_total, b.map(|b| &b.lat_total[..]))
            .iter()
            .enumerate()
        {
            lat_t[k] += d;
        }
        for (k, d) in sub(&v.lat_device, b.map(|b| &b.lat_device[..]))
            .iter()
            .enumerate()
        {
            lat_d[k] += d;
        }
        let busy = v.busy_ns.saturating_sub(b.map_or(0, |b| b.busy_ns)) as f64 * 1e-9;
        let util = (100.0 * busy / period).clamp(0.0, 100.0);
        for c in v.first_core..v.first_core + v.cores.max(1) {
            let mut entry = json!({"neuroncore_utilization": util, "flops": 0});
            if v.cores > 1 {
                // Not in neuron-monitor's format (the hardware's cores always compute on
                // their own): how the software device serves this lockstep group now.
                entry["lockstep_serving"] = json!(if v.lockstep_serving & 1 != 0 {
                    "joint"
                } else {
                    "parallel"
                });
                entry["lockstep_serving_changes"] = json!(v.lockstep_serving >> 1);
            }
            cores.insert(c.to_string(), entry);
        }
        let m = &v.mem;
        device_bytes += m[..5].iter().sum::<u64>();
        host_bytes += m[host::mem::HOST_TENSORS];
        mem_cores.insert(
            v.first_core.to_string(),
            json!({
                "constants": m[host::mem::CONSTANTS],
                "model_code": m[host::mem::MODEL_CODE],
                "model_shared_scratchpad": m[host::mem::SCRATCHPAD],
                "runtime_memory": m[host::mem::RUNTIME],
                "tensors": m[host::mem::TENSORS],
            }),
        );
    }
    prev.recs.insert(key, r.vcores.clone());
    let (cu, cs) = proc_cpu(r.pid).unwrap_or((0, 0));
    let (pu, ps) = prev.cpu.insert(key, (cu, cs)).unwrap_or((cu, cs));
    let tck = clk_tck();
    let vcpu = |now: u64, was: u64| {
        (100.0 * now.saturating_sub(was) as f64 / tck / period / vcpus() as f64).clamp(0.0, 100.0)
    };
    let mut report = serde_json::Map::new();
    let named = |names: &[&str], v: &[u64]| -> Value {
        Value::Object(
            names
                .iter()
                .zip(v)
                .map(|(n, x)| ((*n).to_owned(), json!(x)))
                .collect(),
        )
    };
    for w in want {
        let v = match w.as_str() {
            "execution_stats" => json!({
                "period": period,
                "error_summary": named(&ERROR_CLASS_NAMES, &errors),
                "execution_summary": named(&STATUS_NAMES, &status),
                "latency_stats": {
                    "total_latency": latency_json(&lat_t),
                    "device_latency": latency_json(&lat_d),
                },
                "error": "",
            }),
            "memory_used" => json!({
                "period": period,
                "neuron_runtime_used_bytes": {
                    "host": host_bytes,
                    "neuron_device": device_bytes,
                    "usage_breakdown": {
                        "host": {"application_memory": 0, "constants": 0, "dma_buffers": 0, "tensors": host_bytes},
                        "neuroncore_memory_usage": mem_cores,
                    },
                },
                "loaded_models": r.vcores.iter().map(|v| json!({"neuroncore": v.first_core, "models": v.models})).collect::<Vec<_>>(),
                "error": "",
            }),
            "neuroncore_counters" => json!({
                "period": period,
                "neuroncores_in_use": cores,
                "error": "",
            }),
            "neuron_runtime_vcpu_usage" => json!({
                "period": period,
                "vcpu_usage": {"user": vcpu(cu, pu), "system": vcpu(cs, ps)},
                "error": "",
            }),
            _ => continue,
        };
        report.insert(w.clone(), v);
    }
    json!({
        "pid": r.pid,
        "neuron_runtime_tag": runtime_tag(r),
        "command": r.cmdline,
        "error": "",
        "report": report,
    })
}

fn system_report(h: &HostShape, prev: &mut Prev, period: f64, want: &[String]) -> Value {
    let mut out = serde_json::Map::new();
    for w in want {
        let v = match w.as_str() {
            "vcpu_usage" => {
                let now = procfs::cpu_times();
                let was = prev.sys.replace(now.clone()).unwrap_or_default();
                procfs::vcpu_usage_json(&now, &was, period)
            }
            "memory_info" => {
                let (t, u, st, su) = meminfo();
                json!({
                    "period": period,
                    "memory_total_bytes": t,
                    "memory_used_bytes": u,
                    "swap_total_bytes": st,
                    "swap_used_bytes": su,
                    "error": "",
                })
            }
            "neuron_hw_counters" => json!({
                "period": period,
                "neuron_devices": (0..h.devices).map(|d| json!({
                    "neuron_device_index": d,
                    "mem_ecc_corrected": 0, "mem_ecc_uncorrected": 0,
                    "sram_ecc_corrected": 0, "sram_ecc_uncorrected": 0,
                })).collect::<Vec<_>>(),
                "error": "",
            }),
            _ => continue,
        };
        out.insert(w.clone(), v);
    }
    Value::Object(out)
}

/// One monitor report (one line of `nrt monitor`).
fn report(h: &HostShape, prev: &mut Prev, period: f64, c: &MonitorConfig) -> Value {
    let recs = records(&host::runtime_dir_from_env());
    let (ty, ver, ncver) = device_type(h);
    json!({
        "neuron_runtime_data": recs
            .iter()
            .filter_map(|r| Some(runtime_report(r, prev, period, c.metrics_for(&runtime_tag(r))?)))
            .collect::<Vec<_>>(),
        "system_data": system_report(h, prev, period, &c.system_metrics),
        "instance_info": {
            "instance_name": "",
            "instance_id": "",
            "instance_type": h.instance_type,
            "instance_availability_zone": "",
            "instance_availability_zone_id": "",
            "instance_region": "",
            "ami_id": "",
            "subnet_id": "",
            "error": "",
        },
        "neuron_hardware_info": {
            "neuron_device_type": ty,
            "neuron_device_version": ver,
            "neuroncore_version": ncver,
            "neuron_device_count": h.devices,
            "neuroncore_per_device_count": h.cores_per_device,
            "logical_neuroncore_config": 1,
            "error": "",
        },
    })
}

/// The Prometheus text exposition of a report, with the metric names of the public Neuron
/// Grafana dashboard.
pub fn prometheus_text(r: &Value, totals: &[u64; 6], errors: &[u64; 6]) -> String {
    let mut s = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, rows: Vec<(String, f64)>| {
        s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            if labels.is_empty() {
                s.push_str(&format!("{name} {v}\n"));
            } else {
                s.push_str(&format!("{name}{{{labels}}} {v}\n"));
            }
        }
    };
    let it = &r["instance_info"]["instance_type"];
    metric(
        "instance_info",
        "gauge",
        "The instance (value 1).",
        vec![(format!("instance_type={it}"), 1.0)],
    );
    metric(
        "execution_status_total",
        "counter",
        "Executions by outcome.",
        STATUS_NAMES
            .iter()
            .zip(totals)
            .map(|(n, v)| (format!("status_type=\"{n}\""), *v as f64))
            .collect(),
    );
    metric(
        "execution_errors_total",
        "counter",
        "Failed executions by error class.",
        ERROR_CLASS_NAMES
            .iter()
            .zip(errors)
            .map(|(n, v)| (format!("error_type=\"{n}\""), *v as f64))
            .collect(),
    );
    let rts = r["neuron_runtime_data"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut lat = Vec::new();
    let mut util = Vec::new();
    let mut mem = Vec::new();
    let mut vcpu = Vec::new();
    for rt in &rts {
        let tag = &rt["neuron_runtime_tag"];
        let rep = &rt["report"];
        if let Some(m) = rep["execution_stats"]["latency_stats"]["total_latency"].as_object() {
            for (p, v) in m {
                if let Some(v) = v.as_f64() {
                    lat.push((format!("runtime_tag={tag},percentile=\"{p}\""), v));
                }
            }
        }
        if let Some(m) = rep["neuroncore_counters"]["neuroncores_in_use"].as_object() {
            for (c, v) in m {
                let u = v["neuroncore_utilization"].as_f64().unwrap_or(0.0) / 100.0;
                util.push((format!("runtime_tag={tag},neuroncore=\"{c}\""), u));
            }
        }
        let b = &rep["memory_used"]["neuron_runtime_used_bytes"];
        for loc in ["host", "neuron_device"] {
            if let Some(v) = b[loc].as_f64() {
                mem.push((format!("runtime_tag={tag},memory_location=\"{loc}\""), v));
            }
        }
        for ty in ["user", "system"] {
            if let Some(v) = rep["neuron_runtime_vcpu_usage"]["vcpu_usage"][ty].as_f64() {
                vcpu.push((format!("runtime_tag={tag},usage_type=\"{ty}\""), v / 100.0));
            }
        }
    }
    metric(
        "execution_latency_seconds",
        "gauge",
        "Total execution latency by percentile over the last period.",
        lat,
    );
    metric(
        "neuroncore_utilization_ratio",
        "gauge",
        "NeuronCore utilization over the last period (0 to 1).",
        util,
    );
    metric(
        "neuron_runtime_memory_used_bytes",
        "gauge",
        "Memory used by the runtime, by location.",
        mem,
    );
    metric(
        "neuron_runtime_vcpu_usage_ratio",
        "gauge",
        "vCPU use of the runtime's process (0 to 1).",
        vcpu,
    );
    let sys = &r["system_data"];
    if let Some(m) = sys["vcpu_usage"]["average_usage"].as_object() {
        metric(
            "system_vcpu_usage_ratio",
            "gauge",
            "Host vCPU use by type (0 to 1).",
            m.iter()
                .map(|(k, v)| {
                    (
                        format!("usage_type=\"{k}\""),
                        v.as_f64().unwrap_or(0.0) / 100.0,
                    )
                })
                .collect(),
        );
    }
    let mi = &sys["memory_info"];
    for (name, key, help) in [
        (
            "system_memory_used_bytes",
            "memory_used_bytes",
            "Host memory in use.",
        ),
        (
            "system_memory_total_bytes",
            "memory_total_bytes",
            "Host memory in all.",
        ),
    ] {
        if let Some(v) = mi[key].as_f64() {
            metric(name, "gauge", help, vec![(String::new(), v)]);
        }
    }
    metric(
        "system_vcpu_count",
        "gauge",
        "Host vCPUs.",
        vec![(String::new(), vcpus() as f64)],
    );
    s
}

/// Serves `/metrics` from `text` on `addr` (a small blocking server, one connection at a
/// time).
/// Serves the latest Prometheus text at `/metrics` ([`crate::http`]: connections served
/// concurrently up to a cap, a deadline per request).
fn serve(addr: &str, text: Arc<Mutex<String>>) -> Res<std::net::SocketAddr> {
    use axum::http::{StatusCode, header};
    let metrics = move || {
        let text = text.clone();
        async move {
            let body = text.lock().unwrap_or_else(|e| e.into_inner()).clone();
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                body,
            )
        }
    };
    let router = axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "try /metrics\n") });
    crate::http::spawn(addr, router, crate::http::Limits::METRICS)
        .map(|s| s.addr)
        .map_err(|e| format!("--prometheus {e}"))
}

/// `nrt monitor`.
pub fn monitor(a: &MonitorArgs) -> Res<()> {
    let h = shape()?;
    let c = load_config(a)?;
    let text = Arc::new(Mutex::new(String::new()));
    if let Some(addr) = &a.prometheus {
        let local = serve(addr, text.clone())?;
        eprintln!("nrt monitor: serving Prometheus metrics on http://{local}/metrics");
    }
    let mut prev = Prev::default();
    // Cumulative counters for Prometheus, summed over the periods' deltas.
    let (mut totals, mut errors) = ([0u64; 6], [0u64; 6]);
    let mut last = Instant::now();
    // The first report covers the time since each runtime started (its counters so far);
    // later ones cover one period.
    let mut period = c.period.as_secs_f64();
    let mut n = 0u64;
    loop {
        let r = report(&h, &mut prev, period, &c);
        for rt in r["neuron_runtime_data"].as_array().into_iter().flatten() {
            let es = &rt["report"]["execution_stats"];
            for (i, k) in STATUS_NAMES.iter().enumerate() {
                totals[i] += es["execution_summary"][k].as_u64().unwrap_or(0);
            }
            for (i, k) in ERROR_CLASS_NAMES.iter().enumerate() {
                errors[i] += es["error_summary"][k].as_u64().unwrap_or(0);
            }
        }
        *text.lock().unwrap_or_else(|e| e.into_inner()) = prometheus_text(&r, &totals, &errors);
        let line = serde_json::to_string(&r).map_err(|e| e.to_string())?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}")
            .and_then(|_| out.flush())
            .map_err(|e| e.to_string())?;
        drop(out);
        n += 1;
        if a.count.is_some_and(|k| n >= k) {
            return Ok(());
        }
        let next = last + c.period;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let now = Instant::now();
        period = (now - last).as_secs_f64();
        last = now;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use nrt_runtime::host::ModelSnapshot;

    /// A process holding one vcore of `cores` cores with the model `encoder` on it (also
    /// `nrt top`'s tests).
    pub(crate) fn record(cores: u32, lockstep_serving: u64) -> ProcessRecord {
        ProcessRecord {
            pid: 4242,
            start_unix_ns: 1,
            cmdline: "bench".into(),
            tag: String::new(),
            models: vec![ModelSnapshot {
                id: 1,
                vnc: 0,
                name: "encoder".into(),
                mem: [0; 5],
            }],
            cores: (0..cores).collect(),
            holding: true,
            lnc: cores,
            vcores: vec![VcoreSnapshot {
                cores,
                models: 1,
                lat_total: vec![0; host::HIST_BUCKETS],
                lat_device: vec![0; host::HIST_BUCKETS],
                lockstep_serving,
                ..VcoreSnapshot::default()
            }],
        }
    }

    fn cores_of(r: &ProcessRecord) -> Value {
        let want = vec!["neuroncore_counters".to_string()];
        let report = runtime_report(r, &mut Prev::default(), 1.0, &want);
        report["report"]["neuroncore_counters"]["neuroncores_in_use"].clone()
    }

    #[test]
    fn the_monitor_says_how_a_lockstep_group_is_served() {
        let joint = cores_of(&record(2, (4 << 1) | 1));
        for c in ["0", "1"] {
            assert_eq!(joint[c]["lockstep_serving"], "joint", "{joint}");
            assert_eq!(joint[c]["lockstep_serving_changes"], 4, "{joint}");
        }
        let parallel = cores_of(&record(2, 2 << 1));
        assert_eq!(parallel["1"]["lockstep_serving"], "parallel", "{parallel}");
        // A one-core vcore keeps neuron-monitor's fields only.
        let one = cores_of(&record(1, 0));
        assert!(one["0"].get("lockstep_serving").is_none(), "{one}");
        assert!(one["0"]["neuroncore_utilization"].is_number(), "{one}");
    }
}
