//! The OpenAI API's shapes: request bodies read field by field (each bad value named, the
//! HTTP status OpenAI gives it), responses and stream chunks written as its clients parse
//! them (`/v1/completions`, `/v1/chat/completions`).

use nrt_llm::generate::{Delta, FinishReason, GenerateParams, Generation};
use nrt_llm::runner::Sampling;
use nrt_llm::{ChatMessage, Tokenizer};
use serde_json::{Map, Value, json};

/// The most stop strings a request may give, and their longest (bytes): a stop check runs on
/// every token.
pub const MAX_STOP_STRINGS: usize = 16;
/// See [`MAX_STOP_STRINGS`].
pub const MAX_STOP_BYTES: usize = 256;

/// An error response: its HTTP status, OpenAI's `type`, the parameter, the message.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// The parameter at fault, if one is.
    pub param: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
}

impl ApiError {
    /// 400 for parameter `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            message: message.into(),
        }
    }

    /// An error of `status` with no parameter.
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            param: None,
            message: message.into(),
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status,
        }})
    }
}

/// Which route a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// What the model offers a request.
pub struct ModelView<'a> {
    /// The name clients use.
    pub name: &'a str,
    /// The tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The chat template (`None`: the chat route refuses).
    pub template: Option<&'a nrt_llm::ChatTemplate>,
    /// The longest sequence.
    pub max_model_len: usize,
    /// The vocabulary's size (token ids in a prompt are below it).
    pub vocab_size: usize,
}

/// A request, read and checked.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// How to generate.
    pub params: GenerateParams,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Send a last chunk with the usage (`stream_options.include_usage`).
    pub include_usage: bool,
    /// Return each chosen token's log-probability.
    pub logprobs: bool,
}

fn field<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k).filter(|v| !v.is_null())
}

fn number(o: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::bad(k, format!("'{k}' must be a number, got {v}"))),
    }
}

fn integer(o: &Map<String, Value>, k: &str) -> Result<Option<i64>, ApiError> {
    match field(o, k) {
        None => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::bad(k, format!("'{k}' must be an integer, got {v}"))),
    }
}

fn boolean(o: &Map<String, Value>, k: &str) -> Result<bool, ApiError> {
    match field(o, k) {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| ApiError::bad(k, format!("'{k}' must be true or false, got {v}"))),
    }
}

/// Reads a request body of `route`; `fresh_seed` gives a seed to a request without one.
pub fn parse(
    route: Route,
    body: &[u8],
    m: &ModelView<'_>,
    fresh_seed: impl FnOnce() -> u64,
) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            400,
            "invalid_request_error",
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    let o = v.as_object().ok_or_else(|| {
        ApiError::new(
            400,
            "invalid_request_error",
            "the body must be a JSON object",
        )
    })?;
    if let Some(name) = field(o, "model") {
        let name = name
            .as_str()
            .ok_or_else(|| ApiError::bad("model", "'model' must be a string"))?;
        if name != m.name {
            return Err(ApiError {
                status: 404,
                kind: "NotFoundError",
                param: Some("model".into()),
                message: format!(
                    "The model `{name}` does not exist; this server serves `{}` (GET /v1/models).",
                    m.name
                ),
            });
        }
    }
    let prompt = match route {
        Route::Completions => completion_prompt(o, m)?,
        Route::Chat => chat_prompt(o, m)?,
    };
    if let Some(n) = integer(o, "n")?
        && n != 1
    {
        return Err(ApiError::bad(
            "n",
            format!("n {n}: one choice per request (n = 1)"),
        ));
    }
    if route == Route::Completions && boolean(o, "echo")? {
        return Err(ApiError::bad(
            "echo",
            "echo is not supported: the prompt's text is the caller's",
        ));
    }
    let logprobs = match route {
        Route::Completions => match integer(o, "logprobs")? {
            None => false,
            Some(0) => true,
            Some(k) => {
                return Err(ApiError::bad(
                    "logprobs",
                    format!(
                        "logprobs {k}: only the chosen token's log-probability is computed (on the \
                         device); ask for logprobs 0"
                    ),
                ));
            }
        },
        Route::Chat => {
            if let Some(k) = integer(o, "top_logprobs")?
                && k != 0
            {
                return Err(ApiError::bad(
                    "top_logprobs",
                    format!(
                        "top_logprobs {k}: only the chosen token's log-probability is computed \
                         (on the device); use logprobs: true without top_logprobs"
                    ),
                ));
            }
            boolean(o, "logprobs")?
        }
    };
    let room = m.max_model_len.saturating_sub(prompt.len());
    let max_tokens = match integer(o, "max_completion_tokens")?.or(integer(o, "max_tokens")?) {
        None if route == Route::Completions => 16.min(room),
        None => room,
        Some(k) if k < 1 => {
            return Err(ApiError::bad(
                "max_tokens",
                format!("max_tokens {k}: at least 1"),
            ));
        }
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    if max_tokens > room || prompt.len() >= m.max_model_len {
        return Err(ApiError::bad(
            "max_tokens",
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                 tokens ({} in the prompt, {max_tokens} in the completion). Please reduce the \
                 length of the prompt or the completion.",
                m.max_model_len,
                prompt.len().saturating_add(max_tokens),
                prompt.len()
            ),
        ));
    }
    let temperature = number(o, "temperature")?.unwrap_or(1.0);
    if temperature < 0.0 {
        return Err(ApiError::bad(
            "temperature",
            format!("temperature {temperature}: at least 0 (0 is greedy)"),
        ));
    }
    let top_p = number(o, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", format!("top_p {top_p}: in (0, 1]")));
    }
    let top_k = match integer(o, "top_k")? {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => u32::try_from(k).unwrap_or(u32::MAX),
        Some(k) => {
            return Err(ApiError::bad(
                "top_k",
                format!("top_k {k}: -1 or 0 (all tokens) or a positive count"),
            ));
        }
    };
    let seed = match integer(o, "seed")? {
        Some(s) => s as u64,
        None => fresh_seed(),
    };
    Ok(Parsed {
        prompt,
        params: GenerateParams {
            max_tokens,
            stop: stop_strings(o)?,
            sampling: Sampling {
                temperature: temperature as f32,
                top_k,
                top_p: top_p as f32,
                seed,
            },
            ignore_eos: boolean(o, "ignore_eos")?,
        },
        stream: boolean(o, "stream")?,
        include_usage: match field(o, "stream_options") {
            None => false,
            Some(Value::Object(so)) => boolean(so, "include_usage")?,
            Some(v) => {
                return Err(ApiError::bad(
                    "stream_options",
                    format!("'stream_options' must be an object, got {v}"),
                ));
            }
        },
        logprobs,
    })
}

