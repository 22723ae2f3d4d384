//! # nrt-kernels — what the engines of the software NeuronCore compute
//!
//! One function, [`execute`], runs one compute or data-movement [`Op`] of `nrt-isa` against
//! device memory. The device's scheduler (in `nrt-sim`) handles everything else: semaphores,
//! notifications, DMA descriptor tables, barriers, end-of-block — those ops return
//! [`KernelError::Unsupported`] here.
//!
//! | module | ops |
//! |---|---|
//! | [`copy`] | `DmaCopy`, `Copy` (element-type conversion, blocked transposes), `Fill` |
//! | [`matmul`] | `MatMul` (dispatch on B's layout and element type, fused epilogue) |
//! | [`gemm`] | the products under `MatMul`, `MatMulInteger` and `Conv`: f32 GEMM (GEMM crate comparison and choice) and GEMV ([`gemm::sgemm`], [`gemm::gemv`]), B packed in panels at compile time ([`gemm::packed`], own AVX-512 / AVX2 microkernels), bf16/f16 weights ([`gemm::half`]), AMX ([`gemm::amx`]), int8 tiles |
//! | [`peak`] | the machine's f32 FMA and bf16 dot-product limits (register-only loops) |
//! | [`conv`] | `Conv` (pointwise GEMM, banded im2col + GEMM, register-blocked direct) |
//! | [`act`] | `Activation` (every `ActFunc`) |
//! | [`binary`] | `Binary`, `TensorScalar`, `Select` |
//! | [`reduce`] | `Reduce` |
//! | [`pool`] | `Pool` |
//! | [`norm`] | `Softmax`, `LayerNorm` |
//! | [`resize`] | `Resize` (ONNX reference semantics) |
//! | [`gather`] | `Gather`, `GatherElements`, `ScatterElements` |
//! | [`topk`] | `TopK` |
//! | [`sample`] | `Sample` |
//! | [`dynshape`] | `NonZero`, `Unique`, `NonMaxSuppression` (data-dependent extents: the result packed first in its static bound, zeros after, the actual shape written out) |
//! | [`roi`] | `RoiAlign` |
//! | [`deform`] | `DeformIm2col` (the sampled columns of a deformable convolution) |
//! | [`qmatmul`] | `MatMulInteger` (AVX-512 VNNI `vpdpbusd` when present, else portable) |
//! | [`attention`] | `CachedAttention` (a decoder's attention over its KV cache, up to each query's position) |
//! | [`quantize`] | `DynamicQuantize` (ONNX `DynamicQuantizeLinear`: range, scale and zero point, u8 output) |
//!
//! and the shared pieces: [`strided`] (views, dimension coalescing, the chunked elementwise
//! drivers, memcpy-free bulk copies), [`elem`] (element types, f16/bf16, casts), [`vmath`]
//! (vectorizable exp, log, tanh, erf, sigmoid). Tunables live in `nrt_hal::tuning`
//! (`GEMV_MAX_ROWS`, `KERNEL_*`).
//!
//! Conventions shared by every kernel:
//! - Operands arrive as [`AccessPattern`](nrt_isa::AccessPattern)s already validated by the
//!   decoder and the device (in bounds, aligned, shapes agreeing), so kernels check nothing
//!   but gather indices. A shape with a 0 does nothing.
//! - Operands may alias; an elementwise output identical to an input (same address and
//!   strides) computes in place. Kernels never hold a Rust reference to memory another
//!   operand writes (see [`strided`]).
//! - Dispatch on op and element type happens once per call, into monomorphized loops that the
//!   compiler vectorizes (x86-64-v3: AVX2 + FMA is the build baseline).
//! - Steady state allocates nothing: scratch lives in the caller's [`Workspace`] (and the
//!   GEMM crate's thread-local packing buffer, set up by [`gemm::prepare_thread`] before
//!   a thread's steady state), which grow to the largest need and stay.

