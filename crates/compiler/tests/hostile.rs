//! Hostile ONNX models: huge shapes, huge folded constants, overflowing attributes. Each must
//! give a clean compile error naming the node (or input) — never an abort, a wrapped size or
//! an "internal compiler error".

mod common;

use common::*;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, ErrorKind, compile};

/// Compiles `bytes`, expecting an error of `kind` that names `culprit` (node or input).
fn fails(bytes: &[u8], kind: ErrorKind, culprit: &str) -> String {
    let e = compile(bytes, None, &CompileOptions::default()).expect_err("should fail");
    let s = e.to_string();
    assert_eq!(e.kind, kind, "{s}");
    assert!(s.contains(culprit), "'{culprit}' not named in: {s}");
    s
}

const T40: i64 = 1 << 40;
const T20: i64 = 1 << 20;

/// D5: `ConstantOfShape([2^40])` folded a 4 TiB constant ("memory allocation of
/// 4398046511104 bytes failed", exit 134).
#[test]
fn d5_constant_of_shape_2_40_feeding_add_is_too_large() {
    let m = model(
        vec![
            node("ConstantOfShape", &["S"], &["C"], vec![]),
            node("Add", &["X", "C"], &["Y"], vec![]),
        ],
        vec![i64_init("S", &[1], vec![T40])],
        vec![vi("X", dt::FLOAT, &[1])],
        vec![vi("Y", dt::FLOAT, &[T40])],
        13,
    );
    let s = fails(&m, ErrorKind::TooLarge, "ConstantOfShape_C");
    assert!(s.contains("too large"), "{s}");
}

/// D5: shape `[2^20, 2^20]` (2^40 elements).
#[test]
fn d5_constant_of_shape_2_20_by_2_20_is_too_large() {
    let m = model(
        vec![
            node("ConstantOfShape", &["S"], &["C"], vec![]),
            node("Add", &["X", "C"], &["Y"], vec![]),
        ],
        vec![i64_init("S", &[2], vec![T20, T20])],
        vec![vi("X", dt::FLOAT, &[1])],
        vec![vi("Y", dt::FLOAT, &[T20, T20])],
        13,
    );
    fails(&m, ErrorKind::TooLarge, "ConstantOfShape_C");
}

/// D5: `Expand` of a constant to 2^40 elements (folded on the host).
#[test]
fn d5_expand_of_constant_to_2_40_elements_is_too_large() {
    let m = model(
        vec![
            node("Expand", &["K", "S"], &["C"], vec![]),
            node("Add", &["X", "C"], &["Y"], vec![]),
        ],
        vec![
            f32_init("K", &[1], vec![1.0]),
            i64_init("S", &[2], vec![T20, T20]),
        ],
        vec![vi("X", dt::FLOAT, &[1])],
        vec![vi("Y", dt::FLOAT, &[T20, T20])],
        13,
    );
    fails(&m, ErrorKind::TooLarge, "Expand_C");
}

/// D5: a shape computed by `Shape → Mul → ConstantOfShape`.
#[test]
fn d5_shape_mul_constant_of_shape_is_too_large() {
    let m = model(
        vec![
            node("Shape", &["X"], &["S"], vec![]),
            node("Mul", &["S", "F"], &["S2"], vec![]),
            node("ConstantOfShape", &["S2"], &["C"], vec![]),
            node("Add", &["X", "C"], &["Y"], vec![]),
        ],
        vec![i64_init("F", &[1], vec![T20])],
        vec![vi("X", dt::FLOAT, &[T20])],
        vec![vi("Y", dt::FLOAT, &[T40])],
        13,
    );
    fails(&m, ErrorKind::TooLarge, "ConstantOfShape_C");
}

/// D5: the budget also holds for values computed on the device: an Expand of an input.
#[test]
fn d5_expand_of_input_to_2_40_elements_is_too_large() {
    let m = model(
        vec![node("Expand", &["X", "S"], &["Y"], vec![])],
        vec![i64_init("S", &[2], vec![T20, T20])],
        vec![vi("X", dt::FLOAT, &[1])],
        vec![vi("Y", dt::FLOAT, &[T20, T20])],
        13,
    );
    fails(&m, ErrorKind::TooLarge, "Expand_Y");
}

/// D7: a Relu over `[2^31, 2^31, 2^31]` compiled to I/O tensors of size 0 (the element
/// count wrapped) and `nrt run` "succeeded" with an empty output.
#[test]
fn d7_relu_over_input_whose_size_overflows_is_too_large() {
    let d = 1i64 << 31;
    let m = model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[d, d, d])],
        vec![vi("Y", dt::FLOAT, &[d, d, d])],
        13,
    );
    fails(&m, ErrorKind::TooLarge, "input 'X'");
    // Under u64 but over the budget.
    let m = model(
        vec![node("Relu", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[d, d])],
        vec![vi("Y", dt::FLOAT, &[d, d])],
        13,
    );
    fails(&m, ErrorKind::TooLarge, "input 'X'");
}

