//! The XU worker: one thread per logical core, the async driver of the harvest. While
//! async executions (implicit or explicit) are in flight it drives the harvest
//! ([`crate::completion::drive`], which settles the explicit executions its steps finish) and
//! retires the implicit ones it owns ([`super::implicit::retire_done`]). With nothing async
//! in flight it parks on the XU's [`nrt_hal::IdleGate`]; the submission that ends that state
//! wakes it ([`super::submit_async`]).

use super::implicit::retire_done;
use crate::RuntimeInner;
use crate::completion::{drive, drive_worker};
use crate::error::{NrtError, Result};
use crate::harvest::Step;
use crate::vcore::VCore;
use crate::wait::VcoreWait;
use nrt_hal::{NrtStatus, tuning};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

/// Starts one worker per vcore and returns when all of them are running, so that whatever
/// a thread allocates to start happens inside `init`, never during an execution.
pub(crate) fn start_workers(rt: &Arc<RuntimeInner>) -> Result<()> {
    let mut w = rt.workers.lock().unwrap_or_else(|e| e.into_inner());
    for vnc in 0..rt.vcores.len() {
        let r = rt.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nrt-xu-{vnc}"))
            .spawn(move || worker(r, vnc));
        match spawned {
            Ok(h) => w.push(h),
            Err(e) => {
                drop(w);
                stop_workers(rt);
                return Err(NrtError::new(
                    NrtStatus::Resource,
                    format!("cannot start the XU worker of logical core {vnc}: {e}"),
                ));
            }
        }
    }
    let n = w.len();
    drop(w);
    while rt.workers_started.load(Ordering::Acquire) < n {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    Ok(())
}

/// Stops the workers (at close).
pub(crate) fn stop_workers(rt: &RuntimeInner) {
    rt.stop.store(true, Ordering::Release);
    for vc in rt.vcores.iter() {
        vc.xu.gate.notify();
        // A worker blocked on the completion wake checks `stop` too.
        vc.signal_waiters();
    }
    let handles: Vec<JoinHandle<()>> =
        std::mem::take(&mut *rt.workers.lock().unwrap_or_else(|e| e.into_inner()));
    let me = std::thread::current().id();
    for h in handles {
        if h.thread().id() != me {
            let _ = h.join();
        }
    }
}

/// Waits until nothing async is in flight anywhere (close, unload).
pub(crate) fn drain_all(rt: &RuntimeInner) {
    for vc in rt.vcores.iter() {
        drain_vcore(rt, vc);
    }
}

pub(crate) fn drain_vcore(rt: &RuntimeInner, vc: &VCore) {
    // The count drops when an explicit execution is settled or the worker retires an
    // implicit one; both signal the vcore's wake.
    let mut w = VcoreWait::new(&*rt.device, vc, vc.spin.spin_limit());
    while vc.xu.async_inflight.load(Ordering::Acquire) != 0 {
        vc.xu.gate.notify();
        if drive(rt, vc, 0) == Step::Idle {
            w.idle(|| vc.xu.async_inflight.load(Ordering::Acquire) == 0);
        }
    }
}

/// The worker loop of one vcore.
fn worker(rt: Arc<RuntimeInner>, vnc: usize) {
    let vc = &rt.vcores[vnc];
    vc.xu.gate.register_sleeper();
    rt.workers_started.fetch_add(1, Ordering::Release);
    let mut cursor = 1u64; // oldest seq the worker may still have to retire
    let mut w = VcoreWait::worker(&*rt.device, vc, vc.spin.spin_limit());
    let mut last_external = vc.counters.external_harvests.load(Ordering::Relaxed);
    let mut defer = tuning::HARVEST_SLEEP;
    while !rt.stop.load(Ordering::Acquire) {
        if vc.xu.async_inflight.load(Ordering::Acquire) == 0 {
            // Nothing async in flight: synchronous callers harvest their own executions, so
            // the worker has no reason to compete with them (or with the device thread) for
            // the two vCPUs. Park until a submitter publishes async work — after a short
            // grace: a pipelining async client often lets the count touch 0 between its
            // submissions, and a park then costs the worker a futex wait and the client a
            // wake (one pair every ~17 executions at implicit depth 8).
            // Only when the worker itself was harvesting: a client that polls (explicit
            // `is_completed`/`wait`) harvests its own, and a lingering worker would take the
            // CPU it needs (explicit depth 1: 0.87× the throughput).
            let since = std::time::Instant::now();
            let mut polls = 0u32;
            let harvesting = vc.counters.external_harvests.load(Ordering::Relaxed) == last_external;
            while harvesting
                && vc.xu.async_inflight.load(Ordering::Acquire) == 0
                && !rt.stop.load(Ordering::Acquire)
            {
                polls = polls.wrapping_add(1);
                if polls.is_multiple_of(tuning::HARVEST_YIELD_EVERY_POLLS) {
                    if since.elapsed() >= tuning::XU_PARK_GRACE {
                        break;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
            if vc.xu.async_inflight.load(Ordering::Acquire) != 0 {
                continue;
            }
            vc.xu.gate.sleep_until(|| {
                rt.stop.load(Ordering::Acquire) || vc.xu.async_inflight.load(Ordering::Acquire) != 0
            });
            w = VcoreWait::worker(&*rt.device, vc, vc.spin.spin_limit());
            continue;
        }
        let external = vc.counters.external_harvests.load(Ordering::Relaxed);
        if external != last_external {
            // A client is harvesting (polling is_completed/wait, or a sync caller): a third
            // runnable thread on two vCPUs would only steal its CPU, and a worker blocked on
            // the completion wake would be woken by every publication the client harvests.
            // Retire what its harvest finished, then park on the XU gate for a time that
            // grows while the client keeps polling (a close or a submission ends it early);
            // when the client stops, the worker takes over within `XU_DEFER_MAX`. "The
            // client stopped polling" is the absence of an event, so this one wait is timed.
            last_external = external;
            if retire_done(&rt, vc, &mut cursor) {
                vc.signal_waiters();
            }
            vc.xu
                .gate
                .sleep_until_timeout(defer, || rt.stop.load(Ordering::Acquire));
            defer = (defer * 2).min(tuning::XU_DEFER_MAX);
            w = VcoreWait::worker(&*rt.device, vc, vc.spin.spin_limit());
            continue;
        }
        defer = tuning::HARVEST_SLEEP;
        let progressed = drive_worker(&rt, vc) != Step::Idle;
        let retired = retire_done(&rt, vc, &mut cursor);
        if retired {
            // Drains and tensor reads wait for what the worker retires.
            vc.signal_waiters();
            // The callbacks it just ran are what the client waits for: if the client shares
            // this vCPU (three runnable threads on two), hand it the CPU now, before the
            // worker spins for the next completion; alone, the yield returns in ~0.3 µs once
            // per batch it retires.
            std::thread::yield_now();
        }
        if progressed || retired {
            w = VcoreWait::worker(&*rt.device, vc, vc.spin.spin_limit());
            continue;
        }
        // Spin while a completion is expected soon, then block until a core publishes
        // records (or the work is gone, or the runtime closes).
        w.idle(|| {
            rt.stop.load(Ordering::Acquire) || vc.xu.async_inflight.load(Ordering::Acquire) == 0
        });
    }
}
