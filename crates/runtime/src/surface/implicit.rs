//! The implicit async surface (`nrt_execute` with
//! `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0`): the caller validates, binds, stages and
//! rings the doorbell, then returns; the vcore's XU worker (`super::worker`) is the
//! execution's one owner — it retires it and calls the registered callback. Tensors bound to
//! an implicit execution are marked pending, so tensor reads and writes wait for it
//! (`super::tensor_ops`).

use crate::RuntimeInner;
use crate::completion::announce;
use crate::error::{NrtError, Result};
use crate::harvest::completed_status;
use crate::model::ModelShared;
use crate::nrt_log;
use crate::pipeline::{BindMode, retire, validate};
use crate::tensor::TensorSet;
use crate::vcore::{Surface, VCore};
use nrt_hal::{NrtStatus, tuning};
use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The implicit-async completion callback: `(model_id, vnc, job_id, status)`.
pub type AsyncCallback = Arc<dyn Fn(u32, u32, u64, NrtStatus) + Send + Sync>;

/// A registered callback, boxed so workers can load it through one atomic pointer.
pub(crate) struct CallbackBox {
    pub(crate) cb: AsyncCallback,
}

thread_local! {
    /// Set while this thread runs the implicit-async callback (an XU worker). `const`-
    /// initialized `Cell<bool>`: no allocation and no destructor registration.
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside the implicit-async completion callback.
///
/// The callback contract (`nrt.h`, `nrt_register_async_exec_callback`): the callback runs on
/// the vcore's XU worker, after its execution was retired. From inside it:
/// - tensor reads and writes work and do not wait for other pending executions (the
///   reported execution's outputs are final; an execution still in flight that shares a
///   tensor may be writing it, as on hardware);
/// - `nrt_execute` (queues another execution, or `NRT_QUEUE_FULL` at once), tensor and set
///   management, `nrta_*` polling and `nrt_tensor_check_output_completion` (which then
///   drives the harvest itself) work;
/// - the calls that would wait for the worker itself — `nrt_async_drain_queued_execs`,
///   `nrt_unload`, `nrt_close` — return `NRT_INVALID` at once and change nothing.
pub fn in_async_callback() -> bool {
    IN_CALLBACK.with(Cell::get)
}

/// The error of a call that cannot run inside the callback.
#[cold]
pub(crate) fn refused_in_callback(call: &str) -> NrtError {
    NrtError::invalid(format!(
        "{call} cannot be called from the async-exec callback: it waits for executions that \
         only this callback's worker completes (call it from another thread)"
    ))
}

/// Runs the callback with [`in_async_callback`] set.
pub(crate) fn call_marked(
    ia: &ImplicitAsync,
    model_id: u32,
    vnc: u32,
    job: u64,
    status: NrtStatus,
) {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            IN_CALLBACK.with(|c| c.set(false));
        }
    }
    IN_CALLBACK.with(|c| c.set(true));
    let _unmark = Unmark;
    ia.call(model_id, vnc, job, status);
}

/// The implicit-async mode: the seed's process-wide `async_exec_workers`.
pub(crate) struct ImplicitAsync {
    cap: u32,
    /// Implicit executions in flight per vcore.
    inflight: Box<[AtomicU32]>,
    /// The registered callback (never null; replaced boxes are kept until close so a worker
    /// that loaded the old pointer can still call it).
    pub(crate) callback: AtomicPtr<CallbackBox>,
    #[allow(
        clippy::vec_box,
        reason = "workers hold raw pointers into the boxes: they must not move"
    )]
    pub(crate) graveyard: Mutex<Vec<Box<CallbackBox>>>,
    next_job: AtomicU64,
}

impl ImplicitAsync {
    pub(crate) fn new(cap: u32, vcores: usize) -> ImplicitAsync {
        let default: AsyncCallback = Arc::new(|model_id, vnc, job_id, status| {
            if !status.is_success() {
                nrt_log!(
                    crate::log::Module::Nrt,
                    crate::log::Level::Error,
                    "async_exec_default_callback",
                    "job {job_id} of model {model_id} on vnc {vnc} completed with {status}"
                );
            }
        });
        ImplicitAsync {
            cap,
            inflight: (0..vcores).map(|_| AtomicU32::new(0)).collect(),
            callback: AtomicPtr::new(Box::into_raw(Box::new(CallbackBox { cb: default }))),
            graveyard: Mutex::new(Vec::new()),
            next_job: AtomicU64::new(1),
        }
    }

