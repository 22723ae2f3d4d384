//! The completion wake: how a host thread waiting for a completion stops burning its vCPU —
//! it asks for an "interrupt", sleeps on a futex, and the device (or any thread that writes a
//! completion) wakes it. The io_uring `IORING_ENTER_GETEVENTS` pattern, with the same
//! barrier pair as [`crate::IdleGate`] (io-uring issue #197).
//!
//! # Protocol
//!
//! One 32-bit futex word: bit 0 is the *armed* flag ("a waiter asked for an interrupt", the
//! io_uring `NEED_WAKEUP` flag), bits 1.. an epoch that each wake-up advances.
//!
//! ```text
//!   waiter (host thread, after its spin budget)      signaler (the device after publishing records;
//!                                                     a harvester after writing a completion word)
//!   s = word.fetch_or(ARMED)   -- ask for a wake-up   <make the completion visible: Release store>
//!   heavy_fence()                                     light_fence()
//!   if ready() { return }                             s = word.load()
//!   futex_wait(word, s | ARMED)                       if s & ARMED {
//!     -- sleeps only while the word is unchanged          cas(s, (s & !ARMED) + 2)  -- disarm, next epoch
//!                                                         futex_wake_all(word)       -- by the one that disarmed
//!                                                     }
//! ```
//!
//! The fences are an asymmetric pair (`sync::light_fence` / `heavy_fence`): with
//! `membarrier(2)` the signaler's is a compiler barrier and the waiter, which is about to
//! sleep anyway, pays one system call; without it both are `SeqCst` fences.
//!
//! That system call is cheap when waits are rare (a near-null model's waiter spins and
//! almost never blocks), not when every execution blocks: a waiter for a long model blocks
//! once or more per execution, and each `membarrier` interrupts every vCPU running one of
//! the process's threads — on a 2-vCPU VM 20–60 µs of the caller's time per execution, and
//! an IPI into the device thread computing on the other vCPU (`mlp_b64 --cores 2`: 53–84 µs
//! of caller CPU per execution, most of it in `membarrier`). So the wake has a *fence
//! mode*: asymmetric at first; the first waiter that blocks for a long execution
//! ([`CompletionWake::wait_long`]) switches it to symmetric — both sides `SeqCst` fences from
//! then on, a few ns per publication for the device and no system call for the waiters. The
//! switch is one `membarrier` between two stores (`ASYMMETRIC → SWITCHING`, barrier,
//! `→ SYMMETRIC`): a signaler that read the old mode did its completion store before the
//! barrier reached its CPU, so that store is visible once the barrier returns; one that reads
//! it after fences. A waiter that reads `SWITCHING` still pays the system call; one that reads
//! `SYMMETRIC` (an `Acquire` of the store made after the barrier) only a fence. Either way they
//! order each side's store before its load (Dekker): either the
//! signaler sees the flag and wakes, or the waiter's `ready()` sees the completion, or both.
//! A disarm the waiter did not see makes `futex_wait` return at once (the kernel compares the
//! word under its lock). So a wake-up is never lost. The signaler that disarms wakes every
//! waiter; later signals find the flag clear and make no syscall until a waiter arms it again
//! — one `FUTEX_WAKE` per sleep, however many records the device publishes meanwhile. A
//! signaler that finds the flag clear pays one load (and a fence without `membarrier`). Wake-ups are broadcast
//! (every waiter re-checks its own condition) and may be spurious; a waiter that found
//! `ready()` leaves the flag armed, which costs the next signal one needless wake at most.
//! `tests/loom.rs` model-checks the handshake (`completion_wake_*`), composed with the
//! notification plane that signals it.
//!
//! # Who writes what
//!
//! | bits of `word` | written by | ordering |
//! |---|---|---|
//! | bit 0 (armed) | set by each waiter before it checks and sleeps; cleared by the signaler that wakes | waiter: `Relaxed` `fetch_or`; signaler: `compare_exchange` (`Release`); both ordered by the `SeqCst` fences |
//! | bits 1.. (epoch) | the signaler that clears the flag, in the same `compare_exchange` | as above |
//!
//! # The spin before the block: [`SpinBudget`], [`Waiter`]
//!
//! Blocking costs a futex wake on the device side (~1–2 µs) and 20–60 µs of wake latency on
//! the waiter's (`reference/machine-limits.md`), so a waiter first spins while the completion
//! is likely to come sooner than that. [`SpinBudget`] learns a model's execution time (an
//! exponentially weighted moving average) and says how long spinning pays; [`Waiter`] spins
//! that long (yielding periodically, so a device thread sharing the vCPU runs) and then blocks
//! on the wake.

use crate::sync::{
    AtomicU8, AtomicU64, CachePadded, Futex, Ordering, fence, heavy_fence, light_fence,
    prepare_asymmetric_fences, spin_loop,
};
use crate::tuning;
use core::fmt;
use core::time::Duration;
use std::time::Instant;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of [`CompletionWake::last_wake_ns`] and of the
/// runtime's latency samples.
#[inline]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer for the duration of the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// A completion wake: one futex word with an armed flag. Shared (in an `Arc`) by the host
/// threads that wait and the device that signals; the device signals it through
/// [`crate::PlaneProducer::set_wake`].
pub struct CompletionWake {
    inner: CachePadded<WakeWords>,
}