pub mod act;
pub mod attention;
pub mod binary;
pub mod blockq;
pub mod conv;
pub mod copy;
pub mod cpu;
pub mod deform;
pub mod dynshape;
pub mod elem;
pub mod gather;
pub mod gemm;
/// The packed GEMM's old path, [`gemm::packed`] (kept for the tests and benches that name it).
pub use gemm::packed as gemm_packed;
pub mod matmul;
pub mod norm;
pub mod peak;
pub mod pool;
pub mod qmatmul;
pub mod quantize;
pub mod reduce;
pub mod resize;
pub mod roi;
pub mod sample;
pub mod strided;
pub mod topk;
pub mod vmath;

use nrt_isa::Op;
use nrt_isa::op;

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
    /// Scratch the operation needs and cannot have: the workspace would hold more than
    /// [`KERNEL_SCRATCH_MAX_BYTES`](nrt_hal::tuning::KERNEL_SCRATCH_MAX_BYTES) in all
    /// (sizes come from operand shapes, which a stride-0 view can make far larger than the
    /// memory behind them), or the allocator refused. The instruction stops there, having
    /// allocated nothing; what it wrote before (an earlier batch) is the failed execution's.
    ScratchUnavailable {
        /// Bytes asked for (`u64::MAX` when the size itself overflows).
        bytes: u64,
    },
}

/// The mask of the first `min(n, 16)` lanes of a 16-lane vector (AVX-512 `__mmask16`).
#[inline(always)]
pub(crate) fn lanes_below(n: usize) -> u16 {
    ((1u32 << n.min(16)) - 1) as u16
}

/// Whether the CPU has AVX-512F (checked at run time, per instruction: the binaries still
/// run on AVX2-only machines).
#[inline]
pub(crate) fn has_avx512() -> bool {
    cpu::avx512f()
}

/// Per-thread scratch the kernels reuse across calls (row buffers of Softmax/LayerNorm, the
/// direct convolution's accumulator plane, Reduce accumulators, Resize tables, packed GEMV
/// rows). It grows to the largest size an instruction needs and then stays, so steady-state
/// executions allocate nothing. (The GEMM crate keeps its packing buffers in a thread-local of
/// its own, allocated on a thread's first GEMM unless [`gemm::prepare_thread`] ran on it.)
#[derive(Debug, Default)]
pub struct Workspace {
    f32s: [Vec<f32>; 4],
    words: Vec<u64>,
    /// Bytes allocated by all the buffers together (their capacities).
    held: usize,
}

/// The first `n` elements of `v`, grown (zeroed) if shorter — always with
/// [`KERNEL_SCRATCH_SLACK_BYTES`](nrt_hal::tuning::KERNEL_SCRATCH_SLACK_BYTES) of allocated
/// elements after them, where the masked-off lanes of a vector load at the slice's end land.
/// Growth is checked and fallible: `n` comes from operand shapes (a file's), so a size that
/// would take the workspace's total (`held`, bytes, kept up to date here) past
/// [`KERNEL_SCRATCH_MAX_BYTES`](nrt_hal::tuning::KERNEL_SCRATCH_MAX_BYTES), or one the
/// allocator refuses, is [`KernelError::ScratchUnavailable`] — never an abort.
fn grown<'a, T: Copy + Default>(
    v: &'a mut Vec<T>,
    n: usize,
    held: &mut usize,
) -> Result<&'a mut [T], KernelError> {
    let size = size_of::<T>().max(1);
    let slack = nrt_hal::tuning::KERNEL_SCRATCH_SLACK_BYTES.div_ceil(size);
    if v.len() < n.saturating_add(slack) {
        let refused = KernelError::ScratchUnavailable {
            bytes: n.checked_mul(size).map_or(u64::MAX, |b| b as u64),
        };
        // Bytes the whole workspace would hold with this buffer at `want` elements.
        let others = held.saturating_sub(v.capacity() * size);
        let want = n
            .checked_add(slack)
            .filter(|w| {
                w.checked_mul(size)
                    .and_then(|b| b.checked_add(others))
                    .is_some_and(|t| t <= nrt_hal::tuning::KERNEL_SCRATCH_MAX_BYTES)
            })
            .ok_or(refused)?;
        v.try_reserve_exact(want - v.len()).map_err(|_| refused)?;
        v.resize(want, T::default());
        *held = others + v.capacity() * size;
    }
    Ok(&mut v[..n])
}

