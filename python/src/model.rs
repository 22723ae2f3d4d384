//! `Model`: a model loaded on the process-global runtime. Loading (compiling an `.onnx` path
//! first), the Python methods (`run`, `reset`, `unload`, `benchmark`, the getters), checking a
//! call's inputs against the model's, and its outputs as numpy arrays (data-dependent ones
//! trimmed to their actual shape). How an execution runs is in [`crate::exec`].

use crate::arrays::{contiguous, data_ptr, dtype_name, nbytes, new_array, shape_str};
use crate::compile::{Source, compile_path, shapes_opt};
use crate::error::{from_rt, invalid, model_err, nrt_err};
use crate::exec::{INTERRUPTIBLE, Pools, Src, on_main_thread};
use crate::lock;
use crate::runtime::{Global, global};
use crate::tensor::{Tensor, TensorInfo};
use nrt_hal::NrtStatus;
use nrt_runtime::{LoadOptions, Model as RtModel, NrtError as RtError, Placement, TensorSet};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A model loaded on the process-global runtime. Call it with a dict of numpy arrays (or
/// nrt.Tensor) keyed by input name; it returns a dict of numpy arrays keyed by output name.
///
/// Dropping the last reference unloads it (as a file object closes), unless `unload()` or
/// `nrt.close()` did already.
#[pyclass(frozen, module = "nrt", name = "Model")]
pub(crate) struct Model {
    /// The three runtime-bound fields are dropped only in the process that loaded the model
    /// (a fork child leaks them: see [`Global`]).
    pub(crate) g: ManuallyDrop<Arc<Global>>,
    pub(crate) m: ManuallyDrop<RtModel>,
    pub(crate) inputs: Vec<Py<TensorInfo>>,
    pub(crate) outputs: Vec<Py<TensorInfo>>,
    source: String,
    pub(crate) pool: ManuallyDrop<Mutex<Pools>>,
}

impl Drop for Model {
    fn drop(&mut self) {
        if self.g.pid != std::process::id() {
            // A fork child: the parent's runtime is never touched here; its handles leak.
            return;
        }
        if self.m.is_loaded() && self.g.rt.is_open() {
            // Dropped with the GIL held (the object's deallocation); an unload waits for the
            // model's executions in flight, so it runs without the GIL. Errors (a concurrent
            // close) leave nothing to do.
            let (g, m) = (&**self.g, &*self.m);
            let _ = Python::with_gil(|py| py.allow_threads(|| g.rt.unload(m)));
            self.g.forget_name(self.m.id());
        }
        // SAFETY: each field is dropped once, here, and not used again; the pool's tensors
        // (which reference the runtime) go before the runtime's last handle.
        unsafe {
            ManuallyDrop::drop(&mut self.pool);
            ManuallyDrop::drop(&mut self.m);
            ManuallyDrop::drop(&mut self.g);
        }
    }
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("model", &self.m)
            .field("source", &self.source)
            .finish()
    }
}

