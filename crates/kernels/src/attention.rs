//! `CachedAttention` (PE, NCM 1.12): a decoder LLM's attention over its KV cache in one
//! instruction.
//!
//! For each query row and each KV head: the key rows of the row's slot at positions
//! `0..=p` are read once, each scored against every query head of the group that shares it
//! (grouped-query attention), the scores turned into probabilities (the `Softmax`
//! instruction's row kernel, `norm::softmax_row`, on a scratch row of `p + 1` floats, which
//! stays in L1), then the value rows read once,
//! each added into the group's outputs. Nothing past the query's position is read: a decode
//! step costs the sequence's length, not the cache's.
//!
//! Head dimensions 32, 64 and 128 take a path with the size known at compile time: eight key
//! rows scored at once (eight independent FMA chains, not one long one) and each head's
//! output summed in registers over the value rows; others a generic one.
//!
//! The query rows are copied into scratch and the outputs summed there, then written with
//! a raw copy: no Rust reference to device memory is alive while an operand is written (the
//! crate's aliasing convention).

use crate::norm::softmax_row;
use crate::strided::View;
use crate::{DeviceMemory, Execute, KernelError, Workspace};
use nrt_isa::op;

/// Lanes of the dot product's independent accumulators (one AVX2 register of f32).
const LANES: usize = 8;

/// Key rows scored together by the fixed-size path: as many independent FMA chains (two
/// FMA ports × four cycles of latency keep eight in flight).
const KEYS_AT_ONCE: usize = 8;

/// `Σ a[i]·b[i]`, in `LANES` partial sums (vectorized: the lanes are independent).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail = x.mul_add(*y, tail);
    }
    hsum(acc) + tail
}

#[inline(always)]
fn hsum([a0, a1, a2, a3, a4, a5, a6, a7]: [f32; LANES]) -> f32 {
    ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))
}

/// The query heads that share one KV head, over one sequence's cache rows `0..n`.
struct Group<'a> {
    /// The heads' queries, `nh × d` (a scratch copy).
    q: &'a [f32],
    /// Row 0 of the slot's keys and values for this KV head, and the elements from one
    /// position's row to the next (`[k, v]`).
    k: *const f32,
    v: *const f32,
    step: [isize; 2],
    n: usize,
    nh: usize,
    d: usize,
    scale: f32,
    /// `nh × n` scratch.
    scores: &'a mut [f32],
    /// `nh × d`: the outputs.
    out: &'a mut [f32],
}

/// The dot products of `q` with [`KEYS_AT_ONCE`] key rows: one 8-lane accumulator per row
/// (independent FMA chains), reduced together by horizontal adds.
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
#[inline(always)]
fn dots<const D: usize>(q: &[f32; D], keys: [&[f32; D]; KEYS_AT_ONCE]) -> [f32; KEYS_AT_ONCE] {
    use std::arch::x86_64::*;
    let mut out = [0f32; KEYS_AT_ONCE];
    // SAFETY: AVX2 and FMA are enabled for this build (the cfg above); every load reads 8
    // elements at `c < D` of a `D`-element array (D a multiple of 8), the store 8 floats into
    // `out`.
    unsafe {
        let mut a = [_mm256_setzero_ps(); KEYS_AT_ONCE];
        for c in (0..D).step_by(LANES) {
            let qv = _mm256_loadu_ps(q.as_ptr().add(c));
            for (a, key) in a.iter_mut().zip(keys) {
                *a = _mm256_fmadd_ps(qv, _mm256_loadu_ps(key.as_ptr().add(c)), *a);
            }
        }
        // Lanes [a0 a1 a2 a3 | the same for the upper halves], then the halves added.
        let t0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
        let t1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
        let lo = _mm256_permute2f128_ps(t0, t1, 0x20);
        let hi = _mm256_permute2f128_ps(t0, t1, 0x31);
        _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(lo, hi));
    }
    out
}

/// Portable [`dots`]: the same products, summed lane by lane.
#[cfg(not(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
)))]
#[inline(always)]
fn dots<const D: usize>(q: &[f32; D], keys: [&[f32; D]; KEYS_AT_ONCE]) -> [f32; KEYS_AT_ONCE] {
    keys.map(|k| dot(q, k))
}

