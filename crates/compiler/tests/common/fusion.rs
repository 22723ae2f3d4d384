//! Helpers of the fusion tests: compiling a model that must compile, and reading back the
//! operations, activations and MatMul epilogues of its blocks.

use nrt_compiler::check::check_ordering;
use nrt_compiler::{CompileOptions, Compiled, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{ActFunc, Epilogue, Op, decode_block};
use nrt_model::CompiledModel;

pub fn ok(bytes: &[u8]) -> Compiled {
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
pub fn ops(c: &Compiled, engine: Engine) -> Vec<Op> {
    let b = c.model.block(0, engine).expect("block");
    decode_block(&b.code, engine)
        .expect("decodes")
        .into_iter()
        .map(|(_, i)| i.op)
        .filter(|o| !matches!(o, Op::Nop(op::Nop) | Op::End(op::End)))
        .collect()
}

pub fn acts(c: &Compiled) -> Vec<ActFunc> {
    ops(c, Engine::Act)
        .iter()
        .filter_map(|o| match o {
            Op::Activation(op::Activation { func, .. }) => Some(*func),
            _ => None,
        })
        .collect()
}

pub fn count(ops: &[Op], name: &str) -> usize {
    ops.iter().filter(|o| o.name() == name).count()
}

/// The epilogue of the one MatMul of `c`'s PE block.
pub fn sole_epilogue(c: &Compiled) -> Epilogue {
    let pe = ops(c, Engine::Pe);
    assert_eq!(pe.len(), 1, "{pe:?}");
    let Op::MatMul(op::MatMul { epilogue, .. }) = pe[0] else {
        panic!("{pe:?}")
    };
    epilogue
}
