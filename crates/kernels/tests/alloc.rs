//! Steady state allocates nothing: a second identical call of each op, with the same
//! `Workspace`, makes no heap allocation (counted by a global allocator).

mod common;

use common::{Arena, Rng};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{
    ActFunc, BinaryOp, CoordMode, NearestMode, Op, PoolOp, ReduceOp, ResizeMode, Window,
};
use nrt_kernels::Workspace;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    // Per thread, so the test harness's other threads do not count.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a thread-local `Cell` that never
// allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// Runs `op` twice with one workspace; returns the allocations of the second run.
fn second_run_allocs(m: &mut Arena, op: &Op, ws: &mut Workspace) -> u64 {
    m.run(op, ws).unwrap();
    let before = allocs();
    m.run(op, ws).unwrap();
    allocs() - before
}

#[test]
fn second_calls_allocate_nothing() {
    let mut rng = Rng::new(7);
    let mut m = Arena::new(64 << 20);
    let mut ws = Workspace::new();
    let mut ops: Vec<(&str, Op)> = Vec::new();

    // MatMul: GEMM path (packing buffers), GEMV paths (strided x copied to scratch).
    for (name, mm, k, n, flags) in [
        ("matmul gemm", 64u32, 256u32, 128u32, 0u32),
        ("matmul gemv", 1, 512, 512, 0),
        (
            "matmul gemv transposed b",
            1,
            300,
            200,
            nrt_isa::matmul_flags::TRANSPOSE_B,
        ),
        ("matmul n=1", 100, 64, 1, 0),
        (
            "matmul gemv strided a",
            1,
            64,
            64,
            nrt_isa::matmul_flags::TRANSPOSE_A,
        ),
        (
            "matmul gemv 3 rows strided a",
            3,
            64,
            64,
            nrt_isa::matmul_flags::TRANSPOSE_A,
        ),
        (
            "matmul gemv 4 rows transposed b",
            4,
            100,
            70,
            nrt_isa::matmul_flags::TRANSPOSE_B,
        ),
    ] {
        let ta = flags & nrt_isa::matmul_flags::TRANSPOSE_A != 0;
        let tb = flags & nrt_isa::matmul_flags::TRANSPOSE_B != 0;
        let a = m.dense(DType::F32, if ta { [1, 2, k, mm] } else { [1, 2, mm, k] });
        let b = m.dense(DType::F32, if tb { [1, 2, n, k] } else { [1, 2, k, n] });
        let c = m.dense(DType::F32, [1, 2, mm, n]);
        m.fill_f32(&a, &mut rng, -1.0, 1.0);
        m.fill_f32(&b, &mut rng, -1.0, 1.0);
        ops.push((
            name,
            Op::MatMul(op::MatMul {
                a,
                b,
                c,
                alpha: 1.0,
                flags,
                epilogue: nrt_isa::Epilogue::NONE,
            }),
        ));
    }

    // MatMul with B packed in panels (compile-time-packed constant weights): A in place and
    // A transposed (copied into the workspace), with an epilogue (row blocks).
    for (name, flags) in [
        ("matmul packed b", nrt_isa::matmul_flags::PACKED_B),
        (
            "matmul packed b, transposed a",
            nrt_isa::matmul_flags::PACKED_B | nrt_isa::matmul_flags::TRANSPOSE_A,
        ),
    ] {
        let (mm, k, n) = (70u32, 300u32, 100u32);
        let ta = flags & nrt_isa::matmul_flags::TRANSPOSE_A != 0;
        let a = m.dense(DType::F32, if ta { [1, 2, k, mm] } else { [1, 2, mm, k] });
        let b = m.dense(DType::F32, [1, n.div_ceil(32), k, 32]);
        let c = m.dense(DType::F32, [1, 2, mm, n]);
        let bias = nrt_isa::AccessPattern {
            shape: [1, 2, mm, n],
            stride: [0, 0, 0, 1],
            ..m.dense(DType::F32, [1, 1, 1, n])
        };
        m.fill_f32(&a, &mut rng, -1.0, 1.0);
        m.fill_f32(&b, &mut rng, -1.0, 1.0);
        ops.push((
            name,
            Op::MatMul(op::MatMul {
                a,
                b,
                c,
                alpha: 1.0,
                flags,
                epilogue: nrt_isa::Epilogue {
                    bias: Some(bias),
                    func: nrt_isa::ActFunc::Relu,
                    ..nrt_isa::Epilogue::NONE
                },
            }),
        ));
    }

    // The same with bf16 weights (pairs of K): A rounded into the workspace.
    {
        let (mm, k, n) = (70u32, 301u32, 100u32);
        let a = m.dense(DType::F32, [1, 2, mm, k]);
        let b = m.dense(DType::Bf16, [1, n.div_ceil(32), k.div_ceil(2), 64]);
        let c = m.dense(DType::F32, [1, 2, mm, n]);
        m.fill_f32(&a, &mut rng, -1.0, 1.0);
        m.fill_with(&b, || 0x3f80);
        ops.push((
            "matmul packed bf16 b",
            Op::MatMul(op::MatMul {
                a,
                b,
                c,
                alpha: 1.0,
                flags: nrt_isa::matmul_flags::PACKED_B,
                epilogue: nrt_isa::Epilogue::NONE,
            }),
        ));
    }

    // Conv: im2col + GEMM, direct, pointwise.
    let input = m.dense(DType::F32, [1, 8, 16, 16]);
    m.fill_f32(&input, &mut rng, -1.0, 1.0);
    let weight = m.dense(DType::F32, [16, 8, 3, 3]);
    let output = m.dense(DType::F32, [1, 16, 16, 16]);
    let bias = Some(m.dense(DType::F32, [1, 1, 1, 16]));
    let window = Window {
        kernel: [0, 0],
        stride: [1, 1],
        pad: [1, 1, 1, 1],
        dilation: [1, 1],
    };
    let workspace = Some(m.dense(DType::F32, [1, 1, 1, 8 * 9 * 256]));
    ops.push((
        "conv im2col",
        Op::Conv(op::Conv {
            input,
            weight,
            output,
            bias,
            workspace,
            window,
            groups: 1,
            act: (ActFunc::Relu, 0.0, 0.0),
        }),
    ));
    ops.push((
        "conv direct",
        Op::Conv(op::Conv {
            input,
            weight,
            output,
            bias,
            workspace: None,
            window,
            groups: 1,
            act: (ActFunc::Relu, 0.0, 0.0),
        }),
    ));
    let w1 = m.dense(DType::F32, [16, 8, 1, 1]);
    let no_pad = Window {
        pad: [0; 4],
        ..window
    };
    ops.push((
        "conv pointwise",
        Op::Conv(op::Conv {
            input,
            weight: w1,
            output,
            bias,
            workspace: None,
            window: no_pad,
            groups: 1,
            act: (ActFunc::Identity, 0.0, 0.0),
        }),
    ));

    // Elementwise, reductions, normalizations, data movement.
    let x = m.dense(DType::F32, [2, 3, 17, 33]);
    let y = m.dense(DType::F32, [2, 3, 17, 33]);
    m.fill_f32(&x, &mut rng, -1.0, 1.0);
    let row = nrt_isa::AccessPattern {
        stride: [0, 0, 0, 1],
        ..m.dense(DType::F32, [2, 3, 17, 33])
    };
    ops.push((
        "activation gelu",
        Op::Activation(op::Activation {
            input: x,
            output: y,
            bias: Some(row),
            func: ActFunc::GeluErf,
            scale: 1.0,
            alpha: 0.0,
            beta: 0.0,
        }),
    ));
    ops.push((
        "activation in place",
        Op::Activation(op::Activation {
            input: y,
            output: y,
            bias: None,
            func: ActFunc::Tanh,
            scale: 1.0,
            alpha: 0.0,
            beta: 0.0,
        }),
    ));
    ops.push((
        "binary broadcast",
        Op::Binary(op::Binary {
            a: x,
            b: row,
            out: y,
            op: BinaryOp::Add,
        }),
    ));
    ops.push((
        "tensor scalar",
        Op::TensorScalar(op::TensorScalar {
            a: x,
            out: y,
            op: BinaryOp::Mul,
            scalar: 3.0,
            reverse: false,
        }),
    ));
    let red = m.dense(DType::F32, [2, 1, 17, 1]);
    ops.push((
        "reduce",
        Op::Reduce(op::Reduce {
            input: x,
            output: red,
            op: ReduceOp::Mean,
            axes: 0b1010,
        }),
    ));
    ops.push((
        "softmax",
        Op::Softmax(op::Softmax {
            input: x,
            output: y,
            log: false,
        }),
    ));
    let (xq, xs, xz) = (
        m.dense(DType::U8, x.shape),
        m.dense(DType::F32, [1, 1, 1, 1]),
        m.dense(DType::U8, [1, 1, 1, 1]),
    );
    ops.push((
        "dynamic quantize",
        Op::DynamicQuantize(op::DynamicQuantize {
            input: x,
            output: xq,
            scale: xs,
            zero_point: xz,
        }),
    ));
    ops.push((
        "layer norm",
        Op::LayerNorm(op::LayerNorm {
            input: x,
            gamma: row,
            beta: Some(row),
            output: y,
            eps: 1e-5,
        }),
    ));
    let pooled = m.dense(DType::F32, [2, 3, 8, 16]);
    let pw = Window {
        kernel: [3, 3],
        stride: [2, 2],
        pad: [1, 1, 0, 0],
        dilation: [1, 1],
    };
    ops.push((
        "pool",
        Op::Pool(op::Pool {
            input: x,
            output: pooled,
            window: pw,
            op: PoolOp::Avg,
            count_include_pad: false,
        }),
    ));
    let big = m.dense(DType::F32, [2, 3, 34, 66]);
    ops.push((
        "resize",
        Op::Resize(op::Resize {
            input: x,
            output: big,
            mode: ResizeMode::Linear,
            coord: CoordMode::HalfPixel,
            nearest: NearestMode::RoundPreferFloor,
            scales: [0.0; 4],
        }),
    ));
    let h = m.dense(DType::F16, [2, 3, 17, 33]);
    let xt = nrt_isa::AccessPattern {
        shape: [2, 3, 33, 17],
        stride: [561, 187, 1, 33],
        ..x
    };
    let ht = nrt_isa::AccessPattern {
        shape: [2, 3, 33, 17],
        ..m.dense(DType::F16, [2, 3, 33, 17])
    };
    ops.push((
        "copy cast",
        Op::Copy(op::Copy {
            input: x,
            output: h,
        }),
    ));
    ops.push((
        "copy transpose cast",
        Op::Copy(op::Copy {
            input: xt,
            output: ht,
        }),
    ));
    let idx = m.dense(DType::I64, [1, 1, 1, 4]);
    let gathered = m.dense(DType::F32, [2, 3, 4, 33]);
    ops.push((
        "gather",
        Op::Gather(op::Gather {
            data: x,
            indices: idx,
            output: gathered,
        }),
    ));

    // Element-wise gather / scatter (index scratch: none), TopK (index scratch in the
    // workspace), MatMulInteger (packed operands in the workspace).
    let eidx = m.dense(DType::I64, [2, 3, 4, 33]);
    ops.push((
        "gather elements",
        Op::GatherElements(op::GatherElements {
            data: x,
            indices: eidx,
            output: gathered,
            axis: 2,
        }),
    ));
    ops.push((
        "scatter elements",
        Op::ScatterElements(op::ScatterElements {
            indices: eidx,
            updates: gathered,
            output: x,
            axis: 2,
            reduce: nrt_isa::ScatterReduce::Add,
        }),
    ));
    let top = m.dense(DType::F32, [2, 3, 4, 5]);
    let top_i = m.dense(DType::I64, [2, 3, 4, 5]);
    ops.push((
        "top k",
        Op::TopK(op::TopK {
            input: gathered,
            values: top,
            indices: top_i,
            largest: true,
        }),
    ));
    let qa = m.dense(DType::U8, [1, 2, 13, 70]);
    let qb = m.dense(DType::I8, [1, 2, 70, 40]);
    let qc = m.dense(DType::I32, [1, 2, 13, 40]);
    ops.push((
        "matmul integer",
        Op::MatMulInteger(op::MatMulInteger {
            a: qa,
            b: qb,
            c: qc,
            a_zero: None,
            b_zero: None,
            packed_b: false,
            scale: None,
        }),
    ));

    // The data-dependent extents (sort orders and group tables in the workspace).
    let nz_in = m.dense(DType::F32, [1, 1, 4, 33]);
    let nz_out = m.dense(DType::I64, [1, 1, 2, 132]);
    let two = m.dense(DType::I64, [1, 1, 1, 2]);
    ops.push((
        "non zero",
        Op::NonZero(op::NonZero {
            input: nz_in,
            output: nz_out,
            shape: two,
        }),
    ));
    let u_in = m.dense(DType::F32, [1, 4, 33, 1]);
    let u_y = m.dense(DType::F32, [1, 4, 33, 1]);
    let u_k = [(); 3].map(|_| m.dense(DType::I64, [1, 1, 1, 33]));
    let u_shape = m.dense(DType::I64, [1, 1, 1, 2]);
    ops.push((
        "unique",
        Op::Unique(op::Unique {
            input: u_in,
            y: u_y,
            indices: u_k[0],
            inverse: u_k[1],
            counts: u_k[2],
            shape: u_shape,
            dims: nrt_isa::ShapeTemplate {
                rank: 2,
                axis: 1,
                dims: [4, 33, 0, 0, 0, 0, 0, 0],
            },
            sorted: false,
        }),
    ));
    let boxes = m.dense(DType::F32, [1, 2, 33, 4]);
    let scores = m.dense(DType::F32, [1, 2, 3, 33]);
    let selected = m.dense(DType::I64, [1, 1, 198, 3]);
    ops.push((
        "non max suppression",
        Op::NonMaxSuppression(op::NonMaxSuppression {
            boxes,
            scores,
            max_out: None,
            iou: None,
            score_threshold: None,
            selected,
            shape: two,
            flags: 0,
            max_out_const: 33,
            iou_const: 0.5,
            score_const: 0.0,
        }),
    ));

    let roi_x = m.dense(DType::F32, [2, 3, 9, 9]);
    let rois = m.dense(DType::F32, [1, 1, 4, 4]);
    let roi_b = m.dense(DType::I64, [1, 1, 1, 4]);
    let roi_y = m.dense(DType::F32, [4, 3, 2, 2]);
    ops.push((
        "roi align",
        Op::RoiAlign(op::RoiAlign {
            input: roi_x,
            rois,
            batch_indices: roi_b,
            output: roi_y,
            spatial_scale: 0.5,
            sampling_ratio: 0,
            flags: nrt_isa::roi_flags::HALF_PIXEL,
        }),
    ));

    let d_x = m.dense(DType::F32, [1, 4, 6, 6]);
    let d_off = m.dense(DType::F32, [1, 36, 6, 6]);
    let d_mask = m.dense(DType::F32, [1, 18, 6, 6]);
    let d_cols = m.dense(DType::F32, [1, 36, 6, 6]);
    ops.push((
        "deform im2col",
        Op::DeformIm2col(op::DeformIm2col {
            input: d_x,
            offset: d_off,
            mask: Some(d_mask),
            cols: d_cols,
            window: nrt_isa::Window {
                kernel: [3, 3],
                stride: [1, 1],
                pad: [1, 1, 0, 0],
                dilation: [1, 1],
            },
            offset_groups: 2,
        }),
    ));

    // The counter sees allocations at all.
    let before = allocs();
    let v = std::hint::black_box(vec![1u8; 10]);
    assert!(allocs() > before);
    drop(v);

    for (name, op) in &ops {
        assert_eq!(second_run_allocs(&mut m, op, &mut ws), 0, "{name}");
    }
}

