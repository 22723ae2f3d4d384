//! The state of one logical NeuronCore (a vcore) that every stage, the harvest and every
//! surface share: its in-flight slots (the work-item slab), the staging lock's state, the
//! harvest token, its execution unit (XU) state and its counters. Data and small accessors
//! only: the pipeline (`pipeline`), the harvest (`harvest`), the completion seam
//! (`completion`) and the surfaces (`surface/`) act on it.

use crate::harvest::Harvest;
use crate::host;
use crate::model::ModelShared;
use nrt_hal::{IdleGate, PlaneWatch, Producer, TriggerPair, tuning};
use std::cell::UnsafeCell;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

//===------------------------------------------------------------------------------------===//
// In-flight slots (the work-item slab)
//===------------------------------------------------------------------------------------===//

/// Which surface submitted an execution (who retires it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Surface {
    /// The caller waits and retires.
    Sync,
    /// Implicit async: the worker retires and calls the callback with `job_id`.
    Implicit { job_id: u64 },
    /// Explicit async: whichever thread's harvest step finishes it writes `*status` (if not
    /// null) and retires it, in [`crate::completion::drive`] — usually the client polling
    /// `is_completed` or in `wait`; the XU worker only when it is the one harvesting.
    Explicit { status: *mut i32 },
}

/// What the stager tells the harvest and the retirer about an execution.
pub(crate) struct SlotInfo {
    pub(crate) model: Option<Arc<ModelShared>>,
    pub(crate) io_set: u32,
    pub(crate) sg_count: u8,
    /// On [`crate::harvest::coarse_now`]'s clock.
    pub(crate) deadline: Duration,
    pub(crate) timeout: Duration,
    pub(crate) surface: Surface,
    /// The bound tensors were marked pending ([`crate::pipeline::mark_pending`]): retire unmarks them.
    pub(crate) pending_marked: bool,
    /// [`host::now_ns`] at staging for the executions whose total latency is sampled
    /// ([`host::TOTAL_LATENCY_SAMPLE`]); 0 otherwise.
    pub(crate) t0_ns: u64,
}

/// One entry of a vcore's in-flight table, indexed by `compute_idx % EXEC_RING_SLOTS`.
/// See [`harvest`] for who writes which field.
pub(crate) struct InflightSlot {
    /// Seq of the occupying execution and its completion word: the ownership protocol of
    /// `info` (`nrt_hal::slot_ticket`, loom-checked).
    pub(crate) ticket: nrt_hal::SlotTicket,
    pub(crate) info: UnsafeCell<SlotInfo>,
}

// SAFETY: `info` follows the slot/ticket protocol (`nrt_hal::slot_ticket`, model-checked):
// written by the stager before `publish`, read by the harvest while `current` names its
// execution, read and cleared by the owner after `completed`, reused after `release`; never
// accessed concurrently for writing.
unsafe impl Sync for InflightSlot {}
// SAFETY: the raw status pointer in `Surface::Explicit` is only dereferenced by the retirer,
// under the C API's contract that it stays valid until completion.
unsafe impl Send for InflightSlot {}

//===------------------------------------------------------------------------------------===//
// Logical cores
//===------------------------------------------------------------------------------------===//

/// What staging mutates: guarded by THE lock (the seed's `compute_req_lock` on `tpbs[0]`).
pub(crate) struct Staging {
    /// Executions ever staged on the vcore (`compute_idx_tail`; seq = submitted + 1).
    pub(crate) submitted: u64,
    /// Per core of the vcore: the DMA trigger queue's producer half.
    pub(crate) dma: Vec<Producer<TriggerPair>>,
    /// Per core: the model that ran there last (a different one means reload).
    pub(crate) last_model: Vec<u32>,
}

/// Counters the tests and the benchmark read.
#[derive(Debug, Default)]
pub(crate) struct VcoreCounters {
    // Written under the staging lock (see `VcoreCounters::bump`).
    pub(crate) staging_locks: AtomicU64,
    pub(crate) publishes: AtomicU64,
    /// Core-executions that were the first of a model after another model ran there.
    pub(crate) model_switches: AtomicU64,
    /// Core-executions of the same model as the one before.
    pub(crate) steady_executions: AtomicU64,
    // Written by any thread.
    pub(crate) doorbells: AtomicU64,
    pub(crate) barrier_proxy_waits: AtomicU64,
    /// Harvest steps run by a thread other than the XU worker (a client polling
    /// `is_completed`/`wait`, a sync caller): while they keep coming the worker stays out of
    /// the way.
    pub(crate) external_harvests: AtomicU64,
    /// Binds that cloned host tensors into an I/O set ([`crate::pipeline::bind`] in
    /// [`crate::pipeline::BindMode::CloneHostTensors`]).
    pub(crate) host_clone_binds: AtomicU64,
}

