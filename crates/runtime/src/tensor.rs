//! Tensors and tensor sets.
//!
//! A [`Tensor`] is a shared handle (cloning it is a reference-count increment) to bytes in
//! device memory (`Placement::Device`) or in host memory (`Placement::Host`). Device tensors
//! can be bound to executions on every surface; host tensors only on the synchronous one,
//! which clones them into device buffers reserved at model load.
//!
//! Tensor bytes are *device-style memory*: reads and writes are plain copies through raw
//! pointers, never Rust references, exactly as a DMA engine sees them. Writing a tensor while
//! an execution that uses it is in flight yields unspecified bytes, as on hardware; the
//! implicit-async surface makes reads and writes wait for pending executions, as the public
//! runtime does.

use crate::error::{NrtError, Result};
use crate::{RuntimeInner, ensure_open};
use nrt_hal::{DevAddr, DeviceMapping, NrtStatus};
use std::collections::HashMap;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// Where a tensor lives (`nrt_tensor_placement_t`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Device memory (`NRT_TENSOR_PLACEMENT_DEVICE`).
    Device = 0,
    /// Host memory (`NRT_TENSOR_PLACEMENT_HOST`).
    Host = 1,
    /// Ordinary host memory (`NRT_TENSOR_PLACEMENT_VIRTUAL`); treated as host.
    Virtual = 2,
}

impl Placement {
    /// Decodes the C enum.
    pub fn from_u32(v: u32) -> Option<Placement> {
        match v {
            0 => Some(Placement::Device),
            1 => Some(Placement::Host),
            2 => Some(Placement::Virtual),
            _ => None,
        }
    }

    pub(crate) fn is_device(self) -> bool {
        self == Placement::Device
    }
}

pub(crate) enum Storage {
    /// Device memory at `addr` (host view `map`); `alloc` is the allocation to free when the
    /// last handle drops (`None` for slices, which keep their parent alive instead).
    Device {
        addr: DevAddr,
        map: DeviceMapping,
        alloc: Option<DevAddr>,
        _parent: Option<Tensor>,
    },
    /// Host memory: `ptr`/`len` are atomics so `attach_buffer` can set them on an empty
    /// tensor; `owned` buffers were allocated by us (a leaked `Box<[u8]>`, freed on drop).
    Host {
        ptr: AtomicPtr<u8>,
        len: AtomicUsize,
        owned: bool,
        _parent: Option<Tensor>,
    },
}

/// Per-output streaming-completion state: the count the harvest bumps when the device says
/// the output is final, and the waiters of `check_output_completion`.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    count: AtomicU64,
    waiters: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Completion {
    /// Bumps the count and wakes waiters (a lock and a futex wake only if someone waits).
    pub(crate) fn bump(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) != 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    pub(crate) fn wait(&self, expected: u64, timeout: Option<Duration>) -> bool {
        if self.count.load(Ordering::Acquire) >= expected {
            return true;
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let reached = loop {
            if self.count.load(Ordering::SeqCst) >= expected {
                break true;
            }
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break false;
                    }
                    g = self
                        .cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        };
        drop(g);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        reached
    }
}

pub(crate) struct TensorShared {
    pub(crate) id: u64,
    name: String,
    pub(crate) placement: Placement,
    pub(crate) vnc: i32,
    size: u64,
    pub(crate) storage: Storage,
    pub(crate) completion: Completion,
    /// Executions in flight that use the tensor (implicit async: reads/writes wait for 0).
    pub(crate) pending: AtomicU32,
    /// The logical core of the last execution that marked the tensor pending: whose
    /// completion wake a read that waits for it blocks on (a hint; relaxed).
    pub(crate) pending_vnc: AtomicU32,
    rt: Weak<RuntimeInner>,
}

