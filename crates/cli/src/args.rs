//! The command line, declared with clap: one struct per subcommand, the options they share,
//! and the small parsers of option values (`NAME=VALUE`, `1,3,224,224`).

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// nrt — the nrt-rs command line: compile ONNX models, then run, inspect, trace, benchmark
/// and conformance-test them on the software NeuronCore.
#[derive(Debug, Parser)]
#[command(
    name = "nrt",
    version,
    after_help = crate::environment::help(),
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Builds a small transformer block (or CNN) as ONNX, compiles it, runs it, and prints
    /// outputs, the memory plan and a per-stage latency summary.
    Demo(DemoArgs),
    /// Compiles an ONNX model into an NCM file.
    Compile(CompileArgs),
    /// Runs a model once on given (or random) inputs and prints (and writes) its outputs.
    Run(RunArgs),
    /// Prints a model's I/O, memory plan and instruction blocks.
    Inspect(InspectArgs),
    /// Writes Chrome/Perfetto JSON of the five stages of every execution.
    Trace(TraceArgs),
    /// Latency and throughput of the hot path (or one model), with the limits beside.
    Bench(BenchArgs),
    /// Runs ONNX node-test folders (model.onnx + test_data_set_*) against their outputs.
    Conformance(ConformanceArgs),
    /// Starts a runtime, runs one execution, then reports the process's CPU time while it
    /// sits idle (device thread and XU workers parked: expect ~0%).
    Idle(IdleArgs),
    /// Writes the project's own ONNX models (transformer, encoder, cnn, mlp, mlp_b64,
    /// int8_gemm, lstm_step) as DIR/<name>/model.onnx.
    Samples(SamplesArgs),
    /// Lists the virtual host's Neuron devices, their cores and memory, and the processes
    /// that hold them (the `neuron-ls` table, or its JSON with --json-output).
    Ls(LsArgs),
    /// Reports, every period, one JSON object per line in the `neuron-monitor` schema: the
    /// runtimes' execution statistics, memory, core utilization and vCPU use, and the host's;
    /// optionally serves them to Prometheus.
    Monitor(MonitorArgs),
    /// A live terminal view of the runtimes on this host (like `neuron-top`): per-core
    /// utilization, execution rates and errors, memory by category, models per process.
    /// `q` quits.
    Top(TopArgs),
    /// Makes `neuron-ls`, `neuron-monitor` and `neuron-top` in DIR: links to this binary,
    /// which answers under those names as `nrt ls`, `nrt monitor` and `nrt top` (for tools
    /// that look for the real ones by name).
    InstallTools(InstallToolsArgs),
    /// Decoder LLMs: `nrt llm build` a GGUF into a model directory, `nrt llm generate` text.
    Llm(crate::llm::LlmArgs),
    /// Prints a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// The options that fix how an ONNX model is compiled (used wherever a model is given).
#[derive(Debug, Clone, Default, Args)]
pub struct CompileOpts {
    /// An input's shape, for symbolic or -1 dimensions: NAME=D,D,... (repeatable).
    #[arg(long = "input-shape", value_name = "NAME=D,D,..")]
    pub input_shape: Vec<String>,
    /// A constant input's value (folded at compile time): NAME=FILE.pb (repeatable).
    #[arg(long = "input-value", value_name = "NAME=FILE.pb")]
    pub input_value: Vec<String>,
    /// NeuronCores the model spans (its matmuls and convolutions are split across them;
    /// default 1). Running it, the logical core spans as many unless
    /// NEURON_LOGICAL_NC_CONFIG says otherwise.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=2))]
    pub cores: Option<u32>,
    #[command(flatten)]
    pub cast: CastOpts,
}

impl CompileOpts {
    /// NeuronCores to compile for (`--cores`, default 1).
    pub fn cores(&self) -> u32 {
        self.cores.unwrap_or(1)
    }

