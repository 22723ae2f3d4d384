//! The completion seam: where the harvest's part of an execution ends and its owner's
//! begins.
//!
//! The harvest ([`crate::harvest`]) ends every execution at its completion word. From there
//! exactly one owner retires the slot ([`crate::pipeline::retire`]), and the owner depends on
//! the surface that submitted it:
//!
//! | surface | owner | learns of the completion by |
//! |---|---|---|
//! | synchronous | the calling thread | its own completion word ([`crate::surface::sync`]) |
//! | implicit async | the vcore's XU worker | the completion words of its seqs, in order ([`crate::surface::implicit::retire_done`]) |
//! | explicit async | whichever thread ran the harvest step that finished it | the step's [`Owed`] set, settled here by [`drive`] |
//!
//! Every thread that waits for the device drives the harvest through [`drive`], never the
//! step function directly, so an explicit execution is settled — status slot written,
//! retired, eventfds signalled — by the same call that finished it, whoever made it. That is
//! what makes `is_completed` true only once the status is readable and the slot reusable:
//! it tests [`retired`].

use crate::RuntimeInner;
use crate::harvest::{self, Owed, Step};
use crate::pipeline::retire;
use crate::vcore::{Surface, VCore, signal_efd};
use nrt_hal::{NrtStatus, tuning};
use std::sync::atomic::Ordering;

/// One harvest step on vcore `vc` on behalf of execution `target` (0 = none in
/// particular), then the owner's part of every explicit execution the step finished.
#[inline]
pub(crate) fn drive(rt: &RuntimeInner, vc: &VCore, target: u64) -> Step {
    drive_as(rt, vc, target, false)
}

/// [`drive`] as the XU worker runs it.
#[inline]
pub(crate) fn drive_worker(rt: &RuntimeInner, vc: &VCore) -> Step {
    drive_as(rt, vc, 0, true)
}

/// [`drive`] on every vcore; whether any step made progress.
pub(crate) fn drive_all(rt: &RuntimeInner) -> bool {
    let mut progressed = false;
    for vc in rt.vcores.iter() {
        progressed |= drive(rt, vc, 0) != Step::Idle;
    }
    progressed
}

#[inline(always)]
fn drive_as(rt: &RuntimeInner, vc: &VCore, target: u64, worker: bool) -> Step {
    let mut owed: Owed = 0;
    let step = harvest::progress_one_step(rt, vc, target, worker, &mut owed);
    if owed != 0 {
        settle_explicit(vc, owed);
        // An explicit `wait` blocked on the vcore's wake waits for retirement, which the
        // settle just did.
        vc.signal_waiters();
    }
    step
}

/// The owner's part of explicit executions whose completion words this thread's step
/// wrote: the caller's status slot, retirement (the slot is free for the next schedule
/// once `is_completed` says so), the XU's in-flight count, eventfds.
#[inline(never)]
fn settle_explicit(vc: &VCore, mut owed: Owed) {
    // One locked subtraction for the batch, after the slots are free.
    let settled = owed.count_ones();
    while owed != 0 {
        let si = owed.trailing_zeros() as usize;
        owed &= owed - 1;
        let slot = &vc.slots[si];
        // The step that put the slot in `owed` wrote its completion word and handed it to
        // us; nobody else retires it, so the ticket still names it.
        let seq = slot.ticket.current();
        let status = harvest::completed_status(slot, seq).unwrap_or(NrtStatus::Failure);
        // SAFETY: the completion word is written and we are the execution's one owner: the
        // record is ours until `retire` frees the ticket.
        let surface = unsafe { (*slot.info.get()).surface };
        if let Surface::Explicit { status: p } = surface
            && !p.is_null()
        {
            // SAFETY: the explicit surface's contract: the caller keeps `*status` valid
            // until the execution completes (the public migration guide says so).
            unsafe { p.write_volatile(status.as_i32()) };
        }
        retire(vc, seq, status);
        announce(vc, seq);
    }
    vc.xu.async_done_n(settled);
}

/// Whether execution `seq` (≤ the vcore's submitted count) was retired by its owner: its
/// slot no longer names it. For an explicit execution this is "completed": its status slot
/// was written before.
#[inline]
pub(crate) fn retired(vc: &VCore, seq: u64) -> bool {
    vc.slot(seq).ticket.current() != seq
}

/// After an owner retired `seq`: signals the eventfd registered for it, and the compute
/// XU's.
#[inline]
pub(crate) fn announce(vc: &VCore, seq: u64) {
    if let Some(fd) =
        vc.xu.seq_efd[((seq - 1) % tuning::EXEC_RING_SLOTS as u64) as usize].announce(seq)
    {
        signal_efd(fd);
    }
    signal_efd(vc.xu.compute_efd.load(Ordering::Acquire));
}
