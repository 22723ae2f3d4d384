//! The process-global runtime and the handle pools.
//!
//! Life cycle (documented in `nrt.h`):
//!
//! | state | APIs that need the runtime return |
//! |---|---|
//! | before the first `nrt_init` | `NRT_UNINITIALIZED` |
//! | between `nrt_init` and `nrt_close` | their result |
//! | after `nrt_close` | `NRT_CLOSED` |
//!
//! - `nrt_init` while a runtime is open returns `NRT_FAILURE` and keeps the open runtime
//!   unchanged (its handles stay valid).
//! - `nrt_init` after `nrt_close` starts a **new** runtime on a new software device (a new
//!   *epoch*). Handles of the previous runtime stay dead: its models were unloaded by
//!   `nrt_close` (their handles are stale: `NRT_INVALID`), its tensors answer `NRT_CLOSED`
//!   and may still be freed, tensor sets (plain host objects) keep working but cannot be
//!   executed while they hold tensors of the old runtime.
//! - `nrt_close` before `nrt_init` or twice is a logged no-op.
//!
//! Hot paths never take a lock here: the phase is an atomic, a model handle carries its
//! runtime, and the global runtime sits in a [`Slot`] that is pinned with atomics.

use crate::ffi::{Fail, Res};
use crate::handle::{Pin, Pool, Slot};
use nrt_runtime::log::{Level, Module};
use nrt_runtime::{Model, NrtError, NrtStatus, Runtime, RuntimeConfig, Tensor, TensorSet, nrt_log};
use nrt_sim::{SimConfig, SoftDevice};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const UNINIT: u8 = 0;
const OPEN: u8 = 1;
const CLOSED: u8 = 2;

static PHASE: AtomicU8 = AtomicU8::new(UNINIT);
/// Incremented by each successful `nrt_init`; handles remember the epoch they were made in.
static EPOCH: AtomicU64 = AtomicU64::new(0);
/// Serializes `nrt_init` and `nrt_close`.
static LIFECYCLE: Mutex<()> = Mutex::new(());
static RUNTIME: Slot<RtEntry> = Slot::new();

/// The open runtime.
pub(crate) struct RtEntry {
    pub(crate) rt: Runtime,
    pub(crate) epoch: u64,
    /// The software NeuronCore under `rt` (for the `nrt_sim_*` extensions).
    pub(crate) device: Arc<SoftDevice>,
}

/// What an `nrt_model_t *` holds.
pub(crate) struct ModelEntry {
    pub(crate) model: Model,
    pub(crate) rt: Runtime,
    pub(crate) epoch: u64,
}

/// What an `nrt_tensor_t *` holds.
pub(crate) struct TensorEntry {
    pub(crate) tensor: Tensor,
    pub(crate) epoch: u64,
}

/// What an `nrt_tensor_set_t *` holds: the runtime's set, and for each name the handle that
/// was added (returned by `nrt_get_tensor_from_tensor_set`) and its epoch.
#[derive(Default)]
pub(crate) struct SetEntry {
    pub(crate) set: TensorSet,
    pub(crate) handles: HashMap<String, (usize, u64)>,
    /// The oldest epoch among the members (`u64::MAX` when empty).
    pub(crate) min_epoch: u64,
}

impl SetEntry {
    pub(crate) fn new() -> SetEntry {
        SetEntry {
            min_epoch: u64::MAX,
            ..Default::default()
        }
    }

    /// Adds or replaces `name`.
    pub(crate) fn add(&mut self, name: &str, handle: usize, t: &TensorEntry) {
        self.set.add(name, &t.tensor);
        match self.handles.get_mut(name) {
            Some(h) => *h = (handle, t.epoch),
            None => {
                self.handles.insert(name.to_owned(), (handle, t.epoch));
            }
        }
        self.min_epoch = self.handles.values().map(|h| h.1).min().unwrap_or(u64::MAX);
    }
}

pub(crate) static MODELS: Pool<ModelEntry> = Pool::new("model");
pub(crate) static TENSORS: Pool<TensorEntry> = Pool::new("tensor");
pub(crate) static SETS: Pool<SetEntry> = Pool::new("tensor_set");

/// `NRT_UNINITIALIZED` before the first `nrt_init`; fine afterwards, even when closed (for
/// host-side lookups that cleanup code needs after `nrt_close`).
#[inline]
pub(crate) fn ensure_initialized_once() -> Res {
    if PHASE.load(Ordering::Acquire) == UNINIT {
        Err(phase_error())
    } else {
        Ok(())
    }
}

/// Whether a runtime is open.
#[inline]
pub(crate) fn is_open() -> bool {
    PHASE.load(Ordering::Acquire) == OPEN
}

/// The current epoch.
#[inline]
pub(crate) fn epoch() -> u64 {
    EPOCH.load(Ordering::Acquire)
}

