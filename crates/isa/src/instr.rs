//! Instructions: the header every instruction carries, the operations, and their encoding.

use crate::ap::{AP_SIZE, AccessPattern};
use crate::error::{DecodeError, Reason};
use nrt_hal::{DType, DevAddr, Engine, FIRST_ENGINE_SEMAPHORE, SEMAPHORES_PER_CORE};

/// Size of the instruction header.
pub const HEADER_SIZE: usize = 16;

/// Bit 15 of a semaphore index selects the device-wide (cross-core) semaphore file, used by
/// lockstep cores to synchronize; the low bits index it.
pub const GLOBAL_SEMAPHORE_BIT: u16 = 1 << 15;
/// Device-wide semaphores.
pub const GLOBAL_SEMAPHORES: u16 = 64;

/// A semaphore an instruction waits on or signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SemRef(pub u16);

impl SemRef {
    /// A core-local semaphore (index ≥ [`FIRST_ENGINE_SEMAPHORE`]).
    pub const fn local(index: u16) -> SemRef {
        SemRef(index)
    }

    /// A device-wide semaphore shared by the cores of a lockstep execution.
    pub const fn global(index: u16) -> SemRef {
        SemRef(index | GLOBAL_SEMAPHORE_BIT)
    }

    /// Whether it is device-wide.
    pub const fn is_global(self) -> bool {
        self.0 & GLOBAL_SEMAPHORE_BIT != 0
    }

    /// Index within its file.
    pub const fn index(self) -> u16 {
        self.0 & !GLOBAL_SEMAPHORE_BIT
    }

    fn validate(self, field: &'static str) -> Result<(), DecodeError> {
        let ok = if self.is_global() {
            self.index() < GLOBAL_SEMAPHORES
        } else {
            (FIRST_ENGINE_SEMAPHORE..SEMAPHORES_PER_CORE).contains(&(self.0 as u32))
        };
        if ok {
            Ok(())
        } else {
            Err(DecodeError::field(field, Reason::BadSemaphore(self.0)))
        }
    }
}

/// The synchronization every instruction may carry: wait until a semaphore reaches a value
/// before starting, and add to a semaphore when done. Semaphore values count within one
/// execution (the device resets core-local semaphores when an execution starts).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sync {
    /// Wait until `sem >= value` before starting.
    pub wait: Option<(SemRef, u32)>,
    /// Add `value` to `sem` when finished.
    pub signal: Option<(SemRef, u32)>,
}

macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $n:expr),+ $(,)? }) => {
        $(#[$m])*
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v = $n),+ }
        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// Decodes the wire byte.
            pub const fn from_u8(v: u8) -> Option<$name> {
                match v { $($n => Some($name::$v),)+ _ => None }
            }
        }
    };
}

wire_enum!(
    /// Activation functions of the ACT engine: `y = f(x·scale + bias)`.
    ActFunc {
        /// `y = x`.
        Identity = 0,
        /// `max(x, 0)`.
        Relu = 1,
        /// `x < 0 ? alpha·x : x`.
        LeakyRelu = 2,
        /// `1 / (1 + e^-x)`.
        Sigmoid = 3,
        /// `clamp(alpha·x + beta, 0, 1)`.
        HardSigmoid = 4,
        /// `tanh(x)`.
        Tanh = 5,
        /// `x/2 · (1 + erf(x/√2))`.
        GeluErf = 6,
        /// `x/2 · (1 + tanh(√(2/π)·(x + 0.044715x³)))`.
        GeluTanh = 7,
        /// `erf(x)`.
        Erf = 8,
        /// `e^x`.
        Exp = 9,
        /// `ln x`.
        Log = 10,
        /// `√x`.
        Sqrt = 11,
        /// `1/√x`.
        Rsqrt = 12,
        /// `1/x`.
        Reciprocal = 13,
        /// `clamp(x, alpha, beta)`.
        Clip = 14,
        /// `|x|`.
        Abs = 15,
        /// `-x`.
        Neg = 16,
        /// `x < 0 ? alpha·(e^x − 1) : x`.
        Elu = 17,
        /// `ln(1 + e^x)`.
        Softplus = 18,
        /// `floor(x)`.
        Floor = 19,
        /// `ceil(x)`.
        Ceil = 20,
        /// `x²`.
        Square = 21,
        /// `tan x` (NCM 1.2).
        Tan = 22,
        /// `asin x` (NCM 1.2).
        Asin = 23,
        /// `acos x` (NCM 1.2).
        Acos = 24,
        /// `atan x` (NCM 1.2).
        Atan = 25,
        /// `sinh x` (NCM 1.2).
        Sinh = 26,
        /// `cosh x` (NCM 1.2).
        Cosh = 27,
        /// `asinh x` (NCM 1.2).
        Asinh = 28,
        /// `acosh x` (NCM 1.2).
        Acosh = 29,
        /// `atanh x` (NCM 1.2).
        Atanh = 30,
        /// `x` rounded to the nearest integer, ties to even (ONNX `Round`; NCM 1.7).
        Round = 31,
    }
);

wire_enum!(
    /// Elementwise binary operations of the DVE engine.
    BinaryOp {
        /// `a + b`.
        Add = 0,
        /// `a − b`.
        Sub = 1,
        /// `a · b`.
        Mul = 2,
        /// `a / b` (integers: truncating).
        Div = 3,
        /// `max(a, b)`.
        Max = 4,
        /// `min(a, b)`.
        Min = 5,
        /// `a^b`.
        Pow = 6,
        /// `a == b` (bool output).
        Equal = 7,
        /// `a < b` (bool output).
        Less = 8,
        /// `a > b` (bool output).
        Greater = 9,
        /// `a && b` (bool operands).
        And = 10,
        /// `a || b` (bool operands).
        Or = 11,
        /// `a & b` (integer operands; NCM 1.2).
        BitAnd = 12,
        /// `a | b` (integer operands; NCM 1.2).
        BitOr = 13,
        /// `a ^ b` (integer operands; NCM 1.2).
        BitXor = 14,
        /// `a << b`, 0 when `b` is negative or at least the width (integer operands; NCM 1.2).
        ShiftLeft = 15,
        /// `a >> b` logical (the bits as unsigned), 0 when `b` is negative or at least the
        /// width (integer operands; NCM 1.2).
        ShiftRight = 16,
    }
);

impl BinaryOp {
    /// Whether the output is boolean.
    pub const fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater)
    }

    /// Whether the operands are boolean.
    pub const fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }

    /// Whether the operands are integers (bitwise operations and shifts).
    pub const fn is_bitwise(self) -> bool {
        matches!(
            self,
            BinaryOp::BitAnd
                | BinaryOp::BitOr
                | BinaryOp::BitXor
                | BinaryOp::ShiftLeft
                | BinaryOp::ShiftRight
        )
    }
}

wire_enum!(
    /// Reductions of the POOL engine.
    ReduceOp {
        /// Sum.
        Sum = 0,
        /// Arithmetic mean.
        Mean = 1,
        /// Maximum.
        Max = 2,
        /// Minimum.
        Min = 3,
    }
);

wire_enum!(
    /// How [`Op::ScatterElements`] combines an update with the element it lands on.
    ScatterReduce {
        /// Replace.
        None = 0,
        /// Add.
        Add = 1,
        /// Multiply.
        Mul = 2,
        /// Maximum.
        Max = 3,
        /// Minimum.
        Min = 4,
    }
);

wire_enum!(
    /// Pooling-window operations.
    PoolOp {
        /// Maximum over the window.
        Max = 0,
        /// Average over the window.
        Avg = 1,
    }
);

wire_enum!(
    /// Resize interpolation.
    ResizeMode {
        /// Nearest neighbour.
        Nearest = 0,
        /// (Multi-)linear.
        Linear = 1,
    }
);

wire_enum!(
    /// How an output coordinate maps to an input coordinate (ONNX
    /// `coordinate_transformation_mode`).
    CoordMode {
        /// `(x + 0.5) / scale − 0.5`.
        HalfPixel = 0,
        /// `x / scale`.
        Asymmetric = 1,
        /// `x · (in − 1) / (out − 1)`.
        AlignCorners = 2,
        /// Like half-pixel, but 0 when the output size is 1.
        PytorchHalfPixel = 3,
        /// `(x + 0.5) / scale` (nearest only).
        TfHalfPixelForNearest = 4,
        /// `(x + 0.5) / scale − 0.5`, using the output/input size ratio.
        HalfPixelSymmetric = 5,
    }
);

wire_enum!(
    /// How a fractional input coordinate rounds for nearest-neighbour resize.
    NearestMode {
        /// Round half down.
        RoundPreferFloor = 0,
        /// Round half up.
        RoundPreferCeil = 1,
        /// Floor.
        Floor = 2,
        /// Ceil.
        Ceil = 3,
    }
);

/// Flags of [`Op::MatMul`].
pub mod matmul_flags {
    /// `C += …` instead of `C = …`.
    pub const ACCUMULATE: u32 = 1;
    /// A is stored transposed: its AP is `[b1, b2, K, M]`.
    pub const TRANSPOSE_A: u32 = 2;
    /// B is stored transposed: its AP is `[b1, b2, N, K]`.
    pub const TRANSPOSE_B: u32 = 4;
    /// B (f32 constant weights, shared by every batch) is stored in column panels of `NR`
    /// columns (one of [`PANEL_WIDTHS`]), each panel `K × NR` row-major, the last one
    /// zero-padded past N (NCM 1.3): its AP is `[1, ceil(N/NR), K, NR]` with strides
    /// `[any, K·NR, NR, 1]`. bf16 weights pair K: each panel row holds rows `2t` and `2t+1`
    /// of the panel interleaved (`[2t, j]` then `[2t+1, j]`, K zero-padded to even): AP
    /// `[1, ceil(N/NR), ceil(K/2), 2·NR]`, strides `[any, ceil(K/2)·2·NR, 2·NR, 1]`. Not
    /// with `TRANSPOSE_B`.
    pub const PACKED_B: u32 = 8;
    /// The panel widths a `PACKED_B` operand may have.
    pub const PANEL_WIDTHS: [u32; 3] = [16, 32, 64];
    /// Every defined bit.
    pub const ALL: u32 = ACCUMULATE | TRANSPOSE_A | TRANSPOSE_B | PACKED_B;

    /// Floats of a `k × n` B packed in panels of `nr` columns (`None` on overflow).
    pub fn packed_len(k: usize, n: usize, nr: usize) -> Option<usize> {
        n.div_ceil(nr.max(1)).checked_mul(nr)?.checked_mul(k)
    }

    /// The bf16 [`PACKED_B`] layout of the `k × n` matrix `get(p, j)` (already bf16 bits),
    /// `ceil(k/2)·2·ceil(n/nr)·nr` elements, zero-padded.
    pub fn pack_b_pairs(
        k: usize,
        n: usize,
        nr: usize,
        get: impl Fn(usize, usize) -> u16,
    ) -> Vec<u16> {
        let kp = k.div_ceil(2);
        let panels = n.div_ceil(nr);
        let mut out = vec![0u16; panels * kp * 2 * nr];
        for q in 0..panels {
            for t in 0..kp {
                for jj in 0..nr {
                    let j = q * nr + jj;
                    for h in 0..2 {
                        let p = 2 * t + h;
                        if j < n && p < k {
                            out[((q * kp + t) * nr + jj) * 2 + h] = get(p, j);
                        }
                    }
                }
            }
        }
        out
    }

    /// Packs the `k × n` matrix `get(p, j)` into `out` (at least [`packed_len`] floats) in
    /// the [`PACKED_B`] layout with panels of `nr` columns, zero-padding the last panel.
    pub fn pack_b(
        k: usize,
        n: usize,
        nr: usize,
        get: impl Fn(usize, usize) -> f32,
        out: &mut [f32],
    ) {
        for q in 0..n.div_ceil(nr) {
            for p in 0..k {
                let row = &mut out[(q * k + p) * nr..(q * k + p + 1) * nr];
                for (jj, o) in row.iter_mut().enumerate() {
                    let j = q * nr + jj;
                    *o = if j < n { get(p, j) } else { 0.0 };
                }
            }
        }
    }
}

/// The layout of a packed B of [`Op::MatMulInteger`] (`packed_b`, NCM 1.7): constant weights
/// that the compiler lays out once the way the product reads them, so no execution re-packs
/// them (at 64×512×512 that packing was a third of the instruction's time).
///
/// For a `K × N` B of type `u8` or `i8`, with `K4 = ⌈K/4⌉` and `Np =` [`padded_columns`]`(N)`:
/// `K4 + 1` rows of `Np` little-endian 32-bit words. Word `j` of row `w < K4` holds the
/// bytes `B[4w..4w+4, j]` (k order, zero past `K`) *re-biased to i8* (`b` for i8, `b ^ 0x80`
/// — that is `b − 128` — for u8); word `j < N` of row `K4` is column `j`'s sum of those
/// re-biased bytes as an i32 (the zero-point correction's term); every other word is 0. The
/// operand's AP is `[1, 1, K4 + 1, 4·Np]` of B's type with strides `[0, 0, 4·Np, 1]` (the
/// type still says how the zero point is read). Not for a B that differs between batches.
pub mod qmatmul_layout {
    /// The product's column tile: packed rows are padded to a multiple of it.
    pub const COLUMN_TILE: usize = 32;

    /// Words in one packed row for `n` columns: whole tiles plus one 64-byte line (so the
    /// `K4` rows of a tile fall into consecutive L1 sets, not the same few: with `n = 512`
    /// a 2 KiB row stride put every row in one of two sets).
    pub fn padded_columns(n: usize) -> Option<usize> {
        n.div_ceil(COLUMN_TILE)
            .checked_mul(COLUMN_TILE)?
            .checked_add(16)
    }

    /// Bytes of the packed layout of a `k × n` B (`None` on overflow).
    pub fn packed_len(k: usize, n: usize) -> Option<usize> {
        k.div_ceil(4)
            .checked_add(1)?
            .checked_mul(padded_columns(n)?)?
            .checked_mul(4)
    }

    /// Packs the `k × n` matrix `get(p, j)` (its bytes as stored; `signed`: i8, else u8).
    /// `None` on overflow, or when the host cannot give the packed bytes (the compiler then
    /// keeps the weight unpacked).
    pub fn pack(
        k: usize,
        n: usize,
        signed: bool,
        get: impl Fn(usize, usize) -> u8,
    ) -> Option<Vec<u8>> {
        let np = padded_columns(n)?;
        let k4 = k.div_ceil(4);
        let len = packed_len(k, n)?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).ok()?;
        out.resize(len, 0u8);
        let flip = if signed { 0 } else { 0x80 };
        for j in 0..n {
            let mut sum = 0i32;
            for p in 0..k {
                let byte = get(p, j) ^ flip;
                sum = sum.wrapping_add(byte as i8 as i32);
                out[((p / 4) * np + j) * 4 + p % 4] = byte;
            }
            let at = (k4 * np + j) * 4;
            out[at..at + 4].copy_from_slice(&sum.to_le_bytes());
        }
        Some(out)
    }
}

/// What [`Op::MatMul`] applies to each output tile while it is still in cache, before it
/// is stored: `C = func(alpha·op(A)·op(B) [+ C] + bias + residual)`. Both added operands have
/// C's shape (broadcast by stride 0: a per-column bias is `[.., .., M, N]` with strides
/// `[0, 0, 0, 1]`), must be f32 and must not overlap C. The default (no operand, `Identity`)
/// is no epilogue: such a MatMul encodes as [`opcode::MATMUL`], one with an epilogue as
/// [`opcode::MATMUL_EPI`] (NCM 1.1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Epilogue {
    /// Added to every output element (usually a per-column bias vector, broadcast).
    pub bias: Option<AccessPattern>,
    /// A second added tensor (a residual connection: usually C's full shape).
    pub residual: Option<AccessPattern>,
    /// The activation applied last (`Identity`: none).
    pub func: ActFunc,
    /// The function's first parameter (as [`Op::Activation`]'s `alpha`).
    pub act_alpha: f32,
    /// The function's second parameter (as [`Op::Activation`]'s `beta`).
    pub act_beta: f32,
}

