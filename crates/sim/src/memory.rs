//! Device memory: one physical address space per device, reserved up front and committed
//! lazily by the OS, with a first-fit allocator over it.
//!
//! The whole space is one anonymous `mmap` with `MAP_NORESERVE`: reserving a large space costs
//! nothing until pages are touched, so a device can advertise e.g. 16 GiB on a laptop. Device
//! address `a` is host byte `base + a`. Address 0 .. [`RESERVED_LOW`] is never handed out, so
//! a zero (unrelocated) address always faults.
//!
//! The allocator is only used at init and model load (never on the execution path); it is a
//! mutex-guarded ordered map of free ranges with coalescing on free.

use nrt_hal::{DevAddr, HalError, MemUsage};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Bytes at the bottom of the address space that are never allocated.
pub const RESERVED_LOW: u64 = 1 << 16;

/// The host mapping of a device's physical memory.
#[derive(Debug)]
pub(crate) struct Memory {
    base: *mut u8,
    len: u64,
    alloc: Mutex<Allocator>,
}

// SAFETY: the mapping is owned by the Memory and lives until it is dropped; concurrent access
// to its bytes is ordered by the device/runtime protocols (rings, doorbells, completion), as
// on hardware.
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

#[derive(Debug)]
struct Allocator {
    /// Free ranges: start → size.
    free: BTreeMap<u64, u64>,
    /// Live allocations: start → size.
    live: BTreeMap<u64, u64>,
    used: u64,
}