impl VcoreCounters {
    /// Adds one to a counter that only the holder of a lock writes (the staging lock, or
    /// the harvest token): a load and a store, not a locked read-modify-write, which would
    /// also wait for the request's stores to device memory to leave the store buffer.
    /// Readers see a value at most one behind.
    #[inline]
    pub(crate) fn bump(c: &AtomicU64) {
        c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }
}

/// A logical NeuronCore: `lnc` physical cores executing in lockstep, one staging lock, one
/// harvest token, one in-flight table, one compute XU.
pub(crate) struct VCore {
    pub(crate) index: u32,
    pub(crate) cores: Vec<u32>,
    pub(crate) staging: Mutex<Staging>,
    pub(crate) harvest: Mutex<Harvest>,
    /// Per core: whether its notification plane has records waiting (read without the
    /// harvest token).
    pub(crate) watch: Box<[PlaneWatch]>,
    /// Harvest polls that found nothing waiting (paces their deadline sweeps; any thread,
    /// relaxed: a lost count only shifts the pace).
    pub(crate) idle_polls: AtomicU32,
    /// The last assist of a polling client ran device work: the device thread is not
    /// running (a co-tenant holds its vCPU), so polling clients assist on every idle poll
    /// until an assist finds nothing to run (`surface::explicit::is_completed`). Relaxed: a
    /// stale view costs one assist more or less.
    pub(crate) assisting: AtomicBool,
    /// Which synchronous caller serves the vcore's core now (`surface::sync`), and the wake
    /// of the callers staged behind it, which wait for it to run their executions instead of
    /// serving too ([`nrt_hal::ServedCore`]). Signaled after a harvest writes another
    /// thread's completion word ([`VCore::signal_completions`]).
    pub(crate) served: nrt_hal::ServedCore,
    pub(crate) slots: Box<[InflightSlot]>,
    /// Highest seq such that every execution up to it is done.
    pub(crate) completed: AtomicU64,
    pub(crate) unrecoverable: AtomicBool,
    pub(crate) counters: VcoreCounters,
    pub(crate) models: AtomicU32,
    /// Mirror of `Staging::submitted` for lock-free readers (seq validity checks).
    pub(crate) submitted: AtomicU64,
    pub(crate) xu: Xu,
    /// The published statistics of this vcore ([`host`]).
    pub(crate) stats: StatsRef,
    /// The completion wake every core of the vcore signals after publishing records
    /// (`None`: the device cannot signal; waiters then never block). Harvest steps signal it
    /// too when they finish another thread's execution ([`crate::wait`]).
    pub(crate) wake: Option<Arc<nrt_hal::CompletionWake>>,
    /// Each execution's own wake (by in-flight slot), on which its synchronous caller
    /// sleeps: the device signals it after the publication that finishes the execution, and
    /// a harvest that writes the execution's completion word for another thread signals it
    /// too ([`VCore::signal_completions`]). `None` where the device cannot (then the caller
    /// sleeps on `wake`).
    pub(crate) exec_wakes: Option<Arc<nrt_hal::ExecutionWakes>>,
    /// Sampled latency of every execution on the vcore, for waits that do not know the model
    /// (explicit `wait`, the XU worker).
    pub(crate) spin: nrt_hal::SpinBudget,
    /// How long the vcore's sampled executions took to run, queueing left out
    /// ([`crate::wait::service_time`]): from their staging or the previous execution's
    /// completion, whichever came later, to their own completion.
    pub(crate) service: nrt_hal::SpinBudget,
    /// The seq and [`crate::host::now_ns`] of the last completion that precedes a sampled
    /// execution (`seq % TOTAL_LATENCY_SAMPLE == 0`): where that execution's service
    /// started if it was queued. Written by the harvest (token holder), `Relaxed`.
    pub(crate) before_sample: [AtomicU64; 2],
}

/// A pointer to a vcore's [`host::CoreStats`] in the runtime's [`host::StatsArea`] (the
/// area is a field of the same [`RuntimeInner`], so it outlives every use).
pub(crate) struct StatsRef(pub(crate) *const host::CoreStats);

// SAFETY: the target is atomics only, and lives as long as the runtime that holds both.
unsafe impl Send for StatsRef {}
// SAFETY: as above.
unsafe impl Sync for StatsRef {}

impl VCore {
    /// Whether some core of the vcore has published records not yet harvested (a hint; no
    /// lock): what every waiter's wake-up condition includes.
    #[inline]
    pub(crate) fn has_records(&self) -> bool {
        self.watch.iter().any(PlaneWatch::has_records)
    }

    /// Wakes the vcore's blocked waiters after a completion word, a retirement or another
    /// state they wait for was published by a thread other than their own.
    #[inline]
    pub(crate) fn signal_waiters(&self) {
        if let Some(w) = &self.wake {
            w.signal();
        }
    }

