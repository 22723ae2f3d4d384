//! Unary activations: one ACT instruction each (`act_of` names the function), or a short
//! sequence of ACT / DVE instructions for the composite ones (Selu, Mish, PRelu, …). On
//! constants, the ACT functions with a host twin (`host_act`) and Clip fold.

use super::{Dtypes, Registry};
use crate::error::{ErrorKind, Result};
use crate::eval::{input, one};
use crate::lower::view::View;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, broadcast_shapes, elementwise_dtype_check, out, require_float};
use crate::tensor::{HostTensor, is_float};
use nrt_hal::DType;
use nrt_isa::{ActFunc, BinaryOp};

pub(super) fn register(r: &mut Registry) {
    for (name, since) in [
        ("Relu", 1),
        ("LeakyRelu", 1),
        ("Sigmoid", 1),
        ("HardSigmoid", 1),
        ("Tanh", 1),
        ("Gelu", 20),
        ("Erf", 9),
        ("Exp", 1),
        ("Log", 1),
        ("Sqrt", 1),
        ("Reciprocal", 1),
        ("Abs", 1),
        ("Neg", 1),
        ("Floor", 1),
        ("Ceil", 1),
        ("Softplus", 1),
        ("Elu", 1),
        ("Tan", 7),
        ("Asin", 7),
        ("Acos", 7),
        ("Atan", 7),
        ("Sinh", 9),
        ("Cosh", 9),
        ("Asinh", 9),
        ("Acosh", 9),
        ("Atanh", 9),
    ] {
        r.op(name, since, infer_same)
            .dtypes(Dtypes::Float)
            .folds(fold_activation)
            .device(lower!(lower_activation));
    }
    r.op("Clip", 1, infer_clip)
        .dtypes(Dtypes::Float)
        .folds(fold_clip)
        .note("bounds computed in the graph are read on the device (DVE max/min)")
        .device(lower!(lower_clip));
    for (name, since) in [
        ("Selu", 1),
        ("Celu", 12),
        ("HardSwish", 14),
        ("Softsign", 1),
        ("ThresholdedRelu", 10),
        ("Shrink", 9),
        ("Sign", 9),
        ("Swish", 24),
        ("Mish", 18),
    ] {
        r.op(name, since, infer_float_same)
            .device(lower!(lower_composite_activation));
    }
    for name in ["Sin", "Cos"] {
        r.op(name, 7, infer_float_same)
            .dtypes(Dtypes::Float)
            .note("DVE polynomial after range reduction")
            .device(lower!(lower_sin_cos));
    }
    r.op("IsNaN", 9, infer_is_special)
        .dtypes(Dtypes::Float)
        .note("x ≠ x on DVE")
        .device(lower!(lower_is_special));
    r.op("IsInf", 10, infer_is_special)
        .dtypes(Dtypes::Float)
        .note("x = ±∞ on DVE")
        .device(lower!(lower_is_special));
    r.op("PRelu", 1, infer_prelu)
        .device(lower!(lower_composite_activation));
}

