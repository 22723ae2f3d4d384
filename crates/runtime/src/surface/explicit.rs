//! The explicit async surface (NRT 3.0, `nrta_*`): execution units (XUs) and sequence ids.
//!
//! Each logical core has one compute XU (every execution staged on the vcore gets the next
//! seq number there) and one tensor-op XU. An explicit execution is scheduled with
//! validate → bind → stage → doorbell and returns its seq at once; its owner is whichever
//! thread runs the harvest step that finishes it (a client polling [`is_completed`], its
//! `wait`, the XU worker), which settles it in [`crate::completion::drive`]: status slot,
//! retirement, eventfds. So `is_completed` is true exactly when the slot was retired
//! ([`crate::completion::retired`]), and the status is readable then.
//!
//! Sequence ids are `(seq & 0xFFFF_FFFF_FFFF) | (xu_id << 48)` with `xu_id = vnc ×
//! NRTA_XU_TYPE_NUM + kind`; seq numbers start at 1 and increase by one per submission on
//! each XU.

use crate::RuntimeInner;
use crate::completion::{drive, retired};
use crate::error::{NrtError, Result};
use crate::harvest::{Step, completed_status};
use crate::model::ModelShared;
use crate::pipeline::{BindMode, validate};
use crate::tensor::TensorSet;
use crate::vcore::{Surface, VCore};
use crate::wait::VcoreWait;
use nrt_hal::{NrtStatus, SeqId, tuning};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The kinds of execution unit of the NRT 3.0 API (`nrta_xu_t`).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XuKind {
    /// `NRTA_XU_TENSOR_OP`: tensor reads, writes and copies.
    TensorOp = 0,
    /// `NRTA_XU_COMPUTE`: model executions.
    Compute = 1,
    /// `NRTA_XU_COLLECTIVES`: collectives (not supported by this runtime).
    Collectives = 2,
}

/// `NRTA_XU_TYPE_NUM`.
pub const XU_TYPE_NUM: u32 = 3;

impl XuKind {
    /// Decodes `nrta_xu_t`.
    pub fn from_u32(v: u32) -> Option<XuKind> {
        match v {
            0 => Some(XuKind::TensorOp),
            1 => Some(XuKind::Compute),
            2 => Some(XuKind::Collectives),
            _ => None,
        }
    }
}

pub(crate) fn xu_id(vnc: u32, kind: XuKind) -> u16 {
    (vnc * XU_TYPE_NUM + kind as u32) as u16
}

pub(crate) fn parse_seq(rt: &RuntimeInner, seq: SeqId) -> Result<(&VCore, XuKind)> {
    let id = seq.xu_id() as u32;
    let (vnc, kind) = (
        id / XU_TYPE_NUM,
        XuKind::from_u32(id % XU_TYPE_NUM).expect("mod 3"),
    );
    let vc = rt.vcores.get(vnc as usize).ok_or_else(|| {
        NrtError::invalid(format!(
            "sequence {:#x} names XU {id}, which does not exist",
            seq.0
        ))
    })?;
    Ok((vc, kind))
}

/// Checks that `seq` was issued on `vc`'s XU of `kind` and returns its seq number.
pub(crate) fn check_issued(vc: &VCore, kind: XuKind, seq: SeqId) -> Result<u64> {
    let n = seq.seq_num();
    let issued = match kind {
        XuKind::Compute => vc.submitted.load(Ordering::Acquire),
        XuKind::TensorOp => vc.xu.tensor_ops.load(Ordering::Acquire),
        XuKind::Collectives => 0,
    };
    if n == 0 || n > issued {
        return Err(NrtError::invalid(format!(
            "sequence {:#x} was never issued",
            seq.0
        )));
    }
    Ok(n)
}

/// The vcore of an XU named by `vnc` and `queue` (every XU has only queue 0).
pub(crate) fn xu_vcore(rt: &RuntimeInner, vnc: u32, queue: i32) -> Result<&VCore> {
    let vc = rt
        .vcores
        .get(vnc as usize)
        .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
    if queue != 0 {
        return Err(NrtError::invalid(format!(
            "queue {queue} does not exist on the XUs of logical NeuronCore {vnc}"
        )));
    }
    Ok(vc)
}

