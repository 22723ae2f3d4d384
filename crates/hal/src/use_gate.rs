//! The admission gate of a shared object that has exclusive operations: a C handle that one
//! thread frees or mutates while others use it (`nrt_unload` while `nrt_execute` runs,
//! `nrt_add_tensor_to_tensor_set` while the set is bound, `nrt_close` while calls are in
//! the runtime).
//!
//! # Protocol
//!
//! One 64-bit word: `OPEN` (bit 63), `EXCLUSIVE` (bit 62) and the number of users inside
//! (bits 0..32).
//!
//! ```text
//!   user (enter / leave)                       exclusive operation
//!   s = load                                   close: CAS  OPEN|n  -> EXCLUSIVE|n   (kill)
//!   !OPEN        -> refused at once            lock:  CAS  OPEN|n  -> OPEN|EXCLUSIVE|n
//!   EXCLUSIVE    -> wait until it clears       then wait until n == 0
//!   otherwise    CAS s -> s + 1 (inside)       ... use the object alone ...
//!   ... use the object ...                     unlock / finish_close: clear EXCLUSIVE
//!   leave: fetch_sub 1
//! ```
//!
//! The exclusive operation **closes the gate first** and then waits only for the users that
//! were already inside: a user enters only by a compare-exchange from a word without
//! `EXCLUSIVE`, so once the closer's compare-exchange succeeded the count can only go down.
//! A stream of newcomers therefore cannot starve it (the defect the earlier scheme had: it
//! waited for the count to reach zero while newcomers kept raising it). `close` also clears
//! `OPEN`, so newcomers are refused at once instead of waiting; `lock` (a mutation) keeps
//! `OPEN`, so newcomers wait for the mutation and then enter. Users inside an operation are
//! bounded by that operation (an execution by its timeout), so the wait is bounded.
//!
//! Waiting is a bounded spin followed by `yield_now`; there is no sleeper to wake, so no
//! wake-up can be lost. The protocol is model-checked in `tests/loom.rs`
//! (`use_gate_*` models).
//!
//! # Who writes what
//!
//! | bits | written by | ordering |
//! |---|---|---|
//! | users | a user entering (`compare_exchange`, `Acquire`) or leaving (`fetch_sub`, `Release`) | the closer's `Acquire` load of 0 synchronizes with every leave |
//! | `EXCLUSIVE` | the exclusive operation: set by `compare_exchange` (`Acquire`), cleared by `fetch_and` (`Release`) | a user that waited for it acquires the mutation |
//! | `OPEN` | [`UseGate::open`] (`fetch_or`, `Release`, after the object is written); cleared by [`UseGate::close`] | users acquire the object with their entering CAS |

use crate::sync::{AtomicU64, Ordering, spin_loop, yield_now};
use core::fmt;

const OPEN: u64 = 1 << 63;
const EXCLUSIVE: u64 = 1 << 62;
const USERS: u64 = (1 << 32) - 1;

/// Why a gate refused to admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateRefused {
    /// The gate is closed (the object was freed, or is being freed right now).
    Closed,
    /// 2³² − 1 users are inside at once (never in practice).
    TooManyUsers,
}

/// An admission gate; see the module docs.
pub struct UseGate {
    state: AtomicU64,
}

impl fmt::Debug for UseGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.load(Ordering::Relaxed);
        f.debug_struct("UseGate")
            .field("open", &(s & OPEN != 0))
            .field("exclusive", &(s & EXCLUSIVE != 0))
            .field("users", &(s & USERS))
            .finish()
    }
}

impl Default for UseGate {
    fn default() -> Self {
        Self::new_closed()
    }
}

/// Spins a little, then yields: waits whose other side is a running operation.
struct Wait(u32);

impl Wait {
    #[inline]
    fn pause(&mut self) {
        self.0 = self.0.saturating_add(1);
        if self.0 < 64 {
            spin_loop();
        } else {
            yield_now();
        }
    }
}

impl UseGate {
    /// A closed gate (open it with [`UseGate::open`] once the object exists).
    #[cfg(not(loom))]
    pub const fn new_closed() -> Self {
        UseGate {
            state: AtomicU64::new(0),
        }
    }

    /// A closed gate (open it with [`UseGate::open`] once the object exists).
    #[cfg(loom)]
    pub fn new_closed() -> Self {
        UseGate {
            state: AtomicU64::new(0),
        }
    }

    /// Whether the gate is open right now (a hint: it may change at once).
    #[inline]
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) & OPEN != 0
    }

    /// Opens a closed gate after the object was written (`Release`: users that enter see
    /// it). Must not race another `open` or an exclusive operation on this gate.
    pub fn open(&self) {
        debug_assert_eq!(self.state.load(Ordering::Relaxed) & (OPEN | EXCLUSIVE), 0);
        self.state.fetch_or(OPEN, Ordering::Release);
    }

    /// Enters as a user: `Ok` while open (call [`UseGate::leave`] when done); refused at
    /// once when closed; waits while a mutation holds the gate.
    #[inline]
    pub fn enter(&self) -> Result<(), GateRefused> {
        let mut wait = Wait(0);
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            if s & OPEN == 0 {
                return Err(GateRefused::Closed);
            }
            if s & EXCLUSIVE != 0 {
                wait.pause();
                s = self.state.load(Ordering::Relaxed);
                continue;
            }
            if s & USERS == USERS {
                return Err(GateRefused::TooManyUsers);
            }
            match self
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => s = now,
            }
        }
    }

    /// Leaves after a successful [`UseGate::enter`].
    #[inline]
    pub fn leave(&self) {
        self.state.fetch_sub(1, Ordering::Release);
    }

    /// Takes the gate exclusively for a mutation: newcomers wait, the users already inside
    /// finish, then `Ok`; release with [`UseGate::unlock`]. Refused when closed.
    pub fn lock(&self) -> Result<(), GateRefused> {
        self.take(false)
    }

    /// Ends a mutation begun by [`UseGate::lock`].
    pub fn unlock(&self) {
        self.state.fetch_and(!EXCLUSIVE, Ordering::Release);
    }

    /// Closes the gate for good: newcomers are refused at once, the users already inside
    /// finish, then `Ok` — the caller now owns the object alone and calls
    /// [`UseGate::finish_close`] when it has taken it. Refused when already closed (a second
    /// free of the same handle).
    pub fn close(&self) -> Result<(), GateRefused> {
        self.take(true)
    }

    /// Ends a [`UseGate::close`]: the gate is closed and idle (it may be opened again for a
    /// new object).
    pub fn finish_close(&self) {
        self.state.fetch_and(!EXCLUSIVE, Ordering::Release);
    }

    fn take(&self, kill: bool) -> Result<(), GateRefused> {
        let mut wait = Wait(0);
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            if s & OPEN == 0 {
                return Err(GateRefused::Closed);
            }
            if s & EXCLUSIVE != 0 {
                // Another mutation or close is under way: it is bounded by its own users.
                wait.pause();
                s = self.state.load(Ordering::Relaxed);
                continue;
            }
            let new = if kill {
                (s & !OPEN) | EXCLUSIVE
            } else {
                s | EXCLUSIVE
            };
            match self
                .state
                .compare_exchange_weak(s, new, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        // Nobody enters any more: wait for those inside (their leaves are `Release`).
        let mut wait = Wait(0);
        while self.state.load(Ordering::Acquire) & USERS != 0 {
            wait.pause();
        }
        Ok(())
    }
}
