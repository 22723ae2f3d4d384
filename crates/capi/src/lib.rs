//! # nrt-capi — `libnrt.so.1`, the public Neuron runtime C API
//!
//! Existing C programs written against the public `nrt/nrt.h`, `nrt/nrt_experimental.h`,
//! `nrt/nrt_version.h` and the NRT 3.0 `nrt/nrt_async.h` run unchanged on the software
//! NeuronCore: build this crate (`scripts/build-capi.sh`), compile with
//! `-I include -L target/<profile> -lnrt`. The headers in `include/` are ours, written from
//! the public signatures; `tests/abi.rs` checks them against the `#[repr(C)]` mirrors in
//! [`types`].
//!
//! - [`state`]: the process-global runtime (init/close life cycle, epochs) and handle pools;
//! - [`handle`]: handle shells — pooled, never freed, pinned with atomics — so stale, foreign
//!   or garbage handles give `NRT_INVALID` instead of a crash;
//! - [`ffi`]: the boundary (`catch_unwind`, logging, argument checks);
//! - [`api`]: the exported functions.
//!
//! The library adds no logic of its own to execution: every call maps onto
//! [`nrt_runtime::Runtime`]; `nrt_execute` adds no allocation and no lock
//! (`tests/zero_alloc.rs`).

pub mod api;
pub mod ffi;
pub mod handle;
pub mod state;
pub mod types;

/// `API:IN: (…)` at DEBUG, in the public runtime's tracing style.
#[macro_export]
#[doc(hidden)]
macro_rules! api_in {
    ($func:expr, $($arg:tt)*) => {
        if $crate::ffi::tracing() {
            nrt_runtime::log::write(
                nrt_runtime::log::Module::Nrt,
                nrt_runtime::log::Level::Debug,
                $func,
                format_args!("API:IN: ({})", format_args!($($arg)*)),
            );
        }
    };
}

pub use api::asyncx::*;
pub use api::exec::*;
pub use api::init::*;
pub use api::model::*;
pub use api::set::*;
pub use api::tensor::*;
