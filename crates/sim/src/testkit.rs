//! A minimal host driver that talks to a device through the [`nrt_hal::Device`] contract
//! alone: it sets up one exec ring, stages requests with the three trigger pairs, rings the
//! doorbell and reads the notification rings.
//!
//! It exists so the device can be tested and benchmarked without the runtime (the device's
//! own tests, the device-only round-trip benchmark). The runtime's real staging path lives
//! in `nrt-runtime`.
//!
//! [`CoTenants`]: busy-looping threads that compete for the CPUs, so a test can run the
//! runtime the way a shared host does (the zero-allocation tests under contention).

use nrt_hal::wire::{
    EXEC_RING_SLOT_SIZE, REQUEST_SLOT_EVENT_OFFSET, REQUEST_SLOT_SIZE, REQUEST_SLOT_TAIL_OFFSET,
};
use nrt_hal::{
    CompletionWake, DevAddr, Device, DeviceMapping, DmaKind, Engine, ExecQueueDesc, ExecRequest,
    HalError, NUM_ENGINES, NqRecord, PlaneConsumer, Producer, RecordKind,
    SEMAPHORE_INFERENCE_START, TriggerPair, tuning,
};
use nrt_isa::op;
use nrt_isa::{Instruction, Op};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Busy-looping threads competing with everything else in the process for the CPUs until
/// dropped: co-tenants of a shared host, inside the test process. Once started they never
/// allocate or make a system call, so they are invisible to a counting allocator.
#[derive(Debug)]
pub struct CoTenants {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl CoTenants {
    /// One busy thread per CPU the process may use: every runtime thread then shares a CPU
    /// with one and is preempted in the middle of whatever it does.
    pub fn one_per_cpu() -> CoTenants {
        CoTenants::start(std::thread::available_parallelism().map_or(2, |n| n.get()))
    }

