//! The tiny llama written by `nrt_llm::testing` (no model file needed): the reader, the
//! configuration, the tensor map, the tokenizer and the template on it, and each kind of bad
//! file ending in an error that names its culprit.

use nrt_llm::gguf::{Array, GgufErrorKind, GgufFile, GgufWriter, Value};
use nrt_llm::testing::TinyLlama;
use nrt_llm::{
    ChatMessage, ChatTemplate, Error, GgmlType, Gguf, LlamaConfig, LlamaTensors, Tokenizer,
};

/// Rewrites a file through `edit(metadata, tensors)`.
fn rewrite(
    bytes: &[u8],
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>),
) -> Vec<u8> {
    let f = GgufFile::from_bytes(bytes.to_vec()).unwrap();
    let mut md = f.gguf.metadata().to_vec();
    let mut ts: Vec<_> = f
        .gguf
        .tensors()
        .iter()
        .map(|t| {
            let (_, data) = f.tensor(&t.name).unwrap();
            (t.name.clone(), t.dims.clone(), t.ggml_type, data.to_vec())
        })
        .collect();
    edit(&mut md, &mut ts);
    let mut w = GgufWriter::new();
    for (k, v) in md {
        w.kv(k, v);
    }
    for (n, d, t, data) in ts {
        w.tensor(n, &d, t, data);
    }
    w.to_bytes()
}

