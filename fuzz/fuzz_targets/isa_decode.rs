//! Fuzzes the instruction decoder: the first byte picks the engine, the rest is a block.
//! Decoding must never panic; every instruction that decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nrt_hal::Engine;
use nrt_isa::{BlockDecoder, Instruction};

fuzz_target!(|data: &[u8]| {
    let Some((&e, block)) = data.split_first() else { return };
    let engine = Engine::ALL[e as usize % Engine::ALL.len()];
    for r in BlockDecoder::new(block, engine) {
        let Ok((at, ins)) = r else { break };
        let mut again = Vec::new();
        ins.encode(&mut again);
        let (back, len) = Instruction::decode(&again).expect("re-encoded instruction decodes");
        assert_eq!(back, ins);
        assert_eq!(&block[at..at + len], &again[..], "decode/encode is the identity");
    }
});
