//! Normalizations: LayerNormalization, BatchNormalization (inference), Instance / Group /
//! RMS normalization, LRN, and the row operations Softmax / LogSoftmax.

use super::Registry;
use super::unary::act_of;
use crate::error::{ErrorKind, Result};
use crate::graph::{Node, Value, ValueId};
use crate::lower::view::{View, mk_ap, simplify};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, broadcast_shapes, out, require_float, unsupported_outputs};
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, BinaryOp, Op, PoolOp, ReduceOp, Window};

pub(super) fn register(r: &mut Registry) {
    r.op("LayerNormalization", 17, infer_layer_norm)
        .f32_on_device()
        .device(lower!(lower_layer_norm));
    r.op("BatchNormalization", 1, infer_batch_norm)
        .f32_on_device()
        .note("inference mode: constant parameters; training_mode = 1: decomposed (batch statistics, running mean and variance)")
        .expands_when(
            |_, n| n.attr_i("training_mode", 0).is_ok_and(|t| t != 0),
            expand_batch_norm_training,
        )
        .device(lower!(lower_batch_norm));
    r.op("InstanceNormalization", 1, infer_group_norm)
        .device(lower!(lower_group_norm));
    r.op("GroupNormalization", 18, infer_group_norm)
        .device(lower!(lower_group_norm));
    r.op("RMSNormalization", 23, infer_rms_norm)
        .device(lower!(lower_rms_norm));
    r.op("LRN", 1, infer_lrn)
        .f32_on_device()
        .device(lower!(lower_lrn));
    for name in ["Softmax", "LogSoftmax"] {
        r.op(name, 1, infer_softmax)
            .f32_on_device()
            .device(lower!(lower_softmax));
    }
}

/// LayerNormalization (with its optional Mean and InvStdDev outputs).
pub(crate) fn infer_layer_norm(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let axis = c.norm_axis(n.attr_i("axis", -1)?, x.shape.len())?;
    let norm: usize = x.shape[axis..].iter().product();
    for i in [1, 2] {
        if let Some(p) = c.opt(i)
            && (p.elements() != norm
                || broadcast_shapes(&p.shape, &x.shape).as_deref() != Some(&x.shape[..]))
        {
            return Err(c.mismatch(format!(
                "scale/bias shape {:?} does not match the normalized shape {:?}",
                p.shape,
                &x.shape[axis..]
            )));
        }
    }
    let mut stat = x.shape[..axis].to_vec();
    stat.resize(x.shape.len(), 1);
    Ok(vec![
        out(x.dtype, x.shape.clone()),
        out(DType::F32, stat.clone()),
        out(DType::F32, stat),
    ])
}