impl Drop for TensorShared {
    fn drop(&mut self) {
        match &self.storage {
            Storage::Device { alloc: Some(a), .. } => {
                if let Some(rt) = self.rt.upgrade() {
                    let _ = rt.device.mem_free(*a);
                    if let Some(vc) = rt.vcores.get(self.vnc as usize) {
                        vc.stats().mem[crate::host::mem::TENSORS]
                            .fetch_sub(self.size, Ordering::Relaxed);
                    }
                }
            }
            Storage::Host {
                ptr,
                len,
                owned: true,
                ..
            } => {
                let p = ptr.load(Ordering::Acquire);
                let n = len.load(Ordering::Acquire);
                if let Some(rt) = self.rt.upgrade() {
                    crate::host::count_host_tensor(&rt, n as u64, false);
                }
                // SAFETY: an owned host buffer is exactly the `Box<[u8]>` of `n` bytes leaked
                // in `new_host`; nothing else frees it and no handle outlives this drop.
                drop(unsafe { Box::from_raw(core::ptr::slice_from_raw_parts_mut(p, n)) });
            }
            _ => {}
        }
    }
}

/// Zero-filled host memory for a tensor of `size` bytes, or `NRT_RESOURCE`.
///
/// The size comes from a caller, so this never aborts: the allocation is fallible
/// (`alloc_zeroed`, which returns null instead of calling the abort handler), and a request
/// larger than the host can back ([`nrt_hal::host_memory_available`]) is refused up front,
/// because with overcommit a huge zeroed allocation succeeds and the OOM killer ends the
/// process later, when the pages are touched. The result is freed as a `Box<[u8]>` of `size` bytes.
fn alloc_host_zeroed(size: u64, name: &str) -> Result<*mut u8> {
    let refuse = |why: String| {
        NrtError::new(
            NrtStatus::Resource,
            format!("cannot allocate host tensor '{name}' of {size} bytes: {why}"),
        )
    };
    let len = usize::try_from(size).map_err(|_| refuse("larger than the address space".into()))?;
    if len == 0 {
        return Ok(core::ptr::NonNull::<u8>::dangling().as_ptr());
    }
    let layout = std::alloc::Layout::array::<u8>(len)
        .map_err(|_| refuse("larger than the address space".into()))?;
    if size >= nrt_hal::tuning::HOST_ALLOC_BACKING_CHECK_BYTES
        && let Some(avail) = nrt_hal::host_memory_available()
        && size > avail
    {
        return Err(refuse(format!(
            "the host has {avail} bytes available (the least of MemAvailable, the memory \
             cgroup's headroom and NRT_HOST_MEMORY_MAX)"
        )));
    }
    // SAFETY: `layout` has a non-zero size (len > 0).
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(refuse("out of host memory".into()));
    }
    Ok(p)
}

/// A device tensor's failed allocation: out of memory, with the memory-usage dump.
#[cold]
fn oom(rt: &RuntimeInner, vnc: i32, size: u64, name: &str, e: nrt_hal::HalError) -> NrtError {
    match e {
        nrt_hal::HalError::OutOfMemory { free, .. } => crate::host::out_of_device_memory(
            rt,
            vnc.max(0) as u32,
            size,
            &format!("tensor '{name}'"),
            crate::host::mem::TENSORS,
            None,
            free,
        ),
        e => e.into(),
    }
}

/// A tensor handle. Clones share the tensor.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorShared>);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.0.name)
            .field("placement", &self.0.placement)
            .field("size", &self.0.size)
            .finish()
    }
}

static NEXT_TENSOR_ID: AtomicU64 = AtomicU64::new(1);

impl Tensor {
    pub(crate) fn new_device(
        rt: &Arc<RuntimeInner>,
        vnc: i32,
        size: u64,
        name: &str,
    ) -> Result<Tensor> {
        let dev = &rt.device;
        let addr = dev
            .mem_alloc(size.max(1), 64)
            .map_err(|e| oom(rt, vnc, size, name, e))?;
        let map = match dev.map(addr, size) {
            Ok(m) => m,
            Err(e) => {
                let _ = dev.mem_free(addr);
                return Err(e.into());
            }
        };
        dev.memset(addr, 0, size)?;
        if let Some(vc) = rt.vcores.get(vnc as usize) {
            vc.stats().mem[crate::host::mem::TENSORS].fetch_add(size, Ordering::Relaxed);
        }
        Ok(Tensor::wrap(
            rt,
            name,
            Placement::Device,
            vnc,
            size,
            Storage::Device {
                addr,
                map,
                alloc: Some(addr),
                _parent: None,
            },
        ))
    }

