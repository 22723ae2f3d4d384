//! End-to-end tests of the compiler on small models built in code.

mod common;

use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::onnx::{AttributeProto, GraphProto, NodeProto, attribute_type};
use nrt_compiler::{CompileOptions, Compiled, ErrorKind, HostTensor, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{Op, decode_block};
use nrt_model::CompiledModel;

fn ok(bytes: &[u8], opts: &CompileOptions) -> Compiled {
    let c = compile(bytes, None, opts).unwrap_or_else(|e| panic!("{e}"));
    let back = CompiledModel::decode(&c.model.encode()).expect("round trip");
    assert_eq!(back, c.model);
    check_ordering(&c.model).unwrap_or_else(|e| panic!("ordering: {e}"));
    c
}

fn fails(bytes: &[u8], kind: ErrorKind, node: Option<&str>) -> String {
    let e = compile(bytes, None, &CompileOptions::default()).expect_err("should fail");
    assert_eq!(e.kind, kind, "{e}");
    if let Some(n) = node {
        let r = e.node.as_ref().unwrap_or_else(|| panic!("no node in {e}"));
        assert_eq!(r.name, n, "{e}");
        assert!(e.to_string().contains(n));
    }
    e.to_string()
}

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
    for needle in ["'X'", "unknown dimension -1 at axis 0", "--input-shape X="] {
        assert!(e.message.contains(needle), "{needle}: {e}");
    }
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

#[test]
fn bias_add_and_relu_fuse_into_the_matmul_epilogue() {
    let c = ok(&mlp(1, 32, 3), &CompileOptions::default());
    let i = &c.report.instructions[0];
    assert_eq!(i[Engine::Pe.index()], 3, "{}", c.report);
    // Three MatMuls, each with its bias and Relu; no ACT or DVE pass.
    let pe = decode_block(&c.model.block(0, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
    let fused = pe
        .iter()
        .filter(|(_, x)| {
            matches!(x.op, Op::MatMul(op::MatMul { epilogue, .. })
                if epilogue.func == nrt_isa::ActFunc::Relu && epilogue.bias.is_some())
        })
        .count();
    assert_eq!(fused, 3);
    assert_eq!(i[Engine::Act.index()], 0, "{}", c.report);
    assert_eq!(i[Engine::Dve.index()], 0, "{}", c.report);
}

#[test]
fn planner_reuses_memory_on_a_chain() {
    let c = ok(&mlp(4, 64, 6), &CompileOptions::default());
    let r = &c.report;
    assert!(r.arena_bytes >= r.live_bytes_lower_bound);
    assert!(r.arena_ratio() <= 1.10, "{r}");
    // 5 intermediates of 1 KiB, at most two live at a time.
    assert!(r.arena_bytes <= 2 * 4 * 64 * 4, "{r}");
}

#[test]
fn first_output_is_notified_before_the_last_is_computed() {
    // Y1 = Relu(X) is ready at once; Y2 needs a chain of matmuls.
    let mut nodes = vec![node("Relu", &["X"], &["Y1"], vec![])];
    let mut cur = "X".to_string();
    for i in 0..4 {
        let o = if i == 3 {
            "Y2".to_string()
        } else {
            format!("t{i}")
        };
        nodes.push(node("MatMul", &[&cur, "W"], &[&o], vec![]));
        cur = o;
    }
    let m = model(
        nodes,
        vec![f32_init("W", &[8, 8], ramp(64, 0.01))],
        vec![vi("X", dt::FLOAT, &[8, 8])],
        vec![vi("Y1", dt::FLOAT, &[8, 8]), vi("Y2", dt::FLOAT, &[8, 8])],
        13,
    );
    let c = ok(&m, &CompileOptions::default());
    let sp = decode_block(&c.model.block(0, Engine::Sp).unwrap().code, Engine::Sp).unwrap();
    let pos = |v: u32| {
        sp.iter()
            .position(
                |(_, i)| matches!(i.op, Op::Notify(op::Notify { payload, .. }) if payload == v),
            )
            .unwrap()
    };
    assert!(pos(1) < pos(2));
    // The store of Y1 waits only for the ACT engine, not for the matmul chain.
    let before: Vec<_> = sp[..pos(1)]
        .iter()
        .filter_map(|(_, i)| i.sync.wait)
        .collect();
    let pe_sem = nrt_compiler::schedule::progress_semaphore(Engine::Pe);
    assert!(before.iter().all(|(s, _)| *s != pe_sem), "{before:?}");
}

#[test]
fn two_cores_split_matmuls() {
    let o = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    let c = ok(&mlp(2, 64, 3), &o);
    assert_eq!(c.model.sg_count, 2);
    assert_eq!(c.model.blocks.len(), 10);
    assert_eq!(
        c.report.instructions[0][Engine::Pe.index()],
        3 + c.report.instructions[0][0] - 3
    );
    let pe1 = decode_block(&c.model.block(1, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
    assert_eq!(
        pe1.iter()
            .filter(|(_, i)| matches!(i.op, Op::MatMul(_)))
            .count(),
        3
    );
}

/// The time the compiled model takes when every MatMul costs one unit and everything else
/// nothing, each engine of each core running its block in order and waiting on its
/// semaphores — the length of the critical path the synchronization allows.
fn matmul_makespan(m: &CompiledModel) -> u32 {
    use std::collections::HashMap;
    let blocks: Vec<Vec<nrt_isa::Instruction>> = m
        .blocks
        .iter()
        .map(|b| {
            decode_block(&b.code, b.engine)
                .unwrap()
                .into_iter()
                .map(|(_, i)| i)
                .collect()
        })
        .collect();
    let key =
        |core: u8, s: nrt_isa::SemRef| (if s.is_global() { u8::MAX } else { core }, s.index());
    // Per semaphore: the time of each signal, in its (single) signaling stream's order.
    let mut signals: HashMap<(u8, u16), Vec<(u32, u32)>> = HashMap::new();
    let mut pc = vec![0usize; blocks.len()];
    let mut clock = vec![0u32; blocks.len()];
    loop {
        let mut moved = false;
        for (b, block) in blocks.iter().enumerate() {
            let core = m.blocks[b].core;
            while let Some(ins) = block.get(pc[b]) {
                let mut start = clock[b];
                if let Some((sem, v)) = ins.sync.wait {
                    let hist = signals.get(&key(core, sem)).map_or(&[][..], |h| &h[..]);
                    match hist.iter().find(|&&(_, count)| count >= v) {
                        Some(&(t, _)) => start = start.max(t),
                        None => break,
                    }
                }
                assert!(!matches!(ins.op, Op::SemSet(_) | Op::Barrier(_)));
                let end = start + u32::from(matches!(ins.op, Op::MatMul(_)));
                if let Some((sem, v)) = ins.sync.signal {
                    let h = signals.entry(key(core, sem)).or_default();
                    let count = h.last().map_or(0, |&(_, c)| c) + v;
                    h.push((end, count));
                }
                clock[b] = end;
                pc[b] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    assert!(
        pc.iter().zip(&blocks).all(|(&p, b)| p == b.len()),
        "the blocks deadlock"
    );
    clock.into_iter().max().unwrap()
}

/// The two halves of each layer of a split MLP run at the same time: each core's MatMul of
/// layer `i` waits for both halves of layer `i − 1` and nothing later. (When a cross-core
/// wait was published at the producer's end of stream instead of right after the producing
/// instruction, core 1's layer 2 waited for core 0's layer 2 — the two cores alternated and
/// a 2-core `mlp_b64` ran slower than on one core; and before column blocks were told apart
/// from overlapping ranges, the halves' writes were ordered against each other.)
#[test]
fn two_cores_run_the_halves_of_each_layer_in_parallel() {
    for layers in [1, 2, 4] {
        let one = ok(&mlp(64, 64, layers), &CompileOptions::default());
        let two = ok(
            &mlp(64, 64, layers),
            &CompileOptions {
                cores: 2,
                ..Default::default()
            },
        );
        check_ordering(&two.model).unwrap();
        assert_eq!(matmul_makespan(&one.model), layers as u32);
        assert_eq!(
            matmul_makespan(&two.model),
            layers as u32,
            "{layers} layers on 2 cores"
        );
    }
}

/// The same for batched products (attention's scores and context, all heads in one
/// instruction): each core's half of every head is a block of columns inside each head, which
/// only a row-by-row comparison tells apart from the other core's.
#[test]
fn two_cores_run_the_halves_of_batched_products_in_parallel() {
    let (h, s, d) = (4i64, 128i64, 64i64);
    let m = model(
        vec![
            node("MatMul", &["X", "W1"], &["t"], vec![]),
            node("MatMul", &["t", "W2"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W1", &[h, d, s], ramp((h * d * s) as usize, 0.01)),
            f32_init("W2", &[h, s, d], ramp((h * s * d) as usize, 0.02)),
        ],
        vec![vi("X", dt::FLOAT, &[h, s, d])],
        vec![vi("Y", dt::FLOAT, &[h, s, d])],
        17,
    );
    let two = ok(
        &m,
        &CompileOptions {
            cores: 2,
            ..Default::default()
        },
    );
    check_ordering(&two.model).unwrap();
    assert_eq!(matmul_makespan(&two.model), 2);
    // Split by the batch (the heads), not by N: each core multiplies whole [s, d] matrices
    // of half the heads (an N split left 32-column products).
    for core in 0..2u8 {
        let pe =
            decode_block(&two.model.block(core, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
        let shapes: Vec<[u32; 4]> = pe
            .iter()
            .filter_map(|(_, i)| match i.op {
                Op::MatMul(op::MatMul { c, .. }) => Some(c.shape),
                _ => None,
            })
            .collect();
        assert_eq!(shapes.len(), 2, "core {core}: {shapes:?}");
        for (sh, n) in shapes.iter().zip([s, d]) {
            assert_eq!(sh[1] as i64 * 2, h, "core {core}: {sh:?}");
            assert_eq!(sh[3] as i64, n, "core {core}: {sh:?}");
        }
    }
}

/// Softmax and layer normalization, large enough, are split by rows between two cores
/// (each core's POOL block has one of each); small ones stay on core 0.
#[test]
fn two_cores_split_row_operations() {
    let row_ops = |rows: i64| {
        model(
            vec![
                node("Softmax", &["X"], &["s"], vec![a_i("axis", -1)]),
                node(
                    "LayerNormalization",
                    &["s", "g", "b"],
                    &["Y"],
                    vec![a_i("axis", -1)],
                ),
            ],
            vec![
                f32_init("g", &[128], ramp(128, 0.01)),
                f32_init("b", &[128], ramp(128, 0.02)),
            ],
            vec![vi("X", dt::FLOAT, &[rows, 128])],
            vec![vi("Y", dt::FLOAT, &[rows, 128])],
            17,
        )
    };
    let two = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    let count = |c: &Compiled, core: u8| {
        let pool = decode_block(
            &c.model.block(core, Engine::Pool).unwrap().code,
            Engine::Pool,
        )
        .unwrap();
        (
            pool.iter()
                .filter(|(_, i)| matches!(i.op, Op::Softmax(_)))
                .count(),
            pool.iter()
                .filter(|(_, i)| matches!(i.op, Op::LayerNorm(_)))
                .count(),
        )
    };
    let big = ok(&row_ops(512), &two);
    check_ordering(&big.model).unwrap();
    assert_eq!((count(&big, 0), count(&big, 1)), ((1, 1), (1, 1)));
    let small = ok(&row_ops(4), &two);
    assert_eq!((count(&small, 0), count(&small, 1)), ((1, 1), (0, 0)));
}

#[test]
fn ops_lower_and_order_correctly() {
    // A graph touching many lowering paths at once.
    let nodes = vec![
        node(
            "Transpose",
            &["X"],
            &["xt"],
            vec![a_ints("perm", &[0, 2, 1, 3])],
        ),
        node("Softmax", &["xt"], &["sm"], vec![a_i("axis", 2)]),
        node(
            "LayerNormalization",
            &["sm", "g", "b"],
            &["ln"],
            vec![a_i("axis", -1)],
        ),
        node(
            "ReduceMean",
            &["ln", "axes"],
            &["rm"],
            vec![a_i("keepdims", 1)],
        ),
        node("Sub", &["ln", "rm"], &["d"], vec![]),
        node("Pad", &["d", "pads"], &["p"], vec![a_s("mode", "reflect")]),
        node(
            "Slice",
            &["p", "st", "en", "sax", "ssteps"],
            &["sl"],
            vec![],
        ),
        node("Concat", &["sl", "sl"], &["cc"], vec![a_i("axis", 1)]),
        node(
            "Conv",
            &["cc", "cw", "cb"],
            &["cv"],
            vec![a_ints("pads", &[1, 1, 1, 1])],
        ),
        node(
            "MaxPool",
            &["cv"],
            &["mp"],
            vec![a_ints("kernel_shape", &[2, 2]), a_i("ceil_mode", 1)],
        ),
        node(
            "AveragePool",
            &["cv"],
            &["ap"],
            vec![
                a_ints("kernel_shape", &[3, 3]),
                a_ints("strides", &[2, 2]),
                a_ints("pads", &[1, 1, 1, 1]),
                a_i("ceil_mode", 1),
                a_i("count_include_pad", 1),
            ],
        ),
        node("GlobalAveragePool", &["mp"], &["gp"], vec![]),
        node(
            "Resize",
            &["ap", "", "scales"],
            &["rs"],
            vec![a_s("mode", "linear")],
        ),
        node("Flatten", &["rs"], &["fl"], vec![]),
        node("Gather", &["fl", "idx"], &["ga"], vec![a_i("axis", 1)]),
        node("Where", &["cond", "ga", "zero"], &["Y"], vec![]),
        node(
            "ConvTranspose",
            &["cv", "tw"],
            &["Y2"],
            vec![a_ints("strides", &[2, 2])],
        ),
    ];
    let inits = vec![
        f32_init("g", &[5], ramp(5, 0.1)),
        f32_init("b", &[5], ramp(5, 0.05)),
        i64_init("axes", &[1], vec![-1]),
        i64_init("pads", &[8], vec![0, 0, 1, 1, 0, 0, 1, 1]),
        i64_init("st", &[2], vec![1, 0]),
        i64_init("en", &[2], vec![100, -1]),
        i64_init("sax", &[2], vec![2, 3]),
        i64_init("ssteps", &[2], vec![1, 1]),
        f32_init("cw", &[4, 6, 3, 3], ramp(216, 0.01)),
        f32_init("cb", &[4], ramp(4, 0.1)),
        f32_init("scales", &[4], vec![1.0, 1.0, 2.0, 2.0]),
        i64_init("idx", &[3], vec![0, -1, 5]),
        f32_init("zero", &[], vec![0.0]),
        f32_init("tw", &[4, 2, 3, 3], ramp(72, 0.01)),
    ];
    let m = model(
        nodes,
        inits,
        vec![
            vi("X", dt::FLOAT, &[1, 4, 3, 5]),
            vi("cond", dt::BOOL, &[1, 3]),
        ],
        vec![
            vi("Y", dt::FLOAT, &[1, 3]),
            vi("Y2", dt::FLOAT, &[1, 2, 11, 13]),
        ],
        18,
    );
    let c = ok(&m, &CompileOptions::default());
    assert_eq!(c.model.io[3].shape, vec![1, 2, 11, 13]);
    let o = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    ok(&m, &o);
}

/// Rewrites the instructions of one block (same sizes, so relocations stay valid).
fn edit_block(m: &mut CompiledModel, engine: Engine, f: impl Fn(&mut nrt_isa::Instruction)) {
    let b = m
        .blocks
        .iter_mut()
        .find(|b| b.core == 0 && b.engine == engine)
        .unwrap();
    let mut code = Vec::new();
    for (_, mut ins) in decode_block(&b.code, engine).unwrap() {
        f(&mut ins);
        ins.encode(&mut code);
    }
    b.code = code;
}

#[test]
fn checker_rejects_missing_waits_and_deadlocks() {
    let c = ok(&mlp(1, 16, 2), &CompileOptions::default());
    let mut racy = c.model.clone();
    // PE's MatMuls then no longer wait for the input's DMA.
    edit_block(&mut racy, Engine::Pe, |i| i.sync.wait = None);
    let e = check_ordering(&racy).unwrap_err();
    assert!(e.contains("unordered hazard"), "{e}");
    let mut stuck = c.model.clone();
    edit_block(&mut stuck, Engine::Pe, |i| {
        if let Some((s, v)) = i.sync.wait {
            i.sync.wait = Some((s, v + 100));
        }
    });
    let e = check_ordering(&stuck).unwrap_err();
    assert!(e.contains("never reached") || e.contains("deadlock"), "{e}");
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

/// An `If` on a condition known only at run time keeps both branches, predicated: on ACT
/// the then-branch's Relu runs behind `Guard(cond, true)`, the else-branch's Neg behind
/// `Guard(cond, false)`, and DVE selects the output; the same model with the condition given
/// at compile time folds to one branch, with no guard.
#[test]
fn if_on_a_run_time_condition_is_predicated_and_a_constant_one_folds() {
    use prost::Message;
    let branch = |name: &str, op: &str| {
        let g = GraphProto {
            node: vec![node(op, &["X"], &[name], vec![])],
            name: name.into(),
            output: vec![vi(name, dt::FLOAT, &[2, 3])],
            ..Default::default()
        };
        AttributeProto {
            name: if op == "Relu" {
                "then_branch"
            } else {
                "else_branch"
            }
            .into(),
            r#type: attribute_type::GRAPH,
            g: Some(g.encode_to_vec()),
            ..Default::default()
        }
    };
    let bytes = model(
        vec![node(
            "If",
            &["cond"],
            &["Y"],
            vec![branch("yt", "Relu"), branch("ye", "Neg")],
        )],
        vec![],
        vec![vi("cond", dt::BOOL, &[]), vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    let c = ok(&bytes, &CompileOptions::default());
    let act = decode_block(&c.model.block(0, Engine::Act).unwrap().code, Engine::Act).unwrap();
    let seq: Vec<String> = act
        .iter()
        .filter_map(|(_, i)| match i.op {
            Op::Guard(op::Guard { cond, when }) => {
                Some(format!("guard {}{when}", cond.is_some() as u8))
            }
            Op::Activation(op::Activation { func, .. }) => Some(format!("{func:?}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        seq,
        ["guard 1true", "Relu", "guard 1false", "Neg"],
        "{seq:?}"
    );
    let dve = decode_block(&c.model.block(0, Engine::Dve).unwrap().code, Engine::Dve).unwrap();
    assert!(dve.iter().any(|(_, i)| matches!(i.op, Op::Select(_))));
    assert!(!dve.iter().any(|(_, i)| matches!(i.op, Op::Guard(_))));
    check_ordering(&c.model).unwrap();
    for (v, want) in [(1, nrt_isa::ActFunc::Relu), (0, nrt_isa::ActFunc::Neg)] {
        let mut o = CompileOptions::default();
        o.input_values.insert(
            "cond".into(),
            HostTensor::ints(nrt_hal::DType::Bool, vec![], vec![v]),
        );
        let c = ok(&bytes, &o);
        let code = &c.model.block(0, Engine::Act).unwrap().code;
        let funcs: Vec<_> = decode_block(code, Engine::Act)
            .unwrap()
            .iter()
            .filter_map(|(_, i)| match i.op {
                Op::Activation(op::Activation { func, .. }) => Some(func),
                _ => None,
            })
            .collect();
        assert_eq!(funcs, [want], "cond {v}");
        assert!(
            !decode_block(code, Engine::Act)
                .unwrap()
                .iter()
                .any(|(_, i)| matches!(i.op, Op::Guard(_)))
        );
    }
}

/// With a run-time condition both branches must give an output the same static shape: an
/// `If` whose branches disagree is an error naming it, the output and both shapes.
#[test]
fn run_time_if_with_branches_of_different_shapes_is_refused() {
    use prost::Message;
    let branch = |attr: &str, nodes: Vec<NodeProto>, out: &str| {
        let g = GraphProto {
            node: nodes,
            name: attr.into(),
            output: vec![vi(out, dt::FLOAT, &[])],
            ..Default::default()
        };
        AttributeProto {
            name: attr.into(),
            r#type: attribute_type::GRAPH,
            g: Some(g.encode_to_vec()),
            ..Default::default()
        }
    };
    let bytes = model(
        vec![node(
            "If",
            &["cond"],
            &["Y"],
            vec![
                branch(
                    "then_branch",
                    vec![node("Relu", &["X"], &["a"], vec![])],
                    "a",
                ),
                branch(
                    "else_branch",
                    vec![node("ReduceSum", &["X"], &["b"], vec![a_i("keepdims", 1)])],
                    "b",
                ),
            ],
        )],
        vec![],
        vec![vi("cond", dt::BOOL, &[]), vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::FLOAT, &[2, 3])],
        13,
    );
    let msg = fails(&bytes, ErrorKind::ShapeMismatch, Some("If_Y"));
    assert!(
        msg.contains("then_branch") && msg.contains("[2, 3]") && msg.contains("[1, 1]"),
        "{msg}"
    );
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

/// `Loop` body: `(i, cond, acc) -> (cond, acc + x·i, acc)` reading the outer `x`.
fn loop_model(cond_from_input: bool) -> Vec<u8> {
    use prost::Message;
    let body = GraphProto {
        name: "body".into(),
        node: vec![
            node("Cast", &["i"], &["fi"], vec![a_i("to", dt::FLOAT as i64)]),
            node("Mul", &["x", "fi"], &["xi"], vec![]),
            node("Add", &["acc", "xi"], &["acc_out"], vec![]),
            node("Identity", &["acc"], &["scan"], vec![]),
            if cond_from_input {
                // The condition is computed from a run-time value.
                node("ReduceMax", &["acc_out"], &["m"], vec![a_i("keepdims", 0)])
            } else {
                node("Identity", &["c"], &["m0"], vec![])
            },
            if cond_from_input {
                node("Less", &["m", "ten"], &["c_out"], vec![])
            } else {
                node("Identity", &["m0"], &["c_out"], vec![])
            },
        ],
        initializer: vec![f32_init("ten", &[], vec![10.0])],
        input: vec![
            vi("i", dt::INT64, &[]),
            vi("c", dt::BOOL, &[]),
            vi("acc", dt::FLOAT, &[2]),
        ],
        output: vec![
            vi("c_out", dt::BOOL, &[]),
            vi("acc_out", dt::FLOAT, &[2]),
            vi("scan", dt::FLOAT, &[2]),
        ],
        ..Default::default()
    };
    model(
        vec![node(
            "Loop",
            &["M", "cond", "acc0"],
            &["acc", "scans"],
            vec![AttributeProto {
                name: "body".into(),
                r#type: attribute_type::GRAPH,
                g: Some(body.encode_to_vec()),
                ..Default::default()
            }],
        )],
        vec![],
        vec![
            vi("M", dt::INT64, &[]),
            vi("cond", dt::BOOL, &[]),
            vi("acc0", dt::FLOAT, &[2]),
            vi("x", dt::FLOAT, &[2]),
        ],
        vec![vi("acc", dt::FLOAT, &[2]), vi("scans", dt::FLOAT, &[3, 2])],
        13,
    )
}

fn loop_values(m: i64) -> CompileOptions {
    let mut o = CompileOptions::default();
    o.input_values.insert(
        "M".into(),
        HostTensor::ints(nrt_hal::DType::I64, vec![], vec![m]),
    );
    o.input_values.insert(
        "cond".into(),
        HostTensor::ints(nrt_hal::DType::Bool, vec![], vec![1]),
    );
    o
}

/// A Loop with a run-time trip count is an error naming the node and the input; with its
/// value it unrolls, the body reading the outer `x` and stacking its scan output.
#[test]
fn a_loop_unrolls_over_a_compile_time_trip_count() {
    let bytes = loop_model(false);
    let msg = fails(&bytes, ErrorKind::UnsupportedOp, Some("Loop_acc"));
    assert!(msg.contains("trip count 'M'"), "{msg}");
    let e = compile(&bytes, None, &CompileOptions::default()).unwrap_err();
    assert_eq!(e.needs_inputs, ["M"], "{e}");
    let c = ok(&bytes, &loop_values(3));
    let outs: Vec<(String, Vec<u32>)> = c
        .model
        .outputs()
        .map(|(_, t)| (t.name.clone(), t.shape.clone()))
        .collect();
    assert!(outs.contains(&("scans".into(), vec![3, 2])), "{outs:?}");
    assert!(outs.contains(&("acc".into(), vec![2])), "{outs:?}");
    // The declared scan shape is [3, 2]: a trip count of 4 gives [4, 2].
    let c = ok(&bytes, &loop_values(4));
    assert!(
        c.model
            .outputs()
            .any(|(_, t)| t.name == "scans" && t.shape == [4, 2])
    );
}

/// A condition the body computes from a run-time value cannot decide the unrolling: the
/// error names the node and that value.
#[test]
fn a_loop_whose_condition_is_computed_at_run_time_is_refused() {
    let e = compile(&loop_model(true), None, &loop_values(3)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnsupportedOp, "{e}");
    assert_eq!(
        e.node.as_ref().map(|n| n.name.as_str()),
        Some("Loop_acc"),
        "{e}"
    );
    assert!(e.message.contains("condition the body computes"), "{e}");
    assert_eq!(e.needs_inputs, ["acc0", "x"], "{e}");
}

/// Nested Loops multiply their unrolled copies: a 4096 × 4096 nest is refused with a size
/// error naming a Loop, before the graph holds millions of nodes.
#[test]
fn nested_loops_past_the_node_budget_are_refused() {
    use prost::Message;
    let body = |inner: Option<GraphProto>| {
        let mut nodes = vec![node("Identity", &["c"], &["c_out"], vec![])];
        match inner {
            Some(g) => nodes.push(node(
                "Loop",
                &["M", "", "s"],
                &["s_out"],
                vec![AttributeProto {
                    name: "body".into(),
                    r#type: attribute_type::GRAPH,
                    g: Some(g.encode_to_vec()),
                    ..Default::default()
                }],
            )),
            None => nodes.push(node("Neg", &["s"], &["s_out"], vec![])),
        }
        GraphProto {
            name: "body".into(),
            node: nodes,
            input: vec![
                vi("i", dt::INT64, &[]),
                vi("c", dt::BOOL, &[]),
                vi("s", dt::FLOAT, &[1]),
            ],
            output: vec![vi("c_out", dt::BOOL, &[]), vi("s_out", dt::FLOAT, &[1])],
            ..Default::default()
        }
    };
    let outer = body(Some(body(None)));
    let bytes = model(
        vec![node(
            "Loop",
            &["M", "", "x"],
            &["y"],
            vec![AttributeProto {
                name: "body".into(),
                r#type: attribute_type::GRAPH,
                g: Some(outer.encode_to_vec()),
                ..Default::default()
            }],
        )],
        vec![i64_init("M", &[], vec![4096])],
        vec![vi("x", dt::FLOAT, &[1])],
        vec![vi("y", dt::FLOAT, &[1])],
        13,
    );
    let e = compile(&bytes, None, &CompileOptions::default()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge, "{e}");
    assert!(e.to_string().contains("(Loop)"), "{e}");
}

/// FlexAttention (domain ai.onnx.preview) whose score_mod reads an outer run-time value
/// (`bias`, captured as an extra input) compiles; another preview-domain operator does not.
#[test]
fn flex_attention_score_mod_reads_outer_values() {
    use prost::Message;
    let score_mod = GraphProto {
        name: "score_mod".into(),
        node: vec![node("Add", &["scores", "bias"], &["out"], vec![])],
        input: vec![vi("scores", dt::FLOAT, &[1, 2, 3, 5])],
        output: vec![vi("out", dt::FLOAT, &[1, 2, 3, 5])],
        ..Default::default()
    };
    let mut flex = node(
        "FlexAttention",
        &["Q", "K", "V"],
        &["Y"],
        vec![AttributeProto {
            name: "score_mod".into(),
            r#type: attribute_type::GRAPH,
            g: Some(score_mod.encode_to_vec()),
            ..Default::default()
        }],
    );
    flex.domain = "ai.onnx.preview".into();
    let inputs = vec![
        vi("Q", dt::FLOAT, &[1, 2, 3, 4]),
        vi("K", dt::FLOAT, &[1, 1, 5, 4]),
        vi("V", dt::FLOAT, &[1, 1, 5, 6]),
        vi("bias", dt::FLOAT, &[3, 5]),
    ];
    let bytes = model(
        vec![flex.clone()],
        vec![],
        inputs.clone(),
        vec![vi("Y", dt::FLOAT, &[1, 2, 3, 6])],
        26,
    );
    let c = ok(&bytes, &CompileOptions::default());
    assert!(c.model.inputs().any(|(_, t)| t.name == "bias"));
    let y = c.model.outputs().next().expect("Y").1;
    assert_eq!(y.shape, [1, 2, 3, 6]);
    flex.op_type = "SomethingElse".into();
    let bytes = model(
        vec![flex],
        vec![],
        inputs,
        vec![vi("Y", dt::FLOAT, &[1, 2, 3, 6])],
        26,
    );
    let msg = fails(&bytes, ErrorKind::UnsupportedOp, None);
    assert!(msg.contains("domain 'ai.onnx.preview'"), "{msg}");
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
