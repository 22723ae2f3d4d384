//! Layout without copies: attention's head split and merge, layout operators as views, a
//! transposed value stored transposed by its producer, concat inputs written in place.

mod common;

use common::fusion::*;
use common::*;
use nrt_compiler::onnx::data_type as dt;
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{ActFunc, Op};

/// One attention head block: projections, head split (Reshape + Transpose), K transposed,
/// scaled scores (`scale` = "Mul" or "Div"), softmax, context, head merge.
fn attention_model(scale: &str) -> Vec<u8> {
    let (s, h, heads) = (8i64, 16i64, 2i64);
    let dh = h / heads;
    let mut nodes = Vec::new();
    for p in ["q", "k", "v"] {
        nodes.push(node(
            "MatMul",
            &["X", &format!("W{p}")],
            &[&format!("{p}m")],
            vec![],
        ));
        nodes.push(node(
            "Reshape",
            &[&format!("{p}m"), "sh"],
            &[&format!("{p}r")],
            vec![],
        ));
        nodes.push(node(
            "Transpose",
            &[&format!("{p}r")],
            &[&format!("{p}h")],
            vec![a_ints("perm", &[0, 2, 1, 3])],
        ));
    }
    nodes.extend([
        node(
            "Transpose",
            &["kh"],
            &["kt"],
            vec![a_ints("perm", &[0, 1, 3, 2])],
        ),
        node("MatMul", &["qh", "kt"], &["qk"], vec![]),
        node(scale, &["qk", "sc"], &["scores"], vec![]),
        node("Softmax", &["scores"], &["pr"], vec![a_i("axis", -1)]),
        node("MatMul", &["pr", "vh"], &["ctx"], vec![]),
        node(
            "Transpose",
            &["ctx"],
            &["ct"],
            vec![a_ints("perm", &[0, 2, 1, 3])],
        ),
        node("Reshape", &["ct", "mg"], &["cm"], vec![]),
        node("MatMul", &["cm", "Wo"], &["Y"], vec![]),
    ]);
    let sc = if scale == "Mul" {
        1.0 / (dh as f32).sqrt()
    } else {
        (dh as f32).sqrt()
    };
    let mut inits = vec![
        i64_init("sh", &[4], vec![1, s, heads, dh]),
        i64_init("mg", &[3], vec![1, s, h]),
        f32_init("sc", &[], vec![sc]),
    ];
    for p in ["q", "k", "v", "o"] {
        inits.push(f32_init(
            &format!("W{p}"),
            &[h, h],
            ramp((h * h) as usize, 0.01),
        ));
    }
    model(
        nodes,
        inits,
        vec![vi("X", dt::FLOAT, &[1, s, h])],
        vec![vi("Y", dt::FLOAT, &[1, s, h])],
        17,
    )
}

#[test]
fn attention_head_split_and_merge_need_no_copies() {
    for scale in ["Mul", "Div"] {
        let c = ok(&attention_model(scale));
        let pe = ops(&c, Engine::Pe);
        // q, k, v, scores, context, output: one instruction each, all heads at once.
        assert_eq!(count(&pe, "MatMul"), 6, "{pe:?}");
        let pool = ops(&c, Engine::Pool);
        assert_eq!(pool.len(), 1, "only the softmax: {pool:?}");
        assert!(ops(&c, Engine::Dve).is_empty(), "{scale}");
        let mms: Vec<_> = pe
            .iter()
            .filter_map(|o| match o {
                Op::MatMul(op::MatMul { a, b, c, alpha, .. }) => Some((*a, *b, *c, *alpha)),
                _ => None,
            })
            .collect();
        // Scores: Q heads read in place ([1,2,8,8] with row stride 16), K transposed by
        // strides, the scale in alpha.
        let (a, b, _, alpha) = mms[3];
        assert_eq!(a.shape, [1, 2, 8, 8]);
        assert_eq!(a.stride, [0, 8, 16, 1]);
        assert_eq!(b.stride, [0, 8, 1, 16]);
        assert!((alpha - 1.0 / 8f32.sqrt()).abs() < 1e-6, "{scale}: {alpha}");
        // Context: written straight into the merged [S, H] layout.
        let (_, _, cc, _) = mms[4];
        assert_eq!(cc.stride, [0, 8, 16, 1]);
    }
}

