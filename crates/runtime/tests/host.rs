//! The host view from inside one process: the statistics count exactly the executions and
//! faults performed, and a core held by a runtime with ownership is refused to another one,
//! naming the owner.

mod common;

use common::*;
use nrt_runtime::host::{self, ERROR_CLASS_NAMES, STATUS_NAMES, status};
use nrt_runtime::{NrtStatus, Runtime, RuntimeConfig, builtin};
use nrt_sim::{SimConfig, SoftDevice, parse_faults};
use std::sync::Arc;

fn idx(names: &[&str], n: &str) -> usize {
    names.iter().position(|x| *x == n).unwrap()
}

#[test]
fn counters_equal_the_executions_and_faults_performed() {
    // exec numbers are per core, 1-based: 3 → NaN, 5 → transient, 7 → hang (timeout),
    // 9 → parity (hardware).
    let dev = Arc::new(
        SoftDevice::new(SimConfig {
            memory_bytes: 2 << 30,
            faults: parse_faults("nan@exec=3;transient@exec=5;hang@exec=7;parity@exec=9").unwrap(),
            hang_watchdog: std::time::Duration::from_millis(100),
            ..SimConfig::default()
        })
        .unwrap(),
    );
    let rt = runtime_on(&dev, RuntimeConfig::default());
    let m = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap();
    let (ins, outs, _t) = tensors(&rt, &m, nrt_runtime::Placement::Device);
    let mut statuses = Vec::new();
    for _ in 0..40 {
        statuses.push(match rt.execute(&m, &ins, &outs) {
            Ok(()) => NrtStatus::Success,
            Err(e) => e.status,
        });
    }
    // Two refused before staging: an input set that lacks the input.
    let empty = nrt_runtime::TensorSet::new();
    assert!(rt.execute(&m, &empty, &outs).is_err());
    assert!(rt.execute(&m, &empty, &outs).is_err());

    let s = rt.stats(0).unwrap();
    assert_eq!(s.first_core, 0);
    let ok = statuses.iter().filter(|s| s.is_success()).count() as u64;
    assert_eq!(
        statuses[2],
        NrtStatus::ExecCompletedWithNumErr,
        "{statuses:?}"
    );
    assert_eq!(statuses[4], NrtStatus::ExecCompletedWithErr, "{statuses:?}");
    assert_eq!(statuses[6], NrtStatus::Timeout, "{statuses:?}");
    assert_eq!(statuses[8], NrtStatus::ExecHwErrNcUe, "{statuses:?}");
    assert_eq!(ok, 36);
    let st = |n| s.status[idx(&STATUS_NAMES, n)];
    assert_eq!(st("completed"), ok);
    assert_eq!(st("completed_with_num_err"), 1);
    assert_eq!(st("completed_with_err"), 2, "transient + parity");
    assert_eq!(st("timed_out"), 1);
    assert_eq!(st("incorrect_input"), 2);
    assert_eq!(st("failed_to_queue"), 0);
    let er = |n| s.errors[idx(&ERROR_CLASS_NAMES, n)];
    assert_eq!(
        (
            er("numerical"),
            er("transient"),
            er("runtime"),
            er("hardware"),
            er("model")
        ),
        (1, 1, 1, 1, 2)
    );
    assert_eq!(er("generic"), 0);
    // Total latency: executions 1, 17, 33 were sampled (one in 16).
    assert_eq!(s.lat_total.iter().sum::<u64>(), 3);
    // Device latency: only where the device stamps times (trace mode): none here.
    assert_eq!(s.lat_device.iter().sum::<u64>(), 0);
    assert!(s.busy_ns > 0);
    let p50 = host::percentile(&s.lat_total, 50.0).unwrap();
    assert!(p50 > 0.0 && p50 < 1e9, "{p50}");
    // Traced executions carry the engines' timestamps: every one that ended is counted.
    rt.set_tracing(true);
    for _ in 0..5 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    rt.set_tracing(false);
    assert_eq!(rt.stats(0).unwrap().lat_device.iter().sum::<u64>(), 5);
    // Memory by category and models.
    assert_eq!(s.models, 1);
    assert!(s.mem[host::mem::MODEL_CODE] > 0 && s.mem[host::mem::RUNTIME] > 0);
    assert!(s.mem[host::mem::TENSORS] >= 32, "{:?}", s.mem);
    rt.unload(&m).unwrap();
    let s = rt.stats(0).unwrap();
    assert_eq!((s.models, s.mem[host::mem::MODEL_CODE]), (0, 0));
    assert_eq!(s.status[status::COMPLETED], ok + 5, "kept after unload");
}

fn owning(
    dev: &Arc<SoftDevice>,
    dir: &std::path::Path,
    cores: Option<Vec<u32>>,
) -> nrt_runtime::Result<Runtime> {
    Runtime::init(
        dev.clone(),
        RuntimeConfig {
            ownership: Some(dir.to_owned()),
            visible_cores: cores,
            ..Default::default()
        },
    )
}

#[test]
fn a_held_core_is_refused_naming_the_owner() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("host-own-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (d1, d2) = (device(), device());
    let a = owning(&d1, &dir, Some(vec![1])).unwrap();
    // Another runtime (here in the same process: ownership is per runtime) asking for every
    // core is refused on core 1, with the owner's pid and command line.
    let e = owning(&d2, &dir, None).unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource);
    let me = std::process::id();
    assert!(
        e.message
            .contains(&format!("NeuronCore 1 is in use by pid {me} (")),
        "{}",
        e.message
    );
    let exe = std::env::args().next().unwrap();
    assert!(e.message.contains(&exe), "{}", e.message);
    // Core 0 is free: the refused runtime took nothing.
    let b = owning(&d2, &dir, Some(vec![0])).unwrap();
    // Both are published.
    let recs = host::read_records(&dir);
    assert_eq!(recs.len(), 2, "{recs:?}");
    let mut cores: Vec<Vec<u32>> = recs.iter().map(|r| r.cores.clone()).collect();
    cores.sort();
    assert_eq!(cores, vec![vec![0], vec![1]]);
    assert!(recs.iter().all(|r| r.pid == me && r.holding));
    // Closing frees the core and removes the record.
    a.close();
    assert_eq!(host::read_records(&dir).len(), 1);
    let c = owning(&d1, &dir, Some(vec![1])).unwrap();
    drop((b, c));
    assert!(host::read_records(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
