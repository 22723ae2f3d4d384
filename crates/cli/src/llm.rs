//! `nrt llm build | generate | chat | bench | reference | quality | serve`: decoder LLMs
//! (crate `nrt-llm`) from the command line.

use crate::session::{self, Res};
use clap::{Args, Subcommand};
use nrt_llm::build::{BuildOptions, Progress, WeightFormat};
use nrt_llm::generate::{GenerateParams, generate};
use nrt_llm::runner::Runner;
use std::io::Write;
use std::path::PathBuf;

/// `nrt llm`.
#[derive(Debug, Args)]
pub struct LlmArgs {
    #[command(subcommand)]
    pub command: LlmCommand,
}

/// The `nrt llm` subcommands.
#[derive(Debug, Subcommand)]
pub enum LlmCommand {
    /// Builds a GGUF decoder (llama family) into a model directory: one prefill program per
    /// context bucket, one decode program per batch bucket, the weights once, the tokenizer.
    Build(BuildArgs),
    /// Generates text from a prompt on a built model directory, streaming it, then prints
    /// TTFT, TPOT and tokens/s.
    Generate(GenerateArgs),
    /// An interactive chat on a model directory: the chat template applied to the whole
    /// conversation each turn, the answer streamed. `/reset` starts over, `/quit` (or end of
    /// input) leaves.
    Chat(ChatArgs),
    /// Measures a model directory: prefill tokens/s (TTFT) and decode tokens/s (TPOT) per
    /// batch, and the cost of switching between the prefill and decode programs.
    Bench(BenchArgs),
    /// Runs prompts greedily with the logits head on the device and writes, per prompt, the
    /// logits of the prefill and of each decode step, the tokens, and the reference graphs
    /// (the same programs as ONNX, weights read from the directory's weights.bin) that
    /// `scripts/llm_reference.py` runs with ONNX Runtime to compare.
    Reference(ReferenceArgs),
    /// What compressed weights cost: the perplexity of a fixed text (default: the Gettysburg
    /// Address) and, with `--against` another build (f32), the top-1 agreement per step.
    Quality(crate::llm_quality::QualityArgs),
    /// Serves a model directory over the OpenAI API (`/v1/completions`,
    /// `/v1/chat/completions`, streaming with `"stream": true`), continuously batched;
    /// `/metrics` with vLLM's metric names, `/health`, `/v1/models`.
    Serve(crate::serve::ServeArgs),
}

/// `nrt llm reference`.
#[derive(Debug, Args)]
pub struct ReferenceArgs {
    /// The model directory.
    pub dir: PathBuf,
    /// A prompt (repeatable).
    #[arg(long, required = true)]
    pub prompt: Vec<String>,
    /// Greedy decode steps after each prefill.
    #[arg(long, default_value_t = 32)]
    pub steps: usize,
    /// Where the logits and the index (reference.json) go.
    #[arg(short = 'o', long = "out")]
    pub out: PathBuf,
}

/// `nrt llm chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The model directory.
    pub dir: PathBuf,
    /// A system message opening the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Most new tokens per answer.
    #[arg(long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling threshold.
    #[arg(long = "top-p", default_value_t = 1.0)]
    pub top_p: f32,
    /// Sample among the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 0)]
    pub top_k: u32,
    /// The sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `nrt llm bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The model directory.
    pub dir: PathBuf,
    /// Decode batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,4,8")]
    pub batch: Vec<usize>,
    /// Prompt length of every sequence.
    #[arg(long = "prompt-len", default_value_t = 128)]
    pub prompt_len: usize,
    /// Decode steps per batch.
    #[arg(long = "new-tokens", default_value_t = 128)]
    pub new_tokens: usize,
    /// One JSON object per line instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `nrt llm build`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The model file (`.gguf`).
    pub src: PathBuf,
    /// The directory to write (replaced if it holds an earlier build).
    #[arg(short = 'o', long = "out")]
    pub out: PathBuf,
    /// Prefill buckets, increasing (default: powers of two from 128 up to --max-model-len,
    /// which is included).
    #[arg(long = "context-buckets", value_delimiter = ',')]
    pub context_buckets: Option<Vec<usize>>,
    /// Decode batch buckets, increasing (default 1,4,8).
    #[arg(long = "batch-buckets", value_delimiter = ',')]
    pub batch_buckets: Option<Vec<usize>>,
    /// The longest sequence, prompt and output (sizes the KV cache; default 512, at most
    /// the model's training context).
    #[arg(long = "max-model-len")]
    pub max_model_len: Option<usize>,
    /// How the weights are stored on the device: f32, bf16, int8 or q4.
    #[arg(long, default_value = "f32")]
    pub weights: String,
    /// NeuronCores each program spans (1 or 2).
    #[arg(long = "tp", alias = "cores", default_value_t = 1)]
    pub tp: u32,
}