/// D11: `Pad` with pads `[0, INT64_MIN, 0, INT64_MAX]` overflowed the output-size arithmetic
/// and ended in "internal compiler error: the emitted model does not validate".
#[test]
fn d11_pad_with_extreme_pads_is_a_bad_attribute() {
    for pads in [
        [0, i64::MIN, 0, i64::MAX],
        [0, i64::MAX, 0, i64::MIN],
        [0, i64::MAX, 0, i64::MAX],
        [0, -5, 0, 1],
    ] {
        let m = model(
            vec![node("Pad", &["X", "P"], &["Y"], vec![])],
            vec![i64_init("P", &[4], pads.to_vec())],
            vec![vi("X", dt::FLOAT, &[2, 3])],
            vec![vi("Y", dt::FLOAT, &[2, 3])],
            13,
        );
        let s = fails(&m, ErrorKind::BadAttribute, "Pad_Y");
        assert!(s.contains("pads"), "{s}");
    }
}

/// Per-dimension attributes of a 0-d tensor — a permutation, slice or pad axis 0, which a
/// scalar does not have (`norm_axis` accepts axis 0 of rank 0 for the operators that treat a
/// scalar as one element) — are attribute errors naming the node, not an index past an empty
/// array (Transpose's `perm [0]` panicked: found by the `compile_onnx` fuzz target).
#[test]
fn axes_of_a_scalar_are_bad_attributes() {
    let scalar_in = || vec![vi("X", dt::FLOAT, &[])];
    let transpose = model(
        vec![node(
            "Transpose",
            &["X"],
            &["Y"],
            vec![a_ints("perm", &[0])],
        )],
        vec![],
        scalar_in(),
        vec![vi("Y", dt::FLOAT, &[])],
        13,
    );
    fails(&transpose, ErrorKind::BadAttribute, "Transpose");
    let slice = model(
        vec![node("Slice", &["X", "s", "e", "a"], &["Y"], vec![])],
        vec![
            i64_init("s", &[1], vec![0]),
            i64_init("e", &[1], vec![1]),
            i64_init("a", &[1], vec![0]),
        ],
        scalar_in(),
        vec![vi("Y", dt::FLOAT, &[])],
        13,
    );
    fails(&slice, ErrorKind::BadAttribute, "Slice");
    let pad = model(
        vec![node("Pad", &["X", "p", "", "a"], &["Y"], vec![])],
        vec![
            i64_init("p", &[2], vec![1, 1]),
            i64_init("a", &[1], vec![0]),
        ],
        scalar_in(),
        vec![vi("Y", dt::FLOAT, &[])],
        18,
    );
    fails(&pad, ErrorKind::BadAttribute, "Pad");
}