/// `NRT_UNINITIALIZED` or `NRT_CLOSED`, whichever applies now.
#[cold]
pub(crate) fn phase_error() -> Fail {
    match PHASE.load(Ordering::Acquire) {
        UNINIT => Fail::Err(NrtError::new(
            NrtStatus::Uninitialized,
            "the runtime is not initialized: call nrt_init first",
        )),
        _ => Fail::Err(NrtError::new(
            NrtStatus::Closed,
            "the runtime was closed by nrt_close",
        )),
    }
}

/// Pins the open runtime.
#[inline]
pub(crate) fn runtime() -> Res<Pin<'static, RtEntry>> {
    RUNTIME.pin().ok_or_else(phase_error)
}

/// A clone of the open runtime (for calls that block: they must not hold a pin, which
/// would make `nrt_close` wait for them).
pub(crate) fn runtime_clone() -> Res<(Runtime, u64)> {
    let p = runtime()?;
    Ok((p.rt.clone(), p.epoch))
}

/// Checks that a tensor belongs to the open runtime.
#[inline]
pub(crate) fn check_tensor_epoch(t: &TensorEntry, arg: &str) -> Res {
    if t.epoch == epoch() && is_open() {
        Ok(())
    } else {
        Err(stale_epoch(t, arg))
    }
}

#[cold]
fn stale_epoch(t: &TensorEntry, arg: &str) -> Fail {
    if !is_open() {
        return phase_error();
    }
    Fail::Err(NrtError::new(
        NrtStatus::Closed,
        format!(
            "{arg} (tensor '{}') belongs to a runtime that nrt_close closed",
            t.tensor.name()
        ),
    ))
}

/// `nrt_init`: starts the runtime on a new software device, configured from the
/// environment.
pub(crate) fn init() -> Res {
    let _g = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
    if PHASE.load(Ordering::Acquire) == OPEN {
        return Err(Fail::Err(NrtError::new(
            NrtStatus::Failure,
            "the runtime is already initialized (call nrt_close first); keeping the running one",
        )));
    }
    // (nrt_init configured the log levels from the environment already.)
    let config = RuntimeConfig::from_env()?;
    let sim = SimConfig::from_env().map_err(|e| NrtError::invalid(e.to_string()))?;
    let device = SoftDevice::new(sim).map_err(|e| {
        NrtError::new(
            NrtStatus::Resource,
            format!("cannot start the software NeuronCore: {e}"),
        )
    })?;
    let device = Arc::new(device);
    let rt = Runtime::init(device.clone(), config)?;
    let epoch = EPOCH.fetch_add(1, Ordering::AcqRel) + 1;
    RUNTIME.install(RtEntry { rt, epoch, device });
    PHASE.store(OPEN, Ordering::Release);
    Ok(())
}

/// `nrt_close`: closes the runtime (draining and unloading everything), kills the model
/// handles, and drops the device.
pub(crate) fn close() -> Res {
    if nrt_runtime::in_async_callback() {
        // Closing drains the workers, and this thread is one of them.
        return Err(Fail::Err(NrtError::invalid(
            "nrt_close cannot be called from the async-exec callback: it waits for the worker that runs this callback (call it from another thread); the runtime stays open",
        )));
    }
    let _g = LIFECYCLE.lock().unwrap_or_else(|e| e.into_inner());
    match PHASE.load(Ordering::Acquire) {
        OPEN => {}
        UNINIT => {
            return Err(Fail::Err(NrtError::new(
                NrtStatus::Uninitialized,
                "nrt_close before nrt_init: nothing to close",
            )));
        }
        _ => {
            return Err(Fail::Warn(NrtError::new(
                NrtStatus::Closed,
                "the runtime is already closed",
            )));
        }
    }
    PHASE.store(CLOSED, Ordering::Release);
    // Calls that pinned the runtime before the phase changed finish first.
    let entry = RUNTIME.take();
    if let Some(e) = &entry {
        e.rt.close();
    }
    // Executions that pinned a model finish (close drained them), then the handles die.
    let models = MODELS.drain_live();
    nrt_log!(
        Module::Nrt,
        Level::Info,
        "nrt_close",
        "runtime closed; {} model(s) still loaded were unloaded",
        models.len()
    );
    drop(models);
    drop(entry);
    Ok(())
}

/// The number of physical cores of the software device a runtime would get, and the
/// logical-core size, from the environment — for the counts that work before `nrt_init`.
pub(crate) fn device_cores_from_env() -> Res<(u32, RuntimeConfig)> {
    let sim = SimConfig::from_env().map_err(|e| NrtError::invalid(e.to_string()))?;
    let config = RuntimeConfig::from_env()?;
    Ok((sim.cores, config))
}
