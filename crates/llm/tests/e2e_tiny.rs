//! The whole LLM path on the tiny llama (random weights, written as GGUF by the crate's own
//! test code): `build` a model directory, load it on the software NeuronCore, prefill and
//! decode — checked against a plain host forward pass written here (f64, the textbook llama:
//! adjacent-pair RoPE, grouped-query attention, RMSNorm, SwiGLU), and against itself: a
//! prompt padded into a larger bucket, and sequences decoded together, give exactly what
//! they give alone.

use nrt_llm::build::{BuildOptions, WeightFormat, build};
use nrt_llm::generate::{FinishReason, GenerateParams, generate};
use nrt_llm::runner::{DecodeRow, Runner, Sampling};
use nrt_llm::testing::TinyLlama;
use nrt_llm::{GgufFile, LlamaConfig};
use nrt_runtime::{Runtime, RuntimeConfig};
use std::path::Path;
use std::sync::Arc;

#[path = "common/tiny_dir.rs"]
mod tiny_dir;
use tiny_dir::{built, options, runtime, tmp};

/// The textbook llama forward pass in f64 over the dequantized weights: greedy tokens.
struct Reference {
    c: LlamaConfig,
    w: std::collections::HashMap<String, Vec<f64>>,
}

impl Reference {
    fn new(src: &Path) -> Reference {
        let f = GgufFile::open(src).unwrap();
        let c = LlamaConfig::from_gguf(&f.gguf).unwrap();
        let w = nrt_llm::graph::weights(&c)
            .into_iter()
            .map(|(n, _)| {
                let v = f.tensor_f32(&n).unwrap();
                (n, v.into_iter().map(f64::from).collect())
            })
            .collect();
        Reference { c, w }
    }

    /// `W · x` for `W` stored `[out, in]`.
    fn mv(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let w = &self.w[name];
        let n = x.len();
        w.chunks_exact(n)
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    }

    fn rms(&self, name: &str, x: &[f64]) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + self.c.rms_norm_eps as f64).sqrt();
        x.iter()
            .zip(&self.w[name])
            .map(|(v, g)| v * r * g)
            .collect()
    }

    fn rope(&self, x: &mut [f64], pos: usize) {
        let hd = self.c.head_dim;
        for head in x.chunks_exact_mut(hd) {
            for i in 0..hd / 2 {
                let theta = (self.c.rope_freq_base as f64).powf(-2.0 * i as f64 / hd as f64);
                let (s, co) = (pos as f64 * theta).sin_cos();
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * co - b * s;
                head[2 * i + 1] = a * s + b * co;
            }
        }
    }

    /// The logits after `tokens` (recomputed from scratch).
    fn logits(&self, tokens: &[u32]) -> Vec<f64> {
        let c = &self.c;
        let (hd, e) = (c.head_dim, c.n_embd);
        let group = c.n_head / c.n_head_kv;
        let emb = &self.w["token_embd.weight"];
        let mut xs: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| emb[t as usize * e..(t as usize + 1) * e].to_vec())
            .collect();
        for l in 0..c.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            let mut qs = Vec::new();
            for (p, x) in xs.iter().enumerate() {
                let h = self.rms(&n("attn_norm"), x);
                let mut q = self.mv(&n("attn_q"), &h);
                let mut k = self.mv(&n("attn_k"), &h);
                self.rope(&mut q, p);
                self.rope(&mut k, p);
                qs.push(q);
                ks.push(k);
                vs.push(self.mv(&n("attn_v"), &h));
            }
            for (p, x) in xs.iter_mut().enumerate() {
                let mut o = vec![0.0; c.n_head * hd];
                for j in 0..c.n_head {
                    let kv = j / group;
                    let q = &qs[p][j * hd..(j + 1) * hd];
                    let s: Vec<f64> = (0..=p)
                        .map(|t| {
                            let k = &ks[t][kv * hd..(kv + 1) * hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt()
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                    for (t, sv) in s.iter().enumerate() {
                        let pr = (sv - m).exp() / z;
                        for d in 0..hd {
                            o[j * hd + d] += pr * vs[t][kv * hd + d];
                        }
                    }
                }
                let a = self.mv(&n("attn_output"), &o);
                x.iter_mut().zip(&a).for_each(|(v, d)| *v += d);
                let h = self.rms(&n("ffn_norm"), x);
                let g = self.mv(&n("ffn_gate"), &h);
                let u = self.mv(&n("ffn_up"), &h);
                let act: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let d = self.mv(&n("ffn_down"), &act);
                x.iter_mut().zip(&d).for_each(|(v, d)| *v += d);
            }
        }
        let h = self.rms("output_norm.weight", xs.last().unwrap());
        self.mv("token_embd.weight", &h)
    }

    fn greedy(&self, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut t = prompt.to_vec();
        let mut out = Vec::new();
        for _ in 0..n {
            let l = self.logits(&t);
            let (best, _) = l
                .iter()
                .enumerate()
                .fold((0, f64::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b });
            out.push(best as u32);
            t.push(best as u32);
        }
        out
    }
}

