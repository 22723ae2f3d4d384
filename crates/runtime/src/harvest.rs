//! The harvest: ONE re-entrant step function, [`progress_one_step`]. It ends at each
//! finished execution's completion word; what happens after that belongs to the
//! execution's one owner ([`crate::completion`]).
//!
//! Completion is learned only by reading the notification rings the device writes — never
//! from an interrupt or a callback. Every execution in flight on a vcore advances through
//!
//! ```text
//! INIT ──► WAIT_BARRIER_PROXY (lockstep executions: until every core has started)
//!     └──► WAIT_CORE (sweep cores × 5 engines: START_PENDING → END_PENDING → COMPLETE)
//!                   └──► DONE   (all engines COMPLETE, an aborting ERROR record, or the
//!                                 deadline: cause bit 29 → NRT_TIMEOUT, else NQ overflow)
//! ```
//!
//! Any thread may call the step (through [`crate::completion::drive`]): the synchronous
//! caller for its own execution (the seed's `exec_wait_round_robin`), the XU worker for async
//! ones (`tpb_xu_step`), a client polling the explicit surface. One step takes the vcore's
//! harvest token with a `try_lock` (never blocking: a thread that finds it taken simply
//! checks its completion word), drains every ring of every core of the vcore, advances
//! whichever executions the records belong to, and writes each finished execution's
//! completion word. The token is what makes the rings single-consumer.
//!
//! The step calls nothing above it. It returns, besides what it did, the set of explicit
//! executions it finished (one bit per slot, [`Owed`]): the calling thread becomes their
//! owner and settles them (status slot, retirement, eventfds). A synchronous execution's
//! owner is its caller and an implicit one's the XU worker; both find the completion word.
//!
//! # Who writes what (per in-flight slot)
//!
//! | field | written by | ordering |
//! |---|---|---|
//! | `ticket` | the stager, under the staging lock, *before* the triggers are pushed (`SlotTicket::publish`); the retirer clears it (`release`) | `Release` / read `Acquire` |
//! | `info` | the stager before `ticket`; read by the harvest and the owner while the ticket is set | ordered by `ticket` |
//! | completion word | the harvest (under the token), once (`SlotTicket::complete`) | `Release` / read `Acquire` |
//! | harvest progress | the harvest (under the token) | token |
//!
//! The ticket and completion word are `nrt_hal::SlotTicket`, whose protocol is model-checked
//! with loom (`hal/tests/loom.rs`, `slot_ticket_*`).

use crate::RuntimeInner;
use crate::trace::EngineTimes;
use crate::vcore::{InflightSlot, Surface, VCore};
use nrt_hal::wire::{CUSTOM_SUB_ID_OUTPUT_DONE, CUSTOM_SUBTYPE_TENSOR, cause};
use nrt_hal::{
    ERROR_RING, ErrorSubtype, NUM_ENGINES, NqRecord, NrtStatus, PlaneConsumer, PlaneWatch,
    RecordKind, tuning,
};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A state of the harvest machine for one execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Published, nothing seen yet.
    Init,
    /// Lockstep execution: waiting until every core of the vcore has started.
    WaitBarrierProxy,
    /// Sweeping the engines of every core.
    WaitCore,
    /// Finished (its completion word is written).
    Done,
}

/// Per-engine sub-state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineState {
    /// No START yet.
    StartPending,
    /// Started, no END yet.
    EndPending,
    /// Ended.
    Complete,
}

/// Harvest-side progress of the execution occupying one in-flight slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Progress {
    seq: u64,
    phase: Phase,
    sg_count: u8,
    engines: [[EngineState; NUM_ENGINES]; crate::MAX_LOCKSTEP_CORES],
    complete: u8,
    error: Option<ErrorSubtype>,
}

impl Progress {
    pub(crate) const EMPTY: Progress = Progress {
        seq: 0,
        phase: Phase::Init,
        sg_count: 1,
        engines: [[EngineState::StartPending; NUM_ENGINES]; crate::MAX_LOCKSTEP_CORES],
        complete: 0,
        error: None,
    };
}

