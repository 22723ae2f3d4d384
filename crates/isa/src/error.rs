//! Decode errors: each names the instruction index, its byte offset in the block, the field
//! and what was wrong with it.

use core::fmt;

/// What was wrong with a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The block ended inside an instruction.
    Truncated {
        /// Bytes the instruction needs.
        needed: usize,
        /// Bytes left in the block.
        available: usize,
    },
    /// Unknown opcode.
    UnknownOpcode(u8),
    /// The length field disagrees with the opcode's encoded size.
    BadLength {
        /// The opcode's size.
        expected: usize,
        /// The length field.
        found: usize,
    },
    /// Flag bits that the opcode does not define.
    UnknownFlags(u32),
    /// A reserved field is not zero.
    ReservedNonZero,
    /// Not a valid element-type code.
    BadDType(u8),
    /// The element type is not supported by this operation.
    UnsupportedDType(nrt_hal::DType),
    /// An enumerated value out of range (function, operation, mode).
    BadEnum(u32),
    /// A semaphore index that instructions may not use.
    BadSemaphore(u16),
    /// The opcode may not run on this engine.
    WrongEngine(nrt_hal::Engine),
    /// Two shapes that must agree do not (dimension index, the two sizes).
    ShapeMismatch {
        /// Dimension of the access pattern (0..4).
        dim: usize,
        /// Size expected from the other operand.
        expected: u32,
        /// Size found.
        found: u32,
    },
    /// A value out of its valid range.
    OutOfRange(u64),
    /// The access pattern covers more elements than any device could hold.
    TooManyElements,
    /// A written access pattern whose strides let two of its elements land on one address
    /// (a dimension of size > 1 with stride 0, or interleaving strides).
    OverlappingWrite,
    /// A read access pattern that repeats elements (stride 0, or overlapping strides) over
    /// more elements than [`crate::MAX_REPEATED_READ_ELEMENTS`] and than the instruction's
    /// largest output: work with no memory behind it.
    RepeatedReadTooLarge {
        /// Elements the view addresses.
        elements: u64,
        /// The most it may address.
        limit: u64,
    },
    /// A block does not end with an end-of-block instruction.
    MissingEnd,
    /// Bytes after the end-of-block instruction.
    TrailingBytes(usize),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, {available} left")
            }
            Reason::UnknownOpcode(o) => write!(f, "unknown opcode {o:#04x}"),
            Reason::BadLength { expected, found } => {
                write!(f, "length {found} but the opcode is {expected} bytes")
            }
            Reason::UnknownFlags(b) => write!(f, "undefined flag bits {b:#x}"),
            Reason::ReservedNonZero => write!(f, "reserved bytes are not zero"),
            Reason::BadDType(c) => write!(f, "{c:#x} is not an element type"),
            Reason::UnsupportedDType(d) => write!(f, "element type {d} is not supported here"),
            Reason::BadEnum(v) => write!(f, "value {v} is out of range"),
            Reason::BadSemaphore(s) => {
                write!(f, "semaphore {s:#x} may not be used by instructions")
            }
            Reason::WrongEngine(e) => write!(f, "opcode cannot run on the {e} engine"),
            Reason::ShapeMismatch {
                dim,
                expected,
                found,
            } => {
                write!(f, "dimension {dim} is {found}, expected {expected}")
            }
            Reason::OutOfRange(v) => write!(f, "value {v} is out of range"),
            Reason::TooManyElements => write!(f, "more than 2^40 elements"),
            Reason::OverlappingWrite => write!(
                f,
                "written view repeats elements (a stride of 0, or strides that overlap): \
                 two of its elements would land on one address"
            ),
            Reason::RepeatedReadTooLarge { elements, limit } => write!(
                f,
                "view repeats elements (a stride of 0, or strides that overlap) over \
                 {elements} elements, more than {limit} (the larger of 2^32 and the \
                 instruction's largest output)"
            ),
            Reason::MissingEnd => write!(f, "block does not end with an end-of-block instruction"),
            Reason::TrailingBytes(n) => write!(f, "{n} bytes after the end-of-block instruction"),
        }
    }
}

/// An instruction that failed to decode or validate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// Index of the instruction in its block (filled in by the block decoder).
    pub index: usize,
    /// Byte offset of the instruction in its block (filled in by the block decoder).
    pub block_offset: usize,
    /// Byte offset of the bad field inside the instruction.
    pub field_offset: usize,
    /// Opcode mnemonic, when the opcode was known.
    pub opcode: Option<&'static str>,
    /// The field (`"b.shape"`, `"header.length"`, …).
    pub field: &'static str,
    /// What was wrong.
    pub reason: Reason,
}

impl DecodeError {
    /// An error about `field` (offsets and index filled in by the caller).
    pub fn field_public(field: &'static str, reason: Reason) -> DecodeError {
        Self::field(field, reason)
    }

    pub(crate) fn field(field: &'static str, reason: Reason) -> DecodeError {
        DecodeError {
            index: 0,
            block_offset: 0,
            field_offset: 0,
            opcode: None,
            field,
            reason,
        }
    }

    pub(crate) fn at(mut self, field_offset: usize) -> DecodeError {
        self.field_offset = field_offset;
        self
    }

    pub(crate) fn shifted(mut self, by: usize) -> DecodeError {
        self.field_offset += by;
        self
    }

    pub(crate) fn in_op(mut self, op: &'static str, base: usize) -> DecodeError {
        self.opcode = Some(op);
        self.field_offset += base;
        self
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instruction {} (byte {}", self.index, self.block_offset)?;
        if let Some(op) = self.opcode {
            write!(f, ", {op}")?;
        }
        write!(
            f,
            "): field `{}` at +{}: {}",
            self.field, self.field_offset, self.reason
        )
    }
}

impl std::error::Error for DecodeError {}
