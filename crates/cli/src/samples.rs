//! ONNX models the project builds itself (no downloads, no Python): the demo's small
//! transformer encoder block and a small CNN, written with the compiler's ONNX messages.

use nrt_compiler::onnx::{
    AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto, attribute_type, data_type,
};

/// A deterministic xorshift generator for weights.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        // Uniform in [-1, 1).
        ((self.0 >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    fn tensor(&mut self, name: &str, dims: &[i64], scale: f32) -> TensorProto {
        let n: i64 = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| self.next() * scale).collect();
        f32_tensor(name, dims, &v)
    }
}

fn f32_tensor(name: &str, dims: &[i64], v: &[f32]) -> TensorProto {
    TensorProto {
        name: name.to_owned(),
        dims: dims.to_vec(),
        data_type: data_type::FLOAT,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    }
}

fn i64_tensor(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.to_owned(),
        dims: vec![v.len() as i64],
        data_type: data_type::INT64,
        raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ..Default::default()
    }
}

fn value_info(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.to_owned(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: dims
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

struct Graph {
    nodes: Vec<NodeProto>,
    inits: Vec<TensorProto>,
    rng: Rng,
}

impl Graph {
    fn new(seed: u64) -> Graph {
        Graph {
            nodes: Vec::new(),
            inits: Vec::new(),
            rng: Rng(seed),
        }
    }

    fn node(
        &mut self,
        op: &str,
        inputs: &[&str],
        output: &str,
        attrs: Vec<AttributeProto>,
    ) -> String {
        self.nodes.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.to_owned()],
            name: output.to_owned(),
            op_type: op.to_owned(),
            attribute: attrs,
            ..Default::default()
        });
        output.to_owned()
    }

    fn weight(&mut self, name: &str, dims: &[i64], scale: f32) -> String {
        let t = self.rng.tensor(name, dims, scale);
        self.inits.push(t);
        name.to_owned()
    }

    fn constant(&mut self, name: &str, v: &[f32]) -> String {
        self.inits.push(f32_tensor(name, &[], v));
        name.to_owned()
    }

    /// A constant int8 `[k, n]` of random values in −127..=127.
    fn int8_weight(&mut self, name: &str, k: i64, n: i64) {
        let w: Vec<u8> = (0..k * n)
            .map(|_| (self.rng.next() * 127.0).round() as i8 as u8)
            .collect();
        self.inits.push(TensorProto {
            name: name.into(),
            dims: vec![k, n],
            data_type: data_type::INT8,
            raw_data: w,
            ..Default::default()
        });
    }

    fn finish(self, name: &str, input: ValueInfoProto, output: ValueInfoProto) -> Vec<u8> {
        self.finish_io(name, vec![input], vec![output])
    }

    fn finish_io(
        self,
        name: &str,
        inputs: Vec<ValueInfoProto>,
        outputs: Vec<ValueInfoProto>,
    ) -> Vec<u8> {
        let m = ModelProto {
            ir_version: 8,
            opset_import: vec![OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            }],
            producer_name: "nrt-rs samples".into(),
            graph: Some(GraphProto {
                node: self.nodes,
                name: name.to_owned(),
                initializer: self.inits,
                input: inputs,
                output: outputs,
                ..Default::default()
            }),
            ..Default::default()
        };
        nrt_compiler::onnx::encode_model(&m)
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

fn int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i: v,
        ..Default::default()
    }
}

fn float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::FLOAT,
        f: v,
        ..Default::default()
    }
}

