//! `nrt conformance DIR…`: runs ONNX node-test folders (`model.onnx` +
//! `test_data_set_*/{input,output}_*.pb`, found recursively) through the compiler and the
//! software NeuronCore and compares with the expected outputs.
//!
//! Each test prints one line — `PASS name`, `FAIL name: …` with the largest error, or
//! `UNSUPPORTED name: reason` — and the run ends with `N passed, M failed, K unsupported`.
//! When a model needs the values of some inputs at compile time (a Reshape shape, Slice
//! starts, a Loop's trip count, Range bounds, …) the compiler's error names the graph inputs
//! that value depends on (`CompileError::needs_inputs`); the runner binds exactly those to
//! the data set's values, compiles again, and says so (`specialized a,b`).

use crate::args::ConformanceArgs;
use crate::session::{self, Res};
use nrt_compiler::{CompileOptions, HostTensor};
use nrt_runtime::{DType, LoadOptions, Runtime, RuntimeConfig};
use std::path::{Path, PathBuf};

enum Outcome {
    Pass(String),
    Fail(String),
    Unsupported(String),
}

fn find_tests(dir: &Path, out: &mut Vec<PathBuf>) {
    if dir.join("model.onnx").is_file() {
        out.push(dir.to_path_buf());
        return;
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut v: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        v.sort();
        for p in v {
            find_tests(&p, out);
        }
    }
}

