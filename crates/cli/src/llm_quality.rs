//! `nrt llm quality`: what compressed weights cost — the perplexity of a fixed text and the
//! top-1 agreement with another build (usually f32) of the same model, step by step.
//!
//! Both directories run teacher-forced over the same tokens (one decode step per token,
//! the logits head on the device): the logits after token `i` score token `i + 1`
//! (perplexity = exp of the mean negative log-likelihood), and at each step the two
//! builds' arg-max tokens are compared.

use crate::session::{self, Res};
use clap::Args;
use nrt_llm::runner::{DecodeRow, Runner, Sampling};
use std::path::PathBuf;

/// The default text: the Gettysburg Address (1863, public domain).
const DEFAULT_TEXT: &str = include_str!("../data/gettysburg.txt");

/// `nrt llm quality`.
#[derive(Debug, Args)]
pub struct QualityArgs {
    /// The model directory measured (e.g. built with `--weights q4`).
    pub dir: PathBuf,
    /// Another build of the same model to agree with (e.g. `--weights f32`).
    #[arg(long)]
    pub against: Option<PathBuf>,
    /// The text (default: the Gettysburg Address, shipped in the binary).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// At most this many tokens of it (also capped by the max model length).
    #[arg(long, default_value_t = 256)]
    pub tokens: usize,
    /// One JSON object instead of the lines.
    #[arg(long)]
    pub json: bool,
}

/// One build's run over the text: per scored step, the log-likelihood of the next token and
/// the arg-max.
struct Run {
    nll: Vec<f64>,
    argmax: Vec<u32>,
}

fn run(r: &mut Runner, ids: &[u32]) -> Res<Run> {
    let err = |e: nrt_llm::Error| e.to_string();
    let vocab = r.manifest.config.vocab_size;
    let mut out = Run {
        nll: Vec::new(),
        argmax: Vec::new(),
    };
    let score = |logits: &[f32], next: u32, out: &mut Run| {
        let row = &logits[..vocab];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
        let lse = max as f64 + sum.ln();
        out.nll.push(lse - row[next as usize] as f64);
        let best =
            row.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |b, (i, &v)| if v > b.1 { (i, v) } else { b },
            );
        out.argmax.push(best.0 as u32);
    };
    r.prefill(0, &ids[..1], &Sampling::greedy()).map_err(err)?;
    score(&r.last_logits().map_err(err)?, ids[1], &mut out);
    for i in 1..ids.len() - 1 {
        let row = DecodeRow {
            slot: 0,
            token: ids[i],
            position: i,
            sampling: Sampling::greedy(),
        };
        r.decode(&[row]).map_err(err)?;
        score(&r.last_logits().map_err(err)?, ids[i + 1], &mut out);
    }
    Ok(out)
}

fn perplexity(nll: &[f64]) -> f64 {
    (nll.iter().sum::<f64>() / nll.len().max(1) as f64).exp()
}

/// Runs `nrt llm quality`.
pub fn quality(a: &QualityArgs) -> Res<()> {
    let text = match &a.text {
        Some(p) => {
            std::fs::read_to_string(p).map_err(|e| format!("--text {}: {e}", p.display()))?
        }
        None => DEFAULT_TEXT.to_owned(),
    };
    let (_dev, rt) = session::runtime_for_llm(&a.dir)?;
    let load =
        |d: &PathBuf| Runner::load_logits(&rt, d, 0).map_err(|e| format!("{}: {e}", d.display()));
    let mut main = load(&a.dir)?;
    let mut ids = main.tokenizer.encode(&text).map_err(|e| e.to_string())?;
    ids.truncate(a.tokens.min(main.max_model_len()));
    if ids.len() < 2 {
        return Err("the text has fewer than 2 tokens: nothing to score".into());
    }
    let ours = run(&mut main, &ids)?;
    let weights = main.manifest.weights.dtype.name();
    drop(main);
    let other = match &a.against {
        Some(d) => {
            let mut r = load(d)?;
            let o = run(&mut r, &ids)?;
            Some((r.manifest.weights.dtype.name(), o))
        }
        None => None,
    };
    let ppl = perplexity(&ours.nll);
    let agree = other.as_ref().map(|(_, o)| {
        let same: Vec<bool> = ours
            .argmax
            .iter()
            .zip(&o.argmax)
            .map(|(x, y)| x == y)
            .collect();
        (same.iter().filter(|&&s| s).count(), same)
    });
    if a.json {
        let mut doc = serde_json::json!({
            "weights": weights, "tokens": ids.len(), "scored": ours.nll.len(),
            "perplexity": ppl,
        });
        if let (Some((w, o)), Some((n, same))) = (&other, &agree) {
            doc["against"] = serde_json::json!({
                "weights": w, "perplexity": perplexity(&o.nll),
                "top1_agreement": *n as f64 / same.len() as f64,
                "top1_agree_per_step": same,
            });
        }
        println!("{doc}");
        return Ok(());
    }
    println!(
        "{} ({weights} weights): perplexity {ppl:.3} over {} tokens",
        a.dir.display(),
        ours.nll.len()
    );
    if let (Some((w, o)), Some((n, same))) = (&other, &agree) {
        println!(
            "{} ({w} weights): perplexity {:.3}",
            a.against
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            perplexity(&o.nll)
        );
        let first = same.iter().position(|s| !s);
        println!(
            "top-1 agreement: {n} of {} steps ({:.1}%){}",
            same.len(),
            100.0 * *n as f64 / same.len() as f64,
            first.map_or(String::new(), |i| format!("; first difference at step {i}"))
        );
    }
    Ok(())
}
