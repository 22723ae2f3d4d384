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
