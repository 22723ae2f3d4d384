//! The serving engine: many requests at once over one [`Runner`], continuously batched.
//!
//! One thread owns the runner and runs the scheduler loop (vLLM's v1 split: this module is
//! the scheduler and the KV-cache slot manager; [`crate::runner`] the model runner;
//! [`crate::generate`]'s sequence the output processor). Each iteration:
//!
//! 1. takes the new requests and cancellations from the submission channel;
//! 2. admits waiting requests into free cache slots, prefilling each (one execution of the
//!    smallest context bucket that holds it), up to [`EngineOptions::prefill_token_budget`]
//!    prompt tokens per iteration so a burst of long prompts does not starve the running
//!    sequences' decode (the first admission is always allowed); a prompt longer than the
//!    largest context bucket prefills in chunks of it (chunked prefill), one budget's worth
//!    per iteration, the running sequences' decode steps between its chunks;
//! 3. runs one decode step over every running sequence — the smallest batch bucket that
//!    holds them, padding rows masked — scheduled on the runtime's explicit async surface:
//!    while the device computes, the thread hands the previous step's text to the clients,
//!    updates the metrics and takes new requests;
//! 4. a finished sequence (EOS, a stop string, `max_tokens`, the max model length) or one
//!    whose client went away leaves at once; its slot takes the next waiting request.
//!
//! A sequence owns a whole cache slot (`max_model_len` positions) from its prefill to its
//! end, so a running sequence never runs out of cache: there is nothing to preempt, and a
//! request waits until a slot is free. The queue of waiting requests is bounded
//! ([`EngineOptions::max_queue`]); past it a submission is refused at once (the server's
//! 429). A failed execution (a device fault) ends the requests it carried with an error,
//! the core is reset (`nrt_reset_vnc`), and the engine goes on with the next ones.
//!
//! Clients hear their request through a [`Sink`]: text deltas (whole UTF-8 characters, never
//! a possible start of a stop string), then one final event. A sink that returns `false`
//! (its receiver is gone) cancels the request at the next step.

use crate::Error;
use crate::generate::{Delta, FinishReason, GenerateParams, Generation, Sequence, check_prompt};
use crate::runner::{DecodeRow, Runner, Sampled};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the engine schedules.
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// Sequences decoded at once (at most the largest batch bucket and the cache's slots).
    pub max_num_seqs: usize,
    /// Requests that may wait for a slot; past it a submission is refused.
    pub max_queue: usize,
    /// Prompt tokens prefilled per iteration before the running sequences' next decode step
    /// (at least one prompt, or one chunk of a long one, always goes); 0: the largest
    /// context bucket, so one chunk, or several short prompts, stall the running sequences
    /// for about one prefill execution.
    pub prefill_token_budget: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_num_seqs: usize::MAX,
            max_queue: 256,
            prefill_token_budget: 0,
        }
    }
}

/// What a request's client hears.
#[derive(Clone, Debug)]
pub enum Event {
    /// New text and the tokens chosen since the last event.
    Delta(Delta),
    /// The request ended: the whole generation (its text is everything the deltas carried).
    Finished(Generation),
    /// The request failed (a device fault during its execution): the error.
    Failed(String),
}

/// Where a request's events go; `send` returns `false` when nobody listens any more (the
/// request is then cancelled).
pub trait Sink: Send {
    /// Delivers an event.
    fn send(&mut self, e: Event) -> bool;
}

impl<F: FnMut(Event) -> bool + Send> Sink for F {
    fn send(&mut self, e: Event) -> bool {
        self(e)
    }
}

/// Why a submission was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    /// The request is invalid (prompt length, sampling parameters): the reason.
    Invalid(String),
    /// The waiting queue is full: retry later.
    QueueFull {
        /// Requests waiting.
        waiting: usize,
    },
    /// The engine is draining or stopped: it takes no new request.
    Draining,
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::Invalid(why) => write!(f, "{why}"),
            SubmitError::QueueFull { waiting } => {
                write!(f, "the server is busy: {waiting} requests are waiting")
            }
            SubmitError::Draining => write!(f, "the server is shutting down"),
        }
    }
}

/// Fixed-bucket histogram (Prometheus' cumulative form is made when it is rendered).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds, increasing (seconds).
    pub bounds: &'static [f64],
    /// Observations per bound (not cumulative); the last entry counts those above all.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// vLLM's bucket bounds for time to first token (seconds).
