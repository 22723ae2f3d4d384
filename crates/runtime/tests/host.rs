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

fn small_device(bytes: u64) -> Arc<SoftDevice> {
    Arc::new(
        SoftDevice::new(SimConfig {
            memory_bytes: bytes,
            ..SimConfig::default()
        })
        .unwrap(),
    )
}

#[test]
fn running_out_of_device_memory_says_what_was_asked_what_is_free_and_who_uses_it() {
    const MIB: u64 = 1 << 20;
    let dev = small_device(64 * MIB);
    let rt = runtime_on(&dev, RuntimeConfig::default());
    let m = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap();
    let big = rt
        .allocate_tensor(nrt_runtime::Placement::Device, 0, 40 * MIB, "kv-cache")
        .unwrap();
    // A tensor that does not fit.
    let e = rt
        .allocate_tensor(nrt_runtime::Placement::Device, 0, 30 * MIB, "activations")
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource);
    let msg = &e.message;
    assert!(
        msg.contains(&format!(
            "tensor 'activations' asked for 30.00 MiB ({} bytes, tensors) on logical NeuronCore 0 (NeuronCore 0)",
            30 * MIB
        )),
        "{msg}"
    );
    // What is free, out of what.
    let free_line = msg.lines().next().unwrap();
    assert!(
        free_line.contains(" free of 63.94 MiB on its device"),
        "{msg}"
    );
    // In use by category, then the biggest users, biggest first, then what to do.
    assert!(
        msg.contains("in use: ") && msg.contains("tensors 40.00 MiB"),
        "{msg}"
    );
    let users = msg.split("biggest users:").nth(1).expect(msg);
    let tensors_at = users
        .find("device tensors on logical NeuronCore 0: 40.00 MiB")
        .expect(msg);
    let model_at = users
        .find("model 'near-null' (id 1) on logical NeuronCore 0: ")
        .expect(msg);
    assert!(tensors_at < model_at, "{msg}");
    assert!(users.contains("model code"), "{msg}");
    assert!(msg.contains("to fix: free tensors"), "{msg}");

    // A load that does not fit names the model and what it had allocated before: fill
    // what is left in 1 MiB steps, then load.
    let mut fill = Vec::new();
    for step in [MIB, 4096, 64] {
        while let Ok(t) = rt.allocate_tensor(nrt_runtime::Placement::Device, 0, step, "step") {
            fill.push(t);
        }
    }
    let e = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource);
    assert!(
        e.message.starts_with("out of device memory: ")
            && e.message
                .contains("loading model 'near-null', which had allocated"),
        "{}",
        e.message
    );
    assert!(
        e.message
            .contains("device tensors on logical NeuronCore 0: "),
        "{}",
        e.message
    );
    drop((fill, big, m));
}

#[test]
fn host_tensors_are_counted_at_allocation_and_free() {
    let (_dev, rt) = runtime();
    let before = rt.stats(0).unwrap().mem[host::mem::HOST_TENSORS];
    let a = rt
        .allocate_tensor(nrt_runtime::Placement::Host, -1, 1 << 20, "a")
        .unwrap();
    let b = rt
        .allocate_tensor(nrt_runtime::Placement::Host, -1, 4096, "b")
        .unwrap();
    let s = rt.stats(0).unwrap();
    assert_eq!(s.mem[host::mem::HOST_TENSORS], before + (1 << 20) + 4096);
    // Device memory is not host memory.
    assert_eq!(s.mem[host::mem::TENSORS], 0);
    // A clone is the same tensor; only the last handle frees.
    let a2 = a.clone();
    drop(a);
    assert_eq!(
        rt.stats(0).unwrap().mem[host::mem::HOST_TENSORS],
        before + (1 << 20) + 4096
    );
    drop((a2, b));
    assert_eq!(rt.stats(0).unwrap().mem[host::mem::HOST_TENSORS], before);
}

