//! `MatMulInteger`: `C[m,n] = Σ_k (A[m,k] − za[m])·(B[k,n] − zb[n])` for u8/i8 operands, i32
//! results (integer arithmetic wraps, as ONNX Runtime's does).
//!
//! The product runs on `vpdpbusd` (AVX-512 VNNI: u8 × i8 → i32, four products per lane)
//! when the CPU has it (checked at run time), else with AVX2 on `vpmaddwd` (each word's
//! bytes as two i16 pairs — B's widened in registers, A's split once per batch — so the
//! products are exact, where `vpmaddubsw` would saturate), else on a portable loop over the
//! same packed layout. Operands are re-biased to the instruction's signedness — A to u8
//! (`a ^ 0x80` for i8, i.e. `a + 128`), B to i8 (`b ^ 0x80` for u8, i.e. `b − 128`) — and
//! the zero points moved by the same amounts, so with `a' = a − za'`, `b' = b − zb'`:
//! `C = A'·B' − zb'·rowsum(A') − za'·colsum(B') + K·za'·zb'` (per row / column).
//!
//! Packing (per batch, in the [`Workspace`]): A as `[M][K4]` words of 4 consecutive k
//! bytes, B as `[K4][Np]` words (the 4 k bytes of one column), `K4 = ⌈K/4⌉`, `Np` the
//! columns rounded up to the tile width plus one cache line (so a tile's rows do not alias
//! in L1), zero padded — so a tile loads 16 columns' words as one 64-byte vector and
//! broadcasts one word of A. Constant weights come packed already (`packed_b`: the compiler
//! wrote B in that layout with its column sums, `nrt_isa::qmatmul_layout`), which at
//! 64×512×512 saves a third of the instruction.
//!
//! With a `scale`, each corrected sum is converted to f32 and multiplied by its column's
//! scale as the tile is stored (a dynamically quantized layer's `Cast` and `Mul`).

use crate::Execute;
use crate::gemm::int8::{MR, NR, split_a_words, tile_portable};
#[cfg(target_arch = "x86_64")]
use crate::gemm::int8::{TileStore, pack_a_row_avx512, tile_avx2, tile_vnni, tile_vnni_store};
use crate::strided::View;
use crate::{DeviceMemory, KernelError, Workspace};
use nrt_hal::DType;
use nrt_isa::AccessPattern;
use nrt_isa::op;

/// The operands of one `MatMulInteger`.
#[derive(Debug)]
pub struct Args<'a> {
    /// `[b1, b2, M, K]` u8/i8.
    pub a: &'a AccessPattern,
    /// `[b1, b2, K, N]` u8/i8.
    pub b: &'a AccessPattern,
    /// `[b1, b2, M, N]` i32.
    pub c: &'a AccessPattern,
    /// `[b1, b2, M, 1]`, A's type, if any.
    pub a_zero: Option<&'a AccessPattern>,
    /// `[b1, b2, 1, N]`, B's type, if any.
    pub b_zero: Option<&'a AccessPattern>,
    /// B is in the compiler's packed layout (`nrt_isa::qmatmul_layout`).
    pub packed_b: bool,
    /// `[b1, b2, 1, N]` f32: C is f32, the sums times it, if any.
    pub scale: Option<&'a AccessPattern>,
}

/// Where the corrected sums go.
enum Out {
    /// i32 as they are.
    Integer(View<i32>),
    /// f32, times the scale: `(C, scale)`.
    Scaled(View<f32>, View<f32>),
}

impl Out {
    /// Whether rows of C are unit-stride (and the scale per column or one value): the
    /// layout the vector stores handle.
    fn unit_stride(&self) -> bool {
        match self {
            Out::Integer(vc) => vc.stride[3] == 1,
            Out::Scaled(vc, vs) => vc.stride[3] == 1 && matches!(vs.stride[3], 0 | 1),
        }
    }