/// `nrt llm generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The model directory (`nrt llm build -o DIR`).
    pub dir: PathBuf,
    /// The prompt.
    #[arg(long)]
    pub prompt: String,
    /// Apply the model's chat template (the prompt is the user's message).
    #[arg(long)]
    pub chat: bool,
    /// Most new tokens.
    #[arg(long = "max-tokens", default_value_t = 32)]
    pub max_tokens: usize,
    /// Sampling temperature (0: greedy, the default).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches P.
    #[arg(long = "top-p", default_value_t = 1.0)]
    pub top_p: f32,
    /// Sample among the K most likely tokens (0: all).
    #[arg(long = "top-k", default_value_t = 0)]
    pub top_k: u32,
    /// The sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object instead of the streamed text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `nrt llm …`.
pub fn main(a: &LlmArgs) -> Res<()> {
    match &a.command {
        LlmCommand::Build(b) => build(b),
        LlmCommand::Generate(g) => generate_cmd(g),
        LlmCommand::Chat(c) => chat(c),
        LlmCommand::Bench(b) => bench(b),
        LlmCommand::Reference(r) => reference(r),
        LlmCommand::Quality(q) => crate::llm_quality::quality(q),
        LlmCommand::Serve(s) => crate::serve::serve(s),
    }
}

fn build(a: &BuildArgs) -> Res<()> {
    let o = BuildOptions {
        context_buckets: a.context_buckets.clone(),
        batch_buckets: a.batch_buckets.clone(),
        max_model_len: a.max_model_len,
        weights: WeightFormat::parse(&a.weights)?,
        cores: a.tp,
    };
    let bar = indicatif::ProgressBar::hidden();
    bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed:>4} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let t0 = std::time::Instant::now();
    let m = nrt_llm::build::build(&a.src, &a.out, &o, &mut |p| match p {
        Progress::Start { total } => {
            bar.set_length(total as u64);
            bar.set_message("writing the weights");
        }
        Progress::Step(s) => {
            bar.inc(1);
            bar.println(format!("  {s}"));
            bar.set_message("compiling");
        }
    })
    .map_err(|e| e.to_string())?;
    bar.finish_and_clear();
    let cache_mb = m.cache.bytes as f64 / 1e6;
    println!(
        "built {} ({} layers, hidden {}, {} heads / {} KV heads, vocabulary {}) into {} in {:.1} s",
        m.name,
        m.config.n_layer,
        m.config.n_embd,
        m.config.n_head,
        m.config.n_head_kv,
        m.config.vocab_size,
        a.out.display(),
        t0.elapsed().as_secs_f64()
    );
    println!(
        "  prefill buckets {:?}, decode batch buckets {:?}, max model length {}",
        m.context_buckets, m.batch_buckets, m.max_model_len
    );
    println!(
        "  device memory: weights {:.1} MB ({}), KV cache {cache_mb:.1} MB ({} slots × {} positions)",
        m.weights.bytes as f64 / 1e6,
        m.weights.dtype.name(),
        m.cache.slots - 1,
        m.cache.len
    );
    println!(
        "next: nrt llm generate {} --prompt \"The capital of France is\"",
        a.out.display()
    );
    Ok(())
}

