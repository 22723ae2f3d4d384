//! `nrt._nrt`: the native half of the `nrt` Python package (see `python/nrt/__init__.py` for
//! the public surface and `python/nrt/__init__.pyi` for the types).
//!
//! One process-global runtime on one software NeuronCore device, created on first use from
//! the environment (`NEURON_RT_VISIBLE_CORES`, `NEURON_RT_NUM_CORES`,
//! `NEURON_LOGICAL_NC_CONFIG`, `NEURON_RT_LOG_LEVEL`, `NRT_SIM_FAULTS`) unless `configure()`
//! said otherwise first. Every execution releases the GIL from bind to harvest; numpy inputs
//! that are C-contiguous and of the model's dtype are handed to the runtime as host tensors
//! over the array's own buffer (no copy in this layer; the runtime's synchronous surface
//! stages host inputs into device memory as it does for every host tensor), and outputs are
//! written by the runtime straight into freshly allocated numpy arrays.

use nrt_compiler::CompileOptions;
use nrt_hal::{DType, NrtStatus};
use nrt_runtime::log::{Level, Module};
use nrt_runtime::{
    LoadOptions, Model as RtModel, NrtError as RtError, Placement, Runtime, RuntimeConfig,
    Tensor as RtTensor, TensorSet,
};
use nrt_sim::{SimConfig, SoftDevice};
use numpy::npyffi::{NpyTypes, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pyo3::create_exception!(
    nrt,
    NrtError,
    PyRuntimeError,
    "A runtime call failed. `.status` is the NRT_STATUS code (int), `.status_name` its name \
     (\"NRT_TIMEOUT\", ...), `.message` the text without the status prefix."
);

//===------------------------------------------------------------------------------------===//
// Errors
//===------------------------------------------------------------------------------------===//

/// An `NrtError` carrying `status`, with `.status`, `.status_name` and `.message` set.
fn nrt_err(status: NrtStatus, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::with_gil(|py| {
        let e = NrtError::new_err(format!("{}: {message}", status.as_str()));
        let v = e.value(py);
        // Setting attributes on a fresh exception instance cannot fail (it has a __dict__);
        // if it somehow did, the exception is still raised, without the attribute.
        let _ = v.setattr("status", status as i32);
        let _ = v.setattr("status_name", status.as_str());
        let _ = v.setattr("message", message);
        e
    })
}

fn from_rt(e: RtError) -> PyErr {
    nrt_err(e.status, e.message)
}

/// A runtime error about model `name`, with the model named if the message does not.
fn model_err(name: &str, e: RtError) -> PyErr {
    if e.message.contains(&format!("'{name}'")) {
        from_rt(e)
    } else {
        nrt_err(e.status, format!("model '{name}': {}", e.message))
    }
}

fn invalid(message: impl Into<String>) -> PyErr {
    nrt_err(NrtStatus::Invalid, message)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

//===------------------------------------------------------------------------------------===//
// The process-global runtime
//===------------------------------------------------------------------------------------===//

/// What `configure()` overrides (applied when the runtime starts).
#[derive(Clone, Debug, Default)]
struct Settings {
    visible_cores: Option<Vec<u32>>,
    num_cores: Option<u32>,
    logical_nc: Option<u32>,
    log_level: Option<Level>,
}

/// The device and the runtime on it.
struct Global {
    device: Arc<SoftDevice>,
    rt: Runtime,
    /// Physical cores of each logical core (index = logical core).
    vnc_cores: Vec<Vec<u32>>,
    /// (model id, name) of every model loaded, for trace files.
    names: Mutex<Vec<(u32, String)>>,
}

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Global")
            .field("vnc_cores", &self.vnc_cores)
            .finish()
    }
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    visible_cores: None,
    num_cores: None,
    logical_nc: None,
    log_level: None,
});
static GLOBAL: Mutex<Option<Arc<Global>>> = Mutex::new(None);
/// `ml_dtypes.bfloat16` when the package is installed (set by `nrt/__init__.py`).
static BF16: Mutex<Option<Py<PyArrayDescr>>> = Mutex::new(None);

