//! RoiAlign: one POOL instruction (`Op::RoiAlign`, NCM 1.4). The regions and batch indices
//! are read by the kernel at execution time (they are usually computed by the model).

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::view::mk_ap;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{Op, ROI_MAX_GRID, roi_flags};

pub(super) fn register(r: &mut Registry) {
    r.op("RoiAlign", 10, infer_roi_align)
        .fold(Fold::Never)
        .note("f32; regions and batch indices read at execution time; adaptive sampling at most 1024 samples per cell and dimension")
        .device(lower!(lower_roi_align));
}

/// `(output height, output width, sampling ratio, spatial scale, flags)`.
fn roi_params(c: &Ctx) -> Result<(usize, usize, u32, f32, u32)> {
    let n = c.n;
    let dim = |name: &str| -> Result<usize> {
        let v = n.attr_i(name, 1)?;
        usize::try_from(v)
            .ok()
            .filter(|&v| (1..=1 << 16).contains(&v))
            .ok_or_else(|| c.bad_attr(format!("{name} = {v} (1 to 65536)")))
    };
    let (oh, ow) = (dim("output_height")?, dim("output_width")?);
    let sr = n.attr_i("sampling_ratio", 0)?;
    let sr = u32::try_from(sr)
        .ok()
        .filter(|&s| s <= ROI_MAX_GRID)
        .ok_or_else(|| c.bad_attr(format!("sampling_ratio = {sr} (0 to {ROI_MAX_GRID})")))?;
    let scale = n.attr_f("spatial_scale", 1.0)?;
    if !scale.is_finite() {
        return Err(c.bad_attr(format!("spatial_scale = {scale}")));
    }
    let mut flags = match n.attr_s("mode", "avg")?.as_str() {
        "avg" => 0,
        "max" => roi_flags::MAX,
        m => return Err(c.bad_attr(format!("mode = '{m}' (avg or max)"))),
    };
    // Opset 16 added the attribute, defaulting to half_pixel; before, output_half_pixel.
    let default = if c.opset() >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    match n
        .attr_s("coordinate_transformation_mode", default)?
        .as_str()
    {
        "half_pixel" => flags |= roi_flags::HALF_PIXEL,
        "output_half_pixel" => {}
        m => {
            return Err(c.bad_attr(format!(
                "coordinate_transformation_mode = '{m}' (half_pixel or output_half_pixel)"
            )));
        }
    }
    Ok((oh, ow, sr, scale, flags))
}

/// RoiAlign: Y `[num_rois, C, output_height, output_width]`.
fn infer_roi_align(c: &Ctx) -> Result<Vec<Out>> {
    let (x, rois, bi) = (c.input(0)?, c.input(1)?, c.input(2)?);
    if x.shape.len() != 4 || x.dtype != DType::F32 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            format!(
                "input '{}' is {} {:?}; RoiAlign takes f32 [N, C, H, W]",
                x.name, x.dtype, x.shape
            ),
        ));
    }
    let nr = match rois.shape.as_slice() {
        [nr, 4] if rois.dtype == DType::F32 => *nr,
        _ => {
            return Err(c.mismatch(format!(
                "rois '{}' must be f32 [num_rois, 4], not {} {:?}",
                rois.name, rois.dtype, rois.shape
            )));
        }
    };
    if bi.shape != [nr] || bi.dtype != DType::I64 {
        return Err(c.mismatch(format!(
            "batch_indices '{}' must be i64 [{nr}], not {} {:?}",
            bi.name, bi.dtype, bi.shape
        )));
    }
    let (oh, ow, ..) = roi_params(c)?;
    Ok(vec![out(DType::F32, vec![nr, x.shape[1], oh, ow])])
}

impl<'a> Lowerer<'a> {
    pub(crate) fn lower_roi_align(&mut self, at: At<'a>) -> Result<()> {
        let (oh, ow, sampling_ratio, spatial_scale, flags) = roi_params(&at.c)?;
        let x = self.input_view(at.n, 0)?;
        let rois = self.input_view(at.n, 1)?;
        let bi = self.input_view(at.n, 2)?;
        let y = self.alloc(at.o0);
        let nr = rois.shape[0];
        let dense = |addr: u64, dt: DType, s: &[usize]| {
            let mut st = vec![1i64; s.len()];
            for i in (1..s.len()).rev() {
                st[i - 1] = st[i] * s[i] as i64;
            }
            mk_ap(addr, dt, s, &st)
        };
        self.emit(
            0,
            Engine::Pool,
            Op::RoiAlign(op::RoiAlign {
                input: dense(x.addr, DType::F32, &x.shape)?,
                rois: dense(rois.addr, DType::F32, &[nr, 4])?,
                batch_indices: dense(bi.addr, DType::I64, &[nr])?,
                output: dense(y.addr, DType::F32, &[nr, x.shape[1], oh, ow])?,
                spatial_scale,
                sampling_ratio,
                flags,
            }),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_f, a_i, a_s, ctx, one_node, out_types, var};
    use nrt_hal::DType;
    use nrt_isa::roi_flags;

    fn params(
        opset: i64,
        attrs: Vec<crate::onnx::AttributeProto>,
    ) -> Result<(usize, usize, u32, f32, u32), String> {
        let g = one_node("RoiAlign", opset, vec![], attrs, 1);
        let c = ctx(&g);
        super::roi_params(&c).map_err(|e| e.message)
    }

    #[test]
    fn roi_params_and_the_opset_default_coordinates() {
        let attrs = vec![
            a_i("output_height", 2),
            a_i("output_width", 3),
            a_i("sampling_ratio", 2),
            a_f("spatial_scale", 0.25),
            a_s("mode", "max"),
        ];
        let p = params(16, attrs.clone()).unwrap();
        assert_eq!(p, (2, 3, 2, 0.25, roi_flags::MAX | roi_flags::HALF_PIXEL));
        assert_eq!(params(10, attrs).unwrap().4, roi_flags::MAX);
        let e = params(16, vec![a_i("output_width", 0)]).unwrap_err();
        assert!(e.contains("output_width = 0 (1 to 65536)"), "{e}");
    }

    #[test]
    fn roi_align_output_and_its_index_check() {
        let ins = |bi: &[usize]| {
            vec![
                var(DType::F32, &[1, 3, 8, 8]),
                var(DType::F32, &[5, 4]),
                var(DType::I64, bi),
            ]
        };
        let attrs = || vec![a_i("output_height", 2), a_i("output_width", 2)];
        let t = out_types("RoiAlign", 16, ins(&[5]), attrs(), 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![5, 3, 2, 2])]);
        let e = out_types("RoiAlign", 16, ins(&[4]), attrs(), 1).unwrap_err();
        assert!(
            e.message.contains("batch_indices 'x2' must be i64 [5]"),
            "{e}"
        );
    }
}
