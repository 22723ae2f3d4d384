//! # nrt-model — NCM, the compiled-model container
//!
//! NCM ("NeuronCore Model", files `*.ncm`) is what the compiler writes and `nrt_load` reads:
//! our own versioned format, not NEFF. It carries
//!
//! - the **I/O table**: name (≤ 255 bytes), usage, element type, shape, and the plan entry of
//!   each input and output; an output's index in the table is its *var_id*, which streaming
//!   notifications name;
//! - the **static memory plan**: one [`MemRef`] per variable region, with a kind modeled on the
//!   seed's `MR_SB` / `MR_VIRTUAL_TMP_BUF` / `MR_BUFFER` / `MR_REMOTE`, a size, an alignment
//!   and a placement; load gives each a fixed physical address;
//! - **instruction blocks**, one per core and engine, each with **relocations** (`mem_ref` id
//!   + offset) that load patches into the address fields: `addr = offset + mr.physical_address`;
//! - **constants** (weights);
//! - a **CRC-32** over the whole file.
//!
//! The byte layout is specified in `docs/ncm-format.md`. [`CompiledModel::decode`] is strict:
//! every length is checked against the bytes that remain before anything is allocated, and
//! every problem returns a distinct [`ModelError`] naming the offset and the field. It never
//! panics (a fuzz target holds it to that).

pub mod builder;
mod decode;
mod encode;
mod error;

pub use builder::{ModelBuilder, split_vaddr, vaddr};
pub use error::{ImageTooLarge, ModelError, ModelErrorKind};

use nrt_hal::{DType, Engine};

/// The four bytes every NCM file starts with.
pub const MAGIC: [u8; 4] = *b"NCMF";
/// Major version this crate reads and writes. A different major is rejected.
pub const VERSION_MAJOR: u16 = 1;
/// Minor version this crate writes; files with a higher minor are rejected too (they may use
/// fields we do not know). Every older minor still loads.
///
/// - 1.0: the first format.
/// - 1.1: `MatMul` may carry a fused epilogue (opcode `MATMUL_EPI`, `0x22`: bias, residual,
///   activation; see `nrt_isa::Epilogue`); element type `0x11` (f64); the `MatMulInteger`,
///   `GatherElements`, `ScatterElements` and `TopK` instructions (0x23, 0x56–0x58).
/// - 1.2: `ActFunc` 22–30 (tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh) and the
///   integer `BinaryOp`s 12–16 (bitwise and, or, xor, shift left, logical shift right).
/// - 1.3: `MatMul` flag `PACKED_B` (8): B is constant weights packed in column panels
///   (`nrt_isa::matmul_flags::PACKED_B`).
/// - 1.4: the `NonZero`, `Unique` and `NonMaxSuppression` instructions (0x59–0x5B), whose
///   outputs have a data-dependent extent: a static upper bound plus an i64 companion output
///   `<name>:shape` holding the actual shape (see `docs/ncm-format.md`); the `RoiAlign`
///   and `DeformIm2col` instructions (0x5C, 0x5D).
/// - 1.5: `Conv` may carry an activation (opcode `CONV_ACT`, `0x24`: the `Conv` fields, then
///   the function and its two parameters; see `nrt_isa::Op::Conv`).
/// - 1.6: the `Guard` instruction (opcode `0x03`, any engine): predication, what an `If` on
///   a run-time condition compiles to (see `nrt_isa::Op::Guard`).
/// - 1.7: `MatMulInteger` flag `PACKED_B` (constant weights packed by the compiler) and
///   opcode `MATMUL_INTEGER_SCALED` (`0x25`: the product converted to f32 and scaled);
///   `ActFunc` 31 (round, ties to even).
/// - 1.8: the `DynamicQuantize` instruction (POOL, `0x5E`): ONNX `DynamicQuantizeLinear`
///   (range, scale, zero point and the u8 tensor) in one instruction.
/// - 1.9: the `RmsNorm` instruction (POOL, `0x5F`): `x / √(mean(x²) + eps) · gamma` over
///   the last dimension, the normalization of decoder LLMs.
/// - 1.10: in-place state (an output's `in_place_of`: a decoder's KV cache) and the
///   `Sample` instruction (POOL, `0x60`): one token per row of logits on the device.
/// - 1.11: block-quantized weights: `MatMulBlockQuant` (PE, `0x26`) and `GatherBlockQuant`
///   (POOL, `0x61`) read ggml's `Q4_0` / `Q4_1` / `Q8_0` blocks as a GGUF stores them.
/// - 1.12: the `CachedAttention` instruction (PE, `0x27`): a decoder's attention over the
///   KV-cache slot of each sequence, up to each query's position, in one instruction.
/// - 1.13: `MatMul` flag `F32_A` (bit 4): a bf16 B multiplied with A's f32 values unrounded
///   (a bf16 weight input read through ONNX's `Cast`, as a decoder LLM's bf16 weights are).
pub const VERSION_MINOR: u16 = 13;
/// Size of the file header.
pub const HEADER_SIZE: usize = 64;
/// Size of one section-table entry.
pub const SECTION_ENTRY_SIZE: usize = 24;
/// Size of one plan record.
pub const MEM_REF_SIZE: usize = 32;
/// Size of one relocation record.
pub const RELOC_SIZE: usize = 16;
/// Longest tensor name, in bytes (`NRT_TENSOR_NAME_MAX` is 256 including the NUL).
pub const MAX_NAME_LEN: usize = 255;
/// Largest rank of an I/O tensor.
pub const MAX_RANK: usize = 8;
/// Most cores a model may span.
pub const MAX_CORES: u32 = 8;
/// Size of a core's state buffer (the region `Sb` entries are placed in).
pub const SB_SIZE: u64 = 24 << 20;
/// Largest plan entry, and so largest I/O tensor, in bytes (1 TiB: far above any device's
/// memory, small enough that offsets and sizes add without overflow).
pub const MAX_TENSOR_BYTES: u64 = 1 << 40;
/// Largest alignment a plan entry may ask for.
pub const MAX_ALIGN: u64 = 1 << 16;

