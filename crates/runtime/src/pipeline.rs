//! The pipeline of one execution, stage by stage (DESIGN §3; the seed's symbol for each stage
//! is in `docs/ARCHITECTURE.md`):
//!
//! 1. **validate** — runtime open, model loaded, repeat ≤ 1, every model input/output present
//!    in its set with the right size ([`validate`]);
//! 2. **resolve + fork** — the process-wide async-workers pointer decides the surface and the
//!    mode the bind runs in ([`BindMode`], the seed's exec mode), *inverted* as in the seed:
//!    `workers == None ? CloneHostTensors (1, the seed's EXPLICIT_ASYNC) : RefuseHostTensors
//!    (0)` — so the synchronous path carries mode 1;
//! 3. **bind** — take an I/O descriptor set, clone host tensors into its buffers (mode 1) or
//!    refuse them (mode 0, in [`validate`]), patch the descriptor of every I/O whose tensor
//!    changed ([`bind`]);
//! 4. **stage** — under ONE lock on the vcore's first core: for each core of the model write
//!    the 52-byte request and push the three trigger pairs, then one `compute_idx_tail++`
//!    ([`stage`]);
//! 5. **doorbell** — one `semaphore_increment(nc, INFERENCE_START, 1)` per core ([`doorbell`]);
//! 6. **publish** — the execution's seq id on the vcore's compute XU (assigned under the
//!    staging lock, packed `(seq & 0xFFFF_FFFF_FFFF) | (xu_id << 48)`);
//! 7. **harvest** — [`crate::harvest`] (8. **error decode** too): it ends at the execution's
//!    completion word;
//! 9. **retire** — by the execution's one owner (see [`crate::completion`]): copy host
//!    outputs back, unmark pending tensors, free the I/O set and the slot ([`retire`]).
//!
//! The stages are free functions on the shared state; the surfaces (`crate::surface`) call
//! them in order. Nothing here allocates: the slot table, the I/O sets, the rings and
//! request buffers were all made at load, and nothing here waits.

use crate::RuntimeInner;
use crate::error::{NrtError, Result};
use crate::harvest;
use crate::model::{IoSets, ModelShared, STATE_LOADED};
use crate::tensor::{Storage, Tensor, TensorSet};
use crate::vcore::{InflightSlot, SlotInfo, Surface, VCore, VcoreCounters};
use nrt_hal::wire::{
    EXEC_REQUEST_SIZE, EXEC_RING_SLOT_SIZE, REQUEST_SLOT_EVENT_OFFSET, REQUEST_SLOT_SIZE,
    REQUEST_SLOT_TAIL_OFFSET, exec_flags,
};
use nrt_hal::{
    DmaKind, ExecRequest, NRTA_SEQ_NUM_MAX, NrtStatus, SEMAPHORE_INFERENCE_START, TriggerPair,
    tuning,
};
use nrt_model::Usage;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// What an execution's bind does with host tensors: the seed's exec mode
/// (`kmgr_exec_mode_t`), named for what it does, with the seed's discriminants. The fork
/// computes it as the seed does, `workers == NULL ? 1 : 0` ([`crate::Runtime::bind_mode`]),
/// so `nrt_execute` without the implicit worker pool — the synchronous path — binds in mode
/// 1, which the seed labels `EXPLICIT_ASYNC`, and with the pool in mode 0 (`IMPLICIT_ASYNC`).
/// The seed's explicit NRT 3.0 surface stores 1 too but refuses host tensors before its bind;
/// ours binds in [`BindMode::RefuseHostTensors`], which is what it does.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindMode {
    /// Host tensors are refused (`NRT_INVALID`, "Async exec mode only supports device
    /// allocated tensors"): both async surfaces. The seed's `IMPLICIT_ASYNC` (0).
    RefuseHostTensors = 0,
    /// Host tensors are cloned into the I/O set's device buffers (a host input copied in at
    /// bind, a host output copied back at retire): the synchronous path. The seed's
    /// `EXPLICIT_ASYNC` (1).
    CloneHostTensors = 1,
}

