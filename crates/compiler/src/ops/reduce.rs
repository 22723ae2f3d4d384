//! Reductions on POOL: Reduce*, ArgMax / ArgMin, Hardmax, TopK (`Op::TopK`), and CumSum (a
//! product with a triangular matrix on PE). ReduceSum / Mean / Max / Min of constants fold.

use super::{Dtypes, Registry};
use crate::error::{ErrorKind, Result};
use crate::eval::{dense_strides, input, one};
use crate::lower::view::{View, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params;
use crate::params::{CUMSUM_MAX_LEN, Ctx, Out, out, reduce_axes, require_float};
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{ActFunc, BinaryOp, Op, ReduceOp};

pub(super) fn register(r: &mut Registry) {
    for name in ["ReduceSum", "ReduceMax", "ReduceMin"] {
        r.op(name, 1, infer_reduce)
            .dtypes(Dtypes::Reduce)
            .folds(fold_reduce)
            .device(lower!(lower_reduce));
    }
    r.op("ReduceMean", 1, infer_reduce)
        .dtypes(Dtypes::Float)
        .folds(fold_reduce)
        .device(lower!(lower_reduce));
    for name in [
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSum",
        "ReduceLogSumExp",
    ] {
        r.op(name, 1, infer_reduce)
            .dtypes(Dtypes::Float)
            .device(lower!(lower_reduce));
    }
    for name in ["ArgMax", "ArgMin"] {
        r.op(name, 1, infer_arg_reduce)
            .device(lower!(lower_arg_reduce));
    }
    r.op("Hardmax", 1, infer_hardmax)
        .dtypes(Dtypes::Float)
        .device(lower!(lower_hardmax));
    r.op("TopK", 1, infer_top_k)
        .note("f32 and integers; K known at compile time; always sorted")
        .device(lower!(lower_top_k));
    r.op("ReduceProd", 1, infer_reduce)
        .dtypes(Dtypes::Reduce)
        .note("a halving tree of DVE products per axis")
        .device(lower!(lower_reduce_prod));
    r.op("CumProd", 26, infer_cumprod)
        .dtypes(Dtypes::Reduce)
        .note("a log-step scan of DVE products")
        .device(lower!(lower_cumprod));
    r.op("CumSum", 11, infer_cumsum)
        .dtypes(Dtypes::Reduce)
        .note("f32: axis length at most 4096 (a triangular product on PE); i32/i64: a scan of DVE adds")
        .device(lower!(lower_cumsum));
}

/// TopK's axis, K (input 1 from opset 10, attribute `k` before) and `largest`.
fn top_k_params(c: &Ctx) -> Result<(usize, usize, bool)> {
    let x = c.input(0)?;
    if x.shape.is_empty() {
        return Err(c.mismatch("TopK of a scalar"));
    }
    if matches!(x.dtype, DType::Bool | DType::F16 | DType::Bf16) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "input '{}' is {}; TopK orders f32 and integers",
                x.name, x.dtype
            ),
        ));
    }
    let axis = c.norm_axis(c.n.attr_i("axis", -1)?, x.shape.len())?;
    let k = if c.opset() >= 10 {
        match c.const_ints(1, "K")?.as_deref() {
            Some([k]) => *k,
            _ => return Err(c.mismatch("K must hold one value")),
        }
    } else {
        c.n.attr_i("k", -1)?
    };
    let largest = match c.n.attr_i("largest", 1)? {
        0 => false,
        1 => true,
        v => return Err(c.bad_attr(format!("largest = {v} (0 or 1)"))),
    };
    let n = x.shape[axis];
    match usize::try_from(k) {
        Ok(k) if k <= n => Ok((axis, k, largest)),
        _ => Err(c.bad_attr(format!("K = {k} for an axis of {n} elements"))),
    }
}

/// TopK: values (the input's type) and i64 indices, K along the axis.
pub(crate) fn infer_top_k(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let (axis, k, _) = top_k_params(c)?;
    let mut s = x.shape.clone();
    s[axis] = k;
    Ok(vec![out(x.dtype, s.clone()), out(DType::I64, s)])
}

