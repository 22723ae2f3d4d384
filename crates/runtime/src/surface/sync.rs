//! The synchronous surface (`nrt_execute` without implicit async): the whole pipeline on
//! the caller's thread — validate, bind (waiting for an I/O set if all are in flight),
//! stage, doorbell — then the caller drives the harvest until its execution's completion
//! word is written, and retires it itself: the caller is the execution's one owner.

use crate::RuntimeInner;
use crate::completion::{announce, drive};
use crate::error::Result;
use crate::harvest::{Step, completed_status};
use crate::model::ModelShared;
use crate::pipeline::{bind, doorbell, exec_error, retire, stage, unbind, validate};
use crate::tensor::TensorSet;
use crate::trace::{ClockStamps, NoStamps, Stamps};
use crate::vcore::{Surface, VCore};
use crate::wait::{Spin, VcoreWait};
use nrt_hal::NrtStatus;
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
) -> u32 {
    // A set freed by another caller's retirement is not signaled: spin and yield.
    let mut spin = Spin::new();
    loop {
        if let Some(s) = bind(model, inputs, outputs, any_host) {
            return s;
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
    let s = bind_waiting(rt, vc, model, inputs, outputs, any_host);
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
    doorbell(rt, vc, model);
    stamps.mark();
    let status = wait_for(rt, vc, model, seq);
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
