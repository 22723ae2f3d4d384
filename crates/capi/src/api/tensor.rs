//! Tensors: `nrt_tensor_allocate` / `_free` / `_read` / `_write` / `_copy` / `_memset` /
//! `_get_size` / `_allocate_empty` / `_attach_buffer` / `_allocate_slice` / `_get_va` /
//! `_read_batch` / `_write_batch` / `_check_output_completion` /
//! `_reset_output_completion`, `nrt_tensor_get_device_allocation_info`.
//!
//! A freed tensor's memory lives on while a tensor set (or an execution in flight) still
//! holds it: sets keep their own reference, so a set never points at freed memory.

use crate::ffi::{
    Fail, Res, api, api_value, cstr_or_empty, ensure_open, in_buf, invalid, nonnull, out_buf, pin,
    refused, write_out,
};
use crate::handle::Pin;
use crate::state::{self, TENSORS, TensorEntry};
use crate::types::{NrtStatusC, NrtTensorBatch, NrtTensorDeviceAllocationInfo};
use nrt_runtime::log::{Level, Module};
use nrt_runtime::{Placement, nrt_log};
use std::ffi::{c_char, c_int, c_void};
use std::time::Duration;

/// Pins a live tensor of the open runtime.
#[inline]
pub(crate) fn tensor(p: *const c_void, arg: &str) -> Res<Pin<'static, TensorEntry>> {
    ensure_open()?;
    let t = pin(&TENSORS, p, arg)?;
    state::check_tensor_epoch(&t, arg)?;
    Ok(t)
}

/// The tensor behind handle `p`, for I/O: the handle is pinned only to take a reference.
/// Reads, writes, fills and copies may wait for pending implicit executions, which only the
/// XU worker retires; holding the handle's gate meanwhile would make a free from inside the
/// async callback wait for this thread while this thread waits for the callback's worker.
/// The reference keeps the storage alive, so an I/O racing with a free of its handle stays
/// memory-safe (it reads or writes the storage the handle had).
pub(crate) fn tensor_for_io(p: *const c_void, arg: &str) -> Res<nrt_runtime::Tensor> {
    Ok(tensor(p, arg)?.tensor.clone())
}

fn new_handle(t: nrt_runtime::Tensor, epoch: u64, out: *mut *mut c_void) -> Res {
    let h = TENSORS.insert(TensorEntry { tensor: t, epoch });
    // SAFETY: `out` was checked non-null by the caller of this helper and is a valid
    // `nrt_tensor_t **` by the API contract.
    unsafe { out.write(h) };
    Ok(())
}

/// `NRT_STATUS nrt_tensor_allocate(nrt_tensor_placement_t tensor_placement, int vnc, size_t
/// size, const char *name, nrt_tensor_t **tensor)`: a zero-filled tensor. `name` may be
/// NULL. DEVICE tensors live on logical core `vnc`; HOST and VIRTUAL are host memory.
///
/// # Safety
/// `name` NULL or NUL-terminated; `tensor` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate(
    tensor_placement: u32,
    vnc: c_int,
    size: usize,
    name: *const c_char,
    tensor: *mut *mut c_void,
) -> NrtStatusC {
    api("nrt_tensor_allocate", || {
        // SAFETY: the caller's contract on `name`.
        let n = unsafe { cstr_or_empty(name, "name")? };
        crate::api_in!(
            "nrt_tensor_allocate",
            "placement={tensor_placement}, vnc={vnc}, size={size}, name={n:?}"
        );
        nonnull(tensor, "tensor")?;
        let placement = Placement::from_u32(tensor_placement).ok_or_else(|| {
            invalid(format!(
                "invalid argument: tensor_placement {tensor_placement} is not an nrt_tensor_placement_t"
            ))
        })?;
        let rt = state::runtime()?;
        let t = rt.rt.allocate_tensor(placement, vnc, size as u64, n)?;
        new_handle(t, rt.epoch, tensor)
    })
}

