//! The f32 GEMV kernels: matrix-vector and few-row products.
//!
//! # GEMV
//!
//! GEMM crates pack the operands, which for a few rows costs as much as the product.
//! Matrix-vector and few-row products take hand-written AVX2/FMA kernels instead (`M ≤`
//! [`nrt_hal::tuning::GEMV_MAX_ROWS`] rows, or `N = 1`), on groups of up to [`GEMV_GROUP`] rows of A that share
//! one pass over B:
//! - B row-major (`[K, N]`, unit stride along N): column strips (64 floats for one row of A,
//!   32 for two, 16 for three or four; 64 for three or four with AVX-512, detected at run
//!   time — 0.67–0.69× the time of the 16-wide AVX2 strips at 3 and 4 × 512 × 512, paired
//!   A/B on a busy machine) held in registers while B's rows stream past;
//! - B stored transposed (`[N, K]`, unit stride along K — PyTorch `Linear` weights) and the
//!   `N = 1` case: dot products of up to 4 rows of B with each row of A, 8 accumulators.
//!
//! At M = 1 these run at the machine's memory bandwidth (a 512×512 B is 1 MiB: 17–20 µs here;
//! a plain 1 MiB read takes 18 µs); the GEMM crate needs 35 µs (88 µs with B transposed).

/// Up to 4 rows of A processed together by the GEMV kernels.
pub const GEMV_GROUP: usize = 4;

/// For each row `i < x.len()` (1 to [`GEMV_GROUP`]): `y_i[j] = alpha · Σ_p x_i[p]·B[p, j]`
/// (`+ y_i[j]` when `accumulate`) for a `k×n` B with row stride `ldb` and unit column
/// stride; every `x_i` and `y_i` contiguous. B is read once for the whole group.
///
/// # Safety
/// Each `x_i` readable for `k`, B for its `k×n` elements, each `y_i` writable for `n` and
/// overlapping no input.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemv_rowmajor(
    k: usize,
    n: usize,
    x: &[*const f32],
    b: *const f32,
    ldb: isize,
    y: &[*mut f32],
    alpha: f32,
    accumulate: bool,
) {
    debug_assert!((1..=GEMV_GROUP).contains(&x.len()) && x.len() == y.len());
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        macro_rules! go {
            ($r:literal) => {{
                let xs: [*const f32; $r] = core::array::from_fn(|i| x[i]);
                let mut ys: [*mut f32; $r] = core::array::from_fn(|i| y[i]);
                let (mut b, mut n) = (b, n);
                // AVX-512 (detected at run time) for the columns up to a multiple of 64, the
                // AVX2 kernels for the rest: 1 and 2 rows of a B too large for L2 stream its
                // rows 16 lanes wide (the AVX2 kernel does the same 8 lanes wide); 3 and 4 rows
                // take 64-column strips (twice the registers and width of the AVX2 strips).
                let stream = $r <= 2 && k * n * 4 >= nrt_hal::tuning::GEMV_STREAM_MIN_BYTES;
                if ($r >= 3 || stream) && n >= 64 && avx512::available() {
                    let done = n & !63;
                    // SAFETY: forwarded contract; AVX-512F detected; `done` a multiple of 64.
                    unsafe {
                        if stream {
                            avx512::stream_rows::<$r, 4>(k, done, xs, b, ldb, ys, alpha, accumulate)
                        } else {
                            avx512::gemv_strips::<$r>(k, done, xs, b, ldb, ys, alpha, accumulate)
                        }
                    };
                    b = b.wrapping_add(done);
                    ys = ys.map(|p| p.wrapping_add(done));
                    n -= done;
                }
                if n > 0 {
                    // SAFETY: forwarded contract; the CPU features are enabled at compile
                    // time.
                    unsafe { avx::gemv_rowmajor::<$r>(k, n, xs, b, ldb, ys, alpha, accumulate) }
                }
            }};
        }
        match x.len() {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    for (xi, yi) in x.iter().zip(y) {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                // SAFETY: in bounds per the contract.
                s += unsafe { *xi.add(p) * *b.offset(p as isize * ldb + j as isize) };
            }
            // SAFETY: in bounds per the contract.
            unsafe { *yi.add(j) = alpha * s + if accumulate { *yi.add(j) } else { 0.0 } };
        }
    }
}

