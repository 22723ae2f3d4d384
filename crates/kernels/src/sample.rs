//! `Sample`: one token per row of logits, on the device — greedy, or temperature with
//! top-k and top-p (nucleus) restriction, drawn with a counter-based generator so that a
//! request's `(seed, step)` gives the same draw whatever else shares the batch; and the chosen
//! token's log-probability under the unmodified logits.
//!
//! Per row: the logits are gathered once into scratch; their maximum and log-sum-exp give the
//! log-probability. Greedy takes the first maximum (NaN ranks below every number). Sampling
//! scales by `1/temperature`; with neither restriction it walks the row in index order to the
//! draw; with top-k the `k` best are selected (`select_nth_unstable_by`, O(N)) and sorted,
//! with top-p alone the row is sorted (most likely first, ties by index), and the kept prefix
//! is the smallest whose probability reaches `top_p`.

use crate::strided::View;
use crate::{DeviceMemory, Execute, KernelError, Workspace};
use core::cmp::Ordering;
use nrt_isa::op;

/// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection of 64-bit words whose output
/// bits each depend on every input bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform draw in `[0, 1)` of `(seed, step)`: a counter-based generator (the value is a
/// function of the pair alone), 53 bits.
pub fn uniform(seed: u64, step: u64) -> f64 {
    let z = mix(mix(seed.wrapping_add(0x9E37_79B9_7F4A_7C15)) ^ step);
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Descending by value, NaN last, ties by the lower index.
fn better(x: &[f32]) -> impl Fn(&u64, &u64) -> Ordering + '_ {
    move |a, b| {
        let (va, vb) = (x[*a as usize], x[*b as usize]);
        let o = match (va.is_nan(), vb.is_nan()) {
            (false, false) => vb.partial_cmp(&va).unwrap_or(Ordering::Equal),
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (true, true) => Ordering::Equal,
        };
        o.then(a.cmp(b))
    }
}

/// One row: returns `(token, logprob)`.
fn sample_row(
    x: &mut [f32],
    order: &mut [u64],
    temperature: f32,
    top_k: i64,
    top_p: f32,
    u: f64,
) -> (usize, f32) {
    let n = x.len();
    let mut best = 0;
    let mut max = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > max {
            max = v;
            best = i;
        }
    }
    let lse = max as f64
        + x.iter()
            .filter(|v| !v.is_nan())
            .map(|&v| ((v - max) as f64).exp())
            .sum::<f64>()
            .ln();
    let logprob = |t: usize, x: &[f32]| (x[t] as f64 - lse) as f32;
    if temperature.is_nan() || temperature <= 0.0 || !max.is_finite() {
        return (best, logprob(best, x));
    }
    // Weights of the scaled logits, relative to the maximum (the raw logits stay in `x`
    // for the log-probability).
    let inv_t = 1.0 / temperature as f64;
    let weight = |v: f32| {
        if v.is_nan() {
            0.0
        } else {
            (((v - max) as f64) * inv_t).exp()
        }
    };
    let k = if top_k > 0 && (top_k as u64) < n as u64 {
        top_k as usize
    } else {
        n
    };
    let nucleus = top_p.is_finite() && top_p < 1.0;
    if k == n && !nucleus {
        let total: f64 = x.iter().map(|&v| weight(v)).sum();
        let target = u * total;
        let mut acc = 0.0;
        let mut last = best;
        for (i, &v) in x.iter().enumerate() {
            let w = weight(v);
            if w > 0.0 {
                last = i;
                acc += w;
                if acc > target {
                    return (i, logprob(i, x));
                }
            }
        }
        return (last, logprob(last, x));
    }
    for (j, o) in order.iter_mut().enumerate() {
        *o = j as u64;
    }
    let cmp = better(x);
    if k < n {
        order.select_nth_unstable_by(k - 1, &cmp);
    }
    order[..k].sort_unstable_by(&cmp);
    let kept = &order[..k];
    let total: f64 = kept.iter().map(|&i| weight(x[i as usize])).sum();
    let mut keep = k;
    if nucleus {
        let want = top_p.max(0.0) as f64 * total;
        let mut acc = 0.0;
        for (j, &i) in kept.iter().enumerate() {
            acc += weight(x[i as usize]);
            if acc >= want {
                keep = j + 1;
                break;
            }
        }
    }
    let kept = &kept[..keep];
    let mass: f64 = kept.iter().map(|&i| weight(x[i as usize])).sum();
    let target = u * mass;
    let mut acc = 0.0;
    for &i in kept {
        acc += weight(x[i as usize]);
        if acc > target {
            return (i as usize, logprob(i as usize, x));
        }
    }
    let last = kept.last().map_or(best, |&i| i as usize);
    (last, logprob(last, x))
}

