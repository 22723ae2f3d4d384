//! Handle shells: what an `nrt_model_t *`, `nrt_tensor_t *` or `nrt_tensor_set_t *` points to.
//!
//! A C caller holds a raw pointer and may misuse it: pass it after freeing it (through a copy
//! of the pointer), free it twice, pass a model where a tensor is expected, or pass garbage.
//! So handles are *shells* that are never returned to the allocator:
//!
//! - each kind of handle has its own [`Pool`] of shells, allocated in chunks that are leaked
//!   on purpose (chunk `k` holds `FIRST_CHUNK << k` shells); a pointer is accepted only if it
//!   is the address of a shell of the right pool — anything else (garbage, another kind,
//!   a misaligned address) is rejected **without being dereferenced**;
//! - a shell is guarded by a [`UseGate`] (nrt-hal; loom-checked): using a handle pins it
//!   ([`Pool::pin`]: one compare-exchange in, one atomic sub out); mutating it takes it
//!   exclusively ([`Pool::pin_exclusive`]: newcomers wait, the pins already inside finish);
//!   freeing it ([`Pool::take`]) closes the gate first — newcomers are refused at once with
//!   `NRT_INVALID` — and then waits only for the pins already inside, so a thread that keeps
//!   executing a model can never keep `nrt_unload` waiting. A freed shell's gate is closed,
//!   so a stale pointer is refused with `NRT_INVALID`;
//! - freed shells are recycled first-in first-out and only once more than [`QUARANTINE`]
//!   other shells of the pool are waiting, so a stale pointer is detected until that many
//!   further frees happened. After that it may name a newer object of the same kind — the
//!   one thing this scheme cannot detect (the pointer carries no generation).
//!
//! Pins are not locks on the fast path: a pin never waits unless another thread is mutating
//! the same handle at that moment (a caller race that the public runtime leaves undefined;
//! here it is serialized instead), and a pin on a handle being freed is refused at once.

use nrt_hal::UseGate;
use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Shells in the first chunk of a pool; chunk `k` holds `FIRST_CHUNK << k`.
const FIRST_CHUNK: usize = 64;
/// At most this many chunks (`FIRST_CHUNK << 40` shells: never reached).
const MAX_CHUNKS: usize = 40;
/// Freed shells wait until this many others are free before they are reused.
pub const QUARANTINE: usize = 4096;

/// One handle's storage.
pub(crate) struct Shell<T> {
    gate: UseGate,
    value: UnsafeCell<Option<T>>,
}

// SAFETY: `value` is only read by a user admitted by the gate, and only written by the
// holder of its exclusive lock, by its closer, or while the gate is closed and the shell is
// owned by the pool's allocator; the protocol is described in the module docs and in
// nrt-hal's `use_gate`. `T: Send + Sync` because any thread may pin.
unsafe impl<T: Send + Sync> Sync for Shell<T> {}

impl<T> Shell<T> {
    fn new() -> Shell<T> {
        Shell {
            gate: UseGate::new_closed(),
            value: UnsafeCell::new(None),
        }
    }

    /// Whether the handle is live right now (a hint: it may change at once).
    pub(crate) fn is_live(&self) -> bool {
        self.gate.is_open()
    }

    /// Closes the gate (newcomers refused, pins inside drained) and takes the value.
    fn close_and_take(&self) -> Result<T, Refused> {
        self.gate.close().map_err(|_| Refused::Dead)?;
        // SAFETY: the gate is closed and no pin is inside: we are the only accessor.
        let v = unsafe { (*self.value.get()).take() };
        self.gate.finish_close();
        match v {
            Some(v) => Ok(v),
            None => unreachable!("a live shell holds a value"),
        }
    }
}

/// A shared use of a live handle.
pub(crate) struct Pin<'a, T> {
    shell: &'a Shell<T>,
}

impl<T> std::ops::Deref for Pin<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: while pinned (admitted by the gate) nobody writes `value`; it is `Some`
        // whenever the gate is open.
        match unsafe { &*self.shell.value.get() } {
            Some(v) => v,
            None => unreachable!("a live shell holds a value"),
        }
    }
}

