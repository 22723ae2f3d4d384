//! The notification plane of one core: its five INFER_STATUS rings (one per engine) and its
//! ERROR ring — six single-producer / single-consumer rings of 16-byte [`NqRecord`]s that the
//! device writes and the host polls, laid out so that one execution costs the host as few
//! cache-line transfers as possible.
//!
//! Each ring is its own ring — own head, own tail, own capacity, own overflow count — but
//! the rings share their memory layout:
//!
//! - **the six tails sit in one cache line**: one acquire load of that line tells the host
//!   about every ring, where six separate rings would cost six line transfers per poll;
//! - **slots are interleaved**: position `p` of ring `r` is slot `p × 6 + r`, so the START
//!   records the five engines write for one execution share a cache line or two, and so do
//!   their END records;
//! - **publication is batched**: the producer writes records into slots and makes them
//!   visible with [`PlaneProducer::publish`], one release store per ring that changed, all
//!   into the tails line. The device publishes when an execution finishes or aborts, after a
//!   custom (streaming) record, and before it goes idle — the ERROR ring's tail first, so an
//!   error is never less visible than an END record written after it.
//!
//! # Who writes what
//!
//! | field | written by | ordering | read by |
//! |---|---|---|---|
//! | slot `(tail % cap) × 6 + ring` | producer, before publishing that ring's tail | plain write | consumer, after acquiring the tail |
//! | `tails[ring]` | producer only ([`PlaneProducer::publish`]) | `Release` store | consumer, `Acquire` load |
//! | `heads[ring]` | consumer only, after reading the slots | `Release` store | producer, `Acquire` load, only when its cached head says the ring is full |
//! | `dropped[ring]` | producer (a record it could not write, or discarded) | `Relaxed` `fetch_add` | consumer (a counter; orders nothing) |
//!
//! Indices are free-running `u32`s compared with wrapping arithmetic. [`plane`] returns the
//! only producer and the only consumer; their operations take `&mut self`, so the
//! single-producer / single-consumer contract is enforced by the types. The protocol is the
//! SPSC ring's ([`crate::ring`](mod@crate::ring)) applied per ring; `tests/loom.rs`
//! model-checks it.

use crate::sync::{Arc, AtomicU32, CachePadded, Ordering, UnsafeCell};
// The prefetch hints are compiled out under loom (they would be cell accesses to it).
#[cfg(not(loom))]
use crate::sync::{prefetch_read, prefetch_write};
use crate::wake::{CompletionWake, ExecutionWakes};
use crate::wire::{NUM_ENGINES, NqKind, NqRecord};
use core::fmt;
use core::mem::MaybeUninit;

/// Rings in a plane: one INFER_STATUS ring per engine, then the ERROR ring.
pub const PLANE_RINGS: usize = NUM_ENGINES + 1;
/// Index of the ERROR ring.
pub const ERROR_RING: usize = NUM_ENGINES;

/// The ring index of a notification-queue kind.
pub const fn ring_index(kind: NqKind) -> usize {
    match kind {
        NqKind::InferStatus(e) => e as usize,
        NqKind::Error => ERROR_RING,
    }
}

struct Shared {
    tails: CachePadded<[AtomicU32; PLANE_RINGS]>,
    heads: CachePadded<[AtomicU32; PLANE_RINGS]>,
    dropped: CachePadded<[AtomicU32; PLANE_RINGS]>,
    mask: u32,
    slots: Box<[UnsafeCell<MaybeUninit<NqRecord>>]>,
}

// SAFETY: each slot is written only by the one producer and read only by the one consumer,
// ordered by the release/acquire pairs on `tails` and `heads` (module docs).
unsafe impl Sync for Shared {}
// SAFETY: as above; the plane owns its slots.
unsafe impl Send for Shared {}

impl Shared {
    #[inline]
    fn slot(&self, ring: usize, pos: u32) -> &UnsafeCell<MaybeUninit<NqRecord>> {
        &self.slots[(pos & self.mask) as usize * PLANE_RINGS + ring]
    }
}

/// The device's half of a plane.
pub struct PlaneProducer {
    shared: Arc<Shared>,
    /// Next position to write, per ring (authoritative).
    tail: [u32; PLANE_RINGS],
    /// Last published tail, per ring.
    published: [u32; PLANE_RINGS],
    /// Last observed consumer head, per ring.
    head_cache: [u32; PLANE_RINGS],
    /// Signaled after every publication (the completion "interrupt"), when set.
    wake: Option<Arc<CompletionWake>>,
    /// Per execution: signaled after the publication that finishes it, when set.
    exec_wakes: Option<Arc<ExecutionWakes>>,
}