fn generate_cmd(a: &GenerateArgs) -> Res<()> {
    let sampling = nrt_llm::runner::Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    sampling
        .check()
        .map_err(|e| format!("--temperature/--top-p: {e}"))?;
    if a.max_tokens == 0 {
        return Err("--max-tokens 0: ask for at least one token".into());
    }
    let (_dev, rt) = session::runtime_for_llm(&a.dir)?;
    let mut r = Runner::load(&rt, &a.dir, 0).map_err(|e| e.to_string())?;
    let text = if a.chat {
        let t = r.template.as_ref().ok_or_else(|| {
            format!(
                "--chat: the model in {} has no chat template",
                a.dir.display()
            )
        })?;
        t.render(
            &[nrt_llm::ChatMessage::new("user", a.prompt.as_str())],
            true,
        )
        .map_err(|e| e.to_string())?
    } else {
        a.prompt.clone()
    };
    let ids = r.tokenizer.encode(&text).map_err(|e| e.to_string())?;
    let p = GenerateParams {
        max_tokens: a.max_tokens,
        stop: Vec::new(),
        sampling,
        ignore_eos: false,
    };
    let json = a.json;
    let mut out = std::io::stdout().lock();
    if !json {
        let _ = write!(out, "{}", a.prompt);
        let _ = out.flush();
    }
    let g = generate(&mut r, 0, &ids, &p, &mut |piece| {
        if !json {
            let _ = write!(out, "{piece}");
            let _ = out.flush();
        }
    })
    .map_err(|e| e.to_string())?;
    if json {
        let v = serde_json::json!({
            "prompt_token_ids": g.prompt_token_ids,
            "token_ids": g.token_ids,
            "text": g.text,
            "finish_reason": g.finish_reason.as_str(),
            "ttft_ms": g.ttft_ms,
            "tpot_ms": g.tpot_ms,
            "tokens_per_s": g.tokens_per_s,
        });
        let _ = writeln!(out, "{v}");
    } else {
        let _ = writeln!(out);
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {}] TTFT {:.1} ms, TPOT {:.1} ms, {:.1} tokens/s",
            g.prompt_token_ids.len(),
            g.token_ids.len(),
            g.finish_reason.as_str(),
            g.ttft_ms,
            g.tpot_ms,
            g.tokens_per_s
        );
    }
    Ok(())
}

