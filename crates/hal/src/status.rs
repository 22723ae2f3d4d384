//! `NRT_STATUS`: the status codes of the public `nrt_status.h`, with the public names.
//!
//! The values are ABI: C programs compare against them, logs print them, and the public
//! documentation tables them. Only values that exist in the public header are representable;
//! [`NrtStatus::try_from`] rejects anything else (8 and 12 are holes in the public list, and 11
//! is `NRT_FAIL_HOST_MEM_ALLOC`, kept by the header for backward compatibility only).

use core::fmt;

/// A status code of the public Neuron runtime API (`NRT_STATUS`).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NrtStatus {
    /// Success.
    Success = 0,
    /// Generic failure.
    Failure = 1,
    /// Invalid model file, instruction, DMA descriptor, or input name/size mismatch.
    Invalid = 2,
    /// Invalid handle.
    InvalidHandle = 3,
    /// Resource allocation failed (device memory exhausted, ring full at load, …).
    Resource = 4,
    /// The operation timed out (an execution hung past `NEURON_RT_EXEC_TIMEOUT`).
    Timeout = 5,
    /// Hardware failure.
    HwError = 6,
    /// The execution input queue is full (too many executions in flight).
    QueueFull = 7,
    /// Not enough NeuronCores to load the model.
    LoadNotEnoughNc = 9,
    /// The compiled model's format version is not supported.
    UnsupportedNeffVersion = 10,
    /// Host memory allocation failed (kept by the public header for backward compatibility).
    FailHostMemAlloc = 11,
    /// API called before `nrt_init`.
    Uninitialized = 13,
    /// API called after `nrt_close`.
    Closed = 14,
    /// The queue has no data.
    QueueEmpty = 15,
    /// The execution unit is in a fatal state and must be reset.
    ExecUnitUnrecoverable = 101,
    /// Invalid input submitted to an execution.
    ExecBadInput = 1002,
    /// The execution completed with numerical errors (NaN).
    ExecCompletedWithNumErr = 1003,
    /// The execution completed with other errors (transient, event double clear, …).
    ExecCompletedWithErr = 1004,
    /// The NeuronCore is locked by another model, process or thread.
    ExecNcBusy = 1005,
    /// An indirect copy (gather) or embedding update went out of bounds.
    ExecOob = 1006,
    /// A collective operation is still pending.
    CollPending = 1100,
    /// Stuck in collectives (missing notifications).
    ExecHwErrCollectives = 1200,
    /// HBM unrepairable uncorrectable error.
    ExecHwErrHbmUe = 1201,
    /// NeuronCore on-chip memory parity (uncorrectable) error.
    ExecHwErrNcUe = 1202,
    /// DMA engine unrecoverable error.
    ExecHwErrDmaAbort = 1203,
    /// Software notification-queue overflow: the execution timed out because notifications
    /// were dropped.
    ExecSwNqOverflow = 1204,
    /// HBM repairable uncorrectable error.
    ExecHwErrRepairableHbmUe = 1205,
    /// EFA network proxy operation failed.
    NetworkProxyFailure = 1206,
}

impl NrtStatus {
    /// Every status, in value order.
    pub const ALL: [NrtStatus; 28] = [
        Self::Success,
        Self::Failure,
        Self::Invalid,
        Self::InvalidHandle,
        Self::Resource,
        Self::Timeout,
        Self::HwError,
        Self::QueueFull,
        Self::LoadNotEnoughNc,
        Self::UnsupportedNeffVersion,
        Self::FailHostMemAlloc,
        Self::Uninitialized,
        Self::Closed,
        Self::QueueEmpty,
        Self::ExecUnitUnrecoverable,
        Self::ExecBadInput,
        Self::ExecCompletedWithNumErr,
        Self::ExecCompletedWithErr,
        Self::ExecNcBusy,
        Self::ExecOob,
        Self::CollPending,
        Self::ExecHwErrCollectives,
        Self::ExecHwErrHbmUe,
        Self::ExecHwErrNcUe,
        Self::ExecHwErrDmaAbort,
        Self::ExecSwNqOverflow,
        Self::ExecHwErrRepairableHbmUe,
        Self::NetworkProxyFailure,
    ];