fn read_pbs(dir: &Path, prefix: &str) -> Res<Vec<(String, HostTensor)>> {
    let mut v = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.is_file() {
            break;
        }
        v.push(nrt_compiler::read_tensor_pb(&p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
    Ok(v)
}

/// Graph input names that are not initializers, in order.
fn graph_inputs(bytes: &[u8]) -> Res<(Vec<String>, Vec<String>)> {
    let m =
        nrt_compiler::onnx::decode_model(bytes).map_err(|e| format!("not an ONNX model: {e}"))?;
    let g = m.graph.unwrap_or_default();
    let inits: std::collections::HashSet<&str> =
        g.initializer.iter().map(|t| t.name.as_str()).collect();
    let ins = g
        .input
        .iter()
        .map(|v| v.name.clone())
        .filter(|n| !inits.contains(n.as_str()))
        .collect();
    let outs = g.output.iter().map(|v| v.name.clone()).collect();
    Ok((ins, outs))
}

/// Why a model's inputs or outputs are out of scope (sequence, optional or map values,
/// string tensors: the device holds numeric tensors only), before their `.pb` files are read
/// as tensors (which would fail with a decoding error instead of the reason).
fn out_of_scope_io(bytes: &[u8]) -> Option<String> {
    let g = nrt_compiler::onnx::decode_model(bytes).ok()?.graph?;
    for v in g.input.iter().chain(&g.output) {
        let Some(t) = &v.r#type else { continue };
        let what = if t.sequence_type.is_some() {
            "a sequence"
        } else if t.optional_type.is_some() {
            "an optional"
        } else if t.map_type.is_some() {
            "a map"
        } else if t.tensor_type.as_ref().is_some_and(|t| t.elem_type == 8) {
            "a string tensor"
        } else if t
            .tensor_type
            .as_ref()
            .is_some_and(|t| (17..=26).contains(&t.elem_type))
        {
            // FLOAT8E4M3FN … INT2: the 8-, 4- and 2-bit types (out of scope by decision).
            return Some(format!(
                "'{}' is a float8/float4/int4/int2 tensor (out of scope: sub-byte and 8-bit \
                 float types are not device types)",
                v.name
            ));
        } else {
            continue;
        };
        return Some(format!(
            "'{}' is {what} (out of scope: the device holds numeric tensors only)",
            v.name
        ));
    }
    None
}

fn to_f64s(t: &HostTensor) -> Vec<f64> {
    (0..t.len()).map(|i| t.get_f64(i)).collect()
}

/// Compares an output; returns the largest violation, if any. A half-precision output may
/// differ by one unit in the last place of its type (2^-10 for float16, 2^-7 for bfloat16),
/// relative to the element and to the tensor's largest magnitude: the reference rounds to
/// the half type at every operator as the device does (`compiler/src/widen.rs`), but inside
/// an operator one side accumulates in the half type or in another order, and one-ulp
/// differences of a layer's outputs carry into the sums of the next.
fn compare(got: &HostTensor, want: &HostTensor, rtol: f64, atol: f64) -> Option<String> {
    if got.shape != want.shape {
        return Some(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    let (g, w) = (to_f64s(got), to_f64s(want));
    let ulp = match want.dtype {
        DType::F16 => f64::powi(2.0, -10),
        DType::Bf16 => f64::powi(2.0, -7),
        _ => 0.0,
    };
    let scale = w
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |m, x| m.max(x.abs()));
    let (rtol, atol) = (rtol.max(ulp), atol.max(ulp * scale));
    let mut worst: Option<(f64, usize)> = None;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
        if !ok {
            let err = if a.is_finite() && b.is_finite() {
                (a - b).abs()
            } else {
                f64::INFINITY
            };
            if worst.is_none_or(|(e, _)| err > e) {
                worst = Some((err, i));
            }
        }
    }
    worst.map(|(e, i)| {
        format!(
            "max abs error {e:.3e} at element {i} (got {}, expected {})",
            g[i], w[i]
        )
    })
}

/// Largest error of `got` against `want` relative to the output's scale:
/// `max |g − w| / max |w|` (a per-element ratio is meaningless where ReLU outputs are 0).
fn max_rel_error(got: &HostTensor, want: &HostTensor) -> f64 {
    let (g, w) = (to_f64s(got), to_f64s(want));
    let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
    let err = g
        .iter()
        .zip(&w)
        .map(|(a, b)| (a - b).abs())
        .fold(0f64, f64::max);
    if scale > 0.0 { err / scale } else { err }
}

fn run_test(rt: &Runtime, dir: &Path, rtol: f64, atol: f64, cast: &CompileOptions) -> Outcome {
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Fail(format!("reading model.onnx: {e}")),
    };
    let ops = match nrt_compiler::model_op_types(&bytes) {
        Ok(o) => o,
        Err(e) => return Outcome::Unsupported(e.to_string()),
    };
    if let Some(op) = nrt_compiler::first_unsupported_op(&ops) {
        let why = nrt_compiler::out_of_scope_reason(op)
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        return Outcome::Unsupported(format!("op {op} is not supported{why}"));
    }
    if let Some(why) = out_of_scope_io(&bytes) {
        return Outcome::Unsupported(why);
    }
    let (in_names, out_names) = match graph_inputs(&bytes) {
        Ok(x) => x,
        Err(e) => return Outcome::Fail(e),
    };
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    sets.sort();
    if sets.is_empty() {
        return Outcome::Unsupported("no test_data_set".into());
    }
    let mut notes = Vec::new();
    let mut worst_rel = 0f64;
    for set in &sets {
        let (inputs, outputs) = match (read_pbs(set, "input"), read_pbs(set, "output")) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => return Outcome::Unsupported(e),
        };
        // Inputs by graph name (the .pb names, else position).
        let named: Vec<(String, HostTensor)> = inputs
            .into_iter()
            .enumerate()
            .map(|(i, (n, t))| {
                (
                    if n.is_empty() {
                        in_names.get(i).cloned().unwrap_or(n)
                    } else {
                        n
                    },
                    t,
                )
            })
            .collect();
        let mut opts = CompileOptions {
            auto_cast: cast.auto_cast,
            auto_cast_type: cast.auto_cast_type,
            cores: cast.cores,
            ..CompileOptions::default()
        };
        for (n, t) in &named {
            opts.input_shapes.insert(n.clone(), t.shape.clone());
        }
        let compiled = match specialize_and_compile(&bytes, dir, &opts, &named) {
            Ok((c, bound)) => {
                if !bound.is_empty() {
                    notes.push(format!("specialized {}", bound.join(",")));
                }
                c
            }
            Err(e) if e.kind.is_unsupported() => return Outcome::Unsupported(e.to_string()),
            Err(e) => return Outcome::Fail(format!("compile: {e}")),
        };
        let m = match rt.load(&compiled.model.encode(), 0, &LoadOptions::default()) {
            Ok(m) => m,
            Err(e) => return Outcome::Fail(format!("load: {e}")),
        };
        let result = (|| -> Res<Option<String>> {
            let (ins, outs, all) = session::io_tensors(rt, &m)?;
            for (n, t) in &named {
                if let Some((info, _)) = all.iter().find(|(i, _)| &i.name == n) {
                    ins.get(n)
                        .expect("allocated")
                        .write(&session::to_device_bytes(t, info.dtype), 0)
                        .map_err(|e| e.to_string())?;
                }
            }
            rt.execute(&m, &ins, &outs)
                .map_err(|e| format!("execute: {e}"))?;
            for (i, (pb_name, want)) in outputs.iter().enumerate() {
                let name = if pb_name.is_empty() {
                    out_names.get(i).cloned().unwrap_or_default()
                } else {
                    pb_name.clone()
                };
                let Some((info, t)) = all.iter().find(|(inf, _)| inf.name == name) else {
                    return Ok(Some(format!(
                        "output '{name}' is not an output of the compiled model"
                    )));
                };
                let got = session::read_output(&all, info, t)?;
                if cast.auto_cast != nrt_compiler::AutoCast::None {
                    worst_rel = worst_rel.max(max_rel_error(&got, want));
                }
                if let Some(why) = compare(&got, want, rtol, atol) {
                    return Ok(Some(format!(
                        "output '{name}' ({}): {why}",
                        set.file_name().unwrap_or_default().to_string_lossy()
                    )));
                }
            }
            Ok(None)
        })();
        let _ = rt.unload(&m);
        match result {
            Ok(None) => {}
            Ok(Some(why)) => return Outcome::Fail(why),
            Err(e) => return Outcome::Fail(e),
        }
    }
    notes.dedup();
    if cast.auto_cast != nrt_compiler::AutoCast::None {
        notes.push(format!("max error / max |reference| {worst_rel:.2e}"));
    }
    Outcome::Pass(notes.join("; "))
}

