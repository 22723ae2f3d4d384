//! The synchronous surface (`nrt_execute` without implicit async): the whole pipeline on
//! the caller's thread — validate, bind (waiting for an I/O set if all are in flight),
//! stage, doorbell — then the caller drives the harvest until its execution's completion
//! word is written, and retires it itself: the caller is the execution's one owner.

use crate::RuntimeInner;
use crate::completion::{announce, drive};
use crate::config::SyncOnCaller;
use crate::error::Result;
use crate::harvest::{Step, completed_status};
use crate::model::ModelShared;
use crate::pipeline::{bind, doorbell, exec_error, retire, stage, unbind, validate};
use crate::tensor::TensorSet;
use crate::trace::{ClockStamps, NoStamps, Stamps};
use crate::vcore::{Surface, VCore};
use crate::wait::{Spin, VcoreWait, prepare_assisting_thread};
use nrt_hal::{NrtStatus, tuning};
use std::sync::Arc;

/// Binds with waiting: a synchronous caller waits for an I/O set (driving the harvest so the
/// executions holding them can finish).
fn bind_waiting(
    rt: &RuntimeInner,
    vc: &VCore,
    model: &ModelShared,
    inputs: &TensorSet,
    outputs: &TensorSet,
    any_host: bool,
) -> Result<u32> {
    // A set freed by another caller's retirement is not signaled: spin and yield.
    let mut spin = Spin::new();
    loop {
        if let Some(s) = bind(rt, model, inputs, outputs, any_host)? {
            return Ok(s);
        }
        if drive(rt, vc, 0) == Step::Idle {
            spin.snooze();
        }
    }
}

/// The synchronous surface: the whole pipeline on the caller's thread. Tracing costs one
/// branch here: the pipeline is instantiated with or without timestamps.
pub(crate) fn execute_sync(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
) -> Result<()> {
    if rt.trace.enabled() {
        traced(rt, model, inputs, outputs, repeat)
    } else {
        run_sync(rt, model, inputs, outputs, repeat, &mut NoStamps)
    }
}

#[cold]
#[inline(never)]
fn traced(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
) -> Result<()> {
    run_sync(rt, model, inputs, outputs, repeat, &mut ClockStamps::new())
}

#[inline(always)]
fn run_sync<S: Stamps>(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
    stamps: &mut S,
) -> Result<()> {
    stamps.mark();
    let any_host = validate(rt, model, inputs, outputs, repeat, true)?;
    let vc = &rt.vcores[model.vnc as usize];
    stamps.mark();
    // No pending marks: they make tensor reads and writes wait under implicit async, and a
    // synchronous execution only exists without it.
    let s = bind_waiting(rt, vc, model, inputs, outputs, any_host)?;
    stamps.mark();
    let seq = loop {
        match stage(rt, vc, model, s, Surface::Sync) {
            Ok(seq) => break seq,
            Err(e) if e.status == NrtStatus::QueueFull => {
                // Every slot is taken: help the harvest until one frees.
                if drive(rt, vc, 0) == Step::Idle {
                    std::thread::yield_now();
                }
            }
            Err(e) => {
                unbind(model, s);
                return Err(e);
            }
        }
    };
    stamps.mark();
    let served = serve_core(rt, vc, model);
    doorbell(rt, model);
    stamps.mark();
    let status = match served {
        Some(c) => run_served(rt, vc, model, seq, c),
        None => wait_for(rt, vc, model, seq),
    };
    stamps.mark();
    // The caller is the execution's one owner.
    retire(vc, seq, status);
    announce(vc, seq);
    if let Some(t) = stamps.boundaries() {
        rt.trace.record(seq, model.id, t);
    }
    if status.is_success() {
        Ok(())
    } else {
        Err(exec_error(model, seq, status))
    }
}

/// Whether the caller runs its execution's device work itself ([`Device::host_serves`],
/// then [`Device::assist`]), and on which core: a one-core model expected to finish within
/// [`tuning::SYNC_SERVES_CORE_MAX`] (every one-core model under [`SyncOnCaller::Always`],
/// none under [`SyncOnCaller::Never`]). The caller waits anyway; doing the work on its own
/// thread saves the two hand-offs between CPUs (the doorbell to the device thread, the
/// completion back) and, on a host with fewer spare CPUs than threads, a context switch.
/// Declared after staging and before the doorbell: a device thread that is running does not
/// take the request, and one that is parked is not woken. While the core is served, the
/// device thread leaves it alone, so nothing this call waits for before the doorbell (a free
/// I/O set, a free slot) may depend on it.
///
/// [`Device::host_serves`]: nrt_hal::Device::host_serves
/// [`Device::assist`]: nrt_hal::Device::assist
#[inline]
fn serve_core(rt: &RuntimeInner, vc: &VCore, model: &ModelShared) -> Option<u32> {
    let [c] = vc.cores[..] else {
        return None;
    };
    let serve = match rt.config.sync_on_caller {
        SyncOnCaller::Short => model
            .spin
            .expected()
            .is_some_and(|e| e < tuning::SYNC_SERVES_CORE_MAX),
        SyncOnCaller::Always => true,
        SyncOnCaller::Never => false,
    };
    if !serve {
        return None;
    }
    prepare_assisting_thread(&*rt.device);
    rt.device.host_serves(c, true).then_some(c)
}

/// Runs the core's work on the caller's thread and drives the harvest until `seq`'s
/// completion word is written, then hands the core back to the device. A core that makes no
/// progress for [`tuning::SYNC_SERVE_IDLE_POLLS`] polls (an execution longer than expected, a
/// hang, the device thread inside a poll it began before the core was served) is handed back
/// at once and waited for as usual ([`wait_for`]): the caller does not spin on it.
#[inline]
fn run_served(rt: &RuntimeInner, vc: &VCore, model: &ModelShared, seq: u64, c: u32) -> NrtStatus {
    let mut idle = 0u32;
    loop {
        let ran = rt.device.assist(c);
        match drive(rt, vc, seq) {
            Step::Done => {
                rt.device.host_serves(c, false);
                return completed_status(vc.slot(seq), seq).unwrap_or(NrtStatus::Failure);
            }
            Step::Idle if !ran => {
                idle += 1;
                if idle == tuning::SYNC_SERVE_IDLE_POLLS {
                    rt.device.host_serves(c, false);
                    return wait_for(rt, vc, model, seq);
                }
                std::hint::spin_loop();
            }
            _ => idle = 0,
        }
    }
}

/// Drives the harvest on the caller's thread until `seq`'s completion word is written and
/// returns its status (the seed's `exec_wait_round_robin`).
/// Between steps it spins while the model's spin budget says the completion is near, then
/// blocks on the vcore's completion wake ([`crate::wait`]).
fn wait_for(rt: &RuntimeInner, vc: &VCore, model: &ModelShared, seq: u64) -> NrtStatus {
    let mut w = VcoreWait::for_execution(&*rt.device, vc, &model.spin);
    loop {
        match drive(rt, vc, seq) {
            Step::Done => {
                return completed_status(vc.slot(seq), seq).unwrap_or(NrtStatus::Failure);
            }
            Step::Progress => {}
            Step::Idle => w.idle(|| completed_status(vc.slot(seq), seq).is_some()),
        }
    }
}
