//! Control instructions any engine runs: the end of a block, a no-op that carries only
//! synchronization, and predication.
//!
//! Each instruction: its fields, then its encoding, decoding (with every check the
//! decoder makes) and operands side by side. Opcodes, sizes and engines: the table in
//! [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use crate::op::*;
use nrt_hal::DType;

/// End of block: the engine is done with this execution (writes its END record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct End;

impl Unit for End {
    fn encode(&self, _w: &mut W<'_>) {}

    fn decode(_r: &mut R<'_>) -> Result<Self, DecodeError> {
        Ok(Self)
    }

    operands!(|_f| Self => {});
}

/// Does nothing (carries only synchronization).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Nop;

impl Unit for Nop {
    fn encode(&self, _w: &mut W<'_>) {}

    fn decode(_r: &mut R<'_>) -> Result<Self, DecodeError> {
        Ok(Self)
    }

    operands!(|_f| Self => {});
}

/// Any engine: predication (NCM 1.6). Sets the engine's guard from one element of device
/// memory: with `cond`, the guard holds while `(cond != 0) == when`; without, it always
/// holds (the guard is lifted). While the guard fails, the engine's compute and DMA
/// instructions do only their synchronization — they wait and signal as always, so every
/// semaphore count the other engines wait for is reached, but they touch no memory and
/// cannot fault. Control instructions (`Nop`, `SemSet`, `Notify`, `Barrier`, `Guard`,
/// `End`) always run. Every execution starts with the guard lifted. The compiler brackets
/// the instructions of each branch of an `If` whose condition is computed at run time
/// with it, so the branch not taken costs one pass over its synchronization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Guard {
    /// One `bool` or `u8` element (the condition), or `None` to lift the guard.
    pub cond: Option<AccessPattern>,
    /// The condition value under which the guarded instructions run.
    pub when: bool,
}

impl Unit for Guard {
    fn encode(&self, w: &mut W<'_>) {
        let Self { cond, when } = self;
        w.opt_ap(cond);
        w.u32(cond.is_some() as u32 | (*when as u32) << 1);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let at = HEADER_SIZE + AP_SIZE;
        let flags = u32::from_le_bytes(b[at..at + 4].try_into().expect("4"));
        if flags & !3 != 0 {
            return Err(DecodeError::field("flags", Reason::UnknownFlags(flags & !3)).at(at));
        }
        let (present, when) = (flags & 1 != 0, flags & 2 != 0);
        // Canonical: a lifted guard has no operand (zeros) and no polarity.
        let cond = r.opt_ap("cond", present)?;
        if let Some(c) = &cond {
            require_dtype(c, "cond.dtype", &[DType::Bool, DType::U8])
                .map_err(|e| e.shifted(HEADER_SIZE))?;
            if c.elements() != 1 {
                return Err(
                    DecodeError::field("cond.shape", Reason::OutOfRange(c.elements()))
                        .at(HEADER_SIZE + 16),
                );
            }
        } else if when {
            return Err(DecodeError::field("flags", Reason::ReservedNonZero).at(at));
        }
        r.pos = at + 4;
        r.zeros(4, "reserved")?;
        Ok(Self { cond, when })
    }

    operands!(|f| Self { cond, .. } => {
        if let Some(x) = cond {
            f(0, "cond", Role::Read, x);
        }
    });
}