/// Row `p` of a cache (`len` elements, rows `step` elements apart from `base`).
///
/// # Safety
/// The row lies inside device memory and nothing writes it while the slice lives (the
/// group's rows `0..n`, `d ≥ len` elements each, during the group's call).
#[inline(always)]
unsafe fn row<'m>(base: *const f32, step: isize, p: usize, len: usize) -> &'m [f32] {
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(base.offset(p as isize * step), len) }
}

/// [`row`] of a length known at compile time.
///
/// # Safety
/// As [`row`].
#[inline(always)]
unsafe fn row_of<'m, const D: usize>(base: *const f32, step: isize, p: usize) -> &'m [f32; D] {
    // SAFETY: the caller's guarantee; `[f32; D]` has the alignment of f32.
    unsafe { &*(base.offset(p as isize * step) as *const [f32; D]) }
}

/// Any head dimension: one dot product and one `y += a·x` per row and head.
///
/// # Safety
/// Rows `0..n` of the group's keys and values lie inside device memory, `d` elements each,
/// and nothing writes them during the call.
unsafe fn attend_any(g: &mut Group) {
    let (n, nh, d) = (g.n, g.nh, g.d);
    for p in 0..n {
        // SAFETY: p < n, the caller's guarantee.
        let key = unsafe { row(g.k, g.step[0], p, d) };
        for i in 0..nh {
            g.scores[i * n + p] = dot(&g.q[i * d..(i + 1) * d], key) * g.scale;
        }
    }
    for i in 0..nh {
        softmax_row(&mut g.scores[i * n..(i + 1) * n], false);
    }
    g.out[..nh * d].fill(0.0);
    for p in 0..n {
        // SAFETY: as above.
        let value = unsafe { row(g.v, g.step[1], p, d) };
        for i in 0..nh {
            let w = g.scores[i * n + p];
            for (y, x) in g.out[i * d..(i + 1) * d].iter_mut().zip(value) {
                *y = w.mul_add(*x, *y);
            }
        }
    }
}

/// A head dimension `D` known at compile time (a multiple of [`LANES`]), head by head (its
/// key and value rows come from L1/L2 again for the next head of the group): scores of
/// [`KEYS_AT_ONCE`] key rows at a time (independent FMA chains instead of one long one),
/// and the head's output summed in registers over the value rows.
///
/// # Safety
/// As [`attend_any`], with `g.d == D`.
unsafe fn attend_fixed<const D: usize>(g: &mut Group) {
    let (n, nh) = (g.n, g.nh);
    for i in 0..nh {
        let Some(q) = g.q[i * D..].first_chunk::<D>() else {
            return;
        };
        let scores = &mut g.scores[i * n..(i + 1) * n];
        let mut blocks = scores.chunks_exact_mut(KEYS_AT_ONCE);
        let mut p = 0;
        for block in &mut blocks {
            // SAFETY: rows p..p + KEYS_AT_ONCE ≤ n, the caller's guarantee.
            let keys: [&[f32; D]; KEYS_AT_ONCE] =
                std::array::from_fn(|j| unsafe { row_of::<D>(g.k, g.step[0], p + j) });
            for (s, dot) in block.iter_mut().zip(dots(q, keys)) {
                *s = dot * g.scale;
            }
            p += KEYS_AT_ONCE;
        }
        for s in blocks.into_remainder() {
            // SAFETY: p < n, the caller's guarantee.
            let key = unsafe { row_of::<D>(g.k, g.step[0], p) };
            *s = dot(q, key) * g.scale;
            p += 1;
        }
        softmax_row(scores, false);
        let mut acc = [0f32; D];
        for (p, &w) in scores.iter().enumerate() {
            // SAFETY: p < n, the caller's guarantee.
            let value = unsafe { row_of::<D>(g.v, g.step[1], p) };
            for c in 0..D {
                acc[c] = w.mul_add(value[c], acc[c]);
            }
        }
        g.out[i * D..(i + 1) * D].copy_from_slice(&acc);
    }
}

