//! DeformConv (2-D): the sampled columns on POOL (`Op::DeformIm2col`, NCM 1.4), then per
//! image and group one MatMul by the weights on PE, then the bias on DVE. Offsets, mask and
//! weights may all be computed at run time.

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::view::{View, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, WindowParams, out, window_params};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{BinaryOp, Op, Window};

pub(super) fn register(r: &mut Registry) {
    r.op("DeformConv", 19, infer_deform_conv)
        .fold(Fold::Never)
        .note("2-D, f32: sampled columns on POOL (bilinear, zero outside), MatMuls on PE")
        .device(lower!(lower_deform_conv));
}

/// The window, `group` and `offset_group`, with the shapes checked.
fn deform_params(c: &Ctx) -> Result<(WindowParams, usize, usize)> {
    let (x, w, off) = (c.input(0)?, c.input(1)?, c.input(2)?);
    if x.shape.len() != 4 || w.shape.len() != 4 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!(
                "input '{}' is {:?}; DeformConv is supported in 2-D ([N, C, H, W])",
                x.name, x.shape
            ),
        ));
    }
    for v in [x, w, off] {
        if v.dtype != DType::F32 {
            return Err(c.e(
                ErrorKind::UnsupportedDType,
                format!("input '{}' is {}; f32 is supported", v.name, v.dtype),
            ));
        }
    }
    let kernel = match c.n.attr_ints("kernel_shape")? {
        Some(k) => k.iter().map(|&k| usize::try_from(k).unwrap_or(0)).collect(),
        None => w.shape[2..].to_vec(),
    };
    if kernel != w.shape[2..] {
        return Err(c.mismatch(format!(
            "kernel_shape {kernel:?} does not match weight '{}' {:?}",
            w.name, w.shape
        )));
    }
    let wp = window_params(c, &x.shape[2..], kernel, false)?;
    let positive = |name: &str| -> Result<usize> {
        let v = c.n.attr_i(name, 1)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| v >= 1)
            .ok_or_else(|| c.bad_attr(format!("{name} = {v}")))
    };
    let (group, og) = (positive("group")?, positive("offset_group")?);
    let (ch, oc) = (x.shape[1], w.shape[0]);
    if w.shape[1] * group != ch || !oc.is_multiple_of(group) || !ch.is_multiple_of(og) {
        return Err(c.mismatch(format!(
            "X {:?}, W {:?}, group {group}, offset_group {og} do not agree",
            x.shape, w.shape
        )));
    }
    let taps = wp.kernel[0] * wp.kernel[1];
    let want = [x.shape[0], og * taps * 2, wp.out[0], wp.out[1]];
    if off.shape != want {
        return Err(c.mismatch(format!(
            "offset '{}' is {:?}, expected {want:?}",
            off.name, off.shape
        )));
    }
    if let Some(b) = c.opt(3)
        && (b.shape != [oc] || b.dtype != DType::F32)
    {
        return Err(c.mismatch(format!("bias '{}' must be f32 [{oc}]", b.name)));
    }
    if let Some(m) = c.opt(4) {
        let want = [x.shape[0], og * taps, wp.out[0], wp.out[1]];
        if m.shape != want || m.dtype != DType::F32 {
            return Err(c.mismatch(format!(
                "mask '{}' is {} {:?}, expected f32 {want:?}",
                m.name, m.dtype, m.shape
            )));
        }
    }
    Ok((wp, group, og))
}

/// DeformConv: Y `[N, M, oH, oW]`.
fn infer_deform_conv(c: &Ctx) -> Result<Vec<Out>> {
    let (wp, ..) = deform_params(c)?;
    let (x, w) = (c.input(0)?, c.input(1)?);
    Ok(vec![out(
        DType::F32,
        vec![x.shape[0], w.shape[0], wp.out[0], wp.out[1]],
    )])
}

