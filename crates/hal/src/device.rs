//! The device contract: the one trait through which the runtime — and nothing else — talks
//! to a NeuronCore device.
//!
//! It mirrors what the public driver exposes through ioctls and mmaps (see
//! `docs/ARCHITECTURE.md` for the ioctl each method stands for): device memory with physical
//! addresses, copies in and out, mappings of device buffers, DMA queues, exec-request queues,
//! the semaphore doorbell, notification rings, and each core's interrupt-cause word.
//!
//! Only [`Device::semaphore_increment`] is called on the submit path of an execution (the
//! doorbell); everything else the runtime calls at init and at model load, or it writes
//! through a [`DeviceMapping`] / ring half it obtained there.

use crate::plane::PlaneConsumer;
use crate::ring::Producer;
use crate::sync::Arc;
use crate::wake::{CompletionWake, ExecutionWakes};
use crate::wire::{DevAddr, TriggerPair};
use core::fmt;
use core::ptr::NonNull;

/// Semaphore index the doorbell increments (`INFERENCE_START`): one increment per core per
/// execution makes the core consume what staging published.
pub const SEMAPHORE_INFERENCE_START: u32 = 0;
/// Semaphore indices below this are reserved for the runtime/device protocol; instructions
/// may only wait on and signal the ones from here up.
pub const FIRST_ENGINE_SEMAPHORE: u32 = 4;
/// Semaphores per core.
pub const SEMAPHORES_PER_CORE: u32 = 256;

/// Static facts about a device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Architecture name reported by `nrt_get_instance_info` (≤ 15 bytes).
    pub arch_name: &'static str,
    /// Device revision (≤ 7 bytes).
    pub revision: &'static str,
    /// Physical NeuronCores on the device.
    pub num_cores: u32,
    /// Size of the device's physical address space in bytes.
    pub memory_bytes: u64,
}

/// Device memory in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemUsage {
    /// Bytes allocated.
    pub bytes_used: u64,
    /// Bytes that can be allocated at most.
    pub bytes_limit: u64,
}

/// Where a model's exec-request ring lives, registered with the device at model load.
///
/// The ring, its tail word and its event word are in device memory allocated by the runtime.
/// The DMA engine writes them when it runs staging's trigger pairs; the device's sequencer
/// reads the slots in order and advances its own head (device-internal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecQueueDesc {
    /// PA of slot 0; slots are [`crate::wire::EXEC_RING_SLOT_SIZE`] bytes apart.
    pub ring_addr: DevAddr,
    /// Number of slots (a power of two).
    pub slots: u32,
    /// PA of the 4-byte tail word the tail-increment trigger writes.
    pub tail_addr: DevAddr,
    /// PA of the 4-byte event word the event-poke trigger writes.
    pub event_addr: DevAddr,
    /// Bytes between consecutive I/O descriptor sets of the model: a request with
    /// `io_set = s` runs `DmaDescriptors { table }` on `table + s × io_set_stride`. 0 when the
    /// model has no I/O descriptor table.
    pub io_set_stride: u64,
}