impl Memory {
    /// Reserves `len` bytes of address space.
    pub(crate) fn new(len: u64) -> Result<Memory, HalError> {
        if len <= RESERVED_LOW || len > 1 << 46 {
            return Err(HalError::BadParameter(
                "device memory size must be in (64 KiB, 64 TiB]",
            ));
        }
        // SAFETY: an anonymous private mapping with no address hint; the result is checked
        // against MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(HalError::OutOfMemory {
                requested: len,
                free: 0,
            });
        }
        let mut free = BTreeMap::new();
        free.insert(RESERVED_LOW, len - RESERVED_LOW);
        Ok(Memory {
            base: p.cast(),
            len,
            alloc: Mutex::new(Allocator {
                free,
                live: BTreeMap::new(),
                used: 0,
            }),
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    /// Whether `addr..addr+len` lies inside the address space.
    #[inline]
    pub(crate) fn in_bounds(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len).is_some_and(|e| e <= self.len)
    }

    /// Host pointer of `addr` (no check).
    #[inline]
    pub(crate) fn ptr(&self, addr: u64) -> *mut u8 {
        self.base.wrapping_add(addr as usize)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.alloc.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn alloc(&self, size: u64, align: u64) -> Result<DevAddr, HalError> {
        if !align.is_power_of_two() || align > 1 << 30 {
            return Err(HalError::BadAlignment(align));
        }
        let align = align.max(64);
        let mut a = self.lock();
        // A request larger than the whole space (or one whose rounding overflows, such as
        // `SIZE_MAX`) is out of memory, not a bad address: checked arithmetic, never a wrap.
        let rounded = size.max(1).checked_next_multiple_of(64);
        let hit = rounded.and_then(|size| {
            a.free.iter().find_map(|(&start, &len)| {
                let s = start.checked_next_multiple_of(align)?;
                let end = s.checked_add(size)?;
                (end <= start + len).then_some((start, len, s))
            })
        });
        let Some((start, len, s)) = hit else {
            let free = a.free.values().sum();
            return Err(HalError::OutOfMemory {
                requested: size,
                free,
            });
        };
        let size = rounded.unwrap_or(size);
        // Device memory is this host's memory, committed page by page as the model writes
        // it: an allocation the host cannot back now would end the process mid-execution
        // (the OOM killer: the host's, or a container's at its cgroup limit). Load time only.
        if size >= nrt_hal::tuning::HOST_ALLOC_BACKING_CHECK_BYTES
            && let Some(available) = nrt_hal::host_memory_available()
            && size > available
        {
            return Err(HalError::HostCannotBack {
                requested: size,
                available,
            });
        }
        a.free.remove(&start);
        if s > start {
            a.free.insert(start, s - start);
        }
        if s + size < start + len {
            a.free.insert(s + size, start + len - s - size);
        }
        a.live.insert(s, size);
        a.used += size;
        Ok(s)
    }

    pub(crate) fn free(&self, addr: DevAddr) -> Result<(), HalError> {
        let mut a = self.lock();
        let size = a.live.remove(&addr).ok_or(HalError::NotAllocated(addr))?;
        a.used -= size;
        let (mut start, mut len) = (addr, size);
        if let Some((&ps, &pl)) = a.free.range(..start).next_back()
            && ps + pl == start
        {
            a.free.remove(&ps);
            start = ps;
            len += pl;
        }
        if let Some(&nl) = a.free.get(&(start + len)) {
            a.free.remove(&(start + len));
            len += nl;
        }
        a.free.insert(start, len);
        // Give the pages back to the OS so a freed allocation costs no resident memory.
        let page = 4096u64;
        let (lo, hi) = (addr.next_multiple_of(page), (addr + size) / page * page);
        if hi > lo {
            // SAFETY: lo..hi lies inside our own mapping (addr..addr+size was allocated from
            // it) and is page-aligned; MADV_DONTNEED on a private anonymous mapping just
            // zero-fills those pages on next touch.
            unsafe { libc::madvise(self.ptr(lo).cast(), (hi - lo) as usize, libc::MADV_DONTNEED) };
        }
        Ok(())
    }

    pub(crate) fn usage(&self) -> MemUsage {
        MemUsage {
            bytes_used: self.lock().used,
            bytes_limit: self.len - RESERVED_LOW,
        }
    }

    /// Whether `addr..addr+len` lies inside one live allocation.
    pub(crate) fn is_allocated(&self, addr: u64, len: u64) -> bool {
        let a = self.lock();
        a.live
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, &l)| addr.checked_add(len).is_some_and(|e| e <= s + l))
    }

    /// Copies `len` bytes within device memory (ranges may overlap).
    ///
    /// # Safety
    /// Both ranges must be in bounds.
    #[inline]
    pub(crate) unsafe fn copy_within(&self, src: u64, dst: u64, len: u64) {
        if src == dst || len == 0 {
            return;
        }
        let (s, d) = (self.ptr(src), self.ptr(dst));
        // SAFETY: both ranges are inside the mapping (caller contract). The word copies read
        // the whole source before writing, so they tolerate overlap as `copy` does.
        unsafe {
            match len {
                // The DMA engine's event pokes and tail increments: a word, not a libc call.
                4 => d
                    .cast::<u32>()
                    .write_unaligned(s.cast::<u32>().read_unaligned()),
                8 => d
                    .cast::<u64>()
                    .write_unaligned(s.cast::<u64>().read_unaligned()),
                _ => core::ptr::copy(s, d, len as usize),
            }
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly the mapping created in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesce() {
        let m = Memory::new(1 << 24).unwrap();
        let a = m.alloc(100, 64).unwrap();
        let b = m.alloc(4096, 4096).unwrap();
        let c = m.alloc(1, 1).unwrap();
        assert!(a >= RESERVED_LOW && a.is_multiple_of(64));
        assert!(b.is_multiple_of(4096));
        assert!(m.is_allocated(b, 4096) && !m.is_allocated(b, 4097));
        assert_eq!(m.free(b), Ok(()));
        assert_eq!(m.free(b), Err(HalError::NotAllocated(b)));
        m.free(a).unwrap();
        m.free(c).unwrap();
        assert_eq!(m.usage().bytes_used, 0);
        // Fully coalesced: one free range again.
        assert_eq!(m.lock().free.len(), 1);
        assert!(matches!(
            m.alloc(1 << 30, 64),
            Err(HalError::OutOfMemory { .. })
        ));
        assert_eq!(m.alloc(8, 3), Err(HalError::BadAlignment(3)));
    }

    #[test]
    fn large_reservation_is_lazy() {
        // 64 GiB of address space on a 24 GiB machine: only touched pages are committed.
        let m = Memory::new(64 << 30).unwrap();
        let a = m.alloc(1 << 20, 64).unwrap();
        // SAFETY: a..a+1MiB is inside the mapping.
        unsafe { core::ptr::write_bytes(m.ptr(a), 7, 1 << 20) };
        m.free(a).unwrap();
    }
}
