//! The module-level functions that configure and drive the process-global runtime:
//! `configure`, `close`, `visible_cores`, `inject_faults` / `clear_faults`, `reset`, and the
//! trace recording behind `nrt.profile` (`_trace_start`, `_trace_stop`).

use crate::error::{from_rt, invalid, nrt_err};
use crate::exec::INTERRUPTIBLE;
use crate::lock;
use crate::runtime::{GLOBAL, SETTINGS, global, leave_parent_runtime, set_log_levels};
use nrt_hal::NrtStatus;
use nrt_runtime::log::Level;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

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
pub(crate) fn configure(
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
pub(crate) fn close(py: Python<'_>) -> PyResult<()> {
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
pub(crate) fn visible_cores(py: Python<'_>) -> PyResult<Vec<Vec<u32>>> {
    Ok(global(py)?.vnc_cores.clone())
}

/// Arms a fault plan on this process's software NeuronCore only (syntax of NRT_SIM_FAULTS,
/// e.g. "fatal", "hang@engine=act", "nan@exec=5,count=2"). `core=` counts among this
/// process's logical cores (as Model.load's `core` does); `exec` absent or 0 means the
/// core's next execution.
#[pyfunction]
pub(crate) fn inject_faults(py: Python<'_>, spec: &str) -> PyResult<()> {
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
pub(crate) fn clear_faults(py: Python<'_>) -> PyResult<()> {
    global(py)?.device.clear_faults();
    Ok(())
}

/// Resets logical core `core` after a fatal error (Runtime::reset_vnc; nrt_reset).
#[pyfunction]
#[pyo3(signature = (core=0))]
pub(crate) fn reset(py: Python<'_>, core: u32) -> PyResult<()> {
    let g = global(py)?;
    py.allow_threads(|| g.rt.reset_vnc(core)).map_err(from_rt)
}

/// Starts recording per-stage spans (used by `nrt.profile`).
#[pyfunction]
pub(crate) fn _trace_start(py: Python<'_>) -> PyResult<()> {
    let g = global(py)?;
    g.tracing.store(true, Ordering::Relaxed);
    g.rt.set_tracing(true);
    Ok(())
}

/// Stops recording and writes the spans as Chrome trace-event JSON to `path`; returns the
/// number of spans.
#[pyfunction]
pub(crate) fn _trace_stop(py: Python<'_>, path: PathBuf) -> PyResult<usize> {
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
