//! Small operators ONNX defines by others, decomposed during inference (the mechanism of
//! [`super::attention`]): `Xor` (`(a ∨ b) ∧ ¬(a ∧ b)`) and `LpNormalization`
//! (`x / ‖x‖ₚ` along an axis, 0 where the norm is 0, as the ONNX reference computes it:
//! `(Σ xᵖ)^(1/p)`, so p = 1 sums the values themselves).

use super::Registry;
use super::attention::{Expansion, a_int, g_splice, never_inferred};
use crate::error::{ErrorKind, Result};
use crate::graph::Graph;

pub(super) fn register(r: &mut Registry) {
    r.op("Xor", 7, never_inferred)
        .expands(expand_xor)
        .note("decomposed into And/Or/Not");
    r.op("LpNormalization", 1, never_inferred)
        .expands(expand_lp_norm)
        .note("decomposed (p = 1 or 2)");
    r.op("MeanVarianceNormalization", 9, never_inferred)
        .expands(expand_mvn)
        .note("decomposed as its ONNX function");
    r.op("CausalConvWithState", 27, never_inferred)
        .expands(expand_causal_conv)
        .note("decomposed: Concat with the state, depthwise Conv, SiLU, Slice");
    r.op("Upsample", 7, never_inferred)
        .expands(expand_upsample)
        .note("decomposed into Resize (asymmetric, floor for nearest)");
    r.op("AffineGrid", 20, never_inferred)
        .expands(expand_affine_grid)
        .note("size known at compile time: a constant base grid times θᵀ (MatMul)");
}

/// CausalConvWithState as the ONNX reference: the past state (zeros without one) in front
/// of the input along time, a depthwise Conv without padding (bias optional), then SiLU
/// when asked; the present state is the last `k − 1` steps of that padded input.
fn expand_causal_conv(g: &mut Graph, ni: usize) -> Result<()> {
    use super::attention::a_ints;
    let n = g.nodes[ni].clone();
    let act = n.attr_s("activation", "none")?;
    if !matches!(act.as_str(), "none" | "silu" | "swish") {
        return Err(n.error(ErrorKind::BadAttribute, format!("activation '{act}'")));
    }
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(x), Some(w)) = (input(0), input(1)) else {
        return Err(n.error(ErrorKind::BadAttribute, "input and weight are required"));
    };
    let (xs, ws) = (g.values[x].shape.clone(), g.values[w].shape.clone());
    if xs.len() != 3 || ws.len() != 3 || ws[0] != xs[1] || ws[1] != 1 || ws[2] == 0 {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!("input {xs:?} and weight {ws:?} (expected [B, C, L] and [C, 1, k])"),
        ));
    }
    let (b, ch, len, k) = (xs[0], xs[1], xs[2], ws[2]);
    let dtype = g.values[x].dtype;
    let (bias, past) = (input(2), input(3));
    if let Some(p) = past
        && g.values[p].shape != [b, ch, k - 1]
    {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!(
                "past_state {:?} (expected {:?})",
                g.values[p].shape,
                [b, ch, k - 1]
            ),
        ));
    }
    let outs: Vec<Option<usize>> = n.outputs.clone();
    let (ins, _, mut e) = begin(g, ni, 2)?;
    let padded = if k == 1 {
        ins[0]
    } else {
        let state = match past {
            Some(p) => p,
            None => {
                let t = crate::tensor::HostTensor::try_from_f64s(
                    "CausalConvWithState zero state",
                    dtype,
                    vec![b, ch, k - 1],
                    std::iter::repeat(0.0),
                )
                .map_err(|err| err.at_node(&n.name, &n.op))?;
                e.konst("zero_state", t)
            }
        };
        e.node("Concat", &[state, ins[0]], vec![a_int("axis", 2)], None)
    };
    let mut conv_in = vec![padded, ins[1]];
    if let Some(bv) = bias {
        conv_in.push(bv);
    }
    let conv_attrs = vec![
        a_int("group", ch as i64),
        a_ints("kernel_shape", &[k as i64]),
    ];
    let silu = act != "none";
    let y = outs.first().copied().flatten();
    let conv = e.node("Conv", &conv_in, conv_attrs, if silu { None } else { y });
    if silu {
        let sg = e.node("Sigmoid", &[conv], vec![], None);
        e.node("Mul", &[conv, sg], vec![], y);
    }
    if let Some(Some(st)) = outs.get(1).copied() {
        let total = (len + k - 1) as i64;
        let starts = e.ints("starts", &[total - (k as i64 - 1)]);
        let ends = e.ints("ends", &[total]);
        let axes = e.ints("axes", &[2]);
        e.node("Slice", &[padded, starts, ends, axes], vec![], Some(st));
    }
    finish(e, ni);
    Ok(())
}

