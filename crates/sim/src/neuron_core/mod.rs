//! One NeuronCore (TPB): its semaphore file, cause word, DMA trigger queue, exec-request
//! queues, notification rings, decoded-block cache, and the cooperative scheduler that runs
//! its five engines.
//!
//! # Who touches what
//!
//! | state (own cache line each) | written by | how |
//! |---|---|---|
//! | `doorbell` (semaphore 0, `INFERENCE_START`) | host | `fetch_add(Release)`, then the worker's [`nrt_hal::IdleGate`] |
//! | `semaphores[4..]` (engine semaphores) | this core's engines (device thread) | `Relaxed`: only the device thread reads them |
//! | `cause` | device sets bits (`fetch_or(Release)`); host clears (`fetch_and`) | atomics |
//! | `mirrors` (`doorbell_seen`, `active`) | device thread only | `Relaxed` mirrors of `inner`, read lock-free by the idle check |
//! | `inner` | device thread while it runs requests; host at setup (queue/ring registration, reset) | `Mutex` — never taken on the runtime's submit or harvest path |
//!
//! The host publishes work through the DMA trigger queue ([`nrt_hal::ring`]: tail `Release`,
//! head `Acquire`) and rings the doorbell; the device learns about completed work only by
//! reading the notification rings the device writes here.
//!
//! # Scheduling
//!
//! A request runs all five engines of the core cooperatively on the device thread: each engine
//! runs instructions until it blocks on a semaphore wait, ends its block, finished one
//! instruction that does real work (a kernel or a DMA: engines run in parallel on hardware,
//! so the others get their turn after each), or used its quantum of control instructions
//! ([`nrt_hal::tuning::DEVICE_ENGINE_QUANTUM`]); then the next engine runs. No instruction is
//! ever handed to another thread. When no engine can progress the execution is *stalled*: the
//! worker goes on serving its other cores (the partner core of a lockstep pair may be the one
//! that unblocks it) and the core's watchdog ([`nrt_hal::tuning::DEVICE_HANG_WATCHDOG`]) turns
//! a stall that lasts into a hang: cause bit 29, and the execution is abandoned. A lockstep
//! execution's watchdog starts only once every core of the group took the execution (the host
//! rings the cores one after the other, and a host preempted between the doorbells is late,
//! not hung) and no other core of the group is running it (with a device thread per core, the
//! partner computing its part — or its thread preempted in the middle — is a wait, not a
//! hang).
//!
//! The cores of a lockstep group normally run on different device threads (core `c` on thread
//! `c % threads`), in parallel. Cross-core changes (global semaphores, takes, aborts) bump the
//! device's cross-core event count and notify the device threads' gates; a thread whose only
//! execution is stalled at a barrier polls for [`nrt_hal::tuning::DEVICE_STALL_SPIN`] and
//! then blocks until such an event, a doorbell, or a watchdog look.

mod engines;
mod requests;

use crate::DeviceShared;
use crate::fault::FaultKind;
use nrt_hal::sync::CachePadded;
use nrt_hal::wire::cause;
use nrt_hal::{
    Consumer, DevAddr, Engine, ExecQueueDesc, ExecRequest, NUM_ENGINES, PLANE_RINGS, PlaneProducer,
    SEMAPHORE_INFERENCE_START, SEMAPHORES_PER_CORE, TriggerPair, tuning,
};
use nrt_isa::{AccessPattern, Instruction};
use nrt_kernels::Workspace;
use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(crate) use nrt_hal::ERROR_RING;

/// [`CoreShared::joint_thread`]: the core's own thread serves it.
pub(crate) const NOT_JOINT: u32 = u32::MAX;

/// Largest instruction block the device decodes (instructions).
const MAX_BLOCK_INSTRUCTIONS: usize = 1 << 20;

/// The state of one core shared between the device thread and the host.
///
/// Laid out by writer so that no two writers share a cache line: the host writes only the
/// doorbell (`INFERENCE_START`), the device writes its mirrors on every poll and its lock on
/// every locked poll, and `cause` changes only on faults. Before this split the host's
/// doorbell store and the device's per-poll mirror stores hit the same lines, costing a
/// cross-core miss on each side of every request.
#[derive(Debug)]
pub(crate) struct CoreShared {
    pub(crate) index: u32,
    /// Engine semaphores (index 0, `INFERENCE_START`, is unused here: see `doorbell`).
    semaphores: Box<[AtomicU32]>,
    /// Semaphore `INFERENCE_START`: the host increments it, the device reads it.
    doorbell: CachePadded<AtomicU32>,
    /// The device thread that serves this core jointly with its lockstep group's leader,
    /// or [`NOT_JOINT`] when the core's own thread serves it: written (rarely: when the mode
    /// changes) by the device thread that finishes a lockstep part of the core, read by the
    /// host at each doorbell (which thread to wake) and by the device threads (what to poll).
    /// See [`tuning::DEVICE_JOINT_PART_MAX`].
    joint_thread: CachePadded<AtomicU32>,
    /// The core's lockstep parts are short ([`tuning::DEVICE_JOINT_PART_MAX`]): it is served
    /// jointly whatever its group's serving mode (written with `joint_thread`).
    short_parts: AtomicBool,
    pub(crate) cause: CachePadded<AtomicU32>,
    mirrors: CachePadded<DeviceMirrors>,
    pub(crate) inner: CachePadded<Mutex<CoreInner>>,
}

