//! End-to-end compile tests of scheduling: the epilogue fusion of an MLP, the memory planner,
//! output notification order, the two-core split (matmuls, batched products, row operations)
//! and its parallelism, instruction ordering and the checker that rejects a bad one.

mod common;

use common::e2e::*;
use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, Compiled};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{Op, decode_block};
use nrt_model::CompiledModel;

#[test]
fn bias_add_and_relu_fuse_into_the_matmul_epilogue() {
    let c = ok(&mlp(1, 32, 3), &CompileOptions::default());
    let i = &c.report.instructions[0];
    assert_eq!(i[Engine::Pe.index()], 3, "{}", c.report);
    // Three MatMuls, each with its bias and Relu; no ACT or DVE pass.
    let pe = decode_block(&c.model.block(0, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
    let fused = pe
        .iter()
        .filter(|(_, x)| {
            matches!(x.op, Op::MatMul(op::MatMul { epilogue, .. })
                if epilogue.func == nrt_isa::ActFunc::Relu && epilogue.bias.is_some())
        })
        .count();
    assert_eq!(fused, 3);
    assert_eq!(i[Engine::Act.index()], 0, "{}", c.report);
    assert_eq!(i[Engine::Dve.index()], 0, "{}", c.report);
}

#[test]
fn planner_reuses_memory_on_a_chain() {
    let c = ok(&mlp(4, 64, 6), &CompileOptions::default());
    let r = &c.report;
    assert!(r.arena_bytes >= r.live_bytes_lower_bound);
    assert!(r.arena_ratio() <= 1.10, "{r}");
    // 5 intermediates of 1 KiB, at most two live at a time.
    assert!(r.arena_bytes <= 2 * 4 * 64 * 4, "{r}");
}

#[test]
fn first_output_is_notified_before_the_last_is_computed() {
    // Y1 = Relu(X) is ready at once; Y2 needs a chain of matmuls.
    let mut nodes = vec![node("Relu", &["X"], &["Y1"], vec![])];
    let mut cur = "X".to_string();
    for i in 0..4 {
        let o = if i == 3 {
            "Y2".to_string()
        } else {
            format!("t{i}")
        };
        nodes.push(node("MatMul", &[&cur, "W"], &[&o], vec![]));
        cur = o;
    }
    let m = model(
        nodes,
        vec![f32_init("W", &[8, 8], ramp(64, 0.01))],
        vec![vi("X", dt::FLOAT, &[8, 8])],
        vec![vi("Y1", dt::FLOAT, &[8, 8]), vi("Y2", dt::FLOAT, &[8, 8])],
        13,
    );
    let c = ok(&m, &CompileOptions::default());
    let sp = decode_block(&c.model.block(0, Engine::Sp).unwrap().code, Engine::Sp).unwrap();
    let pos = |v: u32| {
        sp.iter()
            .position(
                |(_, i)| matches!(i.op, Op::Notify(op::Notify { payload, .. }) if payload == v),
            )
            .unwrap()
    };
    assert!(pos(1) < pos(2));
    // The store of Y1 waits only for the ACT engine, not for the matmul chain.
    let before: Vec<_> = sp[..pos(1)]
        .iter()
        .filter_map(|(_, i)| i.sync.wait)
        .collect();
    let pe_sem = nrt_compiler::schedule::progress_semaphore(Engine::Pe);
    assert!(before.iter().all(|(s, _)| *s != pe_sem), "{before:?}");
}

#[test]
fn two_cores_split_matmuls() {
    let o = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    let c = ok(&mlp(2, 64, 3), &o);
    assert_eq!(c.model.sg_count, 2);
    assert_eq!(c.model.blocks.len(), 10);
    assert_eq!(
        c.report.instructions[0][Engine::Pe.index()],
        3 + c.report.instructions[0][0] - 3
    );
    let pe1 = decode_block(&c.model.block(1, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
    assert_eq!(
        pe1.iter()
            .filter(|(_, i)| matches!(i.op, Op::MatMul(_)))
            .count(),
        3
    );
}

/// The time the compiled model takes when every MatMul costs one unit and everything else
/// nothing, each engine of each core running its block in order and waiting on its
/// semaphores — the length of the critical path the synchronization allows.
fn matmul_makespan(m: &CompiledModel) -> u32 {
    use std::collections::HashMap;
    let blocks: Vec<Vec<nrt_isa::Instruction>> = m
        .blocks
        .iter()
        .map(|b| {
            decode_block(&b.code, b.engine)
                .unwrap()
                .into_iter()
                .map(|(_, i)| i)
                .collect()
        })
        .collect();
    let key =
        |core: u8, s: nrt_isa::SemRef| (if s.is_global() { u8::MAX } else { core }, s.index());
    // Per semaphore: the time of each signal, in its (single) signaling stream's order.
    let mut signals: HashMap<(u8, u16), Vec<(u32, u32)>> = HashMap::new();
    let mut pc = vec![0usize; blocks.len()];
    let mut clock = vec![0u32; blocks.len()];
    loop {
        let mut moved = false;
        for (b, block) in blocks.iter().enumerate() {
            let core = m.blocks[b].core;
            while let Some(ins) = block.get(pc[b]) {
                let mut start = clock[b];
                if let Some((sem, v)) = ins.sync.wait {
                    let hist = signals.get(&key(core, sem)).map_or(&[][..], |h| &h[..]);
                    match hist.iter().find(|&&(_, count)| count >= v) {
                        Some(&(t, _)) => start = start.max(t),
                        None => break,
                    }
                }
                assert!(!matches!(ins.op, Op::SemSet(_) | Op::Barrier(_)));
                let end = start + u32::from(matches!(ins.op, Op::MatMul(_)));
                if let Some((sem, v)) = ins.sync.signal {
                    let h = signals.entry(key(core, sem)).or_default();
                    let count = h.last().map_or(0, |&(_, c)| c) + v;
                    h.push((end, count));
                }
                clock[b] = end;
                pc[b] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    assert!(
        pc.iter().zip(&blocks).all(|(&p, b)| p == b.len()),
        "the blocks deadlock"
    );
    clock.into_iter().max().unwrap()
}

/// The two halves of each layer of a split MLP run at the same time: each core's MatMul of
/// layer `i` waits for both halves of layer `i − 1` and nothing later. (When a cross-core
/// wait was published at the producer's end of stream instead of right after the producing
/// instruction, core 1's layer 2 waited for core 0's layer 2 — the two cores alternated and
/// a 2-core `mlp_b64` ran slower than on one core; and before column blocks were told apart
/// from overlapping ranges, the halves' writes were ordered against each other.)
#[test]
fn two_cores_run_the_halves_of_each_layer_in_parallel() {
    for layers in [1, 2, 4] {
        let one = ok(&mlp(64, 64, layers), &CompileOptions::default());
        let two = ok(
            &mlp(64, 64, layers),
            &CompileOptions {
                cores: 2,
                ..Default::default()
            },
        );
        check_ordering(&two.model).unwrap();
        assert_eq!(matmul_makespan(&one.model), layers as u32);
        assert_eq!(
            matmul_makespan(&two.model),
            layers as u32,
            "{layers} layers on 2 cores"
        );
    }
}

/// The same for batched products (attention's scores and context, all heads in one
/// instruction): each core's half of every head is a block of columns inside each head, which
/// only a row-by-row comparison tells apart from the other core's.
#[test]
fn two_cores_run_the_halves_of_batched_products_in_parallel() {
    let (h, s, d) = (4i64, 128i64, 64i64);
    let m = model(
        vec![
            node("MatMul", &["X", "W1"], &["t"], vec![]),
            node("MatMul", &["t", "W2"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W1", &[h, d, s], ramp((h * d * s) as usize, 0.01)),
            f32_init("W2", &[h, s, d], ramp((h * s * d) as usize, 0.02)),
        ],
        vec![vi("X", dt::FLOAT, &[h, s, d])],
        vec![vi("Y", dt::FLOAT, &[h, s, d])],
        17,
    );
    let two = ok(
        &m,
        &CompileOptions {
            cores: 2,
            ..Default::default()
        },
    );
    check_ordering(&two.model).unwrap();
    assert_eq!(matmul_makespan(&two.model), 2);
    // Split by the batch (the heads), not by N: each core multiplies whole [s, d] matrices
    // of half the heads (an N split left 32-column products).
    for core in 0..2u8 {
        let pe =
            decode_block(&two.model.block(core, Engine::Pe).unwrap().code, Engine::Pe).unwrap();
        let shapes: Vec<[u32; 4]> = pe
            .iter()
            .filter_map(|(_, i)| match i.op {
                Op::MatMul(op::MatMul { c, .. }) => Some(c.shape),
                _ => None,
            })
            .collect();
        assert_eq!(shapes.len(), 2, "core {core}: {shapes:?}");
        for (sh, n) in shapes.iter().zip([s, d]) {
            assert_eq!(sh[1] as i64 * 2, h, "core {core}: {sh:?}");
            assert_eq!(sh[3] as i64, n, "core {core}: {sh:?}");
        }
    }
}

/// Softmax and layer normalization, large enough, are split by rows between two cores
/// (each core's POOL block has one of each); small ones stay on core 0.
#[test]
fn two_cores_split_row_operations() {
    let row_ops = |rows: i64| {
        model(
            vec![
                node("Softmax", &["X"], &["s"], vec![a_i("axis", -1)]),
                node(
                    "LayerNormalization",
                    &["s", "g", "b"],
                    &["Y"],
                    vec![a_i("axis", -1)],
                ),
            ],
            vec![
                f32_init("g", &[128], ramp(128, 0.01)),
                f32_init("b", &[128], ramp(128, 0.02)),
            ],
            vec![vi("X", dt::FLOAT, &[rows, 128])],
            vec![vi("Y", dt::FLOAT, &[rows, 128])],
            17,
        )
    };
    let two = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    let count = |c: &Compiled, core: u8| {
        let pool = decode_block(
            &c.model.block(core, Engine::Pool).unwrap().code,
            Engine::Pool,
        )
        .unwrap();
        (
            pool.iter()
                .filter(|(_, i)| matches!(i.op, Op::Softmax(_)))
                .count(),
            pool.iter()
                .filter(|(_, i)| matches!(i.op, Op::LayerNorm(_)))
                .count(),
        )
    };
    let big = ok(&row_ops(512), &two);
    check_ordering(&big.model).unwrap();
    assert_eq!((count(&big, 0), count(&big, 1)), ((1, 1), (1, 1)));
    let small = ok(&row_ops(4), &two);
    assert_eq!((count(&small, 0), count(&small, 1)), ((1, 1), (0, 0)));
}

#[test]
fn ops_lower_and_order_correctly() {
    // A graph touching many lowering paths at once.
    let nodes = vec![
        node(
            "Transpose",
            &["X"],
            &["xt"],
            vec![a_ints("perm", &[0, 2, 1, 3])],
        ),
        node("Softmax", &["xt"], &["sm"], vec![a_i("axis", 2)]),
        node(
            "LayerNormalization",
            &["sm", "g", "b"],
            &["ln"],
            vec![a_i("axis", -1)],
        ),
        node(
            "ReduceMean",
            &["ln", "axes"],
            &["rm"],
            vec![a_i("keepdims", 1)],
        ),
        node("Sub", &["ln", "rm"], &["d"], vec![]),
        node("Pad", &["d", "pads"], &["p"], vec![a_s("mode", "reflect")]),
        node(
            "Slice",
            &["p", "st", "en", "sax", "ssteps"],
            &["sl"],
            vec![],
        ),
        node("Concat", &["sl", "sl"], &["cc"], vec![a_i("axis", 1)]),
        node(
            "Conv",
            &["cc", "cw", "cb"],
            &["cv"],
            vec![a_ints("pads", &[1, 1, 1, 1])],
        ),
        node(
            "MaxPool",
            &["cv"],
            &["mp"],
            vec![a_ints("kernel_shape", &[2, 2]), a_i("ceil_mode", 1)],
        ),
        node(
            "AveragePool",
            &["cv"],
            &["ap"],
            vec![
                a_ints("kernel_shape", &[3, 3]),
                a_ints("strides", &[2, 2]),
                a_ints("pads", &[1, 1, 1, 1]),
                a_i("ceil_mode", 1),
                a_i("count_include_pad", 1),
            ],
        ),
        node("GlobalAveragePool", &["mp"], &["gp"], vec![]),
        node(
            "Resize",
            &["ap", "", "scales"],
            &["rs"],
            vec![a_s("mode", "linear")],
        ),
        node("Flatten", &["rs"], &["fl"], vec![]),
        node("Gather", &["fl", "idx"], &["ga"], vec![a_i("axis", 1)]),
        node("Where", &["cond", "ga", "zero"], &["Y"], vec![]),
        node(
            "ConvTranspose",
            &["cv", "tw"],
            &["Y2"],
            vec![a_ints("strides", &[2, 2])],
        ),
    ];
    let inits = vec![
        f32_init("g", &[5], ramp(5, 0.1)),
        f32_init("b", &[5], ramp(5, 0.05)),
        i64_init("axes", &[1], vec![-1]),
        i64_init("pads", &[8], vec![0, 0, 1, 1, 0, 0, 1, 1]),
        i64_init("st", &[2], vec![1, 0]),
        i64_init("en", &[2], vec![100, -1]),
        i64_init("sax", &[2], vec![2, 3]),
        i64_init("ssteps", &[2], vec![1, 1]),
        f32_init("cw", &[4, 6, 3, 3], ramp(216, 0.01)),
        f32_init("cb", &[4], ramp(4, 0.1)),
        f32_init("scales", &[4], vec![1.0, 1.0, 2.0, 2.0]),
        i64_init("idx", &[3], vec![0, -1, 5]),
        f32_init("zero", &[], vec![0.0]),
        f32_init("tw", &[4, 2, 3, 3], ramp(72, 0.01)),
    ];
    let m = model(
        nodes,
        inits,
        vec![
            vi("X", dt::FLOAT, &[1, 4, 3, 5]),
            vi("cond", dt::BOOL, &[1, 3]),
        ],
        vec![
            vi("Y", dt::FLOAT, &[1, 3]),
            vi("Y2", dt::FLOAT, &[1, 2, 11, 13]),
        ],
        18,
    );
    let c = ok(&m, &CompileOptions::default());
    assert_eq!(c.model.io[3].shape, vec![1, 2, 11, 13]);
    let o = CompileOptions {
        cores: 2,
        ..Default::default()
    };
    ok(&m, &o);
}

/// Rewrites the instructions of one block (same sizes, so relocations stay valid).
fn edit_block(m: &mut CompiledModel, engine: Engine, f: impl Fn(&mut nrt_isa::Instruction)) {
    let b = m
        .blocks
        .iter_mut()
        .find(|b| b.core == 0 && b.engine == engine)
        .unwrap();
    let mut code = Vec::new();
    for (_, mut ins) in decode_block(&b.code, engine).unwrap() {
        f(&mut ins);
        ins.encode(&mut code);
    }
    b.code = code;
}

#[test]
fn checker_rejects_missing_waits_and_deadlocks() {
    let c = ok(&mlp(1, 16, 2), &CompileOptions::default());
    let mut racy = c.model.clone();
    // PE's MatMuls then no longer wait for the input's DMA.
    edit_block(&mut racy, Engine::Pe, |i| i.sync.wait = None);
    let e = check_ordering(&racy).unwrap_err();
    assert!(e.contains("unordered hazard"), "{e}");
    let mut stuck = c.model.clone();
    edit_block(&mut stuck, Engine::Pe, |i| {
        if let Some((s, v)) = i.sync.wait {
            i.sync.wait = Some((s, v + 100));
        }
    });
    let e = check_ordering(&stuck).unwrap_err();
    assert!(e.contains("never reached") || e.contains("deadlock"), "{e}");
}
