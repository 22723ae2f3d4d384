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
//!
//! The modules, by concern:
//! - `error`: the `NrtError` exception and how the runtime's statuses map onto it;
//! - `runtime`: the process-global runtime, started on first use, and fork children;
//! - `control`: the module-level functions that configure and drive it (`configure`,
//!   `close`, faults, `reset`, tracing);
//! - `arrays`: numpy dtypes and arrays (the device's element types, raw buffers);
//! - `tensor`: `TensorInfo` and `Tensor` (device tensors);
//! - `model`: `Model`: loading, its Python methods, a call's inputs and outputs;
//! - `exec`: how an execution runs (the sync surface; the interruptible wait on the main
//!   thread);
//! - `compile`: ONNX → NCM, ONNX signatures, the built-in near-null model;
//!
//! and here, the registration of the `_nrt` module.

mod arrays;
mod compile;
mod control;
mod error;
mod exec;
mod llm;
mod llm_serving;
mod model;
mod runtime;
mod tensor;

use pyo3::prelude::*;
use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the value of a lock a panicking thread poisoned.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymodule]
fn _nrt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("NrtError", py.get_type::<error::NrtError>())?;
    m.add_class::<model::Model>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<tensor::TensorInfo>()?;
    m.add_class::<llm::LlmEngine>()?;
    m.add_class::<llm_serving::LlmServing>()?;
    m.add_class::<llm_serving::LlmRequest>()?;
    m.add_function(wrap_pyfunction!(control::configure, m)?)?;
    m.add_function(wrap_pyfunction!(control::close, m)?)?;
    m.add_function(wrap_pyfunction!(control::visible_cores, m)?)?;
    m.add_function(wrap_pyfunction!(control::inject_faults, m)?)?;
    m.add_function(wrap_pyfunction!(control::clear_faults, m)?)?;
    m.add_function(wrap_pyfunction!(control::reset, m)?)?;
    m.add_function(wrap_pyfunction!(compile::compile, m)?)?;
    m.add_function(wrap_pyfunction!(control::_trace_start, m)?)?;
    m.add_function(wrap_pyfunction!(control::_trace_stop, m)?)?;
    m.add_function(wrap_pyfunction!(arrays::_set_bf16_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(compile::_onnx_signature, m)?)?;
    m.add_function(wrap_pyfunction!(error::_statuses, m)?)?;
    m.add_function(wrap_pyfunction!(compile::_near_null, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_after_fork_child, m)?)?;
    m.add_function(wrap_pyfunction!(exec::_set_main_thread, m)?)?;
    Ok(())
}
