//! `nrt llm build`: a GGUF decoder → one model directory.
//!
//! ```text
//! DIR/manifest.json      what the directory holds (JSON, below)
//! DIR/weights.bin        every weight once, f32, each at a 64-byte aligned offset
//! DIR/prefill-<L>.ncm    one context-encoding program per context bucket (1 row of L tokens)
//! DIR/decode-<B>.ncm     one token-generation program per batch bucket (B rows of 1 token)
//! DIR/tokenizer.gguf     the source's metadata without its tensors: tokenizer, chat template,
//!                        hyperparameters (read by the same code as the source)
//! ```
//!
//! The programs carry no weights: every weight and each layer's KV cache are inputs that the
//! runner allocates once on the device and binds to every program; the caches are declared
//! in place (NCM 1.10). The directory is written beside its destination and renamed into
//! place when complete, so a failed build leaves nothing half-written.

use crate::gguf::{GgufFile, GgufWriter};
use crate::graph::{self, Head, ProgramShape, WeightSource};
use crate::{Error, GgmlType, LlamaConfig, LlamaTensors, Tokenizer};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use std::path::{Path, PathBuf};

/// The manifest's `format`.
pub const FORMAT: &str = "nrt-llm/1";
/// Alignment of each weight in `weights.bin`.
pub const WEIGHT_ALIGN: u64 = 64;
/// The smallest default context bucket (the Neuron stacks' first bucket).
pub const FIRST_CONTEXT_BUCKET: usize = 128;
/// The default max model length when the option is not given (capped by the training
/// context): what sizes the KV cache.
pub const DEFAULT_MAX_MODEL_LEN: usize = 512;
/// The default batch buckets.
pub const DEFAULT_BATCH_BUCKETS: &[usize] = &[1, 4, 8];
/// The largest batch bucket accepted.
pub const MAX_BATCH: usize = 256;

/// How the weights are stored on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    /// f32 (dequantized from the file).
    F32,
    /// bfloat16.
    Bf16,
    /// int8 per output channel.
    Int8,
    /// 4-bit groups as in the file.
    Q4,
}

impl WeightFormat {
    /// Parses `f32|bf16|int8|q4`.
    pub fn parse(s: &str) -> Result<WeightFormat, String> {
        match s {
            "f32" => Ok(WeightFormat::F32),
            "bf16" => Ok(WeightFormat::Bf16),
            "int8" => Ok(WeightFormat::Int8),
            "q4" => Ok(WeightFormat::Q4),
            _ => Err(format!("--weights {s}: expected f32, bf16, int8 or q4")),
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "f32",
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Int8 => "int8",
            WeightFormat::Q4 => "q4",
        }
    }
}

/// What `nrt llm build` is asked for.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Context (prefill) buckets; `None`: powers of two from 128 up to the max model length,
    /// the max itself included.
    pub context_buckets: Option<Vec<usize>>,
    /// Batch (decode) buckets; `None`: [`DEFAULT_BATCH_BUCKETS`].
    pub batch_buckets: Option<Vec<usize>>,
    /// The longest sequence (prompt + generated); `None`: the largest context bucket given,
    /// else [`DEFAULT_MAX_MODEL_LEN`], capped by the training context.
    pub max_model_len: Option<usize>,
    /// The weights' storage on the device.
    pub weights: WeightFormat,
    /// NeuronCores each program spans (1 or 2).
    pub cores: u32,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            context_buckets: None,
            batch_buckets: None,
            max_model_len: None,
            weights: WeightFormat::F32,
            cores: 1,
        }
    }
}

/// One weight in `weights.bin`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightEntry {
    /// The GGUF name (and the programs' input name).
    pub name: String,
    /// Shape, outermost first.
    pub shape: Vec<usize>,
    /// Byte offset in `weights.bin`.
    pub offset: u64,
    /// Bytes.
    pub bytes: u64,
    /// How it is stored: `F32`, `BF16`, or ggml blocks (`Q4_0`, `Q4_1`, `Q8_0`: rows of
    /// `cols/32` blocks), each read in place by the device kernels. Absent in manifests
    /// before block storage: `F32`.
    #[serde(default = "f32_name", rename = "type")]
    pub ggml_type: String,
    /// Block types: groups of 8 rows interleaved (the `x8` layout of
    /// `nrt_isa::op::BlockFormat`: the same blocks, 8 rows' in one register), so the
    /// device's product computes 8 rows at once. Absent: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interleaved: bool,
}