    /// Writes `sums` to columns `at[3]..at[3] + sums.len()` of row `at[..3]`.
    ///
    /// # Safety
    /// Those elements lie inside C (and the scale's `[.., 1, N]`), in device memory.
    #[inline(always)]
    unsafe fn store(&self, at: [usize; 4], sums: &[i32]) {
        let [p, q, i, j0] = at;
        match self {
            Out::Integer(vc) if vc.stride[3] == 1 => {
                // SAFETY: per the contract, a unit-stride run of C.
                unsafe {
                    core::slice::from_raw_parts_mut(vc.at(at), sums.len()).copy_from_slice(sums)
                };
            }
            Out::Integer(vc) => {
                for (c, &v) in sums.iter().enumerate() {
                    // SAFETY: per the contract.
                    unsafe { vc.at([p, q, i, j0 + c]).write(v) };
                }
            }
            Out::Scaled(vc, vs) if vc.stride[3] == 1 && matches!(vs.stride[3], 0 | 1) => {
                // A unit-stride run of C, the scale per column or one value: a loop that
                // vectorizes (converting and scaling 16 sums per instruction pair).
                // SAFETY: per the contract, `sums.len()` elements of C from `at`, and of the
                // scale from (p, q, 0, j0) when it is per column.
                unsafe {
                    let dst = core::slice::from_raw_parts_mut(vc.at(at), sums.len());
                    if vs.stride[3] == 0 {
                        let s = *vs.at([p, q, 0, j0]);
                        for (d, &v) in dst.iter_mut().zip(sums) {
                            *d = v as f32 * s;
                        }
                    } else {
                        let sc = core::slice::from_raw_parts(vs.at([p, q, 0, j0]), sums.len());
                        for ((d, &v), &s) in dst.iter_mut().zip(sums).zip(sc) {
                            *d = v as f32 * s;
                        }
                    }
                }
            }
            Out::Scaled(vc, vs) => {
                for (c, &v) in sums.iter().enumerate() {
                    // SAFETY: per the contract.
                    unsafe {
                        let s = *vs.at([p, q, 0, j0 + c]);
                        vc.at([p, q, i, j0 + c]).write(v as f32 * s);
                    }
                }
            }
        }
    }
}

/// Packs rows of B (batch `pq`) into `bpack` (`[K4][np]` words of 4 consecutive k bytes,
/// re-biased by `b_flip`) and their column sums into `colsum`: row by row (k outer), so
/// that a row-major B is read in memory order; each byte goes to its place in its column's
/// word.
///
/// # Safety
/// B's batch `pq` inside device memory with `k × n` elements; `bpack` holds `⌈k/4⌉·np`
/// words and `colsum` `≥ n`.
#[allow(clippy::too_many_arguments)]
unsafe fn pack_b(
    vb: &View<u8>,
    pq: [usize; 2],
    k: usize,
    n: usize,
    np: usize,
    b_flip: u8,
    bpack: &mut [i32],
    colsum: &mut [i32],
) {
    let [p, q] = pq;
    colsum.fill(0);
    bpack.fill(0);
    // Four unit-stride rows at a time: each word written once (not or-ed into four
    // times), their column sums added in the same pass.
    let quads = if vb.stride[3] == 1 { k / 4 } else { 0 };
    for w in 0..quads {
        // SAFETY: rows 4w..4w+4 of (p, q) hold n contiguous bytes each.
        let rows: [&[u8]; 4] = core::array::from_fn(|t| unsafe {
            core::slice::from_raw_parts(vb.at([p, q, 4 * w + t, 0]), n)
        });
        let words = &mut bpack[w * np..][..n];
        for (j, (word, sum)) in words.iter_mut().zip(colsum.iter_mut()).enumerate() {
            let b = [
                rows[0][j] ^ b_flip,
                rows[1][j] ^ b_flip,
                rows[2][j] ^ b_flip,
                rows[3][j] ^ b_flip,
            ];
            *sum += b[0] as i8 as i32 + b[1] as i8 as i32 + b[2] as i8 as i32 + b[3] as i8 as i32;
            *word = i32::from_le_bytes(b);
        }
    }
    for kk in 4 * quads..k {
        let (w, shift) = (kk / 4, 8 * (kk % 4));
        let words = &mut bpack[w * np..][..n];
        if vb.stride[3] == 1 {
            // A unit-stride row (weights as stored): one slice, no index arithmetic per
            // byte, so the loop vectorizes.
            // SAFETY: row (p, q, kk) of B holds n contiguous bytes.
            let row = unsafe { core::slice::from_raw_parts(vb.at([p, q, kk, 0]), n) };
            for ((word, sum), &x) in words.iter_mut().zip(colsum.iter_mut()).zip(row) {
                let byte = x ^ b_flip;
                *sum += byte as i8 as i32;
                *word |= ((byte as u32) << shift) as i32;
            }
            continue;
        }
        for (j, (word, sum)) in words.iter_mut().zip(colsum.iter_mut()).enumerate() {
            // SAFETY: (p, q, kk, j) inside B.
            let byte = unsafe { *vb.at([p, q, kk, j]) } ^ b_flip;
            *sum += byte as i8 as i32;
            *word |= ((byte as u32) << shift) as i32;
        }
    }
}

