//! Fuzzes the `.npy` reader (`nrt run --input NAME=FILE.npy`): any byte string must read to
//! a tensor whose shape holds exactly its values, or to an error — never a panic, a blow-up
//! in time (the `npyz` parser it replaced was exponential in bracket nesting) or an
//! allocation the file's size does not justify.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = nrt_compiler::npy::read_from(data, data.len() as u64) {
        let n: usize = t.shape.iter().product();
        assert_eq!(n, t.len());
    }
});
