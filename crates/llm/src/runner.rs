//! The model runner: a model directory loaded on one logical NeuronCore — the weights and
//! the KV cache allocated once on the device and bound to every program — and the runtime
//! calls of one prefill or one decode step, with the bucket each needs.
//!
//! It drives the runtime through its public API like any client: each program is a loaded
//! model; the weights are slices of one device tensor, each layer's key and value cache a
//! slice of another, bound as both the input `past_key_values.N.*` and the in-place output
//! `present.N.*`. A step writes only its small inputs (ids, positions, slots, the index of
//! each row's last token) and reads back one token id per row.

use crate::build::{Manifest, ProgramInfo};
use crate::graph::{self, Head, WeightSource};
use crate::{ChatTemplate, Error, GgufFile, Tokenizer};
use nrt_runtime::{LoadOptions, Model, Placement, Runtime, Tensor, TensorSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// A step's failure in the runtime, with what was being done.
fn rt_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Runtime(format!("{what}: {e}"))
}

/// One loaded program and its small I/O tensors.
struct Program {
    info: ProgramInfo,
    model: Model,
    inputs: TensorSet,
    outputs: TensorSet,
    ids: Tensor,
    positions: Tensor,
    slots: Tensor,
    last: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    seed: Tensor,
    next: Tensor,
    logprob: Tensor,
    /// The logits output of a [`Head::Logits`] program.
    logits: Option<Tensor>,
}

/// How a row's next token is chosen on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0: greedy (the default); else the logits are divided by it.
    pub temperature: f32,
    /// Sample among the `top_k` most likely tokens (0: all).
    pub top_k: u32,
    /// ... and among the smallest set of those whose probability reaches `top_p` (1: all).
    pub top_p: f32,
    /// The request's seed: with the token's position it fixes the draw, whatever else is in
    /// the batch.
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Greedy decoding.
    pub fn greedy() -> Sampling {
        Sampling::default()
    }

    /// Checks the values: the error names the parameter.
    pub fn check(&self) -> Result<(), Error> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(Error::Unsupported(format!(
                "temperature {}: a finite number ≥ 0",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Unsupported(format!(
                "top_p {}: in (0, 1]",
                self.top_p
            )));
        }
        Ok(())
    }
}

/// A token chosen on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-probability under the model (before temperature and restrictions).
    pub logprob: f32,
}

/// What one chunk of a prefill did ([`Runner::prefill_chunk`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PrefillChunk {
    /// The prompt's tokens in the cache now.
    pub done: usize,
    /// The context bucket it ran in (the tokens computed, padding or recomputed ones
    /// included).
    pub bucket: usize,
    /// The next token, when this was the prompt's last chunk.
    pub next: Option<Sampled>,
}

/// A row of a decode step: its cache slot, its last token and that token's position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeRow {
    /// KV-cache slot (below [`Runner::slots`]).
    pub slot: usize,
    /// The token to feed.
    pub token: u32,
    /// Its position (below the max model length).
    pub position: usize,
    /// How its next token is chosen.
    pub sampling: Sampling,
}

/// What the runner has counted (for `nrt llm bench` and the trace).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunnerCounters {
    /// Prefill executions.
    pub prefills: u64,
    /// Decode executions.
    pub decodes: u64,
    /// Executions that ran a different program than the one before (a model switch).
    pub switches: u64,
}

/// A model directory loaded on the device.
pub struct Runner {
    /// The directory's manifest.
    pub manifest: Manifest,
    /// The tokenizer (shared with the streams that decode its output).
    pub tokenizer: std::sync::Arc<Tokenizer>,
    /// The chat template, when the model has one.
    pub template: Option<ChatTemplate>,
    /// The directory.
    pub dir: PathBuf,
    rt: Runtime,
    vnc: i32,
    programs: Vec<Program>,
    /// The weights (one device tensor) and the cache (another): kept alive with the views.
    _weights: Tensor,
    _cache: Tensor,
    last_program: Option<usize>,
    counters: RunnerCounters,
}

impl Runner {
    /// Loads `dir` on logical core `vnc` of `rt`.
    pub fn load(rt: &Runtime, dir: &Path, vnc: i32) -> Result<Runner, Error> {
        Runner::load_with(rt, dir, vnc, Head::Sample)
    }

