//! The process-global runtime: one software NeuronCore device and the runtime on it, started
//! on first use from the environment and `configure()`'s [`Settings`], and what a fork child
//! does with the one its parent left it (leaks it and starts its own).

use crate::error::{from_rt, nrt_err};
use crate::lock;
use nrt_hal::NrtStatus;
use nrt_runtime::log::{Level, Module};
use nrt_runtime::{NrtError as RtError, Runtime, RuntimeConfig};
use nrt_sim::{SimConfig, SoftDevice};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

/// What `configure()` overrides (applied when the runtime starts).
#[derive(Clone, Debug, Default)]
pub(crate) struct Settings {
    pub(crate) visible_cores: Option<Vec<u32>>,
    pub(crate) num_cores: Option<u32>,
    pub(crate) logical_nc: Option<u32>,
    pub(crate) log_level: Option<Level>,
}

/// The device and the runtime on it.
///
/// A fork child inherits it but none of its threads (the device's, the XU workers), and any
/// of its locks another thread of the parent held at fork stays locked: a child never
/// touches it, nor drops it (dropping closes the runtime, which joins those threads). Every
/// entry point compares `pid` with the calling process's first ([`Global::check_owner`]);
/// [`global`] leaks the parent's and starts the child's own.
pub(crate) struct Global {
    pub(crate) device: Arc<SoftDevice>,
    pub(crate) rt: Runtime,
    /// The process that started it.
    pub(crate) pid: u32,
    /// Physical cores of each logical core (index = logical core).
    pub(crate) vnc_cores: Vec<Vec<u32>>,
    /// Model id -> (name, still loaded) of the models loaded, for trace files: an unloaded
    /// model's entry goes at once unless a trace is being recorded, then when it is written.
    pub(crate) names: Mutex<BTreeMap<u32, (String, bool)>>,
    /// Whether a trace is being recorded (`nrt.profile`).
    pub(crate) tracing: AtomicBool,
}

impl Global {
    /// `Ok` in the process that started this runtime; in a fork child, the error saying that
    /// `what` (a model, a tensor) belongs to the parent and must be made again.
    pub(crate) fn check_owner(&self, what: impl FnOnce() -> String) -> PyResult<()> {
        if self.pid == std::process::id() {
            return Ok(());
        }
        Err(nrt_err(
            NrtStatus::InvalidHandle,
            format!(
                "{} belongs to the runtime of the parent process (pid {}); this process is a \
                 fork of it, where that runtime cannot run: load the model (or make the \
                 tensor) again in this process",
                what(),
                self.pid
            ),
        ))
    }

    /// Forgets an unloaded model's name (kept until the trace is written while tracing).
    pub(crate) fn forget_name(&self, id: u32) {
        let mut names = lock(&self.names);
        if self.tracing.load(Ordering::Relaxed) {
            if let Some(e) = names.get_mut(&id) {
                e.1 = false;
            }
        } else {
            names.remove(&id);
        }
    }
}

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Global")
            .field("vnc_cores", &self.vnc_cores)
            .finish()
    }
}

pub(crate) static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    visible_cores: None,
    num_cores: None,
    logical_nc: None,
    log_level: None,
});
/// The runtime. Locked only with the GIL held and never across a release of it, so a
/// thread forking (with the GIL) never leaves it locked; a fork child still checks
/// [`GLOBAL_PID`] before locking it and only ever `try_lock`s it then.
pub(crate) static GLOBAL: Mutex<Option<Arc<Global>>> = Mutex::new(None);
/// The pid of the process that last set [`GLOBAL`] (0: never set).
static GLOBAL_PID: AtomicU32 = AtomicU32::new(0);
/// In a fork child whose parent had a runtime: the parent's pid (for error messages).
static FORKED_FROM: AtomicU32 = AtomicU32::new(0);

pub(crate) fn set_log_levels(level: Level) {
    for m in [Module::Nrt, Module::Nmgr, Module::Tdrv] {
        nrt_runtime::log::set_level(m, level);
    }
}