/// A device error, naming what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HalError {
    /// Not enough free device memory.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free (possibly fragmented).
        free: u64,
    },
    /// Free device memory that the host cannot back now: a software device's memory is host
    /// memory (see [`crate::host_memory`]).
    HostCannotBack {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the host can still give this process.
        available: u64,
    },
    /// An address range outside device memory or outside any allocation.
    BadAddress {
        /// Start of the range.
        addr: DevAddr,
        /// Length of the range.
        len: u64,
    },
    /// `mem_free` of an address that is not the start of a live allocation (double free).
    NotAllocated(DevAddr),
    /// An alignment that is not a power of two.
    BadAlignment(u64),
    /// A core index the device does not have.
    BadCore(u32),
    /// A semaphore index out of range or reserved.
    BadSemaphore(u32),
    /// A queue id that is not registered, or a resource that was already set up.
    BadQueue(u32),
    /// A queue or ring parameter out of range (capacity not a power of two, …).
    BadParameter(&'static str),
    /// The device cannot do this.
    Unsupported(&'static str),
}

impl fmt::Display for HalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HalError::OutOfMemory { requested, free } => {
                write!(
                    f,
                    "device memory exhausted: {requested} bytes requested, {free} free"
                )
            }
            HalError::HostCannotBack {
                requested,
                available,
            } => write!(
                f,
                "the host cannot back {requested} bytes of device memory: it has {available} \
                 bytes available to this process (the least of MemAvailable, the memory cgroup's \
                 headroom and NRT_HOST_MEMORY_MAX); the software NeuronCore's memory is host \
                 memory"
            ),
            HalError::BadAddress { addr, len } => {
                write!(f, "device address range {addr:#x}+{len:#x} is not mapped")
            }
            HalError::NotAllocated(a) => write!(f, "{a:#x} is not a live device allocation"),
            HalError::BadAlignment(a) => write!(f, "alignment {a} is not a power of two"),
            HalError::BadCore(c) => write!(f, "no NeuronCore {c} on this device"),
            HalError::BadSemaphore(s) => write!(f, "semaphore index {s} is out of range"),
            HalError::BadQueue(q) => write!(f, "queue {q} is not registered"),
            HalError::BadParameter(p) => write!(f, "bad parameter: {p}"),
            HalError::Unsupported(w) => write!(f, "unsupported by this device: {w}"),
        }
    }
}

impl std::error::Error for HalError {}

/// A host view of a range of device memory (the driver's mmap of a memory chunk).
///
/// The mapping stays valid until the range is freed with [`Device::mem_free`]; the holder
/// must not use it afterwards. Accesses are plain loads and stores: the protocols that order
/// them against the device (ring publication, the doorbell) are the holder's business.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeviceMapping {
    ptr: NonNull<u8>,
    len: usize,
    addr: DevAddr,
}

// SAFETY: a mapping is an address range in device memory that is valid for the lifetime of
// the device allocation; any thread may hold it. Races on the bytes are governed by the
// runtime/device protocols, as on hardware.
unsafe impl Send for DeviceMapping {}
// SAFETY: as above.
unsafe impl Sync for DeviceMapping {}

impl DeviceMapping {
    /// Wraps a host pointer to `len` bytes backing device range `addr..addr+len`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as the device
    /// allocation that contains the range is live.
    pub unsafe fn new(ptr: NonNull<u8>, len: usize, addr: DevAddr) -> Self {
        DeviceMapping { ptr, len, addr }
    }

    /// Host pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of the first byte.
    pub fn device_addr(&self) -> DevAddr {
        self.addr
    }

    /// Writes `bytes` at `offset`.
    ///
    /// # Panics
    /// If the range is outside the mapping.
    #[inline]
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        assert!(
            offset
                .checked_add(bytes.len())
                .is_some_and(|e| e <= self.len),
            "write of {} bytes at {offset} past a {}-byte mapping",
            bytes.len(),
            self.len
        );
        // SAFETY: the range is inside the mapping (checked above), which is valid for writes
        // while the allocation is live (constructor contract); `bytes` cannot overlap device
        // memory that is only reachable through this mapping's pointer.
        unsafe {
            core::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            )
        };
    }

    /// Reads `out.len()` bytes at `offset`.
    ///
    /// # Panics
    /// If the range is outside the mapping.
    #[inline]
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset.checked_add(out.len()).is_some_and(|e| e <= self.len),
            "read of {} bytes at {offset} past a {}-byte mapping",
            out.len(),
            self.len
        );
        // SAFETY: as in `write`, for reads.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
    }
}

impl fmt::Debug for DeviceMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceMapping({:#x}+{:#x})", self.addr, self.len)
    }
}

/// How a lockstep group's cores are served ([`Device::lockstep_serving`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockstepServing {
    /// One thread runs every part in turn (the parts could not run in parallel).
    pub joint: bool,
    /// Changes between joint and parallel serving since the group's model was loaded.
    pub changes: u64,
}

/// The device contract. Implemented by the software NeuronCore (`nrt-sim`); a hardware
/// backend would implement it over the driver's ioctls.
///
/// Every method validates its arguments and returns a [`HalError`] naming the bad one; none
/// panics on bad input.
pub trait Device: Send + Sync + fmt::Debug {
    /// Static facts about the device.
    fn info(&self) -> DeviceInfo;