/// `void nrt_tensor_free(nrt_tensor_t **tensor)`: frees the tensor and sets `*tensor` to
/// NULL. `*tensor == NULL` is a no-op; a stale pointer is logged and nulled. Works after
/// `nrt_close` (to release host memory).
///
/// # Safety
/// `tensor` must be NULL or valid for a read and a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_free(tensor: *mut *mut c_void) {
    api("nrt_tensor_free", || {
        nonnull(tensor, "tensor")?;
        // SAFETY: non-null; a valid `nrt_tensor_t **` by contract.
        let p = unsafe { tensor.read() };
        crate::api_in!("nrt_tensor_free", "tensor={p:p}");
        if p.is_null() {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { tensor.write(core::ptr::null_mut()) };
        let x = TENSORS
            .take(p)
            .map_err(|r| refused(TENSORS.kind(), p, "*tensor", r))?;
        drop(x);
        Ok(())
    });
}

/// `NRT_STATUS nrt_tensor_read(const nrt_tensor_t *tensor, void *buf, size_t offset, size_t
/// size)`.
///
/// # Safety
/// `buf` must be valid for writes of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_read(
    tensor: *const c_void,
    buf: *mut c_void,
    offset: usize,
    size: usize,
) -> NrtStatusC {
    api("nrt_tensor_read", || {
        crate::api_in!(
            "nrt_tensor_read",
            "tensor={tensor:p}, buf={buf:p}, offset={offset}, size={size}"
        );
        let t = tensor_for_io(tensor, "tensor")?;
        // SAFETY: the caller's contract on `buf`.
        let b = unsafe { out_buf(buf, size as u64, "buf")? };
        t.read(b, offset as u64)?;
        Ok(())
    })
}

/// `NRT_STATUS nrt_tensor_write(nrt_tensor_t *tensor, const void *buf, size_t offset, size_t
/// size)`.
///
/// # Safety
/// `buf` must be valid for reads of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_write(
    tensor: *mut c_void,
    buf: *const c_void,
    offset: usize,
    size: usize,
) -> NrtStatusC {
    api("nrt_tensor_write", || {
        crate::api_in!(
            "nrt_tensor_write",
            "tensor={tensor:p}, buf={buf:p}, offset={offset}, size={size}"
        );
        let t = tensor_for_io(tensor, "tensor")?;
        // SAFETY: the caller's contract on `buf`.
        let b = unsafe { in_buf(buf, size as u64, "buf")? };
        t.write(b, offset as u64)?;
        Ok(())
    })
}

/// # Safety
/// `batches` valid for `num_batches` entries, each with `num_ops` valid ops whose buffers
/// are valid for their sizes.
unsafe fn batch(batches: *const NrtTensorBatch, num_batches: u64, read: bool) -> Res {
    if num_batches == 0 {
        return Ok(());
    }
    nonnull(batches, "batches")?;
    ensure_open()?;
    for i in 0..num_batches as usize {
        // SAFETY: `i` < num_batches (caller's contract on the array).
        let b = unsafe { batches.add(i).read() };
        let arg = format!("batches[{i}].tensor");
        let t = tensor_for_io(b.tensor, &arg)?;
        if b.num_ops > 0 {
            nonnull(b.ops, &format!("batches[{i}].ops"))?;
        }
        for j in 0..b.num_ops as usize {
            // SAFETY: `j` < num_ops (caller's contract).
            let op = unsafe { b.ops.add(j).read() };
            let arg = format!("batches[{i}].ops[{j}].buffer");
            if read {
                // SAFETY: the caller's contract on the op's buffer.
                let buf = unsafe { out_buf(op.buffer, op.size, &arg)? };
                t.read(buf, op.offset)?;
            } else {
                // SAFETY: as above.
                let buf = unsafe { in_buf(op.buffer, op.size, &arg)? };
                t.write(buf, op.offset)?;
            }
        }
    }
    Ok(())
}

