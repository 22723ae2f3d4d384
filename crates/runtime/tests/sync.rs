//! The synchronous hot path: lifecycle, load, execute, bad input, model switch, lockstep,
//! faults, tracing.

mod common;
use common::*;
use nrt_hal::NrtStatus;
use nrt_runtime::builtin::near_null;
use nrt_runtime::{LoadOptions, Placement, Runtime, RuntimeConfig, Stage, TensorSet};
use nrt_sim::{FaultKind, FaultSpec};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn near_null_round_trip_device_and_host_tensors() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    for placement in [Placement::Device, Placement::Host] {
        let (ins, outs, _keep) = tensors(&rt, &m, placement);
        for k in 0..50 {
            let x = [k as f32, -1.5, 2.0, 1e-3 * k as f32];
            ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
            rt.execute(&m, &ins, &outs).unwrap();
            assert_eq!(
                read_f32(outs.get("y").unwrap()),
                x,
                "{placement:?} iteration {k}"
            );
        }
    }
}

#[test]
fn one_lock_one_doorbell_one_publish_per_execution() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    let before = rt.pipeline_counters(0);
    for _ in 0..10 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    let after = rt.pipeline_counters(0);
    assert_eq!(after.staging_locks - before.staging_locks, 10);
    assert_eq!(after.doorbells - before.doorbells, 10);
    assert_eq!(after.publishes - before.publishes, 10);
    assert_eq!(after.barrier_proxy_waits, 0);
}

#[test]
fn lockstep_two_core_model_stages_once_and_rings_each_core() {
    let d = device();
    let rt = runtime_on(
        &d,
        RuntimeConfig {
            logical_nc: 2,
            ..Default::default()
        },
    );
    assert_eq!(rt.vnc_count(), 1);
    let m = rt.load(&near_null(2), 0, &LoadOptions::default()).unwrap();
    assert_eq!(m.core_count(), 2);
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    let before = rt.pipeline_counters(0);
    for k in 0..20 {
        let x = [k as f32, 1.0, 2.0, 3.0];
        ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
        rt.execute(&m, &ins, &outs).unwrap();
        assert_eq!(read_f32(outs.get("y").unwrap()), x);
    }
    let after = rt.pipeline_counters(0);
    assert_eq!(
        after.staging_locks - before.staging_locks,
        20,
        "one staging lock per execution"
    );
    assert_eq!(
        after.doorbells - before.doorbells,
        40,
        "one doorbell per core"
    );
    assert_eq!(
        after.publishes - before.publishes,
        20,
        "one publish per execution"
    );
    assert_eq!(
        after.barrier_proxy_waits - before.barrier_proxy_waits,
        20,
        "WAIT_BARRIER_PROXY each time"
    );
    // A 2-core model does not fit a runtime whose logical cores have one core.
    let rt1_dev = device();
    let rt1 = runtime_on(&rt1_dev, RuntimeConfig::default());
    let e = rt1
        .load(&near_null(2), 0, &LoadOptions::default())
        .unwrap_err();
    assert_eq!(e.status, NrtStatus::LoadNotEnoughNc, "{e}");
}

#[test]
fn model_switch_sets_reload_only_on_the_first_execution_after_a_switch() {
    let (_d, rt) = runtime();
    let a = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let b = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ia, oa, _k1) = tensors(&rt, &a, Placement::Device);
    let (ib, ob, _k2) = tensors(&rt, &b, Placement::Device);
    let c0 = rt.switch_counters();
    for _ in 0..5 {
        rt.execute(&a, &ia, &oa).unwrap();
    }
    let c1 = rt.switch_counters();
    assert_eq!(
        (c1.model_switches - c0.model_switches, c1.steady - c0.steady),
        (1, 4)
    );
    rt.execute(&b, &ib, &ob).unwrap();
    rt.execute(&b, &ib, &ob).unwrap();
    rt.execute(&a, &ia, &oa).unwrap();
    let c2 = rt.switch_counters();
    assert_eq!(
        (c2.model_switches - c1.model_switches, c2.steady - c1.steady),
        (2, 1)
    );
}

