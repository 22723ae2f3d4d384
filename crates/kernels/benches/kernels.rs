//! Kernel timings: `cargo bench -p nrt-kernels [-- FILTER]`. Each line is the fastest of 15
//! timed batches of ~20 ms (the machine is a noisy, shared 2-vCPU VM: the minimum is the
//! most repeatable statistic there; compare within a run).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Arena, Rng};
use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, BinaryOp, Op, Window, matmul_flags};
use nrt_kernels::Workspace;
use std::time::Instant;

/// Seconds per call of `f`: the fastest of 15 batches.
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    let mut iters = 0u64;
    while t.elapsed().as_secs_f64() < 0.02 {
        f();
        iters += 1;
    }
    let per = t.elapsed().as_secs_f64() / iters as f64;
    let batch = ((0.02 / per) as u64).max(1);
    let mut v: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_secs_f64() / batch as f64
        })
        .collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v[0]
}

struct Bench {
    filter: Option<String>,
}

impl Bench {
    fn on(&self, name: &str) -> bool {
        self.filter
            .as_ref()
            .is_none_or(|f| name.contains(f.as_str()))
    }
}

fn matmul_op(m: &mut Arena, rng: &mut Rng, mm: u32, k: u32, n: u32, flags: u32) -> Op {
    let tb = flags & matmul_flags::TRANSPOSE_B != 0;
    let a = m.dense(DType::F32, [1, 1, mm, k]);
    let b = m.dense(DType::F32, if tb { [1, 1, n, k] } else { [1, 1, k, n] });
    let c = m.dense(DType::F32, [1, 1, mm, n]);
    m.fill_f32(&a, rng, -1.0, 1.0);
    m.fill_f32(&b, rng, -1.0, 1.0);
    Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags,
        epilogue: nrt_isa::Epilogue::NONE,
    })
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let bench = Bench { filter };
    let mut rng = Rng::new(1);
    let mut m = Arena::new(256 << 20);
    let mut ws = Workspace::new();

    if bench.on("matmul") {
        for (mm, k, n, flags) in [
            (1, 512, 512, 0),
            (1, 512, 512, matmul_flags::TRANSPOSE_B),
            (1, 256, 256, 0),
            (1, 256, 256, matmul_flags::TRANSPOSE_B),
            (1, 64, 1000, 0),
            (1, 1000, 64, 0),
            (2, 512, 512, 0),
            (2, 512, 512, matmul_flags::TRANSPOSE_B),
            (3, 512, 512, 0),
            (4, 512, 512, 0),
            (4, 512, 512, matmul_flags::TRANSPOSE_B),
            (8, 512, 512, 0),
            (64, 512, 512, 0),
            (512, 512, 512, 0),
            (128, 64, 128, 0),
            (4096, 27, 16, 0),
        ] {
            let op = matmul_op(&mut m, &mut rng, mm, k, n, flags);
            let s = time(|| m.run(&op, &mut ws).unwrap());
            let gf = 2.0 * (mm * k * n) as f64 / s / 1e9;
            println!(
                "matmul {mm}x{k}x{n} flags {flags}: {:.2} us, {gf:.1} GFLOP/s",
                s * 1e6
            );
        }
    }

    if bench.on("mlp") {
        // 4 layers, 512 wide, batch 1: MatMul + Activation(Relu, bias) each.
        for flags in [0, matmul_flags::TRANSPOSE_B] {
            let mut ops = Vec::new();
            let mut x = m.dense(DType::F32, [1, 1, 1, 512]);
            m.fill_f32(&x, &mut rng, -1.0, 1.0);
            for _ in 0..4 {
                // A square weight: transposed or not, the same bytes.
                let w = m.dense(DType::F32, [1, 1, 512, 512]);
                m.fill_f32(&w, &mut rng, -0.05, 0.05);
                let bias = m.dense(DType::F32, [1, 1, 1, 512]);
                m.fill_f32(&bias, &mut rng, -0.1, 0.1);
                let y = m.dense(DType::F32, [1, 1, 1, 512]);
                ops.push(Op::MatMul(op::MatMul {
                    a: x,
                    b: w,
                    c: y,
                    alpha: 1.0,
                    flags,
                    epilogue: nrt_isa::Epilogue::NONE,
                }));
                ops.push(Op::Activation(op::Activation {
                    input: y,
                    output: y,
                    bias: Some(bias),
                    func: ActFunc::Relu,
                    scale: 1.0,
                    alpha: 0.0,
                    beta: 0.0,
                }));
                x = y;
            }
            let s = time(|| {
                for op in &ops {
                    m.run(op, &mut ws).unwrap();
                }
            });
            println!("mlp 4x512 batch 1 (flags {flags}): {:.2} us", s * 1e6);
        }
    }

    if bench.on("packed") {
        // The f32 GEMM against a B packed once (constant weights, as `nrt compile` stores
        // them), called directly on host buffers, as a share of the register-only limit
        // measured in the same run (what `nrt bench --gemm` reports through the device).
        use nrt_kernels::gemm::Mat;
        use nrt_kernels::gemm::packed::{Packed, TileEpilogue, gemm_packed, pack_b, packed_len};
        let peak = nrt_kernels::peak::measure(
            nrt_kernels::peak::Peak::F32Fma,
            std::time::Duration::from_millis(20),
            15,
        );
        for (mm, k, n) in [
            (64usize, 512usize, 512usize),
            (512, 512, 512),
            (128, 64, 128),
        ] {
            let nr = nrt_hal::tuning::GEMM_PACK_NR;
            let a: Vec<f32> = (0..mm * k).map(|_| rng.f32(-1.0, 1.0)).collect();
            let bv: Vec<f32> = (0..k * n).map(|_| rng.f32(-1.0, 1.0)).collect();
            let mut bp = vec![0f32; packed_len(k, n, nr).unwrap()];
            pack_b(k, n, nr, |p, j| bv[p * n + j], &mut bp);
            let mut c = vec![0f32; mm * n];
            let s = time(|| {
                // SAFETY: every operand is a dense buffer of the shape it is given.
                unsafe {
                    gemm_packed(
                        mm,
                        n,
                        k,
                        Mat {
                            ptr: a.as_ptr() as *mut f32,
                            rs: k as isize,
                            cs: 1,
                        },
                        Packed {
                            ptr: bp.as_ptr(),
                            nr,
                            panel_stride: (k * nr) as isize,
                        },
                        Mat {
                            ptr: c.as_mut_ptr(),
                            rs: n as isize,
                            cs: 1,
                        },
                        1.0,
                        false,
                        TileEpilogue::NONE,
                        &mut ws,
                    )
                    .unwrap()
                }
            });
            let gf = 2.0 * (mm * k * n) as f64 / s / 1e9;
            let share = peak.map_or(String::new(), |p| {
                format!(", {:.1}% of the f32 peak", 100.0 * gf / p)
            });
            println!(
                "packed {mm}x{k}x{n}: {:.2} us, {gf:.1} GFLOP/s{share}",
                s * 1e6
            );
        }
    }

    if bench.on("qmatmul") {
        // MatMulInteger as the compiler emits it for a quantized Linear: u8 activations with
        // a zero point, constant i8 weights packed (`qmatmul_layout`), f32 output scaled.
        for (mm, k, n) in [(64u32, 512u32, 512u32), (512, 512, 512), (8, 512, 512)] {
            let a = m.dense(DType::U8, [1, 1, mm, k]);
            m.fill_with(&a, || rng.below(256));
            let za = m.dense(DType::U8, [1, 1, 1, 1]);
            m.fill_with(&za, || 128);
            let (ku, nu) = (k as usize, n as usize);
            let vals: Vec<u8> = (0..ku * nu).map(|_| rng.below(256) as u8).collect();
            let bytes =
                nrt_isa::qmatmul_layout::pack(ku, nu, true, |p, j| vals[p * nu + j]).unwrap();
            let np4 = 4 * nrt_isa::qmatmul_layout::padded_columns(nu).unwrap() as u32;
            let b = m.dense(DType::I8, [1, 1, k.div_ceil(4) + 1, np4]);
            for (x, &v) in bytes.iter().enumerate() {
                m.set_raw(&b, [0, 0, x / np4 as usize, x % np4 as usize], v as u64);
            }
            let mut scale = m.dense(DType::F32, [1, 1, 1, n]);
            m.fill_f32(&scale, &mut rng, 0.001, 0.01);
            scale.stride = [0, 0, 0, 0];
            let c = m.dense(DType::F32, [1, 1, mm, n]);
            let mut za_b = za;
            za_b.shape = [1, 1, mm, 1];
            za_b.stride = [0, 0, 0, 0];
            let op = Op::MatMulInteger(op::MatMulInteger {
                a,
                b,
                c,
                a_zero: Some(za_b),
                b_zero: None,
                packed_b: true,
                scale: Some(scale),
            });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            let ops = 2.0 * (mm * k * n) as f64;
            println!(
                "qmatmul {mm}x{k}x{n} packed: {:.2} us, {:.0} GOPS",
                s * 1e6,
                ops / s * 1e-9
            );
        }
    }

    if bench.on("act") {
        let n = 1 << 20;
        let x = m.dense(DType::F32, [1, 1, 1, n]);
        let y = m.dense(DType::F32, [1, 1, 1, n]);
        m.fill_f32(&x, &mut rng, -5.0, 5.0);
        for func in [
            ActFunc::Relu,
            ActFunc::Exp,
            ActFunc::Log,
            ActFunc::Tanh,
            ActFunc::Sigmoid,
            ActFunc::GeluErf,
            ActFunc::GeluTanh,
        ] {
            let op = Op::Activation(op::Activation {
                input: x,
                output: y,
                bias: None,
                func,
                scale: 1.0,
                alpha: 0.0,
                beta: 0.0,
            });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            println!("act {func:?} 1M: {:.3} ns/elem", s * 1e9 / n as f64);
        }
        let small = m.dense(DType::F32, [1, 1, 1, 512]);
        let op = Op::Activation(op::Activation {
            input: small,
            output: small,
            bias: Some(small),
            func: ActFunc::Relu,
            scale: 1.0,
            alpha: 0.0,
            beta: 0.0,
        });
        let s = time(|| m.run(&op, &mut ws).unwrap());
        println!("act relu+bias 512 in place: {:.3} us", s * 1e6);
    }

    if bench.on("binary") {
        let n = 1 << 20;
        let a = m.dense(DType::F32, [1, 1, 1024, 1024]);
        let b = m.dense(DType::F32, [1, 1, 1024, 1024]);
        let o = m.dense(DType::F32, [1, 1, 1024, 1024]);
        m.fill_f32(&a, &mut rng, -5.0, 5.0);
        m.fill_f32(&b, &mut rng, -5.0, 5.0);
        let row = AccessPattern {
            stride: [0, 0, 0, 1],
            ..b
        };
        let bt = AccessPattern {
            stride: [0, 0, 1, 1024],
            ..b
        };
        for (name, bb) in [("dense", b), ("row broadcast", row), ("transposed", bt)] {
            let op = Op::Binary(op::Binary {
                a,
                b: bb,
                out: o,
                op: BinaryOp::Add,
            });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            println!("binary add 1M {name}: {:.3} ns/elem", s * 1e9 / n as f64);
        }
        let op = Op::Binary(op::Binary {
            a,
            b,
            out: a,
            op: BinaryOp::Mul,
        });
        let s = time(|| m.run(&op, &mut ws).unwrap());
        println!("binary mul 1M in place: {:.3} ns/elem", s * 1e9 / n as f64);
    }

    if bench.on("copy") {
        let a = m.dense(DType::F32, [1, 1, 1024, 1024]);
        let o = m.dense(DType::F32, [1, 1, 1024, 1024]);
        m.fill_f32(&a, &mut rng, -5.0, 5.0);
        let at = AccessPattern {
            stride: [0, 0, 1, 1024],
            ..a
        };
        let h = m.dense(DType::F16, [1, 1, 1024, 1024]);
        for (name, input, output) in [("dense", a, o), ("transpose", at, o), ("f32->f16", a, h)] {
            let op = Op::Copy(op::Copy { input, output });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            println!("copy 1M {name}: {:.3} ns/elem", s * 1e9 / (1 << 20) as f64);
        }
    }

    if bench.on("conv") {
        // The machine's f32 FMA limit in this run: each row's share of it.
        let peak = nrt_kernels::peak::measure(
            nrt_kernels::peak::Peak::F32Fma,
            std::time::Duration::from_millis(50),
            5,
        )
        .unwrap_or(f64::NAN);
        println!("conv: f32 FMA limit {peak:.1} GFLOP/s");
        for (name, c, o, hw, k, groups, with_ws) in [
            ("3x3 64->64 56x56 im2col", 64, 64, 56, 3, 1, true),
            ("3x3 64->64 56x56 direct", 64, 64, 56, 3, 1, false),
            ("1x1 64->256 56x56", 64, 256, 56, 1, 1, false),
            ("3x3 dw 128 56x56", 128, 128, 56, 3, 128, false),
            ("3x3 dw 32 56x56", 32, 32, 56, 3, 32, false),
            // MobileNetV2's stride-2 depthwise layer, and a 5×5 one (EfficientNet).
            ("3x3 dw 96 112x112 s2", 96, 96, 112, 3, 96, false),
            ("5x5 dw 240 28x28", 240, 240, 28, 5, 240, false),
            ("3x3 3->32 224x224 s2 im2col", 3, 32, 224, 3, 1, true),
            // SqueezeNet 1.1's first layer.
            ("3x3 3->64 224x224 s2 im2col", 3, 64, 224, 3, 1, true),
            // A DCGAN discriminator's layers: patches of K = Cg·KH·KW = 1024 and 2048, so
            // the weight rows the panel path reads are a multiple of 4 KiB apart; beside
            // them K = 960, the same work without that stride.
            ("dcgan 4x4 64->128 32x32 s2 im2col", 64, 128, 32, 4, 1, true),
            ("4x4 60->128 32x32 s2 im2col", 60, 128, 32, 4, 1, true),
            (
                "dcgan 4x4 128->256 16x16 s2 im2col",
                128,
                256,
                16,
                4,
                1,
                true,
            ),
            // The `cnn` sample's two convolutions.
            ("cnn conv1 3x3 3->16 32x32 im2col", 3, 16, 32, 3, 1, true),
            (
                "cnn conv2 3x3 16->32 16x16 s2 im2col",
                16,
                32,
                16,
                3,
                1,
                true,
            ),
        ] {
            let stride = if name.contains("s2") { 2 } else { 1 };
            let pad = k / 2;
            let window = Window {
                kernel: [0, 0],
                stride: [stride, stride],
                pad: [pad; 4],
                dilation: [1, 1],
            };
            let input = m.dense(DType::F32, [1, c, hw, hw]);
            m.fill_f32(&input, &mut rng, -1.0, 1.0);
            let weight = m.dense(DType::F32, [o, c / groups, k, k]);
            m.fill_f32(&weight, &mut rng, -1.0, 1.0);
            let oh = window.out_dim(0, hw, k).unwrap();
            let output = m.dense(DType::F32, [1, o, oh, oh]);
            let bias = Some(m.dense(DType::F32, [1, 1, 1, o]));
            let workspace =
                with_ws.then(|| m.dense(DType::F32, [1, 1, 1, (c / groups) * k * k * oh * oh]));
            let op = Op::Conv(op::Conv {
                input,
                weight,
                output,
                bias,
                workspace,
                window,
                groups,
                act: (ActFunc::Identity, 0.0, 0.0),
            });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            let flops = 2.0 * (o * (c / groups) * k * k * oh * oh) as f64;
            println!(
                "conv {name}: {:.1} us, {:.1} GFLOP/s ({:.0}% of the limit)",
                s * 1e6,
                flops / s / 1e9,
                100.0 * flops / s / 1e9 / peak
            );
        }
    }

    if bench.on("reduce") {
        let x = m.dense(DType::F32, [1, 1, 1000, 1000]);
        m.fill_f32(&x, &mut rng, -5.0, 5.0);
        for (name, axes, oshape) in [
            ("rows (axis 3)", 0b1000u8, [1u32, 1, 1000, 1]),
            ("columns (axis 2)", 0b0100, [1, 1, 1, 1000]),
        ] {
            let output = m.dense(DType::F32, oshape);
            let op = Op::Reduce(op::Reduce {
                input: x,
                output,
                op: nrt_isa::ReduceOp::Sum,
                axes,
            });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            println!("reduce sum 1000x1000 {name}: {:.3} ns/elem", s * 1e9 / 1e6);
        }
    }

    if bench.on("pool") {
        // SqueezeNet 1.1's max pools (3x3, stride 2, no padding), a padded 3x3 stride-1
        // average pool (Inception's), and the 2x2 stride-2 fast path.
        for (c, h, k, s, pad, op) in [
            (64u32, 111u32, 3u32, 2u32, 0u32, nrt_isa::PoolOp::Max),
            (8, 111, 3, 2, 0, nrt_isa::PoolOp::Max),
            (128, 55, 3, 2, 0, nrt_isa::PoolOp::Max),
            (192, 28, 3, 1, 1, nrt_isa::PoolOp::Avg),
            (64, 112, 2, 2, 0, nrt_isa::PoolOp::Max),
        ] {
            let window = Window {
                kernel: [k, k],
                stride: [s, s],
                pad: [pad; 4],
                dilation: [1, 1],
            };
            let oh = (h + 2 * pad - k) / s + 1;
            let input = m.dense(DType::F32, [1, c, h, h]);
            let output = m.dense(DType::F32, [1, c, oh, oh]);
            m.fill_f32(&input, &mut rng, -1.0, 1.0);
            let op = Op::Pool(op::Pool {
                input,
                output,
                window,
                op,
                count_include_pad: false,
            });
            let t = time(|| m.run(&op, &mut ws).unwrap());
            println!(
                "pool {k}x{k} s{s} pad {pad} over {c}x{h}x{h}: {:.1} us",
                t * 1e6
            );
        }
    }

    if bench.on("softmax") {
        // A large square, and the attention scores of the encoder sample (512 rows of 128).
        for (rows, cols) in [(1000u32, 1000u32), (512, 128)] {
            let x = m.dense(DType::F32, [1, 1, rows, cols]);
            let y = m.dense(DType::F32, [1, 1, rows, cols]);
            m.fill_f32(&x, &mut rng, -5.0, 5.0);
            let op = Op::Softmax(op::Softmax {
                input: x,
                output: y,
                log: false,
            });
            let s = time(|| m.run(&op, &mut ws).unwrap());
            let n = f64::from(rows) * f64::from(cols);
            println!(
                "softmax {rows}x{cols}: {:.2} us, {:.3} ns/elem",
                s * 1e6,
                s * 1e9 / n
            );
        }
    }
}