/// `NRT_STATUS nrt_tensor_read_batch(const nrt_tensor_batch_t *batches, uint64_t
/// num_batches, bool unsafe)`: every op of every batch, in order; stops at the first
/// failure. `unsafe` (skip synchronization) is accepted and changes nothing.
///
/// # Safety
/// See [`NrtTensorBatch`]: every array and buffer must be valid for its stated size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_read_batch(
    batches: *const NrtTensorBatch,
    num_batches: u64,
    unsafe_mode: bool,
) -> NrtStatusC {
    api("nrt_tensor_read_batch", || {
        crate::api_in!(
            "nrt_tensor_read_batch",
            "batches={batches:p}, num_batches={num_batches}, unsafe={unsafe_mode}"
        );
        // SAFETY: the caller's contract.
        unsafe { batch(batches, num_batches, true) }
    })
}

/// `NRT_STATUS nrt_tensor_write_batch(const nrt_tensor_batch_t *batches, uint64_t
/// num_batches, bool unsafe)`.
///
/// # Safety
/// As [`nrt_tensor_read_batch`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_write_batch(
    batches: *const NrtTensorBatch,
    num_batches: u64,
    unsafe_mode: bool,
) -> NrtStatusC {
    api("nrt_tensor_write_batch", || {
        crate::api_in!(
            "nrt_tensor_write_batch",
            "batches={batches:p}, num_batches={num_batches}, unsafe={unsafe_mode}"
        );
        // SAFETY: the caller's contract.
        unsafe { batch(batches, num_batches, false) }
    })
}

/// `NRT_STATUS nrt_tensor_copy(const nrt_tensor_t *src, size_t src_offset, nrt_tensor_t
/// *dst, size_t dst_offset, size_t size)`: device tensors must share a logical core.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_tensor_copy(
    src: *const c_void,
    src_offset: usize,
    dst: *mut c_void,
    dst_offset: usize,
    size: usize,
) -> NrtStatusC {
    api("nrt_tensor_copy", || {
        crate::api_in!(
            "nrt_tensor_copy",
            "src={src:p}, src_offset={src_offset}, dst={dst:p}, dst_offset={dst_offset}, size={size}"
        );
        let s = tensor_for_io(src, "src")?;
        let d = tensor_for_io(dst, "dst")?;
        d.copy_from(&s, src_offset as u64, dst_offset as u64, size as u64)?;
        Ok(())
    })
}

/// `size_t nrt_tensor_get_size(const nrt_tensor_t *tensor)`: 0 (logged) for an invalid
/// handle.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_tensor_get_size(tensor: *const c_void) -> usize {
    api_value("nrt_tensor_get_size", 0, || {
        crate::api_in!("nrt_tensor_get_size", "tensor={tensor:p}");
        let t = self::tensor(tensor, "tensor")?;
        Ok(t.tensor.size() as usize)
    })
}

/// `NRT_STATUS nrt_tensor_memset(nrt_tensor_t *tensor, uint64_t offset, int value, size_t
/// size)`: `value` is converted to `unsigned char`, as `memset` does.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_tensor_memset(
    tensor: *mut c_void,
    offset: u64,
    value: c_int,
    size: usize,
) -> NrtStatusC {
    api("nrt_tensor_memset", || {
        crate::api_in!(
            "nrt_tensor_memset",
            "tensor={tensor:p}, offset={offset}, value={value}, size={size}"
        );
        let t = tensor_for_io(tensor, "tensor")?;
        t.memset(offset, value as u8, size as u64)?;
        Ok(())
    })
}

/// `NRT_STATUS nrt_tensor_allocate_empty(const char *name, nrt_tensor_t **tensor)`: a host
/// tensor without storage; give it some with `nrt_tensor_attach_buffer`.
///
/// # Safety
/// `name` NULL or NUL-terminated; `tensor` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate_empty(
    name: *const c_char,
    tensor: *mut *mut c_void,
) -> NrtStatusC {
    api("nrt_tensor_allocate_empty", || {
        // SAFETY: the caller's contract on `name`.
        let n = unsafe { cstr_or_empty(name, "name")? };
        crate::api_in!("nrt_tensor_allocate_empty", "name={n:?}");
        nonnull(tensor, "tensor")?;
        let rt = state::runtime()?;
        let t = rt.rt.allocate_empty_tensor(n)?;
        new_handle(t, rt.epoch, tensor)
    })
}

