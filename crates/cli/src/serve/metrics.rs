//! `/metrics` of `nrt llm serve`: Prometheus text with vLLM's metric names (`vllm:`…, label
//! `model_name`), so dashboards made for vLLM chart this server unchanged; the runtime's own
//! statistics stay in `nrt monitor` / `nrt top` as for any process.

use nrt_llm::engine::{Histogram, Metrics};
use std::fmt::Write;

fn head(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn scalar(out: &mut String, name: &str, kind: &str, help: &str, label: &str, v: f64) {
    head(out, name, kind, help);
    let _ = writeln!(out, "{name}{{{label}}} {v}");
}

fn histogram(out: &mut String, name: &str, help: &str, label: &str, h: &Histogram) {
    head(out, name, "histogram", help);
    let mut cum = 0;
    for (b, c) in h.bounds.iter().zip(&h.counts) {
        cum += c;
        let _ = writeln!(out, "{name}_bucket{{{label},le=\"{b}\"}} {cum}");
    }
    let _ = writeln!(out, "{name}_bucket{{{label},le=\"+Inf\"}} {}", h.count());
    let _ = writeln!(out, "{name}_sum{{{label}}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{{label}}} {}", h.count());
}

/// The text of `m` for model `model`.
pub fn render(model: &str, m: &Metrics) -> String {
    let label = format!(
        "model_name=\"{}\"",
        model.replace('\\', "\\\\").replace('"', "\\\"")
    );
    let l = label.as_str();
    let mut o = String::new();
    scalar(
        &mut o,
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        l,
        m.running as f64,
    );
    scalar(
        &mut o,
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        l,
        m.waiting as f64,
    );
    let usage = if m.slots_total == 0 {
        0.0
    } else {
        m.slots_used as f64 / m.slots_total as f64
    };
    scalar(
        &mut o,
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage (slots held by running sequences).",
        l,
        usage,
    );
    scalar(
        &mut o,
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemptions (none: a sequence owns its cache slot).",
        l,
        0.0,
    );
    scalar(
        &mut o,
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        l,
        m.prompt_tokens as f64,
    );
    scalar(
        &mut o,
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        l,
        m.generation_tokens as f64,
    );
    head(
        &mut o,
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
    );
    for (reason, n) in m.finished_by_reason() {
        let _ = writeln!(
            o,
            "vllm:request_success_total{{{l},finished_reason=\"{reason}\"}} {n}"
        );
    }
    histogram(
        &mut o,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        l,
        &m.ttft,
    );
    histogram(
        &mut o,
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds (a request's mean).",
        l,
        &m.tpot,
    );
    histogram(
        &mut o,
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        l,
        &m.itl,
    );
    histogram(
        &mut o,
        "vllm:e2e_request_latency_seconds",
        "Histogram of end to end request latency in seconds.",
        l,
        &m.e2e,
    );
    scalar(
        &mut o,
        "nrt_llm_requests_failed_total",
        "counter",
        "Requests ended by an execution error.",
        l,
        m.failed as f64,
    );
    scalar(
        &mut o,
        "nrt_llm_requests_rejected_total",
        "counter",
        "Requests refused because the queue was full (429).",
        l,
        m.rejected as f64,
    );
    scalar(
        &mut o,
        "nrt_llm_prefill_executions_total",
        "counter",
        "Prefill executions.",
        l,
        m.prefills as f64,
    );
    scalar(
        &mut o,
        "nrt_llm_decode_steps_total",
        "counter",
        "Decode executions (one per step over the running batch).",
        l,
        m.decodes as f64,
    );
    o
}
