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

use crate::DeviceShared;
use crate::fault::FaultKind;
use nrt_hal::sync::CachePadded;
use nrt_hal::wire::{
    CUSTOM_SUB_ID_OUTPUT_DONE, EXEC_REQUEST_SIZE, EXEC_RING_SLOT_SIZE, TRIGGER_PAIR_SIZE, cause,
    exec_flags,
};
use nrt_hal::{
    Consumer, DType, DevAddr, DmaKind, Engine, ErrorSubtype, ExecQueueDesc, ExecRequest,
    FIRST_ENGINE_SEMAPHORE, NUM_ENGINES, NqRecord, PLANE_RINGS, PlaneProducer, RecordKind,
    SEMAPHORE_INFERENCE_START, SEMAPHORES_PER_CORE, TriggerPair, tuning,
};
use nrt_isa::op;
use nrt_isa::{AccessPattern, GLOBAL_SEMAPHORES, Instruction, Op, SemRef};
use nrt_kernels::{KernelError, Workspace};
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

impl CoreInner {
    /// Writes a record on ring `ring` (or drops it, counting the drop). It becomes visible
    /// to the host with the next publication of the plane.
    fn post(&mut self, core: &CoreShared, ring: usize, mut rec: NqRecord, drop: bool) {
        rec.seq = self.ring_seq[ring];
        self.ring_seq[ring] = self.ring_seq[ring].wrapping_add(1);
        if let Some(p) = self.rings.as_mut() {
            let kept = if drop {
                p.drop_record(ring);
                false
            } else {
                p.push(ring, rec)
            };
            if !kept {
                core.set_cause(cause::NQ_OVERFLOW);
            }
        }
    }

    /// Makes a streaming output's record visible now (a spinning waiter sees it at once) and
    /// leaves the wake of a blocked one pending ([`CoreInner::wake_pending`]). Signaled at
    /// once, the wake-up of a caller on the device thread's vCPU preempted the thread before
    /// it wrote the execution's last records: the caller found the execution unfinished,
    /// blocked again and had to be woken a second time.
    fn publish_streaming(&mut self) {
        if let Some(p) = self.rings.as_mut() {
            p.publish_quietly();
            self.wake_pending = true;
        }
    }

    fn post_error(
        &mut self,
        core: &CoreShared,
        subtype: ErrorSubtype,
        engine: Engine,
        idx: u32,
        at: u32,
    ) {
        self.post(
            core,
            ERROR_RING,
            NqRecord::error(subtype, engine, core.index as u8, idx, at),
            false,
        );
        let mut bits = cause::ERROR_NOTIFICATION;
        if subtype == ErrorSubtype::Fatal {
            bits |= cause::FATAL;
        }
        core.set_cause(bits);
    }

    /// Runs the staged trigger pairs: request copies, event pokes, tail increments.
    fn drain_dma(&mut self, core: &CoreShared, dev: &DeviceShared) -> bool {
        let Some(mut dma) = self.dma.take() else {
            return false;
        };
        // One request is three 32-byte pairs: two lines (three when they straddle one).
        dma.prefetch_next(3);
        let mut bad = 0u32;
        let mem = &dev.mem;
        let ready = &mut self.ready;
        let n = dma.drain(|p| {
            let len = p.tx.len as u64;
            if p.rx.len != p.tx.len
                || !mem.in_bounds(p.tx.addr, len)
                || !mem.in_bounds(p.rx.addr, len)
            {
                bad += 1;
                return;
            }
            // SAFETY: both ranges are inside device memory (checked just above).
            unsafe { mem.copy_within(p.tx.addr, p.rx.addr, len) };
            if p.rx.kind == DmaKind::TailIncrement as u8 {
                ready.push_back(p.rx.queue);
            }
        });
        self.dma = Some(dma);
        for _ in 0..bad {
            // A trigger pointing outside device memory belongs to no execution we can name.
            self.post_error(core, ErrorSubtype::DmaAbort, Engine::Sp, u32::MAX, 0);
        }
        n != 0
    }

