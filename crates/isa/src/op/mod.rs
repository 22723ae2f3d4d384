//! What an instruction *is*. [`instruction_table!`](crate::instruction_table) is the one
//! table of the instruction set: each entry names an op, its family file, the engines that
//! run it and its encodings (opcode byte and size). From it come the [`Op`] enum, the
//! [`opcode`] numbers, [`opcode_info`], [`Op::opcode`], [`Op::runs_on`] and the dispatch
//! of encoding, decoding and operands to the op's own code; `nrt-kernels` generates its
//! dispatch from the same table.
//!
//! Each family file (`control`, `sp`, `pe`, `attention`, `act`, `dve`, `pool`, `gather`,
//! `dynamic`) holds its ops side by side: the fields (a struct, the payload of its [`Op`]
//! variant), then one `impl Unit` with the encoding, the decoding with every check the
//! decoder makes, and the operands with their roles.
//!
//! Adding an instruction: one entry in the table, one struct (with its `impl Unit`) in its
//! family file, and its kernel (`impl Execute` in `nrt-kernels`).

pub mod act;
pub mod attention;
pub mod block_format;
pub mod control;
pub mod dve;
pub mod dynamic;
pub mod gather;
pub mod pe;
pub mod pool;
pub mod sp;

pub use act::ActFunc;
pub use block_format::BlockFormat;
pub use dve::BinaryOp;
pub use dynamic::{ShapeTemplate, nms_flags};
pub use gather::{ROI_MAX_GRID, ScatterReduce, roi_flags};
pub use pe::{Epilogue, matmul_flags, qmatmul_layout};
pub use pool::{CoordMode, NearestMode, PoolOp, ReduceOp, ResizeMode};

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::{R, W};
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use nrt_hal::Engine;

