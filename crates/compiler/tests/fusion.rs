//! Lowering of the operators and fusions added for the light models and the benchmark
//! models: what instructions each pattern becomes. (Numbers are checked end to end by
//! `nrt conformance` on the ONNX node tests, the light models and `nrt samples`.)

mod common;

use common::fusion::*;
use common::*;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{ActFunc, Op};

#[test]
fn lrn_is_square_window_pool_log_exp_and_product() {
    let m = model(
        vec![node(
            "LRN",
            &["X"],
            &["Y"],
            vec![a_i("size", 5), a_f("alpha", 1e-3), a_f("beta", 0.75)],
        )],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 7, 3, 4])],
        vec![vi("Y", dt::FLOAT, &[2, 7, 3, 4])],
        13,
    );
    let c = ok(&m);
    assert_eq!(
        acts(&c),
        vec![ActFunc::Square, ActFunc::Log, ActFunc::Exp],
        "{}",
        c.report
    );
    let pool = ops(&c, Engine::Pool);
    assert_eq!(pool.len(), 1);
    let Op::Pool(op::Pool {
        input,
        window,
        count_include_pad,
        ..
    }) = pool[0]
    else {
        panic!("{pool:?}")
    };
    assert_eq!(input.shape, [2, 1, 7, 12]);
    assert_eq!(window.kernel, [5, 1]);
    assert_eq!(window.pad, [2, 0, 2, 0]);
    assert!(count_include_pad);
    assert_eq!(ops(&c, Engine::Dve).len(), 1);
}

#[test]
fn lrn_rejects_a_zero_size_naming_the_node() {
    let m = model(
        vec![node("LRN", &["X"], &["Y"], vec![a_i("size", 0)])],
        vec![],
        vec![vi("X", dt::FLOAT, &[1, 3, 2, 2])],
        vec![vi("Y", dt::FLOAT, &[1, 3, 2, 2])],
        13,
    );
    let e = compile(&m, None, &CompileOptions::default()).expect_err("size 0");
    assert!(e.to_string().contains("size"), "{e}");
    assert_eq!(
        e.node.as_ref().map(|n| n.name.as_str()),
        Some("LRN_Y"),
        "{e}"
    );
}

