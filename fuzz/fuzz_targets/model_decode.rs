//! Fuzzes the NCM container decoder: any byte string must decode to a model or an error —
//! never a panic, never an unbounded allocation. Valid models re-encode to themselves.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nrt_model::CompiledModel;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = CompiledModel::decode(data) {
        let again = m.encode();
        let back = CompiledModel::decode(&again).expect("a decoded model re-encodes to a valid file");
        assert_eq!(back, m);
    }
});
