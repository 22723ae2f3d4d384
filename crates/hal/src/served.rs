//! The hand-off between synchronous callers that share one core: one of them *serves* it —
//! runs the device's work on its own thread — and the others, whose executions were staged
//! behind the server's, wait for the server to run theirs too (the runtime's
//! `surface::sync`). A waiting caller sleeps on this wake, not on the core's
//! [`CompletionWake`]: the device signals that one after every publication of records, so a
//! caller waiting there was woken by the server's own execution first (a futex wake on the
//! server's thread, a context switch on its own), found its execution not run yet, and
//! blocked again — `mlp`, two threads on one core: 2.3 futex calls and 1.2 context switches
//! per execution, 0.77× the throughput of one thread. Here it is woken once: when its
//! completion word is written, or when the server leaves without having run it.
//!
//! # Protocol
//!
//! ```text
//!   server S (a caller serving the core)            queued caller Q (staged behind S)
//!   claim(S): server = S                             s = server()            -- S, or 0: not served
//!   runs the core's work; the harvest writes         loop {
//!     Q's completion word (Release), then              if done()        -> Done
//!     signal()                                         if server() != s -> Left
//!   leave(S): if server == S { server = 0 }            wake.wait(ready: done() || server() != s)
//!     signal()                                       }
//! ```
//!
//! Both signalers store (the completion word, the server word) before they
//! [`CompletionWake::signal`]; the waiter arms the wake before it reads both: the wake's own
//! Dekker pair (see [`CompletionWake`]), so either the signaler sees the armed flag and wakes
//! Q, or Q's `ready()` sees the store, or both. A `Left` waiter waits on the next server,
//! serves the core in the server's place (the runtime does when its executions are short),
//! or waits the usual way (it drives the harvest itself and the device thread runs its
//! execution). A server that signals nothing for [`crate::tuning::WAIT_BLOCK_RECHECK`]
//! (preempted, or gone: a panic on its thread) makes the wait return `Stalled`, and the
//! caller waits the usual way, where deadlines are swept: no wait here lasts for ever.
//! `tests/loom.rs` model-checks it (`served_core_*`): the server running the waiter's
//! execution, and leaving without it.
//!
//! # Who writes what
//!
//! | word | written by | ordering |
//! |---|---|---|
//! | `server` | the serving caller: its seq when it claims, 0 when it leaves (only if still its own) | `Release` stores, `Acquire` loads; a stale view only lets two callers serve at once, which is safe (the core's lock runs one poll at a time) |
//! | the wake's word | as [`CompletionWake`]: armed by waiters, disarmed by the signaler that wakes | as there |

use crate::sync::{AtomicU64, CachePadded, Ordering};
use crate::wake::{CompletionWake, Waiter};
use core::fmt;
use core::time::Duration;

/// One core's serving caller and the wake of the callers queued behind it (see the module
/// docs).
pub struct ServedCore {
    server: CachePadded<AtomicU64>,
    wake: CompletionWake,
}

/// Why [`ServedCore::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// `done()` holds.
    Done,
    /// The server the wait was for left (or another one took over): look again.
    Left,
    /// Nothing signaled the wake for [`crate::tuning::WAIT_BLOCK_RECHECK`] while the same
    /// server served: wait some other way.
    Stalled,
}

impl Default for ServedCore {
    fn default() -> Self {
        Self::new()
    }
}

impl ServedCore {
    /// A core nobody serves.
    pub fn new() -> ServedCore {
        ServedCore {
            server: CachePadded(AtomicU64::new(0)),
            wake: CompletionWake::new(),
        }
    }

    /// The seq of the execution whose caller serves the core now; 0 if none.
    #[inline]
    pub fn server(&self) -> u64 {
        self.server.load(Ordering::Acquire)
    }

    /// The caller of execution `seq` (not 0) serves the core from now on.
    #[inline]
    pub fn claim(&self, seq: u64) {
        self.server.store(seq, Ordering::Release);
    }

    /// The caller of `seq` stops serving: clears the claim if it is still its own (another
    /// caller may have claimed meanwhile; a lost race only lets two serve at once) and wakes
    /// the callers queued behind it. One load and a store, then [`CompletionWake::signal`]
    /// (a load, and a fence once a waiter blocked for long).
    #[inline]
    pub fn leave(&self, seq: u64) {
        if self.server.load(Ordering::Relaxed) == seq {
            self.server.store(0, Ordering::Release);
        }
        self.wake.signal();
    }

    /// Called after writing the completion word of an execution whose caller may wait here.
    #[inline]
    pub fn signal(&self) {
        self.wake.signal();
    }

    /// A queued caller's wait while the caller of `server` serves the core: spins up to
    /// `spin` (a [`Waiter`]'s spin), then blocks until `done()` — the caller's completion
    /// word, written before a [`ServedCore::signal`] — holds, the server leaves, or the wake
    /// stays silent for a whole [`crate::tuning::WAIT_BLOCK_RECHECK`].
    pub fn wait(&self, server: u64, spin: Duration, done: impl Fn() -> bool) -> Served {
        let mut w = Waiter::new(Some(&self.wake), spin);
        loop {
            if done() {
                return Served::Done;
            }
            if self.server() != server {
                return Served::Left;
            }
            let wakes = self.wake.wakes();
            let blocked = w.idle(|| done() || self.server() != server);
            if blocked && self.wake.wakes() == wakes && !done() && self.server() == server {
                // Not woken: the block ran out (or returned spuriously) with nothing new.
                return Served::Stalled;
            }
        }
    }

    /// How many times a signaler woke blocked waiters (a hint, for tests and metrics).
    pub fn wakes(&self) -> u32 {
        self.wake.wakes()
    }
}

impl fmt::Debug for ServedCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServedCore")
            .field("server", &self.server.load(Ordering::Relaxed))
            .field("wake", &self.wake)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    #[test]
    fn a_queued_caller_wakes_when_its_execution_is_done_or_the_server_leaves() {
        // Done: the "harvest" writes the word, then signals.
        let core = Arc::new(ServedCore::new());
        let done = Arc::new(AtomicBool::new(false));
        core.claim(5);
        let (c, d) = (core.clone(), done.clone());
        let t = std::thread::spawn(move || c.wait(5, Duration::ZERO, || d.load(Ordering::Acquire)));
        std::thread::sleep(Duration::from_millis(2));
        done.store(true, Ordering::Release);
        core.signal();
        assert_eq!(t.join().unwrap(), Served::Done);
        // Left: the server leaves without running it.
        let c = core.clone();
        let t = std::thread::spawn(move || c.wait(5, Duration::ZERO, || false));
        std::thread::sleep(Duration::from_millis(2));
        core.leave(5);
        assert_eq!(core.server(), 0);
        assert_eq!(t.join().unwrap(), Served::Left);
        // A leave by a caller that no longer serves keeps the new server's claim.
        core.claim(9);
        core.leave(5);
        assert_eq!(core.server(), 9);
    }

    #[test]
    fn a_silent_server_ends_the_wait_after_one_recheck() {
        let core = ServedCore::new();
        core.claim(3);
        let t0 = Instant::now();
        assert_eq!(core.wait(3, Duration::ZERO, || false), Served::Stalled);
        let took = t0.elapsed();
        assert!(
            took >= crate::tuning::WAIT_BLOCK_RECHECK / 2,
            "returned after {took:?}, before a recheck"
        );
    }
}