    /// The compile options given on the command line, as the user spelled them (empty when
    /// none was).
    pub fn given(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        v.extend(
            self.input_shape
                .iter()
                .map(|s| format!("--input-shape {s}")),
        );
        v.extend(
            self.input_value
                .iter()
                .map(|s| format!("--input-value {s}")),
        );
        if let Some(c) = self.cores {
            v.push(format!("--cores {c}"));
        }
        if self.cast.auto_cast != AutoCastArg::None {
            v.push(format!(
                "--auto-cast {}",
                self.cast
                    .auto_cast
                    .to_possible_value()
                    .map_or(String::new(), |p| p.get_name().to_owned())
            ));
        }
        v
    }

    /// Refuses compile options for a model that is not compiled here (an `.ncm`, or a
    /// built-in model): they would be silently ignored.
    pub fn refuse_for_compiled(&self, model: &str) -> Result<(), String> {
        let given = self.given();
        if given.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} {} only when compiling an ONNX model, and {model} is already compiled: its input shapes and core count are fixed in it (`nrt inspect {model}` shows them); recompile the .onnx with {} (`nrt compile MODEL.onnx -o {model} {}`), or pass the .onnx itself",
            given.join(", "),
            if given.len() == 1 { "applies" } else { "apply" },
            if given.len() == 1 { "it" } else { "them" },
            given.join(" ")
        ))
    }
}

/// Reduced-precision compute (the options of `neuronx-cc`).
#[derive(Debug, Clone, Default, Args)]
pub struct CastOpts {
    /// Which operators compute in reduced precision: `matmult` stores MatMul/Gemm constant
    /// weights in the cast type and multiplies them with f32 accumulation (`all`: the same
    /// operators today).
    #[arg(long = "auto-cast", value_enum, default_value_t = AutoCastArg::None)]
    pub auto_cast: AutoCastArg,
    /// The reduced precision: bf16 (AVX-512 BF16 `vdpbf16ps`; activations rounded to bf16
    /// too) or fp16 (weights widened by F16C; activations stay f32).
    #[arg(long = "auto-cast-type", value_enum, default_value_t = CastTypeArg::Bf16)]
    pub auto_cast_type: CastTypeArg,
}

/// `--auto-cast`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum AutoCastArg {
    /// Everything in f32.
    #[default]
    None,
    /// MatMul and Gemm weights.
    Matmult,
    /// As `matmult` (convolutions and elementwise stay f32).
    All,
}

impl From<AutoCastArg> for nrt_compiler::AutoCast {
    fn from(a: AutoCastArg) -> Self {
        match a {
            AutoCastArg::None => nrt_compiler::AutoCast::None,
            AutoCastArg::Matmult => nrt_compiler::AutoCast::MatMult,
            AutoCastArg::All => nrt_compiler::AutoCast::All,
        }
    }
}

/// `--auto-cast-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum CastTypeArg {
    /// bfloat16.
    #[default]
    Bf16,
    /// IEEE half precision.
    Fp16,
}

impl From<CastTypeArg> for nrt_compiler::CastType {
    fn from(a: CastTypeArg) -> Self {
        match a {
            CastTypeArg::Bf16 => nrt_compiler::CastType::Bf16,
            CastTypeArg::Fp16 => nrt_compiler::CastType::Fp16,
        }
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The small CNN instead of the transformer block.
    #[arg(long)]
    pub cnn: bool,
    /// How long the latency summary runs.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub seconds: f64,
}

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The ONNX model.
    pub model: String,
    /// The NCM file to write.
    #[arg(short, long, value_name = "MODEL.ncm")]
    pub output: String,
    #[command(flatten)]
    pub compile: CompileOpts,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The model (.onnx, compiled on the fly, or .ncm).
    pub model: String,
    /// An input's value: NAME=FILE (.pb TensorProto or .npy), repeatable; inputs not given
    /// get random values.
    #[arg(long, value_name = "NAME=FILE")]
    pub input: Vec<String>,
    /// Writes every output there as NAME.pb (and NAME.npy with --npy).
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Also write outputs as .npy (NumPy) files.
    #[arg(long)]
    pub npy: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub compile: CompileOpts,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The model (.onnx or .ncm).
    pub model: String,
    #[command(flatten)]
    pub compile: CompileOpts,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The model (.onnx or .ncm), or `near-null` (the built-in model of `nrt bench`).
    pub model: String,
    /// The JSON file to write.
    #[arg(short, long, default_value = "trace.json")]
    pub output: String,
    /// Executions to trace.
    #[arg(long, default_value_t = 100)]
    pub executions: usize,
    /// Also time every compute and DMA instruction on the device (nested in its engine's
    /// track), and print where the device time went, by opcode.
    #[arg(long)]
    pub instructions: bool,
    #[command(flatten)]
    pub compile: CompileOpts,
}

