//! # nrt-sim — the software NeuronCore
//!
//! A device that implements the [`nrt_hal::Device`] contract in software, faithful where the
//! seed pins bytes and mechanisms:
//!
//! - **device memory**: one physical address space per device, lazily committed
//!   ([`memory`]); out-of-range accesses by instructions or DMA descriptors are device errors,
//!   never host crashes;
//! - **NeuronCores** ([`neuron_core`]) with engines PE, ACT, POOL, DVE, SP, a semaphore file, exec
//!   request rings, a DMA trigger queue, one INFER_STATUS notification ring per engine and an
//!   ERROR ring, and an interrupt-cause word;
//! - **the doorbell**: `semaphore_increment(nc, INFERENCE_START, 1)` makes the core run the
//!   staged trigger pairs (request copy, event poke, tail increment) and then every request
//!   they published, in order; merged and spurious doorbells are harmless;
//! - **scheduling fit for 2 vCPUs**: one device thread per core, up to the CPUs the process
//!   may use (configurable), so a two-core model's cores compute in parallel — unless that
//!   does not pay: short parts, and parts that a busy host runs one after the other anyway,
//!   are served by the group leader's thread alone (`serve_mode`); a thread runs its core's
//!   engines cooperatively, spins a bounded time after work and then parks on an
//!   [`nrt_hal::IdleGate`] that the doorbell opens; at a lockstep barrier it spins a bounded
//!   time and then blocks until the partner core moves;
//! - **the completion interrupt**: after publishing notification records a core signals the
//!   [`nrt_hal::CompletionWake`] the host attached ([`Device::notification_wake`]), so a host
//!   thread can block instead of spinning; the publication that finishes an execution also
//!   signals that execution's own wake ([`Device::execution_wakes`]), for the one thread
//!   waiting for it;
//! - **real kernels** from [`nrt_kernels`];
//! - **fault injection** ([`fault`]): hang, dropped notifications, NaN, parity, transient,
//!   DMA abort, HBM UE, fatal — each writing what hardware would.

pub mod fault;
pub mod host;
pub mod memory;
pub mod neuron_core;
mod serve_mode;
pub mod testkit;

pub use fault::{FaultKind, FaultParseError, FaultSpec, parse_faults};
pub use host::{HostError, HostShape};
pub use neuron_core::InstructionEvent;

use crate::memory::Memory;
use crate::neuron_core::{CoreShared, ExecFaults, ExecQueue, NOT_JOINT, Poll};
use crate::serve_mode::{Sample, ServeMode, ServeModeChooser};
use nrt_hal::{
    CompletionWake, DevAddr, Device, DeviceInfo, DeviceMapping, Engine, ExecQueueDesc,
    ExecutionWakes, HalError, IdleGate, MemUsage, NUM_ENGINES, PlaneConsumer, PlaneProducer,
    Producer, SEMAPHORE_INFERENCE_START, TriggerPair, plane, ring, tuning,
};
use nrt_isa::GLOBAL_SEMAPHORES;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How to build a software device.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Physical NeuronCores (default 2, so two-core models can run).
    pub cores: u32,
    /// Size of the device's physical address space (reserved lazily; default 16 GiB).
    pub memory_bytes: u64,
    /// Device threads; core `c` is served by thread `c % threads`, except that a core whose
    /// lockstep parts are short is served jointly by its group leader's thread
    /// ([`tuning::DEVICE_JOINT_PART_MAX`]). 0 (the default) means one per core, up to the
    /// CPUs this process may run on ([`SimConfig::auto_threads`]): the cores of a two-core
    /// model compute in parallel (`mlp_b64 --cores 2`: 360–390 µs against 650 µs on one
    /// thread), while a short two-core execution still runs on one thread (the lockstep
    /// near-null: ~2 µs, where a hand-off per barrier made it 19 µs). `NRT_SIM_THREADS` sets it
    /// from the environment (1: one thread for every core).
    pub threads: u32,
    /// How long a device thread polls after its last work before parking.
    pub spin_after_work: Duration,
    /// How long an execution may make no progress before the core declares a hang.
    pub hang_watchdog: Duration,
    /// How often a parked device thread looks at a core that a host thread serves
    /// (`Device::host_serves`), to run work nobody took since its last look
    /// ([`tuning::DEVICE_HOST_SERVED_CHECK`]; at least 100 µs, so that a zero does not turn
    /// the park into a spin).
    pub host_served_check: Duration,
    /// Faults to inject.
    pub faults: Vec<FaultSpec>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            cores: 2,
            memory_bytes: 16 << 30,
            threads: 0,
            spin_after_work: tuning::DEVICE_SPIN_AFTER_WORK,
            hang_watchdog: tuning::DEVICE_HANG_WATCHDOG,
            host_served_check: tuning::DEVICE_HOST_SERVED_CHECK,
            faults: Vec::new(),
        }
    }
}

impl SimConfig {
    /// The default configuration shaped as the virtual host of the environment
    /// ([`HostShape::from_env`]: `NRT_SIM_INSTANCE` and its overrides; unset = 2 cores,
    /// 16 GiB as before), with `NRT_SIM_FAULTS` parsed into `faults`.
    pub fn from_env() -> Result<SimConfig, FaultParseError> {
        let host = HostShape::from_env().map_err(|e| FaultParseError {
            entry: String::new(),
            reason: e.0,
        })?;
        let mut c = SimConfig::for_host(&host);
        if let Some(v) = std::env::var_os("NRT_SIM_FAULTS") {
            let s = v.to_str().ok_or_else(|| FaultParseError {
                entry: v.to_string_lossy().into_owned(),
                reason: "the value is not UTF-8".into(),
            })?;
            c.faults = parse_faults(s)?;
        }
        if let Some(v) = std::env::var_os("NRT_SIM_THREADS") {
            let bad = |reason: String| FaultParseError {
                entry: format!("NRT_SIM_THREADS={}", v.to_string_lossy()),
                reason,
            };
            let n: u32 = v
                .to_str()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| bad("not a number".into()))?;
            if n > c.cores {
                return Err(bad(format!(
                    "{n} device threads for {} cores (at most one per core; 0 = automatic)",
                    c.cores
                )));
            }
            c.threads = n;
        }
        // The kernels read the cap themselves (process-wide, once); a value they would not
        // understand is refused here, before any of them runs.
        if let Some(v) = std::env::var_os(nrt_kernels::cpu::ISA_VAR)
            && v.to_str()
                .and_then(nrt_kernels::cpu::IsaCap::parse)
                .is_none()
        {
            return Err(FaultParseError {
                entry: String::new(),
                reason: format!(
                    "{}={:?}: not one of {}",
                    nrt_kernels::cpu::ISA_VAR,
                    v.to_string_lossy(),
                    nrt_kernels::cpu::IsaCap::VALUES
                ),
            });
        }
        c.check_faults()?;
        Ok(c)
    }

    /// The default configuration with the cores and memory of `host`.
    pub fn for_host(host: &HostShape) -> SimConfig {
        SimConfig {
            cores: host.total_cores(),
            memory_bytes: host.total_memory().unwrap_or(u64::MAX),
            ..SimConfig::default()
        }
    }

    /// The device threads `threads = 0` stands for: one per core, at most the CPUs this
    /// process may run on (`sched_getaffinity` / cgroup quota, as
    /// `std::thread::available_parallelism` reads them), at least one.
    pub fn auto_threads(&self) -> u32 {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        (u32::try_from(cpus).unwrap_or(u32::MAX))
            .min(self.cores)
            .max(1)
    }

    /// Checks that every fault names a core this device has (a fault on a core that does not
    /// exist would never fire, silently).
    pub fn check_faults(&self) -> Result<(), FaultParseError> {
        match self.faults.iter().find(|f| f.core >= self.cores) {
            Some(f) => Err(FaultParseError {
                entry: f.to_string(),
                reason: format!(
                    "core={} does not exist (the device has {} cores)",
                    f.core, self.cores
                ),
            }),
            None => Ok(()),
        }
    }
}

