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
        atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering, fence},
    },
    thread::{Thread, current as current_thread, park, yield_now},
};

/// `park_timeout` under loom: loom has no clock, so the timeout is dropped and the thread
/// parks until it is unparked. Models never rely on a timeout to make progress.
#[cfg(loom)]
pub fn park_timeout(_: core::time::Duration) {
    loom::thread::park();
}

#[cfg(not(loom))]
pub use std::thread::park_timeout;

#[cfg(not(loom))]
pub use std::{
    hint::spin_loop,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicU32, AtomicU64, Ordering, fence},
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

/// A 32-bit word that threads can block on until it changes: Linux's `futex` (private,
/// `FUTEX_WAIT` / `FUTEX_WAKE`), the kernel primitive behind every blocking lock.
///
/// [`Futex::wait`] compares the word with the value the caller last saw and sleeps only if
/// they are still equal, atomically with respect to [`Futex::wake_all`] (the kernel checks
/// under its hash-bucket lock), so a waker that changes the word *and then* wakes can never
/// be missed. Returns may be spurious; callers re-check their condition.
///
/// Under loom the kernel's check-and-sleep is modelled with a mutex and a condition
/// variable, which loom explores; elsewhere than Linux, `wait` yields once (a bounded spin,
/// never a lost wake-up, since the caller re-checks).
#[derive(Debug)]
pub struct Futex {
    word: AtomicU32,
    #[cfg(loom)]
    lock: loom::sync::Mutex<()>,
    #[cfg(loom)]
    cv: loom::sync::Condvar,
}

impl Futex {
    /// A word holding `v`.
    pub fn new(v: u32) -> Futex {
        Futex {
            word: AtomicU32::new(v),
            #[cfg(loom)]
            lock: loom::sync::Mutex::new(()),
            #[cfg(loom)]
            cv: loom::sync::Condvar::new(),
        }
    }

    /// The word.
    #[inline]
    pub fn load(&self, order: Ordering) -> u32 {
        self.word.load(order)
    }

    /// Adds to the word (wrapping); returns the previous value.
    #[inline]
    pub fn fetch_add(&self, v: u32, order: Ordering) -> u32 {
        self.word.fetch_add(v, order)
    }

    /// Sets bits of the word; returns the previous value.
    #[inline]
    pub fn fetch_or(&self, v: u32, order: Ordering) -> u32 {
        self.word.fetch_or(v, order)
    }

    /// Compare-exchange on the word.
    #[inline]
    pub fn compare_exchange(
        &self,
        current: u32,
        new: u32,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u32, u32> {
        self.word.compare_exchange(current, new, success, failure)
    }

    /// Sleeps while the word equals `expected`, for at most `timeout` (`None`: until woken).
    /// May return spuriously, and returns at once if the word already differs.
    pub fn wait(&self, expected: u32, timeout: Option<core::time::Duration>) {
        #[cfg(loom)]
        {
            let _ = timeout; // loom has no clock: a model never relies on a timeout
            let g = self.lock.lock().unwrap();
            if self.word.load(Ordering::SeqCst) == expected {
                drop(self.cv.wait(g).unwrap());
            }
        }
        #[cfg(all(not(loom), target_os = "linux"))]
        {
            let ts = timeout.map(|d| libc::timespec {
                tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: d.subsec_nanos() as libc::c_long,
            });
            let tsp = ts
                .as_ref()
                .map_or(core::ptr::null(), |t| t as *const libc::timespec);
            // SAFETY: FUTEX_WAIT reads the aligned 32-bit word we point at (it lives as long
            // as `self`, which the call borrows) and the timespec, which lives on this stack
            // frame; it writes neither. Every outcome (woken, EAGAIN, ETIMEDOUT, EINTR) is a
            // return the caller treats as possibly spurious.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.word.as_ptr(),
                    libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                    expected,
                    tsp,
                )
            };
        }
        #[cfg(all(not(loom), not(target_os = "linux")))]
        {
            let _ = (expected, timeout);
            std::thread::yield_now();
        }
    }

    /// Wakes every thread sleeping in [`Futex::wait`] on this word. Call it after changing
    /// the word.
    pub fn wake_all(&self) {
        #[cfg(loom)]
        {
            let _g = self.lock.lock().unwrap();
            self.cv.notify_all();
        }
        #[cfg(all(not(loom), target_os = "linux"))]
        // SAFETY: FUTEX_WAKE only uses the word's address as a key; it reads and writes no
        // memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                i32::MAX,
            )
        };
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