    /// Loads `dir` with programs that return each row's logits instead of a token
    /// ([`Head::Logits`], compiled from the manifest now): the reference comparison's runner.
    pub fn load_logits(rt: &Runtime, dir: &Path, vnc: i32) -> Result<Runner, Error> {
        Runner::load_with(rt, dir, vnc, Head::Logits)
    }

    fn load_with(rt: &Runtime, dir: &Path, vnc: i32, head: Head) -> Result<Runner, Error> {
        let manifest = Manifest::read(dir)?;
        manifest.check()?;
        let tok_file = GgufFile::open(dir.join(&manifest.tokenizer))?;
        let tokenizer = Tokenizer::from_gguf(&tok_file.gguf)?;
        let template = ChatTemplate::from_gguf(&tok_file.gguf, &tokenizer)?;
        let c = manifest.llama_config();
        let expect = graph::weights(&c);
        let names: Vec<&str> = manifest
            .weights
            .tensors
            .iter()
            .map(|w| w.name.as_str())
            .collect();
        if names != expect.iter().map(|w| w.0.as_str()).collect::<Vec<_>>() {
            return Err(Error::Unsupported(format!(
                "{}: the manifest's weights do not match the model's configuration",
                dir.display()
            )));
        }

        // The weights: one device allocation, filled from weights.bin.
        let wpath = dir.join(&manifest.weights.file);
        let wbytes = manifest.weights.bytes;
        let on_disk = std::fs::metadata(&wpath)
            .map_err(|e| rt_err(&wpath.display().to_string(), e))?
            .len();
        if on_disk != wbytes {
            return Err(Error::Unsupported(format!(
                "{}: {on_disk} bytes, the manifest says {wbytes}",
                wpath.display()
            )));
        }
        let weights = rt
            .allocate_tensor(Placement::Device, vnc, wbytes.max(1), "llm.weights")
            .map_err(|e| rt_err("allocating the weights on the device", e))?;
        let mut f =
            std::fs::File::open(&wpath).map_err(|e| rt_err(&wpath.display().to_string(), e))?;
        let mut buf = vec![0u8; 16 << 20];
        let mut at = 0u64;
        while at < wbytes {
            let n = (wbytes - at).min(buf.len() as u64) as usize;
            f.read_exact(&mut buf[..n])
                .map_err(|e| rt_err(&wpath.display().to_string(), e))?;
            weights
                .write(&buf[..n], at)
                .map_err(|e| rt_err("writing the weights", e))?;
            at += n as u64;
        }
        let mut views = Vec::with_capacity(expect.len());
        for w in &manifest.weights.tensors {
            if w.expected_bytes() != Some(w.bytes) {
                return Err(Error::Tensor {
                    name: w.name.clone(),
                    why: format!("{} bytes in the manifest for shape {:?}", w.bytes, w.shape),
                });
            }
            views.push(
                weights
                    .slice(w.offset, w.bytes, &w.name)
                    .map_err(|e| rt_err(&w.name, e))?,
            );
        }

        // The cache: one allocation, a key and a value slice per layer.
        let k = &manifest.cache;
        let per = (k.slots * k.len * k.kv_heads * k.head_dim * 4) as u64;
        let cache = rt
            .allocate_tensor(Placement::Device, vnc, k.bytes.max(1), "llm.kv_cache")
            .map_err(|e| rt_err("allocating the KV cache on the device", e))?;
        if per * 2 * k.layers as u64 != k.bytes {
            return Err(Error::Unsupported(format!(
                "{}: cache of {} bytes does not match its geometry",
                dir.display(),
                k.bytes
            )));
        }
        let mut caches = Vec::new();
        for l in 0..k.layers {
            let [pk, pv, _, _] = graph::cache_names(l);
            caches.push((
                l,
                cache
                    .slice(2 * l as u64 * per, per, &pk)
                    .map_err(|e| rt_err(&pk, e))?,
                cache
                    .slice((2 * l as u64 + 1) * per, per, &pv)
                    .map_err(|e| rt_err(&pv, e))?,
            ));
        }

        let mut programs = Vec::new();
        for p in &manifest.programs {
            let path = dir.join(&p.file);
            let ncm = match head {
                Head::Sample => {
                    std::fs::read(&path).map_err(|e| rt_err(&path.display().to_string(), e))?
                }
                Head::Logits => logits_program(&manifest, p)?,
            };
            // The weights and the caches are resident: bound once here, read (and the
            // caches updated) where they lie by every program.
            let mut resident: Vec<(String, Tensor)> = manifest
                .weights
                .tensors
                .iter()
                .zip(&views)
                .map(|(w, t)| (w.name.clone(), t.clone()))
                .collect();
            for (l, kt, vt) in &caches {
                let [pk, pv, _, _] = graph::cache_names(*l);
                resident.push((pk, kt.clone()));
                resident.push((pv, vt.clone()));
            }
            let opts = LoadOptions {
                resident,
                ..Default::default()
            };
            let model = rt
                .load(&ncm, vnc, &opts)
                .map_err(|e| rt_err(&format!("loading {}", p.file), e))?;
            let small = |n: &str, bytes: u64| {
                rt.allocate_tensor(Placement::Device, vnc, bytes, &format!("{}.{n}", p.file))
                    .map_err(|e| rt_err(n, e))
            };
            let (b, l) = (p.batch as u64, p.seq as u64);
            let ids = small("input_ids", 8 * b * l)?;
            let positions = small("positions", 8 * b * l)?;
            let slots = small("slots", 8 * b)?;
            let last = small("last", 8 * b)?;
            let temperature = small("temperature", 4 * b)?;
            let top_k = small("top_k", 8 * b)?;
            let top_p = small("top_p", 4 * b)?;
            let seed = small("seed", 8 * b)?;
            let next = small("next_token", 8 * b)?;
            let logprob = small("logprob", 4 * b)?;
            let vocab = manifest.config.vocab_size as u64;
            let logits = match head {
                Head::Logits => Some(small("logits", 4 * b * vocab)?),
                Head::Sample => None,
            };
            let mut inputs = TensorSet::new();
            let mut outputs = TensorSet::new();
            inputs.add("input_ids", &ids);
            inputs.add("positions", &positions);
            inputs.add("slots", &slots);
            inputs.add("last", &last);
            inputs.add("temperature", &temperature);
            inputs.add("top_k", &top_k);
            inputs.add("top_p", &top_p);
            inputs.add("seed", &seed);
            match &logits {
                Some(l) => outputs.add("logits", l),
                None => {
                    outputs.add("next_token", &next);
                    outputs.add("logprob", &logprob);
                }
            }
            programs.push(Program {
                info: p.clone(),
                model,
                inputs,
                outputs,
                ids,
                positions,
                slots,
                last,
                temperature,
                top_k,
                top_p,
                seed,
                next,
                logprob,
                logits,
            });
        }
        Ok(Runner {
            manifest,
            tokenizer: std::sync::Arc::new(tokenizer),
            template,
            dir: dir.to_path_buf(),
            rt: rt.clone(),
            vnc,
            programs,
            _weights: weights,
            _cache: cache,
            last_program: None,
            counters: RunnerCounters::default(),
        })
    }

