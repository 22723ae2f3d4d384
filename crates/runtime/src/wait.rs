//! How a thread waits for the device between harvest steps (the wait policy). Every waiting
//! loop of the runtime — a synchronous caller, an explicit `wait`, the XU worker, a drain or
//! unload — drives the harvest and, after a step that found nothing, calls one of the two
//! waits here. Neither sleeps for a fixed time. (A tensor read under implicit async waits
//! for the execution's owner to retire it: a [`nrt_hal::Waiter`] on the vcore's wake, with
//! no harvest of its own — `surface::tensor_ops`. A synchronous caller queued behind the
//! caller that serves its core first waits for that one to run its execution, on the
//! served wake — `nrt_hal::ServedCore`, `surface::sync::wait_served`.)
//!
//! - [`VcoreWait`]: spins as long as it pays ([`nrt_hal::SpinBudget`]: a few µs for a
//!   near-null model, nothing for one expected to take longer than
//!   [`nrt_hal::tuning::WAIT_SPIN_CAP`]), then blocks on the vcore's completion wake
//!   ([`nrt_hal::CompletionWake`]) until a core publishes records or its condition holds.
//!   The device signals the wake after every publication; a harvest step signals it when it
//!   writes the completion word of an execution some other thread owns, and after settling
//!   explicit executions; the XU worker after retiring implicit ones. A synchronous caller
//!   blocks on its execution's own wake instead ([`nrt_hal::ExecutionWakes`],
//!   [`VCore::execution_wake`]), which the device signals when that execution ends and a
//!   harvest step when it writes that execution's completion word for another thread: it is
//!   not woken for the other executions of its core. A vcore whose device cannot signal
//!   never blocks (it spins and yields).
//! - [`Spin`]: spins, then spins with a `sched_yield` every few polls, never blocking — for
//!   the rare waits on a state no thread signals (a free I/O set or slot, an unload's
//!   in-flight count).

use crate::vcore::VCore;
use nrt_hal::{CompletionWake, Device, SpinBudget, Waiter, tuning};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A wait on one vcore (see the module docs).
pub(crate) struct VcoreWait<'a> {
    waiter: Waiter<'a>,
    vc: &'a VCore,
    device: &'a dyn Device,
    /// Idle polls so far (paces [`Device::assist`]).
    idle: u32,
    /// Whether this waiter lends its thread to the device (not the XU worker's).
    assists: bool,
}