#[pymethods]
impl Model {
    /// Loads a model on logical core `core` (counted among this process's visible cores).
    /// An `.onnx` file is compiled for `cores` cores first (binding symbolic dims from
    /// `input_shapes`); any other path (or bytes) is a compiled model (NCM), which must span
    /// exactly `cores` cores. `timeout` (seconds) bounds each execution (default:
    /// NEURON_RT_EXEC_TIMEOUT, else 30 s).
    #[staticmethod]
    #[pyo3(signature = (path, core=0, cores=1, *, input_shapes=None, timeout=None))]
    fn load(
        py: Python<'_>,
        path: Source,
        core: u32,
        cores: u32,
        input_shapes: Option<BTreeMap<String, Vec<usize>>>,
        timeout: Option<f64>,
    ) -> PyResult<Model> {
        let g = global(py)?;
        let shapes = shapes_opt(input_shapes);
        let (ncm, source) = match path {
            Source::Bytes(b) => (b, "<bytes>".to_string()),
            Source::Path(p) => {
                crate::error::check_exists(&p)?;
                let shown = p.display().to_string();
                let is_onnx = p
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
                let bytes = if is_onnx {
                    py.allow_threads(|| compile_path(&p, shapes, cores))
                        .map_err(from_rt)?
                } else {
                    std::fs::read(&p)
                        .map_err(|e| nrt_err(NrtStatus::Invalid, format!("reading {shown}: {e}")))?
                };
                (bytes, shown)
            }
        };
        let decoded = nrt_model::CompiledModel::decode(&ncm)
            .map_err(|e| invalid(format!("{source}: not a compiled model: {e}")))?;
        if decoded.sg_count != cores {
            return Err(invalid(format!(
                "{source}: model '{}' was compiled for {} core(s); Model.load was asked for \
                 cores={cores} (recompile it, or pass cores={})",
                decoded.name, decoded.sg_count, decoded.sg_count
            )));
        }
        drop(decoded);
        let opts = LoadOptions {
            exec_timeout: timeout.map(exec_timeout).transpose()?,
            ..Default::default()
        };
        let vnc = i32::try_from(core).map_err(|_| invalid(format!("core={core}")))?;
        let m = py
            .allow_threads(|| g.rt.load(&ncm, vnc, &opts))
            .map_err(|e| nrt_err(e.status, format!("{source}: {}", e.message)))?;
        lock(&g.names).insert(m.id(), (m.name().to_owned(), true));
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for i in m.tensor_info() {
            let info = Py::new(py, TensorInfo::from_rt(py, &i)?)?;
            match i.usage {
                nrt_model::Usage::Input => inputs.push(info),
                nrt_model::Usage::Output => outputs.push(info),
            }
        }
        Ok(Model {
            g: ManuallyDrop::new(g),
            m: ManuallyDrop::new(m),
            inputs,
            outputs,
            source,
            pool: ManuallyDrop::new(Mutex::new(Pools::default())),
        })
    }

    /// The inputs, in the model's order.
    #[getter]
    fn inputs(&self, py: Python<'_>) -> Vec<Py<TensorInfo>> {
        self.inputs.iter().map(|i| i.clone_ref(py)).collect()
    }
    /// The outputs, in the model's order.
    #[getter]
    fn outputs(&self, py: Python<'_>) -> Vec<Py<TensorInfo>> {
        self.outputs.iter().map(|i| i.clone_ref(py)).collect()
    }
    /// The model's name.
    #[getter]
    fn name(&self) -> &str {
        self.m.name()
    }
    /// The logical core it is loaded on.
    #[getter]
    fn core(&self) -> u32 {
        self.m.vnc()
    }
    /// How many cores it spans.
    #[getter]
    fn cores(&self) -> u32 {
        self.m.core_count()
    }
    /// Whether it is still loaded (False after unload() or nrt.close()).
    #[getter]
    fn loaded(&self) -> bool {
        self.g.pid == std::process::id() && self.m.is_loaded() && self.g.rt.is_open()
    }