/// What the device thread last saw, read by its own idle check (`CoreShared::has_work`).
#[derive(Debug)]
struct DeviceMirrors {
    /// The last `INFERENCE_START` value the device acted on.
    doorbell_seen: AtomicU32,
    /// "A request is running or queued" (the device thread keeps polling).
    active: AtomicBool,
    /// Polls that found work and took the core (written under the core's lock): a device
    /// thread tells by it whether the host thread that serves the core still does.
    work_polls: AtomicU64,
}

/// One registered exec-request ring.
#[derive(Debug)]
pub(crate) struct ExecQueue {
    pub(crate) desc: ExecQueueDesc,
    /// Next slot the sequencer reads (device-internal).
    pub(crate) head: u32,
}

/// Device-thread state of a core.
#[derive(Debug)]
pub(crate) struct CoreInner {
    pub(crate) dma: Option<Consumer<TriggerPair>>,
    /// The notification plane: INFER_STATUS rings of the five engines, then the ERROR ring.
    pub(crate) rings: Option<PlaneProducer>,
    ring_seq: [u16; PLANE_RINGS],
    pub(crate) queues: Vec<Option<ExecQueue>>,
    /// Queue ids whose tail the DMA engine bumped, in staging order.
    ready: VecDeque<u16>,
    current: Option<Execution>,
    /// Decoded blocks, by address and engine. Entries are dropped only when no execution
    /// is current (model switch in `prepare`, `reset`), which is what makes [`BlockRef`] valid.
    cache: Vec<(DevAddr, Engine, Box<[Instruction]>)>,
    pub(crate) exec_count: u64,
    /// The `compute_idx` after the last request taken (0 before the first): with the
    /// runtime's count of requests staged, how many are staged but not taken yet
    /// ([`crate::SoftDevice::inject_after_staged`]).
    pub(crate) next_compute_idx: u32,
    pub(crate) wedged: bool,
    ws: Workspace,
    /// A streaming output's OUTPUT_DONE record was published quietly and a blocked waiter
    /// is still to be woken for it: once the engine that wrote it has run its step, or
    /// with the records that finish the execution, whichever comes first.
    wake_pending: bool,
    /// The lockstep part this poll finished (`group`, `count`, `compute_idx`): its records
    /// signal the wake only if every other part is finished too
    /// ([`nrt_hal::LockstepParts`]).
    finished_part: Option<(u32, u8, u32)>,
    /// The executions this poll finished or aborted, whose own wakes
    /// ([`nrt_hal::ExecutionWakes`]) its publication signals.
    ended: Ended,
    /// Engine semaphores touched by the current execution (bit per index).
    dirty: [u64; 4],
    /// Output of the last compute instruction of the engine a NaN fault targets in the
    /// current execution (where the NaN goes). Kept out of [`Execution`], which is moved
    /// around once per execution, since only a fault needs it.
    nan_target: Option<AccessPattern>,
    /// The blocks the last request named, by engine, while the cache still holds them: a
    /// steady-state request names the same ones and skips the cache lookups.
    last_blocks: Option<([DevAddr; NUM_ENGINES], [BlockRef; NUM_ENGINES])>,
    /// Running average of this core's lockstep parts' duration (ns, `<< 8` fixed point;
    /// 0 = none yet), for the joint mode.
    part_avg_ns: u64,
    /// The instruction timeline ([`crate::SoftDevice::record_instructions`]): one event per
    /// compute or DMA instruction of a traced execution (`exec_flags::TRACE`), while
    /// reserved capacity is left — recording never allocates, and with no capacity (the
    /// default) it costs one flag test per such instruction.
    pub(crate) instructions: Vec<InstructionEvent>,
}

/// The executions one poll ended ([`CoreInner::ended`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Ended {
    #[default]
    None,
    /// One execution, by compute index.
    One(u32),
    /// More than one (requests refused in a row): every execution's wake is signaled.
    Several,
}