/// Reduce*: axes from `reduce_axes`, `keepdims`.
pub(crate) fn infer_reduce(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let keep = n.attr_i("keepdims", 1)? != 0;
    let s = match reduce_axes(c, x.shape.len())? {
        None => x.shape.clone(),
        Some(axes) => {
            let mut s = Vec::new();
            for (i, &d) in x.shape.iter().enumerate() {
                if axes.contains(&i) {
                    if keep {
                        s.push(1);
                    }
                } else {
                    s.push(d);
                }
            }
            s
        }
    };
    Ok(vec![out(x.dtype, s)])
}

/// ArgMax / ArgMin (i64 indices).
pub(crate) fn infer_arg_reduce(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    if !matches!(x.dtype, DType::F32 | DType::I32 | DType::I64) {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!(
                "input '{}' is {}; f32, i32 and i64 are supported",
                x.name, x.dtype
            ),
        ));
    }
    let r = x.shape.len();
    let axis = c.norm_axis(n.attr_i("axis", 0)?, r)?;
    if x.shape.get(axis) == Some(&0) {
        return Err(c.mismatch("arg-reduction over an empty axis"));
    }
    let mut s = x.shape.clone();
    if n.attr_i("keepdims", 1)? != 0 {
        s[axis] = 1;
    } else {
        s.remove(axis);
    }
    Ok(vec![out(DType::I64, s)])
}

/// Hardmax.
pub(crate) fn infer_hardmax(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    require_float(c, x)?;
    let def = if c.opset() >= 13 { -1 } else { 1 };
    c.norm_axis(n.attr_i("axis", def)?, x.shape.len())?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// CumSum along a constant axis of at most `CUMSUM_MAX_LEN`.
pub(crate) fn infer_cumsum(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    if matches!(x.dtype, DType::I32 | DType::I64) {
        return infer_cumprod(c);
    }
    require_float(c, x)?;
    let axis = c
        .const_ints(1, "axis")?
        .and_then(|a| a.first().copied())
        .ok_or_else(|| c.bad_attr("missing axis"))?;
    let axis = c.norm_axis(axis, x.shape.len())?;
    if x.shape[axis] > CUMSUM_MAX_LEN {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!(
                "CumSum over {} elements (at most {CUMSUM_MAX_LEN}: it is a product with a triangular matrix)",
                x.shape[axis]
            ),
        ));
    }
    Ok(vec![out(x.dtype, x.shape.clone())])
}

/// Folds ReduceSum / Mean / Max / Min: each element accumulated in f64 in order into its
/// kept position, the mean divided once at the end, then back to the input's type.
fn fold_reduce(c: &Ctx, outs: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let op = c.n.op.as_str();
    let x = input(c, 0);
    let Some(axes) = reduce_axes(c, x.shape.len())? else {
        return one(x.clone());
    };
    let r = x.shape.len();
    let kept: Vec<usize> = (0..r)
        .map(|i| if axes.contains(&i) { 1 } else { x.shape[i] })
        .collect();
    let total: usize = kept.iter().product();
    let kd = dense_strides(&kept);
    let vals = x.to_f32s();
    let mut acc: Vec<f64> = vec![
        match op {
            "ReduceMax" => f64::NEG_INFINITY,
            "ReduceMin" => f64::INFINITY,
            _ => 0.0,
        };
        total
    ];
    let xd = dense_strides(&x.shape);
    for (i, &v) in vals.iter().enumerate() {
        let mut o = 0i64;
        for d in 0..r {
            let id = (i as i64 / xd[d]) % x.shape[d] as i64;
            if !axes.contains(&d) {
                o += id * kd[d];
            }
        }
        let a = &mut acc[o as usize];
        let v = v as f64;
        *a = match op {
            "ReduceMax" => a.max(v),
            "ReduceMin" => a.min(v),
            _ => *a + v,
        };
    }
    let cnt: usize = axes.iter().map(|&a| x.shape[a]).product();
    if op == "ReduceMean" {
        for a in &mut acc {
            *a /= cnt as f64;
        }
    }
    one(HostTensor::from_f64s(
        x.dtype,
        outs[0].shape.clone(),
        acc.into_iter(),
    ))
}

