//! Models: `nrt_load`, `nrt_load_collectives`, `nrt_unload`, `nrt_get_model_vnc_count`,
//! `nrt_get_model_tensor_info` / `nrt_free_model_tensor_info`, `nrt_get_model_info`.
//!
//! `nrt_load` takes the bytes of a compiled model in our NCM container (where libnrt takes
//! a NEFF); `nrt-cli compile model.onnx -o model.ncm` produces one.

use crate::ffi::{
    Fail, Res, api, ensure_open, in_buf, invalid, nonnull, pin, refused, write_out,
    write_struct_prefix,
};
use crate::state::{self, MODELS, ModelEntry};
use crate::types::{NrtModelInfo, NrtStatusC, NrtTensorInfo, NrtTensorInfoArray, copy_cstr};
use nrt_runtime::{LoadOptions, NrtError, NrtStatus};
use std::ffi::c_void;
use std::sync::Mutex;

/// `NRT_STATUS nrt_load(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count,
/// nrt_model_t **model)`: loads a compiled model (NCM bytes) on logical core `vnc` (`-1`:
/// the least loaded). `vnc_count` is deprecated: pass -1 (1 is accepted too).
///
/// # Safety
/// `neff_bytes` must be valid for reads of `size` bytes; `model` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_load(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    model: *mut *mut c_void,
) -> NrtStatusC {
    api("nrt_load", || {
        crate::api_in!(
            "nrt_load",
            "neff_bytes={neff_bytes:p}, size={size}, vnc={vnc}, vnc_count={vnc_count}"
        );
        // SAFETY: the caller's contract.
        unsafe { load(neff_bytes, size, vnc, vnc_count, model) }
    })
}

/// # Safety
/// As [`nrt_load`].
unsafe fn load(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    model: *mut *mut c_void,
) -> Res {
    nonnull(neff_bytes, "neff_bytes")?;
    nonnull(model, "model")?;
    if size == 0 {
        return Err(invalid("invalid argument: size is 0"));
    }
    if vnc_count != -1 && vnc_count != 1 {
        return Err(invalid(format!(
            "invalid argument: vnc_count {vnc_count} (deprecated; pass -1 — models are not replicated)"
        )));
    }
    let rt = state::runtime()?;
    let visible = rt.rt.vnc_count() as i32;
    if vnc < -1 || vnc >= visible {
        return Err(Fail::Err(NrtError::new(
            NrtStatus::LoadNotEnoughNc,
            format!(
                "invalid argument: vnc {vnc} (this process has {visible} logical NeuronCore(s); -1 picks one)"
            ),
        )));
    }
    // SAFETY: readable for `size` bytes (caller's contract).
    let bytes = unsafe { in_buf(neff_bytes, size as u64, "neff_bytes")? };
    // The runtime logs its load errors itself, naming the culprit.
    let m = rt
        .rt
        .load(bytes, vnc, &LoadOptions::default())
        .map_err(|e| Fail::Logged(e.status))?;
    let h = MODELS.insert(ModelEntry {
        model: m,
        rt: rt.rt.clone(),
        epoch: rt.epoch,
    });
    // SAFETY: checked non-null; the caller passes a valid `nrt_model_t **`.
    unsafe { write_out(model, h, "model") }
}

/// `NRT_STATUS nrt_load_collectives(const void *neff_bytes, size_t size, int32_t vnc,
/// int32_t vnc_count, uint32_t ctx_device_id, uint32_t ctx_device_count, nrt_model_t
/// **model)`: collectives are not supported by the software NeuronCore. A single-worker
/// group (`ctx_device_id == 0`, `ctx_device_count == 1`) needs no communication and loads as
/// `nrt_load`; anything else returns `NRT_FAILURE` with a log line.
///
/// # Safety
/// As [`nrt_load`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_load_collectives(
    neff_bytes: *const c_void,
    size: usize,
    vnc: i32,
    vnc_count: i32,
    ctx_device_id: u32,
    ctx_device_count: u32,
    model: *mut *mut c_void,
) -> NrtStatusC {
    api("nrt_load_collectives", || {
        crate::api_in!(
            "nrt_load_collectives",
            "size={size}, vnc={vnc}, vnc_count={vnc_count}, ctx_device_id={ctx_device_id}, ctx_device_count={ctx_device_count}"
        );
        ensure_open()?;
        if ctx_device_count != 1 || ctx_device_id != 0 {
            return Err(Fail::Err(NrtError::new(
                NrtStatus::Failure,
                format!(
                    "collectives are not supported by the software NeuronCore (rank {ctx_device_id} of {ctx_device_count}); only a single-worker group (0 of 1) loads"
                ),
            )));
        }
        // SAFETY: the caller's contract.
        unsafe { load(neff_bytes, size, vnc, vnc_count, model) }
    })
}