fn stop_strings(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let list: Vec<&Value> = match field(o, "stop") {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(v) => vec![v],
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::bad(
            "stop",
            format!("{} stop strings: at most {MAX_STOP_STRINGS}", list.len()),
        ));
    }
    list.into_iter()
        .map(|v| match v.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_STOP_BYTES => Ok(s.to_string()),
            _ => Err(ApiError::bad(
                "stop",
                format!("stop {v}: a non-empty string of at most {MAX_STOP_BYTES} bytes"),
            )),
        })
        .collect()
}

fn token_ids(a: &[Value], m: &ModelView<'_>) -> Result<Vec<u32>, ApiError> {
    a.iter()
        .map(|t| {
            t.as_u64()
                .filter(|&t| t < m.vocab_size as u64)
                .map(|t| t as u32)
                .ok_or_else(|| {
                    ApiError::bad(
                        "prompt",
                        format!(
                            "token {t}: prompt tokens are integers below the vocabulary size {}",
                            m.vocab_size
                        ),
                    )
                })
        })
        .collect()
}

fn encode(m: &ModelView<'_>, text: &str, param: &str) -> Result<Vec<u32>, ApiError> {
    m.tokenizer
        .encode(text)
        .map_err(|e| ApiError::bad(param, e.to_string()))
}

fn completion_prompt(o: &Map<String, Value>, m: &ModelView<'_>) -> Result<Vec<u32>, ApiError> {
    let one =
        "one prompt per request: a string, a list of token ids, or a list holding one of those";
    let ids = match field(o, "prompt") {
        None => return Err(ApiError::bad("prompt", "'prompt' is required")),
        Some(Value::String(s)) => encode(m, s, "prompt")?,
        Some(Value::Array(a)) => match a.as_slice() {
            [Value::String(s)] => encode(m, s, "prompt")?,
            [Value::Array(ids)] => token_ids(ids, m)?,
            ids if ids.iter().all(Value::is_number) => token_ids(ids, m)?,
            _ => return Err(ApiError::bad("prompt", one)),
        },
        Some(_) => return Err(ApiError::bad("prompt", one)),
    };
    if ids.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt is empty"));
    }
    Ok(ids)
}