/// The host's half of a plane.
pub struct PlaneConsumer {
    shared: Arc<Shared>,
    /// Next position to read, per ring (authoritative).
    head: [u32; PLANE_RINGS],
}

fn zeros() -> [AtomicU32; PLANE_RINGS] {
    core::array::from_fn(|_| AtomicU32::new(0))
}

/// Creates a plane whose rings hold `capacity` records each (a power of two ≤ 2^20).
///
/// # Panics
/// If `capacity` is out of range (a tuning constant, so a programming error).
pub fn plane(capacity: u32) -> (PlaneProducer, PlaneConsumer) {
    assert!(
        capacity.is_power_of_two() && capacity <= 1 << 20,
        "plane capacity {capacity}"
    );
    let slots = (0..capacity as usize * PLANE_RINGS)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect::<Vec<_>>()
        .into_boxed_slice();
    let shared = Arc::new(Shared {
        tails: CachePadded(zeros()),
        heads: CachePadded(zeros()),
        dropped: CachePadded(zeros()),
        mask: capacity - 1,
        slots,
    });
    (
        PlaneProducer {
            shared: shared.clone(),
            tail: [0; PLANE_RINGS],
            published: [0; PLANE_RINGS],
            head_cache: [0; PLANE_RINGS],
            wake: None,
            exec_wakes: None,
        },
        PlaneConsumer {
            shared,
            head: [0; PLANE_RINGS],
        },
    )
}

impl PlaneProducer {
    /// Records per ring.
    pub fn capacity(&self) -> u32 {
        self.shared.mask + 1
    }

    /// Writes a record into `ring` without publishing it; if the ring is full, drops it and
    /// counts the drop. Returns whether it was written.
    #[inline]
    pub fn push(&mut self, ring: usize, rec: NqRecord) -> bool {
        let cap = self.shared.mask + 1;
        let t = self.tail[ring];
        if t.wrapping_sub(self.head_cache[ring]) >= cap {
            self.head_cache[ring] = self.shared.heads[ring].load(Ordering::Acquire);
            if t.wrapping_sub(self.head_cache[ring]) >= cap {
                self.drop_record(ring);
                return false;
            }
        }
        // SAFETY: position `t` is in [head, head + cap): the consumer returned it (its head
        // store, which we acquired, followed its last read of the slot) and it is not
        // published yet, so no one else accesses it.
        self.shared
            .slot(ring, t)
            .with_mut(|p| unsafe { (*p).write(rec) });
        self.tail[ring] = t.wrapping_add(1);
        true
    }

    /// Prefetches, ready for writing, the lines the next execution's records land in (the
    /// next two positions of every ring: one START and one END per engine). The host read
    /// them last, so each store would otherwise wait for its line to come
    /// back; prefetched at the start of an execution's processing, the transfers overlap
    /// that work instead of following it. (Not the tails line: the host polls it, and would
    /// only take it back before the publication.) A hint only.
    #[inline]
    pub fn prefetch_next_writes(&self) {
        #[cfg(not(loom))]
        {
            let t = self.tail[0];
            for pos in [t, t.wrapping_add(1)] {
                prefetch_write(self.shared.slot(0, pos).with(|p| p));
                prefetch_write(self.shared.slot(PLANE_RINGS - 1, pos).with(|p| p));
            }
        }
    }

    /// Sets (or removes) the completion wake this plane signals after each publication: a
    /// host thread blocked on it ([`CompletionWake::wait`], with a `ready` that checks
    /// [`PlaneWatch::has_records`] or [`PlaneConsumer::has_records`]) wakes once records are
    /// visible. Several planes may share one wake (the cores of a lockstep vcore).
    pub fn set_wake(&mut self, wake: Option<Arc<CompletionWake>>) {
        self.wake = wake;
    }

    /// Sets (or removes) the per-execution wakes ([`ExecutionWakes`]): the device signals one
    /// with [`PlaneProducer::signal_execution`] after the publication that finishes (or
    /// aborts) that execution. Several planes may share them (the cores of a lockstep vcore).
    pub fn set_execution_wakes(&mut self, wakes: Option<Arc<ExecutionWakes>>) {
        self.exec_wakes = wakes;
    }

    /// Prefetches the wake of execution `compute_idx` (read when the execution ends), at its
    /// start: the slot's line was last touched `slots` executions ago. A hint only.
    #[inline]
    pub fn prefetch_execution_wake(&self, compute_idx: u32) {
        #[cfg(not(loom))]
        if let Some(w) = &self.exec_wakes {
            prefetch_read(w.of(compute_idx));
        }
        #[cfg(loom)]
        let _ = compute_idx;
    }

    /// Signals every execution's wake (a poll that ended several executions).
    #[cold]
    pub fn signal_all_executions(&self) {
        if let Some(w) = &self.exec_wakes {
            w.signal_all();
        }
    }