/// State shared by the device's threads and the host-facing handle.
pub(crate) struct DeviceShared {
    pub(crate) config: SimConfig,
    pub(crate) mem: Memory,
    pub(crate) cores: Box<[CoreShared]>,
    /// Device-wide semaphores, `GLOBAL_SEMAPHORES` per lockstep group (keyed by the group's
    /// first core): `epoch << 32 | count`, where epoch is the execution's compute index.
    global: Box<[AtomicU64]>,
    /// Per lockstep group: `compute_idx + 1` of an execution one core aborted.
    group_abort: Box<[AtomicU64]>,
    /// Per core: `compute_idx + 1` of the last lockstep request it took off its exec rings
    /// (0: none since reset). Until every core of a group took an execution, a core waiting
    /// for a partner waits on the host, not on a hung device (see [`Self::group_taken`]).
    lockstep_taken: Box<[AtomicU64]>,
    /// Per core: `compute_idx + 1` of the lockstep execution it is running right now (its
    /// device thread is inside it and not stalled), 0 otherwise. A partner that computes is
    /// not hung: a core stalled at a barrier starts its watchdog only once no core of the
    /// group is busy (with a thread per core, a partner's long kernel — or its thread being
    /// preempted — is a wait, not a hang).
    lockstep_busy: Box<[AtomicU64]>,
    /// Per core: the lockstep execution whose part it last finished; the core whose part
    /// completes an execution signals the completion wake, the others publish quietly.
    pub(crate) lockstep_parts: nrt_hal::LockstepParts,
    /// Per core: how many polls advanced its lockstep execution (the hang watchdog of a
    /// stalled partner resets when this moves).
    lockstep_progress: Box<[AtomicU64]>,
    /// Per core, [`TIMING_SLOTS`] words by compute index: when it first ran its part of a
    /// lockstep execution, and that part's own running time once finished (`compute_idx <<
    /// 32 | µs`; µs of the device clock, wrapping). The last core to finish an execution
    /// measures it from these — with several executions in flight a core may have started
    /// (and finished) later ones by then.
    lockstep_started: Box<[AtomicU64]>,
    lockstep_part_busy: Box<[AtomicU64]>,
    /// Per lockstep group (by its first core): how its cores are served, chosen by
    /// measurement (`serve_mode`), and whether that is jointly now (read by the
    /// non-leader cores at the end of each part).
    serve_mode: Box<[Mutex<ServeModeChooser>]>,
    group_joint: Box<[AtomicBool]>,
    /// Per lockstep group: changes of its serving mode since its model was loaded (for the
    /// host view, [`Device::lockstep_serving`]).
    serve_changes: Box<[AtomicU64]>,
    /// Per device thread: blocked at a lockstep barrier (its gate's flag is then set, but it
    /// is not idle: [`SoftDevice::is_parked`] must not count it).
    stall_blocked: Box<[AtomicBool]>,
    /// Per device thread: parked without a timeout, so a host thread that starts to serve
    /// one of its cores must wake it ([`Device::host_serves`]; the thread then parks with
    /// one and still takes over work nobody polls).
    parked_untimed: Box<[AtomicBool]>,
    gates: Box<[IdleGate]>,
    /// Per core: a host thread serves it ([`Device::host_serves`]): the device's threads
    /// leave it alone and a doorbell does not wake them.
    host_served: Box<[AtomicBool]>,
    /// Cross-core events of lockstep executions: bumped (then every device thread's gate
    /// notified) on each change a stalled partner may wait for — a global semaphore change, a
    /// core taking a lockstep request, an abort. A device thread stalled at a barrier blocks
    /// until it changes.
    cross_core: AtomicU64,
    stop: AtomicBool,
    /// Device threads past their start-up (the constructor waits for all of them).
    threads_started: AtomicUsize,
    faults: Mutex<Vec<FaultSpec>>,
    has_faults: AtomicBool,
    /// Zero of the device clock.
    epoch: Instant,
}

impl DeviceShared {
    /// The device clock ([`Device::clock_ns`]).
    pub(crate) fn clock_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub(crate) fn kernel_memory(&self) -> nrt_kernels::DeviceMemory {
        // SAFETY: the mapping lives as long as `self`, which outlives every kernel call.
        unsafe { nrt_kernels::DeviceMemory::new(self.mem.base(), self.mem.len()) }
    }

    /// Announces a cross-core event (see `cross_core`) and wakes the device threads that
    /// sleep on one. A fence and a load per thread when none sleeps.
    #[inline]
    pub(crate) fn cross_core_event(&self) {
        self.cross_core.fetch_add(1, Ordering::Release);
        for g in self.gates.iter() {
            g.notify();
        }
    }

    fn global(&self, group: u32, index: u16) -> &AtomicU64 {
        &self.global[group as usize * GLOBAL_SEMAPHORES as usize + index as usize]
    }

    pub(crate) fn global_reached(&self, group: u32, index: u16, idx: u32, v: u32) -> bool {
        let x = self.global(group, index).load(Ordering::Acquire);
        let (epoch, count) = ((x >> 32) as u32, x as u32);
        (epoch == idx && count >= v) || (epoch.wrapping_sub(idx) as i32) > 0
    }

