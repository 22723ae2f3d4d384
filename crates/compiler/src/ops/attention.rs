//! The transformer blocks ONNX defines as functions of other operators, decomposed during
//! inference: `Attention` and `RotaryEmbedding` (opset 23).
//!
//! `Attention` (opset 23/24): decomposed, during inference, into the operators ONNX defines
//! it with — Reshape/Transpose of 3-D inputs into heads, the KV cache's Concat, grouped-query
//! head repetition, scaled `Q·Kᵀ`, softcap, the causal/mask/padding bias, Softmax and the
//! product with `V` — so every later stage (widening of half types, fusion, lowering,
//! scheduling) sees ordinary nodes. The bias that depends only on shapes (the causal
//! triangle) is a compile-time constant; masks and `nonpad_kv_seqlen` given at run time are
//! turned into biases on the device.
//!
//! Semantics follow the ONNX reference (`onnx/reference/ops/op_attention.py`): the scale
//! (default `1/√head_size`) is applied as `√scale` to both `Q` and `Kᵀ`; a boolean mask is
//! "attend where true"; a mask shorter than the total sequence is padded with "do not
//! attend"; the causal triangle is aligned to the top left of the new tokens (a query at
//! position `i` sees the past and the new keys up to `i`); softcap comes before the bias.

use super::Registry;
use crate::error::{ErrorKind, Result};
use crate::graph::{Graph, Node, Value, ValueId};
use crate::onnx::{AttributeProto, attribute_type as at};
use crate::params::Out;
use crate::tensor::HostTensor;
use nrt_hal::DType;
use std::rc::Rc;

pub(super) fn register(r: &mut Registry) {
    r.op("Attention", 23, never_inferred)
        .expands(expand_attention)
        .note("decomposed into MatMul/Softmax/…; softmax_precision computes in f32");
    r.op("RotaryEmbedding", 23, never_inferred)
        .expands(expand_rotary)
        .note("decomposed into Gather/Slice/Mul/Concat");
}

/// The operators of this file are replaced before inference reaches them.
pub(super) fn never_inferred(c: &crate::params::Ctx) -> Result<Vec<Out>> {
    Err(c.e(
        ErrorKind::UnsupportedOp,
        format!("{} was not decomposed", c.n.op),
    ))
}

pub(super) fn a_int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        r#type: at::INT,
        i,
        ..Default::default()
    }
}

pub(super) fn a_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        r#type: at::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

pub(super) fn a_ints(name: &str, ints: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.to_owned(),
        r#type: at::INTS,
        ints: ints.to_vec(),
        ..Default::default()
    }
}

/// Builds the nodes that replace one node, naming every new value after it.
pub(super) struct Expansion<'g> {
    pub(super) g: &'g mut Graph,
    pub(super) name: String,
    pub(super) nodes: Vec<Node>,
}

impl Expansion<'_> {
    pub(super) fn value(&mut self, what: &str) -> ValueId {
        let name = format!("{}__{what}_{}", self.name, self.g.values.len());
        self.g.values.push(Value {
            name,
            dtype: DType::F32, // set by inference
            shape: Vec::new(),
            konst: None,
        });
        self.g.values.len() - 1
    }

    pub(super) fn konst(&mut self, what: &str, t: HostTensor) -> ValueId {
        let v = self.value(what);
        self.g.values[v].dtype = t.dtype;
        self.g.values[v].shape = t.shape.clone();
        self.g.values[v].konst = Some(Rc::new(t));
        v
    }

    pub(super) fn ints(&mut self, what: &str, v: &[i64]) -> ValueId {
        self.konst(
            what,
            HostTensor::ints(DType::I64, vec![v.len()], v.to_vec()),
        )
    }

    pub(super) fn scalar(&mut self, what: &str, dtype: DType, x: f64) -> ValueId {
        self.konst(
            what,
            HostTensor::from_f64s(dtype, vec![], std::iter::once(x)),
        )
    }

    /// Appends `op(inputs)` writing `output` (a new value if `None`); returns the output.
    pub(super) fn node(
        &mut self,
        op: &str,
        inputs: &[ValueId],
        attrs: Vec<AttributeProto>,
        output: Option<ValueId>,
    ) -> ValueId {
        let o = output.unwrap_or_else(|| self.value(&op.to_lowercase()));
        let k = self.nodes.len();
        self.nodes.push(Node {
            name: format!("{}__{}{k}", self.name, op.to_lowercase()),
            op: op.to_owned(),
            inputs: inputs.iter().map(|&v| Some(v)).collect(),
            outputs: vec![Some(o)],
            attrs,
            guard: None,
        });
        o
    }
}