    /// `n` busy threads. Returns once every one of them runs: a thread's start-up (std frees
    /// its start-up state on the new thread) must not land in a measured window, and under
    /// contention a spawned thread can start late.
    pub fn start(n: usize) -> CoTenants {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let threads = (0..n)
            .map(|_| {
                let (stop, started) = (stop.clone(), started.clone());
                std::thread::spawn(move || {
                    started.fetch_add(1, Ordering::Release);
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        while started.load(Ordering::Acquire) < n {
            std::thread::yield_now();
        }
        CoTenants { stop, threads }
    }
}

impl Drop for CoTenants {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Drives one core of a device directly.
#[derive(Debug)]
pub struct DirectDriver<'d> {
    dev: &'d dyn Device,
    core: u32,
    dma: Producer<TriggerPair>,
    /// The core's notification plane (five INFER_STATUS rings and the ERROR ring).
    rings: PlaneConsumer,
    queue: u16,
    slots: u32,
    ring_addr: DevAddr,
    tail_addr: DevAddr,
    event_addr: DevAddr,
    req_buf: DeviceMapping,
    tail: u32,
    allocations: Vec<DevAddr>,
}

impl<'d> DirectDriver<'d> {
    /// Sets up core `core` of `dev`: DMA queue, notification rings, one exec ring.
    pub fn new(dev: &'d dyn Device, core: u32) -> Result<Self, HalError> {
        let slots = tuning::EXEC_RING_SLOTS;
        let ring_addr = dev.mem_alloc(slots as u64 * EXEC_RING_SLOT_SIZE, 64)?;
        let words = dev.mem_alloc(64, 64)?;
        let req = dev.mem_alloc(slots as u64 * REQUEST_SLOT_SIZE, 64)?;
        dev.memset(words, 0, 64)?;
        let queue = dev.exec_queue_register(
            core,
            ExecQueueDesc {
                ring_addr,
                slots,
                tail_addr: words,
                event_addr: words + 4,
                io_set_stride: 0,
            },
        )?;
        let dma = dev.dma_queue_init(core, tuning::DMA_QUEUE_CAPACITY)?;
        let rings = dev.notification_init(core, tuning::NQ_RING_CAPACITY)?;
        Ok(DirectDriver {
            dev,
            core,
            dma,
            rings,
            queue,
            slots,
            ring_addr,
            tail_addr: words,
            event_addr: words + 4,
            req_buf: dev.map(req, slots as u64 * REQUEST_SLOT_SIZE)?,
            tail: 0,
            allocations: vec![ring_addr, words, req],
        })
    }

    /// Releases the exec ring now (as the runtime's unload does; the drop's release then
    /// finds it gone).
    pub fn release_queue(&self) -> Result<(), HalError> {
        self.dev.exec_queue_release(self.core, self.queue)
    }

    /// The device.
    pub fn device(&self) -> &'d dyn Device {
        self.dev
    }

    /// Writes an instruction block (an `End` is appended) into device memory; returns its PA.
    pub fn load_block(&mut self, instructions: &[Instruction]) -> Result<DevAddr, HalError> {
        let code = nrt_isa::encode_block(instructions);
        let a = self.dev.mem_alloc(code.len() as u64, 64)?;
        self.dev.copy_in(a, &code)?;
        self.allocations.push(a);
        Ok(a)
    }

    /// Five empty blocks (each just `End`).
    pub fn empty_blocks(&mut self) -> Result<[DevAddr; NUM_ENGINES], HalError> {
        let end = self.load_block(&[Instruction::new(Op::End(op::End))])?;
        Ok([end; NUM_ENGINES])
    }

    /// Stages one request: writes it to the request buffer and appends the three trigger
    /// pairs (request copy, event poke, tail increment). Does not ring the doorbell.
    pub fn stage(
        &mut self,
        blocks: [DevAddr; NUM_ENGINES],
        compute_idx: u32,
        flags: u16,
        sg_index: u8,
        sg_count: u8,
    ) -> bool {
        let slot = self.tail % self.slots;
        let req = ExecRequest {
            engine_block: blocks,
            compute_idx,
            flags,
            sg_index,
            sg_count,
            io_set: 0,
        };
        let off = slot as u64 * REQUEST_SLOT_SIZE;
        self.req_buf.write(off as usize, &req.to_bytes());
        self.req_buf.write(
            (off + REQUEST_SLOT_EVENT_OFFSET) as usize,
            &compute_idx.to_le_bytes(),
        );
        let new_tail = self.tail.wrapping_add(1);
        self.req_buf.write(
            (off + REQUEST_SLOT_TAIL_OFFSET) as usize,
            &new_tail.to_le_bytes(),
        );
        let src = self.req_buf.device_addr() + off;
        let pairs = [
            TriggerPair::new(
                DmaKind::RequestCopy,
                src,
                self.ring_addr + slot as u64 * EXEC_RING_SLOT_SIZE,
                nrt_hal::wire::EXEC_REQUEST_SIZE as u32,
                0,
            ),
            TriggerPair::new(
                DmaKind::EventPoke,
                src + REQUEST_SLOT_EVENT_OFFSET,
                self.event_addr,
                4,
                0,
            ),
            TriggerPair::new(
                DmaKind::TailIncrement,
                src + REQUEST_SLOT_TAIL_OFFSET,
                self.tail_addr,
                4,
                self.queue,
            ),
        ];
        if !self.dma.push_slice(&pairs) {
            return false;
        }
        self.tail = new_tail;
        true
    }

    /// Rings the doorbell.
    pub fn doorbell(&self) -> Result<(), HalError> {
        self.dev
            .semaphore_increment(self.core, SEMAPHORE_INFERENCE_START, 1)
    }

    /// Appends every available record of every ring to `out` (engine rings first, then
    /// the ERROR ring); returns how many.
    pub fn drain(&mut self, out: &mut Vec<NqRecord>) -> usize {
        self.rings.drain_all(|_, rec| out.push(rec)) as usize
    }

    /// Whether records are waiting in any ring (what a blocked waiter's `ready` reads).
    pub fn has_records(&self) -> bool {
        self.rings.has_records()
    }

    /// Spins until `count` END records have arrived or `timeout` passes; returns every
    /// record seen.
    pub fn wait_for_ends(&mut self, count: usize, timeout: Duration) -> Vec<NqRecord> {
        let mut out = Vec::new();
        let t0 = Instant::now();
        loop {
            self.drain(&mut out);
            let ends = out
                .iter()
                .filter(|r| r.record_kind() == Some(RecordKind::End))
                .count();
            if ends >= count || t0.elapsed() > timeout {
                return out;
            }
            std::hint::spin_loop();
        }
    }

    /// Attaches a new completion wake to the core's notification plane and returns it.
    pub fn attach_wake(&self) -> Result<Arc<CompletionWake>, HalError> {
        let wake = Arc::new(CompletionWake::new());
        self.dev.notification_wake(self.core, Some(wake.clone()))?;
        Ok(wake)
    }

    /// [`DirectDriver::wait_for_ends`] without spinning: between looks the thread blocks on
    /// `wake` (attached with [`DirectDriver::attach_wake`]) until the device signals.
    pub fn block_for_ends(
        &mut self,
        wake: &CompletionWake,
        count: usize,
        timeout: Duration,
    ) -> Vec<NqRecord> {
        let mut out = Vec::new();
        let t0 = Instant::now();
        loop {
            self.drain(&mut out);
            let ends = out
                .iter()
                .filter(|r| r.record_kind() == Some(RecordKind::End))
                .count();
            let left = timeout.saturating_sub(t0.elapsed());
            if ends >= count || left.is_zero() {
                return out;
            }
            wake.wait(Some(left), || self.rings.has_records());
        }
    }

    /// Records dropped by engine `engine`'s ring.
    pub fn dropped(&self, engine: Engine) -> u32 {
        self.rings.dropped(engine.index())
    }

    /// The core's interrupt-cause word.
    pub fn cause(&self) -> u32 {
        self.dev.interrupt_cause(self.core).unwrap_or(0)
    }

    /// Spins until every END record of one execution (five) arrived — the device-only round
    /// trip the benchmark times. Returns false on timeout.
    #[inline]
    pub fn spin_for_execution(&mut self, timeout: Duration) -> bool {
        let mut ends = 0;
        let t0 = Instant::now();
        let mut polls = 0u32;
        while ends < NUM_ENGINES {
            self.rings
                .drain_all(|_, rec| ends += (rec.kind == RecordKind::End as u8) as usize);
            polls += 1;
            if polls.is_multiple_of(1024) && t0.elapsed() > timeout {
                return false;
            }
        }
        true
    }
}

impl Drop for DirectDriver<'_> {
    fn drop(&mut self) {
        let _ = self.dev.exec_queue_release(self.core, self.queue);
        let _ = self.dev.dma_queue_release(self.core);
        let _ = self.dev.notification_release(self.core);
        for a in self.allocations.drain(..) {
            let _ = self.dev.mem_free(a);
        }
    }
}
