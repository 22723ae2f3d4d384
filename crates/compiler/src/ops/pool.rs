//! Pooling on POOL: MaxPool / AveragePool / LpPool over 1 to 3 spatial dimensions and the
//! global poolings.

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::lower::view::{View, dense_ap};
use crate::lower::{At, Lowerer};
use crate::params;
use crate::params::{Ctx, Out, out, unsupported_outputs, window_params};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{ActFunc, BinaryOp, Op, PoolOp, ReduceOp, Window};

pub(super) fn register(r: &mut Registry) {
    for name in ["AveragePool", "LpPool"] {
        r.op(name, 1, infer_pool)
            .f32_on_device()
            .note("1-D to 3-D")
            .device(lower!(lower_pool));
    }
    r.op("MaxPool", 1, infer_pool)
        .f32_on_device()
        .note("1-D to 3-D; the Indices output by a compare-and-select per window offset")
        .device(lower!(lower_max_pool));
    for name in ["GlobalAveragePool", "GlobalMaxPool"] {
        r.op(name, 1, infer_global_pool)
            .f32_on_device()
            .device(lower!(lower_global_pool));
    }
}

/// The window of one pooled dimension.
#[derive(Clone, Copy, Debug)]
struct PoolDim {
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
    pad_end: usize,
    /// End padding ceil mode adds (never counted in an average's divisor).
    ceil_extra: usize,
}

/// MaxPool / AveragePool / LpPool: window geometry from `window_params`.
pub(crate) fn infer_pool(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let r = x.shape.len();
    if r < 3 {
        return Err(c.mismatch(format!("pooling of rank-{r} input")));
    }
    if r > 5 {
        return Err(c.e(ErrorKind::UnsupportedOp, format!("{}-D pooling", r - 2)));
    }
    let with_indices = n.op == "MaxPool" && n.outputs.get(1).is_some_and(|o| o.is_some());
    unsupported_outputs(c, if n.op == "MaxPool" { 2 } else { 1 })?;
    let storage = n.attr_i("storage_order", 0)?;
    if !(0..=1).contains(&storage) {
        return Err(c.bad_attr(format!("storage_order = {storage} (0 or 1)")));
    }
    let ks = n
        .attr_ints("kernel_shape")?
        .ok_or_else(|| c.bad_attr("missing kernel_shape"))?;
    if ks.iter().any(|&k| k < 1) {
        return Err(c.bad_attr(format!("kernel_shape {ks:?}")));
    }
    let ceil = n.attr_i("ceil_mode", 0)? != 0;
    let p = window_params(
        c,
        &x.shape[2..],
        ks.iter().map(|&k| k as usize).collect(),
        ceil,
    )?;
    let mut s = x.shape[..2].to_vec();
    s.extend(&p.out);
    if with_indices {
        return Ok(vec![out(x.dtype, s.clone()), out(DType::I64, s)]);
    }
    Ok(vec![out(x.dtype, s)])
}

/// Global pooling: every spatial dimension becomes 1.
pub(crate) fn infer_global_pool(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    if x.shape.len() < 3 {
        return Err(c.mismatch("global pooling of rank < 3"));
    }
    let mut s = x.shape[..2].to_vec();
    s.resize(x.shape.len(), 1);
    Ok(vec![out(x.dtype, s)])
}