/// `NRT_STATUS nrt_unload(nrt_model_t *model)`: waits for the model's executions, frees it.
/// A second unload of the same pointer is `NRT_INVALID` (stale handle).
///
/// # Safety
/// `model` is any pointer value (it is never dereferenced unless it is a live handle).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_unload(model: *mut c_void) -> NrtStatusC {
    api("nrt_unload", || {
        crate::api_in!("nrt_unload", "model={model:p}");
        ensure_open()?;
        nonnull(model, "model")?;
        if nrt_runtime::in_async_callback() {
            // It would wait for executions that only this callback's worker retires.
            return Err(Fail::Err(NrtError::invalid(
                "nrt_unload cannot be called from the async-exec callback: it waits for executions that only this callback's worker completes (call it from another thread)",
            )));
        }
        // Newcomers are refused from here on; executions already inside finish first.
        let entry = MODELS
            .take(model)
            .map_err(|r| refused(MODELS.kind(), model, "model", r))?;
        let r = entry.rt.unload(&entry.model);
        drop(entry);
        r?;
        Ok(())
    })
}

fn model_vnc_count(func: &'static str, model: *const c_void, out: *mut u32) -> NrtStatusC {
    api(func, || {
        crate::api_in!(func, "model={model:p}");
        ensure_open()?;
        let _m = pin(&MODELS, model, "model")?;
        // A model occupies one logical core (of `core_count()` physical cores); models
        // are not replicated.
        // SAFETY: the caller passes a valid `uint32_t *` (checked non-null).
        unsafe { write_out(out, 1, "vnc_count") }
    })
}

/// `NRT_STATUS nrt_get_model_vnc_count(const nrt_model_t *model, uint32_t *vnc_count)`:
/// logical cores the model occupies (always 1: no replication).
///
/// # Safety
/// `vnc_count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_vnc_count(
    model: *const c_void,
    vnc_count: *mut u32,
) -> NrtStatusC {
    model_vnc_count("nrt_get_model_vnc_count", model, vnc_count)
}

/// Deprecated alias of [`nrt_get_model_vnc_count`].
///
/// # Safety
/// As [`nrt_get_model_vnc_count`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_nc_count(
    model: *const c_void,
    vnc_count: *mut u32,
) -> NrtStatusC {
    model_vnc_count("nrt_get_model_nc_count", model, vnc_count)
}

/// `NRT_STATUS nrt_get_model_instance_count(nrt_model_t *model, uint32_t *instance_count)`
/// (deprecated): instances of the model loaded by one `nrt_load` — always 1.
///
/// # Safety
/// `instance_count` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_instance_count(
    model: *const c_void,
    instance_count: *mut u32,
) -> NrtStatusC {
    api("nrt_get_model_instance_count", || {
        crate::api_in!("nrt_get_model_instance_count", "model={model:p}");
        ensure_open()?;
        let _m = pin(&MODELS, model, "model")?;
        // SAFETY: the caller passes a valid `uint32_t *` (checked non-null).
        unsafe { write_out(instance_count, 1, "instance_count") }
    })
}