impl Ended {
    #[inline]
    fn add(&mut self, idx: u32) {
        *self = match *self {
            Ended::None => Ended::One(idx),
            Ended::One(i) if i == idx => Ended::One(i),
            _ => Ended::Several,
        };
    }
}

/// One instruction's run on a device core ([`crate::SoftDevice::instruction_events`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstructionEvent {
    /// The physical core.
    pub core: u32,
    /// The engine that ran it.
    pub engine: Engine,
    /// The execution's compute index on the core.
    pub exec_idx: u32,
    /// The instruction's index in its engine's block.
    pub pc: u32,
    /// The opcode's mnemonic.
    pub op: &'static str,
    /// Start and end on the device clock (ns, [`nrt_hal::Device::clock_ns`]).
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    NotStarted,
    Running,
    Done,
    Hung,
}

#[derive(Clone, Copy, Debug)]
struct EngineState {
    pc: usize,
    phase: Phase,
    /// The current Barrier instruction already added its arrival.
    barrier_armed: bool,
    /// The last [`Op::Guard`] failed: compute and DMA instructions only synchronize.
    guarded_off: bool,
}

/// Faults that fire on the current execution.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ExecFaults {
    pub(crate) hang: Option<Engine>,
    /// Engines whose records are dropped (bit per engine).
    pub(crate) drop_mask: u8,
    pub(crate) nan: Option<Engine>,
    /// An error posted when the engine starts.
    pub(crate) error: Option<(FaultKind, Engine)>,
}

/// A decoded block owned by the core's cache (a `Box<[Instruction]>`, whose heap data does
/// not move when the cache grows). Valid while the cache holds the block, i.e. for the whole
/// execution that looked it up: the cache drops entries only when no execution is current.
#[derive(Clone, Copy, Debug)]
struct BlockRef(NonNull<[Instruction]>);

// SAFETY: a BlockRef is only used by the device thread that holds the core's lock, alongside
// the cache that owns the block.
unsafe impl Send for BlockRef {}

impl BlockRef {
    fn new(b: &[Instruction]) -> BlockRef {
        BlockRef(NonNull::from(b))
    }

    /// # Safety
    /// The cache entry the reference was made from must still exist.
    unsafe fn get<'a>(self) -> &'a [Instruction] {
        // SAFETY: per the contract, the boxed slice is alive and not mutated.
        unsafe { self.0.as_ref() }
    }
}

#[derive(Debug)]
struct Execution {
    req: ExecRequest,
    /// The exec ring it came from: releasing the ring abandons it
    /// ([`CoreInner::abandon_queue`]).
    queue: u16,
    /// Added to every `DmaDescriptors` table address: `io_set × io_set_stride`.
    io_offset: u64,
    idx: u32,
    /// First physical core of the lockstep group (keys the group's global semaphores).
    group: u32,
    blocks: [BlockRef; NUM_ENGINES],
    engines: [EngineState; NUM_ENGINES],
    faults: ExecFaults,
    stalled_since: Option<Instant>,
    /// Time this core spent running its part of a lockstep execution so far, stalls at the
    /// barriers excluded (for the joint mode: a part is short by its own work, not by how
    /// long a descheduled partner kept it waiting).
    busy: Duration,
    /// The group's partners' progress count when this core last looked (hang watchdog).
    partners_progress: u64,
    /// This core ran its part of a lockstep execution at least once (its start is recorded).
    started: bool,
}

impl Execution {
    /// A number that grows whenever any engine advances (a pc, a phase, a barrier
    /// arrival): how a poll tells whether it moved the execution.
    fn progress(&self) -> usize {
        self.engines
            .iter()
            .map(|e| (e.pc << 3) + ((e.phase as usize) << 1) + e.barrier_armed as usize)
            .sum()
    }
}

/// What a poll of a core did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Poll {
    /// Nothing to do.
    Idle,
    /// Some work was done.
    Progressed,
    /// An execution is in flight but blocked (waiting for the partner core).
    Stalled,
}

enum Step {
    /// The engine advanced.
    Progress,
    /// The engine cannot advance now.
    Blocked,
    /// The engine raised an error that aborts the execution.
    Abort,
}