/// The futex word and the fence mode, in one cache line: a signaler reads both.
struct WakeWords {
    word: Futex,
    /// [`FENCES_ASYMMETRIC`], [`FENCES_SWITCHING`] or [`FENCES_SYMMETRIC`].
    fences: AtomicU8,
    /// [`monotonic_ns`] when a signaler last found the wake armed and woke its waiters
    /// (written by that signaler only, `Relaxed`; 0 = never): where a blocked waiter's
    /// completion really came, before its wake-up latency ([`CompletionWake::last_wake_ns`]).
    woke_at: AtomicU64,
}

/// Signalers use a compiler barrier, waiters `membarrier` (see the module docs).
const FENCES_ASYMMETRIC: u8 = 0;
/// A waiter is switching to symmetric fences: signalers fence, waiters still `membarrier`.
const FENCES_SWITCHING: u8 = 1;
/// Both sides use `SeqCst` fences.
const FENCES_SYMMETRIC: u8 = 2;

/// Bit 0 of the word: a waiter asked for a wake-up.
const ARMED: u32 = 1;
/// What one wake-up adds to the word (the epoch lives above the flag).
const EPOCH: u32 = 2;

/// Why [`CompletionWake::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// `ready()` was true once the request was registered: the thread did not sleep.
    Ready,
    /// The thread slept and was woken (by a signal, the timeout, or spuriously).
    Woken,
}

impl Default for CompletionWake {
    fn default() -> Self {
        Self::new()
    }
}

impl CompletionWake {
    /// A wake nobody waits on.
    pub fn new() -> CompletionWake {
        // Before any thread signals or waits on it (see `sync::light_fence`).
        prepare_asymmetric_fences();
        CompletionWake {
            inner: CachePadded(WakeWords {
                word: Futex::new(0),
                fences: AtomicU8::new(FENCES_ASYMMETRIC),
                woke_at: AtomicU64::new(0),
            }),
        }
    }

    /// Called by a signaler after it made a completion visible (a `Release` store the
    /// waiters' `ready()` reads): wakes every sleeping waiter. One load (and, without
    /// `membarrier`, one fence) when nobody armed the wake.
    #[inline]
    pub fn signal(&self) {
        light_fence();
        if self.inner.fences.load(Ordering::Relaxed) != FENCES_ASYMMETRIC {
            fence(Ordering::SeqCst);
        }
        if self.inner.word.load(Ordering::Relaxed) & ARMED != 0 {
            self.wake_all();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_all(&self) {
        let mut s = self.inner.word.load(Ordering::Relaxed);
        while s & ARMED != 0 {
            match self.inner.word.compare_exchange(
                s,
                (s & !ARMED).wrapping_add(EPOCH),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // One clock read on the path that makes a system call anyway (never when
                    // nobody waits): when the completion came, for the spin budgets.
                    self.inner.woke_at.store(monotonic_ns(), Ordering::Relaxed);
                    self.inner.word.wake_all();
                    return;
                }
                Err(now) => s = now,
            }
        }
        // Another signaler disarmed it first: it wakes the waiters.
    }

    /// Called by a waiter: asks for a wake-up, then sleeps unless `ready()` — which must read
    /// what the signalers publish before they call [`CompletionWake::signal`] — is already
    /// true. Sleeps at most `timeout` (`None`: until signaled). Returns after one sleep at
    /// most: the caller re-checks its condition (wake-ups are broadcast and may be spurious)
    /// and calls again.
    pub fn wait(&self, timeout: Option<Duration>, ready: impl FnOnce() -> bool) -> WaitOutcome {
        self.wait_with(timeout, ready, false)
    }

    /// [`CompletionWake::wait`] by a waiter that expects to block for a long execution (its
    /// [`SpinBudget`] says spinning does not pay): switches the wake to symmetric fences
    /// first, if it is not yet (see the module docs), so that this and every later wait costs
    /// a fence instead of a `membarrier`.
    pub fn wait_long(
        &self,
        timeout: Option<Duration>,
        ready: impl FnOnce() -> bool,
    ) -> WaitOutcome {
        self.wait_with(timeout, ready, true)
    }

    fn wait_with(
        &self,
        timeout: Option<Duration>,
        ready: impl FnOnce() -> bool,
        long: bool,
    ) -> WaitOutcome {
        let w = &self.inner;
        let seen = w.word.fetch_or(ARMED, Ordering::Relaxed) | ARMED;
        if w.fences.load(Ordering::Acquire) == FENCES_SYMMETRIC {
            fence(Ordering::SeqCst);
        } else if long
            && w.fences
                .compare_exchange(
                    FENCES_ASYMMETRIC,
                    FENCES_SWITCHING,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            // The barrier orders this wait's arm before its `ready()`, as always, and makes
            // every signaler either fence from now on or have its completion visible.
            heavy_fence();
            w.fences.store(FENCES_SYMMETRIC, Ordering::Release);
        } else {
            heavy_fence();
        }
        if ready() {
            return WaitOutcome::Ready;
        }
        w.word.wait(seen, timeout);
        WaitOutcome::Woken
    }

    /// [`monotonic_ns`] of the last time a signaler woke blocked waiters (0 = never). A
    /// waiter that blocked for a completion learns from it when the completion came: its own
    /// wake-up came 20–60 µs later on a VM, and that delay is the cost of having blocked, not
    /// the execution's ([`SpinBudget::spinning_latency`]).
    pub fn last_wake_ns(&self) -> u64 {
        self.inner.woke_at.load(Ordering::Relaxed)
    }

    /// Whether waiters and signalers use symmetric fences now (a hint, for tests).
    pub fn fences_symmetric(&self) -> bool {
        self.inner.fences.load(Ordering::Relaxed) == FENCES_SYMMETRIC
    }

    /// Whether a waiter armed the wake and no signal disarmed it yet (a hint, for tests).
    pub fn is_armed(&self) -> bool {
        self.inner.word.load(Ordering::Relaxed) & ARMED != 0
    }

    /// How many times a signaler found the wake armed and woke its waiters (a hint, for tests
    /// and metrics; wraps).
    pub fn wakes(&self) -> u32 {
        self.inner.word.load(Ordering::Relaxed) >> 1
    }
}

/// One [`CompletionWake`] per in-flight execution slot: the completion interrupt of one
/// execution, for the one thread that waits for it (a synchronous caller). The device
/// signals the wake of an execution after the publication that finishes or aborts it
/// ([`crate::PlaneProducer::signal_execution`]), and a host thread that writes the completion
/// word of an execution another thread owns signals that execution's wake — so a caller
/// asleep on its own execution is woken for it alone, not for every publication of the
/// core, as the vcore-wide wake would (`mlp` from four threads on one core: every
/// publication woke the three callers whose executions were still queued; each looked and
/// blocked again, ~4 context switches per execution).
///
/// Execution `compute_idx` has the wake `compute_idx % slots` — the runtime's in-flight slot
/// of that execution, so two executions that share a wake are never in flight together.
/// Each wake is a [`CompletionWake`] with its protocol (a waiter's `ready()` reads the
/// device's publication and the completion word); a wake-up for a later execution of the
/// same slot is only spurious.
pub struct ExecutionWakes {
    wakes: Box<[CompletionWake]>,
    mask: u32,
}

impl ExecutionWakes {
    /// `slots` wakes (a power of two: the device masks the compute index).
    ///
    /// # Panics
    /// If `slots` is not a power of two (a tuning constant, so a programming error).
    pub fn new(slots: u32) -> ExecutionWakes {
        assert!(slots.is_power_of_two(), "execution wakes {slots}");
        ExecutionWakes {
            wakes: (0..slots).map(|_| CompletionWake::new()).collect(),
            mask: slots - 1,
        }
    }