/// Greedy tokens from the device: prefill then decode one row at a time.
fn device_greedy(r: &mut Runner, slot: usize, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut t = r.prefill(slot, prompt, &Sampling::greedy()).unwrap().token;
    let mut out = vec![t];
    for i in 1..n {
        let position = prompt.len() + i - 1;
        t = r
            .decode(&[DecodeRow {
                slot,
                token: t,
                position,
                sampling: Sampling::greedy(),
            }])
            .unwrap()[0]
            .token;
        out.push(t);
    }
    out
}

use tiny_dir::PROMPTS;

#[test]
fn greedy_decoding_matches_the_host_reference() {
    let (src, dir) = built("reference", &options());
    let reference = Reference::new(&src);
    let rt = runtime();
    let mut r = Runner::load(&rt, &dir, 0).unwrap();
    for (i, p) in PROMPTS.iter().enumerate() {
        let want = reference.greedy(p, 12);
        let slot = i % r.slots();
        let got = device_greedy(&mut r, slot, p, 12);
        assert_eq!(got, want, "prompt {i} ({} tokens)", p.len());
    }
    // The caches were bound at load: only the small inputs moved per step.
    let c = r.counters();
    assert_eq!((c.prefills, c.decodes), (3, 33));
    assert!(c.switches >= 5, "{c:?}");
}

#[test]
fn a_padded_prompt_gives_what_an_exact_bucket_gives() {
    // 5 tokens in a bucket of 5 (no padding) and in one of 16 (11 padded positions).
    let exact = BuildOptions {
        context_buckets: Some(vec![5, 32]),
        ..options()
    };
    let (_, a) = built("exact", &exact);
    let padded = BuildOptions {
        context_buckets: Some(vec![16, 32]),
        ..options()
    };
    let (_, b) = built("padded", &padded);
    let rt = runtime();
    let mut ra = Runner::load(&rt, &a, 0).unwrap();
    let mut rb = Runner::load(&rt, &b, 0).unwrap();
    assert_eq!(ra.prefill_bucket(5), Some(5));
    assert_eq!(rb.prefill_bucket(5), Some(16));
    let p = PROMPTS[0];
    assert_eq!(
        device_greedy(&mut ra, 0, p, 10),
        device_greedy(&mut rb, 0, p, 10)
    );
}

