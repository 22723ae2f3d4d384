//! Lowering of the operators and fusions added for the light models and the benchmark
//! models: what instructions each pattern becomes. (Numbers are checked end to end by
//! `nrt conformance` on the ONNX node tests, the light models and `nrt samples`.)

mod common;

use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, Compiled, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{ActFunc, Epilogue, Op, decode_block};
use nrt_model::CompiledModel;

fn ok(bytes: &[u8]) -> Compiled {
    let c = compile(bytes, None, &CompileOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let back = CompiledModel::decode(&c.model.encode()).expect("round trip");
    assert_eq!(back, c.model);
    check_ordering(&c.model).unwrap_or_else(|e| panic!("ordering: {e}"));
    let two = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    let c2 = compile(bytes, None, &two).unwrap_or_else(|e| panic!("2 cores: {e}"));
    check_ordering(&c2.model).unwrap_or_else(|e| panic!("ordering (2 cores): {e}"));
    c
}

/// The operations of one engine's block on core 0, `Nop`s and `End` left out.
fn ops(c: &Compiled, engine: Engine) -> Vec<Op> {
    let b = c.model.block(0, engine).expect("block");
    decode_block(&b.code, engine)
        .expect("decodes")
        .into_iter()
        .map(|(_, i)| i.op)
        .filter(|o| !matches!(o, Op::Nop(op::Nop) | Op::End(op::End)))
        .collect()
}

fn acts(c: &Compiled) -> Vec<ActFunc> {
    ops(c, Engine::Act)
        .iter()
        .filter_map(|o| match o {
            Op::Activation(op::Activation { func, .. }) => Some(*func),
            _ => None,
        })
        .collect()
}

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

fn count(ops: &[Op], name: &str) -> usize {
    ops.iter().filter(|o| o.name() == name).count()
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

/// The epilogue of the one MatMul of `c`'s PE block.
fn sole_epilogue(c: &Compiled) -> Epilogue {
    let pe = ops(c, Engine::Pe);
    assert_eq!(pe.len(), 1, "{pe:?}");
    let Op::MatMul(op::MatMul { epilogue, .. }) = pe[0] else {
        panic!("{pe:?}")
    };
    epilogue
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

#[test]
fn gemm_bias_and_relu_are_the_matmul_epilogue() {
    let m = model(
        vec![
            node(
                "Gemm",
                &["X", "W", "b"],
                &["g"],
                vec![a_i("transB", 1), a_f("beta", 0.5)],
            ),
            node("Relu", &["g"], &["r"], vec![]),
            node("Gemm", &["r", "W2", "b2"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[6, 4], ramp(24, 0.1)),
            f32_init("b", &[6], ramp(6, 0.1)),
            f32_init("W2", &[6, 3], ramp(18, 0.1)),
            f32_init("b2", &[3], ramp(3, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[5, 4])],
        vec![vi("Y", dt::FLOAT, &[5, 3])],
        13,
    );
    let c = ok(&m);
    assert!(ops(&c, Engine::Act).is_empty());
    assert!(
        ops(&c, Engine::Dve).is_empty(),
        "no copy of C, no scaling pass"
    );
    let pe = ops(&c, Engine::Pe);
    assert_eq!(pe.len(), 2);
    let epis: Vec<Epilogue> = pe
        .iter()
        .map(|o| match o {
            Op::MatMul(op::MatMul { epilogue, .. }) => *epilogue,
            _ => panic!("{o:?}"),
        })
        .collect();
    // The first Gemm: its (beta-scaled) C and the Relu; the second: its C alone.
    assert_eq!(epis[0].func, ActFunc::Relu);
    assert!(epis[0].bias.is_some() && epis[0].residual.is_none());
    assert_eq!(epis[1].func, ActFunc::Identity);
    assert!(epis[1].bias.is_some() && epis[1].residual.is_none());
    let bias = epis[0].bias.expect("bias");
    assert_eq!(
        bias.stride,
        [0, 0, 0, 1],
        "one value per column, broadcast over rows"
    );
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

#[test]
fn conv_uses_im2col_scratch_and_applies_its_relu_itself() {
    let conv = |k: i64, stride: i64, group: i64, cin: i64, cout: i64| {
        model(
            vec![
                node(
                    "Conv",
                    &["X", "W", "b"],
                    &["c"],
                    vec![
                        a_ints("kernel_shape", &[k, k]),
                        a_ints("strides", &[stride, stride]),
                        a_i("group", group),
                    ],
                ),
                node("Relu", &["c"], &["r"], vec![]),
                node("Sigmoid", &["r"], &["Y"], vec![]),
            ],
            vec![
                f32_init(
                    "W",
                    &[cout, cin / group, k, k],
                    ramp((cout * cin / group * k * k) as usize, 0.01),
                ),
                f32_init("b", &[cout], ramp(cout as usize, 0.1)),
            ],
            vec![vi("X", dt::FLOAT, &[1, cin, 9, 9])],
            vec![vi(
                "Y",
                dt::FLOAT,
                &[1, cout, (9 - k) / stride + 1, (9 - k) / stride + 1],
            )],
            13,
        )
    };
    let workspace = |c: &Compiled| match ops(c, Engine::Pe)[0] {
        Op::Conv(op::Conv {
            workspace, bias, ..
        }) => {
            assert!(bias.is_some(), "the bias stays in the convolution");
            workspace
        }
        ref o => panic!("{o:?}"),
    };
    let c = ok(&conv(3, 2, 1, 4, 6));
    let ws = workspace(&c).expect("im2col scratch");
    assert_eq!(ws.elements(), 4 * 9 * 4 * 4);
    // The Relu that only the convolution feeds is the convolution's activation; the Sigmoid
    // after it (fed by the Relu, not the convolution) stays an ACT instruction.
    assert!(
        matches!(
            ops(&c, Engine::Pe)[0],
            Op::Conv(op::Conv {
                act: (ActFunc::Relu, ..),
                ..
            })
        ),
        "{:?}",
        ops(&c, Engine::Pe)
    );
    assert_eq!(acts(&c), vec![ActFunc::Sigmoid]);
    // Pointwise (the input is the patch matrix) and depthwise: no scratch.
    assert!(workspace(&ok(&conv(1, 1, 1, 4, 6))).is_none());
    assert!(workspace(&ok(&conv(3, 1, 4, 4, 4))).is_none());
    // Two cores: each half of the output channels has its own scratch.
    let two = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    let c2 = compile(&conv(3, 1, 1, 4, 6), None, &two).unwrap();
    let mut scratch = Vec::new();
    for core in 0..2 {
        let b = c2.model.block(core, Engine::Pe).unwrap();
        for (at, i) in decode_block(&b.code, Engine::Pe).unwrap() {
            if let Op::Conv(op::Conv {
                workspace: Some(_), ..
            }) = i.op
            {
                let field = at + 16 + 4 * 48;
                let r = b
                    .relocations
                    .iter()
                    .find(|r| r.patch_offset as usize == field)
                    .expect("workspace relocation");
                scratch.push((r.mem_ref, r.offset));
            }
        }
    }
    assert_eq!(scratch.len(), 2);
    assert_ne!(scratch[0], scratch[1]);
}

#[test]
fn a_convolution_output_read_twice_keeps_its_activation_separate() {
    // `c` feeds the Relu and is also a model output: the Relu cannot be applied in place.
    let m = model(
        vec![
            node("Conv", &["X", "W"], &["c"], vec![]),
            node("LeakyRelu", &["c"], &["Y"], vec![a_f("alpha", 0.2)]),
        ],
        vec![f32_init("W", &[4, 3, 3, 3], ramp(108, 0.01))],
        vec![vi("X", dt::FLOAT, &[1, 3, 6, 6])],
        vec![
            vi("c", dt::FLOAT, &[1, 4, 4, 4]),
            vi("Y", dt::FLOAT, &[1, 4, 4, 4]),
        ],
        13,
    );
    let c = ok(&m);
    assert!(matches!(
        ops(&c, Engine::Pe)[0],
        Op::Conv(op::Conv {
            act: (ActFunc::Identity, ..),
            ..
        })
    ));
    assert_eq!(acts(&c), vec![ActFunc::LeakyRelu]);
    // Read once: fused, with its parameter.
    let m = model(
        vec![
            node("Conv", &["X", "W"], &["c"], vec![]),
            node("LeakyRelu", &["c"], &["Y"], vec![a_f("alpha", 0.2)]),
        ],
        vec![f32_init("W", &[4, 3, 3, 3], ramp(108, 0.01))],
        vec![vi("X", dt::FLOAT, &[1, 3, 6, 6])],
        vec![vi("Y", dt::FLOAT, &[1, 4, 4, 4])],
        13,
    );
    let c = ok(&m);
    assert!(
        matches!(
            ops(&c, Engine::Pe)[0],
            Op::Conv(op::Conv {
                act: (ActFunc::LeakyRelu, a, _),
                ..
            }) if (a - 0.2).abs() < 1e-7
        ),
        "{:?}",
        ops(&c, Engine::Pe)
    );
    assert!(acts(&c).is_empty());
}

#[test]
fn three_d_pooling_is_two_separable_pools() {
    for op in ["MaxPool", "AveragePool"] {
        let m = model(
            vec![node(
                op,
                &["X"],
                &["Y"],
                vec![
                    a_ints("kernel_shape", &[2, 3, 3]),
                    a_ints("strides", &[2, 1, 2]),
                    a_ints("pads", &[1, 1, 0, 0, 1, 1]),
                    a_i("ceil_mode", 1),
                    a_i("count_include_pad", 1),
                ],
            )],
            vec![],
            vec![vi("X", dt::FLOAT, &[1, 2, 5, 6, 7])],
            vec![vi("Y", dt::FLOAT, &[1, 2, 3, 6, 4])],
            19,
        );
        let c = ok(&m);
        let pools: Vec<_> = ops(&c, Engine::Pool)
            .into_iter()
            .filter_map(|o| match o {
                Op::Pool(op::Pool {
                    input,
                    output,
                    window,
                    ..
                }) => Some((input.shape, output.shape, window.kernel)),
                _ => None,
            })
            .collect();
        // (D, H, W) pads (1, 0), (1, 1), (0, 1); W's last window overhangs (ceil mode): the
        // average materializes H and W's counted padding so that overhang is not counted.
        let first_in = if op == "MaxPool" {
            [1, 10, 6, 7]
        } else {
            [1, 10, 8, 8]
        };
        assert_eq!(
            pools,
            vec![
                (first_in, [1, 10, 6, 4], [3, 3]),
                ([2, 1, 5, 24], [2, 1, 3, 24], [2, 1]),
            ],
            "{op}"
        );
    }
}

#[test]
fn batch_norm_folds_into_its_convolution_and_fuses_its_relu() {
    let bn_inits = |p: &str, ch: i64| {
        vec![
            f32_init(&format!("{p}s"), &[ch], ramp(ch as usize, 0.1)),
            f32_init(&format!("{p}b"), &[ch], ramp(ch as usize, 0.2)),
            f32_init(&format!("{p}m"), &[ch], ramp(ch as usize, 0.05)),
            f32_init(&format!("{p}v"), &[ch], vec![0.5; ch as usize]),
        ]
    };
    let bn = |x: &str, p: &str, y: &str| {
        node(
            "BatchNormalization",
            &[
                x,
                &format!("{p}s"),
                &format!("{p}b"),
                &format!("{p}m"),
                &format!("{p}v"),
            ],
            &[y],
            vec![],
        )
    };
    let mut inits = vec![f32_init("W", &[4, 3, 3, 3], ramp(108, 0.01))];
    inits.extend(bn_inits("a", 4));
    inits.extend(bn_inits("c", 4));
    let m = model(
        vec![
            node(
                "Conv",
                &["X", "W"],
                &["c"],
                vec![a_ints("pads", &[1, 1, 1, 1])],
            ),
            bn("c", "a", "n"),
            node("Relu", &["n"], &["r"], vec![]),
            // Not after a convolution: product on DVE, shift + Relu as one ACT pass.
            bn("r", "c", "n2"),
            node("Relu", &["n2"], &["Y"], vec![]),
        ],
        inits,
        vec![vi("X", dt::FLOAT, &[1, 3, 6, 6])],
        vec![vi("Y", dt::FLOAT, &[1, 4, 6, 6])],
        13,
    );
    let c = ok(&m);
    let pe = ops(&c, Engine::Pe);
    // Conv + BN + Relu: one instruction (folded weights and bias, the Relu applied by it).
    assert!(
        matches!(
            pe[0],
            Op::Conv(op::Conv {
                bias: Some(_),
                act: (ActFunc::Relu, ..),
                ..
            })
        ),
        "{pe:?}"
    );
    assert_eq!(acts(&c), vec![ActFunc::Relu]);
    assert_eq!(ops(&c, Engine::Dve).len(), 1, "one per-channel product");
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

/// Every MatMul epilogue of `c`'s PE block on core 0, in order.
fn epilogues(c: &Compiled) -> Vec<Epilogue> {
    ops(c, Engine::Pe)
        .iter()
        .filter_map(|o| match o {
            Op::MatMul(op::MatMul { epilogue, .. }) => Some(*epilogue),
            _ => None,
        })
        .collect()
}

#[test]
fn mlp_layers_are_one_matmul_each_with_bias_and_relu_fused() {
    let c = ok(&mlp(64, 32, 4));
    let e = epilogues(&c);
    assert_eq!(e.len(), 4);
    for x in &e {
        assert_eq!(x.func, ActFunc::Relu);
        assert_eq!(x.bias.expect("bias").stride, [0, 0, 0, 1]);
        assert!(x.residual.is_none());
    }
    assert!(
        ops(&c, Engine::Act).is_empty(),
        "no separate activation pass"
    );
    assert!(ops(&c, Engine::Dve).is_empty());
    // Two cores: each core's MatMul carries its half of the bias.
    let two = compile(
        &mlp(64, 32, 4),
        None,
        &CompileOptions {
            cores: 2,
            ..Default::default()
        },
    )
    .unwrap();
    for core in 0..2 {
        let b = two.model.block(core, Engine::Pe).expect("block");
        let pe: Vec<Op> = decode_block(&b.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .map(|(_, i)| i.op)
            .filter(|o| matches!(o, Op::MatMul(_)))
            .collect();
        assert_eq!(pe.len(), 4, "core {core}");
        for o in pe {
            let Op::MatMul(op::MatMul { c, epilogue, .. }) = o else {
                unreachable!()
            };
            let bias = epilogue.bias.expect("bias");
            assert_eq!(bias.shape, c.shape);
            assert_eq!(c.shape[3], 16, "half of N");
        }
    }
}

#[test]
fn bias_then_residual_adds_fill_both_epilogue_operands() {
    let m = model(
        vec![
            node("MatMul", &["X", "W"], &["h"], vec![]),
            node("Add", &["h", "b"], &["hb"], vec![]),
            node("Add", &["X", "hb"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[16, 16], ramp(256, 0.01)),
            f32_init("b", &[16], ramp(16, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[2, 5, 16])],
        vec![vi("Y", dt::FLOAT, &[2, 5, 16])],
        17,
    );
    let c = ok(&m);
    let e = sole_epilogue(&c);
    assert_eq!(e.func, ActFunc::Identity);
    assert_eq!(e.bias.expect("bias").stride[2..], [0, 1]);
    assert_eq!(e.residual.expect("residual").stride[2..], [16, 1]);
    assert!(ops(&c, Engine::Dve).is_empty() && ops(&c, Engine::Act).is_empty());
}

#[test]
fn adds_that_cannot_fuse_stay_separate() {
    // The residual is computed after the MatMul in node order; the MatMul's result is a graph
    // output: neither fuses.
    let late = model(
        vec![
            node("MatMul", &["X", "W"], &["h"], vec![]),
            node("Abs", &["Z"], &["R"], vec![]),
            node("Add", &["h", "R"], &["Y"], vec![]),
        ],
        vec![f32_init("W", &[6, 3], ramp(18, 0.1))],
        vec![vi("X", dt::FLOAT, &[4, 6]), vi("Z", dt::FLOAT, &[4, 3])],
        vec![vi("Y", dt::FLOAT, &[4, 3])],
        17,
    );
    assert!(sole_epilogue(&ok(&late)).is_none());
    let shown = model(
        vec![
            node("MatMul", &["X", "W"], &["H"], vec![]),
            node("Add", &["H", "b"], &["a"], vec![]),
            node("Relu", &["a"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[6, 3], ramp(18, 0.1)),
            f32_init("b", &[3], ramp(3, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[4, 6])],
        vec![vi("H", dt::FLOAT, &[4, 3]), vi("Y", dt::FLOAT, &[4, 3])],
        17,
    );
    let c = ok(&shown);
    assert!(sole_epilogue(&c).is_none());
    assert_eq!(acts(&c), vec![ActFunc::Relu]);
}

#[test]
fn auto_cast_stores_matmul_and_gemm_weights_in_half_precision() {
    use nrt_compiler::{AutoCast, CastType};
    use nrt_hal::DType;
    let gemm = model(
        vec![
            node("Gemm", &["X", "W", "b"], &["g"], vec![a_i("transB", 1)]),
            node("Relu", &["g"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[6, 4], ramp(24, 0.1)),
            f32_init("b", &[6], ramp(6, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[5, 4])],
        vec![vi("Y", dt::FLOAT, &[5, 6])],
        13,
    );
    for (bytes, want_mm) in [(mlp(4, 64, 3), 3), (gemm, 1)] {
        let plain = ok(&bytes);
        for (ty, d) in [(CastType::Bf16, DType::Bf16), (CastType::Fp16, DType::F16)] {
            for cores in [1, 2] {
                let o = CompileOptions {
                    auto_cast: AutoCast::MatMult,
                    auto_cast_type: ty,
                    cores,
                    ..Default::default()
                };
                let c = compile(&bytes, None, &o).unwrap();
                check_ordering(&c.model).unwrap();
                assert!(
                    c.model
                        .producer
                        .ends_with(&format!("auto-cast matmult {d}"))
                );
                let pe = ops(&c, Engine::Pe);
                let mms: Vec<_> = pe
                    .iter()
                    .filter_map(|o| match o {
                        Op::MatMul(op::MatMul { b, epilogue, .. }) => Some((*b, *epilogue)),
                        _ => None,
                    })
                    .collect();
                assert_eq!(mms.len(), want_mm);
                for (b, e) in mms {
                    assert_eq!(b.dtype, d);
                    // Read K-contiguous (stored [N, K]): MatMul's [K, N] view has stride 1
                    // along K, Gemm's transB view is [N, K] itself.
                    assert!(b.stride[2] == 1 || b.stride[3] == 1, "{b:?}");
                    assert_eq!(e.func, ActFunc::Relu, "the epilogue still fuses");
                }
                if cores == 1 {
                    assert!(
                        c.model.constants.len() * 10 < plain.model.constants.len() * 7,
                        "{} vs {} constant bytes",
                        c.model.constants.len(),
                        plain.model.constants.len()
                    );
                }
            }
        }
    }
}

/// Constant MatMul weights of products with K ≥ 128 (f32; bf16 any K and N ≥ 32) are stored
/// packed in panels of 32 columns (`PACKED_B`); two cores split N on a panel boundary, each reading its own
/// panels of the one packed constant. Four rows or fewer (the GEMV kernels) keep B as stored.
#[test]
fn constant_weights_are_packed_in_panels_and_split_on_panel_boundaries() {
    use nrt_isa::matmul_flags::PACKED_B;
    let matmuls = |c: &Compiled, core: u8| -> Vec<Op> {
        let b = c.model.block(core, Engine::Pe).expect("block");
        decode_block(&b.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .map(|(_, i)| i.op)
            .filter(|o| matches!(o, Op::MatMul(_)))
            .collect()
    };
    let one = ok(&mlp(8, 200, 1));
    let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&one, 0)[..] else {
        panic!("one MatMul")
    };
    assert_ne!(flags & PACKED_B, 0);
    assert_eq!(b.shape, [1, 7, 200, 32]);
    assert_eq!(b.stride, [0, 6400, 32, 1]);
    let two = compile(
        &mlp(8, 200, 1),
        None,
        &CompileOptions {
            cores: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut seen = Vec::new();
    for core in 0..2 {
        let [Op::MatMul(op::MatMul { b, c, flags, .. })] = matmuls(&two, core)[..] else {
            panic!("one MatMul per core")
        };
        assert_ne!(flags & PACKED_B, 0);
        // B's address: the relocation of its field (16-byte header, then A's 48 bytes).
        let blk = two.model.block(core, Engine::Pe).unwrap();
        let (at, _) = decode_block(&blk.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .find(|(_, i)| matches!(i.op, Op::MatMul(_)))
            .unwrap();
        let r = blk
            .relocations
            .iter()
            .find(|r| r.patch_offset as usize == at + 64)
            .expect("B is relocated");
        seen.push(((r.mem_ref, r.offset), b.shape, c.shape));
    }
    // Columns 0..128 (four panels) and 128..200 (three panels, the last one padded).
    assert_eq!(seen[0].1, [1, 4, 200, 32]);
    assert_eq!(seen[1].1, [1, 3, 200, 32]);
    assert_eq!(seen[0].2[3], 128);
    assert_eq!(seen[1].2[3], 72);
    assert_eq!(seen[0].0.0, seen[1].0.0, "one packed constant");
    assert_eq!(seen[1].0.1 - seen[0].0.1, 128 * 200 * 4);
    // bf16 auto-cast: the same panels with pairs of K (`[1, 7, 100, 64]`), split the same
    // way; fp16 weights stay `[N, K]`.
    for (ty, packed) in [
        (nrt_compiler::CastType::Bf16, true),
        (nrt_compiler::CastType::Fp16, false),
    ] {
        for cores in [1u32, 2] {
            let o = CompileOptions {
                auto_cast: nrt_compiler::AutoCast::MatMult,
                auto_cast_type: ty,
                cores,
                ..Default::default()
            };
            let c = compile(&mlp(8, 200, 1), None, &o).unwrap();
            check_ordering(&c.model).unwrap();
            for core in 0..cores as u8 {
                let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&c, core)[..] else {
                    panic!("one MatMul")
                };
                assert_eq!(flags & PACKED_B != 0, packed, "{ty:?}");
                if packed {
                    assert_eq!(b.dtype, nrt_hal::DType::Bf16);
                    let panels = [7, 4, 3][(cores - 1 + core as u32) as usize];
                    assert_eq!(b.shape, [1, panels, 100, 64]);
                    assert_eq!(b.stride, [0, 6400, 64, 1]);
                }
            }
        }
    }
    // Four rows, one row: packed too (the packed GEMV streams whole panels), f32 and bf16.
    for rows in [4, 1] {
        let small = ok(&mlp(rows, 200, 1));
        let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&small, 0)[..] else {
            panic!("one MatMul")
        };
        assert_ne!(flags & PACKED_B, 0);
        assert_eq!(b.shape, [1, 7, 200, 32]);
        let o = CompileOptions {
            auto_cast: nrt_compiler::AutoCast::MatMult,
            auto_cast_type: nrt_compiler::CastType::Bf16,
            ..Default::default()
        };
        let small = compile(&mlp(rows, 200, 1), None, &o).unwrap();
        let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&small, 0)[..] else {
            panic!("one MatMul")
        };
        assert_ne!(flags & PACKED_B, 0);
        assert_eq!(b.shape, [1, 7, 100, 64]);
    }
    // Short K (the GEMM crate is faster there): as stored in f32; bf16 packed whatever K
    // (its dot-product kernel loses at every K), unless N is under a whole panel
    // (`GEMM_PACK_BF16_MIN_N`: a 32-column panel of 16–31 columns is mostly padding).
    let short = ok(&mlp(8, 100, 1));
    let [Op::MatMul(op::MatMul { flags, .. })] = matmuls(&short, 0)[..] else {
        panic!("one MatMul")
    };
    assert_eq!(flags & PACKED_B, 0);
    let bf16 = CompileOptions {
        auto_cast: nrt_compiler::AutoCast::MatMult,
        auto_cast_type: nrt_compiler::CastType::Bf16,
        ..Default::default()
    };
    for (width, shape) in [
        (100, Some([1, 4, 50, 64])),
        (24, None),
        (32, Some([1, 1, 16, 64])),
    ] {
        let c = compile(&mlp(8, width, 1), None, &bf16).unwrap();
        let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&c, 0)[..] else {
            panic!("one MatMul")
        };
        assert_eq!(
            flags & PACKED_B != 0,
            shape.is_some(),
            "bf16, width {width}"
        );
        if let Some(shape) = shape {
            assert_eq!(b.shape, shape, "bf16, width {width}");
        }
    }
}

/// A recurrent layer's constant weights are packed in panels per direction like a MatMul's
/// (`Lowerer::pack_weight_at`): W[d] (K = input) and R[d] (K = hidden) once each at K ≥ 128,
/// except GRU's R, whose gates multiply parts of it; bf16 auto-cast packs them at any K.
/// (`lstm_bidirectional_packed` and its kin in the numerics check the values.)
#[test]
fn recurrent_weights_are_packed_per_direction() {
    use nrt_isa::matmul_flags::PACKED_B;
    let rnn = |op: &str, gates: i64, input: i64, hidden: i64| {
        model(
            vec![node(
                op,
                &["X", "W", "R"],
                &["Y"],
                vec![
                    a_i("hidden_size", hidden),
                    a_s("direction", "bidirectional"),
                ],
            )],
            vec![
                f32_init(
                    "W",
                    &[2, gates * hidden, input],
                    ramp((2 * gates * hidden * input) as usize, 0.001),
                ),
                f32_init(
                    "R",
                    &[2, gates * hidden, hidden],
                    ramp((2 * gates * hidden * hidden) as usize, 0.001),
                ),
            ],
            vec![vi("X", dt::FLOAT, &[3, 2, input])],
            vec![vi("Y", dt::FLOAT, &[3, 2, 2, hidden])],
            14,
        )
    };
    let packed = |c: &Compiled| -> (usize, usize) {
        let b = c.model.block(0, Engine::Pe).expect("block");
        let mms: Vec<u32> = decode_block(&b.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .filter_map(|(_, i)| match i.op {
                Op::MatMul(op::MatMul { flags, .. }) => Some(flags),
                _ => None,
            })
            .collect();
        (
            mms.iter().filter(|&&f| f & PACKED_B != 0).count(),
            mms.len(),
        )
    };
    // LSTM, 3 steps, 2 directions: per direction one input product and 3 recurrent ones.
    assert_eq!(packed(&ok(&rnn("LSTM", 4, 128, 128))), (8, 8));
    // Hidden 32: R's K is short (f32 keeps it as stored), W's is not.
    assert_eq!(packed(&ok(&rnn("LSTM", 4, 128, 32))), (2, 8));
    let bf16 = CompileOptions {
        auto_cast: nrt_compiler::AutoCast::MatMult,
        auto_cast_type: nrt_compiler::CastType::Bf16,
        ..Default::default()
    };
    let c = compile(&rnn("LSTM", 4, 128, 32), None, &bf16).unwrap();
    assert_eq!(packed(&c), (8, 8), "bf16 packs any K");
    // GRU: only W.
    let (p, all) = packed(&ok(&rnn("GRU", 3, 128, 128)));
    assert_eq!(p, 2, "GRU packs W[d] only ({all} MatMuls)");
}