    /// The wake of execution `compute_idx` (of its slot: `compute_idx % slots`).
    #[inline]
    pub fn of(&self, compute_idx: u32) -> &CompletionWake {
        &self.wakes[(compute_idx & self.mask) as usize]
    }

    /// Signals the wakes of the slots whose bit is set in `slots` (bit `i`: slot `i`; the
    /// bits past the table are ignored) — after a harvest wrote their completion words.
    #[inline]
    pub fn signal_slots(&self, mut slots: u64) {
        while slots != 0 {
            let i = slots.trailing_zeros();
            slots &= slots - 1;
            if let Some(w) = self.wakes.get(i as usize) {
                w.signal();
            }
        }
    }

    /// Signals every wake (a device poll that ended several executions; a harvest's rare
    /// paths pass every bit to [`ExecutionWakes::signal_slots`] instead).
    pub fn signal_all(&self) {
        for w in self.wakes.iter() {
            w.signal();
        }
    }

    /// How many times any of the wakes woke its waiter (a hint, for tests; wraps).
    pub fn wakes(&self) -> u32 {
        self.wakes
            .iter()
            .fold(0u32, |n, w| n.wrapping_add(w.wakes()))
    }
}

/// Which execution each core of a lockstep group last finished its part of — so that only
/// the core whose part completes an execution signals the completion wake.
///
/// A lockstep execution is complete for the host once every core of its group published its
/// part's last records. A core that finishes first publishes them quietly (visible to a
/// spinning waiter, no wake); the last one signals. Woken by the first core, a blocked caller
/// found the execution unfinished and blocked again — and that wake-up had come by an
/// inter-processor interrupt to the vCPU the other core's device thread was computing on
/// (`mlp_b64 --cores 2`: the caller then ran there, and the real completion's wake from the
/// other vCPU took 27 µs to arrive and 18 µs more to preempt).
///
/// # Protocol (Dekker, like the wake itself)
///
/// ```text
///   core c, its part of execution idx done:
///     publish its records quietly            -- Release stores of its ring tails
///     done[c] = idx + 1                      -- Release store
///     fence(SeqCst)
///     if every core of the group has done[·] ≥ idx + 1 (Acquire loads): signal the wake
/// ```
///
/// Of two cores finishing together, at least one reads the other's store (each stores, then
/// fences `SeqCst`, then loads), so at least one signals, and it signals after the other's tail
/// stores are visible to it (its load of the other's `done` acquires them) — so the woken
/// waiter sees every part. Both may signal: a spurious wake at worst. `tests/loom.rs`
/// (`lockstep_last_part_wakes_the_waiter`) model-checks it with two planes and one wake.
///
/// # Who writes what
///
/// | word | written by | ordering |
/// |---|---|---|
/// | `done[c]` | the thread running core `c`'s part (it holds the core's lock) | `Release` store then a `SeqCst` fence; read with `Acquire` loads (after the reader's own fence) by the group's other cores |
pub struct LockstepParts {
    done: Box<[CachePadded<AtomicU64>]>,
}

impl LockstepParts {
    /// For `cores` cores, none of which finished anything.
    pub fn new(cores: usize) -> LockstepParts {
        LockstepParts {
            done: (0..cores).map(|_| CachePadded(AtomicU64::new(0))).collect(),
        }
    }