pub const TTFT_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
/// vLLM's bucket bounds for time per output token (seconds).
pub const TPOT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's bucket bounds for whole-request latency (seconds).
pub const E2E_BOUNDS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0,
];

/// What the engine has counted (the server's `/metrics`, with vLLM's names).
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    /// Sequences running now.
    pub running: usize,
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Cache slots in use and in all.
    pub slots_used: usize,
    /// Cache slots sequences may use.
    pub slots_total: usize,
    /// Prompt tokens prefilled.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Requests finished, by reason: stop, length, abort.
    pub finished: [u64; 3],
    /// Requests that failed (an execution error).
    pub failed: u64,
    /// Submissions refused because the queue was full.
    pub rejected: u64,
    /// Core resets after a failed execution.
    pub resets: u64,
    /// Prefill and decode executions.
    pub prefills: u64,
    /// Decode steps.
    pub decodes: u64,
    /// Time to first token.
    pub ttft: Histogram,
    /// Time between two tokens of a sequence (inter-token latency).
    pub itl: Histogram,
    /// Mean time per output token of a request (after the first).
    pub tpot: Histogram,
    /// Whole-request latency, submission to end.
    pub e2e: Histogram,
}

impl Metrics {
    fn new(slots_total: usize) -> Metrics {
        Metrics {
            running: 0,
            waiting: 0,
            slots_used: 0,
            slots_total,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: [0; 3],
            failed: 0,
            rejected: 0,
            resets: 0,
            prefills: 0,
            decodes: 0,
            ttft: Histogram::new(TTFT_BOUNDS),
            itl: Histogram::new(TPOT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
            e2e: Histogram::new(E2E_BOUNDS),
        }
    }

    /// The finished counters with their reason's name.
    pub fn finished_by_reason(&self) -> [(&'static str, u64); 3] {
        [
            ("stop", self.finished[0]),
            ("length", self.finished[1]),
            ("abort", self.finished[2]),
        ]
    }
}

/// What the engine knows of its model, fixed at start.
#[derive(Clone, Debug)]
pub struct ModelLimits {
    /// The longest sequence (prompt and output).
    pub max_model_len: usize,
    /// The longest prompt (one below the max model length; past the largest context bucket
    /// it prefills in chunks).
    pub max_prompt: usize,
    /// Sequences decoded at once.
    pub width: usize,
}

/// A submitted request: its prompt's tokens, how to generate, and where its events go.
pub struct Request {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// How to generate.
    pub params: GenerateParams,
    /// Where its events go.
    pub sink: Box<dyn Sink>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt", &self.prompt.len())
            .field("params", &self.params)
            .finish()
    }
}

enum Command {
    Submit(u64, Request, Instant),
    Cancel(u64),
    Stop,
}

struct Shared {
    metrics: Mutex<Metrics>,
    waiting: AtomicU64,
    in_flight: AtomicU64,
    draining: AtomicBool,
}

/// The engine: a thread that owns the runner. Dropping it stops the thread (what runs is
/// cancelled).
pub struct Engine {
    tx: Mutex<Sender<Command>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    limits: ModelLimits,
    opts: EngineOptions,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("limits", &self.limits)
            .field("opts", &self.opts)
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl Engine {
    /// Starts the engine on `runner`.
    pub fn start(runner: Runner, opts: EngineOptions) -> Result<Engine, Error> {
        let width = opts
            .max_num_seqs
            .min(runner.max_batch())
            .min(runner.slots());
        if width == 0 {
            return Err(Error::Unsupported(
                "the engine needs at least one sequence (--max-num-seqs and the model's slots)"
                    .into(),
            ));
        }
        let mut opts = opts;
        if opts.prefill_token_budget == 0 {
            opts.prefill_token_budget = runner.chunk_len().max(1);
        }
        let limits = ModelLimits {
            max_model_len: runner.max_model_len(),
            max_prompt: runner.max_prompt(),
            width,
        };
        let shared = Arc::new(Shared {
            metrics: Mutex::new(Metrics::new(width)),
            waiting: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            draining: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nrt-llm-engine".into())
            .spawn(move || Scheduler::new(runner, width, opts, sh).run(rx))
            .map_err(|e| Error::Unsupported(format!("cannot start the engine's thread: {e}")))?;
        Ok(Engine {
            tx: Mutex::new(tx),
            shared,
            next_id: AtomicU64::new(1),
            limits,
            opts,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The model's limits.
    pub fn limits(&self) -> &ModelLimits {
        &self.limits
    }

    /// Submits a request: checked at once (a bad prompt or parameter, a full queue and
    /// draining are refused here, nothing queued); returns its id.
    pub fn submit(&self, r: Request) -> Result<u64, SubmitError> {
        if self.shared.draining.load(Ordering::Acquire) {
            return Err(SubmitError::Draining);
        }
        check_request(&self.limits, &r.prompt, &r.params).map_err(SubmitError::Invalid)?;
        let waiting = self.shared.waiting.fetch_add(1, Ordering::AcqRel);
        if waiting >= self.opts.max_queue as u64 {
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            self.lock_metrics().rejected += 1;
            return Err(SubmitError::QueueFull {
                waiting: waiting as usize,
            });
        }
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let sent = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Submit(id, r, Instant::now()));
        if sent.is_err() {
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Draining);
        }
        Ok(id)
    }

    /// Cancels request `id` (it ends with `abort` at the next step; nothing if it ended).
    pub fn cancel(&self, id: u64) {
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Cancel(id));
    }

    /// Stops taking requests ([`SubmitError::Draining`]); what was submitted goes on.
    pub fn drain(&self) {
        self.shared.draining.store(true, Ordering::Release);
    }

    /// Whether it is draining.
    pub fn is_draining(&self) -> bool {
        self.shared.draining.load(Ordering::Acquire)
    }

    /// Requests submitted and not yet ended.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Drains, waits up to `grace` for what was submitted to end, then stops the thread
    /// (cancelling what is left). Returns how many requests were cancelled.
    pub fn shutdown(&self, grace: Duration) -> u64 {
        self.drain();
        let deadline = Instant::now() + grace;
        while self.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let left = self.in_flight();
        let _ = self
            .tx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(Command::Stop);
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
        left
    }

    /// A snapshot of the metrics.
    pub fn metrics(&self) -> Metrics {
        self.lock_metrics().clone()
    }

    fn lock_metrics(&self) -> std::sync::MutexGuard<'_, Metrics> {
        self.shared
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown(Duration::ZERO);
    }
}

/// The checks of a request that need no device: prompt length and sampling values.
pub fn check_request(l: &ModelLimits, prompt: &[u32], p: &GenerateParams) -> Result<(), String> {
    check_prompt(l.max_model_len, 0, prompt).map_err(|e| e.to_string())?;
    p.sampling.check().map_err(|e| e.to_string())?;
    if p.max_tokens == 0 {
        return Err("max_tokens 0: ask for at least one token".into());
    }
    Ok(())
}

/// A request in the engine.
struct Job {
    id: u64,
    prompt: Vec<u32>,
    params: GenerateParams,
    sink: Box<dyn Sink>,
    submitted: Instant,
    cancelled: bool,
}

struct Running<'t> {
    job: Job,
    seq: Sequence<'t>,
    /// When it left the queue (its prefill began).
    admitted: Instant,
}

/// A prompt longer than the largest context bucket between two of its chunks.
struct Partial<'t> {
    run: Running<'t>,
    /// Its tokens in the cache.
    done: usize,
}

/// The engine thread's state.
struct Scheduler {
    runner: Runner,
    width: usize,
    opts: EngineOptions,
    shared: Arc<Shared>,
    tokenizer: Arc<crate::Tokenizer>,
}

impl Scheduler {
    fn new(runner: Runner, width: usize, opts: EngineOptions, shared: Arc<Shared>) -> Scheduler {
        let tokenizer = runner.tokenizer.clone();
        Scheduler {
            runner,
            width,
            opts,
            shared,
            tokenizer,
        }
    }