impl CoreShared {
    pub(crate) fn new(index: u32) -> CoreShared {
        CoreShared {
            index,
            semaphores: (0..SEMAPHORES_PER_CORE)
                .map(|_| AtomicU32::new(0))
                .collect(),
            doorbell: CachePadded(AtomicU32::new(0)),
            joint_thread: CachePadded(AtomicU32::new(NOT_JOINT)),
            short_parts: AtomicBool::new(false),
            cause: CachePadded(AtomicU32::new(0)),
            mirrors: CachePadded(DeviceMirrors {
                doorbell_seen: AtomicU32::new(0),
                active: AtomicBool::new(false),
                work_polls: AtomicU64::new(0),
            }),
            inner: CachePadded(Mutex::new(CoreInner {
                dma: None,
                rings: None,
                ring_seq: [0; PLANE_RINGS],
                queues: Vec::new(),
                ready: VecDeque::with_capacity(tuning::DMA_QUEUE_CAPACITY as usize),
                current: None,
                cache: Vec::new(),
                exec_count: 0,
                next_compute_idx: 0,
                wedged: false,
                ws: Workspace::default(),
                wake_pending: false,
                finished_part: None,
                ended: Ended::None,
                dirty: [0; 4],
                nan_target: None,
                last_blocks: None,
                part_avg_ns: 0,
                instructions: Vec::new(),
            })),
        }
    }

