//! The vector engine (DVE): elementwise arithmetic, copies, selects, fills.
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

/// DVE: `out = a ∘ b` elementwise (broadcast by stride 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Binary {
    /// Left operand.
    pub a: AccessPattern,
    /// Right operand.
    pub b: AccessPattern,
    /// Output.
    pub out: AccessPattern,
    /// The operation.
    pub op: BinaryOp,
}

impl Unit for Binary {
    fn encode(&self, w: &mut W<'_>) {
        let Self { a, b, out, op } = self;
        w.ap(a);
        w.ap(b);
        w.ap(out);
        w.u8(*op as u8);
        w.zeros(7);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
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
            return Err(
                DecodeError::field("out.dtype", Reason::UnsupportedDType(out.dtype))
                    .at(HEADER_SIZE + 2 * AP_SIZE + 8),
            );
        }
        same_shape("a.shape", &out.shape, &a).map_err(|e| e.shifted(HEADER_SIZE))?;
        same_shape("b.shape", &out.shape, &b_).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        Ok(Self { a, b: b_, out, op })
    }

    operands!(|f| Self { a, b, out, .. } => {
        f(0, "a", Role::Read, a);
        f(1, "b", Role::Read, b);
        f(2, "out", Role::Write, out);
    });
}

/// DVE: `out = a ∘ scalar` (or `scalar ∘ a` when `reverse`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorScalar {
    /// Tensor operand.
    pub a: AccessPattern,
    /// Output.
    pub out: AccessPattern,
    /// The operation (arithmetic only).
    pub op: BinaryOp,
    /// The scalar.
    pub scalar: f32,
    /// Scalar on the left.
    pub reverse: bool,
}

impl Unit for TensorScalar {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            a,
            out,
            op,
            scalar,
            reverse,
        } = self;
        w.ap(a);
        w.ap(out);
        w.u8(*op as u8);
        w.zeros(3);
        w.u32(*reverse as u32);
        w.f32(*scalar);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let a = r.ap("a")?;
        let out = r.ap("out")?;
        let op = r.enum_u8("op", BinaryOp::from_u8)?;
        if op.is_comparison() || op.is_logical() || op.is_bitwise() {
            return Err(
                DecodeError::field("op", Reason::BadEnum(op as u32)).at(HEADER_SIZE + 2 * AP_SIZE)
            );
        }
        r.zeros(3, "reserved")?;
        let reverse = r.bool32("reverse")?;
        let scalar = r.f32("scalar")?;
        r.zeros(4, "reserved")?;
        require_dtype(&a, "a.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&out, "out.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        same_shape("out.shape", &a.shape, &out).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        Ok(Self {
            a,
            out,
            op,
            scalar,
            reverse,
        })
    }

    operands!(|f| Self { a, out, .. } => {
        f(0, "a", Role::Read, a);
        f(1, "out", Role::Write, out);
    });
}

/// DVE/POOL: strided copy, converting the element type if the two differ (transpose,
/// slice, concat, pad, expand, cast).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Copy {
    /// Source.
    pub input: AccessPattern,
    /// Destination (same shape).
    pub output: AccessPattern,
}

impl Unit for Copy {
    fn encode(&self, w: &mut W<'_>) {
        let Self { input, output } = self;
        w.ap(input);
        w.ap(output);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        same_shape("output.shape", &input.shape, &output)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        Ok(Self { input, output })
    }

    operands!(|f| Self { input, output } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
    });
}

/// DVE: `out = cond ? a : b`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Select {
    /// Boolean condition.
    pub cond: AccessPattern,
    /// Taken where true.
    pub a: AccessPattern,
    /// Taken where false.
    pub b: AccessPattern,
    /// Output.
    pub out: AccessPattern,
}

impl Unit for Select {
    fn encode(&self, w: &mut W<'_>) {
        let Self { cond, a, b, out } = self;
        w.ap(cond);
        w.ap(a);
        w.ap(b);
        w.ap(out);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let cond = r.ap("cond")?;
        let a = r.ap("a")?;
        let b_ = r.ap("b")?;
        let out = r.ap("out")?;
        require_dtype(&cond, "cond.dtype", &[DType::Bool]).map_err(|e| e.shifted(HEADER_SIZE))?;
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
        same_shape("a.shape", &out.shape, &a).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        same_shape("b.shape", &out.shape, &b_).map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        Ok(Self {
            cond,
            a,
            b: b_,
            out,
        })
    }

    operands!(|f| Self { cond, a, b, out } => {
        f(0, "cond", Role::Read, cond);
        f(1, "a", Role::Read, a);
        f(2, "b", Role::Read, b);
        f(3, "out", Role::Write, out);
    });
}

/// DVE/POOL: fill with one element value (its little-endian bits, zero-extended).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fill {
    /// Destination.
    pub out: AccessPattern,
    /// Element bits.
    pub bits: u64,
}

impl Unit for Fill {
    fn encode(&self, w: &mut W<'_>) {
        let Self { out, bits } = self;
        w.ap(out);
        w.u64(*bits);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let out = r.ap("out")?;
        let at = r.pos;
        let bits = r.u64();
        let width = out.dtype.size() * 8;
        if width < 64 && bits >> width != 0 {
            return Err(DecodeError::field("bits", Reason::OutOfRange(bits)).at(at));
        }
        Ok(Self { out, bits })
    }

    operands!(|f| Self { out, .. } => {
        f(0, "out", Role::Write, out);
    });
}