/// Section kinds.
pub mod section {
    /// Model name and producer.
    pub const META: u32 = 1;
    /// I/O table.
    pub const IO: u32 = 2;
    /// Static memory plan.
    pub const PLAN: u32 = 3;
    /// Instruction blocks and their relocations.
    pub const BLOCKS: u32 = 4;
    /// Constant data.
    pub const CONSTANTS: u32 = 5;
}

/// Whether an I/O tensor is an input or an output (`nrt_tensor_usage_t`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Usage {
    /// `NRT_TENSOR_USAGE_INPUT`.
    Input = 0,
    /// `NRT_TENSOR_USAGE_OUTPUT`.
    Output = 1,
}

/// One input or output of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoTensor {
    /// Name (≤ 255 bytes, unique within the model).
    pub name: String,
    /// Input or output.
    pub usage: Usage,
    /// Element type.
    pub dtype: DType,
    /// Shape (≤ 8 dimensions; an empty shape is a scalar).
    pub shape: Vec<u32>,
    /// The plan entry (kind [`MemRefKind::Io`]) holding the tensor on the device.
    pub mem_ref: u32,
    /// For an output: the input it updates **in place** (its var_id), since NCM 1.10. The
    /// program writes only what changes (a KV cache's new rows), so the caller binds the
    /// same tensor to both; same element type and shape, at most one output per input.
    pub in_place_of: Option<u32>,
}

impl IoTensor {
    /// Number of elements, or `None` if the product of the dimensions overflows `u64`.
    pub fn checked_elements(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
    }

    /// Size in bytes, or `None` if it overflows `u64`.
    pub fn checked_byte_size(&self) -> Option<u64> {
        self.checked_elements()?
            .checked_mul(self.dtype.size() as u64)
    }

    /// Number of elements (saturating: a decoded model's tensors hold at most
    /// [`MAX_TENSOR_BYTES`], so this is exact for every model that validates).
    pub fn elements(&self) -> u64 {
        self.checked_elements().unwrap_or(u64::MAX)
    }

    /// Size in bytes (saturating, exact for every model that validates).
    pub fn byte_size(&self) -> u64 {
        self.checked_byte_size().unwrap_or(u64::MAX)
    }
}

/// Kinds of plan entries, modeled on the seed's `mem_ref` kinds.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemRefKind {
    /// `MR_SB`: a fixed placement (`offset`) in each core's state buffer.
    Sb = 0,
    /// `MR_VIRTUAL_TMP_BUF`: a fixed placement (`offset`) in the model's scratch arena,
    /// where the planner packed every intermediate.
    VirtualTmpBuf = 1,
    /// `MR_BUFFER`: constant data (weights), `size` bytes at `offset` in the constants.
    Buffer = 2,
    /// `MR_REMOTE`: memory of another device (collectives). Not supported by this runtime;
    /// load rejects it.
    Remote = 3,
    /// The device buffer of I/O tensor number `offset` (bind moves user tensors in and out
    /// of it; the sync path clones host tensors into it).
    Io = 4,
    /// The model's I/O descriptor table: one [`nrt_hal::TriggerPair`] per I/O tensor, in I/O
    /// table order, built at load and patched at bind.
    IoDescriptors = 5,
}

impl MemRefKind {
    /// Decodes the kind byte.
    pub const fn from_u8(v: u8) -> Option<MemRefKind> {
        Some(match v {
            0 => Self::Sb,
            1 => Self::VirtualTmpBuf,
            2 => Self::Buffer,
            3 => Self::Remote,
            4 => Self::Io,
            5 => Self::IoDescriptors,
            _ => return None,
        })
    }

