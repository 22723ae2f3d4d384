//! Unary activations: one ACT instruction each (`act_of` names the function), or a short
//! sequence of ACT / DVE instructions for the composite ones (Selu, Mish, PRelu, …).

use super::{Dtypes, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::view::View;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, broadcast_shapes, elementwise_dtype_check, out, require_float};
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
            .device(lower!(lower_activation));
    }
    r.op("Clip", 1, infer_clip)
        .dtypes(Dtypes::Float)
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