/// A product run by a thread that has never run one — a waiting caller lending itself to its
/// core for the first time, thousands of executions in — allocates nothing once the thread
/// was readied (`prepare_thread`, which the runtime calls on a thread's first wait), though
/// the workspace is warm. Without it, the GEMM crate sets up its thread-local packing
/// buffers right then (the control below).
#[test]
fn a_fresh_thread_runs_a_product_without_allocating_once_prepared() {
    let mut rng = Rng::new(11);
    let mut m = Arena::new(16 << 20);
    let a = m.dense(DType::F32, [1, 1, 64, 128]);
    let b = m.dense(DType::F32, [1, 1, 128, 96]);
    let c = m.dense(DType::F32, [1, 1, 64, 96]);
    m.fill_f32(&a, &mut rng, -1.0, 1.0);
    m.fill_f32(&b, &mut rng, -1.0, 1.0);
    let op = Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags: 0,
        epilogue: nrt_isa::Epilogue::NONE,
    });
    let mut ws = Workspace::new();
    m.run(&op, &mut ws).unwrap();
    let first_product_allocs = |prepare: bool, mut m: Arena, mut ws: Workspace| {
        std::thread::spawn(move || {
            if prepare {
                nrt_kernels::matmul::prepare_thread();
            }
            let before = allocs();
            m.run(&op, &mut ws).unwrap();
            (allocs() - before, m, ws)
        })
        .join()
        .unwrap()
    };
    let (control, m, ws) = first_product_allocs(false, m, ws);
    assert!(
        control > 0,
        "the GEMM crate no longer allocates on a thread's first product: prepare_thread and \
         its calls can go"
    );
    let (prepared, _, _) = first_product_allocs(true, m, ws);
    assert_eq!(
        prepared, 0,
        "allocations on a prepared thread's first product"
    );
}