fn chat_prompt(o: &Map<String, Value>, m: &ModelView<'_>) -> Result<Vec<u32>, ApiError> {
    let Some(t) = m.template else {
        return Err(ApiError::bad(
            "messages",
            format!(
                "the model `{}` has no chat template: use /v1/completions",
                m.name
            ),
        ));
    };
    let Some(Value::Array(list)) = field(o, "messages") else {
        return Err(ApiError::bad(
            "messages",
            "'messages' is required: a list of {role, content}",
        ));
    };
    if list.is_empty() {
        return Err(ApiError::bad("messages", "'messages' is empty"));
    }
    let mut msgs = Vec::with_capacity(list.len());
    for (i, msg) in list.iter().enumerate() {
        let bad = |why: &str| ApiError::bad(&format!("messages[{i}]"), why.to_string());
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("'role' must be a string"))?;
        let content = match msg.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            // The content-parts form: text parts only.
            Some(Value::Array(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(x))) => s.push_str(x),
                        _ => return Err(bad("content parts: only {type: \"text\", text} is read")),
                    }
                }
                s
            }
            Some(_) => return Err(bad("'content' must be a string or a list of text parts")),
        };
        msgs.push(ChatMessage::new(role, content));
    }
    let text = t
        .render(&msgs, true)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    let ids = encode(m, &text, "messages")?;
    if ids.is_empty() {
        return Err(ApiError::bad("messages", "the conversation renders empty"));
    }
    Ok(ids)
}

/// What every object of one response shares.
pub struct Header<'a> {
    /// `cmpl-…` or `chatcmpl-…`.
    pub id: &'a str,
    /// Unix seconds.
    pub created: u64,
    /// The served name.
    pub model: &'a str,
    /// Which route.
    pub route: Route,
}

/// The usage object.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// Token `id`'s text (lossy where the token is part of a character) and bytes.
fn token_text(t: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = t.decode_bytes(&[id]).unwrap_or_default();
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// The `logprobs` object of tokens `ids` (whose text starts at `offset` bytes of the
/// completion, for `/v1/completions`' `text_offset`).
pub fn logprobs(route: Route, t: &Tokenizer, ids: &[u32], lps: &[f32], offset: usize) -> Value {
    match route {
        Route::Completions => {
            let mut at = offset;
            let (mut tokens, mut offsets) = (Vec::new(), Vec::new());
            for &id in ids {
                let (s, b) = token_text(t, id);
                tokens.push(s);
                offsets.push(at);
                at += b.len();
            }
            json!({
                "tokens": tokens,
                "token_logprobs": lps,
                "top_logprobs": null,
                "text_offset": offsets,
            })
        }
        Route::Chat => {
            let content: Vec<Value> = ids
                .iter()
                .zip(lps)
                .map(|(&id, &lp)| {
                    let (s, b) = token_text(t, id);
                    json!({"token": s, "logprob": lp, "bytes": b, "top_logprobs": []})
                })
                .collect();
            json!({ "content": content })
        }
    }
}

/// A whole (non-streamed) response.
pub fn response(h: &Header<'_>, g: &Generation, lp: Option<Value>) -> Value {
    let choice = match h.route {
        Route::Completions => json!({
            "index": 0,
            "text": g.text,
            "logprobs": lp,
            "finish_reason": g.finish_reason.as_str(),
        }),
        Route::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": g.text},
            "logprobs": lp,
            "finish_reason": g.finish_reason.as_str(),
        }),
    };
    json!({
        "id": h.id,
        "object": match h.route {
            Route::Completions => "text_completion",
            Route::Chat => "chat.completion",
        },
        "created": h.created,
        "model": h.model,
        "choices": [choice],
        "usage": usage(g.prompt_token_ids.len(), g.token_ids.len()),
    })
}