#[test]
fn bad_inputs_name_the_culprit_and_change_nothing() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    let good = |rt: &Runtime| rt.execute(&m, &ins, &outs).unwrap();

    // Wrong size.
    let small = rt
        .allocate_tensor(Placement::Device, 0, 8, "small")
        .unwrap();
    let mut bad = ins.clone();
    bad.add("x", &small);
    let e = rt.execute(&m, &bad, &outs).unwrap_err();
    assert_eq!(e.status, NrtStatus::Invalid);
    assert!(
        e.message.contains("'small'") && e.message.contains("8 bytes") && e.message.contains("16"),
        "{e}"
    );
    good(&rt);

    // Missing input / unknown name (a set keyed by another name).
    let mut wrong = TensorSet::new();
    wrong.add("not_x", ins.get("x").unwrap());
    let e = rt.execute(&m, &wrong, &outs).unwrap_err();
    assert!(
        e.status == NrtStatus::Invalid && e.message.contains("input tensor 'x'"),
        "{e}"
    );
    let e = rt.execute(&m, &ins, &TensorSet::new()).unwrap_err();
    assert!(e.message.contains("output tensor 'y'"), "{e}");
    good(&rt);

    // Repeat > 1.
    let e = rt.execute_repeat(&m, &ins, &outs, 2).unwrap_err();
    assert!(
        e.status == NrtStatus::Invalid && e.message.contains("repeat_count 2"),
        "{e}"
    );
    good(&rt);

    // Bad tensor allocation arguments.
    let e = rt
        .allocate_tensor(Placement::Device, 7, 16, "t")
        .unwrap_err();
    assert!(e.message.contains("logical NeuronCore 7"), "{e}");
    let t = rt.allocate_tensor(Placement::Device, 0, 16, "t").unwrap();
    let e = t.write(&[0u8; 20], 0).unwrap_err();
    assert!(
        e.message.contains("'t'") && e.message.contains("20 bytes"),
        "{e}"
    );

    // Unloaded model; host tensor in a set of an unloaded model.
    let (hi, ho, _h) = tensors(&rt, &m, Placement::Host);
    rt.unload(&m).unwrap();
    let e = rt.execute(&m, &hi, &ho).unwrap_err();
    assert!(
        e.status == NrtStatus::Invalid && e.message.contains("unloaded"),
        "{e}"
    );
    assert_eq!(
        rt.unload(&m).unwrap_err().status,
        NrtStatus::Invalid,
        "double unload"
    );
    let m2 = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    rt.execute(&m2, &hi, &ho).unwrap();

    // Malformed model files.
    let mut corrupt = near_null(1);
    corrupt[100] ^= 0xFF;
    let e = rt.load(&corrupt, 0, &LoadOptions::default()).unwrap_err();
    assert!(
        e.status == NrtStatus::Invalid && e.message.contains("checksum"),
        "{e}"
    );
    let mut newer = near_null(1);
    newer[4] = 9;
    let e = rt.load(&newer, 0, &LoadOptions::default()).unwrap_err();
    assert!(
        e.status == NrtStatus::UnsupportedNeffVersion && e.message.contains("version 9."),
        "{e}"
    );
    assert_eq!(
        rt.load(&[], 0, &LoadOptions::default()).unwrap_err().status,
        NrtStatus::Invalid
    );
    assert_eq!(
        rt.load(&near_null(1), 9, &LoadOptions::default())
            .unwrap_err()
            .status,
        NrtStatus::LoadNotEnoughNc
    );
    rt.execute(&m2, &hi, &ho).unwrap();
}

#[test]
fn calls_after_close_return_closed() {
    let (d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, keep) = tensors(&rt, &m, Placement::Device);
    rt.close();
    rt.close(); // idempotent
    assert!(!rt.is_open());
    assert_eq!(
        rt.execute(&m, &ins, &outs).unwrap_err().status,
        NrtStatus::Closed
    );
    assert_eq!(
        rt.load(&near_null(1), 0, &LoadOptions::default())
            .unwrap_err()
            .status,
        NrtStatus::Closed
    );
    assert_eq!(
        keep[0].write(&[0; 4], 0).unwrap_err().status,
        NrtStatus::Closed
    );
    assert_eq!(
        rt.allocate_tensor(Placement::Host, 0, 4, "t")
            .unwrap_err()
            .status,
        NrtStatus::Closed
    );
    // The cores were released: a new runtime can reserve them.
    let rt2 = runtime_on(&d, RuntimeConfig::default());
    let m2 = rt2.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (i2, o2, _k) = tensors(&rt2, &m2, Placement::Device);
    rt2.execute(&m2, &i2, &o2).unwrap();
}