/// Upsample (deprecated) as the Resize of its opset-10 form, which it equals: scales (the
/// input from opset 9, the attribute before), `asymmetric` coordinates, floor rounding.
fn expand_upsample(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let mode = n.attr_s("mode", "nearest")?;
    if !matches!(mode.as_str(), "nearest" | "linear" | "bilinear") {
        return Err(n.error(ErrorKind::BadAttribute, format!("mode '{mode}'")));
    }
    let scales_attr = n.attr_floats("scales")?;
    let opset = g.opset;
    let (ins, out, mut e) = begin(g, ni, 1)?;
    let scales = match (n.inputs.get(1).copied().flatten(), scales_attr) {
        (Some(s), _) => s,
        (None, Some(v)) => e.konst("scales", crate::tensor::HostTensor::f32(vec![v.len()], v)),
        (None, None) => return Err(n.error(ErrorKind::BadAttribute, "no scales")),
    };
    let m = super::attention::a_s(
        "mode",
        if mode == "nearest" {
            "nearest"
        } else {
            "linear"
        },
    );
    if opset >= 11 {
        // The same Resize spelled for opset 11+.
        let roi = e.konst("roi", crate::tensor::HostTensor::f32(vec![0], vec![]));
        let attrs = vec![
            m,
            super::attention::a_s("coordinate_transformation_mode", "asymmetric"),
            super::attention::a_s("nearest_mode", "floor"),
        ];
        e.node("Resize", &[ins[0], roi, scales], attrs, Some(out));
    } else {
        e.node("Resize", &[ins[0], scales], vec![m], Some(out));
    }
    finish(e, ni);
    Ok(())
}

/// AffineGrid: the base grid of the (compile-time) size — per position `(x, y[, z], 1)`,
/// each coordinate `−1 + (2i + 1)/L`, or `−1 + 2i/(L − 1)` with align_corners — as a
/// constant `[S, k + 1]`, times θᵀ: `MatMul(base, Transpose(θ))`, reshaped to
/// `[N, dims…, k]`.
fn expand_affine_grid(g: &mut Graph, ni: usize) -> Result<()> {
    use super::attention::a_ints;
    let n = g.nodes[ni].clone();
    let align = n.attr_i("align_corners", 0)? != 0;
    let (ins, out, mut e) = begin(g, ni, 2)?;
    let (theta, size) = (ins[0], ins[1]);
    let Some(sz) = e.g.values[size].konst.as_deref().map(|t| t.to_i64s()) else {
        return Err(n
            .error(
                ErrorKind::UnsupportedOp,
                "size must be known at compile time",
            )
            .needing(crate::graph::input_deps(e.g, size)));
    };
    let ts = e.g.values[theta].shape.clone();
    let k = sz.len().saturating_sub(2);
    if !(k == 2 || k == 3) || ts.len() != 3 || ts[1] != k || ts[2] != k + 1 {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!("theta {ts:?} with size {sz:?} (2-D: [N, 2, 3], 3-D: [N, 3, 4])"),
        ));
    }
    let dims: Vec<usize> = sz[2..]
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| n.error(ErrorKind::BadAttribute, format!("size {sz:?}")))?;
    let s: usize = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| n.error(ErrorKind::TooLarge, format!("size {sz:?}")))?;
    let coord = |i: usize, l: usize| -> f64 {
        if align {
            if l == 1 {
                -1.0
            } else {
                -1.0 + 2.0 * i as f64 / (l - 1) as f64
            }
        } else {
            -1.0 + (2 * i + 1) as f64 / l as f64
        }
    };
    let dt = e.g.values[theta].dtype;
    let base = crate::tensor::HostTensor::try_from_f64s(
        "AffineGrid base grid",
        dt,
        vec![s, k + 1],
        (0..s * (k + 1)).map(|f| {
            let (pos, comp) = (f / (k + 1), f % (k + 1));
            if comp == k {
                return 1.0;
            }
            // Component 0 is the last dimension (x), 1 the one before (y), …
            let d = k - 1 - comp;
            let stride: usize = dims[d + 1..].iter().product();
            coord((pos / stride) % dims[d], dims[d])
        }),
    )
    .map_err(|err| err.at_node(&n.name, &n.op))?;
    let bv = e.konst("base", base);
    let tt = e.node(
        "Transpose",
        &[theta],
        vec![a_ints("perm", &[0, 2, 1])],
        None,
    );
    let mm = e.node("MatMul", &[bv, tt], vec![], None);
    let mut shape = vec![ts[0] as i64];
    shape.extend(dims.iter().map(|&d| d as i64));
    shape.push(k as i64);
    let sh = e.ints("shape", &shape);
    e.node("Reshape", &[mm, sh], vec![], Some(out));
    finish(e, ni);
    Ok(())
}

