//! Execution units (XUs) and the two async surfaces.
//!
//! Each logical core has one compute XU (every execution staged on the vcore is published to
//! it once and gets the next seq number there), one tensor-op XU and one worker thread. The
//! worker is the async driver of the harvest: it spins the same step function as a
//! synchronous caller ([`crate::harvest::progress_one_step`]) and retires async executions —
//! invoking the implicit-async callback. Explicit (NRT 3.0) executions are finished by the
//! harvest itself, whichever thread runs it: status slot, completion word (so `is_completed`
//! implies the status is readable), retirement, then eventfds. With nothing async in flight it parks on
//! an [`IdleGate`] after a bounded spin; submitters and the harvest wake it.
//!
//! Sequence ids are `(seq & 0xFFFF_FFFF_FFFF) | (xu_id << 48)` with `xu_id = vnc ×
//! NRTA_XU_TYPE_NUM + kind`; seq numbers start at 1 and increase by one per submission on
//! each XU.

use crate::error::{NrtError, Result};
use crate::exec::{bind, doorbell, mark_pending, release_pending, retire, stage, unbind, validate};
use crate::harvest::{self, Step};
use crate::model::ModelShared;
use crate::tensor::{Tensor, TensorSet};
use crate::{Runtime, RuntimeInner, Surface, VCore, ensure_open, nrt_log};
use nrt_hal::{IdleGate, NrtStatus, SeqId, tuning};
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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

/// The implicit-async completion callback: `(model_id, vnc, job_id, status)`.
pub type AsyncCallback = Arc<dyn Fn(u32, u32, u64, NrtStatus) + Send + Sync>;

/// Per-vcore XU state.
pub(crate) struct Xu {
    gate: IdleGate,
    /// Async executions staged and not yet retired by the worker.
    async_inflight: AtomicU32,
    /// Tensor-op XU: last seq number (ops run inline and complete at once).
    tensor_ops: AtomicU64,
    /// Eventfd registered for one seq, per in-flight slot: `(seq, fd)`.
    seq_efd: Box<[(AtomicU64, AtomicI32)]>,
    /// Eventfd signalled on every completion of the compute XU (-1 = none).
    compute_efd: AtomicI32,
    /// Eventfd signalled on every completion of the tensor-op XU (-1 = none).
    tensor_efd: AtomicI32,
}

impl Xu {
    pub(crate) fn new(_vnc: u32) -> Xu {
        Xu {
            gate: IdleGate::new(),
            async_inflight: AtomicU32::new(0),
            tensor_ops: AtomicU64::new(0),
            seq_efd: (0..tuning::EXEC_RING_SLOTS)
                .map(|_| (AtomicU64::new(0), AtomicI32::new(-1)))
                .collect(),
            compute_efd: AtomicI32::new(-1),
            tensor_efd: AtomicI32::new(-1),
        }
    }

    /// One async execution left the XU.
    pub(crate) fn async_done(&self) {
        self.async_inflight.fetch_sub(1, Ordering::AcqRel);
    }

    #[inline]
    pub(crate) fn wake(&self) {
        if self.async_inflight.load(Ordering::Relaxed) != 0 {
            self.gate.notify();
        }
    }
}