/// The fork on the process-wide async-workers pointer: the mode `nrt_execute` binds in.
#[inline]
pub(crate) fn bind_mode(rt: &RuntimeInner) -> BindMode {
    if rt.implicit_async.is_none() {
        BindMode::CloneHostTensors
    } else {
        BindMode::RefuseHostTensors
    }
}

/// Stage 1: checks everything that can be checked without touching state; host tensors are
/// refused unless `mode` clones them. Returns whether any tensor is a host tensor. A refusal
/// is counted as `incorrect_input` in the vcore's statistics.
#[inline(always)]
pub(crate) fn validate(
    rt: &RuntimeInner,
    model: &ModelShared,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
    mode: BindMode,
) -> Result<bool> {
    validate_inner(rt, model, inputs, outputs, repeat, mode).inspect_err(|_| {
        if let Some(vc) = rt.vcores.get(model.vnc as usize) {
            count_refused(vc, NrtStatus::Invalid, crate::host::status::INCORRECT_INPUT);
        }
    })
}

/// Counts an execution refused before staging (a cold error path, any thread: `fetch_add`).
#[cold]
pub(crate) fn count_refused(vc: &VCore, class_of: NrtStatus, summary: usize) {
    let st = vc.stats();
    st.status[summary].fetch_add(1, Ordering::Relaxed);
    if let Some(c) = crate::host::error_class(class_of) {
        st.errors[c].fetch_add(1, Ordering::Relaxed);
    }
}

fn validate_inner(
    rt: &RuntimeInner,
    model: &ModelShared,
    inputs: &TensorSet,
    outputs: &TensorSet,
    repeat: i32,
    mode: BindMode,
) -> Result<bool> {
    crate::ensure_open(rt)?;
    if model.state.load(Ordering::Acquire) != STATE_LOADED {
        return Err(NrtError::invalid(format!(
            "model '{}' (id {}) is unloaded",
            model.name, model.id
        )));
    }
    if repeat > 1 {
        return Err(NrtError::invalid(format!(
            "repeat_count {repeat} > 1: model '{}' was not compiled for repeated execution",
            model.name
        )));
    }
    let mut any_host = false;
    for b in &model.io {
        let (set, what) = match b.info.usage {
            Usage::Input => (inputs, "input"),
            Usage::Output => (outputs, "output"),
        };
        let Some(t) = set.get(&b.info.name) else {
            if b.resident.is_some() {
                continue; // bound at load
            }
            return Err(NrtError::invalid(format!(
                "{what} tensor '{}' of model '{}' is missing from the {what} set",
                b.info.name, model.name
            )));
        };
        if let Some(r) = &b.resident {
            if !same_storage(r, t) {
                return Err(resident_mismatch(model, b, r, t));
            }
            continue;
        }
        if !t.belongs_to(rt) {
            return Err(NrtError::invalid(format!(
                "tensor '{}' bound to {what} '{}' belongs to another runtime instance",
                t.name(),
                b.info.name
            )));
        }
        if t.size() != b.info.size {
            return Err(NrtError::invalid(format!(
                "tensor '{}' bound to {what} '{}' of model '{}' is {} bytes; the model expects {}",
                t.name(),
                b.info.name,
                model.name,
                t.size(),
                b.info.size
            )));
        }
        if !t.placement().is_device() {
            if mode == BindMode::RefuseHostTensors {
                return Err(NrtError::invalid(format!(
                    "Async exec mode only supports device allocated tensors ({what} '{}' is bound to host tensor '{}')",
                    b.info.name,
                    t.name()
                )));
            }
            if t.host_ptr().is_null() {
                return Err(NrtError::invalid(format!(
                    "host tensor '{}' has no buffer attached",
                    t.name()
                )));
            }
            any_host = true;
        }
        if let Some(k) = b.in_place_of {
            check_in_place(model, b, k, inputs, t)?;
        }
    }
    Ok(any_host)
}

/// One tensor, or two handles of the same bytes (slices of one allocation at one offset).
fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    a.same(b)
        || (a.size() == b.size()
            && match (a.device_address(), b.device_address()) {
                (Some(x), Some(y)) => x == y,
                (None, None) => a.host_ptr() == b.host_ptr(),
                _ => false,
            })
}

