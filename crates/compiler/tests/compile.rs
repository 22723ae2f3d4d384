//! End-to-end tests of the compiler on small models built in code.

mod common;

use common::e2e::*;
use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::AttributeProto;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, ErrorKind, HostTensor, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{Op, decode_block};

fn relu_model() -> Vec<u8> {
    model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    )
}

#[test]
fn tiny_model_compiles_and_validates() {
    let c = ok(&relu_model(), &CompileOptions::default());
    let m = &c.model;
    assert_eq!(m.io.len(), 2);
    let sp = decode_block(&m.block(0, Engine::Sp).unwrap().code, Engine::Sp).unwrap();
    assert!(matches!(
        sp[0].1.op,
        Op::DmaDescriptors(op::DmaDescriptors { count: 1, .. })
    ));
    assert!(sp.iter().any(|(_, i)| matches!(
        i.op,
        Op::Notify(op::Notify {
            subtype: 6,
            sub_id: 7,
            payload: 1
        })
    )));
    assert_eq!(c.report.instructions[0][Engine::Act.index()], 1);
}

#[test]
fn error_unsupported_op_names_the_node() {
    let m = model(
        vec![
            node("Relu", &["X"], &["A"], vec![]),
            node("ImageDecoder", &["A"], &["Y"], vec![]),
        ],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    let s = fails(&m, ErrorKind::UnsupportedOp, Some("ImageDecoder_Y"));
    assert!(s.contains("ImageDecoder"), "{s}");
}

#[test]
fn error_bad_attribute_names_the_node() {
    let m = model(
        vec![node("Softmax", &["X"], &["Y"], vec![a_i("axis", 5)])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    let s = fails(&m, ErrorKind::BadAttribute, Some("Softmax_Y"));
    assert!(s.contains("axis"), "{s}");
    // An attribute of the wrong type.
    let m = model(
        vec![node("LeakyRelu", &["X"], &["Y"], vec![a_s("alpha", "x")])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    fails(&m, ErrorKind::BadAttribute, Some("LeakyRelu_Y"));
}

#[test]
fn error_shape_mismatch_names_the_node() {
    let m = model(
        vec![node("MatMul", &["X", "W"], &["Y"], vec![])],
        vec![f32_init("W", &[4, 2], vec![0.0; 8])],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 2])],
        13,
    );
    let s = fails(&m, ErrorKind::ShapeMismatch, Some("MatMul_Y"));
    assert!(s.contains("3") && s.contains("4"), "{s}");
    let m = model(
        vec![node("Add", &["X", "B"], &["Y"], vec![])],
        vec![f32_init("B", &[4], vec![0.0; 4])],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    fails(&m, ErrorKind::ShapeMismatch, Some("Add_Y"));
}

/// A 3-D Conv decomposes (Pad, Gather, one 2-D Conv); what it cannot take is an error
/// naming the node and the attribute or shape, before any node is replaced.
#[test]
fn conv_3d_errors_name_the_node() {
    let conv = |attrs: Vec<AttributeProto>, w: &[i64], y: &[i64]| {
        let len = w.iter().product::<i64>() as usize;
        model(
            vec![node("Conv", &["X", "W"], &["Y"], attrs)],
            vec![f32_init("W", w, vec![0.1; len])],
            vec![vi("X", dt::FLOAT, &[1, 4, 5, 6, 6])],
            vec![vi("Y", dt::FLOAT, y)],
            17,
        )
    };
    let c = ok(
        &conv(
            vec![a_ints("strides", &[2, 1, 1])],
            &[2, 4, 3, 3, 3],
            &[1, 2, 2, 4, 4],
        ),
        &CompileOptions::default(),
    );
    assert_eq!(c.model.io[1].shape, vec![1, 2, 2, 4, 4]);
    let s = fails(
        &conv(vec![a_i("group", 3)], &[3, 1, 3, 3, 3], &[1, 3, 3, 4, 4]),
        ErrorKind::BadAttribute,
        Some("Conv_Y"),
    );
    assert!(s.contains("group 3"), "{s}");
    let s = fails(
        &conv(vec![], &[2, 3, 3, 3, 3], &[1, 2, 3, 4, 4]),
        ErrorKind::ShapeMismatch,
        Some("Conv_Y"),
    );
    assert!(s.contains("4 input channels"), "{s}");
    let s = fails(
        &conv(
            vec![a_ints("dilations", &[3, 1, 1])],
            &[2, 4, 3, 3, 3],
            &[1, 2, 1, 4, 4],
        ),
        ErrorKind::ShapeMismatch,
        Some("Conv_Y"),
    );
    assert!(s.contains("does not fit"), "{s}");
    let s = fails(
        &conv(
            vec![a_ints("pads", &[1, 1])],
            &[2, 4, 3, 3, 3],
            &[1, 2, 3, 4, 4],
        ),
        ErrorKind::BadAttribute,
        Some("Conv_Y"),
    );
    assert!(s.contains("pads"), "{s}");
    let s = fails(
        &conv(
            vec![a_ints("kernel_shape", &[3, 3, 2])],
            &[2, 4, 3, 3, 3],
            &[1, 2, 3, 4, 4],
        ),
        ErrorKind::ShapeMismatch,
        Some("Conv_Y"),
    );
    assert!(s.contains("kernel_shape"), "{s}");
}

#[test]
fn error_negative_dim() {
    let m = model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, -3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    let s = fails(&m, ErrorKind::BadShape, None);
    assert!(s.contains("negative") && s.contains("'X'"), "{s}");
}

#[test]
fn error_dangling_edge_names_the_node() {
    let m = model(
        vec![node("Add", &["X", "nowhere"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    let s = fails(&m, ErrorKind::DanglingEdge, Some("Add_Y"));
    assert!(s.contains("nowhere"), "{s}");
}

#[test]
fn error_truncated_and_corrupt_files_never_panic() {
    let m = mlp(2, 16, 2);
    for cut in (0..m.len()).step_by(7) {
        if let Err(e) = compile(&m[..cut], None, &CompileOptions::default()) {
            assert!(!e.message.is_empty());
        }
    }
    let e = compile(&m[..m.len() / 2], None, &CompileOptions::default()).expect_err("truncated");
    assert!(
        matches!(e.kind, ErrorKind::Decode | ErrorKind::DanglingEdge),
        "{e}"
    );
    let mut seed = 7u64;
    for _ in 0..400 {
        let mut b = m.clone();
        for _ in 0..4 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let i = (seed >> 33) as usize % b.len();
            b[i] ^= (seed >> 20) as u8 | 1;
        }
        if let Ok(c) = compile(&b, None, &CompileOptions::default()) {
            check_ordering(&c.model).unwrap();
        }
    }
    let e = compile(b"definitely not protobuf", None, &CompileOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Decode);
}

#[test]
fn symbolic_dims_bind_from_input_shapes() {
    let m = model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[-1, 3])],
        vec![vi("Y", dt::FLOAT, &[-1, 3])],
        13,
    );
    let e = compile(&m, None, &CompileOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadShape);
    assert!(e.message.contains("batch"), "{e}");
    let mut o = CompileOptions::default();
    o.input_shapes.insert("X".into(), vec![5, 3]);
    let c = ok(&m, &o);
    assert_eq!(c.model.io[0].shape, vec![5, 3]);
    assert_eq!(c.model.io[1].shape, vec![5, 3]);
    o.input_shapes.insert("X".into(), vec![5, 4]);
    assert_eq!(
        compile(&m, None, &o).unwrap_err().kind,
        ErrorKind::ShapeMismatch
    );
}

/// A literal `-1` dimension (a common exporter habit; ONNX Runtime reads it as unknown) is a
/// symbolic dimension: fixed by `input_shapes`, and without them the error names the input,
/// the axis and how to fix it (it used to say "declares negative dimension -1").
#[test]
fn minus_one_dims_are_symbolic() {
    let mut x = vi("X", dt::FLOAT, &[2, 3]);
    let mut y = vi("Y", dt::FLOAT, &[2, 3]);
    for v in [&mut x, &mut y] {
        let shape = v.r#type.as_mut().unwrap().tensor_type.as_mut().unwrap();
        shape.shape.as_mut().unwrap().dim[0].dim_value = Some(-1);
    }
    let m = model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![x],
        vec![y],
        13,
    );
    let e = compile(&m, None, &CompileOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::BadShape);
    for needle in ["'X'", "unknown dimension -1 at axis 0", "input_shapes"] {
        assert!(e.message.contains(needle), "{needle}: {e}");
    }
    // Named for the front ends to say how their users give it; no CLI flag in the text.
    assert_eq!(e.needs_shape_of.as_deref(), Some("X"));
    assert!(!e.to_string().contains("--"), "{e}");
    let mut o = CompileOptions::default();
    o.input_shapes.insert("X".into(), vec![7, 3]);
    let c = ok(&m, &o);
    assert_eq!(c.model.io[0].shape, vec![7, 3]);
    assert_eq!(c.model.io[1].shape, vec![7, 3]);
}

/// Opsets 26 and 27 (onnx 1.22) compile: they changed no supported operator; 28 is refused
/// naming the range.
#[test]
fn opsets_up_to_27_are_accepted() {
    for opset in [7, 22, 25, 26, 27] {
        let m = model(
            vec![node("Relu", &["X"], &["Y"], vec![])],
            vec![],
            vec![vi("X", dt::FLOAT, &[2, 3])],
            vec![vi("Y", dt::FLOAT, &[2, 3])],
            opset,
        );
        ok(&m, &CompileOptions::default());
    }
    let m = model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        28,
    );
    let e = compile(&m, None, &CompileOptions::default()).unwrap_err();
    assert!(e.message.contains("27"), "{e}");
}

/// Shape arithmetic folds: Shape → Gather → Unsqueeze → Concat → Reshape.
#[test]
fn shape_subgraph_folds() {
    let m = model(
        vec![
            node("Shape", &["X"], &["s"], vec![]),
            node("Gather", &["s", "zero"], &["d0"], vec![a_i("axis", 0)]),
            node("Unsqueeze", &["d0", "ax0"], &["d0u"], vec![]),
            node(
                "Concat",
                &["d0u", "minus1"],
                &["shape"],
                vec![a_i("axis", 0)],
            ),
            node("Reshape", &["X", "shape"], &["r"], vec![]),
            node("Relu", &["r"], &["Y"], vec![]),
        ],
        vec![
            i64_init("zero", &[], vec![0]),
            i64_init("ax0", &[1], vec![0]),
            i64_init("minus1", &[1], vec![-1]),
        ],
        vec![vi("X", dt::FLOAT, &[2, 3, 4])],
        vec![vi("Y", dt::FLOAT, &[2, 12])],
        13,
    );
    let c = ok(&m, &CompileOptions::default());
    assert_eq!(c.model.io[1].shape, vec![2, 12]);
    assert_eq!(c.report.nodes.1, 4, "{}", c.report);
    assert_eq!(
        c.report.nodes.2, 2,
        "a Reshape alias and the Relu: {}",
        c.report
    );
    assert_eq!(c.report.instructions[0][Engine::Act.index()], 1);
    // Inference through the graph API too.
    let mut g = nrt_compiler::graph::import(&m, None, &CompileOptions::default()).unwrap();
    nrt_compiler::infer::infer(&mut g).unwrap();
    let s = g.values.iter().find(|v| v.name == "shape").unwrap();
    assert_eq!(s.konst.as_ref().unwrap().to_i64s(), vec![2, -1]);
}

/// Weight dequantization folds: int8 initializer → Cast → Mul(scale) → MatMul.
#[test]
fn dequantization_folds_into_one_constant() {
    let w = nrt_compiler::onnx::TensorProto {
        name: "Wq".into(),
        dims: vec![4, 4],
        data_type: dt::INT8,
        int32_data: (0..16).map(|i| i - 8).collect(),
        ..Default::default()
    };
    let m = model(
        vec![
            node("Cast", &["Wq"], &["Wf"], vec![a_i("to", dt::FLOAT as i64)]),
            node("Mul", &["Wf", "scale"], &["W"], vec![]),
            node("MatMul", &["X", "W"], &["Y"], vec![]),
        ],
        vec![w, f32_init("scale", &[], vec![0.5])],
        vec![vi("X", dt::FLOAT, &[1, 4])],
        vec![vi("Y", dt::FLOAT, &[1, 4])],
        13,
    );
    let c = ok(&m, &CompileOptions::default());
    assert_eq!(c.report.nodes, (3, 2, 1));
    let w: Vec<f32> = c.model.constants[..64]
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(w[0], -4.0);
    assert_eq!(w[15], 3.5);
}

#[test]
fn input_values_specialize_shape_inputs() {
    let m = model(
        vec![
            node("Reshape", &["X", "S"], &["r"], vec![]),
            node("Relu", &["r"], &["Y"], vec![]),
        ],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 6]), vi("S", dt::INT64, &[2])],
        vec![vi("Y", dt::FLOAT, &[3, 4])],
        13,
    );
    let e = compile(&m, None, &CompileOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnsupportedOp);
    assert!(e.message.contains("input_values"), "{e}");
    let mut o = CompileOptions::default();
    o.input_values
        .insert("S".into(), HostTensor::i64(vec![2], vec![3, 4]));
    let c = ok(&m, &o);
    assert_eq!(c.report.specialized_inputs, vec!["S".to_string()]);
    assert_eq!(c.model.io.len(), 2);
    assert_eq!(c.model.io[1].shape, vec![3, 4]);
}