impl<'a> Lowerer<'a> {
    /// MaxPool, then its optional Indices output: the flat index (over `N·C` and the
    /// spatial dims, row-major; column-major over the spatial dims when `storage_order` is
    /// set) of the first maximum of each window in row-major window order, as the ONNX
    /// reference finds it. The input is copied into a −∞-padded buffer; for each kernel
    /// offset, last to first, the strided view of that offset is compared with the pooled
    /// output and, where equal, the offset's position (a constant ramp of spatial indices)
    /// is selected; the channel base is added at the end.
    pub(crate) fn lower_max_pool(&mut self, at: At<'a>) -> Result<()> {
        self.lower_pool(at)?;
        let At { n, c, o0, .. } = at;
        let Some(Some(o1)) = n.outputs.get(1).copied() else {
            return Ok(());
        };
        let xv = c.input(0)?;
        let ks: Vec<usize> = n
            .attr_ints("kernel_shape")?
            .unwrap_or_default()
            .iter()
            .map(|&k| k as usize)
            .collect();
        let ceil = n.attr_i("ceil_mode", 0)? != 0;
        let p = params::window_params(&c, &xv.shape[2..], ks.clone(), ceil)?;
        let column_major = n.attr_i("storage_order", 0)? != 0;
        let ind = self.alloc(o1);
        let oshape = ind.shape.clone();
        if oshape.contains(&0) || xv.shape.contains(&0) {
            return Ok(());
        }
        let sp = &xv.shape[2..];
        let k = sp.len();
        // Padded sizes: every window lies inside.
        let padded: Vec<usize> = (0..k)
            .map(|d| {
                let need = (p.out[d] - 1) * p.strides[d] + (ks[d] - 1) * p.dilations[d] + 1;
                need.max(p.pad_begin[d] + sp[d] + p.pad_end[d])
            })
            .collect();
        let mut pshape = xv.shape[..2].to_vec();
        pshape.extend(&padded);
        let pn = crate::tensor::budget("MaxPool padded input", &pshape, DType::F32)
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        let pad = View::dense(self.temp(pn * 4), DType::F32, &pshape);
        self.fill(Engine::Dve, &pad, f64::NEG_INFINITY)?;
        let mut inner = pad.clone();
        for (d, &len) in sp.iter().enumerate() {
            inner = inner.slice(2 + d, p.pad_begin[d] as i64, len, 1);
        }
        let x = self.input_view(n, 0)?;
        self.copy(Engine::Dve, &x, &inner)?;
        // Spatial index of each padded position (−1 in the padding).
        let total_sp: usize = padded.iter().product();
        let mut ramp = crate::tensor::try_vec::<i64>(total_sp, "MaxPool index ramp")
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        for flat in 0..total_sp {
            let (mut rem, mut valid) = (flat, true);
            let mut coords = vec![0usize; k];
            for d in (0..k).rev() {
                coords[d] = rem % padded[d];
                rem /= padded[d];
            }
            let (mut row, mut col, mut mul_c) = (0i64, 0i64, 1i64);
            for d in 0..k {
                let Some(q) = coords[d].checked_sub(p.pad_begin[d]).filter(|&q| q < sp[d]) else {
                    valid = false;
                    break;
                };
                row = row * sp[d] as i64 + q as i64;
                col += q as i64 * mul_c;
                mul_c *= sp[d] as i64;
            }
            ramp.push(match (valid, column_major) {
                (false, _) => -1,
                (true, true) => col,
                (true, false) => row,
            });
        }
        let ra = self.add_const(&crate::tensor::HostTensor::ints(
            DType::I64,
            padded.clone(),
            ramp,
        ))?;
        let ramp = View::dense(ra, DType::I64, &padded);
        let y = self.sview(o0)?;
        let total: usize = oshape.iter().product();
        let eq = View::dense(self.temp(total), DType::Bool, &oshape);
        let acc = View::dense(self.temp(total * 8), DType::I64, &oshape);
        self.fill(Engine::Dve, &acc, -1.0)?;
        let offsets: usize = ks.iter().product();
        for o in (0..offsets).rev() {
            let (mut pv, mut rv, mut rem) = (pad.clone(), ramp.clone(), o);
            for d in (0..k).rev() {
                let od = rem % ks[d];
                rem /= ks[d];
                let start = (od * p.dilations[d]) as i64;
                pv = pv.slice(2 + d, start, p.out[d], p.strides[d] as i64);
                rv = rv.slice(d, start, p.out[d], p.strides[d] as i64);
            }
            self.binary(&pv, &y, &eq, BinaryOp::Equal)?;
            self.select(&eq, &rv.broadcast(&oshape), &acc, &acc)?;
        }
        // + (n·C + c) · spatial size.
        let (nb, ch) = (xv.shape[0], xv.shape[1]);
        let step: usize = sp.iter().product();
        let base: Vec<i64> = (0..nb * ch).map(|i| (i * step) as i64).collect();
        let ba = self.add_const(&crate::tensor::HostTensor::ints(
            DType::I64,
            vec![nb, ch],
            base,
        ))?;
        let mut bs = vec![nb, ch];
        bs.resize(oshape.len(), 1);
        let bv = View::dense(ba, DType::I64, &bs).broadcast(&oshape);
        self.binary(&acc, &bv, &ind, BinaryOp::Add)
    }