impl Epilogue {
    /// No epilogue.
    pub const NONE: Epilogue = Epilogue {
        bias: None,
        residual: None,
        func: ActFunc::Identity,
        act_alpha: 0.0,
        act_beta: 0.0,
    };

    /// Whether it does nothing.
    pub const fn is_none(&self) -> bool {
        self.bias.is_none() && self.residual.is_none() && matches!(self.func, ActFunc::Identity)
    }
}

impl Default for Epilogue {
    fn default() -> Self {
        Epilogue::NONE
    }
}

/// A 2-D window geometry (convolution and pooling), in `(height, width)` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Window {
    /// Kernel size (pooling only; convolution takes it from the weight shape).
    pub kernel: [u32; 2],
    /// Stride.
    pub stride: [u32; 2],
    /// Padding: top, left, bottom, right.
    pub pad: [u32; 4],
    /// Dilation.
    pub dilation: [u32; 2],
}

impl Window {
    /// Output size of one spatial dimension, `None` if the window does not fit.
    pub fn out_dim(&self, dim: usize, input: u32, kernel: u32) -> Option<u32> {
        // i128: every u32 product and sum below fits, whatever the (untrusted) fields hold.
        let padded = input as i128 + self.pad[dim] as i128 + self.pad[dim + 2] as i128;
        let span = self.dilation[dim] as i128 * (kernel as i128 - 1) + 1;
        if kernel == 0 || padded < span || self.stride[dim] == 0 {
            return None;
        }
        u32::try_from((padded - span) / self.stride[dim] as i128 + 1).ok()
    }
}

/// An operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// End of block: the engine is done with this execution (writes its END record).
    End,
    /// Does nothing (carries only synchronization).
    Nop,
    /// Any engine: predication (NCM 1.6). Sets the engine's guard from one element of device
    /// memory: with `cond`, the guard holds while `(cond != 0) == when`; without, it always
    /// holds (the guard is lifted). While the guard fails, the engine's compute and DMA
    /// instructions do only their synchronization — they wait and signal as always, so every
    /// semaphore count the other engines wait for is reached, but they touch no memory and
    /// cannot fault. Control instructions (`Nop`, `SemSet`, `Notify`, `Barrier`, `Guard`,
    /// `End`) always run. Every execution starts with the guard lifted. The compiler brackets
    /// the instructions of each branch of an `If` whose condition is computed at run time
    /// with it, so the branch not taken costs one pass over its synchronization.
    Guard {
        /// One `bool` or `u8` element (the condition), or `None` to lift the guard.
        cond: Option<AccessPattern>,
        /// The condition value under which the guarded instructions run.
        when: bool,
    },
    /// SP: strided copy by the DMA engine (same shape and element type).
    DmaCopy {
        /// Source.
        src: AccessPattern,
        /// Destination.
        dst: AccessPattern,
    },
    /// SP: run `count` DMA transfers ([`nrt_hal::TriggerPair`]s) stored at `table` — how a
    /// model moves its inputs and outputs through the descriptors bind patched.
    DmaDescriptors {
        /// Address of the first descriptor pair.
        table: DevAddr,
        /// Number of pairs.
        count: u32,
    },
    /// SP: set a semaphore.
    SemSet {
        /// Semaphore.
        sem: SemRef,
        /// Value.
        value: u32,
    },
    /// SP: write a custom notification record on this engine's ring.
    Notify {
        /// Custom subtype (6 = tensor).
        subtype: u8,
        /// Custom sub-id (7 = output done).
        sub_id: u16,
        /// Payload (the output's var_id).
        payload: u32,
    },
    /// SP: cross-core barrier: add 1 to a device-wide semaphore, then wait until it reaches
    /// `count` (the number of cores of the execution).
    Barrier {
        /// Device-wide semaphore.
        sem: SemRef,
        /// Cores to wait for.
        count: u32,
    },
    /// PE: `C (+)= alpha · op(A) · op(B)`, batched over the two leading dimensions, then the
    /// optional [`Epilogue`] (bias, residual, activation) on each output tile. A and C are
    /// f32; B is f32, or bf16/f16 weights (NCM 1.1; the products accumulate in f32, and
    /// with bf16 B the device rounds A to bf16 too).
    MatMul {
        /// `[b1, b2, M, K]` (or `[b1, b2, K, M]` with `TRANSPOSE_A`).
        a: AccessPattern,
        /// `[b1, b2, K, N]` (or `[b1, b2, N, K]` with `TRANSPOSE_B`, or panels with
        /// `PACKED_B`: see [`matmul_flags::PACKED_B`]).
        b: AccessPattern,
        /// `[b1, b2, M, N]`.
        c: AccessPattern,
        /// Scale applied to the product.
        alpha: f32,
        /// [`matmul_flags`].
        flags: u32,
        /// Bias, residual and activation applied to the output tiles ([`Epilogue::NONE`]:
        /// none).
        epilogue: Epilogue,
    },
    /// PE: integer matrix product, `C = (A − a_zero)·(B − b_zero)` in i32 (wrapping),
    /// batched over the two leading dimensions (ONNX MatMulInteger); with `scale`, the sums
    /// are converted to f32 and multiplied by it (ONNX Runtime's `MatMulIntegerToFloat`:
    /// a dynamically quantized layer's `Cast` and `Mul` fused, [`opcode::MATMUL_INTEGER_SCALED`],
    /// NCM 1.7).
    MatMulInteger {
        /// `[b1, b2, M, K]` u8 or i8.
        a: AccessPattern,
        /// `[b1, b2, K, N]` u8 or i8; with `packed_b`, the layout of
        /// [`qmatmul_layout`] instead.
        b: AccessPattern,
        /// `[b1, b2, M, N]` i32 (f32 with `scale`).
        c: AccessPattern,
        /// `[b1, b2, M, 1]` of A's type (per row, usually broadcast), if any.
        a_zero: Option<AccessPattern>,
        /// `[b1, b2, 1, N]` of B's type (per column, usually broadcast), if any.
        b_zero: Option<AccessPattern>,
        /// B is constant weights packed once by the compiler ([`qmatmul_layout`], NCM 1.7).
        packed_b: bool,
        /// `[b1, b2, 1, N]` f32 (per column or, with strides 0, per tensor), if any.
        scale: Option<AccessPattern>,
    },
    /// PE: 2-D convolution, `out[n,o,y,x] = bias[o] + Σ in[n,c,·,·]·w[o,c,·,·]`.
    Conv {
        /// `[N, C, H, W]`.
        input: AccessPattern,
        /// `[O, C/groups, KH, KW]`.
        weight: AccessPattern,
        /// `[N, O, OH, OW]`.
        output: AccessPattern,
        /// `[1, 1, 1, O]`, if any.
        bias: Option<AccessPattern>,
        /// Scratch for the im2col lowering: `(C/groups)·KH·KW·OH·OW` fp32 elements, if any
        /// (without it the engine convolves directly).
        workspace: Option<AccessPattern>,
        /// Stride, padding, dilation (kernel unused).
        window: Window,
        /// Groups.
        groups: u32,
        /// Applied to each output element after the bias, while the output rows are still
        /// in cache (`Identity`: none — encoded as [`opcode::CONV`]; any other function as
        /// [`opcode::CONV_ACT`], NCM 1.5): `(function, alpha, beta)` as
        /// [`Op::Activation`]'s.
        act: (ActFunc, f32, f32),
    },
    /// ACT: `y = f(x · scale + bias)`.
    Activation {
        /// Input.
        input: AccessPattern,
        /// Output (same shape).
        output: AccessPattern,
        /// Added before `f` (same shape, usually broadcast), if any.
        bias: Option<AccessPattern>,
        /// The function.
        func: ActFunc,
        /// Multiplies `x` before the bias.
        scale: f32,
        /// Function parameter (LeakyRelu, HardSigmoid, Elu slope; Clip minimum).
        alpha: f32,
        /// Function parameter (HardSigmoid offset; Clip maximum).
        beta: f32,
    },
    /// DVE: `out = a ∘ b` elementwise (broadcast by stride 0).
    Binary {
        /// Left operand.
        a: AccessPattern,
        /// Right operand.
        b: AccessPattern,
        /// Output.
        out: AccessPattern,
        /// The operation.
        op: BinaryOp,
    },
    /// DVE: `out = a ∘ scalar` (or `scalar ∘ a` when `reverse`).
    TensorScalar {
        /// Tensor operand.
        a: AccessPattern,
        /// Output.
        out: AccessPattern,
        /// The operation (arithmetic only).
        op: BinaryOp,
        /// The scalar.
        scalar: f32,
        /// Scalar on the left.
        reverse: bool,
    },
    /// DVE/POOL: strided copy, converting the element type if the two differ (transpose,
    /// slice, concat, pad, expand, cast).
    Copy {
        /// Source.
        input: AccessPattern,
        /// Destination (same shape).
        output: AccessPattern,
    },
    /// DVE: `out = cond ? a : b`.
    Select {
        /// Boolean condition.
        cond: AccessPattern,
        /// Taken where true.
        a: AccessPattern,
        /// Taken where false.
        b: AccessPattern,
        /// Output.
        out: AccessPattern,
    },
    /// DVE/POOL: fill with one element value (its little-endian bits, zero-extended).
    Fill {
        /// Destination.
        out: AccessPattern,
        /// Element bits.
        bits: u64,
    },
    /// POOL: reduce over the dimensions set in `axes` (bit i = dimension i); the output has
    /// size 1 there.
    Reduce {
        /// Input.
        input: AccessPattern,
        /// Output.
        output: AccessPattern,
        /// The reduction.
        op: ReduceOp,
        /// Dimension mask.
        axes: u8,
    },
    /// POOL: max or average pooling windows over `[N, C, H, W]`.
    Pool {
        /// `[N, C, H, W]`.
        input: AccessPattern,
        /// `[N, C, OH, OW]`.
        output: AccessPattern,
        /// Kernel, stride, padding, dilation.
        window: Window,
        /// Max or average.
        op: PoolOp,
        /// Average pooling counts padding cells in the divisor.
        count_include_pad: bool,
    },
    /// POOL: softmax (or log-softmax) over dimension 3, max-subtracted, fp32 accumulation.
    Softmax {
        /// Input.
        input: AccessPattern,
        /// Output.
        output: AccessPattern,
        /// Log-softmax.
        log: bool,
    },
    /// POOL: ONNX `DynamicQuantizeLinear` in one instruction (NCM 1.8): the range of `input`
    /// widened to include 0 gives `scale = (max − min)/255` (1 when the range is empty, as
    /// ONNX Runtime) and `zero_point = round(clamp(−min/scale, 0, 255))`, then
    /// `output = clamp(round(input/scale) + zero_point, 0, 255)` (rounding ties to even; a
    /// NaN element gives 0, NaN elements do not widen the range).
    DynamicQuantize {
        /// f32, any shape.
        input: AccessPattern,
        /// u8, the input's shape.
        output: AccessPattern,
        /// f32, one element.
        scale: AccessPattern,
        /// u8, one element.
        zero_point: AccessPattern,
    },
    /// POOL: layer normalization over dimension 3: `(x − mean)/√(var + eps) · gamma + beta`.
    LayerNorm {
        /// Input.
        input: AccessPattern,
        /// Scale (same shape as input, broadcast).
        gamma: AccessPattern,
        /// Shift, if any.
        beta: Option<AccessPattern>,
        /// Output.
        output: AccessPattern,
        /// Epsilon.
        eps: f32,
    },
    /// POOL: resize every dimension whose sizes differ.
    Resize {
        /// Input.
        input: AccessPattern,
        /// Output.
        output: AccessPattern,
        /// Interpolation.
        mode: ResizeMode,
        /// Coordinate transformation.
        coord: CoordMode,
        /// Rounding for nearest.
        nearest: NearestMode,
        /// Per-dimension scale (output/input); 0 = use the size ratio.
        scales: [f32; 4],
    },
    /// POOL: indexed copy along dimension 2: `out[a,b,i,d] = data[a,b,idx[i],d]`. An index
    /// out of range is a device error (`NRT_EXEC_OOB`).
    Gather {
        /// `[d0, d1, A, d3]`.
        data: AccessPattern,
        /// `[1, 1, 1, N]` of i32 or i64 (negative counts from the end).
        indices: AccessPattern,
        /// `[d0, d1, N, d3]`.
        output: AccessPattern,
    },
    /// POOL: gather along dimension `axis`, one index per output element:
    /// `out[p] = data[p with p[axis] = idx[p]]` (ONNX GatherElements; with a broadcast
    /// indices operand it gathers whole rows). An index outside `[-A, A)` (negative counts
    /// from the end) is a device error (`NRT_EXEC_OOB`) and nothing is written.
    GatherElements {
        /// The shape of `output` except `A` at `axis`.
        data: AccessPattern,
        /// i32 or i64, the shape of `output`.
        indices: AccessPattern,
        /// Output.
        output: AccessPattern,
        /// The indexed dimension (0..4).
        axis: u8,
    },
    /// POOL: scatter along dimension `axis`, in element order:
    /// `out[p with p[axis] = idx[p]] = out[…] ∘ updates[p]` for every position `p` of
    /// `updates` (ONNX ScatterElements / ScatterND with a broadcast indices operand). Indices
    /// are checked as for [`Op::GatherElements`] before anything is written.
    ScatterElements {
        /// i32 or i64, the shape of `updates`.
        indices: AccessPattern,
        /// The values.
        updates: AccessPattern,
        /// Read and written: the shape of `updates` except `A` at `axis`.
        output: AccessPattern,
        /// The indexed dimension (0..4).
        axis: u8,
        /// How an update combines with the element (a reduction: f32, i32 or i64).
        reduce: ScatterReduce,
    },
    /// POOL: the `K` largest (or smallest) elements of every row along dimension 3, in
    /// order (equal elements: the lower index first; NaN above every number), and their
    /// indices (ONNX TopK).
    TopK {
        /// `[d0, d1, d2, N]`: f32 or any integer type.
        input: AccessPattern,
        /// `[d0, d1, d2, K]`, `K ≤ N`, the input's type.
        values: AccessPattern,
        /// `[d0, d1, d2, K]` of i64.
        indices: AccessPattern,
        /// The largest (else the smallest).
        largest: bool,
    },
    /// POOL: the coordinates of the nonzero elements of `input` (ONNX NonZero; NCM 1.4), an
    /// output whose extent depends on the data. `output` is the static upper bound
    /// `[R, N]`; the actual result `[R, count]` is written packed first (row-major: row `r`
    /// holds coordinate `r` of every nonzero element, in element order), the rest of
    /// `output` is zero, and `shape` receives `[R, count]`. A float element is nonzero when
    /// it compares unequal to 0 (NaN is nonzero).
    NonZero {
        /// `[d0, d1, d2, d3]`, any element type; the coordinates are those of its last `R`
        /// dimensions (the first `4 − R` are 1).
        input: AccessPattern,
        /// `[1, 1, R, N]` of i64, `R` in 1..=4, `N` the elements of `input`.
        output: AccessPattern,
        /// `[1, 1, 1, 2]` of i64.
        shape: AccessPattern,
    },
    /// POOL: the distinct slices `input[o, j, i]` (`j` along dimension 2, each slice the
    /// `(o, i)` elements in order) of `input` (ONNX Unique; NCM 1.4). `y` is the static upper
    /// bound (every slice distinct); the `U` distinct slices are written packed first (the
    /// actual `[outer, U, inner]` row-major), zeros after. `sorted`: ascending
    /// (lexicographic, NaN above every number and equal to itself), else in order of first
    /// occurrence. `indices[u]` is the first occurrence of slice `u`, `counts[u]` how often
    /// it occurs (both `U` long, zeros after), `inverse[j]` the slice of `y` that slice `j`
    /// equals. `shape` receives `y`'s actual shape: `dims` with `U` at `dims.axis`.
    Unique {
        /// `[1, outer, A, inner]`, f32 or an integer type.
        input: AccessPattern,
        /// `[1, outer, A, inner]`, the input's type.
        y: AccessPattern,
        /// `[1, 1, 1, A]` of i64.
        indices: AccessPattern,
        /// `[1, 1, 1, A]` of i64.
        inverse: AccessPattern,
        /// `[1, 1, 1, A]` of i64.
        counts: AccessPattern,
        /// `[1, 1, 1, dims.rank]` of i64.
        shape: AccessPattern,
        /// `y`'s ONNX shape with the bound `A` at `dims.axis`.
        dims: ShapeTemplate,
        /// Ascending, else in order of first occurrence.
        sorted: bool,
    },
    /// POOL: greedy non-maximum suppression per batch and class (ONNX NonMaxSuppression;
    /// NCM 1.4). Boxes whose score is above the score threshold (when there is one) are
    /// taken by descending score (equal scores: the lower box index first); a box whose IoU
    /// with one already selected in its class is above the IoU threshold is dropped; at most
    /// `max_out` per class. `selected` is the static upper bound; the `count` selections
    /// `(batch, class, box)` are written packed first, zeros after, and `shape` receives
    /// `[count, 3]`. The scalars come from operands read at execution time when present,
    /// else from the immediates.
    NonMaxSuppression {
        /// `[1, B, S, 4]` of f32 (`[y1, x1, y2, x2]`, or `[xc, yc, w, h]` with
        /// [`nms_flags::CENTER_POINT_BOX`]).
        boxes: AccessPattern,
        /// `[1, B, C, S]` of f32.
        scores: AccessPattern,
        /// `[1, 1, 1, 1]` of i64 ([`nms_flags::MAX_OUT`]); negative counts as 0.
        max_out: Option<AccessPattern>,
        /// `[1, 1, 1, 1]` of f32 ([`nms_flags::IOU`]).
        iou: Option<AccessPattern>,
        /// `[1, 1, 1, 1]` of f32 ([`nms_flags::SCORE`]).
        score_threshold: Option<AccessPattern>,
        /// `[1, 1, bound, 3]` of i64; selections past `bound` are not written.
        selected: AccessPattern,
        /// `[1, 1, 1, 2]` of i64.
        shape: AccessPattern,
        /// [`nms_flags`] (the operand flags follow the operands).
        flags: u32,
        /// Boxes per class without a `max_out` operand.
        max_out_const: u32,
        /// IoU threshold without an `iou` operand.
        iou_const: f32,
        /// Score threshold without a `score_threshold` operand, with
        /// [`nms_flags::SCORE_CONST`] (without either, every box is a candidate).
        score_const: f32,
    },
    /// POOL: region-of-interest align (ONNX RoiAlign; NCM 1.4): for each region `r` (its
    /// `rois` row `[x1, y1, x2, y2]` times `spatial_scale`, minus ½ with
    /// [`roi_flags::HALF_PIXEL`]) and each output cell, the bilinear samples of a
    /// `grid × grid` lattice of the cell (`sampling_ratio`, or `ceil(cell size)` when 0,
    /// capped at [`ROI_MAX_GRID`]) from image `batch_indices[r]` of `input`, averaged (or
    /// their maximum, [`roi_flags::MAX`], of the weighted corner values as ONNX Runtime
    /// takes it). A batch index outside `[0, N)` is a device error (`NRT_EXEC_OOB`).
    RoiAlign {
        /// `[N, C, H, W]` of f32.
        input: AccessPattern,
        /// `[1, 1, R, 4]` of f32.
        rois: AccessPattern,
        /// `[1, 1, 1, R]` of i64.
        batch_indices: AccessPattern,
        /// `[R, C, out_h, out_w]` of f32.
        output: AccessPattern,
        /// Scale of the region coordinates.
        spatial_scale: f32,
        /// Samples per cell and dimension (0: adaptive).
        sampling_ratio: u32,
        /// [`roi_flags`].
        flags: u32,
    },
    /// POOL: the columns of a deformable convolution (ONNX DeformConv; NCM 1.4), for a
    /// MatMul with the weights to finish: `cols[n, (c·kH + i)·kW + j, y, x]` is
    /// `mask[n, (g·kH + i)·kW + j, y, x]` times the bilinear sample of `input[n, c]` (zero
    /// outside the image) at `(y·sH − padT + i·dH + Δh, x·sW − padL + j·dW + Δw)`, where
    /// `g = c / (C / offset_groups)` and `(Δh, Δw)` is `offset[n, ((g·kH + i)·kW + j)·2 +
    /// {0, 1}, y, x]`.
    DeformIm2col {
        /// `[N, C, H, W]` of f32.
        input: AccessPattern,
        /// `[N, G·kH·kW·2, oH, oW]` of f32.
        offset: AccessPattern,
        /// `[N, G·kH·kW, oH, oW]` of f32 (absent: 1).
        mask: Option<AccessPattern>,
        /// `[N, C·kH·kW, oH, oW]` of f32.
        cols: AccessPattern,
        /// Kernel, stride, top/left padding, dilation (the bottom/right padding is 0: the
        /// output size is `cols`').
        window: Window,
        /// `G` (≥ 1, divides C).
        offset_groups: u32,
    },
}

