//! The rest of the C API (`tests/c/api_tour.c`, compiled with gcc): host, device, sliced and
//! attached-buffer tensors, memset/copy/va/batches, completion counts, the versioned query
//! structs, NRT 3.0 copies and per-sequence eventfds, four threads executing one model, and
//! — in a second process with `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS=4` — the
//! implicit-async callback and drain. Both runs also under valgrind.

mod common;
use common::*;
use std::process::Command;

#[test]
fn api_tour_sync_and_implicit() {
    let dir = scratch("api_tour");
    let exe = dir.join("api_tour");
    gcc(
        &[std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/api_tour.c")],
        &exe,
    );
    std::fs::write(dir.join("near_null.ncm"), near_null()).unwrap();
    for (mode, inflight) in [("sync", None), ("implicit", Some("4"))] {
        let mut plain = Command::new(&exe);
        let mut checked = if valgrind_available() {
            valgrind(&exe, &["near_null.ncm", mode])
        } else {
            eprintln!("valgrind is not on PATH: running api_tour without memcheck");
            Command::new(&exe)
        };
        if !valgrind_available() {
            checked.args(["near_null.ncm", mode]);
        }
        plain.args(["near_null.ncm", mode]);
        for cmd in [&mut plain, &mut checked] {
            cmd.env_remove("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS");
            if let Some(n) = inflight {
                cmd.env("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS", n);
            }
            let o = run(cmd, &dir);
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(o.status.success(), "api_tour {mode} failed");
            assert!(out.contains(&format!("api_tour {mode}: ok")), "{out}");
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!err.contains("panic"), "{err}");
        }
    }
}
