//! Profiling and tracing: `nrt_profile_start` / `nrt_profile_stop` (`nrt/nrt_profile.h`) and
//! `nrt_trace_start` / `nrt_trace_stop` (`nrt/nrt.h`).
//!
//! libnrt writes NTFF device profiles; this runtime records the five stages of every
//! execution (validate, bind, stage, doorbell, harvest — the same spans as `nrt trace`) and
//! each device engine's active interval, and writes them as Chrome trace-event JSON, which <https://ui.perfetto.dev> opens. A profile
//! keeps the spans of one model; a trace keeps every model's. One session runs at a time, and
//! a session does not outlive `nrt_close`. Recording allocates nothing per execution (the
//! span ring is allocated when the session starts).

use crate::ffi::{Res, api, cstr, ensure_open, invalid, pin};
use crate::state::{self, MODELS};
use crate::types::NrtStatusC;
use nrt_runtime::log::{Level, Module};
use nrt_runtime::{NrtError, NrtStatus, nrt_log};
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

/// The session in progress.
struct Session {
    /// The runtime it belongs to (`nrt_close` ends it).
    epoch: u64,
    /// `Some((id, name))` for a profile of one model; `None` for a trace of all.
    model: Option<(u32, String)>,
    /// The file named at start (a profile's default output).
    filename: Option<String>,
}

impl Session {
    fn what(&self) -> String {
        match &self.model {
            Some((_, name)) => format!("a profile of model '{name}' (nrt_profile_start)"),
            None => "a trace (nrt_trace_start)".to_string(),
        }
    }
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

/// Starts a session, refusing if one of the open runtime is in progress.
fn start(model: Option<(u32, String)>, filename: Option<String>) -> Res {
    let rt = state::runtime()?;
    if rt.rt.inspecting() {
        return Err(invalid(
            "NEURON_RT_INSPECT_ENABLE profiles this process already (files under NEURON_RT_INSPECT_OUTPUT_DIR); unset it to profile from code",
        ));
    }
    let mut s = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(cur) = s.as_ref()
        && cur.epoch == rt.epoch
    {
        return Err(invalid(format!(
            "{} is already in progress; stop it first",
            cur.what()
        )));
    }
    rt.rt.set_tracing(true);
    *s = Some(Session {
        epoch: rt.epoch,
        model,
        filename,
    });
    Ok(())
}

/// Ends the session of kind `profile` (true) or trace, writing its spans to `filename` (or
/// the start's). Nothing changes if the file cannot be written: the session goes on.
fn stop(profile: bool, filename: Option<&str>) -> Res {
    let rt = state::runtime()?;
    let mut s = SESSION.lock().unwrap_or_else(|e| e.into_inner());
    let (start_fn, stop_fn) = if profile {
        ("nrt_profile_start", "nrt_profile_stop")
    } else {
        ("nrt_trace_start", "nrt_trace_stop")
    };
    let cur = match s.as_ref() {
        Some(cur) if cur.epoch == rt.epoch => cur,
        _ => {
            return Err(invalid(format!(
                "no session in progress: {stop_fn} follows {start_fn}"
            )));
        }
    };
    if cur.model.is_some() != profile {
        return Err(invalid(format!(
            "{} is in progress; {stop_fn} does not end it",
            cur.what()
        )));
    }
    let Some(path) = filename.or(cur.filename.as_deref()).map(str::to_string) else {
        return Err(invalid("invalid argument: filename is NULL"));
    };
    let mut spans = rt.rt.trace_spans();
    let names: Vec<(u32, &str)> = match &cur.model {
        Some((id, name)) => {
            spans.retain(|sp| sp.model == *id);
            vec![(*id, name.as_str())]
        }
        None => Vec::new(),
    };
    let json = nrt_runtime::chrome_json(&spans, &names);
    std::fs::write(&path, json).map_err(|e| {
        NrtError::new(
            NrtStatus::Failure,
            format!("cannot write '{path}': {e}; the session goes on"),
        )
    })?;
    rt.rt.set_tracing(false);
    *s = None;
    nrt_log!(
        Module::Nrt,
        Level::Info,
        stop_fn,
        "{} spans (execution stages and device engines) written to '{path}' (Chrome trace-event JSON)",
        spans.len()
    );
    Ok(())
}

/// `NRT_STATUS nrt_profile_start(nrt_model_t *model, const char *filename)`: starts
/// recording the execution stages of `model`; `filename` is where `nrt_profile_stop` writes
/// them unless it names another file.
///
/// # Safety
/// `filename` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_start(
    model: *mut c_void,
    filename: *const c_char,
) -> NrtStatusC {
    api("nrt_profile_start", || {
        crate::api_in!(
            "nrt_profile_start",
            "model={model:p}, filename={filename:p}"
        );
        ensure_open()?;
        let m = pin(&MODELS, model, "model")?;
        // SAFETY: the caller's contract.
        let f = unsafe { cstr(filename, "filename")? };
        if f.is_empty() {
            return Err(invalid("invalid argument: filename is empty"));
        }
        start(
            Some((m.model.id(), m.model.name().to_string())),
            Some(f.to_string()),
        )
    })
}

/// `NRT_STATUS nrt_profile_stop(const char *filename)`: writes the profile (Chrome
/// trace-event JSON) to `filename`, or to the file named at start when `filename` is NULL,
/// and ends it.
///
/// # Safety
/// `filename` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_profile_stop(filename: *const c_char) -> NrtStatusC {
    api("nrt_profile_stop", || {
        crate::api_in!("nrt_profile_stop", "filename={filename:p}");
        ensure_open()?;
        let f = if filename.is_null() {
            None
        } else {
            // SAFETY: the caller's contract.
            Some(unsafe { cstr(filename, "filename")? })
        };
        stop(true, f)
    })
}

/// `NRT_STATUS nrt_trace_start(bool trace_mem)`: starts recording the execution stages of
/// every model. `trace_mem` (memory-allocation events in libnrt) records nothing more here.
#[unsafe(no_mangle)]
pub extern "C" fn nrt_trace_start(trace_mem: bool) -> NrtStatusC {
    api("nrt_trace_start", || {
        crate::api_in!("nrt_trace_start", "trace_mem={trace_mem}");
        ensure_open()?;
        start(None, None)
    })
}

/// `NRT_STATUS nrt_trace_stop(const char *filename)`: writes the trace (Chrome trace-event
/// JSON) to `filename` and ends it.
///
/// # Safety
/// `filename` must be a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nrt_trace_stop(filename: *const c_char) -> NrtStatusC {
    api("nrt_trace_stop", || {
        crate::api_in!("nrt_trace_stop", "filename={filename:p}");
        ensure_open()?;
        // SAFETY: the caller's contract.
        let f = unsafe { cstr(filename, "filename")? };
        stop(false, Some(f))
    })
}