fn bench(a: &BenchArgs) -> Res<()> {
    use nrt_llm::runner::{DecodeRow, Sampling};
    use std::time::Instant;
    let (_dev, rt) = session::runtime_for_llm(&a.dir)?;
    let mut r = Runner::load(&rt, &a.dir, 0).map_err(|e| e.to_string())?;
    let max = r.max_model_len();
    if a.prompt_len == 0 || a.prompt_len > r.max_prompt() {
        return Err(format!(
            "--prompt-len {}: between 1 and {} (below the max model length {max}; past the largest context bucket, {}, a prompt prefills in chunks)",
            a.prompt_len,
            r.max_prompt(),
            r.chunk_len()
        ));
    }
    let new_tokens = a.new_tokens.min(max - a.prompt_len);
    if new_tokens < a.new_tokens {
        eprintln!(
            "nrt llm bench: --new-tokens {} capped at {new_tokens} (max model length {max})",
            a.new_tokens
        );
    }
    if let Some(&b) = a
        .batch
        .iter()
        .find(|&&b| b == 0 || b > r.max_batch().min(r.slots()))
    {
        return Err(format!(
            "--batch {b}: between 1 and {} (the largest decode bucket)",
            r.max_batch().min(r.slots())
        ));
    }
    let weights = r.manifest.weights.dtype.name();
    let wbytes = r.manifest.weights.bytes;
    let prompt: Vec<u32> = (0..a.prompt_len)
        .map(|i| 100 + (i as u32 * 7919) % 10_000)
        .collect();
    let greedy = Sampling::greedy();
    let err = |e: nrt_llm::Error| e.to_string();
    // Prefill: one warm-up, then the mean of three.
    r.prefill(0, &prompt, &greedy).map_err(err)?;
    let t0 = Instant::now();
    for _ in 0..3 {
        r.prefill(0, &prompt, &greedy).map_err(err)?;
    }
    let ttft = t0.elapsed().as_secs_f64() * 1e3 / 3.0;
    // A prompt past the largest context bucket prefills in chunks: the last one's bucket.
    let chunks = r.prefill_chunks(a.prompt_len);
    let mut rows = vec![serde_json::json!({
        "phase": "prefill", "batch": 1, "prompt_len": a.prompt_len, "new_tokens": 0,
        "bucket": chunks.last().copied().unwrap_or(0), "chunks": chunks.len(),
        "tokens_per_s": a.prompt_len as f64 / (ttft / 1e3), "ttft_ms": ttft, "tpot_ms": 0.0,
        "weights": weights, "bytes_per_token": wbytes / a.prompt_len as u64,
    })];
    for &b in &a.batch {
        let mut next = Vec::with_capacity(b);
        for s in 0..b {
            next.push(r.prefill(s, &prompt, &greedy).map_err(err)?.token);
        }
        // The first step after the prefills pays the switch between programs.
        let mut steps = Vec::with_capacity(new_tokens);
        for i in 0..new_tokens {
            let batch: Vec<DecodeRow> = (0..b)
                .map(|s| DecodeRow {
                    slot: s,
                    token: next[s],
                    position: a.prompt_len + i,
                    sampling: greedy,
                })
                .collect();
            let t = Instant::now();
            let out = r.decode(&batch).map_err(err)?;
            steps.push(t.elapsed().as_secs_f64() * 1e3);
            next = out.iter().map(|s| s.token).collect();
        }
        let steady = if steps.len() > 1 {
            steps[1..].iter().sum::<f64>() / (steps.len() - 1) as f64
        } else {
            steps.first().copied().unwrap_or(0.0)
        };
        let first = steps.first().copied().unwrap_or(0.0);
        rows.push(serde_json::json!({
            "phase": "decode", "batch": b, "prompt_len": a.prompt_len, "new_tokens": new_tokens,
            "bucket": r.decode_bucket(b).unwrap_or(0),
            "tokens_per_s": b as f64 / (steady / 1e3), "ttft_ms": ttft, "tpot_ms": steady,
            "first_step_ms": first, "switch_ms": (first - steady).max(0.0),
            "weights": weights, "bytes_per_token": wbytes / b as u64,
        }));
    }
    let c = r.counters();
    if a.json {
        for row in rows {
            println!("{row}");
        }
    } else {
        println!(
            "{} ({} weights, {:.0} MB), prompt {} tokens, {new_tokens} new tokens",
            r.manifest.name,
            weights,
            wbytes as f64 / 1e6,
            a.prompt_len
        );
        println!(
            "{:<8} {:>5} {:>7} {:>12} {:>10} {:>10} {:>10}",
            "phase", "batch", "bucket", "tokens/s", "TTFT ms", "TPOT ms", "switch ms"
        );
        for row in &rows {
            let f = |k: &str| row[k].as_f64().unwrap_or(0.0);
            println!(
                "{:<8} {:>5} {:>7} {:>12.1} {:>10.1} {:>10.2} {:>10.2}",
                row["phase"].as_str().unwrap_or(""),
                row["batch"].as_u64().unwrap_or(0),
                row["bucket"].as_u64().unwrap_or(0),
                f("tokens_per_s"),
                f("ttft_ms"),
                f("tpot_ms"),
                f("switch_ms")
            );
        }
        println!(
            "executions: {} prefill, {} decode, {} program switches (each counted once, outside the steady rows)",
            c.prefills, c.decodes, c.switches
        );
    }
    Ok(())
}

