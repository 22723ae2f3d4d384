//! Outputs whose extent depends on the data (NonZero, Unique, NonMaxSuppression): the
//! static upper bound each gets, the `<name>:shape` companion outputs, the scalars read at
//! execution time, and the error when a node reads such a value. (The kernels' planted edge
//! cases are in `crates/kernels/tests/dynshape.rs`; the ONNX node tests run them on the
//! device through `nrt conformance`.)

mod common;

use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, Compiled, ErrorKind, HostTensor, compile};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{Op, decode_block, nms_flags};
use nrt_model::{CompiledModel, Usage};

fn ok(bytes: &[u8], opts: &CompileOptions) -> Compiled {
    let c = compile(bytes, None, opts).unwrap_or_else(|e| panic!("{e}"));
    let back = CompiledModel::decode(&c.model.encode()).expect("round trip");
    assert_eq!(back, c.model);
    check_ordering(&c.model).unwrap_or_else(|e| panic!("ordering: {e}"));
    c
}

/// The outputs: (name, type, shape).
fn outputs(c: &Compiled) -> Vec<(String, DType, Vec<u32>)> {
    c.model
        .io
        .iter()
        .filter(|t| t.usage == Usage::Output)
        .map(|t| (t.name.clone(), t.dtype, t.shape.clone()))
        .collect()
}

fn pool_ops(c: &Compiled) -> Vec<Op> {
    decode_block(&c.model.block(0, Engine::Pool).unwrap().code, Engine::Pool)
        .unwrap()
        .into_iter()
        .map(|(_, i)| i.op)
        .collect()
}

#[test]
fn non_zero_output_is_its_bound_with_a_shape_companion() {
    let m = model(
        vec![node("NonZero", &["X"], &["Y"], vec![])],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 3])],
        vec![vi("Y", dt::INT64, &[2, -1])],
        13,
    );
    let c = ok(&m, &CompileOptions::default());
    assert_eq!(
        outputs(&c),
        [
            ("Y".to_string(), DType::I64, vec![2, 6]),
            ("Y:shape".to_string(), DType::I64, vec![2]),
        ]
    );
    assert!(pool_ops(&c).iter().any(|o| matches!(o, Op::NonZero(_))));
}