#[test]
fn a_prompt_longer_than_every_bucket_prefills_in_chunks() {
    // Buckets 8 and 16 (max model length 32) against one bucket of 32 holding the prompt.
    let (_, chunked) = built("chunked", &options());
    let whole = BuildOptions {
        context_buckets: Some(vec![32]),
        ..options()
    };
    let (_, whole) = built("whole", &whole);
    let rt = runtime();
    let mut rc = Runner::load_logits(&rt, &chunked, 0).unwrap();
    let mut rw = Runner::load_logits(&rt, &whole, 0).unwrap();
    let prompt: Vec<u32> = (0..30).map(|k| 3 + (k * 53) % 250).collect();
    // 30 = 16, then the last 16 again from position 14; 20 = 16, then 8 from position 12.
    assert_eq!(rc.prefill_chunks(30), vec![16, 16]);
    assert_eq!(rc.prefill_chunks(20), vec![16, 8]);
    assert_eq!(rc.prefill_chunks(16), vec![16]);
    assert_eq!(rw.prefill_chunks(30), vec![32]);
    for n in [20, 30] {
        let p = &prompt[..n];
        let a = rc.prefill(1, p, &Sampling::greedy()).unwrap();
        let la = rc.last_logits().unwrap();
        let b = rw.prefill(1, p, &Sampling::greedy()).unwrap();
        let lb = rw.last_logits().unwrap();
        assert_eq!(a.token, b.token, "{n} tokens");
        let scale = lb.iter().fold(1f32, |m, v| m.max(v.abs()));
        let diff = la
            .iter()
            .zip(&lb)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= 1e-4 * scale, "{n} tokens: logits differ by {diff}");
        // The cache the chunks left decodes as the whole prefill's does.
        let steps = 32 - n;
        assert_eq!(
            device_greedy(&mut rc, 2, p, steps),
            device_greedy(&mut rw, 2, p, steps),
            "{n} tokens"
        );
    }
    // Chunk by chunk, as the serving engine runs it: only the last chunk answers.
    let p = &prompt[..30];
    let c = rc.prefill_chunk(0, p, 0, &Sampling::greedy()).unwrap();
    assert_eq!((c.done, c.bucket, c.next), (16, 16, None));
    let c = rc.prefill_chunk(0, p, 16, &Sampling::greedy()).unwrap();
    assert_eq!((c.done, c.bucket), (30, 16));
    assert_eq!(
        c.next.map(|s| s.token),
        Some(rw.prefill(0, p, &Sampling::greedy()).unwrap().token)
    );
    let e = rc.prefill_chunk(0, p, 30, &Sampling::greedy()).unwrap_err();
    assert!(e.to_string().contains("none left"), "{e}");
}

#[test]
fn sequences_decoded_together_give_what_each_gives_alone() {
    let (_, dir) = built("batched", &options());
    let rt = runtime();
    let mut r = Runner::load(&rt, &dir, 0).unwrap();
    let steps = 10;
    let alone: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| device_greedy(&mut r, 0, p, steps))
        .collect();
    // Together: three rows in the 4-row bucket (one padding row), in slots 3, 1, 2.
    let slots = [3, 1, 2];
    let mut next: Vec<u32> = PROMPTS
        .iter()
        .zip(slots)
        .map(|(p, s)| r.prefill(s, p, &Sampling::greedy()).unwrap().token)
        .collect();
    let mut got: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    assert_eq!(r.decode_bucket(3), Some(4));
    for step in 1..steps {
        let rows: Vec<DecodeRow> = (0..3)
            .map(|i| DecodeRow {
                slot: slots[i],
                token: next[i],
                position: PROMPTS[i].len() + step - 1,
                sampling: Sampling::greedy(),
            })
            .collect();
        next = r.decode(&rows).unwrap().iter().map(|s| s.token).collect();
        for (g, &t) in got.iter_mut().zip(&next) {
            g.push(t);
        }
    }
    assert_eq!(got, alone);
}

