//! Hostile GGUF files: the tiny llama cut at every byte of its header and mutated at random
//! (bytes, and whole u64 fields set to extremes). Everything this crate reads from a file —
//! the reader, the configuration, the tensor map, every dequantization, the tokenizer (and an
//! encode/decode with it), the chat template — must end in a value or an error, never a
//! panic, an abort or a hang.

use std::sync::OnceLock;

use nrt_llm::testing::TinyLlama;
use nrt_llm::{ChatMessage, ChatTemplate, GgufFile, LlamaConfig, LlamaTensors, Tokenizer};
use proptest::prelude::*;

fn seed() -> &'static (Vec<u8>, usize) {
    static SEED: OnceLock<(Vec<u8>, usize)> = OnceLock::new();
    SEED.get_or_init(|| {
        let b = TinyLlama {
            n_layer: 1,
            n_embd: 32,
            n_ff: 32,
            n_head: 2,
            n_head_kv: 1,
            ..TinyLlama::default()
        }
        .to_gguf();
        let header = GgufFile::from_bytes(b.clone()).unwrap().gguf.data_start as usize;
        (b, header)
    })
}

/// Reads everything; returns how far it got (for the coverage check).
fn exercise(bytes: &[u8]) -> usize {
    let Ok(f) = GgufFile::from_bytes(bytes.to_vec()) else {
        return 0;
    };
    for t in f.gguf.tensors() {
        let _ = f.tensor_f32(&t.name);
        let _ = f.tensor_row_f32(&t.name, 0);
    }
    let Ok(c) = LlamaConfig::from_gguf(&f.gguf) else {
        return 1;
    };
    let _ = LlamaTensors::from_gguf(&f.gguf, &c);
    let Ok(tok) = Tokenizer::from_gguf(&f.gguf) else {
        return 2;
    };
    if let Ok(ids) = tok.encode("the cat in <|im_start|>an 42 ünï 🦀") {
        let _ = tok.decode(&ids);
        let mut s = tok.stream(true);
        for id in ids {
            let _ = s.push(id);
        }
        s.finish();
    }
    if let Ok(Some(t)) = ChatTemplate::from_gguf(&f.gguf, &tok) {
        let _ = t.render(&[ChatMessage::new("user", "hi")], true);
    }
    3
}

#[test]
fn every_truncation_is_an_error() {
    let (bytes, header) = seed();
    for cut in 0..*header + 64 {
        assert!(
            GgufFile::from_bytes(bytes[..cut].to_vec()).is_err(),
            "cut at {cut} parsed"
        );
    }
    assert_eq!(exercise(bytes), 3);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_bytes(muts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let (bytes, header) = seed();
        let mut b = bytes.clone();
        for (at, v) in muts {
            // Mostly the header (where the structure is), sometimes the data.
            let i = at.index(if v % 8 == 0 { b.len() } else { *header });
            b[i] = v;
        }
        exercise(&b);
    }

    #[test]
    fn mutated_u64_fields(
        muts in prop::collection::vec(
            (any::<prop::sample::Index>(), prop::sample::select(vec![
                u64::MAX, u64::MAX - 7, i64::MAX as u64, 1 << 63, 1 << 40, 1 << 32,
                u32::MAX as u64, 0x8000_0000, 1 << 20, 65, 0,
            ])),
            1..3,
        ),
        shift in 0usize..8,
    ) {
        let (bytes, header) = seed();
        let mut b = bytes.clone();
        for (at, v) in muts {
            let i = at.index(*header - 8 - shift) + shift;
            b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
        exercise(&b);
    }
}

/// The mutations reach every stage: a fuzz test whose inputs all die in the reader would
/// prove little about the rest.
#[test]
fn mutations_reach_every_stage() {
    let (bytes, header) = seed();
    let mut rng = nrt_llm::testing::Rng::new(7);
    let mut stages = [0usize; 4];
    for _ in 0..400 {
        let mut b = bytes.clone();
        let r = (rng.next_f32() + 1.0) / 2.0;
        let i = ((r * *header as f32) as usize).min(*header - 1);
        b[i] = ((rng.next_f32() + 1.0) * 127.0) as u8;
        stages[exercise(&b)] += 1;
    }
    println!("stages reached (reader, config, tokenizer, all): {stages:?}");
    assert!(stages.iter().all(|&n| n > 0), "{stages:?}");
}