    /// The seed's name of the kind.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sb => "MR_SB",
            Self::VirtualTmpBuf => "MR_VIRTUAL_TMP_BUF",
            Self::Buffer => "MR_BUFFER",
            Self::Remote => "MR_REMOTE",
            Self::Io => "MR_IO",
            Self::IoDescriptors => "MR_IO_DESCRIPTORS",
        }
    }
}

/// One entry of the static memory plan (`kbin_mem_ref`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemRef {
    /// Kind.
    pub kind: MemRefKind,
    /// Alignment in bytes (a power of two ≤ [`MAX_ALIGN`]).
    pub align: u64,
    /// Size in bytes.
    pub size: u64,
    /// Kind-specific placement: `Sb`/`VirtualTmpBuf`: offset in the region; `Buffer`: offset in
    /// the constants; `Io`: the I/O table index; otherwise 0.
    pub offset: u64,
}

/// A relocation: patch the 8-byte address field at `patch_offset` of the block with
/// `offset + physical_address(mem_ref)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// Byte offset of the address field in the block.
    pub patch_offset: u32,
    /// The plan entry.
    pub mem_ref: u32,
    /// Offset inside the entry.
    pub offset: u64,
}

/// One engine's instruction block on one core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Core index within the model (0..sg_count).
    pub core: u8,
    /// Engine.
    pub engine: Engine,
    /// Encoded instructions, address fields zero (relocations fill them).
    pub code: Vec<u8>,
    /// Relocations, one per address field.
    pub relocations: Vec<Relocation>,
}

/// A decoded (or to-be-encoded) compiled model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledModel {
    /// Model name.
    pub name: String,
    /// Who produced it (`"nrt-rs compiler 0.1.0"`).
    pub producer: String,
    /// Cores the model executes on in lockstep.
    pub sg_count: u32,
    /// Inputs and outputs, in var_id order.
    pub io: Vec<IoTensor>,
    /// The static memory plan.
    pub mem_refs: Vec<MemRef>,
    /// One block per (core, engine), sorted by core then engine.
    pub blocks: Vec<Block>,
    /// Constant data.
    pub constants: Vec<u8>,
}

impl CompiledModel {
    /// The block of `engine` on `core`.
    pub fn block(&self, core: u8, engine: Engine) -> Option<&Block> {
        self.blocks
            .iter()
            .find(|b| b.core == core && b.engine == engine)
    }

    /// Bytes of the scratch arena (the end of the last `VirtualTmpBuf` placement).
    pub fn scratch_bytes(&self) -> u64 {
        self.region_end(MemRefKind::VirtualTmpBuf)
    }

    /// Bytes of each core's state-buffer region in use.
    pub fn sb_bytes(&self) -> u64 {
        self.region_end(MemRefKind::Sb)
    }

    fn region_end(&self, kind: MemRefKind) -> u64 {
        self.mem_refs
            .iter()
            .filter(|m| m.kind == kind)
            .map(|m| m.offset + m.size)
            .max()
            .unwrap_or(0)
    }

    /// Inputs, in var_id order.
    pub fn inputs(&self) -> impl Iterator<Item = (u32, &IoTensor)> {
        self.io
            .iter()
            .enumerate()
            .filter(|(_, t)| t.usage == Usage::Input)
            .map(|(i, t)| (i as u32, t))
    }

    /// Outputs, in var_id order.
    pub fn outputs(&self) -> impl Iterator<Item = (u32, &IoTensor)> {
        self.io
            .iter()
            .enumerate()
            .filter(|(_, t)| t.usage == Usage::Output)
            .map(|(i, t)| (i as u32, t))
    }

    /// Reads and validates an NCM file image.
    pub fn decode(bytes: &[u8]) -> Result<CompiledModel, ModelError> {
        decode::decode(bytes)
    }

    /// The core count of an NCM file image from its header alone (checked in range, the
    /// rest of the file neither read nor validated): what a runtime is sized by before the
    /// model is loaded, without decoding its constants a first time.
    pub fn core_count(bytes: &[u8]) -> Result<u32, ModelError> {
        decode::core_count(bytes)
    }

    /// Writes the NCM file image (checksum included).
    ///
    /// The encoder writes what it is given; [`CompiledModel::decode`] of the result applies
    /// every validation, so a producer that builds an invalid model learns it on the round
    /// trip (the compiler does that before writing a file).
    ///
    /// For a model of a known, small size (a test's, a built-in one); a model whose size came
    /// from a file is written with [`CompiledModel::try_encode`].
    pub fn encode(&self) -> Vec<u8> {
        encode::encode(self).unwrap_or_else(|e| {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::array::<u8>(e.bytes).unwrap_or(std::alloc::Layout::new::<u8>()),
            )
        })
    }

    /// [`CompiledModel::encode`], failing instead of aborting when the host cannot give the
    /// image's memory (its size is the model's constants, which came from a file).
    pub fn try_encode(&self) -> Result<Vec<u8>, ImageTooLarge> {
        encode::encode(self)
    }
}