/// CumProd along a constant axis (`axis` input).
pub(crate) fn infer_cumprod(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    if x.shape.is_empty() {
        return Err(c.mismatch("CumProd of a scalar"));
    }
    let axis = c
        .const_ints(1, "axis")?
        .and_then(|a| a.first().copied())
        .ok_or_else(|| c.bad_attr("missing axis"))?;
    c.norm_axis(axis, x.shape.len())?;
    Ok(vec![out(x.dtype, x.shape.clone())])
}

impl<'a> Lowerer<'a> {
    /// ReduceProd: `x` copied to a temporary, then along each reduced axis of length `L`
    /// the first `⌊L/2⌋` elements are multiplied by the last `⌊L/2⌋` (disjoint halves; the
    /// middle one of an odd length stays) until one is left — `⌈log₂ L⌉` DVE products per
    /// axis. An empty reduction is 1.
    pub(crate) fn lower_reduce_prod(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let (x, y) = self.unary_io(n, o0)?;
        let Some(axes) = params::reduce_axes(&c, xv.shape.len())? else {
            return self.copy(Engine::Dve, &x, &View::dense(y.addr, y.dtype, &xv.shape));
        };
        let ytotal: usize = y.shape.iter().product();
        if ytotal == 0 {
            return Ok(());
        }
        if xv.elements() == 0 {
            return self.fill(Engine::Dve, &y, 1.0);
        }
        let t = View::dense(
            self.temp(xv.elements() * xv.dtype.size()),
            xv.dtype,
            &xv.shape,
        );
        self.copy(Engine::Dve, &x, &t)?;
        let mut cur = t;
        for &a in &axes {
            let mut len = cur.shape[a];
            while len > 1 {
                let h = len / 2;
                let lo = cur.slice(a, 0, h, 1);
                let hi = cur.slice(a, (len - h) as i64, h, 1);
                self.binary(&lo, &hi, &lo, BinaryOp::Mul)?;
                len -= h;
                cur = cur.slice(a, 0, len, 1);
            }
        }
        let kept: Vec<usize> = cur.shape.clone();
        self.copy(Engine::Dve, &cur, &View::dense(y.addr, y.dtype, &kept))
    }

    /// CumProd: the Hillis–Steele scan in `⌈log₂ L⌉` steps between two temporaries
    /// (`b[i] = a[i]·a[i−d]` for `i ≥ d`, `b[i] = a[i]` below, `d` = 1, 2, 4, …); the axis is
    /// walked backwards for `reverse`, and `exclusive` shifts the result by one with a 1
    /// in front.
    pub(crate) fn lower_cumprod(&mut self, at: At<'a>) -> Result<()> {
        self.lower_scan(at, BinaryOp::Mul, 1.0)
    }

    /// The scan of [`Self::lower_cumprod`] with `op` and its identity `unit` (integer
    /// CumSum: `Add`, 0).
    pub(crate) fn lower_scan(&mut self, at: At<'a>, op: BinaryOp, unit: f64) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let axis = c.const_ints(1, "axis")?.map_or(0, |a| a[0]);
        let axis = c.norm_axis(axis, xv.shape.len())?;
        let exclusive = n.attr_i("exclusive", 0)? != 0;
        let reverse = n.attr_i("reverse", 0)? != 0;
        let (x, y) = self.unary_io(n, o0)?;
        let len = xv.shape[axis];
        let total = xv.elements();
        if total == 0 {
            return Ok(());
        }
        let dt = xv.dtype;
        let flip = |v: &View| {
            if reverse {
                v.slice(axis, len as i64 - 1, len, -1)
            } else {
                v.clone()
            }
        };
        let mut a = View::dense(self.temp(total * dt.size()), dt, &xv.shape);
        let mut b = View::dense(self.temp(total * dt.size()), dt, &xv.shape);
        self.copy(Engine::Dve, &flip(&x), &a)?;
        let mut d = 1usize;
        while d < len {
            self.copy(
                Engine::Dve,
                &a.slice(axis, 0, d, 1),
                &b.slice(axis, 0, d, 1),
            )?;
            let m = len - d;
            self.binary(
                &a.slice(axis, d as i64, m, 1),
                &a.slice(axis, 0, m, 1),
                &b.slice(axis, d as i64, m, 1),
                op,
            )?;
            std::mem::swap(&mut a, &mut b);
            d *= 2;
        }
        let yf = flip(&y);
        if !exclusive {
            return self.copy(Engine::Dve, &a, &yf);
        }
        self.fill(Engine::Dve, &yf.slice(axis, 0, 1, 1), unit)?;
        if len > 1 {
            self.copy(
                Engine::Dve,
                &a.slice(axis, 0, len - 1, 1),
                &yf.slice(axis, 1, len - 1, 1),
            )?;
        }
        Ok(())
    }

