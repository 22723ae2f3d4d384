//! Block-quantized weights (NCM 1.11): `MatMulBlockQuant` (PE) and `GatherBlockQuant`
//! (POOL) over ggml's `Q4_0`, `Q4_1` and `Q8_0` blocks as a GGUF file stores them
//! ([`BlockFormat`]). No weight is ever widened to f32 in memory: the product decodes each
//! 32-weight block in registers.
//!
//! The product is llama.cpp's: each row of A is first rounded to 8-bit blocks of 32 with
//! their own scale `dx = max|x|/127` (round half to even) and `s = dx·Σq` ([`QBlock`]);
//! then per block of a weight row, the integer dot product of the two blocks' quants,
//! scaled by `dw·dx`, plus the format's offset term (`Q4_0`: `−8·dw·s`; `Q4_1`: `m·s`).
//!
//! Every result is defined bit for bit, whatever the CPU: a row keeps two accumulators of 8
//! lanes, one for the even blocks and one for the odd ones (two FMA chains); lane `u` of
//! a block's accumulator receives `fma(dw·dx, Σ_{i=4u}^{4u+3} qw_i·qx_i, lane)` — which is
//! what AVX2's `vpmaddubsw` + `vpmaddwd` + `vfmadd` compute. At the end the two are added
//! lane by lane, the lanes summed in the order of a 256-bit horizontal add, and the offset
//! terms (two chains likewise) added. With rows interleaved in groups of 8 (the `x8`
//! formats) each row has one accumulator, `fma(dw·dx, Σ qw·qx, acc)` block by block, and
//! the result is `acc + extra`. The portable kernels spell out the same arithmetic, so they
//! and the AVX2 ones (`blockq/avx2.rs`) agree exactly (tested).

use crate::elem::f16_to_f32;
use crate::strided::View;
use crate::{DeviceMemory, Execute, KernelError, Workspace};
use nrt_isa::op::{self, BlockFormat};

/// Weights per block.
pub const QK: usize = 32;

/// One block of 32 activations rounded to 8 bits.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub struct QBlock {
    /// The quants.
    pub q: [i8; QK],
    /// The scale: value `i` ≈ `d·q[i]`.
    pub d: f32,
    /// `d·Σq` (the offset terms' factor).
    pub s: f32,
}

// SAFETY: plain numbers (no padding: 32 + 4 + 4 bytes), every bit pattern valid, alignment 4.
unsafe impl crate::Pod for QBlock {}

/// Rounds `x` (a multiple of 32 values) into `out` (`x.len()/32` blocks): AVX2 where the CPU
/// has it, else [`quantize_row_portable`] — the same bits either way (tested).
pub fn quantize_row(x: &[f32], out: &mut [QBlock]) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        unsafe { avx2::quantize_row(x, out) };
        return;
    }
    quantize_row_portable(x, out);
}

/// [`quantize_row`] in plain Rust: `d = max|x|/127`, `q = x·(1/d)` rounded half to even and
/// saturated to i8 (NaN → 0), `s = d·Σq`.
pub fn quantize_row_portable(x: &[f32], out: &mut [QBlock]) {
    for (xb, o) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in o.q.iter_mut().zip(xb) {
            // `as` saturates (and maps NaN to 0): no value leaves the i8 range.
            *q = (v * id).round_ties_even() as i8;
            sum += *q as i32;
        }
        o.d = d;
        o.s = d * sum as f32;
    }
}

/// The four partial sums of a block row pair combined into 8 lanes, the portable spelling
/// of `vpmaddubsw` + `vpmaddwd` (no saturation can occur: |w| ≤ 128, |x| ≤ 127).
#[inline(always)]
fn lane_sums(w: &[i32; QK], x: &[i8; QK]) -> [i32; 8] {
    let mut l = [0i32; 8];
    for (u, lane) in l.iter_mut().enumerate() {
        for i in 4 * u..4 * u + 4 {
            *lane += w[i] * x[i] as i32;
        }
    }
    l
}

/// The sum of 8 lanes in the order of the AVX2 horizontal add.
#[inline(always)]
fn hsum8(a: [f32; 8]) -> f32 {
    let q = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let p = [q[0] + q[2], q[1] + q[3]];
    p[0] + p[1]
}

