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
//! Three surfaces share one pipeline of stages (`pipeline`: validate → bind → stage →
//! doorbell → retire) and one harvest step function (`harvest`), which ends at each
//! execution's completion word; the completion seam (`completion`) hands every execution to
//! its one owner. The surfaces (`surface/`) sit on top: [`Runtime::execute`] (synchronous;
//! the caller harvests and retires), the implicit async worker pool
//! (`NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`, callbacks), and the explicit NRT 3.0
//! surface ([`Runtime::execute_schedule`] / [`Runtime::is_completed`]). All public methods
//! of [`Runtime`] are in `api.rs`.

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
pub(crate) mod completion;
pub mod config;
pub mod error;
pub mod harvest;
pub mod host;
pub mod log;
pub mod model;
pub(crate) mod pipeline;
pub(crate) mod surface;
pub mod tensor;
pub mod trace;
pub(crate) mod vcore;
pub(crate) mod wait;

pub use config::{RuntimeConfig, SyncOnCaller};
pub use error::{NrtError, Result};
pub use model::{LoadOptions, TensorInfo};
pub use nrt_hal::{DType, NrtStatus, SeqId};
pub use pipeline::BindMode;
pub use surface::explicit::XuKind;
pub use surface::implicit::{AsyncCallback, in_async_callback};
pub use tensor::{Placement, Tensor, TensorSet};
pub use trace::{
    InspectConfig, InspectMode, InstructionSpan, Span, Stage, chrome_json,
    chrome_json_with_instructions,
};

use crate::model::{ModelShared, STATE_LOADED, STATE_UNLOADED, STATE_UNLOADING};
use crate::surface::implicit::ImplicitAsync;
use crate::vcore::VCore;
use nrt_hal::Device;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// Binds that cloned host tensors into device memory (the synchronous path, in
    /// [`BindMode::CloneHostTensors`]).
    pub host_clone_binds: u64,
    /// Times a synchronous caller queued behind the caller serving the core, blocked, was
    /// woken on the served wake (`nrt_hal::ServedCore`; wraps at 2^31).
    pub served_wakes: u64,
    /// Times a signal woke a thread asleep on one execution's own wake (a synchronous
    /// caller: `nrt_hal::ExecutionWakes`; the sum over the in-flight slots, each wrapping
    /// at 2^31).
    pub execution_wakes: u64,
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
    // Every execution of the model holds one of its I/O sets from `bind` until it is retired
    // (or unbound on a failure path), so "all sets free" is "nothing in flight". A binder
    // takes its set, then reads the state; this marks the state, then reads the sets — with
    // an asymmetric fence pair between (`pipeline::bind`): either the binder sees the mark
    // and hands its set back untouched, or this sees the set taken and waits. So once every
    // set is free, no execution of the model is inside and none will be.
    nrt_hal::sync::heavy_fence();
    // Spins and yields: a set a synchronous owner hands back is not signaled.
    let mut spin = wait::Spin::new();
    while !m.io_sets.all_free() {
        if completion::drive(rt, vc, 0) == harvest::Step::Idle {
            spin.snooze();
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