/// The error of an execution that passes another tensor than the one bound at load.
#[cold]
#[inline(never)]
fn resident_mismatch(
    model: &ModelShared,
    b: &crate::model::IoBinding,
    r: &Tensor,
    t: &Tensor,
) -> NrtError {
    NrtError::invalid(format!(
        "'{}' of model '{}' is resident (tensor '{}', bound at load): pass that tensor or leave \
         it out of the set, not '{}'",
        b.info.name,
        model.name,
        r.name(),
        t.name()
    ))
}

/// In-place state (NCM 1.10): output `b` updates input `k` in place, so both must be bound
/// to one tensor — the program writes only what changes, and a separate output tensor would
/// hold stale data where it does not write.
#[cold]
#[inline(never)]
fn check_in_place(
    model: &ModelShared,
    b: &crate::model::IoBinding,
    k: usize,
    inputs: &TensorSet,
    out: &Tensor,
) -> Result<()> {
    let input = &model.io[k].info.name;
    match inputs.get(input) {
        Some(t) if same_storage(t, out) => Ok(()),
        Some(t) => Err(NrtError::invalid(format!(
            "output '{}' of model '{}' updates input '{input}' in place: bind the same tensor to \
             both (the input set has '{}', the output set '{}')",
            b.info.name,
            model.name,
            t.name(),
            out.name()
        ))),
        None => Ok(()), // the input's own check names it as missing
    }
}