impl<T> Drop for Pin<'_, T> {
    fn drop(&mut self) {
        self.shell.gate.leave();
    }
}

/// An exclusive use of a live handle, to mutate it.
pub(crate) struct Exclusive<'a, T> {
    shell: &'a Shell<T>,
}

impl<T> std::ops::Deref for Exclusive<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the gate's exclusive lock is ours: no pin and no other exclusive holder.
        match unsafe { &*self.shell.value.get() } {
            Some(v) => v,
            None => unreachable!("a live shell holds a value"),
        }
    }
}

impl<T> std::ops::DerefMut for Exclusive<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; we are the only accessor.
        match unsafe { &mut *self.shell.value.get() } {
            Some(v) => v,
            None => unreachable!("a live shell holds a value"),
        }
    }
}

impl<T> Drop for Exclusive<'_, T> {
    fn drop(&mut self) {
        self.shell.gate.unlock();
    }
}

struct Alloc {
    /// Chunks allocated so far.
    chunks: usize,
    /// Shells of the last chunk handed out so far.
    used_in_last: usize,
    /// Freed shells, oldest first (addresses).
    free: VecDeque<usize>,
}

/// A pool of shells of one kind (static: shells live for the whole process).
pub(crate) struct Pool<T> {
    kind: &'static str,
    chunks: [AtomicPtr<Shell<T>>; MAX_CHUNKS],
    alloc: Mutex<Alloc>,
}

/// Why a pointer was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not the address of a shell of this pool.
    Foreign,
    /// A shell of this pool, but freed (or never used).
    Dead,
}

impl<T> Pool<T> {
    fn release(&self, shell: &Shell<T>) {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        a.free.push_back(shell as *const Shell<T> as usize);
    }
}

