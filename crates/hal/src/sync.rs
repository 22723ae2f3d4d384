//! The one place that chooses between `std` and `loom` synchronization primitives.
//!
//! Every lock-free protocol of the project (the SPSC rings, the park handshake) is written
//! against this module, so `RUSTFLAGS="--cfg loom" cargo test -p nrt-hal --release --test loom`
//! model-checks the same code that ships. `UnsafeCell` follows loom's closure API
//! (`with` / `with_mut`) so the ring code is written once.

#[cfg(loom)]
pub use loom::{
    hint::spin_loop,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence},
    },
    thread::{Thread, current as current_thread, park, yield_now},
};

#[cfg(not(loom))]
pub use std::{
    hint::spin_loop,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence},
    },
    thread::{Thread, current as current_thread, park, yield_now},
};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// `core::cell::UnsafeCell` with loom's closure-based access API.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        UnsafeCell(core::cell::UnsafeCell::new(v))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Asks the core to fetch the cache line holding `p` ready for writing (x86 `PREFETCHW`), so
/// that the stores that follow find it owned instead of each waiting for the line to leave
/// the other core. A hint: it changes no memory and no result; a no-op elsewhere and under
/// loom.
#[inline(always)]
pub fn prefetch_write<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: PREFETCHW only hints the cache: it never faults, not even on an unmapped
    // address, and writes no memory, no register and no flag.
    unsafe {
        core::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Asks the core to fetch the cache line holding `p` for reading (x86 `PREFETCHT0`), so that
/// several misses of lines the other core wrote overlap instead of following one another. A
/// hint, like [`prefetch_write`].
#[inline(always)]
pub fn prefetch_read<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: as for PREFETCHW: a hint that never faults and writes nothing.
    unsafe {
        core::arch::asm!("prefetcht0 [{0}]", in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Pads and aligns a value to a cache line so the producer's and consumer's indices never
/// share one (false sharing would turn every index store into a cross-core miss).
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct CachePadded<T>(pub T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}