/// Reads element `idx` of an 8-bit operand as its value (signed for i8).
///
/// # Safety
/// `idx` inside the operand; the operand inside device memory.
#[inline(always)]
unsafe fn byte_at(v: &View<u8>, signed: bool, idx: [usize; 4]) -> i32 {
    // SAFETY: per the contract.
    let x = unsafe { *v.at(idx) };
    if signed { x as i8 as i32 } else { x as i32 }
}

/// Which instructions run the tiles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Path {
    /// `vpdpbusd` (AVX-512 VNNI), and AVX-512 for the packing and the stores.
    Vnni,
    /// `vpmaddwd` on 256-bit vectors (AVX2).
    Avx2,
    /// Scalar code (what the compiler makes of it).
    Portable,
}

/// Whether the VNNI path is available.
fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::avx512vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX2 path is available.
fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::cpu::avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The best path this process may use.
fn best_path() -> Path {
    if has_vnni() {
        Path::Vnni
    } else if has_avx2() {
        Path::Avx2
    } else {
        Path::Portable
    }
}

/// Executes `Op::MatMulInteger`.
///
/// # Safety
/// Operands inside `mem`, aligned, shapes and types as the decoder checks.
pub unsafe fn matmul_integer(
    args: &Args,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    // SAFETY: per the caller's contract.
    unsafe { run(args, mem, ws, best_path(), true) }
}

/// [`matmul_integer`] without the AMX tile unit (`vpdpbusd` where the CPU has VNNI, else the
/// AVX2 or the portable path), for tests comparing paths.
///
/// # Safety
/// As [`matmul_integer`].
pub unsafe fn matmul_integer_vnni(
    args: &Args,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    // SAFETY: per the caller's contract.
    unsafe { run(args, mem, ws, best_path(), false) }
}

/// [`matmul_integer`] on the AVX2 tiles where the CPU has AVX2 (else the portable path),
/// whatever else it has, for tests comparing paths.
///
/// # Safety
/// As [`matmul_integer`].
pub unsafe fn matmul_integer_avx2(
    args: &Args,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    let path = if has_avx2() {
        Path::Avx2
    } else {
        Path::Portable
    };
    // SAFETY: per the caller's contract.
    unsafe { run(args, mem, ws, path, false) }
}

/// [`matmul_integer`] on the portable path, whatever the CPU (for tests comparing paths).
///
/// # Safety
/// As [`matmul_integer`].
pub unsafe fn matmul_integer_portable(
    args: &Args,
    mem: DeviceMemory,
    ws: &mut Workspace,
) -> Result<(), KernelError> {
    // SAFETY: per the caller's contract.
    unsafe { run(args, mem, ws, Path::Portable, false) }
}

