//! In-place state (NCM 1.10) and resident I/O, end to end: a model whose output `state_out`
//! is a `ScatterND` into its input `state` is compiled with the pair declared in place; the
//! runtime then takes one tensor for both on the synchronous (device and host tensors) and
//! explicit surfaces, updating only the scattered row, and refuses two different tensors. Bound
//! at load (resident), the state is updated where it lies with no copy per execution, and an
//! execution may leave it out of its sets.

mod common;

use common::*;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, compile};
use nrt_runtime::{LoadOptions, Placement, Runtime, RuntimeConfig, Tensor, TensorSet};
use nrt_sim::{SimConfig, SoftDevice};
use std::sync::Arc;

const ROWS: usize = 4;
const COLS: usize = 3;

/// `state_out = ScatterND(state, row, update)`; `total = ReduceSum(state_out)` (reads the
/// updated state).
fn model_bytes(extra_reader: bool) -> Vec<u8> {
    let mut nodes = vec![
        node(
            "ScatterND",
            &["state", "row", "update"],
            &["state_out"],
            vec![],
        ),
        node(
            "ReduceSum",
            &["state_out"],
            &["total"],
            vec![a_i("keepdims", 0)],
        ),
    ];
    if extra_reader {
        nodes.push(node("Neg", &["state"], &["neg"], vec![]));
    }
    let mut outputs = vec![
        vi("state_out", dt::FLOAT, &[ROWS as i64, COLS as i64]),
        vi("total", dt::FLOAT, &[]),
    ];
    if extra_reader {
        outputs.push(vi("neg", dt::FLOAT, &[ROWS as i64, COLS as i64]));
    }
    model(
        nodes,
        vec![],
        vec![
            vi("state", dt::FLOAT, &[ROWS as i64, COLS as i64]),
            vi("row", dt::INT64, &[1, 1]),
            vi("update", dt::FLOAT, &[1, COLS as i64]),
        ],
        outputs,
        17,
    )
}

fn in_place() -> CompileOptions {
    let mut o = CompileOptions::default();
    o.in_place.insert("state_out".into(), "state".into());
    o
}

fn ncm() -> Vec<u8> {
    compile(&model_bytes(false), None, &in_place())
        .unwrap()
        .model
        .encode()
}