/// Most samples per cell and dimension [`Op::RoiAlign`] takes (an adaptive grid of a huge
/// or hostile region would otherwise make one instruction loop without bound).
pub const ROI_MAX_GRID: u32 = 1 << 10;

/// Flags of [`Op::RoiAlign`].
pub mod roi_flags {
    /// Maximum, else average.
    pub const MAX: u32 = 1;
    /// `half_pixel` coordinates (subtract ½; no minimum region size), else
    /// `output_half_pixel` (regions at least 1 × 1).
    pub const HALF_PIXEL: u32 = 2;
    /// Every flag.
    pub const ALL: u32 = 3;
}

/// The static shape of a value whose extent along one axis depends on the data
/// ([`Op::Unique`]'s `y`): `rank` dimensions (1..=8), `dims[axis]` the upper bound, the
/// dimensions past `rank` zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeTemplate {
    /// Number of dimensions (1..=8).
    pub rank: u8,
    /// The data-dependent dimension (< `rank`).
    pub axis: u8,
    /// The dimensions (the bound at `axis`).
    pub dims: [u32; 8],
}

/// Flags of [`Op::NonMaxSuppression`].
pub mod nms_flags {
    /// Boxes are `[x_center, y_center, width, height]` (else `[y1, x1, y2, x2]`).
    pub const CENTER_POINT_BOX: u32 = 1;
    /// The `max_out` operand is present.
    pub const MAX_OUT: u32 = 2;
    /// The `iou` operand is present.
    pub const IOU: u32 = 4;
    /// The `score_threshold` operand is present.
    pub const SCORE: u32 = 8;
    /// `score_const` is a threshold (without [`SCORE`]).
    pub const SCORE_CONST: u32 = 16;
    /// Every flag.
    pub const ALL: u32 = 31;
}

/// Opcode bytes.
pub mod opcode {
    /// [`super::Op::End`].
    pub const END: u8 = 0x01;
    /// [`super::Op::Nop`].
    pub const NOP: u8 = 0x02;
    /// [`super::Op::Guard`] (NCM 1.6).
    pub const GUARD: u8 = 0x03;
    /// [`super::Op::DmaCopy`].
    pub const DMA_COPY: u8 = 0x10;
    /// [`super::Op::DmaDescriptors`].
    pub const DMA_DESCRIPTORS: u8 = 0x11;
    /// [`super::Op::SemSet`].
    pub const SEM_SET: u8 = 0x12;
    /// [`super::Op::Notify`].
    pub const NOTIFY: u8 = 0x13;
    /// [`super::Op::Barrier`].
    pub const BARRIER: u8 = 0x14;
    /// [`super::Op::MatMul`].
    pub const MATMUL: u8 = 0x20;
    /// [`super::Op::Conv`].
    pub const CONV: u8 = 0x21;
    /// [`super::Op::MatMulInteger`].
    pub const MATMUL_INTEGER: u8 = 0x23;
    /// [`super::Op::MatMul`] with an [`super::Epilogue`] (NCM 1.1).
    pub const MATMUL_EPI: u8 = 0x22;
    /// [`super::Op::MatMulInteger`] with a `scale` (f32 results, NCM 1.7).
    pub const MATMUL_INTEGER_SCALED: u8 = 0x25;
    /// [`super::Op::Conv`] with an activation (NCM 1.5).
    pub const CONV_ACT: u8 = 0x24;
    /// [`super::Op::Activation`].
    pub const ACTIVATION: u8 = 0x30;
    /// [`super::Op::Binary`].
    pub const BINARY: u8 = 0x40;
    /// [`super::Op::TensorScalar`].
    pub const TENSOR_SCALAR: u8 = 0x41;
    /// [`super::Op::Copy`].
    pub const COPY: u8 = 0x42;
    /// [`super::Op::Select`].
    pub const SELECT: u8 = 0x43;
    /// [`super::Op::Fill`].
    pub const FILL: u8 = 0x44;
    /// [`super::Op::Reduce`].
    pub const REDUCE: u8 = 0x50;
    /// [`super::Op::Pool`].
    pub const POOL: u8 = 0x51;
    /// [`super::Op::Softmax`].
    pub const SOFTMAX: u8 = 0x52;
    /// [`super::Op::LayerNorm`].
    pub const LAYER_NORM: u8 = 0x53;
    /// [`super::Op::Resize`].
    pub const RESIZE: u8 = 0x54;
    /// [`super::Op::Gather`].
    pub const GATHER: u8 = 0x55;
    /// [`super::Op::GatherElements`].
    pub const GATHER_ELEMENTS: u8 = 0x56;
    /// [`super::Op::ScatterElements`].
    pub const SCATTER_ELEMENTS: u8 = 0x57;
    /// [`super::Op::TopK`].
    pub const TOP_K: u8 = 0x58;
    /// [`super::Op::NonZero`] (NCM 1.4).
    pub const NON_ZERO: u8 = 0x59;
    /// [`super::Op::Unique`] (NCM 1.4).
    pub const UNIQUE: u8 = 0x5A;
    /// [`super::Op::NonMaxSuppression`] (NCM 1.4).
    pub const NON_MAX_SUPPRESSION: u8 = 0x5B;
    /// [`super::Op::RoiAlign`] (NCM 1.4).
    pub const ROI_ALIGN: u8 = 0x5C;
    /// [`super::Op::DeformIm2col`] (NCM 1.4).
    pub const DEFORM_IM2COL: u8 = 0x5D;
    /// [`super::Op::DynamicQuantize`] (NCM 1.8).
    pub const DYNAMIC_QUANTIZE: u8 = 0x5E;
}

/// Mnemonic and encoded size of an opcode, `None` if unknown.
pub const fn opcode_info(op: u8) -> Option<(&'static str, usize)> {
    use opcode::*;
    Some(match op {
        END => ("End", HEADER_SIZE),
        NOP => ("Nop", HEADER_SIZE),
        GUARD => ("Guard", HEADER_SIZE + AP_SIZE + 8),
        DMA_COPY => ("DmaCopy", HEADER_SIZE + 2 * AP_SIZE),
        DMA_DESCRIPTORS => ("DmaDescriptors", HEADER_SIZE + 16),
        SEM_SET => ("SemSet", HEADER_SIZE + 8),
        NOTIFY => ("Notify", HEADER_SIZE + 8),
        BARRIER => ("Barrier", HEADER_SIZE + 8),
        MATMUL => ("MatMul", HEADER_SIZE + 3 * AP_SIZE + 8),
        CONV => ("Conv", HEADER_SIZE + 5 * AP_SIZE + 48),
        CONV_ACT => ("Conv", HEADER_SIZE + 5 * AP_SIZE + 64),
        MATMUL_INTEGER => ("MatMulInteger", HEADER_SIZE + 5 * AP_SIZE + 8),
        MATMUL_INTEGER_SCALED => ("MatMulInteger", HEADER_SIZE + 6 * AP_SIZE + 8),
        MATMUL_EPI => ("MatMul", HEADER_SIZE + 5 * AP_SIZE + 24),
        ACTIVATION => ("Activation", HEADER_SIZE + 3 * AP_SIZE + 24),
        BINARY => ("Binary", HEADER_SIZE + 3 * AP_SIZE + 8),
        TENSOR_SCALAR => ("TensorScalar", HEADER_SIZE + 2 * AP_SIZE + 16),
        COPY => ("Copy", HEADER_SIZE + 2 * AP_SIZE),
        SELECT => ("Select", HEADER_SIZE + 4 * AP_SIZE),
        FILL => ("Fill", HEADER_SIZE + AP_SIZE + 8),
        REDUCE => ("Reduce", HEADER_SIZE + 2 * AP_SIZE + 8),
        POOL => ("Pool", HEADER_SIZE + 2 * AP_SIZE + 48),
        SOFTMAX => ("Softmax", HEADER_SIZE + 2 * AP_SIZE + 8),
        LAYER_NORM => ("LayerNorm", HEADER_SIZE + 4 * AP_SIZE + 8),
        RESIZE => ("Resize", HEADER_SIZE + 2 * AP_SIZE + 24),
        GATHER => ("Gather", HEADER_SIZE + 3 * AP_SIZE),
        GATHER_ELEMENTS => ("GatherElements", HEADER_SIZE + 3 * AP_SIZE + 8),
        SCATTER_ELEMENTS => ("ScatterElements", HEADER_SIZE + 3 * AP_SIZE + 8),
        TOP_K => ("TopK", HEADER_SIZE + 3 * AP_SIZE + 8),
        NON_ZERO => ("NonZero", HEADER_SIZE + 3 * AP_SIZE),
        UNIQUE => ("Unique", HEADER_SIZE + 6 * AP_SIZE + 40),
        NON_MAX_SUPPRESSION => ("NonMaxSuppression", HEADER_SIZE + 7 * AP_SIZE + 16),
        ROI_ALIGN => ("RoiAlign", HEADER_SIZE + 4 * AP_SIZE + 16),
        DEFORM_IM2COL => ("DeformIm2col", HEADER_SIZE + 4 * AP_SIZE + 48),
        DYNAMIC_QUANTIZE => ("DynamicQuantize", HEADER_SIZE + 4 * AP_SIZE + 8),
        _ => return None,
    })
}

