//! SmolLM2-135M-Instruct end to end on the software NeuronCore: `build` its GGUF into a model
//! directory (small buckets, to keep the suite short), load it, and generate — greedy text
//! that names Paris, a chat answer, and two sequences decoded together giving what each gives
//! alone. Skips (with the reason printed) when the file is not installed.

mod common;

use nrt_llm::build::{BuildOptions, build};
use nrt_llm::generate::{GenerateParams, generate};
use nrt_llm::runner::{DecodeRow, Runner, Sampling};
use nrt_runtime::{Runtime, RuntimeConfig};
use std::sync::Arc;

fn runner() -> Option<(Runtime, Runner)> {
    let src = common::smollm2_gguf()?;
    let d = std::env::temp_dir().join(format!("nrt-smollm2-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let o = BuildOptions {
        context_buckets: Some(vec![32, 64]),
        batch_buckets: Some(vec![1, 2]),
        max_model_len: Some(64),
        ..Default::default()
    };
    let m = build(&src, &d, &o, &mut |_| {}).unwrap();
    assert_eq!(m.config.n_layer, 30);
    assert_eq!(m.programs.len(), 4);
    let dev = Arc::new(nrt_sim::SoftDevice::new(nrt_sim::SimConfig::default()).unwrap());
    let rt = Runtime::init(dev, RuntimeConfig::default()).unwrap();
    let r = Runner::load(&rt, &d, 0).unwrap();
    Some((rt, r))
}

#[test]
fn smollm2_generates_paris_and_batches_like_alone() {
    let Some((_rt, mut r)) = runner() else {
        return;
    };
    let prompt = r.tokenizer.encode("The capital of France is").unwrap();
    assert_eq!(prompt, [504, 3575, 282, 4649, 314]);
    let p = GenerateParams {
        max_tokens: 6,
        ..Default::default()
    };
    let g = generate(&mut r, 0, &prompt, &p, &mut |_| {}).unwrap();
    assert!(g.text.contains("Paris"), "{:?}", g.text);

    // A chat turn: the template applied, the answer stops at <|im_end|>.
    let t = r.template.as_ref().expect("SmolLM2 has a chat template");
    let chat = t
        .render(
            &[nrt_llm::ChatMessage::new(
                "user",
                "What is the capital of France?",
            )],
            true,
        )
        .unwrap();
    let ids = r.tokenizer.encode(&chat).unwrap();
    let p = GenerateParams {
        max_tokens: 16,
        ..Default::default()
    };
    let g = generate(&mut r, 1, &ids, &p, &mut |_| {}).unwrap();
    assert!(g.text.contains("Paris"), "{:?}", g.text);

    // Two sequences together (slots 0 and 1) give their tokens alone.
    let a = r.tokenizer.encode("The capital of France is").unwrap();
    let b = r.tokenizer.encode("One, two, three, four,").unwrap();
    let alone = |r: &mut Runner, ids: &[u32]| {
        let mut t = r.prefill(0, ids, &Sampling::greedy()).unwrap().token;
        let mut out = vec![t];
        for i in 0..4 {
            t = r
                .decode(&[DecodeRow {
                    slot: 0,
                    token: t,
                    position: ids.len() + i,
                    sampling: Sampling::greedy(),
                }])
                .unwrap()[0]
                .token;
            out.push(t);
        }
        out
    };
    let (wa, wb) = (alone(&mut r, &a), alone(&mut r, &b));
    let mut next = vec![
        r.prefill(0, &a, &Sampling::greedy()).unwrap().token,
        r.prefill(1, &b, &Sampling::greedy()).unwrap().token,
    ];
    let mut got = vec![vec![next[0]], vec![next[1]]];
    for i in 0..4 {
        next = r
            .decode(&[
                DecodeRow {
                    slot: 0,
                    token: next[0],
                    position: a.len() + i,
                    sampling: Sampling::greedy(),
                },
                DecodeRow {
                    slot: 1,
                    token: next[1],
                    position: b.len() + i,
                    sampling: Sampling::greedy(),
                },
            ])
            .unwrap()
            .iter()
            .map(|s| s.token)
            .collect();
        got[0].push(next[0]);
        got[1].push(next[1]);
    }
    assert_eq!(got, vec![wa, wb]);
}