/// Issue 54, S13: a NaN or infinite float attribute — Attention's `scale`, a normalization's
/// `epsilon`, an activation's coefficient — was carried into an instruction the emitted
/// model then failed to validate with ("internal compiler error"), or compiled into a model
/// computing NaN. Each is a bad attribute naming the node and the attribute; so are the
/// negative scales and epsilons the device cannot take.
#[test]
fn s13_non_finite_float_attributes_are_bad_attributes_naming_node_and_attribute() {
    let f = dt::FLOAT;
    let qkv = || {
        vec![
            vi("Q", f, &[1, 2, 3, 4]),
            vi("K", f, &[1, 2, 3, 4]),
            vi("V", f, &[1, 2, 3, 4]),
        ]
    };
    let y = || vec![vi("Y", f, &[])];
    // (case, model, attribute)
    let mut cases: Vec<(String, Vec<u8>, &str)> = Vec::new();
    for (tag, v) in [
        ("nan", f32::NAN),
        ("inf", f32::INFINITY),
        ("-inf", f32::NEG_INFINITY),
    ] {
        for attr in ["scale", "softcap"] {
            let m = model(
                vec![node(
                    "Attention",
                    &["Q", "K", "V"],
                    &["Y"],
                    vec![a_f(attr, v)],
                )],
                vec![],
                qkv(),
                y(),
                23,
            );
            cases.push((format!("Attention {attr}={tag}"), m, attr));
        }
        for (op, opset) in [("LayerNormalization", 17), ("RMSNormalization", 23)] {
            let m = model(
                vec![node(op, &["X", "S"], &["Y"], vec![a_f("epsilon", v)])],
                vec![f32_init("S", &[4], vec![1.0; 4])],
                vec![vi("X", f, &[2, 4])],
                y(),
                opset,
            );
            cases.push((format!("{op} epsilon={tag}"), m, "epsilon"));
        }
        for (op, extra) in [
            ("GroupNormalization", vec![a_i("num_groups", 2)]),
            ("InstanceNormalization", vec![]),
        ] {
            let mut attrs = extra;
            attrs.push(a_f("epsilon", v));
            let m = model(
                vec![node(op, &["X", "S", "B"], &["Y"], attrs)],
                vec![
                    f32_init("S", &[4], vec![1.0; 4]),
                    f32_init("B", &[4], vec![0.0; 4]),
                ],
                vec![vi("X", f, &[1, 4, 2, 2])],
                y(),
                21,
            );
            cases.push((format!("{op} epsilon={tag}"), m, "epsilon"));
        }
        for (op, attr) in [
            ("LeakyRelu", "alpha"),
            ("HardSigmoid", "beta"),
            ("Elu", "alpha"),
            ("Selu", "gamma"),
            ("Celu", "alpha"),
            ("ThresholdedRelu", "alpha"),
            ("Shrink", "lambd"),
            ("LRN", "bias"),
        ] {
            let mut attrs = vec![a_f(attr, v)];
            if op == "LRN" {
                attrs.push(a_i("size", 3));
            }
            let m = model(
                vec![node(op, &["X"], &["Y"], attrs)],
                vec![],
                vec![vi("X", f, &[1, 4, 2, 2])],
                y(),
                17,
            );
            cases.push((format!("{op} {attr}={tag}"), m, attr));
        }
        let m = model(
            vec![node("Gemm", &["X", "W"], &["Y"], vec![a_f("alpha", v)])],
            vec![f32_init("W", &[4, 3], vec![1.0; 12])],
            vec![vi("X", f, &[2, 4])],
            y(),
            17,
        );
        cases.push((format!("Gemm alpha={tag}"), m, "alpha"));
    }
    // Negative: √scale has no value; the device's LayerNorm takes no negative epsilon.
    let m = model(
        vec![node(
            "Attention",
            &["Q", "K", "V"],
            &["Y"],
            vec![a_f("scale", -1.0)],
        )],
        vec![],
        qkv(),
        y(),
        23,
    );
    cases.push(("Attention scale=-1".into(), m, "scale"));
    let m = model(
        vec![node(
            "LayerNormalization",
            &["X", "S"],
            &["Y"],
            vec![a_f("epsilon", -1e-5)],
        )],
        vec![f32_init("S", &[4], vec![1.0; 4])],
        vec![vi("X", f, &[2, 4])],
        y(),
        17,
    );
    cases.push(("LayerNormalization epsilon=-1e-5".into(), m, "epsilon"));
    let m = model(
        vec![node("Clip", &["X"], &["Y"], vec![a_f("min", f32::NAN)])],
        vec![],
        vec![vi("X", f, &[2, 4])],
        y(),
        6,
    );
    cases.push(("Clip-6 min=NaN".into(), m, "min"));
    for (what, m, attr) in cases {
        let e = compile(&m, None, &CompileOptions::default())
            .map(|_| ())
            .expect_err(&what);
        let s = e.to_string();
        assert_eq!(e.kind, ErrorKind::BadAttribute, "{what}: {s}");
        let op = what.split(' ').next().unwrap().trim_end_matches("-6");
        assert!(
            s.contains(&format!("{op}_Y")),
            "{what}: node not named: {s}"
        );
        assert!(
            s.contains(&format!("'{attr}'")) || s.contains(attr),
            "{what}: {s}"
        );
    }
}

/// Issue 54, S13 (its kin): a NaN scalar constant operand of a binary operator (`X + NaN`,
/// legal ONNX) became the immediate of a `TensorScalar`, which cannot be NaN: "internal
/// compiler error: the emitted model does not validate". It now compiles (the constant is
/// read from memory).
#[test]
fn s13_a_nan_scalar_constant_operand_compiles() {
    for op in ["Add", "Mul", "Sub", "Div", "Pow"] {
        let m = model(
            vec![node(op, &["X", "C"], &["Y"], vec![])],
            vec![f32_init("C", &[], vec![f32::NAN])],
            vec![vi("X", dt::FLOAT, &[2, 4])],
            vec![vi("Y", dt::FLOAT, &[2, 4])],
            17,
        );
        if let Err(e) = compile(&m, None, &CompileOptions::default()) {
            panic!("{op} with a NaN constant: {e}");
        }
    }
}
