//! # nrt-runtime — the hot inference path
//!
//! Load a compiled model once; then every execution goes `validate → bind → stage →
//! doorbell → harvest` with zero heap allocations, talking to the device only through
//! [`nrt_hal::Device`] (one doorbell per core is the only device call of submit; completion
//! is learned by polling notification rings).
//!
//! ```
//! # use std::sync::Arc;
//! use nrt_runtime::{Placement, Runtime, RuntimeConfig, TensorSet};
//! // Any `nrt_hal::Device`; here the software NeuronCore.
//! let device = Arc::new(nrt_sim::SoftDevice::new(Default::default()).unwrap());
//! let rt = Runtime::init(device, RuntimeConfig::default())?;
//! // Bytes of a compiled model (`nrt compile model.onnx -o model.ncm`); here the built-in one.
//! let ncm = nrt_runtime::builtin::near_null(1);
//! let model = rt.load(&ncm, -1, &Default::default())?;
//! let (mut inputs, mut outputs) = (TensorSet::new(), TensorSet::new());
//! for info in model.tensor_info() {
//!     let t = rt.allocate_tensor(Placement::Device, model.vnc() as i32, info.size, &info.name)?;
//!     match info.usage {
//!         nrt_model::Usage::Input => inputs.add(&info.name, &t),
//!         nrt_model::Usage::Output => outputs.add(&info.name, &t),
//!     }
//! }
//! rt.execute(&model, &inputs, &outputs)?;
//! # Ok::<(), nrt_runtime::NrtError>(())
//! ```
//!
//! Three surfaces share one bind → stage → doorbell core and one harvest step function:
//! [`Runtime::execute`] (synchronous; the caller's thread harvests), the implicit async worker
//! pool (`NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`, callbacks), and the explicit NRT 3.0
//! surface ([`Runtime::execute_schedule`] / [`Runtime::is_completed`]).

/// The README's Rust example, compiled and run as a doctest.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The most physical cores one logical core (and so one lockstep execution) spans:
/// `NEURON_LOGICAL_NC_CONFIG` is 1 or 2. The harvest's per-execution engine states and the
/// trace's engine timestamps are arrays of this many cores.
pub const MAX_LOCKSTEP_CORES: usize = 2;

mod api;
pub mod builtin;
pub mod config;
pub mod error;
pub(crate) mod exec;
pub mod harvest;
pub mod host;
pub mod log;
pub mod model;
pub mod tensor;
pub mod trace;
pub(crate) mod xu;

pub use config::RuntimeConfig;
pub use error::{NrtError, Result};
pub use exec::ExecMode;
pub use model::{LoadOptions, TensorInfo};
pub use nrt_hal::{DType, NrtStatus, SeqId};
pub use tensor::{Placement, Tensor, TensorSet};
pub use trace::{InspectConfig, InspectMode, Span, Stage, chrome_json};
pub use xu::{AsyncCallback, XuKind, in_async_callback};

use crate::harvest::{Harvest, Progress};
use crate::model::{ModelShared, STATE_LOADED, STATE_UNLOADED, STATE_UNLOADING};
use crate::xu::{ImplicitAsync, Xu};
use nrt_hal::{Device, NUM_ENGINES, PlaneConsumer, PlaneWatch, Producer, TriggerPair, tuning};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Explicit async: the worker retires and writes `*status` (if not null).
    Explicit { status: *mut i32 },
}

/// What the stager tells the harvest and the retirer about an execution.
pub(crate) struct SlotInfo {
    pub(crate) model: Option<Arc<ModelShared>>,
    pub(crate) io_set: u32,
    pub(crate) sg_count: u8,
    /// On [`harvest::coarse_now`]'s clock.
    pub(crate) deadline: Duration,
    pub(crate) timeout: Duration,
    pub(crate) surface: Surface,
    /// The bound tensors were marked pending ([`exec::mark_pending`]): retire unmarks them.
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
}

/// A pointer to a vcore's [`host::CoreStats`] in the runtime's [`host::StatsArea`] (the
/// area is a field of the same [`RuntimeInner`], so it outlives every use).
pub(crate) struct StatsRef(*const host::CoreStats);

// SAFETY: the target is atomics only, and lives as long as the runtime that holds both.
unsafe impl Send for StatsRef {}
// SAFETY: as above.
unsafe impl Sync for StatsRef {}

impl VCore {
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
            if harvest::completed_status(self.slot(next), next).is_none() {
                break;
            }
            c = next;
        }
        self.completed.store(c, Ordering::Release);
    }
}

//===------------------------------------------------------------------------------------===//
// The runtime
//===------------------------------------------------------------------------------------===//

const OPEN: u8 = 1;
const CLOSING: u8 = 2;
const CLOSED: u8 = 3;