/// One stream chunk: a delta (`d`), the opening of a chat (`role`), or the end (`finish`).
pub fn chunk(
    h: &Header<'_>,
    d: Option<&Delta>,
    lp: Option<Value>,
    finish: Option<FinishReason>,
    usage: Option<Value>,
) -> Value {
    let text = d.map(|d| d.text.as_str()).unwrap_or("");
    let reason = finish.map(FinishReason::as_str);
    let choice = match h.route {
        Route::Completions => json!({
            "index": 0, "text": text, "logprobs": lp, "finish_reason": reason,
        }),
        Route::Chat => {
            let delta = match (d, finish) {
                (None, None) => json!({"role": "assistant", "content": ""}),
                (Some(_), _) => json!({"content": text}),
                (None, Some(_)) => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": reason})
        }
    };
    let mut c = json!({
        "id": h.id,
        "object": match h.route {
            Route::Completions => "text_completion",
            Route::Chat => "chat.completion.chunk",
        },
        "created": h.created,
        "model": h.model,
        "choices": [choice],
    });
    if let Some(u) = usage {
        c["usage"] = u;
    }
    c
}

/// The usage-only last chunk of `stream_options.include_usage`.
pub fn usage_chunk(h: &Header<'_>, u: Value) -> Value {
    let mut c = chunk(h, None, None, Some(FinishReason::Stop), Some(u));
    c["choices"] = json!([]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use nrt_llm::testing::TinyLlama;

    fn with_model(f: impl FnOnce(&ModelView<'_>)) {
        let g = nrt_llm::Gguf::parse(&TinyLlama::default().to_gguf()).unwrap();
        let tok = Tokenizer::from_gguf(&g).unwrap();
        let template = nrt_llm::ChatTemplate::from_gguf(&g, &tok).unwrap();
        f(&ModelView {
            name: "tiny",
            tokenizer: &tok,
            template: template.as_ref(),
            max_model_len: 32,
            vocab_size: 300,
        });
    }

    fn parse_ok(route: Route, body: Value, m: &ModelView<'_>) -> Parsed {
        parse(route, body.to_string().as_bytes(), m, || 7).unwrap()
    }

    fn parse_err(route: Route, body: &[u8], m: &ModelView<'_>) -> ApiError {
        parse(route, body, m, || 7).unwrap_err()
    }

    #[test]
    fn defaults_are_openais_and_prompts_come_in_every_form() {
        with_model(|m| {
            let p = parse_ok(Route::Completions, json!({"prompt": [5, 6, 7]}), m);
            assert_eq!(p.prompt, [5, 6, 7]);
            assert_eq!(p.params.max_tokens, 16, "OpenAI's default for completions");
            assert_eq!(p.params.sampling.temperature, 1.0);
            assert_eq!(p.params.sampling.seed, 7, "a fresh seed when none is given");
            assert!(!p.stream && !p.logprobs && !p.params.ignore_eos);
            let q = parse_ok(Route::Completions, json!({"prompt": [[5, 6, 7]]}), m);
            assert_eq!(q.prompt, p.prompt);
            let t = parse_ok(
                Route::Completions,
                json!({"prompt": "ab", "model": "tiny", "max_tokens": 3, "temperature": 0,
                       "top_k": -1, "seed": 9, "stop": "x", "stream": true, "logprobs": 0,
                       "stream_options": {"include_usage": true}, "user": "ignored"}),
                m,
            );
            assert!(!t.prompt.is_empty() && t.stream && t.include_usage && t.logprobs);
            assert_eq!(t.params.stop, ["x"]);
            assert_eq!((t.params.sampling.top_k, t.params.sampling.seed), (0, 9));
            // Chat: the template applied; max_tokens defaults to the room left.
            let c = parse_ok(
                Route::Chat,
                json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
                m,
            );
            assert_eq!(c.params.max_tokens, 32 - c.prompt.len());
        });
    }

    #[test]
    fn each_bad_value_is_named_with_its_status() {
        with_model(|m| {
            let cases: [(&[u8], u16, &str); 12] = [
                (b"{", 400, "not valid JSON"),
                (b"\"text\"", 400, "JSON object"),
                (br#"{"prompt": "a", "model": "big"}"#, 404, "does not exist"),
                (br#"{"prompt": {}}"#, 400, "one prompt"),
                (br#"{"prompt": [1, 300]}"#, 400, "vocabulary size 300"),
                (br#"{"prompt": []}"#, 400, "prompt is empty"),
                (br#"{"prompt": "a", "max_tokens": 0}"#, 400, "at least 1"),
                (
                    br#"{"prompt": "a", "max_tokens": 40}"#,
                    400,
                    "maximum context length is 32",
                ),
                (br#"{"prompt": "a", "top_p": 1.5}"#, 400, "top_p"),
                (br#"{"prompt": "a", "top_k": -2}"#, 400, "top_k"),
                (br#"{"prompt": "a", "logprobs": 3}"#, 400, "logprobs 0"),
                (br#"{"prompt": "a", "stream": "yes"}"#, 400, "true or false"),
            ];
            for (body, status, says) in cases {
                let e = parse_err(Route::Completions, body, m);
                assert_eq!(e.status, status, "{}: {e:?}", String::from_utf8_lossy(body));
                assert!(
                    e.message.contains(says),
                    "{}: {e:?}",
                    String::from_utf8_lossy(body)
                );
            }
            let e = parse_err(Route::Chat, br#"{"messages": [{"content": "x"}]}"#, m);
            assert_eq!(e.param.as_deref(), Some("messages[0]"));
            let many: Vec<String> = (0..17).map(|i| i.to_string()).collect();
            let body = json!({"prompt": "a", "stop": many}).to_string();
            assert!(
                parse_err(Route::Completions, body.as_bytes(), m)
                    .message
                    .contains("at most 16")
            );
        });
    }
}