fn set(md: &mut [(String, Value)], key: &str, v: Value) {
    md.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

/// Everything this crate reads from a file, in order; the first error.
fn load(bytes: &[u8]) -> Result<(), Error> {
    let f = GgufFile::from_bytes(bytes.to_vec())?;
    let c = LlamaConfig::from_gguf(&f.gguf)?;
    LlamaTensors::from_gguf(&f.gguf, &c)?;
    let tok = Tokenizer::from_gguf(&f.gguf)?;
    ChatTemplate::from_gguf(&f.gguf, &tok)?;
    Ok(())
}

#[test]
fn tiny_llama_reads_back() {
    let bytes = TinyLlama::default().to_gguf();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let c = LlamaConfig::from_gguf(&f.gguf).unwrap();
    assert_eq!(
        (
            c.n_layer,
            c.n_embd,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.vocab_size
        ),
        (2, 64, 4, 2, 16, 265)
    );
    assert!(c.tied_embeddings);
    let t = LlamaTensors::from_gguf(&f.gguf, &c).unwrap();
    assert_eq!(t.output, t.token_embd);
    assert!(t.unused.is_empty());
    // Every tensor dequantizes; the quantized weights stay near their bounds.
    for info in f.gguf.tensors() {
        let v = f.tensor_f32(&info.name).unwrap();
        assert_eq!(v.len() as u64, info.n_elements());
        assert!(
            v.iter().all(|x| x.is_finite() && x.abs() <= 1.2),
            "{}",
            info.name
        );
    }
    // The writer's output reads back to the same bytes.
    assert_eq!(rewrite(&bytes, |_, _| {}), bytes);

    let untied = TinyLlama {
        tied: false,
        ..TinyLlama::default()
    }
    .to_gguf();
    let f = GgufFile::from_bytes(untied).unwrap();
    let c = LlamaConfig::from_gguf(&f.gguf).unwrap();
    assert!(!c.tied_embeddings);
    assert_eq!(
        LlamaTensors::from_gguf(&f.gguf, &c).unwrap().output,
        "output.weight"
    );
}

#[test]
fn tiny_tokenizer_and_template() {
    let f = GgufFile::from_bytes(TinyLlama::default().to_gguf()).unwrap();
    let tok = Tokenizer::from_gguf(&f.gguf).unwrap();
    // Byte b is id 3 + b; the merges are 259.. ("Ġt" 259, "he" 260, "Ġthe" 261, "in" 262,
    // "Ġa" 263, "an" 264). " an": "Ġ a" ranks before "a n", so it is "Ġa" + "n".
    let ids = tok.encode("he the an<|im_end|>7").unwrap();
    let byte = |b: u8| 3 + u32::from(b);
    assert_eq!(ids, [260, 261, 263, byte(b'n'), 2, byte(b'7')]);
    assert_eq!(tok.decode(&ids).unwrap(), "he the an<|im_end|>7");

    // Streaming over byte tokens: "€" (E2 82 AC) comes out with its last byte; a broken
    // sequence is U+FFFD, and so is an unfinished character at the end.
    let mut s = tok.stream(false);
    let pieces: Vec<String> = [0xE2, 0x82, 0xAC, 0xF0, b'a', 0xE2, 0x82]
        .iter()
        .map(|&b| s.push(byte(b)).unwrap())
        .collect();
    assert_eq!(pieces, ["", "", "€", "", "\u{FFFD}a", "", ""]);
    assert_eq!(s.finish(), "\u{FFFD}");
    assert!(s.push(265).is_err(), "an id past the vocabulary");
    let t = ChatTemplate::from_gguf(&f.gguf, &tok).unwrap().unwrap();
    let p = t.render(&[ChatMessage::new("user", "hi")], true).unwrap();
    assert_eq!(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(tok.encode(&p).unwrap()[0], 1);
}

#[test]
fn hostile_templates_end_in_errors() {
    let endless =
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(endless, "", "").unwrap();
    let e = t.render(&[], false).unwrap_err();
    assert!(e.to_string().contains("fuel"), "{e}");
    let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
    assert!(
        t.render(&[], true)
            .unwrap_err()
            .to_string()
            .contains("no system role")
    );
    assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    // Python string methods (pycompat) and `tojson`, as Hugging Face templates use them.
    let t = ChatTemplate::new(
        "{{ messages[0].content.strip() }}|{{ messages[0].role|tojson }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "  x  ")], false)
            .unwrap(),
        "x|\"user\""
    );
}

fn gguf_err(bytes: &[u8]) -> nrt_llm::GgufError {
    Gguf::parse(bytes).unwrap_err()
}

#[test]
fn bad_files_name_their_culprit() {
    let good = TinyLlama::default().to_gguf();
    let msg = |b: &[u8]| load(b).unwrap_err().to_string();

    // The container.
    assert!(matches!(
        gguf_err(b"GGUX\x03\0\0\0").kind,
        GgufErrorKind::BadMagic(_)
    ));
    let mut v1 = good.clone();
    v1[4] = 1;
    assert_eq!(gguf_err(&v1).kind, GgufErrorKind::UnsupportedVersion(1));
    let mut be = good.clone();
    be[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(gguf_err(&be).to_string().contains("big-endian"));
    let m = msg(&rewrite(&good, |md, _| {
        md.push(("llama.block_count".into(), Value::U32(2)))
    }));
    assert!(
        m.contains("'llama.block_count'") && m.contains("twice"),
        "{m}"
    );
    let m = msg(&rewrite(&good, |_, ts| {
        let t = ts[3].clone();
        ts.push(t)
    }));
    assert!(m.contains("twice"), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "general.alignment", Value::U32(24))
    }));
    assert!(
        m.contains("general.alignment") && m.contains("power of two"),
        "{m}"
    );
    let m = msg(&good[..good.len() - 100]);
    assert!(m.contains("past the end") && m.contains("blk.1."), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        // Arrays nested 12 deep.
        let mut a = Array::U8(vec![1]);
        for _ in 0..12 {
            a = Array::Array(vec![a]);
        }
        md.push(("x.deep".into(), Value::Array(a)))
    }));
    assert!(m.contains("'x.deep'") && m.contains("nested"), "{m}");

    // The model.
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "general.architecture", Value::String("mamba".into()))
    }));
    assert!(m.contains("architecture 'mamba'"), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        md.retain(|(k, _)| k != "llama.embedding_length")
    }));
    assert!(
        m.contains("'llama.embedding_length'") && m.contains("missing"),
        "{m}"
    );
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "llama.attention.head_count_kv", Value::U32(3))
    }));
    assert!(m.contains("head_count_kv"), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "llama.feed_forward_length", Value::String("96".into()))
    }));
    assert!(
        m.contains("'llama.feed_forward_length'") && m.contains("string"),
        "{m}"
    );
    let m = msg(&rewrite(&good, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "blk.1.ffn_up.weight")
            .unwrap();
        t.1 = vec![96, 64];
    }));
    assert!(
        m.contains("'blk.1.ffn_up.weight'") && m.contains("shape [96, 64]"),
        "{m}"
    );
    let m = msg(&rewrite(&good, |_, ts| {
        ts.retain(|t| t.0 != "blk.0.attn_v.weight")
    }));
    assert!(
        m.contains("'blk.0.attn_v.weight'") && m.contains("missing"),
        "{m}"
    );
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "llama.vocab_size", Value::U32(300))
    }));
    assert!(
        m.contains("tokenizer.ggml.tokens") && m.contains("300"),
        "{m}"
    );

    // The tokenizer.
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "tokenizer.ggml.model", Value::String("llama".into()))
    }));
    assert!(m.contains("tokenizer model 'llama'"), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "tokenizer.ggml.pre", Value::String("qwen2".into()))
    }));
    assert!(m.contains("pre-tokenizer 'qwen2'"), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        set(
            md,
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["Ġ t".into(), "q zz".into()])),
        )
    }));
    assert!(m.contains("merge 1") && m.contains("\"zz\""), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        set(md, "tokenizer.ggml.eos_token_id", Value::U32(265))
    }));
    assert!(m.contains("eos_token_id") && m.contains("265"), "{m}");
    let m = msg(&rewrite(&good, |md, _| {
        set(
            md,
            "tokenizer.chat_template",
            Value::String("{% if %}".into()),
        )
    }));
    assert!(m.starts_with("chat template"), "{m}");
    assert_eq!(load(&good), Ok(()));
}