/// Same shape and type as the input (Gelu: its `approximate` attribute checked).
pub(crate) fn infer_same(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let op = n.op.as_str();
    let x = c.input(0)?;
    if op == "Gelu" {
        let a = n.attr_s("approximate", "none")?;
        if a != "none" && a != "tanh" {
            return Err(c.bad_attr(format!("approximate '{a}'")));
        }
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// Same shape and type as an f32 input.
pub(crate) fn infer_float_same(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    require_float(c, x)?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// IsNaN / IsInf: a bool of the input's shape.
pub(crate) fn infer_is_special(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    require_float(c, x)?;
    Ok(vec![out(DType::Bool, x.shape.clone())])
}

/// PRelu: the slope broadcasts to the input.
pub(crate) fn infer_prelu(c: &Ctx) -> Result<Vec<Out>> {
    let (x, slope) = (c.input(0)?, c.input(1)?);
    require_float(c, x)?;
    elementwise_dtype_check(c, &[x, slope])?;
    if broadcast_shapes(&x.shape, &slope.shape).as_deref() != Some(&x.shape[..]) {
        return Err(c.mismatch(format!(
            "slope {:?} does not broadcast to the input {:?}",
            slope.shape, x.shape
        )));
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// Clip: min / max (inputs from opset 11) must be constants.
pub(crate) fn infer_clip(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    if c.opset() >= 11 {
        // `min` and `max` are scalars; constant ones fold into ACT's clip, the others are
        // read on the device at execution time (see `lower_clip`).
        for (i, what) in [(1, "min"), (2, "max")] {
            if let Some(v) = c.opt(i)
                && v.konst.is_none()
            {
                if v.elements() != 1 {
                    return Err(c.e(
                        ErrorKind::ShapeMismatch,
                        format!(
                            "input '{}' ({what}) must be a scalar; it has shape {:?}",
                            v.name, v.shape
                        ),
                    ));
                }
                if v.dtype != x.dtype {
                    return Err(c.e(
                        ErrorKind::ShapeMismatch,
                        format!(
                            "input '{}' ({what}) is {}; the input is {}",
                            v.name, v.dtype, x.dtype
                        ),
                    ));
                }
            }
        }
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// The activation a node computes on ACT: `(function, alpha, beta)`.
pub(crate) fn act_of(c: &Ctx) -> Result<Option<(ActFunc, f32, f32)>> {
    let n = c.n;
    Ok(Some(match n.op.as_str() {
        "Relu" => (ActFunc::Relu, 0.0, 0.0),
        "LeakyRelu" => (ActFunc::LeakyRelu, n.attr_finite_f("alpha", 0.01)?, 0.0),
        "Sigmoid" => (ActFunc::Sigmoid, 0.0, 0.0),
        "HardSigmoid" => (
            ActFunc::HardSigmoid,
            n.attr_finite_f("alpha", 0.2)?,
            n.attr_finite_f("beta", 0.5)?,
        ),
        "Tanh" => (ActFunc::Tanh, 0.0, 0.0),
        "Gelu" => {
            if n.attr_s("approximate", "none")? == "tanh" {
                (ActFunc::GeluTanh, 0.0, 0.0)
            } else {
                (ActFunc::GeluErf, 0.0, 0.0)
            }
        }
        "Erf" => (ActFunc::Erf, 0.0, 0.0),
        "Exp" => (ActFunc::Exp, 0.0, 0.0),
        "Log" => (ActFunc::Log, 0.0, 0.0),
        "Sqrt" => (ActFunc::Sqrt, 0.0, 0.0),
        "Reciprocal" => (ActFunc::Reciprocal, 0.0, 0.0),
        "Abs" => (ActFunc::Abs, 0.0, 0.0),
        "Neg" => (ActFunc::Neg, 0.0, 0.0),
        "Floor" => (ActFunc::Floor, 0.0, 0.0),
        "Ceil" => (ActFunc::Ceil, 0.0, 0.0),
        "Softplus" => (ActFunc::Softplus, 0.0, 0.0),
        "Elu" => (ActFunc::Elu, n.attr_finite_f("alpha", 1.0)?, 0.0),
        "Tan" => (ActFunc::Tan, 0.0, 0.0),
        "Asin" => (ActFunc::Asin, 0.0, 0.0),
        "Acos" => (ActFunc::Acos, 0.0, 0.0),
        "Atan" => (ActFunc::Atan, 0.0, 0.0),
        "Sinh" => (ActFunc::Sinh, 0.0, 0.0),
        "Cosh" => (ActFunc::Cosh, 0.0, 0.0),
        "Asinh" => (ActFunc::Asinh, 0.0, 0.0),
        "Acosh" => (ActFunc::Acosh, 0.0, 0.0),
        "Atanh" => (ActFunc::Atanh, 0.0, 0.0),
        "Clip" => {
            let (lo, hi) = if c.opset() >= 11 {
                (
                    c.konst(1)
                        .map_or(f32::NEG_INFINITY, |t| t.get_f64(0) as f32),
                    c.konst(2).map_or(f32::INFINITY, |t| t.get_f64(0) as f32),
                )
            } else {
                let bound = |name: &str, default: f32| -> Result<f32> {
                    match n.attr_f(name, default)? {
                        v if v.is_nan() => Err(n.error(
                            ErrorKind::BadAttribute,
                            format!("attribute '{name}' is NaN"),
                        )),
                        v => Ok(v),
                    }
                };
                (
                    bound("min", f32::NEG_INFINITY)?,
                    bound("max", f32::INFINITY)?,
                )
            };
            (ActFunc::Clip, lo, hi)
        }
        _ => return Ok(None),
    }))
}

/// `erf` (Abramowitz–Stegun 7.1.26 refined: |error| < 1.2e-7, enough for f32).
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    (if x >= 0.0 { y } else { -y }) as f32
}

type UnaryFn = Box<dyn Fn(f32) -> f32>;

/// The host twin of an ACT function with its coefficients ([`act_of`]), in f32 for folding;
/// `None` for those the device alone computes (the trigonometric and hyperbolic ones; Clip
/// folds by [`fold_clip`]).
fn host_act((f, a, b): (ActFunc, f32, f32)) -> Option<UnaryFn> {
    Some(match f {
        ActFunc::Sqrt => Box::new(f32::sqrt),
        ActFunc::Reciprocal => Box::new(|x| 1.0 / x),
        ActFunc::Exp => Box::new(f32::exp),
        ActFunc::Log => Box::new(f32::ln),
        ActFunc::Erf => Box::new(erf),
        ActFunc::Relu => Box::new(|x| x.max(0.0)),
        ActFunc::LeakyRelu => Box::new(move |x| if x < 0.0 { a * x } else { x }),
        ActFunc::Elu => Box::new(move |x| if x < 0.0 { a * (x.exp() - 1.0) } else { x }),
        ActFunc::Sigmoid => Box::new(|x| 1.0 / (1.0 + (-x).exp())),
        ActFunc::HardSigmoid => Box::new(move |x| (a * x + b).clamp(0.0, 1.0)),
        ActFunc::Tanh => Box::new(f32::tanh),
        ActFunc::Softplus => Box::new(|x| (1.0 + x.exp()).ln()),
        ActFunc::GeluTanh => Box::new(|x| {
            let k = (2.0f32 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
        }),
        ActFunc::GeluErf => Box::new(|x| 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2))),
        ActFunc::Neg => Box::new(|x| -x),
        ActFunc::Abs => Box::new(f32::abs),
        ActFunc::Floor => Box::new(f32::floor),
        ActFunc::Ceil => Box::new(f32::ceil),
        _ => return None,
    })
}

/// Folds an activation with a host twin ([`host_act`]): floating inputs in f32 (then back
/// to their type); integer ones only for Neg, Abs (wrapping) and Relu.
fn fold_activation(c: &Ctx, _: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let Some(act) = act_of(c)? else {
        return Ok(None);
    };
    let Some(f) = host_act(act) else {
        return Ok(None);
    };
    let x = input(c, 0);
    if !is_float(x.dtype) {
        let f: fn(i64) -> i64 = match act.0 {
            ActFunc::Neg => i64::wrapping_neg,
            ActFunc::Abs => i64::wrapping_abs,
            ActFunc::Relu => |v| v.max(0),
            _ => return Ok(None),
        };
        let v = x.to_i64s().iter().map(|&v| f(v)).collect();
        return one(HostTensor::ints(x.dtype, x.shape.clone(), v));
    }
    let v = x.to_f32s().iter().map(|&v| f(v)).collect();
    one(HostTensor::f32(x.shape.clone(), v).cast(x.dtype))
}

/// Folds Clip in f64, in the input's own type (integer bounds stay exact): the bounds are
/// inputs from opset 11 (an absent one does not bound), attributes before (ONNX's defaults,
/// the f32 extremes). Not [`act_of`]'s bounds: those are ACT's f32 operands.
fn fold_clip(c: &Ctx, _: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let n = c.n;
    let x = input(c, 0);
    let (lo, hi) = if c.opset() >= 11 {
        (
            c.konst(1).map(|t| t.get_f64(0)),
            c.konst(2).map(|t| t.get_f64(0)),
        )
    } else {
        (
            Some(n.attr_f("min", f32::MIN)? as f64),
            Some(n.attr_f("max", f32::MAX)? as f64),
        )
    };
    let v = (0..x.len()).map(|i| {
        let mut v = x.get_f64(i);
        if let Some(l) = lo {
            v = v.max(l);
        }
        if let Some(h) = hi {
            v = v.min(h);
        }
        v
    });
    one(HostTensor::from_f64s(x.dtype, x.shape.clone(), v))
}

impl<'a> Lowerer<'a> {
    /// An activation on ACT (in place when it can be).
    pub(crate) fn lower_activation(&mut self, at: At<'a>) -> Result<()> {
        let (ni, n, c, o0, op, odt) = (at.ni, at.n, at.c, at.o0, at.op, at.odt);
        let Some(f) = act_of(&c)? else {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("operator '{op}' cannot be computed on the device here (dtype {odt})"),
            ));
        };
        let xi = n.inputs[0].expect("p");
        let x = self.sview(xi)?;
        let y = self.alloc_over(xi, &[ni], o0)?;
        self.activation(&x, &y, None, f, 1.0)
    }

    /// `Clip`: ACT's clip when the bounds are constants (or attributes); otherwise the
    /// bounds are read on the device: `y = min(max(x, lo), hi)` on DVE with the scalar
    /// bounds broadcast (a bound that is absent is skipped).
    pub(crate) fn lower_clip(&mut self, at: At<'a>) -> Result<()> {
        let At { g, n, c, o0, .. } = at;
        let computed = |i: usize| c.opset() >= 11 && c.opt(i).is_some_and(|v| v.konst.is_none());
        if !computed(1) && !computed(2) {
            return self.lower_activation(at);
        }
        let shape = g.values[o0].shape.clone();
        let (x, y) = self.unary_io(n, o0)?;
        if shape.iter().product::<usize>() == 0 {
            return Ok(());
        }
        let mut from = x;
        for (i, op) in [(1, BinaryOp::Max), (2, BinaryOp::Min)] {
            if let Some(Some(b)) = n.inputs.get(i) {
                let bound = self.view(*b)?.broadcast(&shape);
                self.binary(&from, &bound, &y, op)?;
                from = y.clone();
            }
        }
        Ok(())
    }

    /// IsNaN: `¬(x = x)`. IsInf: `x = +∞` and / or `x = −∞` (`detect_positive`,
    /// `detect_negative`). Comparisons on DVE, combined by a select.
    pub(crate) fn lower_is_special(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let x = self.input_sview(n, 0)?;
        let y = self.alloc(o0);
        let total: usize = oshape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let bool_const = |l: &mut Self, v: i64| {
            let a = l.add_const(&crate::tensor::HostTensor::ints(
                DType::Bool,
                vec![1],
                vec![v],
            ))?;
            Ok::<_, crate::error::CompileError>(View::dense(a, DType::Bool, &[1]).broadcast(oshape))
        };
        if n.op == "IsNaN" {
            let eq = View::dense(self.temp(total), DType::Bool, oshape);
            self.binary(&x, &x, &eq, BinaryOp::Equal)?;
            let (f, t) = (bool_const(self, 0)?, bool_const(self, 1)?);
            return self.select(&eq, &f, &t, &y);
        }
        let pos = n.attr_i("detect_positive", 1)? != 0;
        let neg = n.attr_i("detect_negative", 1)? != 0;
        let mut first = true;
        for (on, v) in [(pos, f32::INFINITY), (neg, f32::NEG_INFINITY)] {
            if !on {
                continue;
            }
            let inf = self.scalar(v, oshape)?;
            if first {
                self.binary(&x, &inf, &y, BinaryOp::Equal)?;
                first = false;
            } else {
                let eq = View::dense(self.temp(total), DType::Bool, oshape);
                self.binary(&x, &inf, &eq, BinaryOp::Equal)?;
                self.binary(&y, &eq, &y, BinaryOp::Or)?;
            }
        }
        if first {
            let f = bool_const(self, 0)?;
            self.copy(nrt_hal::Engine::Dve, &f, &y)?;
        }
        Ok(())
    }

    /// Activations without an ACT function of their own, from those and DVE operations.
    pub(crate) fn lower_composite_activation(&mut self, at: At<'a>) -> Result<()> {
        let At { g, n, o0, .. } = at;
        let xi = n.inputs[0].expect("p");
        let x = self.sview(xi)?;
        let sh = g.values[o0].shape.clone();
        let total: usize = sh.iter().product();
        let f = |f: ActFunc| (f, 0.0, 0.0);
        let tmp = |l: &mut Self, d: DType| View::dense(l.temp(total * d.size()), d, &sh);
        let y = self.alloc(o0);
        if total == 0 {
            return Ok(());
        }
        match n.op.as_str() {
            "Selu" => {
                let alpha = n.attr_finite_f("alpha", 1.673_263_2)?;
                let gamma = n.attr_finite_f("gamma", 1.050_701)?;
                self.activation(&x, &y, None, (ActFunc::Elu, alpha, 0.0), 1.0)?;
                self.tensor_scalar(&y, &y, BinaryOp::Mul, gamma)
            }
            "Celu" => {
                // alpha · Elu(x / alpha) with Elu's own alpha 1.
                let alpha = n.attr_finite_f("alpha", 1.0)?;
                self.activation(&x, &y, None, (ActFunc::Elu, 1.0, 0.0), 1.0 / alpha)?;
                self.tensor_scalar(&y, &y, BinaryOp::Mul, alpha)
            }
            "HardSwish" => {
                self.activation(&x, &y, None, (ActFunc::HardSigmoid, 1.0 / 6.0, 0.5), 1.0)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "Swish" => {
                let alpha = n.attr_finite_f("alpha", 1.0)?;
                self.activation(&x, &y, None, f(ActFunc::Sigmoid), alpha)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "Mish" => {
                self.activation(&x, &y, None, f(ActFunc::Softplus), 1.0)?;
                self.activation(&y, &y, None, f(ActFunc::Tanh), 1.0)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "Softsign" => {
                // x / (1 + |x|): |x|, then 1/(|x| + 1) with the 1 as the ACT bias.
                self.activation(&x, &y, None, f(ActFunc::Abs), 1.0)?;
                let one = self.scalar(1.0, &sh)?;
                self.activation(&y, &y, Some(&one), f(ActFunc::Reciprocal), 1.0)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "ThresholdedRelu" => {
                let alpha = n.attr_finite_f("alpha", 1.0)?;
                let (a, zero) = (self.scalar(alpha, &sh)?, self.scalar(0.0, &sh)?);
                let cond = tmp(self, DType::Bool);
                self.binary(&x, &a, &cond, BinaryOp::Greater)?;
                self.select(&cond, &x, &zero, &y)
            }
            "Shrink" => {
                let bias = n.attr_finite_f("bias", 0.0)?;
                let lambd = n.attr_finite_f("lambd", 0.5)?;
                let (lo, hi, zero) = (
                    self.scalar(-lambd, &sh)?,
                    self.scalar(lambd, &sh)?,
                    self.scalar(0.0, &sh)?,
                );
                let (c_lo, c_hi) = (tmp(self, DType::Bool), tmp(self, DType::Bool));
                self.binary(&x, &lo, &c_lo, BinaryOp::Less)?;
                self.binary(&x, &hi, &c_hi, BinaryOp::Greater)?;
                let t = tmp(self, DType::F32);
                self.tensor_scalar(&x, &t, BinaryOp::Sub, bias)?;
                self.select(&c_hi, &t, &zero, &y)?;
                self.tensor_scalar(&x, &t, BinaryOp::Add, bias)?;
                self.select(&c_lo, &t, &y, &y)
            }
            "Sign" => {
                // 1, −1, or x·0 (0, or NaN for NaN).
                let (one, minus, zero) = (
                    self.scalar(1.0, &sh)?,
                    self.scalar(-1.0, &sh)?,
                    self.scalar(0.0, &sh)?,
                );
                let (pos, neg) = (tmp(self, DType::Bool), tmp(self, DType::Bool));
                self.binary(&x, &zero, &pos, BinaryOp::Greater)?;
                self.binary(&x, &zero, &neg, BinaryOp::Less)?;
                self.tensor_scalar(&x, &y, BinaryOp::Mul, 0.0)?;
                self.select(&neg, &minus, &y, &y)?;
                self.select(&pos, &one, &y, &y)
            }
            _ => {
                // PRelu: x < 0 ? slope·x : x.
                let slope = self.input_sview(n, 1)?.broadcast(&sh);
                let zero = self.scalar(0.0, &sh)?;
                let neg = tmp(self, DType::Bool);
                self.binary(&x, &zero, &neg, BinaryOp::Less)?;
                let t = tmp(self, DType::F32);
                self.binary(&x, &slope, &t, BinaryOp::Mul)?;
                self.select(&neg, &t, &x, &y)
            }
        }
    }

    /// Sin / Cos without an ACT function of their own: `r = x − 2π·k`, `k = floor(x/2π + ½)`
    /// (2π in two parts, so `r` is exact for moderate `x`), then the odd (Sin) or even (Cos)
    /// Taylor polynomial of `r ∈ [−π, π]` by Horner's rule on DVE (truncation < 4e-8).
    pub(crate) fn lower_sin_cos(&mut self, at: At<'a>) -> Result<()> {
        // 2π = TAU_HI + TAU_LO, TAU_HI with 8 significant bits (k·TAU_HI is exact).
        const TAU_HI: f32 = 6.281_25;
        const TAU_LO: f32 = 0.001_935_307_2;
        // Coefficients of r^2i, highest degree first (Sin: of r^(2i+1)).
        const SIN: [f32; 9] = [
            1.0 / 355_687_428_096_000.0,
            -1.0 / 1_307_674_368_000.0,
            1.0 / 6_227_020_800.0,
            -1.0 / 39_916_800.0,
            1.0 / 362_880.0,
            -1.0 / 5_040.0,
            1.0 / 120.0,
            -1.0 / 6.0,
            1.0,
        ];
        const COS: [f32; 10] = [
            -1.0 / 6_402_373_705_728_000.0,
            1.0 / 20_922_789_888_000.0,
            -1.0 / 87_178_291_200.0,
            1.0 / 479_001_600.0,
            -1.0 / 3_628_800.0,
            1.0 / 40_320.0,
            -1.0 / 720.0,
            1.0 / 24.0,
            -1.0 / 2.0,
            1.0,
        ];
        let (n, op, o0, oshape) = (at.n, at.op, at.o0, at.oshape);
        let x = self.input_sview(n, 0)?;
        let total: usize = oshape.iter().product();
        let y = self.alloc(o0);
        if total == 0 {
            return Ok(());
        }
        let tmp = |l: &mut Self| View::dense(l.temp(total * 4), DType::F32, oshape);
        let (k, r, t) = (tmp(self), tmp(self), tmp(self));
        let half = self.scalar(0.5, oshape)?;
        let floor = (ActFunc::Floor, 0.0, 0.0);
        self.activation(&x, &k, Some(&half), floor, 1.0 / std::f32::consts::TAU)?;
        self.tensor_scalar(&k, &t, BinaryOp::Mul, TAU_HI)?;
        self.binary(&x, &t, &r, BinaryOp::Sub)?;
        self.tensor_scalar(&k, &t, BinaryOp::Mul, TAU_LO)?;
        self.binary(&r, &t, &r, BinaryOp::Sub)?;
        let r2 = k;
        self.binary(&r, &r, &r2, BinaryOp::Mul)?;
        let coef: &[f32] = if op == "Sin" { &SIN } else { &COS };
        self.tensor_scalar(&r2, &y, BinaryOp::Mul, coef[0])?;
        self.tensor_scalar(&y, &y, BinaryOp::Add, coef[1])?;
        for &cf in &coef[2..] {
            self.binary(&y, &r2, &y, BinaryOp::Mul)?;
            self.tensor_scalar(&y, &y, BinaryOp::Add, cf)?;
        }
        if op == "Sin" {
            self.binary(&y, &r, &y, BinaryOp::Mul)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_f, a_s, fold, fold1};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    fn f32s(v: &[f32]) -> HostTensor {
        HostTensor::f32(vec![v.len()], v.to_vec())
    }

    #[test]
    fn activations_fold_in_f32() {
        let x = f32s(&[-2.0, -0.5, 0.0, 1.5]);
        let relu = fold1("Relu", 13, vec![x.clone()], vec![]);
        assert_eq!(relu, f32s(&[0.0, 0.0, 0.0, 1.5]));
        let leaky = fold1("LeakyRelu", 13, vec![x.clone()], vec![a_f("alpha", 0.5)]);
        assert_eq!(leaky, f32s(&[-1.0, -0.25, 0.0, 1.5]));
        let hard = fold1("HardSigmoid", 13, vec![x.clone()], vec![]);
        let hs = |x: f32| (0.2 * x + 0.5f32).clamp(0.0, 1.0);
        assert_eq!(hard, f32s(&[hs(-2.0), hs(-0.5), 0.5, hs(1.5)]));
        let sqrt = fold1("Sqrt", 13, vec![f32s(&[4.0, 2.25])], vec![]);
        assert_eq!(sqrt, f32s(&[2.0, 1.5]));
        // Gelu's two forms agree to f32 precision near 0 and differ by their formula.
        let erf = fold1("Gelu", 20, vec![x.clone()], vec![]);
        let tanh = fold1("Gelu", 20, vec![x], vec![a_s("approximate", "tanh")]);
        let (e, t) = (erf.to_f32s(), tanh.to_f32s());
        assert_eq!(
            (e[2], e[3]),
            (0.0, 0.5 * 1.5 * (1.0 + super::erf(1.5 / 2f32.sqrt())))
        );
        assert!((e[0] - t[0]).abs() < 1e-3 && e[0] != t[0], "{e:?} {t:?}");
    }

    #[test]
    fn integer_activations_fold_only_where_exact() {
        let x = HostTensor::i64(vec![3], vec![i64::MIN, -3, 4]);
        let neg = fold1("Neg", 13, vec![x.clone()], vec![]);
        assert_eq!(neg.to_i64s().as_ref(), &[i64::MIN, 3, -4]);
        let relu = fold1("Relu", 13, vec![x.clone()], vec![]);
        assert_eq!(relu.to_i64s().as_ref(), &[0, 0, 4]);
        // Exp has no integer form on the host: the node stays for the device, which
        // computes it in f32 only.
        let exp = fold("Exp", 13, vec![Some(x)], vec![], 1).unwrap_err();
        assert_eq!(exp.kind, crate::error::ErrorKind::UnsupportedDType, "{exp}");
    }

    #[test]
    fn device_only_activations_do_not_fold() {
        let tan = fold("Tan", 13, vec![Some(f32s(&[0.5]))], vec![], 1).unwrap();
        assert_eq!(tan, vec![None]);
    }

    #[test]
    fn clip_folds_with_input_or_attribute_bounds() {
        let x = f32s(&[-3.0, 0.5, 7.0]);
        let lo = HostTensor::f32(vec![], vec![-1.0]);
        let clip = fold("Clip", 13, vec![Some(x.clone()), Some(lo), None], vec![], 1).unwrap();
        assert_eq!(clip[0], Some(f32s(&[-1.0, 0.5, 7.0])));
        let old = fold1("Clip", 6, vec![x], vec![a_f("min", 0.0), a_f("max", 1.0)]);
        assert_eq!(old, f32s(&[0.0, 0.5, 1.0]));
        // Integer bounds stay exact (computed in f64, not through f32).
        let big = (1i64 << 40) + 1;
        let xi = HostTensor::i64(vec![2], vec![big + 5, -big]);
        let hi = HostTensor::i64(vec![], vec![big]);
        let lo = HostTensor::i64(vec![], vec![-big]);
        let clip = fold1("Clip", 13, vec![xi, lo, hi], vec![]);
        assert_eq!(clip.to_i64s().as_ref(), &[big, -big]);
        assert_eq!(clip.dtype, DType::I64);
    }

    #[test]
    fn erf_is_odd_and_saturates() {
        assert!(super::erf(0.0).abs() < 1e-7);
        assert_eq!(super::erf(-0.5), -super::erf(0.5));
        assert!((super::erf(0.5) - 0.520_499_9).abs() < 2e-7);
        assert!((super::erf(6.0) - 1.0).abs() < 1e-7);
    }
}
