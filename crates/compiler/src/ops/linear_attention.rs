//! `LinearAttention` (opset 27), decomposed as the ONNX reference computes it: the
//! recurrence over the (compile-time) sequence unrolled, per step — the state `[B, H, dk, dv]`
//! decays by `exp(g_t)` (gated rules), the value is corrected by what the state already
//! holds for the key, `β_t·(v_t − k_tᵀS)` (delta rules), the outer product `k_t v_tᵀ` is
//! added (MatMul), and the output is `scale · q_t S` with query heads grouped onto their
//! key/value head (MatMul over `[B, H_kv, G, dk]`). The steps' outputs are concatenated.

use super::Registry;
use super::attention::{Expansion, a_int, a_ints, g_splice, never_inferred};
use crate::error::{ErrorKind, Result};
use crate::graph::{Graph, ValueId};
use crate::tensor::HostTensor;

/// Longest sequence unrolled (each step is about fifteen nodes).
const MAX_STEPS: usize = 4096;

pub(super) fn register(r: &mut Registry) {
    r.op("LinearAttention", 27, never_inferred)
        .expands(expand_linear_attention)
        .note("decomposed: the recurrence unrolled over the sequence (at most 4096 steps)");
}

fn expand_linear_attention(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |m: String| n.error(ErrorKind::BadAttribute, m);
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (input(0), input(1), input(2)) else {
        return Err(bad("query, key and value are required".into()));
    };
    let (past, decay, beta) = (input(3), input(4), input(5));
    let rule = n.attr_s("update_rule", "gated_delta")?;
    let (gating, delta) = match rule.as_str() {
        "linear" => (false, false),
        "gated" => (true, false),
        "delta" => (false, true),
        "gated_delta" => (true, true),
        r => return Err(bad(format!("update_rule '{r}'"))),
    };
    if gating != decay.is_some() || delta != beta.is_some() {
        return Err(bad(format!(
            "update_rule '{rule}' takes {} decay and {} beta",
            if gating { "a" } else { "no" },
            if delta { "a" } else { "no" }
        )));
    }
    let hq = n.attr_i("q_num_heads", 0)?;
    let hkv = n.attr_i("kv_num_heads", 0)?;
    if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
        return Err(bad(format!(
            "q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}"
        )));
    }
    let (hq, hkv) = (hq as usize, hkv as usize);
    let (qs, ks, vs) = (
        g.values[q].shape.clone(),
        g.values[k].shape.clone(),
        g.values[v].shape.clone(),
    );
    let shape_err = |m: String| n.error(ErrorKind::ShapeMismatch, m);
    if qs.len() != 3 || ks.len() != 3 || vs.len() != 3 {
        return Err(shape_err(format!(
            "query {qs:?}, key {ks:?}, value {vs:?} must be [B, T, H·D]"
        )));
    }
    let (b, t) = (qs[0], qs[1]);
    if ks[..2] != qs[..2] || vs[..2] != qs[..2] || qs[2] % hq != 0 || vs[2] % hkv != 0 {
        return Err(shape_err(format!(
            "query {qs:?}, key {ks:?}, value {vs:?} for {hq} / {hkv} heads"
        )));
    }
    let (dk, dv) = (qs[2] / hq, vs[2] / hkv);
    if ks[2] != hkv * dk {
        return Err(shape_err(format!("key {ks:?}: {hkv} heads of {dk}")));
    }
    if t == 0 || t > MAX_STEPS {
        return Err(n.error(
            ErrorKind::UnsupportedOp,
            format!("a sequence of {t} steps (1 to {MAX_STEPS} are unrolled)"),
        ));
    }
    let dlast = decay.map(|d| g.values[d].shape.clone());
    if let Some(ds) = &dlast
        && (ds.len() != 3 || ds[..2] != qs[..2] || !(ds[2] == hkv || ds[2] == hkv * dk))
    {
        return Err(shape_err(format!("decay {ds:?}")));
    }
    let blast = beta.map(|x| g.values[x].shape.clone());
    if let Some(bs) = &blast
        && (bs.len() != 3 || bs[..2] != qs[..2] || !(bs[2] == hkv || bs[2] == 1))
    {
        return Err(shape_err(format!("beta {bs:?}")));
    }
    if let Some(p) = past
        && g.values[p].shape != [b, hkv, dk, dv]
    {
        return Err(shape_err(format!(
            "past_state {:?} (expected {:?})",
            g.values[p].shape,
            [b, hkv, dk, dv]
        )));
    }
    let scale = n.attr_finite_f("scale", 0.0)?;
    let scale = if scale == 0.0 {
        1.0 / (dk as f64).sqrt()
    } else {
        scale as f64
    };
    let dtype = g.values[q].dtype;
    let outs = n.outputs.clone();
    let group = hq / hkv;
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let ints = |e: &mut Expansion<'_>, what: &str, v: &[usize]| {
        let v: Vec<i64> = v.iter().map(|&x| x as i64).collect();
        e.ints(what, &v)
    };
    // [B, T, H·D] → [B, H, T, D].
    let heads = |e: &mut Expansion<'_>, x: ValueId, h: usize, d: usize| {
        let s = ints(e, "heads", &[b, t, h, d]);
        let r = e.node("Reshape", &[x, s], vec![], None);
        e.node("Transpose", &[r], vec![a_ints("perm", &[0, 2, 1, 3])], None)
    };
    let q4 = heads(&mut e, q, hq, dk);
    let k4 = heads(&mut e, k, hkv, dk);
    let v4 = heads(&mut e, v, hkv, dv);
    let d4 = match (decay, &dlast) {
        (Some(d), Some(ds)) => Some(heads(&mut e, d, hkv, ds[2] / hkv)),
        _ => None,
    };
    let b4 = match (beta, &blast) {
        (Some(x), Some(bs)) => Some(heads(&mut e, x, bs[2], 1)),
        _ => None,
    };
    let step = |e: &mut Expansion<'_>, x: ValueId, i: usize| {
        let (s0, s1, ax) = (
            ints(e, "start", &[i]),
            ints(e, "end", &[i + 1]),
            ints(e, "axis", &[2]),
        );
        e.node("Slice", &[x, s0, s1, ax], vec![], None)
    };
    let mut state = match past {
        Some(p) => p,
        None => {
            let z = HostTensor::try_from_f64s(
                "LinearAttention zero state",
                dtype,
                vec![b, hkv, dk, dv],
                std::iter::repeat(0.0),
            )
            .map_err(|err| err.at_node(&n.name, &n.op))?;
            e.konst("zero_state", z)
        }
    };
    let scale_v = e.scalar("scale", dtype, scale);
    let mut step_outs = Vec::new();
    for i in 0..t {
        let qt = step(&mut e, q4, i); // [B, Hq, 1, dk]
        let kt = step(&mut e, k4, i); // [B, Hkv, 1, dk]
        let mut vt = step(&mut e, v4, i); // [B, Hkv, 1, dv]
        if let (Some(d4), Some(ds)) = (d4, &dlast) {
            let gt = step(&mut e, d4, i); // [B, Hkv, 1, 1 or dk]
            let s = ints(&mut e, "decay_col", &[b, hkv, ds[2] / hkv, 1]);
            let gc = e.node("Reshape", &[gt, s], vec![], None);
            let ex = e.node("Exp", &[gc], vec![], None);
            state = e.node("Mul", &[state, ex], vec![], None);
        }
        if let Some(b4) = b4 {
            let retrieved = e.node("MatMul", &[kt, state], vec![], None); // [B, Hkv, 1, dv]
            let diff = e.node("Sub", &[vt, retrieved], vec![], None);
            let bt = step(&mut e, b4, i); // [B, 1 or Hkv, 1, 1]
            vt = e.node("Mul", &[bt, diff], vec![], None);
        }
        let s = ints(&mut e, "key_col", &[b, hkv, dk, 1]);
        let kc = e.node("Reshape", &[kt, s], vec![], None);
        let outer = e.node("MatMul", &[kc, vt], vec![], None); // [B, Hkv, dk, dv]
        state = e.node("Add", &[state, outer], vec![], None);
        let s = ints(&mut e, "query_groups", &[b, hkv, group, dk]);
        let qg = e.node("Reshape", &[qt, s], vec![], None);
        let read = e.node("MatMul", &[qg, state], vec![], None); // [B, Hkv, G, dv]
        let s = ints(&mut e, "step_out", &[b, hq, 1, dv]);
        let o = e.node("Reshape", &[read, s], vec![], None);
        step_outs.push(o);
    }
    let all = if step_outs.len() == 1 {
        step_outs[0]
    } else {
        e.node("Concat", &step_outs, vec![a_int("axis", 2)], None)
    };
    let scaled = e.node("Mul", &[all, scale_v], vec![], None); // [B, Hq, T, dv]
    let tr = e.node(
        "Transpose",
        &[scaled],
        vec![a_ints("perm", &[0, 2, 1, 3])],
        None,
    );
    let s = ints(&mut e, "output", &[b, t, hq * dv]);
    let y = outs.first().copied().flatten();
    e.node("Reshape", &[tr, s], vec![], y);
    if let Some(Some(ps)) = outs.get(1).copied() {
        e.node("Identity", &[state], vec![], Some(ps));
    }
    let Expansion { g, nodes, .. } = e;
    g_splice(g, ni, nodes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, a_s, infer_one, op_types, out_types, var};
    use nrt_hal::DType;

    /// Query and key [1, 2, 8], value [1, 2, 6] (two steps).
    fn qkv() -> Vec<Option<crate::eval::testing::Arg>> {
        let f = |s: &[usize]| var(DType::F32, s);
        vec![f(&[1, 2, 8]), f(&[1, 2, 8]), f(&[1, 2, 6])]
    }

    fn heads(rule: &str, hq: i64, hkv: i64) -> Vec<crate::onnx::AttributeProto> {
        vec![
            a_s("update_rule", rule),
            a_i("q_num_heads", hq),
            a_i("kv_num_heads", hkv),
        ]
    }

    #[test]
    fn the_linear_rule_unrolls_two_matmuls_per_step() {
        let g = infer_one("LinearAttention", 27, qkv(), heads("linear", 2, 2), 2).unwrap();
        let ops = op_types(&g);
        let count = |op: &str| ops.iter().filter(|&&o| o == op).count();
        assert_eq!((count("MatMul"), count("Concat")), (4, 1), "{ops:?}");
        let shapes: Vec<_> = g
            .outputs
            .iter()
            .map(|&v| g.values[v].shape.clone())
            .collect();
        assert_eq!(shapes, vec![vec![1, 2, 6], vec![1, 2, 4, 3]]);
    }

    #[test]
    fn rules_need_their_inputs_and_heads_must_group() {
        let e = out_types("LinearAttention", 27, qkv(), heads("gated", 2, 2), 1).unwrap_err();
        assert!(
            e.message
                .contains("update_rule 'gated' takes a decay and no beta"),
            "{e}"
        );
        let e = out_types("LinearAttention", 27, qkv(), heads("linear", 3, 2), 1).unwrap_err();
        assert!(
            e.message
                .contains("q_num_heads 3 must be a positive multiple of kv_num_heads 2"),
            "{e}"
        );
    }
}