/// A post-LN transformer encoder block: `X: f32[1, seq, hidden]` → `Y`, multi-head attention
/// (Q/K/V projections, scaled dot-product, softmax), residual + LayerNormalization, a
/// tanh-Gelu feed-forward block, residual + LayerNormalization. The same structure as the
/// peers' `encoder` benchmark model, smaller.
pub fn transformer_block(seq: i64, hidden: i64, heads: i64, ffn: i64) -> Vec<u8> {
    let dh = hidden / heads;
    let mut g = Graph::new(0x9E37_79B9_7F4A_7C15);
    let s = 1.0 / (hidden as f32).sqrt();
    for nm in ["q", "k", "v", "o"] {
        g.weight(&format!("W{nm}"), &[hidden, hidden], s);
        g.weight(&format!("b{nm}"), &[hidden], 0.02);
    }
    g.weight("W1", &[hidden, ffn], s);
    g.weight("b1", &[ffn], 0.02);
    g.weight("W2", &[ffn, hidden], 1.0 / (ffn as f32).sqrt());
    g.weight("b2", &[hidden], 0.02);
    for ln in ["ln1", "ln2"] {
        let gamma: Vec<f32> = (0..hidden).map(|_| 1.0 + 0.05 * g.rng.next()).collect();
        g.inits
            .push(f32_tensor(&format!("{ln}_g"), &[hidden], &gamma));
        g.weight(&format!("{ln}_b"), &[hidden], 0.05);
    }
    g.inits
        .push(i64_tensor("shape_heads", &[1, seq, heads, dh]));
    g.inits.push(i64_tensor("shape_merge", &[1, seq, hidden]));
    g.constant("inv_sqrt_dh", &[1.0 / (dh as f32).sqrt()]);
    for (n, v) in [
        ("half", 0.5),
        ("one", 1.0),
        ("c_gelu", (2.0f32 / std::f32::consts::PI).sqrt()),
        ("c_cube", 0.044715),
        ("three", 3.0),
    ] {
        g.constant(n, &[v]);
    }
    let proj = |g: &mut Graph, x: &str, nm: &str| {
        let mm = g.node(
            "MatMul",
            &[x, &format!("W{nm}")],
            &format!("{nm}_mm"),
            vec![],
        );
        g.node(
            "Add",
            &[&mm, &format!("b{nm}")],
            &format!("{nm}_lin"),
            vec![],
        )
    };
    let split = |g: &mut Graph, x: &str, nm: &str| {
        let r = g.node("Reshape", &[x, "shape_heads"], &format!("{nm}_r"), vec![]);
        g.node(
            "Transpose",
            &[&r],
            &format!("{nm}_h"),
            vec![ints("perm", &[0, 2, 1, 3])],
        )
    };
    let q = proj(&mut g, "X", "q");
    let q = split(&mut g, &q, "q");
    let k = proj(&mut g, "X", "k");
    let k = split(&mut g, &k, "k");
    let v = proj(&mut g, "X", "v");
    let v = split(&mut g, &v, "v");
    let kt = g.node("Transpose", &[&k], "kT", vec![ints("perm", &[0, 1, 3, 2])]);
    let qk = g.node("MatMul", &[&q, &kt], "qk", vec![]);
    let scores = g.node("Mul", &[&qk, "inv_sqrt_dh"], "scores", vec![]);
    let p = g.node("Softmax", &[&scores], "probs", vec![int("axis", -1)]);
    let ctx = g.node("MatMul", &[&p, &v], "ctx_h", vec![]);
    let ctx = g.node(
        "Transpose",
        &[&ctx],
        "ctx_t",
        vec![ints("perm", &[0, 2, 1, 3])],
    );
    let ctx = g.node("Reshape", &[&ctx, "shape_merge"], "ctx", vec![]);
    let attn = proj(&mut g, &ctx, "o");
    let x1 = g.node("Add", &["X", &attn], "res1", vec![]);
    let ln = |g: &mut Graph, x: &str, nm: &str, out: &str| {
        g.node(
            "LayerNormalization",
            &[x, &format!("{nm}_g"), &format!("{nm}_b")],
            out,
            vec![int("axis", -1), float("epsilon", 1e-5)],
        )
    };
    let h1 = ln(&mut g, &x1, "ln1", "ln1");
    let f = proj(&mut g, &h1, "1");
    let x3 = g.node("Pow", &[&f, "three"], "g_x3", vec![]);
    let cx3 = g.node("Mul", &[&x3, "c_cube"], "g_cx3", vec![]);
    let inner = g.node("Add", &[&f, &cx3], "g_in", vec![]);
    let sc = g.node("Mul", &[&inner, "c_gelu"], "g_sc", vec![]);
    let t = g.node("Tanh", &[&sc], "g_t", vec![]);
    let hx = g.node("Mul", &[&f, "half"], "g_hx", vec![]);
    let one_t = g.node("Add", &[&t, "one"], "g_1t", vec![]);
    let gel = g.node("Mul", &[&hx, &one_t], "gelu", vec![]);
    let f2 = proj(&mut g, &gel, "2");
    let x2 = g.node("Add", &[&h1, &f2], "res2", vec![]);
    ln(&mut g, &x2, "ln2", "Y");
    g.finish(
        "encoder_block",
        value_info("X", &[1, seq, hidden]),
        value_info("Y", &[1, seq, hidden]),
    )
}

