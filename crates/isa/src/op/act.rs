//! The activation engine (ACT): `y = f(x·scale + bias)`.
//!
//! Each instruction: its fields, then its encoding, decoding (with every check the
//! decoder makes) and operands side by side. Opcodes, sizes and engines: the table in
//! [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use crate::op::*;

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

/// ACT: `y = f(x · scale + bias)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Activation {
    /// Input.
    pub input: AccessPattern,
    /// Output (same shape).
    pub output: AccessPattern,
    /// Added before `f` (same shape, usually broadcast), if any.
    pub bias: Option<AccessPattern>,
    /// The function.
    pub func: ActFunc,
    /// Multiplies `x` before the bias.
    pub scale: f32,
    /// Function parameter (LeakyRelu, HardSigmoid, Elu slope; Clip minimum).
    pub alpha: f32,
    /// Function parameter (HardSigmoid offset; Clip maximum).
    pub beta: f32,
}

impl Unit for Activation {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            output,
            bias,
            func,
            scale,
            alpha,
            beta,
        } = self;
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

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let flags_at = HEADER_SIZE + 3 * AP_SIZE + 4;
        let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
        if flags & !1 != 0 {
            return Err(DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at));
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
        Ok(Self {
            input,
            output,
            bias,
            func,
            scale,
            alpha,
            beta,
        })
    }

    operands!(|f| Self {
        input,
        output,
        bias,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
        if let Some(x) = bias {
            f(2, "bias", Role::Read, x);
        }
    });
}
