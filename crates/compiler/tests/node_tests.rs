//! Compiles every ONNX backend node test whose operators are all supported.
//!
//! The tests live in the `onnx` Python package (`onnx/backend/test/data/node`); the
//! directory is taken from `NRT_ONNX_NODE_TESTS`, else the project's `.venv`. Without it the
//! test prints a note and passes. Inputs the compiler needs at compile time (it names them:
//! `CompileError::needs_inputs`) are specialized with the test's own input values, like
//! `nrt conformance` does.

use nrt_compiler::check::check_ordering;
use nrt_compiler::{
    CompileOptions, ErrorKind, compile, first_unsupported_op, model_op_types, read_tensor_pb,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn node_test_dir() -> Option<PathBuf> {
    if let Ok(d) = std::env::var("NRT_ONNX_NODE_TESTS") {
        return Some(PathBuf::from(d));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for venv in [".venv", "../peers-work/venv"] {
        let d = root
            .join(venv)
            .join("lib/python3.11/site-packages/onnx/backend/test/data/node");
        if d.is_dir() {
            return Some(d);
        }
    }
    None
}

fn pbs(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = (0..)
        .map(|i| dir.join(format!("{prefix}_{i}.pb")))
        .take_while(|p| p.exists())
        .collect();
    v.sort_by_key(|p| p.to_string_lossy().len());
    v
}

#[test]
fn onnx_node_tests_compile_or_are_unsupported_with_a_reason() {
    let Some(root) = node_test_dir() else {
        eprintln!("ONNX node tests not found; set NRT_ONNX_NODE_TESTS");
        return;
    };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let (mut ok, mut out_of_scope) = (0, 0);
    let mut unsupported: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut failures: Vec<String> = Vec::new();
    for d in &dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        let Ok(bytes) = std::fs::read(d.join("model.onnx")) else {
            continue;
        };
        let ops = match model_op_types(&bytes) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        if first_unsupported_op(&ops).is_some() {
            out_of_scope += 1;
            continue;
        }
        let data = d.join("test_data_set_0");
        let inputs = pbs(&data, "input");
        let outputs = pbs(&data, "output");
        let mut opts = CompileOptions::default();
        let mut res = compile(&bytes, Some(d), &opts);
        // Specialize inputs the compiler needs at compile time (shapes, axes, scales…)
        // with the test's values, one at a time, as `nrt conformance` does.
        let g = nrt_compiler::onnx::decode_model(&bytes)
            .unwrap()
            .graph
            .unwrap();
        let init: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        let names: Vec<&str> = g
            .input
            .iter()
            .map(|i| i.name.as_str())
            .filter(|n| !init.contains(n))
            .collect();
        for _ in 0..names.len() {
            let Err(e) = &res else { break };
            // The graph inputs the compiler names (`needs_inputs`); else the input its
            // message names.
            let wanted: Vec<String> = if !e.needs_inputs.is_empty() {
                e.needs_inputs.clone()
            } else if e.message.contains("input_values")
                && let Some(rest) = e.message.split("input '").nth(1)
            {
                vec![rest.split('\'').next().unwrap_or("").to_string()]
            } else {
                break;
            };
            let mut added = false;
            for w in wanted {
                if opts.input_values.contains_key(&w) {
                    continue;
                }
                let Some(k) = names.iter().position(|n| *n == w) else {
                    continue;
                };
                let Some(Ok((_, t))) = inputs.get(k).map(|p| read_tensor_pb(p)) else {
                    continue;
                };
                opts.input_values.insert(w, t);
                added = true;
            }
            if !added {
                break;
            }
            res = compile(&bytes, Some(d), &opts);
        }
        match res {
            Ok(c) => {
                if let Err(e) = check_ordering(&c.model) {
                    failures.push(format!("{name}: ordering: {e}"));
                    continue;
                }
                // Output shapes agree with the expected outputs; an output whose extent
                // depends on the data (it has a `<name>:shape` companion, not itself an
                // output of the graph) holds an upper bound of it.
                let all: Vec<_> = c.model.outputs().map(|(_, t)| t.clone()).collect();
                let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
                let companion = |n: &str| {
                    n.strip_suffix(":shape")
                        .is_some_and(|base| names.contains(&base))
                };
                let outs: Vec<_> = all.iter().filter(|t| !companion(&t.name)).collect();
                for (i, p) in outputs.iter().enumerate() {
                    if let (Ok((_, t)), Some(o)) = (read_tensor_pb(p), outs.get(i)) {
                        let want: Vec<u32> = t.shape.iter().map(|&d| d as u32).collect();
                        let bounded = names.contains(&format!("{}:shape", o.name).as_str());
                        let fits = if bounded {
                            want.len() == o.shape.len()
                                && want.iter().zip(&o.shape).all(|(w, b)| w <= b)
                        } else {
                            want == o.shape
                        };
                        if !fits || t.dtype != o.dtype {
                            failures.push(format!(
                                "{name}: output {i} is {} {:?}, expected {} {:?}",
                                o.dtype, o.shape, t.dtype, want
                            ));
                        }
                    }
                }
                let mut two = opts.clone();
                two.cores = 2;
                match compile(&bytes, Some(d), &two) {
                    Ok(c2) => {
                        if let Err(e) = check_ordering(&c2.model) {
                            failures.push(format!("{name}: 2 cores: ordering: {e}"));
                        }
                    }
                    Err(e) => failures.push(format!("{name}: 2 cores: {e}")),
                }
                ok += 1;
            }
            Err(e) if e.kind.is_unsupported() => {
                unsupported.entry(e.to_string()).or_default().push(name);
            }
            Err(e) if e.kind == ErrorKind::Internal => failures.push(format!("{name}: {e}")),
            Err(e) => unsupported
                .entry(format!("[rejected] {e}"))
                .or_default()
                .push(name),
        }
    }
    let n_uns: usize = unsupported.values().map(|v| v.len()).sum();
    eprintln!(
        "node tests: {ok} compiled, {n_uns} unsupported/rejected, {out_of_scope} use other ops, {} failed",
        failures.len()
    );
    for (reason, tests) in &unsupported {
        eprintln!(
            "  UNSUPPORTED {} × {reason}: {}",
            tests.len(),
            tests.join(" ")
        );
    }
    for f in &failures {
        eprintln!("  FAIL {f}");
    }
    assert!(failures.is_empty(), "{} node tests failed", failures.len());
}
