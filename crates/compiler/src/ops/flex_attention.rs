//! `FlexAttention` (domain `ai.onnx.preview`, opset 1): scaled dot-product attention over
//! rank-4 inputs with optional modifier subgraphs, decomposed during inference into the
//! operators it is defined with, the modifiers inlined the way `If` branches are
//! ([`crate::graph::inline_body`]):
//!
//! ```text
//! scores = (Q·√s) · (K·√s)ᵀ            in Q's type (K repeated over query-head groups)
//! scores = Cast(scores, P)              P: softmax_precision, else f32 (f64 for double)
//! scores = score_mod(scores)            if given
//! probs  = Softmax(scores, axis = -1)
//! probs  = prob_mod(probs)              if given
//! Y      = Cast(probs · Cast(V, P), V's type)
//! ```
//!
//! as the ONNX reference computes it (`onnx/reference/ops/aionnx_preview/
//! op_flex_attention.py`): `√s` is rounded to f32 and then to Q's type; grouped-query heads
//! repeat each K/V head for a contiguous group of query heads (`np.repeat` on axis 1).
//! Half and double tensors then go through f32 on the device like every other operator
//! (`crate::widen`).

use super::Registry;
use super::attention::{Expansion, a_int, a_ints, g_splice, never_inferred};
use crate::error::{ErrorKind, Result};
use crate::graph::{Graph, ValueId};
use crate::tensor::{dtype_from_onnx, dtype_to_onnx, onnx_type_name};
use nrt_hal::DType;
use std::collections::HashMap;

pub(super) fn register(r: &mut Registry) {
    r.op("FlexAttention", 1, never_inferred)
        .expands(expand_flex_attention)
        .note("domain ai.onnx.preview; decomposed into MatMul/Softmax/…, score_mod and prob_mod inlined");
}