/// Half-precision tensors through f32-only operators (issue 13): a float16 MatMul and Conv
/// compile (widened to f32 around the operator, `src/widen.rs`), their I/O stay float16, and
/// the PE computes in f32. The values are checked against ONNX Runtime by the numerics models
/// (`tests/numerics/make_models.py`, `halves`).
#[test]
fn half_tensors_through_f32_only_operators() {
    for elem in [dt::FLOAT16, dt::BFLOAT16] {
        let bytes = model(
            vec![
                node("MatMul", &["X", "W"], &["h"], vec![]),
                node("Relu", &["h"], &["Y"], vec![]),
            ],
            vec![],
            vec![vi("X", elem, &[2, 8]), vi("W", elem, &[8, 4])],
            vec![vi("Y", elem, &[2, 4])],
            13,
        );
        let c = ok(&bytes, &CompileOptions::default());
        let want = if elem == dt::FLOAT16 {
            nrt_hal::DType::F16
        } else {
            nrt_hal::DType::Bf16
        };
        assert!(
            c.model.io.iter().all(|t| t.dtype == want),
            "{:?}",
            c.model.io
        );
        let pe = decode_block(&c.model.block(0, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
        assert!(pe.iter().any(|(_, i)| matches!(i.op, Op::MatMul(_))));
    }
}

/// A causal Attention whose [q_seq, total_seq] mask would be too large to build is refused
/// with the size error naming the node, before anything of that size is allocated.
#[test]
fn a_causal_attention_too_large_for_its_mask_is_refused() {
    let bytes = model(
        vec![node(
            "Attention",
            &["Q", "K", "V"],
            &["Y"],
            vec![a_i("is_causal", 1)],
        )],
        vec![],
        vec![
            vi("Q", dt::FLOAT, &[1, 1, 200_000, 1]),
            vi("K", dt::FLOAT, &[1, 1, 200_000, 1]),
            vi("V", dt::FLOAT, &[1, 1, 200_000, 1]),
        ],
        vec![vi("Y", dt::FLOAT, &[1, 1, 200_000, 1])],
        23,
    );
    let msg = fails(&bytes, ErrorKind::TooLarge, Some("Attention_Y"));
    assert!(msg.contains("causal mask"), "{msg}");
}

/// A value that must be known at compile time and is not: the error names the graph inputs
/// it depends on (walking its producers back), not the others, and binding exactly those
/// compiles the model.
#[test]
fn a_range_computed_from_inputs_names_the_inputs_it_needs() {
    let bytes = model(
        vec![
            node("Add", &["l", "one"], &["l1"], vec![]),
            node("Range", &["s", "l1", "delta"], &["r"], vec![]),
            node("Relu", &["x"], &["y"], vec![]),
        ],
        vec![
            f32_init("one", &[], vec![1.0]),
            f32_init("delta", &[], vec![0.5]),
        ],
        vec![
            vi("x", dt::FLOAT, &[3]),
            vi("s", dt::FLOAT, &[]),
            vi("l", dt::FLOAT, &[]),
        ],
        vec![vi("r", dt::FLOAT, &[4]), vi("y", dt::FLOAT, &[3])],
        13,
    );
    let e = compile(&bytes, None, &CompileOptions::default()).expect_err("needs values");
    assert_eq!(e.kind, ErrorKind::UnsupportedOp, "{e}");
    assert_eq!(e.needs_inputs, ["s", "l"], "{e}");
    assert!(e.to_string().contains("s, l"), "{e}");
    let mut o = CompileOptions::default();
    o.input_values
        .insert("s".into(), HostTensor::f32(vec![], vec![0.0]));
    o.input_values
        .insert("l".into(), HostTensor::f32(vec![], vec![1.0]));
    let c = ok(&bytes, &o);
    let r = c.model.outputs().find(|(_, t)| t.name == "r").expect("r").1;
    assert_eq!(r.shape, [4]); // 0, 0.5, 1, 1.5
    assert_eq!(c.report.specialized_inputs, ["s", "l"]);
}

/// DynamicQuantizeLinear is one POOL `DynamicQuantize` (NCM 1.8), not the eight passes of
/// reductions and elementwise instructions it took before; a strided (transposed) input is
/// copied dense first. Unused scale and zero-point outputs still get their instruction
/// operands (temporaries).
#[test]
fn dynamic_quantize_linear_is_one_instruction() {
    let build = |transposed: bool| {
        let mut nodes = Vec::new();
        let x = if transposed {
            nodes.push(node(
                "Transpose",
                &["X"],
                &["xt"],
                vec![a_ints("perm", &[1, 0])],
            ));
            "xt"
        } else {
            "X"
        };
        nodes.push(node("DynamicQuantizeLinear", &[x], &["Y", "S", ""], vec![]));
        model(
            nodes,
            vec![],
            vec![vi("X", dt::FLOAT, &[24, 40])],
            vec![
                vi(
                    "Y",
                    dt::UINT8,
                    &[
                        if transposed { 40 } else { 24 },
                        if transposed { 24 } else { 40 },
                    ],
                ),
                vi("S", dt::FLOAT, &[]),
            ],
            17,
        )
    };
    for transposed in [false, true] {
        let c = ok(&build(transposed), &CompileOptions::default());
        let ops = |e: Engine| {
            decode_block(&c.model.block(0, e).unwrap().code, e)
                .unwrap()
                .into_iter()
                .map(|(_, i)| i.op)
                .filter(|op| !matches!(op, Op::End(op::End) | Op::Nop(op::Nop)))
                .collect::<Vec<_>>()
        };
        let (pool, dve) = (ops(Engine::Pool), ops(Engine::Dve));
        let quantize: Vec<_> = pool
            .iter()
            .filter(|op| matches!(op, Op::DynamicQuantize(_)))
            .collect();
        assert_eq!(quantize.len(), 1, "{pool:?}");
        let Op::DynamicQuantize(op::DynamicQuantize { input, output, .. }) = quantize[0] else {
            unreachable!()
        };
        assert_eq!(input.elements(), 24 * 40);
        assert_eq!(input.stride[3], 1);
        assert_eq!(output.elements(), 24 * 40);
        // Nothing else but the transposing copy (on POOL or DVE), only when transposed.
        let others: Vec<_> = pool
            .iter()
            .chain(&dve)
            .filter(|op| !matches!(op, Op::DynamicQuantize(_)))
            .collect();
        assert_eq!(others.len(), transposed as usize, "{others:?}");
        assert!(others.iter().all(|op| matches!(op, Op::Copy(_))));
        assert!(ops(Engine::Act).is_empty());
    }
}

/// Elementwise operators on 0-d tensors: their constants (`[1]`) broadcast down to the
/// scalar's `[]`. `Not` of a scalar condition (as `If` models compute one) overflowed the
/// broadcast's rank arithmetic (found by the `compile_onnx` fuzz target).
#[test]
fn elementwise_operators_on_scalars_compile() {
    for (op, elem) in [("Not", dt::BOOL), ("Relu", dt::FLOAT), ("Neg", dt::FLOAT)] {
        let m = model(
            vec![node(op, &["X"], &["Y"], vec![])],
            vec![],
            vec![vi("X", elem, &[])],
            vec![vi("Y", elem, &[])],
            17,
        );
        ok(&m, &CompileOptions::default());
    }
}
