//! The decoder graph: one static-shape program of a llama-family model as an ONNX graph of
//! standard operators, which the project's compiler lowers (and ONNX Runtime runs as the
//! reference).
//!
//! A program processes `batch` rows of `seq` tokens each: a *prefill* (context-encoding)
//! program is one row of a bucket's length, a *decode* (token-generation) program a batch
//! bucket of rows of one token. Every program of a model reads the same tensors, which the
//! caller allocates once and binds to each:
//!
//! | input | type, shape | what |
//! |---|---|---|
//! | `input_ids` | i64 `[B, L]` | the tokens (padding: any id) |
//! | `positions` | i64 `[B, L]` | each token's position in its sequence (RoPE, the mask, the cache row) |
//! | `slots` | i64 `[B]` | each row's KV-cache slot (padding rows: the spare slot, `slots − 1`) |
//! | `last` | i64 `[B]` | which of a row's `L` tokens the logits are taken at (its last real one) |
//! | weights | f32, the GGUF names | `token_embd.weight`, `blk.N.*.weight`, `output_norm.weight`, (`output.weight`) — GGUF's `[rows, cols]` layout, matrices read through a transpose |
//! | `past_key_values.N.key` / `.value` | f32 `[S, T, kv_heads, head_dim]` | the cache of layer N: slot, position, head |
//!
//! Outputs: `present.N.key` / `.value`, each a `ScatterND` of the step's rows into its
//! `past_key_values` input — declared **in place** ([`in_place_pairs`]), so the program writes
//! only the new rows and the caller binds one cache tensor to both; then either `next_token`
//! (i64 `[B]`) and `logprob` (f32 `[B]`), sampled on the device (the sampling parameters
//! `temperature`, `top_k`, `top_p`, `seed` are inputs of `[B]`; no logits are copied back), or
//! `logits` (f32 `[B, vocab]`, for the reference's comparison).
//!
//! Attention: RoPE on adjacent pairs (ggml's "normal" rotation, which the GGUF's permuted Q/K
//! rows expect), grouped-query heads (query head `j` reads KV head `j / group`), each query
//! attending its slot's positions up to its own — so padding, stale rows of an earlier
//! sequence and the rows padding wrote are never attended. The device programs do it with
//! one `ai.nrt` `CachedAttention` per layer, which reads only those rows (a decode step costs
//! the sequence's length, not the cache's); the reference graph for ONNX Runtime
//! ([`WeightSource::External`]) with standard operators: the slot's whole cache row gathered,
//! the positions after the query's masked, softmax, the product with the values.

use crate::LlamaConfig;
use crate::quant::GgmlType;
use nrt_compiler::onnx::{
    AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto, attribute_type, data_type,
};

/// The domain of the project's `Sample` operator.
pub const SAMPLE_DOMAIN: &str = "ai.nrt";

/// What a program returns besides the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// `next_token` and `logprob`: each row's token drawn on the device (`ai.nrt` `Sample`:
    /// greedy at temperature 0, else temperature / top-k / top-p with the row's seed and the
    /// token's position as the draw's counter). Inputs `temperature`, `top_k`, `top_p`,
    /// `seed` (each `[B]`).
    Sample,
    /// `logits` of each row's `last` token.
    Logits,
}

/// The weights stored in ggml blocks (`Q4_0`, `Q4_1`, `Q8_0`) or bf16 rather than f32, by
/// name: the type and whether groups of 8 rows are interleaved (the `x8` layout of
/// `nrt_isa::op::BlockFormat`; never for bf16).
pub type BlockWeights = std::collections::BTreeMap<String, (GgmlType, bool)>;

/// How the weights enter the graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WeightSource {
    /// Graph inputs the caller binds (the device programs: one copy shared by all): f32,
    /// or, for those named here, u8 `[rows, row bytes]` of ggml blocks read by the
    /// `ai.nrt` `MatMulBlockQuant` / `GatherBlockQuant` operators, or bf16 `[rows, cols]`
    /// read by MatMul through a `Cast` (never widened in memory).
    Inputs(BlockWeights),
    /// Initializers whose data lives in an external file at the given offsets (the reference
    /// graph ONNX Runtime loads): `(file name, offset of each weight in WEIGHT order, the
    /// weights stored as bf16)` — f32, or bf16 widened by a `Cast` as the device programs
    /// read them (ggml blocks have no ONNX type).
    External(String, Vec<u64>, BlockWeights),
}