    pub(crate) fn global_add(&self, group: u32, index: u16, idx: u32, v: u32) {
        let g = self.global(group, index);
        let mut cur = g.load(Ordering::Relaxed);
        loop {
            let (epoch, count) = ((cur >> 32) as u32, cur as u32);
            let next = if epoch == idx {
                count.wrapping_add(v)
            } else {
                v
            };
            match g.compare_exchange_weak(
                cur,
                (idx as u64) << 32 | next as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return self.cross_core_event(),
                Err(x) => cur = x,
            }
        }
    }

    pub(crate) fn global_set(&self, group: u32, index: u16, idx: u32, v: u32) {
        self.global(group, index)
            .store((idx as u64) << 32 | v as u64, Ordering::Release);
        self.cross_core_event();
    }

    pub(crate) fn abort_group(&self, group: u32, idx: u32) {
        self.group_abort[group as usize].store(idx as u64 + 1, Ordering::Release);
        self.cross_core_event();
    }

    pub(crate) fn group_aborted(&self, group: u32, idx: u32) -> bool {
        self.group_abort[group as usize].load(Ordering::Acquire) == idx as u64 + 1
    }

    /// Core `core` took lockstep request `idx` off its exec rings.
    pub(crate) fn lockstep_take(&self, core: u32, idx: u32) {
        self.lockstep_taken[core as usize].store(idx as u64 + 1, Ordering::Release);
        self.cross_core_event();
    }

    /// Core `core` runs lockstep execution `idx` now (`Some`), or left it (`None`).
    pub(crate) fn lockstep_busy(&self, core: u32, idx: Option<u32>) {
        self.lockstep_busy[core as usize].store(idx.map_or(0, |i| i as u64 + 1), Ordering::Release);
    }

    /// Whether a core of the group other than `me` is running execution `idx` right now.
    pub(crate) fn group_busy(&self, group: u32, count: u8, idx: u32, me: u32) -> bool {
        (group..group + count as u32).any(|c| {
            c != me
                && self
                    .lockstep_busy
                    .get(c as usize)
                    .is_some_and(|b| b.load(Ordering::Acquire) == idx as u64 + 1)
        })
    }