fn f32_name() -> String {
    "F32".into()
}

impl WeightEntry {
    /// The stored type; `None` for a name that is not `F32` or a block type the device
    /// reads.
    pub fn stored_type(&self) -> Option<GgmlType> {
        match self.ggml_type.as_str() {
            "F32" => Some(GgmlType::F32),
            "Q4_0" => Some(GgmlType::Q4_0),
            "Q4_1" => Some(GgmlType::Q4_1),
            "Q8_0" => Some(GgmlType::Q8_0),
            "BF16" => Some(GgmlType::Bf16),
            _ => None,
        }
    }

    /// The bytes its shape takes in its stored type (`None`: not a known type, or a row
    /// that is not whole blocks, or overflow).
    pub fn expected_bytes(&self) -> Option<u64> {
        let ty = self.stored_type()?;
        let (&cols, rows) = self.shape.split_last()?;
        let rows = rows
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))?;
        ty.row_bytes(cols as u64)?.checked_mul(rows)
    }
}

impl WeightsInfo {
    /// The weights stored in ggml blocks, by name (what the programs read them as).
    pub fn blocks(&self) -> graph::BlockWeights {
        self.tensors
            .iter()
            .filter_map(|w| match w.stored_type() {
                Some(GgmlType::F32) | None => None,
                Some(t) => Some((w.name.clone(), (t, w.interleaved))),
            })
            .collect()
    }
}

/// The weights of a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WeightsInfo {
    /// Storage format.
    pub dtype: WeightFormat,
    /// The file (in the directory).
    pub file: String,
    /// Its size.
    pub bytes: u64,
    /// Each weight, in the programs' input order.
    pub tensors: Vec<WeightEntry>,
}

/// The KV cache's geometry: per layer one key and one value tensor of
/// `[slots, len, kv_heads, head_dim]` f32.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheInfo {
    /// Layers.
    pub layers: usize,
    /// Sequences it holds at once: the largest batch bucket, plus one spare slot that
    /// padding rows write to.
    pub slots: usize,
    /// Positions per slot (the max model length).
    pub len: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Element type.
    pub dtype: String,
    /// Bytes of all layers' keys and values.
    pub bytes: u64,
}

/// One program of a directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramInfo {
    /// `prefill` or `decode`.
    pub phase: String,
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub seq: usize,
    /// The NCM file.
    pub file: String,
}

/// The source file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// Its file name.
    pub file: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
}

/// The model's hyperparameters as the programs use them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfigInfo {
    /// Blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// MLP inner size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Per-head size.
    pub head_dim: usize,
    /// Vocabulary.
    pub vocab_size: usize,
    /// RoPE base.
    pub rope_freq_base: f32,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Training context.
    pub context_length: usize,
    /// LM head tied to the embedding.
    pub tied_embeddings: bool,
}

impl From<&LlamaConfig> for ConfigInfo {
    fn from(c: &LlamaConfig) -> ConfigInfo {
        ConfigInfo {
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            vocab_size: c.vocab_size,
            rope_freq_base: c.rope_freq_base,
            rms_norm_eps: c.rms_norm_eps,
            context_length: c.context_length,
            tied_embeddings: c.tied_embeddings,
        }
    }
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// `general.architecture`.
    pub architecture: String,
    /// `general.name` when the file has one, else the source's stem.
    pub name: String,
    /// Where it came from.
    pub source: SourceInfo,
    /// Hyperparameters.
    pub config: ConfigInfo,
    /// The longest sequence.
    pub max_model_len: usize,
    /// Prefill buckets (increasing).
    pub context_buckets: Vec<usize>,
    /// Decode buckets (increasing).
    pub batch_buckets: Vec<usize>,
    /// NeuronCores per program.
    pub cores: u32,
    /// The weights.
    pub weights: WeightsInfo,
    /// The KV cache.
    pub cache: CacheInfo,
    /// The programs.
    pub programs: Vec<ProgramInfo>,
    /// The tokenizer file.
    pub tokenizer: String,
    /// BOS and EOS ids.
    pub bos: Option<u32>,
    /// EOS id.
    pub eos: Option<u32>,
}

