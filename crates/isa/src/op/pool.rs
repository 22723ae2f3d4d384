//! The pooling engine (POOL), rows and windows: reductions, pooling, softmax, normalization
//! (layer and RMS), dynamic quantization, resize.
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
    /// Reductions of the POOL engine.
    ReduceOp {
        /// Sum.
        Sum = 0,
        /// Arithmetic mean.
        Mean = 1,
        /// Maximum.
        Max = 2,
        /// Minimum.
        Min = 3,
    }
);

wire_enum!(
    /// Pooling-window operations.
    PoolOp {
        /// Maximum over the window.
        Max = 0,
        /// Average over the window.
        Avg = 1,
    }
);

wire_enum!(
    /// Resize interpolation.
    ResizeMode {
        /// Nearest neighbour.
        Nearest = 0,
        /// (Multi-)linear.
        Linear = 1,
    }
);

wire_enum!(
    /// How an output coordinate maps to an input coordinate (ONNX
    /// `coordinate_transformation_mode`).
    CoordMode {
        /// `(x + 0.5) / scale − 0.5`.
        HalfPixel = 0,
        /// `x / scale`.
        Asymmetric = 1,
        /// `x · (in − 1) / (out − 1)`.
        AlignCorners = 2,
        /// Like half-pixel, but 0 when the output size is 1.
        PytorchHalfPixel = 3,
        /// `(x + 0.5) / scale` (nearest only).
        TfHalfPixelForNearest = 4,
        /// `(x + 0.5) / scale − 0.5`, using the output/input size ratio.
        HalfPixelSymmetric = 5,
    }
);

wire_enum!(
    /// How a fractional input coordinate rounds for nearest-neighbour resize.
    NearestMode {
        /// Round half down.
        RoundPreferFloor = 0,
        /// Round half up.
        RoundPreferCeil = 1,
        /// Floor.
        Floor = 2,
        /// Ceil.
        Ceil = 3,
    }
);

/// POOL: reduce over the dimensions set in `axes` (bit i = dimension i); the output has
/// size 1 there.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reduce {
    /// Input.
    pub input: AccessPattern,
    /// Output.
    pub output: AccessPattern,
    /// The reduction.
    pub op: ReduceOp,
    /// Dimension mask.
    pub axes: u8,
}

impl Unit for Reduce {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            output,
            op,
            axes,
        } = self;
        w.ap(input);
        w.ap(output);
        w.u8(*op as u8);
        w.u8(*axes);
        w.zeros(6);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let op = r.enum_u8("op", ReduceOp::from_u8)?;
        let at = r.pos;
        let axes = r.u8();
        if axes & !0xF != 0 {
            return Err(DecodeError::field("axes", Reason::OutOfRange(axes as u64)).at(at));
        }
        r.zeros(6, "reserved")?;
        let ok = if op == ReduceOp::Mean { F32 } else { NUMERIC };
        require_dtype(&input, "input.dtype", ok).map_err(|e| e.shifted(HEADER_SIZE))?;
        if output.dtype != input.dtype {
            return Err(
                DecodeError::field("output.dtype", Reason::UnsupportedDType(output.dtype))
                    .at(HEADER_SIZE + AP_SIZE + 8),
            );
        }
        let mut want = input.shape;
        for (d, w) in want.iter_mut().enumerate() {
            if axes & (1 << d) != 0 {
                *w = 1;
            }
        }
        same_shape("output.shape", &want, &output).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        Ok(Self {
            input,
            output,
            op,
            axes,
        })
    }

    operands!(|f| Self { input, output, .. } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
    });
}

/// POOL: max or average pooling windows over `[N, C, H, W]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pool {
    /// `[N, C, H, W]`.
    pub input: AccessPattern,
    /// `[N, C, OH, OW]`.
    pub output: AccessPattern,
    /// Kernel, stride, padding, dilation.
    pub window: Window,
    /// Max or average.
    pub op: PoolOp,
    /// Average pooling counts padding cells in the divisor.
    pub count_include_pad: bool,
}

impl Unit for Pool {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            output,
            window,
            op,
            count_include_pad,
        } = self;
        w.ap(input);
        w.ap(output);
        w.window(window);
        w.u8(*op as u8);
        w.zeros(3);
        w.u32(*count_include_pad as u32);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let window = r.window(true)?;
        let op = r.enum_u8("op", PoolOp::from_u8)?;
        r.zeros(3, "reserved")?;
        let count_include_pad = r.bool32("count_include_pad")?;
        require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&output, "output.dtype", F32)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let oo = HEADER_SIZE + AP_SIZE;
        for d in 0..2 {
            dim_eq("output.shape", d, input.shape[d], output.shape[d])
                .map_err(|e| e.shifted(oo))?;
            let want = window
                .out_dim(d, input.shape[2 + d], window.kernel[d])
                .ok_or(
                    DecodeError::field(
                        "window.kernel",
                        Reason::OutOfRange(window.kernel[d] as u64),
                    )
                    .at(HEADER_SIZE + 2 * AP_SIZE + 4 * d),
                )?;
            dim_eq("output.shape", 2 + d, want, output.shape[2 + d]).map_err(|e| e.shifted(oo))?;
        }
        Ok(Self {
            input,
            output,
            window,
            op,
            count_include_pad,
        })
    }

    operands!(|f| Self { input, output, .. } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
    });
}