/// BatchNormalization with `training_mode` = 1 as the ONNX reference computes it: the
/// batch mean and (population) variance over every axis but 1 normalize the input, and the
/// optional outputs are the running statistics `input · momentum + batch · (1 − momentum)`.
fn expand_batch_norm_training(g: &mut crate::graph::Graph, ni: usize) -> Result<()> {
    use super::attention::{Expansion, a_int, a_ints, g_splice};
    let n = g.nodes[ni].clone();
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(x), Some(scale), Some(bias), Some(mean_in), Some(var_in)) =
        (input(0), input(1), input(2), input(3), input(4))
    else {
        return Err(n.error(ErrorKind::BadAttribute, "BatchNormalization needs 5 inputs"));
    };
    let Some(Some(y)) = n.outputs.first().copied() else {
        return Err(n.error(
            ErrorKind::BadAttribute,
            "BatchNormalization needs its output",
        ));
    };
    let rank = g.values[x].shape.len();
    if rank < 2 {
        return Err(n.error(ErrorKind::ShapeMismatch, "input of rank < 2"));
    }
    let ch = g.values[x].shape[1];
    let dtype = g.values[x].dtype;
    let eps = epsilon(&n)? as f64;
    let momentum = n.attr_finite_f("momentum", 0.9)? as f64;
    let axes: Vec<i64> = (0..rank as i64).filter(|&a| a != 1).collect();
    let opset = g.opset;
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let mean = |e: &mut Expansion<'_>, v: usize| {
        if opset >= 18 {
            let a = e.ints("axes", &axes);
            e.node("ReduceMean", &[v, a], vec![a_int("keepdims", 1)], None)
        } else {
            let attrs = vec![a_int("keepdims", 1), a_ints("axes", &axes)];
            e.node("ReduceMean", &[v], attrs, None)
        }
    };
    let mut cshape = vec![ch as i64];
    cshape.resize(rank - 1, 1);
    let cs = e.ints("cshape", &cshape);
    let m = mean(&mut e, x);
    let d = e.node("Sub", &[x, m], vec![], None);
    let d2 = e.node("Mul", &[d, d], vec![], None);
    let var = mean(&mut e, d2);
    let epsv = e.scalar("eps", dtype, eps);
    let ve = e.node("Add", &[var, epsv], vec![], None);
    let sd = e.node("Sqrt", &[ve], vec![], None);
    let norm = e.node("Div", &[d, sd], vec![], None);
    let sc = e.node("Reshape", &[scale, cs], vec![], None);
    let bi = e.node("Reshape", &[bias, cs], vec![], None);
    let scaled = e.node("Mul", &[norm, sc], vec![], None);
    e.node("Add", &[scaled, bi], vec![], Some(y));
    for (k, batch, running) in [(1usize, m, mean_in), (2, var, var_in)] {
        let Some(Some(o)) = n.outputs.get(k).copied() else {
            continue;
        };
        let flat = e.ints("flat", &[ch as i64]);
        let b = e.node("Reshape", &[batch, flat], vec![], None);
        let rdt = e.g.values[running].dtype;
        let mom = e.scalar("momentum", rdt, momentum);
        let rest = e.scalar("one_minus_momentum", rdt, 1.0 - momentum);
        let bc = if rdt == dtype {
            b
        } else {
            let to = crate::tensor::dtype_to_onnx(rdt) as i64;
            e.node("Cast", &[b], vec![a_int("to", to)], None)
        };
        let r1 = e.node("Mul", &[running, mom], vec![], None);
        let r2 = e.node("Mul", &[bc, rest], vec![], None);
        e.node("Add", &[r1, r2], vec![], Some(o));
    }
    let Expansion { g, nodes, .. } = e;
    g_splice(g, ni, nodes);
    Ok(())
}

