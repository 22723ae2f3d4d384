//! `nrt.llm.AsyncLLMEngine`'s core: the serving engine of `nrt-llm` (continuous batching on
//! its own thread) with requests submitted from Python and their events read back one at a
//! time, the GIL released while waiting.

use crate::error::invalid;
use crate::lock;
use crate::runtime::global;
use nrt_llm::build::BuildOptions;
use nrt_llm::engine::{Engine, EngineOptions, Event, Request};
use nrt_llm::generate::GenerateParams;
use nrt_llm::runner::{Runner, Sampling};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

/// The engine over a model directory (or a GGUF built into `cache` with default options).
#[pyclass(name = "_LlmServing", module = "nrt._nrt")]
pub(crate) struct LlmServing {
    engine: Engine,
    tokenizer: std::sync::Arc<nrt_llm::Tokenizer>,
    template: Option<nrt_llm::ChatTemplate>,
    /// The directory loaded.
    #[pyo3(get)]
    path: PathBuf,
}

impl std::fmt::Debug for LlmServing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmServing")
            .field("path", &self.path)
            .finish()
    }
}

/// One submitted request: its events, in order.
#[pyclass(name = "_LlmRequest", module = "nrt._nrt")]
pub(crate) struct LlmRequest {
    /// The engine's id (for `abort`).
    #[pyo3(get)]
    id: u64,
    rx: Mutex<mpsc::Receiver<Event>>,
}

#[pymethods]
impl LlmServing {
    #[new]
    #[pyo3(signature = (path, cache, core=0, max_num_seqs=None, max_queue=256))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        cache: PathBuf,
        core: i32,
        max_num_seqs: Option<usize>,
        max_queue: usize,
    ) -> PyResult<LlmServing> {
        let g = global(py)?;
        let is_file = path.is_file();
        type Loaded = (
            PathBuf,
            Engine,
            std::sync::Arc<nrt_llm::Tokenizer>,
            Option<nrt_llm::ChatTemplate>,
        );
        let (dir, engine, tokenizer, template) = py
            .allow_threads(|| -> Result<Loaded, nrt_llm::Error> {
                let dir = if is_file {
                    let o = BuildOptions::default();
                    nrt_llm::build::cached_build(&path, &cache, &o, &mut |_| {})?
                } else {
                    path.clone()
                };
                let mut r = Runner::load(&g.rt, &dir, core)?;
                let (tokenizer, template) = (r.tokenizer.clone(), r.template.take());
                let opts = EngineOptions {
                    max_num_seqs: max_num_seqs.unwrap_or(usize::MAX),
                    max_queue,
                    ..Default::default()
                };
                Ok((dir, Engine::start(r, opts)?, tokenizer, template))
            })
            .map_err(|e| invalid(e.to_string()))?;
        Ok(LlmServing {
            engine,
            tokenizer,
            template,
            path: dir,
        })
    }

    /// Submits `(prompt_ids, max_tokens, temperature, top_p, top_k, seed, stop)`; a bad
    /// request, a full queue or a stopped engine raise at once.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        prompt_ids: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: u32,
        seed: u64,
        stop: Vec<String>,
    ) -> PyResult<LlmRequest> {
        let (tx, rx) = mpsc::channel();
        let r = Request {
            prompt: prompt_ids,
            params: GenerateParams {
                max_tokens,
                stop,
                sampling: Sampling {
                    temperature,
                    top_k,
                    top_p,
                    seed,
                },
                ignore_eos: false,
            },
            sink: Box::new(move |e| tx.send(e).is_ok()),
        };
        let id = self.engine.submit(r).map_err(|e| invalid(e.to_string()))?;
        Ok(LlmRequest {
            id,
            rx: Mutex::new(rx),
        })
    }

    /// Token ids of `text`.
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.tokenizer
            .encode(text)
            .map_err(|e| invalid(e.to_string()))
    }

    /// The text of `ids`.
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        self.tokenizer
            .decode(&ids)
            .map_err(|e| invalid(e.to_string()))
    }

    /// The chat template applied to `(role, content)` pairs, the assistant's turn opened.
    fn apply_chat_template(&self, messages: Vec<(String, String)>) -> PyResult<String> {
        crate::llm::render_chat(self.template.as_ref(), messages)
    }

    /// Cancels request `id` (its stream ends with `abort`).
    fn abort(&self, id: u64) {
        self.engine.cancel(id);
    }

    /// Requests submitted and not yet ended.
    fn in_flight(&self) -> u64 {
        self.engine.in_flight()
    }

    /// Stops taking requests, lets those in flight finish within `grace_s` seconds, cancels
    /// the rest; returns how many were cancelled.
    fn shutdown(&self, py: Python<'_>, grace_s: f64) -> u64 {
        let grace = Duration::from_secs_f64(grace_s.clamp(0.0, 3600.0));
        py.allow_threads(|| self.engine.shutdown(grace))
    }
}

/// An event as Python reads it.
type PyEvent = (String, String, Vec<u32>, Vec<f32>, Option<String>);

#[pymethods]
impl LlmRequest {
    /// The next event, waiting up to `timeout_s` (`None` if none came): `("delta", text,
    /// token_ids, logprobs, None)`, `("finished", whole_text, all_token_ids, all_logprobs,
    /// finish_reason)` or `("failed", message, [], [], None)`; after the last, `("closed",
    /// ...)`.
    fn next(&self, py: Python<'_>, timeout_s: f64) -> Option<PyEvent> {
        let t = Duration::from_secs_f64(timeout_s.clamp(0.0, 3600.0));
        let got = py.allow_threads(|| lock(&self.rx).recv_timeout(t));
        match got {
            Ok(Event::Delta(d)) => Some(("delta".into(), d.text, d.token_ids, d.logprobs, None)),
            Ok(Event::Finished(g)) => Some((
                "finished".into(),
                g.text,
                g.token_ids,
                g.logprobs,
                Some(g.finish_reason.as_str().to_owned()),
            )),
            Ok(Event::Failed(why)) => Some(("failed".into(), why, vec![], vec![], None)),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Some(("closed".into(), String::new(), vec![], vec![], None))
            }
        }
    }
}
