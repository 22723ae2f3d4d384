//! What `nrt monitor` reads of the host from `/proc`: CPU times (whole host and per vCPU,
//! `/proc/stat`), a process's CPU times (`/proc/<pid>/stat`), and memory (`/proc/meminfo`).

use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The seven CPU-time columns of `/proc/stat` that neuron-monitor reports, in clock ticks:
/// user, nice, system, idle, iowait, irq, softirq.
pub type CpuColumns = [u64; 7];

/// neuron-monitor's names of [`CpuColumns`], in order.
const COLUMN_NAMES: [&str; 7] = [
    "user", "nice", "system", "idle", "io_wait", "irq", "soft_irq",
];

/// One reading of `/proc/stat`.
#[derive(Clone, Debug, Default)]
pub struct CpuTimes {
    /// The `cpu` line: all vCPUs together.
    pub total: CpuColumns,
    /// The `cpuN` lines: each online vCPU by its index.
    pub per_vcpu: BTreeMap<u32, CpuColumns>,
    /// The `ctxt` line: context switches since boot.
    pub context_switches: u64,
}

/// Reads `/proc/stat` (all zero where it cannot be read).
pub fn cpu_times() -> CpuTimes {
    parse_stat(&std::fs::read_to_string("/proc/stat").unwrap_or_default())
}

/// Parses the text of `/proc/stat`.
pub fn parse_stat(text: &str) -> CpuTimes {
    let columns = |rest: &str| {
        let mut out = [0u64; 7];
        for (i, v) in rest.split_whitespace().take(7).enumerate() {
            out[i] = v.parse().unwrap_or(0);
        }
        out
    };
    let mut t = CpuTimes::default();
    for line in text.lines() {
        let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
        if key == "cpu" {
            t.total = columns(rest);
        } else if let Some(n) = key.strip_prefix("cpu").and_then(|n| n.parse().ok()) {
            t.per_vcpu.insert(n, columns(rest));
        } else if key == "ctxt" {
            t.context_switches = rest.trim().parse().unwrap_or(0);
        }
    }
    t
}

/// Percentages of each column over the period from `was` to `now` (neuron-monitor's usage
/// object: `user`, `nice`, `system`, `idle`, `io_wait`, `irq`, `soft_irq`).
fn usage(now: &CpuColumns, was: &CpuColumns) -> Value {
    let d: Vec<u64> = now
        .iter()
        .zip(was)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let total = d.iter().sum::<u64>().max(1) as f64;
    let map: serde_json::Map<String, Value> = COLUMN_NAMES
        .iter()
        .zip(&d)
        .map(|(n, &v)| ((*n).to_owned(), json!(100.0 * v as f64 / total)))
        .collect();
    Value::Object(map)
}

/// neuron-monitor's `vcpu_usage` system metric over the period from `was` to `now`: the
/// average over all vCPUs, `usage_data` per vCPU (keyed by its index as a string), and the
/// context switches.
pub fn vcpu_usage_json(now: &CpuTimes, was: &CpuTimes, period: f64) -> Value {
    let usage_data: serde_json::Map<String, Value> = now
        .per_vcpu
        .iter()
        .map(|(n, cols)| {
            let before = was.per_vcpu.get(n).copied().unwrap_or_default();
            (n.to_string(), usage(cols, &before))
        })
        .collect();
    json!({
        "period": period,
        "average_usage": usage(&now.total, &was.total),
        "usage_data": usage_data,
        "context_switch_count": now.context_switches.saturating_sub(was.context_switches),
        "error": "",
    })
}

/// CPU times of a process from `/proc/<pid>/stat`: (user, system) in clock ticks.
pub fn proc_cpu(pid: u32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?))
}

/// Host memory from `/proc/meminfo`: (total, used, swap total, swap used) in bytes.
pub fn meminfo() -> (u64, u64, u64, u64) {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let get = |k: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            .saturating_mul(1024)
    };
    let (t, a) = (get("MemTotal:"), get("MemAvailable:"));
    let (st, sf) = (get("SwapTotal:"), get("SwapFree:"));
    (t, t.saturating_sub(a), st, st.saturating_sub(sf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_vcpu_usage_in_neuron_monitors_shape() {
        let was = parse_stat(
            "cpu  10 0 10 80 0 0 0 0\ncpu0 5 0 5 40 0 0 0\ncpu1 5 0 5 40 0 0 0\nctxt 100\n",
        );
        let now = parse_stat(
            "cpu  40 0 20 140 0 0 0 0\ncpu0 35 0 5 60 0 0 0\ncpu1 5 0 15 80 0 0 0\nctxt 150\n",
        );
        let v = vcpu_usage_json(&now, &was, 1.0);
        assert_eq!(v["usage_data"].as_object().unwrap().len(), 2);
        assert_eq!(v["usage_data"]["0"]["user"], 60.0);
        assert_eq!(v["usage_data"]["0"]["idle"], 40.0);
        assert_eq!(v["usage_data"]["1"]["system"], 20.0);
        assert_eq!(v["usage_data"]["1"]["soft_irq"], 0.0);
        assert_eq!(v["average_usage"]["user"], 30.0);
        assert_eq!(v["context_switch_count"], 50);
    }
}
