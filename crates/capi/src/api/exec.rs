//! Execution: `nrt_execute`, `nrt_execute_repeat`, and the implicit-async controls
//! `nrt_register_async_exec_callback`, `nrt_async_drain_queued_execs`.
//!
//! The hot path adds to the runtime's own work: one atomic load (the phase), three handle
//! pins (an atomic add and an atomic sub each, on cache lines nobody else writes in steady
//! state), two epoch compares, and one relaxed load for the DEBUG check. No allocation, no
//! lock. `tests/zero_alloc.rs` counts allocations around 1000 calls.

use crate::ffi::{Fail, Res, api, ensure_open, pin};
use crate::state::{self, MODELS, SetEntry};
use crate::types::NrtStatusC;
use nrt_runtime::{NrtError, NrtStatus};
use std::ffi::c_void;
use std::sync::Arc;

#[inline]
fn check_set_epoch(s: &SetEntry, model_epoch: u64, arg: &str) -> Res {
    if s.min_epoch >= model_epoch {
        Ok(())
    } else {
        Err(old_tensors(arg))
    }
}

#[cold]
fn old_tensors(arg: &str) -> Fail {
    Fail::Err(NrtError::invalid(format!(
        "{arg} holds tensor(s) of a runtime that nrt_close closed; add tensors of this runtime"
    )))
}

/// Pins and checks a model and its two sets; runs `f` on them.
#[inline]
pub(crate) fn with_model_sets<R>(
    model: *const c_void,
    input_set: *const c_void,
    output_set: *const c_void,
    f: impl FnOnce(&state::ModelEntry, &SetEntry, &SetEntry) -> Res<R>,
) -> Res<R> {
    ensure_open()?;
    let m = pin(&MODELS, model, "model")?;
    let i = super::set::set(input_set, "input_set")?;
    let o = super::set::set(output_set, "output_set")?;
    check_set_epoch(&i, m.epoch, "input_set")?;
    check_set_epoch(&o, m.epoch, "output_set")?;
    f(&m, &i, &o)
}

/// `NRT_STATUS nrt_execute(nrt_model_t *model, const nrt_tensor_set_t *input_set,
/// nrt_tensor_set_t *output_set)`: runs the model once (synchronously, or queued in
/// implicit async mode: `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0`).
#[unsafe(no_mangle)]
pub extern "C" fn nrt_execute(
    model: *mut c_void,
    input_set: *const c_void,
    output_set: *mut c_void,
) -> NrtStatusC {
    api("nrt_execute", || {
        crate::api_in!(
            "nrt_execute",
            "model={model:p}, input_set={input_set:p}, output_set={output_set:p}"
        );
        with_model_sets(model, input_set, output_set, |m, i, o| {
            m.rt.execute(&m.model, &i.set, &o.set)?;
            Ok(())
        })
    })
}

/// `NRT_STATUS nrt_execute_repeat(nrt_model_t *model, const nrt_tensor_set_t *input_set,
/// nrt_tensor_set_t *output_set, int repeat_count)`: `repeat_count` ≤ 1 runs once; more
/// needs a model compiled for repetition, which ours are not (`NRT_INVALID`).
#[unsafe(no_mangle)]
pub extern "C" fn nrt_execute_repeat(
    model: *mut c_void,
    input_set: *const c_void,
    output_set: *mut c_void,
    repeat_count: i32,
) -> NrtStatusC {
    api("nrt_execute_repeat", || {
        crate::api_in!(
            "nrt_execute_repeat",
            "model={model:p}, input_set={input_set:p}, output_set={output_set:p}, repeat_count={repeat_count}"
        );
        with_model_sets(model, input_set, output_set, |m, i, o| {
            m.rt.execute_repeat(&m.model, &i.set, &o.set, repeat_count)?;
            Ok(())
        })
    })
}

/// `NRT_ASYNC_EXEC_STATUS_CALLBACK`.
pub type AsyncExecStatusCallback = unsafe extern "C" fn(
    params: *mut c_void,
    model_id: u32,
    vnc: u32,
    job_id: u64,
    status: NrtStatusC,
);