fn start_runtime(s: &Settings) -> Result<Global, RtError> {
    nrt_runtime::log::configure_from_env();
    if let Some(l) = s.log_level {
        set_log_levels(l);
    }
    let sim = SimConfig::from_env().map_err(|e| RtError::invalid(e.to_string()))?;
    let device = Arc::new(SoftDevice::new(sim).map_err(|e| {
        RtError::new(
            NrtStatus::Resource,
            format!("cannot start the software NeuronCore: {e}"),
        )
    })?);
    let mut cfg = RuntimeConfig::from_env()?;
    if let Some(v) = &s.visible_cores {
        cfg.visible_cores = Some(v.clone());
    }
    if let Some(n) = s.num_cores {
        cfg.num_cores = n;
        if s.visible_cores.is_none() {
            cfg.visible_cores = None;
        }
    }
    if let Some(l) = s.logical_nc {
        cfg.logical_nc = l;
    }
    // Python drives the synchronous surface; implicit async (callbacks) is a C-API mode.
    cfg.async_inflight = 0;
    let cores = nrt_runtime::config::select_cores(&cfg, device.config().cores)?;
    let vnc_cores = cores
        .chunks(cfg.lnc() as usize)
        .map(<[u32]>::to_vec)
        .collect();
    let rt = Runtime::init(device.clone(), cfg)?;
    Ok(Global {
        device,
        rt,
        pid: std::process::id(),
        vnc_cores,
        names: Mutex::new(BTreeMap::new()),
        tracing: AtomicBool::new(false),
    })
}

/// In a fork child: leaks the runtime inherited from the parent, without touching it
/// (its threads do not exist here, and a lock a parent thread held stays locked), so that the
/// next use starts this process's own. Idempotent; a no-op outside a fork child. Called by
/// `os.register_at_fork(after_in_child=...)` and, for forks Python does not see, by
/// [`global`].
pub(crate) fn leave_parent_runtime() -> PyResult<()> {
    let pid = std::process::id();
    let owner = GLOBAL_PID.load(Ordering::Acquire);
    if owner == 0 || owner == pid {
        return Ok(());
    }
    let mut g = match GLOBAL.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Err(nrt_err(
                NrtStatus::InvalidHandle,
                format!(
                    "this process is a fork of pid {owner}, made while a thread of the parent \
                     was starting or closing the runtime; the nrt package cannot be used in \
                     this process (fork before first use, or use the 'spawn' start method)"
                ),
            ));
        }
    };
    if let Some(parent) = g.take() {
        FORKED_FROM.store(parent.pid, Ordering::Relaxed);
        // Never dropped here: dropping closes the runtime, which joins threads that exist
        // only in the parent.
        std::mem::forget(parent);
    }
    GLOBAL_PID.store(pid, Ordering::Release);
    Ok(())
}

/// `os.register_at_fork(after_in_child=...)`: the child forgets the parent's runtime.
#[pyfunction]
pub(crate) fn _after_fork_child() -> PyResult<()> {
    leave_parent_runtime()
}

/// The open runtime, started now if there is none (or the last one was closed). Takes the
/// GIL token: it is called with the GIL held.
pub(crate) fn global(_py: Python<'_>) -> PyResult<Arc<Global>> {
    leave_parent_runtime()?;
    let mut g = lock(&GLOBAL);
    if let Some(rt) = g.as_ref().filter(|g| g.rt.is_open()) {
        return Ok(rt.clone());
    }
    let s = lock(&SETTINGS).clone();
    // Started with the GIL held: releasing it while holding GLOBAL would deadlock against a
    // thread that holds the GIL and waits for GLOBAL. It takes milliseconds, once.
    let started = start_runtime(&s).map_err(|e| match FORKED_FROM.load(Ordering::Relaxed) {
        0 => from_rt(e),
        parent => nrt_err(
            e.status,
            format!(
                "this process is a fork of pid {parent}, whose runtime keeps its cores; \
                 starting this process's own runtime failed: {}",
                e.message
            ),
        ),
    })?;
    let started = Arc::new(started);
    GLOBAL_PID.store(started.pid, Ordering::Release);
    *g = Some(started.clone());
    Ok(started)
}