    /// Global pooling: one reduction over the spatial dimensions.
    pub(crate) fn lower_global_pool(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, op, o0, .. } = at;
        let xv = c.input(0)?;
        let (x, y) = self.unary_io(n, o0)?;
        let (nn, ch) = (xv.shape[0], xv.shape[1]);
        let s: usize = xv.shape[2..].iter().product();
        let rop = if op == "GlobalMaxPool" {
            ReduceOp::Max
        } else {
            ReduceOp::Mean
        };
        let xa = dense_ap(x.addr, x.dtype, &[nn, ch, s])?;
        let ya = dense_ap(y.addr, y.dtype, &[nn, ch, 1])?;
        if nn * ch * s > 0 {
            self.emit_reduce(xa, ya, rop, 0b1000);
        }
        Ok(())
    }

    /// MaxPool / AveragePool over 1, 2 or 3 spatial dimensions. A 3-D pool is separable:
    /// a 2-D pool over (H, W) of the `[N, C·D, H, W]` view, then a pool over D of the
    /// `[N·C, 1, D, OH·OW]` view of that result. Both reductions factor over the dimensions
    /// (max of maxima; for averages the divisor is a product of per-dimension counts, so
    /// averaging averages divides by it), whatever the padding counts.
    pub(crate) fn lower_pool(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let xv = c.input(0)?;
        let ks: Vec<usize> = n
            .attr_ints("kernel_shape")?
            .unwrap_or_default()
            .iter()
            .map(|&k| k as usize)
            .collect();
        let ceil = n.attr_i("ceil_mode", 0)? != 0;
        let p = params::window_params(&c, &xv.shape[2..], ks, ceil)?;
        let is_max = n.op == "MaxPool";
        // LpPool: (Σ|x|^p)^(1/p), the sum an average over whole windows (overhang and
        // padding counted) times the window size.
        let lp = (n.op == "LpPool").then(|| n.attr_i("p", 2)).transpose()?;
        let include_pad = lp.is_some() || (!is_max && n.attr_i("count_include_pad", 0)? != 0);
        let mut x = self.input_view(n, 0)?;
        let y = self.alloc(o0);
        if y.shape.contains(&0) || x.shape.contains(&0) {
            return Ok(());
        }
        let f = |f: ActFunc| (f, 0.0, 0.0);
        if let Some(pw) = lp {
            if pw < 1 {
                return Err(c.bad_attr(format!("p = {pw}")));
            }
            let t = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
            match pw {
                1 => self.activation(&x, &t, None, f(ActFunc::Abs), 1.0)?,
                2 => self.activation(&x, &t, None, f(ActFunc::Square), 1.0)?,
                _ => {
                    self.activation(&x, &t, None, f(ActFunc::Abs), 1.0)?;
                    self.activation(&t, &t, None, f(ActFunc::Log), 1.0)?;
                    self.activation(&t, &t, None, f(ActFunc::Exp), pw as f32)?;
                }
            }
            x = t;
        }
        let (nn, ch) = (xv.shape[0], xv.shape[1]);
        let dim = |k: usize| PoolDim {
            kernel: p.kernel[k],
            stride: p.strides[k],
            dilation: p.dilations[k],
            pad_begin: p.pad_begin[k],
            pad_end: p.pad_end[k],
            ceil_extra: p.ceil_extra[k],
        };
        let unit = PoolDim {
            kernel: 1,
            stride: 1,
            dilation: 1,
            pad_begin: 0,
            pad_end: 0,
            ceil_extra: 0,
        };
        let sp = &xv.shape[2..];
        let os = &y.shape[2..];
        let pooled = match sp.len() {
            1 => self.pool2d(
                &View::dense(x.addr, x.dtype, &[nn, ch, 1, sp[0]]),
                &View::dense(y.addr, y.dtype, &[nn, ch, 1, os[0]]),
                [unit, dim(0)],
                is_max,
                include_pad,
                lp.is_some(),
            ),
            2 => self.pool2d(&x, &y, [dim(0), dim(1)], is_max, include_pad, lp.is_some()),
            3 => {
                let mid = [nn, ch * sp[0], os[1], os[2]];
                let t = View::dense(
                    self.temp(mid.iter().product::<usize>() * 4),
                    DType::F32,
                    &mid,
                );
                self.pool2d(
                    &View::dense(x.addr, x.dtype, &[nn, ch * sp[0], sp[1], sp[2]]),
                    &t,
                    [dim(1), dim(2)],
                    is_max,
                    include_pad,
                    lp.is_some(),
                )?;
                self.pool2d(
                    &View::dense(t.addr, t.dtype, &[nn * ch, 1, sp[0], os[1] * os[2]]),
                    &View::dense(y.addr, y.dtype, &[nn * ch, 1, os[0], os[1] * os[2]]),
                    [dim(0), unit],
                    is_max,
                    include_pad,
                    lp.is_some(),
                )
            }
            r => Err(c.e(ErrorKind::UnsupportedOp, format!("{r}-D pooling"))),
        };
        pooled?;
        if let Some(pw) = lp {
            let win = p.kernel.iter().product::<usize>() as f32;
            match pw {
                1 => self.tensor_scalar(&y, &y, BinaryOp::Mul, win)?,
                2 => self.activation(&y, &y, None, f(ActFunc::Sqrt), win)?,
                _ => {
                    self.activation(&y, &y, None, f(ActFunc::Log), win)?;
                    self.activation(&y, &y, None, f(ActFunc::Exp), 1.0 / pw as f32)?;
                }
            }
        }
        Ok(())
    }

    /// One Pool instruction over dense `[N, C, H, W]` views.
    fn pool2d(
        &mut self,
        x: &View,
        y: &View,
        d: [PoolDim; 2],
        is_max: bool,
        include_pad: bool,
        whole_windows: bool,
    ) -> Result<()> {
        let mut x = x.clone();
        let xs = x.shape.clone();
        let (mut pb, mut pe) = (d.map(|v| v.pad_begin), d.map(|v| v.pad_end));
        let extra = d.map(|v| v.ceil_extra);
        let mut count_pad = include_pad;
        if include_pad && extra != [0, 0] && !whole_windows {
            // Counted padding but uncounted ceil-mode overhang: count only the cells inside
            // the padded image, the padding made real cells (zeros) when there is any.
            count_pad = false;
        }
        if !count_pad && include_pad && (pb != [0, 0] || pe != [0, 0]) {
            let ps = vec![xs[0], xs[1], xs[2] + pb[0] + pe[0], xs[3] + pb[1] + pe[1]];
            let t = View::dense(self.temp(ps.iter().product::<usize>() * 4), DType::F32, &ps);
            self.fill(Engine::Pool, &t, 0.0)?;
            let inner = t
                .slice(2, pb[0] as i64, xs[2], 1)
                .slice(3, pb[1] as i64, xs[3], 1);
            self.copy(Engine::Pool, &x, &inner)?;
            x = t;
            pb = [0, 0];
            pe = [0, 0];
        }
        let window = Window {
            kernel: d.map(|v| v.kernel as u32),
            stride: d.map(|v| v.stride as u32),
            pad: [
                pb[0] as u32,
                pb[1] as u32,
                (pe[0] + extra[0]) as u32,
                (pe[1] + extra[1]) as u32,
            ],
            dilation: d.map(|v| v.dilation as u32),
        };
        let xa = x.ap()?;
        let ya = y.ap()?;
        self.emit(
            0,
            Engine::Pool,
            Op::Pool(op::Pool {
                input: xa,
                output: ya,
                window,
                op: if is_max { PoolOp::Max } else { PoolOp::Avg },
                count_include_pad: count_pad,
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, a_ints, out_types, var};
    use nrt_hal::DType;

    #[test]
    fn pooling_output_shapes() {
        let x = || var(DType::F32, &[1, 2, 5, 5]);
        let attrs = vec![
            a_ints("kernel_shape", &[2, 2]),
            a_ints("strides", &[2, 2]),
            a_i("ceil_mode", 1),
        ];
        let t = out_types("MaxPool", 12, vec![x()], attrs, 2).unwrap();
        assert_eq!(
            t,
            vec![
                (DType::F32, vec![1, 2, 3, 3]),
                (DType::I64, vec![1, 2, 3, 3])
            ]
        );
        let t = out_types(
            "AveragePool",
            11,
            vec![x()],
            vec![a_ints("kernel_shape", &[3, 3])],
            1,
        );
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 2, 3, 3])]);
        let t = out_types("GlobalMaxPool", 1, vec![x()], vec![], 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 2, 1, 1])]);
    }

    #[test]
    fn pooling_needs_a_kernel_and_a_known_storage_order() {
        let x = || var(DType::F32, &[1, 2, 5, 5]);
        let e = out_types("MaxPool", 12, vec![x()], vec![], 1).unwrap_err();
        assert!(e.message.contains("missing kernel_shape"), "{e}");
        let attrs = vec![a_ints("kernel_shape", &[2, 2]), a_i("storage_order", 2)];
        let e = out_types("MaxPool", 12, vec![x()], attrs, 1).unwrap_err();
        assert!(e.message.contains("storage_order = 2"), "{e}");
    }
}