#[test]
fn generation_stops_at_the_max_model_length_and_refuses_long_prompts() {
    let (_, dir) = built("limits", &options());
    let rt = runtime();
    let mut r = Runner::load(&rt, &dir, 0).unwrap();
    let prompt: Vec<u32> = (10..42).collect(); // 32 tokens; max model length 32
    let e = r
        .prefill(0, &prompt, &Sampling::greedy())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("32 tokens") && e.contains("max model length 32"),
        "{e}"
    );
    let p = GenerateParams::default();
    let e = generate(&mut r, 0, &prompt, &p, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("32 tokens"), "{e}");
    let prompt: Vec<u32> = (10..24).collect(); // 14 tokens
    let p = GenerateParams {
        max_tokens: 100,
        ..Default::default()
    };
    let g = generate(&mut r, 0, &prompt, &p, &mut |_| {}).unwrap();
    if g.finish_reason == FinishReason::Length {
        assert_eq!(prompt.len() + g.token_ids.len(), 32, "{g:?}");
    } else {
        assert!(prompt.len() + g.token_ids.len() < 32);
    }
    let p = GenerateParams {
        max_tokens: 3,
        ..Default::default()
    };
    let g = generate(&mut r, 0, &prompt, &p, &mut |_| {}).unwrap();
    assert!(g.token_ids.len() <= 3);
}