fn reference(a: &ReferenceArgs) -> Res<()> {
    use nrt_llm::runner::{DecodeRow, Sampling};
    let (_dev, rt) = session::runtime_for_llm(&a.dir)?;
    let mut r = Runner::load_logits(&rt, &a.dir, 0).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let err = |e: nrt_llm::Error| e.to_string();
    let manifest = r.manifest.clone();
    let program = |phase: &str, n: usize| {
        manifest
            .programs
            .iter()
            .find(|p| {
                p.phase == phase
                    && if phase == "prefill" {
                        p.seq == n
                    } else {
                        p.batch == n
                    }
            })
            .cloned()
    };
    let decode = program("decode", 1).ok_or("the directory has no decode program of batch 1")?;
    let decode_onnx =
        nrt_llm::build::export_reference(&a.dir, &r.manifest, &decode).map_err(err)?;
    let mut index = Vec::new();
    for (i, text) in a.prompt.iter().enumerate() {
        let ids = r.tokenizer.encode(text).map_err(err)?;
        let bucket = r
            .prefill_bucket(ids.len())
            .ok_or_else(|| format!("prompt {i}: {} tokens, longer than every bucket", ids.len()))?;
        let steps = a.steps.min(r.max_model_len().saturating_sub(ids.len() + 1));
        let pre = program("prefill", bucket).ok_or("no prefill program")?;
        let pre_onnx = nrt_llm::build::export_reference(&a.dir, &r.manifest, &pre).map_err(err)?;
        let mut logits: Vec<f32> = Vec::new();
        let mut tokens = Vec::new();
        let mut t = r.prefill(0, &ids, &Sampling::greedy()).map_err(err)?.token;
        logits.extend(r.last_logits().map_err(err)?);
        tokens.push(t);
        for k in 0..steps {
            let row = DecodeRow {
                slot: 0,
                token: t,
                position: ids.len() + k,
                sampling: Sampling::greedy(),
            };
            t = r.decode(&[row]).map_err(err)?[0].token;
            logits.extend(r.last_logits().map_err(err)?);
            tokens.push(t);
        }
        let file = format!("prompt{i}.f32");
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(a.out.join(&file), bytes).map_err(|e| e.to_string())?;
        index.push(serde_json::json!({
            "prompt": text, "prompt_token_ids": ids, "tokens": tokens, "bucket": bucket,
            "logits": file, "prefill_onnx": pre_onnx, "decode_onnx": decode_onnx,
        }));
        eprintln!(
            "prompt {i}: {} tokens in the {bucket} bucket, {steps} decode steps",
            ids.len()
        );
    }
    let m = &r.manifest;
    let doc = serde_json::json!({
        "vocab_size": m.config.vocab_size, "layers": m.config.n_layer,
        "cache_shape": [m.cache.slots, m.cache.len, m.cache.kv_heads, m.cache.head_dim],
        "prompts": index,
    });
    let p = a.out.join("reference.json");
    std::fs::write(
        &p,
        serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", p.display()))?;
    println!("{}", p.display());
    Ok(())
}

fn chat(a: &ChatArgs) -> Res<()> {
    use nrt_llm::ChatMessage;
    use std::io::BufRead;
    let sampling = nrt_llm::runner::Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        seed: a.seed,
    };
    sampling.check().map_err(|e| e.to_string())?;
    let (_dev, rt) = session::runtime_for_llm(&a.dir)?;
    let mut r = Runner::load(&rt, &a.dir, 0).map_err(|e| e.to_string())?;
    if r.template.is_none() {
        return Err(format!(
            "the model in {} has no chat template",
            a.dir.display()
        ));
    }
    let opening: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let mut history = opening.clone();
    eprintln!(
        "{} — type a message; /reset starts over, /quit leaves (prompts up to {} tokens)",
        r.manifest.name,
        r.max_prompt()
    );
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| e.to_string())?
            == 0
        {
            break;
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                history = opening.clone();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let text = r
            .template
            .as_ref()
            .expect("checked above")
            .render(&history, true)
            .map_err(|e| e.to_string())?;
        let ids = r.tokenizer.encode(&text).map_err(|e| e.to_string())?;
        let p = GenerateParams {
            max_tokens: a.max_tokens,
            stop: Vec::new(),
            sampling,
            ignore_eos: false,
        };
        match generate(&mut r, 0, &ids, &p, &mut |piece| {
            let _ = write!(out, "{piece}");
            let _ = out.flush();
        }) {
            Ok(g) => {
                let _ = writeln!(out);
                eprintln!(
                    "[{} tokens, TTFT {:.0} ms, {:.1} tokens/s]",
                    g.token_ids.len(),
                    g.ttft_ms,
                    g.tokens_per_s
                );
                history.push(ChatMessage::new("assistant", g.text.as_str()));
            }
            Err(e) => {
                history.pop();
                eprintln!("error: {e} (/reset to start over)");
            }
        }
    }
    Ok(())
}
