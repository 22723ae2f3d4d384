//! Indices and lengths given at run time are range-checked on the device (issue 54): a
//! compiled model executed on the software device with an out-of-range one fails the
//! execution with `NRT_EXEC_OOB`, as ONNX Runtime refuses it, and in-range ones still give
//! what the same model with them as constants gives.

mod common;

use common::*;
use nrt_compiler::onnx::{TensorProto, data_type as dt};
use nrt_compiler::{CompileOptions, compile};
use nrt_hal::NrtStatus;
use nrt_runtime::{LoadOptions, Placement, Runtime, RuntimeConfig, TensorSet};
use nrt_sim::{SimConfig, SoftDevice};
use std::collections::BTreeMap;
use std::sync::Arc;

fn compiled(onnx: &[u8]) -> Vec<u8> {
    compile(onnx, None, &CompileOptions::default())
        .unwrap_or_else(|e| panic!("compiling the test model: {e}"))
        .model
        .encode()
}

/// Runs `ncm` once on a fresh software device; inputs by name (missing ones zero). Returns
/// the outputs by name, or the execution's status.
fn execute(
    ncm: &[u8],
    inputs: &BTreeMap<&str, Vec<u8>>,
) -> Result<BTreeMap<String, Vec<u8>>, NrtStatus> {
    let dev = Arc::new(SoftDevice::new(SimConfig::default()).unwrap());
    let rt = Runtime::init(dev, RuntimeConfig::default()).unwrap();
    let m = rt.load(ncm, 0, &LoadOptions::default()).unwrap();
    let (mut ins, mut outs) = (TensorSet::new(), TensorSet::new());
    let mut out_tensors = Vec::new();
    for info in m.tensor_info() {
        let t = rt
            .allocate_tensor(Placement::Device, 0, info.size, &info.name)
            .unwrap();
        match info.usage {
            nrt_model::Usage::Input => {
                let b = inputs
                    .get(info.name.as_str())
                    .cloned()
                    .unwrap_or_else(|| vec![0; info.size as usize]);
                assert_eq!(b.len() as u64, info.size, "input {}", info.name);
                t.write(&b, 0).unwrap();
                ins.add(&info.name, &t);
            }
            nrt_model::Usage::Output => {
                outs.add(&info.name, &t);
                out_tensors.push((info.name.clone(), t));
            }
        }
    }
    let r = rt.execute(&m, &ins, &outs).map_err(|e| e.status);
    let r = r.map(|()| {
        out_tensors
            .into_iter()
            .map(|(n, t)| {
                let mut b = vec![0u8; t.size() as usize];
                t.read(&mut b, 0).unwrap();
                (n, b)
            })
            .collect()
    });
    rt.close();
    r
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i64_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn i32_init(name: &str, dims: &[i64], vals: Vec<i32>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: dt::INT32,
        int32_data: vals,
        ..Default::default()
    }
}

const SEQ: usize = 2;
const BATCH: usize = 2;
const INPUT: usize = 3;
const HIDDEN: usize = 2;

/// An `op` (LSTM or GRU) over `[SEQ, BATCH, INPUT]`, `sequence_lens` a graph input or (with
/// `lens`) a constant.
fn recurrent(op: &str, lens: Option<&[i32]>) -> Vec<u8> {
    let g = if op == "LSTM" { 4 } else { 3 };
    let gh = (g * HIDDEN) as i64;
    let mut inits = vec![
        f32_init("W", &[1, gh, INPUT as i64], ramp(g * HIDDEN * INPUT, 0.02)),
        f32_init(
            "R",
            &[1, gh, HIDDEN as i64],
            ramp(g * HIDDEN * HIDDEN, 0.03),
        ),
    ];
    let mut inputs = vec![vi(
        "X",
        dt::FLOAT,
        &[SEQ as i64, BATCH as i64, INPUT as i64],
    )];
    match lens {
        Some(l) => inits.push(i32_init("L", &[BATCH as i64], l.to_vec())),
        None => inputs.push(vi("L", dt::INT32, &[BATCH as i64])),
    }
    model(
        vec![node(
            op,
            &["X", "W", "R", "", "L"],
            &["Y", "Y_h"],
            vec![a_i("hidden_size", HIDDEN as i64)],
        )],
        inits,
        inputs,
        vec![
            vi(
                "Y",
                dt::FLOAT,
                &[SEQ as i64, 1, BATCH as i64, HIDDEN as i64],
            ),
            vi("Y_h", dt::FLOAT, &[1, BATCH as i64, HIDDEN as i64]),
        ],
        17,
    )
}

