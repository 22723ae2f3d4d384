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
use nrt_hal::{DType, NrtStatus, SeqId};
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
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
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
///
/// A fork child inherits it but none of its threads (the device's, the XU workers), and any
/// of its locks another thread of the parent held at fork stays locked: a child never
/// touches it, nor drops it (dropping closes the runtime, which joins those threads). Every
/// entry point compares `pid` with the calling process's first ([`Global::check_owner`]);
/// [`global`] leaks the parent's and starts the child's own.
struct Global {
    device: Arc<SoftDevice>,
    rt: Runtime,
    /// The process that started it.
    pid: u32,
    /// Physical cores of each logical core (index = logical core).
    vnc_cores: Vec<Vec<u32>>,
    /// Model id -> (name, still loaded) of the models loaded, for trace files: an unloaded
    /// model's entry goes at once unless a trace is being recorded, then when it is written.
    names: Mutex<BTreeMap<u32, (String, bool)>>,
    /// Whether a trace is being recorded (`nrt.profile`).
    tracing: AtomicBool,
}

impl Global {
    /// `Ok` in the process that started this runtime; in a fork child, the error saying that
    /// `what` (a model, a tensor) belongs to the parent and must be made again.
    fn check_owner(&self, what: impl FnOnce() -> String) -> PyResult<()> {
        if self.pid == std::process::id() {
            return Ok(());
        }
        Err(nrt_err(
            NrtStatus::InvalidHandle,
            format!(
                "{} belongs to the runtime of the parent process (pid {}); this process is a \
                 fork of it, where that runtime cannot run: load the model (or make the \
                 tensor) again in this process",
                what(),
                self.pid
            ),
        ))
    }

    /// Forgets an unloaded model's name (kept until the trace is written while tracing).
    fn forget_name(&self, id: u32) {
        let mut names = lock(&self.names);
        if self.tracing.load(Ordering::Relaxed) {
            if let Some(e) = names.get_mut(&id) {
                e.1 = false;
            }
        } else {
            names.remove(&id);
        }
    }
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
/// The runtime. Locked only with the GIL held and never across a release of it, so a
/// thread forking (with the GIL) never leaves it locked; a fork child still checks
/// [`GLOBAL_PID`] before locking it and only ever `try_lock`s it then.
static GLOBAL: Mutex<Option<Arc<Global>>> = Mutex::new(None);
/// The pid of the process that last set [`GLOBAL`] (0: never set).
static GLOBAL_PID: AtomicU32 = AtomicU32::new(0);
/// In a fork child whose parent had a runtime: the parent's pid (for error messages).
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);
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
        pid: std::process::id(),
        vnc_cores,
        names: Mutex::new(BTreeMap::new()),
        tracing: AtomicBool::new(false),
    })
}

/// In a fork child: leaks the runtime inherited from the parent, without touching it
/// (its threads do not exist here, and a lock a parent thread held stays locked), so that the
/// next use starts this process's own. Idempotent; a no-op outside a fork child. Called by
/// `os.register_at_fork(after_in_child=...)` and, for forks Python does not see, by
/// [`global`].
fn leave_parent_runtime() -> PyResult<()> {
    let pid = std::process::id();
    let owner = GLOBAL_PID.load(Ordering::Acquire);
    if owner == 0 || owner == pid {
        return Ok(());
    }
    let mut g = match GLOBAL.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Err(nrt_err(
                NrtStatus::InvalidHandle,
                format!(
                    "this process is a fork of pid {owner}, made while a thread of the parent \
                     was starting or closing the runtime; the nrt package cannot be used in \
                     this process (fork before first use, or use the 'spawn' start method)"
                ),
            ));
        }
    };
    if let Some(parent) = g.take() {
        FORKED_FROM.store(parent.pid, Ordering::Relaxed);
        // Never dropped here: dropping closes the runtime, which joins threads that exist
        // only in the parent.
        std::mem::forget(parent);
    }
    GLOBAL_PID.store(pid, Ordering::Release);
    Ok(())
}

