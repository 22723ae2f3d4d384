//! The llama architecture: its configuration from the `llama.*` metadata and its tensors.
//!
//! # Tensor names and shapes
//!
//! GGUF writes shapes innermost first (ggml's `ne`): a weight applied as `y = W·x` with `x` of
//! `n_in` values and `y` of `n_out` is stored `[n_in, n_out]`, `n_out` rows of `n_in` values
//! (so one row is one output's dot product; quantization blocks run along the row).
//!
//! | tensor | shape | |
//! |--------|-------|-|
//! | `token_embd.weight` | `[n_embd, n_vocab]` | row `t` is token `t`'s embedding |
//! | `blk.N.attn_norm.weight` | `[n_embd]` | RMSNorm before attention |
//! | `blk.N.attn_q.weight` | `[n_embd, n_head·head_dim]` | rows permuted, see below |
//! | `blk.N.attn_k.weight` | `[n_embd, n_head_kv·head_dim]` | rows permuted, see below |
//! | `blk.N.attn_v.weight` | `[n_embd, n_head_kv·head_dim]` | |
//! | `blk.N.attn_output.weight` | `[n_head·head_dim, n_embd]` | |
//! | `blk.N.ffn_norm.weight` | `[n_embd]` | RMSNorm before the MLP |
//! | `blk.N.ffn_gate.weight` | `[n_embd, n_ff]` | SwiGLU: `down(silu(gate·x) ⊙ up·x)` |
//! | `blk.N.ffn_up.weight` | `[n_embd, n_ff]` | |
//! | `blk.N.ffn_down.weight` | `[n_ff, n_embd]` | |
//! | `output_norm.weight` | `[n_embd]` | final RMSNorm |
//! | `output.weight` | `[n_embd, n_vocab]` | the LM head; **absent ⇒ tied to `token_embd`** |
//!
//! Optional biases (`blk.N.attn_{q,k,v,output}.bias`, of the output size) are recorded when
//! present. A tensor the map does not name is listed in [`LlamaTensors::unused`], so a builder
//! can refuse a file that needs more than it implements (e.g. Llama 3.1's `rope_freqs`).
//!
//! # The Q/K row permutation (RoPE)
//!
//! Hugging Face llama checkpoints rotate the two *halves* of each head (`x[i]` with
//! `x[i + head_dim/2]`, "NeoX style"). llama.cpp's converter permutes the rows of `attn_q` and
//! `attn_k` within each head (`reshape(n_head, 2, head_dim/2, n_in).swapaxes(1, 2)`) so that
//! ggml's "normal" RoPE, which rotates *adjacent pairs*, computes the same thing. So with GGUF
//! weights the rotation is
//!
//! ```text
//! (x[2i], x[2i+1]) ← (x[2i]·cos θᵢ − x[2i+1]·sin θᵢ,  x[2i]·sin θᵢ + x[2i+1]·cos θᵢ),
//! θᵢ = pos · rope_freq_base^(−2i/head_dim),  i < head_dim/2
//! ```
//!
//! — adjacent pairs, not halves. Attention scores are unchanged by the permutation (Q and K
//! are permuted alike and V is not), so the cache and the rest of the graph need nothing else.

use crate::Error;
use crate::gguf::{Gguf, TensorInfo, Value};

/// The largest dimension (embedding, FFN, vocabulary, context) accepted from a file.
pub const MAX_DIM: u64 = 1 << 24;
/// The most layers accepted from a file.
pub const MAX_LAYERS: u64 = 1 << 12;