impl<'a> Lowerer<'a> {
    pub(crate) fn lower_deform_conv(&mut self, at: At<'a>) -> Result<()> {
        let c = at.c;
        let (wp, group, og) = deform_params(&c)?;
        let x = self.input_view(at.n, 0)?;
        let w = self.input_view(at.n, 1)?;
        let off = self.input_view(at.n, 2)?;
        let mask = match c.opt(4) {
            Some(_) => Some(self.input_view(at.n, 4)?),
            None => None,
        };
        let y = self.alloc(at.o0);
        let (n, ch, oc) = (x.shape[0], x.shape[1], w.shape[0]);
        let (oh, ow) = (wp.out[0], wp.out[1]);
        let k = wp.kernel[0] * wp.kernel[1];
        let ck = ch * k;
        let cols = View::dense(
            self.temp(n * ck * oh * ow * 4),
            DType::F32,
            &[n, ck, oh, ow],
        );
        let u32_of = |v: usize| {
            u32::try_from(v).map_err(|_| crate::lower::view::too_large("a window attribute"))
        };
        let window = Window {
            kernel: [u32_of(wp.kernel[0])?, u32_of(wp.kernel[1])?],
            stride: [u32_of(wp.strides[0])?, u32_of(wp.strides[1])?],
            pad: [u32_of(wp.pad_begin[0])?, u32_of(wp.pad_begin[1])?, 0, 0],
            dilation: [u32_of(wp.dilations[0])?, u32_of(wp.dilations[1])?],
        };
        let ap4 = |v: &View| -> Result<nrt_isa::AccessPattern> {
            let s = &v.shape;
            mk_ap(
                v.addr,
                DType::F32,
                s,
                &[
                    (s[1] * s[2] * s[3]) as i64,
                    (s[2] * s[3]) as i64,
                    s[3] as i64,
                    1,
                ],
            )
        };
        self.emit(
            0,
            Engine::Pool,
            Op::DeformIm2col(op::DeformIm2col {
                input: ap4(&x)?,
                offset: ap4(&off)?,
                mask: mask.as_ref().map(ap4).transpose()?,
                cols: ap4(&cols)?,
                window,
                offset_groups: og as u32,
            }),
        );
        // Per image and group: Y[n, g] (ocg × oH·oW) = W[g] (ocg × cg·K) · cols[n, g].
        let (ocg, cgk, p) = (oc / group, ck / group, oh * ow);
        for b in 0..n {
            for g in 0..group {
                let a = mk_ap(
                    w.elems((g * ocg * cgk) as i64),
                    DType::F32,
                    &[ocg, cgk],
                    &[cgk as i64, 1],
                )?;
                let bb = mk_ap(
                    cols.elems(((b * ck + g * cgk) * p) as i64),
                    DType::F32,
                    &[cgk, p],
                    &[p as i64, 1],
                )?;
                let cc = mk_ap(
                    y.elems(((b * oc + g * ocg) * p) as i64),
                    DType::F32,
                    &[ocg, p],
                    &[p as i64, 1],
                )?;
                self.matmul_aps(a, bb, cc, 1.0, 0);
            }
        }
        if c.opt(3).is_some() {
            let bias = self.input_sview(at.n, 3)?;
            let bias = View {
                addr: bias.addr,
                dtype: DType::F32,
                shape: vec![n, oc, oh, ow],
                strides: vec![0, bias.strides[0], 0, 0],
            };
            self.binary(&y, &bias, &y, BinaryOp::Add)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, ctx, one_node, out_types, var};
    use nrt_hal::DType;

    /// X [1, 4, 5, 5], W [6, 2, 3, 3] in 2 groups, offsets of 2 offset groups (`off` channels).
    fn ins(off: usize) -> Vec<Option<crate::eval::testing::Arg>> {
        let f = |s: &[usize]| var(DType::F32, s);
        vec![f(&[1, 4, 5, 5]), f(&[6, 2, 3, 3]), f(&[1, off, 3, 3])]
    }

    #[test]
    fn params_and_output_shape_of_a_grouped_deform_conv() {
        let attrs = || vec![a_i("group", 2), a_i("offset_group", 2)];
        let g = one_node("DeformConv", 19, ins(36), attrs(), 1);
        let c = ctx(&g);
        let (wp, group, og) = super::deform_params(&c).unwrap();
        assert_eq!(
            (wp.kernel.clone(), wp.out.clone(), group, og),
            (vec![3, 3], vec![3, 3], 2, 2)
        );
        let t = out_types("DeformConv", 19, ins(36), attrs(), 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![1, 6, 3, 3])]);
    }

    #[test]
    fn offsets_of_the_wrong_shape_are_named() {
        let attrs = vec![a_i("group", 2), a_i("offset_group", 2)];
        let e = out_types("DeformConv", 19, ins(18), attrs, 1).unwrap_err();
        assert!(
            e.message.contains("offset 'x2'") && e.message.contains("[1, 36, 3, 3]"),
            "{e}"
        );
        let e = out_types("DeformConv", 19, ins(36), vec![a_i("group", 0)], 1).unwrap_err();
        assert!(e.message.contains("group = 0"), "{e}");
    }
}