/// Issue 54, S10: an LSTM's `sequence_lens` given at run time was not checked — 1,000,000
/// for a sequence of 2 ran (as a full sequence), a negative length ran as 0 — while the
/// constant form is refused when compiled and ONNX Runtime refuses both. Now the execution
/// fails with `NRT_EXEC_OOB`; lengths in `0..=seq` give what the constant form gives.
#[test]
fn s10_run_time_sequence_lens_outside_the_sequence_fail_the_execution() {
    let x = f32_bytes(&ramp(SEQ * BATCH * INPUT, 0.1));
    for op in ["LSTM", "GRU"] {
        let ncm = compiled(&recurrent(op, None));
        for lens in [[2, 1], [0, 2], [1, 0]] {
            let ins = BTreeMap::from([("X", x.clone()), ("L", i32_bytes(&lens))]);
            let got = execute(&ncm, &ins).unwrap_or_else(|s| panic!("{op} {lens:?}: {s}"));
            let want = execute(&compiled(&recurrent(op, Some(&lens))), &ins).unwrap();
            assert_eq!(got, want, "{op} with sequence_lens {lens:?}");
        }
        for lens in [
            [1_000_000, 1],
            [2, 3],
            [-1, 2],
            [1, i32::MIN],
            [i32::MAX, 0],
        ] {
            let ins = BTreeMap::from([("X", x.clone()), ("L", i32_bytes(&lens))]);
            assert_eq!(
                execute(&ncm, &ins).map(|_| ()),
                Err(NrtStatus::ExecOob),
                "{op} with sequence_lens {lens:?}"
            );
        }
    }
}

const ROWS: usize = 8;

/// `RotaryEmbedding` (opset 23) of X `[1, 1, 2, 4]` with caches of `ROWS` rows; positions a
/// graph input or (with `pos`) a constant.
fn rotary(pos: Option<&[i64]>) -> Vec<u8> {
    let mut inits = vec![
        f32_init("cos", &[ROWS as i64, 2], ramp(ROWS * 2, 0.05)),
        f32_init("sin", &[ROWS as i64, 2], ramp(ROWS * 2, 0.07)),
    ];
    let mut inputs = vec![vi("X", dt::FLOAT, &[1, 1, 2, 4])];
    match pos {
        Some(p) => inits.push(i64_init("P", &[1, 2], p.to_vec())),
        None => inputs.push(vi("P", dt::INT64, &[1, 2])),
    }
    model(
        vec![node(
            "RotaryEmbedding",
            &["X", "cos", "sin", "P"],
            &["Y"],
            vec![],
        )],
        inits,
        inputs,
        vec![vi("Y", dt::FLOAT, &[1, 1, 2, 4])],
        23,
    )
}

/// Issue 54, S11: a RotaryEmbedding position of -1 given at run time ran, gathering the last
/// cache row (a negative index counts from the end in Gather, not in RotaryEmbedding);
/// ONNX Runtime reports it out of range. Now a negative position or one past the cache fails
/// the execution with `NRT_EXEC_OOB` (a constant one fails the compile); positions inside
/// it give what constant ones give.
#[test]
fn s11_run_time_rotary_positions_outside_the_cache_fail_the_execution() {
    let x = f32_bytes(&ramp(8, 0.2));
    let ncm = compiled(&rotary(None));
    for pos in [[0, 1], [7, 3], [5, 5]] {
        let ins = BTreeMap::from([("X", x.clone()), ("P", i64_bytes(&pos))]);
        let got = execute(&ncm, &ins).unwrap_or_else(|s| panic!("{pos:?}: {s}"));
        let want = execute(&compiled(&rotary(Some(&pos))), &ins).unwrap();
        assert_eq!(got, want, "positions {pos:?}");
    }
    for pos in [[-1, 0], [0, -8], [8, 0], [0, i64::MIN], [i64::MAX, 1]] {
        let ins = BTreeMap::from([("X", x.clone()), ("P", i64_bytes(&pos))]);
        assert_eq!(
            execute(&ncm, &ins).map(|_| ()),
            Err(NrtStatus::ExecOob),
            "positions {pos:?}"
        );
        let e = compile(&rotary(Some(&pos)), None, &CompileOptions::default())
            .map(|_| ())
            .expect_err("a constant position outside the cache");
        assert!(e.to_string().contains("position_ids"), "{e}");
    }
}