/// What every instruction implements beside its fields (the dispatch of [`Op`] calls it).
pub(crate) trait Unit: Sized {
    /// Appends the fields after the header, in encoding order.
    fn encode(&self, w: &mut W<'_>);
    /// Reads and checks the fields after the header (`r.b` is the whole instruction,
    /// `r.b[0]` its opcode).
    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError>;
    /// Calls `f(slot, name, role, ap)` for every access-pattern operand in encoding order.
    fn operands<'a>(&'a self, f: &mut impl FnMut(usize, &'static str, Role, &'a AccessPattern));
    /// As [`Unit::operands`], mutably (relocation, address assignment).
    fn operands_mut(&mut self, f: &mut impl FnMut(usize, &'static str, Role, &mut AccessPattern));
}

/// Writes [`Unit::operands`] and [`Unit::operands_mut`] from one body: `$pat` destructures
/// `self` (match ergonomics bind the fields by shared or mutable reference accordingly) and
/// the body calls `$f(slot, name, role, ap)` for each operand.
macro_rules! operands {
    (|$f:ident| $pat:pat => $body:block) => {
        fn operands<'a>(
            &'a self,
            $f: &mut impl FnMut(usize, &'static str, crate::instr::Role, &'a AccessPattern),
        ) {
            let $pat = self;
            $body
        }
        fn operands_mut(
            &mut self,
            $f: &mut impl FnMut(usize, &'static str, crate::instr::Role, &mut AccessPattern),
        ) {
            let $pat = self;
            $body
        }
    };
}
pub(crate) use operands;

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

pub(crate) use wire_enum;

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

/// THE instruction set: every op, its family file and payload type, the engines that may
/// run it, and each of its encodings (opcode constant, byte, encoded size). Invoked with
/// the name of a macro (and optional extra tokens), it calls that macro with
/// `(extra tokens)` followed by the table; `nrt-isa` generates [`Op`] and its dispatch from
/// it, `nrt-kernels` its kernel dispatch.
#[macro_export]
macro_rules! instruction_table {
    ($callback:ident $(, $arg:tt)*) => {
        $callback! { ($($arg),*)
            /// End of block: the engine is done with this execution (writes its END record).
            control::End on _ => {
                /// [`super::Op::End`].
                END = 0x01, HEADER_SIZE;
            }
            /// Does nothing (carries only synchronization).
            control::Nop on _ => {
                /// [`super::Op::Nop`].
                NOP = 0x02, HEADER_SIZE;
            }
            /// Any engine: predication (NCM 1.6).
            control::Guard on _ => {
                /// [`super::Op::Guard`] (NCM 1.6).
                GUARD = 0x03, HEADER_SIZE + AP_SIZE + 8;
            }
            /// SP: strided copy by the DMA engine (same shape and element type).
            sp::DmaCopy on Engine::Sp => {
                /// [`super::Op::DmaCopy`].
                DMA_COPY = 0x10, HEADER_SIZE + 2 * AP_SIZE;
            }
            /// SP: run `count` DMA transfers ([`nrt_hal::TriggerPair`]s) stored at `table` — how a model
            /// moves its inputs and outputs through the descriptors bind patched.
            sp::DmaDescriptors on Engine::Sp => {
                /// [`super::Op::DmaDescriptors`].
                DMA_DESCRIPTORS = 0x11, HEADER_SIZE + 16;
            }
            /// SP: set a semaphore.
            sp::SemSet on Engine::Sp => {
                /// [`super::Op::SemSet`].
                SEM_SET = 0x12, HEADER_SIZE + 8;
            }
            /// SP: write a custom notification record on this engine's ring.
            sp::Notify on Engine::Sp => {
                /// [`super::Op::Notify`].
                NOTIFY = 0x13, HEADER_SIZE + 8;
            }
            /// SP: cross-core barrier: add 1 to a device-wide semaphore, then wait until it reaches `count`
            /// (the number of cores of the execution).
            sp::Barrier on Engine::Sp => {
                /// [`super::Op::Barrier`].
                BARRIER = 0x14, HEADER_SIZE + 8;
            }
            /// PE: `C (+)= alpha · op(A) · op(B)`, batched over the two leading dimensions, then the
            /// optional [`Epilogue`] (bias, residual, activation) on each output tile.
            pe::MatMul on Engine::Pe => {
                /// [`super::Op::MatMul`].
                MATMUL = 0x20, HEADER_SIZE + 3 * AP_SIZE + 8;
                /// [`super::Op::MatMul`] with an [`super::Epilogue`] (NCM 1.1).
                MATMUL_EPI = 0x22, HEADER_SIZE + 5 * AP_SIZE + 24;
            }
            /// PE: integer matrix product, `C = (A − a_zero)·(B − b_zero)` in i32 (wrapping), batched over
            /// the two leading dimensions (ONNX MatMulInteger); with `scale`, the sums are converted to f32
            /// and multiplied by it (ONNX Runtime's `MatMulIntegerToFloat`: a dynamically quantized layer's
            /// `Cast` and `Mul` fused, [`opcode::MATMUL_INTEGER_SCALED`], NCM 1.7).
            pe::MatMulInteger on Engine::Pe => {
                /// [`super::Op::MatMulInteger`].
                MATMUL_INTEGER = 0x23, HEADER_SIZE + 5 * AP_SIZE + 8;
                /// [`super::Op::MatMulInteger`] with a `scale` (f32 results, NCM 1.7).
                MATMUL_INTEGER_SCALED = 0x25, HEADER_SIZE + 6 * AP_SIZE + 8;
            }
            /// PE: `C = A·Wᵀ` with `W` block-quantized (NCM 1.11: ggml's Q4_0, Q4_1, Q8_0 blocks
            /// as a GGUF file stores them), A rounded to 8-bit blocks on the fly, integer
            /// products per block accumulated in f32.
            pe::MatMulBlockQuant on Engine::Pe => {
                /// [`super::Op::MatMulBlockQuant`] (NCM 1.11).
                MATMUL_BLOCK_QUANT = 0x26, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// PE: attention of each query over its sequence's KV-cache slot, positions up to its
            /// own (NCM 1.12): scores, softmax and the weighted sum of values in one instruction,
            /// grouped-query heads sharing their key/value rows — a decoder LLM's attention reading
            /// only the rows its sequences hold.
            attention::CachedAttention on Engine::Pe => {
                /// [`super::Op::CachedAttention`] (NCM 1.12).
                CACHED_ATTENTION = 0x27, HEADER_SIZE + 6 * AP_SIZE + 16;
            }
            /// PE: 2-D convolution, `out[n,o,y,x] = bias[o] + Σ in[n,c,·,·]·w[o,c,·,·]`.
            pe::Conv on Engine::Pe => {
                /// [`super::Op::Conv`].
                CONV = 0x21, HEADER_SIZE + 5 * AP_SIZE + 48;
                /// [`super::Op::Conv`] with an activation (NCM 1.5).
                CONV_ACT = 0x24, HEADER_SIZE + 5 * AP_SIZE + 64;
            }
            /// ACT: `y = f(x · scale + bias)`.
            act::Activation on Engine::Act => {
                /// [`super::Op::Activation`].
                ACTIVATION = 0x30, HEADER_SIZE + 3 * AP_SIZE + 24;
            }
            /// DVE: `out = a ∘ b` elementwise (broadcast by stride 0).
            dve::Binary on Engine::Dve => {
                /// [`super::Op::Binary`].
                BINARY = 0x40, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// DVE: `out = a ∘ scalar` (or `scalar ∘ a` when `reverse`).
            dve::TensorScalar on Engine::Dve => {
                /// [`super::Op::TensorScalar`].
                TENSOR_SCALAR = 0x41, HEADER_SIZE + 2 * AP_SIZE + 16;
            }
            /// DVE/POOL: strided copy, converting the element type if the two differ (transpose, slice,
            /// concat, pad, expand, cast).
            dve::Copy on Engine::Dve | Engine::Pool => {
                /// [`super::Op::Copy`].
                COPY = 0x42, HEADER_SIZE + 2 * AP_SIZE;
            }
            /// DVE: `out = cond ? a : b`.
            dve::Select on Engine::Dve => {
                /// [`super::Op::Select`].
                SELECT = 0x43, HEADER_SIZE + 4 * AP_SIZE;
            }
            /// DVE/POOL: fill with one element value (its little-endian bits, zero-extended).
            dve::Fill on Engine::Dve | Engine::Pool => {
                /// [`super::Op::Fill`].
                FILL = 0x44, HEADER_SIZE + AP_SIZE + 8;
            }
            /// POOL: reduce over the dimensions set in `axes` (bit i = dimension i); the output has size 1
            /// there.
            pool::Reduce on Engine::Pool => {
                /// [`super::Op::Reduce`].
                REDUCE = 0x50, HEADER_SIZE + 2 * AP_SIZE + 8;
            }
            /// POOL: max or average pooling windows over `[N, C, H, W]`.
            pool::Pool on Engine::Pool => {
                /// [`super::Op::Pool`].
                POOL = 0x51, HEADER_SIZE + 2 * AP_SIZE + 48;
            }
            /// POOL: softmax (or log-softmax) over dimension 3, max-subtracted, fp32 accumulation.
            pool::Softmax on Engine::Pool => {
                /// [`super::Op::Softmax`].
                SOFTMAX = 0x52, HEADER_SIZE + 2 * AP_SIZE + 8;
            }
            /// POOL: layer normalization over dimension 3: `(x − mean)/√(var + eps) · gamma + beta`.
            pool::LayerNorm on Engine::Pool => {
                /// [`super::Op::LayerNorm`].
                LAYER_NORM = 0x53, HEADER_SIZE + 4 * AP_SIZE + 8;
            }
            /// POOL: RMS normalization over dimension 3: `x / √(mean(x²) + eps) · gamma` (NCM 1.9).
            pool::RmsNorm on Engine::Pool => {
                /// [`super::Op::RmsNorm`] (NCM 1.9).
                RMS_NORM = 0x5F, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// POOL: ONNX `DynamicQuantizeLinear` in one instruction (NCM 1.8): the range of `input`
            /// widened to include 0 gives `scale = (max − min)/255` (1 when the range is empty, as ONNX
            /// Runtime) and `zero_point = round(clamp(−min/scale, 0, 255))`, then `output =
            /// clamp(round(input/scale) + zero_point, 0, 255)` (rounding ties to even; a NaN element gives
            /// 0, NaN elements do not widen the range).
            pool::DynamicQuantize on Engine::Pool => {
                /// [`super::Op::DynamicQuantize`] (NCM 1.8).
                DYNAMIC_QUANTIZE = 0x5E, HEADER_SIZE + 4 * AP_SIZE + 8;
            }
            /// POOL: resize every dimension whose sizes differ.
            pool::Resize on Engine::Pool => {
                /// [`super::Op::Resize`].
                RESIZE = 0x54, HEADER_SIZE + 2 * AP_SIZE + 24;
            }
            /// POOL: indexed copy along dimension 2: `out[a,b,i,d] = data[a,b,idx[i],d]`.
            gather::Gather on Engine::Pool => {
                /// [`super::Op::Gather`].
                GATHER = 0x55, HEADER_SIZE + 3 * AP_SIZE;
            }
            /// POOL: gather along dimension `axis`, one index per output element: `out[p] = data[p with
            /// p[axis] = idx[p]]` (ONNX GatherElements; with a broadcast indices operand it gathers whole
            /// rows).
            gather::GatherElements on Engine::Pool => {
                /// [`super::Op::GatherElements`].
                GATHER_ELEMENTS = 0x56, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// POOL: scatter along dimension `axis`, in element order: `out[p with p[axis] = idx[p]] =
            /// out[…] ∘ updates[p]` for every position `p` of `updates` (ONNX ScatterElements / ScatterND
            /// with a broadcast indices operand).
            gather::ScatterElements on Engine::Pool => {
                /// [`super::Op::ScatterElements`].
                SCATTER_ELEMENTS = 0x57, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// POOL: the `K` largest (or smallest) elements of every row along dimension 3, in order (equal
            /// elements: the lower index first; NaN above every number), and their indices (ONNX TopK).
            gather::TopK on Engine::Pool => {
                /// [`super::Op::TopK`].
                TOP_K = 0x58, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// POOL: one token per row of logits (NCM 1.10), the sampling of a decoder LLM on the
            /// device: greedy (temperature ≤ 0) or softmax(logits / temperature) restricted to the
            /// `top_k` most likely tokens (0: all) and to the smallest set of them whose probability
            /// reaches `top_p`, drawn with a counter-based generator of `(seed, step)`; and the
            /// chosen token's log-probability under the unmodified logits.
            gather::Sample on Engine::Pool => {
                /// [`super::Op::Sample`] (NCM 1.10).
                SAMPLE = 0x60, HEADER_SIZE + 8 * AP_SIZE + 8;
            }
            /// POOL: rows of a block-quantized table widened to f32 (NCM 1.11): an embedding
            /// lookup whose table stays in its `BlockFormat`.
            gather::GatherBlockQuant on Engine::Pool => {
                /// [`super::Op::GatherBlockQuant`] (NCM 1.11).
                GATHER_BLOCK_QUANT = 0x61, HEADER_SIZE + 3 * AP_SIZE + 8;
            }
            /// POOL: region-of-interest align (ONNX RoiAlign; NCM 1.4): for each region `r` (its `rois` row
            /// `[x1, y1, x2, y2]` times `spatial_scale`, minus ½ with [`roi_flags::HALF_PIXEL`]) and each
            /// output cell, the bilinear samples of a `grid × grid` lattice of the cell (`sampling_ratio`,
            /// or `ceil(cell size)` when 0, capped at [`ROI_MAX_GRID`]) from image `batch_indices[r]` of
            /// `input`, averaged (or their maximum, [`roi_flags::MAX`], of the weighted corner values as
            /// ONNX Runtime takes it).
            gather::RoiAlign on Engine::Pool => {
                /// [`super::Op::RoiAlign`] (NCM 1.4).
                ROI_ALIGN = 0x5C, HEADER_SIZE + 4 * AP_SIZE + 16;
            }
            /// POOL: the columns of a deformable convolution (ONNX DeformConv; NCM 1.4), for a MatMul with
            /// the weights to finish: `cols[n, (c·kH + i)·kW + j, y, x]` is `mask[n, (g·kH + i)·kW + j, y,
            /// x]` times the bilinear sample of `input[n, c]` (zero outside the image) at `(y·sH − padT +
            /// i·dH + Δh, x·sW − padL + j·dW + Δw)`, where `g = c / (C / offset_groups)` and `(Δh, Δw)` is
            /// `offset[n, ((g·kH + i)·kW + j)·2 + {0, 1}, y, x]`.
            gather::DeformIm2col on Engine::Pool => {
                /// [`super::Op::DeformIm2col`] (NCM 1.4).
                DEFORM_IM2COL = 0x5D, HEADER_SIZE + 4 * AP_SIZE + 48;
            }
            /// POOL: the coordinates of the nonzero elements of `input` (ONNX NonZero; NCM 1.4), an output
            /// whose extent depends on the data.
            dynamic::NonZero on Engine::Pool => {
                /// [`super::Op::NonZero`] (NCM 1.4).
                NON_ZERO = 0x59, HEADER_SIZE + 3 * AP_SIZE;
            }
            /// POOL: the distinct slices `input[o, j, i]` (`j` along dimension 2, each slice the `(o, i)`
            /// elements in order) of `input` (ONNX Unique; NCM 1.4).
            dynamic::Unique on Engine::Pool => {
                /// [`super::Op::Unique`] (NCM 1.4).
                UNIQUE = 0x5A, HEADER_SIZE + 6 * AP_SIZE + 40;
            }
            /// POOL: greedy non-maximum suppression per batch and class (ONNX NonMaxSuppression; NCM 1.4).
            dynamic::NonMaxSuppression on Engine::Pool => {
                /// [`super::Op::NonMaxSuppression`] (NCM 1.4).
                NON_MAX_SUPPRESSION = 0x5B, HEADER_SIZE + 7 * AP_SIZE + 16;
            }
        }
    };
}

macro_rules! define_ops {
    (@opcode $x:ident $code:ident) => {
        opcode::$code
    };
    (@opcode $x:ident $($code:ident)+) => {
        $x.opcode()
    };
    (() $(
        $(#[$doc:meta])*
        $family:ident::$variant:ident on $engines:pat => {
            $( $(#[$cdoc:meta])* $code:ident = $byte:literal, $size:expr; )+
        }
    )+) => {
        $( pub use $family::$variant; )+

        /// An operation: one variant per entry of the
        /// [`instruction_table!`](crate::instruction_table), holding the op's fields.
        #[derive(Clone, Copy, Debug, PartialEq)]
        pub enum Op {
            $( $(#[$doc])* $variant($family::$variant), )+
        }

        /// Opcode bytes.
        pub mod opcode {
            $( $( $(#[$cdoc])* pub const $code: u8 = $byte; )+ )+
        }

        /// Mnemonic and encoded size of an opcode, `None` if unknown.
        pub const fn opcode_info(op: u8) -> Option<(&'static str, usize)> {
            Some(match op {
                $( $( opcode::$code => (stringify!($variant), $size), )+ )+
                _ => return None,
            })
        }

        impl Op {
            /// The opcode byte.
            pub const fn opcode(&self) -> u8 {
                match self {
                    $( Op::$variant(_x) => define_ops!(@opcode _x $($code)+), )+
                }
            }

            /// Mnemonic.
            pub const fn name(&self) -> &'static str {
                match self {
                    $( Op::$variant(_) => stringify!($variant), )+
                }
            }

            /// Whether the opcode may run on `engine`.
            pub const fn runs_on(&self, engine: Engine) -> bool {
                match self {
                    $( Op::$variant(_) => matches!(engine, $engines), )+
                }
            }

            /// Appends the fields after the header.
            pub(crate) fn encode_fields(&self, w: &mut W<'_>) {
                match self {
                    $( Op::$variant(x) => x.encode(w), )+
                }
            }

            /// Decodes the fields after the header of the instruction `r.b`.
            pub(crate) fn decode_fields(r: &mut R<'_>) -> Result<Op, DecodeError> {
                match r.b[0] {
                    $( $(opcode::$code)|+ => $family::$variant::decode(r).map(Op::$variant), )+
                    other => Err(DecodeError::field("header.opcode", Reason::UnknownOpcode(other))),
                }
            }

            /// [`Unit::operands`] of the op.
            pub(crate) fn visit_operands<'a>(
                &'a self,
                f: &mut impl FnMut(usize, &'static str, Role, &'a AccessPattern),
            ) {
                match self {
                    $( Op::$variant(x) => x.operands(f), )+
                }
            }

            /// [`Unit::operands_mut`] of the op.
            pub(crate) fn visit_operands_mut(
                &mut self,
                f: &mut impl FnMut(usize, &'static str, Role, &mut AccessPattern),
            ) {
                match self {
                    $( Op::$variant(x) => x.operands_mut(f), )+
                }
            }
        }
    };
}

instruction_table!(define_ops);