/// POOL: softmax (or log-softmax) over dimension 3, max-subtracted, fp32 accumulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Softmax {
    /// Input.
    pub input: AccessPattern,
    /// Output.
    pub output: AccessPattern,
    /// Log-softmax.
    pub log: bool,
}

impl Unit for Softmax {
    fn encode(&self, w: &mut W<'_>) {
        let Self { input, output, log } = self;
        w.ap(input);
        w.ap(output);
        w.u32(*log as u32);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let log = r.bool32("log")?;
        r.zeros(4, "reserved")?;
        require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&output, "output.dtype", F32)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        same_shape("output.shape", &input.shape, &output)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        Ok(Self { input, output, log })
    }

    operands!(|f| Self { input, output, .. } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
    });
}

/// POOL: RMS normalization over dimension 3, the normalization of decoder LLMs (Llama,
/// SmolLM2, Mistral): `y = x / √(mean(x²) + eps) · gamma`, each row of `L` elements.
/// `gamma` has the input's shape, usually broadcast (strides 0) from one row of weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNorm {
    /// Input (f32).
    pub input: AccessPattern,
    /// Scale (f32, the input's shape; usually one row broadcast).
    pub gamma: AccessPattern,
    /// Output (f32, the input's shape).
    pub output: AccessPattern,
    /// Added to the mean square (finite, ≥ 0).
    pub eps: f32,
}

impl Unit for RmsNorm {
    fn encode(&self, w: &mut W<'_>) {
        w.ap(&self.input);
        w.ap(&self.gamma);
        w.ap(&self.output);
        w.f32(self.eps);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let gamma = r.ap("gamma")?;
        let output = r.ap("output")?;
        let eps_at = r.pos;
        let eps = r.f32("eps")?;
        if !eps.is_finite() || eps < 0.0 {
            return Err(
                DecodeError::field("eps", Reason::OutOfRange(eps.to_bits() as u64)).at(eps_at),
            );
        }
        r.zeros(4, "reserved")?;
        let operands = [
            (&input, "input.dtype", "input.shape"),
            (&gamma, "gamma.dtype", "gamma.shape"),
            (&output, "output.dtype", "output.shape"),
        ];
        for (i, (ap, dtype, shape)) in operands.into_iter().enumerate() {
            let at = HEADER_SIZE + i * AP_SIZE;
            require_dtype(ap, dtype, F32).map_err(|e| e.shifted(at))?;
            same_shape(shape, &input.shape, ap).map_err(|e| e.shifted(at))?;
        }
        Ok(Self {
            input,
            gamma,
            output,
            eps,
        })
    }

    operands!(|f| Self {
        input,
        gamma,
        output,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "gamma", Role::Read, gamma);
        f(2, "output", Role::Write, output);
    });
}

/// POOL: layer normalization over dimension 3: `(x − mean)/√(var + eps) · gamma + beta`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerNorm {
    /// Input.
    pub input: AccessPattern,
    /// Scale (same shape as input, broadcast).
    pub gamma: AccessPattern,
    /// Shift, if any.
    pub beta: Option<AccessPattern>,
    /// Output.
    pub output: AccessPattern,
    /// Epsilon.
    pub eps: f32,
}