fn set_log_levels(level: Level) {
    for m in [Module::Nrt, Module::Nmgr, Module::Tdrv] {
        nrt_runtime::log::set_level(m, level);
    }
}

fn start_runtime(s: &Settings) -> Result<Global, RtError> {
    nrt_runtime::log::configure_from_env();
    if let Some(l) = s.log_level {
        set_log_levels(l);
    }
    let sim = SimConfig::from_env().map_err(|e| RtError::invalid(e.to_string()))?;
    let device = Arc::new(SoftDevice::new(sim).map_err(|e| {
        RtError::new(
            NrtStatus::Resource,
            format!("cannot start the software NeuronCore: {e}"),
        )
    })?);
    let mut cfg = RuntimeConfig::from_env()?;
    if let Some(v) = &s.visible_cores {
        cfg.visible_cores = Some(v.clone());
    }
    if let Some(n) = s.num_cores {
        cfg.num_cores = n;
        if s.visible_cores.is_none() {
            cfg.visible_cores = None;
        }
    }
    if let Some(l) = s.logical_nc {
        cfg.logical_nc = l;
    }
    // Python drives the synchronous surface; implicit async (callbacks) is a C-API mode.
    cfg.async_inflight = 0;
    let cores = nrt_runtime::config::select_cores(&cfg, device.config().cores)?;
    let vnc_cores = cores
        .chunks(cfg.lnc() as usize)
        .map(<[u32]>::to_vec)
        .collect();
    let rt = Runtime::init(device.clone(), cfg)?;
    Ok(Global {
        device,
        rt,
        vnc_cores,
        names: Mutex::new(Vec::new()),
    })
}

/// The open runtime, started now if there is none (or the last one was closed). Takes the
/// GIL token: it is called with the GIL held.
fn global(_py: Python<'_>) -> PyResult<Arc<Global>> {
    let mut g = lock(&GLOBAL);
    if let Some(rt) = g.as_ref().filter(|g| g.rt.is_open()) {
        return Ok(rt.clone());
    }
    let s = lock(&SETTINGS).clone();
    // Started with the GIL held: releasing it while holding GLOBAL would deadlock against a
    // thread that holds the GIL and waits for GLOBAL. It takes milliseconds, once.
    let started = start_runtime(&s).map_err(from_rt)?;
    let started = Arc::new(started);
    *g = Some(started.clone());
    Ok(started)
}

fn parse_cores(v: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if let Ok(s) = v.extract::<String>() {
        return nrt_runtime::config::parse_core_list(&s).map_err(from_rt);
    }
    if let Ok(n) = v.extract::<u32>() {
        return Ok(vec![n]);
    }
    if let Ok(list) = v.extract::<Vec<u32>>() {
        let s = list
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        return nrt_runtime::config::parse_core_list(&s).map_err(from_rt);
    }
    Err(invalid(
        "visible_cores must be a string like \"0-1\", an int or a list of ints",
    ))
}