    /// A poll of `core`'s lockstep execution moved it (counted per core; the poller holds
    /// the core's lock, so a load and a store suffice).
    pub(crate) fn lockstep_progressed(&self, core: u32) {
        let p = &self.lockstep_progress[core as usize];
        p.store(p.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Core `core` began its part of lockstep execution `idx` at `at` (device clock).
    pub(crate) fn lockstep_started(&self, core: u32, idx: u32, at: Duration) {
        self.lockstep_started[timing_slot(core, idx)].store(tagged(idx, at), Ordering::Relaxed);
    }

    /// Core `core` finished its part of lockstep execution `idx` after running `busy`.
    pub(crate) fn lockstep_part_busy(&self, core: u32, idx: u32, busy: Duration) {
        self.lockstep_part_busy[timing_slot(core, idx)].store(tagged(idx, busy), Ordering::Relaxed);
    }

    /// Whether lockstep group `group`'s cores are served jointly now (`serve_mode`).
    pub(crate) fn group_joint(&self, group: u32) -> bool {
        self.group_joint
            .get(group as usize)
            .is_some_and(|j| j.load(Ordering::Relaxed))
    }

    /// Sets which thread serves core `core` ([`NOT_JOINT`]: its own) and, on a change,
    /// wakes the threads to re-read who serves what (a sleeping one may now own work).
    pub(crate) fn set_joint_thread(&self, core: &CoreShared, thread: u32) {
        if core.set_joint_thread(thread) {
            for g in self.gates.iter() {
                g.notify();
            }
        }
    }

    /// A new model on lockstep group `group`: its serving mode is measured afresh.
    pub(crate) fn serve_mode_reset(&self, group: u32) {
        if let Some(m) = self.serve_mode.get(group as usize) {
            m.lock().unwrap_or_else(|e| e.into_inner()).reset();
            self.group_joint[group as usize].store(false, Ordering::Relaxed);
            self.serve_changes[group as usize].store(0, Ordering::Relaxed);
        }
    }

    /// The last core to finish lockstep execution `idx` of the group at `group` (`count`
    /// cores) measures it — wall time from the first part's start, the parts' summed own
    /// running time — for the group's serving mode (`serve_mode`), and applies a change.
    /// Only where the group's cores have threads of their own and a part is long enough
    /// for the choice to matter (short ones are joint anyway).
    #[cold]
    pub(crate) fn lockstep_finished(&self, group: u32, count: u8, idx: u32) {
        let threads = self.config.threads;
        let cores = group..group.saturating_add(count as u32);
        let Some(members) = self.cores.get(cores.start as usize..cores.end as usize) else {
            return;
        };
        let leader = group % threads;
        if members
            .iter()
            .all(|c| c.index % threads == leader || c.short_parts())
        {
            return;
        }
        let now = self.epoch.elapsed();
        let (mut wall, mut busy) = (0u32, 0u32);
        for c in cores.clone() {
            let slot = timing_slot(c, idx);
            let (si, start) = untag(self.lockstep_started[slot].load(Ordering::Relaxed));
            let (bi, b) = untag(self.lockstep_part_busy[slot].load(Ordering::Relaxed));
            if si != idx || bi != idx {
                // A core's record is of another execution (a reset; a core that ran
                // `TIMING_SLOTS` executions ahead): no sample.
                return;
            }
            wall = wall.max((now.as_micros() as u32).wrapping_sub(start));
            busy = busy.saturating_add(b);
        }
        let newest = cores
            .clone()
            .map(|c| self.lockstep_taken[c as usize].load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
            .saturating_sub(1) as u32;
        let Ok(mut chooser) = self.serve_mode[group as usize].try_lock() else {
            return; // another core finishing the same execution is at it
        };
        let sample = Sample {
            idx,
            wall_us: wall,
            busy_us: busy,
        };
        let Some(mode) = chooser.observe(sample, now.as_micros() as u64, newest) else {
            return;
        };
        let joint = mode == ServeMode::Joint;
        self.group_joint[group as usize].store(joint, Ordering::Relaxed);
        self.serve_changes[group as usize].fetch_add(1, Ordering::Relaxed);
        for c in members.iter().filter(|c| c.index % threads != leader) {
            let thread = if joint || c.short_parts() {
                leader
            } else {
                NOT_JOINT
            };
            self.set_joint_thread(c, thread);
        }
    }

    /// Whether a core of the group other than `me` advanced its lockstep part since `seen`
    /// (which it updates): a stalled core's watchdog must not count time in which its
    /// partner was making progress, even when no one was running the partner at the moment
    /// of the look (one thread serving both cores runs them in turns).
    pub(crate) fn group_progressed(&self, group: u32, count: u8, me: u32, seen: &mut u64) -> bool {
        let now = (group..group + count as u32)
            .filter(|&c| c != me)
            .filter_map(|c| self.lockstep_progress.get(c as usize))
            .fold(0u64, |a, p| a.wrapping_add(p.load(Ordering::Relaxed)));
        core::mem::replace(seen, now) != now
    }

    /// Whether every core of the lockstep group starting at `group` took execution `idx` (or
    /// a later one) off its exec rings. The host rings the cores one after the other, so a
    /// host thread preempted between two doorbells leaves the first core waiting at a
    /// barrier for as long as the preemption lasts; so does a partner still busy with earlier
    /// work. Neither is a hang: the watchdog only runs once this holds.
    pub(crate) fn group_taken(&self, group: u32, count: u8, idx: u32) -> bool {
        (group..group + count as u32).all(|c| {
            self.lockstep_taken.get(c as usize).is_none_or(|t| {
                let t = t.load(Ordering::Acquire);
                t != 0 && ((t - 1) as u32).wrapping_sub(idx) as i32 >= 0
            })
        })
    }

    /// The faults that fire on execution `n` of core `core`.
    pub(crate) fn faults_for(&self, core: u32, n: u64) -> ExecFaults {
        let mut f = ExecFaults::default();
        if !self.has_faults.load(Ordering::Relaxed) {
            return f;
        }
        let plan = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        for s in plan.iter().filter(|s| s.fires_on(core, n)) {
            let e = s.target_engine();
            match s.kind {
                FaultKind::Hang => f.hang = e,
                FaultKind::DropNotifications => {
                    f.drop_mask |= e.map_or(0x1F, |e| 1 << e.index());
                }
                FaultKind::Nan => f.nan = e,
                k => f.error = Some((k, e.unwrap_or(k.default_engine()))),
            }
        }
        f
    }

    fn core(&self, nc: u32) -> Result<&CoreShared, HalError> {
        self.cores.get(nc as usize).ok_or(HalError::BadCore(nc))
    }

    /// The device thread that serves core `c`: its own (`c % threads`), or its group
    /// leader's when the core is served jointly.
    #[inline]
    fn server_thread(&self, c: usize) -> usize {
        self.cores[c].joint_thread().unwrap_or(c % self.gates.len())
    }

    /// After a thread that does not serve core `c` polled it and changed its state (a host
    /// thread's assist, or a device thread covering for a sleeping one; a poll that only
    /// found the core still stalled changed nothing and hands nothing back, or a stalled
    /// core's two pollers would wake each other in turn): hands what the poll left — requests it
    /// moved to the ready queue, an execution stalled at a barrier — back to the core's own
    /// thread. That thread may have parked while the poll held the core: it saw the
    /// doorbell already consumed (`doorbell_seen` is stored first) and the core not yet
    /// marked active (stored last), and no doorbell follows to wake it. The store of
    /// `active` and [`IdleGate::notify`]'s fence pair with the sleeper's flag store and
    /// fence (the gate's Dekker handshake), so one of the two sees the other.
    #[inline]
    fn hand_back(&self, c: usize) {
        if self.cores[c].has_work() {
            self.gates[self.server_thread(c)].notify();
        }
    }
}

/// Runs a device thread: polls its cores while they have work, spins a bounded time after
/// the last of it, then parks until a doorbell. An execution stalled at a lockstep barrier
/// (its partner core runs on another thread, or has not been rung yet) is polled for
/// [`tuning::DEVICE_STALL_SPIN`], then the thread blocks until a cross-core event or a
/// doorbell — never spinning for long on a vCPU the partner may need.
fn device_thread(dev: Arc<DeviceShared>, worker: usize) {
    let gate = &dev.gates[worker];
    gate.register_sleeper();
    let all: Vec<usize> = (0..dev.cores.len()).collect();
    // Whether this thread polls core `c` now: it serves it (its own core, unless the core is
    // served jointly by its group leader's thread; or a core it serves jointly), or the core
    // has work and the thread that serves it sleeps. Any thread may poll any core — the
    // core's lock makes one at a time — so a stale view costs a wasted poll, never lost work.
    let serves = |c: usize| -> bool {
        if dev.host_served[c].load(Ordering::Relaxed) {
            return false;
        }
        let server = dev.server_thread(c);
        server == worker || (dev.cores[c].has_work() && dev.gates[server].is_sleeping())
    };
    // The cores this thread serves by default, and their work-poll counts when it last
    // looked while a host thread served them ([`take_over_stale`]).
    let mine: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&c| c % dev.gates.len() == worker)
        .collect();
    let mut served_polls: Vec<u64> = vec![u64::MAX; mine.len()];
    // Their work-poll counts when this thread last parked with a timeout, and whether a host
    // thread served one of them over that park (flag seen set, or a count moved while this
    // thread slept: nobody else polls them then but a host thread): the thread then keeps
    // parking with a timeout.
    let mut parked_polls: Vec<u64> = vec![0; mine.len()];
    let mut serving_seen = false;
    // Any thread may run any core's instructions (above): its kernels' per-thread state is
    // set up now, not on the first product it happens to run.
    nrt_kernels::matmul::prepare_thread();
    dev.threads_started.fetch_add(1, Ordering::Release);
    let stall_block = tuning::DEVICE_STALL_BLOCK_MAX
        .min(dev.config.hang_watchdog / 4)
        .max(Duration::from_micros(100));
    // When work was last seen. Reading the clock costs ~30 ns here, as much as a poll, so it
    // is read only every 64 idle polls: `worked` says whether work came since that reading.
    let mut last_work = Instant::now();
    // When the idle or stalled polls last yielded the vCPU (checked with the clock above).
    let mut last_yield = last_work;
    let mut worked = false;
    let mut idle_polls = 0u32;
    // Polls that found only stalled executions, and when the stall began (read every 64).
    let mut stalled_polls = 0u32;
    let mut stalled_since: Option<Instant> = None;
    while !dev.stop.load(Ordering::Acquire) {
        // Read before polling: an event after this wakes a block below.
        let events = dev.cross_core.load(Ordering::Acquire);
        let mut progressed = false;
        let mut stalled = false;
        for &c in &all {
            if !serves(c) {
                continue;
            }
            let poll = dev.cores[c].poll_unserved(&dev);
            match poll {
                Poll::Progressed => progressed = true,
                Poll::Stalled => stalled = true,
                Poll::Idle => {}
            }
            if poll == Poll::Progressed && dev.server_thread(c) != worker {
                dev.hand_back(c);
            }
        }
        if progressed {
            idle_polls = 0;
            stalled_polls = 0;
            stalled_since = None;
            worked = true;
            continue;
        }
        std::hint::spin_loop();
        if stalled {
            // An execution is in flight but waits for its partner core (the watchdog bounds
            // the wait once the partner took it). Spin a little, yielding now and then, then
            // block until the partner does something.
            worked = true;
            stalled_polls = stalled_polls.wrapping_add(1);
            if stalled_polls.is_multiple_of(tuning::CLOCK_READ_EVERY_POLLS) {
                let now = Instant::now();
                if now.duration_since(last_yield) >= tuning::DEVICE_IDLE_YIELD_PERIOD {
                    std::thread::yield_now();
                    last_yield = now;
                }
                let since = *stalled_since.get_or_insert(now);
                if now.duration_since(since) >= tuning::DEVICE_STALL_SPIN {
                    dev.stall_blocked[worker].store(true, Ordering::Relaxed);
                    gate.sleep_until_timeout(stall_block, || {
                        dev.stop.load(Ordering::Acquire)
                            || dev.cross_core.load(Ordering::Acquire) != events
                            || all
                                .iter()
                                .any(|&c| dev.cores[c].doorbell_pending() && serves(c))
                    });
                    dev.stall_blocked[worker].store(false, Ordering::Relaxed);
                }
            }
            continue;
        }
        stalled_polls = 0;
        stalled_since = None;
        idle_polls += 1;
        if idle_polls.is_multiple_of(tuning::CLOCK_READ_EVERY_POLLS) {
            let now = Instant::now();
            if now.duration_since(last_yield) >= tuning::DEVICE_IDLE_YIELD_PERIOD {
                std::thread::yield_now();
                last_yield = now;
            }
            if core::mem::take(&mut worked) {
                last_work = now;
            } else if now.duration_since(last_work) >= dev.config.spin_after_work {
                let asleep = || {
                    dev.stop.load(Ordering::Acquire)
                        || all.iter().any(|&c| dev.cores[c].has_work() && serves(c))
                };
                let served_now = || {
                    mine.iter()
                        .any(|&c| dev.host_served[c].load(Ordering::Relaxed))
                };
                if served_now() || serving_seen {
                    // A host thread serves one of this thread's cores, or did over the last
                    // look's period (a synchronous caller serves a core only during each of
                    // its calls): wake now and then to see that it still does
                    // ([`take_over_stale`]).
                    for (p, &c) in parked_polls.iter_mut().zip(&mine) {
                        *p = dev.cores[c].work_polls();
                    }
                    gate.sleep_until_timeout(
                        dev.config.host_served_check.max(Duration::from_micros(100)),
                        asleep,
                    );
                    let now = Instant::now();
                    let look = take_over_stale(&dev, &mine, &mut served_polls, &parked_polls);
                    serving_seen = look.moved || served_now();
                    last_work = if look.took {
                        now
                    } else {
                        // Nothing to take over: back to sleep at the next look (64 idle
                        // polls), not after another `spin_after_work` of spinning beside the
                        // host thread that serves the core.
                        now.checked_sub(dev.config.spin_after_work).unwrap_or(now)
                    };
                } else {
                    // Parked without a timeout: a host thread that starts to serve one of
                    // these cores wakes it (`host_serves` reads this flag after its own
                    // store and a fence; `sleep_until`'s fence orders this store before the
                    // condition's loads), and it then parks with one, above.
                    dev.parked_untimed[worker].store(true, Ordering::Relaxed);
                    gate.sleep_until(|| asleep() || served_now());
                    dev.parked_untimed[worker].store(false, Ordering::Relaxed);
                    serving_seen = served_now();
                    let now = Instant::now();
                    last_work = if serving_seen && !asleep() {
                        // Woken only to park again with a timeout (a host thread serves one
                        // of these cores now, `host_serves`): at the next look, not after a
                        // `spin_after_work` of spinning — beside a busy co-tenant that spin
                        // (yielding every `DEVICE_IDLE_YIELD_PERIOD`) kept the thread off its
                        // park for milliseconds, competing for the vCPUs of the host thread
                        // that does the work.
                        now.checked_sub(dev.config.spin_after_work).unwrap_or(now)
                    } else {
                        now
                    };
                }
            }
        }
    }
}

/// The device thread's side of [`Device::host_serves`]: a core a host thread serves but
/// whose work nobody took since the last look ([`SimConfig::host_served_check`] ago) —
/// the host thread is inside a long callback, preempted, or gone — is polled here until it
/// has nothing left. `seen[i]` is core `mine[i]`'s work-poll count at the last look while
/// it was served; `parked[i]` its count when this thread parked.
#[cold]
fn take_over_stale(
    dev: &DeviceShared,
    mine: &[usize],
    seen: &mut [u64],
    parked: &[u64],
) -> StaleLook {
    let mut look = StaleLook {
        took: false,
        moved: false,
    };
    for (i, &c) in mine.iter().enumerate() {
        let core = &dev.cores[c];
        let polls = core.work_polls();
        look.moved |= polls != parked[i];
        if !dev.host_served[c].load(Ordering::Relaxed) {
            seen[i] = u64::MAX;
            continue;
        }
        if core.has_work() && polls == seen[i] {
            look.took = true;
            while core.poll(dev) == Poll::Progressed {}
        }
        seen[i] = core.work_polls();
    }
    look
}

/// What [`take_over_stale`] found.
struct StaleLook {
    /// It ran work nobody took.
    took: bool,
    /// A core's work-poll count moved while the thread slept (a host thread polled it).
    moved: bool,
}

/// The software NeuronCore device. Cheap to share (`Arc`); dropping the last handle stops
/// its threads.
pub struct SoftDevice {
    shared: Arc<DeviceShared>,
    threads: Vec<JoinHandle<()>>,
}

impl fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftDevice")
            .field("cores", &self.shared.config.cores)
            .field("memory_bytes", &self.shared.config.memory_bytes)
            .field("threads", &self.shared.config.threads)
            .finish()
    }
}

