//! The C ABI's types, as `#[repr(C)]` mirrors of `include/nrt/*.h` and `include/ndl/*.h`.
//!
//! `tests/abi.rs` compiles a C probe against the headers and checks every size, offset and
//! enum value below against what gcc sees.

use std::ffi::{c_char, c_int, c_void};

/// `NRT_STATUS` as it crosses the ABI (a C enum: `int`).
pub type NrtStatusC = c_int;

/// `NRT_TENSOR_NAME_MAX`.
pub const NRT_TENSOR_NAME_MAX: usize = 256;

/// `NRT_MAJOR_VERSION` / `NRT_MINOR_VERSION` of `nrt.h`.
pub const NRT_MAJOR_VERSION: u32 = 2;
/// See [`NRT_MAJOR_VERSION`].
pub const NRT_MINOR_VERSION: u32 = 0;

/// `nrt_tensor_placement_t` values.
pub mod placement {
    /// `NRT_TENSOR_PLACEMENT_DEVICE`.
    pub const DEVICE: u32 = 0;
    /// `NRT_TENSOR_PLACEMENT_HOST`.
    pub const HOST: u32 = 1;
    /// `NRT_TENSOR_PLACEMENT_VIRTUAL`.
    pub const VIRTUAL: u32 = 2;
}

/// `nrt_framework_type_t` values.
pub mod framework {
    /// `NRT_FRAMEWORK_TYPE_INVALID`.
    pub const INVALID: u32 = 0;
    /// `NRT_FRAMEWORK_TYPE_NO_FW`.
    pub const NO_FW: u32 = 1;
    /// `NRT_FRAMEWORK_TYPE_TENSORFLOW`.
    pub const TENSORFLOW: u32 = 2;
    /// `NRT_FRAMEWORK_TYPE_PYTORCH`.
    pub const PYTORCH: u32 = 3;
    /// `NRT_FRAMEWORK_TYPE_MXNET`.
    pub const MXNET: u32 = 4;
    /// `NRT_FRAMEWORK_TYPE_PRECHECK`.
    pub const PRECHECK: u32 = 5;
}

/// `nrt_tensor_usage_t` values.
pub mod usage {
    /// `NRT_TENSOR_USAGE_INPUT`.
    pub const INPUT: u32 = 0;
    /// `NRT_TENSOR_USAGE_OUTPUT`.
    pub const OUTPUT: u32 = 1;
}

/// `nrt_instance_family_t` values we report.
pub mod family {
    /// `NRT_INSTANCE_UNKNOWN`: the software NeuronCore is no EC2 instance family.
    pub const UNKNOWN: u32 = 0;
}

/// `nrt_instance_size_t` values we report.
pub mod instance_size {
    /// `NRT_INSTANCE_SIZE_UNKNOWN`.
    pub const UNKNOWN: u32 = 9;
}

/// `nrta_xu_t` of the NRT 3.0 async API.
pub mod xu {
    /// `NRTA_XU_TENSOR_OP`.
    pub const TENSOR_OP: u32 = 0;
    /// `NRTA_XU_COMPUTE`.
    pub const COMPUTE: u32 = 1;
    /// `NRTA_XU_COLLECTIVES`.
    pub const COLLECTIVES: u32 = 2;
    /// `NRTA_XU_TYPE_NUM`.
    pub const TYPE_NUM: u32 = 3;
}

/// `nrt_tensor_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NrtTensorInfo {
    /// NUL-terminated name.
    pub name: [c_char; NRT_TENSOR_NAME_MAX],
    /// `nrt_tensor_usage_t`.
    pub usage: u32,
    /// Size in bytes.
    pub size: usize,
    /// `nrt_dtype_t` (hardware encoding).
    pub dtype: u32,
    /// `ndim` dimensions (owned by the info array).
    pub shape: *mut u32,
    /// Number of dimensions.
    pub ndim: u32,
}

/// `nrt_tensor_info_array_t` (its flexible array member follows the count).
#[repr(C)]
#[derive(Debug)]
pub struct NrtTensorInfoArray {
    /// Entries in `tensor_array`.
    pub tensor_count: u64,
    /// The entries (a C flexible array member).
    pub tensor_array: [NrtTensorInfo; 0],
}

/// `nrt_version_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NrtVersion {
    /// Major version.
    pub rt_major: u64,
    /// Minor version.
    pub rt_minor: u64,
    /// Patch version.
    pub rt_patch: u64,
    /// Maintenance version.
    pub rt_maintenance: u64,
    /// Free text.
    pub rt_detail: [c_char; 128],
    /// Source revision.
    pub git_hash: [c_char; 64],
}

/// `nrt_instance_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NrtInstanceInfo {
    /// `nrt_instance_family_t`.
    pub family: u32,
    /// `nrt_instance_size_t`.
    pub size: u32,
    /// Architecture name.
    pub arch_name: [c_char; 16],
    /// Device revision.
    pub device_revision: [c_char; 8],
}

/// `nrt_vnc_memory_stats_t` (append-only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NrtVncMemoryStats {
    /// Bytes in use.
    pub bytes_used: usize,
    /// Bytes available at most.
    pub bytes_limit: usize,
}

/// `nrt_model_info_t` (append-only).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NrtModelInfo {
    /// Logical core the model was loaded on.
    pub vnc: u32,
}

/// `nrt_tensor_batch_op_t` (`ndl/neuron_driver_shared_tensor_batch_op.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NrtTensorBatchOp {
    /// Offset in the tensor.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
    /// Host buffer.
    pub buffer: *mut c_void,
}

/// `nrt_tensor_batch_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NrtTensorBatch {
    /// The tensor.
    pub tensor: *const c_void,
    /// `num_ops` operations.
    pub ops: *const NrtTensorBatchOp,
    /// Number of operations.
    pub num_ops: u32,
}

/// `nrt_tensor_device_allocation_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NrtTensorDeviceAllocationInfo {
    /// Device physical address.
    pub physical_address: u64,
    /// Bytes.
    pub size: usize,
    /// HBM the allocation is in.
    pub hbm_index: c_int,
}

/// Copies `s` into a fixed C string buffer, truncating so the NUL always fits.
pub(crate) fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    for d in dst.iter_mut().skip(n) {
        *d = 0;
    }
}