/// A llama-family model's hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `general.architecture` (`llama`).
    pub architecture: String,
    /// Decoder blocks (`llama.block_count`).
    pub n_layer: usize,
    /// Hidden size (`llama.embedding_length`).
    pub n_embd: usize,
    /// MLP inner size (`llama.feed_forward_length`).
    pub n_ff: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`; absent ⇒ `n_head`).
    pub n_head_kv: usize,
    /// Per-head size: `n_embd / n_head` (`llama.attention.key_length` when present).
    pub head_dim: usize,
    /// RoPE base (`llama.rope.freq_base`; absent ⇒ 10000).
    pub rope_freq_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_norm_eps: f32,
    /// The training context (`llama.context_length`).
    pub context_length: usize,
    /// Vocabulary size (`llama.vocab_size`, else the token list's length, else the embedding's
    /// rows).
    pub vocab_size: usize,
    /// The LM head is `token_embd` (no `output.weight` in the file).
    pub tied_embeddings: bool,
}

fn meta_err(key: &str, why: impl Into<String>) -> Error {
    Error::Metadata {
        key: key.to_string(),
        why: why.into(),
    }
}

/// A non-negative integer key, bounded by `max`.
fn get_uint(g: &Gguf, key: &str, max: u64) -> Result<Option<usize>, Error> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    let n = v
        .as_u64()
        .ok_or_else(|| meta_err(key, format!("a {}, expected an integer", v.describe())))?;
    if n == 0 || n > max {
        return Err(meta_err(key, format!("{n} is out of range (1..={max})")));
    }
    Ok(Some(n as usize))
}

fn require_uint(g: &Gguf, key: &str, max: u64) -> Result<usize, Error> {
    get_uint(g, key, max)?.ok_or_else(|| meta_err(key, "missing"))
}

fn get_f32(g: &Gguf, key: &str) -> Result<Option<f32>, Error> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    let x = v
        .as_f32()
        .ok_or_else(|| meta_err(key, format!("a {}, expected a float", v.describe())))?;
    if !x.is_finite() || x <= 0.0 {
        return Err(meta_err(key, format!("{x} is not a positive number")));
    }
    Ok(Some(x))
}

impl LlamaConfig {
    /// Reads the configuration of a llama-family GGUF file.
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, Error> {
        let arch_key = "general.architecture";
        let arch = g
            .get(arch_key)
            .ok_or_else(|| meta_err(arch_key, "missing"))?
            .as_str()
            .ok_or_else(|| meta_err(arch_key, "not a string"))?
            .to_string();
        if arch != "llama" {
            return Err(Error::Unsupported(format!(
                "architecture '{arch}' (general.architecture); the llama family is read"
            )));
        }
        let k = |s: &str| format!("{arch}.{s}");
        let n_layer = require_uint(g, &k("block_count"), MAX_LAYERS)?;
        let n_embd = require_uint(g, &k("embedding_length"), MAX_DIM)?;
        let n_ff = require_uint(g, &k("feed_forward_length"), MAX_DIM)?;
        let n_head = require_uint(g, &k("attention.head_count"), MAX_DIM)?;
        let n_head_kv = get_uint(g, &k("attention.head_count_kv"), MAX_DIM)?.unwrap_or(n_head);
        let context_length = require_uint(g, &k("context_length"), MAX_DIM)?;
        let rms_key = k("attention.layer_norm_rms_epsilon");
        let rms_norm_eps = get_f32(g, &rms_key)?.ok_or_else(|| meta_err(&rms_key, "missing"))?;
        let rope_freq_base = get_f32(g, &k("rope.freq_base"))?.unwrap_or(10000.0);

        if !n_embd.is_multiple_of(n_head) {
            return Err(meta_err(
                &k("attention.head_count"),
                format!("{n_head} heads do not divide the embedding length {n_embd}"),
            ));
        }
        let head_dim = match get_uint(g, &k("attention.key_length"), MAX_DIM)? {
            Some(d) if d != n_embd / n_head => {
                return Err(Error::Unsupported(format!(
                    "{}: a head size {d} other than embedding_length / head_count = {}",
                    k("attention.key_length"),
                    n_embd / n_head
                )));
            }
            _ => n_embd / n_head,
        };
        if let Some(v) = get_uint(g, &k("attention.value_length"), MAX_DIM)?
            && v != head_dim
        {
            return Err(Error::Unsupported(format!(
                "{}: a value head size {v} other than the key head size {head_dim}",
                k("attention.value_length")
            )));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(meta_err(
                &k("attention.head_count"),
                format!("the head size {head_dim} is odd (RoPE rotates pairs)"),
            ));
        }
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(meta_err(
                &k("attention.head_count_kv"),
                format!("{n_head_kv} key/value heads do not divide the {n_head} query heads"),
            ));
        }
        if let Some(d) = get_uint(g, &k("rope.dimension_count"), MAX_DIM)?
            && d != head_dim
        {
            return Err(Error::Unsupported(format!(
                "{}: RoPE over {d} of the head's {head_dim} dimensions (partial RoPE)",
                k("rope.dimension_count")
            )));
        }
        for key in [k("rope.scaling.type"), k("rope.scaling.factor")] {
            match g.get(&key) {
                None => {}
                Some(Value::String(s)) if s == "none" => {}
                Some(Value::F32(f)) if *f == 0.0 || *f == 1.0 => {}
                Some(v) => {
                    return Err(Error::Unsupported(format!(
                        "{key} = {}: RoPE scaling is not implemented",
                        match v {
                            Value::String(s) => s.clone(),
                            v => format!("{v:?}"),
                        }
                    )));
                }
            }
        }

        let tokens = g.get("tokenizer.ggml.tokens").and_then(Value::as_array);
        let embd = g.tensor("token_embd.weight");
        let vocab_size = match get_uint(g, &k("vocab_size"), MAX_DIM)? {
            Some(n) => n,
            None => match (tokens, embd) {
                (Some(t), _) if !t.is_empty() => t.len(),
                (_, Some(t)) if t.dims.len() == 2 => usize::try_from(t.dims[1])
                    .ok()
                    .filter(|&n| n > 0 && n as u64 <= MAX_DIM)
                    .ok_or_else(|| Error::Tensor {
                        name: t.name.clone(),
                        why: format!("a vocabulary of {} rows", t.dims[1]),
                    })?,
                _ => return Err(meta_err(&k("vocab_size"), "missing (and no token list)")),
            },
        };
        if let Some(t) = tokens
            && t.len() != vocab_size
        {
            return Err(meta_err(
                "tokenizer.ggml.tokens",
                format!(
                    "{} tokens, but the model's vocabulary has {vocab_size}",
                    t.len()
                ),
            ));
        }

        Ok(LlamaConfig {
            architecture: arch,
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            rope_freq_base,
            rms_norm_eps,
            context_length,
            vocab_size,
            tied_embeddings: g.tensor("output.weight").is_none(),
        })
    }

    /// Query heads per key/value head (GQA group size).
    pub fn gqa_group(&self) -> usize {
        self.n_head / self.n_head_kv
    }

    /// Values per position of one layer's K (or V) cache: `n_head_kv · head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}

