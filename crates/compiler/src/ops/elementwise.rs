//! Elementwise operators on DVE: broadcasting binary arithmetic and comparisons, variadic
//! Max / Min / Sum / Mean, Where, Not, Mod, and the casts. On constants all but Mean and
//! BitCast fold (floats in f32, integers in i64).

use super::unary::{act_of, infer_same};
use super::{Dtypes, Registry};
use crate::error::{ErrorKind, Result};
use crate::eval::{broadcast_to, input, one};
use crate::graph::{Value, ValueId};
use crate::lower::view::View;
use crate::lower::{At, Lowerer};
use crate::params::{
    Ctx, Out, broadcast_all, broadcast_shapes, elementwise_dtype_check, konst, out,
};
use crate::tensor::{Data, HostTensor, dtype_from_onnx, is_float, onnx_type_name};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{ActFunc, BinaryOp, Op};

pub(super) fn register(r: &mut Registry) {
    for name in [
        "Add", "Sub", "Mul", "Div", "Pow", "Equal", "Less", "Greater",
    ] {
        r.op(name, 1, infer_binary)
            .dtypes(Dtypes::Elementwise)
            .folds(fold_binary)
            .device(lower!(lower_binary));
    }
    for name in ["GreaterOrEqual", "LessOrEqual"] {
        r.op(name, 12, infer_binary)
            .dtypes(Dtypes::Elementwise)
            .folds(fold_binary)
            .device(lower!(lower_binary));
    }
    for name in ["And", "Or"] {
        r.op(name, 1, infer_binary)
            .folds(fold_binary)
            .device(lower!(lower_binary));
    }
    for name in ["Max", "Min", "Sum"] {
        r.op(name, 1, infer_variadic)
            .dtypes(Dtypes::Elementwise)
            .folds(fold_variadic)
            .device(lower!(lower_binary));
    }
    r.op("Mean", 1, infer_variadic).device(lower!(lower_mean));
    r.op("Where", 9, infer_where)
        .folds(fold_where)
        .device(lower!(lower_where));
    r.op("Not", 1, infer_same)
        .folds(fold_not)
        .device(lower!(lower_not));
    r.op("Mod", 10, infer_mod)
        .dtypes(Dtypes::Elementwise)
        .folds(fold_mod)
        .device(lower!(lower_mod));
    r.op("Cast", 1, infer_cast)
        .folds(fold_cast)
        .device(lower!(lower_cast));
    r.op("CastLike", 15, infer_cast_like)
        .folds(fold_cast)
        .device(lower!(lower_cast));
    r.op("BitCast", 26, infer_bit_cast)
        .note("types of one width: a copy of the bits")
        .device(lower!(lower_bit_cast));
}

/// BitCast: the bits reinterpreted as `to`, of the same width (shape unchanged).
pub(crate) fn infer_bit_cast(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let to = c.n.attr_i("to", 0)? as i32;
    let d = dtype_from_onnx(to).ok_or_else(|| {
        c.e(
            ErrorKind::UnsupportedDType,
            format!("bit cast to {}", onnx_type_name(to)),
        )
    })?;
    if d.size() != x.dtype.size() {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "bit cast of {} ({} bytes) to {d} ({} bytes): the widths differ",
                x.dtype,
                x.dtype.size(),
                d.size()
            ),
        ));
    }
    Ok(vec![out(d, x.shape.clone())])
}

/// Broadcasting binary operators (comparisons give bool).
pub(crate) fn infer_binary(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let op = n.op.as_str();
    let a = c.input(0)?;
    let b = c.input(1)?;
    if op != "Pow" {
        elementwise_dtype_check(c, &[a, b])?;
    }
    let s = broadcast_all(c, &[a, b])?;
    let d = if matches!(
        op,
        "Equal" | "Less" | "Greater" | "GreaterOrEqual" | "LessOrEqual"
    ) {
        DType::Bool
    } else {
        a.dtype
    };
    Ok(vec![out(d, s)])
}

/// Variadic Max / Min / Sum / Mean.
pub(crate) fn infer_variadic(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let vals: Vec<&Value> = (0..n.inputs.len()).filter_map(|i| c.opt(i)).collect();
    if vals.is_empty() {
        return Err(c.bad_attr("no inputs"));
    }
    let d = elementwise_dtype_check(c, &vals)?;
    Ok(vec![out(d, broadcast_all(c, &vals)?)])
}

