//! # nrt-kernels — what the engines of the software NeuronCore compute
//!
//! One function, [`execute`], runs one compute or data-movement [`Op`] of `nrt-isa` against
//! device memory. The device's scheduler (in `nrt-sim`) handles everything else: semaphores,
//! notifications, DMA descriptor tables, barriers, end-of-block.
//!
//! (Work in progress: see the module docs as they land.)

use nrt_isa::Op;

/// Device memory as the kernels see it: one contiguous host mapping of the device's physical
/// address space. Device address `a` is host byte `base + a`.
#[derive(Clone, Copy, Debug)]
pub struct DeviceMemory {
    base: *mut u8,
    len: u64,
}

// SAFETY: a DeviceMemory is a pointer into a mapping owned by the device, which outlives
// every kernel call; the device serializes conflicting accesses by its semaphore protocol.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// Wraps `len` bytes at `base`.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes for as long as the value (and
    /// any copy) is used.
    pub unsafe fn new(base: *mut u8, len: u64) -> Self {
        DeviceMemory { base, len }
    }

    /// Size of the address space.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the address space is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host pointer of device address `addr`.
    pub fn ptr(&self, addr: u64) -> *mut u8 {
        self.base.wrapping_add(addr as usize)
    }
}

/// A device error raised by a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelError {
    /// A gather index outside `[-limit, limit)`: the device reports `NRT_EXEC_OOB`.
    IndexOutOfRange {
        /// Position of the index in the indices operand.
        position: u64,
        /// The index.
        index: i64,
        /// Size of the gathered dimension.
        limit: u32,
    },
    /// An operation the kernels do not implement (a scheduler op passed here by mistake, or
    /// an element-type combination without a kernel).
    Unsupported(&'static str),
}

/// Per-thread scratch the kernels reuse across calls (packing buffers and the like). It
/// grows to the largest size an instruction needs and then stays, so steady-state
/// executions allocate nothing.
#[derive(Debug, Default)]
pub struct Workspace {
    _private: (),
}

/// Runs one operation.
///
/// # Safety
/// Every operand of `op` must lie inside `mem` and be aligned to its element size (the
/// device checks both when it loads a model's instructions).
pub unsafe fn execute(op: &Op, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
    let _ = (mem, ws);
    Err(KernelError::Unsupported(op.name()))
}