impl Op {
    /// The opcode byte.
    pub const fn opcode(&self) -> u8 {
        use opcode::*;
        match self {
            Op::End => END,
            Op::Nop => NOP,
            Op::Guard { .. } => GUARD,
            Op::DmaCopy { .. } => DMA_COPY,
            Op::DmaDescriptors { .. } => DMA_DESCRIPTORS,
            Op::SemSet { .. } => SEM_SET,
            Op::Notify { .. } => NOTIFY,
            Op::Barrier { .. } => BARRIER,
            Op::MatMul { epilogue, .. } => {
                if epilogue.is_none() {
                    MATMUL
                } else {
                    MATMUL_EPI
                }
            }
            Op::Conv { act, .. } => {
                if matches!(act.0, ActFunc::Identity) {
                    CONV
                } else {
                    CONV_ACT
                }
            }
            Op::MatMulInteger { scale: None, .. } => MATMUL_INTEGER,
            Op::MatMulInteger { scale: Some(_), .. } => MATMUL_INTEGER_SCALED,
            Op::Activation { .. } => ACTIVATION,
            Op::Binary { .. } => BINARY,
            Op::TensorScalar { .. } => TENSOR_SCALAR,
            Op::Copy { .. } => COPY,
            Op::Select { .. } => SELECT,
            Op::Fill { .. } => FILL,
            Op::Reduce { .. } => REDUCE,
            Op::Pool { .. } => POOL,
            Op::Softmax { .. } => SOFTMAX,
            Op::LayerNorm { .. } => LAYER_NORM,
            Op::DynamicQuantize { .. } => DYNAMIC_QUANTIZE,
            Op::Resize { .. } => RESIZE,
            Op::Gather { .. } => GATHER,
            Op::GatherElements { .. } => GATHER_ELEMENTS,
            Op::ScatterElements { .. } => SCATTER_ELEMENTS,
            Op::TopK { .. } => TOP_K,
            Op::NonZero { .. } => NON_ZERO,
            Op::Unique { .. } => UNIQUE,
            Op::NonMaxSuppression { .. } => NON_MAX_SUPPRESSION,
            Op::RoiAlign { .. } => ROI_ALIGN,
            Op::DeformIm2col { .. } => DEFORM_IM2COL,
        }
    }

    /// Mnemonic.
    pub fn name(&self) -> &'static str {
        opcode_info(self.opcode())
            .expect("every Op has an opcode")
            .0
    }

    /// Whether the opcode may run on `engine`.
    pub const fn runs_on(&self, engine: Engine) -> bool {
        match self {
            Op::End | Op::Nop | Op::Guard { .. } => true,
            Op::DmaCopy { .. }
            | Op::DmaDescriptors { .. }
            | Op::SemSet { .. }
            | Op::Notify { .. }
            | Op::Barrier { .. } => matches!(engine, Engine::Sp),
            Op::MatMul { .. } | Op::Conv { .. } | Op::MatMulInteger { .. } => {
                matches!(engine, Engine::Pe)
            }
            Op::Activation { .. } => matches!(engine, Engine::Act),
            Op::Binary { .. } | Op::TensorScalar { .. } | Op::Select { .. } => {
                matches!(engine, Engine::Dve)
            }
            Op::Copy { .. } | Op::Fill { .. } => matches!(engine, Engine::Dve | Engine::Pool),
            Op::Reduce { .. }
            | Op::Pool { .. }
            | Op::Softmax { .. }
            | Op::LayerNorm { .. }
            | Op::DynamicQuantize { .. }
            | Op::Resize { .. }
            | Op::Gather { .. }
            | Op::GatherElements { .. }
            | Op::ScatterElements { .. }
            | Op::TopK { .. }
            | Op::NonZero { .. }
            | Op::Unique { .. }
            | Op::NonMaxSuppression { .. }
            | Op::RoiAlign { .. }
            | Op::DeformIm2col { .. } => matches!(engine, Engine::Pool),
        }
    }
}

/// One instruction: synchronization plus an operation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Instruction {
    /// Semaphore wait before / signal after.
    pub sync: Sync,
    /// What it does.
    pub op: Op,
}

/// How an instruction uses one of its operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Only read.
    Read,
    /// Only written (every byte it covers may be overwritten; a workspace is written
    /// before it is read, so it is a write too).
    Write,
    /// Read, then written (an accumulating MatMul's `c`).
    ReadWrite,
}

/// Load-time bounds on elements without memory behind them. Every written operand must
/// not repeat elements (an output written twice at one address is no result; and with its
/// elements bounded by the memory behind it, so is the work of every elementwise
/// instruction). A read operand that repeats elements (a broadcast) may address up to
/// the larger of its instruction's largest written operand and
/// [`crate::MAX_REPEATED_READ_ELEMENTS`]: a reduction or product over a stride-0 axis
/// otherwise makes minutes of work, and scratch of that size, from a few bytes of file.
fn bound_repetition(op: &Op) -> Result<(), DecodeError> {
    let stride_at = |slot: usize| HEADER_SIZE + slot * AP_SIZE + 32;
    let mut err = None;
    let mut written = 0u64;
    op.operands(|o| {
        if o.role.writes() {
            written = written.max(o.ap.elements());
            if err.is_none() && o.ap.repeats_elements() {
                err = Some(
                    DecodeError::field(o.name, Reason::OverlappingWrite).at(stride_at(o.slot)),
                );
            }
        }
    });
    let limit = written.max(crate::MAX_REPEATED_READ_ELEMENTS);
    op.operands(|o| {
        let elements = o.ap.elements();
        if err.is_none() && !o.role.writes() && elements > limit && o.ap.repeats_elements() {
            err = Some(
                DecodeError::field(o.name, Reason::RepeatedReadTooLarge { elements, limit })
                    .at(stride_at(o.slot)),
            );
        }
    });
    err.map_or(Ok(()), Err)
}

impl Role {
    /// Whether the operand is read.
    pub fn reads(self) -> bool {
        matches!(self, Role::Read | Role::ReadWrite)
    }

    /// Whether the operand is written.
    pub fn writes(self) -> bool {
        matches!(self, Role::Write | Role::ReadWrite)
    }
}

/// One access-pattern operand of an instruction (see [`Op::operands`]).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    /// Its slot in the encoding: the field sits at `HEADER_SIZE + slot * AP_SIZE`.
    pub slot: usize,
    /// Its name in decode errors and relocations (`"a"`, `"output"`, …).
    pub name: &'static str,
    /// Read, written, or both.
    pub role: Role,
    /// The operand.
    pub ap: &'a AccessPattern,
}

/// [`Operand`] for rewriting the access pattern (see [`Op::operands_mut`]).
#[derive(Debug)]
pub struct OperandMut<'a> {
    /// As in [`Operand`].
    pub slot: usize,
    /// As in [`Operand`].
    pub name: &'static str,
    /// As in [`Operand`].
    pub role: Role,
    /// The operand, to rewrite (relocation, address assignment).
    pub ap: &'a mut AccessPattern,
}

/// THE operand table of the instruction set: for each op, every access-pattern operand in
/// encoding order with its slot, name and role. `$op` is a `&Op` or a `&mut Op` (match
/// ergonomics bind the operands by shared or mutable reference accordingly) and `$f` is
/// called as `$f(slot, name, role, ap)`. [`Op::operands`] and [`Op::operands_mut`] are its
/// only users, so the scheduler's hazards, the loader's bounds checks and the device's
/// operand checks all read this one list; a new instruction adds one arm here.
macro_rules! operand_table {
    ($op:expr, $f:ident) => {
        match $op {
            Op::End
            | Op::Nop
            | Op::SemSet { .. }
            | Op::Notify { .. }
            | Op::Barrier { .. }
            | Op::DmaDescriptors { .. } => {}
            Op::Guard { cond, .. } => {
                if let Some(x) = cond {
                    $f(0, "cond", Role::Read, x);
                }
            }
            Op::DmaCopy { src, dst } => {
                $f(0, "src", Role::Read, src);
                $f(1, "dst", Role::Write, dst);
            }
            Op::MatMul {
                a,
                b,
                c,
                flags,
                epilogue: Epilogue { bias, residual, .. },
                ..
            } => {
                $f(0, "a", Role::Read, a);
                $f(1, "b", Role::Read, b);
                let accumulate = *flags & matmul_flags::ACCUMULATE != 0;
                $f(
                    2,
                    "c",
                    if accumulate {
                        Role::ReadWrite
                    } else {
                        Role::Write
                    },
                    c,
                );
                if let Some(x) = bias {
                    $f(3, "bias", Role::Read, x);
                }
                if let Some(x) = residual {
                    $f(4, "residual", Role::Read, x);
                }
            }
            Op::MatMulInteger {
                a,
                b,
                c,
                a_zero,
                b_zero,
                scale,
                ..
            } => {
                $f(0, "a", Role::Read, a);
                $f(1, "b", Role::Read, b);
                $f(2, "c", Role::Write, c);
                if let Some(x) = a_zero {
                    $f(3, "a_zero", Role::Read, x);
                }
                if let Some(x) = b_zero {
                    $f(4, "b_zero", Role::Read, x);
                }
                if let Some(x) = scale {
                    $f(5, "scale", Role::Read, x);
                }
            }
            Op::Conv {
                input,
                weight,
                output,
                bias,
                workspace,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "weight", Role::Read, weight);
                $f(2, "output", Role::Write, output);
                if let Some(x) = bias {
                    $f(3, "bias", Role::Read, x);
                }
                if let Some(x) = workspace {
                    $f(4, "workspace", Role::Write, x);
                }
            }
            Op::Activation {
                input,
                output,
                bias,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "output", Role::Write, output);
                if let Some(x) = bias {
                    $f(2, "bias", Role::Read, x);
                }
            }
            Op::Binary { a, b, out, .. } => {
                $f(0, "a", Role::Read, a);
                $f(1, "b", Role::Read, b);
                $f(2, "out", Role::Write, out);
            }
            Op::TensorScalar { a, out, .. } => {
                $f(0, "a", Role::Read, a);
                $f(1, "out", Role::Write, out);
            }
            Op::Copy { input, output } => {
                $f(0, "input", Role::Read, input);
                $f(1, "output", Role::Write, output);
            }
            Op::Select { cond, a, b, out } => {
                $f(0, "cond", Role::Read, cond);
                $f(1, "a", Role::Read, a);
                $f(2, "b", Role::Read, b);
                $f(3, "out", Role::Write, out);
            }
            Op::Fill { out, .. } => $f(0, "out", Role::Write, out),
            Op::Reduce { input, output, .. }
            | Op::Pool { input, output, .. }
            | Op::Softmax { input, output, .. }
            | Op::Resize { input, output, .. } => {
                $f(0, "input", Role::Read, input);
                $f(1, "output", Role::Write, output);
            }
            Op::DynamicQuantize {
                input,
                output,
                scale,
                zero_point,
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "output", Role::Write, output);
                $f(2, "scale", Role::Write, scale);
                $f(3, "zero_point", Role::Write, zero_point);
            }
            Op::LayerNorm {
                input,
                gamma,
                beta,
                output,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "gamma", Role::Read, gamma);
                if let Some(x) = beta {
                    $f(2, "beta", Role::Read, x);
                }
                $f(3, "output", Role::Write, output);
            }
            Op::Gather {
                data,
                indices,
                output,
            }
            | Op::GatherElements {
                data,
                indices,
                output,
                ..
            } => {
                $f(0, "data", Role::Read, data);
                $f(1, "indices", Role::Read, indices);
                $f(2, "output", Role::Write, output);
            }
            Op::ScatterElements {
                indices,
                updates,
                output,
                ..
            } => {
                $f(0, "indices", Role::Read, indices);
                $f(1, "updates", Role::Read, updates);
                $f(2, "output", Role::ReadWrite, output);
            }
            Op::TopK {
                input,
                values,
                indices,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "values", Role::Write, values);
                $f(2, "indices", Role::Write, indices);
            }
            Op::NonZero {
                input,
                output,
                shape,
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "output", Role::Write, output);
                $f(2, "shape", Role::Write, shape);
            }
            Op::Unique {
                input,
                y,
                indices,
                inverse,
                counts,
                shape,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "y", Role::Write, y);
                $f(2, "indices", Role::Write, indices);
                $f(3, "inverse", Role::Write, inverse);
                $f(4, "counts", Role::Write, counts);
                $f(5, "shape", Role::Write, shape);
            }
            Op::NonMaxSuppression {
                boxes,
                scores,
                max_out,
                iou,
                score_threshold,
                selected,
                shape,
                ..
            } => {
                $f(0, "boxes", Role::Read, boxes);
                $f(1, "scores", Role::Read, scores);
                if let Some(x) = max_out {
                    $f(2, "max_out", Role::Read, x);
                }
                if let Some(x) = iou {
                    $f(3, "iou", Role::Read, x);
                }
                if let Some(x) = score_threshold {
                    $f(4, "score_threshold", Role::Read, x);
                }
                $f(5, "selected", Role::Write, selected);
                $f(6, "shape", Role::Write, shape);
            }
            Op::RoiAlign {
                input,
                rois,
                batch_indices,
                output,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "rois", Role::Read, rois);
                $f(2, "batch_indices", Role::Read, batch_indices);
                $f(3, "output", Role::Write, output);
            }
            Op::DeformIm2col {
                input,
                offset,
                mask,
                cols,
                ..
            } => {
                $f(0, "input", Role::Read, input);
                $f(1, "offset", Role::Read, offset);
                if let Some(x) = mask {
                    $f(2, "mask", Role::Read, x);
                }
                $f(3, "cols", Role::Write, cols);
            }
        }
    };
}

impl Op {
    /// Every access-pattern operand of the op, in encoding order, with its role. The DMA
    /// descriptor table of [`Op::DmaDescriptors`] is an address but not an access pattern,
    /// and is not listed.
    pub fn operands<'a>(&'a self, mut f: impl FnMut(Operand<'a>)) {
        let mut visit = |slot, name, role, ap: &'a AccessPattern| {
            f(Operand {
                slot,
                name,
                role,
                ap,
            })
        };
        operand_table!(self, visit)
    }

    /// [`Op::operands`], to rewrite the access patterns.
    pub fn operands_mut(&mut self, mut f: impl FnMut(OperandMut<'_>)) {
        let mut visit = |slot, name, role, ap: &mut AccessPattern| {
            f(OperandMut {
                slot,
                name,
                role,
                ap,
            })
        };
        operand_table!(self, visit)
    }

    /// The first operand the op writes (its result), if any.
    pub fn output(&self) -> Option<&AccessPattern> {
        let mut out = None;
        self.operands(|o| {
            if out.is_none() && o.role.writes() {
                out = Some(o.ap);
            }
        });
        out
    }
}

/// An address field of an encoded instruction: what relocations patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressField {
    /// Byte offset of the 8-byte little-endian address inside the instruction.
    pub offset: usize,
    /// Operand name (`"a"`, `"table"`, …).
    pub name: &'static str,
    /// Bytes the instruction touches relative to the address: `[lo, hi)`. Exact (`i128`,
    /// see [`AccessPattern::byte_extent`]): a huge stride must never wrap into range.
    pub extent: (i128, i128),
    /// The same bytes as rows ([`AccessPattern::byte_rows`]): tighter than `extent` for a
    /// block of columns, what hazard analyses compare.
    pub rows: crate::ap::ByteRows,
    /// The operand's access pattern (none for the descriptor table): for the finest hazard
    /// test ([`AccessPattern::may_overlap`]).
    pub ap: Option<AccessPattern>,
}

//===------------------------------------------------------------------------------------===//
// Encoding
//===------------------------------------------------------------------------------------===//

struct W<'a>(&'a mut Vec<u8>);

impl W<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    fn ap(&mut self, ap: &AccessPattern) {
        ap.encode(self.0);
    }
    fn opt_ap(&mut self, ap: &Option<AccessPattern>) {
        match ap {
            Some(ap) => ap.encode(self.0),
            None => self.0.extend_from_slice(&[0u8; AP_SIZE]),
        }
    }
    fn zeros(&mut self, n: usize) {
        self.0.resize(self.0.len() + n, 0);
    }
    fn window(&mut self, w: &Window) {
        for v in w
            .kernel
            .iter()
            .chain(&w.stride)
            .chain(&w.pad)
            .chain(&w.dilation)
        {
            self.u32(*v);
        }
    }
}

impl Instruction {
    /// An instruction without synchronization.
    pub const fn new(op: Op) -> Instruction {
        Instruction {
            sync: Sync {
                wait: None,
                signal: None,
            },
            op,
        }
    }

    /// Adds a wait.
    pub const fn wait(mut self, sem: SemRef, value: u32) -> Instruction {
        self.sync.wait = Some((sem, value));
        self
    }