    /// CumSum as a product with a constant triangular 0/1 matrix `T` (`T[i][j] = 1` where
    /// `j ≤ i`; `<` when exclusive; reversed: `≥`, `>`): along the last axis one GEMM
    /// `X[rows, L] · Tᵀ`, else `T · X[o]` for each outer index, batched.
    pub(crate) fn lower_cumsum(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        if xv.dtype != DType::F32 {
            return self.lower_scan(at, BinaryOp::Add, 0.0);
        }
        let axis = c.const_ints(1, "axis")?.map_or(0, |a| a[0]);
        let axis = c.norm_axis(axis, xv.shape.len())?;
        let exclusive = n.attr_i("exclusive", 0)? != 0;
        let reverse = n.attr_i("reverse", 0)? != 0;
        let (x, y) = self.unary_io(n, o0)?;
        let len = xv.shape[axis];
        let outer: usize = xv.shape[..axis].iter().product();
        let inner: usize = xv.shape[axis + 1..].iter().product();
        if outer * len * inner == 0 {
            return Ok(());
        }
        let takes = |i: usize, j: usize| match (reverse, exclusive) {
            (false, false) => j <= i,
            (false, true) => j < i,
            (true, false) => j >= i,
            (true, true) => j > i,
        };
        let t: Vec<f32> = (0..len * len)
            .map(|e| f32::from(u8::from(takes(e / len, e % len))))
            .collect();
        let ta = self.add_const(&HostTensor::f32(vec![len, len], t))?;
        let l = len as i64;
        if inner == 1 {
            // y[r, i] = Σ_j x[r, j]·T[i][j]: B = Tᵀ, read through swapped strides.
            let a = mk_ap(x.addr, x.dtype, &[outer, len], &[l, 1])?;
            let b = mk_ap(ta, DType::F32, &[len, len], &[1, l])?;
            let cc = mk_ap(y.addr, y.dtype, &[outer, len], &[l, 1])?;
            self.matmul_aps(a, b, cc, 1.0, 0);
        } else {
            let (inn, blk) = (inner as i64, (len * inner) as i64);
            let a = mk_ap(ta, DType::F32, &[outer, len, len], &[0, l, 1])?;
            let b = mk_ap(x.addr, x.dtype, &[outer, len, inner], &[blk, inn, 1])?;
            let cc = mk_ap(y.addr, y.dtype, &[outer, len, inner], &[blk, inn, 1])?;
            self.matmul_aps(a, b, cc, 1.0, 0);
        }
        Ok(())
    }

    /// ArgMax / ArgMin along one axis.
    pub(crate) fn lower_arg_reduce(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
        let last = n.attr_i("select_last_index", 0)? != 0;
        let (x, y) = self.unary_io(n, o0)?;
        if xv.elements() == 0 {
            return Ok(());
        }
        let mut kept = xv.shape.clone();
        kept[axis] = 1;
        let out = View::dense(y.addr, y.dtype, &kept);
        self.arg_index(&c, &x, axis, last, n.op == "ArgMax", &out)
    }