    /// Runs the model: `inputs` maps every input name to a numpy array (or nrt.Tensor);
    /// returns a dict of new numpy arrays, one per output. The GIL is released while it runs.
    fn run<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.run_impl(py, inputs)
    }

    /// Same as run().
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.run_impl(py, inputs)
    }

    /// Resets the model's core after a fatal device error (NRT_EXEC_UNIT_UNRECOVERABLE).
    /// Raises NrtError (NRT_INVALID) once the model is unloaded.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.check_owner()?;
        if !self.m.is_loaded() {
            return Err(invalid(format!(
                "model '{}' is unloaded; reset() resets the core of a loaded model (nrt.reset(core) \
                 resets a core by number)",
                self.m.name()
            )));
        }
        py.allow_threads(|| self.g.rt.reset_vnc(self.m.vnc()))
            .map_err(|e| model_err(self.m.name(), e))
    }

    /// Unloads the model; later calls raise NrtError (NRT_INVALID). Dropping the last
    /// reference to a model unloads it too.
    fn unload(&self, py: Python<'_>) -> PyResult<()> {
        self.check_owner()?;
        py.allow_threads(|| self.g.rt.unload(&self.m))
            .map_err(|e| model_err(self.m.name(), e))?;
        self.g.forget_name(self.m.id());
        Ok(())
    }

    /// Times `iterations` executions after `warmup` untimed ones. mode="host": each call is
    /// a full `m(inputs)` (numpy in, numpy out); mode="device": executions on pre-allocated
    /// device tensors (what `nrt bench` measures). `inputs` defaults to zeros. Returns
    /// {mean, min, max, std, p50, p99, per_iteration} in microseconds.
    #[pyo3(signature = (warmup=100, iterations=1000, mode="host", inputs=None))]
    fn benchmark<'py>(
        &self,
        py: Python<'py>,
        warmup: usize,
        iterations: usize,
        mode: &str,
        inputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.check_owner()?;
        if iterations == 0 {
            return Err(invalid("benchmark(): iterations must be >= 1"));
        }
        let feeds = match inputs {
            Some(d) => d.clone(),
            None => {
                let d = PyDict::new(py);
                for i in &self.inputs {
                    let i = i.get();
                    let a = new_array(py, i.dtype.bind(py), &i.shape)?;
                    // SAFETY: a fresh array of exactly `nbytes` bytes.
                    unsafe { std::ptr::write_bytes(data_ptr(&a), 0, nbytes(&a)) };
                    d.set_item(&i.name, a)?;
                }
                d
            }
        };
        let mut times: Vec<u64> = Vec::with_capacity(iterations);
        match mode {
            "host" => {
                for k in 0..warmup + iterations {
                    let t0 = Instant::now();
                    self.run_impl(py, &feeds)?;
                    if k >= warmup {
                        times.push(t0.elapsed().as_nanos() as u64);
                    }
                }
            }
            "device" => {
                let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
                let vnc = self.m.vnc() as i32;
                for i in self.inputs.iter().chain(&self.outputs) {
                    let i = i.get();
                    let t = self
                        .g
                        .rt
                        .allocate_tensor(Placement::Device, vnc, i.size, &i.name)
                        .map_err(from_rt)?;
                    if let Some(v) = feeds.get_item(&i.name)? {
                        let a = contiguous(py, &v)?;
                        if nbytes(&a) as u64 != i.size {
                            return Err(invalid(format!(
                                "benchmark(): input '{}' is {} bytes; the model expects {}",
                                i.name,
                                nbytes(&a),
                                i.size
                            )));
                        }
                        // SAFETY: `a` is a live C-contiguous array of that many bytes.
                        let b = unsafe { std::slice::from_raw_parts(data_ptr(&a), nbytes(&a)) };
                        t.write(b, 0).map_err(from_rt)?;
                        ins.add(&i.name, &t);
                    } else {
                        outs.add(&i.name, &t);
                    }
                }
                let rt = &self.g.rt;
                let m = &self.m;
                py.allow_threads(|| -> Result<(), RtError> {
                    for k in 0..warmup + iterations {
                        let t0 = Instant::now();
                        rt.execute(m, &ins, &outs)?;
                        if k >= warmup {
                            times.push(t0.elapsed().as_nanos() as u64);
                        }
                    }
                    Ok(())
                })
                .map_err(|e| model_err(self.m.name(), e))?;
            }
            other => {
                return Err(invalid(format!(
                    "benchmark(): mode={other:?} (\"host\" or \"device\")"
                )));
            }
        }
        stats(py, &times, mode)
    }

    fn __repr__(&self) -> String {
        format!(
            "Model(name={:?}, source={:?}, core={}, cores={}, inputs={}, outputs={})",
            self.m.name(),
            self.source,
            self.m.vnc(),
            self.m.core_count(),
            self.inputs.len(),
            self.outputs.len()
        )
    }
}

fn stats<'py>(py: Python<'py>, ns: &[u64], mode: &str) -> PyResult<Bound<'py, PyDict>> {
    let us: Vec<f64> = ns.iter().map(|&n| n as f64 / 1e3).collect();
    let mut sorted = us.clone();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let mean = sorted.iter().sum::<f64>() / n;
    let var = sorted.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    let d = PyDict::new(py);
    d.set_item("mean", mean)?;
    d.set_item("min", sorted[0])?;
    d.set_item("max", sorted[sorted.len() - 1])?;
    d.set_item("std", var.sqrt())?;
    d.set_item("p50", q(0.5))?;
    d.set_item("p99", q(0.99))?;
    d.set_item("per_iteration", PyList::new(py, &us)?)?;
    d.set_item("unit", "us")?;
    d.set_item("mode", mode)?;
    d.set_item("iterations", ns.len())?;
    Ok(d)
}