    /// [`VCore::signal_waiters`] after a harvest wrote the completion words of executions
    /// other threads own — also for a synchronous caller waiting on the serving caller
    /// ([`VCore::served`]) and for the synchronous callers asleep on those executions' own
    /// wakes ([`VCore::exec_wakes`]): the slots whose bit is set in `sync_slots`
    /// (`u64::MAX`: any).
    #[inline]
    pub(crate) fn signal_completions(&self, sync_slots: u64) {
        self.signal_waiters();
        self.served.signal();
        if sync_slots != 0
            && let Some(w) = &self.exec_wakes
        {
            w.signal_slots(sync_slots);
        }
    }

    /// The wake a synchronous caller of execution `seq` sleeps on: its own
    /// ([`VCore::exec_wakes`]), or the vcore's.
    #[inline]
    pub(crate) fn execution_wake(&self, seq: u64) -> Option<&nrt_hal::CompletionWake> {
        match &self.exec_wakes {
            // Compute index seq - 1: the device signals the same wake.
            Some(w) => Some(w.of(seq.wrapping_sub(1) as u32)),
            None => self.wake.as_deref(),
        }
    }

    #[inline]
    pub(crate) fn slot(&self, seq: u64) -> &InflightSlot {
        // EXEC_RING_SLOTS is a power of two (a mask, not a division).
        &self.slots[((seq - 1) % tuning::EXEC_RING_SLOTS as u64) as usize]
    }

    #[inline]
    pub(crate) fn core_pos(&self, phys: u32) -> usize {
        self.cores.iter().position(|&c| c == phys).unwrap_or(0)
    }

    /// The vcore's statistics.
    #[inline(always)]
    pub(crate) fn stats(&self) -> &host::CoreStats {
        // SAFETY: see `StatsRef`: the area is owned by the runtime that owns this vcore.
        unsafe { &*self.stats.0 }
    }

    /// Advances `completed` over the contiguous prefix of done executions (harvest token).
    pub(crate) fn advance_completed(&self) {
        let mut c = self.completed.load(Ordering::Relaxed);
        loop {
            let next = c + 1;
            if self.slot(next).ticket.completed(next).is_none() {
                break;
            }
            c = next;
        }
        self.completed.store(c, Ordering::Release);
    }
}

//===------------------------------------------------------------------------------------===//
// Execution units
//===------------------------------------------------------------------------------------===//

/// Per-vcore XU state.
pub(crate) struct Xu {
    /// Where the worker parks while nothing async is in flight.
    pub(crate) gate: IdleGate,
    /// Async executions (implicit and explicit) staged and not yet retired.
    pub(crate) async_inflight: AtomicU32,
    /// Tensor-op XU: last seq number (ops run inline and complete at once).
    pub(crate) tensor_ops: AtomicU64,
    /// Eventfd registered for one seq, per in-flight slot (`nrt_hal::SeqEvent`: the
    /// registration/retirement handshake).
    pub(crate) seq_efd: Box<[nrt_hal::SeqEvent]>,
    /// Eventfd signalled on every completion of the compute XU (-1 = none).
    pub(crate) compute_efd: AtomicI32,
    /// Eventfd signalled on every completion of the tensor-op XU (-1 = none).
    pub(crate) tensor_efd: AtomicI32,
    /// A client armed a completion eventfd since the worker last looked: it now waits for
    /// someone else to harvest, so the worker takes over at once instead of staying out of
    /// the way of the polling it saw before ([`Xu::rely_on_worker`]).
    pub(crate) relied_on: AtomicBool,
}

impl Xu {
    pub(crate) fn new() -> Xu {
        Xu {
            gate: IdleGate::new(),
            async_inflight: AtomicU32::new(0),
            tensor_ops: AtomicU64::new(0),
            seq_efd: (0..tuning::EXEC_RING_SLOTS)
                .map(|_| nrt_hal::SeqEvent::new())
                .collect(),
            compute_efd: AtomicI32::new(-1),
            tensor_efd: AtomicI32::new(-1),
            relied_on: AtomicBool::new(false),
        }
    }

    /// A client is about to block on a completion eventfd instead of polling: wakes a
    /// worker parked out of the way of that client's earlier polls (it would otherwise take
    /// over only at the end of its park, up to [`tuning::XU_DEFER_MAX`] later).
    pub(crate) fn rely_on_worker(&self) {
        self.relied_on.store(true, Ordering::Release);
        self.gate.notify();
    }

    /// `n` async executions left the XU.
    pub(crate) fn async_done_n(&self, n: u32) {
        self.async_inflight.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Signals a caller-registered eventfd (`-1`: none).
pub(crate) fn signal_efd(fd: i32) {
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writing 8 bytes from a valid u64 to a caller-registered eventfd; a bad fd
        // makes write fail with EBADF, which we ignore (the registration was the caller's).
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}