/// `os.register_at_fork(after_in_child=...)`: the child forgets the parent's runtime.
#[pyfunction]
fn _after_fork_child() -> PyResult<()> {
    leave_parent_runtime()
}

/// The open runtime, started now if there is none (or the last one was closed). Takes the
/// GIL token: it is called with the GIL held.
fn global(_py: Python<'_>) -> PyResult<Arc<Global>> {
    leave_parent_runtime()?;
    let mut g = lock(&GLOBAL);
    if let Some(rt) = g.as_ref().filter(|g| g.rt.is_open()) {
        return Ok(rt.clone());
    }
    let s = lock(&SETTINGS).clone();
    // Started with the GIL held: releasing it while holding GLOBAL would deadlock against a
    // thread that holds the GIL and waits for GLOBAL. It takes milliseconds, once.
    let started = start_runtime(&s).map_err(|e| match FORKED_FROM.load(Ordering::Relaxed) {
        0 => from_rt(e),
        parent => nrt_err(
            e.status,
            format!(
                "this process is a fork of pid {parent}, whose runtime keeps its cores; \
                 starting this process's own runtime failed: {}",
                e.message
            ),
        ),
    })?;
    let started = Arc::new(started);
    GLOBAL_PID.store(started.pid, Ordering::Release);
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
///
/// `interruptible` (default True, may be changed at any time): whether model calls on the
/// main thread wait in 50 ms slices and run Python's signal handlers between them (Ctrl-C
/// raises KeyboardInterrupt even while an execution hangs), at a cost of some tens of µs
/// per call (the explicit surface and an eventfd); False makes them use the sync surface,
/// as every other thread does.
#[pyo3(signature = (visible_cores=None, *, num_cores=None, logical_nc_config=None, log_level=None, interruptible=None))]
fn configure(
    visible_cores: Option<&Bound<'_, PyAny>>,
    num_cores: Option<u32>,
    logical_nc_config: Option<u32>,
    log_level: Option<&str>,
    interruptible: Option<bool>,
) -> PyResult<()> {
    if let Some(i) = interruptible {
        INTERRUPTIBLE.store(i, Ordering::Relaxed);
    }
    let level = match log_level {
        Some(s) => Some(Level::parse(s).ok_or_else(|| {
            invalid(format!(
                "log_level {s:?} is not one of ERROR, WARN, INFO, DEBUG, TRACE, OFF"
            ))
        })?),
        None => None,
    };
    let cores = visible_cores.map(parse_cores).transpose()?;
    leave_parent_runtime()?;
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
fn close(py: Python<'_>) -> PyResult<()> {
    leave_parent_runtime()?;
    let g = lock(&GLOBAL).take();
    if let Some(g) = g {
        py.allow_threads(|| g.rt.close());
    }
    Ok(())
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
        // "Next" is the next execution submitted, not one already queued (issue 54 S19).
        let staged = g.rt.staged_on_core(f.core);
        g.device
            .inject_after_staged(f, staged)
            .map_err(|e| invalid(format!("{e}")))?;
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
    let g = global(py)?;
    g.tracing.store(true, Ordering::Relaxed);
    g.rt.set_tracing(true);
    Ok(())
}

/// Stops recording and writes the spans as Chrome trace-event JSON to `path`; returns the
/// number of spans.
#[pyfunction]
fn _trace_stop(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
    let g = global(py)?;
    let spans = g.rt.trace_spans();
    g.rt.set_tracing(false);
    g.tracing.store(false, Ordering::Relaxed);
    let names: Vec<(u32, String)> = {
        let mut names = lock(&g.names);
        let all = names.iter().map(|(i, (n, _))| (*i, n.clone())).collect();
        names.retain(|_, (_, loaded)| *loaded);
        all
    };
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

/// Every element type the device has.
const DEVICE_DTYPES: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::Bf16,
    DType::F64,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::Bool,
];

/// `d` if it is one of the device's element types (in native byte order); otherwise the
/// error naming it. Object arrays (pointers to Python objects, whose references a byte copy
/// would not carry), strings, bytes, void/structured, datetime, timedelta and complex
/// arrays — anything the device has no type for — are refused here, before a byte of them
/// is copied.
fn device_dtype<'py>(
    py: Python<'py>,
    d: &Bound<'py, PyArrayDescr>,
    what: &str,
) -> PyResult<Bound<'py, PyArrayDescr>> {
    if !d.has_object() {
        for t in DEVICE_DTYPES {
            let dev = descr(py, t)?;
            if d.is_equiv_to(&dev) {
                return Ok(dev);
            }
        }
    }
    let names = DEVICE_DTYPES
        .iter()
        .map(|&t| descr(py, t).map(|d| dtype_name(&d)))
        .collect::<PyResult<Vec<_>>>()?
        .join(", ");
    Err(invalid(format!(
        "{what}: dtype {} ({}, kind '{}') is not an element type of the device ({names}, \
         in native byte order)",
        dtype_name(d),
        dtype_repr(d),
        d.kind() as char
    )))
}