#[test]
fn cores_are_reserved_exclusively() {
    let (d, _rt) = runtime();
    let e = Runtime::init(d.clone(), RuntimeConfig::default()).unwrap_err();
    assert_eq!(e.status, NrtStatus::Resource, "{e}");
    assert!(e.message.contains("NeuronCore 0"), "{e}");
    let other = Runtime::init(
        d,
        RuntimeConfig {
            visible_cores: Some(vec![3]),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(other.status, NrtStatus::Resource);
}

fn fault_status(kind: FaultKind) -> NrtStatus {
    let (d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    rt.execute(&m, &ins, &outs).unwrap();
    let engine = if kind == FaultKind::Hang {
        nrt_hal::Engine::Dve
    } else {
        kind.default_engine()
    };
    d.inject(FaultSpec::new(kind).on_engine(engine)).unwrap();
    let e = rt.execute(&m, &ins, &outs).unwrap_err();
    assert!(e.message.contains("near-null"), "{e}");
    if kind == FaultKind::Fatal {
        // The XU stays unrecoverable until reset.
        assert_eq!(
            rt.execute(&m, &ins, &outs).unwrap_err().status,
            NrtStatus::ExecUnitUnrecoverable
        );
        rt.reset_vnc(0).unwrap();
    }
    // The next execution on the same core succeeds.
    ins.get("x")
        .unwrap()
        .write(&f32s(&[9.0, 8.0, 7.0, 6.0]), 0)
        .unwrap();
    rt.execute(&m, &ins, &outs).unwrap();
    assert_eq!(read_f32(outs.get("y").unwrap()), [9.0, 8.0, 7.0, 6.0]);
    e.status
}

#[test]
fn every_fault_surfaces_as_its_status_through_execute() {
    let cases = [
        (FaultKind::Hang, NrtStatus::Timeout),
        (FaultKind::DropNotifications, NrtStatus::ExecSwNqOverflow),
        (FaultKind::Nan, NrtStatus::ExecCompletedWithNumErr),
        (FaultKind::Transient, NrtStatus::ExecCompletedWithErr),
        (FaultKind::Parity, NrtStatus::ExecHwErrNcUe),
        (FaultKind::DmaAbort, NrtStatus::ExecHwErrDmaAbort),
        (FaultKind::HbmUncorrectable, NrtStatus::ExecHwErrHbmUe),
        (FaultKind::Fatal, NrtStatus::ExecUnitUnrecoverable),
    ];
    for (kind, want) in cases {
        assert_eq!(fault_status(kind), want, "{kind:?}");
    }
}

#[test]
fn unload_during_execution_waits_for_it() {
    let (d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &quick_timeout()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    // Make the next execution slow: an engine hangs until the 300 ms timeout.
    d.inject(FaultSpec::new(FaultKind::Hang).on_engine(nrt_hal::Engine::Dve))
        .unwrap();
    let (rt2, m2) = (rt.clone(), m.clone());
    let before = d.executions(0).unwrap();
    let t = std::thread::spawn(move || rt2.execute(&m2, &ins, &outs));
    wait_until_taken(&d, 0, before); // in flight (not a fixed sleep: see wait_until_taken)
    rt.unload(&m).unwrap(); // returns once the execution finished
    assert!(!m.is_loaded());
    assert_eq!(t.join().unwrap().unwrap_err().status, NrtStatus::Timeout);
}

#[test]
fn tracing_records_the_five_stages_and_each_engine_on_the_device() {
    let (_d, rt) = runtime();
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    rt.execute(&m, &ins, &outs).unwrap();
    assert!(rt.trace_spans().is_empty());
    rt.set_tracing(true);
    for _ in 0..3 {
        rt.execute(&m, &ins, &outs).unwrap();
    }
    rt.set_tracing(false);
    rt.execute(&m, &ins, &outs).unwrap();
    let spans = rt.trace_spans();
    // Per execution: the device's five engine spans (recorded by the harvest when the
    // execution completes), then the host's five stages (recorded by the caller after it).
    assert_eq!(spans.len(), 30, "{spans:#?}");
    for w in spans.chunks(10) {
        let (engines, stages) = w.split_at(5);
        assert_eq!(
            stages.iter().map(|s| s.stage).collect::<Vec<_>>(),
            Stage::ALL
        );
        assert!(stages.windows(2).all(|p| p[0].end_ns <= p[1].start_ns + 1));
        let seq = stages[0].seq;
        let mut seen: Vec<u8> = engines
            .iter()
            .map(|s| match s.stage {
                Stage::Engine { core: 0, engine } => engine,
                other => panic!("expected an engine span of core 0, got {other:?}"),
            })
            .collect();
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3, 4], "one span per engine");
        // The device's clock and the host's are both monotonic and were read together when
        // tracing was enabled: every engine span lies inside the execution's own window,
        // from the doorbell to the end of the harvest (with a little slack for that pairing).
        let (doorbell, harvest) = (stages[3], stages[4]);
        for e in engines {
            assert_eq!(e.seq, seq);
            assert!(e.start_ns <= e.end_ns, "{e:?}");
            assert!(
                e.start_ns + 2_000 >= doorbell.start_ns,
                "{e:?} before {doorbell:?}"
            );
            assert!(
                e.end_ns <= harvest.end_ns + 2_000,
                "{e:?} after {harvest:?}"
            );
        }
    }
}

#[test]
fn tensor_api_basics() {
    let (_d, rt) = runtime();
    let t = rt.allocate_tensor(Placement::Device, 0, 64, "t").unwrap();
    t.memset(0, 7, 64).unwrap();
    let s = t.slice(16, 16, "s").unwrap();
    s.write(&[1; 16], 0).unwrap();
    let mut all = [0u8; 64];
    t.read(&mut all, 0).unwrap();
    assert_eq!(&all[..16], &[7; 16]);
    assert_eq!(&all[16..32], &[1; 16]);
    let h = rt.allocate_tensor(Placement::Host, -1, 64, "h").unwrap();
    h.copy_from(&t, 0, 0, 64).unwrap();
    let mut back = [0u8; 64];
    h.read(&mut back, 0).unwrap();
    assert_eq!(back, all);
    let e = rt.allocate_empty_tensor("e").unwrap();
    let mut buf = vec![3u8; 32];
    // SAFETY: `buf` outlives every use of `e` below.
    unsafe { e.attach_buffer(buf.as_mut_ptr(), buf.len()).unwrap() };
    assert_eq!(e.size(), 32);
    e.write(&[5; 4], 0).unwrap();
    assert_eq!(&buf[..5], &[5, 5, 5, 5, 3]);
    assert!(t.slice(60, 8, "x").is_err());
}

#[test]
fn tensors_of_another_runtime_are_rejected() {
    let (_d1, rt1) = runtime();
    let (_d2, rt2) = runtime();
    let m = rt1.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, _k) = tensors(&rt2, &m, Placement::Device);
    let e = rt1.execute(&m, &ins, &outs).unwrap_err();
    assert!(
        e.status == NrtStatus::Invalid && e.message.contains("another runtime"),
        "{e}"
    );
}

/// A synchronous caller runs a short model's device work on its own thread
/// (`tuning::SYNC_SERVES_CORE_MAX`): the device thread stays parked meanwhile. Without it
/// the first doorbell wakes the device thread, which runs every execution and spins between
/// them, never parked. (The device's look at served cores is put off for the test's length.)
#[test]
fn a_sync_caller_runs_a_short_execution_itself() {
    let d = Arc::new(
        nrt_sim::SoftDevice::new(nrt_sim::SimConfig {
            memory_bytes: 2 << 30,
            host_served_check: Duration::from_secs(3600),
            ..nrt_sim::SimConfig::default()
        })
        .unwrap(),
    );
    let rt = runtime_on(&d, RuntimeConfig::default());
    let m = rt.load(&near_null(1), 0, &LoadOptions::default()).unwrap();
    let (ins, outs, _k) = tensors(&rt, &m, Placement::Device);
    // The model's expected latency is learned; then the device thread parks.
    let t0 = Instant::now();
    while !d.is_parked() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the device never parked"
        );
        rt.execute(&m, &ins, &outs).unwrap();
    }
    // Not every look: a caller preempted while it serves (a busy co-tenant, the suite's
    // other tests) may hand the core back after its idle polls, and the device thread then
    // runs and spins a while. Beside a co-tenant a round of 20,000 executions found it
    // parked at 0–191 of 200 looks (most above 50), so up to three rounds, one of them at a
    // quarter of its looks; without serving it is parked at none.
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let (mut parked, mut looks) = (0, 0);
        for k in 0..20_000 {
            let x = [k as f32, 1.0, 2.0, 3.0];
            ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
            rt.execute(&m, &ins, &outs).unwrap();
            if k % 100 == 0 {
                assert_eq!(read_f32(outs.get("y").unwrap()), x);
                looks += 1;
                parked += d.is_parked() as u32;
            }
        }
        rounds.push(parked);
        if parked * 4 >= looks {
            return;
        }
    }
    panic!("the device thread was parked at {rounds:?} of 200 looks in three rounds");
}