impl Manifest {
    /// Reads `DIR/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, Error> {
        let p = dir.join("manifest.json");
        let text = std::fs::read_to_string(&p)
            .map_err(|e| Error::Unsupported(format!("{}: {e}", p.display())))?;
        let m: Manifest = serde_json::from_str(&text)
            .map_err(|e| Error::Unsupported(format!("{}: {e}", p.display())))?;
        if m.format != FORMAT {
            return Err(Error::Unsupported(format!(
                "{}: format '{}', this build reads '{FORMAT}'",
                p.display(),
                m.format
            )));
        }
        Ok(m)
    }

    /// Checks every size the runner computes from the manifest (a file like any other: a
    /// hostile or damaged one must give an error, not an overflow or a huge allocation).
    pub fn check(&self) -> Result<(), Error> {
        let bad = |what: &str| Error::Unsupported(format!("manifest.json: {what}"));
        let c = &self.config;
        let dims = [
            c.n_layer,
            c.n_embd,
            c.n_ff,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.vocab_size,
        ];
        if dims
            .iter()
            .any(|&d| d == 0 || d as u64 > crate::config::MAX_DIM)
        {
            return Err(bad("a dimension of the configuration is 0 or too large"));
        }
        let k = &self.cache;
        if k.layers != c.n_layer || k.kv_heads != c.n_head_kv || k.head_dim != c.head_dim {
            return Err(bad("the cache geometry does not match the configuration"));
        }
        if k.slots < 2 || k.slots > MAX_BATCH + 1 || k.len == 0 || k.len != self.max_model_len {
            return Err(bad("the cache's slots or length are out of range"));
        }
        let per = [k.slots, k.len, k.kv_heads, k.head_dim, 4]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        let total = per.and_then(|p| p.checked_mul(2 * k.layers as u64));
        if total != Some(k.bytes) {
            return Err(bad("the cache's size does not match its geometry"));
        }
        for p in &self.programs {
            let ok = p.batch >= 1
                && p.batch < k.slots
                && p.seq >= 1
                && p.seq <= k.len
                && (p.batch as u64)
                    .checked_mul(p.seq as u64)
                    .and_then(|n| n.checked_mul(8))
                    .is_some()
                && (p.batch as u64)
                    .checked_mul(c.vocab_size as u64 * 4)
                    .is_some()
                && !p.file.contains('/')
                && !p.file.contains("..");
            if !ok {
                return Err(bad(&format!("program '{}' is out of range", p.file)));
            }
        }
        for w in &self.weights.tensors {
            if w.stored_type().is_none() {
                return Err(bad(&format!(
                    "weight '{}' has type '{}' (F32, BF16, Q4_0, Q4_1 or Q8_0 are read)",
                    w.name, w.ggml_type
                )));
            }
            let rows = w
                .shape
                .iter()
                .rev()
                .skip(1)
                .try_fold(1usize, |a, &d| a.checked_mul(d));
            let blocks = matches!(w.ggml_type.as_str(), "Q4_0" | "Q4_1" | "Q8_0");
            if w.interleaved && (!blocks || !rows.is_some_and(|r| r.is_multiple_of(8))) {
                return Err(bad(&format!(
                    "weight '{}' is marked interleaved but is not rows of blocks in groups of 8",
                    w.name
                )));
            }
            let end = w.offset.checked_add(w.bytes);
            if w.expected_bytes() != Some(w.bytes) || end.is_none_or(|e| e > self.weights.bytes) {
                return Err(bad(&format!("weight '{}' is out of range", w.name)));
            }
        }
        for f in [&self.weights.file, &self.tokenizer] {
            if f.contains('/') || f.contains("..") {
                return Err(bad(&format!("'{f}' is not a file of the directory")));
            }
        }
        Ok(())
    }

    /// The shape program `p` of this directory was built for.
    pub fn program_shape(&self, p: &ProgramInfo) -> ProgramShape {
        ProgramShape {
            batch: p.batch,
            seq: p.seq,
            cache_slots: self.cache.slots,
            cache_len: self.cache.len,
        }
    }

    /// The configuration the programs were built for.
    pub fn llama_config(&self) -> LlamaConfig {
        let c = &self.config;
        LlamaConfig {
            architecture: self.architecture.clone(),
            n_layer: c.n_layer,
            n_embd: c.n_embd,
            n_ff: c.n_ff,
            n_head: c.n_head,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            rope_freq_base: c.rope_freq_base,
            rms_norm_eps: c.rms_norm_eps,
            context_length: c.context_length,
            vocab_size: c.vocab_size,
            tied_embeddings: c.tied_embeddings,
        }
    }
}

