//! Lowering of the operators and fusions added for the light models and the benchmark
//! models: what instructions each pattern becomes. (Numbers are checked end to end by
//! `nrt conformance` on the ONNX node tests, the light models and `nrt samples`.)

mod common;

use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, Compiled, compile};
use nrt_hal::Engine;
use nrt_isa::{ActFunc, Op, decode_block};
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
        .filter(|o| !matches!(o, Op::Nop | Op::End))
        .collect()
}

fn acts(c: &Compiled) -> Vec<ActFunc> {
    ops(c, Engine::Act)
        .iter()
        .filter_map(|o| match o {
            Op::Activation { func, .. } => Some(*func),
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
    let Op::Pool {
        input,
        window,
        count_include_pad,
        ..
    } = pool[0]
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