/// An execution surface of the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Surface {
    /// `nrt_execute`: the whole pipeline on the caller's thread.
    Sync,
    /// `nrt_execute` with NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS: completion on a worker.
    Implicit,
    /// `nrta_execute_schedule` + polling (NRT 3.0).
    Explicit,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A model (.onnx or .ncm) instead of the standard rows.
    pub model: Option<String>,
    /// One surface only.
    #[arg(long, value_enum)]
    pub surface: Option<Surface>,
    /// Executions kept in flight (async surfaces).
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// Threads calling the synchronous surface at once, each with its own tensors (how a
    /// server with concurrent requests, or the Python binding's `submit` pool, drives one
    /// core): their combined throughput, latency, and the process's CPU per execution.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// Seconds per row.
    #[arg(long, default_value_t = 2.0, value_name = "S")]
    pub seconds: f64,
    /// One JSON object per row (line-delimited) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// MatMul GFLOP/s through the device instead.
    #[arg(long)]
    pub gemm: bool,
    #[command(flatten)]
    pub compile: CompileOpts,
}

#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// Folders of node tests (searched recursively).
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Relative tolerance.
    #[arg(long, default_value_t = 1e-4)]
    pub rtol: f64,
    /// Absolute tolerance.
    #[arg(long, default_value_t = 1e-5)]
    pub atol: f64,
    /// Per-test tolerances: lines `TEST RTOL ATOL`.
    #[arg(long, value_name = "FILE")]
    pub tolerances: Option<String>,
    /// Print only failures, unsupported tests and the summary.
    #[arg(long)]
    pub quiet: bool,
    /// Skip (and count) tests that use ops outside the compiler's list.
    #[arg(long)]
    pub only_supported: bool,
    /// Compile with reduced precision (each passing test then notes its largest relative
    /// error against the reference outputs).
    #[command(flatten)]
    pub cast: CastOpts,
    /// NeuronCores each model spans (2: its MatMuls, convolutions and row operations are
    /// split between two cores that synchronize — checks the split and its synchronization).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub cores: u8,
}

#[derive(Debug, Args)]
pub struct IdleArgs {
    /// How long to sit idle.
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    pub seconds: f64,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// One JSON array of devices (neuron-ls's --json-output).
    #[arg(long, short = 'j')]
    pub json_output: bool,
}

#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// A neuron-monitor configuration file (JSON: "period", "neuron_runtimes"[].metrics[].type,
    /// "system_metrics"[].type).
    #[arg(short = 'c', long = "config-file", value_name = "CONFIG")]
    pub config: Option<PathBuf>,
    /// Seconds between reports (overrides the config file; default 5).
    #[arg(long, value_name = "S")]
    pub period: Option<f64>,
    /// Serve the metrics in the Prometheus text format at http://ADDR:PORT/metrics
    /// (e.g. 127.0.0.1:8000; bind to loopback unless the network must scrape it).
    #[arg(long, value_name = "ADDR:PORT")]
    pub prometheus: Option<String>,
    /// Stop after this many reports.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    pub period: f64,
}

#[derive(Debug, Args)]
pub struct InstallToolsArgs {
    /// Where to make the links (created if missing; e.g. ~/.local/bin).
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct SamplesArgs {
    /// Where to write the models.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Splits `name=value`.
pub fn name_value(s: &str, what: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{what} {s:?} is not NAME=VALUE"))
}

/// Parses `1,3,224,224`.
pub fn dims(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("dimension {d:?} in {s:?} is not a number"))
        })
        .collect()
}