    /// Hardmax: 1 at the first maximum along the axis (of the 2-D `[outer, inner]` view
    /// before opset 13), 0 elsewhere.
    pub(crate) fn lower_hardmax(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let axis = c.norm_axis(n.attr_i("axis", if c.opset() >= 13 { -1 } else { 1 })?, r)?;
        let shape = if c.opset() >= 13 {
            xv.shape.clone()
        } else {
            vec![
                xv.shape[..axis].iter().product(),
                xv.shape[axis..].iter().product(),
            ]
        };
        let axis = if c.opset() >= 13 { axis } else { 1 };
        let x0 = self.input_view(n, 0)?;
        let y0 = self.alloc(o0);
        let total = xv.elements();
        if total == 0 {
            return Ok(());
        }
        let x = View::dense(x0.addr, x0.dtype, &shape);
        let y = View::dense(y0.addr, y0.dtype, &shape);
        let mut kept = shape.clone();
        kept[axis] = 1;
        let idx = View::dense(
            self.temp(kept.iter().product::<usize>() * 8),
            DType::I64,
            &kept,
        );
        self.arg_index(&c, &x, axis, false, true, &idx)?;
        let rv = self.index_ramp(&shape, axis)?;
        let eq = View::dense(self.temp(total), DType::Bool, &shape);
        let ib = idx.broadcast(&shape);
        self.binary(&rv, &ib, &eq, BinaryOp::Equal)?;
        self.copy(Engine::Dve, &eq, &y)
    }

    /// `[0, 1, …]` along `axis` of `shape` (a constant, broadcast over the other dims).
    pub(crate) fn index_ramp(&mut self, shape: &[usize], axis: usize) -> Result<View> {
        let len = shape[axis];
        let ramp = self.add_const(&HostTensor::ints(
            DType::I64,
            vec![len],
            (0..len as i64).collect(),
        ))?;
        let mut st = vec![0i64; shape.len()];
        st[axis] = 1;
        Ok(View {
            addr: ramp,
            dtype: DType::I64,
            shape: shape.to_vec(),
            strides: st,
        })
    }

    /// The index of the extreme (max, else min) of dense `x` along `axis` into `out` (i64,
    /// `x`'s shape with 1 at `axis`): the extreme (Reduce, kept dims), where each element
    /// equals it (DVE), those elements' indices with the others replaced by a sentinel
    /// (Select from a constant index ramp), and the smallest index (largest with `last`).
    pub(crate) fn arg_index(
        &mut self,
        c: &Ctx,
        x: &View,
        axis: usize,
        last: bool,
        max: bool,
        out: &View,
    ) -> Result<()> {
        let shape = x.shape.clone();
        let total: usize = shape.iter().product();
        let mut kept = shape.clone();
        kept[axis] = 1;
        let kn: usize = kept.iter().product();
        let m = View::dense(self.temp(kn * x.dtype.size()), x.dtype, &kept);
        let extreme = if max { ReduceOp::Max } else { ReduceOp::Min };
        self.reduce(c, x, &m, Some(&[axis]), extreme)?;
        let eq = View::dense(self.temp(total), DType::Bool, &shape);
        let mb = m.broadcast(&shape);
        self.binary(x, &mb, &eq, BinaryOp::Equal)?;
        let rv = self.index_ramp(&shape, axis)?;
        let sentinel = if last { -1 } else { shape[axis] as i64 };
        let sc = self.add_const(&HostTensor::ints(DType::I64, vec![1], vec![sentinel]))?;
        let sv = View::dense(sc, DType::I64, &[1]).broadcast(&shape);
        let idx = View::dense(self.temp(total * 8), DType::I64, &shape);
        self.select(&eq, &rv, &sv, &idx)?;
        let pick = if last { ReduceOp::Max } else { ReduceOp::Min };
        self.reduce(c, &idx, out, Some(&[axis]), pick)
    }

