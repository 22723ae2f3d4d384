//! The harvest's step function on a scripted device (`common/scripted.rs`): the records of
//! an execution arrive in the order a test chooses, so every path of the state machine —
//! START/END interleavings, two executions' records mixed, errors that abort or not, a stale
//! record, dropped notifications, an engine hang, a lockstep partner that starts late, a
//! fatal error with executions queued behind it — is exercised deterministically.

mod common;

use common::scripted::ScriptedDevice;
use nrt_hal::{Engine, ErrorSubtype, NrtStatus, SeqId, wire::cause};
use nrt_runtime::builtin::near_null;
use nrt_runtime::{LoadOptions, Model, Placement, Runtime, RuntimeConfig, TensorSet};
use std::sync::Arc;
use std::time::Duration;

struct Rig {
    dev: Arc<ScriptedDevice>,
    rt: Runtime,
    m: Model,
    ins: TensorSet,
    outs: TensorSet,
}

fn rig(lnc: u32, timeout: Duration) -> Rig {
    rig_with(
        RuntimeConfig {
            logical_nc: lnc,
            ..RuntimeConfig::default()
        },
        timeout,
    )
}

fn rig_with(config: RuntimeConfig, timeout: Duration) -> Rig {
    let lnc = config.logical_nc.max(1);
    let dev = Arc::new(ScriptedDevice::new(2));
    let rt = Runtime::init(dev.clone(), config).unwrap();
    let m = rt
        .load(
            &near_null(lnc),
            0,
            &LoadOptions {
                exec_timeout: Some(timeout),
                ..Default::default()
            },
        )
        .unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    for info in m.tensor_info() {
        let t = rt
            .allocate_tensor(Placement::Device, 0, info.size, &info.name)
            .unwrap();
        match info.usage {
            nrt_model::Usage::Input => ins.add(&info.name, &t),
            nrt_model::Usage::Output => outs.add(&info.name, &t),
        }
    }
    Rig {
        dev,
        rt,
        m,
        ins,
        outs,
    }
}

impl Rig {
    /// Schedules one execution; returns its seq and the compute index the device sees.
    fn schedule(&self) -> (SeqId, u32) {
        let s = self
            .rt
            .execute_schedule(&self.m, &self.ins, &self.outs)
            .unwrap();
        let reqs = self.dev.staged(0);
        assert_eq!(reqs.len(), 1, "one request per execution and core");
        (s, reqs[0].compute_idx)
    }

    fn done(&self, s: SeqId) -> bool {
        self.rt.is_completed(s).unwrap()
    }