/// Replaces `Attention` node `ni` by its decomposition (the nodes are inferred next).
fn expand_attention(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |msg: String| n.error(ErrorKind::BadAttribute, msg);
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let output = |k: usize| n.outputs.get(k).copied().flatten();
    let (Some(q), Some(k), Some(v)) = (input(0), input(1), input(2)) else {
        return Err(bad("Q, K and V are required".into()));
    };
    let (mask, past_k, past_v, nonpad) = (input(3), input(4), input(5), input(6));
    if past_k.is_some() != past_v.is_some() {
        return Err(bad("past_key and past_value go together".into()));
    }
    let dtype = g.values[q].dtype;
    let (qs, ks, vs) = (
        g.values[q].shape.clone(),
        g.values[k].shape.clone(),
        g.values[v].shape.clone(),
    );
    let rank = qs.len();
    if !(rank == 3 || rank == 4) || ks.len() != rank || vs.len() != rank {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!("Q, K, V must all be 3-D or all 4-D (shapes {qs:?}, {ks:?}, {vs:?})"),
        ));
    }
    let softcap = n.attr_finite_f("softcap", 0.0)?;
    let mode = n.attr_i("qk_matmul_output_mode", 0)?;
    if !(0..=3).contains(&mode) {
        return Err(bad(format!("qk_matmul_output_mode {mode} (0..=3)")));
    }
    let is_causal = n.attr_i("is_causal", 0)? != 0;
    let batch = qs[0];
    let (hq, hkv) = if rank == 3 {
        let hq = n.attr_i("q_num_heads", 0)?;
        let hkv = n.attr_i("kv_num_heads", 0)?;
        if hq <= 0 || hkv <= 0 {
            return Err(bad(
                "3-D inputs need q_num_heads and kv_num_heads (> 0)".into()
            ));
        }
        (hq as usize, hkv as usize)
    } else {
        (qs[1], ks[1])
    };
    let div = |hidden: usize, heads: usize, what: &str| -> Result<usize> {
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(n.error(
                ErrorKind::ShapeMismatch,
                format!("{what} hidden size {hidden} is not a multiple of {heads} heads"),
            ));
        }
        Ok(hidden / heads)
    };
    let (sq, dq, skv) = if rank == 3 {
        (qs[1], div(qs[2], hq, "Q")?, ks[1])
    } else {
        (qs[2], qs[3], ks[2])
    };
    if hkv == 0 || hq % hkv != 0 {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!("{hq} query heads are not a multiple of {hkv} key/value heads"),
        ));
    }
    let past = past_k.map_or(0, |p| g.values[p].shape.get(2).copied().unwrap_or(0));
    let total = past + skv;
    let scale = n.attr_finite_f("scale", 0.0)?;
    if scale < 0.0 {
        return Err(bad(format!(
            "scale {scale}: it is applied as √scale to Q and Kᵀ (as the ONNX definition \
             does), so it must not be negative"
        )));
    }
    let scale = if n.has_attr("scale") {
        scale as f64
    } else {
        1.0 / (dq as f64).sqrt()
    };

    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let (batch_i, hq_i, hkv_i) = (batch as i64, hq as i64, hkv as i64);
    // 3-D: [B, S, H·D] → [B, H, S, D].
    let heads = |e: &mut Expansion, x: ValueId, h: i64, s: usize, hidden: usize| {
        let shape = e.ints("heads", &[batch_i, s as i64, h, hidden as i64 / h]);
        let r = e.node("Reshape", &[x, shape], vec![], None);
        e.node("Transpose", &[r], vec![a_ints("perm", &[0, 2, 1, 3])], None)
    };
    let (q4, k4, v4) = if rank == 3 {
        (
            heads(&mut e, q, hq_i, sq, qs[2]),
            heads(&mut e, k, hkv_i, skv, ks[2]),
            heads(&mut e, v, hkv_i, vs[1], vs[2]),
        )
    } else {
        (q, k, v)
    };
    // The KV cache: present = past ++ new, along the sequence.
    let cache =
        |e: &mut Expansion, past: Option<ValueId>, new: ValueId, out: Option<ValueId>| match past {
            Some(p) => e.node("Concat", &[p, new], vec![a_int("axis", 2)], out),
            None => match out {
                Some(o) => e.node("Identity", &[new], vec![], Some(o)),
                None => new,
            },
        };
    let kp = cache(&mut e, past_k, k4, output(1));
    let vp = cache(&mut e, past_v, v4, output(2));
    // Grouped-query attention: each KV head serves hq/hkv query heads, interleaved
    // ([h0, h0, h1, h1, …]): [B, Hkv, T, D] → [B, Hkv, 1, T, D] → expand → [B, Hq, T, D].
    let repeat = |e: &mut Expansion, x: ValueId, d: usize| {
        if hq == hkv {
            return x;
        }
        let axes = e.ints("axes", &[2]);
        let u = e.node("Unsqueeze", &[x, axes], vec![], None);
        let to = e.ints(
            "expand",
            &[batch_i, hkv_i, (hq / hkv) as i64, total as i64, d as i64],
        );
        let x5 = e.node("Expand", &[u, to], vec![], None);
        let shape = e.ints("shape", &[batch_i, hq_i, total as i64, d as i64]);
        e.node("Reshape", &[x5, shape], vec![], None)
    };
    let dk = e.g.values[k].shape.last().copied().unwrap_or(0);
    let dk = if rank == 3 { dk / hkv.max(1) } else { dk };
    let dv = e.g.values[v].shape.last().copied().unwrap_or(0);
    let dv = if rank == 3 { dv / hkv.max(1) } else { dv };
    let kr = repeat(&mut e, kp, dk);
    let vr = repeat(&mut e, vp, dv);
    // Scores: (Q·√s)·(Kᵀ·√s).
    let root = e.scalar("scale", dtype, scale.sqrt());
    let qs_ = e.node("Mul", &[q4, root], vec![], None);
    let kt = e.node(
        "Transpose",
        &[kr],
        vec![a_ints("perm", &[0, 1, 3, 2])],
        None,
    );
    let ks_ = e.node("Mul", &[kt, root], vec![], None);
    let mut scores = e.node("MatMul", &[qs_, ks_], vec![], None);
    if softcap > 0.0 {
        let c = e.scalar("softcap", dtype, softcap as f64);
        let d = e.node("Div", &[scores, c], vec![], None);
        let t = e.node("Tanh", &[d], vec![], None);
        scores = e.node("Mul", &[t, c], vec![], None);
    }
    let raw_scores = scores;
    // The bias: the mask (boolean: attend where true), padded to the total sequence with
    // "do not attend", plus the causal triangle, plus the padding of nonpad_kv_seqlen.
    let zero = e.scalar("zero", dtype, 0.0);
    let neg_inf = e.scalar("neg_inf", dtype, f64::NEG_INFINITY);
    let mut bias: Option<ValueId> = None;
    if let Some(m) = mask {
        let ms = e.g.values[m].shape.clone();
        let mut b = if e.g.values[m].dtype == DType::Bool {
            e.node("Where", &[m, zero, neg_inf], vec![], None)
        } else {
            m
        };
        let have = ms.last().copied().unwrap_or(0);
        if have < total {
            let mut pads = vec![0i64; 2 * ms.len()];
            pads[2 * ms.len() - 1] = (total - have) as i64;
            let pads = e.ints("pads", &pads);
            b = e.node("Pad", &[b, pads, neg_inf], vec![], None);
        }
        bias = Some(b);
    }
    if is_causal {
        // The triangle is [Sq, T]: each dimension passed the size budget, their product
        // must too before it is built.
        crate::tensor::budget("the causal mask", &[sq, total], dtype)
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        let tri = HostTensor::from_f64s(
            dtype,
            vec![sq, total],
            (0..sq).flat_map(|i| {
                (0..total).map(move |j| {
                    if j >= past && j - past > i {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
            }),
        );
        let c = e.konst("causal", tri);
        bias = Some(match bias {
            Some(b) => e.node("Add", &[b, c], vec![], None),
            None => c,
        });
    }
    if let Some(lens) = nonpad {
        // position < nonpad_kv_seqlen[b] attends: [1, T] < [B, 1] → [B, T] → [B, 1, 1, T].
        let pos = e.konst(
            "positions",
            HostTensor::ints(DType::I64, vec![1, total], (0..total as i64).collect()),
        );
        let axes = e.ints("axes", &[1]);
        let l = e.node("Unsqueeze", &[lens, axes], vec![], None);
        let keep = e.node("Less", &[pos, l], vec![], None);
        let pb = e.node("Where", &[keep, zero, neg_inf], vec![], None);
        let shape = e.ints("shape", &[batch_i, 1, 1, total as i64]);
        let pb = e.node("Reshape", &[pb, shape], vec![], None);
        bias = Some(match bias {
            Some(b) => e.node("Add", &[b, pb], vec![], None),
            None => pb,
        });
    }
    let biased = match bias {
        Some(b) => e.node("Add", &[scores, b], vec![], None),
        None => scores,
    };
    let probs = e.node("Softmax", &[biased], vec![a_int("axis", -1)], None);
    // The optional fourth output: scores (modes 0, 1), biased scores (2), probabilities (3).
    if let Some(o) = output(3) {
        let src = match mode {
            0 | 1 => raw_scores,
            2 => biased,
            _ => probs,
        };
        e.node("Identity", &[src], vec![], Some(o));
    }
    let y = output(0);
    if rank == 3 {
        let y4 = e.node("MatMul", &[probs, vr], vec![], None);
        let t = e.node(
            "Transpose",
            &[y4],
            vec![a_ints("perm", &[0, 2, 1, 3])],
            None,
        );
        let shape = e.ints("shape", &[batch_i, sq as i64, (hq * dv) as i64]);
        match y {
            Some(y) => e.node("Reshape", &[t, shape], vec![], Some(y)),
            None => t,
        };
    } else {
        e.node("MatMul", &[probs, vr], vec![], y);
    }
    let nodes = std::mem::take(&mut e.nodes);
    g_splice(e.g, ni, nodes);
    Ok(())
}

pub(super) fn g_splice(g: &mut Graph, ni: usize, nodes: Vec<Node>) {
    g.nodes.splice(ni..=ni, nodes);
}

/// `position_ids` computed at run time, made safe to gather with: each negative position
/// becomes `rows` (past the cache), so the `Gather` of the cache rows — which POOL
/// range-checks against `[-rows, rows)`, failing the execution with `NRT_EXEC_OOB` — refuses
/// it, as it refuses a position `≥ rows`, instead of counting it from the end of the cache
/// (ONNX Runtime reports both out of range). Positions that are not int64 are cast first.
fn checked_positions(e: &mut Expansion, n: &Node, pos: ValueId, rows: usize) -> Result<ValueId> {
    let rows = i64::try_from(rows)
        .map_err(|_| n.error(ErrorKind::TooLarge, format!("{rows} cache rows")))?;
    let pos = match e.g.values[pos].dtype {
        DType::I64 => pos,
        _ => e.node("Cast", &[pos], vec![a_int("to", 7)], None),
    };
    let zero = e.ints("zero", &[0]);
    let past = e.ints("cache_rows", &[rows]);
    let neg = e.node("Less", &[pos, zero], vec![], None);
    Ok(e.node("Where", &[neg, past, pos], vec![], None))
}

/// Replaces `RotaryEmbedding` node `ni` (X, cos_cache, sin_cache, position_ids?) by its
/// decomposition, in the layout of the ONNX reference: X as [B, S, H, D]; the first
/// `rotary_embedding_dim` (default D) channels rotate — as two halves, or as (even, odd)
/// pairs when `interleaved` — by the cos/sin rows of each position: `real = cos·x1 − sin·x2`,
/// `imag = sin·x1 + cos·x2`; the other channels pass through.
fn expand_rotary(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |msg: String| n.error(ErrorKind::BadAttribute, msg);
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(x), Some(cos), Some(sin)) = (input(0), input(1), input(2)) else {
        return Err(bad("input, cos_cache and sin_cache are required".into()));
    };
    let Some(y) = n.outputs.first().copied().flatten() else {
        return Err(bad("the output is required".into()));
    };
    let pos = input(3);
    let xs = g.values[x].shape.clone();
    let interleaved = n.attr_i("interleaved", 0)? != 0;
    let (b, s, h, d) = match xs.len() {
        4 => (xs[0], xs[2], xs[1], xs[3]),
        3 => {
            let h = n.attr_i("num_heads", 0)?;
            if h <= 0 || !xs[2].is_multiple_of(h as usize) {
                return Err(bad(format!(
                    "a 3-D input needs num_heads dividing its hidden size {} (num_heads = {h})",
                    xs[2]
                )));
            }
            (xs[0], xs[1], h as usize, xs[2] / h as usize)
        }
        r => {
            return Err(n.error(
                ErrorKind::ShapeMismatch,
                format!("input must be 3-D or 4-D, not {r}-D"),
            ));
        }
    };
    let rd = match n.attr_i("rotary_embedding_dim", 0)? {
        0 => d,
        r if r > 0 && (r as usize) <= d && r % 2 == 0 => r as usize,
        r => return Err(bad(format!("rotary_embedding_dim {r} (even, at most {d})"))),
    };
    let half = rd / 2;
    let (bi, si, hi, di) = (b as i64, s as i64, h as i64, d as i64);
    // The cache rows position_ids index: a position outside them is refused, as ONNX
    // Runtime does — a constant one here, a run-time one on the device (`checked_positions`).
    let cache_rows = g.values[cos]
        .shape
        .first()
        .copied()
        .unwrap_or(0)
        .max(g.values[sin].shape.first().copied().unwrap_or(0));
    if let Some(t) = pos.and_then(|p| g.values[p].konst.as_ref())
        && let Some(p) = t
            .to_i64s()
            .iter()
            .copied()
            .find(|&p| p < 0 || p >= cache_rows as i64)
    {
        return Err(bad(format!(
            "position_ids holds {p}, outside 0..{cache_rows} (the rows of cos_cache and sin_cache)"
        )));
    }
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let pos = match pos {
        Some(p) if e.g.values[p].konst.is_none() => {
            Some(checked_positions(&mut e, &n, p, cache_rows)?)
        }
        p => p,
    };
    // [B, S, H, D]
    let xt = if xs.len() == 4 {
        e.node("Transpose", &[x], vec![a_ints("perm", &[0, 2, 1, 3])], None)
    } else {
        let shape = e.ints("shape", &[bi, si, hi, di]);
        e.node("Reshape", &[x, shape], vec![], None)
    };
    let slice = |e: &mut Expansion, v: ValueId, from: i64, to: i64, axis: i64| {
        let (st, en, ax) = (
            e.ints("starts", &[from]),
            e.ints("ends", &[to]),
            e.ints("axes", &[axis]),
        );
        e.node("Slice", &[v, st, en, ax], vec![], None)
    };
    let rot_in = if rd < d {
        slice(&mut e, xt, 0, rd as i64, 3)
    } else {
        xt
    };
    // cos/sin rows per position: [B, S, half] → [B, S, 1, half] (· 1 more when interleaved).
    let rows = |e: &mut Expansion, c: ValueId| {
        let c = match pos {
            Some(p) => e.node("Gather", &[c, p], vec![a_int("axis", 0)], None),
            None => c,
        };
        let axes = if interleaved {
            e.ints("axes", &[2, 4])
        } else {
            e.ints("axes", &[2])
        };
        e.node("Unsqueeze", &[c, axes], vec![], None)
    };
    let (c, sn) = (rows(&mut e, cos), rows(&mut e, sin));
    let (x1, x2, pairs) = if interleaved {
        let shape = e.ints("pairs", &[bi, si, hi, half as i64, 2]);
        let p = e.node("Reshape", &[rot_in, shape], vec![], None);
        (slice(&mut e, p, 0, 1, 4), slice(&mut e, p, 1, 2, 4), true)
    } else {
        (
            slice(&mut e, rot_in, 0, half as i64, 3),
            slice(&mut e, rot_in, half as i64, rd as i64, 3),
            false,
        )
    };
    let (cx1, sx2) = (
        e.node("Mul", &[c, x1], vec![], None),
        e.node("Mul", &[sn, x2], vec![], None),
    );
    let real = e.node("Sub", &[cx1, sx2], vec![], None);
    let (sx1, cx2) = (
        e.node("Mul", &[sn, x1], vec![], None),
        e.node("Mul", &[c, x2], vec![], None),
    );
    let imag = e.node("Add", &[sx1, cx2], vec![], None);
    let mut rot = if pairs {
        let both = e.node("Concat", &[real, imag], vec![a_int("axis", 4)], None);
        let shape = e.ints("shape", &[bi, si, hi, rd as i64]);
        e.node("Reshape", &[both, shape], vec![], None)
    } else {
        e.node("Concat", &[real, imag], vec![a_int("axis", 3)], None)
    };
    if rd < d {
        let pass = slice(&mut e, xt, rd as i64, di, 3);
        rot = e.node("Concat", &[rot, pass], vec![a_int("axis", 3)], None);
    }
    if xs.len() == 4 {
        e.node(
            "Transpose",
            &[rot],
            vec![a_ints("perm", &[0, 2, 1, 3])],
            Some(y),
        );
    } else {
        let shape = e.ints("shape", &[bi, si, hi * di]);
        e.node("Reshape", &[rot, shape], vec![], Some(y));
    }
    let nodes = std::mem::take(&mut e.nodes);
    g_splice(e.g, ni, nodes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, infer_one, konst, op_types, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    #[test]
    fn attention_becomes_two_matmuls_around_a_softmax() {
        let f = |s: &[usize]| var(DType::F32, s);
        let ins = vec![f(&[1, 2, 3, 4]), f(&[1, 2, 5, 4]), f(&[1, 2, 5, 6])];
        let g = infer_one("Attention", 23, ins, vec![a_i("is_causal", 1)], 1).unwrap();
        let ops = op_types(&g);
        let count = |op: &str| ops.iter().filter(|&&o| o == op).count();
        assert_eq!(
            (count("MatMul"), count("Softmax"), count("Attention")),
            (2, 1, 0),
            "{ops:?}"
        );
        let y = &g.values[g.outputs[0]];
        assert_eq!((y.dtype, y.shape.clone()), (DType::F32, vec![1, 2, 3, 6]));
    }

    #[test]
    fn rotary_embedding_checks_heads_dims_and_positions() {
        let f = |s: &[usize]| var(DType::F32, s);
        let ins = || vec![f(&[1, 3, 8]), f(&[4, 2]), f(&[4, 2])];
        let e = out_types("RotaryEmbedding", 23, ins(), vec![a_i("num_heads", 3)], 1);
        assert!(
            e.unwrap_err()
                .message
                .contains("num_heads dividing its hidden size 8")
        );
        let odd = vec![a_i("num_heads", 2), a_i("rotary_embedding_dim", 3)];
        let e = out_types("RotaryEmbedding", 23, ins(), odd, 1).unwrap_err();
        assert!(
            e.message
                .contains("rotary_embedding_dim 3 (even, at most 4)"),
            "{e}"
        );
        let mut far = ins();
        far.push(konst(HostTensor::i64(vec![1, 1], vec![9])));
        let e = out_types("RotaryEmbedding", 23, far, vec![a_i("num_heads", 2)], 1).unwrap_err();
        assert!(
            e.message.contains("position_ids holds 9, outside 0..4"),
            "{e}"
        );
        let mut at = ins();
        at.push(konst(HostTensor::i64(vec![1, 3], vec![0, 1, 3])));
        let t = out_types("RotaryEmbedding", 23, at, vec![a_i("num_heads", 2)], 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![1, 3, 8])]);
    }
}
