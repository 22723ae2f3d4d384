//! Hostile use of the C API (`tests/c/hostile.c`, built with gcc under AddressSanitizer and
//! UndefinedBehaviorSanitizer): huge allocations, exclusive operations while other threads
//! keep using the handle, every API call from inside the implicit-async callback, a fatal
//! fault with executions queued behind it, and fault plans armed at run time or given in
//! a malformed `NRT_SIM_FAULTS`. Each scenario runs in its own process; `alarm(60)` in the
//! program turns a hang into a failure.
//!
//! The tests named `dN_…` are the regression tests of issue 11's defects.

mod common;
use common::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The program, built once per test binary, and its scratch directory (with the model).
fn program() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let dir = scratch("hostile");
        let exe = dir.join("hostile");
        gcc_sanitized(
            &[std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/hostile.c")],
            &exe,
        );
        std::fs::write(dir.join("near_null.ncm"), near_null()).unwrap();
        (dir, exe)
    })
}

/// Runs one scenario under the sanitizers ([`sanitizer_env`]).
fn scenario(name: &str, env: &[(&str, &OsStr)]) -> Output {
    let (dir, exe) = program();
    let mut cmd = Command::new(exe);
    sanitizer_env(&mut cmd)
        .arg("near_null.ncm")
        .arg(name)
        .env_remove("NRT_SIM_FAULTS")
        .env_remove("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS")
        .env_remove("NEURON_RT_EXEC_TIMEOUT")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .env_remove("NEURON_LOGICAL_NC_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd, dir)
}

fn passes(name: &str) -> String {
    let o = scenario(name, &[]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "scenario {name} failed ({}):\n{err}",
        o.status
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("hostile {name}: ok")),
        "{name}"
    );
    assert_no_sanitizer_report(&err);
    assert!(
        !err.contains("panicked"),
        "{name}: a panic in stderr:\n{err}"
    );
    err
}

/// D2, D9: a 64 TiB host tensor, `SIZE_MAX` host and device tensors and sizes whose 64-byte
/// rounding wraps: `NRT_RESOURCE`, nothing changed, no abort.
#[test]
fn d2_d9_huge_tensors_are_resource_errors() {
    let err = passes("alloc");
    assert!(err.contains("cannot allocate host tensor 'huge'"), "{err}");
    assert!(
        err.contains("MemAvailable"),
        "the refusal names the limit:\n{err}"
    );
}

/// D3: `nrt_unload`, `nrt_close`, set mutation and tensor free while two threads keep
/// executing: each returns promptly; newcomers after a free are refused with `NRT_INVALID`
/// / `NRT_CLOSED`.
#[test]
fn d3_exclusive_operations_while_threads_execute() {
    passes("unload_busy");
}

/// D4: every API call from inside the callback: reads and writes work (two executions
/// share the output), the calls that would wait for the callback's own worker return
/// `NRT_INVALID` at once and change nothing.
#[test]
fn d4_api_calls_from_inside_the_callback() {
    let err = passes("callback");
    assert!(
        err.contains("nrt_async_drain_queued_execs cannot be called from the async-exec callback"),
        "{err}"
    );
    assert!(err.contains("nrt_unload cannot be called from the async-exec callback"));
    assert!(err.contains("nrt_close cannot be called from the async-exec callback"));
}

/// D3/D4: the callback frees a tensor that another thread is reading while a later
/// execution on it is pending; the read waits for that execution (which only the callback's
/// worker retires), so the free must not wait for the read: it completes at once, and the
/// read completes after the callback returns (or finds the handle freed).
#[test]
fn d3_d4_free_from_the_callback_while_another_thread_reads() {
    passes("free_while_read");
}

/// D6: after a fatal fault, executions queued behind it get 101 at once (explicit surface),
/// not a timeout or "notifications were dropped" 5 s later; `nrt_reset_vnc` recovers.
#[test]
fn d6_fatal_fault_fails_queued_explicit_executions_at_once() {
    passes("fatal_queued");
}

/// D6 on the implicit-async surface.
#[test]
fn d6_fatal_fault_fails_queued_implicit_executions_at_once() {
    passes("fatal_implicit");
}

/// Issue 54 S19: a fault armed at run time with no `exec=` fires on the next execution
/// submitted on every surface, deterministically (on the implicit surface it fired "usually
/// never": on an execution the device had not taken yet, or none).
#[test]
fn s19_a_fault_armed_with_no_exec_fires_on_the_next_execution_of_every_surface() {
    for surface in ["sync", "nrta", "implicit"] {
        passes(&format!("next_fault_{surface}"));
    }
}

/// D10 (run-time arming): bad plans are refused naming the entry and arm nothing; a huge
/// `count` fires.
#[test]
fn d10_fault_plans_armed_at_run_time() {
    let err = passes("faults");
    assert!(err.contains("core=4294967296"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
}

/// D10 (the environment): a core index past u32, a core the device lacks and a value that
/// is not UTF-8 make `nrt_init` fail naming the culprit, instead of being truncated or
/// ignored.
#[test]
fn d10_malformed_nrt_sim_faults_fail_init() {
    for (value, needle) in [
        (
            OsStr::new("hang@core=4294967296"),
            "core=\"4294967296\" is not a core index",
        ),
        (OsStr::new("hang@core=5"), "core=5 does not exist"),
        (OsStr::from_bytes(b"nan@exec=\xff"), "not UTF-8"),
    ] {
        let o = scenario("alloc", &[("NRT_SIM_FAULTS", value)]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{value:?} was accepted");
        assert!(err.contains("nrt_init"), "{err}");
        assert!(
            err.contains(needle),
            "{value:?}: stderr lacks {needle:?}:\n{err}"
        );
        assert!(!err.contains("AddressSanitizer"), "{err}");
    }
}