    /// Whether `s` completes within 5 s of polling. One `is_completed` is a poll, not a
    /// wait: while the XU worker is inside a harvest step that the records feed, the
    /// client's own step finds the harvest taken and `s` not yet retired (1 run in ~60).
    fn completes(&self, s: SeqId) -> bool {
        let t0 = std::time::Instant::now();
        while !self.done(s) {
            if t0.elapsed() > Duration::from_secs(5) {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }
}

/// How the device serves a lockstep vcore reaches the published statistics (`nrt monitor`,
/// `nrt top`), refreshed by the harvest's deadline sweep while the vcore is in use.
#[test]
fn the_published_statistics_say_how_a_lockstep_vcore_is_served() {
    let r = rig(2, Duration::from_millis(500));
    assert_eq!(r.rt.stats(0).unwrap().lockstep_serving, 0);
    r.dev.set_lockstep_serving(Some(nrt_hal::LockstepServing {
        joint: true,
        changes: 3,
    }));
    let (s, _) = r.schedule();
    // Idle polls sweep the deadlines once a millisecond at most.
    let t0 = std::time::Instant::now();
    while r.rt.stats(0).unwrap().lockstep_serving != (3 << 1) | 1 {
        assert!(!r.done(s));
        assert!(
            t0.elapsed() < Duration::from_millis(400),
            "never published: {}",
            r.rt.stats(0).unwrap().lockstep_serving
        );
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn completes_only_after_every_engine_ended_in_any_order() {
    let r = rig(1, Duration::from_secs(5));
    let (s, idx) = r.schedule();
    assert_eq!(r.dev.doorbells(0), 1);
    // Ends before other engines' starts, reverse order, a duplicate END.
    let order = [
        Engine::Sp,
        Engine::Dve,
        Engine::Pe,
        Engine::Act,
        Engine::Pool,
    ];
    for e in order {
        r.dev.engine(0, e, idx, false);
    }
    assert!(!r.done(s));
    for (k, e) in order.iter().rev().enumerate() {
        r.dev.engine(0, *e, idx, true);
        if k == 0 {
            r.dev.engine(0, *e, idx, true); // a repeated END counts once
        }
        if k == order.len() - 1 {
            assert!(r.completes(s), "after the last END");
        } else {
            assert!(!r.done(s), "after {k} ENDs");
        }
    }
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::Success);
}

#[test]
fn two_executions_records_interleaved_complete_independently() {
    let r = rig(1, Duration::from_secs(5));
    let (s1, i1) = r.schedule();
    let (s2, i2) = r.schedule();
    assert_eq!(i2, i1 + 1);
    // The second one's records first: it completes before the first.
    r.dev.run_all(0, i2);
    assert!(r.completes(s2) && !r.done(s1));
    for e in Engine::ALL {
        r.dev.engine(0, e, i1, false);
    }
    assert!(!r.done(s1));
    for e in Engine::ALL {
        r.dev.engine(0, e, i1, true);
    }
    assert!(r.completes(s1));
    assert_eq!(r.rt.wait(s1).unwrap(), NrtStatus::Success);
    assert_eq!(r.rt.wait(s2).unwrap(), NrtStatus::Success);
}

#[test]
fn a_non_aborting_error_reports_at_the_end_an_aborting_one_at_once() {
    let r = rig(1, Duration::from_secs(5));
    let (s, idx) = r.schedule();
    r.dev.error(0, ErrorSubtype::Numerical, Engine::Act, idx);
    assert!(!r.done(s), "a numerical error does not end the execution");
    r.dev.run_all(0, idx);
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::ExecCompletedWithNumErr);

    let (s, idx) = r.schedule();
    r.dev.engine(0, Engine::Sp, idx, false);
    r.dev.error(0, ErrorSubtype::DmaAbort, Engine::Sp, idx);
    assert!(
        r.completes(s),
        "an aborting error ends it without END records"
    );
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::ExecHwErrDmaAbort);
    // Its late END records are stale and change nothing.
    r.dev.run_all(0, idx);
    let (s, idx) = r.schedule();
    r.dev.run_all(0, idx);
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::Success);
}

#[test]
fn the_first_error_wins() {
    let r = rig(1, Duration::from_secs(5));
    let (s, idx) = r.schedule();
    r.dev.error(0, ErrorSubtype::Transient, Engine::Pe, idx);
    r.dev.error(0, ErrorSubtype::Numerical, Engine::Act, idx);
    r.dev.run_all(0, idx);
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::ExecCompletedWithErr);
}

#[test]
fn missing_records_decode_as_dropped_notifications_or_a_hang() {
    let r = rig(1, Duration::from_millis(100));
    // No records at all and no cause bit: the notifications were dropped.
    let (s, idx) = r.schedule();
    r.dev.engine(0, Engine::Pe, idx, false);
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::ExecSwNqOverflow);
    // The watchdog's cause bit: a hang.
    let (s, _) = r.schedule();
    r.dev.set_cause(0, cause::EXEC_TIMEOUT);
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::Timeout);
    assert_eq!(
        r.dev.interrupt_cause_now(0) & cause::EXEC_TIMEOUT,
        0,
        "the harvest clears the cause bit it decoded"
    );
}

#[test]
fn lockstep_execution_waits_for_the_late_partner() {
    let r = rig(2, Duration::from_secs(5));
    let s = r.rt.execute_schedule(&r.m, &r.ins, &r.outs).unwrap();
    let (q0, q1) = (r.dev.staged(0), r.dev.staged(1));
    assert_eq!((q0.len(), q1.len()), (1, 1), "one request per core");
    assert_eq!(q0[0].compute_idx, q1[0].compute_idx, "one compute index");
    assert_eq!((r.dev.doorbells(0), r.dev.doorbells(1)), (1, 1));
    let idx = q0[0].compute_idx;
    r.dev.run_all(0, idx);
    assert!(!r.done(s), "core 1 has not even started");
    r.dev.engine(1, Engine::Pe, idx, false);
    assert!(!r.done(s));
    for e in Engine::ALL {
        r.dev.engine(1, e, idx, false);
        r.dev.engine(1, e, idx, true);
    }
    assert!(r.completes(s));
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::Success);
}

