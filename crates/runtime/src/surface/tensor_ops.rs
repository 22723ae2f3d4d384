//! Tensor reads, writes, fills and copies (`nrt_tensor_read/write/memset/copy`, and the
//! tensor-op XU's `nrta_tensor_*`), and waiting for streamed output completion. Under
//! implicit async a tensor bound to an execution still in flight is *pending*; these wait
//! for it by driving the harvest — except inside the async callback, where they would wait
//! for the callback's own worker (see [`super::implicit::in_async_callback`]).

use super::implicit::in_async_callback;
use crate::RuntimeInner;
use crate::completion::drive_all;
use crate::error::{NrtError, Result};
use crate::tensor::Tensor;
use crate::wait::Spin;
use nrt_hal::{NrtStatus, Waiter};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Waits while an implicit execution using `t` is pending. Their owners retire them — the
/// XU worker an implicit execution, the harvest that settles an explicit one — and signal
/// the vcore's completion wake after they did, so the wait spins only as long as the
/// vcore's executions are expected to take ([`nrt_hal::SpinBudget::spin_limit`]) and then
/// blocks on that wake: a read of a long execution's output does not hold a vCPU for the
/// whole execution, one that the device threads of a model spanning every CPU need.
///
/// It does not drive the harvest: the worker does while anything async is in flight, and a
/// thread that harvests makes the worker stand back (`surface::worker`), which a waiter
/// about to block must not do. The vcore is the one of the last execution that marked the
/// tensor (a hint): a tensor pending on several vcores at once waits on that one's wake,
/// and looks again after each wake-up or within [`nrt_hal::tuning::WAIT_BLOCK_RECHECK`].
fn wait_tensor_idle(rt: &RuntimeInner, t: &Tensor) {
    let pending = || t.0.pending.load(Ordering::Acquire) != 0;
    if !pending() || in_async_callback() {
        return;
    }
    let mut spin = Spin::new();
    while pending() {
        let vnc = t.0.pending_vnc.load(Ordering::Relaxed);
        let Some(vc) = rt.vcores.get(vnc as usize) else {
            // Not a vcore of this runtime (cannot happen: the markers write theirs): spin
            // and yield.
            spin.snooze();
            continue;
        };
        let mut w = Waiter::new(vc.wake.as_deref(), vc.spin.spin_limit());
        while pending() && t.0.pending_vnc.load(Ordering::Relaxed) == vnc {
            w.idle(|| !pending());
        }
    }
}

impl Tensor {
    fn wait_idle(&self, rt: &RuntimeInner) {
        if rt.implicit_async.is_some() {
            wait_tensor_idle(rt, self);
        }
    }

    /// Copies `buf.len()` bytes at `offset` into `buf` (`nrt_tensor_read`).
    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let rt = self.rt()?;
        self.wait_idle(&rt);
        let (p, n) = self.range(offset, buf.len() as u64, "read")?;
        // SAFETY: p..p+n is inside the tensor's buffer (checked by `range`), which lives as
        // long as `self`; `buf` is a distinct host slice.
        unsafe { core::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n) };
        Ok(())
    }

    /// Copies `buf` into the tensor at `offset` (`nrt_tensor_write`).
    pub fn write(&self, buf: &[u8], offset: u64) -> Result<()> {
        let rt = self.rt()?;
        self.wait_idle(&rt);
        let (p, n) = self.range(offset, buf.len() as u64, "write")?;
        // SAFETY: as in `read`, in the other direction.
        unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), p, n) };
        Ok(())
    }

    /// Fills `size` bytes at `offset` with `value` (`nrt_tensor_memset`).
    pub fn memset(&self, offset: u64, value: u8, size: u64) -> Result<()> {
        let rt = self.rt()?;
        self.wait_idle(&rt);
        let (p, n) = self.range(offset, size, "memset")?;
        // SAFETY: p..p+n is inside the tensor's buffer (checked by `range`).
        unsafe { core::ptr::write_bytes(p, value, n) };
        Ok(())
    }

    /// Copies `size` bytes from `src` at `src_offset` to `self` at `dst_offset`
    /// (`nrt_tensor_copy`). Device-to-device copies must stay on one vcore.
    pub fn copy_from(
        &self,
        src: &Tensor,
        src_offset: u64,
        dst_offset: u64,
        size: u64,
    ) -> Result<()> {
        let rt = self.rt()?;
        if src.placement().is_device() && self.placement().is_device() && src.vnc() != self.vnc() {
            return Err(NrtError::invalid(format!(
                "cannot copy between device tensors on different NeuronCores ('{}' on {}, '{}' on {})",
                src.name(),
                src.vnc(),
                self.name(),
                self.vnc()
            )));
        }
        src.wait_idle(&rt);
        self.wait_idle(&rt);
        let (s, n) = src.range(src_offset, size, "copy source")?;
        let (d, _) = self.range(dst_offset, size, "copy destination")?;
        // SAFETY: both ranges are inside their tensors (checked); they may overlap when the
        // two tensors alias (slices), which `copy` allows.
        unsafe { core::ptr::copy(s, d, n) };
        Ok(())
    }

    /// Waits until the output has been reported final `expected` times by streaming
    /// notifications (`nrt_tensor_check_output_completion`). `None` waits forever;
    /// `NRT_TIMEOUT` if the count is not reached in time.
    pub fn check_output_completion(&self, timeout: Option<Duration>, expected: u64) -> Result<()> {
        let reached = if in_async_callback() {
            // Nobody else may be harvesting while this worker runs the callback: drive the
            // harvest here instead of sleeping on the condition variable.
            let rt = self.rt()?;
            let deadline = timeout.map(|t| Instant::now() + t);
            let mut backoff = Spin::new();
            loop {
                if self.completion_count() >= expected {
                    break true;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break false;
                }
                if !drive_all(&rt) {
                    backoff.snooze();
                }
            }
        } else {
            self.0.completion.wait(expected, timeout)
        };
        if reached {
            Ok(())
        } else {
            Err(NrtError::new(
                NrtStatus::Timeout,
                format!(
                    "output '{}' reached {} of {expected} completions in time",
                    self.name(),
                    self.completion_count()
                ),
            ))
        }
    }
}
