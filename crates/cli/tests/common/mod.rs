//! What the `nrt` binary's tests share: the binary run with a runtime directory of its own,
//! scratch folders, a hand-written `.npy`.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A runtime directory of its own (`NRT_RUNTIME_DIR`), so parallel tests never contend for
/// core ownership.
pub fn private_runtime_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("nrt-run")
        .join(format!("{}-{n}", std::process::id()))
}

/// The `nrt` binary with `args`, a runtime directory of its own and no fault plan or
/// core selection or implicit async from the environment.
pub fn nrt_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nrt"));
    c.args(args)
        .env("NRT_RUNTIME_DIR", private_runtime_dir())
        .env_remove("NRT_SIM_FAULTS")
        .env_remove("NEURON_LOGICAL_NC_CONFIG")
        .env_remove("NEURON_RT_VISIBLE_CORES")
        .env_remove("NEURON_RT_NUM_CORES")
        .env_remove("NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS");
    c
}

pub fn nrt(args: &[&str]) -> Output {
    nrt_command(args).output().expect("run nrt")
}

pub fn ok(args: &[&str]) -> String {
    let out = nrt(args);
    assert!(
        out.status.success(),
        "nrt {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A fresh scratch folder under the target directory.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Writes a float32 C-order `.npy` file by hand (the format's version 1.0 header).
pub fn write_npy_f32(path: &Path, shape: &[usize], data: &[f32]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    // NumPy's own spelling: `(2,)` for one dimension, `(3, 2)` for more.
    let tuple = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {tuple}, }}").into_bytes();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut f = b"\x93NUMPY\x01\x00".to_vec();
    f.extend((header.len() as u16).to_le_bytes());
    f.extend(header);
    f.extend(data.iter().flat_map(|x| x.to_le_bytes()));
    std::fs::write(path, f).expect("write .npy");
}