    pub(crate) fn lower_reduce(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let (x, y) = self.unary_io(n, o0)?;
        let axes = params::reduce_axes(&c, xv.shape.len())?;
        let rop = match n.op.as_str() {
            "ReduceMean" => ReduceOp::Mean,
            "ReduceMax" => ReduceOp::Max,
            "ReduceMin" => ReduceOp::Min,
            _ => ReduceOp::Sum,
        };
        let f = |f: ActFunc| (f, 0.0, 0.0);
        // The composite reductions: an elementwise map before the sum, one after.
        let (pre, post) = match n.op.as_str() {
            "ReduceL1" => (Some(f(ActFunc::Abs)), None),
            "ReduceL2" => (Some(f(ActFunc::Square)), Some(f(ActFunc::Sqrt))),
            "ReduceSumSquare" => (Some(f(ActFunc::Square)), None),
            "ReduceLogSum" => (None, Some(f(ActFunc::Log))),
            "ReduceLogSumExp" => {
                // max + ln Σ exp(x − max), the max kept for broadcasting.
                let mut kept = xv.shape.clone();
                if let Some(a) = &axes {
                    for &i in a {
                        kept[i] = 1;
                    }
                }
                let mv = View::dense(
                    self.temp(kept.iter().product::<usize>() * 4),
                    DType::F32,
                    &kept,
                );
                self.reduce(&c, &x, &mv, axes.as_deref(), ReduceOp::Max)?;
                let d = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
                let mb = mv.broadcast(&xv.shape);
                self.binary(&x, &mb, &d, BinaryOp::Sub)?;
                self.activation(&d, &d, None, f(ActFunc::Exp), 1.0)?;
                self.reduce(&c, &d, &y, axes.as_deref(), ReduceOp::Sum)?;
                self.activation(&y, &y, None, f(ActFunc::Log), 1.0)?;
                let m = View::dense(mv.addr, mv.dtype, &y.shape);
                return self.binary(&y, &m, &y, BinaryOp::Add);
            }
            _ => (None, None),
        };
        let src = match pre {
            Some(pf) => {
                let t = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
                self.activation(&x, &t, None, pf, 1.0)?;
                t
            }
            None => x,
        };
        self.reduce(&c, &src, &y, axes.as_deref(), rop)?;
        if let Some(pf) = post {
            self.activation(&y, &y, None, pf, 1.0)?;
        }
        Ok(())
    }

    /// Reduces dense `x` over `axes` (`None`: a copy) into dense `y` (same elements as the
    /// kept dimensions).
    pub(crate) fn reduce(
        &mut self,
        c: &Ctx,
        x: &View,
        y: &View,
        axes: Option<&[usize]>,
        rop: ReduceOp,
    ) -> Result<()> {
        let Some(axes) = axes else {
            return self.copy(Engine::Pool, x, &View::dense(y.addr, y.dtype, &x.shape));
        };
        let xs = x.shape.clone();
        if xs.iter().product::<usize>() == 0 {
            if y.shape.iter().product::<usize>() > 0 {
                let v = match rop {
                    ReduceOp::Max => f64::NEG_INFINITY,
                    ReduceOp::Min => f64::INFINITY,
                    ReduceOp::Mean => f64::NAN,
                    ReduceOp::Sum => 0.0,
                };
                self.fill(Engine::Pool, y, v)?;
            }
            return Ok(());
        }
        // Groups of consecutive dims, reduced or kept (size-1 dims dropped).
        let mut groups: Vec<(usize, bool)> = Vec::new();
        for (i, &d) in xs.iter().enumerate() {
            if d == 1 {
                continue;
            }
            let red = axes.contains(&i);
            match groups.last_mut() {
                Some(l) if l.1 == red => l.0 *= d,
                _ => groups.push((d, red)),
            }
        }
        if !groups.iter().any(|g| g.1) {
            return self.copy(Engine::Pool, x, &View::dense(y.addr, y.dtype, &xs));
        }
        // Loop over a leading kept group when there are more than four.
        let (loops, groups) = if groups.len() > 4 {
            if groups[0].1 || groups.len() > 5 {
                return Err(c.e(
                    ErrorKind::UnsupportedOp,
                    "reduction over more than four alternating axis groups",
                ));
            }
            (groups[0].0, groups[1..].to_vec())
        } else {
            (1, groups)
        };
        let ishape: Vec<usize> = groups.iter().map(|g| g.0).collect();
        let oshape: Vec<usize> = groups.iter().map(|g| if g.1 { 1 } else { g.0 }).collect();
        let ist = dense_strides(&ishape);
        let ost = dense_strides(&oshape);
        let mut mask = 0u8;
        for (i, gr) in groups.iter().enumerate() {
            if gr.1 {
                mask |= 1 << (4 - groups.len() + i);
            }
        }
        let in_chunk: usize = ishape.iter().product();
        let out_chunk: usize = oshape.iter().product();
        for l in 0..loops {
            let xa = mk_ap(x.elems((l * in_chunk) as i64), x.dtype, &ishape, &ist)?;
            let ya = mk_ap(y.elems((l * out_chunk) as i64), y.dtype, &oshape, &ost)?;
            self.emit_reduce(xa, ya, rop, mask);
        }
        Ok(())
    }
}