/// # Safety
/// As [`matmul_integer`]; `path` only one the CPU has (`Vnni`: AVX-512 VNNI, `Avx2`: AVX2).
/// `tiles`: the AMX tile unit may run the product (where the process has it, with `Vnni`).
unsafe fn run(
    args: &Args,
    mem: DeviceMemory,
    ws: &mut Workspace,
    path: Path,
    tiles: bool,
) -> Result<(), KernelError> {
    let vnni = path == Path::Vnni;
    let [b1, b2, m, k] = args.a.shape.map(|d| d as usize);
    let n = args.c.shape[3] as usize;
    if b1 * b2 * m * n == 0 {
        return Ok(());
    }
    let a_signed = args.a.dtype == DType::I8;
    let b_signed = args.b.dtype == DType::I8;
    // Re-biasing: A to u8, B to i8 (see the module comment).
    let (a_flip, a_off) = if a_signed { (0x80u8, 128i32) } else { (0, 0) };
    let (b_flip, b_off) = if b_signed { (0, 0) } else { (0x80u8, 128i32) };
    let k4 = k.div_ceil(4);
    // Packed B's row stride in words: the columns rounded up to the tile width, plus one
    // cache line, so that a tile's K4 rows (one 128-byte load pair each) fall into
    // consecutive L1 sets rather than the same few (N = 512 made the stride 2 KiB: every row
    // in one of two sets, the tile streaming B from L2). The compiler's packed weights use
    // the same layout (`qmatmul_layout`).
    const { assert!(NR == nrt_isa::qmatmul_layout::COLUMN_TILE) };
    let np = n.div_ceil(NR) * NR + 16;
    let packed = args.packed_b;
    let b_words = if packed { 0 } else { k4 * np + np };
    // The AMX tile unit (`tdpbusd`) where the process may use it: 16×64-byte tiles of A and B
    // into 16×16 i32 (4,096 multiply-adds an instruction against `vpdpbusd`'s 64), on the
    // same packed words; A re-laid tile by tile in extra scratch.
    #[cfg(target_arch = "x86_64")]
    let amx = tiles && vnni && k4 > 0 && crate::gemm::amx::int8_available();
    #[cfg(not(target_arch = "x86_64"))]
    let amx = tiles && false;
    let amx_words = if amx {
        crate::gemm::amx::int8_scratch_words(m, k4)
    } else {
        0
    };
    let (va, vb) = (View::<u8>::new(args.a, mem), View::<u8>::new(args.b, mem));
    let vza = args.a_zero.map(|z| View::<u8>::new(z, mem));
    let vzb = args.b_zero.map(|z| View::<u8>::new(z, mem));
    let out = match args.scale {
        Some(sc) => Out::Scaled(View::<f32>::new(args.c, mem), View::<f32>::new(sc, mem)),
        None => Out::Integer(View::<i32>::new(args.c, mem)),
    };
    // The VNNI tiles correct, convert and store their sums from registers when C is
    // unit-stride (and the scale per column or per tensor): per batch the column and row
    // terms are laid out once (`zb'` per column; `rowsum − K·za'` and `za'` per row).
    let fused = vnni && !amx && out.unit_stride();
    let fused_words = if fused { n + 2 * m } else { 0 };
    // The AVX2 tiles read A's words split into their byte pairs (`split_a_words`), once per
    // batch rather than once per tile.
    let split_words = if path == Path::Avx2 {
        m.saturating_mul(k4).saturating_mul(2)
    } else {
        0
    };
    let words = ws.typed::<i32>(
        m.saturating_mul(k4)
            .saturating_add(m)
            .saturating_add(b_words)
            .saturating_add(amx_words)
            .saturating_add(fused_words)
            .saturating_add(split_words),
    )?;
    let (apack, rest) = words.split_at_mut(m * k4);
    let (rowsum, rest) = rest.split_at_mut(m);
    let (amx_tiles, rest) = rest.split_at_mut(amx_words);
    let (fused_terms, rest) = rest.split_at_mut(fused_words);
    let (a_split, rest) = rest.split_at_mut(split_words);
    let (zb_cols, row_terms) = fused_terms.split_at_mut(if fused { n } else { 0 });
    let (row_terms, za_rows) = row_terms.split_at_mut(if fused { m } else { 0 });
    let (bpack_ws, colsum_ws) = rest.split_at_mut(if packed { 0 } else { k4 * np });
    // A packed B: its words and column sums as the compiler stored them.
    let packed_words: &[i32] = if packed {
        // SAFETY: the decoder checked the packed layout (`[1, 1, K4 + 1, 4·Np]` bytes, dense
        // rows, a 4-byte aligned address in 64-byte aligned device memory) and the device
        // checked that the operand lies inside `mem`; nothing writes it while the
        // instruction runs (B is read-only here).
        unsafe { core::slice::from_raw_parts(mem.ptr(args.b.addr) as *const i32, (k4 + 1) * np) }
    } else {
        &[]
    };
    for p in 0..b1 {
        for q in 0..b2 {
            // Pack A (u8) with its row sums.
            rowsum.fill(0);
            for (i, row) in apack.chunks_exact_mut(k4.max(1)).take(m).enumerate() {
                #[cfg(target_arch = "x86_64")]
                if vnni && va.stride[3] == 1 {
                    // SAFETY: `vnni` implies AVX-512 F and BW; row (p, q, i) of A holds k
                    // contiguous bytes and `row` k4 = ⌈k/4⌉ words.
                    rowsum[i] = unsafe { pack_a_row_avx512(va.at([p, q, i, 0]), k, a_flip, row) };
                    continue;
                }
                if va.stride[3] == 1 {
                    // A unit-stride row: whole words from 4-byte chunks (vectorizes), the
                    // short tail padded with zeros.
                    // SAFETY: row (p, q, i) of A holds k contiguous bytes.
                    let src = unsafe { core::slice::from_raw_parts(va.at([p, q, i, 0]), k) };
                    let mut sum = 0i32;
                    let chunks = src.chunks_exact(4);
                    let tail = chunks.remainder();
                    for (word, c) in row.iter_mut().zip(chunks) {
                        let b = [c[0] ^ a_flip, c[1] ^ a_flip, c[2] ^ a_flip, c[3] ^ a_flip];
                        sum += b[0] as i32 + b[1] as i32 + b[2] as i32 + b[3] as i32;
                        *word = i32::from_le_bytes(b);
                    }
                    if !tail.is_empty() {
                        let mut b = [0u8; 4];
                        for (d, &x) in b.iter_mut().zip(tail) {
                            *d = x ^ a_flip;
                            sum += *d as i32;
                        }
                        row[k / 4] = i32::from_le_bytes(b);
                    }
                    rowsum[i] = sum;
                    continue;
                }
                let mut sum = 0i32;
                for (w, word) in row.iter_mut().enumerate() {
                    let mut bytes = [0u8; 4];
                    for (j, byte) in bytes.iter_mut().enumerate() {
                        let kk = 4 * w + j;
                        if kk < k {
                            // SAFETY: (p, q, i, kk) inside A.
                            *byte = unsafe { *va.at([p, q, i, kk]) } ^ a_flip;
                            sum += *byte as i32;
                        }
                    }
                    *word = i32::from_le_bytes(bytes);
                }
                rowsum[i] = sum;
            }
            if path == Path::Avx2 {
                split_a_words(apack, a_split);
            }
            if !packed {
                // SAFETY: per the caller's contract (B inside `mem`, shape `[b1, b2, K, N]`).
                unsafe { pack_b(&vb, [p, q], k, n, np, b_flip, bpack_ws, colsum_ws) };
            }
            let (bpack, colsum): (&[i32], &[i32]) = if packed {
                packed_words.split_at(k4 * np)
            } else {
                (bpack_ws, colsum_ws)
            };
            let corrections = Corrections {
                vza: vza.as_ref(),
                vzb: vzb.as_ref(),
                a_signed,
                b_signed,
                a_off,
                b_off,
                k: k as i32,
            };
            // A finished block of raw sums (rows of NR columns from (i0, j0)), corrected and
            // stored: the AMX blocks and the VNNI/portable tiles both end here.
            let block = Block {
                corrections: &corrections,
                out: &out,
                pq: [p, q],
                rowsum,
                colsum,
            };
            let store_block =
                |i0: usize, j0: usize, rows: usize, cols: usize, blk: &[[i32; NR]]| {
                    #[cfg(target_arch = "x86_64")]
                    if vnni {
                        // SAFETY: `vnni` is set only where the CPU has AVX-512 F, BW, VL
                        // (`has_vnni`); the block's rows and columns lie inside C.
                        return unsafe { block.store_avx512(i0, j0, rows, cols, blk) };
                    }
                    // SAFETY: the block's rows and columns lie inside C.
                    unsafe { block.store(i0, j0, rows, cols, blk) }
                };
            #[cfg(target_arch = "x86_64")]
            if amx {
                // SAFETY: AMX-INT8 usable (checked above); A holds m rows of k4 words, B k4
                // rows of np ≥ ⌈n/32⌉·32 words; the scratch was sized for it.
                unsafe {
                    crate::gemm::amx::int8_products(
                        m,
                        n,
                        k4,
                        apack,
                        bpack,
                        np,
                        amx_tiles,
                        |i0, j0, r, c, b| store_block(i0, j0, r, c, b),
                    )
                };
                continue;
            }
            if fused {
                for (j, zb) in zb_cols.iter_mut().enumerate() {
                    // SAFETY: (p, q, 0, j) inside the zero point's [.., 1, N].
                    *zb = vzb
                        .as_ref()
                        .map_or(0, |z| unsafe { byte_at(z, b_signed, [p, q, 0, j]) })
                        - b_off;
                }
                for (i, (rt, za)) in row_terms.iter_mut().zip(za_rows.iter_mut()).enumerate() {
                    // SAFETY: (p, q, i, 0) inside the zero point's [.., M, 1].
                    *za = vza
                        .as_ref()
                        .map_or(0, |z| unsafe { byte_at(z, a_signed, [p, q, i, 0]) })
                        + a_off;
                    *rt = rowsum[i].wrapping_sub((k as i32).wrapping_mul(*za));
                }
            }
            // Tiles.
            let mut i0 = 0;
            while i0 < m {
                let rows = MR.min(m - i0);
                let mut j0 = 0;
                while j0 < n {
                    let a_rows: [&[i32]; MR] =
                        core::array::from_fn(|r| &apack[(i0 + r.min(rows - 1)) * k4..][..k4]);
                    #[cfg(target_arch = "x86_64")]
                    if fused {
                        let cols = NR.min(n - j0);
                        let (scale, per_column) = match &out {
                            Out::Scaled(_, vs) => {
                                (vs.at([p, q, 0, j0]) as *const f32, vs.stride[3] == 1)
                            }
                            Out::Integer(_) => (core::ptr::null(), false),
                        };
                        let st = TileStore {
                            rows,
                            cols,
                            zb: zb_cols[j0..].as_ptr(),
                            colsum: colsum[j0..j0 + cols].as_ptr(),
                            scale,
                            per_column,
                            row_term: row_terms[i0..].as_ptr(),
                            za: za_rows[i0..].as_ptr(),
                            dst: core::array::from_fn(|r| {
                                let i = i0 + r.min(rows - 1);
                                match &out {
                                    Out::Scaled(vc, _) => vc.at([p, q, i, j0]) as *mut u8,
                                    Out::Integer(vc) => vc.at([p, q, i, j0]) as *mut u8,
                                }
                            }),
                        };
                        // An empty B (K = 0) is never read: the sums are the terms alone.
                        let b = bpack.get(j0..).unwrap_or(&[]);
                        // SAFETY: `fused` implies the CPU has AVX-512 F, BW, VL and VNNI;
                        // every row of A holds k4 words, B k4 rows of np ≥ j0 + NR words;
                        // the tile's rows and columns lie inside C (unit-stride) and the
                        // terms cover them.
                        unsafe {
                            match rows {
                                1 => tile_vnni_store::<1>(&a_rows, b, np, k4, &st),
                                2 => tile_vnni_store::<2>(&a_rows, b, np, k4, &st),
                                3 | 4 => tile_vnni_store::<4>(&a_rows, b, np, k4, &st),
                                _ => tile_vnni_store::<MR>(&a_rows, b, np, k4, &st),
                            }
                        };
                        j0 += NR;
                        continue;
                    }
                    let mut acc = [[0i32; NR]; MR];
                    #[cfg(target_arch = "x86_64")]
                    if k4 == 0 {
                        // An empty sum: only the zero-point terms remain.
                    } else if vnni {
                        // SAFETY: the CPU has AVX-512F and VNNI (checked by the caller);
                        // every row of A holds k4 words and B holds k4 rows of np ≥ j0 + NR
                        // words.
                        unsafe { tile_vnni(&a_rows, &bpack[j0..], np, k4, &mut acc) };
                    } else if path == Path::Avx2 {
                        let split: [&[i32]; MR] = core::array::from_fn(|r| {
                            &a_split[(i0 + r.min(rows - 1)) * 2 * k4..][..2 * k4]
                        });
                        // SAFETY: the CPU has AVX2 (the caller's contract); every split row
                        // of A holds 2·k4 words and B holds k4 rows of np ≥ j0 + NR words.
                        unsafe { tile_avx2(&split, rows, &bpack[j0..], np, k4, &mut acc) };
                    } else {
                        tile_portable(&a_rows, &bpack[j0..], np, k4, &mut acc);
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    if k4 > 0 {
                        let _ = (vnni, path);
                        tile_portable(&a_rows, &bpack[j0..], np, k4, &mut acc);
                    }
                    store_block(i0, j0, rows, NR.min(n - j0), &acc);
                    j0 += NR;
                }
                i0 += MR;
            }
        }
    }
    Ok(())
}

/// What a finished block of raw sums needs to be corrected and stored.
struct Block<'a> {
    corrections: &'a Corrections<'a>,
    out: &'a Out,
    pq: [usize; 2],
    rowsum: &'a [i32],
    colsum: &'a [i32],
}