fn signal_efd(fd: i32) {
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to a caller-registered eventfd; a bad fd
        // makes write fail with EBADF, which we ignore (the registration was the caller's).
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

struct CallbackBox {
    cb: AsyncCallback,
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
fn call_marked(ia: &ImplicitAsync, model_id: u32, vnc: u32, job: u64, status: NrtStatus) {
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
    callback: AtomicPtr<CallbackBox>,
    #[allow(
        clippy::vec_box,
        reason = "workers hold raw pointers into the boxes: they must not move"
    )]
    graveyard: Mutex<Vec<Box<CallbackBox>>>,
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

/// Starts one worker per vcore and returns when all of them are running, so that whatever
/// a thread allocates to start happens inside `init`, never during an execution.
pub(crate) fn start_workers(rt: &Arc<RuntimeInner>) -> Result<()> {
    let mut w = rt.workers.lock().unwrap_or_else(|e| e.into_inner());
    for vnc in 0..rt.vcores.len() {
        let r = rt.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("nrt-xu-{vnc}"))
            .spawn(move || worker(r, vnc));
        match spawned {
            Ok(h) => w.push(h),
            Err(e) => {
                drop(w);
                stop_workers(rt);
                return Err(NrtError::new(
                    NrtStatus::Resource,
                    format!("cannot start the XU worker of logical core {vnc}: {e}"),
                ));
            }
        }
    }
    let n = w.len();
    drop(w);
    while rt.workers_started.load(Ordering::Acquire) < n {
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    Ok(())
}

/// Stops the workers (at close).
pub(crate) fn stop_workers(rt: &RuntimeInner) {
    rt.stop.store(true, Ordering::Release);
    for vc in rt.vcores.iter() {
        vc.xu.gate.notify();
    }
    let handles: Vec<JoinHandle<()>> =
        std::mem::take(&mut *rt.workers.lock().unwrap_or_else(|e| e.into_inner()));
    let me = std::thread::current().id();
    for h in handles {
        if h.thread().id() != me {
            let _ = h.join();
        }
    }
}

/// Waits until nothing async is in flight anywhere (close, unload).
pub(crate) fn drain_all(rt: &RuntimeInner) {
    for vc in rt.vcores.iter() {
        drain_vcore(rt, vc);
    }
}

fn drain_vcore(rt: &RuntimeInner, vc: &VCore) {
    let mut backoff = harvest::Backoff::new();
    while vc.xu.async_inflight.load(Ordering::Acquire) != 0 {
        vc.xu.gate.notify();
        if harvest::progress_one_step(rt, vc, 0) == Step::Idle {
            backoff.snooze();
        }
    }
}

/// The worker loop of one vcore.
fn worker(rt: Arc<RuntimeInner>, vnc: usize) {
    let vc = &rt.vcores[vnc];
    vc.xu.gate.register_sleeper();
    rt.workers_started.fetch_add(1, Ordering::Release);
    let mut cursor = 1u64; // oldest seq the worker may still have to retire
    let mut backoff = harvest::Backoff::new();
    let mut last_external = vc.counters.external_harvests.load(Ordering::Relaxed);
    let mut defer = tuning::HARVEST_SLEEP;
    while !rt.stop.load(Ordering::Acquire) {
        if vc.xu.async_inflight.load(Ordering::Acquire) == 0 {
            // Nothing async in flight: synchronous callers harvest their own executions, so
            // the worker has no reason to compete with them (or with the device thread) for
            // the two vCPUs. Park until a submitter publishes async work.
            vc.xu.gate.sleep_until(|| {
                rt.stop.load(Ordering::Acquire) || vc.xu.async_inflight.load(Ordering::Acquire) != 0
            });
            backoff = harvest::Backoff::new();
            continue;
        }
        let external = vc.counters.external_harvests.load(Ordering::Relaxed);
        if external != last_external {
            // A client is harvesting (polling is_completed/wait, or a sync caller): a third
            // runnable thread on two vCPUs would only steal its CPU. Retire what its harvest
            // finished, then look again after a sleep that grows while the client keeps
            // polling; when it stops, the worker takes over within `XU_DEFER_MAX`.
            last_external = external;
            retire_done(&rt, vc, &mut cursor);
            std::thread::sleep(defer);
            defer = (defer * 2).min(tuning::XU_DEFER_MAX);
            backoff = harvest::Backoff::new();
            continue;
        }
        defer = tuning::HARVEST_SLEEP;
        let progressed = harvest::progress_one_step_worker(&rt, vc) != Step::Idle;
        let retired = retire_done(&rt, vc, &mut cursor);
        if progressed || retired {
            backoff = harvest::Backoff::new();
            continue;
        }
        // Bounded spin, then yield, then short sleeps.
        backoff.snooze();
    }
}

/// Retires every done async execution from `cursor` on; returns whether any was retired.
fn retire_done(rt: &RuntimeInner, vc: &VCore, cursor: &mut u64) -> bool {
    if vc.xu.async_inflight.load(Ordering::Acquire) == 0 {
        return false;
    }
    let submitted = vc.submitted.load(Ordering::Acquire);
    let mut any = false;
    let mut seq = (*cursor).max(submitted.saturating_sub(tuning::EXEC_RING_SLOTS as u64) + 1);
    let mut advance = true;
    while seq <= submitted {
        let slot = vc.slot(seq);
        let owned = slot.ticket.load(Ordering::Acquire) == seq;
        if owned {
            // SAFETY: the ticket is ours to read (see harvest's protocol).
            let surface = unsafe { (*slot.info.get()).surface };
            match (surface, harvest::completed_status(slot, seq)) {
                (Surface::Sync, _) => {}
                (_, None) => advance = false,
                (Surface::Implicit { job_id }, Some(status)) => {
                    // SAFETY: as above.
                    let (model_id, model_vnc) = unsafe {
                        (*slot.info.get())
                            .model
                            .as_ref()
                            .map_or((0, 0), |m| (m.id, m.vnc))
                    };
                    retire(vc, seq, status);
                    if let Some(ia) = rt.implicit_async.as_ref() {
                        ia.inflight[vc.index as usize].fetch_sub(1, Ordering::AcqRel);
                        call_marked(ia, model_id, model_vnc, job_id, status);
                    }
                    vc.xu.async_inflight.fetch_sub(1, Ordering::AcqRel);
                    any = true;
                }
                // Explicit executions are retired by the harvest itself.
                (Surface::Explicit { .. }, Some(_)) => {}
            }
        }
        if advance {
            *cursor = seq + 1;
        }
        seq += 1;
    }
    any
}

/// Called by the harvest when an execution finishes, *before* its completion word: writes
/// the explicit surface's status slot, so `is_completed` implies the status is readable.
pub(crate) fn write_status(surface: Surface, status: NrtStatus) {
    if let Surface::Explicit { status: p } = surface
        && !p.is_null()
    {
        // SAFETY: the explicit-surface contract: the caller keeps `*ret` valid until the
        // execution completes (the public migration guide says so).
        unsafe { p.write_volatile(status.as_i32()) };
    }
}

/// Called by the harvest *after* the completion word: signals eventfds, and wakes the worker
/// if the execution is an implicit one (the worker retires those and calls the callback;
/// the harvest already retired an explicit one, and a synchronous caller retires its own).
pub(crate) fn after_finish(vc: &VCore, seq: u64, surface: Surface) {
    let (s, fd) = &vc.xu.seq_efd[((seq - 1) % tuning::EXEC_RING_SLOTS as u64) as usize];
    if s.load(Ordering::Acquire) == seq
        && s.compare_exchange(seq, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        signal_efd(fd.swap(-1, Ordering::AcqRel));
    }
    signal_efd(vc.xu.compute_efd.load(Ordering::Acquire));
    if let Surface::Implicit { .. } = surface {
        vc.xu.wake();
    }
}

//===------------------------------------------------------------------------------------===//
// Implicit async (nrt_execute with NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0)
//===------------------------------------------------------------------------------------===//

/// `nrt_execute` in implicit async mode: stage and doorbell inline, hand completion to the
/// worker, return. More than the configured in-flight cap returns `NRT_QUEUE_FULL` (the
/// public runtime's behaviour; it does not block).
pub(crate) fn execute_implicit(
    rt: &RuntimeInner,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
) -> Result<()> {
    let ia = rt.implicit_async.as_ref().expect("implicit async mode");
    validate(rt, model, inputs, outputs, repeat, false)?;
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
    submit_async(rt, vc, model, inputs, outputs, Surface::Implicit { job_id }).inspect_err(
        |_| {
            counter.fetch_sub(1, Ordering::AcqRel);
        },
    )?;
    Ok(())
}

/// Bind, stage, doorbell for an async surface; the worker owns completion.
fn submit_async(
    rt: &RuntimeInner,
    vc: &VCore,
    model: &Arc<ModelShared>,
    inputs: &TensorSet,
    outputs: &TensorSet,
    surface: Surface,
) -> Result<u64> {
    let s = bind(model, inputs, outputs, false).ok_or_else(|| {
        NrtError::new(
            NrtStatus::QueueFull,
            format!("every I/O set of model '{}' is in flight", model.name),
        )
    })?;
    // Pending marks make tensor reads and writes wait; only implicit async mode does.
    let mark = rt.implicit_async.is_some();
    if mark {
        mark_pending(model, s);
    }
    let before = vc.xu.async_inflight.fetch_add(1, Ordering::AcqRel);
    match stage(rt, vc, model, s, surface) {
        Ok(seq) => {
            doorbell(rt, vc, model);
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
            }
            unbind(model, s);
            Err(e)
        }
    }
}

