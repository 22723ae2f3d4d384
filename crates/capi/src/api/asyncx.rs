//! The NRT 3.0 explicit async API (`nrt_async.h`): `nrta_execute_schedule`,
//! `nrta_tensor_read` / `_write` / `_copy`, `nrta_is_completed`, `nrta_get_sequence`,
//! `nrta_event_register_seq_id_completion`, `nrta_event_register_xu_completion`.
//!
//! `*ret` receives the request's final status when it completes (before
//! `nrta_is_completed` reports it); it may be NULL. If scheduling itself fails, the return
//! value is that status and `*ret` receives it too. Tensor operations complete before their
//! schedule call returns (the tensor-op XU runs them inline).

use crate::ffi::{Res, api, ensure_open, in_buf, invalid, nonnull, out_buf, write_out};
use crate::state;
use crate::types::{NrtStatusC, xu};
use nrt_runtime::{SeqId, XuKind};
use std::ffi::{c_int, c_void};

/// Writes the failure status to `ret` (if any) and passes the error on.
#[inline]
fn schedule_result(r: Res<SeqId>, ret: *mut NrtStatusC, seq: *mut u64) -> Res {
    match r {
        Ok(s) => {
            // SAFETY: `seq` was checked non-null; valid by the API contract.
            unsafe { seq.write(s.0) };
            Ok(())
        }
        Err(f) => {
            if !ret.is_null() {
                let st = match &f {
                    crate::ffi::Fail::Err(e) | crate::ffi::Fail::Warn(e) => e.status,
                    crate::ffi::Fail::Logged(s) => *s,
                };
                // SAFETY: non-null; valid for a write by the API contract.
                unsafe { ret.write(st.as_i32()) };
            }
            Err(f)
        }
    }
}

fn xu_kind(v: u32, arg: &str) -> Res<XuKind> {
    XuKind::from_u32(v).ok_or_else(|| {
        invalid(format!(
            "invalid argument: {arg} {v} is not an nrta_xu_t (0..{})",
            xu::TYPE_NUM
        ))
    })
}

fn lnc(v: c_int, arg: &str) -> Res<u32> {
    u32::try_from(v).map_err(|_| invalid(format!("invalid argument: {arg} {v} is negative")))
}

/// `NRT_STATUS nrta_execute_schedule(nrt_model_t *model, const nrt_tensor_set_t *input,
/// nrt_tensor_set_t *output, int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence)`:
/// queues an execution on the model's compute XU (`queue` must be 0) and returns at once.
/// `NRT_QUEUE_FULL` when the XU has no room: wait for a completion and retry.
///
/// # Safety
/// `ret` NULL or valid for a write until the execution completes; `req_sequence` valid for
/// a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_execute_schedule(
    model: *mut c_void,
    input: *const c_void,
    output: *mut c_void,
    queue: c_int,
    ret: *mut NrtStatusC,
    req_sequence: *mut u64,
) -> NrtStatusC {
    api("nrta_execute_schedule", || {
        crate::api_in!(
            "nrta_execute_schedule",
            "model={model:p}, input={input:p}, output={output:p}, queue={queue}, ret={ret:p}"
        );
        nonnull(req_sequence, "req_sequence")?;
        let r = super::exec::with_model_sets(model, input, output, |m, i, o| {
            // SAFETY: the caller keeps `ret` valid until completion (API contract).
            Ok(unsafe {
                m.rt.execute_schedule_raw(&m.model, &i.set, &o.set, queue, ret)
            }?)
        });
        schedule_result(r, ret, req_sequence)
    })
}