#[test]
fn bad_builds_name_their_culprit_and_write_nothing() {
    let d = tmp("bad");
    let src = d.join("tiny.gguf");
    let bytes = TinyLlama::default().to_gguf();
    std::fs::write(&src, &bytes).unwrap();
    let out = d.join("model");
    let cases: Vec<(BuildOptions, &str)> = vec![
        (
            BuildOptions {
                context_buckets: Some(vec![16, 8]),
                ..options()
            },
            "strictly increasing",
        ),
        (
            BuildOptions {
                batch_buckets: Some(vec![0, 4]),
                ..options()
            },
            "--batch-buckets",
        ),
        (
            BuildOptions {
                max_model_len: Some(100_000),
                ..options()
            },
            "context is 256",
        ),
        (
            BuildOptions {
                context_buckets: Some(vec![8, 64]),
                ..options()
            },
            "longer than --max-model-len 32",
        ),
    ];
    for (o, want) in cases {
        let e = build(&src, &out, &o, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
        assert!(!out.exists());
    }
    // A truncated file.
    let cut = d.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = build(&cut, &out, &options(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(!e.is_empty());
    assert!(!out.exists());
    // Nothing else was left beside it.
    let left: Vec<_> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.iter().all(|n| !n.contains("partial")), "{left:?}");
    // A directory that is not a model directory is not overwritten.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = build(&src, &out, &options(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a model directory"), "{e}");
    assert!(out.join("keep.txt").is_file());
}

#[test]
fn device_sampling_is_reproducible_by_seed_whatever_the_batch() {
    let (_, dir) = built("sampling", &options());
    let rt = runtime();
    let mut r = Runner::load(&rt, &dir, 0).unwrap();
    let warm = |seed| Sampling {
        temperature: 20.0,
        top_k: 0,
        top_p: 0.95,
        seed,
    };
    let p = PROMPTS[1];
    // Alone, twice with one seed, once with another.
    let run = |r: &mut Runner, s: Sampling| {
        let mut t = r.prefill(0, p, &s).unwrap();
        let mut out = vec![t.token];
        for i in 0..12 {
            t = r
                .decode(&[DecodeRow {
                    slot: 0,
                    token: t.token,
                    position: p.len() + i,
                    sampling: s,
                }])
                .unwrap()[0];
            out.push(t.token);
            assert!(t.logprob <= 0.0 && t.logprob.is_finite(), "{t:?}");
        }
        out
    };
    let a = run(&mut r, warm(7));
    assert_eq!(run(&mut r, warm(7)), a);
    let b = run(&mut r, warm(8));
    assert_ne!(a, b, "two seeds drew the same 13 tokens");
    let greedy = device_greedy(&mut r, 0, p, 13);
    assert_ne!(a, greedy, "temperature 20 drew the greedy sequence");
    // top-k 1 is greedy at any temperature.
    let k1 = Sampling {
        top_k: 1,
        ..warm(3)
    };
    assert_eq!(run(&mut r, k1), greedy);
    // Seed 7 in slot 2, beside a greedy row and a row of seed 8, gives the same tokens.
    let mut t = [
        r.prefill(2, p, &warm(7)).unwrap().token,
        r.prefill(1, PROMPTS[0], &Sampling::greedy()).unwrap().token,
        r.prefill(3, p, &warm(8)).unwrap().token,
    ];
    let mut got = vec![t[0]];
    let mut other = vec![t[2]];
    for i in 0..12 {
        let rows = [
            DecodeRow {
                slot: 2,
                token: t[0],
                position: p.len() + i,
                sampling: warm(7),
            },
            DecodeRow {
                slot: 1,
                token: t[1],
                position: PROMPTS[0].len() + i,
                sampling: Sampling::greedy(),
            },
            DecodeRow {
                slot: 3,
                token: t[2],
                position: p.len() + i,
                sampling: warm(8),
            },
        ];
        let s = r.decode(&rows).unwrap();
        t = [s[0].token, s[1].token, s[2].token];
        got.push(t[0]);
        other.push(t[2]);
    }
    assert_eq!(got, a);
    assert_eq!(other, b);
    // Bad parameters are refused, naming them.
    let bad = Sampling {
        top_p: 0.0,
        ..Sampling::default()
    };
    let e = r.prefill(0, p, &bad).unwrap_err().to_string();
    assert!(e.contains("top_p"), "{e}");
}

#[test]
fn a_damaged_manifest_or_a_cache_too_large_for_the_device_is_a_clear_error() {
    let (_, dir) = built("manifest", &options());
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let m: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rt = runtime();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: Vec<(&str, Edit, &str)> = vec![
        (
            "slots",
            Box::new(|m| m["cache"]["slots"] = serde_json::json!(1u64 << 60)),
            "slots",
        ),
        (
            "bytes",
            Box::new(|m| m["cache"]["bytes"] = serde_json::json!(12345)),
            "cache's size",
        ),
        (
            "weight",
            Box::new(|m| m["weights"]["tensors"][0]["offset"] = serde_json::json!(u64::MAX)),
            "out of range",
        ),
        (
            "file",
            Box::new(|m| m["programs"][0]["file"] = serde_json::json!("../../etc/passwd")),
            "out of range",
        ),
        (
            "type",
            Box::new(|m| m["weights"]["tensors"][1]["type"] = serde_json::json!("Q5_K")),
            "has type 'Q5_K'",
        ),
        (
            "blocks of an f32 size",
            Box::new(|m| m["weights"]["tensors"][2]["type"] = serde_json::json!("Q4_1")),
            "out of range",
        ),
        (
            "interleaved",
            Box::new(|m| m["weights"]["tensors"][1]["interleaved"] = serde_json::json!(true)),
            "interleaved",
        ),
    ];
    for (what, edit, want) in edits {
        let mut bad = m.clone();
        edit(&mut bad);
        std::fs::write(dir.join("manifest.json"), bad.to_string()).unwrap();
        let e = Runner::load(&rt, &dir, 0).unwrap_err().to_string();
        assert!(e.contains(want), "{what}: {e}");
    }
    std::fs::write(dir.join("manifest.json"), &text).unwrap();
    Runner::load(&rt, &dir, 0).unwrap();

    // A cache far larger than the device: the load says which allocation and how much.
    let big = BuildOptions {
        batch_buckets: Some(vec![1, 256]),
        max_model_len: Some(256),
        context_buckets: Some(vec![256]),
        ..Default::default()
    };
    let (_, dir) = built("bigcache", &big);
    let dev = Arc::new(
        nrt_sim::SoftDevice::new(nrt_sim::SimConfig {
            memory_bytes: 8 << 20,
            ..nrt_sim::SimConfig::default()
        })
        .unwrap(),
    );
    let small = Runtime::init(dev, RuntimeConfig::default()).unwrap();
    let e = Runner::load(&small, &dir, 0).unwrap_err().to_string();
    assert!(e.contains("KV cache"), "{e}");
}

#[test]
fn continuous_batching_gives_each_request_what_it_gives_alone() {
    let (_, dir) = built("continuous", &options());
    let rt = runtime();
    let mut r = Runner::load(&rt, &dir, 0).unwrap();
    let warm = |seed, max_tokens| GenerateParams {
        max_tokens,
        sampling: Sampling {
            temperature: 20.0,
            top_k: 0,
            top_p: 0.9,
            seed,
        },
        ..Default::default()
    };
    let greedy = |max_tokens| GenerateParams {
        max_tokens,
        ..Default::default()
    };
    // Six requests, four slots: the fifth and sixth are admitted as earlier ones finish
    // (different lengths), into the slots they free.
    let requests: Vec<(Vec<u32>, GenerateParams)> = vec![
        (PROMPTS[0].to_vec(), greedy(3)),
        (PROMPTS[1].to_vec(), warm(5, 9)),
        (PROMPTS[2].to_vec(), greedy(12)),
        (PROMPTS[0].to_vec(), warm(6, 6)),
        (PROMPTS[1].to_vec(), greedy(7)),
        (vec![9, 8, 7, 6, 5, 4, 3], warm(7, 10)),
    ];
    let alone: Vec<_> = requests
        .iter()
        .map(|(p, params)| generate(&mut r, 0, p, params, &mut |_| {}).unwrap())
        .collect();
    let mut pieces = vec![String::new(); requests.len()];
    let before = r.counters();
    let together =
        nrt_llm::generate::generate_batch(&mut r, &requests, &mut |i, t| pieces[i].push_str(t))
            .unwrap();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(t.token_ids, a.token_ids, "request {i}");
        assert_eq!(t.finish_reason, a.finish_reason, "request {i}");
        assert_eq!(t.text, a.text, "request {i}");
        assert_eq!(pieces[i], t.text, "request {i}");
    }
    // Decoded together: fewer decode executions than the tokens decoded.
    let decoded: usize = together
        .iter()
        .map(|g| g.token_ids.len().saturating_sub(1))
        .sum();
    let steps = (r.counters().decodes - before.decodes) as usize;
    assert!(
        steps < decoded,
        "{steps} decode steps for {decoded} decoded tokens"
    );
}

/// `--weights q4` keeps the file's Q4_1 matrices and Q8_0 embedding as they are, `int8`
/// stores every matrix as Q8_0, `bf16` as bfloat16; the device reads them in place
/// (`MatMulBlockQuant`, `GatherBlockQuant`; bf16: MatMul through a folded `Cast`). The
/// logits stay within the 8-bit activations' rounding of the f64 reference over the file's
/// weights (int8: plus the re-quantization of the Q4_1 matrices; bf16: the rounding of
/// weights and activations to bf16), and greedy decoding picks the reference's tokens.
#[test]
fn block_weights_are_read_in_place_and_follow_the_reference() {
    for (name, format, types) in [
        ("q4", WeightFormat::Q4, ["Q8_0", "Q4_1"]),
        ("int8", WeightFormat::Int8, ["Q8_0", "Q8_0"]),
        ("bf16", WeightFormat::Bf16, ["BF16", "BF16"]),
    ] {
        let o = BuildOptions {
            weights: format,
            ..options()
        };
        let (src, dir) = built(&format!("blocks-{name}"), &o);
        let m = nrt_llm::build::Manifest::read(&dir).unwrap();
        let ty = |n: &str| {
            m.weights
                .tensors
                .iter()
                .find(|w| w.name == n)
                .unwrap()
                .ggml_type
                .clone()
        };
        assert_eq!(m.weights.dtype, format);
        assert_eq!(ty("token_embd.weight"), types[0], "{name}");
        assert_eq!(ty("blk.0.ffn_down.weight"), types[1], "{name}");
        assert_eq!(ty("blk.0.attn_norm.weight"), "F32", "{name}");
        // Block rows in groups of 8 are interleaved for the 8-row product (bf16 rows are
        // read as they are).
        let w = |n: &str| m.weights.tensors.iter().find(|w| w.name == n).unwrap();
        let blocks = format != WeightFormat::Bf16;
        assert_eq!(w("blk.0.ffn_down.weight").interleaved, blocks, "{name}");
        assert!(!w("blk.0.attn_norm.weight").interleaved, "{name}");
        let f32_bytes: u64 = m
            .weights
            .tensors
            .iter()
            .map(|w| w.shape.iter().product::<usize>() as u64 * 4)
            .sum();
        // q4 and int8 under a third of f32's bytes; bf16 about half (the norms stay f32).
        let (num, den) = if blocks { (3, 1) } else { (19, 10) };
        assert!(
            m.weights.bytes * num < f32_bytes * den,
            "{name}: {} bytes of {f32_bytes}",
            m.weights.bytes
        );

        let reference = Reference::new(&src);
        let rt = runtime();
        let mut r = Runner::load_logits(&rt, &dir, 0).unwrap();
        let vocab = reference.c.vocab_size;
        for (i, p) in PROMPTS.iter().enumerate() {
            r.prefill(i % r.slots(), p, &Sampling::greedy()).unwrap();
            let got = &r.last_logits().unwrap()[..vocab];
            let want = reference.logits(p);
            let scale = want.iter().fold(1.0f64, |a, v| a.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0.0f64, |a, (g, w)| a.max((*g as f64 - w).abs()));
            let tol = match format {
                WeightFormat::Q4 => 0.02,
                WeightFormat::Bf16 => 0.01,
                _ => 0.05,
            };
            assert!(
                err <= tol * scale,
                "{name} prompt {i}: max error {err} of {scale}"
            );
        }
        drop(r);
        let mut r = Runner::load(&rt, &dir, 0).unwrap();
        for (i, p) in PROMPTS.iter().enumerate() {
            let want = reference.greedy(p, 8);
            let slot = i % r.slots();
            let got = device_greedy(&mut r, slot, p, 8);
            assert_eq!(got, want, "{name} prompt {i}");
        }
    }
}

/// A model built for two cores (`--cores 2`: each product's weight rows split between them)
/// decodes exactly what the one-core build decodes, with f32, block and bf16 weights.
#[test]
fn two_core_builds_decode_what_one_core_decodes() {
    let dev = Arc::new(nrt_sim::SoftDevice::new(nrt_sim::SimConfig::default()).unwrap());
    let rt2 = Runtime::init(
        dev,
        RuntimeConfig {
            logical_nc: 2,
            ..RuntimeConfig::default()
        },
    )
    .unwrap();
    let rt1 = runtime();
    for format in [WeightFormat::F32, WeightFormat::Q4, WeightFormat::Bf16] {
        let one = BuildOptions {
            weights: format,
            ..options()
        };
        let two = BuildOptions {
            cores: 2,
            ..one.clone()
        };
        let (_, d1) = built(&format!("cores1-{}", format.name()), &one);
        let (_, d2) = built(&format!("cores2-{}", format.name()), &two);
        let mut r1 = Runner::load(&rt1, &d1, 0).unwrap();
        let mut r2 = Runner::load(&rt2, &d2, 0).unwrap();
        for (i, p) in PROMPTS.iter().enumerate() {
            let a = device_greedy(&mut r1, i % 2, p, 8);
            let b = device_greedy(&mut r2, i % 2, p, 8);
            assert_eq!(a, b, "{} prompt {i}", format.name());
        }
    }
}