/// Whether compute execution `seq` completed (`nrta_is_completed`), helping the harvest
/// once if not.
pub(crate) fn is_completed(rt: &RuntimeInner, vc: &VCore, seq: SeqId) -> Result<bool> {
    let n = check_issued(vc, XuKind::Compute, seq)?;
    if retired(vc, n) {
        return Ok(true);
    }
    // Help the harvest along (re-entrant, non-blocking); it settles what it finishes.
    if drive(rt, vc, n) == Step::Idle {
        // It may assist below: readied on its first idle poll, not on its first assist.
        crate::wait::prepare_assisting_thread(&*rt.device);
        // A client polling in a loop is a spinning waiter too: once in
        // POLLER_ASSIST_EVERY_IDLE_POLLS idle harvest polls of the vcore (any poller's), lend
        // this thread to the device, whose own thread may not be running (wait.rs) — for
        // short executions only: a poll must not turn into running a long one.
        // Once an assist ran work, the next poll assists again, until one finds nothing.
        let idle = vc.idle_polls.load(Ordering::Relaxed);
        if (vc.assisting.load(Ordering::Relaxed)
            || idle.is_multiple_of(tuning::POLLER_ASSIST_EVERY_IDLE_POLLS))
            && vc
                .spin
                .expected()
                .is_some_and(|e| e < tuning::WAIT_SPIN_CAP)
        {
            let mut ran = false;
            for &c in &vc.cores {
                ran |= rt.device.assist(c);
            }
            vc.assisting.store(ran, Ordering::Relaxed);
        }
    }
    Ok(retired(vc, n))
}

/// Waits for compute execution `seq` on the calling thread (driving the harvest) and
/// returns its status.
pub(crate) fn wait(rt: &RuntimeInner, vc: &VCore, seq: SeqId) -> Result<NrtStatus> {
    let n = check_issued(vc, XuKind::Compute, seq)?;
    // Retirement is signaled: by the device's records, or by the step that settled it.
    let mut w = VcoreWait::new(&*rt.device, vc, vc.spin.spin_limit());
    while !retired(vc, n) {
        if drive(rt, vc, n) == Step::Idle {
            w.idle(|| retired(vc, n));
        }
    }
    // The completion word outlives retirement until the slot is reused by a later
    // execution; by then the status is no longer kept.
    Ok(completed_status(vc.slot(n), n).unwrap_or(NrtStatus::Success))
}

/// Whether compute execution `n` (issued) completed, for the eventfd registration.
pub(crate) fn completed_already(vc: &VCore, n: u64) -> bool {
    retired(vc, n)
}

/// Schedules an execution on the compute XU (`nrta_execute_schedule`): validate, bind,
/// stage, doorbell; returns its seq id at once. `status`, if not null, is written when the
/// execution is settled, before [`is_completed`] turns true.
pub(crate) fn schedule(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    queue: i32,
    status: *mut i32,
) -> Result<SeqId> {
    if queue != 0 {
        return Err(NrtError::invalid(format!(
            "queue {queue}: the compute XU has only queue 0"
        )));
    }
    // The seed's explicit surface carries mode 1 (`EXPLICIT_ASYNC`) but refuses host tensors
    // before its bind, which is what this mode does.
    validate(rt, model, inputs, outputs, 1, BindMode::RefuseHostTensors)?;
    let vc = &rt.vcores[model.vnc as usize];
    if vc.unrecoverable.load(Ordering::Acquire) {
        return Err(NrtError::new(
            NrtStatus::ExecUnitUnrecoverable,
            format!("compute XU of vnc {} is in a fatal state", vc.index),
        ));
    }
    let seq = super::submit_async(rt, vc, model, inputs, outputs, Surface::Explicit { status })?;
    Ok(SeqId::new(xu_id(vc.index, XuKind::Compute), seq))
}
