//! Container errors: each names the file offset, the field, and what was wrong.

use core::fmt;

/// What was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelErrorKind {
    /// The file ends before the field.
    Truncated {
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left.
        available: u64,
    },
    /// The first four bytes are not `NCMF`.
    BadMagic([u8; 4]),
    /// A major version we do not read, or a newer minor.
    UnsupportedVersion {
        /// Major.
        major: u16,
        /// Minor.
        minor: u16,
    },
    /// The header's file size is not the file's size.
    SizeMismatch {
        /// Header value.
        header: u64,
        /// Actual size.
        actual: u64,
    },
    /// The CRC-32 does not match.
    ChecksumMismatch {
        /// Stored.
        stored: u32,
        /// Computed.
        computed: u32,
    },
    /// A section outside the file, misaligned, overlapping another, duplicated, or unknown.
    BadSection(&'static str),
    /// A required section is missing.
    MissingSection(&'static str),
    /// A name longer than 255 bytes.
    NameTooLong(u64),
    /// A name that is not UTF-8, empty, or contains NUL.
    BadName,
    /// Two I/O tensors with the same name.
    DuplicateName(String),
    /// An enumerated byte out of range.
    BadEnum(u64),
    /// An id (mem_ref, core, I/O index) out of range.
    OutOfRangeId {
        /// The id.
        id: u64,
        /// How many exist.
        limit: u64,
    },
    /// A count or size out of range.
    OutOfRange(u64),
    /// An alignment that is not a power of two ≤ 64 KiB.
    BadAlignment(u64),
    /// A placement not a multiple of the entry's alignment.
    Misaligned {
        /// The placement.
        offset: u64,
        /// The alignment.
        align: u64,
    },
    /// Two placements in the same region overlap.
    Overlap {
        /// The other entry.
        other: u32,
    },
    /// A relocation whose 8-byte field lies past the end of its block.
    RelocationPastBlock {
        /// Patch offset.
        patch_offset: u32,
        /// Block size.
        block_size: u64,
    },
    /// A relocation that does not land on an address field of an instruction, or an address
    /// field without exactly one relocation.
    RelocationMismatch(u32),
    /// An operand that reaches outside the plan entry it is relocated against.
    OperandOutOfBounds {
        /// Index of the instruction in its block.
        instruction: u32,
        /// Its opcode (the message shows its name: `Fill`, `DmaCopy`, …).
        opcode: u8,
        /// The operand (`"out"`, `"src"`, …).
        operand: &'static str,
        /// First byte the operand touches, relative to the entry (exact: an extent can exceed
        /// the `i64` range).
        lo: i128,
        /// One past the last byte.
        hi: i128,
        /// Entry size.
        size: u64,
    },
    /// An I/O tensor whose byte size overflows or exceeds [`crate::MAX_TENSOR_BYTES`].
    TensorTooLarge {
        /// Its shape.
        shape: Vec<u32>,
        /// Bytes per element.
        elem_size: u64,
    },
    /// An instruction block that does not decode.
    Instruction(nrt_isa::DecodeError),
    /// Anything else inconsistent between sections.
    Inconsistent(&'static str),
}

/// A problem in a compiled-model file: where, which field, what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelError {
    /// File offset of the offending field.
    pub offset: u64,
    /// The field (`"header.magic"`, `"io[2].name"`, `"blocks[3].relocs[0].mem_ref"`, …).
    pub field: String,
    /// What was wrong.
    pub kind: ModelErrorKind,
}

impl ModelError {
    pub(crate) fn new(offset: u64, field: impl Into<String>, kind: ModelErrorKind) -> ModelError {
        ModelError {
            offset,
            field: field.into(),
            kind,
        }
    }

    /// Whether the problem is a version the runtime does not support
    /// (`NRT_UNSUPPORTED_NEFF_VERSION` rather than `NRT_INVALID`).
    pub fn is_unsupported_version(&self) -> bool {
        matches!(self.kind, ModelErrorKind::UnsupportedVersion { .. })
    }
}

/// Whether a file's first four bytes start an ONNX `ModelProto`: its `ir_version` (field 1,
/// a small varint) and then a length-delimited field 2..=8 (`producer_name`, `graph`,
/// `opset_import`, ...), as every ONNX exporter writes them.
fn looks_like_onnx(m: &[u8; 4]) -> bool {
    m[0] == 0x08 && (1..=15).contains(&m[1]) && (0x12..=0x42).contains(&m[2]) && m[2] & 7 == 2
}

impl fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ModelErrorKind::*;
        match self {
            Truncated { needed, available } => {
                write!(f, "file truncated: {needed} bytes needed, {available} left")
            }
            BadMagic(m) if looks_like_onnx(m) => write!(
                f,
                "this is ONNX, not a compiled model (NCM): compile it with `nrt compile` or pass it to `nrt run`"
            ),
            BadMagic([b'G', b'G', b'U', b'F']) => write!(
                f,
                "this is a GGUF file, not a compiled model (NCM): build it with `nrt llm build`"
            ),
            BadMagic(m) => write!(f, "bad magic {m:02x?}, expected \"NCMF\""),
            UnsupportedVersion { major, minor } => write!(
                f,
                "unsupported version {major}.{minor} (this runtime reads {}.0..={}.{})",
                crate::VERSION_MAJOR,
                crate::VERSION_MAJOR,
                crate::VERSION_MINOR
            ),
            SizeMismatch { header, actual } => {
                write!(f, "header says {header} bytes, file has {actual}")
            }
            ChecksumMismatch { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )
            }
            BadSection(why) => write!(f, "bad section: {why}"),
            MissingSection(s) => write!(f, "missing section {s}"),
            NameTooLong(n) => write!(f, "name of {n} bytes exceeds 255"),
            BadName => write!(f, "name is empty, not UTF-8, or contains NUL"),
            DuplicateName(n) => write!(f, "duplicate tensor name {n:?}"),
            BadEnum(v) => write!(f, "value {v} is out of range"),
            OutOfRangeId { id, limit } => write!(f, "id {id} out of range (there are {limit})"),
            OutOfRange(v) => write!(f, "value {v} is out of range"),
            BadAlignment(a) => write!(f, "alignment {a} is not a power of two <= 65536"),
            Misaligned { offset, align } => {
                write!(
                    f,
                    "placement {offset:#x} is not a multiple of its alignment {align}"
                )
            }
            Overlap { other } => write!(f, "placement overlaps plan entry {other}"),
            RelocationPastBlock {
                patch_offset,
                block_size,
            } => write!(
                f,
                "relocation at byte {patch_offset} runs past the {block_size}-byte block"
            ),
            RelocationMismatch(p) => write!(
                f,
                "relocation/address-field mismatch at block byte {p} (every address field needs exactly one relocation)"
            ),
            OperandOutOfBounds {
                instruction,
                opcode,
                operand,
                lo,
                hi,
                size,
            } => write!(
                f,
                "instruction {instruction} ({}): operand `{operand}` touches bytes [{lo}, {hi}) \
                 of a {size}-byte plan entry",
                nrt_isa::opcode_info(*opcode).map_or("?", |i| i.0)
            ),
            TensorTooLarge { shape, elem_size } => write!(
                f,
                "tensor of shape {shape:?} with {elem_size}-byte elements is larger than {} bytes \
                 (or its size overflows)",
                crate::MAX_TENSOR_BYTES
            ),
            Instruction(e) => write!(f, "{e}"),
            Inconsistent(why) => write!(f, "{why}"),
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid model at byte {} (`{}`): {}",
            self.offset, self.field, self.kind
        )
    }
}

impl std::error::Error for ModelError {}

/// [`crate::CompiledModel::try_encode`]: the host cannot give the memory of the NCM image
/// (its size is the model's constants, which came from a file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageTooLarge {
    /// Bytes the image needs.
    pub bytes: usize,
}

impl fmt::Display for ImageTooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the compiled model's image ({} bytes) does not fit in this process's memory",
            self.bytes
        )
    }
}

impl std::error::Error for ImageTooLarge {}
