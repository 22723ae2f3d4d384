//! Errors: the `NrtError` exception (a `RuntimeError` carrying the NRT_STATUS), the mapping
//! of the runtime's errors onto it, and `_statuses` (every NRT_STATUS by name, for the
//! Python side's constants).

use nrt_hal::NrtStatus;
use nrt_runtime::NrtError as RtError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::collections::BTreeMap;

pyo3::create_exception!(
    nrt,
    NrtError,
    PyRuntimeError,
    "A runtime call failed. `.status` is the NRT_STATUS code (int), `.status_name` its name \
     (\"NRT_TIMEOUT\", ...), `.message` the text without the status prefix."
);

/// An `NrtError` carrying `status`, with `.status`, `.status_name` and `.message` set.
pub(crate) fn nrt_err(status: NrtStatus, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::with_gil(|py| {
        let e = NrtError::new_err(format!("{}: {message}", status.as_str()));
        let v = e.value(py);
        // Setting attributes on a fresh exception instance cannot fail (it has a __dict__);
        // if it somehow did, the exception is still raised, without the attribute.
        let _ = v.setattr("status", status as i32);
        let _ = v.setattr("status_name", status.as_str());
        let _ = v.setattr("message", message);
        e
    })
}

pub(crate) fn from_rt(e: RtError) -> PyErr {
    nrt_err(e.status, e.message)
}

/// A runtime error about model `name`, with the model named if the message does not.
pub(crate) fn model_err(name: &str, e: RtError) -> PyErr {
    if e.message.contains(&format!("'{name}'")) {
        from_rt(e)
    } else {
        nrt_err(e.status, format!("model '{name}': {}", e.message))
    }
}

/// `Ok` when `path` exists; otherwise `nrt.ModelNotFoundError` — a `FileNotFoundError`
/// (errno ENOENT, `.filename`) that is also an `NrtError` (`NRT_INVALID`), so both
/// `except FileNotFoundError` and `except nrt.NrtError` catch it.
pub(crate) fn check_exists(path: &std::path::Path) -> PyResult<()> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(not_found(path)),
        _ => Ok(()),
    }
}

/// ENOENT (Linux, the only platform of the package).
const ENOENT: i32 = 2;

fn not_found(path: &std::path::Path) -> PyErr {
    let shown = path.display().to_string();
    let message = format!("{shown}: no such file (a model: .onnx, or a compiled .ncm)");
    Python::with_gil(|py| {
        // The class is defined in Python (nrt/__init__.py: it has two exception bases).
        let made = py
            .import("nrt")
            .and_then(|m| m.getattr("ModelNotFoundError"))
            .and_then(|cls| cls.call1((ENOENT, message.clone(), shown.clone())));
        match made {
            Ok(v) => {
                let _ = v.setattr("status", NrtStatus::Invalid as i32);
                let _ = v.setattr("status_name", NrtStatus::Invalid.as_str());
                let _ = v.setattr("message", message);
                PyErr::from_value(v)
            }
            Err(_) => nrt_err(NrtStatus::Invalid, message),
        }
    })
}

pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    nrt_err(NrtStatus::Invalid, message)
}

/// Every NRT_STATUS: {name: code}.
#[pyfunction]
pub(crate) fn _statuses() -> BTreeMap<&'static str, i32> {
    NrtStatus::ALL
        .iter()
        .map(|s| (s.as_str(), *s as i32))
        .collect()
}
