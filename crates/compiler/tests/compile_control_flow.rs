//! End-to-end compile tests of control flow: `If` predicated on a run-time condition or
//! folded on a constant one, `Loop` unrolled over a compile-time trip count (and refused
//! otherwise), and FlexAttention's score_mod subgraph.

mod common;

use common::e2e::*;
use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::onnx::{AttributeProto, GraphProto, NodeProto, attribute_type};
use nrt_compiler::{CompileOptions, ErrorKind, HostTensor, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{Op, decode_block};

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