    /// Core `me` finished its part of execution `idx` of the group of `count` cores starting
    /// at `group`, and published that part's records: whether every core of the group has
    /// now finished `idx` (or a later execution) — then the caller signals the wake. Cores
    /// outside the table count as finished.
    pub fn finish(&self, me: usize, group: usize, count: usize, idx: u32) -> bool {
        if let Some(d) = self.done.get(me) {
            d.store(idx as u64 + 1, Ordering::Release);
        }
        // Orders this core's store before its loads (and each other core's, by its own
        // fence): the Dekker pair.
        fence(Ordering::SeqCst);
        (group..group.saturating_add(count)).all(|c| {
            c == me
                || self.done.get(c).is_none_or(|d| {
                    let d = d.load(Ordering::Acquire);
                    d != 0 && ((d - 1) as u32).wrapping_sub(idx) as i32 >= 0
                })
        })
    }

    /// Forgets what core `core` finished (it was reset, or joined another group).
    pub fn reset(&self, core: usize) {
        if let Some(d) = self.done.get(core) {
            d.store(0, Ordering::Release);
        }
    }
}

impl fmt::Debug for LockstepParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockstepParts")
            .field("cores", &self.done.len())
            .finish()
    }
}

impl fmt::Debug for CompletionWake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionWake")
            .field("armed", &self.is_armed())
            .field("wakes", &self.wakes())
            .finish()
    }
}

impl fmt::Debug for ExecutionWakes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExecutionWakes")
            .field("slots", &self.wakes.len())
            .field("wakes", &self.wakes())
            .finish()
    }
}

/// How long a waiter should spin before it blocks, learned from the executions of one model:
/// an exponentially weighted moving average of their latency (submission to completion, as
/// the waiter saw it; weight [`tuning::WAIT_EWMA_SHIFT`]).
///
/// Spinning pays only when the completion is expected within [`tuning::WAIT_SPIN_CAP`]: then
/// the waiter spins up to twice the expected time plus [`tuning::WAIT_SPIN_SLACK`] (jitter),
/// never past the cap. A longer execution is waited for by blocking at once: the device
/// signals its completion, and a spin would only hold the vCPU the device (or a co-tenant)
/// needs. With no history yet the waiter spins the cap, which also measures the model.
///
/// Updated with a load and a store (no locked read-modify-write): two waiters that record at
/// once lose one sample, which an average does not miss.
#[derive(Debug, Default)]
pub struct SpinBudget {
    /// The average in nanoseconds, `<< WAIT_EWMA_SHIFT` fixed point; 0 = no sample yet.
    ewma: AtomicU64,
    /// How late this model's pre-wake timers came back (see [`Waiter::with_prewake`]), the
    /// same fixed point; 0 = no sample yet.
    lateness: AtomicU64,
}

impl SpinBudget {
    /// A budget with no history.
    pub fn new() -> SpinBudget {
        SpinBudget {
            ewma: AtomicU64::new(0),
            lateness: AtomicU64::new(0),
        }
    }

    /// Adds one execution's latency to the average.
    #[inline]
    pub fn record(&self, latency: Duration) {
        Self::average_in(&self.ewma, latency);
    }

