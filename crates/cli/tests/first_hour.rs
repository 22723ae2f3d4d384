//! A new user's first mistakes (issue 53): each error says what was wrong and points at the
//! fix, and `nrt --help` lists every environment variable the code reads.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{nrt, ok, s, scratch};

fn fails(args: &[&str]) -> (String, String) {
    let out = nrt(args);
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(2), "nrt {args:?}:\n{o}{e}");
    (o, e)
}

/// Writes a float32 `.npy` of `shape` with values 0, 0.01, 0.02, ...
fn write_npy_f32(path: &Path, shape: &[usize]) {
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
    common::write_npy_f32(path, shape, &data);
}

/// The `mlp` sample (input `X`, f32 [1, 512]) as ONNX and compiled.
fn mlp(dir: &Path) -> (PathBuf, PathBuf) {
    ok(&["samples", "--out", s(dir)]);
    let onnx = dir.join("mlp/model.onnx");
    let ncm = dir.join("mlp.ncm");
    ok(&["compile", s(&onnx), "-o", s(&ncm)]);
    (onnx, ncm)
}

/// A wrong input name is refused before any input is filled (no "random values" line),
/// listing the model's inputs — for a compiled model and for an ONNX one.
#[test]
fn a_wrong_input_name_lists_the_models_inputs() {
    let dir = scratch("first-hour-input-name");
    let (onnx, ncm) = mlp(&dir);
    let x = dir.join("x.npy");
    write_npy_f32(&x, &[1, 512]);
    for model in [&ncm, &onnx] {
        let (out, err) = fails(&["run", s(model), "--input", &format!("x={}", s(&x))]);
        assert!(
            err.contains("no input named 'x'") && err.contains("its inputs: 'X'"),
            "{err}"
        );
        assert!(!out.contains("random values"), "{out}");
    }
    // The right name runs.
    ok(&["run", s(&ncm), "--input", &format!("X={}", s(&x))]);
}

/// Compile options given for a model that is already compiled are refused, saying why,
/// instead of being ignored.
#[test]
fn compile_options_for_a_compiled_model_are_refused() {
    let dir = scratch("first-hour-ncm-flags");
    let (_onnx, ncm) = mlp(&dir);
    for (flags, named) in [
        (&["--input-shape", "X=4,512"][..], "--input-shape X=4,512"),
        (&["--cores", "2"][..], "--cores 2"),
    ] {
        for sub in ["run", "inspect", "bench"] {
            let mut args = vec![sub, s(&ncm)];
            args.extend_from_slice(flags);
            let (_, err) = fails(&args);
            assert!(
                err.contains(named)
                    && err.contains("applies only when compiling an ONNX model")
                    && err.contains("already compiled"),
                "nrt {args:?}: {err}"
            );
        }
    }
    // `--cores` of the built-in near-null model of `nrt bench` (no model) still applies.
    ok(&[
        "bench",
        "--surface",
        "sync",
        "--cores",
        "1",
        "--seconds",
        "0.05",
    ]);
}

/// An input file of the wrong shape is refused naming both shapes: the same element count in
/// another shape too (it was accepted), and a wrong size in shapes and elements, not bytes
/// alone.
#[test]
fn an_input_file_of_the_wrong_shape_names_both_shapes() {
    let dir = scratch("first-hour-npy-shape");
    let (_onnx, ncm) = mlp(&dir);
    let t = dir.join("t.npy");
    write_npy_f32(&t, &[512, 1]);
    let (_, err) = fails(&["run", s(&ncm), "--input", &format!("X={}", s(&t))]);
    assert!(
        err.contains("t.npy: shape [512, 1] for input 'X', which takes shape [1, 512]")
            && err.contains("the same 512 elements in another shape"),
        "{err}"
    );
    let small = dir.join("small.npy");
    write_npy_f32(&small, &[2]);
    let (_, err) = fails(&["run", s(&ncm), "--input", &format!("X={}", s(&small))]);
    assert!(
        err.contains("small.npy: shape [2] (2 elements of f32) for input 'X', which takes shape [1, 512] (512 elements of f32, 2048 bytes)"),
        "{err}"
    );
}

/// An ONNX file given where a compiled model is expected says so and what to do.
#[test]
fn an_onnx_file_given_as_a_compiled_model_says_what_to_do() {
    let dir = scratch("first-hour-onnx-as-ncm");
    ok(&["samples", "--out", s(&dir)]);
    let renamed = dir.join("model.ncm");
    std::fs::copy(dir.join("mlp/model.onnx"), &renamed).expect("copy");
    for sub in ["inspect", "run"] {
        let (_, err) = fails(&[sub, s(&renamed)]);
        assert!(
            err.contains("model.ncm")
                && err.contains("this is ONNX")
                && err.contains("compile it with `nrt compile` or pass it to `nrt run`"),
            "nrt {sub}: {err}"
        );
        assert!(!err.contains("bad magic"), "{err}");
    }
}