#[test]
fn dropout_mask_is_a_constant_all_true() {
    let m = model(
        vec![node("Dropout", &["X"], &["Y", "M"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[3, 4])],
        vec![vi("Y", dt::FLOAT, &[3, 4]), vi("M", dt::BOOL, &[3, 4])],
        13,
    );
    let c = ok(&m);
    // The data is copied to its output, the mask from a constant: no compute at all.
    assert_eq!(c.report.instructions[0][Engine::Act.index()], 0);
    assert_eq!(c.report.instructions[0][Engine::Pe.index()], 0);
    assert!(c.model.constants.len() >= 12);
}

/// `Y = gelu(X·W + b)` spelled out in tanh form; `variant` permutes operand orders.
fn tanh_gelu_model(variant: usize) -> Vec<u8> {
    let k = (2.0f32 / std::f32::consts::PI).sqrt();
    let mut nodes = vec![
        node("MatMul", &["X", "W"], &["mm"], vec![]),
        node("Add", &["b", "mm"], &["f"], vec![]),
    ];
    match variant {
        0 => nodes.extend([
            node("Pow", &["f", "three"], &["x3"], vec![]),
            node("Mul", &["x3", "c"], &["cx3"], vec![]),
            node("Add", &["f", "cx3"], &["in"], vec![]),
            node("Mul", &["in", "k"], &["sc"], vec![]),
            node("Tanh", &["sc"], &["t"], vec![]),
            node("Add", &["t", "one"], &["p"], vec![]),
            node("Mul", &["f", "half"], &["hx"], vec![]),
            node("Mul", &["hx", "p"], &["Y"], vec![]),
        ]),
        _ => nodes.extend([
            // x·x·x, constants on the left, 0.5 applied last, Sum for the 1 + tanh.
            node("Mul", &["f", "f"], &["x2"], vec![]),
            node("Mul", &["x2", "f"], &["x3"], vec![]),
            node("Mul", &["c", "x3"], &["cx3"], vec![]),
            node("Add", &["cx3", "f"], &["in"], vec![]),
            node("Mul", &["k", "in"], &["sc"], vec![]),
            node("Tanh", &["sc"], &["t"], vec![]),
            node("Sum", &["one", "t"], &["p"], vec![]),
            node("Mul", &["p", "f"], &["xp"], vec![]),
            node("Mul", &["half", "xp"], &["Y"], vec![]),
        ]),
    }
    model(
        nodes,
        vec![
            f32_init("W", &[8, 16], ramp(128, 0.01)),
            f32_init("b", &[16], ramp(16, 0.1)),
            f32_init("three", &[], vec![3.0]),
            f32_init("c", &[], vec![0.044715]),
            f32_init("k", &[], vec![k]),
            f32_init("one", &[], vec![1.0]),
            f32_init("half", &[], vec![0.5]),
        ],
        vec![vi("X", dt::FLOAT, &[4, 8])],
        vec![vi("Y", dt::FLOAT, &[4, 16])],
        17,
    )
}

#[test]
fn tanh_gelu_with_its_bias_add_is_the_matmul_epilogue() {
    for variant in 0..2 {
        let c = ok(&tanh_gelu_model(variant));
        let e = sole_epilogue(&c);
        assert_eq!(e.func, ActFunc::GeluTanh, "variant {variant}");
        assert!(e.bias.is_some(), "the bias add is the epilogue's bias");
        assert!(e.residual.is_none());
        assert!(ops(&c, Engine::Act).is_empty(), "variant {variant}");
        assert!(ops(&c, Engine::Dve).is_empty(), "variant {variant}");
    }
}

#[test]
fn erf_gelu_is_one_activation_and_a_near_miss_is_not() {
    let build = |scale: f32| {
        model(
            vec![
                node("Div", &["X", "s2"], &["d"], vec![]),
                node("Erf", &["d"], &["e"], vec![]),
                node("Add", &["e", "one"], &["p"], vec![]),
                node("Mul", &["X", "p"], &["xp"], vec![]),
                node("Mul", &["xp", "half"], &["Y"], vec![]),
            ],
            vec![
                f32_init("s2", &[], vec![scale]),
                f32_init("one", &[], vec![1.0]),
                f32_init("half", &[], vec![0.5]),
            ],
            vec![vi("X", dt::FLOAT, &[2, 5])],
            vec![vi("Y", dt::FLOAT, &[2, 5])],
            13,
        )
    };
    let c = ok(&build(std::f32::consts::SQRT_2));
    assert_eq!(acts(&c), vec![ActFunc::GeluErf]);
    assert!(ops(&c, Engine::Dve).is_empty());
    // x/1.5 is not x/√2: computed as written.
    let c = ok(&build(1.5));
    assert_eq!(acts(&c), vec![ActFunc::Erf]);
    assert!(!ops(&c, Engine::Dve).is_empty());
}

#[test]
fn small_integer_powers_avoid_powf() {
    for (e, want_acts, want_dve) in [
        (3.0f32, vec![ActFunc::Square], 1usize),
        (4.0, vec![ActFunc::Square, ActFunc::Square], 0),
        (-1.0, vec![ActFunc::Reciprocal], 0),
        (-0.5, vec![ActFunc::Rsqrt], 0),
    ] {
        let m = model(
            vec![node("Pow", &["X", "e"], &["Y"], vec![])],
            vec![f32_init("e", &[], vec![e])],
            vec![vi("X", dt::FLOAT, &[3, 4])],
            vec![vi("Y", dt::FLOAT, &[3, 4])],
            13,
        );
        let c = ok(&m);
        assert_eq!(acts(&c), want_acts, "x^{e}");
        assert_eq!(ops(&c, Engine::Dve).len(), want_dve, "x^{e}");
    }
}

fn unary_model(op: &str, attrs: Vec<nrt_compiler::onnx::AttributeProto>, opset: i64) -> Vec<u8> {
    model(
        vec![node(op, &["X"], &["Y"], attrs)],
        vec![],
        vec![vi("X", dt::FLOAT, &[3, 4])],
        vec![vi("Y", dt::FLOAT, &[3, 4])],
        opset,
    )
}

#[test]
fn composite_reductions_map_reduce_and_map() {
    for (op, want) in [
        ("ReduceL1", vec![ActFunc::Abs]),
        ("ReduceL2", vec![ActFunc::Square, ActFunc::Sqrt]),
        ("ReduceSumSquare", vec![ActFunc::Square]),
        ("ReduceLogSum", vec![ActFunc::Log]),
        ("ReduceLogSumExp", vec![ActFunc::Exp, ActFunc::Log]),
    ] {
        let m = model(
            vec![node(op, &["X"], &["Y"], vec![a_ints("axes", &[1])])],
            vec![],
            vec![vi("X", dt::FLOAT, &[3, 4])],
            vec![vi("Y", dt::FLOAT, &[3, 1])],
            13,
        );
        let c = ok(&m);
        assert_eq!(acts(&c), want, "{op}");
        let reduces = count(&ops(&c, Engine::Pool), "Reduce");
        assert_eq!(reduces, if op == "ReduceLogSumExp" { 2 } else { 1 }, "{op}");
    }
}

#[test]
fn or_equal_comparisons_and_trilu() {
    for op in ["GreaterOrEqual", "LessOrEqual"] {
        let m = model(
            vec![node(op, &["X", "Z"], &["Y"], vec![])],
            vec![],
            vec![vi("X", dt::FLOAT, &[3, 4]), vi("Z", dt::FLOAT, &[4])],
            vec![vi("Y", dt::BOOL, &[3, 4])],
            16,
        );
        let c = ok(&m);
        let kinds: Vec<String> = ops(&c, Engine::Dve)
            .iter()
            .map(|o| match o {
                Op::Binary(op::Binary { op, .. }) => format!("{op:?}"),
                o => o.name().to_string(),
            })
            .collect();
        let first = if op == "GreaterOrEqual" {
            "Greater"
        } else {
            "Less"
        };
        assert_eq!(kinds, vec![first, "Equal", "Or"], "{op}");
    }
    let c = ok(&unary_model("Trilu", vec![a_i("upper", 0)], 14));
    assert_eq!(count(&ops(&c, Engine::Dve), "Select"), 1);
}

#[test]
fn argmax_is_reduce_compare_select_reduce() {
    let m = model(
        vec![node(
            "ArgMax",
            &["X"],
            &["Y"],
            vec![a_i("axis", 1), a_i("keepdims", 0)],
        )],
        vec![],
        vec![vi("X", dt::FLOAT, &[3, 4, 2])],
        vec![vi("Y", dt::INT64, &[3, 2])],
        13,
    );
    let c = ok(&m);
    let pool = ops(&c, Engine::Pool);
    let reduces: Vec<_> = pool
        .iter()
        .filter_map(|o| match o {
            Op::Reduce(op::Reduce { op, .. }) => Some(*op),
            _ => None,
        })
        .collect();
    assert_eq!(
        reduces,
        vec![nrt_isa::ReduceOp::Max, nrt_isa::ReduceOp::Min]
    );
    let dve = ops(&c, Engine::Dve);
    assert_eq!(count(&dve, "Binary") + count(&dve, "Select"), 2);
}

#[test]
fn composite_activations_lower_to_act_and_dve() {
    for (op, want_acts, want_dve) in [
        ("Selu", vec![ActFunc::Elu], 1usize),
        ("Celu", vec![ActFunc::Elu], 1),
        ("HardSwish", vec![ActFunc::HardSigmoid], 1),
        ("Swish", vec![ActFunc::Sigmoid], 1),
        ("Mish", vec![ActFunc::Softplus, ActFunc::Tanh], 1),
        ("Softsign", vec![ActFunc::Abs, ActFunc::Reciprocal], 1),
        ("ThresholdedRelu", vec![], 2),
        ("Shrink", vec![], 6),
        ("Sign", vec![], 5),
    ] {
        let c = ok(&unary_model(op, vec![], 22));
        assert_eq!(acts(&c), want_acts, "{op}");
        assert_eq!(ops(&c, Engine::Dve).len(), want_dve, "{op}");
    }
    let m = model(
        vec![node("RMSNormalization", &["X", "s"], &["Y"], vec![])],
        vec![f32_init("s", &[4], ramp(4, 0.1))],
        vec![vi("X", dt::FLOAT, &[3, 4])],
        vec![vi("Y", dt::FLOAT, &[3, 4])],
        23,
    );
    // f32 with one row of scales: the POOL engine's RmsNorm, one instruction.
    let c = ok(&m);
    assert_eq!(acts(&c), vec![]);
    let pool = ops(&c, Engine::Pool);
    assert_eq!(pool.len(), 1, "{pool:?}");
    let Op::RmsNorm(op::RmsNorm { gamma, eps, .. }) = pool[0] else {
        panic!("{pool:?}")
    };
    assert_eq!((gamma.shape, gamma.stride), ([1, 1, 3, 4], [0, 0, 0, 1]));
    assert_eq!(eps, 1e-5);
    // Scales that vary along a row-indexing dimension are not one row: the square, mean,
    // rsqrt and products.
    let m = model(
        vec![node("RMSNormalization", &["X", "s"], &["Y"], vec![])],
        vec![f32_init("s", &[3, 1], ramp(3, 0.1))],
        vec![vi("X", dt::FLOAT, &[3, 4])],
        vec![vi("Y", dt::FLOAT, &[3, 4])],
        23,
    );
    let c = ok(&m);
    assert_eq!(acts(&c), vec![ActFunc::Square, ActFunc::Rsqrt]);
    assert_eq!(count(&ops(&c, Engine::Pool), "Reduce"), 1);
}

#[test]
fn tile_and_depth_to_space_are_one_copy() {
    let m = model(
        vec![
            node("Tile", &["X", "r"], &["t"], vec![]),
            node("DepthToSpace", &["t"], &["Y"], vec![a_i("blocksize", 2)]),
        ],
        vec![i64_init("r", &[4], vec![1, 2, 1, 1])],
        vec![vi("X", dt::FLOAT, &[1, 4, 3, 3])],
        vec![vi("Y", dt::FLOAT, &[1, 2, 6, 6])],
        13,
    );
    let c = ok(&m);
    assert!(ops(&c, Engine::Pool).iter().all(|o| o.name() == "Copy"));
    assert!(
        ops(&c, Engine::Pool).len() <= 4,
        "{:?}",
        ops(&c, Engine::Pool)
    );
}

#[test]
fn split_and_slice_are_views() {
    let m = model(
        vec![
            node("Split", &["X", "sz"], &["a", "b"], vec![a_i("axis", 1)]),
            node("Relu", &["a"], &["Y1"], vec![]),
            node("Slice", &["b", "st", "en", "ax", "stp"], &["s"], vec![]),
            node("Sigmoid", &["s"], &["Y2"], vec![]),
        ],
        vec![
            i64_init("sz", &[2], vec![2, 4]),
            i64_init("st", &[1], vec![1]),
            i64_init("en", &[1], vec![4]),
            i64_init("ax", &[1], vec![1]),
            i64_init("stp", &[1], vec![2]),
        ],
        vec![vi("X", dt::FLOAT, &[3, 6])],
        vec![vi("Y1", dt::FLOAT, &[3, 2]), vi("Y2", dt::FLOAT, &[3, 2])],
        13,
    );
    let c = ok(&m);
    assert!(ops(&c, Engine::Pool).is_empty());
    let act = ops(&c, Engine::Act);
    let Op::Activation(op::Activation { input, .. }) = act[1] else {
        panic!("{act:?}")
    };
    // b = X[:, 2:6], s = b[:, 1:4:2]: columns 3 and 5 of X.
    assert_eq!(input.shape[2..], [3, 2]);
    assert_eq!(input.stride[2..], [6, 2]);
}

#[test]
fn cumsum_is_a_product_with_a_triangular_matrix() {
    for axis in [1i64, 0] {
        let m = model(
            vec![node(
                "CumSum",
                &["X", "ax"],
                &["Y"],
                vec![a_i("reverse", 1)],
            )],
            vec![i64_init("ax", &[], vec![axis])],
            vec![vi("X", dt::FLOAT, &[3, 4])],
            vec![vi("Y", dt::FLOAT, &[3, 4])],
            14,
        );
        let c = ok(&m);
        let pe = ops(&c, Engine::Pe);
        assert_eq!(pe.len(), 1, "{pe:?}");
        let Op::MatMul(op::MatMul { a, .. }) = pe[0] else {
            unreachable!()
        };
        // Along the last axis the data is A (3 rows of 4, times the 4×4 Tᵀ); along axis 0
        // the 3×3 matrix T is A and the data B.
        assert_eq!(a.shape[2], 3, "axis {axis}");
    }
    let long = model(
        vec![node("CumSum", &["X", "ax"], &["Y"], vec![])],
        vec![i64_init("ax", &[], vec![0])],
        vec![vi("X", dt::FLOAT, &[5000])],
        vec![vi("Y", dt::FLOAT, &[5000])],
        14,
    );
    let e = compile(&long, None, &CompileOptions::default()).expect_err("too long");
    assert!(e.to_string().contains("CumSum over 5000"), "{e}");
}

#[test]
fn group_norms_use_the_layer_norm_instruction_and_lp_pool_sums() {
    let norm = |op: &str, groups: i64, params: i64| {
        let mut attrs = vec![];
        if op == "GroupNormalization" {
            attrs.push(a_i("num_groups", groups));
        }
        model(
            vec![node(op, &["X", "s", "b"], &["Y"], attrs)],
            vec![
                f32_init("s", &[params], ramp(params as usize, 0.1)),
                f32_init("b", &[params], ramp(params as usize, 0.1)),
            ],
            vec![vi("X", dt::FLOAT, &[2, 4, 3, 3])],
            vec![vi("Y", dt::FLOAT, &[2, 4, 3, 3])],
            21,
        )
    };
    // Per-channel instance parameters and per-group ones ride in the instruction.
    for (op, g, p, dve) in [
        ("InstanceNormalization", 4, 4, 0usize),
        ("GroupNormalization", 2, 4, 1),
    ] {
        let c = ok(&norm(op, g, p));
        let pool = ops(&c, Engine::Pool);
        let Op::LayerNorm(op::LayerNorm { input, gamma, .. }) = pool[0] else {
            panic!("{pool:?}")
        };
        assert_eq!(input.shape, [1, 2, g as u32, 36 / g as u32], "{op}");
        assert_eq!(ops(&c, Engine::Dve).len(), dve, "{op}");
        if op == "InstanceNormalization" {
            assert_eq!(gamma.stride, [0, 0, 1, 0]);
        }
    }
    let m = model(
        vec![node(
            "LpPool",
            &["X"],
            &["Y"],
            vec![a_ints("kernel_shape", &[2, 2]), a_i("p", 2)],
        )],
        vec![],
        vec![vi("X", dt::FLOAT, &[1, 2, 4, 4])],
        vec![vi("Y", dt::FLOAT, &[1, 2, 3, 3])],
        18,
    );
    let c = ok(&m);
    assert_eq!(acts(&c), vec![ActFunc::Square, ActFunc::Sqrt]);
    assert!(matches!(
        ops(&c, Engine::Pool)[0],
        Op::Pool(op::Pool {
            count_include_pad: true,
            ..
        })
    ));
}

#[test]
fn mod_of_narrow_integers_goes_through_i64() {
    let m = model(
        vec![node("Mod", &["A", "B"], &["Y"], vec![])],
        vec![],
        vec![vi("A", dt::INT8, &[6]), vi("B", dt::INT8, &[6])],
        vec![vi("Y", dt::INT8, &[6])],
        13,
    );
    let c = ok(&m);
    let dve = ops(&c, Engine::Dve);
    // Two widening copies, the remainder, the sign fix-up, one narrowing copy.
    assert_eq!(count(&dve, "Copy"), 3, "{dve:?}");
    assert_eq!(count(&dve, "Select"), 2);
    let float = model(
        vec![node("Mod", &["A", "B"], &["Y"], vec![])],
        vec![],
        vec![vi("A", dt::FLOAT, &[6]), vi("B", dt::FLOAT, &[6])],
        vec![vi("Y", dt::FLOAT, &[6])],
        13,
    );
    let e = compile(&float, None, &CompileOptions::default()).expect_err("fmod 0 on floats");
    assert!(e.to_string().contains("fmod"), "{e}");
}
