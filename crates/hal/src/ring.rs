//! A bounded single-producer / single-consumer ring: the shape of every queue between the
//! runtime and the device (the DMA trigger queue, the notification rings).
//!
//! # Who writes what
//!
//! | field | written by | ordering | read by |
//! |---|---|---|---|
//! | slot `tail % cap` | producer, before publishing `tail` | plain write | consumer, after acquiring `tail` |
//! | `tail` | producer only | `Release` store (publishes the slots before it) | consumer, `Acquire` load |
//! | `head` | consumer only | `Release` store (returns the slots before it) | producer, `Acquire` load |
//! | `dropped` | producer only (records it could not push) | `Relaxed` `fetch_add` | consumer, `Relaxed` (a counter, orders nothing) |
//!
//! Indices are free-running `u32`s compared with wrapping arithmetic, so the ring is full when
//! `tail - head == capacity` and no slot is sacrificed. Each side keeps a cached copy of the
//! other side's index and reloads it only when the cache says full (producer) or empty
//! (consumer): a push or pop that does not hit the boundary touches no shared cache line but
//! its own index. A batch costs one release store: [`Producer::push_slice`] writes every slot
//! then publishes once; [`Consumer::drain`] reads every available slot then returns them once.
//!
//! # Thread safety
//!
//! [`ring`] returns the only [`Producer`] and the only [`Consumer`]. Both are `Send` and not
//! `Sync`, and their operations take `&mut self`, so the single-producer / single-consumer
//! contract is enforced by the type system: whoever shares a half must wrap it in a lock
//! (the runtime keeps the DMA producer inside the staging lock and each notification consumer
//! inside the harvest token). The model-checked protocol is in `tests/loom.rs`.

use crate::sync::{Arc, AtomicU32, CachePadded, Ordering, UnsafeCell};
// The prefetch hint is compiled out under loom (it would be a cell access to it).
#[cfg(not(loom))]
use crate::sync::prefetch_read;
use core::fmt;
use core::mem::MaybeUninit;

struct Shared<T> {
    head: CachePadded<AtomicU32>,
    tail: CachePadded<AtomicU32>,
    dropped: CachePadded<AtomicU32>,
    mask: u32,
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
}

// SAFETY: slots are only written by the one Producer and read by the one Consumer, and the
// release/acquire pair on `tail`/`head` orders every slot access against the index that hands
// the slot over (see the module docs). T: Send is required to move values between threads.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above; the ring owns its slots.
unsafe impl<T: Send> Send for Shared<T> {}

/// The producing half of a ring.
pub struct Producer<T> {
    shared: Arc<Shared<T>>,
    /// Our own tail (authoritative; `shared.tail` is its published copy).
    tail: u32,
    /// Last observed consumer head.
    head_cache: u32,
}

/// The consuming half of a ring.
pub struct Consumer<T> {
    shared: Arc<Shared<T>>,
    /// Our own head (authoritative; `shared.head` is its published copy).
    head: u32,
    /// Last observed producer tail.
    tail_cache: u32,
}

/// Creates a ring of `capacity` slots (a power of two, at least 1, at most 2^31).
///
/// # Panics
/// If `capacity` is not a power of two in range; capacities are compile-time tuning
/// constants, so this is a programming error.
pub fn ring<T: Copy + Send>(capacity: u32) -> (Producer<T>, Consumer<T>) {
    assert!(
        capacity.is_power_of_two() && capacity <= 1 << 31,
        "ring capacity {capacity} must be a power of two <= 2^31"
    );
    let slots = (0..capacity)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect::<Vec<_>>()
        .into_boxed_slice();
    let shared = Arc::new(Shared {
        head: CachePadded(AtomicU32::new(0)),
        tail: CachePadded(AtomicU32::new(0)),
        dropped: CachePadded(AtomicU32::new(0)),
        mask: capacity - 1,
        slots,
    });
    (
        Producer {
            shared: shared.clone(),
            tail: 0,
            head_cache: 0,
        },
        Consumer {
            shared,
            head: 0,
            tail_cache: 0,
        },
    )
}

impl<T: Copy + Send> Producer<T> {
    /// Slots in the ring.
    pub fn capacity(&self) -> u32 {
        self.shared.mask + 1
    }

    /// Free slots, reloading the consumer's head only if the cached one says fewer than
    /// `want` are free.
    #[inline]
    fn free_slots(&mut self, want: u32) -> u32 {
        let cap = self.capacity();
        let mut free = cap - self.tail.wrapping_sub(self.head_cache);
        if free < want {
            self.head_cache = self.shared.head.load(Ordering::Acquire);
            free = cap - self.tail.wrapping_sub(self.head_cache);
        }
        free
    }

    #[inline]
    fn write_slot(&mut self, index: u32, value: T) {
        let slot = &self.shared.slots[(index & self.shared.mask) as usize];
        // SAFETY: `index` is in [tail, head_cache + capacity), a slot the consumer returned
        // (its head store, which we acquired, happened after its last read of the slot) and
        // not yet published, so no one else accesses it.
        slot.with_mut(|p| unsafe { (*p).write(value) });
    }

    /// Pushes one value, or hands it back if the ring is full.
    #[inline]
    pub fn try_push(&mut self, value: T) -> Result<(), T> {
        if self.free_slots(1) == 0 {
            return Err(value);
        }
        self.write_slot(self.tail, value);
        self.tail = self.tail.wrapping_add(1);
        self.shared.tail.store(self.tail, Ordering::Release);
        Ok(())
    }