impl Block<'_> {
    /// Corrects the raw sums of a block (rows of NR columns from `(i0, j0)`) and stores its
    /// first `rows` rows and `cols` columns: the AMX blocks and the VNNI/portable tiles
    /// both end here.
    ///
    /// # Safety
    /// Rows `i0..i0 + rows`, columns `j0..j0 + cols` lie inside C (and the scale's
    /// `[.., 1, N]`); `rowsum` covers the rows and `colsum` the columns.
    #[inline(always)]
    unsafe fn store(&self, i0: usize, j0: usize, rows: usize, cols: usize, blk: &[[i32; NR]]) {
        let [p, q] = self.pq;
        let c = self.corrections;
        // The block's columns' zero points, read once per block, not per element.
        let zbs = c.column_zero_points([p, q], j0, cols);
        for (r, acc_row) in blk.iter().enumerate().take(rows) {
            let i = i0 + r;
            let sums = c.row(
                [p, q, i],
                acc_row,
                &zbs,
                self.rowsum[i],
                &self.colsum[j0..],
                cols,
            );
            // SAFETY: per the contract.
            unsafe { self.out.store([p, q, i, j0], &sums[..cols]) };
        }
    }

    /// [`Block::store`] compiled with AVX-512: the corrections and the conversion and
    /// scaling of a row run 16 lanes wide with masks (from the closure that receives the
    /// blocks, they were compiled for the baseline: AVX2 and scalar tails). The VNNI tiles
    /// of a unit-stride C do not come here: they store from registers (`tile_vnni_store`).
    ///
    /// # Safety
    /// As [`Block::store`]; the CPU has AVX-512 F, BW and VL.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn store_avx512(
        &self,
        i0: usize,
        j0: usize,
        rows: usize,
        cols: usize,
        blk: &[[i32; NR]],
    ) {
        // SAFETY: forwarded contract.
        unsafe { self.store(i0, j0, rows, cols, blk) }
    }
}