/// One decoder block's tensor names.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct LayerTensors {
    pub attn_norm: String,
    pub attn_q: String,
    pub attn_k: String,
    pub attn_v: String,
    pub attn_output: String,
    pub ffn_norm: String,
    pub ffn_gate: String,
    pub ffn_up: String,
    pub ffn_down: String,
    /// Optional biases of the attention projections (absent in Llama proper).
    pub attn_q_bias: Option<String>,
    pub attn_k_bias: Option<String>,
    pub attn_v_bias: Option<String>,
    pub attn_output_bias: Option<String>,
}

/// The tensor map of a llama-family file, every shape checked against the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlamaTensors {
    /// `token_embd.weight`.
    pub token_embd: String,
    /// The blocks, in order.
    pub layers: Vec<LayerTensors>,
    /// `output_norm.weight`.
    pub output_norm: String,
    /// `output.weight`, or `token_embd.weight` when the head is tied.
    pub output: String,
    /// Tensors of the file the map does not name.
    pub unused: Vec<String>,
}

impl LlamaTensors {
    /// Finds every tensor the configuration needs and checks its shape and that its type can
    /// be dequantized.
    pub fn from_gguf(g: &Gguf, c: &LlamaConfig) -> Result<LlamaTensors, Error> {
        let mut named = std::collections::HashSet::new();
        let u = |n: usize| n as u64;
        let (e, q, kv, ff, v) = (
            u(c.n_embd),
            u(c.n_head * c.head_dim),
            u(c.kv_dim()),
            u(c.n_ff),
            u(c.vocab_size),
        );
        let mut need = |name: String, shape: &[u64]| -> Result<String, Error> {
            let t = g.tensor(&name).ok_or_else(|| Error::Tensor {
                name: name.clone(),
                why: "missing".into(),
            })?;
            check(t, shape)?;
            named.insert(name.clone());
            Ok(name)
        };
        let token_embd = need("token_embd.weight".into(), &[e, v])?;
        let output_norm = need("output_norm.weight".into(), &[e])?;
        let output = if c.tied_embeddings {
            token_embd.clone()
        } else {
            need("output.weight".into(), &[e, v])?
        };
        let mut layers = Vec::new();
        for i in 0..c.n_layer {
            let p = |s: &str| format!("blk.{i}.{s}");
            let mut l = LayerTensors {
                attn_norm: need(p("attn_norm.weight"), &[e])?,
                attn_q: need(p("attn_q.weight"), &[e, q])?,
                attn_k: need(p("attn_k.weight"), &[e, kv])?,
                attn_v: need(p("attn_v.weight"), &[e, kv])?,
                attn_output: need(p("attn_output.weight"), &[q, e])?,
                ffn_norm: need(p("ffn_norm.weight"), &[e])?,
                ffn_gate: need(p("ffn_gate.weight"), &[e, ff])?,
                ffn_up: need(p("ffn_up.weight"), &[e, ff])?,
                ffn_down: need(p("ffn_down.weight"), &[ff, e])?,
                attn_q_bias: None,
                attn_k_bias: None,
                attn_v_bias: None,
                attn_output_bias: None,
            };
            for (slot, name, n) in [
                (&mut l.attn_q_bias, p("attn_q.bias"), q),
                (&mut l.attn_k_bias, p("attn_k.bias"), kv),
                (&mut l.attn_v_bias, p("attn_v.bias"), kv),
                (&mut l.attn_output_bias, p("attn_output.bias"), e),
            ] {
                if g.tensor(&name).is_some() {
                    *slot = Some(need(name, &[n])?);
                }
            }
            layers.push(l);
        }
        let unused = g
            .tensors()
            .iter()
            .filter(|t| !named.contains(&t.name))
            .map(|t| t.name.clone())
            .collect();
        Ok(LlamaTensors {
            token_embd,
            layers,
            output_norm,
            output,
            unused,
        })
    }
}

fn check(t: &TensorInfo, shape: &[u64]) -> Result<(), Error> {
    if t.dims != shape {
        return Err(Error::Tensor {
            name: t.name.clone(),
            why: format!("shape {:?}, expected {shape:?}", t.dims),
        });
    }
    if !t.ggml_type.can_dequantize() {
        return Err(Error::Tensor {
            name: t.name.clone(),
            why: format!("type {} cannot be dequantized here", t.ggml_type),
        });
    }
    Ok(())
}