#[test]
fn the_published_record_lists_the_models_their_memory_and_the_host_tensors() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("host-models-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let dev = device();
    let rt = owning(&dev, &dir, Some(vec![1])).unwrap();
    let m1 = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap();
    let m2 = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap();
    let h = rt
        .allocate_tensor(nrt_runtime::Placement::Host, -1, 12345, "h")
        .unwrap();
    let recs = host::read_records(&dir);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    let ids: Vec<u32> = r.models.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&m1.id()) && ids.contains(&m2.id()), "{r:?}");
    for m in &r.models {
        assert_eq!((m.name.as_str(), m.vnc), ("near-null", 0));
        assert!(m.mem[host::mem::MODEL_CODE] > 0, "{m:?}");
    }
    // The models' bytes add up to the core's (no device tensors here).
    let sum: u64 = r.models.iter().map(|m| m.mem.iter().sum::<u64>()).sum();
    assert_eq!(sum, r.vcores[0].mem[..5].iter().sum::<u64>());
    assert_eq!(r.vcores[0].mem[host::mem::HOST_TENSORS], 12345);
    rt.unload(&m1).unwrap();
    let r = &host::read_records(&dir)[0];
    assert_eq!(
        r.models.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![m2.id()]
    );
    drop((h, m2));
    rt.close();
    let _ = std::fs::remove_dir_all(&dir);
}

fn inspect_dir(name: &str) -> std::path::PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("inspect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The `seq`s of the executions a Chrome trace holds, and how many spans of each kind.
fn seqs(json: &str) -> (Vec<u64>, usize, usize) {
    let mut v: Vec<u64> = json
        .split("\"seq\":")
        .skip(1)
        .map(|s| {
            s.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let stages = json.matches("\"cat\":\"stage\"").count();
    let engines = json.matches("\"cat\":\"engine\"").count();
    v.sort();
    v.dedup();
    (v, stages, engines)
}

#[test]
fn inspect_model_mode_writes_the_execution_after_the_warm_up_when_it_returns() {
    let out = inspect_dir("model");
    let dev = device();
    let rt = runtime_on(
        &dev,
        RuntimeConfig {
            inspect: Some(nrt_runtime::InspectConfig {
                output_dir: out.clone(),
                mode: nrt_runtime::InspectMode::Model,
                warmup: 3,
            }),
            ..Default::default()
        },
    );
    assert!(rt.inspecting());
    // Turning tracing off from code does not stop the process-wide profile.
    rt.set_tracing(false);
    let m = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap();
    let (ins, outs, _t) = tensors(&rt, &m, nrt_runtime::Placement::Device);
    let file = out
        .join(format!("nrt_pid_{}", std::process::id()))
        .join(format!("model_{}_near-null_vnc_0_exec_4.json", m.id()));
    for _ in 0..3 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    assert!(!file.exists(), "written during the warm-up");
    rt.execute(&m, &ins, &outs).unwrap();
    // Written when the captured (4th) execution returned.
    let json = std::fs::read_to_string(&file).expect("the profile of the 4th execution");
    let (s, stages, engines) = seqs(&json);
    assert_eq!(s, vec![4], "only the 4th execution: {json}");
    assert_eq!(stages, 5, "{json}");
    assert!(engines >= 2, "SP and DVE at least: {json}");
    assert!(json.contains("\"model_name\":\"near-null\""));
    for _ in 0..3 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    rt.close();
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        json,
        "written once"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn inspect_session_mode_writes_every_execution_after_the_warm_up_at_close() {
    let out = inspect_dir("session");
    let dev = device();
    let rt = runtime_on(
        &dev,
        RuntimeConfig {
            inspect: Some(nrt_runtime::InspectConfig {
                output_dir: out.clone(),
                mode: nrt_runtime::InspectMode::Session,
                warmup: 2,
            }),
            ..Default::default()
        },
    );
    let m = rt
        .load(&builtin::near_null(1), 0, &quick_timeout())
        .unwrap();
    let (ins, outs, _t) = tensors(&rt, &m, nrt_runtime::Placement::Device);
    for _ in 0..5 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    let file = out
        .join(format!("nrt_pid_{}", std::process::id()))
        .join("session.json");
    assert!(!file.exists());
    // A link planted where the profile goes (issue 54: the output directory may be one
    // others can write) is replaced, never written through.
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let victim = out.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, &file).unwrap();
    rt.close();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(
        !std::fs::symlink_metadata(&file)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let json = std::fs::read_to_string(&file).expect("session.json at close");
    let (s, stages, _) = seqs(&json);
    assert_eq!(s, vec![3, 4, 5], "{json}");
    assert_eq!(stages, 15);
    let _ = std::fs::remove_dir_all(&out);
}