/// One program's shape.
#[derive(Clone, Debug)]
pub struct ProgramShape {
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// KV-cache slots (the largest batch bucket plus one spare for padding rows).
    pub cache_slots: usize,
    /// KV-cache positions per slot (the max model length).
    pub cache_len: usize,
}

/// The weights a model's programs read, in order: `(name, shape)`, shape as ONNX (outermost
/// first) — GGUF's `[ne1, ne0]` for matrices.
pub fn weights(c: &LlamaConfig) -> Vec<(String, Vec<usize>)> {
    let (h, f, q, kv) = (c.n_embd, c.n_ff, c.n_head * c.head_dim, c.kv_dim());
    let mut w = vec![("token_embd.weight".to_owned(), vec![c.vocab_size, h])];
    for l in 0..c.n_layer {
        let n = |s: &str| format!("blk.{l}.{s}.weight");
        w.push((n("attn_norm"), vec![h]));
        w.push((n("attn_q"), vec![q, h]));
        w.push((n("attn_k"), vec![kv, h]));
        w.push((n("attn_v"), vec![kv, h]));
        w.push((n("attn_output"), vec![h, q]));
        w.push((n("ffn_norm"), vec![h]));
        w.push((n("ffn_gate"), vec![f, h]));
        w.push((n("ffn_up"), vec![f, h]));
        w.push((n("ffn_down"), vec![h, f]));
    }
    w.push(("output_norm.weight".to_owned(), vec![h]));
    if !c.tied_embeddings {
        w.push(("output.weight".to_owned(), vec![c.vocab_size, h]));
    }
    w
}

/// The names of layer `l`'s cache input and output: `(past key, past value, present key,
/// present value)`.
pub fn cache_names(l: usize) -> [String; 4] {
    [
        format!("past_key_values.{l}.key"),
        format!("past_key_values.{l}.value"),
        format!("present.{l}.key"),
        format!("present.{l}.value"),
    ]
}

/// The in-place pairs (output → input) of a program: every layer's present over its past.
pub fn in_place_pairs(c: &LlamaConfig) -> Vec<(String, String)> {
    (0..c.n_layer)
        .flat_map(|l| {
            let [pk, pv, ok, ov] = cache_names(l);
            [(ok, pk), (ov, pv)]
        })
        .collect()
}

/// The compile options of every program of a model: the caches in place, `cores` cores.
pub fn compile_options(c: &LlamaConfig, cores: u32) -> nrt_compiler::CompileOptions {
    nrt_compiler::CompileOptions {
        cores,
        in_place: in_place_pairs(c).into_iter().collect(),
        ..Default::default()
    }
}