/// Where: a bool condition selects between two broadcast inputs.
pub(crate) fn infer_where(c: &Ctx) -> Result<Vec<Out>> {
    let (cond, a, b) = (c.input(0)?, c.input(1)?, c.input(2)?);
    if cond.dtype != DType::Bool {
        return Err(c.e(ErrorKind::UnsupportedDType, "condition is not bool"));
    }
    elementwise_dtype_check(c, &[a, b])?;
    Ok(vec![out(a.dtype, broadcast_all(c, &[cond, a, b])?)])
}

/// Mod (floating-point inputs need `fmod = 1`).
pub(crate) fn infer_mod(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let (a, b) = (c.input(0)?, c.input(1)?);
    elementwise_dtype_check(c, &[a, b])?;
    if is_float(a.dtype) && n.attr_i("fmod", 0)? != 1 {
        return Err(c.bad_attr("fmod must be 1 for floating-point inputs"));
    }
    Ok(vec![out(a.dtype, broadcast_all(c, &[a, b])?)])
}

/// Mod's `fmod` attribute: the remainder takes the dividend's sign (C's `fmod`), else the
/// divisor's (Python's `%`).
fn fmod(c: &Ctx) -> Result<bool> {
    Ok(c.n.attr_i("fmod", 0)? != 0)
}

/// Cast to the `to` element type.
pub(crate) fn infer_cast(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let to = n.attr_i("to", 0)? as i32;
    let d = dtype_from_onnx(to).ok_or_else(|| {
        c.e(
            ErrorKind::UnsupportedDType,
            format!("cast to {}", onnx_type_name(to)),
        )
    })?;
    if n.attr_i("saturate", 1)? != 1 && is_float(d) {
        // saturate only concerns float8 targets
    }
    Ok(vec![out(d, x.shape.clone())])
}

/// CastLike: cast to the element type of the second input.
pub(crate) fn infer_cast_like(c: &Ctx) -> Result<Vec<Out>> {
    // Cast to the element type of the second input (only its type matters).
    let (x, like) = (c.input(0)?, c.input(1)?);
    Ok(match &x.konst {
        // Folds whenever the data is constant (the second input is not read).
        Some(t) => vec![konst(t.cast(like.dtype))],
        None => vec![out(like.dtype, x.shape.clone())],
    })
}

/// Binary operator `op` of `a` and `b` broadcast to `shape`, on the host: arithmetic in f32
/// (Pow also of an integer exponent) or wrapping i64 (division by 0 gives 0), comparisons
/// (bool) in the first input's kind, And / Or on integers. `None` for other operand kinds.
fn host_binary(op: &str, a: &HostTensor, b: &HostTensor, shape: &[usize]) -> Option<HostTensor> {
    let va = broadcast_to(a, shape);
    let vb = broadcast_to(b, shape);
    let cmp = matches!(
        op,
        "Equal" | "Less" | "Greater" | "GreaterOrEqual" | "LessOrEqual"
    );
    Some(match (&va.data, &vb.data) {
        (Data::F32(x), Data::F32(y)) if !cmp => {
            let f: fn(f32, f32) -> f32 = match op {
                "Add" | "Sum" => |p, q| p + q,
                "Sub" => |p, q| p - q,
                "Mul" => |p, q| p * q,
                "Div" => |p, q| p / q,
                "Pow" => f32::powf,
                "Max" => f32::max,
                "Min" => f32::min,
                _ => return None,
            };
            let v = x.iter().zip(y).map(|(&p, &q)| f(p, q)).collect();
            HostTensor::f32(shape.to_vec(), v).cast(a.dtype)
        }
        (Data::F32(x), Data::I64(y)) if op == "Pow" => {
            let v = x.iter().zip(y).map(|(&p, &q)| p.powf(q as f32)).collect();
            HostTensor::f32(shape.to_vec(), v).cast(a.dtype)
        }
        _ if cmp => {
            let x = va.to_f32s();
            let y = vb.to_f32s();
            let (xi, yi) = (va.to_i64s(), vb.to_i64s());
            let fl = is_float(a.dtype);
            let v = (0..x.len())
                .map(|i| {
                    let r = if fl {
                        match op {
                            "Equal" => x[i] == y[i],
                            "Less" => x[i] < y[i],
                            "GreaterOrEqual" => x[i] >= y[i],
                            "LessOrEqual" => x[i] <= y[i],
                            _ => x[i] > y[i],
                        }
                    } else {
                        match op {
                            "Equal" => xi[i] == yi[i],
                            "Less" => xi[i] < yi[i],
                            "GreaterOrEqual" => xi[i] >= yi[i],
                            "LessOrEqual" => xi[i] <= yi[i],
                            _ => xi[i] > yi[i],
                        }
                    };
                    r as i64
                })
                .collect();
            HostTensor::ints(DType::Bool, shape.to_vec(), v)
        }
        (Data::I64(x), Data::I64(y)) => {
            let f: fn(i64, i64) -> i64 = match op {
                "Add" | "Sum" => i64::wrapping_add,
                "Sub" => i64::wrapping_sub,
                "Mul" => i64::wrapping_mul,
                "Div" => |p, q| if q == 0 { 0 } else { p.wrapping_div(q) },
                "Pow" => |p, q| p.wrapping_pow(q.clamp(0, u32::MAX as i64) as u32),
                "Max" => i64::max,
                "Min" => i64::min,
                "And" => |p, q| (p != 0 && q != 0) as i64,
                "Or" => |p, q| (p != 0 || q != 0) as i64,
                _ => return None,
            };
            let v = x.iter().zip(y).map(|(&p, &q)| f(p, q)).collect();
            HostTensor::ints(a.dtype, shape.to_vec(), v)
        }
        _ => return None,
    })
}