/// Compiles the model; when that fails because a value must be known at compile time, binds
/// the graph inputs the compiler says it depends on (`CompileError::needs_inputs`) to the
/// data set's values and tries again, until it compiles or nothing new can be bound.
/// Returns the model and the inputs bound, in the order they were.
fn specialize_and_compile(
    bytes: &[u8],
    dir: &Path,
    opts: &CompileOptions,
    named: &[(String, HostTensor)],
) -> Result<(nrt_compiler::Compiled, Vec<String>), nrt_compiler::CompileError> {
    let mut spec = opts.clone();
    let mut bound: Vec<String> = Vec::new();
    loop {
        let e = match nrt_compiler::compile(bytes, Some(dir), &spec) {
            Ok(c) => return Ok((c, bound)),
            Err(e) => e,
        };
        if e.needs_inputs.is_empty() {
            return fallback(bytes, dir, &spec, named, bound, e);
        }
        let mut progress = false;
        for want in &e.needs_inputs {
            if bound.contains(want) {
                continue;
            }
            if let Some((_, t)) = named.iter().find(|(n, _)| n == want) {
                spec.input_values.insert(want.clone(), t.clone());
                bound.push(want.clone());
                progress = true;
            }
        }
        if !progress {
            return fallback(bytes, dir, &spec, named, bound, e);
        }
    }
}