/// Sets how the process-global runtime starts. Call before first use; values given here
/// override the environment variables (NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES,
/// NEURON_LOGICAL_NC_CONFIG, NEURON_RT_LOG_LEVEL). `log_level` may also be changed later.
#[pyfunction]
#[pyo3(signature = (visible_cores=None, *, num_cores=None, logical_nc_config=None, log_level=None))]
fn configure(
    visible_cores: Option<&Bound<'_, PyAny>>,
    num_cores: Option<u32>,
    logical_nc_config: Option<u32>,
    log_level: Option<&str>,
) -> PyResult<()> {
    let level = match log_level {
        Some(s) => Some(Level::parse(s).ok_or_else(|| {
            invalid(format!(
                "log_level {s:?} is not one of ERROR, WARN, INFO, DEBUG, TRACE, OFF"
            ))
        })?),
        None => None,
    };
    let cores = visible_cores.map(parse_cores).transpose()?;
    let running = lock(&GLOBAL).as_ref().is_some_and(|g| g.rt.is_open());
    if running && (cores.is_some() || num_cores.is_some() || logical_nc_config.is_some()) {
        return Err(invalid(
            "configure(): the runtime is already running; core settings apply only before \
             first use (call nrt.close() first to start a new runtime)",
        ));
    }
    if let Some(l) = logical_nc_config
        && !(1..=2).contains(&l)
    {
        return Err(invalid(format!("logical_nc_config={l} (1 or 2)")));
    }
    let mut s = lock(&SETTINGS);
    if cores.is_some() {
        s.visible_cores = cores;
    }
    if num_cores.is_some() {
        s.num_cores = num_cores;
    }
    if logical_nc_config.is_some() {
        s.logical_nc = logical_nc_config;
    }
    if let Some(l) = level {
        s.log_level = Some(l);
        set_log_levels(l);
    }
    Ok(())
}

/// Closes the process-global runtime: unloads every model and releases the cores. Models
/// and tensors from before raise NrtError (NRT_CLOSED); the next use starts a new runtime.
#[pyfunction]
fn close(py: Python<'_>) {
    let g = lock(&GLOBAL).take();
    if let Some(g) = g {
        py.allow_threads(|| g.rt.close());
    }
}

/// The physical NeuronCores the runtime reserved, one list per logical core (starts the
/// runtime if needed).
#[pyfunction]
fn visible_cores(py: Python<'_>) -> PyResult<Vec<Vec<u32>>> {
    Ok(global(py)?.vnc_cores.clone())
}

/// Arms a fault plan on this process's software NeuronCore only (syntax of NRT_SIM_FAULTS,
/// e.g. "fatal", "hang@engine=act", "nan@exec=5,count=2"). `core=` counts among this
/// process's logical cores (as Model.load's `core` does); `exec` absent or 0 means the
/// core's next execution.
#[pyfunction]
fn inject_faults(py: Python<'_>, spec: &str) -> PyResult<()> {
    let g = global(py)?;
    let specs = nrt_sim::parse_faults(spec).map_err(|e| invalid(e.to_string()))?;
    for mut f in specs {
        let vnc = f.core as usize;
        let phys = g.vnc_cores.get(vnc).ok_or_else(|| {
            invalid(format!(
                "inject_faults({spec:?}): logical core {vnc} does not exist ({} visible)",
                g.vnc_cores.len()
            ))
        })?;
        f.core = phys[0];
        g.device.inject(f).map_err(|e| invalid(format!("{e}")))?;
    }
    Ok(())
}

/// Removes every planned fault of this process's software NeuronCore.
#[pyfunction]
fn clear_faults(py: Python<'_>) -> PyResult<()> {
    global(py)?.device.clear_faults();
    Ok(())
}

/// Resets logical core `core` after a fatal error (Runtime::reset_vnc; nrt_reset).
#[pyfunction]
#[pyo3(signature = (core=0))]
fn reset(py: Python<'_>, core: u32) -> PyResult<()> {
    let g = global(py)?;
    py.allow_threads(|| g.rt.reset_vnc(core)).map_err(from_rt)
}

/// Starts recording per-stage spans (used by `nrt.profile`).
#[pyfunction]
fn _trace_start(py: Python<'_>) -> PyResult<()> {
    global(py)?.rt.set_tracing(true);
    Ok(())
}

/// Stops recording and writes the spans as Chrome trace-event JSON to `path`; returns the
/// number of spans.
#[pyfunction]
fn _trace_stop(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    let g = global(py)?;
    let spans = g.rt.trace_spans();
    g.rt.set_tracing(false);
    let names = lock(&g.names).clone();
    let refs: Vec<(u32, &str)> = names.iter().map(|(i, n)| (*i, n.as_str())).collect();
    let json = nrt_runtime::chrome_json(&spans, &refs);
    std::fs::write(&path, json).map_err(|e| {
        nrt_err(
            NrtStatus::Failure,
            format!("writing trace {}: {e}", path.display()),
        )
    })?;
    Ok(spans.len())
}