/// A step of a build, for a progress display.
#[derive(Clone, Debug)]
pub enum Progress {
    /// `total` steps will follow (weights, then each program).
    Start {
        /// Steps.
        total: usize,
    },
    /// One step is done.
    Step(String),
}

/// The buckets a build will use: `(context, batch, max_model_len)`, checked.
pub fn plan_buckets(
    c: &LlamaConfig,
    o: &BuildOptions,
) -> Result<(Vec<usize>, Vec<usize>, usize), Error> {
    let bad = |why: String| Error::Unsupported(why);
    let increasing = |v: &[usize], what: &str| -> Result<(), Error> {
        if v.is_empty() || v[0] == 0 || v.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad(format!(
                "{what} {v:?}: buckets must be positive and strictly increasing"
            )));
        }
        Ok(())
    };
    if let Some(v) = &o.context_buckets {
        increasing(v, "--context-buckets")?;
    }
    let max_len = match (o.max_model_len, &o.context_buckets) {
        (Some(m), _) => m,
        (None, Some(v)) => *v.last().unwrap_or(&DEFAULT_MAX_MODEL_LEN),
        (None, None) => DEFAULT_MAX_MODEL_LEN.min(c.context_length),
    };
    if max_len == 0 || max_len > c.context_length {
        return Err(bad(format!(
            "--max-model-len {max_len}: the model's context is {} tokens",
            c.context_length
        )));
    }
    let context = match &o.context_buckets {
        Some(v) => {
            if let Some(&l) = v.iter().find(|&&l| l > max_len) {
                return Err(bad(format!(
                    "--context-buckets: bucket {l} is longer than --max-model-len {max_len}"
                )));
            }
            v.clone()
        }
        None => {
            let mut v = Vec::new();
            let mut l = FIRST_CONTEXT_BUCKET;
            while l < max_len {
                v.push(l);
                l *= 2;
            }
            v.push(max_len);
            v
        }
    };
    let batch = o
        .batch_buckets
        .clone()
        .unwrap_or_else(|| DEFAULT_BATCH_BUCKETS.to_vec());
    increasing(&batch, "--batch-buckets")?;
    if let Some(&b) = batch.iter().find(|&&b| b > MAX_BATCH) {
        return Err(bad(format!(
            "--batch-buckets: {b} rows is more than {MAX_BATCH}"
        )));
    }
    Ok((context, batch, max_len))
}