#[test]
fn layout_operators_never_copy() {
    let m = model(
        vec![
            node("Relu", &["X"], &["r"], vec![]),
            node("Reshape", &["r", "s1"], &["a"], vec![]),
            node("Unsqueeze", &["a", "ax"], &["b"], vec![]),
            node("Squeeze", &["b", "ax"], &["c2"], vec![]),
            node("Flatten", &["c2"], &["d"], vec![a_i("axis", 1)]),
            node("Identity", &["d"], &["e"], vec![]),
            node("Sigmoid", &["e"], &["Y"], vec![]),
        ],
        vec![
            i64_init("s1", &[3], vec![2, 3, 4]),
            i64_init("ax", &[1], vec![0]),
        ],
        vec![vi("X", dt::FLOAT, &[6, 4])],
        vec![vi("Y", dt::FLOAT, &[2, 12])],
        13,
    );
    let c = ok(&m);
    assert!(ops(&c, Engine::Pool).is_empty());
    assert!(ops(&c, Engine::Dve).is_empty());
    assert_eq!(acts(&c), vec![ActFunc::Relu, ActFunc::Sigmoid]);
}

#[test]
fn a_transposed_value_read_elementwise_is_stored_transposed_by_its_producer() {
    let m = model(
        vec![
            node("MatMul", &["X", "W"], &["mm"], vec![]),
            node("Transpose", &["mm"], &["t"], vec![a_ints("perm", &[1, 0])]),
            node("Reshape", &["t", "s"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[4, 6], ramp(24, 0.1)),
            i64_init("s", &[1], vec![18]),
        ],
        vec![vi("X", dt::FLOAT, &[3, 4])],
        vec![vi("Y", dt::FLOAT, &[18])],
        13,
    );
    let c = ok(&m);
    let pe = ops(&c, Engine::Pe);
    let Op::MatMul(op::MatMul { c: out, .. }) = pe[0] else {
        panic!("{pe:?}")
    };
    assert_eq!(out.stride[2..], [1, 3]);
    assert!(ops(&c, Engine::Pool).is_empty());
    assert!(ops(&c, Engine::Dve).is_empty());
}

/// Two convolution branches (+ Relu on the first) concatenated along channels.
fn branches(batch: i64) -> Vec<u8> {
    model(
        vec![
            node("Conv", &["X", "W1"], &["c1"], vec![]),
            node("Relu", &["c1"], &["r1"], vec![]),
            node("Conv", &["X", "W2"], &["c2"], vec![]),
            node(
                "MaxPool",
                &["X"],
                &["p"],
                vec![a_ints("kernel_shape", &[1, 1])],
            ),
            node("Concat", &["r1", "c2", "p"], &["Y"], vec![a_i("axis", 1)]),
        ],
        vec![
            f32_init("W1", &[4, 3, 1, 1], ramp(12, 0.1)),
            f32_init("W2", &[5, 3, 1, 1], ramp(15, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[batch, 3, 4, 4])],
        vec![vi("Y", dt::FLOAT, &[batch, 12, 4, 4])],
        13,
    )
}

#[test]
fn concat_inputs_are_written_in_place() {
    // Batch 1: every part of the output is dense, every producer writes its own part.
    let c = ok(&branches(1));
    assert!(
        ops(&c, Engine::Pool).iter().all(|o| o.name() == "Pool"),
        "{:?}",
        ops(&c, Engine::Pool)
    );
    // Batch 2: the parts are strided; the Relu writes its part, the convolution and the
    // pool (dense outputs only) are copied.
    let c = ok(&branches(2));
    assert_eq!(count(&ops(&c, Engine::Pool), "Copy"), 2);
}
