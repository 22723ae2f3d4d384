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
use std::time::Instant;

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
    let mut serving = Serving::new(&rt, vc);
    while !rt.stop.load(Ordering::Acquire) {
        if vc.xu.async_inflight.load(Ordering::Acquire) == 0 {
            serving.release();
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
        // A client that armed a completion eventfd waits for the worker now, whatever it
        // polled before (read only when it did: the swap is a locked instruction).
        if external != last_external && vc.xu.relied_on.swap(false, Ordering::AcqRel) {
            last_external = external;
        }
        if external != last_external {
            // A client is harvesting (polling is_completed/wait, or a sync caller): a third
            // runnable thread on two vCPUs would only steal its CPU, and a worker blocked on
            // the completion wake would be woken by every publication the client harvests.
            // Retire what its harvest finished, then park on the XU gate for a time that
            // grows while the client keeps polling (a close or a submission ends it early);
            // when the client stops, the worker takes over within `XU_DEFER_MAX` (within
            // `XU_DEFER_MAX_XU_EVENTFD` while an XU completion eventfd is registered; arming
            // an eventfd calls it at once, above). "The client stopped polling" is the absence
            // of an event, so this one wait is timed.
            last_external = external;
            serving.release();
            if retire_done(&rt, vc, &mut cursor) {
                vc.signal_waiters();
            }
            vc.xu
                .gate
                .sleep_until_timeout(defer, || rt.stop.load(Ordering::Acquire));
            let cap = if vc.xu.compute_efd.load(Ordering::Relaxed) >= 0 {
                tuning::XU_DEFER_MAX_XU_EVENTFD
            } else {
                tuning::XU_DEFER_MAX
            };
            defer = (defer * 2).min(cap);
            w = VcoreWait::worker(&*rt.device, vc, vc.spin.spin_limit());
            continue;
        }
        defer = tuning::HARVEST_SLEEP;
        let ran = serving.run();
        let progressed = drive_worker(&rt, vc) != Step::Idle || ran;
        let retired = retire_done(&rt, vc, &mut cursor);
        if retired {
            serving.retired();
            // Drains and tensor reads wait for what the worker retires.
            vc.signal_waiters();
            // The callbacks it just ran are what the client waits for: if the client shares
            // this vCPU (three runnable threads on two), hand it the CPU now, before the
            // worker spins for the next completion; alone, the yield returns in ~0.3 µs once
            // per batch it retires. Not while it serves the core: then the client and the
            // worker are the only runnable threads.
            if !serving.on {
                std::thread::yield_now();
            }
        }
        if progressed || retired {
            serving.idle_since = None;
            w = VcoreWait::worker(&*rt.device, vc, vc.spin.spin_limit());
            continue;
        }
        if serving.idle() {
            continue;
        }
        // Spin while a completion is expected soon, then block until a core publishes
        // records (or the work is gone, or the runtime closes).
        w.idle(|| {
            rt.stop.load(Ordering::Acquire) || vc.xu.async_inflight.load(Ordering::Acquire) == 0
        });
    }
    serving.release();
}

/// The worker's side of [`nrt_hal::Device::host_serves`]: on a host with at most
/// [`tuning::XU_SERVES_CORE_MAX_CPUS`] CPUs, while implicit executions of a short model
/// (expected under [`tuning::WAIT_SPIN_CAP`]) are in flight on a one-core vcore, the worker
/// runs the core's work itself ([`nrt_hal::Device::assist`]) and the device's thread parks:
/// the client, the worker and the device thread were three runnable threads on two vCPUs,
/// and every hand-off between the two that shared one was a context switch (~1.2 µs under
/// KVM here). It stops serving — handing back what is pending — whenever it leaves the loop's
/// busy path: nothing async in flight, a client harvesting by itself, an idle spell of
/// [`tuning::WAIT_SPIN_CAP`], close. A callback that runs long holds the core only until the
/// device thread's next look ([`tuning::DEVICE_HOST_SERVED_CHECK`]).
struct Serving<'a> {
    rt: &'a RuntimeInner,
    vc: &'a VCore,
    /// The vcore and the host qualify, and the device honours it.
    eligible: bool,
    /// Serving now.
    on: bool,
    /// It stopped after an idle spell; it serves again once something is retired.
    rested: bool,
    /// When the current idle spell began (idle polls while serving).
    idle_since: Option<Instant>,
    idle_polls: u32,
}

impl<'a> Serving<'a> {
    fn new(rt: &'a RuntimeInner, vc: &'a VCore) -> Serving<'a> {
        let eligible = rt.implicit_async.is_some()
            && vc.cores.len() == 1
            && crate::wait::cpus() <= tuning::XU_SERVES_CORE_MAX_CPUS;
        if eligible {
            // It may run any instruction: its kernels' per-thread state is set up now, at
            // init, not inside its first execution.
            rt.device.prepare_thread();
        }
        Serving {
            rt,
            vc,
            eligible,
            on: false,
            rested: false,
            idle_since: None,
            idle_polls: 0,
        }
    }

    /// Serves the core if it should, then runs what the core has — up to
    /// [`tuning::XU_SERVE_BATCH`] polls, so the harvest and the callbacks of what ran are not
    /// held back for long; whether any ran work.
    #[inline]
    fn run(&mut self) -> bool {
        if !self.on {
            if !self.eligible || self.rested || !self.short() {
                return false;
            }
            let c = self.vc.cores[0];
            if !self.rt.device.host_serves(c, true) {
                self.eligible = false; // a device that does not take it
                return false;
            }
            self.on = true;
        } else if !self.short() {
            // The model got long: its work goes back to the device thread.
            self.release();
            return false;
        }
        let c = self.vc.cores[0];
        let mut ran = false;
        for _ in 0..tuning::XU_SERVE_BATCH {
            if !self.rt.device.assist(c) {
                break;
            }
            ran = true;
        }
        ran
    }

    /// Whether the vcore's executions are expected within [`tuning::WAIT_SPIN_CAP`].
    #[inline]
    fn short(&self) -> bool {
        self.vc
            .spin
            .expected()
            .is_some_and(|e| e < tuning::WAIT_SPIN_CAP)
    }

    /// Something was retired: an idle spell's rest is over.
    #[inline]
    fn retired(&mut self) {
        self.rested = false;
    }

    /// An idle poll while serving: spins, yields now and then, and after an idle spell of
    /// [`tuning::WAIT_SPIN_CAP`] stops serving (the worker then waits as usual). Whether it
    /// handled the poll (false: not serving).
    #[inline]
    fn idle(&mut self) -> bool {
        if !self.on {
            return false;
        }
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if !self
            .idle_polls
            .is_multiple_of(tuning::HARVEST_YIELD_EVERY_POLLS)
        {
            std::hint::spin_loop();
            return true;
        }
        std::thread::yield_now();
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= tuning::WAIT_SPIN_CAP {
            self.release();
            self.rested = true;
        }
        true
    }

    /// Stops serving (if it does): the device's thread takes the core back, woken if work is
    /// pending.
    #[inline]
    fn release(&mut self) {
        if core::mem::take(&mut self.on) {
            self.rt.device.host_serves(self.vc.cores[0], false);
        }
        self.idle_since = None;
    }
}