#[test]
fn a_fatal_error_fails_what_is_queued_behind_it_and_nothing_ahead() {
    let r = rig(1, Duration::from_secs(30));
    let (s1, i1) = r.schedule();
    let (s2, i2) = r.schedule();
    let (s3, _) = r.schedule();
    let (s4, _) = r.schedule();
    // The first ran to its end, but its END records are not drained yet when the fatal
    // error of the second arrives: it keeps its own status.
    r.dev.run_all(0, i1);
    r.dev.error(0, ErrorSubtype::Fatal, Engine::Pe, i2);
    assert_eq!(r.rt.wait(s1).unwrap(), NrtStatus::Success);
    for s in [s2, s3, s4] {
        assert!(
            r.completes(s),
            "finished at once, not after the 30 s timeout"
        );
        assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::ExecUnitUnrecoverable);
    }
    assert_eq!(
        r.rt.execute_schedule(&r.m, &r.ins, &r.outs)
            .unwrap_err()
            .status,
        NrtStatus::ExecUnitUnrecoverable
    );
    r.rt.reset_vnc(0).unwrap();
    let (s, idx) = r.schedule();
    r.dev.run_all(0, idx);
    assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::Success);
}

/// A thread's first wait readies it for device work (`Device::prepare_thread`: the software
/// device's kernels set up their per-thread state then, not on the first product the thread
/// runs while assisting its core, deep in its steady state) — once per thread; later waits
/// do not call it again, and the XU worker, which never assists, is never readied. A thread
/// that only polls `is_completed` is readied on its first idle poll.
#[test]
fn a_thread_is_readied_for_device_work_on_its_first_wait_only() {
    std::thread::spawn(|| {
        let r = rig(1, Duration::from_secs(5));
        let me = std::thread::current().id();
        for round in 0..3 {
            let (s, idx) = r.schedule();
            r.dev.run_all(0, idx);
            assert_eq!(r.rt.wait(s).unwrap(), NrtStatus::Success, "round {round}");
            assert_eq!(r.dev.prepared_threads(), vec![me], "after wait {round}");
        }
        // A thread that only polls `is_completed` is readied on its first idle poll.
        let (s, idx) = r.schedule();
        let poller = std::thread::scope(|sc| {
            sc.spawn(|| {
                assert!(!r.done(s), "no record posted yet");
                std::thread::current().id()
            })
            .join()
            .unwrap()
        });
        assert_eq!(r.dev.prepared_threads(), vec![me, poller], "after a poll");
        r.dev.run_all(0, idx);
        assert!(r.completes(s));
        assert_eq!(r.dev.prepared_threads(), vec![me, poller], "after polls");
    })
    .join()
    .unwrap();
}

/// `NRT_SIM_SYNC_ON_CALLER` decides which synchronous executions the caller offers to run on
/// its own thread (`Device::host_serves`, refused by the scripted device, so each is then
/// waited for as usual): `always` every one, from the first; `short` only those whose model
/// is expected within `tuning::SYNC_SERVES_CORE_MAX`, so not the first (no history yet);
/// `never` none.
#[test]
fn the_sync_on_caller_policy_decides_which_executions_the_caller_offers_to_run() {
    use nrt_runtime::SyncOnCaller;
    use std::sync::atomic::{AtomicBool, Ordering};
    for policy in [
        SyncOnCaller::Always,
        SyncOnCaller::Short,
        SyncOnCaller::Never,
    ] {
        let r = rig_with(
            RuntimeConfig {
                sync_on_caller: policy,
                ..RuntimeConfig::default()
            },
            Duration::from_secs(5),
        );
        let offers = || {
            r.dev
                .serve_requests()
                .iter()
                .filter(|&&(nc, on)| nc == 0 && on)
                .count()
        };
        let stop = AtomicBool::new(false);
        let mut after_first = 0;
        std::thread::scope(|sc| {
            // The device: runs every request the runtime stages, as soon as it is staged.
            sc.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    for req in r.dev.staged(0) {
                        r.dev.run_all(0, req.compute_idx);
                    }
                    std::thread::yield_now();
                }
            });
            for k in 0..20 {
                r.rt.execute(&r.m, &r.ins, &r.outs).unwrap();
                if k == 0 {
                    after_first = offers();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        let (first, all) = match policy {
            SyncOnCaller::Always => (1, Some(20)),
            SyncOnCaller::Short => (0, None),
            SyncOnCaller::Never => (0, Some(0)),
        };
        assert_eq!(
            after_first, first,
            "{policy:?}: offers after the first execution"
        );
        if let Some(all) = all {
            assert_eq!(offers(), all, "{policy:?}: offers after 20 executions");
        }
    }
}