/// A `timeout=` in seconds as the execution timeout: finite, positive and representable
/// (`Duration::from_secs_f64` panics past ~1.8e19 s).
fn exec_timeout(s: f64) -> PyResult<Duration> {
    if !(s.is_finite() && s > 0.0) {
        return Err(invalid(format!("timeout={s} (seconds, > 0)")));
    }
    Duration::try_from_secs_f64(s).map_err(|e| invalid(format!("timeout={s} (seconds, > 0): {e}")))
}

impl Model {
    /// `Ok` in the process that loaded the model; in a fork child, the error saying so.
    fn check_owner(&self) -> PyResult<()> {
        self.g
            .check_owner(|| format!("model '{}' ({})", self.m.name(), self.source))
    }

    /// Checks one input value and returns where its bytes are.
    fn input_src<'py>(
        &self,
        py: Python<'py>,
        info: &TensorInfo,
        v: &Bound<'py, PyAny>,
    ) -> PyResult<Src<'py>> {
        let model = self.m.name();
        if let Ok(t) = v.downcast::<Tensor>() {
            let t = t.get();
            t.check_owner()?;
            if t.t.size() != info.size
                || t.shape != info.shape
                || !info.accepts(py, t.dtype.bind(py))
            {
                return Err(invalid(format!(
                    "input '{}' of model '{model}': nrt.Tensor '{}' is {} {} ({} bytes); the \
                     model expects {} {} ({} bytes)",
                    info.name,
                    t.t.name(),
                    shape_str(&t.shape),
                    dtype_name(t.dtype.bind(py)),
                    t.t.size(),
                    shape_str(&info.shape),
                    dtype_name(info.dtype.bind(py)),
                    info.size
                )));
            }
            if t.core != self.m.vnc() {
                return Err(invalid(format!(
                    "input '{}' of model '{model}': nrt.Tensor '{}' lives on core {}; the model \
                     runs on core {}",
                    info.name,
                    t.t.name(),
                    t.core,
                    self.m.vnc()
                )));
            }
            return Ok(Src::Device((*t.t).clone()));
        }
        let a = match v.downcast::<PyUntypedArray>() {
            Ok(a) => {
                if !info.accepts(py, &a.dtype()) {
                    return Err(invalid(format!(
                        "input '{}' of model '{model}' has dtype {}; the model expects {}",
                        info.name,
                        dtype_name(&a.dtype()),
                        dtype_name(info.dtype.bind(py))
                    )));
                }
                a.clone()
            }
            Err(_) => {
                // Lists, scalars, other array-likes: converted to the model's dtype (a copy).
                let np = py.import("numpy")?;
                np.call_method1("asarray", (v, info.dtype.bind(py)))
                    .map_err(|e| {
                        invalid(format!(
                            "input '{}' of model '{model}': cannot convert {} to a {} array: {e}",
                            info.name,
                            v.get_type()
                                .name()
                                .map(|n| n.to_string())
                                .unwrap_or_default(),
                            dtype_name(info.dtype.bind(py))
                        ))
                    })?
                    .downcast_into::<PyUntypedArray>()?
            }
        };
        if a.shape() != info.shape.as_slice() {
            return Err(invalid(format!(
                "input '{}' of model '{model}' has shape {}; the model expects {}",
                info.name,
                shape_str(a.shape()),
                shape_str(&info.shape)
            )));
        }
        // Non-C-contiguous (strided, Fortran-ordered, views): one copy here.
        let a = if a.is_c_contiguous() {
            a
        } else {
            contiguous(py, a.as_any())?
        };
        Ok(Src::Host(a))
    }

    fn run_impl<'py>(
        &self,
        py: Python<'py>,
        inputs: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.check_owner()?;
        let model = self.m.name();
        if inputs.len() > self.inputs.len() {
            for k in inputs.keys() {
                let k: String = k.str()?.to_string();
                if !self.inputs.iter().any(|i| i.get().name == k) {
                    return Err(invalid(format!(
                        "model '{model}' has no input named '{k}' (inputs: {})",
                        self.input_names()
                    )));
                }
            }
        }
        let mut srcs: Vec<Src<'py>> = Vec::with_capacity(self.inputs.len());
        for i in &self.inputs {
            let i = i.get();
            let v = match inputs.get_item(&i.name)? {
                Some(v) => v,
                None => {
                    // An unknown name is the likelier mistake than a missing one: say so.
                    for k in inputs.keys() {
                        let k: String = k.str()?.to_string();
                        if !self.inputs.iter().any(|x| x.get().name == k) {
                            return Err(invalid(format!(
                                "model '{model}' has no input named '{k}' (inputs: {})",
                                self.input_names()
                            )));
                        }
                    }
                    return Err(invalid(format!(
                        "input '{}' of model '{model}' is missing (inputs: {})",
                        i.name,
                        self.input_names()
                    )));
                }
            };
            srcs.push(self.input_src(py, i, &v)?);
        }
        let mut outs: Vec<Bound<'py, PyUntypedArray>> = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            let o = o.get();
            outs.push(new_array(py, o.dtype.bind(py), &o.shape)?);
        }
        // Signals (Ctrl-C) are handled on the main thread only, and only between waits:
        // there, the execution is waited for in slices (explicit surface). Elsewhere, and
        // while a trace records the sync surface's stages, the sync surface.
        let result = if INTERRUPTIBLE.load(Ordering::Relaxed)
            && on_main_thread()
            && !self.g.tracing.load(Ordering::Relaxed)
        {
            self.run_interruptible(py, &srcs, &outs)?
        } else {
            self.run_sync(py, &srcs, &outs)
        };
        result.map_err(|e| model_err(model, e))?;
        // An output whose extent depends on the data (NonZero, Unique, NonMaxSuppression)
        // comes back trimmed to the actual shape its `<name>:shape` companion holds; the
        // companion is not a result of its own.
        let names: Vec<&str> = self.outputs.iter().map(|o| o.get().name.as_str()).collect();
        let d = PyDict::new(py);
        for (o, a) in self.outputs.iter().zip(&outs) {
            let name = o.get().name.as_str();
            if name
                .strip_suffix(SHAPE_SUFFIX)
                .is_some_and(|base| names.contains(&base))
            {
                continue;
            }
            let companion = format!("{name}{SHAPE_SUFFIX}");
            match names.iter().position(|n| *n == companion) {
                Some(j) => d.set_item(name, trimmed(a, &outs[j], name)?)?,
                None => d.set_item(name, a)?,
            }
        }
        Ok(d)
    }

    fn input_names(&self) -> String {
        self.inputs
            .iter()
            .map(|i| format!("'{}'", i.get().name))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The suffix of the i64 output holding the actual shape of an output whose extent depends
/// on the data: `<name>:shape`.
const SHAPE_SUFFIX: &str = ":shape";

/// `a` (an output at its static upper bound, the actual elements packed first) trimmed to
/// the actual shape held by `shape`: a fresh array.
fn trimmed<'py>(
    a: &Bound<'py, PyUntypedArray>,
    shape: &Bound<'py, PyUntypedArray>,
    name: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let dims: Vec<i64> = shape.call_method0("tolist")?.extract()?;
    let n = dims.iter().try_fold(1u64, |p, &d| {
        u64::try_from(d).ok().and_then(|d| p.checked_mul(d))
    });
    match n {
        Some(n) if dims.len() == a.ndim() && n <= a.len() as u64 => a
            .call_method1("reshape", (-1,))?
            .get_item(pyo3::types::PySlice::new(a.py(), 0, n as isize, 1))?
            .call_method1("reshape", (PyTuple::new(a.py(), &dims)?,))?
            .call_method0("copy"),
        _ => Err(invalid(format!(
            "output '{name}': its actual shape {dims:?} does not fit its bound {:?}",
            a.shape()
        ))),
    }
}