impl<'a> Lowerer<'a> {
    /// TopK: one instruction on POOL over the input seen as `[outer, inner, N]` (the axis
    /// last, strided), the outputs likewise.
    pub(crate) fn lower_top_k(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let (axis, k, largest) = top_k_params(&c)?;
        let x = self.input_view(n, 0)?;
        let vals = self.alloc(o0);
        let outer: usize = xv.shape[..axis].iter().product();
        let inner: usize = xv.shape[axis + 1..].iter().product();
        let len = xv.shape[axis];
        let idx = match n.outputs.get(1).copied().flatten() {
            Some(v) => self.alloc(v),
            None => View::dense(
                self.temp(outer * inner * k * 8),
                DType::I64,
                &[outer, inner, k],
            ),
        };
        if outer * inner * k == 0 {
            return Ok(());
        }
        let rows = |v: &View, m: usize| {
            mk_ap(
                v.addr,
                v.dtype,
                &[outer, inner, m],
                &[(m * inner) as i64, 1, inner as i64],
            )
        };
        self.emit(
            0,
            Engine::Pool,
            Op::TopK(op::TopK {
                input: rows(&x, len)?,
                values: rows(&vals, k)?,
                indices: rows(&idx, k)?,
                largest,
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, a_ints, fold, fold1};
    use crate::tensor::HostTensor;

    fn x() -> HostTensor {
        HostTensor::f32(vec![2, 3], vec![1., 5., 3., -4., 2., 8.])
    }

    #[test]
    fn reductions_fold_over_their_axes() {
        let axes = || HostTensor::i64(vec![1], vec![1]);
        let sum = fold1("ReduceSum", 13, vec![x(), axes()], vec![]);
        assert_eq!(sum, HostTensor::f32(vec![2, 1], vec![9., 6.]));
        let max = fold1("ReduceMax", 18, vec![x(), axes()], vec![a_i("keepdims", 0)]);
        assert_eq!(max, HostTensor::f32(vec![2], vec![5., 8.]));
        // Attribute axes before opset 18 (13 for ReduceSum); all axes by default.
        let min = fold1("ReduceMin", 13, vec![x()], vec![a_ints("axes", &[0])]);
        assert_eq!(min, HostTensor::f32(vec![1, 3], vec![-4., 2., 3.]));
        let mean = fold1("ReduceMean", 13, vec![x()], vec![a_i("keepdims", 0)]);
        assert_eq!(mean, HostTensor::f32(vec![], vec![2.5]));
        // Integers reduce in f64 and come back exact at this size.
        let xi = HostTensor::i64(vec![3], vec![7, -2, 4]);
        let sum = fold1("ReduceSum", 13, vec![xi], vec![]);
        assert_eq!(sum, HostTensor::i64(vec![1], vec![9]));
    }

    #[test]
    fn empty_axes_with_noop_pass_the_data() {
        let empty = HostTensor::i64(vec![0], vec![]);
        let noop = a_i("noop_with_empty_axes", 1);
        let same = fold1("ReduceSum", 13, vec![x(), empty], vec![noop]);
        assert_eq!(same, x());
    }

    /// The reductions without a hook are computed on the device.
    #[test]
    fn reduce_l2_stays_for_the_device() {
        let r = fold("ReduceL2", 13, vec![Some(x())], vec![], 1).unwrap();
        assert_eq!(r, vec![None]);
    }
}