//===------------------------------------------------------------------------------------===//
// Asymmetric fences
//===------------------------------------------------------------------------------------===//

/// The cheap side of an asymmetric fence pair, for the hot side of a Dekker handshake (a
/// signaler that runs on every completion): with `membarrier(2)`'s private expedited command
/// available, a compiler barrier only; otherwise a `SeqCst` fence. Paired with
/// [`heavy_fence`] on the rare side (a waiter about to sleep), the pair orders each side's
/// store before its load exactly as two `SeqCst` fences do: `membarrier` makes every running
/// thread of the process execute a full barrier before it returns, and a thread not running
/// passed one at its context switch (the Linux `membarrier(2)` contract; folly's
/// `asymmetric_thread_fence_light/heavy`, C++ P1202). Under loom both are `SeqCst` fences,
/// so the models check the protocol with the symmetric pair.
#[cfg(not(loom))]
#[inline(always)]
pub fn light_fence() {
    if membarrier::available() {
        core::sync::atomic::compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The expensive side of an asymmetric fence pair (see [`light_fence`]): one
/// `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` system call (a few µs), or a `SeqCst`
/// fence where it is unavailable.
#[cfg(not(loom))]
pub fn heavy_fence() {
    if !(membarrier::available() && membarrier::barrier()) {
        fence(Ordering::SeqCst);
    }
}

/// Registers the process for [`heavy_fence`]'s system call (once; idempotent). Until it has
/// run, both fences are `SeqCst` fences; after it, they are asymmetric. Call it before the
/// threads that use the pair start (a mixed pair — one side deciding before registration,
/// the other after — is still correct: a `SeqCst` fence pairs with either side).
#[cfg(not(loom))]
pub fn prepare_asymmetric_fences() {
    membarrier::register();
}

#[cfg(loom)]
pub fn light_fence() {
    fence(Ordering::SeqCst);
}

#[cfg(loom)]
pub fn heavy_fence() {
    fence(Ordering::SeqCst);
}

#[cfg(loom)]
pub fn prepare_asymmetric_fences() {}

#[cfg(not(loom))]
mod membarrier {
    use std::sync::atomic::{AtomicU8, Ordering};

    const CMD_QUERY: libc::c_long = 0;
    const CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;
    /// 0: not asked yet; 1: registered; 2: unavailable.
    static STATE: AtomicU8 = AtomicU8::new(0);

    #[inline(always)]
    pub(super) fn available() -> bool {
        STATE.load(Ordering::Relaxed) == 1
    }

    pub(super) fn register() {
        if STATE.load(Ordering::Acquire) != 0 {
            return;
        }
        // SAFETY: membarrier(2) with the query command takes no pointers; it returns the
        // supported commands as a bit mask or -1.
        let mask = unsafe { libc::syscall(libc::SYS_membarrier, CMD_QUERY, 0) };
        let ok = mask >= 0
            && mask & CMD_PRIVATE_EXPEDITED != 0
            // SAFETY: as above; registering has no memory effects on this process.
            && unsafe { libc::syscall(libc::SYS_membarrier, CMD_REGISTER_PRIVATE_EXPEDITED, 0) }
                == 0;
        STATE.store(if ok { 1 } else { 2 }, Ordering::Release);
    }

    /// Whether the barrier ran (false: fall back to a fence).
    pub(super) fn barrier() -> bool {
        // SAFETY: as in `register`; the process is registered (STATE == 1).
        unsafe { libc::syscall(libc::SYS_membarrier, CMD_PRIVATE_EXPEDITED, 0) == 0 }
    }
}