/// Registers the numpy dtype used for bfloat16 tensors (ml_dtypes.bfloat16).
#[pyfunction]
fn _set_bf16_dtype(dtype: Bound<'_, PyArrayDescr>) {
    *lock(&BF16) = Some(dtype.unbind());
}

//===------------------------------------------------------------------------------------===//
// dtypes and arrays
//===------------------------------------------------------------------------------------===//

fn descr(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    let name = match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::Bf16 => {
            if let Some(b) = lock(&BF16).as_ref() {
                return Ok(b.bind(py).clone());
            }
            "uint16"
        }
        DType::I8 => "int8",
        DType::U8 => "uint8",
        DType::I16 => "int16",
        DType::U16 => "uint16",
        DType::I32 => "int32",
        DType::U32 => "uint32",
        DType::I64 => "int64",
        DType::U64 => "uint64",
        DType::Bool => "bool",
        DType::F64 => "float64",
    };
    PyArrayDescr::new(py, name)
}

/// A new, uninitialized, C-ordered array.
fn new_array<'py>(
    py: Python<'py>,
    dtype: &Bound<'py, PyArrayDescr>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let mut dims: Vec<npy_intp> = shape.iter().map(|&d| d as npy_intp).collect();
    // SAFETY: PyArray_NewFromDescr steals the descriptor reference that `into_dtype_ptr`
    // hands over; `dims` holds `dims.len()` extents; null strides/data/obj ask numpy to
    // allocate a C-contiguous buffer. The GIL is held (`py`).
    let ptr = unsafe {
        PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            PY_ARRAY_API.get_type_object(py, NpyTypes::PyArray_Type),
            dtype.clone().into_dtype_ptr(),
            dims.len() as std::os::raw::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        )
    };
    // SAFETY: `ptr` is a new reference or null with a Python error set.
    let obj = unsafe { Bound::from_owned_ptr_or_err(py, ptr)? };
    Ok(obj.downcast_into::<PyUntypedArray>()?)
}

/// The data pointer of an array.
fn data_ptr(a: &Bound<'_, PyUntypedArray>) -> *mut u8 {
    // SAFETY: `as_array_ptr` is a live PyArrayObject (we hold a reference); reading its
    // `data` field does not touch the bytes.
    unsafe { (*a.as_array_ptr()).data.cast::<u8>() }
}

fn nbytes(a: &Bound<'_, PyUntypedArray>) -> usize {
    a.len() * a.dtype().itemsize()
}

/// A shape as Python prints a tuple.
fn shape_str(s: &[usize]) -> String {
    match s {
        [d] => format!("({d},)"),
        _ => format!(
            "({})",
            s.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn dtype_name(d: &Bound<'_, PyArrayDescr>) -> String {
    d.str()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| "?".into())
}

//===------------------------------------------------------------------------------------===//
// TensorInfo
//===------------------------------------------------------------------------------------===//

/// One input or output of a model: `name`, `shape` (tuple), `dtype` (numpy dtype), `size`
/// (bytes).
#[pyclass(frozen, module = "nrt", name = "TensorInfo")]
#[derive(Debug)]
struct TensorInfo {
    name: String,
    shape: Vec<usize>,
    dtype: Py<PyArrayDescr>,
    ndtype: DType,
    size: u64,
}

#[pymethods]
impl TensorInfo {
    /// The tensor's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// The shape, as a tuple of ints.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
    /// The element type, as a numpy dtype (bfloat16: ml_dtypes.bfloat16 if installed, else
    /// uint16).
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyArrayDescr> {
        self.dtype.clone_ref(py)
    }
    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "TensorInfo(name={:?}, shape={}, dtype={}, size={})",
            self.name,
            shape_str(&self.shape),
            dtype_name(self.dtype.bind(py)),
            self.size
        )
    }
}

