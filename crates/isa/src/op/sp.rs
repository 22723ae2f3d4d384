//! The sequencer's (SP) instructions: DMA, semaphores, notifications, cross-core barriers.
//!
//! Each instruction: its fields, then its encoding, decoding (with every check the
//! decoder makes) and operands side by side. Opcodes, sizes and engines: the table in
//! [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role, SemRef};
use crate::op::*;
use nrt_hal::DevAddr;

/// SP: strided copy by the DMA engine (same shape and element type).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DmaCopy {
    /// Source.
    pub src: AccessPattern,
    /// Destination.
    pub dst: AccessPattern,
}

impl Unit for DmaCopy {
    fn encode(&self, w: &mut W<'_>) {
        let Self { src, dst } = self;
        w.ap(src);
        w.ap(dst);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let src = r.ap("src")?;
        let dst = r.ap("dst")?;
        if src.dtype != dst.dtype {
            return Err(
                DecodeError::field("dst.dtype", Reason::UnsupportedDType(dst.dtype))
                    .at(HEADER_SIZE + AP_SIZE + 8),
            );
        }
        same_shape("dst.shape", &src.shape, &dst).map_err(|e| {
            let o = e.field_offset;
            e.at(HEADER_SIZE + AP_SIZE + o)
        })?;
        Ok(Self { src, dst })
    }

    operands!(|f| Self { src, dst } => {
        f(0, "src", Role::Read, src);
        f(1, "dst", Role::Write, dst);
    });
}

/// SP: run `count` DMA transfers ([`nrt_hal::TriggerPair`]s) stored at `table` — how a
/// model moves its inputs and outputs through the descriptors bind patched.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DmaDescriptors {
    /// Address of the first descriptor pair.
    pub table: DevAddr,
    /// Number of pairs.
    pub count: u32,
}

impl Unit for DmaDescriptors {
    fn encode(&self, w: &mut W<'_>) {
        let Self { table, count } = self;
        w.u64(*table);
        w.u32(*count);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let table = r.u64();
        let at = r.pos;
        let count = r.u32();
        if count == 0 || count > 1 << 16 {
            return Err(DecodeError::field("count", Reason::OutOfRange(count as u64)).at(at));
        }
        r.zeros(4, "reserved")?;
        Ok(Self { table, count })
    }

    operands!(|_f| Self { .. } => {});
}

/// SP: set a semaphore.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SemSet {
    /// Semaphore.
    pub sem: SemRef,
    /// Value.
    pub value: u32,
}

impl Unit for SemSet {
    fn encode(&self, w: &mut W<'_>) {
        let Self { sem, value } = self;
        w.u16(sem.0);
        w.u16(0);
        w.u32(*value);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let sem = SemRef(r.u16());
        sem.validate("sem").map_err(|e| e.at(HEADER_SIZE))?;
        r.zeros(2, "reserved")?;
        Ok(Self {
            sem,
            value: r.u32(),
        })
    }

    operands!(|_f| Self { .. } => {});
}

/// SP: write a custom notification record on this engine's ring.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Notify {
    /// Custom subtype (6 = tensor).
    pub subtype: u8,
    /// Custom sub-id (7 = output done).
    pub sub_id: u16,
    /// Payload (the output's var_id).
    pub payload: u32,
}

impl Unit for Notify {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            subtype,
            sub_id,
            payload,
        } = self;
        w.u8(*subtype);
        w.u8(0);
        w.u16(*sub_id);
        w.u32(*payload);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let subtype = r.u8();
        r.zeros(1, "reserved")?;
        let sub_id = r.u16();
        Ok(Self {
            subtype,
            sub_id,
            payload: r.u32(),
        })
    }

    operands!(|_f| Self { .. } => {});
}

/// SP: cross-core barrier: add 1 to a device-wide semaphore, then wait until it reaches
/// `count` (the number of cores of the execution).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Barrier {
    /// Device-wide semaphore.
    pub sem: SemRef,
    /// Cores to wait for.
    pub count: u32,
}

impl Unit for Barrier {
    fn encode(&self, w: &mut W<'_>) {
        let Self { sem, count } = self;
        w.u16(sem.0);
        w.u16(0);
        w.u32(*count);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let sem = SemRef(r.u16());
        if !sem.is_global() {
            return Err(DecodeError::field("sem", Reason::BadSemaphore(sem.0)).at(HEADER_SIZE));
        }
        sem.validate("sem").map_err(|e| e.at(HEADER_SIZE))?;
        r.zeros(2, "reserved")?;
        let at = r.pos;
        let count = r.u32();
        if !(1..=8).contains(&count) {
            return Err(DecodeError::field("count", Reason::OutOfRange(count as u64)).at(at));
        }
        Ok(Self { sem, count })
    }

    operands!(|_f| Self { .. } => {});
}
