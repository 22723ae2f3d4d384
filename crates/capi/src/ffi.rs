//! The boundary: every exported function runs its body through [`api`] (or [`api_value`]),
//! which catches panics (mapped to `NRT_FAILURE` with a log line — nothing unwinds into C),
//! logs failures in the public style (`NRT:<function> <message>`), and at DEBUG traces
//! `API:OUT` after the `API:IN` line the body printed. Also: argument checks that name the
//! argument, and handle lookups.

use crate::handle::{Pin, Pool, Refused};
use crate::state;
use crate::types::NrtStatusC;
use nrt_runtime::log::{Level, Module};
use nrt_runtime::{NrtError, NrtStatus, nrt_log};
use std::ffi::{CStr, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Why an entry point failed.
#[derive(Debug)]
pub(crate) enum Fail {
    /// Log at ERROR and return the status.
    Err(NrtError),
    /// Log at WARN and return the status (expected misses such as an absent set entry).
    Warn(NrtError),
    /// Already logged (by the runtime); just return the status.
    Logged(NrtStatus),
}

impl From<NrtError> for Fail {
    fn from(e: NrtError) -> Fail {
        Fail::Err(e)
    }
}

/// What an entry point's body returns.
pub(crate) type Res<T = ()> = Result<T, Fail>;

/// `NRT_INVALID` with a message.
pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
    Fail::Err(NrtError::invalid(msg))
}

/// Runs the body of an entry point that returns `NRT_STATUS`.
#[inline]
pub(crate) fn api(func: &'static str, body: impl FnOnce() -> Res) -> NrtStatusC {
    let st = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NrtStatus::Success,
        Ok(Err(f)) => report(func, f),
        Err(p) => {
            panicked(func, &*p);
            NrtStatus::Failure
        }
    };
    if nrt_runtime::log::enabled(Module::Nrt, Level::Debug) {
        api_out(func, st);
    }
    st.as_i32()
}

/// Runs the body of an entry point that returns a value (`void`, `size_t`, a pointer):
/// failures are logged and `fallback` is returned.
#[inline]
pub(crate) fn api_value<T>(func: &'static str, fallback: T, body: impl FnOnce() -> Res<T>) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(f)) => {
            report(func, f);
            fallback
        }
        Err(p) => {
            panicked(func, &*p);
            fallback
        }
    }
}

#[cold]
fn report(func: &str, f: Fail) -> NrtStatus {
    match f {
        // Back-pressure is an answer, not an error: the caller retries after a completion.
        Fail::Err(e) if e.status == NrtStatus::QueueFull => {
            nrt_log!(
                Module::Nrt,
                Level::Debug,
                func,
                "{} ({})",
                e.message,
                e.status.as_str()
            );
            e.status
        }
        Fail::Err(e) => {
            nrt_log!(
                Module::Nrt,
                Level::Error,
                func,
                "{} ({})",
                e.message,
                e.status.as_str()
            );
            e.status
        }
        Fail::Warn(e) => {
            nrt_log!(
                Module::Nrt,
                Level::Warn,
                func,
                "{} ({})",
                e.message,
                e.status.as_str()
            );
            e.status
        }
        Fail::Logged(s) => s,
    }
}

#[cold]
fn panicked(func: &str, p: &(dyn std::any::Any + Send)) {
    let msg = p
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    // Logged regardless of the level: a panic is a bug in this library.
    nrt_runtime::log::write(
        Module::Nrt,
        Level::Error,
        func,
        format_args!("internal error (panic: {msg}); returning NRT_FAILURE"),
    );
}

#[cold]
fn api_out(func: &str, st: NrtStatus) {
    nrt_log!(Module::Nrt, Level::Debug, func, "API:OUT: {}", st.as_str());
}

/// `true` when API tracing (DEBUG) is on: guard `API:IN` lines with it.
#[inline]
pub(crate) fn tracing() -> bool {
    nrt_runtime::log::enabled(Module::Nrt, Level::Debug)
}

/// `NRT_INVALID` naming `arg` if `p` is NULL.
#[inline]
pub(crate) fn nonnull<T>(p: *const T, arg: &str) -> Res {
    if p.is_null() {
        Err(null_arg(arg))
    } else {
        Ok(())
    }
}

#[cold]
fn null_arg(arg: &str) -> Fail {
    invalid(format!("invalid argument: {arg} is NULL"))
}

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn cstr<'a>(p: *const c_char, arg: &str) -> Res<&'a str> {
    nonnull(p, arg)?;
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| invalid(format!("invalid argument: {arg} is not valid UTF-8")))
}

/// A C string argument that may be NULL (then `""`).
///
/// # Safety
/// As [`cstr`].
pub(crate) unsafe fn cstr_or_empty<'a>(p: *const c_char, arg: &str) -> Res<&'a str> {
    if p.is_null() {
        Ok("")
    } else {
        // SAFETY: forwarded contract.
        unsafe { cstr(p, arg) }
    }
}

