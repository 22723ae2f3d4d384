//! Operators computed at compile time: Constant, Shape, Size, ConstantOfShape, Range,
//! EyeLike (only the input's shape matters), the Hann / Hamming / Blackman windows and
//! MelWeightMatrix (from its five scalar inputs; given as graph inputs, they become known by
//! specialization: the error names them).

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::params::{Ctx, Out, konst};
use crate::tensor::{HostTensor, dtype_from_onnx, onnx_type_name, try_vec};

pub(super) fn register(r: &mut Registry) {
    r.op("Constant", 1, infer_constant);
    r.op("Shape", 1, infer_shape);
    r.op("Size", 1, infer_size).fold(Fold::Only);
    r.op("ConstantOfShape", 9, infer_constant_of_shape)
        .fold(Fold::Only);
    r.op("Range", 11, infer_range).fold(Fold::Only);
    r.op("EyeLike", 9, infer_eye_like)
        .note("a constant of the input's shape");
    r.op("MelWeightMatrix", 17, infer_mel_weight_matrix)
        .fold(Fold::Only)
        .note("parameters known at compile time: a constant");
    for name in ["HannWindow", "HammingWindow", "BlackmanWindow"] {
        r.op(name, 17, infer_window)
            .fold(Fold::Only)
            .note("size known at compile time");
    }
}

/// The element type named by attribute `attr` (ONNX TensorProto code), or `default`.
fn dtype_attr(c: &Ctx, attr: &str, default: nrt_hal::DType) -> Result<nrt_hal::DType> {
    let n = c.n;
    if !n.has_attr(attr) {
        return Ok(default);
    }
    let t = n.attr_i(attr, 0)? as i32;
    dtype_from_onnx(t).ok_or_else(|| {
        c.e(
            ErrorKind::UnsupportedDType,
            format!("{attr} {}", onnx_type_name(t)),
        )
    })
}

/// EyeLike: ones on diagonal `k` of a 2-D tensor of the input's shape (its values are not
/// read, so the output is a constant).
pub(crate) fn infer_eye_like(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let [rows, cols] = x.shape[..] else {
        return Err(c.mismatch(format!("EyeLike of shape {:?} (2-D only)", x.shape)));
    };
    let d = dtype_attr(c, "dtype", x.dtype)?;
    let k = n.attr_i("k", 0)?;
    let t = HostTensor::try_from_f64s(
        "the output",
        d,
        vec![rows, cols],
        (0..rows * cols).map(|e| {
            let (i, j) = ((e / cols) as i64, (e % cols) as i64);
            f64::from(u8::from(j - i == k))
        }),
    )
    .map_err(|e| e.at_node(&n.name, &n.op))?;
    Ok(vec![konst(t)])
}

/// HannWindow / HammingWindow / BlackmanWindow of a compile-time size, as the ONNX
/// reference computes them (in f64, then the output type).
pub(crate) fn infer_window(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let size = match c.const_ints(0, "size")?.as_deref() {
        Some([s]) if *s >= 0 => *s as usize,
        Some(v) => return Err(c.bad_attr(format!("size {v:?}"))),
        None => return Err(c.needs_known(0, "size must be known at compile time")),
    };
    let d = dtype_attr(c, "output_datatype", nrt_hal::DType::F32)?;
    let periodic = n.attr_i("periodic", 1)? != 0;
    let n1 = if periodic {
        size as f64
    } else {
        size as f64 - 1.0
    };
    let pi = std::f64::consts::PI;
    let op = n.op.clone();
    let t = HostTensor::try_from_f64s(
        "the output",
        d,
        vec![size],
        (0..size).map(|i| {
            let x = i as f64;
            match op.as_str() {
                "HannWindow" => (x * pi / n1).sin().powi(2),
                "HammingWindow" => {
                    let a = 25.0 / 46.0;
                    a - (x * pi * 2.0 / n1).cos() * (1.0 - a)
                }
                _ => (x * (pi * 2.0) / n1).cos() * -0.5 + (x * (pi * 4.0) / n1).cos() * 0.08 + 0.42,
            }
        }),
    )
    .map_err(|e| e.at_node(&n.name, &n.op))?;
    Ok(vec![konst(t)])
}

