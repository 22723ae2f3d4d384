//! The `nrt` binary end to end: every subcommand on a real model, and the errors a user
//! gets for bad input (exit status 2 and a message naming the culprit).

use std::path::Path;

mod common;
use common::{nrt, nrt_command, ok, s, scratch, write_npy_f32};

/// Runs a command that must fail with exit status 2; returns its stderr.
fn fails(args: &[&str]) -> String {
    let out = nrt(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "nrt {args:?} should fail with status 2:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stderr).expect("utf-8 errors")
}

/// A tensor's `ValueInfoProto`: element type `elem_type`, dimensions as given (`-1` kept as
/// the value, as exporters write an unknown batch dimension).
fn value_info(name: &str, elem_type: i32, dims: &[i64]) -> nrt_compiler::onnx::ValueInfoProto {
    use nrt_compiler::onnx::*;
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&v| Dimension {
                            dim_value: Some(v),
                            dim_param: None,
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
    }
}

/// A node of the default domain, named after its one output.
fn node(op: &str, inputs: &[&str], output: &str) -> nrt_compiler::onnx::NodeProto {
    nrt_compiler::onnx::NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        name: output.into(),
        op_type: op.into(),
        ..Default::default()
    }
}

/// An opset-17 ONNX model of one graph, encoded.
fn onnx_model(
    name: &str,
    node: Vec<nrt_compiler::onnx::NodeProto>,
    input: Vec<nrt_compiler::onnx::ValueInfoProto>,
    output: Vec<nrt_compiler::onnx::ValueInfoProto>,
) -> Vec<u8> {
    use nrt_compiler::onnx::*;
    encode_model(&ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: name.into(),
            node,
            input,
            output,
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[test]
fn compile_inspect_run_trace_and_bench_a_sample_model() {
    let dir = scratch("cli-mlp");
    ok(&["samples", "--out", s(&dir)]);
    let onnx = dir.join("mlp/model.onnx");
    assert!(onnx.is_file(), "samples wrote {}", onnx.display());

    let ncm = dir.join("mlp.ncm");
    ok(&["compile", s(&onnx), "-o", s(&ncm)]);
    assert!(std::fs::metadata(&ncm).expect("ncm written").len() > 0);

    let inspect = ok(&["inspect", s(&ncm)]);
    assert!(
        inspect.contains("Input X") && inspect.contains("Output Y"),
        "inspect lists the I/O:\n{inspect}"
    );
    // The sample MLP's layers are MatMul + Add + Relu: each one MatMul with its epilogue.
    assert!(
        inspect.contains("fused epilogues (")
            && inspect.contains("+ bias (strides [0, 0, 0, 1]) + Relu"),
        "inspect shows the fused epilogues:\n{inspect}"
    );
    assert!(inspect.contains("auto-cast: none (4 MatMuls)"), "{inspect}");
    // Auto-cast: the weights are stored in bf16 (half the bytes), and inspect says so.
    let cast = dir.join("mlp_bf16.ncm");
    ok(&[
        "compile",
        s(&onnx),
        "-o",
        s(&cast),
        "--auto-cast",
        "matmult",
    ]);
    let (f32_len, bf16_len) = (
        std::fs::metadata(&ncm).unwrap().len(),
        std::fs::metadata(&cast).unwrap().len(),
    );
    assert!(bf16_len * 10 < f32_len * 6, "{bf16_len} vs {f32_len} bytes");
    let inspect = ok(&["inspect", s(&cast)]);
    assert!(
        inspect.contains("auto-cast: matmult bf16 (4 MatMuls, 4 with bf16 weights)"),
        "{inspect}"
    );
    ok(&["run", s(&cast), "--seed", "7"]);

    let outputs = dir.join("out");
    ok(&["run", s(&ncm), "--output-dir", s(&outputs), "--seed", "7"]);
    let written: Vec<_> = std::fs::read_dir(&outputs)
        .expect("output dir")
        .flatten()
        .collect();
    assert!(!written.is_empty(), "run writes the outputs as .pb files");

    let trace = dir.join("trace.json");
    ok(&["trace", s(&ncm), "-o", s(&trace), "--executions", "3"]);
    let json = std::fs::read_to_string(&trace).expect("trace written");
    assert!(json.contains("traceEvents"), "Perfetto/Chrome JSON");
    for stage in ["bind", "stage", "doorbell", "harvest"] {
        assert!(json.contains(stage), "trace shows the {stage} stage");
    }
    assert!(
        !json.contains("\"cat\":\"instruction\""),
        "instructions only with --instructions"
    );
    let printed = ok(&[
        "trace",
        s(&ncm),
        "-o",
        s(&trace),
        "--executions",
        "3",
        "--instructions",
    ]);
    let json = std::fs::read_to_string(&trace).expect("trace written");
    assert!(
        json.contains("\"cat\":\"instruction\"") && json.contains("\"exec_idx\""),
        "one event per instruction"
    );
    assert!(
        printed.contains("device time by opcode"),
        "where the device time went: {printed}"
    );

    let bench = ok(&["bench", s(&ncm), "--seconds", "0.05", "--json"]);
    assert!(
        bench.contains("\"median_ns\"") || bench.contains("median"),
        "{bench}"
    );
}

/// `nrt run` and `nrt trace` of a two-core model size the logical core to it when
/// `NEURON_LOGICAL_NC_CONFIG` is not set (as `nrt bench --cores 2` does); a value set there
/// is the user's and is kept, so a one-core logical core still refuses the model.
#[test]
fn run_and_trace_a_two_core_model_without_the_logical_core_variable() {
    let dir = scratch("cli-two-core");
    ok(&["samples", "--out", s(&dir)]);
    let onnx = dir.join("mlp/model.onnx");
    let ncm = dir.join("mlp2.ncm");
    let with_lnc = |args: &[&str], lnc: Option<&str>| {
        let mut c = nrt_command(args);
        c.env_remove("NEURON_LOGICAL_NC_CONFIG");
        if let Some(v) = lnc {
            c.env("NEURON_LOGICAL_NC_CONFIG", v);
        }
        c.output().expect("run nrt")
    };
    let out = with_lnc(&["compile", s(&onnx), "-o", s(&ncm), "--cores", "2"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = dir.join("trace.json");
    for args in [
        vec!["run", s(&onnx), "--cores", "2", "--seed", "3"],
        vec!["run", s(&ncm), "--seed", "3"],
        vec!["trace", s(&ncm), "-o", s(&trace), "--executions", "2"],
    ] {
        let out = with_lnc(&args, None);
        assert!(
            out.status.success(),
            "nrt {args:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = with_lnc(&["run", s(&ncm), "--seed", "3"], Some("1"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("NEURON_LOGICAL_NC_CONFIG"),
        "a logical core the user set is kept: {err}"
    );
}

/// `NRT_SIM_ISA` caps the kernels (`avx2`: the same outputs from the AVX2 kernels); a value
/// it does not know fails before anything runs, naming the variable.
#[test]
fn the_isa_cap_runs_on_avx2_and_refuses_an_unknown_value() {
    let dir = scratch("cli-isa");
    ok(&["samples", "--out", s(&dir)]);
    let onnx = dir.join("mlp/model.onnx");
    let run = |isa: &str, out: &Path| {
        nrt_command(&["run", s(&onnx), "--seed", "5", "--output-dir", s(out)])
            .env("NRT_SIM_ISA", isa)
            .output()
            .expect("run nrt")
    };
    let (native, avx2) = (dir.join("native"), dir.join("avx2"));
    for (isa, out) in [("native", &native), ("avx2", &avx2)] {
        let o = run(isa, out);
        assert!(
            o.status.success(),
            "{isa}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let o = run("avx-1024", &dir.join("bad"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.code() == Some(2) && err.contains("NRT_SIM_ISA") && err.contains("avx-1024"),
        "{err}"
    );
    // Both runs wrote the one output; the sums differ only in rounding order.
    let read = |d: &Path| {
        let f = std::fs::read_dir(d)
            .expect("outputs")
            .flatten()
            .next()
            .expect("one output");
        std::fs::read(f.path()).expect("output file")
    };
    let (a, b) = (read(&native), read(&avx2));
    assert_eq!(a.len(), b.len());
    let floats = |v: &[u8]| -> Vec<f32> {
        // The TensorProto's raw data is the file's last 4·N bytes (N = 512: mlp's [1, 512]).
        v[v.len() - 4 * 512..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    for (x, y) in floats(&a).iter().zip(floats(&b)) {
        assert!((x - y).abs() <= 1e-4 * (1.0 + x.abs()), "{x} vs {y}");
    }
}

#[test]
fn bench_rows_for_every_surface_and_the_gemm_rows() {
    for (surface, depth) in [("sync", "1"), ("explicit", "4"), ("implicit", "4")] {
        let out = ok(&[
            "bench",
            "--surface",
            surface,
            "--depth",
            depth,
            "--seconds",
            "0.05",
        ]);
        assert!(out.contains(surface), "{surface} row:\n{out}");
        assert!(
            out.contains("0.000"),
            "no allocations per execution:\n{out}"
        );
    }
    let gemm = ok(&["bench", "--gemm", "--seconds", "0.02"]);
    assert!(gemm.contains("GFLOP/s"), "{gemm}");
    // Several threads on one core: one row, every thread's executions, no allocations.
    let out = ok(&[
        "bench",
        "--surface",
        "sync",
        "--threads",
        "3",
        "--seconds",
        "0.05",
        "--json",
    ]);
    let row: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(row["depth"], 3, "{out}");
    assert_eq!(row["allocs_per_exec"], 0.0, "{out}");
    assert!(row["note"].as_str().unwrap().contains("3 threads"), "{out}");
    assert!(row["n"].as_u64().unwrap() > 0, "{out}");
    assert!(fails(&["bench", "--threads", "0"]).contains("--threads"));
    // Not silently ignored where it does not apply.
    for other in [
        &["bench", "--threads", "2"][..],
        &["bench", "--threads", "2", "--surface", "explicit"],
        &["bench", "--threads", "2", "--gemm"],
    ] {
        assert!(fails(other).contains("synchronous surface"), "{other:?}");
    }
}

#[test]
fn standard_bench_rows_include_first_after_switch_on_every_surface() {
    let out = ok(&["bench", "--seconds", "0.02"]);
    for row in [
        "spin-pingpong",
        "empty-request",
        "near-null-2c",
        "sync-host",
        "sync-switch",
        "explicit-switch",
        "implicit-switch",
    ] {
        assert!(out.contains(row), "{row} row missing:\n{out}");
    }
    for line in out.lines().filter(|l| l.contains("-switch")) {
        // Every execution of a switch row is first-after-switch.
        assert!(line.ends_with(", 0 steady"), "{line}");
    }
    assert!(out.contains("sync near-null round trip / spinning pingpong limit"));
}

#[test]
fn idle_process_uses_almost_no_cpu() {
    let out = ok(&["idle", "--seconds", "0.3"]);
    assert!(out.contains("parked: true"), "{out}");
}

#[test]
fn help_and_usage_errors() {
    assert!(ok(&["help"]).contains("Usage: nrt <COMMAND>"));
    assert!(
        ok(&["--help"]).contains("NRT_SIM_FAULTS"),
        "the environment is listed"
    );
    // Every subcommand has its own --help.
    for sub in [
        "demo",
        "compile",
        "run",
        "inspect",
        "trace",
        "bench",
        "conformance",
        "idle",
        "samples",
        "completions",
    ] {
        assert!(
            ok(&[sub, "--help"]).contains(&format!("Usage: nrt {sub}")),
            "{sub} --help"
        );
    }
    assert!(fails(&["frobnicate"]).contains("frobnicate"));
    assert!(
        fails(&["compile", "m.onnx"]).contains("--output"),
        "a missing option is named"
    );
    assert!(fails(&["bench", "--nope"]).contains("--nope"));
    assert!(fails(&["bench", "--surface", "sideways"]).contains("sideways"));
    assert!(fails(&["bench", "--seconds", "soon"]).contains("soon"));
}

#[test]
fn bad_model_files_name_the_file() {
    let dir = scratch("cli-bad");
    let missing = dir.join("missing.ncm");
    assert!(fails(&["run", s(&missing)]).contains("missing.ncm"));

    // A container cut short, and an ONNX file that is not protobuf.
    ok(&["samples", "--out", s(&dir)]);
    let ncm = dir.join("mlp.ncm");
    ok(&["compile", s(&dir.join("mlp/model.onnx")), "-o", s(&ncm)]);
    let bytes = std::fs::read(&ncm).expect("ncm");
    let cut = dir.join("cut.ncm");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let err = fails(&["inspect", s(&cut)]);
    assert!(err.contains("cut.ncm"), "{err}");

    let junk = dir.join("junk.onnx");
    std::fs::write(&junk, b"\xff\xff\xff not a model").expect("write");
    let err = fails(&["compile", s(&junk), "-o", s(&dir.join("j.ncm"))]);
    assert!(err.contains("junk.onnx"), "{err}");
}

#[test]
fn shell_completions() {
    let bash = ok(&["completions", "bash"]);
    assert!(
        bash.contains("_nrt()") && bash.contains("conformance"),
        "{bash}"
    );
    assert!(ok(&["completions", "zsh"]).contains("#compdef nrt"));
    assert!(fails(&["completions", "tcsh"]).contains("tcsh"));
}

/// `nrt run` reads `.npy` inputs and writes `.npy` outputs (checked byte by byte against the
/// `.pb` of the same run, and by ONNX Runtime's NumPy where the venv has it).
#[test]
fn run_reads_and_writes_npy() {
    let dir = scratch("cli-npy");
    ok(&["samples", "--out", s(&dir)]);
    let onnx = dir.join("mlp/model.onnx");
    let out1 = dir.join("out1");
    ok(&[
        "run",
        s(&onnx),
        "--output-dir",
        s(&out1),
        "--npy",
        "--seed",
        "3",
    ]);
    let npy = std::fs::read_dir(&out1)
        .expect("outputs")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "npy"))
        .expect("an .npy output");
    let bytes = std::fs::read(&npy).expect("npy");
    assert!(bytes.starts_with(b"\x93NUMPY"), "NumPy magic");
    assert!(String::from_utf8_lossy(&bytes[..128]).contains("'descr': '<f4'"));
    // Feed the output back as the input (same shape), once as .npy and once as .pb: the
    // runs agree byte for byte.
    let (a, b) = (dir.join("a"), dir.join("b"));
    let y_npy = out1.join("Y.npy");
    let y_pb = out1.join("Y.pb");
    ok(&[
        "run",
        s(&onnx),
        "--input",
        &format!("X={}", s(&y_npy)),
        "--output-dir",
        s(&a),
        "--npy",
    ]);
    ok(&[
        "run",
        s(&onnx),
        "--input",
        &format!("X={}", s(&y_pb)),
        "--output-dir",
        s(&b),
        "--npy",
    ]);
    assert_eq!(
        std::fs::read(a.join("Y.npy")).expect("a"),
        std::fs::read(b.join("Y.npy")).expect("b")
    );
    // A wrong-sized .npy (float32 [2]) is refused naming the file.
    let small = dir.join("small.npy");
    write_npy_f32(&small, &[2], &[1.0, 2.0]);
    let err = fails(&["run", s(&onnx), "--input", &format!("X={}", s(&small))]);
    assert!(err.contains("small.npy"), "{err}");
}

/// A model exported with `-1` as its batch dimension: `nrt run` takes the shape from the
/// input file given; without one (and no --input-shape) the error says how to fix it.
#[test]
fn run_specializes_minus_one_dims_from_the_inputs_given() {
    use nrt_compiler::onnx::data_type;
    let onnx = onnx_model(
        "relu",
        vec![node("Relu", &["x"], "y")],
        vec![value_info("x", data_type::FLOAT, &[-1, 2])],
        vec![value_info("y", data_type::FLOAT, &[-1, 2])],
    );
    let dir = scratch("cli-minus-one");
    let model = dir.join("relu.onnx");
    std::fs::write(&model, onnx).expect("write");
    let err = fails(&["run", s(&model)]);
    assert!(
        err.contains("unknown dimension -1 at axis 0") && err.contains("--input x="),
        "{err}"
    );
    let x = dir.join("x.npy");
    write_npy_f32(&x, &[3, 2], &[-1.0, 2.0, -3.0, 4.0, 5.0, -6.0]);
    let out = ok(&["run", s(&model), "--input", &format!("x={}", s(&x))]);
    assert!(
        out.contains("output 'y' [3, 2]: [0.00000, 2.00000, 0.00000, 4.00000, 5.00000, 0.00000]"),
        "{out}"
    );
}

/// A model whose output shape depends on input values (Range): `nrt run` binds the inputs
/// the compiler names to the values given with --input, says so on stderr, and feeds the
/// compiled model only the other inputs; without those values the error names them.
#[test]
fn run_specializes_on_the_input_values_the_compiler_needs() {
    use nrt_compiler::onnx::data_type::FLOAT;
    let onnx = onnx_model(
        "range",
        vec![
            node("Range", &["s", "l", "d"], "y"),
            node("Relu", &["x"], "z"),
        ],
        vec![
            value_info("s", FLOAT, &[]),
            value_info("l", FLOAT, &[]),
            value_info("d", FLOAT, &[]),
            value_info("x", FLOAT, &[2]),
        ],
        vec![value_info("y", FLOAT, &[3]), value_info("z", FLOAT, &[2])],
    );
    let dir = scratch("cli-specialize");
    let model = dir.join("range.onnx");
    std::fs::write(&model, onnx).expect("write");
    let err = fails(&["run", s(&model)]);
    assert!(err.contains("graph input(s) s, l, d"), "{err}");
    let mut args = vec!["run".to_string(), s(&model).to_string()];
    for (name, v) in [("s", 1.0f32), ("l", 2.5), ("d", 0.5), ("x", -1.0)] {
        let shape: &[usize] = if name == "x" { &[2] } else { &[] };
        let f = dir.join(format!("{name}.npy"));
        write_npy_f32(&f, shape, &vec![v; shape.iter().product()]);
        args.extend(["--input".into(), format!("{name}={}", s(&f))]);
    }
    let args: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
    let out = nrt(&args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("specialized the model on the values of input(s) s, l, d"),
        "{stderr}"
    );
    assert!(
        stdout.contains("output 'y' [3]: [1.00000, 1.50000, 2.00000]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("output 'z' [2]: [0.00000, 0.00000]"),
        "{stdout}"
    );
}

/// An output whose extent depends on the data (NonZero) is shown and written trimmed to its
/// actual shape: the `.pb` that `nrt run --output-dir` writes straight from the device bytes
/// reads back as that tensor.
#[test]
fn run_writes_a_data_dependent_output_trimmed_to_its_actual_shape() {
    use nrt_compiler::onnx::data_type;
    let onnx = onnx_model(
        "nonzero",
        vec![node("NonZero", &["x"], "y")],
        vec![value_info("x", data_type::FLOAT, &[2, 3])],
        vec![value_info("y", data_type::INT64, &[2, -1])],
    );
    let dir = scratch("cli-nonzero");
    let model = dir.join("nonzero.onnx");
    std::fs::write(&model, onnx).expect("write");
    let x = dir.join("x.npy");
    write_npy_f32(&x, &[2, 3], &[0.0, 2.0, 0.0, 4.0, 0.0, -6.0]);
    let out_dir = dir.join("out");
    let out = ok(&[
        "run",
        s(&model),
        "--input",
        &format!("x={}", s(&x)),
        "--output-dir",
        s(&out_dir),
    ]);
    assert!(
        out.contains("output 'y' [2, 3]: [0.00000, 1.00000, 1.00000, 1.00000, 0.00000, 2.00000]"),
        "{out}"
    );
    let (name, y) = nrt_compiler::read_tensor_pb(&out_dir.join("y.pb")).expect("y.pb");
    assert_eq!(name, "y");
    assert_eq!(y.shape, vec![2, 3]);
    assert_eq!(y.to_i64s().into_owned(), vec![0, 1, 1, 1, 0, 2]);
}