/// MeanVarianceNormalization as ONNX defines it: `(x − E[x]) / (√(E[x²] − E[x]²) + 1e-9)`
/// over `axes` (default N, H, W).
fn expand_mvn(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let axes = n.attr_ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let opset = g.opset;
    let (ins, out, mut e) = begin(g, ni, 1)?;
    let x = ins[0];
    let dtype = e.g.values[x].dtype;
    let mean = |e: &mut Expansion<'_>, v: usize| {
        let keep = a_int("keepdims", 1);
        if opset >= 18 {
            let a = e.ints("axes", &axes);
            e.node("ReduceMean", &[v, a], vec![keep], None)
        } else {
            let attr = super::attention::a_ints("axes", &axes);
            e.node("ReduceMean", &[v], vec![keep, attr], None)
        }
    };
    let two = e.scalar("two", dtype, 2.0);
    let eps = e.scalar("eps", dtype, 1e-9);
    let m = mean(&mut e, x);
    let m2 = e.node("Pow", &[m, two], vec![], None);
    let x2 = e.node("Pow", &[x, two], vec![], None);
    let ex2 = mean(&mut e, x2);
    let var = e.node("Sub", &[ex2, m2], vec![], None);
    let std = e.node("Sqrt", &[var], vec![], None);
    let d = e.node("Sub", &[x, m], vec![], None);
    let se = e.node("Add", &[std, eps], vec![], None);
    e.node("Div", &[d, se], vec![], Some(out));
    finish(e, ni);
    Ok(())
}

/// Starts the expansion of node `ni`: its inputs (required), its first output, the builder.
fn begin(g: &mut Graph, ni: usize, inputs: usize) -> Result<(Vec<usize>, usize, Expansion<'_>)> {
    let n = &g.nodes[ni];
    let ins: Option<Vec<usize>> = (0..inputs)
        .map(|k| n.inputs.get(k).copied().flatten())
        .collect();
    let (Some(ins), Some(Some(out))) = (ins, n.outputs.first().copied()) else {
        return Err(n.error(
            ErrorKind::BadAttribute,
            format!("{} needs {inputs} input(s) and its output", n.op),
        ));
    };
    let name = n.name.clone();
    Ok((
        ins,
        out,
        Expansion {
            name,
            g,
            nodes: Vec::new(),
        },
    ))
}

fn finish(e: Expansion<'_>, ni: usize) {
    let Expansion { g, nodes, .. } = e;
    g_splice(g, ni, nodes);
}

fn expand_xor(g: &mut Graph, ni: usize) -> Result<()> {
    let (ins, out, mut e) = begin(g, ni, 2)?;
    let (a, b) = (ins[0], ins[1]);
    let or = e.node("Or", &[a, b], vec![], None);
    let and = e.node("And", &[a, b], vec![], None);
    let nand = e.node("Not", &[and], vec![], None);
    e.node("And", &[or, nand], vec![], Some(out));
    finish(e, ni);
    Ok(())
}

fn expand_lp_norm(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let p = n.attr_i("p", 2)?;
    let axis = n.attr_i("axis", -1)?;
    if !(p == 1 || p == 2) {
        return Err(n.error(ErrorKind::BadAttribute, format!("p = {p} (1 or 2)")));
    }
    let opset = g.opset;
    let (ins, out, mut e) = begin(g, ni, 1)?;
    let x = ins[0];
    let dtype = e.g.values[x].dtype;
    let (op, keep) = (
        if p == 2 { "ReduceL2" } else { "ReduceSum" },
        a_int("keepdims", 1),
    );
    // ReduceSum takes its axes as an input from opset 13, ReduceL2 from opset 18.
    let axes_as_input = if p == 2 { opset >= 18 } else { opset >= 13 };
    let norm = if axes_as_input {
        let axes = e.ints("axes", &[axis]);
        e.node(op, &[x, axes], vec![keep], None)
    } else {
        let attr = super::attention::a_ints("axes", &[axis]);
        e.node(op, &[x], vec![keep, attr], None)
    };
    let zero = e.scalar("zero", dtype, 0.0);
    let is_zero = e.node("Equal", &[norm, zero], vec![], None);
    let q = e.node("Div", &[x, norm], vec![], None);
    e.node("Where", &[is_zero, zero, q], vec![], Some(out));
    finish(e, ni);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, fold1, infer_one, op_types, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    #[test]
    fn xor_is_or_and_not_and() {
        let ins = vec![var(DType::Bool, &[3]), var(DType::Bool, &[3])];
        let g = infer_one("Xor", 7, ins, vec![], 1).unwrap();
        assert_eq!(op_types(&g), ["Or", "And", "Not", "And"]);
        let t = HostTensor::ints(DType::Bool, vec![4], vec![0, 0, 1, 1]);
        let u = HostTensor::ints(DType::Bool, vec![4], vec![0, 1, 0, 1]);
        let x = fold1("Xor", 7, vec![t, u], vec![]);
        assert_eq!(x, HostTensor::ints(DType::Bool, vec![4], vec![0, 1, 1, 0]));
    }

    #[test]
    fn lp_normalization_divides_by_the_norm_and_zero_stays_zero() {
        let x = HostTensor::f32(vec![2, 2], vec![3., 1., 0., 0.]);
        let l1 = fold1(
            "LpNormalization",
            13,
            vec![x],
            vec![a_i("p", 1), a_i("axis", 1)],
        );
        assert_eq!(l1, HostTensor::f32(vec![2, 2], vec![0.75, 0.25, 0., 0.]));
        let e = out_types(
            "LpNormalization",
            13,
            vec![var(DType::F32, &[2])],
            vec![a_i("p", 3)],
            1,
        );
        assert!(e.unwrap_err().message.contains("p = 3 (1 or 2)"));
    }
}
