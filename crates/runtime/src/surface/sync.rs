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
use crate::pipeline::{BindMode, bind, doorbell, exec_error, retire, stage, unbind, validate};
use crate::tensor::TensorSet;
use crate::trace::{ClockStamps, NoStamps, Stamps};
use crate::vcore::{Surface, VCore};
use crate::wait::{Spin, VcoreWait, prepare_assisting_thread, service_time};
use nrt_hal::{NrtStatus, Served, tuning};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Binds with waiting: a synchronous caller waits for an I/O set (driving the harvest so the
/// executions holding them can finish).
fn bind_waiting(
    rt: &RuntimeInner,
    vc: &VCore,
    model: &ModelShared,
    inputs: &TensorSet,
    outputs: &TensorSet,
    mode: BindMode,
    any_host: bool,
) -> Result<u32> {
    // A set freed by another caller's retirement is not signaled: spin and yield.
    let mut spin = Spin::new();
    loop {
        if let Some(s) = bind(rt, model, inputs, outputs, mode, any_host)? {
            return Ok(s);
        }
        if drive(rt, vc, 0) == Step::Idle {
            spin.snooze();
        }
    }
}

/// The synchronous surface: the whole pipeline on the caller's thread. Tracing costs one
/// branch here: the pipeline is instantiated with or without timestamps. `mode` is the
/// fork's ([`BindMode::CloneHostTensors`]): host tensors are cloned.
pub(crate) fn execute_sync(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
    mode: BindMode,
) -> Result<()> {
    if rt.trace.enabled() {
        traced(rt, model, inputs, outputs, repeat, mode)
    } else {
        run_sync(rt, model, inputs, outputs, repeat, mode, &mut NoStamps)
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
    mode: BindMode,
) -> Result<()> {
    run_sync(
        rt,
        model,
        inputs,
        outputs,
        repeat,
        mode,
        &mut ClockStamps::new(),
    )
}

#[inline(always)]
fn run_sync<S: Stamps>(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
    mode: BindMode,
    stamps: &mut S,
) -> Result<()> {
    stamps.mark();
    let any_host = validate(rt, model, inputs, outputs, repeat, mode)?;
    let vc = &rt.vcores[model.vnc as usize];
    stamps.mark();
    // No pending marks: they make tensor reads and writes wait under implicit async, and a
    // synchronous execution only exists without it.
    let s = bind_waiting(rt, vc, model, inputs, outputs, mode, any_host)?;
    stamps.mark();
    let seq = loop {
        match stage(rt, vc, model, s, Surface::Sync) {
            Ok(Some(seq)) => break seq,
            Ok(None) => {
                // The next slot is still taken (its owner has not retired it yet): help the
                // harvest until it frees.
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
    // Executions of other threads staged before this one and not yet complete: the core
    // runs them first. A caller serves the core (runs them and its own on its thread) unless
    // another caller serves it now — that one runs this execution too (`serve_queued`), and
    // this caller waits for it, blocking unless the whole queue is expected soon.
    let ahead = (seq - 1).saturating_sub(vc.completed.load(Ordering::Acquire));
    let served = if ahead == 0 || (vc.served.server() == 0 && short_queue(vc)) {
        serve_core(rt, vc, model, seq)
    } else {
        None
    };
    doorbell(rt, model);
    stamps.mark();
    let status = match served {
        Some(c) => run_served(rt, vc, model, seq, c),
        None => wait_for(rt, vc, model, seq, ahead),
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
fn serve_core(rt: &RuntimeInner, vc: &VCore, model: &ModelShared, seq: u64) -> Option<u32> {
    let [c] = vc.cores[..] else {
        return None;
    };
    let serve = match rt.config.sync_on_caller {
        SyncOnCaller::Short => service_time(&model.service, &model.spin)
            .is_some_and(|e| e < tuning::SYNC_SERVES_CORE_MAX),
        SyncOnCaller::Always => true,
        SyncOnCaller::Never => false,
    };
    if !serve {
        return None;
    }
    prepare_assisting_thread(&*rt.device);
    if !rt.device.host_serves(c, true) {
        return None;
    }
    vc.served.claim(seq);
    Some(c)
}

/// Whether a caller runs other threads' executions on its thread: the vcore's executions —
/// any model's, any thread's — are expected to take under [`tuning::SYNC_SERVES_CORE_MAX`]
/// each (a long one stays on the device thread), and no more of them are in flight than
/// the process has CPUs. With more callers than CPUs, the one serving never sleeps while
/// the others wait for their wake-ups, so it stages first each round and their executions
/// queue behind its own: `mlp` from 4 threads on 2 vCPUs, served, had a p99 of 490–810 µs
/// against 290–340 µs with the device thread running the queue (median and throughput
/// alike), `int8_gemm` 640–730 against 480–550 µs; 2 threads kept theirs.
#[inline]
fn short_queue(vc: &VCore) -> bool {
    let in_flight = vc
        .submitted
        .load(Ordering::Relaxed)
        .saturating_sub(vc.completed.load(Ordering::Relaxed));
    in_flight <= crate::wait::cpus() as u64
        && service_time(&vc.service, &vc.spin).is_some_and(|e| e < tuning::SYNC_SERVES_CORE_MAX)
}

/// Hands the core back to the device (after [`serve_core`]), then wakes the callers queued
/// behind this one that it did not run ([`nrt_hal::ServedCore::leave`]: they wait the usual
/// way). Another caller may have taken over as the server meanwhile (it saw none): its claim
/// stays. A lost race only lets two callers serve at once, which is safe (the core's lock
/// makes one poll at a time).
#[inline]
fn end_serving(rt: &RuntimeInner, vc: &VCore, seq: u64, c: u32) {
    rt.device.host_serves(c, false);
    vc.served.leave(seq);
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
                serve_queued(rt, vc, c);
                end_serving(rt, vc, seq, c);
                return completed_status(vc.slot(seq), seq).unwrap_or(NrtStatus::Failure);
            }
            Step::Idle if !ran => {
                idle += 1;
                if idle == tuning::SYNC_SERVE_IDLE_POLLS {
                    end_serving(rt, vc, seq, c);
                    return wait_for(rt, vc, model, seq, 0);
                }
                std::hint::spin_loop();
            }
            _ => idle = 0,
        }
    }
}

/// After the serving caller's own execution: runs the executions other threads staged
/// behind it meanwhile (their callers wait for them, blocked: `wait_for`), up to those staged
/// by now, for at most [`tuning::SYNC_SERVES_CORE_MAX`], then returns. Handed back at once,
/// the core sat idle while the device thread woke (a futex wake, 20–60 µs) for work that
/// was already here: `mlp` from 4 threads on one core ran at 0.75× the throughput of one
/// thread. Costs a single caller two loads.
#[inline]
fn serve_queued(rt: &RuntimeInner, vc: &VCore, c: u32) {
    let upto = vc.submitted.load(Ordering::Acquire);
    if vc.completed.load(Ordering::Acquire) >= upto || !short_queue(vc) {
        return;
    }
    serve_queued_slow(rt, vc, c, upto);
}

#[cold]
#[inline(never)]
fn serve_queued_slow(rt: &RuntimeInner, vc: &VCore, c: u32, upto: u64) {
    let until = Instant::now() + tuning::SYNC_SERVES_CORE_MAX;
    let mut idle = 0u32;
    let mut polls = 0u32;
    while vc.completed.load(Ordering::Acquire) < upto {
        let ran = rt.device.assist(c);
        if drive(rt, vc, 0) == Step::Idle && !ran {
            idle += 1;
            if idle == tuning::SYNC_SERVE_IDLE_POLLS {
                return;
            }
            std::hint::spin_loop();
        } else {
            idle = 0;
        }
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(tuning::CLOCK_READ_EVERY_POLLS) && Instant::now() >= until {
            return;
        }
    }
}

/// Drives the harvest on the caller's thread until `seq`'s completion word is written and
/// returns its status (the seed's `exec_wait_round_robin`).
/// Between steps it spins while the model's spin budget says the completion is near, then
/// blocks on its execution's own wake ([`crate::wait`], [`VCore::execution_wake`]). A
/// caller staged behind `ahead` others while another caller serves the core first waits for
/// that one to run its execution ([`wait_served`]).
fn wait_for(rt: &RuntimeInner, vc: &VCore, model: &ModelShared, seq: u64, ahead: u64) -> NrtStatus {
    if ahead != 0 {
        if let Some(status) = wait_served(vc, model, seq, ahead) {
            return status;
        }
        // The server left with this execution still queued (its time was up): serve the
        // core in its place, as a caller staging now would.
        if vc.served.server() == 0
            && short_queue(vc)
            && let Some(c) = serve_core(rt, vc, model, seq)
        {
            return run_served(rt, vc, model, seq, c);
        }
    }
    let mut w = if ahead == 0 {
        VcoreWait::for_execution(&*rt.device, vc, &model.spin, seq)
    } else {
        VcoreWait::queued(&*rt.device, vc, &model.spin, seq, ahead)
    };
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

/// The wait of a caller staged behind `ahead` others while another caller serves the core:
/// the server runs this execution too (`serve_queued`) and its harvest writes the completion
/// word, so this caller neither harvests nor lends its thread; it spins only while the whole
/// queue is expected soon ([`crate::wait::queued_spin_limit`]) and otherwise sleeps on the
/// served wake ([`nrt_hal::ServedCore`]), which only a completion written for another thread
/// or a server's leaving signals — not the device's publication of every record (woken by
/// the server's own execution first, `mlp` from two threads on one core ran at 0.77× the
/// throughput of one thread, with 2.3 futex calls per execution). The status once done;
/// `None` once nobody serves, or the server went silent: then the caller waits as usual.
fn wait_served(vc: &VCore, model: &ModelShared, seq: u64, ahead: u64) -> Option<NrtStatus> {
    let slot = vc.slot(seq);
    let spin = crate::wait::queued_spin_limit(&model.spin, ahead);
    loop {
        let server = vc.served.server();
        if server == 0 {
            return None;
        }
        match vc
            .served
            .wait(server, spin, || completed_status(slot, seq).is_some())
        {
            Served::Done => return completed_status(slot, seq),
            Served::Left => {}
            Served::Stalled => return None,
        }
    }
}