    /// KV-cache slots that sequences may use (the spare one is for padding rows).
    pub fn slots(&self) -> usize {
        self.manifest.cache.slots - 1
    }

    /// The longest sequence.
    pub fn max_model_len(&self) -> usize {
        self.manifest.max_model_len
    }

    /// The longest prompt: one token below the max model length (a prompt longer than
    /// the largest context bucket prefills in chunks).
    pub fn max_prompt(&self) -> usize {
        self.max_model_len().saturating_sub(1)
    }

    /// The most tokens one prefill execution takes (the largest context bucket): a longer
    /// prompt goes in chunks of it.
    pub fn chunk_len(&self) -> usize {
        self.manifest.context_buckets.last().copied().unwrap_or(0)
    }

    /// The largest decode batch.
    pub fn max_batch(&self) -> usize {
        self.manifest.batch_buckets.last().copied().unwrap_or(0)
    }

    /// Resets the logical core after a failed execution (`nrt_reset_vnc`): a core wedged by a
    /// fatal fault takes executions again; the weights, the cache and the loaded programs
    /// stay.
    pub fn reset(&mut self) -> Result<(), Error> {
        let vnc = u32::try_from(self.vnc)
            .map_err(|_| rt_err("resetting", format!("logical core {}", self.vnc)))?;
        self.rt
            .reset_vnc(vnc)
            .map_err(|e| rt_err(&format!("resetting logical core {vnc}"), e))
    }

    /// What was counted so far.
    pub fn counters(&self) -> RunnerCounters {
        self.counters
    }