    /// Adds `sample` to the moving average in `avg`.
    #[inline]
    fn average_in(avg: &AtomicU64, sample: Duration) {
        let sample = (sample.as_nanos().min(u64::MAX as u128 >> 8) as u64) << 8;
        let old = avg.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample.max(1)
        } else {
            // old + (sample - old) / 2^shift, in wrapping-free form, the sample clamped to
            // WAIT_EWMA_OUTLIER_FACTOR times the average (a preemption is not the model).
            let sample = sample.min(old.saturating_mul(tuning::WAIT_EWMA_OUTLIER_FACTOR));
            let s = tuning::WAIT_EWMA_SHIFT;
            (old - (old >> s)).saturating_add(sample >> s).max(1)
        };
        avg.store(new, Ordering::Relaxed);
    }

    /// Adds how late one pre-wake timer came back to its average.
    #[inline]
    pub fn record_lateness(&self, late: Duration) {
        Self::average_in(&self.lateness, late);
    }

    /// How late a pre-wake timer is expected to come back (the assumed
    /// [`tuning::WAIT_PREWAKE_INITIAL_LATENESS`] before the first sample).
    #[inline]
    pub fn timer_lateness(&self) -> Duration {
        match self.lateness.load(Ordering::Relaxed) {
            0 => tuning::WAIT_PREWAKE_INITIAL_LATENESS,
            v => Duration::from_nanos(v >> 8),
        }
    }

    /// For an execution too long to spin for: how long after its submission a waiter should
    /// have its timer wake it — the expected latency less the timer's lateness and
    /// [`tuning::WAIT_PREWAKE_MARGIN`] — so that it is spinning when the completion comes.
    /// `None` when the waiter spins anyway, or the sleep would be shorter than
    /// [`tuning::WAIT_PREWAKE_MIN_SLEEP`].
    #[inline]
    pub fn prewake(&self) -> Option<Duration> {
        let e = self.expected()?;
        if e <= tuning::WAIT_SPIN_CAP {
            return None;
        }
        let sleep = e.checked_sub(self.timer_lateness() + tuning::WAIT_PREWAKE_MARGIN)?;
        (sleep >= tuning::WAIT_PREWAKE_MIN_SLEEP).then_some(sleep)
    }

    /// The latency to learn from for an execution submitted at `t0` and seen complete at
    /// `now` (both [`monotonic_ns`]) on a vcore whose wake last woke a blocked waiter at
    /// `last_wake` ([`CompletionWake::last_wake_ns`]): what a waiter that kept spinning would
    /// have seen. When a wake-up came during the execution, the completion came then — the
    /// waiter blocked and saw it only after its own wake-up latency. Counting that latency
    /// would make the policy feed itself: a 36 µs model (the `cnn` sample), once measured at
    /// 79 µs because its caller blocked, stays past [`tuning::WAIT_SPIN_CAP`] and blocks for
    /// ever (79 µs instead of 36 µs per execution).
    #[inline]
    pub fn spinning_latency(t0: u64, now: u64, last_wake: u64) -> Duration {
        let end = if last_wake > t0 && last_wake <= now {
            last_wake
        } else {
            now
        };
        Duration::from_nanos(end.saturating_sub(t0))
    }

    /// The expected latency (`None` before the first sample).
    #[inline]
    pub fn expected(&self) -> Option<Duration> {
        match self.ewma.load(Ordering::Relaxed) {
            0 => None,
            v => Some(Duration::from_nanos(v >> 8)),
        }
    }

    /// How long, counted from the submission, a waiter should spin before it blocks.
    #[inline]
    pub fn spin_limit(&self) -> Duration {
        match self.expected() {
            None => tuning::WAIT_SPIN_CAP,
            Some(e) if e > tuning::WAIT_SPIN_CAP => Duration::ZERO,
            Some(e) => (e * 2 + tuning::WAIT_SPIN_SLACK).min(tuning::WAIT_SPIN_CAP),
        }
    }

    /// [`SpinBudget::spin_limit`] for a waiter with a vCPU to spare beside the device
    /// threads (which may pre-wake): an execution too short for a pre-wake
    /// ([`SpinBudget::prewake`] is `None`) but not past
    /// [`tuning::WAIT_SPIN_CAP_SPARE_CPU`] is spun for rather than blocked on.
    #[inline]
    pub fn spin_limit_spare_cpu(&self) -> Duration {
        match self.expected() {
            Some(e)
                if e > tuning::WAIT_SPIN_CAP
                    && e <= tuning::WAIT_SPIN_CAP_SPARE_CPU
                    && self.prewake().is_none() =>
            {
                (e * 2 + tuning::WAIT_SPIN_SLACK).min(tuning::WAIT_SPIN_CAP_SPARE_CPU)
            }
            _ => self.spin_limit(),
        }
    }
}

/// One wait for a completion: spins within the [`SpinBudget`]'s limit — a `sched_yield` every
/// [`tuning::HARVEST_YIELD_EVERY_POLLS`] polls after the first
/// [`tuning::HARVEST_PURE_SPIN_POLLS`], so a device thread that shares the vCPU runs at once —
/// then blocks on the [`CompletionWake`] for at most [`tuning::WAIT_BLOCK_RECHECK`] at a time.
/// No fixed-length sleep anywhere. Lives on the caller's stack; allocates nothing; reads the
/// clock only once the pure spin is over (a near-null execution completes within it, and two
/// clock reads would cost a tenth of its round trip), so the spin limit counts from there.
///
/// ```text
///   let mut w = Waiter::new(&wake, budget.spin_limit());
///   while step() != Done {
///       w.idle(|| watch.has_records() || my_completion_is_written());
///   }
/// ```
#[derive(Debug)]
pub struct Waiter<'a> {
    wake: Option<&'a CompletionWake>,
    since: Option<Instant>,
    spin: Duration,
    polls: u32,
    /// The budget said "do not spin": a long execution ([`CompletionWake::wait_long`]).
    long: bool,
    /// [`Waiter::with_prewake`]: when the timer should end the block, and the budget that
    /// learns how late it came.
    prewake: Option<(Instant, &'a SpinBudget)>,
}