impl Unit for LayerNorm {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            gamma,
            beta,
            output,
            eps,
        } = self;
        w.ap(input);
        w.ap(gamma);
        w.opt_ap(beta);
        w.ap(output);
        w.f32(*eps);
        w.u32(beta.is_some() as u32);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let input = r.ap("input")?;
        let gamma = r.ap("gamma")?;
        let flags_at = HEADER_SIZE + 4 * AP_SIZE + 4;
        let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
        if flags & !1 != 0 {
            return Err(DecodeError::field("flags", Reason::UnknownFlags(flags)).at(flags_at));
        }
        let beta = r.opt_ap("beta", flags & 1 != 0)?;
        let output = r.ap("output")?;
        let eps = r.f32("eps")?;
        if eps.is_nan() || eps < 0.0 {
            return Err(
                DecodeError::field("eps", Reason::OutOfRange(eps.to_bits() as u64))
                    .at(flags_at - 4),
            );
        }
        let aps = [Some(&input), Some(&gamma), beta.as_ref(), Some(&output)];
        let names = ["input.dtype", "gamma.dtype", "beta.dtype", "output.dtype"];
        let shapes = ["input.shape", "gamma.shape", "beta.shape", "output.shape"];
        for (i, ap) in aps.iter().enumerate() {
            if let Some(ap) = ap {
                require_dtype(ap, names[i], F32)
                    .map_err(|e| e.shifted(HEADER_SIZE + i * AP_SIZE))?;
                same_shape(shapes[i], &input.shape, ap)
                    .map_err(|e| e.shifted(HEADER_SIZE + i * AP_SIZE))?;
            }
        }
        Ok(Self {
            input,
            gamma,
            beta,
            output,
            eps,
        })
    }

    operands!(|f| Self {
        input,
        gamma,
        beta,
        output,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "gamma", Role::Read, gamma);
        if let Some(x) = beta {
            f(2, "beta", Role::Read, x);
        }
        f(3, "output", Role::Write, output);
    });
}

/// POOL: ONNX `DynamicQuantizeLinear` in one instruction (NCM 1.8): the range of `input`
/// widened to include 0 gives `scale = (max − min)/255` (1 when the range is empty, as
/// ONNX Runtime) and `zero_point = round(clamp(−min/scale, 0, 255))`, then
/// `output = clamp(round(input/scale) + zero_point, 0, 255)` (rounding ties to even; a
/// NaN element gives 0, NaN elements do not widen the range).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DynamicQuantize {
    /// f32, any shape.
    pub input: AccessPattern,
    /// u8, the input's shape.
    pub output: AccessPattern,
    /// f32, one element.
    pub scale: AccessPattern,
    /// u8, one element.
    pub zero_point: AccessPattern,
}

impl Unit for DynamicQuantize {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            output,
            scale,
            zero_point,
        } = self;
        w.ap(input);
        w.ap(output);
        w.ap(scale);
        w.ap(zero_point);
        w.zeros(8);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let scale = r.ap("scale")?;
        let zero_point = r.ap("zero_point")?;
        r.zeros(8, "reserved")?;
        require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&output, "output.dtype", &[DType::U8])
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        same_shape("output.shape", &input.shape, &output)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        for (slot, ap, dtype, dname, sname) in [
            (2, &scale, DType::F32, "scale.dtype", "scale.shape"),
            (
                3,
                &zero_point,
                DType::U8,
                "zero_point.dtype",
                "zero_point.shape",
            ),
        ] {
            let at = HEADER_SIZE + slot * AP_SIZE;
            require_dtype(ap, dname, &[dtype]).map_err(|e| e.shifted(at))?;
            if ap.elements() != 1 {
                return Err(
                    DecodeError::field(sname, Reason::OutOfRange(ap.elements())).at(at + 16)
                );
            }
        }
        Ok(Self {
            input,
            output,
            scale,
            zero_point,
        })
    }

    operands!(|f| Self {
        input,
        output,
        scale,
        zero_point,
    } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
        f(2, "scale", Role::Write, scale);
        f(3, "zero_point", Role::Write, zero_point);
    });
}

/// POOL: resize every dimension whose sizes differ.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resize {
    /// Input.
    pub input: AccessPattern,
    /// Output.
    pub output: AccessPattern,
    /// Interpolation.
    pub mode: ResizeMode,
    /// Coordinate transformation.
    pub coord: CoordMode,
    /// Rounding for nearest.
    pub nearest: NearestMode,
    /// Per-dimension scale (output/input); 0 = use the size ratio.
    pub scales: [f32; 4],
}

impl Unit for Resize {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            output,
            mode,
            coord,
            nearest,
            scales,
        } = self;
        w.ap(input);
        w.ap(output);
        w.u8(*mode as u8);
        w.u8(*coord as u8);
        w.u8(*nearest as u8);
        w.zeros(5);
        for s in scales {
            w.f32(*s);
        }
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let mode = r.enum_u8("mode", ResizeMode::from_u8)?;
        let coord = r.enum_u8("coord", CoordMode::from_u8)?;
        let nearest = r.enum_u8("nearest", NearestMode::from_u8)?;
        r.zeros(5, "reserved")?;
        let mut scales = [0f32; 4];
        for s in &mut scales {
            let at = r.pos;
            *s = r.f32("scales")?;
            if *s < 0.0 || !s.is_finite() {
                return Err(
                    DecodeError::field("scales", Reason::OutOfRange(s.to_bits() as u64)).at(at),
                );
            }
        }
        require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&output, "output.dtype", F32)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        Ok(Self {
            input,
            output,
            mode,
            coord,
            nearest,
            scales,
        })
    }

    operands!(|f| Self { input, output, .. } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
    });
}