impl Execute for op::Sample {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]); the
        // decoder checked the types and that the per-row operands have the rows' shape.
        let vl = View::<f32>::new(&self.logits, mem);
        let vt = View::<f32>::new(&self.temperature, mem);
        let vk = View::<i64>::new(&self.top_k, mem);
        let vp = View::<f32>::new(&self.top_p, mem);
        let vs = View::<i64>::new(&self.seed, mem);
        let vc = View::<i64>::new(&self.step, mem);
        let vo = View::<i64>::new(&self.token, mem);
        let vq = View::<f32>::new(&self.logprob, mem);
        let n = vl.shape[3];
        if n == 0 || vo.elements() == 0 {
            return Ok(());
        }
        let (x, order) = ws.f32_and_words(n, n)?;
        for a in 0..vl.shape[0] {
            for b in 0..vl.shape[1] {
                for c in 0..vl.shape[2] {
                    let r = [a, b, c, 0];
                    // SAFETY: every index is inside its operand (the decoder checked the
                    // shapes); the scratch is distinct from device memory.
                    unsafe {
                        let row = vl.at(r);
                        for (j, v) in x.iter_mut().enumerate() {
                            *v = *row.offset(j as isize * vl.stride[3]);
                        }
                        let u = uniform(*vs.at(r) as u64, *vc.at(r) as u64);
                        let (t, lp) = sample_row(x, order, *vt.at(r), *vk.at(r), *vp.at(r), u);
                        vo.at(r).write(t as i64);
                        vq.at(r).write(lp);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(x: &[f32], t: f32, k: i64, p: f32, u: f64) -> usize {
        let mut xs = x.to_vec();
        let mut order = vec![0u64; x.len()];
        sample_row(&mut xs, &mut order, t, k, p, u).0
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_its_logprob() {
        let x = [1.0, 3.0, 3.0, -2.0];
        let mut xs = x.to_vec();
        let mut order = vec![0u64; 4];
        let (t, lp) = sample_row(&mut xs, &mut order, 0.0, 0, 1.0, 0.5);
        assert_eq!(t, 1);
        let lse = x.iter().map(|v: &f32| (*v as f64).exp()).sum::<f64>().ln();
        assert!((lp as f64 - (3.0 - lse)).abs() < 1e-6);
        assert_eq!(draw(&[f32::NAN, 1.0], 0.0, 0, 1.0, 0.0), 1);
    }

    #[test]
    fn draws_follow_the_restricted_distribution() {
        // Probabilities ∝ exp(x): 0.0321, 0.0871, 0.2369, 0.6439.
        let x = [0.0f32, 1.0, 2.0, 3.0];
        // Unrestricted: the draw walks the row in index order.
        assert_eq!(draw(&x, 1.0, 0, 1.0, 0.01), 0);
        assert_eq!(draw(&x, 1.0, 0, 1.0, 0.05), 1);
        assert_eq!(draw(&x, 1.0, 0, 1.0, 0.99), 3);
        // top-k 1 is greedy whatever the draw.
        for u in [0.0, 0.5, 0.999] {
            assert_eq!(draw(&x, 1.0, 1, 1.0, u), 3);
        }
        // top-k 2 keeps tokens 3 (0.731) then 2 (0.269), most likely first.
        assert_eq!(draw(&x, 1.0, 2, 1.0, 0.7), 3);
        assert_eq!(draw(&x, 1.0, 2, 1.0, 0.75), 2);
        // top-p 0.6 keeps only token 3 (0.644 ≥ 0.6); 0.7 keeps 3 and 2.
        assert_eq!(draw(&x, 1.0, 0, 0.6, 0.99), 3);
        assert_eq!(draw(&x, 1.0, 0, 0.7, 0.99), 2);
        // A high temperature flattens, a low one sharpens.
        assert_eq!(draw(&x, 100.0, 0, 1.0, 0.3), 1);
        assert_eq!(draw(&x, 0.01, 0, 1.0, 0.01), 3);
    }

    #[test]
    fn the_generator_is_a_function_of_seed_and_step() {
        assert_eq!(uniform(7, 3), uniform(7, 3));
        assert_ne!(uniform(7, 3), uniform(7, 4));
        assert_ne!(uniform(7, 3), uniform(8, 3));
        // Roughly uniform: the mean of 10,000 draws.
        let m: f64 = (0..10_000).map(|s| uniform(42, s)).sum::<f64>() / 10_000.0;
        assert!((m - 0.5).abs() < 0.01, "{m}");
        assert!((0..10_000).all(|s| (0.0..1.0).contains(&uniform(s, 1))));
    }
}