impl Execute for op::CachedAttention {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The decoder checked: q, out [B, L, H, D] and k, v [S, T, G, D] f32 with unit stride
        // along D; slots [1, 1, 1, B] and positions [1, 1, B, L] i64; group ≥ 1 and every
        // head's KV head (first_head + h) / group below G. The caller: every operand inside
        // device memory.
        let vq = View::<f32>::new(&self.q, mem);
        let vk = View::<f32>::new(&self.k, mem);
        let vv = View::<f32>::new(&self.v, mem);
        let vo = View::<f32>::new(&self.out, mem);
        let vs = View::<i64>::new(&self.slots, mem);
        let vp = View::<i64>::new(&self.positions, mem);
        let [b, l, h, d] = vq.shape;
        let [s, t, _, _] = vk.shape;
        if b == 0 || l == 0 || h == 0 || d == 0 {
            return Ok(());
        }
        // Every slot and position first: an out-of-range one fails the instruction before
        // anything is written.
        for r in 0..b {
            // SAFETY: (0, 0, 0, r) is inside the slots.
            let slot = unsafe { *vs.at([0, 0, 0, r]) };
            if slot < 0 || slot >= s as i64 {
                return Err(KernelError::IndexOutOfRange {
                    position: r as u64,
                    index: slot,
                    limit: s as u32,
                });
            }
            for j in 0..l {
                // SAFETY: (0, 0, r, j) is inside the positions.
                let p = unsafe { *vp.at([0, 0, r, j]) };
                if p < 0 || p >= t as i64 {
                    return Err(KernelError::IndexOutOfRange {
                        position: (r * l + j) as u64,
                        index: p,
                        limit: t as u32,
                    });
                }
            }
        }
        let attend: unsafe fn(&mut Group) = match d {
            32 => attend_fixed::<32>,
            64 => attend_fixed::<64>,
            128 => attend_fixed::<128>,
            _ => attend_any,
        };
        let group = self.group as usize;
        let first = self.first_head as usize;
        // The heads of q that share one KV head: at most `group`, at most `h`.
        let most = group.min(h);
        let (scores, qbuf, obuf) = ws.f32x3(most * t, most * d, most * d)?;
        for r in 0..b {
            // SAFETY: checked above to lie in [0, S).
            let slot = unsafe { *vs.at([0, 0, 0, r]) } as usize;
            for j in 0..l {
                // SAFETY: checked above to lie in [0, T).
                let n = unsafe { *vp.at([0, 0, r, j]) } as usize + 1;
                for kv in first / group..=(first + h - 1) / group {
                    // This KV head's query heads, as indices of q.
                    let h0 = (kv * group).max(first) - first;
                    let h1 = ((kv + 1) * group).min(first + h) - first;
                    let nh = h1 - h0;
                    for i in 0..nh {
                        // SAFETY: the D-row (r, j, h0 + i) of q lies inside device memory
                        // (unit stride); the copy goes to scratch.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                vq.at([r, j, h0 + i, 0]),
                                qbuf[i * d..].as_mut_ptr(),
                                d,
                            )
                        };
                    }
                    let mut grp = Group {
                        q: &qbuf[..nh * d],
                        k: vk.at([slot, 0, kv, 0]),
                        v: vv.at([slot, 0, kv, 0]),
                        step: [vk.stride[1], vv.stride[1]],
                        n,
                        nh,
                        d,
                        scale: self.scale,
                        scores: &mut scores[..nh * n],
                        out: &mut obuf[..nh * d],
                    };
                    // SAFETY: rows 0..n ≤ T of the slot's keys and values for KV head `kv`
                    // (< G, the decoder's check) lie inside device memory, D elements each
                    // at unit stride; nothing writes device memory during the call (the
                    // outputs go to scratch).
                    unsafe { attend(&mut grp) };
                    for i in 0..nh {
                        // SAFETY: the D-row (r, j, h0 + i) of out lies inside device memory;
                        // the source is scratch, disjoint from it.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                obuf[i * d..].as_ptr(),
                                vo.at([r, j, h0 + i, 0]),
                                d,
                            )
                        };
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
    use nrt_hal::DType;
    use nrt_isa::AccessPattern;