/// The zero-point terms of the re-biased product (see the module docs): per column `zb'`,
/// per row `za'`, and `C = A'·B' − zb'·rowsum(A') − za'·colsum(B') + K·za'·zb'`.
struct Corrections<'a> {
    vza: Option<&'a View<u8>>,
    vzb: Option<&'a View<u8>>,
    a_signed: bool,
    b_signed: bool,
    a_off: i32,
    b_off: i32,
    k: i32,
}

impl Corrections<'_> {
    /// `zb'` of columns `j0..j0 + cols` of batch `pq` (read once per tile, not per element).
    #[inline(always)]
    fn column_zero_points(&self, [p, q]: [usize; 2], j0: usize, cols: usize) -> [i32; NR] {
        let mut zbs = [0i32; NR];
        for (c, zb) in zbs.iter_mut().enumerate().take(cols) {
            // SAFETY: (p, q, 0, j0 + c) inside the zero point's [.., 1, N] (the decoder
            // checked its shape against C's).
            *zb = self.vzb.map_or(0, |z| unsafe {
                byte_at(z, self.b_signed, [p, q, 0, j0 + c])
            }) - self.b_off;
        }
        zbs
    }

    /// The corrected sums of row `(p, q, i)`'s first `cols` columns from the raw ones.
    #[inline(always)]
    fn row(
        &self,
        [p, q, i]: [usize; 3],
        raw: &[i32; NR],
        zbs: &[i32; NR],
        rowsum: i32,
        colsum: &[i32],
        cols: usize,
    ) -> [i32; NR] {
        // SAFETY: (p, q, i, 0) inside the zero point's [.., M, 1].
        let za = self
            .vza
            .map_or(0, |z| unsafe { byte_at(z, self.a_signed, [p, q, i, 0]) })
            + self.a_off;
        let mut sums = [0i32; NR];
        let kza = self.k.wrapping_mul(za);
        // Zipped slices of the same length: no bounds check per element, so the loop
        // vectorizes (indexed, it stayed a scalar loop of five integer operations a column).
        let cols = cols.min(NR).min(colsum.len());
        for (((s, &dot), &zb), &cs) in sums[..cols]
            .iter_mut()
            .zip(&raw[..cols])
            .zip(&zbs[..cols])
            .zip(&colsum[..cols])
        {
            *s = dot
                .wrapping_sub(zb.wrapping_mul(rowsum))
                .wrapping_sub(za.wrapping_mul(cs))
                .wrapping_add(kza.wrapping_mul(zb));
        }
        sums
    }
}