/// Stage 3: takes an I/O set and wires every tensor into it, cloning host inputs into the
/// set's device buffers (`any_host`: [`validate`] found host tensors, which it lets through
/// only in [`BindMode::CloneHostTensors`]; such a bind takes one of the model's
/// [`tuning::HOST_CLONE_SETS`] sets and is counted in `host_clone_binds`). Returns the set,
/// or `None` if none is free (the caller waits or reports `NRT_QUEUE_FULL`); an error if the
/// model is being unloaded (or the runtime closed).
///
/// Holding a set is what keeps an unload waiting ([`crate::unload_model`] waits until every
/// set is free): the set is taken, then the state is read, with an asymmetric fence between
/// (`nrt_hal::sync::light_fence`, a compiler barrier here; the unload's side pays
/// `heavy_fence`). Either this sees the unload's mark and hands the set back untouched, or
/// the unload sees the set taken and waits — a caller that validated just before an unload
/// never writes into the set's descriptor table after the model's memory is freed.
pub(crate) fn bind(
    rt: &RuntimeInner,
    model: &ModelShared,
    inputs: &TensorSet,
    outputs: &TensorSet,
    mode: BindMode,
    any_host: bool,
) -> Result<Option<u32>> {
    debug_assert!(
        !any_host || mode == BindMode::CloneHostTensors,
        "validate refuses host tensors in {mode:?}"
    );
    let sets: &IoSets = &model.io_sets;
    let limit = if any_host {
        tuning::HOST_CLONE_SETS
    } else {
        tuning::EXEC_RING_SLOTS
    };
    let Some(s) = sets.acquire(limit) else {
        return Ok(None);
    };
    nrt_hal::sync::light_fence();
    if model.state.load(Ordering::Relaxed) != STATE_LOADED {
        sets.release(s);
        if let Some(vc) = rt.vcores.get(model.vnc as usize) {
            count_refused(vc, NrtStatus::Invalid, crate::host::status::FAILED_TO_QUEUE);
        }
        return Err(unloading_error(rt, model));
    }
    let set = &sets.sets[s as usize];
    let clones = if any_host {
        match model.host_clones(&*rt.device, s) {
            Ok(c) => c,
            Err(e) => {
                sets.release(s);
                return Err(e);
            }
        }
    } else {
        &[]
    };
    // SAFETY: set `s` is ours from `acquire` until `release`; no execution using it is in
    // flight, so nobody reads `tensors` concurrently.
    let bound = unsafe { &mut *set.tensors.get() };
    for (i, b) in model.io.iter().enumerate() {
        if b.resident.is_some() {
            bound[i] = None; // bound at load: the program addresses it, no descriptor
            continue;
        }
        let input = b.info.usage == Usage::Input;
        let t = if input {
            inputs.get(&b.info.name)
        } else {
            outputs.get(&b.info.name)
        };
        let t = t.expect("validated");
        let (addr, id) = match &t.0.storage {
            Storage::Device { addr, .. } => (*addr, t.0.id),
            Storage::Host { .. } => {
                let (clone_addr, clone_map) = clones[i];
                if input {
                    // The synchronous clone of a host input into device memory.
                    // SAFETY: the host buffer holds `size` bytes (validated) and the clone
                    // mapping was allocated with the same size at load.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            t.host_ptr(),
                            clone_map.as_ptr(),
                            b.info.size as usize,
                        )
                    };
                }
                (clone_addr, u64::MAX - i as u64) // the clone buffer is fixed per set and I/O
            }
        };
        if set.bound_ids[i].load(Ordering::Relaxed) != id {
            sets.patch(s, i, input, addr);
            set.bound_ids[i].store(id, Ordering::Relaxed);
        }
        bound[i] = Some(t.clone());
    }
    if any_host {
        // Only on the host-clone path, which copies the inputs anyway: never a locked add on
        // the device-tensor hot path.
        if let Some(vc) = rt.vcores.get(model.vnc as usize) {
            vc.counters.host_clone_binds.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(Some(s))
}

/// Undoes a bind on a failure path.
pub(crate) fn unbind(model: &ModelShared, s: u32) {
    let set = &model.io_sets.sets[s as usize];
    // SAFETY: the set is still ours (no execution was staged with it).
    let bound = unsafe { &mut *set.tensors.get() };
    bound.iter_mut().for_each(|t| *t = None);
    model.io_sets.release(s);
}

/// The error of a submission after the compute XU issued its last sequence number,
/// `NRTA_SEQ_NUM_MAX` = 2^48 − 1 (`nrt_async.h`): the next one would not fit the 48 bits of
/// a sequence id, and a number that wrapped to 0 would read as "none completed"
/// (`nrta_get_sequence`) and alias the first executions. Refused, not wrapped.
#[cold]
fn seq_numbers_exhausted(vc: &VCore) -> NrtError {
    NrtError::new(
        NrtStatus::Resource,
        format!(
            "the compute XU of logical NeuronCore {} issued its last sequence number \
             (NRTA_SEQ_NUM_MAX = {NRTA_SEQ_NUM_MAX:#x})",
            vc.index
        ),
    )
}

/// The error of an async submission that found every in-flight slot taken ([`stage`]).
#[cold]
pub(crate) fn slot_taken_error(vc: &VCore) -> NrtError {
    NrtError::new(
        NrtStatus::QueueFull,
        format!(
            "{} executions in flight on logical NeuronCore {}",
            tuning::EXEC_RING_SLOTS,
            vc.index
        ),
    )
}

/// Stage 4: under the vcore's one staging lock, write the request for every core of the
/// model, push the trigger pairs, and take the next compute index. Returns the seq, or
/// `Ok(None)` if the in-flight slot for the next compute index is still taken (its owner has
/// not retired the execution 64 before): an async submitter reports it
/// ([`slot_taken_error`]), a synchronous caller waits — without building an error, so
/// without allocating (four threads on one core wrapped the slots this way every few
/// hundred executions).
pub(crate) fn stage(
    rt: &RuntimeInner,
    vc: &VCore,
    model: &Arc<ModelShared>,
    io_set: u32,
    surface: Surface,
) -> Result<Option<u64>> {
    let mut st = vc.staging.lock().unwrap_or_else(|e| e.into_inner());
    VcoreCounters::bump(&vc.counters.staging_locks);
    // Checked again under the lock (close marks the runtime, and `bind` checked the model's
    // state already): an unload waits for the I/O set this execution holds in any case.
    if model.state.load(Ordering::Acquire) != STATE_LOADED || !crate::is_open(rt) {
        count_refused(vc, NrtStatus::Invalid, crate::host::status::FAILED_TO_QUEUE);
        return Err(unloading_error(rt, model));
    }
    if vc.unrecoverable.load(Ordering::Acquire) {
        count_refused(
            vc,
            NrtStatus::ExecUnitUnrecoverable,
            crate::host::status::FAILED_TO_QUEUE,
        );
        return Err(NrtError::new(
            NrtStatus::ExecUnitUnrecoverable,
            format!(
                "logical NeuronCore {} is in a fatal state; reset it before submitting",
                vc.index
            ),
        ));
    }
    if st.submitted >= NRTA_SEQ_NUM_MAX {
        count_refused(
            vc,
            NrtStatus::Resource,
            crate::host::status::FAILED_TO_QUEUE,
        );
        return Err(seq_numbers_exhausted(vc));
    }
    let seq = st.submitted + 1;
    let idx = st.submitted as u32;
    let slot: &InflightSlot = vc.slot(seq);
    if !slot.ticket.is_free() {
        return Ok(None);
    }
    // SAFETY: the slot is free (ticket 0) and we hold the staging lock, so no one else
    // reads or writes `info` until the ticket below publishes it.
    let info = unsafe { &mut *slot.info.get() };
    *info = SlotInfo {
        model: Some(model.clone()),
        io_set,
        sg_count: model.sg_count as u8,
        deadline: harvest::coarse_now() + model.exec_timeout,
        timeout: model.exec_timeout,
        surface,
        pending_marked: marks_pending(rt, surface),
        t0_ns: if seq % crate::host::TOTAL_LATENCY_SAMPLE == 1 {
            crate::host::now_ns()
        } else {
            0
        },
    };
    // Publish before the device can possibly see the request: records for this compute index
    // must find the ticket.
    slot.ticket.publish(seq);
    for (c, cr) in model.cores.iter().enumerate() {
        let pos = vc.core_pos(cr.phys);
        let mut flags = 0;
        if st.last_model[pos] != model.id {
            st.last_model[pos] = model.id;
            flags |= exec_flags::RELOAD_CONFIG;
            VcoreCounters::bump(&vc.counters.model_switches);
        } else {
            VcoreCounters::bump(&vc.counters.steady_executions);
        }
        if rt.trace.engine_timeline() {
            flags |= exec_flags::TRACE;
        }
        let tail = cr.tail.load(Ordering::Relaxed);
        let ring_slot = tail % tuning::EXEC_RING_SLOTS;
        let req = ExecRequest {
            engine_block: cr.blocks,
            compute_idx: idx,
            flags,
            sg_index: c as u8,
            sg_count: model.sg_count as u8,
            io_set,
        };
        let off = ring_slot as usize * REQUEST_SLOT_SIZE as usize;
        let new_tail = tail.wrapping_add(1);
        cr.req_buf.write(off, &req.to_bytes());
        cr.req_buf
            .write(off + REQUEST_SLOT_EVENT_OFFSET as usize, &idx.to_le_bytes());
        cr.req_buf.write(
            off + REQUEST_SLOT_TAIL_OFFSET as usize,
            &new_tail.to_le_bytes(),
        );
        let src = cr.req_buf.device_addr() + off as u64;
        let pairs = [
            TriggerPair::new(
                DmaKind::RequestCopy,
                src,
                cr.ring + ring_slot as u64 * EXEC_RING_SLOT_SIZE,
                EXEC_REQUEST_SIZE as u32,
                0,
            ),
            TriggerPair::new(
                DmaKind::EventPoke,
                src + REQUEST_SLOT_EVENT_OFFSET,
                cr.event_addr,
                4,
                0,
            ),
            TriggerPair::new(
                DmaKind::TailIncrement,
                src + REQUEST_SLOT_TAIL_OFFSET,
                cr.tail_addr,
                4,
                cr.queue,
            ),
        ];
        // Capacity: ≤ 64 executions in flight per vcore × 3 pairs < the queue's 1024 slots.
        let pushed = st.dma[pos].push_slice(&pairs);
        debug_assert!(pushed, "DMA trigger queue full");
        cr.tail.store(new_tail, Ordering::Relaxed);
    }
    st.submitted += 1; // compute_idx_tail++
    vc.submitted.store(st.submitted, Ordering::Release);
    VcoreCounters::bump(&vc.counters.publishes);
    // The doorbells this execution's caller rings next ([`doorbell`]), one per core: counted
    // here, by the lock's one holder, with a load and a store.
    let c = &vc.counters.doorbells;
    c.store(
        c.load(Ordering::Relaxed)
            .wrapping_add(model.cores.len() as u64),
        Ordering::Relaxed,
    );
    Ok(Some(seq))
}

#[cold]
fn unloading_error(rt: &RuntimeInner, model: &ModelShared) -> NrtError {
    match crate::ensure_open(rt) {
        Err(e) => e,
        Ok(()) => NrtError::invalid(format!(
            "model '{}' (id {}) is being unloaded",
            model.name, model.id
        )),
    }
}

/// Stage 5: one doorbell per core of the model — the only device call of submit.
#[inline]
pub(crate) fn doorbell(rt: &RuntimeInner, model: &ModelShared) {
    for cr in &model.cores {
        // The core index was validated at init; an error here is a device bug.
        let _ = rt
            .device
            .semaphore_increment(cr.phys, SEMAPHORE_INFERENCE_START, 1);
    }
}

/// Stage 9, by the execution's one owner after its completion word: copy host outputs back
/// (on success), unmark pending tensors, free the I/O set and the slot.
pub(crate) fn retire(vc: &VCore, seq: u64, status: NrtStatus) {
    let slot = vc.slot(seq);
    // SAFETY: the completion word is written, so the harvest no longer reads `info`; we are
    // the execution's owner.
    let info = unsafe { &mut *slot.info.get() };
    let marked_pending = info.pending_marked;
    if let Some(model) = info.model.take() {
        let s = info.io_set;
        let set = &model.io_sets.sets[s as usize];
        // SAFETY: the set is owned by this execution until the release below.
        let bound = unsafe { &mut *set.tensors.get() };
        for (i, t) in bound.iter_mut().enumerate() {
            if let Some(t) = t.take() {
                if marked_pending {
                    t.0.pending.fetch_sub(1, Ordering::Release);
                }
                if status.is_success()
                    && !t.placement().is_device()
                    && model.io[i].info.usage == Usage::Output
                {
                    let (_, map) = model.io_sets.clone[s as usize]
                        .get()
                        .expect("a set bound to host tensors has its clones")[i];
                    // SAFETY: the host buffer holds the output's size (validated at bind);
                    // the clone mapping has the same size.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            map.as_ptr(),
                            t.host_ptr(),
                            model.io[i].info.size as usize,
                        )
                    };
                    // Streamed completion of a host output: its bytes are final now.
                    t.0.completion.bump();
                }
            }
        }
        // Last: an unload waiting for the model's sets may free its memory from here on.
        model.io_sets.release(s);
    }
    slot.ticket.release();
}