    struct Case {
        /// Rows and queries per row.
        bl: [usize; 2],
        /// Query heads of the instruction, the head dimension.
        h: usize,
        d: usize,
        /// Cache slots and positions, KV heads.
        st: [usize; 2],
        g: usize,
        /// Query heads per KV head, the first head's index in the model.
        group: usize,
        first: usize,
        slots: Vec<i64>,
        pos: Vec<i64>,
    }

    /// The plain definition: scores over positions 0..=p, softmax in f64, weighted sum.
    fn reference(c: &Case, q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Vec<f32> {
        let ([b, l], [_, t], (h, d, g)) = (c.bl, c.st, (c.h, c.d, c.g));
        let mut out = vec![0f32; b * l * h * d];
        for r in 0..b {
            let s = c.slots[r] as usize;
            for j in 0..l {
                let p = c.pos[r * l + j] as usize;
                for hh in 0..h {
                    let kv = (c.first + hh) / c.group;
                    let qrow = &q[((r * l + j) * h + hh) * d..][..d];
                    let at = |tt: usize| ((s * t + tt) * g + kv) * d;
                    let sc: Vec<f64> = (0..=p)
                        .map(|tt| {
                            let dot: f64 =
                                (0..d).map(|i| qrow[i] as f64 * k[at(tt) + i] as f64).sum();
                            dot * scale as f64
                        })
                        .collect();
                    let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for dd in 0..d {
                        let o: f64 = (0..=p).map(|tt| e[tt] / z * v[at(tt) + dd] as f64).sum();
                        out[((r * l + j) * h + hh) * d + dd] = o as f32;
                    }
                }
            }
        }
        out
    }

    fn dense(addr: u64, dtype: DType, shape: [usize; 4]) -> AccessPattern {
        let [_, b, c, d] = shape.map(|x| x as i32);
        AccessPattern {
            addr,
            dtype,
            shape: shape.map(|x| x as u32),
            stride: [b * c * d, c * d, d, 1],
        }
    }

    /// Runs the case on device memory laid out as q | k | v | slots | positions | out (the
    /// output first filled with 7.0); returns the result, the output and the reference.
    fn run(c: &Case, seed: u32) -> (Result<(), KernelError>, Vec<f32>, Vec<f32>) {
        let ([b, l], [s, t], (h, d, g)) = (c.bl, c.st, (c.h, c.d, c.g));
        let mut x = seed;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
                })
                .collect()
        };
        let q = rnd(b * l * h * d);
        let k = rnd(s * t * g * d);
        let v = rnd(s * t * g * d);
        let oq = 0usize;
        let ok = oq + 4 * q.len();
        let ov = ok + 4 * k.len();
        let os = (ov + 4 * v.len()).next_multiple_of(8);
        let op_ = os + 8 * c.slots.len();
        let oo = op_ + 8 * c.pos.len();
        let end = oo + 4 * q.len();
        let mut mem = vec![0u64; end.div_ceil(8)];
        let base = mem.as_mut_ptr() as *mut u8;
        let out0 = vec![7f32; q.len()];
        // SAFETY: every range lies inside `mem` (`end` bytes), aligned to its element.
        unsafe {
            let put = |src: *const u8, at: usize, bytes: usize| {
                std::ptr::copy_nonoverlapping(src, base.add(at), bytes)
            };
            put(q.as_ptr().cast(), oq, 4 * q.len());
            put(k.as_ptr().cast(), ok, 4 * k.len());
            put(v.as_ptr().cast(), ov, 4 * v.len());
            put(c.slots.as_ptr().cast(), os, 8 * c.slots.len());
            put(c.pos.as_ptr().cast(), op_, 8 * c.pos.len());
            put(out0.as_ptr().cast(), oo, 4 * out0.len());
        }
        let instr = op::CachedAttention {
            q: dense(oq as u64, DType::F32, [b, l, h, d]),
            k: dense(ok as u64, DType::F32, [s, t, g, d]),
            v: dense(ov as u64, DType::F32, [s, t, g, d]),
            slots: dense(os as u64, DType::I64, [1, 1, 1, b]),
            positions: dense(op_ as u64, DType::I64, [1, 1, b, l]),
            out: dense(oo as u64, DType::F32, [b, l, h, d]),
            scale: 1.0 / (d as f32).sqrt(),
            group: c.group as u32,
            first_head: c.first as u32,
        };
        // SAFETY: `mem` is the device memory, every operand inside it.
        let dm = unsafe { DeviceMemory::new(base, (mem.len() * 8) as u64) };
        let mut ws = Workspace::scribbled(1 << 16);
        // SAFETY: as above.
        let result = unsafe { instr.execute(dm, &mut ws) };
        let mut out = vec![0f32; q.len()];
        // SAFETY: the output lies inside `mem`.
        unsafe { std::ptr::copy_nonoverlapping(base.add(oo).cast(), out.as_mut_ptr(), out.len()) };
        let want = if result.is_ok() {
            reference(c, &q, &k, &v, instr.scale)
        } else {
            out0
        };
        (result, out, want)
    }

    fn close(got: &[f32], want: &[f32]) {
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 + 1e-5 * b.abs(),
                "element {i}: {a} vs {b}"
            );
        }
    }

    /// Decode rows (L = 1) of a batch in different slots and at different positions, a
    /// prefill (L > 1, causal by position), GQA, a core's share of the heads starting inside
    /// a group; the fixed head dimensions (32, 64, 128) and others, one not a multiple of
    /// the vector width.
    #[test]
    fn cached_attention_is_softmax_attention_up_to_each_position() {
        let cases = [
            Case {
                bl: [3, 1],
                h: 9,
                d: 64,
                st: [4, 40],
                g: 3,
                group: 3,
                first: 0,
                slots: vec![2, 0, 3],
                pos: vec![0, 17, 39],
            },
            Case {
                bl: [1, 6],
                h: 9,
                d: 64,
                st: [2, 16],
                g: 3,
                group: 3,
                first: 0,
                slots: vec![1],
                pos: vec![0, 1, 2, 3, 4, 5],
            },
            // Heads 4..9 of 9 (one core's half): KV heads 1 and 2.
            Case {
                bl: [2, 1],
                h: 5,
                d: 12,
                st: [2, 9],
                g: 3,
                group: 3,
                first: 4,
                slots: vec![1, 0],
                pos: vec![8, 3],
            },
            // The other fixed head dimensions, positions not a multiple of 4.
            Case {
                bl: [1, 2],
                h: 4,
                d: 128,
                st: [1, 7],
                g: 2,
                group: 2,
                first: 0,
                slots: vec![0],
                pos: vec![6, 2],
            },
            Case {
                bl: [2, 1],
                h: 2,
                d: 32,
                st: [2, 11],
                g: 1,
                group: 2,
                first: 0,
                slots: vec![1, 1],
                pos: vec![10, 4],
            },
            // Multi-head (group 1), odd D.
            Case {
                bl: [1, 2],
                h: 2,
                d: 5,
                st: [1, 4],
                g: 2,
                group: 1,
                first: 0,
                slots: vec![0],
                pos: vec![3, 1],
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            let (result, got, want) = run(c, 7 + i as u32);
            result.unwrap();
            close(&got, &want);
        }
    }

    /// A slot or a position outside the cache fails with the culprit named, and the output
    /// is left as it was.
    #[test]
    fn out_of_range_slots_and_positions_fail_before_writing() {
        let case = |slots: Vec<i64>, pos: Vec<i64>| Case {
            bl: [2, 1],
            h: 3,
            d: 8,
            st: [2, 4],
            g: 1,
            group: 3,
            first: 0,
            slots,
            pos,
        };
        let (r, got, want) = run(&case(vec![0, 2], vec![1, 2]), 1);
        assert!(
            matches!(
                r,
                Err(KernelError::IndexOutOfRange {
                    position: 1,
                    index: 2,
                    limit: 2
                })
            ),
            "{r:?}"
        );
        assert_eq!(got, want);
        let (r, got, want) = run(&case(vec![0, 1], vec![1, 4]), 1);
        assert!(
            matches!(
                r,
                Err(KernelError::IndexOutOfRange {
                    position: 1,
                    index: 4,
                    limit: 4
                })
            ),
            "{r:?}"
        );
        assert_eq!(got, want);
        let (r, _, _) = run(&case(vec![0, 1], vec![-1, 0]), 1);
        assert!(
            matches!(r, Err(KernelError::IndexOutOfRange { index: -1, .. })),
            "{r:?}"
        );
    }
}