/// Folds a broadcasting binary operator ([`host_binary`]).
fn fold_binary(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let (a, b) = (input(c, 0), input(c, 1));
    Ok(host_binary(&c.n.op, a, b, &outs[0].shape).map(|t| vec![t]))
}

/// Folds variadic Max / Min / Sum: [`host_binary`] from the first input on, then
/// broadcast to the output's shape.
fn fold_variadic(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let (n, o0) = (c.n, &outs[0]);
    let vals: Vec<&HostTensor> = (0..n.inputs.len()).filter_map(|i| c.konst(i)).collect();
    let mut acc = vals[0].clone();
    for v in &vals[1..] {
        let s = broadcast_shapes(&acc.shape, &v.shape).expect("inferred");
        match host_binary(&n.op, &acc, v, &s) {
            Some(t) => acc = t,
            None => return Ok(None),
        }
    }
    one(broadcast_to(&acc, &o0.shape))
}

/// Folds Mod: floats by Rust's `%` (C's `fmod`: the only mode ONNX allows them), integers
/// wrapping, by the sign rule of [`fmod`] (a zero divisor gives 0).
fn fold_mod(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let fmod = fmod(c)?;
    let s = &outs[0].shape;
    let a = broadcast_to(input(c, 0), s);
    let b = broadcast_to(input(c, 1), s);
    if is_float(a.dtype) {
        let (x, y) = (a.to_f32s(), b.to_f32s());
        let v = x.iter().zip(y.iter()).map(|(&p, &q)| (p % q) as f64);
        return one(HostTensor::from_f64s(a.dtype, s.clone(), v));
    }
    let (x, y) = (a.to_i64s(), b.to_i64s());
    let v = x
        .iter()
        .zip(y.iter())
        .map(|(&p, &q)| {
            if q == 0 {
                0
            } else if fmod {
                p.wrapping_rem(q)
            } else {
                let r = p.wrapping_rem(q);
                if r != 0 && (r < 0) != (q < 0) {
                    r + q
                } else {
                    r
                }
            }
        })
        .collect();
    one(HostTensor::ints(a.dtype, s.clone(), v))
}

/// Folds Where: the three inputs broadcast, then selected element by element.
fn fold_where(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let s = &outs[0].shape;
    let cond = broadcast_to(input(c, 0), s);
    let cond = cond.to_i64s();
    let a = broadcast_to(input(c, 1), s);
    let b = broadcast_to(input(c, 2), s);
    let data = match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => Data::F32(
            (0..cond.len())
                .map(|i| if cond[i] != 0 { x[i] } else { y[i] })
                .collect(),
        ),
        (Data::I64(x), Data::I64(y)) => Data::I64(
            (0..cond.len())
                .map(|i| if cond[i] != 0 { x[i] } else { y[i] })
                .collect(),
        ),
        _ => return Ok(None),
    };
    one(HostTensor {
        dtype: a.dtype,
        shape: s.clone(),
        data,
    })
}