/// The runner's older guesses, for failures the compiler does not tie to input values (an
/// element type the device lacks, which folding the whole graph on the host avoids): bind
/// every input that is not floating point (shapes, indices, axes, …), else every input but
/// the first (Clip bounds, batch-norm statistics, …).
fn fallback(
    bytes: &[u8],
    dir: &Path,
    spec: &CompileOptions,
    named: &[(String, HostTensor)],
    bound: Vec<String>,
    first: nrt_compiler::CompileError,
) -> Result<(nrt_compiler::Compiled, Vec<String>), nrt_compiler::CompileError> {
    let ints: Vec<&String> = named
        .iter()
        .filter(|(_, t)| !nrt_compiler::tensor::is_float(t.dtype))
        .map(|(n, _)| n)
        .collect();
    let rest: Vec<&String> = named.iter().skip(1).map(|(n, _)| n).collect();
    for which in [ints, rest] {
        if which.iter().all(|n| bound.contains(n)) {
            continue;
        }
        let mut s = spec.clone();
        let mut b = bound.clone();
        for (n, t) in named {
            if which.contains(&n) && !b.contains(n) {
                s.input_values.insert(n.clone(), t.clone());
                b.push(n.clone());
            }
        }
        if let Ok(c) = nrt_compiler::compile(bytes, Some(dir), &s) {
            return Ok((c, b));
        }
    }
    Err(first)
}

/// Reads per-test tolerance overrides: lines `TEST RTOL ATOL  # reason`.
fn read_tolerances(path: &str) -> Res<Vec<(String, f64, f64)>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("{path}:{}: expected `TEST RTOL ATOL`", i + 1);
        if f.len() != 3 {
            return Err(bad());
        }
        v.push((
            f[0].to_owned(),
            f[1].parse().map_err(|_| bad())?,
            f[2].parse().map_err(|_| bad())?,
        ));
    }
    Ok(v)
}

/// Whether the test's model uses an op the compiler does not list.
fn uses_unlisted_op(dir: &Path) -> bool {
    std::fs::read(dir.join("model.onnx"))
        .ok()
        .and_then(|b| nrt_compiler::model_op_types(&b).ok())
        .is_some_and(|ops| nrt_compiler::first_unsupported_op(&ops).is_some())
}

pub fn main(a: &ConformanceArgs) -> Res<bool> {
    let (rtol, atol, quiet) = (a.rtol, a.atol, a.quiet);
    let overrides = match &a.tolerances {
        Some(f) => read_tolerances(f)?,
        None => Vec::new(),
    };
    let only_supported = a.only_supported;
    let cast = CompileOptions {
        auto_cast: a.cast.auto_cast.into(),
        auto_cast_type: a.cast.auto_cast_type.into(),
        cores: a.cores as _,
        ..CompileOptions::default()
    };
    let mut dirs = Vec::new();
    for d in &a.dirs {
        find_tests(d, &mut dirs);
    }
    let (_dev, rt) = session::runtime(Some(RuntimeConfig {
        logical_nc: a.cores as u32,
        ..RuntimeConfig::default()
    }))?;
    let (mut pass, mut fail, mut unsup, mut skipped) = (0, 0, 0, 0);
    // On stderr, drawn only when it is a terminal; report lines go around it.
    let bar = indicatif::ProgressBar::new(dirs.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {wide_msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let say = |line: String| bar.suspend(|| println!("{line}"));
    for d in &dirs {
        bar.inc(1);
        let name = d
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        bar.set_message(name.clone());
        if only_supported && uses_unlisted_op(d) {
            skipped += 1;
            continue;
        }
        let (rt_, at_) = overrides
            .iter()
            .find(|(n, _, _)| *n == name)
            .map_or((rtol, atol), |&(_, r, a)| (r, a));
        match run_test(&rt, d, rt_, at_, &cast) {
            Outcome::Pass(note) => {
                pass += 1;
                if !quiet {
                    if note.is_empty() {
                        say(format!("PASS {name}"))
                    } else {
                        say(format!("PASS {name} ({note})"))
                    }
                }
            }
            Outcome::Fail(why) => {
                fail += 1;
                say(format!("FAIL {name}: {why}"));
            }
            Outcome::Unsupported(why) => {
                unsup += 1;
                say(format!("UNSUPPORTED {name}: {why}"));
            }
        }
    }
    bar.finish_and_clear();
    if only_supported {
        println!("({skipped} tests use ops outside the supported list and were not run)");
    }
    println!("{pass} passed, {fail} failed, {unsup} unsupported");
    Ok(fail == 0)
}