impl SoftDevice {
    /// `f` on core `nc`'s notification plane (the device's half), under the core's lock.
    fn with_plane(&self, nc: u32, f: impl FnOnce(&mut PlaneProducer)) -> Result<(), HalError> {
        let core = self.shared.core(nc)?;
        f(core.lock().rings.as_mut().ok_or(HalError::BadQueue(nc))?);
        Ok(())
    }

    /// Builds a device and starts its threads.
    pub fn new(config: SimConfig) -> Result<SoftDevice, HalError> {
        if config.cores == 0 || config.cores > host::MAX_HOST_CORES {
            return Err(HalError::BadParameter(
                "cores must be in 1..=256 (host::MAX_HOST_CORES)",
            ));
        }
        let mut config = config;
        if config.threads == 0 {
            config.threads = config.auto_threads();
        }
        if config.threads > config.cores {
            return Err(HalError::BadParameter(
                "threads must be in 0..=cores (0: automatic)",
            ));
        }
        if config.check_faults().is_err() {
            return Err(HalError::BadParameter(
                "a planned fault names a core the device does not have",
            ));
        }
        let n = config.cores as usize;
        let mem = Memory::new(config.memory_bytes)?;
        // A plan given at start-up fires "next execution" faults on the first one.
        let faults: Vec<FaultSpec> = config
            .faults
            .iter()
            .map(|f| {
                if f.execution == 0 {
                    f.at_execution(1)
                } else {
                    *f
                }
            })
            .collect();
        let shared = Arc::new(DeviceShared {
            mem,
            cores: (0..n as u32).map(CoreShared::new).collect(),
            global: (0..n * GLOBAL_SEMAPHORES as usize)
                .map(|_| AtomicU64::new(0))
                .collect(),
            group_abort: (0..n).map(|_| AtomicU64::new(0)).collect(),
            lockstep_taken: (0..n).map(|_| AtomicU64::new(0)).collect(),
            lockstep_busy: (0..n).map(|_| AtomicU64::new(0)).collect(),
            lockstep_parts: nrt_hal::LockstepParts::new(n),
            lockstep_progress: (0..n).map(|_| AtomicU64::new(0)).collect(),
            lockstep_started: (0..n * TIMING_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            lockstep_part_busy: (0..n * TIMING_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            serve_mode: (0..n)
                .map(|_| Mutex::new(ServeModeChooser::default()))
                .collect(),
            group_joint: (0..n).map(|_| AtomicBool::new(false)).collect(),
            serve_changes: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stall_blocked: (0..config.threads)
                .map(|_| AtomicBool::new(false))
                .collect(),
            parked_untimed: (0..config.threads)
                .map(|_| AtomicBool::new(false))
                .collect(),
            gates: (0..config.threads).map(|_| IdleGate::new()).collect(),
            host_served: (0..n).map(|_| AtomicBool::new(false)).collect(),
            cross_core: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            threads_started: AtomicUsize::new(0),
            has_faults: AtomicBool::new(!faults.is_empty()),
            faults: Mutex::new(faults),
            epoch: Instant::now(),
            config,
        });
        let spawned = (0..shared.config.threads as usize)
            .map(|w| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("nrt-sim-{w}"))
                    .spawn(move || device_thread(s, w))
                    .map_err(|_| HalError::BadParameter("cannot spawn a device thread"))
            })
            .collect::<Result<Vec<_>, _>>();
        // The device is ready when its threads are: whatever a thread allocates to start
        // (thread-locals, its core list) happens here, never during an execution. If a spawn
        // failed, `SoftDevice::drop` stops and joins the ones that did start.
        let threads = match spawned {
            Ok(t) => t,
            Err(e) => {
                shared.stop.store(true, Ordering::Release);
                for g in shared.gates.iter() {
                    g.notify();
                }
                return Err(e);
            }
        };
        while shared.threads_started.load(Ordering::Acquire) < threads.len() {
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(SoftDevice { shared, threads })
    }

    /// The configuration the device runs with.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Adds a fault to the plan. A spec with `execution == 0` fires on the next execution
    /// of its core.
    pub fn inject(&self, spec: FaultSpec) -> Result<(), HalError> {
        self.inject_after_staged(spec, None)
    }

    /// [`SoftDevice::inject`], where a fault with no execution number fires on the next
    /// execution *submitted*: `staged` is how many requests the runtime has ever staged on the
    /// core's logical core (its `compute_idx_tail`); those staged but not taken yet by the
    /// device are skipped. (Without it, "next" is the next request the device takes, which
    /// with executions queued is one submitted before the fault was armed.)
    pub fn inject_after_staged(
        &self,
        mut spec: FaultSpec,
        staged: Option<u64>,
    ) -> Result<(), HalError> {
        let core = self.shared.core(spec.core)?;
        if spec.execution == 0 {
            let c = core.lock();
            // Wrapping, like compute_idx; more than a ring holds means the count is not this
            // device's (another runtime staged before): nothing is skipped then.
            let pending = staged
                .map(|s| (s as u32).wrapping_sub(c.next_compute_idx))
                .filter(|&p| p <= nrt_hal::tuning::EXEC_RING_SLOTS)
                .unwrap_or(0) as u64;
            spec.execution = c.exec_count + pending + 1;
        }
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(spec);
        self.shared.has_faults.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Removes every planned fault.
    pub fn clear_faults(&self) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.shared.has_faults.store(false, Ordering::Relaxed);
    }

    /// Whether every device thread is parked (idle past its spin window).
    pub fn is_parked(&self) -> bool {
        self.shared
            .gates
            .iter()
            .zip(self.shared.stall_blocked.iter())
            .all(|(g, s)| g.is_sleeping() && !s.load(Ordering::Relaxed))
    }

    /// Whether every device thread is parked without a timeout: none of its cores is served
    /// by a host thread now or was over its last timed park ([`Device::host_serves`]), so
    /// an idle device makes no wake-ups at all.
    pub fn is_parked_untimed(&self) -> bool {
        self.is_parked()
            && self
                .shared
                .parked_untimed
                .iter()
                .all(|p| p.load(Ordering::Relaxed))
    }

    /// The device thread serving core `nc` jointly with its lockstep group's leader, or
    /// `None` when the core's own thread serves it ([`tuning::DEVICE_JOINT_PART_MAX`]).
    pub fn joint_thread(&self, nc: u32) -> Result<Option<usize>, HalError> {
        Ok(self.shared.core(nc)?.joint_thread())
    }

    /// Starts (or restarts, clearing what was kept) the instruction timeline: every core
    /// keeps up to `per_core` [`InstructionEvent`]s, one per compute or DMA instruction of
    /// each traced execution (the runtime's `set_tracing`), with its start and end on the
    /// device clock; once a core's room is used up it records no more. `per_core = 0` turns
    /// it off. The room is reserved here, so recording never allocates; a room the process
    /// cannot reserve is refused.
    pub fn record_instructions(&self, per_core: usize) -> Result<(), HalError> {
        for core in self.shared.cores.iter() {
            let mut g = core.lock();
            g.instructions = Vec::new();
            g.instructions
                .try_reserve_exact(per_core)
                .map_err(|_| HalError::BadParameter("instruction timeline too large"))?;
        }
        Ok(())
    }

    /// Takes the instruction events recorded since [`SoftDevice::record_instructions`],
    /// core by core, each core's in the order they ran; the room stays reserved for more.
    pub fn instruction_events(&self) -> Vec<InstructionEvent> {
        let mut out = Vec::new();
        for core in self.shared.cores.iter() {
            out.append(&mut core.lock().instructions);
        }
        out
    }

    /// The CPU time each device thread has used so far (thread `w` serves the cores `c` with
    /// `c % threads == w`, and those served jointly with a group it leads), read from the
    /// thread's CPU clock. For tests (a stalled thread
    /// blocks instead of spinning; both cores of a pair compute) and the benchmark.
    pub fn thread_cpu_times(&self) -> Vec<Duration> {
        use std::os::unix::thread::JoinHandleExt;
        self.threads
            .iter()
            .map(|t| {
                let mut clock: libc::clockid_t = 0;
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: the thread is alive (threads are joined only in `drop`), so its
                // pthread_t is valid; `clock` and `ts` are writable locals.
                let ok = unsafe {
                    libc::pthread_getcpuclockid(t.as_pthread_t(), &mut clock) == 0
                        && libc::clock_gettime(clock, &mut ts) == 0
                };
                if ok {
                    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
                } else {
                    Duration::ZERO
                }
            })
            .collect()
    }

    /// Requests the device has taken off core `nc`'s exec rings since it started.
    pub fn executions(&self, nc: u32) -> Result<u64, HalError> {
        Ok(self.shared.core(nc)?.lock().exec_count)
    }

    fn mapping_ok(&self, addr: DevAddr, len: u64) -> Result<(), HalError> {
        if len == 0 && self.shared.mem.in_bounds(addr, 0) {
            return Ok(());
        }
        if self.shared.mem.is_allocated(addr, len) {
            Ok(())
        } else {
            Err(HalError::BadAddress { addr, len })
        }
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for g in self.shared.gates.iter() {
            g.notify();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Device for SoftDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            arch_name: "nrt-sim",
            revision: "1.0",
            num_cores: self.shared.config.cores,
            memory_bytes: self.shared.mem.len(),
        }
    }

    fn clock_ns(&self) -> u64 {
        self.shared.clock_ns()
    }

    fn mem_alloc(&self, size: u64, align: u64) -> Result<DevAddr, HalError> {
        self.shared.mem.alloc(size, align)
    }

    fn mem_free(&self, addr: DevAddr) -> Result<(), HalError> {
        self.shared.mem.free(addr)
    }

    fn mem_usage(&self) -> MemUsage {
        self.shared.mem.usage()
    }

    fn copy_in(&self, dst: DevAddr, src: &[u8]) -> Result<(), HalError> {
        self.mapping_ok(dst, src.len() as u64)?;
        // SAFETY: dst..dst+len is inside a live allocation (checked above); src is a host
        // slice, which cannot overlap the device mapping we own.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.shared.mem.ptr(dst), src.len())
        };
        Ok(())
    }