/// BatchNormalization: inference mode, per-channel constant parameters.
pub(crate) fn infer_batch_norm(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    if n.attr_i("training_mode", 0)? != 0 {
        return Err(c.e(ErrorKind::UnsupportedOp, "training_mode = 1"));
    }
    unsupported_outputs(c, 1)?;
    if x.shape.len() < 2 {
        return Err(c.mismatch("input of rank < 2"));
    }
    let ch = x.shape[1];
    for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
        c.const_floats(i, what)?;
    }
    for i in 1..5 {
        channel_param(c, c.input(i)?, ch, ch)?;
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// Checks that per-channel parameter `p` has `ch` (or `alt`) elements.
fn channel_param(c: &Ctx, p: &Value, ch: usize, alt: usize) -> Result<()> {
    if p.elements() != ch && p.elements() != alt {
        return Err(c.mismatch(format!(
            "parameter '{}' has {} elements for {ch} channels",
            p.name,
            p.elements()
        )));
    }
    Ok(())
}

/// Instance / Group normalization.
pub(crate) fn infer_group_norm(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let op = n.op.as_str();
    let (x, scale, bias) = (c.input(0)?, c.input(1)?, c.input(2)?);
    require_float(c, x)?;
    if x.shape.len() < 3 {
        return Err(c.mismatch(format!("input of rank {} (N, C, D…)", x.shape.len())));
    }
    let ch = x.shape[1];
    let groups = if op == "GroupNormalization" {
        let g = n.attr_i("num_groups", 0)?;
        if g < 1 || ch % g as usize != 0 {
            return Err(c.bad_attr(format!("num_groups {g} for {ch} channels")));
        }
        g as usize
    } else {
        ch
    };
    for p in [scale, bias] {
        channel_param(c, p, ch, groups)?;
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// RMSNormalization.
pub(crate) fn infer_rms_norm(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let (x, scale) = (c.input(0)?, c.input(1)?);
    require_float(c, x)?;
    let r = x.shape.len();
    c.norm_axis(n.attr_i("axis", -1)?, r)?;
    if broadcast_shapes(&x.shape, &scale.shape).as_deref() != Some(&x.shape[..]) {
        return Err(c.mismatch(format!(
            "scale {:?} does not broadcast to the input {:?}",
            scale.shape, x.shape
        )));
    }
    unsupported_outputs(c, 1)?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// LRN.
pub(crate) fn infer_lrn(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    if x.shape.len() < 3 {
        return Err(c.mismatch(format!("LRN of a rank-{} input", x.shape.len())));
    }
    let size = n.attr_i("size", 0)?;
    if !(1..=1 << 20).contains(&size) {
        return Err(c.bad_attr(format!("size = {size} (must be in 1..=2^20)")));
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// A normalization's `epsilon` (default 1e-5): finite and not negative, or a bad attribute
/// naming the node (NaN or a negative one reached the device's LayerNorm, which refuses it,
/// as an internal compiler error).
fn epsilon(n: &Node) -> Result<f32> {
    let eps = n.attr_finite_f("epsilon", 1e-5)?;
    if eps < 0.0 {
        return Err(n.error(
            ErrorKind::BadAttribute,
            format!("attribute 'epsilon' is {eps}; it must not be negative"),
        ));
    }
    Ok(eps)
}

/// Softmax / LogSoftmax.
pub(crate) fn infer_softmax(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let def = if c.opset() >= 13 { -1 } else { 1 };
    c.norm_axis(n.attr_i("axis", def)?, x.shape.len())?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// BatchNormalization (inference) as a per-channel affine map: `(scale, shift)` with
/// `scale = gamma/√(var + eps)`, `shift = beta − mean·scale`.
pub(crate) fn bn_affine(c: &Ctx) -> Result<(Vec<f32>, Vec<f32>)> {
    let eps = epsilon(c.n)?;
    let mut p = Vec::new();
    for i in 1..5 {
        p.push(
            c.konst(i)
                .ok_or_else(|| {
                    c.e(
                        ErrorKind::UnsupportedOp,
                        "BatchNormalization needs constant scale, bias, mean and variance",
                    )
                })?
                .to_f32s(),
        );
    }
    let ch = p[0].len();
    if p.iter().any(|v| v.len() != ch) {
        return Err(c.e(ErrorKind::ShapeMismatch, "parameters of different lengths"));
    }
    let scale: Vec<f32> = (0..ch).map(|i| p[0][i] / (p[3][i] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..ch).map(|i| p[1][i] - p[2][i] * scale[i]).collect();
    Ok((scale, shift))
}

impl<'a> Lowerer<'a> {
    /// Softmax / LogSoftmax: one row operation on POOL.
    pub(crate) fn lower_softmax(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, op, o0, .. } = at;
        let xv = c.input(0)?;
        let (x, y) = self.unary_io(n, o0)?;
        let r = xv.shape.len();
        let axis = c.norm_axis(n.attr_i("axis", if c.opset() >= 13 { -1 } else { 1 })?, r)?;
        let outer: usize = xv.shape[..axis].iter().product();
        let (a, inner) = if c.opset() >= 13 {
            (
                xv.shape[axis],
                xv.shape[axis + 1..].iter().product::<usize>(),
            )
        } else {
            (xv.shape[axis..].iter().product(), 1)
        };
        let sh = [outer, inner, a];
        let st = [(a * inner) as i64, 1, inner as i64];
        let log = op == "LogSoftmax";
        let xa = View {
            shape: sh.to_vec(),
            strides: st.to_vec(),
            ..x
        };
        let ya = View {
            shape: sh.to_vec(),
            strides: st.to_vec(),
            ..y
        };
        self.row_op(&xa, &ya, |i, o| {
            Op::Softmax(op::Softmax {
                input: i,
                output: o,
                log,
            })
        })?;
        Ok(())
    }

    /// A row operation (softmax) over `[outer, inner, axis]` views: dim 3 is the axis.
    pub(crate) fn row_op(
        &mut self,
        x: &View,
        y: &View,
        f: impl Fn(AccessPattern, AccessPattern) -> Op,
    ) -> Result<()> {
        // Loop the outer dims beyond what fits in AP dims 0..3.
        let (s, st, offs) = simplify(
            &x.shape[..2],
            &[x.strides[..2].to_vec(), y.strides[..2].to_vec()],
            2,
        );
        if x.shape.contains(&0) {
            return Ok(());
        }
        let a = x.shape[2];
        for o in offs {
            let mut sh = s.clone();
            sh.push(a);
            let mut sx = st[0].clone();
            sx.push(x.strides[2]);
            let mut sy = st[1].clone();
            sy.push(y.strides[2]);
            let xa = mk_ap(x.elems(o[0]), x.dtype, &sh, &sx)?;
            let ya = mk_ap(y.elems(o[1]), y.dtype, &sh, &sy)?;
            self.emit_rows(Engine::Pool, f(xa, ya));
        }
        Ok(())
    }

    /// LayerNormalization on POOL (and its statistics outputs).
    pub(crate) fn lower_layer_norm(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let axis = c.norm_axis(n.attr_i("axis", -1)?, r)?;
        let eps = epsilon(n)?;
        let outer: usize = xv.shape[..axis].iter().product();
        let d: usize = xv.shape[axis..].iter().product();
        let x = self.input_view(n, 0)?;
        let gamma = self.input_view(n, 1)?;
        let beta = match n.inputs.get(2).copied().flatten() {
            Some(b) => Some(self.view(b)?),
            None => None,
        };
        let y = self.alloc(o0);
        let sh = [outer, d];
        let row = |v: &View, bcast: bool| View {
            shape: sh.to_vec(),
            strides: if bcast { vec![0, 1] } else { vec![d as i64, 1] },
            ..v.clone()
        };
        let (xa, ya, ga) = (row(&x, false), row(&y, false), row(&gamma, true));
        let ba = beta.as_ref().map(|b| row(b, true));
        // One instruction over [rows, d] (not emit_nd: dims of size 1 would be
        // dropped, a normalized axis of size 1 with them).
        if outer * d > 0 {
            let ap = |v: &View| v.ap();
            let op = Op::LayerNorm(op::LayerNorm {
                input: ap(&xa)?,
                gamma: ap(&ga)?,
                beta: ba.as_ref().map(ap).transpose()?,
                output: ap(&ya)?,
                eps,
            });
            self.emit_rows(Engine::Pool, op);
        }
        // Optional outputs: Mean and InvStdDev over the normalized axes.
        let mean_out = n.outputs.get(1).copied().flatten();
        let inv_out = n.outputs.get(2).copied().flatten();
        if (mean_out.is_some() || inv_out.is_some()) && outer * d > 0 {
            let stat = |l: &mut Self, v: Option<ValueId>| match v {
                Some(v) => l.alloc(v).addr,
                None => l.temp(outer * 4),
            };
            let mean = stat(self, mean_out);
            let col = |addr: u64| View {
                addr,
                dtype: DType::F32,
                shape: vec![outer, 1],
                strides: vec![1, 1],
            };
            let mean_v = col(mean);
            self.emit_reduce(
                mk_ap(x.addr, x.dtype, &sh, &[d as i64, 1])?,
                mk_ap(mean, DType::F32, &[outer, 1], &[1, 1])?,
                ReduceOp::Mean,
                0b1000,
            );
            if inv_out.is_some() {
                let centered = View::dense(self.temp(outer * d * 4), DType::F32, &sh);
                let mb = View {
                    strides: vec![1, 0],
                    shape: sh.to_vec(),
                    ..mean_v.clone()
                };
                self.binary(&xa, &mb, &centered, BinaryOp::Sub)?;
                self.activation(&centered, &centered, None, (ActFunc::Square, 0.0, 0.0), 1.0)?;
                let inv = stat(self, inv_out);
                let var = col(self.temp(outer * 4));
                self.emit_reduce(
                    mk_ap(centered.addr, DType::F32, &sh, &[d as i64, 1])?,
                    mk_ap(var.addr, DType::F32, &[outer, 1], &[1, 1])?,
                    ReduceOp::Mean,
                    0b1000,
                );
                self.emit_nd(0, Engine::Dve, &[&var, &var], |a| {
                    Op::TensorScalar(op::TensorScalar {
                        a: a[0],
                        out: a[1],
                        op: BinaryOp::Add,
                        scalar: eps,
                        reverse: false,
                    })
                })?;
                self.activation(&var, &col(inv), None, (ActFunc::Rsqrt, 0.0, 0.0), 1.0)?;
            }
        }
        Ok(())
    }

    /// BatchNormalization: a per-channel product on DVE, the shift (and a following activation) in one ACT pass.
    pub(crate) fn lower_batch_norm(&mut self, at: At<'a>) -> Result<()> {
        let (ni, g, n, c, o0, oshape) = (at.ni, at.g, at.n, at.c, at.o0, at.oshape);
        // y = x·scale[c] + shift[c]: the per-channel product on DVE, then the shift
        // (and a following activation) as one ACT pass in place.
        let (scale, shift) = bn_affine(&c)?;
        let ch = scale.len();
        let sa = self.add_const(&HostTensor::f32(vec![ch], scale))?;
        let sb = self.add_const(&HostTensor::f32(vec![ch], shift))?;
        let xi = n.inputs[0].expect("p");
        let x = self.sview(xi)?;
        let mut cs = vec![0i64; oshape.len()];
        cs[1] = 1;
        let av = View {
            addr: sa,
            dtype: DType::F32,
            shape: oshape.to_vec(),
            strides: cs.clone(),
        };
        let bv = View {
            addr: sb,
            dtype: DType::F32,
            shape: oshape.to_vec(),
            strides: cs,
        };
        let act = self.sole_consumer(o0).and_then(|j| {
            let cj = Ctx { g, n: &g.nodes[j] };
            act_of(&cj).ok().flatten().map(|f| (j, f))
        });
        let y = self.alloc_over(xi, &[ni], o0)?;
        self.binary(&x, &av, &y, BinaryOp::Mul)?;
        match act {
            Some((j, f)) => {
                let oj = self.out(j, 0)?;
                let z = self.alloc_over(o0, &[j], oj)?;
                self.activation(&y, &z, Some(&bv), f, 1.0)?;
                self.skip[j] = true;
                self.finish_value(oj)?;
            }
            None => self.activation(&y, &y, Some(&bv), (ActFunc::Identity, 0.0, 0.0), 1.0)?,
        }
        Ok(())
    }

    /// LRN: `y = x · (bias + alpha/size · Σ_window x²)^-beta`, the sum over a window of
    /// `size` channels. Square on ACT; the channel-window mean is an average Pool over the
    /// `[N, 1, C, H·W]` view with a `[size, 1]` kernel and zero padding counted in the
    /// divisor; `(bias + alpha·mean)^-beta` is `exp(-beta · ln(alpha·mean + bias))` (two ACT
    /// passes, in place); the product on DVE.
    pub(crate) fn lower_lrn(&mut self, at: At<'a>) -> Result<()> {
        let At { n, o0, .. } = at;
        let size = n.attr_i("size", 0)? as usize;
        let alpha = n.attr_finite_f("alpha", 1e-4)?;
        let beta = n.attr_finite_f("beta", 0.75)?;
        let bias = n.attr_finite_f("bias", 1.0)?;
        let (x, y) = self.unary_io(n, o0)?;
        let total: usize = x.shape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let (nn, ch) = (x.shape[0], x.shape[1]);
        let sp = total / (nn * ch);
        let sq = View::dense(self.temp(total * 4), DType::F32, &x.shape);
        self.activation(&x, &sq, None, (ActFunc::Square, 0.0, 0.0), 1.0)?;
        let mean = View::dense(self.temp(total * 4), DType::F32, &x.shape);
        let s4 = [nn, 1, ch, sp];
        let st4 = [(ch * sp) as i64, (ch * sp) as i64, sp as i64, 1];
        let window = Window {
            kernel: [size as u32, 1],
            stride: [1, 1],
            pad: [((size - 1) / 2) as u32, 0, (size / 2) as u32, 0],
            dilation: [1, 1],
        };
        self.emit(
            0,
            Engine::Pool,
            Op::Pool(op::Pool {
                input: mk_ap(sq.addr, DType::F32, &s4, &st4)?,
                output: mk_ap(mean.addr, DType::F32, &s4, &st4)?,
                window,
                op: PoolOp::Avg,
                count_include_pad: true,
            }),
        );
        let b = self.add_const(&HostTensor::f32(vec![1], vec![bias]))?;
        let bv = View::dense(b, DType::F32, &[1]).broadcast(&x.shape);
        self.activation(&mean, &mean, Some(&bv), (ActFunc::Log, 0.0, 0.0), alpha)?;
        self.activation(&mean, &mean, None, (ActFunc::Exp, 0.0, 0.0), -beta)?;
        self.binary(&x, &mean, &y, BinaryOp::Mul)
    }

    /// InstanceNormalization and GroupNormalization with the LayerNorm instruction over the
    /// `[N, G, (C/G)·spatial]` view. Per-group (and, for instances, per-channel) scale and
    /// bias ride along as LayerNorm's broadcast gamma/beta; per-channel ones of a group
    /// norm are a DVE product and an ACT bias pass after it.
    pub(crate) fn lower_group_norm(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let eps = epsilon(n)?;
        let (nn, ch) = (xv.shape[0], xv.shape[1]);
        let sp: usize = xv.shape[2..].iter().product();
        let groups = if n.op == "GroupNormalization" {
            n.attr_i("num_groups", 1)? as usize
        } else {
            ch
        };
        let x = self.input_view(n, 0)?;
        let scale = self.input_view(n, 1)?;
        let bias = self.input_view(n, 2)?;
        let y = self.alloc(o0);
        if nn * ch * sp == 0 {
            return Ok(());
        }
        let d = ch / groups * sp;
        let sh = [nn, groups, d];
        let grid = |v: &View, st: [i64; 3]| View {
            addr: v.addr,
            dtype: v.dtype,
            shape: sh.to_vec(),
            strides: st.to_vec(),
        };
        let per_group = scale.shape.iter().product::<usize>() == groups;
        let (gamma, beta) = if per_group {
            (grid(&scale, [0, 1, 0]), grid(&bias, [0, 1, 0]))
        } else {
            let one = self.scalar(1.0, &sh)?;
            (one, self.scalar(0.0, &sh)?)
        };
        let dense = [(groups * d) as i64, d as i64, 1];
        let (xa, ya) = (grid(&x, dense), grid(&y, dense));
        // (Not emit_nd: merging dims would merge the normalized one with the groups.)
        let ap = |v: &View| v.ap();
        let op = Op::LayerNorm(op::LayerNorm {
            input: ap(&xa)?,
            gamma: ap(&gamma)?,
            beta: Some(ap(&beta)?),
            output: ap(&ya)?,
            eps,
        });
        self.emit_rows(Engine::Pool, op);
        if !per_group {
            let cs = [nn, ch, sp];
            let by_channel = |v: &View| View {
                addr: v.addr,
                dtype: v.dtype,
                shape: cs.to_vec(),
                strides: vec![0, 1, 0],
            };
            let y3 = View::dense(y.addr, y.dtype, &cs);
            self.binary(&y3, &by_channel(&scale), &y3, BinaryOp::Mul)?;
            let b = by_channel(&bias);
            self.activation(&y3, &y3, Some(&b), (ActFunc::Identity, 0.0, 0.0), 1.0)?;
        }
        Ok(())
    }

    /// RMSNormalization: `x / √(mean(x²) + eps) · scale` over the dims from `axis` on.
    pub(crate) fn lower_rms_norm(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let axis = c.norm_axis(n.attr_i("axis", -1)?, r)?;
        let eps = epsilon(n)?;
        let x = self.input_view(n, 0)?;
        let y = self.alloc(o0);
        let outer: usize = xv.shape[..axis].iter().product();
        let d: usize = xv.shape[axis..].iter().product();
        if outer * d == 0 {
            return Ok(());
        }
        // f32 with one row of scales (the normalized shape, broadcast over the rest): the
        // POOL engine's RmsNorm, one instruction over [rows, d]. Anything else: the
        // square, mean, rsqrt and products below.
        let sv = c.input(1)?;
        let lead = r.saturating_sub(sv.shape.len());
        let one_row = sv.shape.len() <= r
            && (0..r).all(|k| {
                let s = if k < lead { 1 } else { sv.shape[k - lead] };
                if k < axis { s == 1 } else { s == xv.shape[k] }
            });
        if xv.dtype == DType::F32 && sv.dtype == DType::F32 && one_row {
            let gamma = self.input_view(n, 1)?;
            let row = |v: &View, bcast: bool| View {
                shape: vec![outer, d],
                strides: if bcast { vec![0, 1] } else { vec![d as i64, 1] },
                ..v.clone()
            };
            let op = Op::RmsNorm(op::RmsNorm {
                input: row(&x, false).ap()?,
                gamma: row(&gamma, true).ap()?,
                output: row(&y, false).ap()?,
                eps,
            });
            self.emit_rows(Engine::Pool, op);
            return Ok(());
        }
        let scale = self.input_sview(n, 1)?.broadcast(&xv.shape);
        let sq = View::dense(self.temp(outer * d * 4), DType::F32, &[outer, d]);
        let x2 = View::dense(x.addr, x.dtype, &[outer, d]);
        self.activation(&x2, &sq, None, (ActFunc::Square, 0.0, 0.0), 1.0)?;
        let ms = View::dense(self.temp(outer * 4), DType::F32, &[outer, 1]);
        self.reduce(&c, &sq, &ms, Some(&[1]), ReduceOp::Mean)?;
        let e = self.scalar(eps, &[outer, 1])?;
        self.activation(&ms, &ms, Some(&e), (ActFunc::Rsqrt, 0.0, 0.0), 1.0)?;
        let y2 = View::dense(y.addr, y.dtype, &[outer, d]);
        self.binary(&x2, &ms.broadcast(&[outer, d]), &y2, BinaryOp::Mul)?;
        self.binary(&y, &scale, &y, BinaryOp::Mul)
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_f, a_i, ctx, konst, one_node, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    #[test]
    fn layer_norm_statistics_keep_the_leading_axes() {
        let ins = vec![var(DType::F32, &[2, 3, 4]), var(DType::F32, &[3, 4])];
        let t = out_types("LayerNormalization", 17, ins, vec![a_i("axis", 1)], 3).unwrap();
        let stat = (DType::F32, vec![2, 1, 1]);
        assert_eq!(t, vec![(DType::F32, vec![2, 3, 4]), stat.clone(), stat]);
        let ins = vec![var(DType::F32, &[2, 3, 4]), var(DType::F32, &[4])];
        let e = out_types("LayerNormalization", 17, ins, vec![a_i("axis", 1)], 1).unwrap_err();
        assert!(e.message.contains("scale/bias shape [4]"), "{e}");
    }

    #[test]
    fn batch_norm_is_a_per_channel_affine_map() {
        let p = |v: [f32; 2]| konst(HostTensor::f32(vec![2], v.to_vec()));
        let ins = vec![
            var(DType::F32, &[1, 2, 3]),
            p([2., 8.]),
            p([1., 0.]),
            p([0., 1.]),
            p([3., 15.]),
        ];
        let g = one_node("BatchNormalization", 15, ins, vec![a_f("epsilon", 1.0)], 1);
        let c = ctx(&g);
        assert_eq!(super::bn_affine(&c).unwrap(), (vec![1., 2.], vec![1., -2.]));
        let neg = one_node(
            "BatchNormalization",
            15,
            vec![],
            vec![a_f("epsilon", -1.0)],
            1,
        );
        let e = super::epsilon(&neg.nodes[0]).unwrap_err();
        assert!(e.message.contains("'epsilon' is -1"), "{e}");
    }

    #[test]
    fn group_norm_groups_must_divide_the_channels() {
        let ins = vec![
            var(DType::F32, &[1, 4, 5]),
            var(DType::F32, &[4]),
            var(DType::F32, &[4]),
        ];
        let e =
            out_types("GroupNormalization", 18, ins, vec![a_i("num_groups", 3)], 1).unwrap_err();
        assert!(e.message.contains("num_groups 3 for 4 channels"), "{e}");
    }
}
