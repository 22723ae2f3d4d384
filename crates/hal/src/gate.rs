//! The park handshake between a polling thread that goes to sleep when idle and the threads
//! that hand it work: io_uring SQPOLL's `NEED_WAKEUP` protocol.
//!
//! # Protocol
//!
//! The sleeper (a device thread, an XU worker) polls for work while it has some, spins for a
//! bounded time after the last of it, and then calls [`IdleGate::sleep_until`]:
//!
//! ```text
//!   sleeper                                  waker (after publishing work)
//!   needs_wakeup.store(true)                 <publish work: a Release store or RMW>
//!   fence(SeqCst)                            fence(SeqCst)
//!   if has_work() { clear; return }          if needs_wakeup.load()
//!   park()  -- and loop                          && needs_wakeup.cas(true, false) { unpark(sleeper) }
//! ```
//!
//! The two `SeqCst` fences order each side's store before its load (a Dekker pattern): either
//! the waker sees `needs_wakeup == true` and unparks, or the sleeper's `has_work()` sees the
//! work, or both. A wake-up can never be lost, and a waker that finds the flag clear pays two
//! fences and one load, no syscall (io-uring issue #197 discusses the same barrier pair).
//! The clear is a compare-exchange, not a swap: an unconditional swap by a waker that finds
//! the flag already cleared is a no-op *store* that loom's partial modification order cannot
//! place before the sleeper's next `store(true)`, and it then reports a lost wake-up (it did
//! for the two-doorbell model). With a compare-exchange the only stores are the sleeper's and
//! the one clear that precedes each unpark, which the unpark itself orders.
//! `park` may return spuriously and an `unpark` may come early (it is then remembered by the
//! park token), so the sleeper always re-checks. The protocol is model-checked in
//! `tests/loom.rs`.
//!
//! # Who writes what
//!
//! | field | written by | ordering |
//! |---|---|---|
//! | `needs_wakeup` | sleeper sets it before sleeping; sleeper or a waker clears it | sleeper: `Relaxed` store; waker: `compare_exchange(true, false, AcqRel)` after a `Relaxed` load; both ordered by the `SeqCst` fences |
//! | `sleeper` | the sleeping thread, once, in [`IdleGate::register_sleeper`] | `OnceLock` (set before the first sleep, so every waker that finds `needs_wakeup` set also finds it) |

use crate::sync::{AtomicBool, Ordering, Thread, current_thread, fence, park, park_timeout};
use core::fmt;
use std::sync::OnceLock;

/// A park handshake for one sleeping thread.
pub struct IdleGate {
    needs_wakeup: AtomicBool,
    sleeper: OnceLock<Thread>,
}

impl Default for IdleGate {
    fn default() -> Self {
        Self::new()
    }
}

impl IdleGate {
    /// A gate with no sleeper yet.
    pub fn new() -> Self {
        IdleGate {
            needs_wakeup: AtomicBool::new(false),
            sleeper: OnceLock::new(),
        }
    }

    /// Registers the calling thread as the gate's sleeper. The sleeping thread calls it once,
    /// before its first [`IdleGate::sleep_until`]; wakers only ever unpark a registered thread.
    ///
    /// # Panics
    /// If a different thread registered before (a gate has one sleeper for life).
    pub fn register_sleeper(&self) {
        let me = current_thread();
        let registered = self.sleeper.get_or_init(|| me.clone());
        assert_eq!(
            registered.id(),
            me.id(),
            "an IdleGate has exactly one sleeping thread"
        );
    }

    /// Called by the registered sleeping thread: returns once `has_work()` is true, parking
    /// the thread in between. `has_work` must read the state wakers publish before they call
    /// [`IdleGate::notify`] (a stop flag counts as work).
    ///
    pub fn sleep_until(&self, mut has_work: impl FnMut() -> bool) {
        loop {
            self.needs_wakeup.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if has_work() {
                self.needs_wakeup.store(false, Ordering::Relaxed);
                return;
            }
            park();
        }
    }

    /// [`IdleGate::sleep_until`] for at most about `timeout`: parks once (unless `has_work()`
    /// already holds) and returns whether `has_work()` held when it last looked. For a
    /// sleeper that must also look at a clock now and then (a device thread stalled on a
    /// lockstep barrier runs a hang watchdog). Under loom the timeout is not modelled.
    pub fn sleep_until_timeout(
        &self,
        timeout: core::time::Duration,
        mut has_work: impl FnMut() -> bool,
    ) -> bool {
        self.needs_wakeup.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if !has_work() {
            park_timeout(timeout);
        }
        self.needs_wakeup.store(false, Ordering::Relaxed);
        has_work()
    }

    /// Called by a waker after it published work: unparks the sleeper if it is (about to be)
    /// asleep. Costs a fence and one load, no syscall, when the sleeper is awake.
    #[inline]
    pub fn notify(&self) {
        fence(Ordering::SeqCst);
        self.notify_fenced();
    }

    /// [`IdleGate::notify`] for a caller that issued a `SeqCst` fence after the store the
    /// sleeper must see (and before nothing else it must see).
    #[inline]
    pub fn notify_fenced(&self) {
        if self.needs_wakeup.load(Ordering::Relaxed) {
            self.wake_sleeper();
        }
    }

    /// The flag is cleared with a compare-exchange, never an unconditional swap: a waker
    /// that loses the race (the sleeper already cleared the flag, or another waker did) writes
    /// nothing, so the only stores to the flag are the sleeper's own and the one successful
    /// clear that precedes each unpark.
    #[cold]
    fn wake_sleeper(&self) {
        let cleared = self
            .needs_wakeup
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if let (true, Some(t)) = (cleared, self.sleeper.get()) {
            t.unpark();
        }
    }

    /// Whether the sleeper announced it is going to sleep: for tests and metrics, and a hint
    /// for another thread deciding whether to do the sleeper's work itself.
    #[inline]
    pub fn is_sleeping(&self) -> bool {
        self.needs_wakeup.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for IdleGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleGate")
            .field("needs_wakeup", &self.is_sleeping())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn many_handoffs_never_lose_a_wakeup() {
        let gate = Arc::new(IdleGate::new());
        let work = Arc::new(AtomicU32::new(0));
        let (g, w) = (gate.clone(), work.clone());
        let t = std::thread::spawn(move || {
            g.register_sleeper();
            let mut seen = 0;
            while seen < 2000 {
                g.sleep_until(|| w.load(Ordering::Acquire) > seen);
                seen = w.load(Ordering::Acquire);
            }
        });
        for _ in 0..2000 {
            work.fetch_add(1, Ordering::Release);
            gate.notify();
            if work.load(Ordering::Relaxed).is_multiple_of(64) {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }
}