    /// Takes the next request off the exec rings and sets it up as the current execution.
    fn start_next(&mut self, core: &CoreShared, dev: &DeviceShared) -> bool {
        let mut progressed = false;
        while let Some(qid) = self.ready.pop_front() {
            progressed = true;
            let Some(Some(q)) = self.queues.get_mut(qid as usize) else {
                continue;
            };
            let mem = &dev.mem;
            // SAFETY: the tail word was validated in bounds and 4-aligned at registration.
            let tail = unsafe { (mem.ptr(q.desc.tail_addr) as *const u32).read_volatile() };
            if q.head == tail {
                continue; // spurious: a request we already ran
            }
            let slot = q.desc.ring_addr + (q.head % q.desc.slots) as u64 * EXEC_RING_SLOT_SIZE;
            q.head = q.head.wrapping_add(1);
            let mut bytes = [0u8; EXEC_REQUEST_SIZE];
            // SAFETY: the ring was validated in bounds at registration; slot < ring end.
            unsafe {
                core::ptr::copy_nonoverlapping(mem.ptr(slot), bytes.as_mut_ptr(), EXEC_REQUEST_SIZE)
            };
            let req = ExecRequest::from_bytes(&bytes);
            self.exec_count += 1;
            self.next_compute_idx = req.compute_idx.wrapping_add(1);
            if req.sg_count > 1 {
                dev.lockstep_take(core.index, req.compute_idx);
            }
            if self.wedged {
                continue; // a wedged core takes no requests until reset
            }
            // Wrapping, like the table address it offsets: the sum is bounds-checked where the
            // descriptors are read, so a wrapped product is just another rejected address.
            let io_offset = (req.io_set as u64).wrapping_mul(q.desc.io_set_stride);
            // Preparing (decoding the blocks of a new model: milliseconds for a large one) is
            // work on the execution: a partner stalled at the first barrier must not count it
            // against its hang watchdog. `run`, which follows at once, marks it busy again.
            let lockstep = req.sg_count > 1;
            if lockstep {
                dev.lockstep_busy(core.index, Some(req.compute_idx));
            }
            let prepared = self.prepare(core, dev, req);
            if lockstep {
                dev.lockstep_busy(core.index, None);
            }
            let Some(mut exec) = prepared else {
                // Refused (an error record names it): its waiter is woken for it.
                self.ended.add(req.compute_idx);
                continue;
            };
            exec.io_offset = io_offset;
            exec.queue = qid;
            if let Some(p) = self.rings.as_ref() {
                p.prefetch_execution_wake(exec.idx);
            }
            self.current = Some(exec);
            return true;
        }
        progressed
    }