/// `NRT_STATUS nrt_tensor_attach_buffer(nrt_tensor_t *tensor, void *buffer, size_t size)`:
/// the tensor (from `nrt_tensor_allocate_empty`) uses the caller's buffer, which must stay
/// valid until the tensor is freed or another buffer is attached.
///
/// # Safety
/// `buffer` valid for reads and writes of `size` bytes for the tensor's lifetime.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_attach_buffer(
    tensor: *mut c_void,
    buffer: *mut c_void,
    size: usize,
) -> NrtStatusC {
    api("nrt_tensor_attach_buffer", || {
        crate::api_in!(
            "nrt_tensor_attach_buffer",
            "tensor={tensor:p}, buffer={buffer:p}, size={size}"
        );
        let t = self::tensor(tensor, "tensor")?;
        if size > 0 {
            nonnull(buffer, "buffer")?;
        }
        // SAFETY: the caller's contract on `buffer`, forwarded.
        unsafe { t.tensor.attach_buffer(buffer.cast(), size)? };
        Ok(())
    })
}

/// `NRT_STATUS nrt_tensor_allocate_slice(const nrt_tensor_t *tensor_source, size_t offset,
/// size_t size, const char *name, nrt_tensor_t **tensor_slice)`: a tensor viewing `size`
/// bytes of the source at `offset` (it keeps the source's memory alive).
///
/// # Safety
/// `name` NULL or NUL-terminated; `tensor_slice` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_allocate_slice(
    tensor_source: *const c_void,
    offset: usize,
    size: usize,
    name: *const c_char,
    tensor_slice: *mut *mut c_void,
) -> NrtStatusC {
    api("nrt_tensor_allocate_slice", || {
        // SAFETY: the caller's contract on `name`.
        let n = unsafe { cstr_or_empty(name, "name")? };
        crate::api_in!(
            "nrt_tensor_allocate_slice",
            "tensor_source={tensor_source:p}, offset={offset}, size={size}, name={n:?}"
        );
        nonnull(tensor_slice, "tensor_slice")?;
        let src = tensor(tensor_source, "tensor_source")?;
        let s = src.tensor.slice(offset as u64, size as u64, n)?;
        new_handle(s, src.epoch, tensor_slice)
    })
}

/// `void *nrt_tensor_get_va(const nrt_tensor_t *tensor)`: the host address of the bytes
/// (device memory of the software NeuronCore is host-mapped); NULL (logged) for an invalid
/// handle, NULL for an empty tensor.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_tensor_get_va(tensor: *const c_void) -> *mut c_void {
    api_value("nrt_tensor_get_va", core::ptr::null_mut(), || {
        crate::api_in!("nrt_tensor_get_va", "tensor={tensor:p}");
        let t = self::tensor(tensor, "tensor")?;
        Ok(t.tensor.host_ptr().cast())
    })
}

/// `NRT_STATUS nrt_memcpy_to_device(void *dest, const void *src, size_t size)`: copies
/// `size` host bytes to device memory at `dest`, an address inside a live DEVICE tensor (from
/// `nrt_tensor_get_va`, plus an offset). `NRT_INVALID` names the address if no device
/// tensor holds the whole range.
///
/// # Safety
/// `src` must be valid for reads of `size` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_memcpy_to_device(
    dest: *mut c_void,
    src: *const c_void,
    size: usize,
) -> NrtStatusC {
    api("nrt_memcpy_to_device", || {
        crate::api_in!(
            "nrt_memcpy_to_device",
            "dest={dest:p}, src={src:p}, size={size}"
        );
        ensure_open()?;
        nonnull(dest, "dest")?;
        if size == 0 {
            return Ok(());
        }
        nonnull(src, "src")?;
        let start = dest as usize;
        let end = start.checked_add(size).ok_or_else(|| {
            invalid(format!(
                "invalid argument: dest {dest:p} + size {size} overflows"
            ))
        })?;
        let epoch = state::epoch();
        let holder = TENSORS.find_live(|t| {
            let base = t.tensor.host_ptr() as usize;
            t.epoch == epoch
                && t.tensor.placement() == Placement::Device
                && base != 0
                && base <= start
                && end <= base + t.tensor.size() as usize
        });
        let Some(t) = holder else {
            return Err(invalid(format!(
                "invalid argument: dest {dest:p}..+{size} is not inside a device tensor of this runtime (nrt_tensor_get_va of a DEVICE tensor gives one)"
            )));
        };
        // SAFETY: readable for `size` bytes (caller's contract).
        let bytes = unsafe { in_buf(src, size as u64, "src")? };
        // Write through a reference, not the pinned handle (see `tensor_for_io`).
        let t = {
            let pinned = t;
            pinned.tensor.clone()
        };
        let offset = (start - t.host_ptr() as usize) as u64;
        t.write(bytes, offset).map_err(Fail::from)
    })
}