    /// Semaphore `index` of the core (the doorbell for `INFERENCE_START`).
    #[inline]
    pub(crate) fn semaphore(&self, index: u32) -> Option<&AtomicU32> {
        if index == SEMAPHORE_INFERENCE_START {
            Some(&self.doorbell)
        } else {
            self.semaphores.get(index as usize)
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, CoreInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a doorbell rang that the device has not acted on, or work is in flight.
    #[inline]
    pub(crate) fn has_work(&self) -> bool {
        self.mirrors.active.load(Ordering::Relaxed)
            || self.doorbell.load(Ordering::Acquire)
                != self.mirrors.doorbell_seen.load(Ordering::Relaxed)
    }

    /// How many polls found work on this core and took it so far.
    #[inline]
    pub(crate) fn work_polls(&self) -> u64 {
        self.mirrors.work_polls.load(Ordering::Relaxed)
    }

    /// Whether a doorbell rang that the device has not acted on yet.
    #[inline]
    pub(crate) fn doorbell_pending(&self) -> bool {
        self.doorbell.load(Ordering::Acquire) != self.mirrors.doorbell_seen.load(Ordering::Relaxed)
    }

    /// Does what the core has to do now: consume staged triggers if the doorbell rang, start
    /// the next request, run the current one until it finishes or stalls.
    ///
    /// Any device thread may poll any core (the core's lock makes one at a time): its own
    /// thread, the leader's thread of a core served jointly, or a thread that finds work on
    /// a core whose own thread sleeps. A core another thread is serving right now reads as
    /// idle.
    #[inline]
    pub(crate) fn poll(&self, dev: &DeviceShared) -> Poll {
        if !self.has_work() {
            return Poll::Idle;
        }
        self.work(dev, false)
    }

    /// [`CoreShared::poll`] for a device thread: a core that a host thread serves now
    /// ([`nrt_hal::Device::host_serves`]) reads as idle, checked again under the core's lock
    /// after the doorbell is read. The thread decided to poll on an earlier look at the flag;
    /// a synchronous caller that served its previous execution sets it again and rings the
    /// next doorbell in between (flag, fence, doorbell), and the doorbell's acquire load makes
    /// that flag visible here. Without the second look a spinning device thread took such
    /// executions from under their caller now and then, each one counting as work that kept
    /// it spinning `spin_after_work` longer: a device thread that, once awake, never parked
    /// again while its caller served the core (~85% of a vCPU, the sync near-null round trip
    /// 0.45 → 0.8–1.1 µs on the lines they then shared).
    #[inline]
    pub(crate) fn poll_unserved(&self, dev: &DeviceShared) -> Poll {
        if !self.has_work() {
            return Poll::Idle;
        }
        self.work(dev, true)
    }

    /// The thread serving this core jointly with its group's leader, if any.
    #[inline]
    pub(crate) fn joint_thread(&self) -> Option<usize> {
        match self.joint_thread.load(Ordering::Relaxed) {
            NOT_JOINT => None,
            t => Some(t as usize),
        }
    }

    /// Sets the thread serving this core ([`NOT_JOINT`]: its own); whether that changed.
    pub(crate) fn set_joint_thread(&self, thread: u32) -> bool {
        if self.joint_thread.load(Ordering::Relaxed) == thread {
            return false;
        }
        self.joint_thread.store(thread, Ordering::SeqCst);
        true
    }

    /// Whether the core's lockstep parts are short (served jointly whatever the mode).
    pub(crate) fn short_parts(&self) -> bool {
        self.short_parts.load(Ordering::Relaxed)
    }

    /// [`CoreShared::poll`] once there is work: kept out of line, so an idle poll is two
    /// loads, not the prologue and epilogue of this large frame.
    #[inline(never)]
    fn work(&self, dev: &DeviceShared, unless_served: bool) -> Poll {
        let mut inner = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Poll::Idle,
        };
        let bell = self.doorbell.load(Ordering::Acquire);
        // After the doorbell's acquire load: a doorbell rung by a serving host thread comes
        // with its flag ([`CoreShared::poll_unserved`]).
        if unless_served && dev.host_served[self.index as usize].load(Ordering::Relaxed) {
            return Poll::Idle;
        }
        if let Some(p) = inner.rings.as_ref() {
            p.prefetch_next_writes();
        }
        // One writer (the lock's holder): a plain increment.
        let polls = &self.mirrors.work_polls;
        polls.store(
            polls.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
        let mut progressed = false;
        if bell != self.mirrors.doorbell_seen.load(Ordering::Relaxed) {
            self.mirrors.doorbell_seen.store(bell, Ordering::Relaxed);
            progressed |= inner.drain_dma(self, dev);
        }
        if inner.current.is_none() {
            progressed |= inner.start_next(self, dev);
        }
        let result = if inner.current.is_some() {
            match inner.run(self, dev) {
                Poll::Idle => Poll::Progressed,
                Poll::Stalled if progressed => Poll::Progressed,
                p => p,
            }
        } else if progressed {
            Poll::Progressed
        } else {
            Poll::Idle
        };
        // Make the records of this poll visible: one batch, one store per ring. Records of an
        // execution still in flight (START records, ENDs of engines with nothing to do, of a
        // part stalled at a barrier or just begun) wake nobody: no waiter needs them. The
        // poll that finishes an execution (or aborts it) signals, and so does one that left
        // a streaming output's wake pending — but a lockstep part's last records signal only
        // if every other part is finished too (the last core to finish wakes the host, once).
        let inner = &mut *inner;
        let wake_pending = core::mem::take(&mut inner.wake_pending);
        let finished_part = inner.finished_part.take();
        if let Some(p) = inner.rings.as_mut()
            && (p.has_unpublished() || finished_part.is_some() || wake_pending)
        {
            // A finished part is always recorded, even when a pending wake signals anyway:
            // a partner finishing later must see it.
            let finishes = match finished_part {
                Some((group, count, idx)) => {
                    p.publish_quietly();
                    let last = dev.lockstep_parts.finish(
                        self.index as usize,
                        group as usize,
                        count as usize,
                        idx,
                    );
                    if last {
                        dev.lockstep_finished(group, count, idx);
                    }
                    last
                }
                // Finished its execution — or ended one (a request it refused) while the
                // next runs on: that one's waiter must not wait for the next to end.
                None => inner.current.is_none() || inner.ended != Ended::None,
            };
            if wake_pending || finishes {
                p.publish_and_signal();
                // The execution's own wake, after the records that finish it are visible
                // (a lockstep part's only if it completes the execution, as above).
                match core::mem::take(&mut inner.ended) {
                    Ended::None => {}
                    Ended::One(idx) => p.signal_execution(idx),
                    Ended::Several => p.signal_all_executions(),
                }
            } else {
                p.publish_quietly();
            }
        }
        inner.ended = Ended::None;
        self.mirrors.active.store(
            inner.current.is_some() || !inner.ready.is_empty(),
            Ordering::Relaxed,
        );
        result
    }

    /// The core's interrupt-cause bits, with [`cause::EXEC_TIMEOUT`] also when a thread running
    /// it has held it for the whole of [`tuning::DEVICE_BUSY_PROBE`]: an instruction
    /// still computing (a long kernel; the thread running it cannot raise the bit itself, as
    /// the watchdog of a hung engine does). Cold: the runtime reads it at an execution's
    /// deadline.
    pub(crate) fn cause_now(&self) -> u32 {
        let c = self.cause.load(Ordering::Acquire);
        if c & cause::EXEC_TIMEOUT != 0 {
            return c;
        }
        let t0 = Instant::now();
        loop {
            // A poll in progress holds the lock (`active` is only published after the poll
            // that took the request, so it cannot tell); between polls it is free.
            if !matches!(
                self.inner.try_lock(),
                Err(std::sync::TryLockError::WouldBlock)
            ) {
                return c;
            }
            if t0.elapsed() >= tuning::DEVICE_BUSY_PROBE {
                return c | cause::EXEC_TIMEOUT;
            }
            std::thread::sleep(tuning::DEVICE_BUSY_PROBE / 8);
        }
    }

    fn set_cause(&self, bits: u32) {
        self.cause.fetch_or(bits, Ordering::Release);
    }
}