    /// Signals the wake of execution `compute_idx`, if the plane has per-execution wakes —
    /// after a publication that made its last records visible (a waiter's `ready()` reads
    /// the tails). One fence and one load when nobody waits for it.
    #[inline]
    pub fn signal_execution(&self, compute_idx: u32) {
        if let Some(w) = &self.exec_wakes {
            w.of(compute_idx).signal();
        }
    }

    /// Counts a record of `ring` that was discarded instead of written.
    pub fn drop_record(&mut self, ring: usize) {
        self.shared.dropped[ring].fetch_add(1, Ordering::Relaxed);
    }

    /// Whether records were written and not yet published.
    #[inline]
    pub fn has_unpublished(&self) -> bool {
        self.tail != self.published
    }

    /// Makes every written record visible: one release store per ring that changed, all in
    /// the tails cache line. The ERROR ring is published first, so a consumer that acquired
    /// an engine's END record and then reads the ERROR ring sees every error posted before
    /// that END (the runtime's harvest relies on it).
    /// Then signals the plane's completion wake, if any: the tail stores are the completion
    /// its waiters' `ready()` reads (one fence and one load when nobody waits).
    #[inline]
    pub fn publish(&mut self) {
        if self.publish_quietly()
            && let Some(w) = &self.wake
        {
            w.signal();
        }
    }

    /// Makes every written record visible and signals the plane's completion wake, whether
    /// or not anything was left to publish: for records published quietly earlier that a
    /// waiter must now be woken for (see [`publish_quietly`](Self::publish_quietly)).
    #[inline]
    pub fn publish_and_signal(&mut self) {
        self.publish_quietly();
        if let Some(w) = &self.wake {
            w.signal();
        }
    }

    /// Makes every written record visible as [`publish`](Self::publish) does, without
    /// signaling the wake; returns whether anything was published. For records no waiter
    /// needs to be woken for: the START records of an execution that is still running (a
    /// core stalled at a barrier between two layers of a two-core model published them, and
    /// woke a blocked caller that only had to block again, on a vCPU the partner core needed).
    /// The END or ERROR record that completes the execution comes with a
    /// [`publish`](Self::publish).
    #[inline]
    pub fn publish_quietly(&mut self) -> bool {
        let mut any = false;
        for r in (0..PLANE_RINGS).rev() {
            if self.tail[r] != self.published[r] {
                self.shared.tails[r].store(self.tail[r], Ordering::Release);
                self.published[r] = self.tail[r];
                any = true;
            }
        }
        any
    }
}

/// A read-only view of a plane's indices: whether records are waiting, for a thread that
/// does not hold the consumer (the runtime polls it before taking its harvest token, so an
/// idle poll is a few loads rather than a lock round trip). Reads the tails line and the
/// heads line; the answer can be stale by the time it returns, in either direction, so it
/// is a hint: the consumer's own drain decides.
#[derive(Clone)]
pub struct PlaneWatch {
    shared: Arc<Shared>,
}

impl PlaneWatch {
    /// Whether some ring has a published record that the consumer has not returned yet.
    #[inline]
    pub fn has_records(&self) -> bool {
        (0..PLANE_RINGS).any(|r| {
            self.shared.tails[r].load(Ordering::Acquire)
                != self.shared.heads[r].load(Ordering::Relaxed)
        })
    }
}

impl fmt::Debug for PlaneWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlaneWatch").finish_non_exhaustive()
    }
}

impl PlaneConsumer {
    /// A [`PlaneWatch`] on this plane.
    pub fn watch(&self) -> PlaneWatch {
        PlaneWatch {
            shared: self.shared.clone(),
        }
    }

    /// Records per ring.
    pub fn capacity(&self) -> u32 {
        self.shared.mask + 1
    }

    /// Calls `f(ring, record)` for every published record of every ring — rings in index
    /// order, records in order within a ring — then returns their slots. Reads the tails
    /// line once. Returns how many records were consumed.
    /// The tails are read first, in ring order, and the lines of every waiting record are
    /// prefetched before any is read: the device wrote them, so each would otherwise be a
    /// miss of its own, one after the other.
    #[inline]
    pub fn drain_all(&mut self, mut f: impl FnMut(usize, NqRecord)) -> u32 {
        let tails: [u32; PLANE_RINGS] =
            core::array::from_fn(|r| self.shared.tails[r].load(Ordering::Acquire));
        #[cfg(not(loom))]
        for (r, &tail) in tails.iter().enumerate() {
            let head = self.head[r];
            if tail != head {
                prefetch_read(self.shared.slot(r, head).with(|p| p));
                prefetch_read(self.shared.slot(r, tail.wrapping_sub(1)).with(|p| p));
            }
        }
        let mut n = 0;
        for (r, &tail) in tails.iter().enumerate() {
            n += self.drain_to(r, tail, &mut f);
        }
        n
    }