/// `NRT_STATUS nrt_tensor_get_device_allocation_info(const nrt_tensor_t *tensor,
/// nrt_tensor_device_allocation_info_t *alloc_info)`: device tensors only (`NRT_INVALID`
/// for host tensors). `hbm_index` is 0: the software device has one memory.
///
/// # Safety
/// `alloc_info` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_tensor_get_device_allocation_info(
    tensor: *const c_void,
    alloc_info: *mut NrtTensorDeviceAllocationInfo,
) -> NrtStatusC {
    api("nrt_tensor_get_device_allocation_info", || {
        crate::api_in!(
            "nrt_tensor_get_device_allocation_info",
            "tensor={tensor:p}, alloc_info={alloc_info:p}"
        );
        nonnull(alloc_info, "alloc_info")?;
        let t = self::tensor(tensor, "tensor")?;
        let addr = t.tensor.device_address().ok_or_else(|| {
            invalid(format!(
                "tensor '{}' is not a device tensor",
                t.tensor.name()
            ))
        })?;
        let v = NrtTensorDeviceAllocationInfo {
            physical_address: addr,
            size: t.tensor.size() as usize,
            hbm_index: 0,
        };
        // SAFETY: checked non-null; valid by the caller's contract.
        unsafe { write_out(alloc_info, v, "alloc_info") }
    })
}

/// `NRT_STATUS nrt_tensor_check_output_completion(const nrt_tensor_t *output_tensor,
/// int64_t timeout, uint64_t expected_completion_count)`: waits (timeout in microseconds,
/// negative = no limit) until the output was reported final that many times;
/// `NRT_TIMEOUT` if not in time.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_tensor_check_output_completion(
    output_tensor: *const c_void,
    timeout: i64,
    expected_completion_count: u64,
) -> NrtStatusC {
    api("nrt_tensor_check_output_completion", || {
        crate::api_in!(
            "nrt_tensor_check_output_completion",
            "output_tensor={output_tensor:p}, timeout={timeout}, expected_completion_count={expected_completion_count}"
        );
        let t = tensor_for_io(output_tensor, "output_tensor")?;
        let limit = u64::try_from(timeout).ok().map(Duration::from_micros);
        t.check_output_completion(limit, expected_completion_count)
            .map_err(|e| {
                // A timeout is an answer, not an error of the library.
                nrt_log!(
                    Module::Nrt,
                    Level::Debug,
                    "nrt_tensor_check_output_completion",
                    "{}",
                    e.message
                );
                Fail::Logged(e.status)
            })
    })
}

/// `NRT_STATUS nrt_tensor_reset_output_completion(nrt_tensor_t *output_tensor)`.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_tensor_reset_output_completion(output_tensor: *mut c_void) -> NrtStatusC {
    api("nrt_tensor_reset_output_completion", || {
        crate::api_in!(
            "nrt_tensor_reset_output_completion",
            "output_tensor={output_tensor:p}"
        );
        let t = tensor(output_tensor, "output_tensor")?;
        t.tensor.reset_output_completion();
        Ok(())
    })
}
