//! The tiny llama's model directory, shared by the tests that run it: a runtime on a
//! software device, a scratch directory, a build with small buckets, and prompts.

use nrt_llm::build::{BuildOptions, build};
use nrt_llm::testing::TinyLlama;
use nrt_runtime::{Runtime, RuntimeConfig};
use std::path::PathBuf;
use std::sync::Arc;

pub fn runtime() -> Runtime {
    let dev = Arc::new(nrt_sim::SoftDevice::new(nrt_sim::SimConfig::default()).unwrap());
    Runtime::init(dev, RuntimeConfig::default()).unwrap()
}

pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nrt-llm-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The tiny model as a file, and a directory built from it.
pub fn built(name: &str, o: &BuildOptions) -> (PathBuf, PathBuf) {
    let d = tmp(name);
    let src = d.join("tiny.gguf");
    std::fs::write(&src, TinyLlama::default().to_gguf()).unwrap();
    let out = d.join("model");
    build(&src, &out, o, &mut |_| {}).unwrap();
    (src, out)
}

pub fn options() -> BuildOptions {
    BuildOptions {
        context_buckets: Some(vec![8, 16]),
        batch_buckets: Some(vec![1, 4]),
        max_model_len: Some(32),
        ..Default::default()
    }
}

/// Prompts of the tiny vocabulary (token ids).
pub const PROMPTS: [&[u32]; 3] = [
    &[5, 77, 140, 31, 9],
    &[200, 3, 3, 18, 250, 61, 7, 90, 12, 44, 101],
    &[42],
];