    /// The numeric value, as C sees it.
    pub const fn as_i32(self) -> i32 {
        self as i32
    }

    /// The public name of the status (`"NRT_SUCCESS"`, `"NRT_EXEC_OOB"`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Success => "NRT_SUCCESS",
            Self::Failure => "NRT_FAILURE",
            Self::Invalid => "NRT_INVALID",
            Self::InvalidHandle => "NRT_INVALID_HANDLE",
            Self::Resource => "NRT_RESOURCE",
            Self::Timeout => "NRT_TIMEOUT",
            Self::HwError => "NRT_HW_ERROR",
            Self::QueueFull => "NRT_QUEUE_FULL",
            Self::LoadNotEnoughNc => "NRT_LOAD_NOT_ENOUGH_NC",
            Self::UnsupportedNeffVersion => "NRT_UNSUPPORTED_NEFF_VERSION",
            Self::FailHostMemAlloc => "NRT_FAIL_HOST_MEM_ALLOC",
            Self::Uninitialized => "NRT_UNINITIALIZED",
            Self::Closed => "NRT_CLOSED",
            Self::QueueEmpty => "NRT_QUEUE_EMPTY",
            Self::ExecUnitUnrecoverable => "NRT_EXEC_UNIT_UNRECOVERABLE",
            Self::ExecBadInput => "NRT_EXEC_BAD_INPUT",
            Self::ExecCompletedWithNumErr => "NRT_EXEC_COMPLETED_WITH_NUM_ERR",
            Self::ExecCompletedWithErr => "NRT_EXEC_COMPLETED_WITH_ERR",
            Self::ExecNcBusy => "NRT_EXEC_NC_BUSY",
            Self::ExecOob => "NRT_EXEC_OOB",
            Self::CollPending => "NRT_COLL_PENDING",
            Self::ExecHwErrCollectives => "NRT_EXEC_HW_ERR_COLLECTIVES",
            Self::ExecHwErrHbmUe => "NRT_EXEC_HW_ERR_HBM_UE",
            Self::ExecHwErrNcUe => "NRT_EXEC_HW_ERR_NC_UE",
            Self::ExecHwErrDmaAbort => "NRT_EXEC_HW_ERR_DMA_ABORT",
            Self::ExecSwNqOverflow => "NRT_EXEC_SW_NQ_OVERFLOW",
            Self::ExecHwErrRepairableHbmUe => "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE",
            Self::NetworkProxyFailure => "NRT_NETWORK_PROXY_FAILURE",
        }
    }

    /// A one-line description in the words of the public documentation.
    pub const fn description(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failure => "non-specific failure",
            Self::Invalid => "invalid model, instruction, DMA descriptor, or input name/size",
            Self::InvalidHandle => "invalid handle",
            Self::Resource => "failed to allocate a resource",
            Self::Timeout => "operation timed out",
            Self::HwError => "hardware failure",
            Self::QueueFull => "too many executions in flight",
            Self::LoadNotEnoughNc => "not enough NeuronCores available to load the model",
            Self::UnsupportedNeffVersion => "unsupported compiled-model version",
            Self::FailHostMemAlloc => "host memory allocation failed",
            Self::Uninitialized => "called before nrt_init",
            Self::Closed => "called after nrt_close",
            Self::QueueEmpty => "queue is empty",
            Self::ExecUnitUnrecoverable => "execution unit in a fatal state; needs reset",
            Self::ExecBadInput => "invalid input submitted to an execution",
            Self::ExecCompletedWithNumErr => "execution completed with numerical errors (NaN)",
            Self::ExecCompletedWithErr => "execution completed with errors",
            Self::ExecNcBusy => "NeuronCore locked by another model, process or thread",
            Self::ExecOob => "indirect memory access out of bounds",
            Self::CollPending => "collective operation still pending",
            Self::ExecHwErrCollectives => "stuck in collectives (missing notifications)",
            Self::ExecHwErrHbmUe => "HBM uncorrectable error",
            Self::ExecHwErrNcUe => "NeuronCore on-chip memory parity error",
            Self::ExecHwErrDmaAbort => "DMA engine unrecoverable error",
            Self::ExecSwNqOverflow => "execution timed out: notifications were dropped",
            Self::ExecHwErrRepairableHbmUe => "HBM repairable uncorrectable error",
            Self::NetworkProxyFailure => "network proxy operation failed",
        }
    }

    /// `true` for [`NrtStatus::Success`].
    pub const fn is_success(self) -> bool {
        matches!(self, Self::Success)
    }
}