/// Folds Not.
fn fold_not(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let v = input(c, 0)
        .to_i64s()
        .iter()
        .map(|&x| (x == 0) as i64)
        .collect();
    one(HostTensor::ints(DType::Bool, outs[0].shape.clone(), v))
}

/// Folds Cast / CastLike to the inferred output type ([`HostTensor::cast`]).
fn fold_cast(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    one(input(c, 0).cast(outs[0].dtype))
}

impl<'a> Lowerer<'a> {
    /// Cast / CastLike: a converting copy on DVE — except a bf16 or f16 matrix widened
    /// only to be a MatMul's B (a weight bound as a half-precision input, `MatMul(x,
    /// Cast(W))`): the product reads the half values itself (the device's MatMul takes an
    /// f32 A and a bf16/f16 B and widens B in registers), so no f32 copy of the weight is
    /// made or stored.
    pub(crate) fn lower_cast(&mut self, at: At<'a>) -> Result<()> {
        if let Some(src) = self.half_product_operand(at)? {
            self.loc[at.o0] = Some(src);
            self.owns[at.o0] = false;
            return Ok(());
        }
        let src = self.input_view(at.n, 0)?;
        self.copy_out(Engine::Dve, &src, at.o0)
    }

    /// The half-precision view a Cast's output may stand for, when the Cast widens a 2-D
    /// bf16/f16 value to f32 for a MatMul that alone reads it, as its B, with an f32 A.
    fn half_product_operand(&mut self, at: At<'a>) -> Result<Option<View>> {
        let g = at.g;
        let Some(x) = at.n.inputs.first().copied().flatten() else {
            return Ok(None);
        };
        let (xv, ov) = (&g.values[x], &g.values[at.o0]);
        if !matches!(xv.dtype, DType::Bf16 | DType::F16)
            || ov.dtype != DType::F32
            || xv.shape.len() != 2
            || xv.konst.is_some()
        {
            return Ok(None);
        }
        let Some(j) = self.sole_consumer(at.o0) else {
            return Ok(None);
        };
        let mm = &g.nodes[j];
        let reads_as_b = mm.op == "MatMul"
            && mm.inputs.len() == 2
            && mm.inputs[1] == Some(at.o0)
            && mm.inputs[0] != Some(at.o0)
            && mm.inputs[0].is_some_and(|a| g.values[a].dtype == DType::F32);
        if !reads_as_b {
            return Ok(None);
        }
        let v = self.sview(x)?;
        Ok((v.strides.iter().all(|&s| s >= 0)).then_some(v))
    }

    /// BitCast: a DVE copy into the output's buffer seen with the input's element type
    /// (same width: the bits move unchanged).
    pub(crate) fn lower_bit_cast(&mut self, at: At<'a>) -> Result<()> {
        let src = self.input_view(at.n, 0)?;
        let y = self.alloc(at.o0);
        let dst = View {
            dtype: src.dtype,
            ..y
        };
        self.copy(Engine::Dve, &src, &dst)
    }

    /// Where: a select on DVE.
    pub(crate) fn lower_where(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let cond = self.input_view(n, 0)?.broadcast(oshape);
        let a = self.input_view(n, 1)?.broadcast(oshape);
        let b = self.input_view(n, 2)?.broadcast(oshape);
        let y = self.alloc(o0);
        self.select(&cond, &a, &b, &y)?;
        Ok(())
    }