impl<T: Send + Sync + 'static> Pool<T> {
    /// An empty pool; `kind` names the handle type in messages (`"tensor"`).
    pub(crate) const fn new(kind: &'static str) -> Pool<T> {
        Pool {
            kind,
            chunks: [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_CHUNKS],
            alloc: Mutex::new(Alloc {
                chunks: 0,
                used_in_last: 0,
                free: VecDeque::new(),
            }),
        }
    }

    /// The handle kind, for messages.
    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }

    /// Makes a live handle holding `value`; returns the pointer C sees.
    pub(crate) fn insert(&'static self, value: T) -> *mut c_void {
        let shell = self.take_shell();
        // SAFETY: the shell's gate is closed and idle (it came off the free list after its
        // close finished, or is new): nobody reads `value` until `open` publishes it.
        unsafe { *shell.value.get() = Some(value) };
        shell.gate.open();
        (shell as *const Shell<T>).cast_mut().cast()
    }

    fn take_shell(&'static self) -> &'static Shell<T> {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        if a.free.len() > QUARANTINE
            && let Some(addr) = a.free.pop_front()
        {
            // SAFETY: addresses on the free list are shells of this pool's leaked chunks.
            return unsafe { &*(addr as *const Shell<T>) };
        }
        let last_len = if a.chunks == 0 {
            0
        } else {
            FIRST_CHUNK << (a.chunks - 1)
        };
        if a.chunks == 0 || a.used_in_last == last_len {
            assert!(a.chunks < MAX_CHUNKS, "handle pool exhausted");
            let len = FIRST_CHUNK << a.chunks;
            let chunk: Box<[Shell<T>]> = (0..len).map(|_| Shell::new()).collect();
            let base = Box::leak(chunk).as_mut_ptr();
            self.chunks[a.chunks].store(base, Ordering::Release);
            a.chunks += 1;
            a.used_in_last = 0;
        }
        let base = self.chunks[a.chunks - 1].load(Ordering::Acquire);
        let i = a.used_in_last;
        a.used_in_last += 1;
        // SAFETY: `i` < the chunk's length, and the chunk is leaked (lives forever).
        unsafe { &*base.add(i) }
    }

    /// The shell at `p`, if `p` is exactly the address of one of this pool's shells. Never
    /// dereferences `p` otherwise.
    pub(crate) fn shell(&self, p: *const c_void) -> Option<&'static Shell<T>> {
        let addr = p as usize;
        let size = std::mem::size_of::<Shell<T>>();
        for (k, c) in self.chunks.iter().enumerate() {
            let base = c.load(Ordering::Acquire);
            if base.is_null() {
                break;
            }
            let start = base as usize;
            let end = start + (FIRST_CHUNK << k) * size;
            if (start..end).contains(&addr) {
                if !(addr - start).is_multiple_of(size) {
                    return None;
                }
                // SAFETY: `addr` is the address of a shell inside a leaked chunk of this
                // pool (checked just above); chunks are never freed.
                return Some(unsafe { &*(addr as *const Shell<T>) });
            }
        }
        None
    }

    /// Pins the live handle at `p` for shared use.
    #[inline]
    pub(crate) fn pin(&self, p: *const c_void) -> Result<Pin<'static, T>, Refused> {
        let shell = self.shell(p).ok_or(Refused::Foreign)?;
        pin_shell(shell)
    }

    /// Takes the live handle at `p` exclusively, to mutate it: newcomers wait, the users
    /// already inside finish first.
    pub(crate) fn pin_exclusive(&self, p: *const c_void) -> Result<Exclusive<'_, T>, Refused> {
        let shell = self.shell(p).ok_or(Refused::Foreign)?;
        shell.gate.lock().map_err(|_| Refused::Dead)?;
        Ok(Exclusive { shell })
    }

    /// Frees the live handle at `p` and returns its value: newcomers are refused at once,
    /// the users already inside finish first; the shell goes to the pool's quarantine.
    pub(crate) fn take(&self, p: *const c_void) -> Result<T, Refused> {
        let shell = self.shell(p).ok_or(Refused::Foreign)?;
        let v = shell.close_and_take()?;
        self.release(shell);
        Ok(v)
    }

    /// Pins the first live handle whose value satisfies `pred` (a linear scan of the pool:
    /// for lookups by content, e.g. which tensor holds an address — not for hot paths).
    pub(crate) fn find_live(&self, pred: impl Fn(&T) -> bool) -> Option<Pin<'static, T>> {
        for (k, c) in self.chunks.iter().enumerate() {
            let base = c.load(Ordering::Acquire);
            if base.is_null() {
                break;
            }
            for i in 0..(FIRST_CHUNK << k) {
                // SAFETY: `i` is inside chunk `k`, which is leaked (lives forever).
                let shell: &'static Shell<T> = unsafe { &*base.add(i) };
                if !shell.is_live() {
                    continue;
                }
                if let Ok(p) = pin_shell(shell)
                    && pred(&p)
                {
                    return Some(p);
                }
            }
        }
        None
    }

    /// Frees every live handle of the pool (at `nrt_close`, for models), returning their
    /// values.
    pub(crate) fn drain_live(&self) -> Vec<T> {
        let mut out = Vec::new();
        for (k, c) in self.chunks.iter().enumerate() {
            let base = c.load(Ordering::Acquire);
            if base.is_null() {
                break;
            }
            for i in 0..(FIRST_CHUNK << k) {
                // SAFETY: `i` is inside the leaked chunk `k`.
                let shell = unsafe { &*base.add(i) };
                if shell.is_live()
                    && let Ok(x) = shell.close_and_take()
                {
                    self.release(shell);
                    out.push(x);
                }
            }
        }
        out
    }
}

