//! The eventfd a caller registers for one execution (`nrta_event_register_seq`), and the
//! handshake that makes sure it is signalled once the execution completes, however the
//! registration and the completion interleave.
//!
//! # Protocol
//!
//! ```text
//!   registrant (rare: a caller)               announcer (every retirement, hot)
//!   fd  = efd          (Release)              <make `n` retired: a Release store>
//!   seq = n            (Release)              light_fence()
//!   heavy_fence()                             seq == n ?          (Acquire)
//!   retired(n) ?                              ──yes──► take(n)
//!   ──yes──► take(n)
//!
//!   take(n): CAS seq n → 0 (AcqRel); the winner swaps fd → -1 and signals it.
//! ```
//!
//! Each side stores, then loads what the other side stores (a Dekker handshake): without a
//! fence between the store and the load, both loads may run before the other side's store
//! leaves its store buffer (x86 allows exactly this reordering), the registrant reading "not
//! retired" and the announcer reading "nothing registered", and the eventfd is never
//! signalled — the caller waiting on it hangs. With the fence pair, at least one side sees
//! the other's store; the CAS makes exactly one of them signal. The pair is asymmetric
//! ([`crate::sync::light_fence`] / [`crate::sync::heavy_fence`]): the retirement path runs
//! on every execution and pays a compiler barrier; the registration, once per registered
//! execution, pays the `membarrier`. Model-checked in `tests/loom.rs`
//! (`seq_event_signals_exactly_once`).
//!
//! # Who writes what
//!
//! | word | written by | ordering |
//! |---|---|---|
//! | `fd` (the eventfd; -1 = none) | the registrant (`arm`, before `seq`), the winner of `take` (swap to -1) | `Release` / `AcqRel` |
//! | `seq` (the execution it is armed for; 0 = none) | the registrant (`arm`, `disarm`), the winner of `take` (CAS to 0) | `Release` / `AcqRel`; read `Acquire` |

use crate::sync::{AtomicI32, AtomicU64, Ordering, heavy_fence, light_fence};

/// One in-flight slot's registered eventfd; see the module docs.
#[derive(Debug)]
pub struct SeqEvent {
    seq: AtomicU64,
    fd: AtomicI32,
}

impl Default for SeqEvent {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqEvent {
    /// Nothing registered.
    pub fn new() -> Self {
        SeqEvent {
            seq: AtomicU64::new(0),
            fd: AtomicI32::new(-1),
        }
    }

    /// Registers `efd` (≥ 0) for execution `n` (> 0). `retired` must read what the announcer
    /// stores before it calls [`SeqEvent::announce`]. Returns the eventfd to signal now if
    /// `n` already retired and this call won the signal (the announcer may have signalled
    /// it instead: then `None`).
    pub fn arm(&self, n: u64, efd: i32, retired: impl FnOnce() -> bool) -> Option<i32> {
        debug_assert!(n != 0 && efd >= 0);
        self.fd.store(efd, Ordering::Release);
        self.seq.store(n, Ordering::Release);
        // Orders the store of `seq` before the load in `retired` (see the module docs).
        heavy_fence();
        if retired() { self.take(n) } else { None }
    }

    /// Withdraws the registration for `n`, if it is still armed.
    pub fn disarm(&self, n: u64) {
        if self.seq.load(Ordering::Acquire) == n {
            self.fd.store(-1, Ordering::Release);
            self.seq.store(0, Ordering::Release);
        }
    }

    /// Called by the owner right after it retired `n` (after the store that `arm`'s
    /// `retired` reads): returns the eventfd to signal, if one is armed for `n` and this
    /// call won the signal.
    #[inline(always)]
    pub fn announce(&self, n: u64) -> Option<i32> {
        // Orders the retirement's store before the load of `seq` (see the module docs).
        light_fence();
        if self.seq.load(Ordering::Acquire) == n {
            self.take(n)
        } else {
            None
        }
    }

    fn take(&self, n: u64) -> Option<i32> {
        if self
            .seq
            .compare_exchange(n, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let fd = self.fd.swap(-1, Ordering::AcqRel);
            (fd >= 0).then_some(fd)
        } else {
            None
        }
    }
}
