//! Shared helpers of the C-API tests: where `libnrt.so` is (and its `libnrt.so.1` link),
//! compiling C programs with gcc against `include/`, the test models, reference outputs
//! through the Rust API, and running programs (optionally under valgrind).
#![allow(dead_code, reason = "each test binary uses a different subset")]

use nrt_compiler::onnx::*;
use nrt_runtime::{LoadOptions, Placement, Runtime, RuntimeConfig, TensorSet};
use nrt_sim::{SimConfig, SoftDevice};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, OnceLock};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `target/<profile>/deps`: where `cargo test` builds the crate's `libnrt.so` (it is copied
/// up to `target/<profile>` only by `cargo build`, so that copy may be stale here). Makes
/// sure `libnrt.so.1 -> libnrt.so` exists next to it (what `scripts/build-capi.sh` does for
/// `target/<profile>`).
pub fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().to_path_buf();
        let so = dir.join("libnrt.so");
        assert!(
            so.exists(),
            "{} is missing: build the crate (cargo test -p nrt-capi builds it)",
            so.display()
        );
        let link = dir.join("libnrt.so.1");
        if std::fs::read_link(&link).ok().as_deref() != Some(Path::new("libnrt.so")) {
            // Atomic replace: another test binary may be doing the same.
            let tmp = dir.join(format!("libnrt.so.1.tmp{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink("libnrt.so", &tmp).unwrap();
            std::fs::rename(&tmp, &link).unwrap();
        }
        dir
    })
    .clone()
}