/// The harvest token's state: the consumer halves of every ring of the vcore and the
/// progress of every in-flight slot.
pub(crate) struct Harvest {
    /// Per core of the vcore: its notification plane (five INFER_STATUS rings and the ERROR
    /// ring).
    pub(crate) rings: Vec<PlaneConsumer>,
    pub(crate) progress: Box<[Progress]>,
    /// When deadlines were last swept ([`coarse_now`]).
    pub(crate) last_sweep: Duration,
    /// Per in-flight slot: the device timestamps of its engines' START/END records (trace
    /// mode only; zero otherwise).
    pub(crate) times: Box<[EngineTimes]>,
}

/// Slots whose engines all ended during the current step: finished only after the ERROR rings
/// were read once more. The device posts an error before the END records of the same
/// execution, so once an END is seen, a second read of the ERROR ring sees every error that
/// preceded it — reading rings one after the other could otherwise see the END first.
type Ready = u64;
const _: () = assert!(
    tuning::EXEC_RING_SLOTS <= Ready::BITS,
    "the ready set is one bit per slot"
);

/// Explicit executions finished by one step, one bit per in-flight slot: handed to the
/// thread that ran the step, which must settle them ([`crate::completion::drive`]).
pub(crate) type Owed = u64;

/// What one step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The target execution is done.
    Done,
    /// Records were consumed (maybe for other executions).
    Progress,
    /// Nothing new (or another thread holds the token).
    Idle,
}

/// The status an ERROR-ring subtype decodes to (the seed's `exec_request_process_errors`).
pub fn error_status(sub: ErrorSubtype) -> NrtStatus {
    match sub {
        ErrorSubtype::Transient => NrtStatus::ExecCompletedWithErr,
        ErrorSubtype::Numerical => NrtStatus::ExecCompletedWithNumErr,
        ErrorSubtype::Uncorrectable => NrtStatus::ExecHwErrNcUe,
        ErrorSubtype::DmaAbort => NrtStatus::ExecHwErrDmaAbort,
        ErrorSubtype::OutOfBounds => NrtStatus::ExecOob,
        ErrorSubtype::HbmUncorrectable => NrtStatus::ExecHwErrHbmUe,
        ErrorSubtype::Fatal => NrtStatus::ExecUnitUnrecoverable,
        ErrorSubtype::InvalidInstruction => NrtStatus::ExecBadInput,
    }
}

/// The status of `seq` if its completion word is written.
#[inline]
pub(crate) fn completed_status(slot: &InflightSlot, seq: u64) -> Option<NrtStatus> {
    slot.ticket
        .completed(seq)
        .map(|s| NrtStatus::try_from(s as i32).unwrap_or(NrtStatus::Failure))
}