impl fmt::Display for NrtStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.as_str(), self.as_i32())
    }
}

impl From<NrtStatus> for i32 {
    fn from(s: NrtStatus) -> i32 {
        s.as_i32()
    }
}

/// A value that is not a public `NRT_STATUS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownStatus(pub i32);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is not an NRT_STATUS value", self.0)
    }
}

impl std::error::Error for UnknownStatus {}

impl TryFrom<i32> for NrtStatus {
    type Error = UnknownStatus;

    #[inline]
    fn try_from(v: i32) -> Result<Self, Self::Error> {
        // Every completion reads its status through here: success without the scan.
        if v == 0 {
            return Ok(NrtStatus::Success);
        }
        // A linear scan of 28 entries, on error paths only.
        Self::ALL
            .iter()
            .copied()
            .find(|s| s.as_i32() == v)
            .ok_or(UnknownStatus(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_exactly_the_public_ones() {
        let expected: [(i32, &str); 28] = [
            (0, "NRT_SUCCESS"),
            (1, "NRT_FAILURE"),
            (2, "NRT_INVALID"),
            (3, "NRT_INVALID_HANDLE"),
            (4, "NRT_RESOURCE"),
            (5, "NRT_TIMEOUT"),
            (6, "NRT_HW_ERROR"),
            (7, "NRT_QUEUE_FULL"),
            (9, "NRT_LOAD_NOT_ENOUGH_NC"),
            (10, "NRT_UNSUPPORTED_NEFF_VERSION"),
            (11, "NRT_FAIL_HOST_MEM_ALLOC"),
            (13, "NRT_UNINITIALIZED"),
            (14, "NRT_CLOSED"),
            (15, "NRT_QUEUE_EMPTY"),
            (101, "NRT_EXEC_UNIT_UNRECOVERABLE"),
            (1002, "NRT_EXEC_BAD_INPUT"),
            (1003, "NRT_EXEC_COMPLETED_WITH_NUM_ERR"),
            (1004, "NRT_EXEC_COMPLETED_WITH_ERR"),
            (1005, "NRT_EXEC_NC_BUSY"),
            (1006, "NRT_EXEC_OOB"),
            (1100, "NRT_COLL_PENDING"),
            (1200, "NRT_EXEC_HW_ERR_COLLECTIVES"),
            (1201, "NRT_EXEC_HW_ERR_HBM_UE"),
            (1202, "NRT_EXEC_HW_ERR_NC_UE"),
            (1203, "NRT_EXEC_HW_ERR_DMA_ABORT"),
            (1204, "NRT_EXEC_SW_NQ_OVERFLOW"),
            (1205, "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE"),
            (1206, "NRT_NETWORK_PROXY_FAILURE"),
        ];
        for ((v, name), s) in expected.iter().zip(NrtStatus::ALL) {
            assert_eq!(s.as_i32(), *v, "{name}");
            assert_eq!(s.as_str(), *name);
            assert_eq!(NrtStatus::try_from(*v), Ok(s));
            assert_eq!(i32::from(s), *v);
        }
    }

    #[test]
    fn holes_and_unknown_values_are_rejected() {
        for v in [
            -1,
            8,
            12,
            16,
            100,
            102,
            1001,
            1007,
            1099,
            1101,
            1199,
            1207,
            i32::MAX,
        ] {
            assert_eq!(NrtStatus::try_from(v), Err(UnknownStatus(v)));
        }
    }

    #[test]
    fn display_names_value() {
        assert_eq!(NrtStatus::ExecOob.to_string(), "NRT_EXEC_OOB (1006)");
    }
}