/// A small CNN: `X: f32[1, 3, 32, 32]` → conv 3×3 (16) + ReLU → max-pool 2 → conv 3×3 (32,
/// stride 2) + ReLU → global average pool → flatten → dense 10 → softmax.
pub fn small_cnn() -> Vec<u8> {
    let mut g = Graph::new(0xC0FF_EE00_1234_5678);
    g.weight("w1", &[16, 3, 3, 3], 0.3);
    g.weight("c1", &[16], 0.05);
    g.weight("w2", &[32, 16, 3, 3], 0.1);
    g.weight("c2", &[32], 0.05);
    g.weight("wd", &[32, 10], 0.3);
    g.weight("bd", &[10], 0.05);
    let c1 = g.node(
        "Conv",
        &["X", "w1", "c1"],
        "conv1",
        vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
    );
    let r1 = g.node("Relu", &[&c1], "relu1", vec![]);
    let p1 = g.node(
        "MaxPool",
        &[&r1],
        "pool1",
        vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
    );
    let c2 = g.node(
        "Conv",
        &[&p1, "w2", "c2"],
        "conv2",
        vec![
            ints("kernel_shape", &[3, 3]),
            ints("pads", &[1, 1, 1, 1]),
            ints("strides", &[2, 2]),
        ],
    );
    let r2 = g.node("Relu", &[&c2], "relu2", vec![]);
    let gp = g.node("GlobalAveragePool", &[&r2], "gap", vec![]);
    let fl = g.node("Flatten", &[&gp], "flat", vec![int("axis", 1)]);
    let d = g.node("Gemm", &[&fl, "wd", "bd"], "dense", vec![]);
    g.node("Softmax", &[&d], "Y", vec![int("axis", -1)]);
    g.finish(
        "small_cnn",
        value_info("X", &[1, 3, 32, 32]),
        value_info("Y", &[1, 10]),
    )
}

/// `layers` × (MatMul + Add + Relu), `width` wide, batch `batch`: the shape of the peers'
/// `mlp` (batch 1) and `mlp_b64` (batch 64) benchmark models.
pub fn mlp(batch: i64, width: i64, layers: usize) -> Vec<u8> {
    let mut g = Graph::new(0x2545_F491_4F6C_DD1D);
    let mut cur = "X".to_owned();
    for i in 0..layers {
        let w = g.weight(
            &format!("W{i}"),
            &[width, width],
            1.0 / (width as f32).sqrt(),
        );
        let b = g.weight(&format!("b{i}"), &[width], 0.1);
        let mm = g.node("MatMul", &[&cur, &w], &format!("mm{i}"), vec![]);
        let add = g.node("Add", &[&mm, &b], &format!("add{i}"), vec![]);
        let out = if i + 1 == layers {
            "Y".to_owned()
        } else {
            format!("h{i}")
        };
        cur = g.node("Relu", &[&add], &out, vec![]);
    }
    g.finish(
        "mlp",
        value_info("X", &[batch, width]),
        value_info("Y", &[batch, width]),
    )
}

