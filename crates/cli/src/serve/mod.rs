//! `nrt llm serve`: an OpenAI-compatible server over the serving engine of `nrt-llm`.
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both streaming as
//! server-sent events ending in `data: [DONE]` with `"stream": true`), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (Prometheus text, vLLM's metric names). Errors in OpenAI's
//! format: 400 for bad JSON, parameters or a prompt the model cannot take, 404 for another
//! model, 413 for a body over [`MAX_BODY`], 429 with `Retry-After` when the queue is full,
//! 503 while draining.
//!
//! The HTTP side only reads requests and writes what the engine hands it: each request's
//! events come through an unbounded channel (bounded in practice by `max_tokens`) that the
//! engine's sink feeds; a client that goes away drops the receiving end, and the engine
//! cancels the request at its next step. On SIGTERM or Ctrl-C the server drains: new
//! requests get 503, what runs may finish within `--drain-timeout`, the rest is cancelled
//! (a stream ends with `finish_reason: "abort"`), and the process exits 0.

mod metrics;
pub mod openai;

use crate::session::{self, Res};
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use clap::Args;
use nrt_llm::engine::{Engine, EngineOptions, Event, Request, SubmitError};
use nrt_llm::runner::Runner;
use nrt_llm::{ChatTemplate, Tokenizer};
use openai::{ApiError, Header, ModelView, Route};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The largest request body: a prompt of the longest model's context is far below it.
pub const MAX_BODY: usize = 1 << 20;
/// Time to receive a request's body (a client trickling it is dropped).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// `nrt llm serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The model directory (`nrt llm build -o DIR`).
    pub dir: PathBuf,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port (0: any free one; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Sequences decoded at once (default: the largest batch bucket).
    #[arg(long = "max-num-seqs")]
    pub max_num_seqs: Option<usize>,
    /// Requests that may wait for a cache slot; past it the server answers 429.
    #[arg(long = "max-queue", default_value_t = 256)]
    pub max_queue: usize,
    /// The model's name in the API (default: DIR as given, like vLLM's model path).
    #[arg(long = "served-model-name")]
    pub served_model_name: Option<String>,
    /// Seconds a draining server lets running requests finish before it cancels them.
    #[arg(long = "drain-timeout", default_value_t = 30)]
    pub drain_timeout: u64,
}

/// The server's state, shared by its handlers.
struct App {
    engine: Engine,
    name: String,
    created: u64,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    max_model_len: usize,
    vocab_size: usize,
    ids: AtomicU64,
}

impl App {
    fn view(&self) -> ModelView<'_> {
        ModelView {
            name: &self.name,
            tokenizer: &self.tokenizer,
            template: self.template.as_ref(),
            max_model_len: self.max_model_len,
            vocab_size: self.vocab_size,
        }
    }

    /// A fresh number: request ids, seeds of requests that give none.
    fn next(&self) -> u64 {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        // SplitMix64 of the counter and the start time: distinct, unpredictable enough
        // for ids and default seeds (not a secret).
        let mut z = n
            .wrapping_add(self.created.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs `nrt llm serve` until SIGTERM or Ctrl-C.
pub fn serve(a: &ServeArgs) -> Res<()> {
    let (_dev, rt) = session::runtime_for_llm(&a.dir)?;
    let mut runner = Runner::load(&rt, &a.dir, 0).map_err(|e| e.to_string())?;
    let template = runner.template.take();
    let tokenizer = runner.tokenizer.clone();
    let max_model_len = runner.max_model_len();
    let vocab_size = runner.manifest.config.vocab_size;
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        let d = a.dir.to_string_lossy();
        let t = d.trim_end_matches('/');
        if t.is_empty() {
            d.into_owned()
        } else {
            t.to_string()
        }
    });
    let opts = EngineOptions {
        max_num_seqs: a.max_num_seqs.unwrap_or(usize::MAX),
        max_queue: a.max_queue,
        ..Default::default()
    };
    if a.max_num_seqs == Some(0) {
        return Err("--max-num-seqs 0: at least one sequence".into());
    }
    let engine = Engine::start(runner, opts).map_err(|e| e.to_string())?;
    let width = engine.limits().width;
    let app = Arc::new(App {
        engine,
        name,
        created: now_secs(),
        tokenizer,
        template,
        max_model_len,
        vocab_size,
        ids: AtomicU64::new(1),
    });
    let addr = format!("{}:{}", a.host, a.port);
    let server = crate::http::spawn(&addr, router(app.clone()), crate::http::Limits::LLM)?;
    eprintln!(
        "nrt llm serve: {} on http://{} ({} sequences at once, max model length {}, queue {}); \
         Ctrl-C or SIGTERM drains and stops",
        app.name, server.addr, width, max_model_len, a.max_queue
    );
    wait_for_signal()?;
    let grace = Duration::from_secs(a.drain_timeout);
    eprintln!(
        "nrt llm serve: draining ({} requests in flight, up to {} s)",
        app.engine.in_flight(),
        grace.as_secs()
    );
    let cancelled = app.engine.shutdown(grace);
    // The cancelled requests' last events reach their connections.
    std::thread::sleep(Duration::from_millis(200));
    eprintln!("nrt llm serve: stopped ({cancelled} requests cancelled)");
    Ok(())
}