#[inline]
fn pin_shell<T>(shell: &'static Shell<T>) -> Result<Pin<'static, T>, Refused> {
    match shell.gate.enter() {
        Ok(()) => Ok(Pin { shell }),
        Err(_) => Err(Refused::Dead),
    }
}

/// A single-slot shell with its own LIVE protocol, for the process-global runtime.
pub(crate) struct Slot<T> {
    shell: Shell<T>,
}

// SAFETY: as for `Shell`.
unsafe impl<T: Send + Sync> Sync for Slot<T> {}

impl<T> Slot<T> {
    /// An empty slot.
    pub(crate) const fn new() -> Slot<T> {
        Slot {
            shell: Shell {
                gate: UseGate::new_closed(),
                value: UnsafeCell::new(None),
            },
        }
    }

    /// Pins the value, if there is one.
    #[inline]
    pub(crate) fn pin(&'static self) -> Option<Pin<'static, T>> {
        pin_shell(&self.shell).ok()
    }

    /// Installs a value. The caller serializes `install` and `take` (the lifecycle lock)
    /// and the slot must be empty.
    pub(crate) fn install(&self, value: T) {
        // SAFETY: the slot is empty and its gate closed and idle (caller contract): nobody
        // reads `value` until `open` publishes it.
        unsafe { *self.shell.value.get() = Some(value) };
        self.shell.gate.open();
    }

    /// Removes the value: newcomers are refused at once, pins already inside finish first.
    /// Serialized with `install`.
    pub(crate) fn take(&self) -> Option<T> {
        self.shell.close_and_take().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static P: Pool<u32> = Pool::new("test");
    static Q: Pool<u64> = Pool::new("other");

    #[test]
    fn lifecycle_and_stale_detection() {
        let h = P.insert(7);
        assert_eq!(*P.pin(h).unwrap(), 7);
        // Another pool never accepts it, nor does a misaligned or foreign address.
        assert_eq!(Q.pin(h).err(), Some(Refused::Foreign));
        assert_eq!(
            P.pin(h.cast::<u8>().wrapping_add(1).cast()).err(),
            Some(Refused::Foreign)
        );
        let local = 5u32;
        assert_eq!(
            P.pin((&local as *const u32).cast()).err(),
            Some(Refused::Foreign)
        );
        {
            let mut x = P.pin_exclusive(h).unwrap();
            *x = 8;
        }
        assert_eq!(*P.pin(h).unwrap(), 8);
        assert_eq!(P.take(h), Ok(8));
        assert_eq!(P.pin(h).err(), Some(Refused::Dead));
        assert!(P.pin_exclusive(h).is_err());
        assert_eq!(P.take(h), Err(Refused::Dead));
        // Quarantine: the freed shell is not reused by the next allocations.
        let others: Vec<_> = (0..100).map(|i| P.insert(i)).collect();
        assert!(!others.contains(&h));
        assert_eq!(P.pin(h).err(), Some(Refused::Dead));
    }

    #[test]
    fn recycles_after_quarantine_and_grows_chunks() {
        static R: Pool<usize> = Pool::new("r");
        let hs: Vec<_> = (0..QUARANTINE + 10).map(|i| R.insert(i)).collect();
        for &h in &hs {
            R.take(h).unwrap();
        }
        let again = R.insert(1);
        assert_eq!(again, hs[0], "oldest freed shell is reused first");
        assert_eq!(*R.pin(again).unwrap(), 1);
        assert_eq!(R.drain_live(), vec![1]);
    }

    #[test]
    fn slot() {
        static S: Slot<String> = Slot::new();
        assert!(S.pin().is_none());
        S.install("a".into());
        assert_eq!(&*S.pin().unwrap(), "a");
        assert_eq!(S.take().as_deref(), Some("a"));
        assert!(S.pin().is_none());
        assert!(S.take().is_none());
    }

    #[test]
    fn concurrent_pins_and_free() {
        static C: Pool<Vec<u8>> = Pool::new("c");
        let h = C.insert(vec![1; 64]) as usize;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    let mut ok = 0;
                    for _ in 0..10_000 {
                        match C.pin(h as *const c_void) {
                            Ok(p) => {
                                assert_eq!(p.len(), 64);
                                ok += 1;
                            }
                            Err(e) => {
                                assert_eq!(e, Refused::Dead);
                                break;
                            }
                        }
                    }
                    ok
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let v = C.take(h as *const c_void).unwrap();
        assert_eq!(v.len(), 64);
        for t in threads {
            t.join().unwrap();
        }
    }
}