    /// Adds a signal.
    pub const fn signal(mut self, sem: SemRef, value: u32) -> Instruction {
        self.sync.signal = Some((sem, value));
        self
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        opcode_info(self.op.opcode()).expect("known opcode").1
    }

    /// Appends the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let len = self.encoded_len();
        let mut w = W(out);
        w.u8(self.op.opcode());
        w.u8(self.sync.wait.is_some() as u8 | (self.sync.signal.is_some() as u8) << 1);
        w.u16(len as u16);
        w.u16(self.sync.wait.map_or(0, |(s, _)| s.0));
        w.u16(self.sync.signal.map_or(0, |(s, _)| s.0));
        w.u32(self.sync.wait.map_or(0, |(_, v)| v));
        w.u32(self.sync.signal.map_or(0, |(_, v)| v));
        match &self.op {
            Op::End | Op::Nop => {}
            Op::Guard { cond, when } => {
                w.opt_ap(cond);
                w.u32(cond.is_some() as u32 | (*when as u32) << 1);
                w.u32(0);
            }
            Op::DmaCopy { src, dst } => {
                w.ap(src);
                w.ap(dst);
            }
            Op::DmaDescriptors { table, count } => {
                w.u64(*table);
                w.u32(*count);
                w.u32(0);
            }
            Op::SemSet { sem, value } => {
                w.u16(sem.0);
                w.u16(0);
                w.u32(*value);
            }
            Op::Notify {
                subtype,
                sub_id,
                payload,
            } => {
                w.u8(*subtype);
                w.u8(0);
                w.u16(*sub_id);
                w.u32(*payload);
            }
            Op::Barrier { sem, count } => {
                w.u16(sem.0);
                w.u16(0);
                w.u32(*count);
            }
            Op::MatMul {
                a,
                b,
                c,
                alpha,
                flags,
                epilogue,
            } => {
                w.ap(a);
                w.ap(b);
                w.ap(c);
                if !epilogue.is_none() {
                    w.opt_ap(&epilogue.bias);
                    w.opt_ap(&epilogue.residual);
                }
                w.f32(*alpha);
                w.u32(*flags);
                if !epilogue.is_none() {
                    w.u8(epilogue.func as u8);
                    w.zeros(3);
                    w.u32(
                        epilogue.bias.is_some() as u32 | (epilogue.residual.is_some() as u32) << 1,
                    );
                    w.f32(epilogue.act_alpha);
                    w.f32(epilogue.act_beta);
                }
            }
            Op::Conv {
                input,
                weight,
                output,
                bias,
                workspace,
                window,
                groups,
                act,
            } => {
                w.ap(input);
                w.ap(weight);
                w.ap(output);
                w.opt_ap(bias);
                w.opt_ap(workspace);
                w.window(window);
                w.u32(*groups);
                w.u32(bias.is_some() as u32 | (workspace.is_some() as u32) << 1);
                if !matches!(act.0, ActFunc::Identity) {
                    w.u8(act.0 as u8);
                    w.zeros(3);
                    w.f32(act.1);
                    w.f32(act.2);
                    w.zeros(4);
                }
            }
            Op::MatMulInteger {
                a,
                b,
                c,
                a_zero,
                b_zero,
                packed_b,
                scale,
            } => {
                w.ap(a);
                w.ap(b);
                w.ap(c);
                w.opt_ap(a_zero);
                w.opt_ap(b_zero);
                if scale.is_some() {
                    w.opt_ap(scale);
                }
                w.u32(
                    a_zero.is_some() as u32
                        | (b_zero.is_some() as u32) << 1
                        | (*packed_b as u32) << 2,
                );
                w.u32(0);
            }
            Op::Activation {
                input,
                output,
                bias,
                func,
                scale,
                alpha,
                beta,
            } => {
                w.ap(input);
                w.ap(output);
                w.opt_ap(bias);
                w.u8(*func as u8);
                w.zeros(3);
                w.u32(bias.is_some() as u32);
                w.f32(*scale);
                w.f32(*alpha);
                w.f32(*beta);
                w.u32(0);
            }
            Op::Binary { a, b, out, op } => {
                w.ap(a);
                w.ap(b);
                w.ap(out);
                w.u8(*op as u8);
                w.zeros(7);
            }
            Op::TensorScalar {
                a,
                out,
                op,
                scalar,
                reverse,
            } => {
                w.ap(a);
                w.ap(out);
                w.u8(*op as u8);
                w.zeros(3);
                w.u32(*reverse as u32);
                w.f32(*scalar);
                w.u32(0);
            }
            Op::Copy { input, output } => {
                w.ap(input);
                w.ap(output);
            }
            Op::Select { cond, a, b, out } => {
                w.ap(cond);
                w.ap(a);
                w.ap(b);
                w.ap(out);
            }
            Op::Fill { out, bits } => {
                w.ap(out);
                w.u64(*bits);
            }
            Op::Reduce {
                input,
                output,
                op,
                axes,
            } => {
                w.ap(input);
                w.ap(output);
                w.u8(*op as u8);
                w.u8(*axes);
                w.zeros(6);
            }
            Op::Pool {
                input,
                output,
                window,
                op,
                count_include_pad,
            } => {
                w.ap(input);
                w.ap(output);
                w.window(window);
                w.u8(*op as u8);
                w.zeros(3);
                w.u32(*count_include_pad as u32);
            }
            Op::Softmax { input, output, log } => {
                w.ap(input);
                w.ap(output);
                w.u32(*log as u32);
                w.u32(0);
            }
            Op::DynamicQuantize {
                input,
                output,
                scale,
                zero_point,
            } => {
                w.ap(input);
                w.ap(output);
                w.ap(scale);
                w.ap(zero_point);
                w.zeros(8);
            }
            Op::LayerNorm {
                input,
                gamma,
                beta,
                output,
                eps,
            } => {
                w.ap(input);
                w.ap(gamma);
                w.opt_ap(beta);
                w.ap(output);
                w.f32(*eps);
                w.u32(beta.is_some() as u32);
            }
            Op::Resize {
                input,
                output,
                mode,
                coord,
                nearest,
                scales,
            } => {
                w.ap(input);
                w.ap(output);
                w.u8(*mode as u8);
                w.u8(*coord as u8);
                w.u8(*nearest as u8);
                w.zeros(5);
                for s in scales {
                    w.f32(*s);
                }
            }
            Op::Gather {
                data,
                indices,
                output,
            } => {
                w.ap(data);
                w.ap(indices);
                w.ap(output);
            }
            Op::GatherElements {
                data,
                indices,
                output,
                axis,
            } => {
                w.ap(data);
                w.ap(indices);
                w.ap(output);
                w.u8(*axis);
                w.zeros(7);
            }
            Op::ScatterElements {
                indices,
                updates,
                output,
                axis,
                reduce,
            } => {
                w.ap(indices);
                w.ap(updates);
                w.ap(output);
                w.u8(*axis);
                w.u8(*reduce as u8);
                w.zeros(6);
            }
            Op::TopK {
                input,
                values,
                indices,
                largest,
            } => {
                w.ap(input);
                w.ap(values);
                w.ap(indices);
                w.u32(*largest as u32);
                w.u32(0);
            }
            Op::NonZero {
                input,
                output,
                shape,
            } => {
                w.ap(input);
                w.ap(output);
                w.ap(shape);
            }
            Op::Unique {
                input,
                y,
                indices,
                inverse,
                counts,
                shape,
                dims,
                sorted,
            } => {
                for ap in [input, y, indices, inverse, counts, shape] {
                    w.ap(ap);
                }
                w.u8(dims.rank);
                w.u8(dims.axis);
                w.u8(*sorted as u8);
                w.u8(0);
                for d in dims.dims {
                    w.u32(d);
                }
                w.u32(0);
            }
            Op::NonMaxSuppression {
                boxes,
                scores,
                max_out,
                iou,
                score_threshold,
                selected,
                shape,
                flags,
                max_out_const,
                iou_const,
                score_const,
            } => {
                w.ap(boxes);
                w.ap(scores);
                w.opt_ap(max_out);
                w.opt_ap(iou);
                w.opt_ap(score_threshold);
                w.ap(selected);
                w.ap(shape);
                w.u32(*flags);
                w.u32(*max_out_const);
                w.f32(*iou_const);
                w.f32(*score_const);
            }
            Op::RoiAlign {
                input,
                rois,
                batch_indices,
                output,
                spatial_scale,
                sampling_ratio,
                flags,
            } => {
                w.ap(input);
                w.ap(rois);
                w.ap(batch_indices);
                w.ap(output);
                w.f32(*spatial_scale);
                w.u32(*sampling_ratio);
                w.u32(*flags);
                w.u32(0);
            }
            Op::DeformIm2col {
                input,
                offset,
                mask,
                cols,
                window,
                offset_groups,
            } => {
                w.ap(input);
                w.ap(offset);
                w.opt_ap(mask);
                w.ap(cols);
                w.window(window);
                w.u32(*offset_groups);
                w.u32(mask.is_some() as u32);
            }
        }
        debug_assert_eq!(out.len() - start, len, "{} encoding size", self.op.name());
    }
}

//===------------------------------------------------------------------------------------===//
// Decoding and validation
//===------------------------------------------------------------------------------------===//

struct R<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> R<'a> {
    fn u8(&mut self) -> u8 {
        let v = self.b[self.pos];
        self.pos += 1;
        v
    }
    fn u16(&mut self) -> u16 {
        let v = u16::from_le_bytes([self.b[self.pos], self.b[self.pos + 1]]);
        self.pos += 2;
        v
    }
    fn u32(&mut self) -> u32 {
        let v = u32::from_le_bytes(self.b[self.pos..self.pos + 4].try_into().expect("4 bytes"));
        self.pos += 4;
        v
    }
    fn u64(&mut self) -> u64 {
        let v = u64::from_le_bytes(self.b[self.pos..self.pos + 8].try_into().expect("8 bytes"));
        self.pos += 8;
        v
    }
    fn f32(&mut self, field: &'static str) -> Result<f32, DecodeError> {
        let at = self.pos;
        let v = f32::from_bits(self.u32());
        if v.is_nan() {
            return Err(DecodeError::field(field, Reason::OutOfRange(v.to_bits() as u64)).at(at));
        }
        Ok(v)
    }
    fn ap(&mut self, field: &'static str) -> Result<AccessPattern, DecodeError> {
        let at = self.pos;
        let ap = AccessPattern::decode(&self.b[at..at + AP_SIZE], field).map_err(|e| {
            let off = e.field_offset;
            e.at(at + off)
        })?;
        self.pos += AP_SIZE;
        Ok(ap)
    }
    /// An optional operand: present iff `present`; absent ones must be all zero.
    fn opt_ap(
        &mut self,
        field: &'static str,
        present: bool,
    ) -> Result<Option<AccessPattern>, DecodeError> {
        if present {
            return self.ap(field).map(Some);
        }
        self.zeros(AP_SIZE, field)?;
        Ok(None)
    }
    fn zeros(&mut self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        let at = self.pos;
        if self.b[at..at + n].iter().any(|&x| x != 0) {
            return Err(DecodeError::field(field, Reason::ReservedNonZero).at(at));
        }
        self.pos += n;
        Ok(())
    }
    fn flags(&mut self, field: &'static str, allowed: u32) -> Result<u32, DecodeError> {
        let at = self.pos;
        let v = self.u32();
        if v & !allowed != 0 {
            return Err(DecodeError::field(field, Reason::UnknownFlags(v & !allowed)).at(at));
        }
        Ok(v)
    }
    fn bool32(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        Ok(self.flags(field, 1)? != 0)
    }
    fn enum_u8<T>(
        &mut self,
        field: &'static str,
        f: fn(u8) -> Option<T>,
    ) -> Result<T, DecodeError> {
        let at = self.pos;
        let v = self.u8();
        f(v).ok_or(DecodeError::field(field, Reason::BadEnum(v as u32)).at(at))
    }
    /// A dimension index of an access pattern (0..4).
    fn axis(&mut self) -> Result<u8, DecodeError> {
        let at = self.pos;
        let a = self.u8();
        if a > 3 {
            return Err(DecodeError::field("axis", Reason::OutOfRange(a as u64)).at(at));
        }
        Ok(a)
    }
    fn window(&mut self, pooling: bool) -> Result<Window, DecodeError> {
        let at = self.pos;
        let mut v = [0u32; 10];
        for x in &mut v {
            *x = self.u32();
        }
        let w = Window {
            kernel: [v[0], v[1]],
            stride: [v[2], v[3]],
            pad: [v[4], v[5], v[6], v[7]],
            dilation: [v[8], v[9]],
        };
        let check = |ok: bool, field: &'static str, value: u32, off: usize| {
            if ok {
                Ok(())
            } else {
                Err(DecodeError::field(field, Reason::OutOfRange(value as u64)).at(at + off))
            }
        };
        for i in 0..2 {
            if pooling {
                check(w.kernel[i] >= 1, "window.kernel", w.kernel[i], 4 * i)?;
            } else {
                check(w.kernel[i] == 0, "window.kernel", w.kernel[i], 4 * i)?;
            }
            check(w.stride[i] >= 1, "window.stride", w.stride[i], 8 + 4 * i)?;
            check(
                w.dilation[i] >= 1,
                "window.dilation",
                w.dilation[i],
                32 + 4 * i,
            )?;
        }
        for i in 0..4 {
            check(w.pad[i] < 1 << 20, "window.pad", w.pad[i], 16 + 4 * i)?;
        }
        Ok(w)
    }
}

fn require_dtype(ap: &AccessPattern, field: &'static str, ok: &[DType]) -> Result<(), DecodeError> {
    if ok.contains(&ap.dtype) {
        Ok(())
    } else {
        Err(DecodeError::field(field, Reason::UnsupportedDType(ap.dtype)).at(8))
    }
}

fn same_shape(
    field: &'static str,
    want: &[u32; 4],
    got: &AccessPattern,
) -> Result<(), DecodeError> {
    for (d, (&w, &g)) in want.iter().zip(&got.shape).enumerate() {
        if w != g {
            return Err(DecodeError::field(
                field,
                Reason::ShapeMismatch {
                    dim: d,
                    expected: w,
                    found: g,
                },
            )
            .at(16 + 4 * d));
        }
    }
    Ok(())
}

/// The layout of a `PACKED_B` operand holding a `k × n` matrix (offsets inside its AP):
/// `[1, ceil(n/NR), k, NR]`, NR one of the panel widths, strides `[any, k·NR, NR, 1]`.
/// bf16: `[1, ceil(n/NR), ceil(k/2), 2·NR]`, strides `[any, ceil(k/2)·2·NR, 2·NR, 1]`.
fn check_packed_b(b: &AccessPattern, k: u32, n: u32) -> Result<(), DecodeError> {
    let pairs = b.dtype == DType::Bf16;
    let row = b.shape[3];
    let nr = if pairs { row / 2 } else { row };
    if !matmul_flags::PANEL_WIDTHS.contains(&nr) || (pairs && !row.is_multiple_of(2)) {
        return Err(DecodeError::field("b.shape", Reason::OutOfRange(row as u64)).at(16 + 12));
    }
    let rows = if pairs { k.div_ceil(2) } else { k };
    dim_eq("b.shape", 0, 1, b.shape[0])?;
    dim_eq("b.shape", 1, n.div_ceil(nr), b.shape[1])?;
    dim_eq("b.shape", 2, rows, b.shape[2])?;
    let want = [
        None,
        Some(rows as i64 * row as i64),
        Some(row as i64),
        Some(1),
    ];
    for (d, w) in want.into_iter().enumerate() {
        if let Some(w) = w
            && b.stride[d] as i64 != w
            && !(d == 1 && b.shape[1] == 1)
        {
            return Err(
                DecodeError::field("b.stride", Reason::OutOfRange(b.stride[d] as u64))
                    .at(32 + 4 * d),
            );
        }
    }
    Ok(())
}

