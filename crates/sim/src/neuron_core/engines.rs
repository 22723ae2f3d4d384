//! The cooperative scheduler: runs the current execution's five engines instruction by
//! instruction (waits, signals, kernels, DMA, faults), records their progress and ends
//! the execution or its lockstep part; and the instruction helpers it uses.

use super::*;
use crate::DeviceShared;
use crate::fault::FaultKind;
use nrt_hal::wire::{CUSTOM_SUB_ID_OUTPUT_DONE, TRIGGER_PAIR_SIZE, cause, exec_flags};
use nrt_hal::{DType, DevAddr, Engine, ErrorSubtype, NqRecord, RecordKind, TriggerPair, tuning};
use nrt_isa::op;
use nrt_isa::{AccessPattern, Instruction, Op, SemRef};
use nrt_kernels::KernelError;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl CoreInner {
    /// Runs the current execution until it finishes or stalls. A lockstep execution is
    /// marked busy meanwhile, so a partner stalled at a barrier knows this core is computing
    /// and does not count the wait as a hang.
    pub(super) fn run(&mut self, core: &CoreShared, dev: &DeviceShared) -> Poll {
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
    pub(super) fn run_current(
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
    pub(super) fn part_done(
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
    pub(super) fn record(
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
    pub(super) fn step(
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

    pub(super) fn sem_reached(
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

    pub(super) fn sem_add(
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

    pub(super) fn sem_set(
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

/// The operand an op writes (where an injected NaN lands).
fn output_operand(op: &Op) -> Option<AccessPattern> {
    op.output().copied()
}
