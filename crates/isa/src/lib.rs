//! # nrt-isa — the instruction set of the software NeuronCore
//!
//! What the engines of a core execute, as a compact little-endian binary encoding that the
//! compiler writes into a compiled model's instruction blocks and the device decodes when it
//! (re)loads a model's configuration.
//!
//! - Every instruction starts with a 16-byte header ([`HEADER_SIZE`]): opcode, length, and an
//!   optional semaphore **wait** (`sem >= value` before it starts) and **signal** (`sem +=
//!   value` when it ends). That is how the five engines of a core, each running its own block,
//!   order themselves: the compiler inserts the waits from the data dependencies.
//! - Operands are [`AccessPattern`]s: a device address, an element type, a 4-D shape and
//!   element strides (stride 0 broadcasts). Address fields are what the container's
//!   relocations patch at load ([`Instruction::address_fields`]).
//! - Decoding ([`Instruction::decode`], [`BlockDecoder`]) validates every field — opcode,
//!   length, flags, reserved bytes, enums, semaphore ranges, element types, shape agreement,
//!   the engine the block belongs to — and names the instruction index, byte offset and field
//!   of the first problem. It never panics and never allocates.
//!
//! | engine | operations |
//! |---|---|
//! | PE | [`Op::MatMul`] (accumulate, transpose, batched, fused [`Epilogue`]: bias, residual, activation), [`Op::MatMulInteger`] (u8/i8 → i32), [`Op::Conv`] (direct or im2col) |
//! | ACT | [`Op::Activation`]: `y = f(x·scale + bias)` for every [`ActFunc`] |
//! | DVE | [`Op::Binary`], [`Op::TensorScalar`], [`Op::Select`], [`Op::Copy`] (cast, transpose), [`Op::Fill`] |
//! | POOL | [`Op::Reduce`], [`Op::Pool`], [`Op::Softmax`], [`Op::DynamicQuantize`], [`Op::LayerNorm`], [`Op::RmsNorm`], [`Op::Resize`], [`Op::Gather`], [`Op::GatherElements`], [`Op::ScatterElements`], [`Op::TopK`], [`Op::NonZero`], [`Op::Unique`], [`Op::NonMaxSuppression`] (data-dependent extents), [`Op::RoiAlign`], [`Op::DeformIm2col`], [`Op::Copy`], [`Op::Fill`] |
//! | SP | [`Op::DmaCopy`], [`Op::DmaDescriptors`], [`Op::SemSet`], [`Op::Notify`], [`Op::Barrier`] |
//! | all | [`Op::End`], [`Op::Nop`], [`Op::Guard`] (predication: the instructions after it run only while its condition holds) |

pub mod ap;
mod codec;
pub mod error;
pub mod instr;
pub mod op;

pub use ap::{
    AP_SIZE, AccessPattern, ByteRows, MAX_DIMS, MAX_ELEMENTS, MAX_REPEATED_READ_ELEMENTS,
    dense_strides,
};
pub use error::{DecodeError, Reason};
pub use instr::{
    AddressField, GLOBAL_SEMAPHORE_BIT, GLOBAL_SEMAPHORES, HEADER_SIZE, Instruction, Operand,
    OperandMut, Role, SemRef, Sync,
};
pub use op::{
    ActFunc, BinaryOp, CoordMode, Epilogue, NearestMode, Op, PoolOp, ROI_MAX_GRID, ReduceOp,
    ResizeMode, ScatterReduce, ShapeTemplate, Window, matmul_flags, nms_flags, opcode, opcode_info,
    qmatmul_layout, roi_flags,
};

use nrt_hal::Engine;

/// Decodes the instructions of one engine's block, in order, without allocating.
///
/// Yields each instruction with its byte offset; the last one is [`Op::End`]. Stops after the
/// first error, which names the instruction index and byte offset. A block must end with
/// `End` exactly at its last byte.
#[derive(Debug, Clone)]
pub struct BlockDecoder<'a> {
    bytes: &'a [u8],
    engine: Engine,
    pos: usize,
    index: usize,
    done: bool,
}

impl<'a> BlockDecoder<'a> {
    /// A decoder for `bytes`, the block of `engine`.
    pub fn new(bytes: &'a [u8], engine: Engine) -> Self {
        BlockDecoder {
            bytes,
            engine,
            pos: 0,
            index: 0,
            done: false,
        }
    }
}

impl Iterator for BlockDecoder<'_> {
    type Item = Result<(usize, Instruction), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let fail = |this: &mut Self, mut e: DecodeError| {
            this.done = true;
            e.index = this.index;
            e.block_offset = this.pos;
            Some(Err(e))
        };
        if self.pos == self.bytes.len() {
            return fail(self, DecodeError::field_public("block", Reason::MissingEnd));
        }
        match Instruction::decode(&self.bytes[self.pos..]) {
            Err(e) => fail(self, e),
            Ok((ins, len)) => {
                if !ins.op.runs_on(self.engine) {
                    let mut e = DecodeError::field_public(
                        "header.opcode",
                        Reason::WrongEngine(self.engine),
                    );
                    e.opcode = Some(ins.op.name());
                    return fail(self, e);
                }
                let at = self.pos;
                self.pos += len;
                self.index += 1;
                if matches!(ins.op, Op::End(_)) {
                    self.done = true;
                    if self.pos != self.bytes.len() {
                        let mut e = DecodeError::field_public(
                            "block",
                            Reason::TrailingBytes(self.bytes.len() - self.pos),
                        );
                        e.index = self.index;
                        e.block_offset = self.pos;
                        return Some(Err(e));
                    }
                }
                Some(Ok((at, ins)))
            }
        }
    }
}

/// Encodes a block: the instructions, then `End` if the last one is not already `End`.
pub fn encode_block(instructions: &[Instruction]) -> Vec<u8> {
    let mut out = Vec::new();
    for i in instructions {
        i.encode(&mut out);
    }
    if !matches!(
        instructions.last(),
        Some(Instruction {
            op: Op::End(op::End),
            ..
        })
    ) {
        Instruction::new(Op::End(op::End)).encode(&mut out);
    }
    out
}

/// Decodes a whole block into a vector (tools and the device's configuration reload).
pub fn decode_block(
    bytes: &[u8],
    engine: Engine,
) -> Result<Vec<(usize, Instruction)>, DecodeError> {
    BlockDecoder::new(bytes, engine).collect()
}
