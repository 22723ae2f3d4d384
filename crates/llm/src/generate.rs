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
    /// Cancelled: the client went away or the server stopped.
    Abort,
}

impl FinishReason {
    /// `stop` or `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
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
    /// Go on past EOS (vLLM's `ignore_eos`: benchmarks fix the output length with it).
    pub ignore_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_tokens: 16,
            stop: Vec::new(),
            sampling: Sampling::default(),
            ignore_eos: false,
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

impl Generation {
    /// A request cancelled before it ran.
    pub fn aborted(prompt_token_ids: Vec<u32>) -> Generation {
        Generation {
            prompt_token_ids,
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            finish_reason: FinishReason::Abort,
            ttft_ms: 0.0,
            tpot_ms: 0.0,
            tokens_per_s: 0.0,
        }
    }
}

/// One sequence being generated: what it has produced and when it ends (the output
/// processor: detokenizing as whole UTF-8 characters, the stop checks).
pub(crate) struct Sequence<'t> {
    prompt: Vec<u32>,
    params: GenerateParams,
    slot: usize,
    stream: crate::tokenizer::StreamDecoder<'t>,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    text: String,
    /// Bytes of `text` handed out so far (the rest may be the start of a stop string).
    shown: usize,
    /// Tokens handed out so far.
    tokens_shown: usize,
    finish: Option<FinishReason>,
    start: Instant,
    first: Option<std::time::Duration>,
    /// When the last token arrived (inter-token latency).
    last: Option<Instant>,
}

/// What a sequence produced since it was last asked (see [`Sequence::take_delta`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delta {
    /// New text: whole UTF-8 characters, none of it possibly the start of a stop string.
    pub text: String,
    /// The tokens chosen since.
    pub token_ids: Vec<u32>,
    /// Their log-probabilities.
    pub logprobs: Vec<f32>,
}

impl<'t> Sequence<'t> {
    pub(crate) fn new(
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
            shown: 0,
            tokens_shown: 0,
            finish: None,
            start: Instant::now(),
            first: None,
            last: None,
        }
    }

    /// Takes the token the device chose. Returns whether the sequence is finished; what may
    /// be shown of it is then [`Sequence::take_delta`]'s.
    pub(crate) fn accept(
        &mut self,
        s: Sampled,
        eos: Option<u32>,
        max_len: usize,
    ) -> Result<bool, Error> {
        let now = Instant::now();
        self.first.get_or_insert_with(|| now - self.start);
        self.last = Some(now);
        if Some(s.token) == eos && !self.params.ignore_eos {
            let rest = self.stream.finish();
            self.text.push_str(&rest);
            self.finish = Some(FinishReason::Stop);
            self.cut_at_stop();
            return Ok(true);
        }
        self.tokens.push(s.token);
        self.logprobs.push(s.logprob);
        let piece = self.stream.push(s.token)?;
        self.text.push_str(&piece);
        if self.cut_at_stop() {
            self.finish = Some(FinishReason::Stop);
            return Ok(true);
        }
        if self.tokens.len() >= self.params.max_tokens
            || self.prompt.len() + self.tokens.len() >= max_len
        {
            let rest = self.stream.finish();
            self.text.push_str(&rest);
            self.finish = Some(if self.cut_at_stop() {
                FinishReason::Stop
            } else {
                FinishReason::Length
            });
            return Ok(true);
        }
        Ok(false)
    }

    /// Cuts the text before the first stop string in it; whether there was one.
    fn cut_at_stop(&mut self) -> bool {
        // Only text not yet shown can hold a new match's start (what was shown was checked
        // not to begin one), so search from a stop string's length before it.
        let longest = self.params.stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.shown.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let cut = self
            .params
            .stop
            .iter()
            .filter(|x| !x.is_empty())
            .filter_map(|x| self.text[from..].find(x.as_str()).map(|k| from + k))
            .min();
        match cut {
            Some(c) => {
                self.text.truncate(c.max(self.shown));
                true
            }
            None => false,
        }
    }

    /// Bytes at the end of the text that could begin a stop string (held back while the
    /// sequence runs: the next token may complete it).
    fn held_back(&self) -> usize {
        if self.finish.is_some() {
            return 0;
        }
        let t = &self.text[self.shown..];
        self.params
            .stop
            .iter()
            .filter_map(|stop| {
                (1..stop.len().min(t.len() + 1))
                    .rev()
                    .filter(|&n| t.is_char_boundary(t.len() - n) && stop.is_char_boundary(n))
                    .find(|&n| t.ends_with(&stop[..n]))
            })
            .max()
            .unwrap_or(0)
    }

    /// What was produced since the last call that may be shown.
    pub(crate) fn take_delta(&mut self) -> Delta {
        let end = self.text.len() - self.held_back();
        let text = self.text[self.shown..end].to_string();
        self.shown = end;
        let d = Delta {
            text,
            token_ids: self.tokens[self.tokens_shown..].to_vec(),
            logprobs: self.logprobs[self.tokens_shown..].to_vec(),
        };
        self.tokens_shown = self.tokens.len();
        d
    }

    /// Its cache slot.
    pub(crate) fn slot(&self) -> usize {
        self.slot
    }

    /// When its last token arrived.
    pub(crate) fn last_token_at(&self) -> Option<Instant> {
        self.last
    }

    /// Ends it early (the client left): `Length`-less, with what it has.
    pub(crate) fn abort(&mut self) {
        self.finish.get_or_insert(FinishReason::Abort);
    }

    /// The row that feeds its last token.
    pub(crate) fn row(&self) -> DecodeRow {
        DecodeRow {
            slot: self.slot,
            token: *self.tokens.last().expect("a running sequence has a token"),
            position: self.prompt.len() + self.tokens.len() - 1,
            sampling: self.params.sampling,
        }
    }

    pub(crate) fn done(self) -> Generation {
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

/// A prompt takes 1 to `max_len − 1` tokens (one longer than the largest context bucket
/// prefills in chunks).
pub(crate) fn check_prompt(max_len: usize, i: usize, prompt: &[u32]) -> Result<(), Error> {
    if prompt.is_empty() || prompt.len() >= max_len {
        return Err(Error::Unsupported(format!(
            "prompt {i}: {} tokens; a prompt needs 1 to {} (below the max model length {max_len})",
            prompt.len(),
            max_len - 1
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
    check_prompt(r.max_model_len(), 0, prompt)?;
    let (eos, max_len) = (r.manifest.eos, r.max_model_len());
    let tokenizer = r.tokenizer.clone();
    let mut seq = Sequence::new(&tokenizer, prompt, p, slot);
    let mut s = r.prefill(slot, prompt, &p.sampling)?;
    loop {
        let done = seq.accept(s, eos, max_len)?;
        show(&mut seq, on_text);
        if done {
            return Ok(seq.done());
        }
        s = r.decode(&[seq.row()])?[0];
    }
}

/// Hands a sequence's new text to `on_text`, if there is any.
fn show(seq: &mut Sequence<'_>, on_text: &mut dyn FnMut(&str)) {
    let d = seq.take_delta();
    if !d.text.is_empty() {
        on_text(&d.text);
    }
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
        check_prompt(r.max_model_len(), i, prompt)?;
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
            let done = seq.accept(s, eos, max_len)?;
            show(&mut seq, &mut |t| on_text(i, t));
            if done {
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
            let done = seq.accept(s, eos, max_len)?;
            show(seq, &mut |t| on_text(i, t));
            if done {
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
