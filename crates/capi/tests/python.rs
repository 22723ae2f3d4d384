//! `examples/python/smoke.py` (ctypes, standard library only) against `libnrt.so.1`: it
//! loads and runs a compiled model; its outputs must equal the Rust API's. Uses
//! `$NRT_PYTHON` if set (the test command's venv), else `python3`.

mod common;
use common::*;
use std::process::Command;

#[test]
fn python_ctypes_smoke() {
    let python = std::env::var("NRT_PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = scratch("python");
    let model = mlp();
    std::fs::write(dir.join("model.ncm"), &model).unwrap();
    let inputs = model_inputs(&model)
        .into_iter()
        .map(|(n, size)| {
            let b = input_bytes(&n, size);
            std::fs::write(dir.join(&n), &b).unwrap();
            (n, b)
        })
        .collect();
    let expected = rust_outputs(&model, &inputs);
    let want = dir.join("expected");
    std::fs::create_dir_all(&want).unwrap();
    for (n, b) in &expected {
        std::fs::write(want.join(format!("{n}.out")), b).unwrap();
    }
    let lib = lib_dir().join("libnrt.so.1");
    let o = run(
        Command::new(&python)
            .arg(root().join("examples/python/smoke.py"))
            .arg("model.ncm")
            .arg("--lib")
            .arg(&lib)
            .args(["--inputs", ".", "--out", ".", "--expect", "expected"]),
        &dir,
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "smoke.py failed ({python})");
    assert!(out.trim_end().ends_with("smoke: ok"), "{out}");
    assert!(out.contains("output mm = ["), "{out}");
}
