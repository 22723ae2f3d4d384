//! # nrt-llm — decoder LLMs on nrt-rs
//!
//! The foundation of the decoder-LLM stack (issue 48): what a model file holds, read without
//! trusting it.
//!
//! - [`gguf`]: the GGUF v2/v3 reader (metadata of every value type, tensor infos, alignment,
//!   tensor data extents), hostile-input safe: every size and offset checked, no allocation the
//!   file sizes can abort, errors naming the key or tensor and the byte offset.
//! - [`quant`]: the ggml tensor types and their dequantization to f32 (F32, F16, BF16, Q4_0,
//!   Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).
//! - [`config`]: [`LlamaConfig`] from the `llama.*` metadata and [`LlamaTensors`], the
//!   tensor-name map with every shape checked (and the note on ggml's permuted Q/K rows).
//! - [`tokenizer`]: GPT-2 byte-level BPE from `tokenizer.ggml.*` on the Hugging Face
//!   `tokenizers` crate; encode, decode, and a streaming detokenizer that emits only whole
//!   UTF-8 characters.
//! - [`template`]: the chat template (`tokenizer.chat_template`, Jinja) on `minijinja`.
//! - [`testing`]: a tiny llama with random weights written as GGUF (test models).
//!
//! Like llama.cpp keeps `gguf` apart from the model graph, the program-family builder and the
//! engine live in modules of their own on top of these.

pub mod build;
pub mod config;
pub mod engine;
pub mod generate;
pub mod gguf;
pub mod graph;
pub mod quant;
pub mod runner;
pub mod template;
pub mod testing;
pub mod tokenizer;

pub use config::{LayerTensors, LlamaConfig, LlamaTensors};
pub use gguf::{Gguf, GgufError, GgufFile, TensorInfo, Value};
pub use quant::{DequantError, GgmlType};
pub use template::{ChatMessage, ChatTemplate};
pub use tokenizer::{StreamDecoder, Tokenizer};

use std::fmt;

/// An error of this crate: each names its culprit (the key, the tensor, the token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The file is not a valid GGUF file.
    Gguf(GgufError),
    /// A metadata key is missing or has the wrong type or value.
    Metadata {
        /// The key.
        key: String,
        /// What was wrong.
        why: String,
    },
    /// A tensor is missing, of the wrong shape, or of a type that cannot be used.
    Tensor {
        /// The tensor's name.
        name: String,
        /// What was wrong.
        why: String,
    },
    /// The model is of an architecture or kind this crate does not build.
    Unsupported(String),
    /// The tokenizer cannot be built, or cannot encode or decode.
    Tokenizer(String),
    /// The chat template does not compile or render.
    Template(String),
    /// A runtime call or a file of the model directory failed: what was being done, and why.
    Runtime(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Gguf(e) => write!(f, "{e}"),
            Error::Metadata { key, why } => write!(f, "metadata key '{key}': {why}"),
            Error::Tensor { name, why } => write!(f, "tensor '{name}': {why}"),
            Error::Unsupported(why) => write!(f, "unsupported model: {why}"),
            Error::Tokenizer(why) => write!(f, "tokenizer: {why}"),
            Error::Template(why) => write!(f, "chat template: {why}"),
            Error::Runtime(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<GgufError> for Error {
    fn from(e: GgufError) -> Error {
        Error::Gguf(e)
    }
}

impl GgufFile {
    /// A tensor dequantized to f32 (row-major, `dims[0]` innermost); the error names it.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, Error> {
        let (t, data) = self.tensor(name).ok_or_else(|| Error::Tensor {
            name: name.to_string(),
            why: "absent from the file".into(),
        })?;
        quant::dequantize_vec(t.ggml_type, data, t.n_elements()).map_err(|e| Error::Tensor {
            name: name.to_string(),
            why: e.to_string(),
        })
    }

    /// Row `row` of a tensor (its `dims[0]` values) dequantized to f32.
    pub fn tensor_row_f32(&self, name: &str, row: u64) -> Result<Vec<f32>, Error> {
        let err = |why: String| Error::Tensor {
            name: name.to_string(),
            why,
        };
        let (t, data) = self
            .tensor(name)
            .ok_or_else(|| err("absent from the file".into()))?;
        let cols = t.dims.first().copied().unwrap_or(1);
        if row >= t.n_rows() {
            return Err(err(format!("row {row} of {} rows", t.n_rows())));
        }
        // The tensor's size was checked at parse time, so one row's bytes and offset fit.
        let row_bytes = t.ggml_type.row_bytes(cols).unwrap_or(0);
        let start = (row * row_bytes) as usize;
        let bytes = &data[start..start + row_bytes as usize];
        quant::dequantize_vec(t.ggml_type, bytes, cols).map_err(|e| err(e.to_string()))
    }
}