/// One step of the harvest machine on vcore `vc`, on behalf of execution `target` (a seq;
/// 0 = none in particular). Re-entrant: any number of threads may call it concurrently.
/// `worker`: the XU worker runs it (that does not count as someone else harvesting, see
/// [`crate::vcore::VcoreCounters::external_harvests`]). The explicit executions it finished
/// are added to `owed`.
pub(crate) fn progress_one_step(
    rt: &RuntimeInner,
    vc: &VCore,
    target: u64,
    worker: bool,
    owed: &mut Owed,
) -> Step {
    if target != 0 && completed_status(vc.slot(target), target).is_some() {
        return Step::Done;
    }
    if !vc.watch.iter().any(PlaneWatch::has_records) {
        // Nothing published: no need for the token. One idle poll in
        // HARVEST_DEADLINE_EVERY_IDLE_STEPS still takes it, to sweep the deadlines.
        let n = vc.idle_polls.load(Ordering::Relaxed).wrapping_add(1);
        vc.idle_polls.store(n, Ordering::Relaxed);
        if !n.is_multiple_of(tuning::HARVEST_DEADLINE_EVERY_IDLE_STEPS) {
            if !worker {
                note_external_harvest(vc);
            }
            return Step::Idle;
        }
    }
    let Ok(mut guard) = vc.harvest.try_lock() else {
        return Step::Idle;
    };
    let h = &mut *guard;
    let mut consumed = 0u32;
    // Whether this step wrote a completion word some other thread may be blocked on, and
    // the slots of those whose owner is a synchronous caller, which sleeps on its
    // execution's own wake (`Ready::MAX`: any slot, from a rare path that does not list them).
    let mut others = false;
    let mut sync_owners: Ready = 0;
    let mut sets = Sets { ready: 0, owed: 0 };
    for (pos, plane) in h.rings.iter_mut().enumerate() {
        let (progress, times) = (&mut h.progress, &mut h.times);
        consumed +=
            plane.drain_all(|_, rec| on_record(rt, vc, progress, times, pos, rec, &mut sets));
    }
    if sets.ready != 0 {
        for (pos, plane) in h.rings.iter_mut().enumerate() {
            let (progress, times) = (&mut h.progress, &mut h.times);
            consumed += plane.drain(ERROR_RING, |_, rec| {
                on_record(rt, vc, progress, times, pos, rec, &mut sets)
            });
        }
        while sets.ready != 0 {
            let si = sets.ready.trailing_zeros() as usize;
            sets.ready &= sets.ready - 1;
            let p = &mut h.progress[si];
            let slot = &vc.slots[si];
            if p.phase != Phase::Done && slot.ticket.current() == p.seq {
                let status = p.error.map_or(NrtStatus::Success, error_status);
                let seq = p.seq;
                if rt.trace.enabled() {
                    // The device stamps engine times in trace mode only.
                    record_engine_spans(rt, slot, seq, &h.times[si], p.sg_count);
                    record_device_time(vc, &h.times[si], p.sg_count);
                }
                let sync = finish(vc, si, p, seq, status, &mut sets.owed);
                if seq != target {
                    others = true;
                    sync_owners |= Ready::from(sync) << si;
                }
            }
        }
    }
    *owed |= sets.owed;
    if consumed == 0 {
        if vc.unrecoverable.load(Ordering::Acquire) {
            // An execution staged while the fatal error was being recorded (it read the flag
            // just before it was set) is failed here, on the next idle step.
            fail_inflight_unrecoverable(vc, &mut h.progress, 0, owed);
            (others, sync_owners) = (true, Ready::MAX);
        }
        // Deadlines are seconds away; idle polls get here once in
        // HARVEST_DEADLINE_EVERY_IDLE_STEPS (above).
        let now = coarse_now();
        if now.saturating_sub(h.last_sweep) >= tuning::HARVEST_DEADLINE_SWEEP {
            h.last_sweep = now;
            sweep_deadlines(rt, vc, &mut h.progress, now, owed);
            if vc.cores.len() > 1 {
                note_lockstep_serving(rt, vc);
            }
            // Rare (once per sweep period): whatever it finished, wake.
            (others, sync_owners) = (true, Ready::MAX);
        }
    }
    drop(guard);
    if others {
        // Owners blocked on the vcore's wake check their completion words (one fence and
        // one load when nobody is blocked); a synchronous owner asleep on its execution's
        // own wake is woken by that one alone. A step that finished only its caller's own
        // execution skips this: nobody else waits for it.
        vc.signal_completions(sync_owners);
    }
    if !worker {
        note_external_harvest(vc);
    }
    if target != 0 && completed_status(vc.slot(target), target).is_some() {
        Step::Done
    } else if consumed != 0 {
        Step::Progress
    } else {
        Step::Idle
    }
}