/// The layout of a packed B of [`Op::MatMulInteger`] holding a `k × n` matrix
/// ([`qmatmul_layout`]): `[1, 1, ⌈k/4⌉ + 1, 4·Np]`, strides `[any, any, 4·Np, 1]`, at a
/// 4-byte aligned address (the product reads it as words).
fn check_packed_int_b(b: &AccessPattern, k: u32, n: u32) -> Result<(), DecodeError> {
    let np = qmatmul_layout::padded_columns(n as usize)
        .and_then(|np| u32::try_from(np.checked_mul(4)?).ok())
        .ok_or_else(|| DecodeError::field("b.shape", Reason::OutOfRange(n as u64)).at(16 + 12))?;
    dim_eq("b.shape", 0, 1, b.shape[0])?;
    dim_eq("b.shape", 1, 1, b.shape[1])?;
    dim_eq("b.shape", 2, k.div_ceil(4) + 1, b.shape[2])?;
    dim_eq("b.shape", 3, np, b.shape[3])?;
    for (d, w) in [(2, np as i64), (3, 1)] {
        if b.stride[d] as i64 != w {
            return Err(
                DecodeError::field("b.stride", Reason::OutOfRange(b.stride[d] as u64))
                    .at(32 + 4 * d),
            );
        }
    }
    if !b.addr.is_multiple_of(4) {
        return Err(DecodeError::field("b.addr", Reason::OutOfRange(b.addr)).at(0));
    }
    Ok(())
}

/// The `shape` operand of an instruction with a data-dependent output: `[1, 1, 1, rank]`
/// of i64, at byte `off` of the instruction.
fn shape_operand(ap: &AccessPattern, rank: u32, off: usize) -> Result<(), DecodeError> {
    require_dtype(ap, "shape.dtype", &[DType::I64]).map_err(|e| e.shifted(off))?;
    same_shape("shape.shape", &[1, 1, 1, rank], ap).map_err(|e| e.shifted(off))
}

fn dim_eq(field: &'static str, dim: usize, expected: u32, found: u32) -> Result<(), DecodeError> {
    if expected == found {
        Ok(())
    } else {
        Err(DecodeError::field(
            field,
            Reason::ShapeMismatch {
                dim,
                expected,
                found,
            },
        )
        .at(16 + 4 * dim))
    }
}

const F32: &[DType] = &[DType::F32];
const NUMERIC: &[DType] = &[DType::F32, DType::I32, DType::I64];
const INTEGER: &[DType] = &[DType::I32, DType::I64];
/// What [`Op::TopK`] orders: f32 and every integer type.
const TOP_K_TYPES: &[DType] = &[
    DType::F32,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U64,
    DType::U32,
    DType::U16,
    DType::U8,
];

impl Instruction {
    /// Decodes and validates one instruction from the start of `bytes`, returning it and its
    /// length. `index`/`block_offset` of an error are left 0 (see [`crate::BlockDecoder`]).
    pub fn decode(bytes: &[u8]) -> Result<(Instruction, usize), DecodeError> {
        if bytes.len() < HEADER_SIZE {
            return Err(DecodeError::field(
                "header",
                Reason::Truncated {
                    needed: HEADER_SIZE,
                    available: bytes.len(),
                },
            ));
        }
        let opc = bytes[0];
        let (name, size) = opcode_info(opc).ok_or(DecodeError::field(
            "header.opcode",
            Reason::UnknownOpcode(opc),
        ))?;
        let len = u16::from_le_bytes([bytes[2], bytes[3]]) as usize;
        if len != size {
            return Err(DecodeError::field(
                "header.length",
                Reason::BadLength {
                    expected: size,
                    found: len,
                },
            )
            .at(2)
            .in_op(name, 0));
        }
        if bytes.len() < size {
            return Err(DecodeError::field(
                "header.length",
                Reason::Truncated {
                    needed: size,
                    available: bytes.len(),
                },
            )
            .at(2)
            .in_op(name, 0));
        }
        let b = &bytes[..size];
        Self::decode_exact(b)
            .map(|i| (i, size))
            .map_err(|e| e.in_op(name, 0))
    }