/// For each row `i < x.len()` (1 to [`GEMV_GROUP`]): `y_i[j·ys] = alpha · dot(x_i, R_j)`
/// (`+ y_i[j·ys]` when `accumulate`) for `n` rows `R_j = r + j·ldr` of `k` contiguous floats;
/// every `x_i` contiguous. The rows `R_j` are read once for the whole group.
///
/// # Safety
/// As [`gemv_rowmajor`], `y_i` writable at every `j·ys`, `j < n`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemv_dot(
    k: usize,
    n: usize,
    x: &[*const f32],
    r: *const f32,
    ldr: isize,
    y: &[*mut f32],
    ys: isize,
    alpha: f32,
    accumulate: bool,
) {
    debug_assert!((1..=GEMV_GROUP).contains(&x.len()) && x.len() == y.len());
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        macro_rules! go {
            ($r:literal) => {{
                let xs: [*const f32; $r] = core::array::from_fn(|i| x[i]);
                let yv: [*mut f32; $r] = core::array::from_fn(|i| y[i]);
                // SAFETY: forwarded contract; the CPU features are enabled at compile time.
                unsafe { avx::gemv_dot::<$r>(k, n, xs, r, ldr, yv, ys, alpha, accumulate) }
            }};
        }
        match x.len() {
            1 => go!(1),
            2 => go!(2),
            3 => go!(3),
            _ => go!(4),
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    )))]
    for (xi, yi) in x.iter().zip(y) {
        for j in 0..n {
            let mut s = 0.0;
            for p in 0..k {
                // SAFETY: in bounds per the contract.
                s += unsafe { *xi.add(p) * *r.offset(j as isize * ldr + p as isize) };
            }
            let yp = yi.wrapping_offset(j as isize * ys);
            // SAFETY: in bounds per the contract.
            unsafe { *yp = alpha * s + if accumulate { *yp } else { 0.0 } };
        }
    }
}

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx {
    use core::arch::x86_64::*;

    /// Stores `alpha·s (+ y)` to 8 floats at `y`.
    ///
    /// # Safety
    /// `y` writable for 8 floats.
    #[inline(always)]
    unsafe fn store8(y: *mut f32, s: __m256, alpha: __m256, accumulate: bool) {
        // SAFETY: per the contract (unaligned load/store intrinsics).
        unsafe {
            let v = if accumulate {
                _mm256_fmadd_ps(s, alpha, _mm256_loadu_ps(y))
            } else {
                _mm256_mul_ps(s, alpha)
            };
            _mm256_storeu_ps(y, v);
        }
    }

    /// One strip of `8·W` columns over all `k` rows of B, for `R` rows of A: `R·W`
    /// accumulators in registers while B's rows stream past.
    ///
    /// # Safety
    /// As `super::gemv_rowmajor` for the strip's columns.
    #[inline(always)]
    unsafe fn strip<const R: usize, const W: usize>(
        k: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        // SAFETY: every load reads row p < k, columns < 8·W of the strip, or x_i[p].
        unsafe {
            let mut c = [[_mm256_setzero_ps(); W]; R];
            let mut row = b;
            for p in 0..k {
                let bv: [__m256; W] = core::array::from_fn(|w| _mm256_loadu_ps(row.add(8 * w)));
                for (ci, xi) in c.iter_mut().zip(x) {
                    let xv = _mm256_broadcast_ss(&*xi.add(p));
                    for (cw, bw) in ci.iter_mut().zip(bv) {
                        *cw = _mm256_fmadd_ps(xv, bw, *cw);
                    }
                }
                row = row.offset(ldb);
            }
            let av = _mm256_set1_ps(alpha);
            for (ci, yi) in c.iter().zip(y) {
                for (w, cw) in ci.iter().enumerate() {
                    store8(yi.add(8 * w), *cw, av, accumulate);
                }
            }
        }
    }

    /// One step of [`stream_rows`]: rows `p..p+G` of B, each read once, start to end, added
    /// (scaled by `alpha·x_i[p+g]`) into every `y_i`, `8·Q` columns per register block.
    ///
    /// # Safety
    /// As `super::gemv_rowmajor`, with `p + G ≤ k`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn stream_step<const R: usize, const G: usize, const Q: usize>(
        n: usize,
        x: [*const f32; R],
        p: usize,
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
    ) {
        // SAFETY: reads x_i[p..p+G], rows p..p+G of B at columns < n; writes y_i at columns
        // < n (no overlap with any input, per the contract).
        unsafe {
            let xs: [[f32; G]; R] =
                core::array::from_fn(|i| core::array::from_fn(|g| alpha * *x[i].add(p + g)));
            let xv: [[__m256; G]; R] = xs.map(|xi| xi.map(|v| _mm256_set1_ps(v)));
            let rows: [*const f32; G] = core::array::from_fn(|g| b.offset((p + g) as isize * ldb));
            let mut j = 0;
            while j + 8 * Q <= n {
                let mut acc: [[__m256; Q]; R] = core::array::from_fn(|i| {
                    core::array::from_fn(|q| _mm256_loadu_ps(y[i].add(j + 8 * q)))
                });
                for (g, row) in rows.iter().enumerate() {
                    for q in 0..Q {
                        let w = _mm256_loadu_ps(row.add(j + 8 * q));
                        for (ai, xi) in acc.iter_mut().zip(&xv) {
                            ai[q] = _mm256_fmadd_ps(xi[g], w, ai[q]);
                        }
                    }
                }
                for (ai, yi) in acc.iter().zip(y) {
                    for (q, aq) in ai.iter().enumerate() {
                        _mm256_storeu_ps(yi.add(j + 8 * q), *aq);
                    }
                }
                j += 8 * Q;
            }
            while j + 8 <= n {
                for i in 0..R {
                    let mut a = _mm256_loadu_ps(y[i].add(j));
                    for g in 0..G {
                        a = _mm256_fmadd_ps(xv[i][g], _mm256_loadu_ps(rows[g].add(j)), a);
                    }
                    _mm256_storeu_ps(y[i].add(j), a);
                }
                j += 8;
            }
            while j < n {
                for i in 0..R {
                    let mut a = *y[i].add(j);
                    for g in 0..G {
                        a += xs[i][g] * *rows[g].add(j);
                    }
                    *y[i].add(j) = a;
                }
                j += 1;
            }
        }
    }

    /// The GEMV for a B too large for L2: instead of column strips (which walk B down its
    /// columns, `k` short runs per strip), B's rows are read in memory order, `G` at a time,
    /// and each `y_i` (in L1) accumulates them; the hardware prefetcher sees `G` sequential
    /// streams. `y_i = alpha·Σ_p x_i[p]·B[p] (+ y_i)`, with `alpha` folded into `x_i[p]`.
    ///
    /// # Safety
    /// As `super::gemv_rowmajor`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn stream_rows<const R: usize, const G: usize, const Q: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        // SAFETY: y_i writable for n floats; the steps as `stream_step` with p + G ≤ k.
        unsafe {
            if !accumulate {
                for yi in y {
                    core::ptr::write_bytes(yi, 0, n);
                }
            }
            let mut p = 0;
            while p + G <= k {
                stream_step::<R, G, Q>(n, x, p, b, ldb, y, alpha);
                p += G;
            }
            while p < k {
                stream_step::<R, 1, Q>(n, x, p, b, ldb, y, alpha);
                p += 1;
            }
        }
    }

    /// # Safety
    /// As `super::gemv_rowmajor`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv_rowmajor<const R: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        if R <= 2 && n >= 32 && k * n * 4 >= nrt_hal::tuning::GEMV_STREAM_MIN_BYTES {
            // SAFETY: forwarded contract. G·R broadcasts plus R·Q accumulators and one loaded
            // B vector stay within the 16 registers.
            unsafe {
                match R {
                    1 => stream_rows::<R, 8, 4>(k, n, x, b, ldb, y, alpha, accumulate),
                    _ => stream_rows::<R, 4, 2>(k, n, x, b, ldb, y, alpha, accumulate),
                }
            }
            return;
        }
        let at = |j: usize| y.map(|yi| yi.wrapping_add(j));
        let mut j = 0;
        // SAFETY: (every strip) columns j..j+8W ≤ n lie inside B and every y_i. Widths keep
        // R·W accumulators plus the loaded B vectors within the 16 registers.
        unsafe {
            match R {
                1 => {
                    while j + 64 <= n {
                        strip::<R, 8>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                        j += 64;
                    }
                    if j + 32 <= n {
                        strip::<R, 4>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                        j += 32;
                    }
                }
                2 => {
                    while j + 32 <= n {
                        strip::<R, 4>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                        j += 32;
                    }
                }
                _ => {}
            }
            while j + 16 <= n {
                strip::<R, 2>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                j += 16;
            }
            if j + 8 <= n {
                strip::<R, 1>(k, x, b.add(j), ldb, at(j), alpha, accumulate);
                j += 8;
            }
        }
        if j < n {
            // Up to 7 tail columns: accumulate them together, row by row of B.
            let t = n - j;
            let mut s = [[0.0f32; 8]; R];
            for p in 0..k {
                // SAFETY: row p, columns j..n of B; x_i[p].
                unsafe {
                    let row = b.offset(p as isize * ldb).add(j);
                    for (si, xi) in s.iter_mut().zip(x) {
                        let xp = *xi.add(p);
                        for (q, sq) in si[..t].iter_mut().enumerate() {
                            *sq += xp * *row.add(q);
                        }
                    }
                }
            }
            for (si, yi) in s.iter().zip(y) {
                for (q, sq) in si[..t].iter().enumerate() {
                    // SAFETY: y_i[j + q] with j + q < n.
                    unsafe {
                        let yp = yi.add(j + q);
                        *yp = alpha * sq + if accumulate { *yp } else { 0.0 };
                    }
                }
            }
        }
    }

    /// Horizontal sum of 8 lanes.
    #[inline(always)]
    fn hsum(v: __m256) -> f32 {
        // SAFETY: register-only intrinsics; AVX is enabled at compile time (this module is
        // compiled only with avx2 + fma).
        unsafe {
            let lo = _mm256_castps256_ps128(v);
            let hi = _mm256_extractf128_ps::<1>(v);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// Dot products of `R` rows of A with `J` rows `r + j·ldr`, `U` accumulators per pair.
    ///
    /// # Safety
    /// Each `x_i` readable for `k`; rows `r + j·ldr` readable for `k`, `j < J`.
    #[inline(always)]
    unsafe fn dots<const R: usize, const J: usize, const U: usize>(
        k: usize,
        x: [*const f32; R],
        r: *const f32,
        ldr: isize,
    ) -> [[f32; J]; R] {
        // SAFETY: every load reads index < k of an x_i or of one of the J rows.
        unsafe {
            let rows: [*const f32; J] = core::array::from_fn(|j| r.offset(j as isize * ldr));
            let mut c = [[[_mm256_setzero_ps(); U]; J]; R];
            let mut p = 0;
            while p + 8 * U <= k {
                for u in 0..U {
                    let bv: [__m256; J] =
                        core::array::from_fn(|j| _mm256_loadu_ps(rows[j].add(p + 8 * u)));
                    for (ci, xi) in c.iter_mut().zip(x) {
                        let xv = _mm256_loadu_ps(xi.add(p + 8 * u));
                        for (cij, bj) in ci.iter_mut().zip(bv) {
                            cij[u] = _mm256_fmadd_ps(xv, bj, cij[u]);
                        }
                    }
                }
                p += 8 * U;
            }
            while p + 8 <= k {
                let bv: [__m256; J] = core::array::from_fn(|j| _mm256_loadu_ps(rows[j].add(p)));
                for (ci, xi) in c.iter_mut().zip(x) {
                    let xv = _mm256_loadu_ps(xi.add(p));
                    for (cij, bj) in ci.iter_mut().zip(bv) {
                        cij[0] = _mm256_fmadd_ps(xv, bj, cij[0]);
                    }
                }
                p += 8;
            }
            let mut out = [[0.0f32; J]; R];
            for i in 0..R {
                for j in 0..J {
                    let v = c[i][j][1..]
                        .iter()
                        .fold(c[i][j][0], |v, cu| _mm256_add_ps(v, *cu));
                    let mut s = hsum(v);
                    for q in p..k {
                        s += *x[i].add(q) * *rows[j].add(q);
                    }
                    out[i][j] = s;
                }
            }
            out
        }
    }

    /// # Safety
    /// As `super::gemv_dot`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv_dot<const R: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        r: *const f32,
        ldr: isize,
        y: [*mut f32; R],
        ys: isize,
        alpha: f32,
        accumulate: bool,
    ) {
        let put = |i: usize, j: usize, s: f32| {
            let yp = y[i].wrapping_offset(j as isize * ys);
            // SAFETY: y_i[j·ys] with j < n is writable per the contract.
            unsafe { *yp = alpha * s + if accumulate { *yp } else { 0.0 } };
        };
        macro_rules! block {
            ($j:literal, $u:literal, $jj:expr) => {{
                // SAFETY: rows jj..jj+J < n.
                let s = unsafe { dots::<R, $j, $u>(k, x, r.offset($jj as isize * ldr), ldr) };
                for (i, si) in s.iter().enumerate() {
                    for (q, v) in si.iter().enumerate() {
                        put(i, $jj + q, *v);
                    }
                }
            }};
        }
        let mut j = 0;
        // R·J·U ≤ 8 accumulators: 4 rows of B at a time for one row of A, 2 for more.
        if R == 1 {
            while j + 4 <= n {
                block!(4, 2, j);
                j += 4;
            }
        } else {
            while j + 2 <= n {
                if R == 2 {
                    block!(2, 2, j);
                } else {
                    block!(2, 1, j);
                }
                j += 2;
            }
        }
        while j < n {
            block!(1, 2, j);
            j += 1;
        }
    }
}

