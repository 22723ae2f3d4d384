//! A core's requests and records: records posted to its notification rings, its DMA
//! trigger queue, starting the next execution (its blocks decoded, checked and cached),
//! abandoning an exec ring's execution and resetting the core.

use super::*;
use crate::DeviceShared;
use nrt_hal::wire::{EXEC_REQUEST_SIZE, EXEC_RING_SLOT_SIZE, cause, exec_flags};
use nrt_hal::{
    DevAddr, DmaKind, Engine, ErrorSubtype, ExecRequest, FIRST_ENGINE_SEMAPHORE, NUM_ENGINES,
    NqRecord,
};
use nrt_isa::op;
use nrt_isa::{GLOBAL_SEMAPHORES, Instruction, Op};
use std::sync::atomic::Ordering;
use std::time::Duration;

impl CoreInner {
    /// Writes a record on ring `ring` (or drops it, counting the drop). It becomes visible
    /// to the host with the next publication of the plane.
    pub(super) fn post(&mut self, core: &CoreShared, ring: usize, mut rec: NqRecord, drop: bool) {
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
    pub(super) fn publish_streaming(&mut self) {
        if let Some(p) = self.rings.as_mut() {
            p.publish_quietly();
            self.wake_pending = true;
        }
    }

    pub(super) fn post_error(
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
    pub(super) fn drain_dma(&mut self, core: &CoreShared, dev: &DeviceShared) -> bool {
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
    pub(super) fn start_next(&mut self, core: &CoreShared, dev: &DeviceShared) -> bool {
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

    pub(super) fn prepare(
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
    pub(super) fn block(
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
