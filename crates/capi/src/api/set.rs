//! Tensor sets: `nrt_allocate_tensor_set`, `nrt_destroy_tensor_set`,
//! `nrt_add_tensor_to_tensor_set`, `nrt_get_tensor_from_tensor_set`.
//!
//! A set maps names to tensors. It keeps its own reference to each tensor (freeing a tensor
//! that is still in a set leaves the set's bytes valid) and remembers the handle that was
//! added, which `nrt_get_tensor_from_tensor_set` returns.

use crate::ffi::{Fail, Res, api, cstr, ensure_open, nonnull, pin, refused};
use crate::state::{SETS, SetEntry};
use crate::types::NrtStatusC;
use nrt_runtime::NrtError;
use nrt_runtime::NrtStatus;
use std::ffi::{c_char, c_void};

/// `NRT_STATUS nrt_allocate_tensor_set(nrt_tensor_set_t **result)`.
///
/// # Safety
/// `result` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_allocate_tensor_set(result: *mut *mut c_void) -> NrtStatusC {
    api("nrt_allocate_tensor_set", || {
        crate::api_in!("nrt_allocate_tensor_set", "result={result:p}");
        ensure_open()?;
        nonnull(result, "result")?;
        let h = SETS.insert(SetEntry::new());
        // SAFETY: checked non-null; a valid `nrt_tensor_set_t **` by contract.
        unsafe { result.write(h) };
        Ok(())
    })
}

/// `void nrt_destroy_tensor_set(nrt_tensor_set_t **tensor_set)`: destroys the set (not its
/// tensors) and sets `*tensor_set` to NULL. `*tensor_set == NULL` is a no-op; a stale
/// pointer is logged and nulled. Works after `nrt_close`.
///
/// # Safety
/// `tensor_set` NULL or valid for a read and a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_destroy_tensor_set(tensor_set: *mut *mut c_void) {
    api("nrt_destroy_tensor_set", || {
        nonnull(tensor_set, "tensor_set")?;
        // SAFETY: non-null; a valid `nrt_tensor_set_t **` by contract.
        let p = unsafe { tensor_set.read() };
        crate::api_in!("nrt_destroy_tensor_set", "tensor_set={p:p}");
        if p.is_null() {
            return Ok(());
        }
        // SAFETY: as above.
        unsafe { tensor_set.write(core::ptr::null_mut()) };
        let x = SETS
            .take(p)
            .map_err(|r| refused(SETS.kind(), p, "*tensor_set", r))?;
        drop(x);
        Ok(())
    });
}

/// `NRT_STATUS nrt_add_tensor_to_tensor_set(nrt_tensor_set_t *tensor_set, const char
/// *tensor_name, nrt_tensor_t *tensor)`: adds, or replaces the tensor of that name. The
/// name need not match the tensor's own name.
///
/// # Safety
/// `tensor_name` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_add_tensor_to_tensor_set(
    tensor_set: *mut c_void,
    tensor_name: *const c_char,
    tensor: *mut c_void,
) -> NrtStatusC {
    api("nrt_add_tensor_to_tensor_set", || {
        // SAFETY: the caller's contract on `tensor_name`.
        let name = unsafe { cstr(tensor_name, "tensor_name")? };
        crate::api_in!(
            "nrt_add_tensor_to_tensor_set",
            "tensor_set={tensor_set:p}, tensor_name={name:?}, tensor={tensor:p}"
        );
        let t = super::tensor::tensor(tensor, "tensor")?;
        nonnull(tensor_set, "tensor_set")?;
        let mut s = SETS
            .pin_exclusive(tensor_set)
            .map_err(|r| refused(SETS.kind(), tensor_set, "tensor_set", r))?;
        s.add(name, tensor as usize, &t);
        Ok(())
    })
}

/// `NRT_STATUS nrt_get_tensor_from_tensor_set(nrt_tensor_set_t *tensor_set, const char
/// *tensor_name, nrt_tensor_t **tensor)`: the handle added under that name. If the name is
/// absent: `NRT_FAILURE`, and `*tensor` is not written. Works after `nrt_close` too (so
/// cleanup code can find the tensors it has to free).
///
/// # Safety
/// `tensor_name` NULL or NUL-terminated; `tensor` valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_get_tensor_from_tensor_set(
    tensor_set: *mut c_void,
    tensor_name: *const c_char,
    tensor: *mut *mut c_void,
) -> NrtStatusC {
    api("nrt_get_tensor_from_tensor_set", || {
        // SAFETY: the caller's contract on `tensor_name`.
        let name = unsafe { cstr(tensor_name, "tensor_name")? };
        crate::api_in!(
            "nrt_get_tensor_from_tensor_set",
            "tensor_set={tensor_set:p}, tensor_name={name:?}"
        );
        // Also after nrt_close: cleanup code looks tensors up to free them.
        crate::state::ensure_initialized_once()?;
        nonnull(tensor, "tensor")?;
        let s = pin(&SETS, tensor_set, "tensor_set")?;
        let Some(&(h, _)) = s.handles.get(name) else {
            return Err(Fail::Warn(NrtError::new(
                NrtStatus::Failure,
                format!("no tensor named '{name}' in tensor_set ({tensor_set:p})"),
            )));
        };
        // SAFETY: checked non-null; a valid `nrt_tensor_t **` by contract.
        unsafe { tensor.write(h as *mut c_void) };
        Ok(())
    })
}

/// Pins a set for an execution.
#[inline]
pub(crate) fn set(p: *const c_void, arg: &str) -> Res<crate::handle::Pin<'static, SetEntry>> {
    pin(&SETS, p, arg)
}
