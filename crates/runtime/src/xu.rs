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
use crate::tensor::TensorSet;
use crate::{RuntimeInner, Surface, VCore, nrt_log};
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
    pub(crate) tensor_ops: AtomicU64,
    /// Eventfd registered for one seq, per in-flight slot: `(seq, fd)`.
    pub(crate) seq_efd: Box<[(AtomicU64, AtomicI32)]>,
    /// Eventfd signalled on every completion of the compute XU (-1 = none).
    pub(crate) compute_efd: AtomicI32,
    /// Eventfd signalled on every completion of the tensor-op XU (-1 = none).
    pub(crate) tensor_efd: AtomicI32,
}

impl Xu {
    pub(crate) fn new() -> Xu {
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

pub(crate) fn signal_efd(fd: i32) {
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to a caller-registered eventfd; a bad fd
        // makes write fail with EBADF, which we ignore (the registration was the caller's).
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

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

pub(crate) fn drain_vcore(rt: &RuntimeInner, vc: &VCore) {
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
        let owned = slot.ticket.current() == seq;
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
pub(crate) fn submit_async(
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
    let mark = crate::exec::marks_pending(rt, surface);
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