    /// The program of `phase` whose bucket is the smallest that holds `n`.
    fn pick(&self, phase: &str, n: usize) -> Option<usize> {
        self.programs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.info.phase == phase)
            .filter(|(_, p)| {
                if phase == "prefill" {
                    p.info.seq >= n
                } else {
                    p.info.batch >= n
                }
            })
            .min_by_key(|(_, p)| {
                if phase == "prefill" {
                    p.info.seq
                } else {
                    p.info.batch
                }
            })
            .map(|(i, _)| i)
    }

    /// The bucket a prompt of `n` tokens prefills in at once, if any.
    pub fn prefill_bucket(&self, n: usize) -> Option<usize> {
        self.pick("prefill", n).map(|i| self.programs[i].info.seq)
    }

    /// The context bucket of each chunk a prompt of `n` tokens prefills in (one for a
    /// prompt that fits the largest bucket; empty for an empty prompt).
    pub fn prefill_chunks(&self, n: usize) -> Vec<usize> {
        let mut v = Vec::new();
        let mut done = 0;
        while let Some((i, _, end)) = self.plan_chunk(n, done) {
            v.push(self.programs[i].info.seq);
            done = end;
        }
        v
    }

    /// The chunk of a prompt of `n` tokens after its first `done`: its program and the
    /// prompt positions `start..end` it computes. Tokens beyond the largest context bucket
    /// go in a chunk of that bucket; the last chunk takes the smallest bucket that holds the
    /// rest and, when it is not the first, ends at the prompt's end — it recomputes up to
    /// a bucket of tokens before `done` instead of padding past them, so no position beyond
    /// the prompt is written and none reaches the max model length. The first chunk starts
    /// at 0 (padded when the prompt is shorter than its bucket).
    fn plan_chunk(&self, n: usize, done: usize) -> Option<(usize, usize, usize)> {
        if done >= n {
            return None;
        }
        let rest = n - done;
        let last_chunk = rest <= self.chunk_len();
        let i = self.pick("prefill", if last_chunk { rest } else { self.chunk_len() })?;
        let l = self.programs[i].info.seq;
        let start = if !last_chunk {
            done
        } else if n >= l {
            done.min(n - l)
        } else {
            0
        };
        Some((i, start, (start + l).min(n)))
    }

    /// The bucket `n` rows decode in, if any.
    pub fn decode_bucket(&self, n: usize) -> Option<usize> {
        self.pick("decode", n).map(|i| self.programs[i].info.batch)
    }

    /// Writes each row's sampling parameters (padding rows: greedy).
    fn write_sampling(&self, i: usize, rows: &[Sampling]) -> Result<(), Error> {
        let p = &self.programs[i];
        let b = p.info.batch;
        let mut t = vec![0f32; b];
        let mut k = vec![0i64; b];
        let mut tp = vec![1f32; b];
        let mut s = vec![0i64; b];
        for (j, r) in rows.iter().enumerate() {
            r.check()?;
            t[j] = r.temperature;
            k[j] = r.top_k as i64;
            tp[j] = r.top_p;
            s[j] = r.seed as i64;
        }
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        p.temperature
            .write(&f32s(&t), 0)
            .map_err(|e| rt_err("temperature", e))?;
        p.top_p
            .write(&f32s(&tp), 0)
            .map_err(|e| rt_err("top_p", e))?;
        write_i64(&p.top_k, &k)?;
        write_i64(&p.seed, &s)
    }

    fn run(&mut self, i: usize) -> Result<Vec<Sampled>, Error> {
        self.count_switch(i);
        let p = &self.programs[i];
        self.rt
            .execute(&p.model, &p.inputs, &p.outputs)
            .map_err(|e| rt_err(&format!("executing {}", p.info.file), e))?;
        self.read_out(i)
    }

    fn count_switch(&mut self, i: usize) {
        if self.last_program.is_some_and(|p| p != i) {
            self.counters.switches += 1;
        }
        self.last_program = Some(i);
    }

    /// Each row's token (padding rows included) of program `i`'s last execution.
    fn read_out(&self, i: usize) -> Result<Vec<Sampled>, Error> {
        let p = &self.programs[i];
        let b = p.info.batch;
        if p.logits.is_some() {
            // The reference's runner: greedy on the host from the logits it returns.
            let v = self.manifest.config.vocab_size;
            return Ok(self
                .last_logits()?
                .chunks_exact(v.max(1))
                .map(|row| {
                    let (best, max) =
                        row.iter()
                            .enumerate()
                            .fold(
                                (0, f32::NEG_INFINITY),
                                |b, (i, &x)| if x > b.1 { (i, x) } else { b },
                            );
                    let z: f64 = row.iter().map(|&x| ((x - max) as f64).exp()).sum();
                    Sampled {
                        token: best as u32,
                        logprob: -(z.ln() as f32),
                    }
                })
                .collect());
        }
        let mut tok = vec![0u8; 8 * b];
        p.next
            .read(&mut tok, 0)
            .map_err(|e| rt_err("reading next_token", e))?;
        let mut lp = vec![0u8; 4 * b];
        p.logprob
            .read(&mut lp, 0)
            .map_err(|e| rt_err("reading logprob", e))?;
        Ok(tok
            .chunks_exact(8)
            .zip(lp.chunks_exact(4))
            .map(|(t, l)| Sampled {
                token: i64::from_le_bytes(t.try_into().expect("8 bytes")) as u32,
                logprob: f32::from_le_bytes(l.try_into().expect("4 bytes")),
            })
            .collect())
    }

    /// The logits of the last step of a runner from [`Runner::load_logits`]: `batch × vocab`
    /// f32 of the program that ran last (padding rows included).
    pub fn last_logits(&self) -> Result<Vec<f32>, Error> {
        let i = self
            .last_program
            .ok_or_else(|| Error::Unsupported("no step has run".into()))?;
        let t = self.programs[i].logits.as_ref().ok_or_else(|| {
            Error::Unsupported("this runner samples; load it with load_logits".into())
        })?;
        let mut b = vec![0u8; t.size() as usize];
        t.read(&mut b, 0).map_err(|e| rt_err("reading logits", e))?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }

    /// Prefills `tokens` into cache slot `slot` (positions 0..n); returns the next token,
    /// chosen on the device as `sampling` says. A prompt longer than the largest context
    /// bucket goes in chunks ([`Runner::prefill_chunk`]), each attending what the ones
    /// before it left in the cache.
    pub fn prefill(
        &mut self,
        slot: usize,
        tokens: &[u32],
        sampling: &Sampling,
    ) -> Result<Sampled, Error> {
        let mut done = 0;
        loop {
            let c = self.prefill_chunk(slot, tokens, done, sampling)?;
            if let Some(s) = c.next {
                return Ok(s);
            }
            done = c.done;
        }
    }

    /// Runs the next chunk of a prefill (the plan: [`Runner::prefill_chunks`]): the
    /// prompt's first `done` tokens are in slot `slot`'s cache already. Only the last
    /// chunk's token is returned.
    pub fn prefill_chunk(
        &mut self,
        slot: usize,
        tokens: &[u32],
        done: usize,
        sampling: &Sampling,
    ) -> Result<PrefillChunk, Error> {
        let n = tokens.len();
        if n == 0 {
            return Err(Error::Unsupported("an empty prompt".into()));
        }
        if n >= self.max_model_len() {
            return Err(Error::Unsupported(format!(
                "a prompt of {n} tokens: a prompt needs 1 to {} tokens (below the max model length {})",
                self.max_model_len() - 1,
                self.max_model_len()
            )));
        }
        if slot >= self.slots() {
            return Err(Error::Unsupported(format!(
                "slot {slot}: the cache has {} slots",
                self.slots()
            )));
        }
        if done >= n {
            return Err(Error::Unsupported(format!(
                "a prefill of {n} tokens has none left after {done}"
            )));
        }
        let Some((i, start, end)) = self.plan_chunk(n, done) else {
            return Err(Error::Unsupported("the model has no context bucket".into()));
        };
        let l = self.programs[i].info.seq;
        let p = &self.programs[i];
        let mut ids = vec![0i64; l];
        for (d, &t) in ids.iter_mut().zip(&tokens[start..end]) {
            *d = t as i64;
        }
        let pos: Vec<i64> = (start as i64..(start + l) as i64).collect();
        write_i64(&p.ids, &ids)?;
        write_i64(&p.positions, &pos)?;
        write_i64(&p.slots, &[slot as i64])?;
        write_i64(&p.last, &[(end - 1 - start) as i64])?;
        self.write_sampling(i, std::slice::from_ref(sampling))?;
        self.counters.prefills += 1;
        let s = self.run(i)?[0];
        Ok(PrefillChunk {
            done: end,
            bucket: l,
            next: (end == n).then_some(s),
        })
    }

    /// One decode step over `rows` (at most the largest batch bucket); returns each row's
    /// next token, chosen on the device. Padding rows write only the spare slot.
    pub fn decode(&mut self, rows: &[DecodeRow]) -> Result<Vec<Sampled>, Error> {
        let step = self.decode_begin(rows)?;
        self.decode_end(step)
    }

    /// Starts a decode step over `rows` on the explicit async surface and returns at once:
    /// the host may do its bookkeeping while the device runs; [`Runner::decode_end`] waits
    /// for the tokens. One step at a time: the program's input tensors are the step's.
    pub fn decode_begin(&mut self, rows: &[DecodeRow]) -> Result<DecodeStep, Error> {
        let i = self.write_decode(rows)?;
        self.count_switch(i);
        let p = &self.programs[i];
        let seq = self
            .rt
            .execute_schedule(&p.model, &p.inputs, &p.outputs)
            .map_err(|e| rt_err(&format!("scheduling {}", p.info.file), e))?;
        Ok(DecodeStep {
            program: i,
            seq,
            rows: rows.len(),
        })
    }

    /// Waits for a step from [`Runner::decode_begin`] and returns each row's token.
    pub fn decode_end(&mut self, step: DecodeStep) -> Result<Vec<Sampled>, Error> {
        let file = &self.programs[step.program].info.file;
        let status = self
            .rt
            .wait(step.seq)
            .map_err(|e| rt_err(&format!("waiting for {file}"), e))?;
        if status != nrt_runtime::NrtStatus::Success {
            return Err(rt_err(&format!("executing {file}"), status));
        }
        let mut out = self.read_out(step.program)?;
        out.truncate(step.rows);
        Ok(out)
    }

    /// Writes a decode step's inputs; returns its program.
    fn write_decode(&mut self, rows: &[DecodeRow]) -> Result<usize, Error> {
        let Some(i) = self.pick("decode", rows.len()) else {
            return Err(Error::Unsupported(format!(
                "{} rows: the largest batch bucket is {}",
                rows.len(),
                self.max_batch()
            )));
        };
        for r in rows {
            if r.slot >= self.slots() || r.position >= self.max_model_len() {
                return Err(Error::Unsupported(format!(
                    "row {r:?}: slots below {}, positions below {}",
                    self.slots(),
                    self.max_model_len()
                )));
            }
        }
        let p = &self.programs[i];
        let b = p.info.batch;
        let spare = self.manifest.cache.slots as i64 - 1;
        let mut ids = vec![0i64; b];
        let mut pos = vec![0i64; b];
        let mut slots = vec![spare; b];
        for (k, r) in rows.iter().enumerate() {
            ids[k] = r.token as i64;
            pos[k] = r.position as i64;
            slots[k] = r.slot as i64;
        }
        write_i64(&p.ids, &ids)?;
        write_i64(&p.positions, &pos)?;
        write_i64(&p.slots, &slots)?;
        write_i64(&p.last, &vec![0; b])?;
        let sampling: Vec<Sampling> = rows.iter().map(|r| r.sampling).collect();
        self.write_sampling(i, &sampling)?;
        self.counters.decodes += 1;
        Ok(i)
    }
}