impl Workspace {
    /// A new, empty workspace.
    pub fn new() -> Self {
        Self::default()
    }

    /// A workspace whose buffers already hold `bytes` each of a nonzero pattern (`0xA5`
    /// bytes): tests run kernels on one, so that none relies on scratch it did not write
    /// (a fresh buffer grows zeroed).
    #[doc(hidden)]
    pub fn scribbled(bytes: usize) -> Self {
        let mut w = Self::default();
        for v in &mut w.f32s {
            *v = vec![f32::from_bits(0xA5A5_A5A5); bytes / 4];
        }
        w.words = vec![0xA5A5_A5A5_A5A5_A5A5; bytes / 8];
        w.held = w.capacity_bytes();
        w
    }

    /// Bytes of scratch currently held.
    pub fn capacity_bytes(&self) -> usize {
        self.f32s.iter().map(|v| v.capacity() * 4).sum::<usize>() + self.words.capacity() * 8
    }

    /// Scratch buffer `i` (0..4) of `n` f32 (contents unspecified).
    pub(crate) fn f32(&mut self, i: usize, n: usize) -> Result<&mut [f32], KernelError> {
        grown(&mut self.f32s[i], n, &mut self.held)
    }

    /// Scratch buffers 0 and 1, of `n0` and `n1` f32 (contents unspecified).
    pub(crate) fn f32x2(
        &mut self,
        n0: usize,
        n1: usize,
    ) -> Result<(&mut [f32], &mut [f32]), KernelError> {
        let [a, b, ..] = &mut self.f32s;
        let held = &mut self.held;
        Ok((grown(a, n0, held)?, grown(b, n1, held)?))
    }

    /// Scratch buffers 0, 1 and 2 (contents unspecified).
    pub(crate) fn f32x3(
        &mut self,
        n0: usize,
        n1: usize,
        n2: usize,
    ) -> Result<ThreeRows<'_>, KernelError> {
        let [a, b, c, _] = &mut self.f32s;
        let held = &mut self.held;
        Ok((
            grown(a, n0, held)?,
            grown(b, n1, held)?,
            grown(c, n2, held)?,
        ))
    }

    /// Scratch buffer 0 of `nf` f32 and `nw` 64-bit words (contents unspecified).
    pub(crate) fn f32_and_words(
        &mut self,
        nf: usize,
        nw: usize,
    ) -> Result<(&mut [f32], &mut [u64]), KernelError> {
        let held = &mut self.held;
        Ok((
            grown(&mut self.f32s[0], nf, held)?,
            grown(&mut self.words, nw, held)?,
        ))
    }

    /// 8-byte-aligned scratch of `n` 64-bit words (contents unspecified).
    pub(crate) fn words(&mut self, n: usize) -> Result<&mut [u64], KernelError> {
        grown(&mut self.words, n, &mut self.held)
    }

    /// Scratch of `n` elements of a plain number type (contents unspecified).
    pub(crate) fn typed<T: Pod>(&mut self, n: usize) -> Result<&mut [T], KernelError> {
        let bytes = n
            .checked_mul(size_of::<T>())
            .ok_or(KernelError::ScratchUnavailable { bytes: u64::MAX })?;
        let w = self.words(bytes.div_ceil(8))?;
        // SAFETY: `w` holds at least `n·size_of::<T>()` bytes, 8-byte aligned (≥ T's
        // alignment by `Pod`'s contract), initialized, and every bit pattern is a valid `T`;
        // the returned slice borrows `self` mutably, so nothing else aliases it.
        Ok(unsafe { core::slice::from_raw_parts_mut(w.as_mut_ptr() as *mut T, n) })
    }
}

/// Three scratch slices of f32 ([`Workspace::f32x3`]).
type ThreeRows<'a> = (&'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// Plain number types usable as typed workspace scratch.
///
/// # Safety
/// Every bit pattern must be a valid value, and the alignment at most 8.
pub(crate) unsafe trait Pod: Copy + Default + 'static {}
// SAFETY: plain numbers, alignment ≤ 8.
unsafe impl Pod for f32 {}
// SAFETY: as above.
unsafe impl Pod for i32 {}
// SAFETY: as above.
unsafe impl Pod for i64 {}

