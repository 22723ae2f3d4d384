//! `RmsNorm` (the normalization of decoder LLMs) against an f64 reference: random shapes and
//! layouts (strided, reversed, gapped), gamma broadcast from one row or given per row, rows
//! longer and shorter than the kernel's 16-lane accumulators, zero rows (only `eps` left).

mod common;

use common::{Arena, Rng};
use nrt_hal::DType;
use nrt_isa::{AccessPattern, Op, op};
use nrt_kernels::Workspace;

fn reference(m: &mut Arena, o: &op::RmsNorm) -> Vec<f32> {
    let [a, b, c, l] = o.input.shape.map(|d| d as usize);
    let mut out = Vec::with_capacity(a * b * c * l);
    for i in 0..a {
        for j in 0..b {
            for k in 0..c {
                let x: Vec<f64> = (0..l)
                    .map(|t| m.get_f32(&o.input, [i, j, k, t]) as f64)
                    .collect();
                let ms = x.iter().map(|v| v * v).sum::<f64>() / l as f64;
                let r = 1.0 / (ms + o.eps as f64).sqrt();
                for (t, v) in x.iter().enumerate() {
                    let g = m.get_f32(&o.gamma, [i, j, k, t]) as f64;
                    out.push((v * r * g) as f32);
                }
            }
        }
    }
    out
}

#[test]
fn rms_norm_matches_the_f64_reference_on_random_layouts() {
    let mut rng = Rng::new(0x5eed_4e0b);
    let mut ws = Workspace::new();
    for case in 0..300 {
        let mut m = Arena::new(1 << 22);
        let l = [1, 3, 15, 16, 17, 64, 100, 576][rng.below(8) as usize];
        let shape = [
            1 + rng.below(2) as u32,
            1 + rng.below(3) as u32,
            1 + rng.below(4) as u32,
            l,
        ];
        let input = m.random(&mut rng, DType::F32, shape, false);
        let gamma = if rng.chance(0.5) {
            // One row of weights broadcast over every row, as a model's norm weights are.
            let row = m.dense(DType::F32, [1, 1, 1, l]);
            AccessPattern {
                shape,
                stride: [0, 0, 0, row.stride[3]],
                ..row
            }
        } else {
            m.random(&mut rng, DType::F32, shape, true)
        };
        let output = m.random(&mut rng, DType::F32, shape, false);
        m.fill_f32(&input, &mut rng, -3.0, 3.0);
        m.fill_f32(&gamma, &mut rng, -3.0, 3.0);
        // A zero row leaves only eps (0/0 without it, which the comparison could not take).
        let zero_rows = rng.chance(0.1);
        if zero_rows {
            m.fill_with(&input, || 0);
        }
        let eps = match rng.below(3) {
            0 if !zero_rows => 0.0,
            1 => 1e-6,
            _ => 1e-5,
        };
        let o = op::RmsNorm {
            input,
            gamma,
            output,
            eps,
        };
        m.run(&Op::RmsNorm(o), &mut ws).unwrap();
        let want = reference(&mut m, &o);
        let got = m.read_f32(&output);
        for (n, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-5 * w.abs().max(1.0);
            assert!(
                (g - w).abs() <= tol,
                "case {case} {shape:?} [{n}]: {g} vs {w}"
            );
        }
    }
}