//===------------------------------------------------------------------------------------===//
// Explicit async (NRT 3.0) and the implicit-mode controls, as Runtime methods
//===------------------------------------------------------------------------------------===//

fn xu_id(vnc: u32, kind: XuKind) -> u16 {
    (vnc * XU_TYPE_NUM + kind as u32) as u16
}

fn parse_seq(rt: &RuntimeInner, seq: SeqId) -> Result<(&VCore, XuKind)> {
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

impl Runtime {
    /// Schedules an execution on the compute XU (`nrta_execute_schedule`): returns its seq id
    /// at once. `queue` must be 0. `status`, if not null, receives the final status when the
    /// execution completes (before `is_completed` turns true).
    ///
    /// # Safety
    /// `status` must be null or valid for a 4-byte write until the execution completes.
    pub unsafe fn execute_schedule_raw(
        &self,
        model: &crate::Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        let rt = &self.0;
        if queue != 0 {
            return Err(NrtError::invalid(format!(
                "queue {queue}: the compute XU has only queue 0"
            )));
        }
        validate(rt, &model.0, inputs, outputs, 1, false)?;
        let vc = &rt.vcores[model.0.vnc as usize];
        if vc.unrecoverable.load(Ordering::Acquire) {
            return Err(NrtError::new(
                NrtStatus::ExecUnitUnrecoverable,
                format!("compute XU of vnc {} is in a fatal state", vc.index),
            ));
        }
        let seq = submit_async(
            rt,
            vc,
            &model.0,
            inputs,
            outputs,
            Surface::Explicit { status },
        )?;
        Ok(SeqId::new(xu_id(vc.index, XuKind::Compute), seq))
    }

    /// [`Runtime::execute_schedule_raw`] without a status slot; read the outcome with
    /// [`Runtime::wait`].
    pub fn execute_schedule(
        &self,
        model: &crate::Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> Result<SeqId> {
        // SAFETY: a null status slot is never written.
        unsafe { self.execute_schedule_raw(model, inputs, outputs, 0, core::ptr::null_mut()) }
    }

    /// Whether `seq` completed (`nrta_is_completed`); `NRT_INVALID` for a seq that was never
    /// issued.
    pub fn is_completed(&self, seq: SeqId) -> Result<bool> {
        let rt = &self.0;
        ensure_open(rt)?;
        let (vc, kind) = parse_seq(rt, seq)?;
        let n = seq.seq_num();
        match kind {
            XuKind::Compute => {
                if n == 0 || n > vc.submitted.load(Ordering::Acquire) {
                    return Err(NrtError::invalid(format!(
                        "sequence {:#x} was never issued",
                        seq.0
                    )));
                }
                if n <= vc.completed.load(Ordering::Acquire)
                    || harvest::completed_status(vc.slot(n), n).is_some()
                {
                    return Ok(true);
                }
                // Help the harvest along (re-entrant, non-blocking).
                Ok(harvest::progress_one_step(rt, vc, n) == Step::Done)
            }
            XuKind::TensorOp => {
                if n == 0 || n > vc.xu.tensor_ops.load(Ordering::Acquire) {
                    return Err(NrtError::invalid(format!(
                        "sequence {:#x} was never issued",
                        seq.0
                    )));
                }
                Ok(true)
            }
            XuKind::Collectives => Err(NrtError::invalid(format!(
                "sequence {:#x}: collectives are not supported",
                seq.0
            ))),
        }
    }

    /// Waits for `seq` on the calling thread (spinning the harvest) and returns its status.
    pub fn wait(&self, seq: SeqId) -> Result<NrtStatus> {
        let rt = &self.0;
        let (vc, kind) = parse_seq(rt, seq)?;
        if kind != XuKind::Compute {
            return self.is_completed(seq).map(|_| NrtStatus::Success);
        }
        let n = seq.seq_num();
        if n == 0 || n > vc.submitted.load(Ordering::Acquire) {
            return Err(NrtError::invalid(format!(
                "sequence {:#x} was never issued",
                seq.0
            )));
        }
        let mut backoff = harvest::Backoff::new();
        loop {
            if let Some(s) = harvest::completed_status(vc.slot(n), n) {
                return Ok(s);
            }
            if n <= vc.completed.load(Ordering::Acquire) {
                return Ok(NrtStatus::Success); // retired long ago; status no longer kept
            }
            if harvest::progress_one_step(rt, vc, n) == Step::Idle {
                backoff.snooze();
            }
        }
    }

    /// The last completed seq of an XU (`nrta_get_sequence`).
    pub fn get_sequence(&self, vnc: u32, kind: XuKind, queue: i32) -> Result<SeqId> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = rt
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        if queue != 0 {
            return Err(NrtError::invalid(format!(
                "queue {queue} does not exist on this XU"
            )));
        }
        let n = match kind {
            XuKind::Compute => vc.completed.load(Ordering::Acquire),
            XuKind::TensorOp => vc.xu.tensor_ops.load(Ordering::Acquire),
            XuKind::Collectives => return Err(NrtError::invalid("collectives are not supported")),
        };
        Ok(SeqId::new(xu_id(vnc, kind), n))
    }

    /// Signals eventfd `efd` when `seq` completes (at once if it already has);
    /// `efd = -1` deregisters (`nrta_event_register_seq_id_completion`).
    pub fn register_seq_eventfd(&self, seq: SeqId, efd: i32) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let (vc, kind) = parse_seq(rt, seq)?;
        let n = seq.seq_num();
        if kind == XuKind::TensorOp {
            if n == 0 || n > vc.xu.tensor_ops.load(Ordering::Acquire) {
                return Err(NrtError::invalid(format!(
                    "sequence {:#x} was never issued",
                    seq.0
                )));
            }
            signal_efd(efd);
            return Ok(());
        }
        if n == 0 || n > vc.submitted.load(Ordering::Acquire) {
            return Err(NrtError::invalid(format!(
                "sequence {:#x} was never issued",
                seq.0
            )));
        }
        let (s, fd) = &vc.xu.seq_efd[((n - 1) % tuning::EXEC_RING_SLOTS as u64) as usize];
        if efd < 0 {
            if s.load(Ordering::Acquire) == n {
                fd.store(-1, Ordering::Release);
                s.store(0, Ordering::Release);
            }
            return Ok(());
        }
        fd.store(efd, Ordering::Release);
        s.store(n, Ordering::Release);
        if n <= vc.completed.load(Ordering::Acquire)
            || harvest::completed_status(vc.slot(n), n).is_some()
        {
            // Already complete: signal now (the harvest may also have: eventfds count).
            if s.compare_exchange(n, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                signal_efd(fd.swap(-1, Ordering::AcqRel));
            }
        }
        Ok(())
    }

    /// Signals `efd` on every completion of an XU; `-1` deregisters
    /// (`nrta_event_register_xu_completion`).
    pub fn register_xu_eventfd(&self, vnc: u32, kind: XuKind, queue: i32, efd: i32) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = rt
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        if queue != 0 {
            return Err(NrtError::invalid(format!(
                "queue {queue} does not exist on this XU"
            )));
        }
        match kind {
            XuKind::Compute => vc.xu.compute_efd.store(efd.max(-1), Ordering::Release),
            XuKind::TensorOp => vc.xu.tensor_efd.store(efd.max(-1), Ordering::Release),
            XuKind::Collectives => return Err(NrtError::invalid("collectives are not supported")),
        }
        Ok(())
    }

    fn tensor_op(
        &self,
        vnc: u32,
        queue: i32,
        status: *mut i32,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<SeqId> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = rt
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        if queue != 0 {
            return Err(NrtError::invalid(format!(
                "queue {queue} does not exist on the tensor-op XU"
            )));
        }
        let r = op();
        let st = r.as_ref().map_or_else(|e| e.status, |_| NrtStatus::Success);
        if !status.is_null() {
            // SAFETY: the caller's contract for the status slot (see execute_schedule_raw).
            unsafe { status.write_volatile(st.as_i32()) };
        }
        r?;
        let n = vc.xu.tensor_ops.fetch_add(1, Ordering::AcqRel) + 1;
        signal_efd(vc.xu.tensor_efd.load(Ordering::Acquire));
        Ok(SeqId::new(xu_id(vnc, XuKind::TensorOp), n))
    }

    /// Schedules a tensor write on the tensor-op XU (`nrta_tensor_write`). The copy is done
    /// when this returns; the seq completes at once.
    ///
    /// # Safety
    /// `status`: as in [`Runtime::execute_schedule_raw`].
    pub unsafe fn tensor_write_schedule(
        &self,
        t: &Tensor,
        buf: &[u8],
        offset: u64,
        vnc: u32,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        self.tensor_op(vnc, queue, status, || t.write(buf, offset))
    }

    /// Schedules a tensor read (`nrta_tensor_read`).
    ///
    /// # Safety
    /// `status`: as in [`Runtime::execute_schedule_raw`].
    pub unsafe fn tensor_read_schedule(
        &self,
        t: &Tensor,
        buf: &mut [u8],
        offset: u64,
        vnc: u32,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        self.tensor_op(vnc, queue, status, || t.read(buf, offset))
    }

    /// Schedules a tensor copy (`nrta_tensor_copy`).
    ///
    /// # Safety
    /// `status`: as in [`Runtime::execute_schedule_raw`].
    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the public nrta_tensor_copy signature"
    )]
    pub unsafe fn tensor_copy_schedule(
        &self,
        src: &Tensor,
        src_offset: u64,
        dst: &Tensor,
        dst_offset: u64,
        size: u64,
        vnc: u32,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        self.tensor_op(vnc, queue, status, || {
            dst.copy_from(src, src_offset, dst_offset, size)
        })
    }

    /// Registers the implicit-async completion callback, replacing the previous one
    /// (`nrt_register_async_exec_callback`). `NRT_INVALID` when the runtime is not in
    /// implicit async mode.
    pub fn register_async_callback(&self, cb: AsyncCallback) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let ia = rt.implicit_async.as_ref().ok_or_else(|| {
            NrtError::invalid("not in async mode: set NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0 before nrt_init")
        })?;
        let new = Box::into_raw(Box::new(CallbackBox { cb }));
        let old = ia.callback.swap(new, Ordering::AcqRel);
        // SAFETY: `old` came from Box::into_raw; it is parked (not freed) because a worker may
        // still be calling it.
        ia.graveyard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(unsafe { Box::from_raw(old) });
        Ok(())
    }

    /// Waits until every implicit-async execution on `vnc` completed and was reported
    /// (`nrt_async_drain_queued_execs`).
    pub fn async_drain(&self, vnc: i32) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        if in_async_callback() {
            return Err(refused_in_callback("nrt_async_drain_queued_execs"));
        }
        if vnc < 0 {
            drain_all(rt);
            return Ok(());
        }
        let vc = rt
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        drain_vcore(rt, vc);
        Ok(())
    }

    /// Whether the runtime runs `nrt_execute` in implicit async mode.
    pub fn is_implicit_async(&self) -> bool {
        self.0.implicit_async.is_some()
    }
}