/// Blocks until SIGTERM or SIGINT.
fn wait_for_signal() -> Res<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the signal handler: {e}"))?;
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| format!("cannot listen for SIGTERM: {e}"))?;
        let mut int = signal(SignalKind::interrupt())
            .map_err(|e| format!("cannot listen for SIGINT: {e}"))?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    })
}

fn router(app: Arc<App>) -> axum::Router {
    use axum::routing::{get, post};
    axum::Router::new()
        .route(
            "/v1/completions",
            post(|s: State<Arc<App>>, b: Body| generate(s, Route::Completions, b)),
        )
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<App>>, b: Body| generate(s, Route::Chat, b)),
        )
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(|| async {
            error(&ApiError::new(
                404,
                "NotFoundError",
                "no such route: the server has POST /v1/completions, POST /v1/chat/completions, \
                 GET /v1/models, /health and /metrics",
            ))
        })
        .with_state(app)
}

fn error(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(e.body())).into_response();
    if e.status == 429 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.name,
            "object": "model",
            "created": app.created,
            "owned_by": "nrt-rs",
            "max_model_len": app.max_model_len,
        }],
    }))
    .into_response()
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.engine.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response()
    } else {
        (StatusCode::OK, "").into_response()
    }
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        metrics::render(&app.name, &app.engine.metrics()),
    )
        .into_response()
}

/// Reads the body: at most [`MAX_BODY`] bytes within [`BODY_TIMEOUT`].
async fn read_body(b: Body) -> Result<axum::body::Bytes, ApiError> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(b, MAX_BODY)).await {
        Err(_) => Err(ApiError::new(
            408,
            "invalid_request_error",
            format!(
                "the body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ),
        )),
        Ok(Err(_)) => Err(ApiError::new(
            413,
            "invalid_request_error",
            format!("the body is larger than {MAX_BODY} bytes (or was cut short)"),
        )),
        Ok(Ok(b)) => Ok(b),
    }
}

