//! One sequence generated on a [`Runner`]: prefill, then decode steps until EOS, a stop
//! string, `max_tokens` or the max model length — with the text streamed as whole UTF-8
//! characters and the timings users compare (TTFT, TPOT, tokens/s).

use crate::Error;
use crate::runner::{DecodeRow, Runner, Sampled, Sampling};
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

/// One sequence being generated: what it has produced and when it ends (the output
/// processor: detokenizing as whole UTF-8 characters, the stop checks).
struct Sequence<'t> {
    prompt: Vec<u32>,
    params: GenerateParams,
    slot: usize,
    stream: crate::tokenizer::StreamDecoder<'t>,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    text: String,
    finish: Option<FinishReason>,
    start: Instant,
    first: Option<std::time::Duration>,
}

impl<'t> Sequence<'t> {
    fn new(
        tok: &'t crate::Tokenizer,
        prompt: &[u32],
        params: &GenerateParams,
        slot: usize,
    ) -> Self {
        Sequence {
            prompt: prompt.to_vec(),
            params: params.clone(),
            slot,
            stream: tok.stream(true),
            tokens: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            finish: None,
            start: Instant::now(),
            first: None,
        }
    }

    /// Takes the token the device chose; `on_text` hears the new text. Returns whether the
    /// sequence is finished.
    fn accept(
        &mut self,
        s: Sampled,
        eos: Option<u32>,
        max_len: usize,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<bool, Error> {
        self.first.get_or_insert_with(|| self.start.elapsed());
        if Some(s.token) == eos {
            self.finish = Some(FinishReason::Stop);
            return Ok(true);
        }
        self.tokens.push(s.token);
        self.logprobs.push(s.logprob);
        let piece = self.stream.push(s.token)?;
        self.text.push_str(&piece);
        if let Some(cut) = self
            .params
            .stop
            .iter()
            .filter_map(|x| self.text.find(x.as_str()))
            .min()
        {
            self.text.truncate(cut);
            self.finish = Some(FinishReason::Stop);
            return Ok(true);
        }
        on_text(&piece);
        if self.tokens.len() >= self.params.max_tokens
            || self.prompt.len() + self.tokens.len() >= max_len
        {
            let rest = self.stream.finish();
            on_text(&rest);
            self.text.push_str(&rest);
            self.finish = Some(FinishReason::Length);
            return Ok(true);
        }
        Ok(false)
    }

    /// The row that feeds its last token.
    fn row(&self) -> DecodeRow {
        DecodeRow {
            slot: self.slot,
            token: *self.tokens.last().expect("a running sequence has a token"),
            position: self.prompt.len() + self.tokens.len() - 1,
            sampling: self.params.sampling,
        }
    }

    fn done(self) -> Generation {
        let total = self.start.elapsed();
        let ttft = self.first.unwrap_or(total);
        let n = self.tokens.len();
        let tpot = if n > 1 {
            (total - ttft).as_secs_f64() * 1e3 / (n - 1) as f64
        } else {
            0.0
        };
        Generation {
            prompt_token_ids: self.prompt,
            token_ids: self.tokens,
            logprobs: self.logprobs,
            text: self.text,
            finish_reason: self.finish.unwrap_or(FinishReason::Length),
            ttft_ms: ttft.as_secs_f64() * 1e3,
            tpot_ms: tpot,
            tokens_per_s: if total.as_secs_f64() > 0.0 {
                n as f64 / total.as_secs_f64()
            } else {
                0.0
            },
        }
    }
}

fn check_prompt(r: &Runner, i: usize, prompt: &[u32]) -> Result<(), Error> {
    let max_len = r.max_model_len();
    if prompt.is_empty() || prompt.len() >= max_len {
        return Err(Error::Unsupported(format!(
            "prompt {i}: {} tokens; a prompt needs 1 to {} (below the max model length {max_len})",
            prompt.len(),
            max_len - 1
        )));
    }
    if prompt.len() > r.max_prompt() {
        return Err(Error::Unsupported(format!(
            "prompt {i}: {} tokens is longer than the largest context bucket ({} tokens)",
            prompt.len(),
            r.max_prompt()
        )));
    }
    Ok(())
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
    check_prompt(r, 0, prompt)?;
    let (eos, max_len) = (r.manifest.eos, r.max_model_len());
    let tokenizer = r.tokenizer.clone();
    let mut seq = Sequence::new(&tokenizer, prompt, p, slot);
    let mut s = r.prefill(slot, prompt, &p.sampling)?;
    while !seq.accept(s, eos, max_len, on_text)? {
        s = r.decode(&[seq.row()])?[0];
    }
    Ok(seq.done())
}

/// Generates for every request together, continuously batched: up to
/// `min(largest batch bucket, cache slots)` sequences run at once, each decode step is one
/// execution over all of them (the smallest bucket that holds them), a finished sequence
/// leaves at once and the next waiting request is prefilled into its slot. `on_text(i,
/// piece)` hears request `i`'s text. Each result is what the request gives alone (tokens are
/// chosen per row; a seed draws per position).
pub fn generate_batch(
    r: &mut Runner,
    requests: &[(Vec<u32>, GenerateParams)],
    on_text: &mut dyn FnMut(usize, &str),
) -> Result<Vec<Generation>, Error> {
    for (i, (prompt, p)) in requests.iter().enumerate() {
        check_prompt(r, i, prompt)?;
        p.sampling.check()?;
    }
    let (eos, max_len) = (r.manifest.eos, r.max_model_len());
    let width = r.max_batch().min(r.slots()).max(1);
    let tokenizer = r.tokenizer.clone();
    let mut free: Vec<usize> = (0..width).rev().collect();
    let mut waiting: std::collections::VecDeque<usize> = (0..requests.len()).collect();
    let mut running: Vec<(usize, Sequence<'_>)> = Vec::with_capacity(width);
    let mut results: Vec<Option<Generation>> = (0..requests.len()).map(|_| None).collect();
    loop {
        while running.len() < width {
            let Some(i) = waiting.pop_front() else { break };
            let slot = free
                .pop()
                .expect("a free slot per sequence below the width");
            let (prompt, p) = &requests[i];
            let mut seq = Sequence::new(&tokenizer, prompt, p, slot);
            let s = r.prefill(slot, prompt, &p.sampling)?;
            if seq.accept(s, eos, max_len, &mut |t| on_text(i, t))? {
                free.push(slot);
                results[i] = Some(seq.done());
            } else {
                running.push((i, seq));
            }
        }
        if running.is_empty() {
            break;
        }
        let rows: Vec<DecodeRow> = running.iter().map(|(_, s)| s.row()).collect();
        let out = r.decode(&rows)?;
        let mut k = 0;
        for s in out {
            let (i, seq) = &mut running[k];
            let i = *i;
            if seq.accept(s, eos, max_len, &mut |t| on_text(i, t))? {
                let (_, seq) = running.remove(k);
                free.push(seq.slot);
                results[i] = Some(seq.done());
            } else {
                k += 1;
            }
        }
    }
    Ok(results
        .into_iter()
        .map(|g| g.expect("every request ran"))
        .collect())
}
