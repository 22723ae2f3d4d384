//! Test models: a tiny llama with random weights, written as GGUF by this crate's own
//! [`GgufWriter`] (the fast tests' model, and the seed the hostile-input tests mutate).

use crate::gguf::{Array, GgufWriter, Value};
use crate::quant::{GgmlType, quantize_q4_1, quantize_q8_0};

/// The tiny model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinyLlama {
    /// Blocks.
    pub n_layer: usize,
    /// Hidden size (a multiple of 32: the quantized rows are whole blocks).
    pub n_embd: usize,
    /// MLP size (a multiple of 32).
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Whether `output.weight` is absent (tied to `token_embd`).
    pub tied: bool,
    /// The weights' seed.
    pub seed: u64,
}

impl Default for TinyLlama {
    fn default() -> TinyLlama {
        TinyLlama {
            n_layer: 2,
            n_embd: 64,
            n_ff: 96,
            n_head: 4,
            n_head_kv: 2,
            tied: true,
            seed: 1,
        }
    }
}

/// The tiny tokenizer's vocabulary: three control tokens, the 256 byte-level characters, then
/// one token per merge of [`TINY_MERGES`].
pub fn tiny_vocab() -> (Vec<String>, Vec<i32>) {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![3; 3];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('?')
        };
        tokens.push(c.to_string());
        types.push(1);
    }
    for m in TINY_MERGES {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    (tokens, types)
}

/// The tiny tokenizer's merges.
pub const TINY_MERGES: [&str; 6] = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "a n"];

/// A deterministic generator of weights in [-1, 1) (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator; seed 0 is replaced by a constant.
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next value in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values scaled by `scale`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

impl TinyLlama {
    /// The GGUF file: llama metadata, the tiny tokenizer, a chat template, and the weights —
    /// embedding Q8_0, matrices Q4_1, norms F32 (the types of SmolLM2's file).
    pub fn to_gguf(&self) -> Vec<u8> {
        let (tokens, types) = tiny_vocab();
        let vocab = tokens.len();
        let head_dim = self.n_embd / self.n_head;
        let (e, q, kv, ff) = (
            self.n_embd as u64,
            (self.n_head * head_dim) as u64,
            (self.n_head_kv * head_dim) as u64,
            self.n_ff as u64,
        );
        let mut w = GgufWriter::new();
        let s = |x: &str| Value::String(x.to_string());
        w.kv("general.architecture", s("llama"))
            .kv("general.name", s("tiny-llama"))
            .kv("general.alignment", Value::U32(32))
            .kv("llama.block_count", Value::U32(self.n_layer as u32))
            .kv("llama.context_length", Value::U32(256))
            .kv("llama.embedding_length", Value::U32(e as u32))
            .kv("llama.feed_forward_length", Value::U32(ff as u32))
            .kv("llama.attention.head_count", Value::U32(self.n_head as u32))
            .kv(
                "llama.attention.head_count_kv",
                Value::U32(self.n_head_kv as u32),
            )
            .kv("llama.rope.freq_base", Value::F32(10000.0))
            .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
            .kv("llama.vocab_size", Value::U32(vocab as u32))
            .kv("llama.rope.dimension_count", Value::U32(head_dim as u32))
            .kv("tokenizer.ggml.model", s("gpt2"))
            .kv("tokenizer.ggml.pre", s("smollm"))
            .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
            .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
            .kv(
                "tokenizer.ggml.merges",
                Value::Array(Array::String(
                    TINY_MERGES.iter().map(|m| m.to_string()).collect(),
                )),
            )
            .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
            .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
            .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
            .kv(
                "tokenizer.chat_template",
                s(
                    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\
                   {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
                ),
            );
        let mut rng = Rng::new(self.seed);
        let mut q8 = |w: &mut GgufWriter, name: &str, cols: u64, rows: u64| {
            let x = rng.vec((cols * rows) as usize, 0.5);
            let data = quantize_q8_0(&x).unwrap_or_default();
            w.tensor(name, &[cols, rows], GgmlType::Q8_0, data);
        };
        q8(&mut w, "token_embd.weight", e, vocab as u64);
        if !self.tied {
            q8(&mut w, "output.weight", e, vocab as u64);
        }
        let mut rng = Rng::new(self.seed.wrapping_add(1));
        let norm = |rng: &mut Rng| -> Vec<f32> {
            rng.vec(self.n_embd, 0.1).iter().map(|v| 1.0 + v).collect()
        };
        let out_norm = norm(&mut rng);
        w.tensor_f32("output_norm.weight", &[e], &out_norm);
        for l in 0..self.n_layer {
            let p = |s: &str| format!("blk.{l}.{s}.weight");
            let n = norm(&mut rng);
            w.tensor_f32(p("attn_norm"), &[e], &n);
            let n = norm(&mut rng);
            w.tensor_f32(p("ffn_norm"), &[e], &n);
            for (name, cols, rows) in [
                ("attn_q", e, q),
                ("attn_k", e, kv),
                ("attn_v", e, kv),
                ("attn_output", q, e),
                ("ffn_gate", e, ff),
                ("ffn_up", e, ff),
                ("ffn_down", ff, e),
            ] {
                let scale = 1.0 / (cols as f32).sqrt();
                let x = rng.vec((cols * rows) as usize, scale);
                let data = quantize_q4_1(&x).unwrap_or_default();
                w.tensor(p(name), &[cols, rows], GgmlType::Q4_1, data);
            }
        }
        w.to_bytes()
    }
}