/// `NRT_STATUS nrta_tensor_read(void *buf, nrt_tensor_t *tensor, uint64_t offset, uint64_t
/// size, int lnc_idx, int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence)`.
///
/// # Safety
/// `buf` valid for writes of `size` bytes; `ret` NULL or valid; `req_sequence` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_read(
    buf: *mut c_void,
    tensor: *mut c_void,
    offset: u64,
    size: u64,
    lnc_idx: c_int,
    queue: c_int,
    ret: *mut NrtStatusC,
    req_sequence: *mut u64,
) -> NrtStatusC {
    api("nrta_tensor_read", || {
        crate::api_in!(
            "nrta_tensor_read",
            "buf={buf:p}, tensor={tensor:p}, offset={offset}, size={size}, lnc_idx={lnc_idx}, queue={queue}"
        );
        nonnull(req_sequence, "req_sequence")?;
        let r = (|| {
            let t = super::tensor::tensor_for_io(tensor, "tensor")?;
            let v = lnc(lnc_idx, "lnc_idx")?;
            // SAFETY: the caller's contract on `buf`.
            let b = unsafe { out_buf(buf, size, "buf")? };
            let rt = state::runtime()?;
            // SAFETY: `ret` NULL or valid (caller's contract); written before we return.
            Ok(unsafe { rt.rt.tensor_read_schedule(&t, b, offset, v, queue, ret) }?)
        })();
        schedule_result(r, ret, req_sequence)
    })
}

/// `NRT_STATUS nrta_tensor_write(nrt_tensor_t *tensor, const void *buf, uint64_t offset,
/// uint64_t size, int lnc_idx, int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence)`.
///
/// # Safety
/// `buf` valid for reads of `size` bytes; `ret` NULL or valid; `req_sequence` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_write(
    tensor: *mut c_void,
    buf: *const c_void,
    offset: u64,
    size: u64,
    lnc_idx: c_int,
    queue: c_int,
    ret: *mut NrtStatusC,
    req_sequence: *mut u64,
) -> NrtStatusC {
    api("nrta_tensor_write", || {
        crate::api_in!(
            "nrta_tensor_write",
            "tensor={tensor:p}, buf={buf:p}, offset={offset}, size={size}, lnc_idx={lnc_idx}, queue={queue}"
        );
        nonnull(req_sequence, "req_sequence")?;
        let r = (|| {
            let t = super::tensor::tensor_for_io(tensor, "tensor")?;
            let v = lnc(lnc_idx, "lnc_idx")?;
            // SAFETY: the caller's contract on `buf`.
            let b = unsafe { in_buf(buf, size, "buf")? };
            let rt = state::runtime()?;
            // SAFETY: `ret` NULL or valid (caller's contract).
            Ok(unsafe { rt.rt.tensor_write_schedule(&t, b, offset, v, queue, ret) }?)
        })();
        schedule_result(r, ret, req_sequence)
    })
}

/// `NRT_STATUS nrta_tensor_copy(nrt_tensor_t *src, uint64_t src_offset, nrt_tensor_t *dst,
/// uint64_t dst_offset, uint64_t size, int lnc_idx, int queue, NRT_STATUS *ret, nrta_seq_t
/// *req_sequence)`.
///
/// # Safety
/// `ret` NULL or valid; `req_sequence` valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_tensor_copy(
    src: *mut c_void,
    src_offset: u64,
    dst: *mut c_void,
    dst_offset: u64,
    size: u64,
    lnc_idx: c_int,
    queue: c_int,
    ret: *mut NrtStatusC,
    req_sequence: *mut u64,
) -> NrtStatusC {
    api("nrta_tensor_copy", || {
        crate::api_in!(
            "nrta_tensor_copy",
            "src={src:p}, src_offset={src_offset}, dst={dst:p}, dst_offset={dst_offset}, size={size}, lnc_idx={lnc_idx}, queue={queue}"
        );
        nonnull(req_sequence, "req_sequence")?;
        let r = (|| {
            let s = super::tensor::tensor_for_io(src, "src")?;
            let d = super::tensor::tensor_for_io(dst, "dst")?;
            let v = lnc(lnc_idx, "lnc_idx")?;
            let rt = state::runtime()?;
            // SAFETY: `ret` NULL or valid (caller's contract).
            Ok(unsafe {
                rt.rt
                    .tensor_copy_schedule(&s, src_offset, &d, dst_offset, size, v, queue, ret)
            }?)
        })();
        schedule_result(r, ret, req_sequence)
    })
}

