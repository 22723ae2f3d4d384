//! # nrt-compiler — ONNX to NCM
//!
//! Compiles an ONNX model into a [`nrt_model::CompiledModel`] for the software NeuronCore:
//!
//! 1. **import** ([`graph`]): the protobuf is read with hand-transcribed `prost` messages
//!    ([`onnx`]), external data included; symbolic input dimensions are bound from
//!    [`CompileOptions::input_shapes`]; inputs named in [`CompileOptions::input_values`]
//!    become constants (specialization);
//! 2. **shape inference and constant folding** ([`infer`], [`eval`]);
//! 3. the back end, whose stages `pipeline` names in order: dead-node removal; activations
//!    spelled out as arithmetic (GELU) recognized (`fuse`); **lowering** (`lower`): every
//!    node becomes engine instructions — MatMul/Conv on PE, activations on ACT,
//!    elementwise/copies on DVE, reductions/pooling/softmax/layer-norm/resize/gather on
//!    POOL, I/O DMA and notifications on SP; liveness and **memory planning** ([`plan`]):
//!    one scratch arena, offsets by liveness, best fit; **scheduling** ([`schedule`]):
//!    per-engine progress semaphores, waits inserted from every read-after-write,
//!    write-after-read and write-after-write on overlapping bytes, cross-core dependencies
//!    through device-wide semaphores; **emission** with [`nrt_model::ModelBuilder`] and a
//!    decode round trip; the report.
//!
//! Every operator is one entry of the operator table ([`ops`]): its shape inference,
//! folding, device element types and lowering; [`ops::supported_report`] lists it.
//!
//! [`check::check_ordering`] independently verifies a compiled model's synchronization (the
//! tests run it on every model they compile).
//!
//! ```no_run
//! let opts = nrt_compiler::CompileOptions::default();
//! let c = nrt_compiler::compile_file(std::path::Path::new("model.onnx"), &opts).unwrap();
//! std::fs::write("model.ncm", c.model.encode()).unwrap();
//! println!("{}", c.report);
//! ```

pub mod check;
pub mod error;
pub mod eval;
mod fuse;
pub mod graph;
pub mod infer;
mod lower;
pub mod npy;
pub mod onnx;
pub mod ops;
pub(crate) mod params;
mod pipeline;
pub mod plan;
pub mod schedule;
pub mod tensor;
mod widen;

pub use error::{CompileError, ErrorKind, NodeRef};
pub use ops::{OpInfo, out_of_scope_reason, supported_ops, supported_report};
pub use tensor::{
    HostTensor, decode_tensor_pb, encode_tensor_pb, read_tensor_pb, write_tensor_pb,
    write_tensor_pb_raw,
};

use nrt_hal::DType;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::LazyLock;

/// Operators the compiler supports, on the device or folded at compile time (sorted; from
/// the operator table, [`ops`]).
pub static SUPPORTED_OPS: LazyLock<Vec<&'static str>> = LazyLock::new(ops::supported_ops);

/// Operators computed only at compile time: a model where their inputs are not constants
/// is rejected as unsupported.
pub static FOLD_ONLY_OPS: LazyLock<Vec<&'static str>> = LazyLock::new(ops::fold_only_ops);

/// How to compile.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Shapes of inputs, by name: binds symbolic dimensions (and must agree with fixed ones).
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    /// Values of inputs, by name: those inputs become compile-time constants (and are no
    /// longer inputs of the compiled model). Use it for inputs that decide shapes.
    pub input_values: BTreeMap<String, HostTensor>,
    /// Cores the model runs on in lockstep (1 or 2).
    pub cores: u32,
    /// Model name written into the container (default: the graph's name).
    pub name: Option<String>,
    /// Which operators compute in reduced precision (`--auto-cast`).
    pub auto_cast: AutoCast,
    /// The reduced precision (`--auto-cast-type`).
    pub auto_cast_type: CastType,
    /// In-place state, output name → input name: each output is a `ScatterND` into the
    /// input (its only reader), of the same type and shape. The compiled model declares the
    /// pair (NCM 1.10), the caller binds one tensor to both, and the program writes only the
    /// scattered rows — a decoder's KV cache updated without copying it.
    pub in_place: BTreeMap<String, String>,
}

/// What `nrt compile --auto-cast` casts to reduced precision (the option names of the
/// Neuron compiler, `neuronx-cc --auto-cast`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AutoCast {
    /// Everything stays f32.
    #[default]
    None,
    /// MatMul and Gemm whose B is a constant 2-D f32 weight: the weight is stored in the
    /// cast type (half the bytes), the product accumulates in f32; with bf16 the device
    /// rounds A to bf16 too (`vdpbf16ps`), with fp16 A stays f32 (B widened by F16C).
    MatMult,
    /// Today the same operators as `MatMult` (convolutions and elementwise operators stay
    /// f32).
    All,
}

/// The reduced precision of [`AutoCast`] (`--auto-cast-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CastType {
    /// bfloat16 (8-bit significand).
    #[default]
    Bf16,
    /// IEEE binary16 (11-bit significand, range ±65504: weights beyond it become ±inf).
    Fp16,
}