/// Whether an execution on `surface` marks its tensors pending: the async surfaces do in
/// implicit async mode (tensor reads and writes then wait for them); a synchronous execution
/// never does. The one place that decides it: the submitter marks ([`mark_pending`]), the
/// stager records it in the slot, and [`retire`] undoes it from that record.
#[inline]
pub(crate) fn marks_pending(rt: &RuntimeInner, surface: Surface) -> bool {
    rt.implicit_async.is_some() && !matches!(surface, Surface::Sync)
}

/// Marks every bound tensor pending (see [`marks_pending`]).
pub(crate) fn mark_pending(model: &ModelShared, s: u32) {
    let set = &model.io_sets.sets[s as usize];
    // SAFETY: the set is ours (bound, not yet staged).
    for t in unsafe { &*set.tensors.get() }.iter().flatten() {
        t.0.pending_vnc.store(model.vnc, Ordering::Relaxed);
        t.0.pending.fetch_add(1, Ordering::AcqRel);
    }
}

/// The error an execution that finished with `status` returns.
#[cold]
pub(crate) fn exec_error(model: &ModelShared, seq: u64, status: NrtStatus) -> NrtError {
    NrtError::new(
        status,
        format!(
            "execution {seq} of model '{}' failed: {}",
            model.name,
            status.description()
        ),
    )
}

/// Undoes [`mark_pending`] for an execution that was never staged.
pub(crate) fn release_pending(model: &ModelShared, s: u32) {
    let set = &model.io_sets.sets[s as usize];
    // SAFETY: the set is ours.
    for t in unsafe { &*set.tensors.get() }.iter().flatten() {
        t.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}