#[test]
fn every_value_type_round_trips_and_v2_reads() {
    let values = [
        Value::U8(200),
        Value::I8(-100),
        Value::U16(60000),
        Value::I16(-30000),
        Value::U32(4_000_000_000),
        Value::I32(-2_000_000_000),
        Value::F32(1.5),
        Value::Bool(true),
        Value::String("ünï 🦀".into()),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F64(-2.25),
        Value::Array(Array::U8(vec![1, 2])),
        Value::Array(Array::I8(vec![-1])),
        Value::Array(Array::U16(vec![7])),
        Value::Array(Array::I16(vec![-7])),
        Value::Array(Array::U32(vec![])),
        Value::Array(Array::I32(vec![-5, 5])),
        Value::Array(Array::F32(vec![0.5])),
        Value::Array(Array::Bool(vec![true, false])),
        Value::Array(Array::String(vec!["a".into(), String::new()])),
        Value::Array(Array::U64(vec![9])),
        Value::Array(Array::I64(vec![-9])),
        Value::Array(Array::F64(vec![1e300])),
        Value::Array(Array::Array(vec![
            Array::String(vec!["x".into()]),
            Array::Array(vec![Array::U8(vec![3])]),
        ])),
    ];
    let mut w = GgufWriter::new();
    for (i, v) in values.iter().enumerate() {
        w.kv(format!("k.{i}"), v.clone());
    }
    w.kv("general.alignment", Value::U32(64));
    w.tensor_f32("t", &[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let mut bytes = w.to_bytes();
    for version in [3u8, 2] {
        bytes[4] = version;
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        assert_eq!(f.gguf.version, u32::from(version));
        for (i, v) in values.iter().enumerate() {
            assert_eq!(f.gguf.get(&format!("k.{i}")), Some(v));
        }
        assert_eq!(f.gguf.alignment, 64);
        assert_eq!(f.gguf.data_start % 64, 0);
        assert_eq!(f.tensor_row_f32("t", 1).unwrap(), [4.0, 5.0, 6.0]);
    }
}