/// A decode step scheduled on the device ([`Runner::decode_begin`]).
#[derive(Debug)]
#[must_use = "a scheduled step is finished with Runner::decode_end"]
pub struct DecodeStep {
    program: usize,
    seq: nrt_runtime::SeqId,
    rows: usize,
}

/// A program of the directory compiled with the logits head.
fn logits_program(m: &Manifest, p: &ProgramInfo) -> Result<Vec<u8>, Error> {
    let c = m.llama_config();
    let g = graph::decoder_graph(
        &c,
        &m.program_shape(p),
        Head::Logits,
        &WeightSource::Inputs(m.weights.blocks()),
    );
    let opts = graph::compile_options(&c, m.cores);
    let compiled = nrt_compiler::compile(&nrt_compiler::onnx::encode_model(&g), None, &opts)
        .map_err(|e| Error::Unsupported(format!("compiling the logits head of {}: {e}", p.file)))?;
    Ok(compiled.model.encode())
}

fn write_i64(t: &Tensor, v: &[i64]) -> Result<(), Error> {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    t.write(&b, 0).map_err(|e| rt_err(t.name(), e))
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("dir", &self.dir)
            .field("name", &self.manifest.name)
            .field("programs", &self.programs.len())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        for p in &self.programs {
            let _ = self.rt.unload(&p.model);
        }
    }
}
