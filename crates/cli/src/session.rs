//! What several subcommands share: the device and runtime, compiling or reading a model,
//! tensors between `.pb` files, host values and the device.

use crate::args::{self, CompileOpts};
use nrt_compiler::{CompileOptions, HostTensor, PlanReport};
use nrt_hal::DType;
use nrt_runtime::{
    LoadOptions, Model, Placement, Runtime, RuntimeConfig, Tensor, TensorInfo, TensorSet,
};
use nrt_sim::{SimConfig, SoftDevice};
use std::path::Path;
use std::sync::Arc;

pub type Res<T> = Result<T, String>;

/// The software NeuronCore, configured from the environment (`NRT_SIM_FAULTS`).
pub fn device() -> Res<Arc<SoftDevice>> {
    let cfg = SimConfig::from_env().map_err(|e| e.to_string())?;
    Ok(Arc::new(SoftDevice::new(cfg).map_err(|e| {
        format!("cannot start the software NeuronCore: {e}")
    })?))
}

/// A runtime on a fresh device, configured from the environment unless overridden.
pub fn runtime(config: Option<RuntimeConfig>) -> Res<(Arc<SoftDevice>, Runtime)> {
    nrt_runtime::log::configure_from_env();
    let dev = device()?;
    let cfg = match config {
        Some(c) => c,
        None => RuntimeConfig::from_env().map_err(|e| e.to_string())?,
    };
    let rt = Runtime::init(dev.clone(), cfg).map_err(|e| e.to_string())?;
    Ok((dev, rt))
}

/// The runtime to run `ncm` on: [`runtime`] with the environment's configuration, except that
/// without `NEURON_LOGICAL_NC_CONFIG` the logical core spans as many NeuronCores as the
/// model does (`nrt run --cores 2`, or a two-core NCM, works as in `nrt bench`; the real
/// runtime needs the variable, and a value set there is kept, so a mismatch still fails
/// with its error).
pub fn runtime_for(ncm: &[u8]) -> Res<(Arc<SoftDevice>, Runtime)> {
    runtime_spanning(nrt_model::CompiledModel::core_count(ncm).ok())
}

/// The runtime to run an LLM model directory on: as [`runtime_for`], the logical core
/// spanning the cores its programs were built for (`nrt llm build --cores 2`).
pub fn runtime_for_llm(dir: &std::path::Path) -> Res<(Arc<SoftDevice>, Runtime)> {
    let cores = nrt_llm::build::Manifest::read(dir).ok().map(|m| m.cores);
    runtime_spanning(cores)
}

/// [`runtime`] with the environment's configuration, the logical core widened to `cores`
/// unless `NEURON_LOGICAL_NC_CONFIG` says otherwise.
fn runtime_spanning(cores: Option<u32>) -> Res<(Arc<SoftDevice>, Runtime)> {
    let mut cfg = RuntimeConfig::from_env().map_err(|e| e.to_string())?;
    if std::env::var_os("NEURON_LOGICAL_NC_CONFIG").is_none()
        && let Some(cores) = cores
        && (cores as usize) <= nrt_runtime::MAX_LOCKSTEP_CORES
    {
        cfg.logical_nc = cfg.logical_nc.max(cores);
    }
    runtime(Some(cfg))
}

/// `--input-shape`, `--input-value`, `--cores` as compile options.
pub fn compile_options(a: &CompileOpts) -> Res<CompileOptions> {
    let mut o = CompileOptions::default();
    for s in &a.input_shape {
        let (n, d) = args::name_value(s, "--input-shape")?;
        o.input_shapes.insert(n, args::dims(&d)?);
    }
    for s in &a.input_value {
        let (n, f) = args::name_value(s, "--input-value")?;
        let (_, t) =
            nrt_compiler::read_tensor_pb(Path::new(&f)).map_err(|e| format!("{f}: {e}"))?;
        o.input_values.insert(n, t);
    }
    o.cores = a.cores();
    o.auto_cast = a.cast.auto_cast.into();
    o.auto_cast_type = a.cast.auto_cast_type.into();
    Ok(o)
}

/// A model ready to load: NCM bytes, and the plan report when it was compiled here.
pub struct Prepared {
    pub ncm: Vec<u8>,
    pub report: Option<PlanReport>,
}

/// A spinner on stderr while `what` runs (drawn only when stderr is a terminal).
pub fn spinner(what: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(what);
    bar.enable_steady_tick(std::time::Duration::from_millis(100));
    bar
}

/// A compile error of `path` as the CLI says it: the compiler's text, then how to give what
/// it asks for on this command line.
pub fn compile_error(path: &str, e: &nrt_compiler::CompileError) -> String {
    let mut s = format!("{path}: {e}");
    if let Some(n) = &e.needs_shape_of {
        s.push_str(&format!(
            "; on the command line: `--input-shape {n}=D,D,..`, or an input file (`nrt run --input {n}=FILE`)"
        ));
    }
    if !e.needs_inputs.is_empty() {
        s.push_str(
            "; on the command line: `nrt run --input NAME=FILE` specializes on them, `--input-value NAME=FILE.pb` binds them",
        );
    }
    s
}