/// Info arrays handed out and not yet freed (to refuse double or foreign frees).
static INFO_ARRAYS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `NRT_STATUS nrt_get_model_tensor_info(nrt_model_t *model, nrt_tensor_info_array_t
/// **tensor_info)`: one `malloc`ed block (array and shapes); free it with
/// `nrt_free_model_tensor_info`.
///
/// # Safety
/// `tensor_info` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_tensor_info(
    model: *mut c_void,
    tensor_info: *mut *mut NrtTensorInfoArray,
) -> NrtStatusC {
    api("nrt_get_model_tensor_info", || {
        crate::api_in!("nrt_get_model_tensor_info", "model={model:p}");
        ensure_open()?;
        nonnull(tensor_info, "tensor_info")?;
        let m = pin(&MODELS, model, "model")?;
        let infos = m.model.tensor_info();
        let head = std::mem::size_of::<NrtTensorInfoArray>();
        let entry = std::mem::size_of::<NrtTensorInfo>();
        let dims: usize = infos.iter().map(|i| i.shape.len()).sum();
        let total = head + infos.len() * entry + dims * 4;
        // SAFETY: plain malloc; checked for NULL below. The block is freed by
        // `nrt_free_model_tensor_info` with `free`.
        let block = unsafe { libc::malloc(total) }.cast::<u8>();
        if block.is_null() {
            return Err(Fail::Err(NrtError::new(
                NrtStatus::Resource,
                format!("cannot allocate {total} bytes of tensor info"),
            )));
        }
        let arr = block.cast::<NrtTensorInfoArray>();
        // SAFETY: `block` holds `total` bytes, malloc-aligned (≥ 8, enough for every field);
        // the header, the `infos.len()` entries and the shape words lie inside it without
        // overlapping.
        unsafe {
            (*arr).tensor_count = infos.len() as u64;
            let first = block.add(head).cast::<NrtTensorInfo>();
            let mut shape_at = block.add(head + infos.len() * entry).cast::<u32>();
            for (i, info) in infos.iter().enumerate() {
                let mut e = NrtTensorInfo {
                    name: [0; crate::types::NRT_TENSOR_NAME_MAX],
                    usage: info.usage as u32,
                    size: info.size as usize,
                    dtype: info.dtype.nrt_code(),
                    shape: if info.shape.is_empty() {
                        core::ptr::null_mut()
                    } else {
                        shape_at
                    },
                    ndim: info.shape.len() as u32,
                };
                copy_cstr(&mut e.name, &info.name);
                for &d in &info.shape {
                    shape_at.write(d);
                    shape_at = shape_at.add(1);
                }
                first.add(i).write(e);
            }
        }
        INFO_ARRAYS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(block as usize);
        // SAFETY: checked non-null above; the caller passes a valid pointer.
        unsafe { tensor_info.write(arr) };
        Ok(())
    })
}

/// `NRT_STATUS nrt_free_model_tensor_info(nrt_tensor_info_array_t *tensor_info)`: frees an
/// array from `nrt_get_model_tensor_info`. Works after `nrt_close`. A pointer that is not an
/// outstanding array (double free) is `NRT_INVALID` and is not freed.
///
/// # Safety
/// `tensor_info` is any pointer value (only outstanding arrays are freed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_free_model_tensor_info(
    tensor_info: *mut NrtTensorInfoArray,
) -> NrtStatusC {
    api("nrt_free_model_tensor_info", || {
        crate::api_in!("nrt_free_model_tensor_info", "tensor_info={tensor_info:p}");
        nonnull(tensor_info, "tensor_info")?;
        let mut list = INFO_ARRAYS.lock().unwrap_or_else(|e| e.into_inner());
        let Some(i) = list.iter().position(|&p| p == tensor_info as usize) else {
            return Err(invalid(format!(
                "invalid argument: tensor_info ({tensor_info:p}) is not an array from nrt_get_model_tensor_info (already freed?)"
            )));
        };
        list.swap_remove(i);
        // SAFETY: the pointer is an outstanding malloc block of ours (just checked), freed
        // once (removed from the list under the lock).
        unsafe { libc::free(tensor_info.cast()) };
        Ok(())
    })
}

/// `NRT_STATUS nrt_get_model_info(const nrt_model_t *model, nrt_model_info_t *info, size_t
/// info_size_in, size_t *info_size_out)`: writes the first `info_size_in` bytes;
/// `*info_size_out` (optional) receives the bytes written.
///
/// # Safety
/// `info` must be valid for writes of `info_size_in` bytes; `info_size_out` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_model_info(
    model: *const c_void,
    info: *mut NrtModelInfo,
    info_size_in: usize,
    info_size_out: *mut usize,
) -> NrtStatusC {
    api("nrt_get_model_info", || {
        crate::api_in!(
            "nrt_get_model_info",
            "model={model:p}, info={info:p}, info_size_in={info_size_in}"
        );
        ensure_open()?;
        nonnull(info, "info")?;
        let m = pin(&MODELS, model, "model")?;
        let v = NrtModelInfo { vnc: m.model.vnc() };
        // SAFETY: writable for `info_size_in` bytes (caller's contract).
        let n = unsafe { write_struct_prefix(info, &v, info_size_in) };
        if !info_size_out.is_null() {
            // SAFETY: non-null and valid by the caller's contract.
            unsafe { info_size_out.write(n) };
        }
        Ok(())
    })
}