/// A dtype as numpy spells it in `repr` (`dtype('<U3')`), so that object, string and
/// structured dtypes are named unambiguously.
fn dtype_repr(d: &Bound<'_, PyArrayDescr>) -> String {
    d.repr()
        .map(|s| s.to_string())
        .unwrap_or_else(|_| dtype_name(d))
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
    /// Dropped only in the process that made it (a fork child leaks it: freeing device
    /// memory takes the parent device's locks).
    t: ManuallyDrop<RtTensor>,
    /// The process whose runtime holds it.
    pid: u32,
    shape: Vec<usize>,
    dtype: Py<PyArrayDescr>,
    core: u32,
}

impl Drop for Tensor {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // SAFETY: `t` is dropped once, here, and not used again.
            unsafe { ManuallyDrop::drop(&mut self.t) };
        }
    }
}

impl Tensor {
    /// `Ok` in the process that made it; in a fork child, the error saying so.
    fn check_owner(&self) -> PyResult<()> {
        if self.pid == std::process::id() {
            return Ok(());
        }
        Err(nrt_err(
            NrtStatus::InvalidHandle,
            format!(
                "nrt.Tensor '{}' belongs to the runtime of the parent process (pid {}); this \
                 process is a fork of it, where that runtime cannot run: make the tensor again \
                 in this process",
                self.t.name(),
                self.pid
            ),
        ))
    }
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
        let name = name.unwrap_or("tensor");
        let a = contiguous(py, array)?;
        let dtype = device_dtype(py, &a.dtype(), &format!("Tensor.from_numpy('{name}')"))?;
        let g = global(py)?;
        let size = nbytes(&a) as u64;
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
            t: ManuallyDrop::new(t),
            pid: g.pid,
            shape: a.shape().to_vec(),
            dtype: dtype.unbind(),
            core,
        })
    }

    /// Copies the tensor into a new numpy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyUntypedArray>> {
        self.check_owner()?;
        let a = new_array(py, self.dtype.bind(py), &self.shape)?;
        let (p, n) = (data_ptr(&a) as usize, nbytes(&a));
        // SAFETY: `a` is a fresh C-contiguous array of `n` bytes that nobody else sees yet.
        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
        py.allow_threads(|| self.t.read(buf, 0)).map_err(from_rt)?;
        Ok(a)
    }

    /// Overwrites the tensor with `array` (same shape and dtype).
    fn write(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_owner()?;
        let a = contiguous(py, array)?;
        device_dtype(
            py,
            &a.dtype(),
            &format!("Tensor.write('{}')", self.t.name()),
        )?;
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

/// The interruptible path's I/O ([`Model::run_interruptible`]): device tensors, one per
/// input and output, and the execution's status slot.
struct DevPair {
    ins: TensorSet,
    outs: TensorSet,
    in_t: Vec<RtTensor>,
    out_t: Vec<RtTensor>,
    /// Written by the runtime when the execution completes (`execute_schedule_raw`).
    status: Box<AtomicI32>,
}

/// A model's pooled I/O.
#[derive(Default)]
struct Pools {
    /// The sync path's empty host tensors.
    host: Vec<IoPair>,
    /// The interruptible path's device tensors.
    dev: Vec<DevPair>,
    /// Device tensors of executions a signal interrupted the wait for: still in flight, so
    /// not reused until the runtime says they completed (a hung one: after its timeout).
    abandoned: Vec<(SeqId, DevPair)>,
}

/// At most this many pooled I/O sets of each kind per model.
const POOL_MAX: usize = 64;

/// How often a wait for an execution on the main thread wakes to run Python's signal
/// handlers (Ctrl-C: `KeyboardInterrupt`).
const SIGNAL_CHECK_EVERY: Duration = Duration::from_millis(50);

/// Whether the main thread's calls wait interruptibly (`configure(interruptible=...)`).
static INTERRUPTIBLE: AtomicBool = AtomicBool::new(true);

/// The thread ident (`threading.get_ident()`, pthread_self) of Python's main thread, the
/// one thread signal handlers run on (0: unknown).
static MAIN_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Registers Python's main thread (`threading.main_thread().ident`; again in a fork child).
#[pyfunction]
fn _set_main_thread(ident: u64) {
    MAIN_THREAD.store(ident, Ordering::Relaxed);
}

fn on_main_thread() -> bool {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    MAIN_THREAD.load(Ordering::Relaxed) == me
}

/// An eventfd, closed on drop.
struct EventFd(i32);

impl EventFd {
    fn new() -> Result<EventFd, RtError> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(RtError::new(
                NrtStatus::Resource,
                format!("eventfd: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(EventFd(fd))
    }

    /// Waits up to `timeout` for the eventfd to be signaled (and consumes the signal).
    fn wait(&self, timeout: Duration) {
        let mut p = libc::pollfd {
            fd: self.0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; poll returns early on a signal (EINTR), which is fine.
        unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
        let mut v = 0u64;
        // SAFETY: an 8-byte read into a u64 from our non-blocking eventfd.
        unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
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
///
/// Dropping the last reference unloads it (as a file object closes), unless `unload()` or
/// `nrt.close()` did already.
#[pyclass(frozen, module = "nrt", name = "Model")]
struct Model {
    /// The three runtime-bound fields are dropped only in the process that loaded the model
    /// (a fork child leaks them: see [`Global`]).
    g: ManuallyDrop<Arc<Global>>,
    m: ManuallyDrop<RtModel>,
    inputs: Vec<Py<TensorInfo>>,
    outputs: Vec<Py<TensorInfo>>,
    source: String,
    pool: ManuallyDrop<Mutex<Pools>>,
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
            exec_timeout: timeout.map(exec_timeout).transpose()?,
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

    fn take_pair(&self) -> Result<IoPair, RtError> {
        if let Some(p) = lock(&self.pool).host.pop() {
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
        if pool.host.len() < POOL_MAX {
            pool.host.push(p);
        }
    }

    /// A set of device tensors for the interruptible path: a pooled one, one whose
    /// interrupted execution has completed since, or a new one.
    fn take_dev_pair(&self) -> Result<DevPair, RtError> {
        {
            let mut pool = lock(&self.pool);
            let rt = &self.g.rt;
            // An interrupted execution's tensors come back once it completed (an error —
            // the runtime closed — drops them).
            let mut k = 0;
            while k < pool.abandoned.len() {
                match rt.is_completed(pool.abandoned[k].0) {
                    Ok(false) => k += 1,
                    done => {
                        let (_, p) = pool.abandoned.swap_remove(k);
                        if done.is_ok() && pool.dev.len() < POOL_MAX {
                            pool.dev.push(p);
                        }
                    }
                }
            }
            if let Some(p) = pool.dev.pop() {
                return Ok(p);
            }
        }
        let (rt, vnc) = (&self.g.rt, self.m.vnc() as i32);
        let mut p = DevPair {
            ins: TensorSet::new(),
            outs: TensorSet::new(),
            in_t: Vec::new(),
            out_t: Vec::new(),
            status: Box::new(AtomicI32::new(0)),
        };
        for i in &self.inputs {
            let i = i.get();
            let t = rt.allocate_tensor(Placement::Device, vnc, i.size, &i.name)?;
            p.ins.add(&i.name, &t);
            p.in_t.push(t);
        }
        for o in &self.outputs {
            let o = o.get();
            let t = rt.allocate_tensor(Placement::Device, vnc, o.size, &o.name)?;
            p.outs.add(&o.name, &t);
            p.out_t.push(t);
        }
        Ok(p)
    }

    /// Runs on the main thread: the execution is scheduled on the explicit surface (its
    /// inputs copied into pooled device tensors, as the sync surface copies host inputs
    /// into its clone buffers) and waited for in slices of [`SIGNAL_CHECK_EVERY`], running
    /// Python's signal handlers between them, so that Ctrl-C raises `KeyboardInterrupt`
    /// within ~50 ms even while the execution hangs. An interrupted execution stays in
    /// flight: its tensors are parked ([`Pools::abandoned`]) until the runtime reports it
    /// completed (a hung one times out), never reused before. Returns the execution's
    /// result; the outputs are in `outs` on success.
    fn run_interruptible(
        &self,
        py: Python<'_>,
        srcs: &[Src<'_>],
        outs: &[Bound<'_, PyUntypedArray>],
    ) -> PyResult<Result<(), RtError>> {
        let mut pair = match self.take_dev_pair() {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        // Host inputs: their bytes, copied without the GIL below.
        let mut copies: Vec<(usize, usize, usize)> = Vec::with_capacity(srcs.len());
        for (k, (src, info)) in srcs.iter().zip(&self.inputs).enumerate() {
            match src {
                Src::Host(a) => {
                    pair.ins.add(&info.get().name, &pair.in_t[k]);
                    copies.push((k, data_ptr(a) as usize, nbytes(a)));
                }
                Src::Device(t) => pair.ins.add(&info.get().name, t),
            }
        }
        let (rt, m) = (&self.g.rt, &*self.m);
        // As an address: a raw pointer cannot cross into the GIL-free closure.
        let status = pair.status.as_ptr() as usize;
        pair.status.store(-1, Ordering::Relaxed);
        let scheduled = py.allow_threads(|| -> Result<SeqId, RtError> {
            for &(k, p, n) in &copies {
                // SAFETY: the arrays are C-contiguous, `n` bytes long and referenced by
                // `srcs` for the whole call; only read.
                let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
                pair.in_t[k].write(bytes, 0)?;
            }
            loop {
                // SAFETY: the status slot lives in `pair`, which is kept (pooled or parked
                // in `abandoned`, never dropped) until the execution completed.
                match unsafe {
                    rt.execute_schedule_raw(m, &pair.ins, &pair.outs, 0, status as *mut i32)
                } {
                    // Every I/O set is in flight (other threads, interrupted executions):
                    // wait for one as the sync surface does.
                    Err(e) if e.status == NrtStatus::QueueFull => {
                        std::thread::sleep(Duration::from_micros(200))
                    }
                    r => return r,
                }
            }
        });
        let seq = match scheduled {
            Ok(seq) => seq,
            Err(e) => {
                self.give_back_dev(pair);
                return Ok(Err(e));
            }
        };
        let waited = self.wait_interruptible(py, seq);
        match waited {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // The runtime closed under it: nothing is reused.
                return Ok(Err(e));
            }
            Err(interrupted) => {
                lock(&self.pool).abandoned.push((seq, pair));
                return Err(interrupted);
            }
        }
        let st = pair.status.load(Ordering::Acquire);
        let result = match NrtStatus::try_from(st).ok() {
            Some(NrtStatus::Success) => {
                let reads: Vec<(usize, usize)> = outs
                    .iter()
                    .map(|a| (data_ptr(a) as usize, nbytes(a)))
                    .collect();
                py.allow_threads(|| -> Result<(), RtError> {
                    for (&(p, n), t) in reads.iter().zip(&pair.out_t) {
                        // SAFETY: fresh C-contiguous output arrays of the outputs' sizes,
                        // referenced by `outs` and seen by nobody else yet.
                        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
                        t.read(buf, 0)?;
                    }
                    Ok(())
                })
            }
            Some(s) => Err(RtError::new(
                s,
                format!(
                    "execution {} of model '{}' failed: {}",
                    seq.seq_num(),
                    m.name(),
                    s.description()
                ),
            )),
            None => Err(RtError::new(
                NrtStatus::Failure,
                format!("execution of model '{}' ended with status {st}", m.name()),
            )),
        };
        self.give_back_dev(pair);
        Ok(result)
    }

    fn give_back_dev(&self, p: DevPair) {
        let mut pool = lock(&self.pool);
        if pool.dev.len() < POOL_MAX {
            pool.dev.push(p);
        }
    }

    /// Waits for `seq` without the GIL, waking every [`SIGNAL_CHECK_EVERY`] to run Python's
    /// signal handlers. `Err` is the handlers' exception (the execution is still in flight);
    /// `Ok(Err)` a runtime error of the wait itself.
    fn wait_interruptible(&self, py: Python<'_>, seq: SeqId) -> PyResult<Result<(), RtError>> {
        let rt = &self.g.rt;
        // Blocks on an eventfd the runtime signals at completion, in slices. Polling
        // `is_completed` first (helping the harvest) was slower: with 500 µs of polling
        // before blocking, the mlp sample's p50 from the main thread was 650 µs (the
        // spinning caller kept the device's thread off a CPU on a 2-vCPU host), 30 µs of it
        // 178 µs, none 128 µs (the sync surface: 85 µs).
        let efd = match EventFd::new() {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        if let Err(e) = rt.register_seq_eventfd(seq, efd.0) {
            return Ok(Err(e));
        }
        let out = loop {
            let done = py.allow_threads(|| -> Result<bool, RtError> {
                let until = Instant::now() + SIGNAL_CHECK_EVERY;
                loop {
                    if rt.is_completed(seq)? {
                        return Ok(true);
                    }
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    efd.wait(left);
                }
            });
            match done {
                Ok(true) => break Ok(Ok(())),
                Ok(false) => {
                    if let Err(e) = py.check_signals() {
                        break Err(e);
                    }
                }
                Err(e) => break Ok(Err(e)),
            }
        };
        // Deregistered before the descriptor closes (a later completion must not write to
        // a number the process may reuse).
        let _ = rt.register_seq_eventfd(seq, -1);
        drop(efd);
        out
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

    /// The sync surface: the arrays' buffers bound to pooled empty host tensors, the whole
    /// execution on this thread without the GIL (not interruptible by signals).
    fn run_sync(
        &self,
        py: Python<'_>,
        srcs: &[Src<'_>],
        outs: &[Bound<'_, PyUntypedArray>],
    ) -> Result<(), RtError> {
        let mut pair = self.take_pair()?;
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
        if result.is_ok() || self.g.rt.is_open() {
            // Keep the pool only while the runtime is usable.
            self.give_back(pair);
        }
        result
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
    m.add_function(wrap_pyfunction!(_after_fork_child, m)?)?;
    m.add_function(wrap_pyfunction!(_set_main_thread, m)?)?;
    Ok(())
}