impl TensorInfo {
    fn from_rt(py: Python<'_>, i: &nrt_runtime::TensorInfo) -> PyResult<TensorInfo> {
        Ok(TensorInfo {
            name: i.name.clone(),
            shape: i.shape.iter().map(|&d| d as usize).collect(),
            dtype: descr(py, i.dtype)?.unbind(),
            ndtype: i.dtype,
            size: i.size,
        })
    }

    /// Whether `d` is acceptable for this tensor (bf16 also takes uint16).
    fn accepts(&self, py: Python<'_>, d: &Bound<'_, PyArrayDescr>) -> bool {
        d.is_equiv_to(self.dtype.bind(py))
            || (self.ndtype == DType::Bf16 && d.is_equiv_to(&numpy::dtype::<u16>(py)))
    }
}

//===------------------------------------------------------------------------------------===//
// Tensor (device tensors)
//===------------------------------------------------------------------------------------===//

/// A tensor in device memory of one logical core. Pass it in a model's input dict to skip
/// the host-to-device copy; read it back with `.numpy()`.
#[pyclass(frozen, module = "nrt", name = "Tensor")]
#[derive(Debug)]
struct Tensor {
    t: RtTensor,
    shape: Vec<usize>,
    dtype: Py<PyArrayDescr>,
    core: u32,
}

#[pymethods]
impl Tensor {
    /// Copies a numpy array into a new device tensor on logical core `core`.
    #[staticmethod]
    #[pyo3(signature = (array, core=0, name=None))]
    fn from_numpy(
        py: Python<'_>,
        array: &Bound<'_, PyAny>,
        core: u32,
        name: Option<&str>,
    ) -> PyResult<Tensor> {
        let a = contiguous(py, array)?;
        let g = global(py)?;
        let size = nbytes(&a) as u64;
        let name = name.unwrap_or("tensor");
        let t =
            g.rt.allocate_tensor(Placement::Device, core as i32, size, name)
                .map_err(from_rt)?;
        let p = data_ptr(&a) as usize;
        let n = size as usize;
        // SAFETY: `a` is a C-contiguous array of `n` bytes that we keep referenced (and so
        // alive) for the whole call; the slice is only read.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
        py.allow_threads(|| t.write(bytes, 0)).map_err(from_rt)?;
        Ok(Tensor {
            t,
            shape: a.shape().to_vec(),
            dtype: a.dtype().unbind(),
            core,
        })
    }

    /// Copies the tensor into a new numpy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyUntypedArray>> {
        let a = new_array(py, self.dtype.bind(py), &self.shape)?;
        let (p, n) = (data_ptr(&a) as usize, nbytes(&a));
        // SAFETY: `a` is a fresh C-contiguous array of `n` bytes that nobody else sees yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
        py.allow_threads(|| self.t.read(buf, 0)).map_err(from_rt)?;
        Ok(a)
    }

    /// Overwrites the tensor with `array` (same shape and dtype).
    fn write(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        let a = contiguous(py, array)?;
        if a.shape() != self.shape.as_slice() || !a.dtype().is_equiv_to(self.dtype.bind(py)) {
            return Err(invalid(format!(
                "tensor '{}' is {} {}; got {} {}",
                self.t.name(),
                shape_str(&self.shape),
                dtype_name(self.dtype.bind(py)),
                shape_str(a.shape()),
                dtype_name(&a.dtype())
            )));
        }
        let (p, n) = (data_ptr(&a) as usize, nbytes(&a));
        // SAFETY: as in `from_numpy`.
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
        py.allow_threads(|| self.t.write(bytes, 0)).map_err(from_rt)
    }

    /// The shape, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
    /// The numpy dtype.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyArrayDescr> {
        self.dtype.clone_ref(py)
    }
    /// The logical core it lives on.
    #[getter]
    fn core(&self) -> u32 {
        self.core
    }
    /// Size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.t.size()
    }
    /// The name given at creation.
    #[getter]
    fn name(&self) -> &str {
        self.t.name()
    }
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Tensor(name={:?}, shape={}, dtype={}, core={})",
            self.t.name(),
            shape_str(&self.shape),
            dtype_name(self.dtype.bind(py)),
            self.core
        )
    }
}