/// The AVX-512 strips of the 3- and 4-row GEMV (chosen at run time).
#[cfg(all(
    target_arch = "x86_64",
    target_feature = "avx2",
    target_feature = "fma"
))]
mod avx512 {
    use core::arch::x86_64::*;

    /// Whether the CPU runs these kernels.
    pub fn available() -> bool {
        crate::cpu::avx512f()
    }

    /// `y_i[j] = alpha·Σ_p x_i[p]·B[p, j]` (`+ y_i[j]` when `accumulate`) for the first `n`
    /// columns, `n` a multiple of 64, in strips of 64 columns: R×4 accumulators, B's row
    /// segment loaded once per strip row.
    ///
    /// # Safety
    /// As [`super::gemv_rowmajor`]; AVX-512F present.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn gemv_strips<const R: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        debug_assert!(n.is_multiple_of(64));
        let mut j = 0;
        while j < n {
            let mut acc = [[_mm512_setzero_ps(); 4]; R];
            for p in 0..k {
                // SAFETY: row p, columns j..j+64 of B; x_i[p] (the contract).
                unsafe {
                    let row = b.offset(p as isize * ldb).add(j);
                    let mut bv = [_mm512_setzero_ps(); 4];
                    for w in 0..4 {
                        bv[w] = _mm512_loadu_ps(row.add(16 * w));
                    }
                    for r in 0..R {
                        let xv = _mm512_set1_ps(*x[r].add(p));
                        for w in 0..4 {
                            acc[r][w] = _mm512_fmadd_ps(xv, bv[w], acc[r][w]);
                        }
                    }
                }
            }
            let va = _mm512_set1_ps(alpha);
            for r in 0..R {
                for w in 0..4 {
                    // SAFETY: y_i[j + 16w .. +16] lies inside y_i's n columns.
                    unsafe {
                        let yp = y[r].add(j + 16 * w);
                        let mut v = _mm512_mul_ps(va, acc[r][w]);
                        if accumulate {
                            v = _mm512_add_ps(v, _mm512_loadu_ps(yp));
                        }
                        _mm512_storeu_ps(yp, v);
                    }
                }
            }
            j += 64;
        }
    }

    /// The row-streaming GEMV ([`super::avx`]'s `stream_rows`, for a B too large for L2)
    /// 16 lanes wide: `G` rows of B read in memory order per step, each `y_i` (in L1)
    /// accumulating them in blocks of 64 columns, for the first `n` columns, `n` a multiple
    /// of 64. Half the load and FMA instructions of the AVX2 kernel per byte of B. `mlp`
    /// (four 512×512 layers, batch 1; AMD EPYC Zen 5, `ab.sh` 12 pairs): `G` = 8 0.907× the
    /// AVX2 kernel, then `G` = 4 0.958× of 8, 16 1.09×, 2 1.19×.
    ///
    /// # Safety
    /// As [`super::gemv_rowmajor`]; AVX-512F present; `n` a multiple of 64.
    #[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn stream_rows<const R: usize, const G: usize>(
        k: usize,
        n: usize,
        x: [*const f32; R],
        b: *const f32,
        ldb: isize,
        y: [*mut f32; R],
        alpha: f32,
        accumulate: bool,
    ) {
        debug_assert!(n.is_multiple_of(64));
        if !accumulate {
            for yi in y {
                // SAFETY: y_i writable for n floats (the contract).
                unsafe { core::ptr::write_bytes(yi, 0, n) };
            }
        }
        let mut p = 0;
        while p < k {
            let g = G.min(k - p);
            // alpha·x_i[p + t] for the step's rows (0 past the last: those rows are not read).
            let mut xv = [[_mm512_setzero_ps(); G]; R];
            let mut rows = [b; G];
            for t in 0..g {
                rows[t] = b.wrapping_offset((p + t) as isize * ldb);
                for r in 0..R {
                    // SAFETY: x_i[p + t], p + t < k.
                    xv[r][t] = _mm512_set1_ps(alpha * unsafe { *x[r].add(p + t) });
                }
            }
            let mut j = 0;
            while j < n {
                let mut acc = [[_mm512_setzero_ps(); 4]; R];
                for r in 0..R {
                    for w in 0..4 {
                        // SAFETY: y_i[j + 16w .. +16] inside its n columns.
                        acc[r][w] = unsafe { _mm512_loadu_ps(y[r].add(j + 16 * w)) };
                    }
                }
                for t in 0..g {
                    for w in 0..4 {
                        // SAFETY: row p + t < k, columns j + 16w .. +16 < n of B.
                        let bv = unsafe { _mm512_loadu_ps(rows[t].add(j + 16 * w)) };
                        for r in 0..R {
                            acc[r][w] = _mm512_fmadd_ps(xv[r][t], bv, acc[r][w]);
                        }
                    }
                }
                for r in 0..R {
                    for w in 0..4 {
                        // SAFETY: as the loads of y_i above.
                        unsafe { _mm512_storeu_ps(y[r].add(j + 16 * w), acc[r][w]) };
                    }
                }
                j += 64;
            }
            p += G;
        }
    }
}
