//! `nrt.llm`'s engine: a decoder-LLM model directory (crate `nrt-llm`) loaded on the
//! process's runtime, generating on the device. The Python layer (`nrt/llm.py`) gives it
//! vLLM's names (`LLM`, `SamplingParams`, `RequestOutput`).

use crate::error::invalid;
use crate::lock;
use crate::runtime::global;
use nrt_llm::build::{BuildOptions, WeightFormat};
use nrt_llm::generate::{GenerateParams, generate, generate_batch};
use nrt_llm::runner::{Runner, Sampling};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Mutex;

fn llm_err(e: nrt_llm::Error) -> PyErr {
    invalid(e.to_string())
}

/// `template` applied to `(role, content)` pairs, the assistant's turn opened.
pub(crate) fn render_chat(
    template: Option<&nrt_llm::ChatTemplate>,
    messages: Vec<(String, String)>,
) -> PyResult<String> {
    let t = template.ok_or_else(|| invalid("the model has no chat template"))?;
    let m: Vec<nrt_llm::ChatMessage> = messages
        .into_iter()
        .map(|(role, content)| nrt_llm::ChatMessage::new(role, content))
        .collect();
    t.render(&m, true).map_err(llm_err)
}

/// A model directory (or a GGUF built into `cache`) loaded on logical core `core`.
#[pyclass(name = "_LlmEngine", module = "nrt._nrt")]
pub(crate) struct LlmEngine {
    runner: Mutex<Runner>,
    /// The directory loaded.
    #[pyo3(get)]
    path: PathBuf,
}

impl std::fmt::Debug for LlmEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmEngine")
            .field("path", &self.path)
            .finish()
    }
}

#[pymethods]
impl LlmEngine {
    #[new]
    #[pyo3(signature = (path, cache, core=0, context_buckets=None, batch_buckets=None, max_model_len=None, weights="f32", tp=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        cache: PathBuf,
        core: i32,
        context_buckets: Option<Vec<usize>>,
        batch_buckets: Option<Vec<usize>>,
        max_model_len: Option<usize>,
        weights: &str,
        tp: u32,
    ) -> PyResult<LlmEngine> {
        let g = global(py)?;
        let opts = BuildOptions {
            context_buckets,
            batch_buckets,
            max_model_len,
            weights: WeightFormat::parse(weights).map_err(invalid)?,
            cores: tp,
        };
        let is_file = path.is_file();
        let runner = py.allow_threads(|| -> Result<(PathBuf, Runner), nrt_llm::Error> {
            let dir = if is_file {
                nrt_llm::build::cached_build(&path, &cache, &opts, &mut |_| {})?
            } else {
                path.clone()
            };
            let r = Runner::load(&g.rt, &dir, core)?;
            Ok((dir, r))
        });
        let (dir, runner) = runner.map_err(llm_err)?;
        Ok(LlmEngine {
            runner: Mutex::new(runner),
            path: dir,
        })
    }

    /// The model's manifest (JSON text).
    fn manifest(&self) -> PyResult<String> {
        serde_json::to_string(&lock(&self.runner).manifest).map_err(|e| invalid(e.to_string()))
    }

    /// Token ids of `text`.
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        lock(&self.runner).tokenizer.encode(text).map_err(llm_err)
    }

    /// The text of `ids`.
    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        lock(&self.runner).tokenizer.decode(&ids).map_err(llm_err)
    }

    /// The chat template applied to `messages` (`(role, content)` pairs), the assistant's
    /// turn opened.
    fn apply_chat_template(&self, messages: Vec<(String, String)>) -> PyResult<String> {
        render_chat(lock(&self.runner).template.as_ref(), messages)
    }

    /// Generates for every request together (continuous batching on the device's decode
    /// buckets): each request is `(prompt_ids, max_tokens, temperature, top_p, top_k, seed,
    /// stop)`. Returns `(token_ids, text, finish_reason, logprobs)` per request.
    #[allow(clippy::type_complexity)]
    fn generate_batch(
        &self,
        py: Python<'_>,
        requests: Vec<(Vec<u32>, usize, f32, f32, u32, u64, Vec<String>)>,
    ) -> PyResult<Vec<(Vec<u32>, String, String, Vec<f32>)>> {
        let reqs: Vec<(Vec<u32>, GenerateParams)> = requests
            .into_iter()
            .map(|(ids, max_tokens, temperature, top_p, top_k, seed, stop)| {
                (
                    ids,
                    GenerateParams {
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
                )
            })
            .collect();
        let out = py
            .allow_threads(|| {
                let mut r = lock(&self.runner);
                generate_batch(&mut r, &reqs, &mut |_, _| {})
            })
            .map_err(llm_err)?;
        Ok(out
            .into_iter()
            .map(|g| {
                (
                    g.token_ids,
                    g.text,
                    g.finish_reason.as_str().to_owned(),
                    g.logprobs,
                )
            })
            .collect())
    }

    /// Generates from `prompt_ids`; `on_text(piece)` (if given) hears each piece of text.
    /// Returns `(token_ids, text, finish_reason, logprobs)`.
    #[pyo3(signature = (prompt_ids, max_tokens, temperature, top_p, top_k, seed, stop, on_text=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        prompt_ids: Vec<u32>,
        max_tokens: usize,
        temperature: f32,
        top_p: f32,
        top_k: u32,
        seed: u64,
        stop: Vec<String>,
        on_text: Option<PyObject>,
    ) -> PyResult<(Vec<u32>, String, String, Vec<f32>)> {
        let p = GenerateParams {
            max_tokens,
            stop,
            sampling: Sampling {
                temperature,
                top_k,
                top_p,
                seed,
            },
            ignore_eos: false,
        };
        p.sampling.check().map_err(llm_err)?;
        let mut failed: Option<PyErr> = None;
        let g = py.allow_threads(|| {
            let mut r = lock(&self.runner);
            generate(&mut r, 0, &prompt_ids, &p, &mut |piece| {
                if let Some(cb) = &on_text
                    && failed.is_none()
                    && !piece.is_empty()
                {
                    Python::with_gil(|py| {
                        if let Err(e) = cb.call1(py, (piece,)) {
                            failed = Some(e);
                        }
                    });
                }
            })
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let g = g.map_err(llm_err)?;
        Ok((
            g.token_ids,
            g.text,
            g.finish_reason.as_str().to_owned(),
            g.logprobs,
        ))
    }
}
