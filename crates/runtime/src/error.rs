//! Errors: every failure carries its public status code and a message naming the culprit.

use core::fmt;
use nrt_hal::{HalError, NrtStatus};

/// A failed runtime call: the `NRT_STATUS` a C caller would get, and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NrtError {
    /// The status code.
    pub status: NrtStatus,
    /// What went wrong, naming the culprit (tensor, model, field, core).
    pub message: String,
}

/// `Result` with [`NrtError`].
pub type Result<T, E = NrtError> = core::result::Result<T, E>;

impl NrtError {
    /// An error with `status` and `message`.
    pub fn new(status: NrtStatus, message: impl Into<String>) -> NrtError {
        NrtError {
            status,
            message: message.into(),
        }
    }

    /// `NRT_INVALID` with a message.
    pub fn invalid(message: impl Into<String>) -> NrtError {
        NrtError::new(NrtStatus::Invalid, message)
    }
}

impl fmt::Display for NrtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.as_str(), self.message)
    }
}

impl std::error::Error for NrtError {}

impl From<HalError> for NrtError {
    fn from(e: HalError) -> NrtError {
        let status = match e {
            HalError::OutOfMemory { .. } | HalError::HostCannotBack { .. } => NrtStatus::Resource,
            HalError::BadCore(_) => NrtStatus::LoadNotEnoughNc,
            _ => NrtStatus::Invalid,
        };
        NrtError::new(status, format!("device: {e}"))
    }
}

impl From<nrt_model::ModelError> for NrtError {
    fn from(e: nrt_model::ModelError) -> NrtError {
        let status = if e.is_unsupported_version() {
            NrtStatus::UnsupportedNeffVersion
        } else {
            NrtStatus::Invalid
        };
        NrtError::new(status, e.to_string())
    }
}