#[test]
fn unique_bounds_y_indices_counts_and_not_inverse() {
    let m = model(
        vec![node(
            "Unique",
            &["X"],
            &["Y", "I", "V", "C"],
            vec![a_i("axis", 1), a_i("sorted", 1)],
        )],
        vec![],
        vec![vi("X", dt::FLOAT, &[2, 5, 3])],
        vec![
            vi("Y", dt::FLOAT, &[2, -1, 3]),
            vi("I", dt::INT64, &[-1]),
            vi("V", dt::INT64, &[5]),
            vi("C", dt::INT64, &[-1]),
        ],
        11,
    );
    let c = ok(&m, &CompileOptions::default());
    let names: Vec<(String, Vec<u32>)> = outputs(&c).into_iter().map(|(n, _, s)| (n, s)).collect();
    let want: Vec<(String, Vec<u32>)> = [
        ("Y", vec![2, 5, 3]),
        ("Y:shape", vec![3]),
        ("I", vec![5]),
        ("I:shape", vec![1]),
        ("V", vec![5]),
        ("C", vec![5]),
        ("C:shape", vec![1]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    assert_eq!(names, want);
    let ops = pool_ops(&c);
    let u = ops.iter().find_map(|o| match o {
        Op::Unique(op::Unique { dims, sorted, .. }) => Some((*dims, *sorted)),
        _ => None,
    });
    let (dims, sorted) = u.expect("a Unique instruction");
    assert!(sorted);
    assert_eq!((dims.rank, dims.axis), (3, 1));
    assert_eq!(dims.dims[..3], [2, 5, 3]);
}

fn nms_model(thresholds_as_inputs: bool) -> Vec<u8> {
    let mut inputs = vec![
        vi("boxes", dt::FLOAT, &[2, 6, 4]),
        vi("scores", dt::FLOAT, &[2, 3, 6]),
        vi("max", dt::INT64, &[1]),
    ];
    let mut inits = vec![];
    if thresholds_as_inputs {
        inputs.push(vi("iou", dt::FLOAT, &[1]));
        inputs.push(vi("score", dt::FLOAT, &[1]));
    } else {
        inits.push(f32_init("iou", &[1], vec![0.5]));
        inits.push(f32_init("score", &[1], vec![0.25]));
    }
    model(
        vec![node(
            "NonMaxSuppression",
            &["boxes", "scores", "max", "iou", "score"],
            &["S"],
            vec![a_i("center_point_box", 1)],
        )],
        inits,
        inputs,
        vec![vi("S", dt::INT64, &[-1, 3])],
        11,
    )
}

fn nms_op(c: &Compiled) -> Op {
    pool_ops(c)
        .into_iter()
        .find(|o| matches!(o, Op::NonMaxSuppression(_)))
        .expect("a NonMaxSuppression instruction")
}

#[test]
fn nms_reads_its_thresholds_at_execution_time() {
    // max_output_boxes_per_class an input: bound 2·3·6; every scalar an operand.
    let c = ok(&nms_model(true), &CompileOptions::default());
    assert_eq!(outputs(&c)[0].2, vec![36, 3]);
    assert_eq!(outputs(&c)[1], ("S:shape".to_string(), DType::I64, vec![2]));
    let Op::NonMaxSuppression(op::NonMaxSuppression { flags, .. }) = nms_op(&c) else {
        unreachable!()
    };
    let all = nms_flags::CENTER_POINT_BOX | nms_flags::MAX_OUT | nms_flags::IOU | nms_flags::SCORE;
    assert_eq!(flags, all);
}

#[test]
fn nms_with_compile_time_scalars_bounds_by_max_output() {
    // max = 2 known at compile time: bound 2·3·min(6, 2); constant thresholds are immediates.
    let mut o = CompileOptions::default();
    o.input_values.insert(
        "max".into(),
        HostTensor::from_f64s(DType::I64, vec![1], [2.0].into_iter()),
    );
    let c = ok(&nms_model(false), &o);
    assert_eq!(outputs(&c)[0].2, vec![12, 3]);
    let Op::NonMaxSuppression(op::NonMaxSuppression {
        flags,
        max_out_const,
        iou_const,
        score_const,
        ..
    }) = nms_op(&c)
    else {
        unreachable!()
    };
    assert_eq!(flags, nms_flags::CENTER_POINT_BOX | nms_flags::SCORE_CONST);
    assert_eq!((max_out_const, iou_const, score_const), (2, 0.5, 0.25));
}

#[test]
fn a_node_reading_a_data_dependent_value_is_rejected_naming_both() {
    let m = model(
        vec![
            node("NonZero", &["X"], &["N"], vec![]),
            node("Cast", &["N"], &["Y"], vec![a_i("to", dt::FLOAT as i64)]),
        ],
        vec![],
        vec![vi("X", dt::FLOAT, &[4])],
        vec![vi("Y", dt::FLOAT, &[1, -1])],
        13,
    );
    let e = compile(&m, None, &CompileOptions::default()).expect_err("should fail");
    assert_eq!(e.kind, ErrorKind::UnsupportedOp, "{e}");
    let s = e.to_string();
    for part in ["NonZero_N", "Cast_Y", "depends on the data", "graph output"] {
        assert!(s.contains(part), "'{part}' not in: {s}");
    }
}

#[test]
fn a_companion_name_already_taken_is_an_error() {
    let m = model(
        vec![
            node("NonZero", &["X"], &["Y"], vec![]),
            node("Relu", &["X"], &["Y:shape"], vec![]),
        ],
        vec![],
        vec![vi("X", dt::FLOAT, &[4])],
        vec![vi("Y", dt::INT64, &[1, -1]), vi("Y:shape", dt::FLOAT, &[4])],
        13,
    );
    let e = compile(&m, None, &CompileOptions::default()).expect_err("should fail");
    assert!(e.to_string().contains("Y:shape"), "{e}");
}

#[test]
fn roi_align_reads_regions_at_execution_time() {
    let m = model(
        vec![node(
            "RoiAlign",
            &["X", "rois", "bi"],
            &["Y"],
            vec![
                a_i("output_height", 3),
                a_i("output_width", 2),
                a_s("mode", "max"),
                a_f("spatial_scale", 0.25),
            ],
        )],
        vec![],
        vec![
            vi("X", dt::FLOAT, &[2, 4, 8, 8]),
            vi("rois", dt::FLOAT, &[5, 4]),
            vi("bi", dt::INT64, &[5]),
        ],
        vec![vi("Y", dt::FLOAT, &[5, 4, 3, 2])],
        16,
    );
    let c = ok(&m, &CompileOptions::default());
    assert_eq!(outputs(&c)[0].2, vec![5, 4, 3, 2]);
    let op = pool_ops(&c)
        .into_iter()
        .find(|o| matches!(o, Op::RoiAlign(_)))
        .expect("a RoiAlign instruction");
    let Op::RoiAlign(op::RoiAlign {
        flags,
        spatial_scale,
        sampling_ratio,
        ..
    }) = op
    else {
        unreachable!()
    };
    // Opset 16: half_pixel by default.
    use nrt_isa::roi_flags;
    assert_eq!(flags, roi_flags::MAX | roi_flags::HALF_PIXEL);
    assert_eq!((spatial_scale, sampling_ratio), (0.25, 0));
}