/// Runs one operation: the kernel of its op (an `impl Execute` beside the code it calls),
/// dispatched through the instruction table ([`nrt_isa::instruction_table!`]).
///
/// # Safety
/// Every operand of `op` must lie inside `mem` and be aligned to its element size (the
/// device checks both when it loads a model's instructions).
pub unsafe fn execute(op: &Op, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
    macro_rules! dispatch {
        (($op:ident, $mem:ident, $ws:ident) $(
            $(#[$doc:meta])* $family:ident::$variant:ident on $engines:pat => { $($encodings:tt)* }
        )+) => {
            match $op {
                // SAFETY: the caller's guarantee, passed on.
                $( Op::$variant(x) => unsafe { Execute::execute(x, $mem, $ws) }, )+
            }
        };
    }
    nrt_isa::instruction_table!(dispatch, op, mem, ws)
}

/// The kernel of one instruction; each lives beside the code it calls (`copy`, `matmul`,
/// `norm`, …).
pub(crate) trait Execute {
    /// Runs it.
    ///
    /// # Safety
    /// As [`execute`].
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError>;
}

/// Instructions without a kernel: control and the sequencer's own (the device runs them).
macro_rules! no_kernel {
    ($($variant:ident),+) => {$(
        impl Execute for op::$variant {
            unsafe fn execute(&self, _: DeviceMemory, _: &mut Workspace) -> Result<(), KernelError> {
                Err(KernelError::Unsupported(stringify!($variant)))
            }
        }
    )+};
}
no_kernel!(End, Nop, Guard, DmaDescriptors, SemSet, Notify, Barrier);

#[cfg(test)]
mod tests {
    use super::*;
    use nrt_hal::tuning::KERNEL_SCRATCH_MAX_BYTES;

    /// Scratch sized past the bound, or by an overflowing size, is refused with the size
    /// asked for, and nothing grows.
    #[test]
    fn scratch_past_the_bound_is_refused_and_nothing_grows() {
        let mut ws = Workspace::new();
        ws.f32(0, 1000).unwrap();
        let held = ws.capacity_bytes();
        let n = KERNEL_SCRATCH_MAX_BYTES / 4 + 1;
        assert_eq!(
            ws.f32(1, n).unwrap_err(),
            KernelError::ScratchUnavailable {
                bytes: 4 * n as u64
            }
        );
        for e in [
            ws.typed::<i64>(usize::MAX / 4).unwrap_err(),
            ws.words(usize::MAX).unwrap_err(),
        ] {
            assert_eq!(e, KernelError::ScratchUnavailable { bytes: u64::MAX });
        }
        assert_eq!(ws.capacity_bytes(), held);
        assert_eq!(ws.held, held);
    }

    /// The bound is on the workspace's total: a buffer that fits alone is refused when the
    /// others hold the rest, and a grant is counted.
    #[test]
    fn the_bound_counts_every_buffer() {
        let slack = nrt_hal::tuning::KERNEL_SCRATCH_SLACK_BYTES;
        let mut held = KERNEL_SCRATCH_MAX_BYTES - 1024;
        let (mut a, mut b) = (Vec::<f32>::new(), Vec::<f32>::new());
        assert_eq!(grown(&mut a, 100, &mut held).unwrap().len(), 100);
        assert_eq!(held, KERNEL_SCRATCH_MAX_BYTES - 1024 + a.capacity() * 4);
        assert!(a.capacity() * 4 >= 400 + slack);
        // 200 floats and the slack fit in 1024 bytes, not in what the first left.
        assert!(800 + slack <= 1024);
        assert!(grown(&mut b, 200, &mut held).is_err());
        assert_eq!(b.capacity(), 0);
        // Regrowing the same buffer counts only its growth.
        let room = (KERNEL_SCRATCH_MAX_BYTES - held + a.capacity() * 4 - slack) / 4;
        assert_eq!(grown(&mut a, room, &mut held).map(|s| s.len()), Ok(room));
        assert!(held <= KERNEL_SCRATCH_MAX_BYTES);
    }
}