/// The RoPE tables `[cache_len, head_dim / 2]`: `cos(p·θᵢ)`, `sin(p·θᵢ)`, `θᵢ = base^(−2i/d)`
/// (computed in f64, stored in f32).
pub fn rope_tables(c: &LlamaConfig, cache_len: usize) -> (Vec<f32>, Vec<f32>) {
    let half = c.head_dim / 2;
    let mut cos = Vec::with_capacity(cache_len * half);
    let mut sin = Vec::with_capacity(cache_len * half);
    for p in 0..cache_len {
        for i in 0..half {
            let theta = (c.rope_freq_base as f64).powf(-2.0 * i as f64 / c.head_dim as f64);
            let a = p as f64 * theta;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

/// Builds one program's graph.
pub fn decoder_graph(
    c: &LlamaConfig,
    s: &ProgramShape,
    head: Head,
    source: &WeightSource,
) -> ModelProto {
    let mut g = G::default();
    let (b, l) = (s.batch as i64, s.seq as i64);
    let (h, hd) = (c.n_embd as i64, c.head_dim as i64);
    let (nh, kvh) = (c.n_head as i64, c.n_head_kv as i64);
    let group = nh / kvh;
    let t = s.cache_len as i64;

    g.input("input_ids", data_type::INT64, &[b, l]);
    g.input("positions", data_type::INT64, &[b, l]);
    g.input("slots", data_type::INT64, &[b]);
    g.input("last", data_type::INT64, &[b]);
    if head == Head::Sample {
        g.input("temperature", data_type::FLOAT, &[b]);
        g.input("top_k", data_type::INT64, &[b]);
        g.input("top_p", data_type::FLOAT, &[b]);
        g.input("seed", data_type::INT64, &[b]);
    }
    let ws = weights(c);
    match source {
        WeightSource::Inputs(blocks) => {
            for (n, shape) in &ws {
                match blocks.get(n) {
                    Some(&(GgmlType::Bf16, _)) => {
                        g.input(n, data_type::BFLOAT16, &to_i64(shape));
                        let k = shape[shape.len() - 1] as i64;
                        g.blocks.insert(n.clone(), (GgmlType::Bf16, false, k));
                    }
                    Some(&(ty, x8)) => {
                        let (rows, k) = (shape[0] as u64, shape[shape.len() - 1] as u64);
                        let rb = ty.row_bytes(k).unwrap_or(0) as i64;
                        g.input(n, data_type::UINT8, &[rows as i64, rb]);
                        g.blocks.insert(n.clone(), (ty, x8, k as i64));
                    }
                    None => g.input(n, data_type::FLOAT, &to_i64(shape)),
                }
            }
        }
        WeightSource::External(file, offsets, halves) => {
            for ((n, shape), &off) in ws.iter().zip(offsets) {
                let bf16 = matches!(halves.get(n), Some(&(GgmlType::Bf16, _)));
                let (ty, size) = if bf16 {
                    let k = shape[shape.len() - 1] as i64;
                    g.blocks.insert(n.clone(), (GgmlType::Bf16, false, k));
                    (data_type::BFLOAT16, 2)
                } else {
                    (data_type::FLOAT, 4)
                };
                let bytes = shape.iter().product::<usize>() as u64 * size;
                g.graph.initializer.push(TensorProto {
                    dims: to_i64(shape),
                    data_type: ty,
                    name: n.clone(),
                    external_data: vec![
                        kv("location", file),
                        kv("offset", &off.to_string()),
                        kv("length", &bytes.to_string()),
                    ],
                    data_location: 1,
                    ..Default::default()
                });
            }
        }
    }
    let cache_shape = [s.cache_slots as i64, t, kvh, hd];
    for layer in 0..c.n_layer {
        let [pk, pv, _, _] = cache_names(layer);
        g.input(&pk, data_type::FLOAT, &cache_shape);
        g.input(&pv, data_type::FLOAT, &cache_shape);
    }

    // Shared by every layer: RoPE factors of each token, the mask, the cache indices.
    let (cos_t, sin_t) = rope_tables(c, s.cache_len);
    let half = hd / 2;
    g.konst_f32("rope.cos", &[t, half], &cos_t);
    g.konst_f32("rope.sin", &[t, half], &sin_t);
    let cos = g.op("Gather", &["rope.cos", "positions"], &[]);
    let cos = g.reshape(&cos, &[b, l, 1, half, 1]);
    let sin = g.op("Gather", &["rope.sin", "positions"], &[]);
    let sin = g.reshape(&sin, &[b, l, 1, half, 1]);
    // The device programs attend with `ai.nrt` `CachedAttention` (only the rows up to each
    // query's position are read); the reference graph ONNX Runtime runs, with standard
    // operators: the whole slot, the positions after the query's masked.
    let fused = matches!(source, WeightSource::Inputs(_));
    let mask = if fused {
        String::new()
    } else {
        let key_pos: Vec<i64> = (0..t).collect();
        g.konst_i64("mask.key_positions", &[t], &key_pos);
        let qpos = g.reshape("positions", &[b, l, 1]);
        let allowed = g.op("LessOrEqual", &["mask.key_positions", &qpos], &[]);
        g.konst_f32("mask.zero", &[], &[0.0]);
        g.konst_f32("mask.neg", &[], &[-1e9]);
        let mask = g.op("Where", &[&allowed, "mask.zero", "mask.neg"], &[]);
        g.konst_f32("attn.scale", &[], &[1.0 / (hd as f32).sqrt()]);
        g.reshape(&mask, &[b, 1, 1, l, t])
    };
    let slot_col = g.reshape("slots", &[b, 1, 1]);
    g.konst_i64("cache.index_shape", &[3], &[b, l, 1]);
    let slot_col = g.op("Expand", &[&slot_col, "cache.index_shape"], &[]);
    let pos_col = g.reshape("positions", &[b, l, 1]);
    let cache_idx = g.op("Concat", &[&slot_col, &pos_col], &[int("axis", 2)]);

    let mut x = g.gather_rows("token_embd.weight", "input_ids");
    for layer in 0..c.n_layer {
        let w = |s: &str| format!("blk.{layer}.{s}.weight");
        let [pk, pv, ok, ov] = cache_names(layer);
        let hn = g.op(
            "RMSNormalization",
            &[&x, &w("attn_norm")],
            &[int("axis", -1), float("epsilon", c.rms_norm_eps)],
        );
        let q = g.linear(&hn, &w("attn_q"));
        let k = g.linear(&hn, &w("attn_k"));
        let v = g.linear(&hn, &w("attn_v"));
        let q = g.rope(&q, &[b, l, nh, half, 2], &cos, &sin, &[b, l, nh * hd]);
        let k = g.rope(&k, &[b, l, kvh, half, 2], &cos, &sin, &[b, l, kvh, hd]);
        let v = g.reshape(&v, &[b, l, kvh, hd]);
        g.node("ScatterND", &[&pk, &cache_idx, &k], &ok, &[]);
        g.node("ScatterND", &[&pv, &cache_idx, &v], &ov, &[]);
        let o = if fused {
            let o = g.op(
                "CachedAttention",
                &[&q, &ok, &ov, "slots", "positions"],
                &[int("num_heads", nh), int("kv_num_heads", kvh)],
            );
            g.graph.node.last_mut().expect("just pushed").domain = SAMPLE_DOMAIN.into();
            o
        } else {
            let kb = g.op("Gather", &[&ok, "slots"], &[int("axis", 0)]); // [B, T, kvh, hd]
            let vb = g.op("Gather", &[&ov, "slots"], &[int("axis", 0)]);
            let kt = g.op("Transpose", &[&kb], &[ints("perm", &[0, 2, 3, 1])]); // [B, kvh, hd, T]
            let vt = g.op("Transpose", &[&vb], &[ints("perm", &[0, 2, 1, 3])]); // [B, kvh, T, hd]
            let qs = g.op("Mul", &[&q, "attn.scale"], &[]);
            let q5 = g.reshape(&qs, &[b, l, kvh, group, hd]);
            let q5 = g.op("Transpose", &[&q5], &[ints("perm", &[0, 2, 3, 1, 4])]); // [B, kvh, g, L, hd]
            let q4 = g.reshape(&q5, &[b, kvh, group * l, hd]);
            let scores = g.op("MatMul", &[&q4, &kt], &[]); // [B, kvh, g·L, T]
            let scores = g.reshape(&scores, &[b, kvh, group, l, t]);
            let scores = g.op("Add", &[&scores, &mask], &[]);
            let p = g.op("Softmax", &[&scores], &[int("axis", -1)]);
            let p = g.reshape(&p, &[b, kvh, group * l, t]);
            let o = g.op("MatMul", &[&p, &vt], &[]); // [B, kvh, g·L, hd]
            let o = g.reshape(&o, &[b, kvh, group, l, hd]);
            let o = g.op("Transpose", &[&o], &[ints("perm", &[0, 3, 1, 2, 4])]); // [B, L, kvh, g, hd]
            g.reshape(&o, &[b, l, nh * hd])
        };
        let attn = g.linear(&o, &w("attn_output"));
        x = g.op("Add", &[&x, &attn], &[]);
        let hn = g.op(
            "RMSNormalization",
            &[&x, &w("ffn_norm")],
            &[int("axis", -1), float("epsilon", c.rms_norm_eps)],
        );
        let gate = g.linear(&hn, &w("ffn_gate"));
        let up = g.linear(&hn, &w("ffn_up"));
        let sg = g.op("Sigmoid", &[&gate], &[]);
        let silu = g.op("Mul", &[&gate, &sg], &[]);
        let act = g.op("Mul", &[&silu, &up], &[]);
        let down = g.linear(&act, &w("ffn_down"));
        x = g.op("Add", &[&x, &down], &[]);
    }
    // Each row's `last` token: row r of the [B·L, H] states is r·L + last.
    let flat = g.reshape(&x, &[b * l, h]);
    let row_starts: Vec<i64> = (0..b).map(|r| r * l).collect();
    g.konst_i64("head.row_starts", &[b], &row_starts);
    let at = g.op("Add", &["head.row_starts", "last"], &[]);
    let xl = g.op("Gather", &[&flat, &at], &[int("axis", 0)]); // [B, H]
    let xn = g.op(
        "RMSNormalization",
        &[&xl, "output_norm.weight"],
        &[int("axis", -1), float("epsilon", c.rms_norm_eps)],
    );
    let lm = if c.tied_embeddings {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let v = c.vocab_size as i64;
    match head {
        Head::Logits => {
            if g.blocks.contains_key(lm) {
                let lg = g.linear(&xn, lm);
                g.node("Identity", &[&lg], "logits", &[]);
            } else {
                let lt = g.op("Transpose", &[lm], &[ints("perm", &[1, 0])]);
                g.node("MatMul", &[&xn, &lt], "logits", &[]);
            }
            g.output("logits", data_type::FLOAT, &[b, v]);
        }
        Head::Sample => {
            let logits = g.linear(&xn, lm);
            // The draw's counter: the position of each row's last token.
            let flat_pos = g.reshape("positions", &[b * l]);
            let step = g.op("Gather", &[&flat_pos, &at], &[int("axis", 0)]);
            g.graph.node.push(NodeProto {
                input: ["temperature", "top_k", "top_p", "seed"]
                    .iter()
                    .fold(vec![logits], |mut v, s| {
                        v.push(s.to_string());
                        v
                    })
                    .into_iter()
                    .chain([step])
                    .collect(),
                output: vec!["next_token".into(), "logprob".into()],
                name: "sample".into(),
                op_type: "Sample".into(),
                domain: SAMPLE_DOMAIN.into(),
                ..Default::default()
            });
            g.output("next_token", data_type::INT64, &[b]);
            g.output("logprob", data_type::FLOAT, &[b]);
        }
    }
    for layer in 0..c.n_layer {
        let [_, _, ok, ov] = cache_names(layer);
        g.output(&ok, data_type::FLOAT, &cache_shape);
        g.output(&ov, data_type::FLOAT, &cache_shape);
    }
    g.graph.name = match (s.seq, s.batch) {
        (1, bb) => format!("decode-b{bb}"),
        (ll, _) => format!("prefill-l{ll}"),
    };
    let mut opset_import = vec![OperatorSetIdProto {
        domain: String::new(),
        version: 23,
    }];
    if head == Head::Sample || !g.blocks.is_empty() {
        opset_import.push(OperatorSetIdProto {
            domain: SAMPLE_DOMAIN.into(),
            version: 1,
        });
    }
    ModelProto {
        ir_version: 10,
        opset_import,
        producer_name: "nrt-llm".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        graph: Some(g.graph),
        ..Default::default()
    }
}

fn to_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

fn kv(k: &str, v: &str) -> nrt_compiler::onnx::StringStringEntryProto {
    nrt_compiler::onnx::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

fn int(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ..Default::default()
    }
}

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn float(name: &str, f: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f,
        ..Default::default()
    }
}

/// A graph under construction: values are named `v<n>`.
#[derive(Default)]
struct G {
    graph: GraphProto,
    next: usize,
    /// The weights in ggml blocks: their type, whether interleaved, and weights per row.
    blocks: std::collections::BTreeMap<String, (GgmlType, bool, i64)>,
}

impl G {
    fn value_info(name: &str, elem: i32, shape: &[i64]) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            r#type: Some(TypeProto {
                tensor_type: Some(TypeProtoTensor {
                    elem_type: elem,
                    shape: Some(TensorShapeProto {
                        dim: shape
                            .iter()
                            .map(|&d| Dimension {
                                dim_value: Some(d),
                                dim_param: None,
                            })
                            .collect(),
                    }),
                }),
                ..Default::default()
            }),
        }
    }

    fn input(&mut self, name: &str, elem: i32, shape: &[i64]) {
        self.graph.input.push(Self::value_info(name, elem, shape));
    }

    fn output(&mut self, name: &str, elem: i32, shape: &[i64]) {
        self.graph.output.push(Self::value_info(name, elem, shape));
    }

    fn konst_f32(&mut self, name: &str, dims: &[i64], v: &[f32]) {
        self.graph.initializer.push(TensorProto {
            dims: dims.to_vec(),
            data_type: data_type::FLOAT,
            name: name.into(),
            raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ..Default::default()
        });
    }

    fn konst_i64(&mut self, name: &str, dims: &[i64], v: &[i64]) {
        self.graph.initializer.push(TensorProto {
            dims: dims.to_vec(),
            data_type: data_type::INT64,
            name: name.into(),
            raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ..Default::default()
        });
    }

    fn node(&mut self, op: &str, inputs: &[&str], out: &str, attrs: &[AttributeProto]) {
        self.graph.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![out.to_owned()],
            name: format!("{op}_{}", self.graph.node.len()),
            op_type: op.into(),
            attribute: attrs.to_vec(),
            ..Default::default()
        });
    }

    fn op(&mut self, op: &str, inputs: &[&str], attrs: &[AttributeProto]) -> String {
        self.next += 1;
        let out = format!("v{}", self.next);
        self.node(op, inputs, &out, attrs);
        out
    }

    fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        self.next += 1;
        let s = format!("shape{}", self.next);
        self.konst_i64(&s, &[shape.len() as i64], shape);
        self.op("Reshape", &[x, &s], &[])
    }

    /// `x · Wᵀ` with `W` in GGUF's `[out, in]` layout (f32, bf16, or ggml blocks). A bf16 `W`
    /// is widened by a `Cast` that the compiler folds into the product (the device's MatMul
    /// reads the bf16 values in place: no f32 copy).
    fn linear(&mut self, x: &str, w: &str) -> String {
        match self.blocks.get(w) {
            Some(&(GgmlType::Bf16, _, _)) => {
                let wt = self.op("Transpose", &[w], &[ints("perm", &[1, 0])]);
                let wf = self.op("Cast", &[&wt], &[int("to", data_type::FLOAT as i64)]);
                self.op("MatMul", &[x, &wf], &[])
            }
            Some(&(ty, x8, k)) => self.block_op("MatMulBlockQuant", &[x, w], ty, x8, k),
            None => {
                let wt = self.op("Transpose", &[w], &[ints("perm", &[1, 0])]);
                self.op("MatMul", &[x, &wt], &[])
            }
        }
    }

    /// Rows `ids` of the table `w` (an embedding lookup), as f32.
    fn gather_rows(&mut self, w: &str, ids: &str) -> String {
        match self.blocks.get(w) {
            Some(&(GgmlType::Bf16, _, _)) => {
                let rows = self.op("Gather", &[w, ids], &[]);
                self.op("Cast", &[&rows], &[int("to", data_type::FLOAT as i64)])
            }
            Some(&(ty, x8, k)) => self.block_op("GatherBlockQuant", &[w, ids], ty, x8, k),
            None => self.op("Gather", &[w, ids], &[]),
        }
    }

    /// An `ai.nrt` block-quantized operator over weights of type `ty` (`x8`: interleaved),
    /// `k` per row.
    fn block_op(&mut self, op: &str, inputs: &[&str], ty: GgmlType, x8: bool, k: i64) -> String {
        let format = format!("{}{}", ty.name(), if x8 { "x8" } else { "" });
        let out = self.op(op, inputs, &[string("format", &format), int("K", k)]);
        self.graph.node.last_mut().expect("just pushed").domain = SAMPLE_DOMAIN.into();
        out
    }

    /// RoPE on adjacent pairs: `x` viewed as `pairs` (`[..., heads, half, 2]`), rotated by the
    /// token's `cos`/`sin` (`[B, L, 1, half, 1]`), returned in shape `out`.
    fn rope(&mut self, x: &str, pairs: &[i64], cos: &str, sin: &str, out: &[i64]) -> String {
        let xp = self.reshape(x, pairs);
        let x0 = self.slice_last(&xp, 0);
        let x1 = self.slice_last(&xp, 1);
        let a = self.op("Mul", &[&x0, cos], &[]);
        let bq = self.op("Mul", &[&x1, sin], &[]);
        let o0 = self.op("Sub", &[&a, &bq], &[]);
        let c = self.op("Mul", &[&x0, sin], &[]);
        let d = self.op("Mul", &[&x1, cos], &[]);
        let o1 = self.op("Add", &[&c, &d], &[]);
        let r = self.op("Concat", &[&o0, &o1], &[int("axis", -1)]);
        self.reshape(&r, out)
    }

    fn slice_last(&mut self, x: &str, i: i64) -> String {
        self.next += 1;
        let (s, e, a) = (
            format!("slice{}.s", self.next),
            format!("slice{}.e", self.next),
            format!("slice{}.a", self.next),
        );
        self.konst_i64(&s, &[1], &[i]);
        self.konst_i64(&e, &[1], &[i + 1]);
        self.konst_i64(&a, &[1], &[-1]);
        self.op("Slice", &[x, &s, &e, &a], &[])
    }
}