/// `NRT_STATUS nrt_register_async_exec_callback(NRT_ASYNC_EXEC_STATUS_CALLBACK callback,
/// void *params)`: replaces the implicit-async completion callback (called on a runtime
/// thread with `params`). `NRT_INVALID` unless the runtime is in implicit async mode.
///
/// # Safety
/// `callback` must be safe to call from any thread with `params` until `nrt_close`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_register_async_exec_callback(
    callback: Option<AsyncExecStatusCallback>,
    params: *mut c_void,
) -> NrtStatusC {
    api("nrt_register_async_exec_callback", || {
        crate::api_in!(
            "nrt_register_async_exec_callback",
            "callback={:?}, params={params:p}",
            callback.map(|f| f as *const c_void)
        );
        let Some(cb) = callback else {
            return Err(crate::ffi::invalid("invalid argument: callback is NULL"));
        };
        let rt = state::runtime()?;
        let params = params as usize;
        rt.rt.register_async_callback(Arc::new(
            move |model_id, vnc, job_id, status: NrtStatus| {
                // SAFETY: the caller registered a callback that is safe to call with `params`
                // from any thread (API contract).
                unsafe {
                    cb(
                        params as *mut c_void,
                        model_id,
                        vnc,
                        job_id,
                        status.as_i32(),
                    )
                }
            },
        ))?;
        Ok(())
    })
}

/// `NRT_STATUS nrt_async_drain_queued_execs(int32_t vnc)`: waits until every queued
/// implicit-async execution on `vnc` (`-1`: all) completed and was reported.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_async_drain_queued_execs(vnc: i32) -> NrtStatusC {
    api("nrt_async_drain_queued_execs", || {
        crate::api_in!("nrt_async_drain_queued_execs", "vnc={vnc}");
        // Blocking: hold a clone, not a pin (nrt_close must not wait for us).
        let (rt, _) = state::runtime_clone()?;
        rt.async_drain(vnc)?;
        Ok(())
    })
}

/// `NRT_STATUS nrt_sim_inject_faults(const char *plan)` (nrt-rs extension, in
/// `nrt_experimental.h`): arms a fault plan in `NRT_SIM_FAULTS` syntax on this process's
/// software NeuronCore. The whole plan is checked before anything is armed.
///
/// # Safety
/// `plan` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_sim_inject_faults(plan: *const std::ffi::c_char) -> NrtStatusC {
    api("nrt_sim_inject_faults", || {
        // SAFETY: the caller's contract on `plan`.
        let plan = unsafe { crate::ffi::cstr(plan, "plan")? };
        crate::api_in!("nrt_sim_inject_faults", "plan={plan:?}");
        let rt = state::runtime()?;
        let specs = nrt_sim::parse_faults(plan)
            .map_err(|e| Fail::Err(NrtError::invalid(format!("invalid argument: {e}"))))?;
        let cores = rt.device.config().cores;
        if let Some(f) = specs.iter().find(|f| f.core >= cores) {
            return Err(Fail::Err(NrtError::invalid(format!(
                "invalid argument: fault {f}: core {} does not exist (the device has {cores} cores)",
                f.core
            ))));
        }
        for spec in specs {
            // "Next" is the next execution submitted on the core, not one already queued.
            let staged = rt.rt.staged_on_core(spec.core);
            rt.device
                .inject_after_staged(spec, staged)
                .map_err(|e| Fail::Err(NrtError::invalid(format!("invalid argument: {e}"))))?;
        }
        Ok(())
    })
}

/// `NRT_STATUS nrt_sim_clear_faults(void)` (nrt-rs extension): removes every planned fault.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_sim_clear_faults() -> NrtStatusC {
    api("nrt_sim_clear_faults", || {
        crate::api_in!("nrt_sim_clear_faults", "");
        state::runtime()?.device.clear_faults();
        Ok(())
    })
}

/// `NRT_STATUS nrt_reset_vnc(int32_t vnc)` (nrt-rs extension): resets logical core `vnc`
/// after a fatal error, so it accepts executions again.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_reset_vnc(vnc: i32) -> NrtStatusC {
    api("nrt_reset_vnc", || {
        crate::api_in!("nrt_reset_vnc", "vnc={vnc}");
        let rt = state::runtime()?;
        let vnc = u32::try_from(vnc).map_err(|_| {
            Fail::Err(NrtError::invalid(format!(
                "invalid argument: vnc {vnc} is not a logical NeuronCore"
            )))
        })?;
        rt.rt.reset_vnc(vnc)?;
        Ok(())
    })
}