    /// The device's clock: nanoseconds since an arbitrary start, monotonic. START and END
    /// records of a traced execution carry it ([`crate::wire::exec_flags::TRACE`]).
    fn clock_ns(&self) -> u64;

    /// Allocates `size` bytes of device memory aligned to `align` (a power of two) and
    /// returns its physical address. (`MEM_ALLOC_V2`)
    fn mem_alloc(&self, size: u64, align: u64) -> Result<DevAddr, HalError>;

    /// Frees an allocation made by [`Device::mem_free`]'s sibling; `addr` must be the address
    /// it returned. (`MEM_FREE`)
    fn mem_free(&self, addr: DevAddr) -> Result<(), HalError>;

    /// Bytes in use and the limit.
    fn mem_usage(&self) -> MemUsage;

    /// Copies host bytes into device memory. (`MEM_BUF_COPY`, to device)
    fn copy_in(&self, dst: DevAddr, src: &[u8]) -> Result<(), HalError>;

    /// Copies device memory out to the host. (`MEM_BUF_COPY`, from device)
    fn copy_out(&self, src: DevAddr, dst: &mut [u8]) -> Result<(), HalError>;

    /// Copies within device memory (ranges may overlap). (`MEM_COPY`)
    fn copy_device(&self, src: DevAddr, dst: DevAddr, len: u64) -> Result<(), HalError>;

    /// Fills device memory with a byte. (`MEMSET`)
    fn memset(&self, dst: DevAddr, value: u8, len: u64) -> Result<(), HalError>;

    /// Maps an allocated range into the host address space (the driver's mmap, whose offset
    /// is the physical address).
    fn map(&self, addr: DevAddr, len: u64) -> Result<DeviceMapping, HalError>;

    /// Sets up core `nc`'s DMA trigger queue and returns its producer half; the device
    /// consumes it when the doorbell rings. One per core. (`DMA_QUEUE_INIT`)
    fn dma_queue_init(&self, nc: u32, capacity: u32) -> Result<Producer<TriggerPair>, HalError>;

    /// Releases core `nc`'s DMA trigger queue (after which it may be set up again).
    /// (`DMA_QUEUE_RELEASE`)
    fn dma_queue_release(&self, nc: u32) -> Result<(), HalError>;

    /// Registers an exec-request ring on core `nc`; returns the queue id that tail-increment
    /// triggers name.
    fn exec_queue_register(&self, nc: u32, desc: ExecQueueDesc) -> Result<u16, HalError>;

    /// Unregisters an exec-request ring (at model unload).
    fn exec_queue_release(&self, nc: u32, queue: u16) -> Result<(), HalError>;

    /// Sets up core `nc`'s notification plane — its five INFER_STATUS rings and its ERROR
    /// ring, `capacity` records each — and returns the consumer half the host polls.
    /// (`NOTIFICATIONS_INIT_V2` for each ring + mmap)
    fn notification_init(&self, nc: u32, capacity: u32) -> Result<PlaneConsumer, HalError>;

    /// Releases core `nc`'s notification plane. (`NOTIFICATIONS_DESTROY`)
    fn notification_release(&self, nc: u32) -> Result<(), HalError>;

    /// Lends the calling host thread to core `nc` for a moment: a software device whose own
    /// thread is not running the core right now (a co-tenant took its vCPU, or it is between
    /// polls) does the core's pending work on the caller's thread — runs its doorbell, its
    /// requests, its instructions until the current execution finishes or stalls — and says
    /// whether it did anything. It never blocks: a core another thread is serving is left
    /// alone. A host thread that waits for the core and has seen no progress for a while calls
    /// it, instead of spinning on a device thread that is not running. Hardware (the
    /// default) does nothing.
    fn assist(&self, _nc: u32) -> bool {
        false
    }

    /// Readies the calling host thread to do device work later ([`Device::assist`]) without
    /// allocating then: a software device whose kernels keep per-thread state sets it up
    /// now. The runtime calls it once per thread, on the thread's first wait that may
    /// assist — inside its first execution, not in its steady state. Hardware (the default)
    /// does nothing.
    fn prepare_thread(&self) {}