/// MelWeightMatrix: the `[dft_length/2 + 1, num_mel_bins]` triangular filter bank, as
/// the ONNX reference computes it (`op_mel_weight_matrix.py`): the mel bounds and step in
/// f32, the band edges `⌊(dft_length + 1)·hz / sample_rate⌋` in f64, rising and falling
/// ramps between consecutive edges.
pub(crate) fn infer_mel_weight_matrix(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let scalar_i = |i: usize, what: &str| -> Result<i64> {
        match c.const_ints(i, what)?.as_deref() {
            Some([v]) => Ok(*v),
            v => Err(c.bad_attr(format!("{what} {v:?} (one value expected)"))),
        }
    };
    let scalar_f = |i: usize, what: &str| -> Result<f32> {
        match c.const_floats(i, what)?.as_deref() {
            Some([v]) => Ok(*v),
            v => Err(c.bad_attr(format!("{what} {v:?} (one value expected)"))),
        }
    };
    let mels = scalar_i(0, "num_mel_bins")?;
    let dft = scalar_i(1, "dft_length")?;
    let rate = scalar_i(2, "sample_rate")?;
    let (lo, hi) = (
        scalar_f(3, "lower_edge_hertz")?,
        scalar_f(4, "upper_edge_hertz")?,
    );
    if mels <= 0 || dft <= 0 || rate <= 0 {
        return Err(c.bad_attr(format!(
            "num_mel_bins {mels}, dft_length {dft}, sample_rate {rate} (all must be positive)"
        )));
    }
    let d = dtype_attr(c, "output_datatype", nrt_hal::DType::F32)?;
    let (mels, bins) = (mels as usize, (dft / 2 + 1) as usize);
    crate::tensor::budget("the output", &[bins, mels], d).map_err(|e| e.at_node(&n.name, &n.op))?;
    let mel = |hz: f32| 2595f32 * (1f32 + hz / 700f32).log10();
    let (lo_mel, hi_mel) = (mel(lo), mel(hi));
    let step = (hi_mel - lo_mel) / (mels + 2) as f32;
    let at_node = |e: crate::error::CompileError| e.at_node(&n.name, &n.op);
    let mut edges = try_vec::<i64>(mels + 2, "the band edges").map_err(at_node)?;
    edges.extend((0..mels + 2).map(|i| {
        let m = i as f64 * step as f64 + lo_mel as f64;
        let hz = 700.0 * (10f64.powf(m / 2595.0) - 1.0);
        (((dft + 1) as f64 * hz) / rate as f64).floor() as i64
    }));
    let mut w = try_vec::<f64>(bins * mels, "the output").map_err(at_node)?;
    w.resize(bins * mels, 0.0);
    let at = |j: i64| -> Result<usize> {
        usize::try_from(j).ok().filter(|&j| j < bins).ok_or_else(|| {
            c.bad_attr(format!(
                "band edge {j} is outside the {bins} spectrogram bins (lower_edge_hertz {lo}, upper_edge_hertz {hi}, sample_rate {rate})"
            ))
        })
    };
    for i in 0..mels {
        let (l, m, h) = (edges[i], edges[i + 1], edges[i + 2]);
        if m == l {
            w[at(m)? * mels + i] = 1.0;
        } else {
            for j in l..=m {
                w[at(j)? * mels + i] = (j - l) as f64 / (m - l) as f64;
            }
        }
        if h > m {
            for j in m..h {
                w[at(j)? * mels + i] = (h - j) as f64 / (h - m) as f64;
            }
        }
    }
    let t = HostTensor::try_from_f64s("the output", d, vec![bins, mels], w.into_iter())
        .map_err(at_node)?;
    Ok(vec![konst(t)])
}

/// Constant (any of its value attributes).
pub(crate) fn infer_constant(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let t = if let Some(t) = n.attr_t("value")? {
        t
    } else if n.has_attr("value_float") {
        HostTensor::f32(vec![], vec![n.attr_f("value_float", 0.0)?])
    } else if let Some(v) = n.attr_floats("value_floats")? {
        HostTensor::f32(vec![v.len()], v)
    } else if n.has_attr("value_int") {
        HostTensor::i64(vec![], vec![n.attr_i("value_int", 0)?])
    } else if let Some(v) = n.attr_ints("value_ints")? {
        HostTensor::i64(vec![v.len()], v)
    } else {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            "Constant without a value / value_float(s) / value_int(s) attribute",
        ));
    };
    Ok(vec![konst(t)])
}

/// Shape (with start / end).
pub(crate) fn infer_shape(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let x = c.input(0)?;
    let r = x.shape.len() as i64;
    let clampi = |v: i64| if v < 0 { (v + r).max(0) } else { v.min(r) };
    let start = clampi(n.attr_i("start", 0)?) as usize;
    let end = clampi(n.attr_i("end", r)?) as usize;
    let v: Vec<i64> = x.shape[start..end.max(start)]
        .iter()
        .map(|&d| d as i64)
        .collect();
    Ok(vec![konst(HostTensor::i64(vec![v.len()], v))])
}