/// Every `NEURON_*` / `NRT_*` variable the crates' sources read is listed by `nrt --help`,
/// with a default.
#[test]
fn help_lists_every_environment_variable_the_code_reads() {
    let help = ok(&["--help"]);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let read = regex::Regex::new(
        r#"(?:env::var(?:_os)?\(|\bvar\(|getenv\(|_VAR: &str = )\s*"((?:NEURON|NRT)_[A-Z0-9_]+)""#,
    )
    .expect("regex");
    let mut names = std::collections::BTreeSet::new();
    let mut stack = vec![root.join("crates"), root.join("python/src")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                // Sources only: tests, benches and examples read their own variables.
                if !matches!(name, "tests" | "benches" | "examples" | "target") {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") {
                let text = std::fs::read_to_string(&p).expect("source");
                for c in read.captures_iter(&text) {
                    names.insert(c[1].to_owned());
                }
            }
        }
    }
    // The per-module log levels are read by a formatted name.
    for m in ["NRT", "NMGR", "TDRV"] {
        names.insert(format!("NEURON_RT_LOG_LEVEL_{m}"));
    }
    assert!(names.len() > 15, "the grep found too few: {names:?}");
    let listed = |n: &str| {
        help.lines()
            .any(|l| l.split_whitespace().next() == Some(n) && l.contains(':'))
    };
    let missing: Vec<&String> = names.iter().filter(|n| !listed(n)).collect();
    assert!(
        missing.is_empty(),
        "nrt --help does not list {missing:?}:\n{help}"
    );
}

/// Through a link named `neuron-ls`, `nrt` answers as `nrt ls` (Ray's Neuron detector runs
/// `neuron-ls --json-output` and sums `nc_count`); `nrt install-tools` makes the links,
/// keeps its own on a second run, and refuses to replace a file that is not its link.
#[test]
fn nrt_answers_as_the_neuron_tools_and_install_tools_makes_the_links() {
    let dir = scratch("first-hour-tools");
    let bin = dir.join("bin");
    let out = ok(&["install-tools", s(&bin)]);
    for tool in ["neuron-ls", "neuron-monitor", "neuron-top"] {
        let link = bin.join(tool);
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("the link")
                .file_type()
                .is_symlink(),
            "{tool}"
        );
        assert!(out.contains(&format!("made {}", link.display())), "{out}");
    }
    let out = ok(&["install-tools", s(&bin)]);
    assert!(out.contains("kept"), "{out}");

    // neuron-ls --json-output, parsed as Ray parses it.
    let o = Command::new(bin.join("neuron-ls"))
        .arg("--json-output")
        .env("NRT_RUNTIME_DIR", dir.join("run"))
        .env_remove("NRT_SIM_INSTANCE")
        .output()
        .expect("run neuron-ls");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let devices: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let cores: u64 = devices
        .as_array()
        .expect("an array of devices")
        .iter()
        .map(|d| d["nc_count"].as_u64().expect("nc_count"))
        .sum();
    assert_eq!(cores, 2, "{devices}");
    // Its --help is `nrt ls`'s.
    let o = Command::new(bin.join("neuron-ls"))
        .arg("--help")
        .output()
        .expect("run neuron-ls --help");
    assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: nrt ls"));

    // A file that is not the link is left alone, and no link is made beside it.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).expect("dir");
    std::fs::write(other.join("neuron-top"), "#!/bin/sh\n").expect("write");
    let (_, err) = fails(&["install-tools", s(&other)]);
    assert!(
        err.contains("neuron-top already exists and is not a link to"),
        "{err}"
    );
    assert!(!other.join("neuron-ls").exists(), "nothing made");
}

/// `nrt monitor`'s report carries neuron-monitor's per-vCPU usage: one entry per online
/// vCPU (the `cpuN` lines of /proc/stat), each with the seven percentages, as AWS's
/// neuron-monitor-prometheus.py reads them (`system_vcpu_count` is its length).
#[test]
fn the_monitor_report_has_per_vcpu_usage() {
    let dir = scratch("first-hour-monitor");
    let o = Command::new(env!("CARGO_BIN_EXE_nrt"))
        .args(["monitor", "--count", "1", "--period", "0.2"])
        .env("NRT_RUNTIME_DIR", dir.join("run"))
        .output()
        .expect("run nrt monitor");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line = o.stdout.split(|&b| b == b'\n').next().expect("a report");
    let r: serde_json::Value = serde_json::from_slice(line).expect("JSON");
    let vcpu = &r["system_data"]["vcpu_usage"];
    let per = vcpu["usage_data"].as_object().expect("usage_data");
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let online: Vec<String> = stat
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|k| k.strip_prefix("cpu").filter(|n| !n.is_empty()))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        per.keys()
            .cloned()
            .collect::<std::collections::BTreeSet<_>>(),
        online.into_iter().collect(),
        "{vcpu}"
    );
    for (n, u) in per {
        for k in [
            "user", "nice", "system", "idle", "io_wait", "irq", "soft_irq",
        ] {
            let v = u[k].as_f64().unwrap_or(-1.0);
            assert!((0.0..=100.0).contains(&v), "vCPU {n} {k}: {u}");
        }
    }
    assert!(vcpu["average_usage"]["idle"].is_number(), "{vcpu}");
    assert!(vcpu["context_switch_count"].is_u64(), "{vcpu}");
}

/// The demo ends with what its words mean and what to try next.
#[test]
fn the_demo_ends_with_a_glossary_and_next_steps() {
    let out = ok(&["demo", "--seconds", "0.05"]);
    let tail: Vec<&str> = out.lines().rev().take(5).collect();
    let tail = tail.join("\n");
    for word in [
        "arena",
        "lowered",
        "harvest",
        "reload-config",
        "PE, ACT",
        "next: nrt",
    ] {
        assert!(tail.contains(word), "{word}: {tail}");
    }
}