impl<'a> Waiter<'a> {
    /// A wait that may spin for `spin` (past its pure spin) before it blocks on `wake`.
    /// Without a wake (a device that cannot signal) it never blocks: it spins and yields.
    #[inline]
    pub const fn new(wake: Option<&'a CompletionWake>, spin: Duration) -> Waiter<'a> {
        Waiter {
            wake,
            since: None,
            spin,
            polls: 0,
            long: spin.is_zero(),
            prewake: None,
        }
    }

    /// For a waiter that blocks at once (a long execution, its spin limit zero): its first
    /// block ends by timer [`SpinBudget::prewake`] after now (the submission), and it spins
    /// from there (up to [`tuning::WAIT_PREWAKE_SPIN`], then blocks as usual) — so it is running
    /// when the completion comes instead of waking 20–60 µs after it. The thread's timer
    /// slack is lowered to [`tuning::WAIT_PREWAKE_TIMER_SLACK_NS`] once. Nothing changes for
    /// a spinning waiter, one without a wake, or a model without history.
    #[inline]
    pub fn with_prewake(mut self, budget: &'a SpinBudget) -> Waiter<'a> {
        if self.wake.is_some()
            && self.spin.is_zero()
            && let Some(d) = budget.prewake()
        {
            lower_timer_slack_once();
            self.prewake = Some((Instant::now() + d, budget));
        }
        self
    }

    /// Called after a look that found nothing: spins one poll, yields now and then, or —
    /// past the spin limit — blocks until the wake is signaled, `ready()` holds, or
    /// [`tuning::WAIT_BLOCK_RECHECK`] passed. `ready` must read what the signalers publish
    /// before they signal (the notification rings' tails, the completion words). Returns
    /// whether it blocked.
    #[inline]
    pub fn idle(&mut self, ready: impl FnOnce() -> bool) -> bool {
        self.polls = self.polls.wrapping_add(1);
        if self.spin.is_zero() && self.wake.is_some() {
            if let Some((at, budget)) = self.prewake {
                // A long execution with a pre-wake: block until the timer says the
                // completion is near (or it comes first), then spin.
                return self.block_until(at, budget, ready);
            }
            // A long execution: block at once (the device signals its completion).
            return self.block(ready);
        }
        if self.polls < tuning::HARVEST_PURE_SPIN_POLLS
            || !self.polls.is_multiple_of(tuning::HARVEST_YIELD_EVERY_POLLS)
        {
            spin_loop();
            return false;
        }
        let since = *self.since.get_or_insert_with(Instant::now);
        if self.wake.is_none() || since.elapsed() < self.spin {
            crate::sync::yield_now();
            false
        } else {
            self.block(ready)
        }
    }

    /// The pre-wake's block: sleeps until `at` unless signaled (or `ready()`) first; once
    /// `at` passed, learns the timer's lateness (when no signal woke it) and turns the
    /// waiter into a spinning one, counted from now.
    #[cold]
    fn block_until(
        &mut self,
        at: Instant,
        budget: &SpinBudget,
        ready: impl FnOnce() -> bool,
    ) -> bool {
        let w = self.wake.expect("a pre-wake needs a wake");
        let before = Instant::now();
        let blocked = before < at;
        if blocked {
            let wakes = w.wakes();
            let timeout = (at - before).min(tuning::WAIT_BLOCK_RECHECK);
            let woken = w.wait_long(Some(timeout), ready) == WaitOutcome::Woken;
            let after = Instant::now();
            if after < at {
                // Signaled (or spurious) before the timer: the caller looks; the pre-wake
                // stays armed for the next block.
                return true;
            }
            if woken && w.wakes() == wakes {
                // No signaler woke it: the timer did, this late.
                budget.record_lateness(after - at);
            }
        }
        self.prewake = None;
        self.spin = tuning::WAIT_PREWAKE_SPIN;
        self.since = Some(Instant::now());
        blocked
    }

    #[cold]
    fn block(&mut self, ready: impl FnOnce() -> bool) -> bool {
        if let Some(w) = self.wake {
            if self.long {
                w.wait_long(Some(tuning::WAIT_BLOCK_RECHECK), ready);
            } else {
                w.wait(Some(tuning::WAIT_BLOCK_RECHECK), ready);
            }
        }
        // Look again right away; the next idle call blocks again.
        self.spin = Duration::ZERO;
        true
    }
}

/// Lowers this thread's timer slack to [`tuning::WAIT_PREWAKE_TIMER_SLACK_NS`], once per
/// thread (a thread-local flag; no allocation). Linux only; a failure leaves the default.
#[cold]
fn lower_timer_slack_once() {
    #[cfg(all(not(loom), target_os = "linux"))]
    {
        thread_local! {
            static LOWERED: core::cell::Cell<bool> = const { core::cell::Cell::new(false) };
        }
        if LOWERED.with(|l| l.replace(true)) {
            return;
        }
        // SAFETY: PR_SET_TIMERSLACK takes one integer argument (the slack in ns) and touches
        // no memory of ours; the trailing arguments are ignored.
        unsafe {
            libc::prctl(
                libc::PR_SET_TIMERSLACK,
                tuning::WAIT_PREWAKE_TIMER_SLACK_NS as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            );
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32 as StdU32;

    /// One preemption-length outlier does not turn a near-null model's spinning waiter into a
    /// blocking one; a model that really became long does, within a few dozen samples.
    #[test]
    fn an_outlier_does_not_flip_the_budget_but_a_slower_model_does() {
        let b = SpinBudget::new();
        for _ in 0..32 {
            b.record(Duration::from_nanos(500));
        }
        b.record(Duration::from_millis(3));
        assert!(
            b.expected().unwrap() < Duration::from_micros(1),
            "{:?}",
            b.expected()
        );
        assert!(b.spin_limit() > Duration::ZERO);
        let mut n = 0;
        while b.spin_limit() > Duration::ZERO {
            b.record(Duration::from_micros(600));
            n += 1;
            assert!(n < 40, "still spinning after {n} samples of 600 µs");
        }
    }

    /// Only a waiter that expects a long execution switches the fences; the switch sticks.
    #[test]
    fn a_long_wait_switches_the_fences_to_symmetric() {
        let w = CompletionWake::new();
        assert_eq!(w.wait(None, || true), WaitOutcome::Ready);
        assert!(!w.fences_symmetric(), "a short wait keeps membarrier");
        assert_eq!(w.wait_long(None, || true), WaitOutcome::Ready);
        assert!(w.fences_symmetric());
        assert_eq!(w.wait(None, || true), WaitOutcome::Ready);
        assert!(w.fences_symmetric());
        // A Waiter whose budget says "long" uses it.
        let w2 = CompletionWake::new();
        let mut waiter = Waiter::new(Some(&w2), Duration::ZERO);
        assert!(waiter.idle(|| true));
        assert!(w2.fences_symmetric());
        let w3 = CompletionWake::new();
        let mut waiter = Waiter::new(Some(&w3), Duration::from_micros(1));
        for _ in 0..100_000 {
            if waiter.idle(|| true) {
                break;
            }
        }
        assert!(!w3.fences_symmetric(), "a spinning waiter keeps membarrier");
    }

    #[test]
    fn budget_spins_for_short_models_and_blocks_at_once_for_long_ones() {
        let b = SpinBudget::new();
        assert_eq!(
            b.spin_limit(),
            tuning::WAIT_SPIN_CAP,
            "no history: spin the cap"
        );
        b.record(Duration::from_nanos(500));
        assert_eq!(b.expected(), Some(Duration::from_nanos(500)));
        assert_eq!(
            b.spin_limit(),
            Duration::from_nanos(1000) + tuning::WAIT_SPIN_SLACK
        );
        for _ in 0..64 {
            b.record(Duration::from_micros(600));
        }
        let e = b.expected().unwrap();
        assert!(
            e > Duration::from_micros(590) && e <= Duration::from_micros(600),
            "{e:?}"
        );
        assert_eq!(b.spin_limit(), Duration::ZERO);
        // It follows a model that got faster.
        for _ in 0..64 {
            b.record(Duration::from_micros(2));
        }
        assert!(b.spin_limit() <= Duration::from_micros(5) + tuning::WAIT_SPIN_SLACK);
        assert!(b.spin_limit() > Duration::ZERO);
    }

    #[test]
    fn a_waiter_blocks_and_the_signal_wakes_it() {
        let wake = Arc::new(CompletionWake::new());
        let done = Arc::new(StdU32::new(0));
        let (w, d) = (wake.clone(), done.clone());
        let t = std::thread::spawn(move || {
            let mut blocks = 0;
            let mut waiter = Waiter::new(Some(&w), Duration::ZERO);
            while d.load(Ordering::Acquire) == 0 {
                if waiter.idle(|| d.load(Ordering::Acquire) != 0) {
                    blocks += 1;
                }
            }
            blocks
        });
        while !wake.is_armed() {
            std::thread::yield_now();
        }
        done.store(1, Ordering::Release);
        let before = monotonic_ns();
        wake.signal();
        let after = monotonic_ns();
        let blocks = t.join().unwrap();
        assert!(blocks >= 1);
        assert!(wake.wakes() >= 1, "the signal found the waiter");
        // The wake-up is stamped when the signaler woke the waiter, not when it ran again.
        let at = wake.last_wake_ns();
        assert!(before <= at && at <= after, "{before} <= {at} <= {after}");
    }

    /// A blocked waiter's latency sample ends at the wake-up the device issued, so its own
    /// wake-up delay does not count; a spinning waiter's (no wake-up during the execution)
    /// ends when it saw the completion.
    #[test]
    fn the_spin_sample_ends_at_the_wake_up_of_a_blocked_waiter() {
        let us = |x: u64| x * 1_000;
        let lat = SpinBudget::spinning_latency;
        // Blocked: submitted at 100 µs, woken by the device at 136 µs, ran again at 179 µs.
        assert_eq!(lat(us(100), us(179), us(136)), Duration::from_micros(36));
        // Spun: the last wake-up was before the submission (another execution's).
        assert_eq!(lat(us(100), us(136), us(40)), Duration::from_micros(36));
        // Never blocked on this vcore.
        assert_eq!(lat(us(100), us(136), 0), Duration::from_micros(36));
        // A stamp after `now` (another thread's later wake-up) is not this execution's end.
        assert_eq!(lat(us(100), us(136), us(150)), Duration::from_micros(36));
        // So a model just under the cap, once measured through a block, learns its real
        // time and spins again instead of blocking for ever.
        let b = SpinBudget::new();
        for _ in 0..64 {
            b.record(lat(us(100), us(179), us(136)));
        }
        assert!(b.spin_limit() > Duration::ZERO, "{:?}", b.expected());
    }

    #[test]
    fn a_signal_with_nobody_waiting_makes_no_syscall() {
        let wake = CompletionWake::new();
        for _ in 0..1000 {
            wake.signal();
        }
        assert_eq!(wake.wakes(), 0);
        assert_eq!(
            wake.wait(Some(Duration::from_secs(5)), || true),
            WaitOutcome::Ready
        );
        // The waiter left it armed: the next signal disarms it (one wake), and the rest of a
        // burst of publications makes no syscall.
        assert!(wake.is_armed());
        for _ in 0..1000 {
            wake.signal();
        }
        assert_eq!(wake.wakes(), 1);
        assert!(!wake.is_armed());
    }

    #[test]
    fn many_handoffs_never_lose_a_wakeup() {
        let wake = Arc::new(CompletionWake::new());
        let done = Arc::new(StdU32::new(0));
        let (w, d) = (wake.clone(), done.clone());
        let t = std::thread::spawn(move || {
            for i in 1..=2000u32 {
                // No timeout: a lost wake-up hangs the test.
                while d.load(Ordering::Acquire) < i {
                    w.wait(None, || d.load(Ordering::Acquire) >= i);
                }
            }
        });
        for i in 1..=2000u32 {
            done.store(i, Ordering::Release);
            wake.signal();
            if i.is_multiple_of(64) {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }

    /// The pre-wake leaves the timer's lateness (assumed, then learned) and the margin before
    /// the expected completion; none for an execution the waiter spins for, or one too
    /// short for a useful sleep.
    #[test]
    fn the_prewake_leaves_the_timer_lateness_and_the_margin() {
        let b = SpinBudget::new();
        assert_eq!(b.prewake(), None, "no history");
        b.record(Duration::from_micros(500));
        let lead = tuning::WAIT_PREWAKE_INITIAL_LATENESS + tuning::WAIT_PREWAKE_MARGIN;
        assert_eq!(b.prewake(), Some(Duration::from_micros(500) - lead));
        b.record_lateness(Duration::from_micros(25));
        assert_eq!(b.timer_lateness(), Duration::from_micros(25));
        assert_eq!(
            b.prewake(),
            Some(Duration::from_micros(500 - 25) - tuning::WAIT_PREWAKE_MARGIN)
        );
        let short = SpinBudget::new();
        short.record(tuning::WAIT_SPIN_CAP);
        assert_eq!(short.prewake(), None, "spun for");
        let barely = SpinBudget::new();
        barely.record(tuning::WAIT_SPIN_CAP + Duration::from_micros(1));
        barely.record_lateness(Duration::from_micros(40));
        assert_eq!(
            barely.prewake(),
            None,
            "the sleep would be under the minimum"
        );
    }

    /// With a vCPU to spare, an execution past the spin cap that is too short for a pre-wake
    /// is spun for (up to the spare-CPU cap); a longer one pre-wakes, a short one spins as
    /// always.
    #[test]
    fn a_spare_cpu_spins_for_what_is_too_short_to_prewake() {
        let mid = SpinBudget::new();
        mid.record(Duration::from_micros(70));
        mid.record_lateness(Duration::from_micros(45));
        assert_eq!(
            mid.prewake(),
            None,
            "70 - 45 - 10 µs is under the minimum sleep"
        );
        assert_eq!(mid.spin_limit(), Duration::ZERO);
        assert_eq!(
            mid.spin_limit_spare_cpu(),
            (Duration::from_micros(140) + tuning::WAIT_SPIN_SLACK)
                .min(tuning::WAIT_SPIN_CAP_SPARE_CPU)
        );
        let long = SpinBudget::new();
        long.record(Duration::from_micros(500));
        assert!(long.prewake().is_some());
        assert_eq!(
            long.spin_limit_spare_cpu(),
            Duration::ZERO,
            "pre-wakes instead"
        );
        let past = SpinBudget::new();
        past.record(tuning::WAIT_SPIN_CAP_SPARE_CPU + Duration::from_micros(1));
        past.record_lateness(tuning::WAIT_SPIN_CAP_SPARE_CPU);
        assert_eq!(past.prewake(), None);
        assert_eq!(
            past.spin_limit_spare_cpu(),
            Duration::ZERO,
            "past the cap: blocks"
        );
        let short = SpinBudget::new();
        short.record(Duration::from_micros(5));
        assert_eq!(short.spin_limit_spare_cpu(), short.spin_limit());
    }

    /// A waiter for a long execution, with no signal coming, sleeps until its pre-wake (not
    /// the 10 ms recheck), learns how late the timer came, and then spins: its next idle
    /// calls do not block until the spin limit passes.
    #[test]
    fn a_prewaking_waiter_is_woken_by_its_timer_and_then_spins() {
        let wake = CompletionWake::new();
        let b = SpinBudget::new();
        b.record(Duration::from_millis(2));
        let sleep = b.prewake().expect("a long model pre-wakes");
        let t0 = Instant::now();
        let mut w = Waiter::new(Some(&wake), b.spin_limit()).with_prewake(&b);
        while t0.elapsed() < sleep {
            assert!(w.idle(|| false), "blocks until the pre-wake");
        }
        assert!(
            t0.elapsed() < tuning::WAIT_BLOCK_RECHECK,
            "{:?}",
            t0.elapsed()
        );
        assert_ne!(
            b.timer_lateness(),
            tuning::WAIT_PREWAKE_INITIAL_LATENESS,
            "a sample"
        );
        // Spinning now: the first polls neither block nor take long.
        let t1 = Instant::now();
        for _ in 0..tuning::HARVEST_PURE_SPIN_POLLS - 2 {
            assert!(!w.idle(|| false));
        }
        assert!(
            t1.elapsed() < tuning::WAIT_SPIN_CAP * 20,
            "{:?}",
            t1.elapsed()
        );
    }

    /// A completion signaled before the pre-wake ends the block at once, and teaches the
    /// budget no lateness (the timer did not fire).
    #[test]
    fn a_signal_before_the_prewake_wakes_the_waiter() {
        let wake = Arc::new(CompletionWake::new());
        let done = Arc::new(StdU32::new(0));
        let (w2, d2) = (wake.clone(), done.clone());
        let t = std::thread::spawn(move || {
            let b = SpinBudget::new();
            b.record(Duration::from_secs(5));
            let mut w = Waiter::new(Some(&w2), b.spin_limit()).with_prewake(&b);
            let t0 = Instant::now();
            while d2.load(Ordering::Acquire) == 0 {
                w.idle(|| d2.load(Ordering::Acquire) != 0);
            }
            (t0.elapsed(), b.timer_lateness())
        });
        while !wake.is_armed() {
            std::thread::yield_now();
        }
        done.store(1, Ordering::Release);
        wake.signal();
        let (waited, lateness) = t.join().unwrap();
        assert!(waited < Duration::from_secs(1), "{waited:?}");
        assert_eq!(lateness, tuning::WAIT_PREWAKE_INITIAL_LATENESS);
    }
}