    /// Pushes every value of `values` with one publication, or none of them if they do not
    /// all fit. Returns whether they were pushed.
    #[inline]
    pub fn push_slice(&mut self, values: &[T]) -> bool {
        let n = values.len() as u32;
        if self.free_slots(n) < n {
            return false;
        }
        for (i, v) in values.iter().enumerate() {
            self.write_slot(self.tail.wrapping_add(i as u32), *v);
        }
        self.tail = self.tail.wrapping_add(n);
        self.shared.tail.store(self.tail, Ordering::Release);
        true
    }

    /// Pushes one value; if the ring is full, drops it and counts the drop (the notification
    /// rings' overflow behaviour). Returns whether the value was pushed.
    #[inline]
    pub fn push_or_drop(&mut self, value: T) -> bool {
        if self.try_push(value).is_ok() {
            true
        } else {
            self.record_drop(1);
            false
        }
    }

    /// Counts `n` values that were never pushed (overflow, or a fault that discards records).
    pub fn record_drop(&mut self, n: u32) {
        self.shared.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// Number of values pushed and not yet popped, as far as the producer knows.
    pub fn len_hint(&self) -> u32 {
        self.tail
            .wrapping_sub(self.shared.head.load(Ordering::Acquire))
    }
}

impl<T: Copy + Send> Consumer<T> {
    /// Slots in the ring.
    pub fn capacity(&self) -> u32 {
        self.shared.mask + 1
    }

    /// Number of values available now (reloads the producer's tail).
    #[inline]
    pub fn available(&mut self) -> u32 {
        self.tail_cache = self.shared.tail.load(Ordering::Acquire);
        self.tail_cache.wrapping_sub(self.head)
    }

    #[inline]
    fn read_slot(&self, index: u32) -> T {
        let slot = &self.shared.slots[(index & self.shared.mask) as usize];
        // SAFETY: `index` is in [head, tail_cache): the producer wrote the slot before its
        // release store of a tail we acquired, and will not touch it again until our head
        // store returns it.
        slot.with(|p| unsafe { (*p).assume_init() })
    }

    /// Pops one value.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        if self.head == self.tail_cache && self.available() == 0 {
            return None;
        }
        let v = self.read_slot(self.head);
        self.head = self.head.wrapping_add(1);
        self.shared.head.store(self.head, Ordering::Release);
        Some(v)
    }

    /// Calls `f` on every value available now, in order, then returns their slots with one
    /// release store. Returns how many were consumed.
    #[inline]
    pub fn drain(&mut self, mut f: impl FnMut(T)) -> u32 {
        let n = self.available();
        for i in 0..n {
            f(self.read_slot(self.head.wrapping_add(i)));
        }
        if n != 0 {
            self.head = self.head.wrapping_add(n);
            self.shared.head.store(self.head, Ordering::Release);
        }
        n
    }

    /// Prefetches the lines of the next `n` slots, to overlap their misses with the load of
    /// the producer's tail (the slots are read right after it). A hint only: it reads nothing
    /// that the protocol orders.
    #[inline]
    pub fn prefetch_next(&self, n: u32) {
        #[cfg(not(loom))]
        for i in 0..n {
            let slot = &self.shared.slots[(self.head.wrapping_add(i) & self.shared.mask) as usize];
            prefetch_read(slot.with(|p| p));
        }
        #[cfg(loom)]
        let _ = n;
    }

    /// Whether nothing is available (one acquire load).
    #[inline]
    pub fn is_empty(&mut self) -> bool {
        self.available() == 0
    }

    /// Values the producer dropped because the ring was full (monotonic).
    pub fn dropped(&self) -> u32 {
        self.shared.dropped.load(Ordering::Relaxed)
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer")
            .field("tail", &self.tail)
            .field("capacity", &(self.shared.mask + 1))
            .finish()
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("head", &self.head)
            .field("capacity", &(self.shared.mask + 1))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_wrap() {
        let (mut p, mut c) = ring::<u64>(4);
        for round in 0..10u64 {
            assert!(p.push_slice(&[round, round + 100, round + 200]));
            assert_eq!(c.pop(), Some(round));
            let mut got = Vec::new();
            c.drain(|v| got.push(v));
            assert_eq!(got, vec![round + 100, round + 200]);
            assert_eq!(c.pop(), None);
        }
    }

    #[test]
    fn full_ring_rejects_and_counts_drops() {
        let (mut p, mut c) = ring::<u32>(2);
        assert!(p.push_or_drop(1));
        assert!(p.push_or_drop(2));
        assert!(!p.push_or_drop(3));
        assert_eq!(p.try_push(4), Err(4));
        assert!(!p.push_slice(&[5]));
        assert_eq!(c.dropped(), 1);
        assert_eq!(c.pop(), Some(1));
        assert!(p.push_slice(&[6]));
        assert_eq!(c.pop(), Some(2));
        assert_eq!(c.pop(), Some(6));
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn all_or_nothing_batches() {
        let (mut p, mut c) = ring::<u8>(4);
        assert!(p.push_slice(&[1, 2, 3]));
        assert!(!p.push_slice(&[4, 5]));
        assert_eq!(c.drain(|_| {}), 3);
        assert!(p.push_slice(&[4, 5, 6, 7]));
        assert_eq!(p.len_hint(), 4);
    }

    #[test]
    fn cross_thread_order_is_preserved() {
        let (mut p, mut c) = ring::<u64>(8);
        let n = 100_000u64;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                if p.try_push(i).is_ok() {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut expect = 0;
        while expect < n {
            c.drain(|v| {
                assert_eq!(v, expect);
                expect += 1;
            });
        }
        t.join().unwrap();
    }
}
