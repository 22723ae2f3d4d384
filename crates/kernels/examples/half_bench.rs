//! The bf16-weight MatMul's two kernels side by side at short K, where the compiler chooses
//! between them (`nrt_hal::tuning::GEMM_PACK_MIN_K_BF16`): the packed GEMM
//! (`gemm_packed_bf16`, weights in panels of pairs of K) and the dot-product kernel over
//! `[N, K]` weights (`gemm_half`).
//! `cargo run --release -p nrt-kernels --example half_bench [M K N ...]`
use nrt_isa::matmul_flags::pack_b_pairs;
use nrt_kernels::Workspace;
use nrt_kernels::elem::f32_to_bf16;
use nrt_kernels::gemm::packed::{Bf16Kernel, gemm_packed_bf16};
use nrt_kernels::gemm::{Half, HalfMat, Mat, PackedBf16, TileEpilogue, gemm_half};
use std::time::Instant;

fn best<F: FnMut()>(mut f: F) -> f64 {
    for _ in 0..20 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..30 {
        let t = Instant::now();
        for _ in 0..20 {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / 20.0);
    }
    best
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let shapes: Vec<(usize, usize, usize)> = if args.len() >= 3 {
        args.chunks_exact(3).map(|c| (c[0], c[1], c[2])).collect()
    } else {
        let mut v = Vec::new();
        for m in [1, 4, 16, 128] {
            for k in [16, 32, 64, 96, 128] {
                v.push((m, k, 128));
            }
        }
        v
    };
    let kernel = Bf16Kernel::best();
    println!("bf16 packed kernel {kernel:?}; times in ns (best of 30 batches)");
    let mut ws = Workspace::new();
    for (m, k, n) in shapes {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
            .collect();
        let bf: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        // [N, K] storage for the dot-product kernel.
        let bnk: Vec<u16> = (0..n * k)
            .map(|i| f32_to_bf16(bf[(i % k) * n + i / k]))
            .collect();
        let nr = 32;
        let packed = pack_b_pairs(k, n, nr, |p, j| f32_to_bf16(bf[p * n + j]));
        let mut c = vec![0f32; m * n];
        let ma = Mat {
            ptr: a.as_ptr() as *mut f32,
            rs: k as isize,
            cs: 1,
        };
        let mc = Mat {
            ptr: c.as_mut_ptr(),
            rs: n as isize,
            cs: 1,
        };
        // SAFETY: A m×k, B k×n as [N, K], C m×n, all inside their vectors.
        let dot = best(|| unsafe {
            gemm_half(
                m,
                n,
                k,
                ma,
                HalfMat {
                    ptr: bnk.as_ptr(),
                    rs: 1,
                    cs: k as isize,
                    kind: Half::Bf16,
                },
                mc,
                1.0,
                false,
                true,
                &mut ws,
            )
            .unwrap()
        });
        // SAFETY: as above, B's panels inside `packed`.
        let pk = best(|| unsafe {
            gemm_packed_bf16(
                m,
                n,
                k,
                ma,
                PackedBf16 {
                    ptr: packed.as_ptr(),
                    nr,
                    panel_stride: (k.div_ceil(2) * 2 * nr) as isize,
                },
                mc,
                1.0,
                false,
                TileEpilogue::NONE,
                kernel,
                &mut ws,
            )
            .unwrap()
        });
        println!(
            "{m}x{k}x{n}: dot {dot:.0}  packed {pk:.0}  packed/dot {:.2}",
            pk / dot
        );
    }
}
