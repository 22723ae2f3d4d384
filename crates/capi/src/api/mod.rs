//! The exported `extern "C"` functions, grouped as in the public headers.
//!
//! Every function: traces `API:IN` at DEBUG, runs its body under [`crate::ffi::api`] (no
//! panic crosses the boundary), validates each pointer (NULL → `NRT_INVALID` naming the
//! argument) and each handle (see [`crate::handle`]), and returns `NRT_UNINITIALIZED` /
//! `NRT_CLOSED` outside `nrt_init`..`nrt_close` where it needs the runtime.

pub mod asyncx;
pub mod exec;
pub mod init;
pub mod model;
pub mod profile;
pub mod set;
pub mod tensor;