impl CastType {
    /// The element type.
    pub fn dtype(self) -> DType {
        match self {
            CastType::Bf16 => DType::Bf16,
            CastType::Fp16 => DType::F16,
        }
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            input_shapes: BTreeMap::new(),
            input_values: BTreeMap::new(),
            cores: 1,
            name: None,
            auto_cast: AutoCast::None,
            auto_cast_type: CastType::Bf16,
            in_place: BTreeMap::new(),
        }
    }
}

/// What the compiler produced and how it planned memory.
#[derive(Clone, Debug)]
pub struct PlanReport {
    /// Entries of the static memory plan.
    pub mem_refs: usize,
    /// Bytes of the scratch arena.
    pub arena_bytes: u64,
    /// Lower bound of the arena: the largest total of intermediates live at one time.
    pub live_bytes_lower_bound: u64,
    /// Bytes of constant data.
    pub constant_bytes: u64,
    /// Instructions per core per engine (index: [`nrt_hal::Engine::index`]), `End` excluded.
    pub instructions: Vec<[usize; nrt_hal::NUM_ENGINES]>,
    /// Inputs turned into constants by [`CompileOptions::input_values`].
    pub specialized_inputs: Vec<String>,
    /// Nodes in the model / nodes folded at compile time / nodes lowered to the device.
    pub nodes: (usize, usize, usize),
}

impl PlanReport {
    /// `arena_bytes / live_bytes_lower_bound` (1.0 when nothing is live).
    pub fn arena_ratio(&self) -> f64 {
        if self.live_bytes_lower_bound == 0 {
            1.0
        } else {
            self.arena_bytes as f64 / self.live_bytes_lower_bound as f64
        }
    }
}

impl fmt::Display for PlanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "nodes: {} ({} folded, {} lowered)",
            self.nodes.0, self.nodes.1, self.nodes.2
        )?;
        writeln!(
            f,
            "arena: {} bytes (live lower bound {}, ratio {:.3}); constants: {} bytes; plan entries: {}",
            self.arena_bytes,
            self.live_bytes_lower_bound,
            self.arena_ratio(),
            self.constant_bytes,
            self.mem_refs
        )?;
        for (c, e) in self.instructions.iter().enumerate() {
            writeln!(
                f,
                "core {c}: PE {} ACT {} POOL {} DVE {} SP {}",
                e[0], e[1], e[2], e[3], e[4]
            )?;
        }
        if !self.specialized_inputs.is_empty() {
            writeln!(
                f,
                "specialized inputs: {}",
                self.specialized_inputs.join(", ")
            )?;
        }
        Ok(())
    }
}

/// A compiled model and its report.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The model (already validated by a decode round trip).
    pub model: nrt_model::CompiledModel,
    /// How memory was planned.
    pub report: PlanReport,
}

/// Compiles ONNX model bytes. `model_dir` is where external data files are looked up.
pub fn compile(
    onnx_bytes: &[u8],
    model_dir: Option<&Path>,
    opts: &CompileOptions,
) -> Result<Compiled, CompileError> {
    if !(1..=2).contains(&opts.cores) {
        return Err(CompileError::new(
            ErrorKind::BadOption,
            format!("cores = {} (1 or 2 are supported)", opts.cores),
        ));
    }
    // The cap on host memory that the compiler's large allocations respect: a value that is
    // not a size is an error here rather than no cap there.
    nrt_hal::host_memory::memory_cap_from_env()
        .map_err(|e| CompileError::new(ErrorKind::BadOption, e))?;
    let mut g = graph::import(onnx_bytes, model_dir, opts)?;
    infer::infer(&mut g)?;
    pipeline::compile_graph(&g, opts)
}

/// Compiles an ONNX file (external data relative to its directory).
pub fn compile_file(path: &Path, opts: &CompileOptions) -> Result<Compiled, CompileError> {
    let bytes = std::fs::read(path).map_err(|e| {
        CompileError::new(ErrorKind::Io, format!("reading {}: {e}", path.display()))
    })?;
    compile(&bytes, path.parent(), opts)
}

/// The operator types a model uses (sorted, deduplicated), e.g. to decide whether a test
/// is in scope before compiling it.
pub fn model_op_types(onnx_bytes: &[u8]) -> Result<Vec<String>, CompileError> {
    let m = onnx::decode_model(onnx_bytes).map_err(|e| {
        CompileError::new(ErrorKind::Decode, format!("not a valid ONNX model: {e}"))
    })?;
    // Operators of subgraphs (an If's branches) count too.
    fn collect(g: &onnx::GraphProto, ops: &mut Vec<String>) {
        use prost::Message;
        for n in &g.node {
            ops.push(n.op_type.clone());
            for a in &n.attribute {
                if let Some(Ok(sub)) = a.g.as_deref().map(onnx::GraphProto::decode) {
                    collect(&sub, ops);
                }
            }
        }
    }
    let mut ops = Vec::new();
    if let Some(g) = &m.graph {
        collect(g, &mut ops);
    }
    ops.sort();
    ops.dedup();
    Ok(ops)
}

/// The first operator of `ops` that the compiler does not support, if any.
pub fn first_unsupported_op(ops: &[String]) -> Option<&str> {
    ops.iter()
        .map(|s| s.as_str())
        .find(|o| ops::get(o).is_none())
}