/// Pins the handle `p` of `pool` for shared use, naming `arg` if it is not a live handle.
#[inline]
pub(crate) fn pin<T: Send + Sync + 'static>(
    pool: &'static Pool<T>,
    p: *const c_void,
    arg: &str,
) -> Res<Pin<'static, T>> {
    nonnull(p, arg)?;
    pool.pin(p).map_err(|r| refused(pool.kind(), p, arg, r))
}

#[cold]
pub(crate) fn refused(kind: &str, p: *const c_void, arg: &str, r: Refused) -> Fail {
    invalid(match r {
        Refused::Foreign => {
            format!("invalid argument: {arg} ({p:p}) is not an nrt_{kind}_t handle")
        }
        Refused::Dead => format!(
            "invalid argument: {arg} ({p:p}) is a stale nrt_{kind}_t handle (already freed{})",
            if kind == "model" {
                ", unloaded, or unloaded by nrt_close"
            } else {
                ""
            }
        ),
    })
}

/// Checks that the runtime is open (a relaxed-cost atomic load).
#[inline]
pub(crate) fn ensure_open() -> Res {
    if state::is_open() {
        Ok(())
    } else {
        Err(state::phase_error())
    }
}

/// A byte buffer argument as a slice (empty when `size == 0`, whatever `p` is).
///
/// # Safety
/// `p` must be valid for reads of `size` bytes for `'a` (when `size > 0`).
pub(crate) unsafe fn in_buf<'a>(p: *const c_void, size: u64, arg: &str) -> Res<&'a [u8]> {
    if size == 0 {
        return Ok(&[]);
    }
    nonnull(p, arg)?;
    let n = buf_len(size, arg)?;
    // SAFETY: non-null, and valid for `n` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// A writable byte buffer argument as a slice.
///
/// # Safety
/// `p` must be valid for writes of `size` bytes for `'a` and not aliased meanwhile.
pub(crate) unsafe fn out_buf<'a>(p: *mut c_void, size: u64, arg: &str) -> Res<&'a mut [u8]> {
    if size == 0 {
        return Ok(&mut []);
    }
    nonnull(p, arg)?;
    let n = buf_len(size, arg)?;
    // SAFETY: non-null, valid and unaliased for `n` bytes by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) })
}

fn buf_len(size: u64, arg: &str) -> Res<usize> {
    usize::try_from(size)
        .ok()
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(|| {
            invalid(format!(
                "invalid argument: {arg} of {size} bytes is too large"
            ))
        })
}

/// Writes `v` through an out-pointer argument, after checking it.
///
/// # Safety
/// `p` must be NULL or valid for a write of `T`.
#[inline]
pub(crate) unsafe fn write_out<T>(p: *mut T, v: T, arg: &str) -> Res {
    nonnull(p, arg)?;
    // SAFETY: non-null and valid by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Copies the first `min(size_in, size_of::<T>())` bytes of `v` to `dst` — the public
/// runtime's convention for versioned, append-only structs (`nrt_get_version`,
/// `nrt_get_vnc_memory_stats`, …). Returns the bytes written.
///
/// # Safety
/// `dst` must be valid for writes of `size_in` bytes.
pub(crate) unsafe fn write_struct_prefix<T>(dst: *mut T, v: &T, size_in: usize) -> usize {
    let n = size_in.min(std::mem::size_of::<T>());
    // SAFETY: `v` is a whole `T` (readable for `n` ≤ size_of::<T>() bytes) and `dst` is
    // writable for `size_in` ≥ n bytes; they cannot overlap (`v` is our local).
    unsafe { std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), dst.cast::<u8>(), n) };
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_nrt_failure() {
        let st = api("test_panic", || panic!("boom"));
        assert_eq!(st, NrtStatus::Failure.as_i32());
        assert_eq!(api_value("test_panic", 7usize, || panic!("boom")), 7);
        let st = api("test_err", || Err(invalid("x")));
        assert_eq!(st, NrtStatus::Invalid.as_i32());
        assert_eq!(api("test_ok", || Ok(())), 0);
    }

    #[test]
    fn buffers_and_pointers() {
        assert!(nonnull(core::ptr::null::<u8>(), "p").is_err());
        // SAFETY: a zero-sized buffer is never dereferenced.
        let empty = unsafe { in_buf(core::ptr::null(), 0, "b") };
        assert!(empty.unwrap().is_empty());
        // SAFETY: NULL with a size is refused before any dereference.
        assert!(unsafe { out_buf(core::ptr::null_mut(), 4, "b") }.is_err());
        // SAFETY: NULL is accepted as the empty string; a literal is NUL-terminated.
        unsafe {
            assert_eq!(cstr_or_empty(core::ptr::null(), "s").unwrap(), "");
            assert_eq!(cstr(c"abc".as_ptr(), "s").unwrap(), "abc");
        }
    }
}