    /// Declares that the calling host thread serves core `nc` from now on (`on`), polling it
    /// with [`Device::assist`] itself, until it calls this again with `false`: the device's
    /// own threads leave the core alone meanwhile and a doorbell does not wake them (on a
    /// host with fewer CPUs than runnable threads, one thread fewer). They still look now
    /// and then and run work that nobody took, so a server that stops polling without
    /// saying so delays the core, never strands it. Clearing hands back what is pending.
    /// Returns whether the device takes it; hardware (the default) does not.
    fn host_serves(&self, _nc: u32, _on: bool) -> bool {
        false
    }

    /// How the lockstep group whose first core is `nc` is served now, for the host view
    /// (`nrt monitor`, `nrt top`): a software device whose cores have threads of their own
    /// may serve a group's parts from one thread when they cannot run in parallel (a busy
    /// host). `None`: not a lockstep group's first core, or a device that does not choose
    /// (hardware, the default: every core computes on its own).
    fn lockstep_serving(&self, _nc: u32) -> Option<LockstepServing> {
        None
    }

    /// [`Device::assist`], but only if the device has not yet taken core `nc`'s last
    /// doorbell: its thread has not looked at the core since the host rang — on a shared
    /// host, because it is not running. A waiter calls it early in its spin: a device thread
    /// that is running takes a doorbell within a few hundred ns, so on a quiet machine this
    /// is one load and does nothing. Hardware (the default) does nothing.
    fn assist_untaken(&self, _nc: u32) -> bool {
        false
    }

    /// Attaches a completion wake to core `nc`'s notification plane (`None` detaches it):
    /// after each publication of records the device signals it, so a host thread blocked on
    /// it ([`CompletionWake::wait`]) wakes — the completion interrupt of the driver's
    /// notification rings. Several cores may share one wake (the cores of a vcore). The
    /// plane must be set up ([`Device::notification_init`]); releasing it detaches the wake.
    ///
    /// The default says the device cannot signal: the host must then not block without a
    /// timeout (it polls).
    fn notification_wake(
        &self,
        nc: u32,
        wake: Option<Arc<CompletionWake>>,
    ) -> Result<(), HalError> {
        let _ = (nc, wake);
        Err(HalError::Unsupported("completion wake"))
    }

    /// Attaches per-execution wakes to core `nc`'s notification plane (`None` detaches
    /// them): after the publication that finishes or aborts execution `compute_idx`, the
    /// device signals [`ExecutionWakes::of`]`(compute_idx)` — the completion interrupt of
    /// that execution alone, for the one host thread waiting for it. Several cores may share
    /// them (the cores of a vcore; only the core whose part completes a lockstep execution
    /// signals). The plane must be set up ([`Device::notification_init`]).
    ///
    /// The default says the device cannot: the host then waits on the plane's completion
    /// wake ([`Device::notification_wake`]) for every execution.
    fn execution_wakes(&self, nc: u32, wakes: Option<Arc<ExecutionWakes>>) -> Result<(), HalError> {
        let _ = (nc, wakes);
        Err(HalError::Unsupported("execution wakes"))
    }

    /// Adds `value` to semaphore `semaphore` of core `nc` — with
    /// [`SEMAPHORE_INFERENCE_START`], the doorbell. (`SEMAPHORE_INCREMENT`, ioctl #41, whose
    /// argument is `{nc_id, semaphore_index, value}`)
    fn semaphore_increment(&self, nc: u32, semaphore: u32, value: u32) -> Result<(), HalError>;

    /// Reads a semaphore. (`SEMAPHORE_READ`)
    fn semaphore_read(&self, nc: u32, semaphore: u32) -> Result<u32, HalError>;

    /// Reads core `nc`'s interrupt-cause word ([`crate::wire::cause`] bits).
    fn interrupt_cause(&self, nc: u32) -> Result<u32, HalError>;

    /// Clears the given cause bits of core `nc`.
    fn interrupt_cause_clear(&self, nc: u32, bits: u32) -> Result<(), HalError>;

    /// Resets core `nc`: drops whatever it was executing, clears its semaphores and cause
    /// word, and makes a wedged core take requests again. (`NC_RESET`)
    fn nc_reset(&self, nc: u32) -> Result<(), HalError>;
}