    pub(crate) fn new_host(
        rt: &Arc<RuntimeInner>,
        placement: Placement,
        size: u64,
        name: &str,
    ) -> Result<Tensor> {
        let ptr = alloc_host_zeroed(size, name)?;
        crate::host::count_host_tensor(rt, size, true);
        // `alloc_host_zeroed` succeeded, so the size fits in `usize`.
        let len = size as usize;
        Ok(Tensor::wrap(
            rt,
            name,
            placement,
            -1,
            size,
            Storage::Host {
                ptr: AtomicPtr::new(ptr),
                len: AtomicUsize::new(len),
                owned: true,
                _parent: None,
            },
        ))
    }

    pub(crate) fn new_empty(rt: &Arc<RuntimeInner>, name: &str) -> Tensor {
        Tensor::wrap(
            rt,
            name,
            Placement::Host,
            -1,
            0,
            Storage::Host {
                ptr: AtomicPtr::new(core::ptr::null_mut()),
                len: AtomicUsize::new(0),
                owned: false,
                _parent: None,
            },
        )
    }

    fn wrap(
        rt: &Arc<RuntimeInner>,
        name: &str,
        placement: Placement,
        vnc: i32,
        size: u64,
        storage: Storage,
    ) -> Tensor {
        Tensor(Arc::new(TensorShared {
            id: NEXT_TENSOR_ID.fetch_add(1, Ordering::Relaxed),
            name: name.to_owned(),
            placement,
            vnc,
            size,
            storage,
            completion: Completion::default(),
            pending: AtomicU32::new(0),
            pending_vnc: AtomicU32::new(0),
            rt: Arc::downgrade(rt),
        }))
    }

    pub(crate) fn rt(&self) -> Result<Arc<RuntimeInner>> {
        let rt = self
            .0
            .rt
            .upgrade()
            .ok_or_else(|| NrtError::new(NrtStatus::Closed, "the runtime was closed"))?;
        ensure_open(&rt)?;
        Ok(rt)
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Where it lives.
    pub fn placement(&self) -> Placement {
        self.0.placement
    }

    /// Its size in bytes (`nrt_tensor_get_size`). For an empty tensor, the attached
    /// buffer's size.
    pub fn size(&self) -> u64 {
        match &self.0.storage {
            Storage::Host {
                len,
                owned: false,
                _parent: None,
                ..
            } => len.load(Ordering::Acquire) as u64,
            _ => self.0.size,
        }
    }

    /// The vcore a device tensor was allocated on (`-1` for host tensors).
    pub fn vnc(&self) -> i32 {
        self.0.vnc
    }

    /// Device physical address of a device tensor.
    pub fn device_address(&self) -> Option<DevAddr> {
        match &self.0.storage {
            Storage::Device { addr, .. } => Some(*addr),
            Storage::Host { .. } => None,
        }
    }

    /// A host pointer to the bytes (`nrt_tensor_get_va`); null for an empty tensor.
    pub fn host_ptr(&self) -> *mut u8 {
        match &self.0.storage {
            Storage::Device { map, .. } => map.as_ptr(),
            Storage::Host { ptr, .. } => ptr.load(Ordering::Acquire),
        }
    }

    /// Whether the tensor was allocated by runtime `rt` (a pointer compare).
    #[inline]
    pub(crate) fn belongs_to(&self, rt: &RuntimeInner) -> bool {
        core::ptr::eq(self.0.rt.as_ptr(), rt)
    }

    /// Whether two handles name the same tensor.
    pub fn same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub(crate) fn range(&self, offset: u64, len: u64, what: &str) -> Result<(*mut u8, usize)> {
        let size = self.size();
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(NrtError::invalid(format!(
                "{what} of {len} bytes at offset {offset} is outside tensor '{}' ({size} bytes)",
                self.0.name
            )));
        }
        let base = self.host_ptr();
        if base.is_null() && len > 0 {
            return Err(NrtError::invalid(format!(
                "tensor '{}' has no buffer attached",
                self.0.name
            )));
        }
        Ok((base.wrapping_add(offset as usize), len as usize))
    }