impl<'a> VcoreWait<'a> {
    /// A wait that may spin `spin` (past its pure spin) before it blocks.
    #[inline]
    pub(crate) fn new(device: &'a dyn Device, vc: &'a VCore, spin: Duration) -> VcoreWait<'a> {
        VcoreWait::on(device, vc, vc.wake.as_deref(), spin)
    }

    /// As [`VcoreWait::new`], blocking on `wake` (the vcore's, or one execution's).
    #[inline]
    fn on(
        device: &'a dyn Device,
        vc: &'a VCore,
        wake: Option<&'a CompletionWake>,
        spin: Duration,
    ) -> VcoreWait<'a> {
        prepare_assisting_thread(device);
        VcoreWait {
            waiter: Waiter::new(wake, spin),
            vc,
            device,
            idle: 0,
            assists: true,
        }
    }

    /// As [`VcoreWait::new`] with the spin limit of `budget` and, for a long execution, its
    /// pre-wake ([`Waiter::with_prewake`]): a caller waiting for its own execution, created
    /// right after the doorbell (the pre-wake counts from now); an execution too short to
    /// pre-wake for is spun for ([`SpinBudget::spin_limit_spare_cpu`]). Both only where a CPU
    /// is left beside the vcore's device threads: a model spanning every CPU keeps them all busy,
    /// and a spinning caller would take one from a device thread (`encoder --cores 2` on 2
    /// vCPUs: 1.07× the time with the pre-wake, caller CPU 4.3% → 8.6%).
    /// It blocks on execution `seq`'s own wake ([`VCore::execution_wake`]).
    #[inline]
    pub(crate) fn for_execution(
        device: &'a dyn Device,
        vc: &'a VCore,
        budget: &'a SpinBudget,
        seq: u64,
    ) -> VcoreWait<'a> {
        let wake = vc.execution_wake(seq);
        if vc.cores.len() < cpus() {
            let mut w = VcoreWait::on(device, vc, wake, budget.spin_limit_spare_cpu());
            w.waiter = w.waiter.with_prewake(budget);
            w
        } else {
            VcoreWait::on(device, vc, wake, budget.spin_limit())
        }
    }

    /// The wait of a synchronous caller whose execution was staged behind `ahead` others
    /// still running on the vcore (other threads' executions: the core runs one at a time).
    /// Its completion is that many executions further off than the budget says, so it spins
    /// only while all of them together are expected within [`tuning::WAIT_SPIN_CAP`], and
    /// otherwise blocks at once — without a pre-wake, which would time the first execution
    /// ahead, not its own. Several callers of a short model spinning side by side held every
    /// vCPU while one of them ran the core (`mlp`, 4 threads on 2 vCPUs: 1.7 vCPUs for 0.8×
    /// the throughput of one thread). It blocks on execution `seq`'s own wake
    /// ([`VCore::execution_wake`]): on the vcore's, every publication — the executions
    /// queued ahead finishing one by one — woke every caller queued behind them (`mlp`, 4
    /// threads: ~4 context switches per execution).
    #[inline]
    pub(crate) fn queued(
        device: &'a dyn Device,
        vc: &'a VCore,
        budget: &SpinBudget,
        seq: u64,
        ahead: u64,
    ) -> VcoreWait<'a> {
        let wake = vc.execution_wake(seq);
        VcoreWait::on(device, vc, wake, queued_spin_limit(budget, ahead))
    }

    /// The XU worker's wait: as [`VcoreWait::new`], but it never runs device work. The
    /// worker is a third thread on a 2-vCPU machine already; lent to the device it competed
    /// with the device thread for the core and delayed the harvest and callbacks it exists
    /// for (implicit depth 8: 0.86× the throughput when it assisted after its pure spin).
    #[inline]
    pub(crate) fn worker(device: &'a dyn Device, vc: &'a VCore, spin: Duration) -> VcoreWait<'a> {
        VcoreWait {
            waiter: Waiter::new(vc.wake.as_deref(), spin),
            vc,
            device,
            idle: 0,
            assists: false,
        }
    }

    /// Called after a step that found nothing. `ready` is the loop's own condition (a
    /// completion word, a retirement, a count); it must be something whose writer signals
    /// the vcore's wake after writing it.
    #[inline]
    pub(crate) fn idle(&mut self, ready: impl FnOnce() -> bool) {
        let vc = self.vc;
        self.idle = self.idle.wrapping_add(1);
        // Early, once: the device has not even taken the doorbell (its thread is not
        // running).
        if self.assists && self.idle == tuning::HOST_EARLY_ASSIST_POLLS && self.assist_untaken() {
            return;
        }
        // Past the pure spin, right before each of the waiter's yields (the counts agree:
        // both start at 0 and count these calls) — and on every idle step while the vcore's
        // last assist ran work ([`VCore::assisting`]: the device thread is not running) and
        // its executions are short (a long one stays on the device thread).
        if self.assists
            && ((self.idle >= tuning::HARVEST_PURE_SPIN_POLLS
                && self
                    .idle
                    .is_multiple_of(tuning::HOST_ASSIST_EVERY_IDLE_POLLS))
                || (vc.assisting.load(Ordering::Relaxed)
                    && vc
                        .spin
                        .expected()
                        .is_some_and(|e| e < tuning::WAIT_SPIN_CAP)))
        {
            let ran = self.assist();
            vc.assisting.store(ran, Ordering::Relaxed);
            if ran {
                return;
            }
        }
        if self.waiter.idle(|| vc.has_records() || ready()) {
            // It blocked (up to WAIT_BLOCK_RECHECK): make the next idle step sweep the
            // deadlines, which otherwise wait for HARVEST_DEADLINE_EVERY_IDLE_STEPS idle
            // steps — far apart once each follows a block. A hung execution then times out
            // within a recheck of its deadline.
            vc.idle_polls.store(
                tuning::HARVEST_DEADLINE_EVERY_IDLE_STEPS - 1,
                Ordering::Relaxed,
            );
        }
    }
}

/// How long one execution takes to run, queueing left out (`service`, [`VCore::service`];
/// before its first sample the average latency, `latency`). What decides whether a
/// synchronous caller serves the core (`surface::sync`): with several callers every latency
/// includes the others' executions, and `int8_gemm` (~90 µs) from two threads read ~200 µs, past
/// [`tuning::SYNC_SERVES_CORE_MAX`], so nobody served and both callers blocked on the
/// device's wake.
#[inline]
pub(crate) fn service_time(service: &SpinBudget, latency: &SpinBudget) -> Option<Duration> {
    service.expected().or_else(|| latency.expected())
}

/// How long a caller whose execution waits behind `ahead` others spins before it blocks
/// ([`VcoreWait::queued`]): the budget's spin limit while the whole queue is expected within
/// [`tuning::WAIT_SPIN_CAP`], nothing otherwise (or without history).
pub(crate) fn queued_spin_limit(budget: &SpinBudget, ahead: u64) -> Duration {
    let n = u32::try_from(ahead.saturating_add(1)).unwrap_or(u32::MAX);
    let soon = budget
        .expected()
        .and_then(|e| e.checked_mul(n))
        .is_some_and(|all| all < tuning::WAIT_SPIN_CAP);
    if soon {
        budget.spin_limit()
    } else {
        Duration::ZERO
    }
}

