//! The instruction *stream*: the header every instruction carries (synchronization, opcode,
//! length), its encoding and decoding around the op's own ([`crate::op`]), operands and
//! their roles, and the address fields relocations patch.

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::{R, W};
use crate::error::{DecodeError, Reason};
use crate::op::{Op, opcode_info};
use nrt_hal::{FIRST_ENGINE_SEMAPHORE, SEMAPHORES_PER_CORE};

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

    pub(crate) fn validate(self, field: &'static str) -> Result<(), DecodeError> {
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
        self.visit_operands(&mut visit)
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
        self.visit_operands_mut(&mut visit)
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
        self.op.encode_fields(&mut w);
        debug_assert_eq!(out.len() - start, len, "{} encoding size", self.op.name());
    }
}

//===------------------------------------------------------------------------------------===//
// Decoding and validation
//===------------------------------------------------------------------------------------===//

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
        let op = Op::decode_fields(&mut r)?;
        bound_repetition(&op)?;
        Ok(Instruction { sync, op })
    }

    /// The address fields of the instruction, in encoding order, with the byte extent each
    /// operand touches: what relocations may patch and what the loader bounds-checks. Every
    /// access-pattern field comes from [`Op::operands`]; the DMA descriptor table is the one
    /// address that is not an access pattern.
    pub fn address_fields(&self, mut f: impl FnMut(AddressField)) {
        let h = HEADER_SIZE;
        if let Op::DmaDescriptors(crate::op::sp::DmaDescriptors { count, .. }) = &self.op {
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
