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

pub mod builtin;
pub mod config;
pub mod error;
pub(crate) mod exec;
pub mod harvest;
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
pub use trace::{Span, Stage, chrome_json};
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
}

/// One entry of a vcore's in-flight table, indexed by `compute_idx % EXEC_RING_SLOTS`.
/// See [`harvest`] for who writes which field.
pub(crate) struct InflightSlot {
    /// Seq of the execution occupying the slot; 0 = free.
    pub(crate) ticket: AtomicU64,
    /// Completion word: `seq << 16 | status`; written once, by the harvest.
    pub(crate) done: AtomicU64,
    pub(crate) info: UnsafeCell<SlotInfo>,
}

// SAFETY: `info` follows the ticket protocol documented in `harvest`: written by the stager
// before the ticket's Release store, read by the harvest and the owner after acquiring it,
// cleared by the owner after the completion word; never accessed concurrently for writing.
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
}

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
}

/// Whether the runtime is open (one `Acquire` load).
#[inline]
pub(crate) fn is_open(rt: &RuntimeInner) -> bool {
    rt.state.load(Ordering::Acquire) == OPEN
}

pub(crate) fn ensure_open(rt: &RuntimeInner) -> Result<()> {
    if rt.state.load(Ordering::Acquire) == OPEN {
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

impl Runtime {
    /// Starts a runtime on `device`: reserves the selected cores (sets up their DMA trigger
    /// queues and notification rings, exclusively) and, if configured, the implicit-async
    /// worker pool.
    pub fn init(device: Arc<dyn Device>, config: RuntimeConfig) -> Result<Runtime> {
        config.validate()?;
        let info = device.info();
        let cores = config::select_cores(&config, info.num_cores)?;
        let lnc = config.lnc() as usize;
        let mut vcores = Vec::with_capacity(cores.len() / lnc);
        let mut reserved: Vec<u32> = Vec::new();
        let release = |dev: &dyn Device, reserved: &[u32]| {
            for &c in reserved {
                let _ = dev.dma_queue_release(c);
                let _ = dev.notification_release(c);
            }
        };
        for (vi, group) in cores.chunks(lnc).enumerate() {
            let mut dma = Vec::new();
            let mut rings = Vec::new();
            for &c in group {
                let setup = || -> Result<(Producer<TriggerPair>, PlaneConsumer)> {
                    let d = device
                        .dma_queue_init(c, tuning::DMA_QUEUE_CAPACITY)
                        .map_err(|e| {
                            NrtError::new(
                                NrtStatus::Resource,
                                format!("NeuronCore {c} is not available: {e}"),
                            )
                        })?;
                    let r = device
                        .notification_init(c, tuning::NQ_RING_CAPACITY)
                        .map_err(|e| {
                            let _ = device.dma_queue_release(c);
                            NrtError::new(
                                NrtStatus::Resource,
                                format!("NeuronCore {c} is not available: {e}"),
                            )
                        })?;
                    Ok((d, r))
                };
                match setup() {
                    Ok((d, r)) => {
                        reserved.push(c);
                        dma.push(d);
                        rings.push(r);
                    }
                    Err(e) => {
                        // Only what this call reserved: core `c` may belong to another runtime.
                        release(&*device, &reserved);
                        return Err(e);
                    }
                }
            }
            let slots = tuning::EXEC_RING_SLOTS as usize;
            let now = harvest::coarse_now();
            vcores.push(VCore {
                index: vi as u32,
                cores: group.to_vec(),
                staging: Mutex::new(Staging {
                    submitted: 0,
                    dma,
                    last_model: vec![0; group.len()],
                }),
                watch: rings.iter().map(PlaneConsumer::watch).collect(),
                idle_polls: AtomicU32::new(0),
                harvest: Mutex::new(Harvest {
                    rings,
                    progress: vec![Progress::EMPTY; slots].into_boxed_slice(),
                    times: vec![[[[0; 2]; NUM_ENGINES]; 2]; slots].into_boxed_slice(),
                    last_sweep: now,
                }),
                slots: (0..slots)
                    .map(|_| InflightSlot {
                        ticket: AtomicU64::new(0),
                        done: AtomicU64::new(0),
                        info: UnsafeCell::new(SlotInfo {
                            model: None,
                            io_set: 0,
                            sg_count: 1,
                            deadline: now,
                            timeout: Duration::ZERO,
                            surface: Surface::Sync,
                            pending_marked: false,
                        }),
                    })
                    .collect(),
                completed: AtomicU64::new(0),
                unrecoverable: AtomicBool::new(false),
                counters: VcoreCounters::default(),
                models: AtomicU32::new(0),
                submitted: AtomicU64::new(0),
                xu: Xu::new(vi as u32),
            });
        }
        let implicit_async = if config.async_inflight > 0 {
            Some(ImplicitAsync::new(config.async_inflight, vcores.len()))
        } else {
            None
        };
        let inner = Arc::new(RuntimeInner {
            device,
            state: AtomicU8::new(OPEN),
            config,
            vcores: vcores.into_boxed_slice(),
            models: Mutex::new(Vec::new()),
            next_model_id: AtomicU32::new(1),
            implicit_async,
            trace: trace::Trace::new(),
            workers: Mutex::new(Vec::new()),
            workers_started: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        if let Err(e) = xu::start_workers(&inner) {
            release(&*inner.device, &reserved);
            return Err(e);
        }
        nrt_log!(
            log::Module::Nrt,
            log::Level::Info,
            "nrt_init",
            "reserved {} NeuronCore(s) as {} logical core(s); {}",
            reserved.len(),
            inner.vcores.len(),
            if inner.implicit_async.is_some() {
                "implicit async mode"
            } else {
                "synchronous mode"
            }
        );
        let guard = Arc::new(CloseOnDrop(inner.clone()));
        Ok(Runtime(inner, guard))
    }

    /// [`Runtime::init`] with [`RuntimeConfig::from_env`].
    pub fn init_from_env(device: Arc<dyn Device>) -> Result<Runtime> {
        log::configure_from_env();
        Runtime::init(device, RuntimeConfig::from_env()?)
    }

    /// Closes the runtime: drains in-flight executions, unloads every model, releases the
    /// cores. Later calls on this runtime or its handles return `NRT_CLOSED`. Closing twice
    /// is a no-op.
    pub fn close(&self) {
        Runtime::close_inner(&self.0);
    }

    fn close_inner(rt: &Arc<RuntimeInner>) {
        if rt
            .state
            .compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        xu::drain_all(rt);
        let models: Vec<Arc<ModelShared>> =
            std::mem::take(&mut *rt.models.lock().unwrap_or_else(|e| e.into_inner()));
        for m in &models {
            unload_model(rt, m);
        }
        rt.state.store(CLOSED, Ordering::Release);
        xu::stop_workers(rt);
        for vc in rt.vcores.iter() {
            for &c in &vc.cores {
                let _ = rt.device.dma_queue_release(c);
                let _ = rt.device.notification_release(c);
            }
        }
    }

    /// Whether the runtime is open.
    pub fn is_open(&self) -> bool {
        ensure_open(&self.0).is_ok()
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.0.config
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.0.device
    }

    /// Logical cores of this runtime (`nrt_get_visible_vnc_count`).
    pub fn vnc_count(&self) -> u32 {
        self.0.vcores.len() as u32
    }

    /// Loads a compiled model (NCM bytes) onto logical core `vnc` (`-1`: the one with the
    /// fewest models) (`nrt_load`).
    pub fn load(&self, bytes: &[u8], vnc: i32, opts: &LoadOptions) -> Result<Model> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = if vnc < 0 {
            rt.vcores
                .iter()
                .min_by_key(|v| v.models.load(Ordering::Relaxed))
                .expect("at least one vcore")
        } else {
            rt.vcores.get(vnc as usize).ok_or_else(|| {
                NrtError::new(
                    NrtStatus::LoadNotEnoughNc,
                    format!(
                        "logical NeuronCore {vnc} does not exist ({} visible)",
                        rt.vcores.len()
                    ),
                )
            })?
        };
        let id = rt.next_model_id.fetch_add(1, Ordering::Relaxed);
        let m = Arc::new(model::load(rt, bytes, vc, id, opts).inspect_err(|e| {
            nrt_log!(log::Module::Nrt, log::Level::Error, "nrt_load", "{e}");
        })?);
        vc.models.fetch_add(1, Ordering::Relaxed);
        rt.models
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(m.clone());
        nrt_log!(
            log::Module::Nrt,
            log::Level::Info,
            "nrt_load",
            "loaded model '{}' (id {}) on vnc {} ({} core(s))",
            m.name,
            m.id,
            m.vnc,
            m.sg_count
        );
        Ok(Model(m))
    }

    /// Unloads a model (`nrt_unload`): executions in flight finish first; later executions
    /// of it fail with `NRT_INVALID`. Unloading twice is `NRT_INVALID`.
    pub fn unload(&self, model: &Model) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        if xu::in_async_callback() {
            return Err(xu::refused_in_callback("nrt_unload"));
        }
        if model
            .0
            .state
            .compare_exchange(
                STATE_LOADED,
                STATE_UNLOADING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Err(NrtError::invalid(format!(
                "model '{}' (id {}) is already unloaded",
                model.0.name, model.0.id
            )));
        }
        rt.models
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|m| !Arc::ptr_eq(m, &model.0));
        unload_model(rt, &model.0);
        Ok(())
    }

    /// Allocates a tensor of `size` bytes (`nrt_tensor_allocate`). Device tensors live on
    /// logical core `vnc`.
    pub fn allocate_tensor(
        &self,
        placement: Placement,
        vnc: i32,
        size: u64,
        name: &str,
    ) -> Result<Tensor> {
        ensure_open(&self.0)?;
        match placement {
            Placement::Device => {
                if vnc < 0 || vnc as usize >= self.0.vcores.len() {
                    return Err(NrtError::invalid(format!(
                        "logical NeuronCore {vnc} does not exist ({} visible) for tensor '{name}'",
                        self.0.vcores.len()
                    )));
                }
                Tensor::new_device(&self.0, vnc, size, name)
            }
            Placement::Host | Placement::Virtual => {
                Tensor::new_host(&self.0, placement, size, name)
            }
        }
    }

    /// A tensor with no storage yet (`nrt_tensor_allocate_empty`); attach a buffer with
    /// [`Tensor::attach_buffer`].
    pub fn allocate_empty_tensor(&self, name: &str) -> Result<Tensor> {
        ensure_open(&self.0)?;
        Ok(Tensor::new_empty(&self.0, name))
    }

    /// Executes `model` on `inputs`, writing `outputs` (`nrt_execute`). In implicit async
    /// mode this returns as soon as the execution is staged; completion arrives through the
    /// registered callback.
    pub fn execute(&self, model: &Model, inputs: &TensorSet, outputs: &TensorSet) -> Result<()> {
        self.execute_repeat(model, inputs, outputs, 1)
    }

    /// `nrt_execute_repeat`: `repeat` must be ≤ 1 (repeated execution needs a specially
    /// compiled model, which this runtime does not produce).
    pub fn execute_repeat(
        &self,
        model: &Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
        repeat: i32,
    ) -> Result<()> {
        match exec::exec_mode(&self.0) {
            ExecMode::ExplicitAsync => {
                exec::execute_sync(&self.0, &model.0, inputs, outputs, repeat)
            }
            ExecMode::ImplicitAsync => {
                xu::execute_implicit(&self.0, &model.0, inputs, outputs, repeat)
            }
        }
    }

    /// Device memory in use (`nrt_get_vnc_memory_stats`).
    pub fn memory_stats(&self, vnc: u32) -> Result<MemoryStats> {
        ensure_open(&self.0)?;
        if vnc as usize >= self.0.vcores.len() {
            return Err(NrtError::invalid(format!(
                "logical NeuronCore {vnc} does not exist"
            )));
        }
        let u = self.0.device.mem_usage();
        Ok(MemoryStats {
            bytes_used: u.bytes_used,
            bytes_limit: u.bytes_limit,
        })
    }

    /// Staging/doorbell/publish counters of logical core `vnc`.
    pub fn pipeline_counters(&self, vnc: u32) -> PipelineCounters {
        let c = &self.0.vcores[vnc as usize].counters;
        PipelineCounters {
            staging_locks: c.staging_locks.load(Ordering::Relaxed),
            doorbells: c.doorbells.load(Ordering::Relaxed),
            publishes: c.publishes.load(Ordering::Relaxed),
            barrier_proxy_waits: c.barrier_proxy_waits.load(Ordering::Relaxed),
        }
    }

    /// Model-switch counters.
    pub fn switch_counters(&self) -> SwitchCounters {
        let sum = |f: fn(&VcoreCounters) -> &AtomicU64| {
            self.0
                .vcores
                .iter()
                .map(|v| f(&v.counters).load(Ordering::Relaxed))
                .sum()
        };
        SwitchCounters {
            model_switches: sum(|c| &c.model_switches),
            steady: sum(|c| &c.steady_executions),
        }
    }

    /// Turns per-stage tracing on (clearing the ring) or off.
    pub fn set_tracing(&self, on: bool) {
        let dev = &self.0.device;
        self.0.trace.set_enabled(on, || dev.clock_ns());
    }

    /// The recorded spans, oldest first.
    pub fn trace_spans(&self) -> Vec<Span> {
        let mut v = Vec::new();
        self.0.trace.spans(&mut v);
        v
    }

    /// Resets logical core `vnc` after a fatal error: resets its cores on the device and makes
    /// its XU accept work again.
    pub fn reset_vnc(&self, vnc: u32) -> Result<()> {
        ensure_open(&self.0)?;
        let vc = self
            .0
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        let _st = vc.staging.lock().unwrap_or_else(|e| e.into_inner());
        for &c in &vc.cores {
            self.0.device.nc_reset(c)?;
        }
        vc.unrecoverable.store(false, Ordering::Release);
        Ok(())
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
    m.state.store(STATE_UNLOADED, Ordering::Release);
}