/// Compiles an `.onnx` file (a spinner shows while it runs), or reads a compiled model.
pub fn compile_with_progress(path: &str, opts: &CompileOptions) -> Res<nrt_compiler::Compiled> {
    let bar = spinner(format!("compiling {path}"));
    let c = nrt_compiler::compile_file(Path::new(path), opts).map_err(|e| compile_error(path, &e));
    bar.finish_and_clear();
    c
}

/// Compiles an `.onnx` file; when that fails because a value must be known at compile time
/// (`CompileError::needs_inputs`) and `values` holds every graph input it depends on, binds
/// them (`input_values`) and compiles again. Returns the model and the inputs bound.
pub fn compile_specializing(
    path: &str,
    opts: &mut CompileOptions,
    values: &std::collections::HashMap<String, HostTensor>,
) -> Res<(nrt_compiler::Compiled, Vec<String>)> {
    let mut bound = Vec::new();
    loop {
        let bar = spinner(format!("compiling {path}"));
        let r = nrt_compiler::compile_file(Path::new(path), opts);
        bar.finish_and_clear();
        let e = match r {
            Ok(c) => return Ok((c, bound)),
            Err(e) => e,
        };
        let new: Vec<&String> = e
            .needs_inputs
            .iter()
            .filter(|n| !opts.input_values.contains_key(*n))
            .collect();
        if new.is_empty() || !new.iter().all(|n| values.contains_key(*n)) {
            return Err(compile_error(path, &e));
        }
        for n in new {
            opts.input_values.insert(n.clone(), values[n].clone());
            bound.push(n.clone());
        }
    }
}

/// The NCM image of a compiled model, or an error saying it does not fit in memory (its
/// constants' size came from the model file).
pub fn image(m: &nrt_model::CompiledModel) -> Res<Vec<u8>> {
    m.try_encode().map_err(|e| e.to_string())
}

/// Compiles an `.onnx` file, or reads a compiled model.
pub fn prepare(path: &str, opts: &CompileOptions) -> Res<Prepared> {
    if path.ends_with(".onnx") {
        let c = compile_with_progress(path, opts)?;
        Ok(Prepared {
            ncm: image(&c.model)?,
            report: Some(c.report),
        })
    } else {
        let ncm = std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?;
        // Decoded here (and again by the runtime's load) so a bad file is named in the error.
        nrt_model::CompiledModel::decode(&ncm).map_err(|e| format!("{path}: {e}"))?;
        Ok(Prepared { ncm, report: None })
    }
}

pub fn load(rt: &Runtime, ncm: &[u8], vnc: i32) -> Res<Model> {
    rt.load(ncm, vnc, &LoadOptions::default())
        .map_err(|e| e.to_string())
}

/// The input set, the output set, and every (info, tensor) pair of a model.
pub type IoTensors = (TensorSet, TensorSet, Vec<(TensorInfo, Tensor)>);

/// One device tensor per input and output.
pub fn io_tensors(rt: &Runtime, m: &Model) -> Res<IoTensors> {
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let mut all = Vec::new();
    for info in m.tensor_info() {
        let t = rt
            .allocate_tensor(Placement::Device, m.vnc() as i32, info.size, &info.name)
            .map_err(|e| e.to_string())?;
        match info.usage {
            nrt_model::Usage::Input => ins.add(&info.name, &t),
            nrt_model::Usage::Output => outs.add(&info.name, &t),
        }
        all.push((info, t));
    }
    Ok((ins, outs, all))
}