/// One dynamically quantized linear layer, as ONNX Runtime's `quantize_dynamic` writes it:
/// `X: f32[m, k]` → DynamicQuantizeLinear (u8, per tensor) → MatMulInteger with constant i8
/// weights `[k, n]` → Cast to f32 → times `x_scale · w_scale` → `Y: f32[m, n]`. The int8
/// GEMM benchmark (GOPS beside ONNX Runtime's MatMulInteger, `scripts/bench.sh`).
pub fn int8_gemm(m: i64, k: i64, n: i64) -> Vec<u8> {
    let mut g = Graph::new(0x9E37_79B9_7F4A_7C15);
    g.int8_weight("Wq", k, n);
    g.inits.push(TensorProto {
        name: "Wzp".into(),
        dims: vec![],
        data_type: data_type::INT8,
        raw_data: vec![0],
        ..Default::default()
    });
    let ws = g.constant("Ws", &[1.0 / (127.0 * (k as f32).sqrt())]);
    g.nodes.push(NodeProto {
        input: vec!["X".into()],
        output: vec!["Xq".into(), "Xs".into(), "Xzp".into()],
        name: "quantize".into(),
        op_type: "DynamicQuantizeLinear".into(),
        ..Default::default()
    });
    let mm = g.node("MatMulInteger", &["Xq", "Wq", "Xzp", "Wzp"], "acc", vec![]);
    let f = g.node(
        "Cast",
        &[&mm],
        "accf",
        vec![int("to", data_type::FLOAT as i64)],
    );
    let scale = g.node("Mul", &["Xs", &ws], "scale", vec![]);
    g.node("Mul", &[&f, &scale], "Y", vec![]);
    g.finish(
        "int8_gemm",
        value_info("X", &[m, k]),
        value_info("Y", &[m, n]),
    )
}

/// One `MatMulInteger` `Y: i32[m, n] = X: u8[m, k] · W: i8[k, n]` (W a constant, no zero
/// points): the int8 row of `nrt bench --gemm`.
pub fn matmul_integer(m: i64, k: i64, n: i64) -> Vec<u8> {
    let mut g = Graph::new(0x6A09_E667_F3BC_C908);
    g.int8_weight("W", k, n);
    g.node("MatMulInteger", &["X", "W"], "Y", vec![]);
    let typed = |name: &str, dims: &[i64], elem: i32| {
        let mut v = value_info(name, dims);
        if let Some(t) = v.r#type.as_mut().and_then(|t| t.tensor_type.as_mut()) {
            t.elem_type = elem;
        }
        v
    };
    g.finish_io(
        "matmul_integer",
        vec![typed("X", &[m, k], data_type::UINT8)],
        vec![typed("Y", &[m, n], data_type::INT32)],
    )
}

/// One step of a streaming LSTM (what voice and audio models run per frame): `X: f32[1, 1,
/// input]` and the state `H0`, `C0: f32[1, 1, hidden]` in, the new state `Yh`, `Yc` out
/// (fed back by the caller as the next step's `H0`, `C0`). The LSTM step benchmark.
pub fn lstm_step(input: i64, hidden: i64) -> Vec<u8> {
    let mut g = Graph::new(0xD1B5_4A32_D192_ED03);
    let sc = 1.0 / (hidden as f32).sqrt();
    g.weight("W", &[1, 4 * hidden, input], sc);
    g.weight("R", &[1, 4 * hidden, hidden], sc);
    g.weight("B", &[1, 8 * hidden], 0.1);
    g.nodes.push(NodeProto {
        input: ["X", "W", "R", "B", "", "H0", "C0"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        output: vec!["".into(), "Yh".into(), "Yc".into()],
        name: "lstm".into(),
        op_type: "LSTM".into(),
        attribute: vec![int("hidden_size", hidden)],
        ..Default::default()
    });
    g.finish_io(
        "lstm_step",
        vec![
            value_info("X", &[1, 1, input]),
            value_info("H0", &[1, 1, hidden]),
            value_info("C0", &[1, 1, hidden]),
        ],
        vec![
            value_info("Yh", &[1, 1, hidden]),
            value_info("Yc", &[1, 1, hidden]),
        ],
    )
}

/// Every sample, by name: what `nrt samples` writes and the test suite checks against
/// ONNX Runtime.
pub fn all() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("transformer", transformer_block(32, 128, 4, 512)),
        ("encoder", transformer_block(128, 256, 4, 1024)),
        ("cnn", small_cnn()),
        ("mlp", mlp(1, 512, 4)),
        ("mlp_b64", mlp(64, 512, 4)),
        ("int8_gemm", int8_gemm(64, 512, 512)),
        ("lstm_step", lstm_step(128, 256)),
    ]
}