    fn decode_exact(b: &[u8]) -> Result<Instruction, DecodeError> {
        let mut r = R { b, pos: 1 };
        let sync_flags = r.u8();
        if sync_flags & !3 != 0 {
            return Err(
                DecodeError::field("header.sync", Reason::UnknownFlags(sync_flags as u32)).at(1),
            );
        }
        r.pos = 4;
        let (ws, ss) = (SemRef(r.u16()), SemRef(r.u16()));
        let (wv, sv) = (r.u32(), r.u32());
        let wait = if sync_flags & 1 != 0 {
            ws.validate("header.wait_sem").map_err(|e| e.at(4))?;
            Some((ws, wv))
        } else if ws.0 != 0 || wv != 0 {
            return Err(DecodeError::field("header.wait_sem", Reason::ReservedNonZero).at(4));
        } else {
            None
        };
        let signal = if sync_flags & 2 != 0 {
            ss.validate("header.signal_sem").map_err(|e| e.at(6))?;
            Some((ss, sv))
        } else if ss.0 != 0 || sv != 0 {
            return Err(DecodeError::field("header.signal_sem", Reason::ReservedNonZero).at(6));
        } else {
            None
        };
        let sync = Sync { wait, signal };
        let op = match b[0] {
            opcode::END => Op::End,
            opcode::NOP => Op::Nop,
            opcode::GUARD => {
                let at = HEADER_SIZE + AP_SIZE;
                let flags = u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
                if flags & !3 != 0 {
                    return Err(
                        DecodeError::field("flags", Reason::UnknownFlags(flags & !3)).at(at),
                    );
                }
                let (present, when) = (flags & 1 != 0, flags & 2 != 0);
                // Canonical: a lifted guard has no operand (zeros) and no polarity.
                let cond = r.opt_ap("cond", present)?;
                if let Some(c) = &cond {
                    require_dtype(c, "cond.dtype", &[DType::Bool, DType::U8])
                        .map_err(|e| e.shifted(HEADER_SIZE))?;
                    if c.elements() != 1 {
                        return Err(DecodeError::field(
                            "cond.shape",
                            Reason::OutOfRange(c.elements()),
                        )
                        .at(HEADER_SIZE + 16));
                    }
                } else if when {
                    return Err(DecodeError::field("flags", Reason::ReservedNonZero).at(at));
                }
                r.pos = at + 4;
                r.zeros(4, "reserved")?;
                Op::Guard { cond, when }
            }
            opcode::DMA_COPY => {
                let src = r.ap("src")?;
                let dst = r.ap("dst")?;
                if src.dtype != dst.dtype {
                    return Err(DecodeError::field(
                        "dst.dtype",
                        Reason::UnsupportedDType(dst.dtype),
                    )
                    .at(HEADER_SIZE + AP_SIZE + 8));
                }
                same_shape("dst.shape", &src.shape, &dst).map_err(|e| {
                    let o = e.field_offset;
                    e.at(HEADER_SIZE + AP_SIZE + o)
                })?;
                Op::DmaCopy { src, dst }
            }
            opcode::DMA_DESCRIPTORS => {
                let table = r.u64();
                let at = r.pos;
                let count = r.u32();
                if count == 0 || count > 1 << 16 {
                    return Err(
                        DecodeError::field("count", Reason::OutOfRange(count as u64)).at(at),
                    );
                }
                r.zeros(4, "reserved")?;
                Op::DmaDescriptors { table, count }
            }
            opcode::SEM_SET => {
                let sem = SemRef(r.u16());
                sem.validate("sem").map_err(|e| e.at(HEADER_SIZE))?;
                r.zeros(2, "reserved")?;
                Op::SemSet {
                    sem,
                    value: r.u32(),
                }
            }
            opcode::NOTIFY => {
                let subtype = r.u8();
                r.zeros(1, "reserved")?;
                let sub_id = r.u16();
                Op::Notify {
                    subtype,
                    sub_id,
                    payload: r.u32(),
                }
            }
            opcode::BARRIER => {
                let sem = SemRef(r.u16());
                if !sem.is_global() {
                    return Err(
                        DecodeError::field("sem", Reason::BadSemaphore(sem.0)).at(HEADER_SIZE)
                    );
                }
                sem.validate("sem").map_err(|e| e.at(HEADER_SIZE))?;
                r.zeros(2, "reserved")?;
                let at = r.pos;
                let count = r.u32();
                if !(1..=8).contains(&count) {
                    return Err(
                        DecodeError::field("count", Reason::OutOfRange(count as u64)).at(at),
                    );
                }
                Op::Barrier { sem, count }
            }
            opcode::MATMUL | opcode::MATMUL_EPI => {
                let a = r.ap("a")?;
                let b_ = r.ap("b")?;
                let c = r.ap("c")?;
                let epi = b[0] == opcode::MATMUL_EPI;
                let epi_flags_at = HEADER_SIZE + 5 * AP_SIZE + 12;
                let epi_flags = if epi {
                    let v = u32::from_le_bytes(
                        b[epi_flags_at..epi_flags_at + 4].try_into().expect("4"),
                    );
                    if v & !3 != 0 {
                        return Err(DecodeError::field(
                            "epilogue.flags",
                            Reason::UnknownFlags(v & !3),
                        )
                        .at(epi_flags_at));
                    }
                    v
                } else {
                    0
                };
                let (bias, residual) = if epi {
                    (
                        r.opt_ap("bias", epi_flags & 1 != 0)?,
                        r.opt_ap("residual", epi_flags & 2 != 0)?,
                    )
                } else {
                    (None, None)
                };
                let alpha = r.f32("alpha")?;
                let flags_at = r.pos;
                let flags = r.flags("flags", matmul_flags::ALL)?;
                let packed = flags & matmul_flags::PACKED_B != 0;
                if packed && flags & matmul_flags::TRANSPOSE_B != 0 {
                    return Err(DecodeError::field(
                        "flags",
                        Reason::UnknownFlags(matmul_flags::TRANSPOSE_B),
                    )
                    .at(flags_at));
                }
                let mut epilogue = Epilogue {
                    bias,
                    residual,
                    ..Epilogue::NONE
                };
                if epi {
                    epilogue.func = r.enum_u8("epilogue.func", ActFunc::from_u8)?;
                    r.zeros(3, "reserved")?;
                    r.pos += 4;
                    epilogue.act_alpha = r.f32("epilogue.act_alpha")?;
                    epilogue.act_beta = r.f32("epilogue.act_beta")?;
                    if epilogue.is_none() {
                        // The encoding is canonical: no epilogue is opcode MATMUL.
                        return Err(DecodeError::field("epilogue", Reason::ReservedNonZero)
                            .at(epi_flags_at));
                    }
                    for (ap, name, slot) in [
                        (&epilogue.bias, "bias.dtype", 3),
                        (&epilogue.residual, "residual.dtype", 4),
                    ] {
                        if let Some(ap) = ap {
                            let shape = if slot == 3 {
                                "bias.shape"
                            } else {
                                "residual.shape"
                            };
                            require_dtype(ap, name, F32)
                                .map_err(|e| e.shifted(HEADER_SIZE + slot * AP_SIZE))?;
                            same_shape(shape, &c.shape, ap)
                                .map_err(|e| e.shifted(HEADER_SIZE + slot * AP_SIZE))?;
                        }
                    }
                }
                let base = HEADER_SIZE;
                require_dtype(&a, "a.dtype", F32).map_err(|e| e.shifted(base))?;
                // B may hold half-precision weights (auto-cast): bf16 or f16, f32 accumulation.
                let b_types: &[DType] = if packed {
                    &[DType::F32, DType::Bf16]
                } else {
                    &[DType::F32, DType::Bf16, DType::F16]
                };
                require_dtype(&b_, "b.dtype", b_types).map_err(|e| e.shifted(base + AP_SIZE))?;
                require_dtype(&c, "c.dtype", F32).map_err(|e| e.shifted(base + 2 * AP_SIZE))?;
                let (m, k) = if flags & matmul_flags::TRANSPOSE_A != 0 {
                    (a.shape[3], a.shape[2])
                } else {
                    (a.shape[2], a.shape[3])
                };
                let (kb, n) = if flags & matmul_flags::TRANSPOSE_B != 0 {
                    (b_.shape[3], b_.shape[2])
                } else if packed {
                    // K is A's (B's rows were checked against it, pairs for bf16).
                    (k, c.shape[3])
                } else {
                    (b_.shape[2], b_.shape[3])
                };
                let bo = base + AP_SIZE;
                let co = base + 2 * AP_SIZE;
                if packed {
                    check_packed_b(&b_, k, n).map_err(|e| e.shifted(bo))?;
                }
                if kb != k {
                    return Err(DecodeError::field(
                        "b.shape",
                        Reason::ShapeMismatch {
                            dim: 2,
                            expected: k,
                            found: kb,
                        },
                    )
                    .at(bo + 16 + 8));
                }
                for d in 0..2 {
                    if !packed {
                        dim_eq("b.shape", d, c.shape[d], b_.shape[d]).map_err(|e| e.shifted(bo))?;
                    }
                    dim_eq("a.shape", d, c.shape[d], a.shape[d]).map_err(|e| e.shifted(base))?;
                }
                dim_eq("c.shape", 2, m, c.shape[2]).map_err(|e| e.shifted(co))?;
                dim_eq("c.shape", 3, n, c.shape[3]).map_err(|e| e.shifted(co))?;
                Op::MatMul {
                    a,
                    b: b_,
                    c,
                    alpha,
                    flags,
                    epilogue,
                }
            }
            opcode::CONV | opcode::CONV_ACT => {
                let input = r.ap("input")?;
                let weight = r.ap("weight")?;
                let output = r.ap("output")?;
                let flags_at = HEADER_SIZE + 5 * AP_SIZE + 40 + 4;
                let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
                if flags & !3 != 0 {
                    return Err(
                        DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at)
                    );
                }
                let bias = r.opt_ap("bias", flags & 1 != 0)?;
                let workspace = r.opt_ap("workspace", flags & 2 != 0)?;
                let window = r.window(false)?;
                let at = r.pos;
                let groups = r.u32();
                let base = HEADER_SIZE;
                for (ap, f, i) in [
                    (&input, "input.dtype", 0),
                    (&weight, "weight.dtype", 1),
                    (&output, "output.dtype", 2),
                ] {
                    require_dtype(ap, f, F32).map_err(|e| e.shifted(base + i * AP_SIZE))?;
                }
                let (c, o) = (input.shape[1], weight.shape[0]);
                if groups == 0 || c % groups != 0 || o % groups != 0 {
                    return Err(
                        DecodeError::field("groups", Reason::OutOfRange(groups as u64)).at(at),
                    );
                }
                let wo = base + AP_SIZE;
                let oo = base + 2 * AP_SIZE;
                dim_eq("weight.shape", 1, c / groups, weight.shape[1])
                    .map_err(|e| e.shifted(wo))?;
                dim_eq("output.shape", 0, input.shape[0], output.shape[0])
                    .map_err(|e| e.shifted(oo))?;
                dim_eq("output.shape", 1, o, output.shape[1]).map_err(|e| e.shifted(oo))?;
                for d in 0..2 {
                    let want = window
                        .out_dim(d, input.shape[2 + d], weight.shape[2 + d])
                        .ok_or(
                            DecodeError::field(
                                "window",
                                Reason::OutOfRange(weight.shape[2 + d] as u64),
                            )
                            .at(HEADER_SIZE + 5 * AP_SIZE),
                        )?;
                    dim_eq("output.shape", 2 + d, want, output.shape[2 + d])
                        .map_err(|e| e.shifted(oo))?;
                }
                if let Some(bias) = &bias {
                    require_dtype(bias, "bias.dtype", F32)
                        .map_err(|e| e.shifted(base + 3 * AP_SIZE))?;
                    same_shape("bias.shape", &[1, 1, 1, o], bias)
                        .map_err(|e| e.shifted(base + 3 * AP_SIZE))?;
                }
                if let Some(ws) = &workspace {
                    let need = (c / groups) as u64
                        * weight.shape[2] as u64
                        * weight.shape[3] as u64
                        * output.shape[2] as u64
                        * output.shape[3] as u64;
                    require_dtype(ws, "workspace.dtype", F32)
                        .map_err(|e| e.shifted(base + 4 * AP_SIZE))?;
                    if ws.elements() < need || !ws.is_dense() {
                        return Err(DecodeError::field(
                            "workspace.shape",
                            Reason::OutOfRange(ws.elements()),
                        )
                        .at(base + 4 * AP_SIZE + 16));
                    }
                }
                let mut act = (ActFunc::Identity, 0.0, 0.0);
                if b[0] == opcode::CONV_ACT {
                    r.pos = flags_at + 4;
                    let at = r.pos;
                    act.0 = r.enum_u8("act.func", ActFunc::from_u8)?;
                    r.zeros(3, "reserved")?;
                    act.1 = r.f32("act.alpha")?;
                    act.2 = r.f32("act.beta")?;
                    r.zeros(4, "reserved")?;
                    if matches!(act.0, ActFunc::Identity) {
                        // The encoding is canonical: no activation is opcode CONV.
                        return Err(DecodeError::field("act.func", Reason::ReservedNonZero).at(at));
                    }
                }
                Op::Conv {
                    input,
                    weight,
                    output,
                    bias,
                    workspace,
                    window,
                    groups,
                    act,
                }
            }
            opcode::ACTIVATION => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let flags_at = HEADER_SIZE + 3 * AP_SIZE + 4;
                let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
                if flags & !1 != 0 {
                    return Err(
                        DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at)
                    );
                }
                let bias = r.opt_ap("bias", flags & 1 != 0)?;
                let func = r.enum_u8("func", ActFunc::from_u8)?;
                r.zeros(3, "reserved")?;
                r.pos += 4;
                let scale = r.f32("scale")?;
                let alpha = r.f32("alpha")?;
                let beta = r.f32("beta")?;
                r.zeros(4, "reserved")?;
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&output, "output.dtype", F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                same_shape("output.shape", &input.shape, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                if let Some(bias) = &bias {
                    require_dtype(bias, "bias.dtype", F32)
                        .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                    same_shape("bias.shape", &input.shape, bias)
                        .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                }
                Op::Activation {
                    input,
                    output,
                    bias,
                    func,
                    scale,
                    alpha,
                    beta,
                }
            }
            opcode::BINARY => {
                let a = r.ap("a")?;
                let b_ = r.ap("b")?;
                let out = r.ap("out")?;
                let op = r.enum_u8("op", BinaryOp::from_u8)?;
                r.zeros(7, "reserved")?;
                let ops = if op.is_logical() {
                    &[DType::Bool][..]
                } else if op.is_bitwise() {
                    INTEGER
                } else {
                    NUMERIC
                };
                require_dtype(&a, "a.dtype", ops).map_err(|e| e.shifted(HEADER_SIZE))?;
                if b_.dtype != a.dtype {
                    return Err(
                        DecodeError::field("b.dtype", Reason::UnsupportedDType(b_.dtype))
                            .at(HEADER_SIZE + AP_SIZE + 8),
                    );
                }
                let want_out = if op.is_comparison() {
                    DType::Bool
                } else {
                    a.dtype
                };
                if out.dtype != want_out {
                    return Err(DecodeError::field(
                        "out.dtype",
                        Reason::UnsupportedDType(out.dtype),
                    )
                    .at(HEADER_SIZE + 2 * AP_SIZE + 8));
                }
                same_shape("a.shape", &out.shape, &a).map_err(|e| e.shifted(HEADER_SIZE))?;
                same_shape("b.shape", &out.shape, &b_)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                Op::Binary { a, b: b_, out, op }
            }
            opcode::TENSOR_SCALAR => {
                let a = r.ap("a")?;
                let out = r.ap("out")?;
                let op = r.enum_u8("op", BinaryOp::from_u8)?;
                if op.is_comparison() || op.is_logical() || op.is_bitwise() {
                    return Err(DecodeError::field("op", Reason::BadEnum(op as u32))
                        .at(HEADER_SIZE + 2 * AP_SIZE));
                }
                r.zeros(3, "reserved")?;
                let reverse = r.bool32("reverse")?;
                let scalar = r.f32("scalar")?;
                r.zeros(4, "reserved")?;
                require_dtype(&a, "a.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&out, "out.dtype", F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                same_shape("out.shape", &a.shape, &out)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                Op::TensorScalar {
                    a,
                    out,
                    op,
                    scalar,
                    reverse,
                }
            }
            opcode::COPY => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                same_shape("output.shape", &input.shape, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                Op::Copy { input, output }
            }
            opcode::SELECT => {
                let cond = r.ap("cond")?;
                let a = r.ap("a")?;
                let b_ = r.ap("b")?;
                let out = r.ap("out")?;
                require_dtype(&cond, "cond.dtype", &[DType::Bool])
                    .map_err(|e| e.shifted(HEADER_SIZE))?;
                if a.dtype != out.dtype {
                    return Err(
                        DecodeError::field("a.dtype", Reason::UnsupportedDType(a.dtype))
                            .at(HEADER_SIZE + AP_SIZE + 8),
                    );
                }
                if b_.dtype != out.dtype {
                    return Err(
                        DecodeError::field("b.dtype", Reason::UnsupportedDType(b_.dtype))
                            .at(HEADER_SIZE + 2 * AP_SIZE + 8),
                    );
                }
                same_shape("cond.shape", &out.shape, &cond).map_err(|e| e.shifted(HEADER_SIZE))?;
                same_shape("a.shape", &out.shape, &a)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                same_shape("b.shape", &out.shape, &b_)
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                Op::Select {
                    cond,
                    a,
                    b: b_,
                    out,
                }
            }
            opcode::FILL => {
                let out = r.ap("out")?;
                let at = r.pos;
                let bits = r.u64();
                let width = out.dtype.size() * 8;
                if width < 64 && bits >> width != 0 {
                    return Err(DecodeError::field("bits", Reason::OutOfRange(bits)).at(at));
                }
                Op::Fill { out, bits }
            }
            opcode::REDUCE => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let op = r.enum_u8("op", ReduceOp::from_u8)?;
                let at = r.pos;
                let axes = r.u8();
                if axes & !0xF != 0 {
                    return Err(DecodeError::field("axes", Reason::OutOfRange(axes as u64)).at(at));
                }
                r.zeros(6, "reserved")?;
                let ok = if op == ReduceOp::Mean { F32 } else { NUMERIC };
                require_dtype(&input, "input.dtype", ok).map_err(|e| e.shifted(HEADER_SIZE))?;
                if output.dtype != input.dtype {
                    return Err(DecodeError::field(
                        "output.dtype",
                        Reason::UnsupportedDType(output.dtype),
                    )
                    .at(HEADER_SIZE + AP_SIZE + 8));
                }
                let mut want = input.shape;
                for (d, w) in want.iter_mut().enumerate() {
                    if axes & (1 << d) != 0 {
                        *w = 1;
                    }
                }
                same_shape("output.shape", &want, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                Op::Reduce {
                    input,
                    output,
                    op,
                    axes,
                }
            }
            opcode::POOL => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let window = r.window(true)?;
                let op = r.enum_u8("op", PoolOp::from_u8)?;
                r.zeros(3, "reserved")?;
                let count_include_pad = r.bool32("count_include_pad")?;
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&output, "output.dtype", F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let oo = HEADER_SIZE + AP_SIZE;
                for d in 0..2 {
                    dim_eq("output.shape", d, input.shape[d], output.shape[d])
                        .map_err(|e| e.shifted(oo))?;
                    let want = window
                        .out_dim(d, input.shape[2 + d], window.kernel[d])
                        .ok_or(
                            DecodeError::field(
                                "window.kernel",
                                Reason::OutOfRange(window.kernel[d] as u64),
                            )
                            .at(HEADER_SIZE + 2 * AP_SIZE + 4 * d),
                        )?;
                    dim_eq("output.shape", 2 + d, want, output.shape[2 + d])
                        .map_err(|e| e.shifted(oo))?;
                }
                Op::Pool {
                    input,
                    output,
                    window,
                    op,
                    count_include_pad,
                }
            }
            opcode::SOFTMAX => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let log = r.bool32("log")?;
                r.zeros(4, "reserved")?;
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&output, "output.dtype", F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                same_shape("output.shape", &input.shape, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                Op::Softmax { input, output, log }
            }
            opcode::DYNAMIC_QUANTIZE => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let scale = r.ap("scale")?;
                let zero_point = r.ap("zero_point")?;
                r.zeros(8, "reserved")?;
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&output, "output.dtype", &[DType::U8])
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                same_shape("output.shape", &input.shape, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                for (slot, ap, dtype, dname, sname) in [
                    (2, &scale, DType::F32, "scale.dtype", "scale.shape"),
                    (
                        3,
                        &zero_point,
                        DType::U8,
                        "zero_point.dtype",
                        "zero_point.shape",
                    ),
                ] {
                    let at = HEADER_SIZE + slot * AP_SIZE;
                    require_dtype(ap, dname, &[dtype]).map_err(|e| e.shifted(at))?;
                    if ap.elements() != 1 {
                        return Err(DecodeError::field(sname, Reason::OutOfRange(ap.elements()))
                            .at(at + 16));
                    }
                }
                Op::DynamicQuantize {
                    input,
                    output,
                    scale,
                    zero_point,
                }
            }
            opcode::LAYER_NORM => {
                let input = r.ap("input")?;
                let gamma = r.ap("gamma")?;
                let flags_at = HEADER_SIZE + 4 * AP_SIZE + 4;
                let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
                if flags & !1 != 0 {
                    return Err(
                        DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at)
                    );
                }
                let beta = r.opt_ap("beta", flags & 1 != 0)?;
                let output = r.ap("output")?;
                let eps = r.f32("eps")?;
                if eps.is_nan() || eps < 0.0 {
                    return Err(DecodeError::field(
                        "eps",
                        Reason::OutOfRange(eps.to_bits() as u64),
                    )
                    .at(flags_at - 4));
                }
                let aps = [Some(&input), Some(&gamma), beta.as_ref(), Some(&output)];
                let names = ["input.dtype", "gamma.dtype", "beta.dtype", "output.dtype"];
                let shapes = ["input.shape", "gamma.shape", "beta.shape", "output.shape"];
                for (i, ap) in aps.iter().enumerate() {
                    if let Some(ap) = ap {
                        require_dtype(ap, names[i], F32)
                            .map_err(|e| e.shifted(HEADER_SIZE + i * AP_SIZE))?;
                        same_shape(shapes[i], &input.shape, ap)
                            .map_err(|e| e.shifted(HEADER_SIZE + i * AP_SIZE))?;
                    }
                }
                Op::LayerNorm {
                    input,
                    gamma,
                    beta,
                    output,
                    eps,
                }
            }
            opcode::RESIZE => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let mode = r.enum_u8("mode", ResizeMode::from_u8)?;
                let coord = r.enum_u8("coord", CoordMode::from_u8)?;
                let nearest = r.enum_u8("nearest", NearestMode::from_u8)?;
                r.zeros(5, "reserved")?;
                let mut scales = [0f32; 4];
                for s in &mut scales {
                    let at = r.pos;
                    *s = r.f32("scales")?;
                    if *s < 0.0 || !s.is_finite() {
                        return Err(DecodeError::field(
                            "scales",
                            Reason::OutOfRange(s.to_bits() as u64),
                        )
                        .at(at));
                    }
                }
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&output, "output.dtype", F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                Op::Resize {
                    input,
                    output,
                    mode,
                    coord,
                    nearest,
                    scales,
                }
            }
            opcode::GATHER => {
                let data = r.ap("data")?;
                let indices = r.ap("indices")?;
                let output = r.ap("output")?;
                require_dtype(&indices, "indices.dtype", &[DType::I32, DType::I64])
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                if output.dtype != data.dtype {
                    return Err(DecodeError::field(
                        "output.dtype",
                        Reason::UnsupportedDType(output.dtype),
                    )
                    .at(HEADER_SIZE + 2 * AP_SIZE + 8));
                }
                let n = indices.shape[3];
                same_shape("indices.shape", &[1, 1, 1, n], &indices)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let want = [data.shape[0], data.shape[1], n, data.shape[3]];
                same_shape("output.shape", &want, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                Op::Gather {
                    data,
                    indices,
                    output,
                }
            }
            opcode::GATHER_ELEMENTS => {
                let data = r.ap("data")?;
                let indices = r.ap("indices")?;
                let output = r.ap("output")?;
                let axis = r.axis()?;
                r.zeros(7, "reserved")?;
                require_dtype(&indices, "indices.dtype", &[DType::I32, DType::I64])
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                if output.dtype != data.dtype {
                    return Err(DecodeError::field(
                        "output.dtype",
                        Reason::UnsupportedDType(output.dtype),
                    )
                    .at(HEADER_SIZE + 2 * AP_SIZE + 8));
                }
                same_shape("indices.shape", &output.shape, &indices)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let mut want = output.shape;
                want[axis as usize] = data.shape[axis as usize];
                same_shape("data.shape", &want, &data).map_err(|e| e.shifted(HEADER_SIZE))?;
                Op::GatherElements {
                    data,
                    indices,
                    output,
                    axis,
                }
            }
            opcode::SCATTER_ELEMENTS => {
                let indices = r.ap("indices")?;
                let updates = r.ap("updates")?;
                let output = r.ap("output")?;
                let axis = r.axis()?;
                let reduce = r.enum_u8("reduce", ScatterReduce::from_u8)?;
                r.zeros(6, "reserved")?;
                require_dtype(&indices, "indices.dtype", &[DType::I32, DType::I64])
                    .map_err(|e| e.shifted(HEADER_SIZE))?;
                if reduce != ScatterReduce::None {
                    require_dtype(&output, "output.dtype", NUMERIC)
                        .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                }
                if updates.dtype != output.dtype {
                    return Err(DecodeError::field(
                        "updates.dtype",
                        Reason::UnsupportedDType(updates.dtype),
                    )
                    .at(HEADER_SIZE + AP_SIZE + 8));
                }
                same_shape("indices.shape", &updates.shape, &indices)
                    .map_err(|e| e.shifted(HEADER_SIZE))?;
                let mut want = updates.shape;
                want[axis as usize] = output.shape[axis as usize];
                same_shape("output.shape", &want, &output)
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                Op::ScatterElements {
                    indices,
                    updates,
                    output,
                    axis,
                    reduce,
                }
            }
            opcode::MATMUL_INTEGER | opcode::MATMUL_INTEGER_SCALED => {
                let scaled = b[0] == opcode::MATMUL_INTEGER_SCALED;
                let aps = if scaled { 6 } else { 5 };
                let flags_at = HEADER_SIZE + aps * AP_SIZE;
                let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
                if flags & !7 != 0 {
                    return Err(
                        DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at)
                    );
                }
                let packed_b = flags & 4 != 0;
                let a = r.ap("a")?;
                let b_ = r.ap("b")?;
                let c = r.ap("c")?;
                let a_zero = r.opt_ap("a_zero", flags & 1 != 0)?;
                let b_zero = r.opt_ap("b_zero", flags & 2 != 0)?;
                let scale = if scaled { Some(r.ap("scale")?) } else { None };
                r.u32();
                r.zeros(4, "reserved")?;
                const Q: &[DType] = &[DType::U8, DType::I8];
                require_dtype(&a, "a.dtype", Q).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&b_, "b.dtype", Q).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let c_type = if scaled { DType::F32 } else { DType::I32 };
                require_dtype(&c, "c.dtype", &[c_type])
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                let [b1, b2, m, k] = a.shape;
                let n = c.shape[3];
                if packed_b {
                    check_packed_int_b(&b_, k, n).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                } else {
                    same_shape("b.shape", &[b1, b2, k, n], &b_)
                        .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                }
                same_shape("c.shape", &[b1, b2, m, n], &c)
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                if let Some(z) = &a_zero {
                    let at = HEADER_SIZE + 3 * AP_SIZE;
                    require_dtype(z, "a_zero.dtype", &[a.dtype]).map_err(|e| e.shifted(at))?;
                    same_shape("a_zero.shape", &[b1, b2, m, 1], z).map_err(|e| e.shifted(at))?;
                }
                if let Some(z) = &b_zero {
                    let at = HEADER_SIZE + 4 * AP_SIZE;
                    require_dtype(z, "b_zero.dtype", &[b_.dtype]).map_err(|e| e.shifted(at))?;
                    same_shape("b_zero.shape", &[b1, b2, 1, n], z).map_err(|e| e.shifted(at))?;
                }
                if let Some(sc) = &scale {
                    let at = HEADER_SIZE + 5 * AP_SIZE;
                    require_dtype(sc, "scale.dtype", &[DType::F32]).map_err(|e| e.shifted(at))?;
                    same_shape("scale.shape", &[b1, b2, 1, n], sc).map_err(|e| e.shifted(at))?;
                }
                Op::MatMulInteger {
                    a,
                    b: b_,
                    c,
                    a_zero,
                    b_zero,
                    packed_b,
                    scale,
                }
            }
            opcode::TOP_K => {
                let input = r.ap("input")?;
                let values = r.ap("values")?;
                let indices = r.ap("indices")?;
                let largest = r.bool32("largest")?;
                r.zeros(4, "reserved")?;
                require_dtype(&input, "input.dtype", TOP_K_TYPES)
                    .map_err(|e| e.shifted(HEADER_SIZE))?;
                if values.dtype != input.dtype {
                    return Err(DecodeError::field(
                        "values.dtype",
                        Reason::UnsupportedDType(values.dtype),
                    )
                    .at(HEADER_SIZE + AP_SIZE + 8));
                }
                require_dtype(&indices, "indices.dtype", &[DType::I64])
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                let k = values.shape[3];
                dim_eq("values.shape", 3, k.min(input.shape[3]), k)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let mut want = input.shape;
                want[3] = k;
                same_shape("values.shape", &want, &values)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                same_shape("indices.shape", &want, &indices)
                    .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
                Op::TopK {
                    input,
                    values,
                    indices,
                    largest,
                }
            }
            opcode::NON_ZERO => {
                let input = r.ap("input")?;
                let output = r.ap("output")?;
                let shape = r.ap("shape")?;
                let at = HEADER_SIZE + AP_SIZE;
                require_dtype(&output, "output.dtype", &[DType::I64]).map_err(|e| e.shifted(at))?;
                let rank = output.shape[2];
                if !(1..=4).contains(&rank) {
                    return Err(DecodeError::field(
                        "output.shape",
                        Reason::OutOfRange(rank as u64),
                    )
                    .at(at + 16 + 8));
                }
                let mut lead = [1u32; 4];
                lead[4 - rank as usize..].copy_from_slice(&input.shape[4 - rank as usize..]);
                same_shape("input.shape", &lead, &input).map_err(|e| e.shifted(HEADER_SIZE))?;
                let n = input.elements();
                let n = u32::try_from(n).map_err(|_| {
                    DecodeError::field("input.shape", Reason::OutOfRange(n)).at(HEADER_SIZE + 16)
                })?;
                same_shape("output.shape", &[1, 1, rank, n], &output).map_err(|e| e.shifted(at))?;
                shape_operand(&shape, 2, HEADER_SIZE + 2 * AP_SIZE)?;
                Op::NonZero {
                    input,
                    output,
                    shape,
                }
            }
            opcode::UNIQUE => {
                let input = r.ap("input")?;
                let y = r.ap("y")?;
                let indices = r.ap("indices")?;
                let inverse = r.ap("inverse")?;
                let counts = r.ap("counts")?;
                let shape = r.ap("shape")?;
                let at = r.pos;
                let rank = r.u8();
                let axis = r.u8();
                let sorted = r.u8();
                r.zeros(1, "reserved")?;
                let mut dims = [0u32; 8];
                for d in &mut dims {
                    *d = r.u32();
                }
                r.zeros(4, "reserved")?;
                if !(1..=8).contains(&rank) {
                    return Err(
                        DecodeError::field("dims.rank", Reason::OutOfRange(rank as u64)).at(at),
                    );
                }
                if axis >= rank {
                    return Err(
                        DecodeError::field("dims.axis", Reason::OutOfRange(axis as u64)).at(at + 1),
                    );
                }
                if sorted > 1 {
                    return Err(
                        DecodeError::field("sorted", Reason::OutOfRange(sorted as u64)).at(at + 2),
                    );
                }
                if let Some(i) = (rank as usize..8).find(|&i| dims[i] != 0) {
                    return Err(
                        DecodeError::field("dims", Reason::ReservedNonZero).at(at + 4 + 4 * i)
                    );
                }
                require_dtype(&input, "input.dtype", TOP_K_TYPES)
                    .map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&y, "y.dtype", &[input.dtype])
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                dim_eq("input.shape", 0, 1, input.shape[0]).map_err(|e| e.shifted(HEADER_SIZE))?;
                same_shape("y.shape", &input.shape, &y)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let a = input.shape[2];
                for (k, (ap, name)) in [
                    (indices, "indices.shape"),
                    (inverse, "inverse.shape"),
                    (counts, "counts.shape"),
                ]
                .iter()
                .enumerate()
                {
                    let off = HEADER_SIZE + (2 + k) * AP_SIZE;
                    require_dtype(ap, "dtype", &[DType::I64]).map_err(|e| e.shifted(off))?;
                    same_shape(name, &[1, 1, 1, a], ap).map_err(|e| e.shifted(off))?;
                }
                shape_operand(&shape, rank as u32, HEADER_SIZE + 5 * AP_SIZE)?;
                // The template describes `y`: outer · bound · inner.
                let prod = |ds: &[u32]| ds.iter().try_fold(1u64, |p, &d| p.checked_mul(d as u64));
                let (r_, x) = (rank as usize, axis as usize);
                let fits = prod(&dims[..x]) == Some(input.shape[1] as u64)
                    && dims[x] == a
                    && prod(&dims[x + 1..r_]) == Some(input.shape[3] as u64);
                if !fits {
                    return Err(DecodeError::field(
                        "dims",
                        Reason::ShapeMismatch {
                            dim: x,
                            expected: a,
                            found: dims[x],
                        },
                    )
                    .at(at + 4));
                }
                Op::Unique {
                    input,
                    y,
                    indices,
                    inverse,
                    counts,
                    shape,
                    dims: ShapeTemplate { rank, axis, dims },
                    sorted: sorted != 0,
                }
            }
            opcode::NON_MAX_SUPPRESSION => {
                let flags_at = HEADER_SIZE + 7 * AP_SIZE;
                let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
                if flags & !nms_flags::ALL != 0 {
                    return Err(DecodeError::field(
                        "flags",
                        Reason::UnknownFlags(flags & !nms_flags::ALL),
                    )
                    .at(flags_at));
                }
                if flags & nms_flags::SCORE != 0 && flags & nms_flags::SCORE_CONST != 0 {
                    return Err(DecodeError::field(
                        "flags",
                        Reason::UnknownFlags(nms_flags::SCORE_CONST),
                    )
                    .at(flags_at));
                }
                let boxes = r.ap("boxes")?;
                let scores = r.ap("scores")?;
                let max_out = r.opt_ap("max_out", flags & nms_flags::MAX_OUT != 0)?;
                let iou = r.opt_ap("iou", flags & nms_flags::IOU != 0)?;
                let score_threshold = r.opt_ap("score_threshold", flags & nms_flags::SCORE != 0)?;
                let selected = r.ap("selected")?;
                let shape = r.ap("shape")?;
                r.u32();
                let max_out_const = r.u32();
                let iou_const = r.f32("iou_const")?;
                let score_const = r.f32("score_const")?;
                require_dtype(&boxes, "boxes.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                require_dtype(&scores, "scores.dtype", F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                let [_, nb, ns, _] = boxes.shape;
                same_shape("boxes.shape", &[1, nb, ns, 4], &boxes)
                    .map_err(|e| e.shifted(HEADER_SIZE))?;
                let nc = scores.shape[2];
                same_shape("scores.shape", &[1, nb, nc, ns], &scores)
                    .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
                for (k, (op, dt)) in [
                    (max_out, DType::I64),
                    (iou, DType::F32),
                    (score_threshold, DType::F32),
                ]
                .iter()
                .enumerate()
                {
                    if let Some(ap) = op {
                        let off = HEADER_SIZE + (2 + k) * AP_SIZE;
                        require_dtype(ap, "dtype", &[*dt]).map_err(|e| e.shifted(off))?;
                        same_shape("shape", &[1, 1, 1, 1], ap).map_err(|e| e.shifted(off))?;
                    }
                }
                let off = HEADER_SIZE + 5 * AP_SIZE;
                require_dtype(&selected, "selected.dtype", &[DType::I64])
                    .map_err(|e| e.shifted(off))?;
                same_shape("selected.shape", &[1, 1, selected.shape[2], 3], &selected)
                    .map_err(|e| e.shifted(off))?;
                shape_operand(&shape, 2, HEADER_SIZE + 6 * AP_SIZE)?;
                Op::NonMaxSuppression {
                    boxes,
                    scores,
                    max_out,
                    iou,
                    score_threshold,
                    selected,
                    shape,
                    flags,
                    max_out_const,
                    iou_const,
                    score_const,
                }
            }
            opcode::ROI_ALIGN => {
                let input = r.ap("input")?;
                let rois = r.ap("rois")?;
                let batch_indices = r.ap("batch_indices")?;
                let output = r.ap("output")?;
                let spatial_scale = r.f32("spatial_scale")?;
                let at = r.pos;
                let sampling_ratio = r.u32();
                if sampling_ratio > ROI_MAX_GRID {
                    return Err(DecodeError::field(
                        "sampling_ratio",
                        Reason::OutOfRange(sampling_ratio as u64),
                    )
                    .at(at));
                }
                let flags = r.flags("flags", roi_flags::ALL)?;
                r.zeros(4, "reserved")?;
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
                let off = |k: usize| HEADER_SIZE + k * AP_SIZE;
                require_dtype(&rois, "rois.dtype", F32).map_err(|e| e.shifted(off(1)))?;
                require_dtype(&batch_indices, "batch_indices.dtype", &[DType::I64])
                    .map_err(|e| e.shifted(off(2)))?;
                require_dtype(&output, "output.dtype", F32).map_err(|e| e.shifted(off(3)))?;
                let nr = output.shape[0];
                same_shape("rois.shape", &[1, 1, nr, 4], &rois).map_err(|e| e.shifted(off(1)))?;
                same_shape("batch_indices.shape", &[1, 1, 1, nr], &batch_indices)
                    .map_err(|e| e.shifted(off(2)))?;
                dim_eq("output.shape", 1, input.shape[1], output.shape[1])
                    .map_err(|e| e.shifted(off(3)))?;
                Op::RoiAlign {
                    input,
                    rois,
                    batch_indices,
                    output,
                    spatial_scale,
                    sampling_ratio,
                    flags,
                }
            }
            opcode::DEFORM_IM2COL => {
                let flags_at = HEADER_SIZE + 4 * AP_SIZE + 44;
                let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
                if flags & !1 != 0 {
                    return Err(
                        DecodeError::field("flags", Reason::UnknownFlags(flags & !1)).at(flags_at),
                    );
                }
                let input = r.ap("input")?;
                let offset = r.ap("offset")?;
                let mask = r.opt_ap("mask", flags & 1 != 0)?;
                let cols = r.ap("cols")?;
                let win_at = r.pos;
                let window = r.window(true)?;
                if window.pad[2] != 0 || window.pad[3] != 0 {
                    return Err(DecodeError::field(
                        "window.pad",
                        Reason::OutOfRange(window.pad[2].max(window.pad[3]) as u64),
                    )
                    .at(win_at + 24));
                }
                let g_at = r.pos;
                let groups = r.u32();
                r.u32();
                let off = |k: usize| HEADER_SIZE + k * AP_SIZE;
                require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(off(0)))?;
                require_dtype(&offset, "offset.dtype", F32).map_err(|e| e.shifted(off(1)))?;
                require_dtype(&cols, "cols.dtype", F32).map_err(|e| e.shifted(off(3)))?;
                let [n, c, _, _] = input.shape;
                if groups == 0 || !c.is_multiple_of(groups) {
                    return Err(DecodeError::field(
                        "offset_groups",
                        Reason::OutOfRange(groups as u64),
                    )
                    .at(g_at));
                }
                let k = window.kernel[0] as u64 * window.kernel[1] as u64;
                let fit = |v: u64, field: &'static str, at: usize| {
                    u32::try_from(v)
                        .map_err(|_| DecodeError::field(field, Reason::OutOfRange(v)).at(at))
                };
                let (oh, ow) = (cols.shape[2], cols.shape[3]);
                let gk = fit(groups as u64 * k, "window.kernel", win_at)?;
                let gk2 = fit(gk as u64 * 2, "window.kernel", win_at)?;
                let ck = fit(c as u64 * k, "window.kernel", win_at)?;
                same_shape("offset.shape", &[n, gk2, oh, ow], &offset)
                    .map_err(|e| e.shifted(off(1)))?;
                if let Some(m) = &mask {
                    require_dtype(m, "mask.dtype", F32).map_err(|e| e.shifted(off(2)))?;
                    same_shape("mask.shape", &[n, gk, oh, ow], m).map_err(|e| e.shifted(off(2)))?;
                }
                same_shape("cols.shape", &[n, ck, oh, ow], &cols).map_err(|e| e.shifted(off(3)))?;
                Op::DeformIm2col {
                    input,
                    offset,
                    mask,
                    cols,
                    window,
                    offset_groups: groups,
                }
            }
            other => unreachable!("opcode {other:#x} passed opcode_info"),
        };
        bound_repetition(&op)?;
        Ok(Instruction { sync, op })
    }

    /// The address fields of the instruction, in encoding order, with the byte extent each
    /// operand touches: what relocations may patch and what the loader bounds-checks. Every
    /// access-pattern field comes from [`Op::operands`]; the DMA descriptor table is the one
    /// address that is not an access pattern.
    pub fn address_fields(&self, mut f: impl FnMut(AddressField)) {
        let h = HEADER_SIZE;
        if let Op::DmaDescriptors { count, .. } = &self.op {
            f(AddressField {
                offset: h,
                name: "table",
                extent: (0, *count as i128 * nrt_hal::wire::TRIGGER_PAIR_SIZE as i128),
                rows: crate::ap::ByteRows::range(
                    0,
                    *count as i128 * nrt_hal::wire::TRIGGER_PAIR_SIZE as i128,
                ),
                ap: None,
            });
            return;
        }
        self.op.operands(|o| {
            f(AddressField {
                offset: h + o.slot * AP_SIZE,
                name: o.name,
                extent: o.ap.byte_extent(),
                rows: o.ap.byte_rows(),
                ap: Some(*o.ap),
            })
        });
    }
}