    fn prepare(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        req: ExecRequest,
    ) -> Option<Execution> {
        let idx = req.compute_idx;
        if req.flags & !exec_flags::ALL != 0 || req.sg_count == 0 || req.sg_index >= req.sg_count {
            self.post_error(core, ErrorSubtype::InvalidInstruction, Engine::Sp, idx, 0);
            return None;
        }
        if req.flags & exec_flags::RELOAD_CONFIG != 0 {
            // Model switch: forget everything decoded for the previous model, and how its
            // group was best served.
            self.cache.clear();
            self.last_blocks = None;
            if req.sg_count > 1 && req.sg_index == 0 {
                dev.serve_mode_reset(core.index);
            }
        }
        let blocks_addr = req.engine_block;
        let blocks = match self.last_blocks {
            Some((addrs, refs)) if addrs == blocks_addr => refs,
            _ => {
                let mut blocks: [Option<BlockRef>; NUM_ENGINES] = [None; NUM_ENGINES];
                for e in Engine::ALL {
                    match self.block(dev, blocks_addr[e.index()], e) {
                        Ok(b) => blocks[e.index()] = Some(b),
                        Err(at) => {
                            self.post_error(core, ErrorSubtype::InvalidInstruction, e, idx, at);
                            return None;
                        }
                    }
                }
                let refs = blocks.map(|b| b.expect("every engine has a block"));
                self.last_blocks = Some((blocks_addr, refs));
                refs
            }
        };
        // Engine semaphores count within one execution.
        for (w, word) in self.dirty.iter_mut().enumerate() {
            let mut bits = core::mem::take(word);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                core.semaphores[w * 64 + b].store(0, Ordering::Relaxed);
            }
        }
        let faults = dev.faults_for(core.index, self.exec_count);
        let idle = EngineState {
            pc: 0,
            phase: Phase::NotStarted,
            barrier_armed: false,
            guarded_off: false,
        };
        self.nan_target = None;
        Some(Execution {
            req,
            queue: 0,
            io_offset: 0,
            idx,
            group: core.index - req.sg_index as u32,
            blocks,
            engines: [idle; NUM_ENGINES],
            faults,
            stalled_since: None,
            busy: Duration::ZERO,
            partners_progress: 0,
            started: false,
        })
    }

    /// The decoded block at `addr` for `engine`, decoding (and validating) it on a miss.
    /// Returns the failing instruction index on error.
    fn block(
        &mut self,
        dev: &DeviceShared,
        addr: DevAddr,
        engine: Engine,
    ) -> Result<BlockRef, u32> {
        if let Some((_, _, b)) = self
            .cache
            .iter()
            .find(|(a, e, _)| *a == addr && *e == engine)
        {
            return Ok(BlockRef::new(b));
        }
        let mem = &dev.mem;
        let mut out = Vec::new();
        let mut at = addr;
        loop {
            if out.len() >= MAX_BLOCK_INSTRUCTIONS || !mem.in_bounds(at, 1) {
                return Err(out.len() as u32);
            }
            let avail = (mem.len() - at).min(4096) as usize;
            // SAFETY: at..at+avail is inside device memory (checked above).
            let bytes = unsafe { core::slice::from_raw_parts(mem.ptr(at), avail) };
            let (ins, len) = Instruction::decode(bytes).map_err(|_| out.len() as u32)?;
            if !ins.op.runs_on(engine) || !operands_valid(&ins, mem.len()) {
                return Err(out.len() as u32);
            }
            out.push(ins);
            at += len as u64;
            if matches!(ins.op, Op::End(op::End)) {
                break;
            }
        }
        let b: Box<[Instruction]> = out.into();
        let r = BlockRef::new(&b);
        self.cache.push((addr, engine, b));
        Ok(r)
    }

    /// Runs the current execution until it finishes or stalls. A lockstep execution is
    /// marked busy meanwhile, so a partner stalled at a barrier knows this core is computing
    /// and does not count the wait as a hang.
    fn run(&mut self, core: &CoreShared, dev: &DeviceShared) -> Poll {
        let lockstep = self
            .current
            .as_ref()
            .filter(|e| e.req.sg_count > 1)
            .map(|e| e.idx);
        if lockstep.is_none() {
            return self.run_current(core, dev, None);
        }
        dev.lockstep_busy(core.index, lockstep);
        let before = self.current.as_ref().map(Execution::progress);
        let t0 = Instant::now();
        if let Some(e) = self.current.as_mut()
            && !core::mem::replace(&mut e.started, true)
        {
            dev.lockstep_started(core.index, e.idx, t0.saturating_duration_since(dev.epoch));
        }
        let r = self.run_current(core, dev, Some(t0));
        if let Some(e) = self.current.as_mut() {
            // Stalled at a barrier: count the run up to here.
            e.busy += t0.elapsed();
        }
        if self.current.as_ref().map(Execution::progress) != before {
            dev.lockstep_progressed(core.index);
        }
        dev.lockstep_busy(core.index, None);
        r
    }

    /// `run_from`: when this run of a lockstep execution began (its part's busy time).
    fn run_current(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        run_from: Option<Instant>,
    ) -> Poll {
        let mut exec = self.current.take().expect("run with a current execution");
        loop {
            let mut progressed = false;
            let mut done = true;
            for e in Engine::ALL {
                if exec.engines[e.index()].phase == Phase::Done {
                    continue;
                }
                match self.step(core, dev, &mut exec, e) {
                    Step::Progress => progressed = true,
                    Step::Blocked => {}
                    Step::Abort => {
                        if exec.req.sg_count > 1 {
                            dev.abort_group(exec.group, exec.idx);
                        }
                        self.ended.add(exec.idx);
                        return Poll::Progressed;
                    }
                }
                // A streaming output's wake: now, unless this step finished the execution
                // (then the poll's publication of its last records signals it).
                if self.wake_pending
                    && exec.engines.iter().any(|x| x.phase != Phase::Done)
                    && let Some(p) = self.rings.as_mut()
                {
                    self.wake_pending = false;
                    p.publish_and_signal();
                }
                done &= exec.engines[e.index()].phase == Phase::Done;
            }
            if done {
                if exec.req.sg_count > 1 {
                    self.finished_part = Some((exec.group, exec.req.sg_count, exec.idx));
                }
                if let Some(t) = run_from {
                    self.part_done(core, dev, &exec, exec.busy + t.elapsed());
                }
                self.ended.add(exec.idx);
                return Poll::Progressed;
            }
            if progressed {
                exec.stalled_since = None;
                continue;
            }
            // Stalled.
            if exec.req.sg_count > 1 && dev.group_aborted(exec.group, exec.idx) {
                self.ended.add(exec.idx);
                return Poll::Progressed; // the partner core failed this execution
            }
            if exec.req.sg_count > 1
                && (!dev.group_taken(exec.group, exec.req.sg_count, exec.idx)
                    || dev.group_busy(exec.group, exec.req.sg_count, exec.idx, core.index)
                    || dev.group_progressed(
                        exec.group,
                        exec.req.sg_count,
                        core.index,
                        &mut exec.partners_progress,
                    ))
            {
                // A partner has not taken its part yet (the host is late, or the partner busy
                // with earlier work), or it is computing its part right now (on its own
                // device thread, which may also be preempted), or it advanced since this core
                // last looked (a thread serving both cores ran the partner's part in between).
                // The watchdog starts once every core of the group has the execution and none
                // is running it or advancing.
                exec.stalled_since = None;
                self.current = Some(exec);
                return Poll::Stalled;
            }
            let since = *exec.stalled_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= dev.config.hang_watchdog {
                core.set_cause(cause::EXEC_TIMEOUT);
                if exec.req.sg_count > 1 {
                    dev.abort_group(exec.group, exec.idx);
                }
                return Poll::Progressed;
            }
            self.current = Some(exec);
            return Poll::Stalled;
        }
    }

    /// A lockstep part finished in `took`: updates the core's average and, for a core
    /// other than the group's leader, whether the leader's thread serves it jointly.
    fn part_done(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        exec: &Execution,
        took: Duration,
    ) {
        let sample = (took.as_nanos().min(u64::MAX as u128 >> 8) as u64) << 8;
        let old = self.part_avg_ns;
        let s = tuning::DEVICE_JOINT_EWMA_SHIFT;
        self.part_avg_ns = if old == 0 {
            sample.max(1)
        } else {
            (old - (old >> s)).saturating_add(sample >> s).max(1)
        };
        dev.lockstep_part_busy(core.index, exec.idx, took);
        let threads = dev.config.threads;
        let (leader, own) = (exec.group % threads, core.index % threads);
        let short = Duration::from_nanos(self.part_avg_ns >> 8) < tuning::DEVICE_JOINT_PART_MAX;
        if core.short_parts.load(Ordering::Relaxed) != short {
            // Stored on a change only: the line is read by the partner's thread.
            core.short_parts.store(short, Ordering::Relaxed);
        }
        let joint = if leader != own && (short || dev.group_joint(exec.group)) {
            leader
        } else {
            NOT_JOINT
        };
        dev.set_joint_thread(core, joint);
    }

    #[inline(always)]
    fn record(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        exec: &Execution,
        kind: RecordKind,
        e: Engine,
    ) {
        let drop = exec.faults.drop_mask & (1 << e.index()) != 0;
        let mut rec = NqRecord::engine_event(kind, e, core.index as u8, exec.idx);
        if exec.req.flags & exec_flags::TRACE != 0 {
            rec = stamped(rec, dev);
        }
        self.post(core, e.index(), rec, drop);
    }

    /// Runs up to a quantum of instructions on engine `e`.
    fn step(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        exec: &mut Execution,
        e: Engine,
    ) -> Step {
        let ei = e.index();
        let mut started = false;
        if exec.engines[ei].phase == Phase::NotStarted {
            exec.engines[ei].phase = Phase::Running;
            self.record(core, dev, exec, RecordKind::Start, e);
            if let Some((kind, fe)) = exec.faults.error
                && fe == e
            {
                let sub = kind.error_subtype().expect("error faults have a subtype");
                self.post_error(core, sub, e, exec.idx, 0);
                if kind == FaultKind::Fatal {
                    self.wedged = true;
                }
                if sub.aborts_execution() {
                    return Step::Abort;
                }
            }
            if exec.faults.hang == Some(e) {
                exec.engines[ei].phase = Phase::Hung;
                return Step::Progress;
            }
            // Started: go straight on to the engine's first instructions (one step per
            // engine less per execution).
            started = true;
        } else if exec.engines[ei].phase == Phase::Hung {
            return Step::Blocked;
        }
        // SAFETY: the block is in the cache, which keeps it while this execution is current.
        let block = unsafe { exec.blocks[ei].get() };
        let mut progressed = started;
        let mut moved_data = false;
        for _ in 0..tuning::DEVICE_ENGINE_QUANTUM {
            let pc = exec.engines[ei].pc;
            let ins = &block[pc];
            if moved_data && !publishes(ins) {
                break;
            }
            if let Some((sem, v)) = ins.sync.wait
                && !self.sem_reached(core, dev, exec, sem, v)
            {
                break;
            }
            let mem = &dev.mem;
            // The instruction timeline: only traced executions, only while room is left.
            let timed = exec.req.flags & exec_flags::TRACE != 0
                && self.instructions.len() < self.instructions.capacity()
                && moves_data(&ins.op);
            let t0 = if timed { dev.clock_ns() } else { 0 };
            match &ins.op {
                Op::End(op::End) => {
                    if exec.faults.nan == Some(e) {
                        if let Some(ap) = self.nan_target
                            && ap.dtype == DType::F32
                            && ap.elements() > 0
                        {
                            // SAFETY: the operand was validated in bounds and aligned when the
                            // block was decoded.
                            unsafe { (mem.ptr(ap.addr) as *mut f32).write(f32::NAN) };
                        }
                        self.post_error(core, ErrorSubtype::Numerical, e, exec.idx, pc as u32);
                    }
                    self.record(core, dev, exec, RecordKind::End, e);
                    exec.engines[ei].phase = Phase::Done;
                    return Step::Progress;
                }
                Op::Nop(op::Nop) => {}
                Op::Guard(op::Guard { cond, when }) => {
                    exec.engines[ei].guarded_off = cond.is_some_and(|c| {
                        // SAFETY: the operand (one byte) was validated in bounds when the
                        // block was decoded (`operands_valid`).
                        let v = unsafe { mem.ptr(c.addr).read_volatile() };
                        (v != 0) != *when
                    });
                }
                Op::SemSet(op::SemSet { sem, value }) => {
                    self.sem_set(core, dev, exec, *sem, *value)
                }
                Op::Notify(op::Notify {
                    subtype,
                    sub_id,
                    payload,
                }) => {
                    let drop = exec.faults.drop_mask & (1 << ei) != 0;
                    let rec = NqRecord::custom(
                        *subtype,
                        *sub_id,
                        e,
                        core.index as u8,
                        exec.idx,
                        *payload,
                    );
                    self.post(core, ei, rec, drop);
                    if *sub_id == CUSTOM_SUB_ID_OUTPUT_DONE {
                        // A streaming output is final: the host must see it now, not when
                        // the whole execution is done (a blocked waiter is woken after
                        // this engine's step, or with the execution's last records).
                        self.publish_streaming();
                    }
                }
                Op::Barrier(op::Barrier { sem, count }) => {
                    if !exec.engines[ei].barrier_armed {
                        self.sem_add(core, dev, exec, *sem, 1);
                        exec.engines[ei].barrier_armed = true;
                        progressed = true;
                    }
                    if !self.sem_reached(core, dev, exec, *sem, *count) {
                        break;
                    }
                    exec.engines[ei].barrier_armed = false;
                }
                // Predicated off: the instruction only synchronizes (below).
                _ if exec.engines[ei].guarded_off => {}
                Op::DmaDescriptors(op::DmaDescriptors { table, count }) => {
                    if run_descriptors(mem, table.wrapping_add(exec.io_offset), *count).is_err() {
                        self.post_error(core, ErrorSubtype::DmaAbort, e, exec.idx, pc as u32);
                        return Step::Abort;
                    }
                }
                op => {
                    // SAFETY: every operand was validated in bounds and aligned when the block
                    // was decoded (`operands_valid`).
                    let r = unsafe { nrt_kernels::execute(op, dev.kernel_memory(), &mut self.ws) };
                    match r {
                        Ok(()) if exec.faults.nan == Some(e) => {
                            self.nan_target = output_operand(op)
                        }
                        Ok(()) => {}
                        Err(KernelError::IndexOutOfRange { .. }) => {
                            self.post_error(
                                core,
                                ErrorSubtype::OutOfBounds,
                                e,
                                exec.idx,
                                pc as u32,
                            );
                            return Step::Abort;
                        }
                        // An instruction whose scratch is past the workspace's bound (a
                        // stride-0 view can give an operand far more elements than memory):
                        // the device cannot execute it.
                        Err(
                            KernelError::Unsupported(_) | KernelError::ScratchUnavailable { .. },
                        ) => {
                            self.post_error(
                                core,
                                ErrorSubtype::InvalidInstruction,
                                e,
                                exec.idx,
                                pc as u32,
                            );
                            return Step::Abort;
                        }
                    }
                }
            }
            if timed && !exec.engines[ei].guarded_off {
                self.instructions.push(InstructionEvent {
                    core: core.index,
                    engine: e,
                    exec_idx: exec.idx,
                    pc: pc as u32,
                    op: ins.op.name(),
                    start_ns: t0,
                    end_ns: dev.clock_ns(),
                });
            }
            if let Some((sem, v)) = ins.sync.signal {
                self.sem_add(core, dev, exec, sem, v);
            }
            exec.engines[ei].pc += 1;
            progressed = true;
            // Engines run in parallel on hardware: after a compute or DMA instruction, let the
            // other engines of the core take their turn, so one engine's long chain cannot
            // hold back another engine's (e.g. an early output's DMA and notify) — but first
            // tell the other cores: a `Nop` right after it that signals a device-wide
            // semaphore is what another core waits for, and it must not wait behind this
            // core's next instruction (the input DMA's publish behind the first MatMul held
            // back the partner core's first layer by the whole layer).
            moved_data |= moves_data(&ins.op) && !exec.engines[ei].guarded_off;
        }
        if progressed {
            Step::Progress
        } else {
            Step::Blocked
        }
    }

    fn sem_reached(
        &self,
        core: &CoreShared,
        dev: &DeviceShared,
        exec: &Execution,
        sem: SemRef,
        v: u32,
    ) -> bool {
        if sem.is_global() {
            dev.global_reached(exec.group, sem.index(), exec.idx, v)
        } else {
            core.semaphores[sem.index() as usize].load(Ordering::Relaxed) >= v
        }
    }

    fn sem_add(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        exec: &Execution,
        sem: SemRef,
        v: u32,
    ) {
        if sem.is_global() {
            dev.global_add(exec.group, sem.index(), exec.idx, v);
        } else {
            let i = sem.index() as usize;
            self.dirty[i / 64] |= 1 << (i % 64);
            core.semaphores[i].fetch_add(v, Ordering::Relaxed);
        }
    }

    fn sem_set(
        &mut self,
        core: &CoreShared,
        dev: &DeviceShared,
        exec: &Execution,
        sem: SemRef,
        v: u32,
    ) {
        if sem.is_global() {
            dev.global_set(exec.group, sem.index(), exec.idx, v);
        } else {
            let i = sem.index() as usize;
            self.dirty[i / 64] |= 1 << (i % 64);
            core.semaphores[i].store(v, Ordering::Relaxed);
        }
    }

    /// Abandons the core's current execution if it came from exec ring `queue`, which is
    /// being released: a model unloaded after its execution timed out. A part stalled at a
    /// lockstep barrier (its lock free, so the release got in) would otherwise resume when
    /// its partner arrives and run the rest of its instructions on memory the unload frees —
    /// and that another model may be given. A lockstep part aborts its group, as a hang does.
    pub(crate) fn abandon_queue(&mut self, queue: u16, dev: &DeviceShared) {
        if let Some(exec) = self.current.take_if(|e| e.queue == queue)
            && exec.req.sg_count > 1
        {
            dev.abort_group(exec.group, exec.idx);
        }
    }

    /// Drops whatever the core was doing (`nc_reset`).
    pub(crate) fn reset(&mut self, core: &CoreShared, dev: &DeviceShared) {
        self.current = None;
        self.ready.clear();
        self.cache.clear();
        self.last_blocks = None;
        self.wedged = false;
        // Triggers the host staged before the reset still run their copies (they only move
        // bytes: request, event word, tail word) — dropping them would leave an exec ring's
        // tail word behind the host's tail, and the next request after the reset would make
        // the core run the stale slots in between. Their requests are skipped just below.
        self.drain_dma(core, dev);
        self.ready.clear();
        for q in self.queues.iter_mut().flatten() {
            // SAFETY: validated at registration.
            q.head = unsafe { (dev.mem.ptr(q.desc.tail_addr) as *const u32).read_volatile() };
        }
        for (i, s) in core.semaphores.iter().enumerate() {
            if i as u32 >= FIRST_ENGINE_SEMAPHORE {
                s.store(0, Ordering::Relaxed);
            }
        }
        self.dirty = [0; 4];
        core.mirrors
            .doorbell_seen
            .store(core.doorbell.load(Ordering::Acquire), Ordering::Relaxed);
        core.cause.store(0, Ordering::Release);
        core.mirrors.active.store(false, Ordering::Relaxed);
        let _ = GLOBAL_SEMAPHORES;
    }
}

