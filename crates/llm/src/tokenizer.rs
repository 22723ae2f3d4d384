//! The tokenizer: GPT-2 byte-level BPE from the GGUF `tokenizer.ggml.*` metadata.
//!
//! Built on the Hugging Face `tokenizers` crate (pure-Rust `fancy-regex`, no Oniguruma):
//!
//! - **model**: BPE with the vocabulary `tokenizer.ggml.tokens` (id = index) and the merges
//!   `tokenizer.ggml.merges` (`"a b"`, rank = index);
//! - **pre-tokenizer** from `tokenizer.ggml.pre`, as llama.cpp's `llama-vocab.cpp` splits:
//!   `smollm` (and `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`: the same split)
//!   isolates every digit (`\p{N}`) and then applies GPT-2's regex
//!   (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`) — in
//!   `tokenizers` terms `Sequence[Digits(individual), ByteLevel(use_regex)]`; `gpt2` (and
//!   `mpt`, `olmo`, `jais`) is GPT-2's regex alone;
//! - **special tokens**: the control tokens (`tokenizer.ggml.token_type` 3, e.g.
//!   `<|im_start|>`) and user-defined ones (4) are matched whole in the text, so a rendered chat
//!   template encodes to its control ids;
//! - BOS (`tokenizer.ggml.bos_token_id`) is prepended only when
//!   `tokenizer.ggml.add_bos_token` is true (SmolLM2: false).
//!
//! Decoding maps each token back to its bytes (GPT-2's byte↔unicode table; special tokens are
//! their text) and joins them; [`StreamDecoder`] emits text only up to the last complete
//! UTF-8 character, holding a split character's first bytes for the next token.

use std::collections::HashMap;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::Error;
use crate::gguf::{Array, Gguf, Value};

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    /// An ordinary token.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control token (`<|im_start|>`): matched whole in text, not shown when skipping special.
    pub const CONTROL: i32 = 3;
    /// A user-defined token: matched whole in text.
    pub const USER_DEFINED: i32 = 4;
    /// An unused slot.
    pub const UNUSED: i32 = 5;
    /// A byte token (`<0x0A>`, SentencePiece vocabularies).
    pub const BYTE: i32 = 6;
}

/// The byte-level BPE tokenizer of a GGUF file.
pub struct Tokenizer {
    hf: HfTokenizer,
    /// Each token's bytes.
    pieces: Vec<Vec<u8>>,
    /// Each token's type (`token_type`).
    types: Vec<i32>,
    /// The pre-tokenizer's name (`tokenizer.ggml.pre`).
    pub pre: String,
    /// The beginning-of-sequence token.
    pub bos: Option<u32>,
    /// The end-of-sequence token.
    pub eos: Option<u32>,
    /// Whether [`Tokenizer::encode`] prepends BOS.
    pub add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

fn tok_err(why: impl Into<String>) -> Error {
    Error::Tokenizer(why.into())
}

fn meta_err(key: &str, why: impl Into<String>) -> Error {
    Error::Metadata {
        key: key.to_string(),
        why: why.into(),
    }
}

/// GPT-2's byte → unicode table: printable bytes stand for themselves, the others for
/// U+0100 onwards, in byte order.
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\u{FFFD}')
        };
    }
    table
}