    fn call(&self, model_id: u32, vnc: u32, job: u64, status: NrtStatus) {
        let p = self.callback.load(Ordering::Acquire);
        // SAFETY: the pointer is always a live box: boxes are only freed in Drop, after the
        // workers stopped; replaced ones go to the graveyard.
        let cb = unsafe { &*p };
        (cb.cb)(model_id, vnc, job, status);
    }
}

impl Drop for ImplicitAsync {
    fn drop(&mut self) {
        let p = self.callback.swap(core::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: the pointer came from Box::into_raw and is dropped once, here.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// `nrt_execute` in implicit async mode: stage and doorbell inline, hand completion to the
/// worker, return. More than the configured in-flight cap returns `NRT_QUEUE_FULL` (the
/// public runtime's behaviour; it does not block). `mode` is the fork's
/// ([`BindMode::RefuseHostTensors`]).
pub(crate) fn execute_implicit(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
    mode: BindMode,
) -> Result<()> {
    let ia = rt.implicit_async.as_ref().expect("implicit async mode");
    validate(rt, model, inputs, outputs, repeat, mode)?;
    let vc = &rt.vcores[model.vnc as usize];
    let counter = &ia.inflight[vc.index as usize];
    if counter.fetch_add(1, Ordering::AcqRel) >= ia.cap {
        counter.fetch_sub(1, Ordering::AcqRel);
        return Err(NrtError::new(
            NrtStatus::QueueFull,
            format!(
                "{} executions already in flight on vnc {} (NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS)",
                ia.cap, vc.index
            ),
        ));
    }
    let job_id = ia.next_job.fetch_add(1, Ordering::Relaxed);
    super::submit_async(rt, vc, model, inputs, outputs, Surface::Implicit { job_id }).inspect_err(
        |_| {
            counter.fetch_sub(1, Ordering::AcqRel);
        },
    )?;
    Ok(())
}

/// The implicit surface's owner duties, run by the XU worker: retires the implicit
/// executions whose completion words are written, oldest first from `cursor`, up to the first
/// implicit one still running, and calls the callback for each — so the callback sees them
/// in submission order; returns whether any was retired. The worker owns implicit executions
/// only; the others' owners (a synchronous caller, the thread that settles an explicit one)
/// retire theirs.
pub(crate) fn retire_done(rt: &RuntimeInner, vc: &VCore, cursor: &mut u64) -> bool {
    if vc.xu.async_inflight.load(Ordering::Acquire) == 0 {
        return false;
    }
    let submitted = vc.submitted.load(Ordering::Acquire);
    let mut any = false;
    let mut seq = (*cursor).max(submitted.saturating_sub(tuning::EXEC_RING_SLOTS as u64) + 1);
    let mut advance = true;
    while seq <= submitted {
        let slot = vc.slot(seq);
        let owned = slot.ticket.current() == seq;
        if owned {
            // SAFETY: the ticket is ours to read (see harvest's protocol).
            let surface = unsafe { (*slot.info.get()).surface };
            match (surface, completed_status(slot, seq)) {
                // Callbacks report implicit executions in submission order: a later one
                // whose completion word the harvest wrote first (its record sat on a plane
                // the harvest read earlier) waits for this one.
                (Surface::Implicit { .. }, None) => break,
                (_, None) => advance = false,
                (Surface::Implicit { job_id }, Some(status)) => {
                    // SAFETY: as above.
                    let (model_id, model_vnc) = unsafe {
                        (*slot.info.get())
                            .model
                            .as_ref()
                            .map_or((0, 0), |m| (m.id, m.vnc))
                    };
                    // Its place under the in-flight cap first: once `retire` clears the
                    // pending marks, a read of its output returns, and the client that
                    // then submits the next execution must find the place free (the
                    // retiring execution still holds its I/O set and slot meanwhile, one
                    // more than the cap: the model has `EXEC_RING_SLOTS` of each, the cap is
                    // below that).
                    let ia = rt.implicit_async.as_ref();
                    if let Some(ia) = ia {
                        ia.inflight[vc.index as usize].fetch_sub(1, Ordering::AcqRel);
                    }
                    retire(vc, seq, status);
                    announce(vc, seq);
                    if let Some(ia) = ia {
                        call_marked(ia, model_id, model_vnc, job_id, status);
                    }
                    vc.xu.async_inflight.fetch_sub(1, Ordering::AcqRel);
                    any = true;
                }
                // Not the worker's: their owners retire them.
                (Surface::Sync | Surface::Explicit { .. }, Some(_)) => {}
            }
        }
        if advance {
            *cursor = seq + 1;
        }
        seq += 1;
    }
    any
}