/// `threads` threads call `execute` `executions` times each on a 256 Ki-element identity
/// model loaded on `rt`'s core 0, each with its own tensors and inputs; every
/// `check_every`-th output must be the caller's own input. Returns the core's pipeline
/// counters before and after.
fn identity_callers(
    rt: &Runtime,
    threads: usize,
    executions: u32,
    check_every: u32,
) -> (nrt_runtime::PipelineCounters, nrt_runtime::PipelineCounters) {
    const N: u32 = 256 << 10;
    let model = nrt_runtime::builtin::identity("identity-256k", 1, N);
    let m = rt.load(&model, 0, &LoadOptions::default()).unwrap();
    let before = rt.pipeline_counters(0);
    let run = |t: usize| {
        let (ins, outs, _k) = tensors(rt, &m, Placement::Device);
        for k in 0..executions {
            let v = (t as u32 * 1_000_000 + k) as f32;
            let x: Vec<f32> = (0..N).map(|i| v + (i % 7) as f32).collect();
            ins.get("x").unwrap().write(&f32s(&x), 0).unwrap();
            rt.execute(&m, &ins, &outs).unwrap();
            if k % check_every == 0 {
                assert_eq!(
                    read_f32(outs.get("y").unwrap()),
                    x,
                    "thread {t}, execution {k}"
                );
            }
        }
    };
    std::thread::scope(|s| {
        let h: Vec<_> = (0..threads).map(|t| s.spawn(move || run(t))).collect();
        for h in h {
            h.join().unwrap();
        }
    });
    (before, rt.pipeline_counters(0))
}