fn runtime() -> Runtime {
    let dev = Arc::new(SoftDevice::new(SimConfig::default()).unwrap());
    Runtime::init(dev, RuntimeConfig::default()).unwrap()
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(t: &Tensor) -> Vec<f32> {
    let mut b = vec![0u8; t.size() as usize];
    t.read(&mut b, 0).unwrap();
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// The small per-execution tensors: row index, update, total.
struct Step {
    row: Tensor,
    update: Tensor,
    total: Tensor,
}

fn step(rt: &Runtime, placement: Placement) -> Step {
    let a = |n: &str, s: u64| rt.allocate_tensor(placement, 0, s, n).unwrap();
    Step {
        row: a("row", 8),
        update: a("update", 4 * COLS as u64),
        total: a("total", 4),
    }
}

impl Step {
    fn set(&self, row: i64, v: f32) {
        self.row.write(&row.to_le_bytes(), 0).unwrap();
        self.update.write(&bytes(&[v; COLS]), 0).unwrap();
    }

    fn sets(&self, state: Option<(&Tensor, &Tensor)>) -> (TensorSet, TensorSet) {
        let (mut i, mut o) = (TensorSet::new(), TensorSet::new());
        i.add("row", &self.row);
        i.add("update", &self.update);
        o.add("total", &self.total);
        if let Some((si, so)) = state {
            i.add("state", si);
            o.add("state_out", so);
        }
        (i, o)
    }
}

/// The state after writing `v` into each `(row, v)` in turn over a ramp.
fn expected(writes: &[(usize, f32)]) -> Vec<f32> {
    let mut s: Vec<f32> = (0..ROWS * COLS).map(|i| i as f32).collect();
    for &(r, v) in writes {
        s[r * COLS..(r + 1) * COLS].fill(v);
    }
    s
}

#[test]
fn the_pair_is_declared_in_the_compiled_model() {
    let c = compile(&model_bytes(false), None, &in_place()).unwrap();
    let out = c.model.io.iter().find(|t| t.name == "state_out").unwrap();
    let state = c.model.io.iter().position(|t| t.name == "state").unwrap();
    assert_eq!(out.in_place_of, Some(state as u32));
    let back = nrt_model::CompiledModel::decode(&c.model.encode()).unwrap();
    assert_eq!(back.io, c.model.io);
    // Without the option the same graph declares nothing (and copies the state).
    let plain = compile(&model_bytes(false), None, &CompileOptions::default()).unwrap();
    assert!(plain.model.io.iter().all(|t| t.in_place_of.is_none()));
}

#[test]
fn pairs_the_program_cannot_update_in_place_are_refused_at_compile_time() {
    // The state read by another node.
    let e = compile(&model_bytes(true), None, &in_place())
        .unwrap_err()
        .to_string();
    assert!(e.contains("read by other nodes"), "{e}");
    // An output that is not a scatter into the input.
    let mut o = CompileOptions::default();
    o.in_place.insert("total".into(), "state".into());
    let e = compile(&model_bytes(false), None, &o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("'total'"), "{e}");
    // Unknown names.
    let mut o = CompileOptions::default();
    o.in_place.insert("state_out".into(), "nope".into());
    let e = compile(&model_bytes(false), None, &o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no input 'nope'"), "{e}");
}

#[test]
fn one_tensor_is_updated_in_place_on_every_surface() {
    for placement in [Placement::Device, Placement::Host] {
        let rt = runtime();
        let m = rt.load(&ncm(), 0, &LoadOptions::default()).unwrap();
        let state = rt
            .allocate_tensor(placement, 0, (4 * ROWS * COLS) as u64, "state")
            .unwrap();
        state.write(&bytes(&expected(&[])), 0).unwrap();
        let s = step(&rt, placement);
        let mut writes = Vec::new();
        for (row, v) in [(2usize, 10.0f32), (0, -1.0), (3, 7.5)] {
            s.set(row as i64, v);
            let (i, o) = s.sets(Some((&state, &state)));
            rt.execute(&m, &i, &o).unwrap();
            writes.push((row, v));
            let want = expected(&writes);
            assert_eq!(floats(&state), want, "{placement:?} after {writes:?}");
            assert_eq!(floats(&s.total)[0], want.iter().sum::<f32>());
        }
        if placement == Placement::Device {
            // The explicit async surface: schedule, then wait.
            s.set(1, 4.0);
            let (i, o) = s.sets(Some((&state, &state)));
            let seq = rt.execute_schedule(&m, &i, &o).unwrap();
            assert!(rt.wait(seq).unwrap().is_success());
            writes.push((1, 4.0));
            assert_eq!(floats(&state), expected(&writes));
        }
        rt.close();
    }
}

#[test]
fn two_tensors_for_an_in_place_pair_are_refused() {
    let rt = runtime();
    let m = rt.load(&ncm(), 0, &LoadOptions::default()).unwrap();
    let size = (4 * ROWS * COLS) as u64;
    let a = rt.allocate_tensor(Placement::Device, 0, size, "a").unwrap();
    let b = rt.allocate_tensor(Placement::Device, 0, size, "b").unwrap();
    let s = step(&rt, Placement::Device);
    s.set(0, 1.0);
    let (i, o) = s.sets(Some((&a, &b)));
    let e = rt.execute(&m, &i, &o).unwrap_err().to_string();
    assert!(
        e.contains("in place") && e.contains("'a'") && e.contains("'b'"),
        "{e}"
    );
    // Two handles of the same bytes (a slice at offset 0 of the same length) are one tensor.
    let view = a.slice(0, size, "a-view").unwrap();
    let (i, o) = s.sets(Some((&a, &view)));
    rt.execute(&m, &i, &o).unwrap();
    rt.close();
}

#[test]
fn a_resident_state_is_updated_where_it_lies() {
    let rt = runtime();
    let size = (4 * ROWS * COLS) as u64;
    // The state is a slice of a larger allocation (as an LLM's per-layer caches are).
    let block = rt
        .allocate_tensor(Placement::Device, 0, 4 * size, "block")
        .unwrap();
    let state = block.slice(128, size, "state").unwrap();
    state.write(&bytes(&expected(&[])), 0).unwrap();
    let opts = LoadOptions {
        resident: vec![("state".into(), state.clone())],
        ..Default::default()
    };
    let m = rt.load(&ncm(), 0, &opts).unwrap();
    // Two models share it.
    let m2 = rt.load(&ncm(), 0, &opts).unwrap();
    let s = step(&rt, Placement::Device);
    let mut writes = Vec::new();
    for (k, (row, v)) in [(1usize, 3.0f32), (2, 5.0), (1, -2.0)]
        .into_iter()
        .enumerate()
    {
        s.set(row as i64, v);
        // Left out of the sets, or passed as itself.
        let (i, o) = if k == 1 {
            s.sets(Some((&state, &state)))
        } else {
            s.sets(None)
        };
        rt.execute(if k == 2 { &m2 } else { &m }, &i, &o).unwrap();
        writes.push((row, v));
        assert_eq!(floats(&state), expected(&writes));
    }
    // The rest of the block is untouched.
    let mut head = vec![0u8; 128];
    block.read(&mut head, 0).unwrap();
    assert!(head.iter().all(|&b| b == 0));
    // Another tensor is refused, naming the resident one.
    let other = rt
        .allocate_tensor(Placement::Device, 0, size, "other")
        .unwrap();
    let (i, o) = s.sets(Some((&other, &other)));
    let e = rt.execute(&m, &i, &o).unwrap_err().to_string();
    assert!(e.contains("resident") && e.contains("'state'"), "{e}");
    rt.close();
}

#[test]
fn bad_resident_tensors_are_refused_at_load() {
    let rt = runtime();
    let size = (4 * ROWS * COLS) as u64;
    let load = |name: &str, t: &Tensor| {
        let opts = LoadOptions {
            resident: vec![(name.into(), t.clone())],
            ..Default::default()
        };
        rt.load(&ncm(), 0, &opts).unwrap_err().to_string()
    };
    let ok = rt
        .allocate_tensor(Placement::Device, 0, size, "ok")
        .unwrap();
    let e = load("nope", &ok);
    assert!(e.contains("no such input"), "{e}");
    let e = load("state_out", &ok);
    assert!(e.contains("is an output"), "{e}");
    let small = rt
        .allocate_tensor(Placement::Device, 0, size - 4, "small")
        .unwrap();
    let e = load("state", &small);
    assert!(e.contains("bytes"), "{e}");
    let host = rt
        .allocate_tensor(Placement::Host, 0, size, "host")
        .unwrap();
    let e = load("state", &host);
    assert!(e.contains("not a device tensor"), "{e}");
    let block = rt
        .allocate_tensor(Placement::Device, 0, 2 * size, "block")
        .unwrap();
    let odd = block.slice(4, size, "odd").unwrap();
    let e = load("state", &odd);
    assert!(e.contains("aligned"), "{e}");
    rt.close();
}