    /// Calls `f(ring, record)` for every published record of `ring`, then returns their slots.
    #[inline]
    pub fn drain(&mut self, ring: usize, f: impl FnMut(usize, NqRecord)) -> u32 {
        let tail = self.shared.tails[ring].load(Ordering::Acquire);
        self.drain_to(ring, tail, f)
    }

    /// [`PlaneConsumer::drain`] up to `tail`, a value of the ring's tail this thread acquired.
    #[inline]
    fn drain_to(&mut self, ring: usize, tail: u32, mut f: impl FnMut(usize, NqRecord)) -> u32 {
        let head = self.head[ring];
        let n = tail.wrapping_sub(head);
        if n == 0 {
            return 0;
        }
        for i in 0..n {
            let pos = head.wrapping_add(i);
            // SAFETY: `pos` is in [head, tail): the producer wrote the slot before its release
            // store of `tail`, which we acquired, and will not write it again until our head
            // store below returns it.
            let rec = self
                .shared
                .slot(ring, pos)
                .with(|p| unsafe { (*p).assume_init() });
            f(ring, rec);
        }
        self.head[ring] = tail;
        self.shared.heads[ring].store(tail, Ordering::Release);
        n
    }

    /// Whether any ring has a published record not yet consumed.
    #[inline]
    pub fn has_records(&self) -> bool {
        (0..PLANE_RINGS).any(|r| self.shared.tails[r].load(Ordering::Acquire) != self.head[r])
    }

    /// Records `ring`'s producer dropped (monotonic).
    pub fn dropped(&self, ring: usize) -> u32 {
        self.shared.dropped[ring].load(Ordering::Relaxed)
    }
}

impl fmt::Debug for PlaneProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlaneProducer")
            .field("tail", &self.tail)
            .field("published", &self.published)
            .finish()
    }
}

impl fmt::Debug for PlaneConsumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlaneConsumer")
            .field("head", &self.head)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::wire::{Engine, RecordKind};

    fn rec(idx: u32, e: Engine) -> NqRecord {
        NqRecord::engine_event(RecordKind::Start, e, 0, idx)
    }

    #[test]
    fn records_are_invisible_until_published() {
        let (mut p, mut c) = plane(4);
        assert!(p.push(0, rec(1, Engine::Pe)));
        assert!(p.push(3, rec(1, Engine::Dve)));
        assert!(p.has_unpublished());
        assert_eq!(c.drain_all(|_, _| {}), 0);
        p.publish();
        let mut got = Vec::new();
        assert_eq!(c.drain_all(|r, x| got.push((r, x.engine))), 2);
        assert_eq!(got, vec![(0, 0), (3, 3)]);
        assert!(!c.has_records());
    }

    #[test]
    fn rings_wrap_and_overflow_independently() {
        let (mut p, mut c) = plane(2);
        for i in 0..3 {
            p.push(1, rec(i, Engine::Act));
        }
        p.push(5, rec(9, Engine::Sp));
        p.publish();
        assert_eq!(c.dropped(1), 1);
        assert_eq!(c.dropped(5), 0);
        let mut got = Vec::new();
        c.drain_all(|r, x| got.push((r, x.compute_idx)));
        assert_eq!(got, vec![(1, 0), (1, 1), (5, 9)]);
        for round in 0..10u32 {
            assert!(p.push(1, rec(round, Engine::Act)));
            assert!(p.push(1, rec(round + 100, Engine::Act)));
            p.publish();
            let mut v = Vec::new();
            c.drain(1, |_, x| v.push(x.compute_idx));
            assert_eq!(v, vec![round, round + 100]);
        }
    }

    #[test]
    fn a_watch_sees_published_records_until_they_are_drained() {
        let (mut p, mut c) = plane(4);
        let w = c.watch();
        assert!(!w.has_records());
        p.push(4, rec(1, Engine::Pool));
        assert!(!w.has_records(), "written but not published");
        p.publish();
        assert!(w.has_records());
        assert_eq!(c.drain(2, |_, _| {}), 0);
        assert!(w.has_records(), "another ring's record is still waiting");
        assert_eq!(c.drain_all(|_, _| {}), 1);
        assert!(!w.has_records());
    }

    #[test]
    fn interleaved_layout_puts_one_position_of_all_rings_together() {
        let (p, _c) = plane(8);
        let base = p.shared.slot(0, 3) as *const _ as usize;
        for r in 0..PLANE_RINGS {
            assert_eq!(p.shared.slot(r, 3) as *const _ as usize, base + r * 16);
        }
    }
}