/// Two threads call `execute` on one core with a model long enough that the caller staged
/// behind the other blocks (a 256 Ki-element identity: three passes over 1 MiB, tens of µs,
/// short enough to be served). The serving caller runs the other's execution too, and the
/// other sleeps on the served wake until its completion word is written: the served wake
/// wakes it (`PipelineCounters::served_wakes`), and every output is the caller's own input.
/// Fails if queued callers wait on the device's wake instead (no served wake-ups), or if the
/// serving caller ran an execution into another caller's tensors.
#[test]
fn a_caller_queued_behind_the_serving_one_sleeps_on_the_served_wake() {
    // Serving pinned on: under `Short` whether a caller serves follows the measured service
    // time, which in this host's slow phases exceeds the budget (then no caller serves and
    // the test failed on an idle machine at the base commit too, 4 of 4 runs).
    let d = device();
    let rt = runtime_on(
        &d,
        RuntimeConfig {
            sync_on_caller: nrt_runtime::SyncOnCaller::Always,
            ..RuntimeConfig::default()
        },
    );
    let (before, after) = identity_callers(&rt, 2, 1000, 50);
    assert!(
        after.served_wakes > before.served_wakes,
        "no queued caller was woken on the served wake in 2,000 executions from 2 threads ({} -> {})",
        before.served_wakes,
        after.served_wakes
    );
}

/// More synchronous callers on one core than it runs at once, none running the core on its
/// own thread (`SyncOnCaller::Never`): each caller whose execution is queued sleeps on its
/// execution's own wake, which the device signals when that execution ends — not on the
/// vcore's wake, which every execution's end signals and which woke every queued caller each
/// time. The execution wakes wake them (`PipelineCounters::execution_wakes`), and every
/// output is the caller's own input. Fails if synchronous callers sleep on the vcore's wake
/// (no execution wake-ups). (That the device signals the right execution's wake is
/// `nrt-sim`'s `a_host_asleep_on_one_executions_wake_is_woken_when_that_execution_ends`.)
#[test]
fn queued_sync_callers_sleep_on_their_executions_own_wakes() {
    const THREADS: usize = 4;
    const EXECUTIONS: u32 = 300;
    let d = device();
    let rt = runtime_on(
        &d,
        RuntimeConfig {
            sync_on_caller: nrt_runtime::SyncOnCaller::Never,
            ..RuntimeConfig::default()
        },
    );
    let (before, after) = identity_callers(&rt, THREADS, EXECUTIONS, 25);
    let woken = after.execution_wakes - before.execution_wakes;
    let executions = THREADS as u64 * EXECUTIONS as u64;
    assert!(
        woken >= executions / 10,
        "{woken} wake-ups on the executions' own wakes in {executions} executions from \
         {THREADS} threads"
    );
}