impl Execute for op::MatMulInteger {
    unsafe fn execute(&self, mem: DeviceMemory, ws: &mut Workspace) -> Result<(), KernelError> {
        // The caller guarantees every operand in bounds and aligned ([`crate::execute`]).
        let op::MatMulInteger {
            a,
            b,
            c,
            a_zero,
            b_zero,
            packed_b,
            scale,
        } = self;

        let args = Args {
            a,
            b,
            c,
            a_zero: a_zero.as_ref(),
            b_zero: b_zero.as_ref(),
            packed_b: *packed_b,
            scale: scale.as_ref(),
        };
        // SAFETY: see above.
        unsafe { matmul_integer(&args, mem, ws) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VNNI tile and the portable tile agree on random packed words (including the
    /// extremes 0/255 × −128/127), where the CPU has VNNI.
    #[test]
    fn vnni_tile_matches_portable_tile() {
        if !has_vnni() {
            eprintln!("no AVX-512 VNNI here: only the portable path runs");
            return;
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as i32
        };
        for k4 in [1usize, 3, 17] {
            let np = 2 * NR;
            let arows: Vec<Vec<i32>> = (0..MR)
                .map(|r| {
                    (0..k4)
                        .map(|w| if r == 0 && w == 0 { -1 } else { next() })
                        .collect()
                })
                .collect();
            let b: Vec<i32> = (0..k4 * np)
                .map(|i| {
                    if i == 0 {
                        0x8080_8080u32 as i32
                    } else {
                        next()
                    }
                })
                .collect();
            let a: [&[i32]; MR] = core::array::from_fn(|r| arows[r].as_slice());
            for j0 in [0, NR] {
                let (mut x, mut y) = ([[0; NR]; MR], [[0; NR]; MR]);
                tile_portable(&a, &b[j0..], np, k4, &mut x);
                // SAFETY: VNNI checked above; sizes as the function requires.
                unsafe { tile_vnni(&a, &b[j0..], np, k4, &mut y) };
                assert_eq!(x, y, "k4 {k4} j0 {j0}");
            }
        }
    }

    /// The AVX2 tile and the portable tile agree on random packed words with the extreme
    /// bytes (0/255 × −128/127, where `vpmaddubsw` would saturate), for every row count (the
    /// blocks of 4, 3, 2 and 1 rows) and both column halves; rows past the count stay zero.
    #[test]
    fn avx2_tile_matches_portable_tile() {
        if !has_avx2() {
            eprintln!("no AVX2 here: only the portable path runs");
            return;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as i32
        };
        for k4 in [1usize, 2, 9] {
            let np = 2 * NR + 16;
            // Every fifth word of A all 0xff, of B all 0x80 (−128) or 0x7f: the extremes.
            let arows: Vec<Vec<i32>> = (0..MR)
                .map(|r| {
                    (0..k4)
                        .map(|w| if (r + w) % 5 == 0 { -1 } else { next() })
                        .collect()
                })
                .collect();
            let b: Vec<i32> = (0..k4 * np)
                .map(|i| match i % 5 {
                    0 => 0x8080_8080u32 as i32,
                    1 => 0x7f7f_7f7f,
                    _ => next(),
                })
                .collect();
            let a: [&[i32]; MR] = core::array::from_fn(|r| arows[r].as_slice());
            let split_rows: Vec<Vec<i32>> = arows
                .iter()
                .map(|r| {
                    let mut out = vec![0; 2 * k4];
                    split_a_words(r, &mut out);
                    out
                })
                .collect();
            let split: [&[i32]; MR] = core::array::from_fn(|r| split_rows[r].as_slice());
            for rows in 1..=MR {
                for j0 in [0, NR] {
                    let (mut x, mut y) = ([[0; NR]; MR], [[0; NR]; MR]);
                    tile_portable(&a, &b[j0..], np, k4, &mut x);
                    for row in &mut x[rows..] {
                        *row = [0; NR];
                    }
                    // SAFETY: AVX2 checked above; sizes as the function requires.
                    unsafe { tile_avx2(&split, rows, &b[j0..], np, k4, &mut y) };
                    assert_eq!(x, y, "k4 {k4} rows {rows} j0 {j0}");
                }
            }
        }
    }
}
