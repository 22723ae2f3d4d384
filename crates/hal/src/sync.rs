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
    thread::{Thread, current as current_thread, park},
};

#[cfg(not(loom))]
pub use std::{
    hint::spin_loop,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence},
    },
    thread::{Thread, current as current_thread, park},
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