    /// Not: a select between constant false and true.
    pub(crate) fn lower_not(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, oshape, .. } = at;
        let x = self.input_view(n, 0)?;
        let f = self.add_const(&HostTensor::ints(DType::Bool, vec![1], vec![0]))?;
        let t = self.add_const(&HostTensor::ints(DType::Bool, vec![1], vec![1]))?;
        let fv = View::dense(f, DType::Bool, &[1]).broadcast(oshape);
        let tv = View::dense(t, DType::Bool, &[1]).broadcast(oshape);
        let y = self.alloc(o0);
        self.select(&x, &fv, &tv, &y)?;
        Ok(())
    }

    /// Mean: the Sum, then one scaling.
    pub(crate) fn lower_mean(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, .. } = at;
        self.lower_binary(at)?;
        let y = self.sview(o0)?;
        let k = n.inputs.iter().flatten().count() as f32;
        self.emit_nd(0, Engine::Dve, &[&y, &y], |a| {
            Op::TensorScalar(op::TensorScalar {
                a: a[0],
                out: a[1],
                op: BinaryOp::Mul,
                scalar: 1.0 / k,
                reverse: false,
            })
        })?;
        Ok(())
    }

    pub(crate) fn lower_binary(&mut self, at: At<'a>) -> Result<()> {
        let (ni, g, n, c, op, o0) = (at.ni, at.g, at.n, at.c, at.op, at.o0);
        let oshape = g.values[o0].shape.clone();
        let bop = match op {
            "Add" | "Sum" | "Mean" => BinaryOp::Add,
            "Sub" => BinaryOp::Sub,
            "Mul" => BinaryOp::Mul,
            "Div" => BinaryOp::Div,
            "Pow" => BinaryOp::Pow,
            "Max" => BinaryOp::Max,
            "Min" => BinaryOp::Min,
            "Equal" => BinaryOp::Equal,
            "Greater" | "GreaterOrEqual" => BinaryOp::Greater,
            "Less" | "LessOrEqual" => BinaryOp::Less,
            "And" => BinaryOp::And,
            _ => BinaryOp::Or,
        };
        // a ≥ b is (a > b) ∨ (a = b): false with a NaN, like the operator.
        let or_equal = matches!(op, "GreaterOrEqual" | "LessOrEqual");
        let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
        // Types the DVE does not compute go through a wider one and back.
        let wide = |d: DType| match d {
            DType::F32 | DType::I32 | DType::I64 | DType::Bool => d,
            DType::F16 | DType::Bf16 | DType::F64 => DType::F32,
            _ => DType::I64,
        };
        let cd = if bop == BinaryOp::Pow {
            DType::F32
        } else {
            wide(g.values[ins[0]].dtype)
        };
        let odt = g.values[o0].dtype;
        if ins.iter().any(|&v| g.values[v].dtype != cd) || (odt != cd && odt != DType::Bool) {
            let mut views = Vec::new();
            for &v in &ins {
                let x = self.view(v)?;
                views.push(self.converted(x, cd)?.broadcast(&oshape));
            }
            let rdt = if bop.is_comparison() { DType::Bool } else { cd };
            let y = self.alloc(o0);
            let acc = if rdt == odt {
                y.clone()
            } else {
                View::dense(
                    self.temp(y.shape.iter().product::<usize>() * rdt.size()),
                    rdt,
                    &oshape,
                )
            };
            self.binary(&views[0], &views[1], &acc, bop)?;
            if or_equal {
                self.or_equal(&views[0], &views[1], &acc)?;
            }
            for v in &views[2..] {
                self.binary(&acc, v, &acc, bop)?;
            }
            if rdt != odt {
                self.copy(Engine::Dve, &acc, &y)?;
            }
            return Ok(());
        }
        if ins.len() == 1 {
            let x = self.view(ins[0])?;
            let y = self.alloc(o0);
            return self.copy(Engine::Dve, &x.broadcast(&oshape), &y);
        }
        if ins.len() == 2
            && g.values[ins[0]].dtype == DType::F32
            && g.values[o0].dtype == DType::F32
        {
            // One side a compile-time scalar: TensorScalar (or an activation).
            for (k, other) in [(1usize, 0usize), (0, 1)] {
                let kv = &g.values[ins[k]];
                let Some(t) = kv.konst.as_deref() else {
                    continue;
                };
                if t.len() != 1 || g.values[ins[other]].shape != oshape {
                    continue;
                }
                let s = t.get_f64(0) as f32;
                if s.is_nan() {
                    // An instruction's immediate cannot be NaN (the model would not validate):
                    // the general path reads the constant from memory.
                    continue;
                }
                let x = self.sview(ins[other])?;
                if bop == BinaryOp::Pow && k == 1 {
                    // Small integer and half powers without `powf`.
                    let f = match s {
                        1.0 => Some(ActFunc::Identity),
                        2.0 | 3.0 | 4.0 => Some(ActFunc::Square),
                        0.5 => Some(ActFunc::Sqrt),
                        -0.5 => Some(ActFunc::Rsqrt),
                        -1.0 => Some(ActFunc::Reciprocal),
                        _ => None,
                    };
                    if let Some(f) = f {
                        if s == 3.0 {
                            // x² then x²·x (not in place: x is read again).
                            let y = self.alloc_any(o0)?;
                            self.activation(&x, &y, None, (f, 0.0, 0.0), 1.0)?;
                            return self.binary(&y, &x, &y, BinaryOp::Mul);
                        }
                        let y = self.alloc_over(ins[other], &[ni], o0)?;
                        self.activation(&x, &y, None, (f, 0.0, 0.0), 1.0)?;
                        if s == 4.0 {
                            self.activation(&y, &y, None, (f, 0.0, 0.0), 1.0)?;
                        }
                        return Ok(());
                    }
                }
                if matches!(bop, BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater) {
                    break;
                }
                let y = self.alloc_over(ins[other], &[ni], o0)?;
                return self.emit_nd(0, Engine::Dve, &[&x, &y], |a| {
                    Op::TensorScalar(op::TensorScalar {
                        a: a[0],
                        out: a[1],
                        op: bop,
                        scalar: s,
                        reverse: k == 0,
                    })
                });
            }
            // Bias add on ACT, fused with a following activation when possible.
            if bop == BinaryOp::Add {
                for (k, other) in [(1usize, 0usize), (0, 1)] {
                    if g.values[ins[k]].konst.is_none() || g.values[ins[other]].shape != oshape {
                        continue;
                    }
                    let x = self.sview(ins[other])?;
                    let bias = self.sview(ins[k])?.broadcast(&oshape);
                    let fused = self.sole_consumer(o0).and_then(|j| {
                        let cj = Ctx { g, n: &g.nodes[j] };
                        act_of(&cj).ok().flatten().map(|f| (j, f))
                    });
                    if let Some((j, f)) = fused {
                        let oj = self.out(j, 0)?;
                        let y = self.alloc_over(ins[other], &[ni], oj)?;
                        self.activation(&x, &y, Some(&bias), f, 1.0)?;
                        self.skip[j] = true;
                        return self.finish_value(oj);
                    }
                    let y = self.alloc_over(ins[other], &[ni], o0)?;
                    return self.activation(
                        &x,
                        &y,
                        Some(&bias),
                        (ActFunc::Identity, 0.0, 0.0),
                        1.0,
                    );
                }
            }
        }
        let _ = c;
        let first = self.sview(ins[0])?.broadcast(&oshape);
        let second = self.sview(ins[1])?.broadcast(&oshape);
        let y = if ins.len() == 2 && !or_equal {
            // In place over an operand of the output's shape that nothing else reads.
            match self.in_place(ins[0], &[ni], o0) {
                Some(y) => y,
                None => self.alloc_over(ins[1], &[ni], o0)?,
            }
        } else {
            self.alloc_any(o0)?
        };
        self.binary(&first, &second, &y, bop)?;
        if or_equal {
            return self.or_equal(&first, &second, &y);
        }
        for &v in &ins[2..] {
            let x = self.view(v)?.broadcast(&oshape);
            self.binary(&y, &x, &y, bop)?;
        }
        Ok(())
    }

    /// `y ∨= (a = b)` for a boolean `y` of `a` and `b`'s (broadcast) shape.
    pub(crate) fn or_equal(&mut self, a: &View, b: &View, y: &View) -> Result<()> {
        let eq = View::dense(
            self.temp(y.shape.iter().product::<usize>()),
            DType::Bool,
            &y.shape,
        );
        self.binary(a, b, &eq, BinaryOp::Equal)?;
        self.binary(y, &eq, y, BinaryOp::Or)
    }

    /// Mod. Integers (through i64 when narrower): `r = a − (a/b)·b` with the truncating
    /// division, and without `fmod` the remainder takes the divisor's sign: `r + b` where
    /// `r` and `b` have opposite signs (`b < 0 ? r > 0 : r < 0`). Floats (`fmod` only):
    /// `a − b·trunc(a/b)`, `trunc` by Floor/Ceil on the quotient's sign.
    pub(crate) fn lower_mod(&mut self, at: At<'a>) -> Result<()> {
        let At { g, n, c, o0, .. } = at;
        let fmod = fmod(&c)?;
        let sh = g.values[o0].shape.clone();
        let odt = g.values[o0].dtype;
        let total: usize = sh.iter().product();
        let float = crate::tensor::is_float(odt);
        let cd = match odt {
            DType::I32 | DType::I64 => odt,
            _ if float => DType::F32,
            _ => DType::I64,
        };
        let mut ops = Vec::new();
        for v in n.inputs.iter().flatten().copied() {
            let x = self.sview(v)?;
            ops.push(self.converted(x, cd)?.broadcast(&sh));
        }
        let (a, b) = (ops[0].clone(), ops[1].clone());
        let y = self.alloc(o0);
        if total == 0 {
            return Ok(());
        }
        let tmp = |l: &mut Self, d: DType| View::dense(l.temp(total * d.size()), d, &sh);
        let acc = if odt == cd { y.clone() } else { tmp(self, cd) };
        let zc = self.add_const(&HostTensor::from_f64s(cd, vec![1], std::iter::once(0.0)))?;
        let zero = View::dense(zc, cd, &[1]).broadcast(&sh);
        let t = tmp(self, cd);
        self.binary(&a, &b, &t, BinaryOp::Div)?;
        if float {
            let neg = tmp(self, DType::Bool);
            self.binary(&t, &zero, &neg, BinaryOp::Less)?;
            let fl = tmp(self, cd);
            self.activation(&t, &fl, None, (ActFunc::Floor, 0.0, 0.0), 1.0)?;
            self.activation(&t, &t, None, (ActFunc::Ceil, 0.0, 0.0), 1.0)?;
            self.select(&neg, &t, &fl, &t)?;
        }
        self.binary(&t, &b, &t, BinaryOp::Mul)?;
        self.binary(&a, &t, &acc, BinaryOp::Sub)?;
        if !fmod && !float {
            let (neg_r, pos_r, neg_b) = (
                tmp(self, DType::Bool),
                tmp(self, DType::Bool),
                tmp(self, DType::Bool),
            );
            self.binary(&acc, &zero, &neg_r, BinaryOp::Less)?;
            self.binary(&acc, &zero, &pos_r, BinaryOp::Greater)?;
            self.binary(&b, &zero, &neg_b, BinaryOp::Less)?;
            self.select(&neg_b, &pos_r, &neg_r, &neg_r)?;
            self.binary(&acc, &b, &t, BinaryOp::Add)?;
            self.select(&neg_r, &t, &acc, &acc)?;
        }
        if odt != cd {
            self.copy(Engine::Dve, &acc, &y)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, fold, fold1};
    use crate::tensor::{HostTensor, dtype_to_onnx};
    use nrt_hal::DType;

    fn f32s(shape: &[usize], v: &[f32]) -> HostTensor {
        HostTensor::f32(shape.to_vec(), v.to_vec())
    }

    fn i64s(shape: &[usize], v: &[i64]) -> HostTensor {
        HostTensor::i64(shape.to_vec(), v.to_vec())
    }

    fn bools(t: &HostTensor) -> Vec<i64> {
        assert_eq!(t.dtype, DType::Bool);
        t.to_i64s().into_owned()
    }

    #[test]
    fn binary_arithmetic_broadcasts() {
        let a = f32s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let b = f32s(&[2], &[10.0, 0.5]);
        let sum = fold1("Add", 14, vec![a.clone(), b.clone()], vec![]);
        assert_eq!(sum, f32s(&[2, 2], &[11.0, 2.5, 13.0, 4.5]));
        let quot = fold1("Div", 14, vec![a.clone(), b], vec![]);
        assert_eq!(quot, f32s(&[2, 2], &[0.1, 4.0, 0.3, 8.0]));
        // A float base with an integer exponent.
        let pow = fold1("Pow", 15, vec![a, i64s(&[], &[2])], vec![]);
        assert_eq!(pow, f32s(&[2, 2], &[1.0, 4.0, 9.0, 16.0]));
    }

    #[test]
    fn integer_arithmetic_wraps_and_divides_by_zero_to_zero() {
        let a = i64s(&[3], &[i64::MAX, 7, -7]);
        let b = i64s(&[3], &[1, 0, 2]);
        let sum = fold1("Add", 14, vec![a.clone(), b.clone()], vec![]);
        assert_eq!(sum.to_i64s().as_ref(), &[i64::MIN, 7, -5]);
        let quot = fold1("Div", 14, vec![a, b], vec![]);
        assert_eq!(quot.to_i64s().as_ref(), &[i64::MAX, 0, -3]);
    }

    #[test]
    fn comparisons_and_logic_give_bool() {
        let a = f32s(&[3], &[1.0, 2.0, 3.0]);
        let two = f32s(&[], &[2.0]);
        let ge = fold1("GreaterOrEqual", 16, vec![a.clone(), two.clone()], vec![]);
        assert_eq!(bools(&ge), [0, 1, 1]);
        let lt = fold1("Less", 13, vec![a, two], vec![]);
        assert_eq!(bools(&lt), [1, 0, 0]);
        // Integers compare exactly (2^53 + 1 ≠ 2^53 though equal as f32).
        let big = i64s(&[1], &[(1 << 53) + 1]);
        let eq = fold1("Equal", 13, vec![big, i64s(&[1], &[1 << 53])], vec![]);
        assert_eq!(bools(&eq), [0]);
        let t = HostTensor::ints(DType::Bool, vec![2], vec![1, 0]);
        let f = HostTensor::ints(DType::Bool, vec![2], vec![1, 1]);
        let and = fold1("And", 7, vec![t.clone(), f.clone()], vec![]);
        assert_eq!(bools(&and), [1, 0]);
        let not = fold1("Not", 1, vec![t], vec![]);
        assert_eq!(bools(&not), [0, 1]);
    }

    #[test]
    fn variadic_max_min_sum_fold_mean_does_not() {
        let a = f32s(&[2, 1], &[1.0, 5.0]);
        let b = f32s(&[3], &[0.0, 2.0, 4.0]);
        let c = f32s(&[], &[3.0]);
        let max = fold1("Max", 13, vec![a.clone(), b.clone(), c.clone()], vec![]);
        assert_eq!(max, f32s(&[2, 3], &[3.0, 3.0, 4.0, 5.0, 5.0, 5.0]));
        let sum = fold1("Sum", 13, vec![a.clone(), b.clone()], vec![]);
        assert_eq!(sum, f32s(&[2, 3], &[1.0, 3.0, 5.0, 5.0, 7.0, 9.0]));
        // One input: broadcast to the output's shape, which is its own.
        let min = fold1("Min", 13, vec![b.clone()], vec![]);
        assert_eq!(min, b);
        // Mean has no folding hook: the node stays for the device.
        let mean = fold("Mean", 13, vec![Some(a), Some(b)], vec![], 1).unwrap();
        assert_eq!(mean, vec![None]);
    }

    #[test]
    fn modulo_follows_the_divisor_sign_unless_fmod() {
        let a = i64s(&[4], &[7, -7, 7, 5]);
        let b = i64s(&[4], &[3, 3, -3, 0]);
        let m = fold1("Mod", 13, vec![a.clone(), b.clone()], vec![]);
        assert_eq!(m.to_i64s().as_ref(), &[1, 2, -2, 0]);
        let f = fold1("Mod", 13, vec![a, b], vec![a_i("fmod", 1)]);
        assert_eq!(f.to_i64s().as_ref(), &[1, -1, 1, 0]);
        let x = f32s(&[2], &[-7.5, 7.5]);
        let y = f32s(&[], &[2.0]);
        let f = fold1("Mod", 13, vec![x, y], vec![a_i("fmod", 1)]);
        assert_eq!(f, f32s(&[2], &[-1.5, 1.5]));
    }

    #[test]
    fn where_selects_between_broadcast_inputs() {
        let cond = HostTensor::ints(DType::Bool, vec![2, 1], vec![1, 0]);
        let a = i64s(&[2], &[1, 2]);
        let b = i64s(&[], &[-1]);
        let w = fold1("Where", 16, vec![cond, a, b], vec![]);
        assert_eq!(w, i64s(&[2, 2], &[1, 2, -1, -1]));
    }

    #[test]
    fn casts_fold_to_the_inferred_type() {
        let x = f32s(&[3], &[1.9, -1.9, 0.0]);
        let to = a_i("to", i64::from(dtype_to_onnx(DType::I64)));
        let c = fold1("Cast", 13, vec![x.clone()], vec![to]);
        assert_eq!(
            (c.dtype, c.to_i64s().as_ref()),
            (DType::I64, &[1, -1, 0][..])
        );
        let like = HostTensor::ints(DType::Bool, vec![1], vec![0]);
        let c = fold1("CastLike", 15, vec![x, like], vec![]);
        assert_eq!(
            (c.dtype, c.to_i64s().as_ref()),
            (DType::Bool, &[1, 1, 0][..])
        );
    }
}