/// Block `b` of a weight row decoded to its quants, scale and offset factor: the value of
/// weight `i` is `d·q[i] + off·…` where the offset term per activation block is `off·s`.
#[inline(always)]
fn decode_block(f: BlockFormat, blk: &[u8]) -> ([i32; QK], f32, f32) {
    let f = f.base();
    let d = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
    let mut q = [0i32; QK];
    if f == BlockFormat::Q8_0 {
        for (j, &b) in blk[2..34].iter().enumerate() {
            q[j] = b as i8 as i32;
        }
    } else {
        let nib = if f == BlockFormat::Q4_0 {
            &blk[2..18]
        } else {
            &blk[4..20]
        };
        for (j, &b) in nib.iter().enumerate() {
            q[j] = (b & 15) as i32;
            q[j + 16] = (b >> 4) as i32;
        }
    }
    let off = match f {
        BlockFormat::Q4_0 => -8.0 * d,
        BlockFormat::Q4_1 => f16_to_f32(u16::from_le_bytes([blk[2], blk[3]])),
        _ => 0.0,
    };
    (q, d, off)
}

/// `out[m] = Σ_b dot(w block b, x[m] block b)` for each activation row `x[m]` — the
/// portable kernel.
fn dot_rows_portable(f: BlockFormat, w: &[u8], x: &[&[QBlock]], out: &mut [f32]) {
    let bb = f.block_bytes() as usize;
    for (xs, os) in x.chunks(4).zip(out.chunks_mut(4)) {
        // Two chains per row: even blocks (but a last odd one) and odd blocks.
        let mut lanes = [[[0f32; 8]; 2]; 4];
        let mut extra = [[0f32; 2]; 4];
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let chain = if b % 2 == 1 { 1 } else { 0 };
            let (q, d, off) = decode_block(f, blk);
            for (r, xr) in xs.iter().enumerate() {
                let xb = &xr[b];
                let sc = d * xb.d;
                let l = lane_sums(&q, &xb.q);
                for (acc, v) in lanes[r][chain].iter_mut().zip(l) {
                    *acc = sc.mul_add(v as f32, *acc);
                }
                if f.base() != BlockFormat::Q8_0 {
                    extra[r][chain] = off.mul_add(xb.s, extra[r][chain]);
                }
            }
        }
        for (r, o) in os.iter_mut().enumerate() {
            let [a, b] = lanes[r];
            let sum: [f32; 8] = std::array::from_fn(|i| a[i] + b[i]);
            *o = hsum8(sum) + (extra[r][0] + extra[r][1]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Whether the AVX2 kernel runs here.
fn use_avx2() -> bool {
    cfg!(target_arch = "x86_64") && crate::cpu::avx2_fma() && f16c()
}

#[cfg(target_arch = "x86_64")]
fn f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c")
}
#[cfg(not(target_arch = "x86_64"))]
fn f16c() -> bool {
    false
}

/// `out[m] = W row · x[m]` for every activation row: the AVX2 kernel where the CPU has it,
/// else the portable one (the same bits either way).
pub fn dot_rows(f: BlockFormat, w: &[u8], x: &[&[QBlock]], out: &mut [f32], avx2: bool) {
    let nb = w.len() / f.block_bytes() as usize;
    assert!(x.iter().all(|r| r.len() >= nb) && out.len() >= x.len());
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only true where `use_avx2` said so; the blocks were checked
        // just above.
        return unsafe { avx2::dot_rows(f, w, x, out) };
    }
    let _ = avx2;
    dot_rows_portable(f, w, x, out)
}

/// The product of the 8 rows of an interleaved group (`x8` format, `nb` blocks per row) with
/// activation rows: `out[r][i]` for weight row `i` — the portable kernel. Per weight row and
/// activation row one accumulator, `fma(dw·dx, Σ qw·qx, acc)` block by block in order,
/// and the offset terms (`fma(off, s, extra)`) apart; the result is `acc + extra`.
fn dot_group_portable(
    f: BlockFormat,
    group: &[u8],
    nb: usize,
    x: &[&[QBlock]],
    out: &mut [[f32; 8]],
) {
    let base = f.base();
    let mut blk = [0u8; 34];
    for (xr, o) in x.iter().zip(out.iter_mut()) {
        let mut acc = [0f32; 8];
        let mut extra = [0f32; 8];
        for b in 0..nb {
            let xb = &xr[b];
            for i in 0..8 {
                f.block_of_group(group, i, b, &mut blk);
                let (q, d, off) = decode_block(base, &blk);
                let isum: i32 = q.iter().zip(&xb.q).map(|(&w, &v)| w * v as i32).sum();
                acc[i] = (d * xb.d).mul_add(isum as f32, acc[i]);
                if base != BlockFormat::Q8_0 {
                    extra[i] = off.mul_add(xb.s, extra[i]);
                }
            }
        }
        for i in 0..8 {
            o[i] = acc[i] + extra[i];
        }
    }
}

/// `out[r][i]` = row `i` of the interleaved group `group` (an `x8` format, `nb` blocks per
/// row) · `x[r]`: the AVX2 kernel where the CPU has it, else the portable one (the same
/// bits).
pub fn dot_group(
    f: BlockFormat,
    group: &[u8],
    nb: usize,
    x: &[&[QBlock]],
    out: &mut [[f32; 8]],
    avx2: bool,
) {
    assert!(
        f.interleaved()
            && group.len() >= 8 * nb * f.block_bytes() as usize
            && x.iter().all(|r| r.len() >= nb)
            && out.len() >= x.len()
    );
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is only true where `use_avx2` said so; the sizes were checked just
        // above.
        return unsafe { avx2::dot_group(f, group, nb, x, out) };
    }
    let _ = avx2;
    dot_group_portable(f, group, nb, x, out)
}