fn optional_id(g: &Gguf, key: &str, vocab: usize) -> Result<Option<u32>, Error> {
    let Some(v) = g.get(key) else {
        return Ok(None);
    };
    let id = v
        .as_u64()
        .ok_or_else(|| meta_err(key, format!("a {}, expected an integer", v.describe())))?;
    if id >= vocab as u64 {
        return Err(meta_err(
            key,
            format!("token {id} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok(Some(id as u32))
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file (`tokenizer.ggml.model` = `gpt2`).
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, Error> {
        let model_key = "tokenizer.ggml.model";
        let model = g
            .get(model_key)
            .ok_or_else(|| meta_err(model_key, "missing"))?
            .as_str()
            .ok_or_else(|| meta_err(model_key, "not a string"))?;
        if model != "gpt2" {
            return Err(Error::Unsupported(format!(
                "tokenizer model '{model}' ({model_key}); the GPT-2 byte-level BPE ('gpt2') is \
                 read"
            )));
        }
        let tokens_key = "tokenizer.ggml.tokens";
        let tokens = match g.get(tokens_key) {
            Some(Value::Array(Array::String(t))) if !t.is_empty() => t,
            Some(v) => {
                return Err(meta_err(
                    tokens_key,
                    format!("a {}, expected a non-empty array of strings", v.describe()),
                ));
            }
            None => return Err(meta_err(tokens_key, "missing")),
        };
        if tokens.len() > u32::MAX as usize {
            return Err(meta_err(tokens_key, "more tokens than u32 ids"));
        }
        let merges_key = "tokenizer.ggml.merges";
        let merges = match g.get(merges_key) {
            Some(Value::Array(Array::String(m))) => m.as_slice(),
            Some(Value::Array(a)) if a.is_empty() => &[],
            Some(v) => {
                return Err(meta_err(
                    merges_key,
                    format!("a {}, expected an array of strings", v.describe()),
                ));
            }
            None => return Err(meta_err(merges_key, "missing")),
        };
        let types_key = "tokenizer.ggml.token_type";
        let types: Vec<i32> = match g.get(types_key) {
            None => vec![token_type::NORMAL; tokens.len()],
            Some(Value::Array(Array::I32(t))) if t.len() == tokens.len() => t.clone(),
            Some(v) => {
                return Err(meta_err(
                    types_key,
                    format!(
                        "a {}, expected an array of {} i32",
                        v.describe(),
                        tokens.len()
                    ),
                ));
            }
        };
        let pre = match g.get("tokenizer.ggml.pre") {
            None => "gpt2".to_string(),
            Some(v) => v
                .as_str()
                .ok_or_else(|| meta_err("tokenizer.ggml.pre", "not a string"))?
                .to_string(),
        };
        let byte_level = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
        let pre_tokenizer = match pre.as_str() {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
                PreTokenizerWrapper::Sequence(Sequence::new(vec![
                    PreTokenizerWrapper::Digits(Digits::new(true)),
                    byte_level(),
                ]))
            }
            "gpt2" | "mpt" | "olmo" | "jais" => byte_level(),
            other => {
                return Err(Error::Unsupported(format!(
                    "pre-tokenizer '{other}' (tokenizer.ggml.pre); read: smollm, starcoder, \
                     refact, command-r, codeshell, exaone, gpt2, mpt, olmo, jais"
                )));
            }
        };

        let vocab_len = tokens.len();
        let mut vocab = Vocab::default();
        vocab
            .try_reserve(vocab_len)
            .map_err(|_| tok_err("out of memory for the vocabulary"))?;
        for (id, t) in tokens.iter().enumerate() {
            // A duplicate keeps its first id (as llama.cpp's token-to-id map does).
            vocab.entry(t.clone()).or_insert(id as u32);
        }
        let mut merge_pairs = Vec::new();
        merge_pairs
            .try_reserve_exact(merges.len())
            .map_err(|_| tok_err("out of memory for the merges"))?;
        for (i, m) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first character.
            let split = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(at, _)| at)
                .ok_or_else(|| meta_err(merges_key, format!("merge {i} ({m:?}) has no space")))?;
            let (a, b) = (&m[..split], &m[split + 1..]);
            for part in [a, b] {
                if !vocab.contains_key(part) {
                    return Err(meta_err(
                        merges_key,
                        format!("merge {i} ({m:?}): {part:?} is not in the vocabulary"),
                    ));
                }
            }
            let merged = format!("{a}{b}");
            if !vocab.contains_key(&merged) {
                return Err(meta_err(
                    merges_key,
                    format!("merge {i} ({m:?}): the merged {merged:?} is not in the vocabulary"),
                ));
            }
            merge_pairs.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merge_pairs)
            .build()
            .map_err(|e| tok_err(format!("building the BPE model: {e}")))?;
        let mut hf = HfTokenizer::new(bpe);
        hf.with_pre_tokenizer(Some(pre_tokenizer));

        let mut specials = Vec::new();
        let mut user = Vec::new();
        for (t, &ty) in tokens.iter().zip(&types) {
            if t.is_empty() {
                continue;
            }
            match ty {
                token_type::CONTROL => specials.push(AddedToken::from(t.clone(), true)),
                token_type::USER_DEFINED => user.push(AddedToken::from(t.clone(), false)),
                _ => {}
            }
        }
        hf.add_special_tokens(specials)
            .map_err(|e| tok_err(format!("adding the control tokens: {e}")))?;
        hf.add_tokens(user)
            .map_err(|e| tok_err(format!("adding the user-defined tokens: {e}")))?;

        let to_unicode = bytes_to_unicode();
        let mut from_unicode: HashMap<char, u8> = HashMap::new();
        for (b, &c) in to_unicode.iter().enumerate() {
            from_unicode.insert(c, b as u8);
        }
        let mut pieces = Vec::new();
        pieces
            .try_reserve_exact(vocab_len)
            .map_err(|_| tok_err("out of memory for the vocabulary"))?;
        for (t, &ty) in tokens.iter().zip(&types) {
            let bytes = if matches!(ty, token_type::CONTROL | token_type::USER_DEFINED) {
                t.as_bytes().to_vec()
            } else {
                let mut b = Vec::with_capacity(t.len());
                for c in t.chars() {
                    match from_unicode.get(&c) {
                        Some(&byte) => b.push(byte),
                        // Not a byte-level character: its own UTF-8.
                        None => b.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                    }
                }
                b
            };
            pieces.push(bytes);
        }

        let bos = optional_id(g, "tokenizer.ggml.bos_token_id", vocab_len)?;
        let eos = optional_id(g, "tokenizer.ggml.eos_token_id", vocab_len)?;
        let add_bos = match g.get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| meta_err("tokenizer.ggml.add_bos_token", "not a bool"))?,
        };
        if add_bos && bos.is_none() {
            return Err(meta_err(
                "tokenizer.ggml.bos_token_id",
                "missing, but tokenizer.ggml.add_bos_token is true",
            ));
        }
        Ok(Tokenizer {
            hf,
            pieces,
            types,
            pre,
            bos,
            eos,
            add_bos,
        })
    }

    /// The number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Encodes text (special tokens written in it are matched whole); prepends BOS when the
    /// file asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        let enc = self
            .hf
            .encode(text, false)
            .map_err(|e| tok_err(format!("encoding: {e}")))?;
        let mut ids = Vec::with_capacity(enc.get_ids().len() + 1);
        if self.add_bos
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// A token's bytes; `None` outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(Vec::as_slice)
    }

    /// Whether a token is a control token (BOS, EOS, `<|im_start|>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&token_type::CONTROL)
    }

    /// The id of a token's text, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    /// The bytes of a token sequence (every token, control tokens as their text).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id).ok_or_else(|| {
                tok_err(format!(
                    "token id {id} is outside the vocabulary of {}",
                    self.vocab_size()
                ))
            })?);
        }
        Ok(out)
    }

    /// Decodes a token sequence to text (every token, control tokens as their text; bytes
    /// that are not UTF-8 become U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }

    /// A streaming detokenizer; `skip_control` leaves control tokens out of the text.
    pub fn stream(&self, skip_control: bool) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
            skip_control,
        }
    }

    /// The `tokenizers` tokenizer underneath.
    pub fn hf(&self) -> &HfTokenizer {
        &self.hf
    }
}

/// Turns tokens into text as they come, emitting only complete UTF-8 characters: a character
/// split over tokens (an emoji's four bytes over two byte-level tokens) comes out whole with
/// the token that completes it.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u8>,
    skip_control: bool,
}

impl StreamDecoder<'_> {
    /// Adds a token; returns the text it completes (maybe empty).
    pub fn push(&mut self, id: u32) -> Result<String, Error> {
        if self.skip_control && self.tokenizer.is_control(id) {
            return Ok(String::new());
        }
        let bytes = self.tokenizer.token_bytes(id).ok_or_else(|| {
            tok_err(format!(
                "token id {id} is outside the vocabulary of {}",
                self.tokenizer.vocab_size()
            ))
        })?;
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix up to `valid` is UTF-8 (from_utf8 said so).
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        // Invalid bytes (not merely an unfinished character): U+FFFD for them.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                        // An unfinished character at the end: keep it for the next token.
                        None => {
                            self.pending.drain(..valid);
                            break;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Ends the stream: an unfinished character left over becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
