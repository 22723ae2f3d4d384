//! `nrt llm build | generate`: decoder LLMs (crate `nrt-llm`) from the command line.

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
            bar.set_message("dequantizing the weights");
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
    let (_dev, rt) = session::runtime(None)?;
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