/// `NRT_STATUS nrta_is_completed(nrta_seq_t seq, bool *is_completed)`: `NRT_INVALID` for a
/// sequence that was never issued; a pending one gives `false`.
///
/// # Safety
/// `is_completed` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_is_completed(seq: u64, is_completed: *mut bool) -> NrtStatusC {
    api("nrta_is_completed", || {
        crate::api_in!("nrta_is_completed", "seq={seq:#x}");
        nonnull(is_completed, "is_completed")?;
        let rt = state::runtime()?;
        let done = rt.rt.is_completed(SeqId(seq))?;
        // SAFETY: checked non-null; valid by contract.
        unsafe { is_completed.write(done) };
        Ok(())
    })
}

/// `NRT_STATUS nrta_get_sequence(uint32_t lnc, nrta_xu_t xu, int queue, nrta_seq_t *seq)`:
/// the last completed sequence of that execution unit (sequence number 0 if none yet).
///
/// # Safety
/// `seq` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrta_get_sequence(
    lnc: u32,
    xu: u32,
    queue: c_int,
    seq: *mut u64,
) -> NrtStatusC {
    api("nrta_get_sequence", || {
        crate::api_in!("nrta_get_sequence", "lnc={lnc}, xu={xu}, queue={queue}");
        nonnull(seq, "seq")?;
        let kind = xu_kind(xu, "xu")?;
        let rt = state::runtime()?;
        let s = rt.rt.get_sequence(lnc, kind, queue)?;
        // SAFETY: checked non-null; valid by contract.
        unsafe { write_out(seq, s.0, "seq") }
    })
}

/// `NRT_STATUS nrta_event_register_seq_id_completion(nrta_seq_t seq, int efd)`: the eventfd
/// `efd` is signalled (written 1) when `seq` completes — at once if it already has. `efd =
/// -1` deregisters. The caller owns (and closes) the eventfd.
#[unsafe(no_mangle)]
pub extern "C" fn nrta_event_register_seq_id_completion(seq: u64, efd: c_int) -> NrtStatusC {
    api("nrta_event_register_seq_id_completion", || {
        crate::api_in!(
            "nrta_event_register_seq_id_completion",
            "seq={seq:#x}, efd={efd}"
        );
        check_efd(efd)?;
        let rt = state::runtime()?;
        rt.rt.register_seq_eventfd(SeqId(seq), efd)?;
        Ok(())
    })
}

/// `NRT_STATUS nrta_event_register_xu_completion(int lnc, nrta_xu_t xu, int queue, int
/// efd)`: `efd` is signalled on every completion of that execution unit; drain it, then
/// ask `nrta_get_sequence`. `efd = -1` deregisters.
#[unsafe(no_mangle)]
pub extern "C" fn nrta_event_register_xu_completion(
    lnc: c_int,
    xu: u32,
    queue: c_int,
    efd: c_int,
) -> NrtStatusC {
    api("nrta_event_register_xu_completion", || {
        crate::api_in!(
            "nrta_event_register_xu_completion",
            "lnc={lnc}, xu={xu}, queue={queue}, efd={efd}"
        );
        check_efd(efd)?;
        let v = self::lnc(lnc, "lnc")?;
        let kind = xu_kind(xu, "xu")?;
        let rt = state::runtime()?;
        rt.rt.register_xu_eventfd(v, kind, queue, efd)?;
        Ok(())
    })
}

fn check_efd(efd: c_int) -> Res {
    if efd < -1 {
        return Err(invalid(format!(
            "invalid argument: efd {efd} (an eventfd, or -1 to deregister)"
        )));
    }
    ensure_open()
}