/// A fresh scratch directory under `target/tmp` (unique per call: tests of one binary run
/// in parallel).
pub fn scratch(name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("capi")
        .join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles C sources into `out` with gcc: `-Iinclude -L<lib_dir> -lnrt`, rpath to
/// `lib_dir`, warnings as errors.
pub fn gcc(sources: &[PathBuf], out: &Path) {
    gcc_with(sources, out, &[]);
}

/// Compiles C sources like [`gcc`], with AddressSanitizer and UndefinedBehaviorSanitizer
/// (UB aborts: no recovery).
pub fn gcc_sanitized(sources: &[PathBuf], out: &Path) {
    gcc_with(
        sources,
        out,
        &[
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            "-fno-omit-frame-pointer",
        ],
    );
}

/// The environment of a program built by [`gcc_sanitized`]: a huge request is answered
/// with NULL (as malloc does), not with ASan's abort; leak detection is off (the library's
/// handle pools are leaked on purpose: they outlive every handle); UB prints a stack.
pub fn sanitizer_env(cmd: &mut Command) -> &mut Command {
    cmd.env("ASAN_OPTIONS", "allocator_may_return_null=1:detect_leaks=0")
        .env("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
}

/// Fails if a sanitizer reported anything on `stderr`.
pub fn assert_no_sanitizer_report(stderr: &str) {
    for bad in ["AddressSanitizer", "runtime error:"] {
        assert!(!stderr.contains(bad), "{bad} in stderr:\n{stderr}");
    }
}

/// [`gcc`] with extra flags (e.g. `-fsanitize=address,undefined`).
pub fn gcc_with(sources: &[PathBuf], out: &Path, extra: &[&str]) {
    let lib = lib_dir();
    let mut cmd = Command::new("gcc");
    cmd.args(extra);
    cmd.args([
        "-std=gnu11",
        "-O1",
        "-g",
        "-pthread",
        "-Wall",
        "-Wextra",
        "-Werror",
    ])
    .arg(format!("-I{}", root().join("include").display()))
    .args(sources)
    .arg(format!("-L{}", lib.display()))
    .arg("-lnrt")
    .arg(format!("-Wl,-rpath,{}", lib.display()))
    .arg("-o")
    .arg(out);
    let o = cmd.output().expect("gcc is installed");
    assert!(
        o.status.success(),
        "gcc failed: {cmd:?}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The near-null model (`y = x`, f32[1,4]).
pub fn near_null() -> Vec<u8> {
    nrt_runtime::builtin::near_null(1)
}

fn vi(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            dim_value: Some(d),
                            dim_param: None,
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    }
}

fn node(op: &str, ins: &[&str], outs: &[&str]) -> NodeProto {
    NodeProto {
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        name: format!("{op}_{}", outs[0]),
        op_type: op.into(),
        ..Default::default()
    }
}

/// A compiled two-input, two-output model: `mm = x @ w`, `y = Relu(mm + b)` with
/// `x: f32[2,8]`, `w: f32[8,4]`, constant `b: f32[4]`.
pub fn mlp() -> Vec<u8> {
    let onnx = encode_model(&ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "nrt-capi tests".into(),
        graph: Some(GraphProto {
            name: "mlp".into(),
            node: vec![
                node("MatMul", &["x", "w"], &["mm"]),
                node("Add", &["mm", "b"], &["pre"]),
                node("Relu", &["pre"], &["y"]),
            ],
            initializer: vec![TensorProto {
                name: "b".into(),
                dims: vec![4],
                data_type: data_type::FLOAT,
                float_data: vec![0.5, -1.0, 0.25, -0.125],
                ..Default::default()
            }],
            input: vec![vi("x", &[2, 8]), vi("w", &[8, 4])],
            output: vec![vi("y", &[2, 4]), vi("mm", &[2, 4])],
            ..Default::default()
        }),
        ..Default::default()
    });
    let c = nrt_compiler::compile(&onnx, None, &nrt_compiler::CompileOptions::default())
        .unwrap_or_else(|e| panic!("compiling the test model: {e}"));
    c.model.encode()
}

/// Deterministic input bytes for a tensor of `size` bytes (f32 values).
pub fn input_bytes(name: &str, size: usize) -> Vec<u8> {
    let salt = name.bytes().map(u32::from).sum::<u32>();
    (0..size / 4)
        .flat_map(|i| {
            let v = ((i as u32 * 7 + salt) % 23) as f32 * 0.25 - 2.5;
            v.to_le_bytes()
        })
        .collect()
}

/// Runs `model` once through the Rust API on a fresh software device with the given input
/// bytes; returns the output bytes by name.
pub fn rust_outputs(model: &[u8], inputs: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<u8>> {
    let dev = Arc::new(SoftDevice::new(SimConfig::default()).unwrap());
    let rt = Runtime::init(dev, RuntimeConfig::default()).unwrap();
    let m = rt.load(model, 0, &LoadOptions::default()).unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let mut out_tensors = Vec::new();
    for info in m.tensor_info() {
        let t = rt
            .allocate_tensor(Placement::Device, 0, info.size, &info.name)
            .unwrap();
        match info.usage {
            nrt_model::Usage::Input => {
                let b = inputs
                    .get(&info.name)
                    .cloned()
                    .unwrap_or_else(|| vec![0; info.size as usize]);
                t.write(&b, 0).unwrap();
                ins.add(&info.name, &t);
            }
            nrt_model::Usage::Output => {
                outs.add(&info.name, &t);
                out_tensors.push((info.name.clone(), t));
            }
        }
    }
    rt.execute(&m, &ins, &outs).unwrap();
    let r = out_tensors
        .into_iter()
        .map(|(n, t)| {
            let mut b = vec![0u8; t.size() as usize];
            t.read(&mut b, 0).unwrap();
            (n, b)
        })
        .collect();
    rt.close();
    r
}

/// The model's inputs as `(name, size)` through the Rust API.
pub fn model_inputs(model: &[u8]) -> Vec<(String, usize)> {
    let m = nrt_model::CompiledModel::decode(model).unwrap();
    m.io.iter()
        .filter(|io| io.usage == nrt_model::Usage::Input)
        .map(|io| (io.name.clone(), (io.elements() as usize) * io.dtype.size()))
        .collect()
}

/// Runs a command in `cwd`, returning its output (stdout and stderr shown on failure).
/// `LD_LIBRARY_PATH` is [`lib_dir`] alone: cargo's own value lists `target/<profile>`, whose
/// `libnrt.so` may be stale, and it would win over the programs' rpath.
/// Each program gets its own runtime directory (`NRT_RUNTIME_DIR`), so the suite's parallel
/// programs never contend for core ownership (the ownership tests set theirs).
pub fn run(cmd: &mut Command, cwd: &Path) -> Output {
    cmd.current_dir(cwd).env("LD_LIBRARY_PATH", lib_dir());
    if !cmd.get_envs().any(|(k, _)| k == "NRT_RUNTIME_DIR") {
        cmd.env("NRT_RUNTIME_DIR", private_runtime_dir());
    }
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    eprintln!(
        "--- {cmd:?}: {}\n--- stdout:\n{}--- stderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A runtime directory of its own (under the target's tmp dir; unique per call).
pub fn private_runtime_dir() -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("nrt-run")
        .join(format!("{}-{n}", std::process::id()))
}

/// Whether valgrind is on PATH.
pub fn valgrind_available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `valgrind --error-exitcode=1 --leak-check=full` with the suppressions of
/// `tests/valgrind.supp`, around `program args`.
pub fn valgrind(program: &Path, args: &[&str]) -> Command {
    let supp = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/valgrind.supp");
    let mut c = Command::new("valgrind");
    c.args([
        "--error-exitcode=1",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,possible",
        "--track-origins=yes",
    ])
    .arg(format!("--suppressions={}", supp.display()))
    .arg(program)
    .args(args);
    c
}