/// Decodes one row of `k` weights (`k/32` blocks) to f32.
pub fn decode_row(f: BlockFormat, row: &[u8], out: &mut [f32]) {
    for (blk, o) in row
        .chunks_exact(f.block_bytes() as usize)
        .zip(out.chunks_exact_mut(QK))
    {
        let (q, d, off) = decode_block(f, blk);
        for (v, q) in o.iter_mut().zip(q) {
            // Q4_0: d·(q − 8) = d·q − 8d; Q4_1: d·q + m; Q8_0: d·q.
            *v = d.mul_add(q as f32, off);
        }
    }
}

/// Activation rows quantized per instruction: at most this many at a time (a tile of A
/// that stays in the L2 cache while every weight row passes over it).
const ROW_TILE: usize = 64;

impl Execute for op::MatMulBlockQuant {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The decoder checked: A and C f32 of shapes [b1, b2, M, K] and [b1, b2, M, N], K a
        // multiple of 32, W u8 [1, 1, N, K/32·block bytes] with unit byte stride and rows
        // at least a row apart; the caller, every operand inside device memory.
        let va = View::<f32>::new(&self.a, mem);
        let vc = View::<f32>::new(&self.c, mem);
        let vw = View::<u8>::new(&self.w, mem);
        let [b1, b2, m, k] = va.shape;
        let n = vc.shape[3];
        if m == 0 || n == 0 {
            return Ok(());
        }
        let nb = k / QK;
        let rb = nb * self.format.block_bytes() as usize;
        let tile = m.min(ROW_TILE);
        let blocks = ws.typed::<QBlock>(tile * nb)?;
        let avx2 = use_avx2();
        let mut out = [0f32; 4];
        for i0 in 0..b1 {
            for i1 in 0..b2 {
                for m0 in (0..m).step_by(tile) {
                    let mt = tile.min(m - m0);
                    for r in 0..mt {
                        let blk = &mut blocks[r * nb..(r + 1) * nb];
                        // SAFETY: row `m0 + r` of batch (i0, i1) is inside A.
                        unsafe { quantize_strided(&va, [i0, i1, m0 + r], blk) };
                    }
                    for r0 in (0..mt).step_by(4) {
                        let rn = 4.min(mt - r0);
                        let pick = |r: usize| -> &[QBlock] {
                            let r = r0 + r.min(rn - 1);
                            &blocks[r * nb..(r + 1) * nb]
                        };
                        let xs = [pick(0), pick(1), pick(2), pick(3)];
                        if !self.format.interleaved() {
                            for j in 0..n {
                                // SAFETY: row `j` of W lies inside device memory (the
                                // decoder's checks), `rb` bytes from its start.
                                let wrow = unsafe {
                                    std::slice::from_raw_parts(vw.at([0, 0, j, 0]) as *const u8, rb)
                                };
                                dot_rows(self.format, wrow, &xs[..rn], &mut out, avx2);
                                for (r, &v) in out[..rn].iter().enumerate() {
                                    // SAFETY: (i0, i1, m0 + r0 + r, j) is inside C.
                                    unsafe { vc.at([i0, i1, m0 + r0 + r, j]).write(v) };
                                }
                            }
                        } else {
                            // Interleaved: 8 weight rows (one group, 8 row lengths) at a time.
                            let mut out8 = [[0f32; 8]; 4];
                            for g in 0..n / 8 {
                                // SAFETY: group `g` (rows 8g..8g+8, `8·rb` bytes, the decoder
                                // checked N is a multiple of 8 and rows exactly `rb` apart)
                                // lies inside device memory.
                                let group = unsafe {
                                    std::slice::from_raw_parts(
                                        vw.at([0, 0, 8 * g, 0]) as *const u8,
                                        8 * rb,
                                    )
                                };
                                dot_group(self.format, group, nb, &xs[..rn], &mut out8, avx2);
                                for (r, row) in out8[..rn].iter().enumerate() {
                                    for (i, &v) in row.iter().enumerate() {
                                        // SAFETY: (i0, i1, m0 + r0 + r, 8g + i) is inside C.
                                        unsafe { vc.at([i0, i1, m0 + r0 + r, 8 * g + i]).write(v) };
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Rounds row `[i0, i1, m, ..k]` of `a` into `out`.
///
/// # Safety
/// The row lies inside device memory.
unsafe fn quantize_strided(a: &View<f32>, [i0, i1, m]: [usize; 3], out: &mut [QBlock]) {
    if a.stride[3] == 1 {
        // SAFETY: the caller's guarantee: the row's `32·out.len()` elements, contiguous.
        let row = unsafe { std::slice::from_raw_parts(a.at([i0, i1, m, 0]), QK * out.len()) };
        quantize_row(row, out);
        return;
    }
    let mut buf = [0f32; QK];
    for (b, o) in out.iter_mut().enumerate() {
        for (i, v) in buf.iter_mut().enumerate() {
            // SAFETY: the caller's guarantee.
            *v = unsafe { *a.at([i0, i1, m, b * QK + i]) };
        }
        quantize_row(&buf, std::slice::from_mut(o));
    }
}

impl Execute for op::GatherBlockQuant {
    unsafe fn execute(&self, mem: DeviceMemory, _: &mut Workspace) -> Result<(), KernelError> {
        // The decoder checked the types, the table's row layout for K = output.shape[3],
        // and that indices have the output's rows.
        let vt = View::<u8>::new(&self.table, mem);
        let vi = View::<i64>::new(&self.indices, mem);
        let vo = View::<f32>::new(&self.output, mem);
        let v = vt.shape[2];
        let k = vo.shape[3];
        let rb = self.format.row_bytes(k as u32).unwrap_or(0) as usize;
        let [d0, d1, d2, _] = vo.shape;
        // Every index first: an out-of-range one fails the instruction before anything is
        // written.
        let mut pos = 0u64;
        for a in 0..d0 {
            for b in 0..d1 {
                for c in 0..d2 {
                    // SAFETY: (a, b, c, 0) is inside the indices.
                    let i = unsafe { *vi.at([a, b, c, 0]) };
                    if i < -(v as i64) || i >= v as i64 {
                        return Err(KernelError::IndexOutOfRange {
                            position: pos,
                            index: i,
                            limit: v as u32,
                        });
                    }
                    pos += 1;
                }
            }
        }
        let (interleaved, bb) = (
            self.format.interleaved(),
            self.format.block_bytes() as usize,
        );
        let mut row = [0f32; QK];
        let mut tmp = [0u8; 34];
        for a in 0..d0 {
            for b in 0..d1 {
                for c in 0..d2 {
                    // SAFETY: as above; the index was checked to lie in [−V, V).
                    let i = unsafe { *vi.at([a, b, c, 0]) };
                    let r = if i < 0 { i + v as i64 } else { i } as usize;
                    // The bytes holding row `r`: the row itself, or (interleaved) its group
                    // of 8 rows.
                    let (first, len) = if interleaved {
                        (r / 8 * 8, 8 * rb)
                    } else {
                        (r, rb)
                    };
                    // SAFETY: rows `first..` of the table lie inside device memory, `len`
                    // bytes (the decoder checked the row layout; interleaved: V a multiple
                    // of 8 and rows exactly `rb` apart).
                    let src = unsafe {
                        std::slice::from_raw_parts(vt.at([0, 0, first, 0]) as *const u8, len)
                    };
                    for blk_i in 0..rb / bb {
                        let blk = if interleaved {
                            self.format.block_of_group(src, r % 8, blk_i, &mut tmp);
                            &tmp[..bb]
                        } else {
                            &src[blk_i * bb..(blk_i + 1) * bb]
                        };
                        decode_row(self.format, blk, &mut row);
                        for (e, &x) in row.iter().enumerate() {
                            // SAFETY: (a, b, c, blk_i·32 + e) < K is inside the output.
                            unsafe { vo.at([a, b, c, blk_i * QK + e]).write(x) };
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::elem::f32_to_f16;

    pub(crate) struct Rng(pub(crate) u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// A row of `nb` random blocks of `f`.
    pub(crate) fn random_row(f: BlockFormat, nb: usize, rng: &mut Rng) -> Vec<u8> {
        let mut v = Vec::new();
        for _ in 0..nb {
            v.extend_from_slice(&f32_to_f16(rng.f() * 0.1).to_le_bytes());
            if f == BlockFormat::Q4_1 {
                v.extend_from_slice(&f32_to_f16(rng.f() * 0.5).to_le_bytes());
            }
            let n = if f == BlockFormat::Q8_0 { 32 } else { 16 };
            for _ in 0..n {
                v.push(rng.next() as u8);
            }
        }
        v
    }

    #[test]
    fn decode_row_follows_each_formats_definition() {
        let one = f32_to_f16(1.0).to_le_bytes();
        let half = f32_to_f16(0.5).to_le_bytes();
        let mut q4_0 = one.to_vec();
        q4_0.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let mut out = [0f32; 32];
        decode_row(BlockFormat::Q4_0, &q4_0, &mut out);
        assert_eq!(out[0], -8.0);
        assert_eq!(out[3], -5.0);
        assert_eq!(out[16], 7.0);
        assert_eq!(out[31], -8.0);
        let mut q4_1 = half.to_vec();
        q4_1.extend_from_slice(&one);
        q4_1.extend((0..16u8).map(|j| j | (15 - j) << 4));
        decode_row(BlockFormat::Q4_1, &q4_1, &mut out);
        assert_eq!((out[0], out[15], out[16]), (1.0, 8.5, 8.5));
        let mut q8 = half.to_vec();
        q8.extend((0..32).map(|j| (j as i8 - 16) as u8));
        decode_row(BlockFormat::Q8_0, &q8, &mut out);
        assert_eq!((out[0], out[16], out[31]), (-8.0, 0.0, 7.5));
    }

    #[test]
    fn quantized_activations_round_half_to_even_within_their_scale() {
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = -63.5;
        x[2] = 0.5;
        let mut b = [QBlock::default()];
        quantize_row(&x, &mut b);
        assert_eq!(b[0].d, 1.0);
        assert_eq!(
            (b[0].q[0], b[0].q[1], b[0].q[2], b[0].q[3]),
            (127, -64, 0, 0)
        );
        assert_eq!(b[0].s, 63.0);
        // All zeros, NaN and infinities never leave the i8 range.
        quantize_row(&[0.0; 32], &mut b);
        assert_eq!((b[0].d, b[0].s), (0.0, 0.0));
        let mut y = [1.0f32; 32];
        y[5] = f32::NAN;
        y[6] = f32::INFINITY;
        quantize_row(&y, &mut b);
        assert!(b[0].q.iter().all(|&q| q == 0));
    }

    /// The AVX2 quantizer gives the portable one's bits: random rows at many scales, exact
    /// halves, NaN, infinities, zeros, subnormal blocks (whose 1/d overflows) and huge ones.
    #[test]
    fn avx2_and_portable_quantizers_agree_bit_for_bit() {
        if !use_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let mut rows: Vec<Vec<f32>> = Vec::new();
        for e in [-140i32, -126, -20, -1, 0, 3, 20, 100, 127] {
            let scale = 2f32.powi(e);
            rows.push((0..64).map(|_| rng.f() * scale).collect());
        }
        rows.push((0..32).map(|i| i as f32 - 15.5).collect()); // every product a half
        rows.push((0..32).map(|i| (i as f32 - 16.0) * 127.0 / 16.0).collect());
        let mut special: Vec<f32> = (0..32).map(|_| rng.f()).collect();
        special[3] = f32::NAN;
        special[9] = f32::NEG_INFINITY;
        rows.push(special.clone());
        special[9] = 0.0;
        rows.push(special);
        rows.push(vec![0.0; 32]);
        rows.push(vec![-0.0; 32]);
        rows.push((0..32).map(|i| f32::from_bits(1 + i)).collect()); // subnormals
        rows.push((0..32).map(|i| f32::MAX / (1 + i) as f32).collect());
        for x in &rows {
            let n = x.len() / QK;
            let (mut a, mut b) = (vec![QBlock::default(); n], vec![QBlock::default(); n]);
            quantize_row_portable(x, &mut a);
            // SAFETY: checked above that the CPU has AVX2 and FMA.
            unsafe { avx2::quantize_row(x, &mut b) };
            for (a, b) in a.iter().zip(&b) {
                assert_eq!(a.q, b.q, "{x:?}");
                assert_eq!(a.d.to_bits(), b.d.to_bits(), "{x:?}");
                assert_eq!(a.s.to_bits(), b.s.to_bits(), "{x:?}");
            }
        }
    }

    #[test]
    fn avx2_and_portable_products_agree_bit_for_bit_and_match_the_dequantized_sum() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for f in [BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0] {
            for (nb, m) in [(1, 1), (3, 2), (18, 4), (18, 5), (48, 9)] {
                let w = random_row(f, nb, &mut rng);
                let xs: Vec<Vec<f32>> = (0..m)
                    .map(|_| (0..nb * QK).map(|_| rng.f()).collect())
                    .collect();
                let qs: Vec<Vec<QBlock>> = xs
                    .iter()
                    .map(|x| {
                        let mut b = vec![QBlock::default(); nb];
                        quantize_row(x, &mut b);
                        b
                    })
                    .collect();
                let refs: Vec<&[QBlock]> = qs.iter().map(|q| q.as_slice()).collect();
                let mut port = vec![0f32; m];
                dot_rows(f, &w, &refs, &mut port, false);
                if use_avx2() {
                    let mut vec = vec![0f32; m];
                    dot_rows(f, &w, &refs, &mut vec, true);
                    assert_eq!(
                        port.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        vec.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{f:?} nb {nb} m {m}"
                    );
                }
                let mut wf = vec![0f32; nb * QK];
                decode_row(f, &w, &mut wf);
                for (x, got) in xs.iter().zip(&port) {
                    let exact: f64 = wf.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let scale: f64 = wf
                        .iter()
                        .zip(x)
                        .map(|(a, b)| (*a as f64 * *b as f64).abs())
                        .sum();
                    // 8-bit activations: each product off by at most |w|·dx/2.
                    assert!(
                        (*got as f64 - exact).abs() <= 0.01 * scale + 1e-6,
                        "{f:?}: {got} vs {exact} (scale {scale})"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod interleaved {
    use super::tests::{Rng, random_row};
    use super::*;

    #[test]
    fn x8_layout_round_trips_and_its_products_agree_bit_for_bit_and_with_the_rows() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        for base in [BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0] {
            let f = BlockFormat::with_interleave(base, true);
            assert!(f.interleaved() && f.base() == base);
            for (nb, m) in [(1, 1), (3, 2), (18, 4), (5, 6)] {
                let k = (nb * QK) as u32;
                let rows: Vec<Vec<u8>> = (0..16).map(|_| random_row(base, nb, &mut rng)).collect();
                let plain: Vec<u8> = rows.concat();
                let x8 = base.interleave(&plain, 16, k).unwrap();
                assert_eq!(x8.len(), plain.len());
                let rb = base.row_bytes(k).unwrap() as usize;
                let bb = base.block_bytes() as usize;
                let mut blk = [0u8; 34];
                for (j, row) in rows.iter().enumerate() {
                    for b in 0..nb {
                        f.block_of_group(&x8[j / 8 * 8 * rb..], j % 8, b, &mut blk);
                        assert_eq!(
                            &blk[..bb],
                            &row[b * bb..(b + 1) * bb],
                            "{f:?} row {j} block {b}"
                        );
                    }
                }
                let qs: Vec<Vec<QBlock>> = (0..m)
                    .map(|_| {
                        let x: Vec<f32> = (0..nb * QK).map(|_| rng.f()).collect();
                        let mut q = vec![QBlock::default(); nb];
                        quantize_row(&x, &mut q);
                        q
                    })
                    .collect();
                let refs: Vec<&[QBlock]> = qs.iter().map(|q| q.as_slice()).collect();
                for g in 0..2 {
                    let group = &x8[g * 8 * rb..(g + 1) * 8 * rb];
                    let mut port = vec![[0f32; 8]; m];
                    dot_group(f, group, nb, &refs, &mut port, false);
                    if use_avx2() {
                        let mut vec = vec![[0f32; 8]; m];
                        dot_group(f, group, nb, &refs, &mut vec, true);
                        let bits = |v: &[[f32; 8]]| {
                            v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>()
                        };
                        assert_eq!(bits(&port), bits(&vec), "{f:?} nb {nb} m {m}");
                    }
                    // The plain kernel on the same rows: the same integer sums, other f32
                    // summation orders.
                    for i in 0..8 {
                        let mut plain_out = vec![0f32; m];
                        dot_rows(base, &rows[8 * g + i], &refs, &mut plain_out, false);
                        for r in 0..m {
                            let (a, b) = (port[r][i], plain_out[r]);
                            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{f:?}: {a} vs {b}");
                        }
                    }
                }
            }
        }
        assert!(BlockFormat::Q4_1.interleave(&[0; 20 * 4], 4, 32).is_none());
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// Not a test: `cargo test --release -p nrt-kernels --lib blockq::speed -- --ignored
    /// --nocapture` prints the product's ns per block (SmolLM2's FFN-down shape).
    #[test]
    #[ignore]
    fn ns_per_block() {
        for f in [BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0] {
            let (n, k) = (8192usize, 1536usize);
            let nb = k / QK;
            let rb = nb * f.block_bytes() as usize;
            let w: Vec<u8> = (0..n * rb).map(|i| (i * 7 + 3) as u8 & 0x77).collect();
            let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut q = vec![QBlock::default(); nb];
            quantize_row(&x, &mut q);
            let mut out = [0f32; 4];
            let t = std::time::Instant::now();
            let reps = 20;
            for _ in 0..reps {
                for j in 0..n {
                    dot_rows(f, &w[j * rb..(j + 1) * rb], &[&q], &mut out, use_avx2());
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / (reps * n * nb) as f64;
            let gbs = (n * rb * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("{f:?}: {ns:.2} ns per block, {gbs:.1} GB/s of weights");
            let f8 = BlockFormat::with_interleave(f, true);
            let w8 = f.interleave(&w, n, k as u32).unwrap();
            let mut out8 = [[0f32; 8]; 1];
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for g in 0..n / 8 {
                    let grp = &w8[g * 8 * rb..(g + 1) * 8 * rb];
                    dot_group(f8, grp, nb, &[&q], &mut out8, use_avx2());
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / (reps * n * nb) as f64;
            let gbs = (n * rb * reps) as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!("{f8:?}: {ns:.2} ns per block, {gbs:.1} GB/s of weights");
        }
    }
}