    /// A tensor viewing `size` bytes of `self` at `offset` (`nrt_tensor_allocate_slice`).
    pub fn slice(&self, offset: u64, size: u64, name: &str) -> Result<Tensor> {
        let rt = self.rt()?;
        self.range(offset, size, "slice")?;
        let storage = match &self.0.storage {
            Storage::Device { addr, map, .. } => {
                let p = core::ptr::NonNull::new(map.as_ptr().wrapping_add(offset as usize))
                    .ok_or_else(|| NrtError::invalid("null device mapping"))?;
                Storage::Device {
                    addr: addr + offset,
                    // SAFETY: the sub-range is inside the parent's mapping, which the slice
                    // keeps alive through `_parent`.
                    map: unsafe { DeviceMapping::new(p, size as usize, addr + offset) },
                    alloc: None,
                    _parent: Some(self.clone()),
                }
            }
            Storage::Host { ptr, .. } => Storage::Host {
                ptr: AtomicPtr::new(ptr.load(Ordering::Acquire).wrapping_add(offset as usize)),
                len: AtomicUsize::new(size as usize),
                owned: false,
                _parent: Some(self.clone()),
            },
        };
        Ok(Tensor::wrap(
            &rt,
            name,
            self.0.placement,
            self.0.vnc,
            size,
            storage,
        ))
    }

    /// Attaches a caller-owned host buffer to a tensor made by `allocate_empty`
    /// (`nrt_tensor_attach_buffer`).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until the tensor is freed or
    /// another buffer is attached, and must not be used for anything else meanwhile.
    pub unsafe fn attach_buffer(&self, ptr: *mut u8, len: usize) -> Result<()> {
        self.rt()?;
        match &self.0.storage {
            Storage::Host {
                ptr: p,
                len: l,
                owned: false,
                _parent: None,
            } => {
                if ptr.is_null() && len > 0 {
                    return Err(NrtError::invalid(format!(
                        "NULL buffer attached to tensor '{}'",
                        self.0.name
                    )));
                }
                l.store(len, Ordering::Release);
                p.store(ptr, Ordering::Release);
                Ok(())
            }
            _ => Err(NrtError::invalid(format!(
                "tensor '{}' was not made by allocate_empty; cannot attach a buffer",
                self.0.name
            ))),
        }
    }

    /// Resets the streaming-completion count (`nrt_tensor_reset_output_completion`).
    pub fn reset_output_completion(&self) {
        self.0.completion.count.store(0, Ordering::Release);
    }

    /// The streaming-completion count.
    pub fn completion_count(&self) -> u64 {
        self.0.completion.count.load(Ordering::Acquire)
    }
}

/// FNV-1a: tensor names are short and trusted, and binding looks each one up on every
/// execution; SipHash's flooding resistance buys nothing here and costs ~4× per lookup.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

type FnvBuild = std::hash::BuildHasherDefault<Fnv>;

/// A named set of tensors: a model's inputs or outputs (`nrt_tensor_set_t`). Adding a name
/// that exists replaces its tensor.
#[derive(Debug, Default, Clone)]
pub struct TensorSet {
    tensors: HashMap<String, Tensor, FnvBuild>,
}

impl TensorSet {
    /// An empty set.
    pub fn new() -> TensorSet {
        TensorSet::default()
    }

    /// Adds `tensor` under `name`, replacing what was there (`nrt_add_tensor_to_tensor_set`).
    pub fn add(&mut self, name: &str, tensor: &Tensor) {
        match self.tensors.get_mut(name) {
            Some(t) => *t = tensor.clone(),
            None => {
                self.tensors.insert(name.to_owned(), tensor.clone());
            }
        }
    }

    /// The tensor named `name` (`nrt_get_tensor_from_tensor_set`).
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The names in the set.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}