/// Tells the XU worker that a thread other than itself polls the harvest: counted whether or
/// not the poll found records (when the worker also harvests, a client's polls often find
/// the rings drained, and the worker must still see that someone else is polling). A load and
/// a store, not a locked increment: concurrent pollers may lose counts, and the worker only
/// looks for change.
#[inline]
fn note_external_harvest(vc: &VCore) {
    let c = &vc.counters.external_harvests;
    c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// Hands a traced execution's engine timestamps to the trace ring (before `finish`: once
/// the completion word is written, the owner may retire the slot).
#[cold]
fn record_engine_spans(
    rt: &RuntimeInner,
    slot: &InflightSlot,
    seq: u64,
    times: &EngineTimes,
    cores: u8,
) {
    // SAFETY: ticket set (checked by the caller under the token), completion word not yet
    // written: `info` is stable.
    let model = unsafe { (*slot.info.get()).model.as_ref().map_or(0, |m| m.id) };
    rt.trace.record_engines(seq, model, times, cores);
}

/// A START (`end == false`) or END record of the execution tracked in `p` (slot `si`):
/// advances the engine's sub-state (START_PENDING → END_PENDING → COMPLETE), leaves
/// WAIT_BARRIER_PROXY once every core has started, marks the slot ready when every engine
/// ended, and keeps the device timestamp of a traced execution.
#[inline(always)]
fn engine_record(
    p: &mut Progress,
    times: &mut [EngineTimes],
    si: usize,
    core_pos: usize,
    end: bool,
    rec: &NqRecord,
    ready: &mut Ready,
) {
    let (e, c) = (
        (rec.engine as usize).min(NUM_ENGINES - 1),
        core_pos.min(crate::MAX_LOCKSTEP_CORES - 1),
    );
    let ts = rec.timestamp_ns();
    if ts != 0 {
        times[si][c][e][end as usize] = ts;
    }
    if !end {
        p.engines[c][e] = EngineState::EndPending;
        if p.phase == Phase::WaitBarrierProxy
            && (0..p.sg_count as usize)
                .all(|k| p.engines[k].iter().any(|s| *s != EngineState::StartPending))
        {
            p.phase = Phase::WaitCore;
        }
        return;
    }
    if p.engines[c][e] != EngineState::Complete {
        p.engines[c][e] = EngineState::Complete;
        p.complete += 1;
    }
    if p.complete as usize == NUM_ENGINES * p.sg_count as usize {
        *ready |= 1 << si;
    }
}

/// The slot sets one step builds: `ready` (every engine ended; finished after a second read
/// of the ERROR rings) and `owed` (explicit executions it finished, for the caller).
struct Sets {
    ready: Ready,
    owed: Owed,
}

/// Routes one record to the execution it belongs to.
#[inline(always)]
fn on_record(
    rt: &RuntimeInner,
    vc: &VCore,
    progress: &mut [Progress],
    times: &mut [EngineTimes],
    core_pos: usize,
    rec: NqRecord,
    sets: &mut Sets,
) {
    let si = rec.compute_idx as usize % tuning::EXEC_RING_SLOTS as usize;
    // Fast path: a START or END of an execution this harvest already tracks in WAIT_CORE.
    // Its ticket was checked on its first record, and it cannot have been retired since:
    // only a finished execution is retired, and finishing sets its phase to DONE.
    let p = &mut progress[si];
    if p.phase == Phase::WaitCore && p.seq != 0 && (p.seq - 1) as u32 == rec.compute_idx {
        let end = match rec.record_kind() {
            Some(RecordKind::Start) => false,
            Some(RecordKind::End) => true,
            _ => return on_record_slow(rt, vc, progress, times, core_pos, rec, sets),
        };
        engine_record(p, times, si, core_pos, end, &rec, &mut sets.ready);
        return;
    }
    on_record_slow(rt, vc, progress, times, core_pos, rec, sets);
}

/// [`on_record`] for the first record of an execution, errors, custom records, lockstep
/// executions and stale records.
#[inline(never)]
fn on_record_slow(
    rt: &RuntimeInner,
    vc: &VCore,
    progress: &mut [Progress],
    times: &mut [EngineTimes],
    core_pos: usize,
    rec: NqRecord,
    sets: &mut Sets,
) {
    let si = rec.compute_idx as usize % tuning::EXEC_RING_SLOTS as usize;
    let slot = &vc.slots[si];
    let seq = slot.ticket.current();
    if seq == 0 || (seq - 1) as u32 != rec.compute_idx || completed_status(slot, seq).is_some() {
        return; // a record of an execution that already finished (timed out, aborted)
    }
    // SAFETY: the ticket is set (acquired above), so `info` was fully written by the stager
    // and is not touched by anyone else until the completion word is written (by us, under
    // the token) and the owner retires the slot.
    let info = unsafe { &*slot.info.get() };
    let p = &mut progress[si];
    if p.seq != seq {
        *p = Progress::EMPTY;
        p.seq = seq;
        p.sg_count = info.sg_count;
        times[si] = [[[0; 2]; NUM_ENGINES]; crate::MAX_LOCKSTEP_CORES];
        p.phase = if info.sg_count > 1 {
            vc.counters
                .barrier_proxy_waits
                .fetch_add(1, Ordering::Relaxed);
            Phase::WaitBarrierProxy
        } else {
            Phase::WaitCore
        };
    }
    match rec.record_kind() {
        Some(RecordKind::Start) => {
            engine_record(p, times, si, core_pos, false, &rec, &mut sets.ready)
        }
        Some(RecordKind::End) => engine_record(p, times, si, core_pos, true, &rec, &mut sets.ready),
        Some(RecordKind::Error) => {
            rt.device
                .interrupt_cause_clear(rec.core as u32, cause::ERROR_NOTIFICATION)
                .ok();
            let sub =
                ErrorSubtype::from_u8(rec.subtype).unwrap_or(ErrorSubtype::InvalidInstruction);
            crate::nrt_log!(
                crate::log::Module::Tdrv,
                crate::log::Level::Error,
                "notification_consume_errors",
                "execution {} of model '{}' on nc {}: {} error on engine {} at instruction {}{}",
                seq,
                info.model.as_ref().map_or("?", |m| m.name.as_str()),
                rec.core,
                sub.name(),
                nrt_hal::Engine::from_index(rec.engine).map_or("?", |e| e.name()),
                rec.payload,
                if sub == ErrorSubtype::InvalidInstruction {
                    " (the device cannot run it: an undecodable block, an operand outside \
                     device memory, or kernel scratch past KERNEL_SCRATCH_MAX_BYTES)"
                } else {
                    ""
                }
            );
            // The first error wins; an aborting one ends the execution now.
            if p.error.is_none() {
                p.error = Some(sub);
            }
            if sub.aborts_execution() {
                finish(vc, si, p, seq, error_status(sub), &mut sets.owed);
            }
            if sub == ErrorSubtype::Fatal {
                vc.unrecoverable.store(true, Ordering::Release);
                // The core stopped: nothing queued behind this execution will ever complete.
                // (Executions ahead of it finished on the device; their END records may
                // simply not be drained yet.)
                fail_inflight_unrecoverable(vc, progress, seq, &mut sets.owed);
            }
            // The error path (rare): whoever owns what was just finished may be blocked.
            vc.signal_completions(Ready::MAX);
        }
        Some(RecordKind::Custom)
            if rec.subtype == CUSTOM_SUBTYPE_TENSOR && rec.sub_id == CUSTOM_SUB_ID_OUTPUT_DONE =>
        {
            streaming_output(info, rec.payload);
        }
        Some(RecordKind::Custom) | None => {}
    }
}

/// A device output is final: bump its tensor's completion count (host outputs are bumped
/// after the copy back, when their bytes are final).
fn streaming_output(info: &crate::vcore::SlotInfo, var_id: u32) {
    let Some(model) = info.model.as_ref() else {
        return;
    };
    let Some(set) = model.io_sets.sets.get(info.io_set as usize) else {
        return;
    };
    // SAFETY: the set is owned by this execution, which is not done; its owner wrote the
    // tensors before publishing the ticket and clears them only after the completion word.
    let tensors = unsafe { &*set.tensors.get() };
    if let Some(Some(t)) = tensors.get(var_id as usize)
        && t.placement().is_device()
    {
        t.0.completion.bump();
    }
}

/// Executions past their deadline: decode why (cause bit 29 → timeout, else notifications
/// were dropped) and finish them.
fn sweep_deadlines(
    rt: &RuntimeInner,
    vc: &VCore,
    progress: &mut [Progress],
    now: Duration,
    owed: &mut Owed,
) {
    for (si, slot) in vc.slots.iter().enumerate() {
        let seq = slot.ticket.current();
        if seq == 0 || completed_status(slot, seq).is_some() {
            continue;
        }
        // SAFETY: as in `on_record`: ticket set, completion word not written.
        let info = unsafe { &*slot.info.get() };
        if now < info.deadline {
            continue;
        }
        let mut timeout = false;
        for &phys in vc.cores.iter().take(info.sg_count as usize) {
            let c = rt.device.interrupt_cause(phys).unwrap_or(0);
            if c & cause::EXEC_TIMEOUT != 0 {
                timeout = true;
            }
            rt.device
                .interrupt_cause_clear(phys, c & (cause::EXEC_TIMEOUT | cause::NQ_OVERFLOW))
                .ok();
        }
        let status = if timeout {
            NrtStatus::Timeout
        } else {
            NrtStatus::ExecSwNqOverflow
        };
        crate::nrt_log!(
            crate::log::Module::Nmgr,
            crate::log::Level::Error,
            "exec_request_process_errors",
            "execution {} of model '{}' on vnc {} exceeded its {:?} timeout: {}",
            seq,
            info.model.as_ref().map_or("?", |m| m.name.as_str()),
            vc.index,
            info.timeout,
            if timeout {
                "engine hang (cause bit 29)"
            } else {
                "notifications were dropped (NQ overflow)"
            }
        );
        let p = &mut progress[si];
        if p.seq != seq {
            *p = Progress::EMPTY;
            p.seq = seq;
        }
        finish(vc, si, p, seq, status, owed);
    }
}

/// Copies how the device serves the vcore's cores into its published statistics
/// ([`crate::host::CoreStats::lockstep_serving`]), for `nrt monitor` and `nrt top`. From the
/// deadline sweep: about once a millisecond while the vcore is in use, never per execution.
#[cold]
fn note_lockstep_serving(rt: &RuntimeInner, vc: &VCore) {
    if let Some(s) = rt.device.lockstep_serving(vc.cores[0]) {
        let word = (s.changes << 1) | u64::from(s.joint);
        vc.stats().lockstep_serving.store(word, Ordering::Relaxed);
    }
}

/// After a fatal error the vcore's cores stop: every execution still in flight on it after
/// `after` (a seq; 0 = all) is finished at once with `NRT_EXEC_UNIT_UNRECOVERABLE` (as the
/// synchronous surface reports for the next submission), instead of waiting out its
/// deadline and reporting a timeout or dropped notifications. Called under the harvest
/// token.
#[cold]
fn fail_inflight_unrecoverable(vc: &VCore, progress: &mut [Progress], after: u64, owed: &mut Owed) {
    for (si, slot) in vc.slots.iter().enumerate() {
        let seq = slot.ticket.current();
        if seq <= after || completed_status(slot, seq).is_some() {
            continue;
        }
        let p = &mut progress[si];
        if p.seq != seq {
            *p = Progress::EMPTY;
            p.seq = seq;
        }
        if p.phase == Phase::Done {
            continue;
        }
        finish(vc, si, p, seq, NrtStatus::ExecUnitUnrecoverable, owed);
    }
}

/// Device latency of an execution whose engines all ended, from the engines' own
/// timestamps, present in trace mode only (harvest token: single writer, load + store).
#[inline(always)]
fn record_device_time(vc: &VCore, times: &EngineTimes, cores: u8) {
    let (mut lo, mut hi) = (u64::MAX, 0u64);
    for core in times.iter().take(cores as usize) {
        for [s, e] in core {
            if *s != 0 && *s < lo {
                lo = *s;
            }
            if *e > hi {
                hi = *e;
            }
        }
    }
    if hi > lo {
        let st = vc.stats();
        let ns = hi - lo;
        crate::host::bump(&st.lat_device[crate::host::latency_bucket(ns)], 1);
    }
}

/// Ends an execution: statistics, then its completion word — the end of the harvest's
/// part. An explicit one is added to `owed` for the calling thread to settle. Returns
/// whether its owner is a synchronous caller (which sleeps on the execution's own wake).
fn finish(
    vc: &VCore,
    si: usize,
    p: &mut Progress,
    seq: u64,
    status: NrtStatus,
    owed: &mut Owed,
) -> bool {
    p.phase = Phase::Done;
    let slot = &vc.slots[si];
    // SAFETY: ticket set, completion word not yet written: `info` is stable.
    let (surface, t0) = unsafe { ((*slot.info.get()).surface, (*slot.info.get()).t0_ns) };
    // Statistics (harvest token: single writer, load + store, no allocation).
    let st = vc.stats();
    crate::host::bump(&st.status[crate::host::status_index(status)], 1);
    if let Some(c) = crate::host::error_class(status) {
        crate::host::bump(&st.errors[c], 1);
    }
    if t0 != 0 {
        let now = crate::host::now_ns();
        let ns = now.saturating_sub(t0);
        // The waiters' spin budgets learn from the same sample (harvest token: one writer),
        // as a waiter that kept spinning would have seen it: up to the device's wake-up of a
        // blocked waiter if one came meanwhile (its wake-up latency is the blocking's cost).
        // (A synchronous caller sleeps on its execution's own wake, the others on the
        // vcore's: the later of the two.)
        let last_wake = vc.wake.as_ref().map_or(0, |w| w.last_wake_ns()).max(
            vc.exec_wakes
                .as_ref()
                .map_or(0, |w| w.of((seq - 1) as u32).last_wake_ns()),
        );
        let lat = nrt_hal::SpinBudget::spinning_latency(t0, now, last_wake);
        vc.spin.record(lat);
        // Its service time: from its staging, or from the previous completion if that came
        // later (it was queued); none if that completion was not seen here (an error path).
        let [before_seq, before_ns] = &vc.before_sample;
        let service = (before_seq.load(Ordering::Relaxed) == seq - 1).then(|| {
            let start = t0.max(before_ns.load(Ordering::Relaxed));
            nrt_hal::SpinBudget::spinning_latency(start, now, last_wake)
        });
        if let Some(s) = service {
            vc.service.record(s);
        }
        // SAFETY: as above.
        if let Some(m) = unsafe { (*slot.info.get()).model.as_ref() } {
            m.spin.record(lat);
            if let Some(s) = service {
                m.service.record(s);
            }
        }
        crate::host::bump(&st.lat_total[crate::host::latency_bucket(ns)], 1);
        // Busy time, estimated from the sample (see `CoreStats::busy_ns`).
        crate::host::bump(
            &st.busy_ns,
            ns.saturating_mul(crate::host::TOTAL_LATENCY_SAMPLE),
        );
    }
    if seq.is_multiple_of(crate::host::TOTAL_LATENCY_SAMPLE) {
        // The next one is sampled: note where its service starts if it is queued.
        vc.before_sample[1].store(crate::host::now_ns(), Ordering::Relaxed);
        vc.before_sample[0].store(seq, Ordering::Relaxed);
    }
    slot.ticket.complete(seq, status.as_i32() as u16);
    vc.advance_completed();
    match surface {
        Surface::Explicit { .. } => {
            *owed |= 1 << si;
            false
        }
        Surface::Implicit { .. } => false,
        Surface::Sync => true,
    }
}

/// The kernel's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`), as time since boot: the
/// timestamp of the last timer tick, read from the vDSO without touching the TSC — ~7 ns
/// here against ~30 ns for `Instant::now`, which staging would otherwise pay on every
/// execution for its deadline. Its resolution is one tick (1–4 ms), so a deadline fires
/// within a tick of the exact one: under 4% of the smallest `NEURON_RT_EXEC_TIMEOUT`
/// accepted ([`tuning::MIN_EXEC_TIMEOUT`]).
#[inline]
pub(crate) fn coarse_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC_COARSE exists on every
    // Linux since 2.6.32 and the call cannot fail with valid arguments.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