    fn copy_out(&self, src: DevAddr, dst: &mut [u8]) -> Result<(), HalError> {
        self.mapping_ok(src, dst.len() as u64)?;
        // SAFETY: as in copy_in, in the other direction.
        unsafe {
            core::ptr::copy_nonoverlapping(self.shared.mem.ptr(src), dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    fn copy_device(&self, src: DevAddr, dst: DevAddr, len: u64) -> Result<(), HalError> {
        self.mapping_ok(src, len)?;
        self.mapping_ok(dst, len)?;
        // SAFETY: both ranges are inside live allocations (checked above).
        unsafe { self.shared.mem.copy_within(src, dst, len) };
        Ok(())
    }

    fn memset(&self, dst: DevAddr, value: u8, len: u64) -> Result<(), HalError> {
        self.mapping_ok(dst, len)?;
        // SAFETY: dst..dst+len is inside a live allocation (checked above).
        unsafe { core::ptr::write_bytes(self.shared.mem.ptr(dst), value, len as usize) };
        Ok(())
    }

    fn map(&self, addr: DevAddr, len: u64) -> Result<DeviceMapping, HalError> {
        self.mapping_ok(addr, len)?;
        let ptr = core::ptr::NonNull::new(self.shared.mem.ptr(addr))
            .ok_or(HalError::BadAddress { addr, len })?;
        // SAFETY: the range is inside a live allocation of our mapping, valid until freed.
        Ok(unsafe { DeviceMapping::new(ptr, len as usize, addr) })
    }

    fn dma_queue_init(&self, nc: u32, capacity: u32) -> Result<Producer<TriggerPair>, HalError> {
        if !capacity.is_power_of_two() || capacity > 1 << 20 {
            return Err(HalError::BadParameter(
                "DMA queue capacity must be a power of two <= 2^20",
            ));
        }
        let core = self.shared.core(nc)?;
        let mut inner = core.lock();
        if inner.dma.is_some() {
            return Err(HalError::BadQueue(nc));
        }
        let (p, c) = ring(capacity);
        inner.dma = Some(c);
        Ok(p)
    }

    fn dma_queue_release(&self, nc: u32) -> Result<(), HalError> {
        let core = self.shared.core(nc)?;
        core.lock()
            .dma
            .take()
            .map(|_| ())
            .ok_or(HalError::BadQueue(nc))
    }

    fn exec_queue_register(&self, nc: u32, desc: ExecQueueDesc) -> Result<u16, HalError> {
        let core = self.shared.core(nc)?;
        if !desc.slots.is_power_of_two() || desc.slots > 1 << 16 {
            return Err(HalError::BadParameter(
                "exec ring slots must be a power of two <= 65536",
            ));
        }
        let ring_len = desc.slots as u64 * nrt_hal::wire::EXEC_RING_SLOT_SIZE;
        self.mapping_ok(desc.ring_addr, ring_len)?;
        for a in [desc.tail_addr, desc.event_addr] {
            if a % 4 != 0 {
                return Err(HalError::BadAddress { addr: a, len: 4 });
            }
            self.mapping_ok(a, 4)?;
        }
        let mut inner = core.lock();
        // SAFETY: the tail word is inside a live allocation and 4-aligned (checked above).
        let head = unsafe { (self.shared.mem.ptr(desc.tail_addr) as *const u32).read_volatile() };
        let q = ExecQueue { desc, head };
        let id = match inner.queues.iter().position(Option::is_none) {
            Some(i) => {
                inner.queues[i] = Some(q);
                i
            }
            None => {
                inner.queues.push(Some(q));
                inner.queues.len() - 1
            }
        };
        u16::try_from(id).map_err(|_| HalError::BadParameter("too many exec queues"))
    }

    fn exec_queue_release(&self, nc: u32, queue: u16) -> Result<(), HalError> {
        let core = self.shared.core(nc)?;
        let mut inner = core.lock();
        match inner.queues.get_mut(queue as usize) {
            Some(q @ Some(_)) => {
                *q = None;
                inner.abandon_queue(queue, &self.shared);
                Ok(())
            }
            _ => Err(HalError::BadQueue(queue as u32)),
        }
    }

    fn notification_init(&self, nc: u32, capacity: u32) -> Result<PlaneConsumer, HalError> {
        if !capacity.is_power_of_two() || capacity > 1 << 20 {
            return Err(HalError::BadParameter(
                "notification ring capacity must be a power of two <= 2^20",
            ));
        }
        let core = self.shared.core(nc)?;
        let mut inner = core.lock();
        if inner.rings.is_some() {
            return Err(HalError::BadQueue(nc));
        }
        let (p, c) = plane(capacity);
        inner.rings = Some(p);
        Ok(c)
    }

    fn notification_release(&self, nc: u32) -> Result<(), HalError> {
        let core = self.shared.core(nc)?;
        core.lock()
            .rings
            .take()
            .map(|_| ())
            .ok_or(HalError::BadQueue(nc))
    }

    #[inline]
    fn semaphore_increment(&self, nc: u32, semaphore: u32, value: u32) -> Result<(), HalError> {
        let core = self.shared.core(nc)?;
        let s = core
            .semaphore(semaphore)
            .ok_or(HalError::BadSemaphore(semaphore))?;
        s.fetch_add(value, Ordering::Release);
        if semaphore == SEMAPHORE_INFERENCE_START {
            // Wake the thread that serves the core: its own, or its group leader's when the
            // core is served jointly (a stale answer wakes a thread that passes the work on)
            // — unless a host thread serves it. The fence orders the doorbell before both
            // loads: it pairs with `host_serves(false)`'s and with the sleeper's.
            fence(Ordering::SeqCst);
            if !self.shared.host_served[nc as usize].load(Ordering::Relaxed) {
                self.shared.gates[self.shared.server_thread(nc as usize)].notify_fenced();
            }
        }
        Ok(())
    }

    fn prepare_thread(&self) {
        nrt_kernels::matmul::prepare_thread();
    }

    fn host_serves(&self, nc: u32, on: bool) -> bool {
        let Some(flag) = self.shared.host_served.get(nc as usize) else {
            return false;
        };
        if on {
            flag.store(true, Ordering::Relaxed);
            // The core's own thread may be parked without a timeout (it saw no core served
            // lately when it parked): wake it, so that it parks again with one and still
            // takes over work nobody polls (`take_over_stale`). The store, a fence, then the
            // look at `parked_untimed` — against the thread's store of that flag, its gate's
            // fence, then its condition's look at this one: one of the two sees the other.
            // A thread parked with a timeout, or awake, is left alone (one fence and one
            // load per call: a synchronous caller serves its core on every execution).
            fence(Ordering::SeqCst);
            let t = nc as usize % self.shared.gates.len();
            if self.shared.parked_untimed[t].load(Ordering::Relaxed) {
                self.shared.gates[t].notify_fenced();
            }
        } else {
            flag.store(false, Ordering::Relaxed);
            // Pairs with the doorbell's fence: either it saw the flag cleared and woke the
            // core's thread, or this sees its doorbell.
            fence(Ordering::SeqCst);
            if self.shared.cores[nc as usize].has_work() {
                self.shared.gates[self.shared.server_thread(nc as usize)].notify_fenced();
            }
        }
        true
    }

    fn lockstep_serving(&self, nc: u32) -> Option<nrt_hal::LockstepServing> {
        let g = nc as usize;
        Some(nrt_hal::LockstepServing {
            joint: self.shared.group_joint.get(g)?.load(Ordering::Relaxed),
            changes: self.shared.serve_changes.get(g)?.load(Ordering::Relaxed),
        })
    }

    fn assist_untaken(&self, nc: u32) -> bool {
        match self.shared.core(nc) {
            Ok(core) if core.doorbell_pending() => self.assist(nc),
            _ => false,
        }
    }

    fn assist(&self, nc: u32) -> bool {
        let Ok(core) = self.shared.core(nc) else {
            return false;
        };
        let progressed = core.poll(&self.shared) == Poll::Progressed;
        // A host thread that serves the core keeps what it leaves (`host_serves(false)`
        // hands it back).
        if progressed && !self.shared.host_served[nc as usize].load(Ordering::Relaxed) {
            self.shared.hand_back(nc as usize);
        }
        progressed
    }

    fn notification_wake(
        &self,
        nc: u32,
        wake: Option<Arc<CompletionWake>>,
    ) -> Result<(), HalError> {
        self.with_plane(nc, |p| p.set_wake(wake))
    }

    fn execution_wakes(&self, nc: u32, wakes: Option<Arc<ExecutionWakes>>) -> Result<(), HalError> {
        self.with_plane(nc, |p| p.set_execution_wakes(wakes))
    }

    fn semaphore_read(&self, nc: u32, semaphore: u32) -> Result<u32, HalError> {
        let core = self.shared.core(nc)?;
        let s = core
            .semaphore(semaphore)
            .ok_or(HalError::BadSemaphore(semaphore))?;
        Ok(s.load(Ordering::Acquire))
    }

    fn interrupt_cause(&self, nc: u32) -> Result<u32, HalError> {
        Ok(self.shared.core(nc)?.cause_now())
    }

    fn interrupt_cause_clear(&self, nc: u32, bits: u32) -> Result<(), HalError> {
        self.shared
            .core(nc)?
            .cause
            .fetch_and(!bits, Ordering::AcqRel);
        Ok(())
    }

    fn nc_reset(&self, nc: u32) -> Result<(), HalError> {
        let core = self.shared.core(nc)?;
        core.lock().reset(core, &self.shared);
        self.shared.group_abort[nc as usize].store(0, Ordering::Release);
        self.shared.lockstep_taken[nc as usize].store(0, Ordering::Release);
        self.shared.lockstep_parts.reset(nc as usize);
        // A group led by this core measures its serving mode afresh (its compute indices
        // may start over).
        self.shared.serve_mode_reset(nc);
        // A partner stalled on the execution the reset dropped looks again now.
        self.shared.cross_core_event();
        Ok(())
    }
}

/// Timing words per core ([`DeviceShared::lockstep_started`]): how many executions a core
/// may run ahead of its partner's finish and still be measured. Barriers keep the cores of
/// one execution together; a core runs ahead only past an execution's last barrier, by one
/// or two at the async surfaces' depths.
const TIMING_SLOTS: usize = 8;

fn timing_slot(core: u32, idx: u32) -> usize {
    core as usize * TIMING_SLOTS + idx as usize % TIMING_SLOTS
}

/// `idx << 32 | µs` (wrapping) for the lockstep timing words.
fn tagged(idx: u32, t: Duration) -> u64 {
    (u64::from(idx) << 32) | u64::from(t.as_micros() as u32)
}

fn untag(w: u64) -> (u32, u32) {
    ((w >> 32) as u32, w as u32)
}

// Compile-time facts the device relies on.
const _: () = assert!(NUM_ENGINES == Engine::ALL.len());
