//! Fuzzes the compiler from ONNX (`nrt compile`): any byte string must compile to a model or
//! give an error — never a panic, an overflow, an unbounded allocation or a hang. A model it
//! compiles must pass the compiler's own ordering check and decode back from its bytes (the
//! loader's validation of what the compiler emits is `model_exec`'s job).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nrt_compiler::{CompileOptions, compile};
use nrt_model::CompiledModel;

fuzz_target!(|data: &[u8]| {
    // Both kinds of product: f32 weights, and bf16 weights packed in panels (the first byte
    // picks, so one corpus covers both).
    let mut opts = CompileOptions::default();
    if data.first().is_some_and(|b| b & 1 == 1) {
        opts.auto_cast = nrt_compiler::AutoCast::MatMult;
        opts.auto_cast_type = nrt_compiler::CastType::Bf16;
    }
    if let Ok(c) = compile(data, None, &opts) {
        nrt_compiler::check::check_ordering(&c.model).expect("a compiled model is well ordered");
        let bytes = c.model.encode();
        CompiledModel::decode(&bytes).expect("a compiled model decodes");
    }
});