/// Replaces `FlexAttention` node `ni` by its decomposition (inferred next).
fn expand_flex_attention(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |msg: String| n.error(ErrorKind::BadAttribute, msg);
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (input(0), input(1), input(2)) else {
        return Err(bad("Q, K and V are required".into()));
    };
    let Some(y) = n.outputs.first().copied().flatten() else {
        return Err(bad("the output Y is required".into()));
    };
    let (qs, ks, vs) = (
        g.values[q].shape.clone(),
        g.values[k].shape.clone(),
        g.values[v].shape.clone(),
    );
    let mismatch = |msg: String| n.error(ErrorKind::ShapeMismatch, msg);
    if qs.len() != 4 || ks.len() != 4 || vs.len() != 4 {
        return Err(mismatch(format!(
            "Q, K and V must be 4-D (shapes {qs:?}, {ks:?}, {vs:?})"
        )));
    }
    let (b, hq, e) = (qs[0], qs[1], qs[3]);
    let (hkv, s) = (ks[1], ks[2]);
    if ks[0] != b || vs[0] != b || vs[1] != hkv || vs[2] != s || ks[3] != e {
        return Err(mismatch(format!(
            "Q {qs:?}, K {ks:?} and V {vs:?} disagree (batch, heads, sequence or head size)"
        )));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(mismatch(format!(
            "{hq} query heads are not a multiple of {hkv} key/value heads"
        )));
    }
    let dtype = g.values[q].dtype;
    let vdtype = g.values[v].dtype;
    if !matches!(dtype, DType::F32 | DType::F16 | DType::Bf16 | DType::F64) {
        return Err(n.error(
            ErrorKind::UnsupportedDType,
            format!("Q is {dtype}; FlexAttention takes float tensors"),
        ));
    }
    let compute = if n.has_attr("softmax_precision") {
        let p = n.attr_i("softmax_precision", 0)? as i32;
        match dtype_from_onnx(p) {
            Some(d @ (DType::F32 | DType::F16 | DType::Bf16 | DType::F64)) => d,
            _ => {
                return Err(bad(format!(
                    "softmax_precision {} (float, float16, bfloat16 or double)",
                    onnx_type_name(p)
                )));
            }
        }
    } else if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let scale = if n.has_attr("scale") {
        n.attr_finite_f("scale", 0.0)?
    } else {
        (1.0 / (e as f64).sqrt()) as f32
    };
    if scale < 0.0 {
        return Err(bad(format!(
            "scale {scale}: it is applied as √scale to Q and Kᵀ, so it must not be negative"
        )));
    }
    // The reference: sqrt(float32(scale)), then Q's type.
    let root = scale.sqrt() as f64;
    // The modifiers, decoded before the graph is borrowed by the expansion; the outer
    // values they read are the node's inputs after Q, K, V.
    let mut mods = HashMap::new();
    for a in n.attrs.iter().filter(|a| a.g.is_some()) {
        if !matches!(a.name.as_str(), "score_mod" | "prob_mod") {
            return Err(n.error(
                ErrorKind::UnsupportedOp,
                format!("subgraph attribute '{}'", a.name),
            ));
        }
        let gp = crate::graph::subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
        if gp.input.len() != 1 || gp.output.len() != 1 {
            return Err(bad(format!(
                "{} has {} inputs and {} outputs (one of each expected)",
                a.name,
                gp.input.len(),
                gp.output.len()
            )));
        }
        mods.insert(a.name.clone(), gp);
    }
    let outer: HashMap<String, ValueId> = crate::graph::captured(&n.attrs)?
        .into_iter()
        .zip(n.inputs.iter().skip(3))
        .filter_map(|(name, id)| id.map(|id| (name, id)))
        .collect();

    let mut x = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    // Grouped-query attention: [B, Hkv, S, D] → [B, Hkv, 1, S, D] → expand → [B, Hq, S, D]
    // (each K/V head serves a contiguous group of query heads).
    let repeat = |x: &mut Expansion, t: ValueId, d: usize| {
        if hq == hkv {
            return t;
        }
        let axes = x.ints("axes", &[2]);
        let u = x.node("Unsqueeze", &[t, axes], vec![], None);
        let to = x.ints(
            "expand",
            &[b as i64, hkv as i64, (hq / hkv) as i64, s as i64, d as i64],
        );
        let t5 = x.node("Expand", &[u, to], vec![], None);
        let shape = x.ints("shape", &[b as i64, hq as i64, s as i64, d as i64]);
        x.node("Reshape", &[t5, shape], vec![], None)
    };
    let kr = repeat(&mut x, k, e);
    let vr = repeat(&mut x, v, vs[3]);
    let root = x.scalar("sqrt_scale", dtype, root);
    let qs_ = x.node("Mul", &[q, root], vec![], None);
    let ks_ = x.node("Mul", &[kr, root], vec![], None);
    let kt = x.node(
        "Transpose",
        &[ks_],
        vec![a_ints("perm", &[0, 1, 3, 2])],
        None,
    );
    let mut scores = x.node("MatMul", &[qs_, kt], vec![], None);
    let cast = |x: &mut Expansion, t: ValueId, from: DType, to: DType| {
        if from == to {
            t
        } else {
            x.node(
                "Cast",
                &[t],
                vec![a_int("to", dtype_to_onnx(to) as i64)],
                None,
            )
        }
    };
    scores = cast(&mut x, scores, dtype, compute);
    let mut apply = |x: &mut Expansion, which: &str, t: ValueId| -> Result<ValueId> {
        let Some(gp) = mods.remove(which) else {
            return Ok(t);
        };
        let mut scope = outer.clone();
        scope.insert(gp.input[0].name.clone(), t);
        let prefix = format!("{}/{which}/", x.name);
        let (nodes, outs) = crate::graph::inline_body(x.g, &gp, &prefix, scope, &[])
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        x.nodes.extend(nodes);
        Ok(outs[0])
    };
    scores = apply(&mut x, "score_mod", scores)?;
    let mut probs = x.node("Softmax", &[scores], vec![a_int("axis", -1)], None);
    probs = apply(&mut x, "prob_mod", probs)?;
    let vc = cast(&mut x, vr, vdtype, compute);
    if compute == vdtype {
        x.node("MatMul", &[probs, vc], vec![], Some(y));
    } else {
        let o = x.node("MatMul", &[probs, vc], vec![], None);
        x.node(
            "Cast",
            &[o],
            vec![a_int("to", dtype_to_onnx(vdtype) as i64)],
            Some(y),
        );
    }
    let nodes = std::mem::take(&mut x.nodes);
    g_splice(x.g, ni, nodes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_f, infer_one, op_types, out_types, var};
    use nrt_hal::DType;

    fn qkv(hq: usize, hkv: usize) -> Vec<Option<crate::eval::testing::Arg>> {
        let f = |s: &[usize]| var(DType::F32, s);
        vec![f(&[1, hq, 3, 8]), f(&[1, hkv, 5, 8]), f(&[1, hkv, 5, 6])]
    }

    #[test]
    fn grouped_query_heads_decompose_into_matmuls_and_a_softmax() {
        let g = infer_one("FlexAttention", 23, qkv(4, 2), vec![], 1).unwrap();
        let ops = op_types(&g);
        let count = |op: &str| ops.iter().filter(|&&o| o == op).count();
        assert_eq!(
            (count("MatMul"), count("Softmax"), count("FlexAttention")),
            (2, 1, 0),
            "{ops:?}"
        );
        let y = &g.values[g.outputs[0]];
        assert_eq!((y.dtype, y.shape.clone()), (DType::F32, vec![1, 4, 3, 6]));
    }

    #[test]
    fn heads_and_scale_are_checked() {
        let e = out_types("FlexAttention", 23, qkv(3, 2), vec![], 1).unwrap_err();
        assert!(
            e.message.contains("3 query heads are not a multiple of 2"),
            "{e}"
        );
        let e = out_types("FlexAttention", 23, qkv(2, 2), vec![a_f("scale", -1.0)], 1).unwrap_err();
        assert!(e.message.contains("scale -1"), "{e}");
    }
}
