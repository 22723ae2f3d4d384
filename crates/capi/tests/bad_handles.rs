//! Misuse through the C API (`tests/c/bad_handles.c`, compiled with gcc): NULL, stale,
//! foreign and garbage handles, calls before `nrt_init` and after `nrt_close`, `nrt_init`
//! twice and after close. The program checks every status itself; here we also check the
//! log lines (the argument is named; DEBUG traces API entries) and run it under valgrind.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

fn build() -> (PathBuf, PathBuf) {
    let dir = scratch("bad_handles");
    let exe = dir.join("bad_handles");
    gcc(
        &[std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/bad_handles.c")],
        &exe,
    );
    std::fs::write(dir.join("near_null.ncm"), near_null()).unwrap();
    (dir, exe)
}

#[test]
fn misuse_returns_the_documented_status_and_is_logged() {
    let (dir, exe) = build();
    let o = run(
        Command::new(&exe)
            .arg("near_null.ncm")
            .env_remove("NEURON_RT_LOG_LEVEL"),
        &dir,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "bad_handles failed:\n{err}");
    assert!(out.contains("bad_handles: ok"), "{out}");
    // Errors name the function and the culprit, in the public style.
    for needle in [
        "ERROR NRT:nrt_execute invalid argument: model is NULL (NRT_INVALID)",
        "ERROR NRT:nrt_tensor_read invalid argument: tensor is NULL (NRT_INVALID)",
        "ERROR NRT:nrt_load invalid argument: neff_bytes is NULL (NRT_INVALID)",
        "is a stale nrt_tensor_t handle",
        "is not an nrt_model_t handle",
        "is a stale nrt_model_t handle",
        "ERROR NRT:nrt_load the runtime is not initialized: call nrt_init first (NRT_UNINITIALIZED)",
        "ERROR NRT:nrt_execute the runtime was closed by nrt_close (NRT_CLOSED)",
        "ERROR NRT:nrt_init the runtime is already initialized",
        "ERROR NRT:nrt_load_collectives collectives are not supported",
        "belongs to a runtime that nrt_close closed",
        "holds tensor(s) of a runtime that nrt_close closed",
        "is outside tensor 'x'",
    ] {
        assert!(err.contains(needle), "stderr lacks {needle:?}");
    }
    // No panic crossed the boundary, and at the default level no API tracing.
    assert!(!err.contains("panic"), "{err}");
    assert!(!err.contains("API:IN"), "API tracing at the default level");
}

#[test]
fn debug_level_traces_api_entries() {
    let (dir, exe) = build();
    let o = run(
        Command::new(&exe)
            .arg("near_null.ncm")
            .env("NEURON_RT_LOG_LEVEL", "DEBUG"),
        &dir,
    );
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    for needle in [
        "DEBUG NRT:nrt_init API:IN: (framework=1, fw_version=\"\", fal_version=\"\")",
        "DEBUG NRT:nrt_load API:IN: (neff_bytes=0x",
        ", vnc=-1, vnc_count=-1)",
        "DEBUG NRT:nrt_execute API:IN: (model=0x",
        "DEBUG NRT:nrt_execute API:OUT: NRT_SUCCESS",
        "DEBUG NRT:nrt_tensor_read API:OUT: NRT_INVALID",
        // A miss is a warning, not an error.
        "WARN NRT:nrt_get_tensor_from_tensor_set no tensor named 'no_such_tensor'",
    ] {
        assert!(err.contains(needle), "stderr lacks {needle:?}");
    }
    // Each line starts with a readable UTC time, `2026-Nov-29 07:30:01.123456`, not raw
    // epoch seconds.
    let line = err
        .lines()
        .find(|l| l.contains("DEBUG NRT:nrt_init API:IN"))
        .expect("the nrt_init line");
    let stamp: Vec<char> = line.chars().take(27).collect();
    let shape: String = stamp
        .iter()
        .map(|c| match c {
            '0'..='9' => '9',
            'A'..='Z' => 'A',
            'a'..='z' => 'a',
            c => *c,
        })
        .collect();
    assert_eq!(shape, "9999-Aaa-99 99:99:99.999999", "{line}");
}

#[test]
fn misuse_under_valgrind() {
    let (dir, exe) = build();
    if !valgrind_available() {
        eprintln!("valgrind is not on PATH: running bad_handles without memcheck");
        let o = run(Command::new(&exe).arg("near_null.ncm"), &dir);
        assert!(o.status.success());
        return;
    }
    let o = run(&mut valgrind(&exe, &["near_null.ncm"]), &dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "valgrind found errors (exit {:?})",
        o.status.code()
    );
    assert!(err.contains("ERROR SUMMARY: 0 errors"), "{err}");
}

/// The same misuse program built with AddressSanitizer and UndefinedBehaviorSanitizer
/// (issue 11: the C misuse programs run clean under ASan/UBSan; `tests/hostile.rs` covers
/// huge sizes, concurrency and the callback the same way).
#[test]
fn misuse_under_asan_and_ubsan() {
    let dir = scratch("bad_handles_asan");
    let exe = dir.join("bad_handles");
    gcc_sanitized(
        &[std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/bad_handles.c")],
        &exe,
    );
    std::fs::write(dir.join("near_null.ncm"), near_null()).unwrap();
    let o = run(sanitizer_env(Command::new(&exe).arg("near_null.ncm")), &dir);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "bad_handles under ASan/UBSan failed:\n{err}"
    );
    assert_no_sanitizer_report(&err);
}