/// [`Device::prepare_thread`] on this thread's first wait that may assist, or its first idle
/// poll of `is_completed` (a thread-local flag: one load after that). An assist may run any
/// instruction on the waiting thread, and the first one to reach a kernel with per-thread
/// state would otherwise allocate in the thread's steady state (a model going through the
/// GEMM crate: one allocation the first time a co-tenant held the device thread's vCPU). The
/// flag is the thread's, not the device's: one device per process is the case it serves.
#[inline]
pub(crate) fn prepare_assisting_thread(device: &dyn Device) {
    thread_local! {
        static PREPARED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    // `try_with`: a wait during thread teardown simply does not prepare.
    if PREPARED.try_with(|p| p.replace(true)) == Ok(false) {
        device.prepare_thread();
    }
}

/// The CPUs this process may run on (`std::thread::available_parallelism`, read once and
/// cached; at least 1).
pub(crate) fn cpus() -> usize {
    static CPUS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    match CPUS.load(Ordering::Relaxed) {
        0 => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            CPUS.store(n, Ordering::Relaxed);
            n
        }
        n => n,
    }
}

impl VcoreWait<'_> {
    /// Lends this thread to the vcore's cores ([`Device::assist`]): a spinning waiter whose
    /// device thread is not running (a co-tenant holds its vCPU) runs the work itself.
    /// [`VcoreWait::assist`] only where the device has not taken the doorbell
    /// ([`Device::assist_untaken`]).
    #[cold]
    fn assist_untaken(&self) -> bool {
        self.lend(|d, c| d.assist_untaken(c))
    }

    #[cold]
    fn assist(&self) -> bool {
        self.lend(|d, c| d.assist(c))
    }

    /// `f` on each of the vcore's cores; whether any ran work.
    #[inline]
    fn lend(&self, f: impl Fn(&dyn Device, u32) -> bool) -> bool {
        let mut any = false;
        for &c in &self.vc.cores {
            any |= f(self.device, c);
        }
        any
    }
}

/// A wait that never blocks (see the module docs).
pub(crate) struct Spin(Waiter<'static>);

impl Spin {
    #[inline]
    pub(crate) const fn new() -> Spin {
        Spin(Waiter::new(None, Duration::MAX))
    }

    /// Called after a step that found nothing: a pure spin of
    /// [`nrt_hal::tuning::HARVEST_PURE_SPIN_POLLS`] polls, then a `sched_yield` every
    /// [`nrt_hal::tuning::HARVEST_YIELD_EVERY_POLLS`] (a device thread that shares the vCPU runs).
    #[inline]
    pub(crate) fn snooze(&mut self) {
        self.0.idle(|| false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget_of(latency: Duration) -> SpinBudget {
        let b = SpinBudget::new();
        for _ in 0..64 {
            b.record(latency);
        }
        b
    }

    #[test]
    fn service_time_leaves_queueing_out_once_it_has_a_sample() {
        // Two callers of a 90 µs model: each latency holds the other's execution too.
        let latency = budget_of(Duration::from_micros(190));
        let service = SpinBudget::new();
        assert_eq!(service_time(&service, &latency), latency.expected());
        for _ in 0..64 {
            service.record(Duration::from_micros(90));
        }
        let s = service_time(&service, &latency).unwrap();
        assert!(
            s < tuning::SYNC_SERVES_CORE_MAX && s >= Duration::from_micros(89),
            "{s:?}"
        );
        assert_eq!(service_time(&SpinBudget::new(), &SpinBudget::new()), None);
    }

    #[test]
    fn a_caller_behind_others_spins_only_for_a_queue_expected_soon() {
        // Near-null (1 µs): eight ahead are still well within the cap — spin as usual.
        let near_null = budget_of(Duration::from_micros(1));
        assert_eq!(queued_spin_limit(&near_null, 8), near_null.spin_limit());
        // A 30 µs model spins alone (its own budget), but one execution ahead puts the wait
        // past the cap: block at once.
        let short = budget_of(Duration::from_micros(30));
        assert!(!short.spin_limit().is_zero());
        assert_eq!(queued_spin_limit(&short, 0), short.spin_limit());
        assert_eq!(queued_spin_limit(&short, 1), Duration::ZERO);
        // No history, and absurd queue lengths, block.
        assert_eq!(queued_spin_limit(&SpinBudget::new(), 1), Duration::ZERO);
        assert_eq!(queued_spin_limit(&near_null, u64::MAX), Duration::ZERO);
    }
}