    fn run(mut self, rx: Receiver<Command>) {
        let tokenizer = self.tokenizer.clone();
        let (eos, max_len) = (self.runner.manifest.eos, self.runner.max_model_len());
        let mut free: Vec<usize> = (0..self.width).rev().collect();
        let mut waiting: VecDeque<Job> = VecDeque::new();
        let mut running: Vec<Running<'_>> = Vec::with_capacity(self.width);
        // A prompt longer than the largest context bucket, part-way through its prefill.
        let mut partial: Option<Partial<'_>> = None;
        let mut stop = false;
        while !stop {
            // 1. Commands: block only when there is nothing to do.
            let idle = running.is_empty() && waiting.is_empty() && partial.is_none();
            let first = if idle {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                None
            };
            stop |= self.take_commands(first, &rx, &mut waiting, &mut running, &mut partial);
            if stop {
                break;
            }
            // 2. Prefills: the prompt in chunks first, then admissions, within the budget.
            let mut budget = self.opts.prefill_token_budget;
            let mut admitted = 0;
            loop {
                let mut p = match partial.take() {
                    Some(p) => p,
                    None => {
                        if running.len() >= self.width {
                            break;
                        }
                        let Some(front) = waiting.front() else { break };
                        if admitted > 0 && front.prompt.len() > budget {
                            break;
                        }
                        let job = waiting.pop_front().expect("front exists");
                        self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
                        admitted += 1;
                        let slot = free.pop().expect("a free slot below the width");
                        self.count(|m| {
                            m.prefills += 1;
                            m.prompt_tokens += job.prompt.len() as u64;
                        });
                        let seq = Sequence::new(&tokenizer, &job.prompt, &job.params, slot);
                        Partial {
                            run: Running {
                                job,
                                seq,
                                admitted: Instant::now(),
                            },
                            done: 0,
                        }
                    }
                };
                let slot = p.run.seq.slot();
                if p.run.job.cancelled {
                    free.push(slot);
                    self.finish(p.run, false);
                    continue;
                }
                let r = self.runner.prefill_chunk(
                    slot,
                    &p.run.job.prompt,
                    p.done,
                    &p.run.job.params.sampling,
                );
                let c = match r {
                    Ok(c) => c,
                    Err(e) => {
                        free.push(slot);
                        self.fail(p.run.job, &e.to_string());
                        self.recover();
                        continue;
                    }
                };
                budget = budget.saturating_sub(c.done - p.done);
                let Some(s) = c.next else {
                    // More chunks: the running sequences decode between them.
                    p.done = c.done;
                    partial = Some(p);
                    if budget == 0 && !running.is_empty() {
                        break;
                    }
                    continue;
                };
                let mut run = p.run;
                match run.seq.accept(s, eos, max_len) {
                    Err(e) => {
                        free.push(slot);
                        self.fail(run.job, &e.to_string());
                    }
                    Ok(done) => {
                        let ok = self.deliver(&mut run);
                        if done || !ok {
                            free.push(slot);
                            self.finish(run, ok);
                        } else {
                            running.push(run);
                        }
                    }
                }
                self.gauges(&waiting, &running, &partial);
            }
            if running.is_empty() {
                continue;
            }
            // 3. One decode step, the bookkeeping overlapping it.
            let rows: Vec<DecodeRow> = running.iter().map(|r| r.seq.row()).collect();
            let step = self.runner.decode_begin(&rows);
            let before = Instant::now();
            stop |= self.take_commands(None, &rx, &mut waiting, &mut running, &mut partial);
            self.gauges(&waiting, &running, &partial);
            let out: Result<Vec<Sampled>, Error> = step.and_then(|s| self.runner.decode_end(s));
            self.count(|m| m.decodes += 1);
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    let why = e.to_string();
                    for r in running.drain(..) {
                        free.push(r.seq.slot());
                        self.fail(r.job, &why);
                    }
                    self.recover();
                    self.gauges(&waiting, &running, &partial);
                    continue;
                }
            };
            // 4. The tokens: deliver, let the finished leave.
            let mut k = 0;
            let mut itl = Vec::with_capacity(out.len());
            for s in out {
                let r = &mut running[k];
                let prev = r.seq.last_token_at().unwrap_or(before);
                let done = match r.seq.accept(s, eos, max_len) {
                    Ok(d) => d,
                    Err(e) => {
                        let r = running.remove(k);
                        free.push(r.seq.slot());
                        self.fail(r.job, &e.to_string());
                        continue;
                    }
                };
                itl.push(r.seq.last_token_at().unwrap_or(before) - prev);
                let ok = !r.job.cancelled && self.deliver(r);
                if done || !ok {
                    let r = running.remove(k);
                    free.push(r.seq.slot());
                    self.finish(r, ok);
                } else {
                    k += 1;
                }
            }
            self.count(|m| {
                for d in &itl {
                    m.itl.observe(d.as_secs_f64());
                }
            });
            self.gauges(&waiting, &running, &partial);
        }
        // Stopped: what is left is cancelled.
        for r in running.drain(..).chain(partial.take().map(|p| p.run)) {
            self.end(r.job, None);
        }
        for j in waiting.drain(..) {
            self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
            self.end(j, None);
        }
        self.gauges(&waiting, &running, &partial);
    }

    /// Takes every queued command (and `first`); whether the engine is told to stop.
    fn take_commands<'t>(
        &mut self,
        first: Option<Command>,
        rx: &Receiver<Command>,
        waiting: &mut VecDeque<Job>,
        running: &mut [Running<'t>],
        partial: &mut Option<Partial<'t>>,
    ) -> bool {
        let mut next = first;
        loop {
            let c = match next.take() {
                Some(c) => c,
                None => match rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => return false,
                    Err(TryRecvError::Disconnected) => return true,
                },
            };
            match c {
                Command::Submit(id, r, at) => waiting.push_back(Job {
                    id,
                    prompt: r.prompt,
                    params: r.params,
                    sink: r.sink,
                    submitted: at,
                    cancelled: false,
                }),
                Command::Cancel(id) => {
                    // Waiting: ended at once (its place in the queue is free again).
                    if let Some(k) = waiting.iter().position(|j| j.id == id) {
                        let j = waiting.remove(k).expect("a position found");
                        self.shared.waiting.fetch_sub(1, Ordering::AcqRel);
                        self.end(j, None);
                    }
                    let prefilling = partial.as_mut().map(|p| &mut p.run);
                    for r in running
                        .iter_mut()
                        .chain(prefilling)
                        .filter(|r| r.job.id == id)
                    {
                        r.job.cancelled = true;
                    }
                }
                Command::Stop => return true,
            }
        }
    }

    /// Hands a running sequence's new text to its client; whether the client still listens.
    fn deliver(&self, r: &mut Running<'_>) -> bool {
        let d = r.seq.take_delta();
        if d.text.is_empty() && d.token_ids.is_empty() {
            return true;
        }
        r.job.sink.send(Event::Delta(d))
    }

    /// A sequence ended (finished, or its client left).
    fn finish(&self, mut r: Running<'_>, client_listens: bool) {
        if !client_listens || r.job.cancelled {
            r.seq.abort();
        }
        let mut g = r.seq.done();
        // Clients see the time to their first token from their submission, the queue
        // included.
        g.ttft_ms += (r.admitted - r.job.submitted).as_secs_f64() * 1e3;
        self.end(r.job, Some(g));
    }

    /// Ends a job: the final event and the counters.
    fn end(&self, mut job: Job, g: Option<Generation>) {
        let g = g.unwrap_or_else(|| Generation::aborted(std::mem::take(&mut job.prompt)));
        let e2e = job.submitted.elapsed().as_secs_f64();
        self.count(|m| {
            if !g.token_ids.is_empty() {
                m.ttft.observe(g.ttft_ms / 1e3);
            }
            if g.token_ids.len() > 1 {
                m.tpot.observe(g.tpot_ms / 1e3);
            }
            m.generation_tokens += g.token_ids.len() as u64;
            m.e2e.observe(e2e);
            let i = match g.finish_reason {
                FinishReason::Stop => 0,
                FinishReason::Length => 1,
                FinishReason::Abort => 2,
            };
            m.finished[i] += 1;
        });
        // Counted out before the client hears it: whoever reads the counters after the
        // last event sees this request ended.
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = job.sink.send(Event::Finished(g));
    }

    /// After a failed execution: resets the core (a fatal fault leaves it refusing work
    /// until then), so the requests after it run.
    fn recover(&mut self) {
        if let Err(e) = self.runner.reset() {
            eprintln!("nrt-llm engine: {e}");
        }
        self.count(|m| m.resets += 1);
    }

    /// A job failed in an execution.
    fn fail(&self, mut job: Job, why: &str) {
        self.count(|m| m.failed += 1);
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = job.sink.send(Event::Failed(why.to_string()));
    }

    fn gauges(
        &self,
        waiting: &VecDeque<Job>,
        running: &[Running<'_>],
        partial: &Option<Partial<'_>>,
    ) {
        // A prompt part-way through its chunks runs (vLLM counts it so) and holds a slot.
        let n = running.len() + usize::from(partial.is_some());
        self.count(|m| {
            m.running = n;
            m.waiting = self.shared.waiting.load(Ordering::Acquire) as usize;
            debug_assert!(waiting.len() <= m.waiting);
            m.slots_used = n;
        });
    }

    fn count(&self, f: impl FnOnce(&mut Metrics)) {
        f(&mut self
            .shared
            .metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner()));
    }
}