/// Size.
pub(crate) fn infer_size(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    Ok(vec![konst(HostTensor::i64(
        vec![],
        vec![x.elements() as i64],
    ))])
}

/// ConstantOfShape.
pub(crate) fn infer_constant_of_shape(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let s = c.const_ints(0, "shape")?.unwrap_or_default();
    if s.iter().any(|&d| d < 0) {
        return Err(c.bad_attr(format!("shape {s:?}")));
    }
    let shape: Vec<usize> = s.iter().map(|&d| d as usize).collect();
    let v = n
        .attr_t("value")?
        .unwrap_or_else(|| HostTensor::f32(vec![1], vec![0.0]));
    if v.len() != 1 {
        return Err(c.bad_attr("value must hold one element"));
    }
    let t = HostTensor::try_from_f64s(
        "the output",
        v.dtype,
        shape,
        std::iter::repeat(v.get_f64(0)),
    )
    .map_err(|e| e.at_node(&n.name, &n.op))?;
    Ok(vec![konst(t)])
}

/// Range.
pub(crate) fn infer_range(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let (s, l, d) = (c.input(0)?, c.konst(1), c.konst(2));
    let (Some(st), Some(li), Some(de)) = (c.konst(0), l, d) else {
        // The output's length depends on the values: every non-constant one is named.
        let mut needs = Vec::new();
        for v in c.n.inputs.iter().take(3).flatten() {
            for x in crate::graph::input_deps(c.g, *v) {
                if !needs.contains(&x) {
                    needs.push(x);
                }
            }
        }
        return Err(c
            .e(
                ErrorKind::UnsupportedOp,
                "Range inputs (start, limit, delta) must be known at compile time: the output's length depends on them",
            )
            .needing(needs));
    };
    let (a, b, dd) = (st.get_f64(0), li.get_f64(0), de.get_f64(0));
    if dd == 0.0 {
        return Err(c.bad_attr("delta is 0"));
    }
    // Saturating float-to-int: NaN gives 0, ±inf and huge counts give usize::MAX,
    // which the budget then refuses.
    let cnt = ((b - a) / dd).ceil().max(0.0) as usize;
    let t = HostTensor::try_from_f64s(
        "the output",
        s.dtype,
        vec![cnt],
        (0..cnt).map(|i| a + i as f64 * dd),
    )
    .map_err(|e| e.at_node(&n.name, &n.op))?;
    Ok(vec![konst(t)])
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, infer_one, konst, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    /// The constant value of the node's only output.
    fn value(
        op: &str,
        ins: Vec<Option<crate::eval::testing::Arg>>,
        attrs: Vec<crate::onnx::AttributeProto>,
    ) -> HostTensor {
        let g = infer_one(op, 17, ins, attrs, 1).unwrap();
        let v = &g.values[g.outputs[0]];
        v.konst
            .as_deref()
            .cloned()
            .unwrap_or_else(|| panic!("{op} is not constant"))
    }

    #[test]
    fn shape_eye_like_and_range_are_constants_of_run_time_inputs() {
        let x = || var(DType::F32, &[2, 3, 5]);
        let s = value("Shape", vec![x()], vec![a_i("start", 1), a_i("end", -1)]);
        assert_eq!(s, HostTensor::i64(vec![1], vec![3]));
        assert_eq!(
            value("Size", vec![x()], vec![]),
            HostTensor::i64(vec![], vec![30])
        );
        let eye = value("EyeLike", vec![var(DType::I64, &[2, 3])], vec![a_i("k", 1)]);
        assert_eq!(eye, HostTensor::i64(vec![2, 3], vec![0, 1, 0, 0, 0, 1]));
        let sc = |v: i64| konst(HostTensor::i64(vec![], vec![v]));
        let r = value("Range", vec![sc(1), sc(8), sc(3)], vec![]);
        assert_eq!(r, HostTensor::i64(vec![3], vec![1, 4, 7]));
    }

    #[test]
    fn range_names_its_run_time_inputs_and_refuses_a_zero_delta() {
        let sc = |v: i64| konst(HostTensor::i64(vec![], vec![v]));
        let ins = vec![sc(0), var(DType::I64, &[]), sc(1)];
        let e = infer_one("Range", 17, ins, vec![], 1).unwrap_err();
        assert_eq!(e.needs_inputs, vec!["x1".to_string()], "{e}");
        let e = infer_one("Range", 17, vec![sc(0), sc(4), sc(0)], vec![], 1).unwrap_err();
        assert!(e.message.contains("delta is 0"), "{e}");
    }
}