/// `array` as a C-contiguous ndarray (one copy when it is not one already).
fn contiguous<'py>(
    py: Python<'py>,
    array: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = array.downcast::<PyUntypedArray>()
        && a.is_c_contiguous()
    {
        return Ok(a.clone());
    }
    let np = py.import("numpy")?;
    Ok(np
        .call_method1("ascontiguousarray", (array,))?
        .downcast_into::<PyUntypedArray>()?)
}

//===------------------------------------------------------------------------------------===//
// Model
//===------------------------------------------------------------------------------------===//

/// Empty host tensors, one per input and output, re-attached to each call's buffers.
struct IoPair {
    ins: TensorSet,
    outs: TensorSet,
    in_t: Vec<RtTensor>,
    out_t: Vec<RtTensor>,
}

/// Where one input's bytes come from.
enum Src<'py> {
    /// A host buffer (kept alive by the array).
    Host(Bound<'py, PyUntypedArray>),
    /// A device tensor.
    Device(RtTensor),
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

/// A model loaded on the process-global runtime. Call it with a dict of numpy arrays (or
/// nrt.Tensor) keyed by input name; it returns a dict of numpy arrays keyed by output name.
#[pyclass(frozen, module = "nrt", name = "Model")]
struct Model {
    g: Arc<Global>,
    m: RtModel,
    inputs: Vec<Py<TensorInfo>>,
    outputs: Vec<Py<TensorInfo>>,
    source: String,
    pool: Mutex<Vec<IoPair>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("model", &self.m)
            .field("source", &self.source)
            .finish()
    }
}

/// Where a model comes from: a path, or bytes (NCM).
#[derive(FromPyObject)]
enum Source {
    Bytes(Vec<u8>),
    Path(PathBuf),
}

fn shapes_opt(input_shapes: Option<BTreeMap<String, Vec<usize>>>) -> BTreeMap<String, Vec<usize>> {
    input_shapes.unwrap_or_default()
}

fn compile_path(
    path: &std::path::Path,
    input_shapes: BTreeMap<String, Vec<usize>>,
    cores: u32,
) -> Result<Vec<u8>, RtError> {
    let opts = CompileOptions {
        input_shapes,
        cores,
        ..CompileOptions::default()
    };
    let c = nrt_compiler::compile_file(path, &opts)
        .map_err(|e| RtError::invalid(format!("compiling {}: {e}", path.display())))?;
    c.model
        .try_encode()
        .map_err(|e| RtError::invalid(format!("compiling {}: {e}", path.display())))
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
            exec_timeout: match timeout {
                Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
                Some(s) => return Err(invalid(format!("timeout={s} (seconds, > 0)"))),
                None => None,
            },
        };
        let vnc = i32::try_from(core).map_err(|_| invalid(format!("core={core}")))?;
        let m = py
            .allow_threads(|| g.rt.load(&ncm, vnc, &opts))
            .map_err(|e| nrt_err(e.status, format!("{source}: {}", e.message)))?;
        lock(&g.names).push((m.id(), m.name().to_owned()));
        let (mut inputs, mut outputs) = (Vec::new(), Vec::new());
        for i in m.tensor_info() {
            let info = Py::new(py, TensorInfo::from_rt(py, &i)?)?;
            match i.usage {
                nrt_model::Usage::Input => inputs.push(info),
                nrt_model::Usage::Output => outputs.push(info),
            }
        }
        Ok(Model {
            g,
            m,
            inputs,
            outputs,
            source,
            pool: Mutex::new(Vec::new()),
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
        self.m.is_loaded() && self.g.rt.is_open()
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
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.g.rt.reset_vnc(self.m.vnc()))
            .map_err(|e| model_err(self.m.name(), e))
    }

    /// Unloads the model; later calls raise NrtError (NRT_INVALID).
    fn unload(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.g.rt.unload(&self.m))
            .map_err(|e| model_err(self.m.name(), e))
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