pub(crate) struct RuntimeInner {
    pub(crate) device: Arc<dyn Device>,
    state: AtomicU8,
    pub(crate) config: RuntimeConfig,
    pub(crate) vcores: Box<[VCore]>,
    models: Mutex<Vec<Arc<ModelShared>>>,
    next_model_id: AtomicU32,
    /// The process-wide async-workers pointer of the seed: `Some` = implicit async.
    pub(crate) implicit_async: Option<ImplicitAsync>,
    pub(crate) trace: trace::Trace,
    pub(crate) workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// XU workers past their start-up (`init` waits for all of them).
    pub(crate) workers_started: AtomicUsize,
    pub(crate) stop: AtomicBool,
    /// The cores held in the runtime directory and the published record (`None` without
    /// ownership, and after close).
    pub(crate) ownership: Mutex<Option<host::Ownership>>,
    /// Where the vcores' statistics live (read through [`VCore::stats`]); after `vcores`
    /// so it is dropped last.
    pub(crate) stats: host::StatsArea,
}

/// Whether the runtime is open (one `Acquire` load).
#[inline]
pub(crate) fn is_open(rt: &RuntimeInner) -> bool {
    rt.state.load(Ordering::Acquire) == OPEN
}

pub(crate) fn ensure_open(rt: &RuntimeInner) -> Result<()> {
    if is_open(rt) {
        Ok(())
    } else {
        Err(NrtError::new(
            NrtStatus::Closed,
            "the runtime was closed (nrt_close)",
        ))
    }
}

/// A loaded model (`nrt_model_t`). Cheap to clone.
#[derive(Clone)]
pub struct Model(pub(crate) Arc<ModelShared>);

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("id", &self.0.id)
            .field("name", &self.0.name)
            .field("vnc", &self.0.vnc)
            .finish()
    }
}

impl Model {
    /// The model's id (unique within the runtime; the callback's `model_id`).
    pub fn id(&self) -> u32 {
        self.0.id
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The logical core it was loaded on.
    pub fn vnc(&self) -> u32 {
        self.0.vnc
    }

    /// Physical cores it executes on (`sg_count`).
    pub fn core_count(&self) -> u32 {
        self.0.sg_count
    }

    /// Its inputs and outputs (`nrt_get_model_tensor_info`).
    pub fn tensor_info(&self) -> Vec<TensorInfo> {
        self.0.tensor_info()
    }

    /// The execution timeout it was loaded with.
    pub fn exec_timeout(&self) -> Duration {
        self.0.exec_timeout
    }

    /// Whether it is still loaded.
    pub fn is_loaded(&self) -> bool {
        self.0.state.load(Ordering::Acquire) == STATE_LOADED
    }
}

/// Per-vcore counters of the staging and publishing steps (for tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PipelineCounters {
    /// Times the staging lock was taken.
    pub staging_locks: u64,
    /// Doorbells rung (semaphore increments).
    pub doorbells: u64,
    /// Executions published to the vcore's XU.
    pub publishes: u64,
    /// Executions that went through WAIT_BARRIER_PROXY.
    pub barrier_proxy_waits: u64,
}

/// Runtime-wide counters of model switches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchCounters {
    /// Core-executions that were the first of a model after another model ran there
    /// (reload-config set).
    pub model_switches: u64,
    /// Core-executions of the same model as the previous one (no reload).
    pub steady: u64,
}

/// Device memory use of a logical core (`nrt_vnc_memory_stats_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes used.
    pub bytes_used: u64,
    /// Bytes available at most.
    pub bytes_limit: u64,
}

/// A runtime instance: the reserved cores of one device and what is loaded on them. Clones
/// share it; when the last clone is dropped the runtime closes.
#[derive(Clone)]
pub struct Runtime(
    pub(crate) Arc<RuntimeInner>,
    #[allow(dead_code, reason = "held for its Drop")] Arc<CloseOnDrop>,
);

/// Closes the runtime when the last [`Runtime`] clone goes away (its XU workers hold the
/// inner state, so the inner state's own drop cannot be the trigger).
pub(crate) struct CloseOnDrop(Arc<RuntimeInner>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        Runtime::close_inner(&self.0);
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("vcores", &self.0.vcores.len())
            .field("config", &self.0.config)
            .finish()
    }
}

/// Waits for the model's executions to finish, then frees its device resources.
fn unload_model(rt: &RuntimeInner, m: &Arc<ModelShared>) {
    m.state.store(STATE_UNLOADING, Ordering::Release);
    let vc = &rt.vcores[m.vnc as usize];
    // A stager that read STATE_LOADED under the staging lock has counted its execution in
    // `inflight` before releasing the lock; one that takes the lock after this sees the
    // mark and refuses (see `exec::stage`). So after this lock round trip, `inflight` only
    // goes down.
    drop(vc.staging.lock().unwrap_or_else(|e| e.into_inner()));
    let mut backoff = harvest::Backoff::new();
    while m.inflight.load(Ordering::Acquire) != 0 {
        if harvest::progress_one_step(rt, vc, 0) == harvest::Step::Idle {
            backoff.snooze();
        }
    }
    m.release(&*rt.device);
    vc.models.fetch_sub(1, Ordering::Relaxed);
    let st = vc.stats();
    st.models.fetch_sub(1, Ordering::Relaxed);
    for (c, b) in m.mem.iter().enumerate() {
        st.mem[c].fetch_sub(*b, Ordering::Relaxed);
    }
    rt.stats.unpublish_model(m.published);
    rt.trace.flush_model(m.id);
    m.state.store(STATE_UNLOADED, Ordering::Release);
}
