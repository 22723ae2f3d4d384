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

mod device_thread;
pub mod fault;
pub mod host;
pub mod memory;
pub mod neuron_core;
mod serve_mode;
mod shared;
pub mod testkit;

pub use fault::{FaultKind, FaultParseError, FaultSpec, parse_faults};
pub use host::{HostError, HostShape};
pub use neuron_core::InstructionEvent;

use crate::memory::Memory;
use crate::neuron_core::{CoreShared, ExecQueue, Poll};
use crate::serve_mode::ServeModeChooser;
pub(crate) use crate::shared::DeviceShared;
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
                    .spawn(move || device_thread::device_thread(s, w))
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

pub(crate) fn timing_slot(core: u32, idx: u32) -> usize {
    core as usize * TIMING_SLOTS + idx as usize % TIMING_SLOTS
}

/// `idx << 32 | µs` (wrapping) for the lockstep timing words.
pub(crate) fn tagged(idx: u32, t: Duration) -> u64 {
    (u64::from(idx) << 32) | u64::from(t.as_micros() as u32)
}

pub(crate) fn untag(w: u64) -> (u32, u32) {
    ((w >> 32) as u32, w as u32)
}

// Compile-time facts the device relies on.
const _: () = assert!(NUM_ENGINES == Engine::ALL.len());