impl Model {
    fn take_pair(&self) -> Result<IoPair, RtError> {
        if let Some(p) = lock(&self.pool).pop() {
            return Ok(p);
        }
        let rt = &self.g.rt;
        let mut p = IoPair {
            ins: TensorSet::new(),
            outs: TensorSet::new(),
            in_t: Vec::new(),
            out_t: Vec::new(),
        };
        for i in &self.inputs {
            let t = rt.allocate_empty_tensor(&i.get().name)?;
            p.ins.add(&i.get().name, &t);
            p.in_t.push(t);
        }
        for o in &self.outputs {
            let t = rt.allocate_empty_tensor(&o.get().name)?;
            p.outs.add(&o.get().name, &t);
            p.out_t.push(t);
        }
        Ok(p)
    }

    fn give_back(&self, p: IoPair) {
        let mut pool = lock(&self.pool);
        if pool.len() < 64 {
            pool.push(p);
        }
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
            if t.t.size() != info.size || !info.accepts(py, t.dtype.bind(py)) {
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
            return Ok(Src::Device(t.t.clone()));
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
        let mut pair = self.take_pair().map_err(|e| model_err(model, e))?;
        let attached = (|| -> Result<(), RtError> {
            for (src, t) in srcs.iter().zip(&pair.in_t) {
                if let Src::Host(a) = src {
                    // SAFETY: the array is C-contiguous, `nbytes` long (its shape was checked
                    // against the model's) and referenced by `srcs` until after the
                    // execution; the tensor is detached again before this returns.
                    unsafe { t.attach_buffer(data_ptr(a), nbytes(a))? }
                }
            }
            for (a, t) in outs.iter().zip(&pair.out_t) {
                // SAFETY: a fresh C-contiguous output array of the output's size, referenced
                // by `outs` until after the execution; detached again before return.
                unsafe { t.attach_buffer(data_ptr(a), nbytes(a))? }
            }
            Ok(())
        })();
        for (src, info) in srcs.iter().zip(&self.inputs) {
            if let Src::Device(t) = src {
                pair.ins.add(&info.get().name, t);
            }
        }
        let result = match attached {
            Ok(()) => {
                let (rt, m, p) = (&self.g.rt, &self.m, &pair);
                py.allow_threads(|| rt.execute(m, &p.ins, &p.outs))
            }
            Err(e) => Err(e),
        };
        // Detach every buffer (so no tensor keeps a pointer into an array that may be freed)
        // and put the pooled empty tensors back where device tensors were bound.
        for t in pair.in_t.iter().chain(&pair.out_t) {
            // SAFETY: a null buffer of length 0 is never dereferenced.
            let _ = unsafe { t.attach_buffer(std::ptr::null_mut(), 0) };
        }
        for ((src, t), info) in srcs.iter().zip(&pair.in_t).zip(&self.inputs) {
            if let Src::Device(_) = src {
                pair.ins.add(&info.get().name, t);
            }
        }
        match result {
            Ok(()) => self.give_back(pair),
            Err(e) => {
                // Keep the pool only while the runtime is usable.
                if self.g.rt.is_open() {
                    self.give_back(pair);
                }
                return Err(model_err(model, e));
            }
        }
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

//===------------------------------------------------------------------------------------===//
// Compiling, ONNX signatures
//===------------------------------------------------------------------------------------===//

/// Compiles an ONNX model (a path, or the model's bytes) for the software NeuronCore and
/// returns the compiled model (NCM bytes). `input_shapes` binds symbolic dimensions.
#[pyfunction]
#[pyo3(signature = (path, input_shapes=None, cores=1))]
fn compile<'py>(
    py: Python<'py>,
    path: Source,
    input_shapes: Option<BTreeMap<String, Vec<usize>>>,
    cores: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    let shapes = shapes_opt(input_shapes);
    let ncm = match path {
        Source::Path(p) => py
            .allow_threads(|| compile_path(&p, shapes, cores))
            .map_err(from_rt)?,
        Source::Bytes(b) => py
            .allow_threads(|| {
                let opts = CompileOptions {
                    input_shapes: shapes,
                    cores,
                    ..CompileOptions::default()
                };
                let c = nrt_compiler::compile(&b, None, &opts).map_err(|e| e.to_string())?;
                c.model.try_encode().map_err(|e| e.to_string())
            })
            .map_err(|e| invalid(format!("compiling <bytes>: {e}")))?,
    };
    Ok(PyBytes::new(py, &ncm))
}

type Sig = (String, Vec<Option<PyObject>>, i32);

/// The graph inputs (initializers excluded) and outputs of an ONNX file: (name, dims,
/// elem_type) with each dim an int, a str (symbolic) or None.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn _onnx_signature(py: Python<'_>, path: PathBuf) -> PyResult<(Vec<Sig>, Vec<Sig>)> {
    let bytes =
        std::fs::read(&path).map_err(|e| invalid(format!("reading {}: {e}", path.display())))?;
    let m = nrt_compiler::onnx::decode_model(&bytes)
        .map_err(|e| invalid(format!("{}: not a valid ONNX model: {e}", path.display())))?;
    let g = m
        .graph
        .ok_or_else(|| invalid(format!("{}: no graph", path.display())))?;
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let sig = |v: &nrt_compiler::onnx::ValueInfoProto| -> PyResult<Sig> {
        let t = v.r#type.as_ref().and_then(|t| t.tensor_type.as_ref());
        let elem = t.map(|t| t.elem_type).unwrap_or(0);
        let dims = t
            .and_then(|t| t.shape.as_ref())
            .map(|s| {
                s.dim
                    .iter()
                    .map(|d| -> PyResult<Option<PyObject>> {
                        Ok(match (d.dim_value, &d.dim_param) {
                            (Some(n), _) => Some(n.into_pyobject(py)?.into_any().unbind()),
                            (None, Some(p)) if !p.is_empty() => {
                                Some(p.into_pyobject(py)?.into_any().unbind())
                            }
                            _ => None,
                        })
                    })
                    .collect::<PyResult<Vec<_>>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok((v.name.clone(), dims, elem))
    };
    let ins = g
        .input
        .iter()
        .filter(|i| !inits.contains(i.name.as_str()))
        .map(sig)
        .collect::<PyResult<Vec<_>>>()?;
    let outs = g.output.iter().map(sig).collect::<PyResult<Vec<_>>>()?;
    Ok((ins, outs))
}

/// The built-in near-null model (NCM bytes): one tiny input and output, no compute; what
/// `nrt bench` times to measure the runtime's own overhead.
#[pyfunction]
#[pyo3(signature = (cores=1))]
fn _near_null<'py>(py: Python<'py>, cores: u32) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &nrt_runtime::builtin::near_null(cores))
}

/// Every NRT_STATUS: {name: code}.
#[pyfunction]
fn _statuses() -> BTreeMap<&'static str, i32> {
    NrtStatus::ALL
        .iter()
        .map(|s| (s.as_str(), *s as i32))
        .collect()
}

#[pymodule]
fn _nrt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NrtError", py.get_type::<NrtError>())?;
    m.add_class::<Model>()?;
    m.add_class::<Tensor>()?;
    m.add_class::<TensorInfo>()?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(close, m)?)?;
    m.add_function(wrap_pyfunction!(visible_cores, m)?)?;
    m.add_function(wrap_pyfunction!(inject_faults, m)?)?;
    m.add_function(wrap_pyfunction!(clear_faults, m)?)?;
    m.add_function(wrap_pyfunction!(reset, m)?)?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(_trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(_set_bf16_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(_onnx_signature, m)?)?;
    m.add_function(wrap_pyfunction!(_statuses, m)?)?;
    m.add_function(wrap_pyfunction!(_near_null, m)?)?;
    Ok(())
}
