//! The surfaces: the three ways an execution is submitted and completed. Each drives the
//! pipeline's stages (`crate::pipeline`) and consumes completions through the seam
//! (`crate::completion`); none is called by the harvest.
//!
//! - [`sync`] — `nrt_execute`: the caller runs every stage and owns its execution;
//! - [`implicit`] — `nrt_execute` in implicit async mode: the XU worker owns it and calls the
//!   callback;
//! - [`explicit`] — `nrta_execute_schedule` / `nrta_is_completed`: the thread whose harvest
//!   step finishes it owns it;
//! - [`worker`] — the XU worker thread that drives the harvest for both async surfaces;
//! - [`tensor_ops`] — tensor reads, writes and copies, which wait for pending implicit
//!   executions (the tensor-op XU's work).

pub(crate) mod explicit;
pub(crate) mod implicit;
pub(crate) mod sync;
pub(crate) mod tensor_ops;
pub(crate) mod worker;

use crate::RuntimeInner;
use crate::error::{NrtError, Result};
use crate::model::ModelShared;
use crate::pipeline::{
    BindMode, bind, doorbell, mark_pending, marks_pending, release_pending, slot_taken_error,
    stage, unbind,
};
use crate::tensor::TensorSet;
use crate::vcore::{Surface, VCore};
use nrt_hal::NrtStatus;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Bind, stage, doorbell for an async surface (implicit or explicit); returns the seq.
/// Counts the execution in the XU's async in-flight count, which keeps the worker driving
/// the harvest until the execution's owner retires it.
pub(crate) fn submit_async(
    rt: &RuntimeInner,
    vc: &VCore,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    surface: Surface,
) -> Result<u64> {
    let s = bind(
        rt,
        model,
        inputs,
        outputs,
        BindMode::RefuseHostTensors,
        false,
    )?
    .ok_or_else(|| {
        NrtError::new(
            NrtStatus::QueueFull,
            format!("every I/O set of model '{}' is in flight", model.name),
        )
    })?;
    // Pending marks make tensor reads and writes wait; only implicit async mode does.
    let mark = marks_pending(rt, surface);
    if mark {
        mark_pending(model, s);
    }
    let before = vc.xu.async_inflight.fetch_add(1, Ordering::AcqRel);
    match stage(rt, vc, model, s, surface).and_then(|seq| seq.ok_or_else(|| slot_taken_error(vc))) {
        Ok(seq) => {
            doorbell(rt, model);
            if before == 0 {
                // The worker parks only while nothing async is in flight, so only the
                // submission that ends that state has to wake it (its sleep re-checks the
                // count after announcing itself, so no wake-up is lost).
                vc.xu.gate.notify();
            }
            Ok(seq)
        }
        Err(e) => {
            vc.xu.async_inflight.fetch_sub(1, Ordering::AcqRel);
            if mark {
                release_pending(model, s);
                // A read of one of its tensors may be blocked waiting for it.
                vc.signal_waiters();
            }
            unbind(model, s);
            Err(e)
        }
    }
}