async fn generate(State(app): State<Arc<App>>, route: Route, b: Body) -> Response {
    if app.engine.is_draining() {
        return error(&ApiError::new(
            503,
            "service_unavailable",
            "the server is shutting down",
        ));
    }
    let body = match read_body(b).await {
        Ok(b) => b,
        Err(e) => return error(&e),
    };
    let mut p = match openai::parse(route, &body, &app.view(), || app.next()) {
        Ok(p) => p,
        Err(e) => return error(&e),
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let request = Request {
        prompt: std::mem::take(&mut p.prompt),
        params: p.params.clone(),
        sink: Box::new(move |e| tx.send(e).is_ok()),
    };
    if let Err(e) = app.engine.submit(request) {
        return error(&match e {
            SubmitError::Invalid(why) => ApiError::bad("prompt", why),
            SubmitError::QueueFull { .. } => {
                ApiError::new(429, "rate_limit_exceeded", e.to_string())
            }
            SubmitError::Draining => ApiError::new(503, "service_unavailable", e.to_string()),
        });
    }
    let id = match route {
        Route::Completions => format!("cmpl-{:016x}", app.next()),
        Route::Chat => format!("chatcmpl-{:016x}", app.next()),
    };
    if p.stream {
        stream(app, route, id, p, rx)
    } else {
        whole(app, route, id, p, rx).await
    }
}

/// Waits for the end and answers once.
async fn whole(
    app: Arc<App>,
    route: Route,
    id: String,
    p: openai::Parsed,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Response {
    let h = Header {
        id: &id,
        created: now_secs(),
        model: &app.name,
        route,
    };
    while let Some(e) = rx.recv().await {
        match e {
            Event::Delta(_) => {}
            Event::Finished(g) => {
                let lp = p
                    .logprobs
                    .then(|| openai::logprobs(route, &app.tokenizer, &g.token_ids, &g.logprobs, 0));
                return axum::Json(openai::response(&h, &g, lp)).into_response();
            }
            Event::Failed(why) => {
                return error(&ApiError::new(500, "InternalServerError", why));
            }
        }
    }
    error(&ApiError::new(
        500,
        "InternalServerError",
        "the engine stopped",
    ))
}

/// Server-sent events: one chunk per delta, the end, `[DONE]`.
fn stream(
    app: Arc<App>,
    route: Route,
    id: String,
    p: openai::Parsed,
    rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Response {
    struct St {
        app: Arc<App>,
        route: Route,
        id: String,
        created: u64,
        p: openai::Parsed,
        rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
        opened: bool,
        done: bool,
        offset: usize,
    }
    fn sse(v: &Value) -> String {
        format!("data: {v}\n\n")
    }
    let st = St {
        app,
        route,
        id,
        created: now_secs(),
        p,
        rx,
        opened: false,
        done: false,
        offset: 0,
    };
    let events = futures_util::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let h = Header {
            id: &st.id,
            created: st.created,
            model: &st.app.name,
            route: st.route,
        };
        if !st.opened && st.route == Route::Chat {
            st.opened = true;
            let first = sse(&openai::chunk(&h, None, None, None, None));
            return Some((Ok::<_, Infallible>(first), st));
        }
        st.opened = true;
        let out = match st.rx.recv().await {
            Some(Event::Delta(d)) => {
                let lp = st.p.logprobs.then(|| {
                    openai::logprobs(
                        st.route,
                        &st.app.tokenizer,
                        &d.token_ids,
                        &d.logprobs,
                        st.offset,
                    )
                });
                st.offset += d.text.len();
                sse(&openai::chunk(&h, Some(&d), lp, None, None))
            }
            Some(Event::Finished(g)) => {
                let u = openai::usage(g.prompt_token_ids.len(), g.token_ids.len());
                let mut s = if st.p.include_usage {
                    let last = sse(&openai::chunk(&h, None, None, Some(g.finish_reason), None));
                    last + &sse(&openai::usage_chunk(&h, u))
                } else {
                    sse(&openai::chunk(
                        &h,
                        None,
                        None,
                        Some(g.finish_reason),
                        Some(u),
                    ))
                };
                s.push_str("data: [DONE]\n\n");
                st.done = true;
                s
            }
            Some(Event::Failed(why)) => {
                st.done = true;
                let e = ApiError::new(500, "InternalServerError", why);
                sse(&e.body()) + "data: [DONE]\n\n"
            }
            None => {
                st.done = true;
                let e = ApiError::new(500, "InternalServerError", "the engine stopped");
                sse(&e.body()) + "data: [DONE]\n\n"
            }
        };
        Some((Ok(out), st))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
