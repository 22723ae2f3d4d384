//! One sequence generated on a [`Runner`]: prefill, then decode steps until EOS, a stop
//! string, `max_tokens` or the max model length — with the text streamed as whole UTF-8
//! characters and the timings users compare (TTFT, TPOT, tokens/s).

use crate::Error;
use crate::runner::{DecodeRow, Runner, Sampling};
use std::time::Instant;

/// Why a sequence ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` or the max model length.
    Length,
}

impl FinishReason {
    /// `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateParams {
    /// Most new tokens.
    pub max_tokens: usize,
    /// Strings that end the generation (not included in the text).
    pub stop: Vec<String>,
    /// How each token is chosen (on the device).
    pub sampling: Sampling,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 16,
            stop: Vec::new(),
            sampling: Sampling::default(),
        }
    }
}

/// A finished generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The prompt's tokens.
    pub prompt_token_ids: Vec<u32>,
    /// The generated tokens (EOS not included).
    pub token_ids: Vec<u32>,
    /// Each generated token's log-probability.
    pub logprobs: Vec<f32>,
    /// Their text.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Time to the first token (the prefill), ms.
    pub ttft_ms: f64,
    /// Mean time per output token after the first, ms.
    pub tpot_ms: f64,
    /// Generated tokens per second over the whole request.
    pub tokens_per_s: f64,
}

/// Generates from `prompt` (token ids) in cache slot `slot`; `on_text` hears each piece of
/// text as it is decoded.
pub fn generate(
    r: &mut Runner,
    slot: usize,
    prompt: &[u32],
    p: &GenerateParams,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, Error> {
    let eos = r.manifest.eos;
    let max_len = r.max_model_len();
    if prompt.len() >= max_len {
        return Err(Error::Unsupported(format!(
            "a prompt of {} tokens leaves no room below the max model length ({max_len})",
            prompt.len()
        )));
    }
    let t0 = Instant::now();
    let mut next = r.prefill(slot, prompt, &p.sampling)?;
    let ttft = t0.elapsed();
    let tokenizer = r.tokenizer.clone();
    let mut stream = tokenizer.stream(true);
    let mut tokens = Vec::new();
    let mut logprobs = Vec::new();
    let mut text = String::new();
    let mut finish = FinishReason::Length;
    let mut pos = prompt.len();
    loop {
        if Some(next.token) == eos {
            finish = FinishReason::Stop;
            break;
        }
        tokens.push(next.token);
        logprobs.push(next.logprob);
        let piece = stream.push(next.token)?;
        text.push_str(&piece);
        if let Some(cut) = p.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            text.truncate(cut);
            finish = FinishReason::Stop;
            break;
        }
        on_text(&piece);
        if tokens.len() >= p.max_tokens || pos + 1 >= max_len {
            break;
        }
        next = r.decode(&[DecodeRow {
            slot,
            token: next.token,
            position: pos,
            sampling: p.sampling,
        }])?[0];
        pos += 1;
    }
    if finish == FinishReason::Length {
        let rest = stream.finish();
        on_text(&rest);
        text.push_str(&rest);
    }
    let total = t0.elapsed();
    let n = tokens.len();
    let tpot = if n > 1 {
        (total - ttft).as_secs_f64() * 1e3 / (n - 1) as f64
    } else {
        0.0
    };
    Ok(Generation {
        prompt_token_ids: prompt.to_vec(),
        token_ids: tokens,
        logprobs,
        text,
        finish_reason: finish,
        ttft_ms: ttft.as_secs_f64() * 1e3,
        tpot_ms: tpot,
        tokens_per_s: if total.as_secs_f64() > 0.0 {
            n as f64 / total.as_secs_f64()
        } else {
            0.0
        },
    })
}