/// Trace mode: a START or END record carries the device clock (the engine's timeline). Out of
/// line: the clock read must not weigh on the untraced path's code.
#[cold]
#[inline(never)]
fn stamped(rec: NqRecord, dev: &DeviceShared) -> NqRecord {
    rec.with_timestamp(dev.clock_ns())
}

/// Whether `ins` only tells other cores of progress: a `Nop` with no wait that signals a
/// device-wide semaphore.
fn publishes(ins: &Instruction) -> bool {
    matches!(ins.op, Op::Nop(op::Nop))
        && ins.sync.wait.is_none()
        && ins.sync.signal.is_some_and(|(sem, _)| sem.is_global())
}

/// Whether an instruction does real work (a kernel or a DMA), after which the engine yields.
fn moves_data(op: &Op) -> bool {
    !matches!(
        op,
        Op::Nop(op::Nop)
            | Op::Guard(_)
            | Op::SemSet(_)
            | Op::Notify(_)
            | Op::Barrier(_)
            | Op::End(op::End)
    )
}

/// Runs `count` descriptor pairs stored at `table`.
fn run_descriptors(mem: &crate::memory::Memory, table: DevAddr, count: u32) -> Result<(), ()> {
    let size = TRIGGER_PAIR_SIZE as u64;
    if !mem.in_bounds(table, count as u64 * size) {
        return Err(());
    }
    for i in 0..count as u64 {
        let mut b = [0u8; TRIGGER_PAIR_SIZE];
        // SAFETY: the table range was checked in bounds above.
        unsafe {
            core::ptr::copy_nonoverlapping(
                mem.ptr(table + i * size),
                b.as_mut_ptr(),
                TRIGGER_PAIR_SIZE,
            )
        };
        let p = TriggerPair::from_bytes(&b);
        let len = p.tx.len as u64;
        if p.rx.len != p.tx.len || !mem.in_bounds(p.tx.addr, len) || !mem.in_bounds(p.rx.addr, len)
        {
            return Err(());
        }
        // SAFETY: both ranges checked in bounds just above.
        unsafe { mem.copy_within(p.tx.addr, p.rx.addr, len) };
    }
    Ok(())
}

/// Whether every operand of `ins` lies inside a device memory of `mem_len` bytes and is
/// aligned to its element size (the DMA descriptor table: to 8 bytes). The operands and their
/// extents come from the ISA's operand table (`Op::operands`, through `address_fields`).
fn operands_valid(ins: &Instruction, mem_len: u64) -> bool {
    let in_memory = |addr: u64, align: u64, (lo, hi): (i128, i128)| {
        if lo == hi {
            return true; // empty operand: touches nothing
        }
        let (start, end) = (addr as i128 + lo, addr as i128 + hi);
        start >= 0 && end <= mem_len as i128 && addr.is_multiple_of(align)
    };
    let mut ok = true;
    if let Op::DmaDescriptors(op::DmaDescriptors { table, .. }) = &ins.op {
        ins.address_fields(|f| ok &= in_memory(*table, 8, f.extent));
        return ok;
    }
    ins.op.operands(|o| {
        ok &= in_memory(o.ap.addr, o.ap.dtype.size() as u64, o.ap.byte_extent());
    });
    ok
}

/// The operand an op writes (where an injected NaN lands).
fn output_operand(op: &Op) -> Option<AccessPattern> {
    op.output().copied()
}
