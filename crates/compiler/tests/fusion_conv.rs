//! Convolution and pooling lowering: im2col scratch and the fused Relu, an output read twice,
//! 3-D pooling as two separable pools, batch norm folded into its convolution.

mod common;

use common::fusion::*;
use common::*;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, Compiled, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{ActFunc, Op, decode_block};

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
