//! Throughput of the packed-B GEMM beside the GEMM crate and the machine's f32 peak:
//! `cargo run --release -p nrt-kernels --example packed_bench [avx2|portable] [M K N ...]`
//! (`avx2` or `portable`: that kernel instead of the best one this CPU runs).
use nrt_kernels::gemm::packed::{Isa, Packed, TileEpilogue, gemm_packed_on, pack_b, packed_len};
use nrt_kernels::gemm::{Mat, gemm_f32};
use nrt_kernels::peak::{Peak, measure};
use std::time::{Duration, Instant};

fn best<F: FnMut()>(mut f: F) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut best = f64::MAX;
    for _ in 0..30 {
        let t = Instant::now();
        for _ in 0..5 {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / 5.0);
    }
    best
}

fn main() {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let isa = match words.first().map(String::as_str) {
        Some("avx2") => Isa::Avx2,
        Some("portable") => Isa::Portable,
        _ => Isa::best(),
    };
    if !isa.available() {
        eprintln!("packed_bench: this CPU does not run the {isa:?} kernel");
        std::process::exit(2);
    }
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let shapes: Vec<(usize, usize, usize)> = if args.len() >= 3 {
        args.chunks_exact(3).map(|c| (c[0], c[1], c[2])).collect()
    } else {
        vec![
            (64, 512, 512),
            (512, 512, 512),
            (64, 512, 256),
            (128, 512, 2048),
            (128, 2048, 512),
            // `encoder`'s second FFN product: rows of A 4 KiB apart.
            (128, 1024, 128),
        ]
    };
    let peak = measure(Peak::F32Fma, Duration::from_millis(30), 20).unwrap_or(f64::NAN);
    println!("peak f32 {peak:.1} GFLOP/s; packed kernel {isa:?}");
    for (m, k, n) in shapes {
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.1 - 0.5)
            .collect();
        let mut c = vec![0f32; m * n];
        let flop = 2.0 * (m * k * n) as f64;
        let ma = Mat {
            ptr: a.as_ptr() as *mut f32,
            rs: k as isize,
            cs: 1,
        };
        let mb = Mat {
            ptr: b.as_ptr() as *mut f32,
            rs: n as isize,
            cs: 1,
        };
        let mc = Mat {
            ptr: c.as_mut_ptr(),
            rs: n as isize,
            cs: 1,
        };
        // SAFETY: the three buffers have the shapes and strides given.
        let crate_ns = best(|| unsafe { gemm_f32(m, n, k, ma, mb, mc, 1.0, false) });
        let mut line = format!("{m}x{k}x{n}: crate {:.0}%", 100.0 * flop / crate_ns / peak);
        for nr in [16usize, 32, 64] {
            let mut p = vec![0f32; packed_len(k, n, nr).unwrap()];
            pack_b(k, n, nr, |pp, j| b[pp * n + j], &mut p);
            let pb = Packed {
                ptr: p.as_ptr(),
                nr,
                panel_stride: (k * nr) as isize,
            };
            // SAFETY: as above; the packed buffer holds every panel.
            let ns = best(|| unsafe {
                gemm_packed_on(isa, m, n, k, ma, pb, mc, 1.0, false, TileEpilogue::NONE)
            });
            line += &format!(
                "  packed{nr} {:.0}% ({:.1} us)",
                100.0 * flop / ns / peak,
                ns / 1e3
            );
        }
        // Four different weights in turn (an MLP's layers: B no longer stays in L2).
        let nr = 32;
        let packs: Vec<Vec<f32>> = (0..4)
            .map(|_| {
                let mut p = vec![0f32; packed_len(k, n, nr).unwrap()];
                pack_b(k, n, nr, |pp, j| b[pp * n + j], &mut p);
                p
            })
            .collect();
        let mut i = 0;
        let ns = best(|| {
            let pb = Packed {
                ptr: packs[i % 4].as_ptr(),
                nr,
                panel_stride: (k * nr) as isize,
            };
            i += 1;
            // SAFETY: as above.
            unsafe { gemm_packed_on(isa, m, n, k, ma, pb, mc, 1.0, false, TileEpilogue::NONE) }
        });
        line += &format!(
            "  4 weights in turn {:.0}% ({:.1} us)",
            100.0 * flop / ns / peak,
            ns / 1e3
        );
        // An MLP's layers (square products only): the four weights in turn, each layer's
        // output the next one's input, bias and Relu in the epilogue.
        if k == n {
            let bias: Vec<f32> = (0..n).map(|j| (j % 7) as f32 * 0.01).collect();
            let mut acts: Vec<Vec<f32>> = (0..5).map(|_| a.clone()).collect();
            let ns = best(|| {
                for l in 0..4 {
                    let (x, y) = acts.split_at_mut(l + 1);
                    let pb = Packed {
                        ptr: packs[l].as_ptr(),
                        nr,
                        panel_stride: (k * nr) as isize,
                    };
                    let epi = TileEpilogue {
                        bias: bias.as_ptr(),
                        row_bias: core::ptr::null(),
                        relu: true,
                    };
                    let (xa, yc) = (
                        Mat {
                            ptr: x[l].as_mut_ptr(),
                            rs: k as isize,
                            cs: 1,
                        },
                        Mat {
                            ptr: y[0].as_mut_ptr(),
                            rs: n as isize,
                            cs: 1,
                        },
                    );
                    // SAFETY: as above; activation l is m×k, l + 1 m×n, distinct buffers.
                    unsafe { gemm_packed_on(isa, m, n, k, xa, pb, yc, 1.0, false, epi) }
                }
            }) / 4.0;
            line += &format!(
                "  chained layers {:.0}% ({:.1} us a layer)",
                100.0 * flop / ns / peak,
                ns / 1e3
            );
        }
        println!("{line}");
    }
}