/// Builds `src` (a GGUF file) into `out`. `progress` hears each step.
pub fn build(
    src: &Path,
    out: &Path,
    o: &BuildOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest, Error> {
    if src.extension().is_some_and(|e| e == "onnx") {
        return Err(Error::Unsupported(format!(
            "{}: ONNX decoders (past_key_values/present) are not built yet; pass a .gguf",
            src.display()
        )));
    }
    if !(1..=2).contains(&o.cores) {
        return Err(Error::Unsupported(format!("--cores {}: 1 or 2", o.cores)));
    }
    let file = GgufFile::open(src)?;
    let c = LlamaConfig::from_gguf(&file.gguf)?;
    let tensors = LlamaTensors::from_gguf(&file.gguf, &c)?;
    if let Some(l) = tensors.layers.iter().position(|l| {
        l.attn_q_bias.is_some()
            || l.attn_k_bias.is_some()
            || l.attn_v_bias.is_some()
            || l.attn_output_bias.is_some()
    }) {
        return Err(Error::Unsupported(format!(
            "blk.{l}: attention biases are not built yet"
        )));
    }
    let tok = Tokenizer::from_gguf(&file.gguf)?;
    if tok.vocab_size() != c.vocab_size {
        return Err(Error::Tokenizer(format!(
            "the tokenizer has {} tokens but the embedding {} rows",
            tok.vocab_size(),
            c.vocab_size
        )));
    }
    crate::ChatTemplate::from_gguf(&file.gguf, &tok)?;
    let (context, batch, max_len) = plan_buckets(&c, o)?;
    let slots = batch.last().copied().unwrap_or(1) + 1;
    let cache_len = max_len;
    progress(Progress::Start {
        total: 1 + context.len() + batch.len(),
    });

    // Everything goes into a sibling directory, renamed into place at the end.
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let leaf = out
        .file_name()
        .ok_or_else(|| Error::Unsupported(format!("-o {}: not a directory name", out.display())))?;
    let stage = parent.join(format!(
        ".{}.partial-{}",
        leaf.to_string_lossy(),
        std::process::id()
    ));
    let io =
        |what: &Path, e: std::io::Error| Error::Unsupported(format!("{}: {e}", what.display()));
    if out.exists() && !out.join("manifest.json").is_file() {
        let empty = std::fs::read_dir(out)
            .map_err(|e| io(out, e))?
            .next()
            .is_none();
        if !empty {
            return Err(Error::Unsupported(format!(
                "-o {}: exists and is not a model directory (no manifest.json); \
                 choose another or remove it",
                out.display()
            )));
        }
    }
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage).map_err(|e| io(&stage, e))?;
    let result = (|| -> Result<Manifest, Error> {
        let weights = write_weights(&file, &c, o.weights, &stage.join("weights.bin"))?;
        progress(Progress::Step(format!(
            "weights.bin: {} tensors, {:.1} MB {}",
            weights.tensors.len(),
            weights.bytes as f64 / 1e6,
            o.weights.name()
        )));
        let blocks = weights.blocks();
        let mut programs = Vec::new();
        let mut opts = graph::compile_options(&c, o.cores);
        let shapes = context
            .iter()
            .map(|&l| ("prefill", 1, l))
            .chain(batch.iter().map(|&b| ("decode", b, 1)));
        for (phase, b, l) in shapes {
            let shape = ProgramShape {
                batch: b,
                seq: l,
                cache_slots: slots,
                cache_len,
            };
            let name = if phase == "prefill" {
                format!("prefill-{l}.ncm")
            } else {
                format!("decode-{b}.ncm")
            };
            let m = graph::decoder_graph(
                &c,
                &shape,
                Head::Sample,
                &WeightSource::Inputs(blocks.clone()),
            );
            opts.name = Some(format!(
                "{}-{}",
                leaf.to_string_lossy(),
                name.trim_end_matches(".ncm")
            ));
            let compiled =
                nrt_compiler::compile(&nrt_compiler::onnx::encode_model(&m), None, &opts)
                    .map_err(|e| Error::Unsupported(format!("compiling {name}: {e}")))?;
            let bytes = compiled.model.encode();
            let p = stage.join(&name);
            std::fs::write(&p, bytes).map_err(|e| io(&p, e))?;
            progress(Progress::Step(format!(
                "{name}: {} instructions",
                compiled.report.instructions.iter().flatten().sum::<usize>()
            )));
            programs.push(ProgramInfo {
                phase: phase.into(),
                batch: b,
                seq: l,
                file: name,
            });
        }
        write_tokenizer(&file, &stage.join("tokenizer.gguf"))?;
        let kv = (c.n_head_kv, c.head_dim);
        let cache_bytes = (slots * cache_len * kv.0 * kv.1 * 4 * 2 * c.n_layer) as u64;
        let name = match file.gguf.get("general.name").and_then(|v| v.as_str()) {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => src
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let m = Manifest {
            format: FORMAT.into(),
            architecture: c.architecture.clone(),
            name,
            source: SourceInfo {
                file: src
                    .file_name()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                sha256: hex(&sha2::Sha256::digest(file.bytes())),
            },
            config: ConfigInfo::from(&c),
            max_model_len: max_len,
            context_buckets: context.clone(),
            batch_buckets: batch.clone(),
            cores: o.cores,
            weights,
            cache: CacheInfo {
                layers: c.n_layer,
                slots,
                len: cache_len,
                kv_heads: kv.0,
                head_dim: kv.1,
                dtype: "f32".into(),
                bytes: cache_bytes,
            },
            programs,
            tokenizer: "tokenizer.gguf".into(),
            bos: tok.bos,
            eos: tok.eos,
        };
        let p = stage.join("manifest.json");
        let text =
            serde_json::to_string_pretty(&m).map_err(|e| Error::Unsupported(e.to_string()))?;
        std::fs::write(&p, text + "\n").map_err(|e| io(&p, e))?;
        Ok(m)
    })();
    match result {
        Ok(m) => {
            // Replace an earlier build (a directory with a manifest) or an empty directory.
            if out.exists() {
                let old = parent.join(format!(
                    ".{}.old-{}",
                    leaf.to_string_lossy(),
                    std::process::id()
                ));
                std::fs::rename(out, &old).map_err(|e| io(out, e))?;
                let _ = std::fs::remove_dir_all(&old);
            }
            std::fs::rename(&stage, out).map_err(|e| io(out, e))?;
            Ok(m)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&stage);
            Err(e)
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How weight `name` (GGUF type `src`, `cols` per row, `rank` dimensions) is stored in
/// `format`: f32, or ggml blocks the device multiplies in place. `--weights q4` keeps a
/// matrix already in `Q4_0`, `Q4_1` or `Q8_0` as the file has it (no re-quantization:
/// llama.cpp's Q4_1 files hold the embedding in Q8_0) and quantizes any other to `Q4_1`;
/// `--weights int8` keeps `Q8_0` and quantizes any other to it; `--weights bf16` rounds
/// every matrix to bfloat16 (nearest, ties to even; a `BF16` tensor of the file is kept as
/// it is). Vectors (the norms) and rows that are not whole blocks of 32 stay f32.
pub fn stored_type(format: WeightFormat, src: GgmlType, rank: usize, cols: usize) -> GgmlType {
    if rank < 2 || cols == 0 || !cols.is_multiple_of(32) {
        return GgmlType::F32;
    }
    match (format, src) {
        (WeightFormat::Q4, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) => src,
        (WeightFormat::Q4, _) => GgmlType::Q4_1,
        (WeightFormat::Int8, _) => GgmlType::Q8_0,
        (WeightFormat::Bf16, _) => GgmlType::Bf16,
        (WeightFormat::F32, _) => GgmlType::F32,
    }
}

/// Writes every weight into `path` in [`graph::weights`] order, each in its
/// [`stored_type`].
fn write_weights(
    file: &GgufFile,
    c: &LlamaConfig,
    format: WeightFormat,
    path: &Path,
) -> Result<WeightsInfo, Error> {
    use std::io::Write;
    let io = |e: std::io::Error| Error::Unsupported(format!("{}: {e}", path.display()));
    let f = std::fs::File::create(path).map_err(io)?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let mut at = 0u64;
    let mut entries = Vec::new();
    for (name, shape) in graph::weights(c) {
        let (info, raw) = file
            .tensor(&name)
            .ok_or_else(|| Error::Unsupported(format!("{name}: not in the file")))?;
        let cols = shape.last().copied().unwrap_or(0);
        let ty = stored_type(format, info.ggml_type, shape.len(), cols);
        let pad = at.next_multiple_of(WEIGHT_ALIGN) - at;
        w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        at += pad;
        let block = |q: Option<Vec<u8>>| {
            q.ok_or_else(|| Error::Tensor {
                name: name.clone(),
                why: format!("rows of {cols} are not whole blocks of 32"),
            })
        };
        let b = if ty == info.ggml_type && ty != GgmlType::F32 {
            std::borrow::Cow::Borrowed(raw)
        } else {
            let data = file.tensor_f32(&name)?;
            std::borrow::Cow::Owned(match ty {
                GgmlType::Q4_1 => block(crate::quant::quantize_q4_1(&data))?,
                GgmlType::Q8_0 => block(crate::quant::quantize_q8_0(&data))?,
                GgmlType::Bf16 => data
                    .iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
                _ => data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            })
        };
        // Block rows in groups of 8 are interleaved (the device's 8-row product).
        let rows = shape.iter().rev().skip(1).product::<usize>();
        let x8 = nrt_isa::op::BlockFormat::from_name(ty.name())
            .filter(|_| rows.is_multiple_of(8))
            .and_then(|f| f.interleave(&b, rows, u32::try_from(cols).ok()?));
        let interleaved = x8.is_some();
        let b = x8.map_or(b, std::borrow::Cow::Owned);
        w.write_all(&b).map_err(io)?;
        let bytes = b.len() as u64;
        entries.push(WeightEntry {
            name,
            shape,
            offset: at,
            bytes,
            ggml_type: ty.name().into(),
            interleaved,
        });
        at += bytes;
    }
    w.flush().map_err(io)?;
    Ok(WeightsInfo {
        dtype: format,
        file: "weights.bin".into(),
        bytes: at,
        tensors: entries,
    })
}

/// The source's metadata without tensors (tokenizer, template, hyperparameters).
fn write_tokenizer(file: &GgufFile, path: &Path) -> Result<(), Error> {
    let mut w = GgufWriter::new();
    for (k, v) in file.gguf.metadata() {
        w.kv(k.clone(), v.clone());
    }
    std::fs::write(path, w.to_bytes())
        .map_err(|e| Error::Unsupported(format!("{}: {e}", path.display())))
}

/// Writes the reference graph of program `p` of the directory `dir`: the same decoder with
/// the logits head and the weights as initializers whose data is `weights.bin` itself
/// (ONNX external data, no copy; bf16 weights as `BFLOAT16` initializers widened by the same
/// `Cast` the device programs have), for ONNX Runtime to run beside the device. Returns its
/// path (`DIR/reference-<program>.onnx`).
pub fn export_reference(dir: &Path, m: &Manifest, p: &ProgramInfo) -> Result<PathBuf, Error> {
    if let Some(w) =
        (m.weights.tensors.iter()).find(|w| !matches!(w.ggml_type.as_str(), "F32" | "BF16"))
    {
        return Err(Error::Unsupported(format!(
            "{}: '{}' is stored as {}; the ONNX Runtime reference reads f32 or bf16 weights \
             (build with --weights f32 or bf16 to compare)",
            dir.display(),
            w.name,
            w.ggml_type
        )));
    }
    let c = m.llama_config();
    let shape = m.program_shape(p);
    let offsets = m.weights.tensors.iter().map(|w| w.offset).collect();
    let g = graph::decoder_graph(
        &c,
        &shape,
        Head::Logits,
        &WeightSource::External(m.weights.file.clone(), offsets, m.weights.blocks()),
    );
    let path = dir.join(format!(
        "reference-{}.onnx",
        p.file.trim_end_matches(".ncm")
    ));
    std::fs::write(&path, nrt_compiler::onnx::encode_model(&g))
        .map_err(|e| Error::Unsupported(format!("{}: {e}", path.display())))?;
    Ok(path)
}

/// The directory `src` builds into under `cache` with `o`, built now unless an earlier build
/// with the same source bytes (SHA-256) and options is there: what `nrt.llm.LLM("x.gguf")`
/// loads. The directory's name is the source's stem and a hash of its bytes and the options.
pub fn cached_build(
    src: &Path,
    cache: &Path,
    o: &BuildOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf, Error> {
    let bytes =
        std::fs::read(src).map_err(|e| Error::Unsupported(format!("{}: {e}", src.display())))?;
    let mut h = sha2::Sha256::new();
    h.update(&bytes);
    h.update(format!("{o:?}").as_bytes());
    let key = hex(&h.finalize()[..8]);
    let stem = src
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let dir = cache.join(format!("{stem}-{key}"));
    if Manifest::read(&dir).is_ok_and(|m| m.source.sha256 == hex(&sha2::Sha256::digest(&bytes))) {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache)
        .map_err(|e| Error::Unsupported(format!("{}: {e}", cache.display())))?;
    build(src, &dir, o, progress)?;
    Ok(dir)
}
