//! The C example programs (`examples/c/first_app.c`, `examples/c/async_loop.c`), compiled
//! with gcc against `include/` and linked with `-lnrt`, run on compiled models; their
//! output files must equal what the Rust API computes. Then once each under valgrind
//! memcheck (no leaks of their own allocations, no invalid accesses).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Case {
    name: &'static str,
    model: Vec<u8>,
    /// Inputs given as files (the others are zero-filled by the programs).
    inputs: BTreeMap<String, Vec<u8>>,
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (name, model, skip) in [
        ("near_null", near_null(), None),
        ("mlp", mlp(), None),
        // `w` has no file: the programs must use zeros, as the Rust reference does.
        ("mlp_zero_w", mlp(), Some("w")),
    ] {
        let inputs = model_inputs(&model)
            .into_iter()
            .filter(|(n, _)| Some(n.as_str()) != skip)
            .map(|(n, size)| {
                let b = input_bytes(&n, size);
                (n, b)
            })
            .collect();
        v.push(Case {
            name,
            model,
            inputs,
        });
    }
    v
}

fn build(dir: &Path) -> (PathBuf, PathBuf) {
    let ex = root().join("examples/c");
    let first = dir.join("first_app");
    let asyncp = dir.join("async_loop");
    gcc(&[ex.join("first_app.c")], &first);
    gcc(&[ex.join("async_loop.c")], &asyncp);
    (first, asyncp)
}

/// Writes the model and input files into a fresh directory.
fn stage(dir: &Path, case: &Case) -> PathBuf {
    let d = dir.join(case.name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("model.ncm"), &case.model).unwrap();
    for (n, b) in &case.inputs {
        std::fs::write(d.join(n), b).unwrap();
    }
    d
}

fn check_outputs(d: &Path, expected: &BTreeMap<String, Vec<u8>>, who: &str) {
    for (n, want) in expected {
        let got = std::fs::read(d.join(format!("{n}.out")))
            .unwrap_or_else(|e| panic!("{who}: {n}.out: {e}"));
        assert_eq!(
            &got, want,
            "{who}: output '{n}' differs from the Rust API's"
        );
        std::fs::remove_file(d.join(format!("{n}.out"))).unwrap();
    }
}

#[test]
fn c_examples_match_the_rust_api() {
    let dir = scratch("examples");
    let (first, asyncp) = build(&dir);
    for case in cases() {
        let expected = rust_outputs(&case.model, &case.inputs);
        assert!(!expected.is_empty());
        if case.name == "mlp" {
            // The model computes something: outputs are not all zero.
            assert!(expected["mm"].iter().any(|&b| b != 0));
        }
        let d = stage(&dir, &case);

        let o = run(Command::new(&first).arg("model.ncm"), &d);
        assert!(o.status.success(), "first_app on {}", case.name);
        assert!(String::from_utf8_lossy(&o.stdout).contains("first_app: ok"));
        check_outputs(&d, &expected, "first_app");

        let o = run(Command::new(&asyncp).args(["model.ncm", "64"]), &d);
        assert!(o.status.success(), "async_loop on {}", case.name);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("async_loop: ok (64 executions)"), "{out}");
        assert!(out.contains("status=NRT_SUCCESS"), "{out}");
        check_outputs(&d, &expected, "async_loop");
    }
}

#[test]
fn c_examples_under_valgrind() {
    if !valgrind_available() {
        eprintln!(
            "valgrind is not on PATH: running the C examples without memcheck (install valgrind for the leak check)"
        );
    }
    let dir = scratch("valgrind");
    let (first, asyncp) = build(&dir);
    let case = cases().into_iter().find(|c| c.name == "mlp").unwrap();
    let expected = rust_outputs(&case.model, &case.inputs);
    let d = stage(&dir, &case);
    let runs: [(&Path, &[&str]); 2] = [(&first, &["model.ncm"]), (&asyncp, &["model.ncm", "16"])];
    for (prog, args) in runs {
        let mut cmd = if valgrind_available() {
            valgrind(prog, args)
        } else {
            let mut c = Command::new(prog);
            c.args(args);
            c
        };
        let o = run(&mut cmd, &d);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success(),
            "{} under valgrind failed (exit {:?})",
            prog.display(),
            o.status.code()
        );
        if valgrind_available() {
            assert!(
                err.contains("ERROR SUMMARY: 0 errors"),
                "valgrind reported errors for {}",
                prog.display()
            );
            assert!(
                !err.contains("definitely lost: ") || err.contains("definitely lost: 0 bytes"),
                "definite leak in {}",
                prog.display()
            );
        }
        check_outputs(&d, &expected, &prog.display().to_string());
    }
}

/// `NEURON_RT_INSPECT_*` profile an unchanged C program: the synchronous one writes the
/// execution after the warm-up when it returns, the explicit-async one at unload/close (the
/// harvest captures it, no caller thread records its stages).
#[test]
fn unchanged_c_programs_are_profiled_from_the_environment() {
    let dir = scratch("inspect");
    let (first, asyncp) = build(&dir);
    let case = cases().into_iter().find(|c| c.name == "near_null").unwrap();
    let d = stage(&dir, &case);
    for (prog, args, warmup, stages) in [
        (&first, &["model.ncm"][..], "0", 5),
        (&asyncp, &["model.ncm", "32"][..], "10", 0),
    ] {
        let out = d.join(format!(
            "profiles-{}",
            prog.file_name().unwrap().to_string_lossy()
        ));
        let o = run(
            Command::new(prog)
                .args(args)
                .env("NEURON_RT_INSPECT_ENABLE", "1")
                .env("NEURON_RT_INSPECT_OUTPUT_DIR", &out)
                .env("NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP", warmup),
            &d,
        );
        assert!(o.status.success(), "{}", prog.display());
        let procs: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
        assert_eq!(procs.len(), 1, "one process directory");
        let files: Vec<_> = std::fs::read_dir(procs[0].path())
            .unwrap()
            .flatten()
            .collect();
        let n: u64 = warmup.parse::<u64>().unwrap() + 1;
        assert_eq!(files.len(), 1, "{}", prog.display());
        assert_eq!(
            files[0].file_name().to_string_lossy(),
            format!("model_1_near-null_vnc_0_exec_{n}.json")
        );
        let json = std::fs::read_to_string(files[0].path()).unwrap();
        // One execution: the (warm-up + 1)-th on the vcore, with its engines (and, for the
        // synchronous surface, its five host stages).
        let mut seqs: Vec<&str> = json
            .split("\"seq\":")
            .skip(1)
            .map(|s| s.split(',').next().unwrap())
            .collect();
        seqs.dedup();
        assert_eq!(seqs.len(), 1, "{json}");
        assert!(json.matches("\"cat\":\"engine\"").count() >= 2, "{json}");
        assert_eq!(json.matches("\"cat\":\"stage\"").count(), stages, "{json}");
    }
}