/// A model's inputs for an error message: `'X' f32 [1, 4], 'mask' i64 [1, 8]`.
pub fn describe_inputs(inputs: &[&TensorInfo]) -> String {
    if inputs.is_empty() {
        return "none".to_owned();
    }
    inputs
        .iter()
        .map(|i| format!("'{}' {} {:?}", i.name, i.dtype, i.shape))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The device bytes of input `info` from the tensor `h` read from `file`: refused, naming
/// both shapes, when its shape is not the input's (the same element count in another
/// shape included: the values would land in the wrong places).
pub fn input_file_bytes(file: &str, h: &HostTensor, info: &TensorInfo) -> Res<Vec<u8>> {
    let want: Vec<usize> = info.shape.iter().map(|&d| d as usize).collect();
    let elements = |s: &[usize]| s.iter().product::<usize>();
    if h.shape != want {
        let (got_n, want_n) = (elements(&h.shape), elements(&want));
        return Err(if got_n == want_n {
            format!(
                "{file}: shape {:?} for input '{}', which takes shape {want:?}: the same {want_n} elements in another shape (reshape the array to {want:?})",
                h.shape, info.name
            )
        } else {
            format!(
                "{file}: shape {:?} ({got_n} elements of {}) for input '{}', which takes shape {want:?} ({want_n} elements of {}, {} bytes)",
                h.shape, h.dtype, info.name, info.dtype, info.size
            )
        });
    }
    let b = to_device_bytes(h, info.dtype);
    if b.len() as u64 != info.size {
        return Err(format!(
            "{file}: {} bytes of {} {:?} for input '{}', which takes {} bytes ({} {want:?})",
            b.len(),
            info.dtype,
            h.shape,
            info.name,
            info.size,
            info.dtype
        ));
    }
    Ok(b)
}

/// The device bytes of a host tensor of element type `dtype` (converting the values).
pub fn to_device_bytes(t: &HostTensor, dtype: DType) -> Vec<u8> {
    if t.dtype == dtype {
        t.to_bytes()
    } else {
        t.cast(dtype).to_bytes()
    }
}

/// A host tensor from device bytes.
pub fn from_device_bytes(info: &TensorInfo, bytes: &[u8]) -> Res<HostTensor> {
    let shape: Vec<usize> = info.shape.iter().map(|&d| d as usize).collect();
    from_device_bytes_shaped(info.dtype, shape, bytes)
}

/// A `dtype` host tensor of `shape` from device bytes.
pub fn from_device_bytes_shaped(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Res<HostTensor> {
    HostTensor::from_bytes(dtype, shape, bytes).map_err(|e| e.to_string())
}

/// The suffix of the i64 output holding the actual shape of an output whose extent
/// depends on the data (NonZero, Unique, NonMaxSuppression): `<name>:shape`.
pub const SHAPE_SUFFIX: &str = ":shape";

/// Whether output `name` is the `<output>:shape` companion of another output of the model.
pub fn is_shape_companion(all: &[(TensorInfo, Tensor)], name: &str) -> bool {
    name.strip_suffix(SHAPE_SUFFIX).is_some_and(|base| {
        all.iter()
            .any(|(i, _)| i.name == base && i.usage == nrt_model::Usage::Output)
    })
}

/// Reads output `info` (tensor `t`) of a model whose I/O is `all`: as it is, or, when the
/// model has its `<name>:shape` companion, trimmed to that actual shape (the device writes
/// the actual elements packed first in the static upper bound).
pub fn read_output(all: &[(TensorInfo, Tensor)], info: &TensorInfo, t: &Tensor) -> Res<HostTensor> {
    let (shape, b) = read_output_bytes(all, info, t)?;
    HostTensor::from_bytes(info.dtype, shape, &b).map_err(|e| e.to_string())
}

/// [`read_output`] as the device holds it: the actual shape and the elements' bytes (one
/// copy of the output on the host, read into a buffer reserved fallibly).
pub fn read_output_bytes(
    all: &[(TensorInfo, Tensor)],
    info: &TensorInfo,
    t: &Tensor,
) -> Res<(Vec<usize>, Vec<u8>)> {
    let mut b = Vec::new();
    let size = usize::try_from(info.size).map_err(|_| "output too large".to_string())?;
    b.try_reserve_exact(size).map_err(|_| {
        format!(
            "output '{}': cannot hold its {size} bytes in host memory",
            info.name
        )
    })?;
    b.resize(size, 0);
    t.read(&mut b, 0).map_err(|e| e.to_string())?;
    let companion = format!("{}{SHAPE_SUFFIX}", info.name);
    let Some((si, st)) = all.iter().find(|(i, _)| i.name == companion) else {
        return Ok((info.shape.iter().map(|&d| d as usize).collect(), b));
    };
    let mut sb = vec![0u8; si.size as usize];
    st.read(&mut sb, 0).map_err(|e| e.to_string())?;
    let dims: Vec<i64> = sb
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let bound: u64 = info.shape.iter().map(|&d| d as u64).product();
    let shape: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    let elements = shape
        .as_ref()
        .and_then(|s| s.iter().try_fold(1u64, |p, &d| p.checked_mul(d as u64)));
    match (shape, elements) {
        (Some(shape), Some(n)) if dims.len() == info.shape.len() && n <= bound => {
            b.truncate(n as usize * info.dtype.size());
            Ok((shape, b))
        }
        _ => Err(format!(
            "output '{}': its actual shape {dims:?} ('{companion}') does not fit its bound {:?}",
            info.name, info.shape
        )),
    }
}

/// Deterministic pseudo-random input bytes for a tensor.
pub fn random_bytes(info: &TensorInfo, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let n = (info.size / info.dtype.size() as u64) as usize;
    let shape: Vec<usize> = info.shape.iter().map(|&d| d as usize).collect();
    let t = match info.dtype {
        DType::F32 | DType::F16 | DType::Bf16 | DType::F64 => HostTensor::from_f64s(
            info.dtype,
            shape,
            (0..n).map(|_| ((next() >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0),
        ),
        DType::Bool => {
            HostTensor::from_f64s(info.dtype, shape, (0..n).map(|_| (next() & 1) as f64))
        }
        d => HostTensor::from_f64s(d, shape, (0..n).map(|_| (next() % 4) as f64)),
    };
    t.to_bytes()
}

pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e4 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns >= 1e3 {
        format!("{:.2} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Median and 99th percentile of samples (sorted in place).
pub fn percentiles(v: &mut [u64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_unstable();
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize] as f64;
    (q(0.5), q(0.99))
}
