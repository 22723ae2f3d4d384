//! MatMul and Gemm on PE (split between the cores with `cores: 2`). A following scalar
//! factor goes into alpha; Gemm's C, the `Add`s of a bias or a residual that follow and a
//! following activation (an ACT function node or a recognized GELU) go into the MatMul's
//! fused epilogue ([`nrt_isa::Epilogue`]), computed on each output tile while it is hot.
//! A 2-D floating MatMul of constants folds.

use super::unary::act_of;
use super::{Dtypes, Fold, Registry};
use crate::error::Result;
use crate::eval::{input, one};
use crate::graph::ValueId;
use crate::lower::view::{View, mk_ap, simplify};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, broadcast_shapes, elementwise_dtype_check, matmul_shape, out};
use crate::tensor::{HostTensor, is_float};
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, BinaryOp, Epilogue, Op, matmul_flags};

pub(super) fn register(r: &mut Registry) {
    r.op("Det", 11, infer_det)
        .dtypes(Dtypes::Float)
        .note("matrices up to 5 × 5: the Leibniz sum of signed products on DVE")
        .device(lower!(lower_det));
    r.op("MatMul", 1, infer_matmul)
        .dtypes(Dtypes::Float)
        .folds(fold_matmul)
        .device(|l, at| l.lower_matmul(at));
    r.op("Gemm", 1, infer_gemm)
        .dtypes(Dtypes::Float)
        .fold(Fold::Never)
        .device(|l, at| l.lower_gemm(at));
}

/// What [`Lowerer::epilogue_chain`] found after a product.
#[derive(Debug)]
pub(crate) struct EpilogueChain {
    /// Tensors added (broadcast to the product's shape), in order: bias, residual.
    pub addends: Vec<ValueId>,
    /// The activation applied last: `(function, alpha, beta)`.
    pub act: Option<(ActFunc, f32, f32)>,
    /// The value the last fused node produces (the product itself when nothing fuses).
    pub out: ValueId,
    /// The fused nodes (not lowered).
    pub nodes: Vec<usize>,
}

/// MatMul (numpy semantics).
pub(crate) fn infer_matmul(c: &Ctx) -> Result<Vec<Out>> {
    let (a, b) = (c.input(0)?, c.input(1)?);
    elementwise_dtype_check(c, &[a, b])?;
    Ok(vec![out(a.dtype, matmul_shape(c, &a.shape, &b.shape)?)])
}

/// Folds a MatMul of two 2-D floating matrices in f32, each row accumulated over `k` in
/// order (other ranks and integers go to the device).
fn fold_matmul(c: &Ctx, _: &[Out]) -> Result<Option<Vec<HostTensor>>> {
    let (a, b) = (input(c, 0), input(c, 1));
    if a.shape.len() != 2 || b.shape.len() != 2 || !is_float(a.dtype) {
        return Ok(None);
    }
    let (m, kk, nn) = (a.shape[0], a.shape[1], b.shape[1]);
    let (x, y) = (a.to_f32s(), b.to_f32s());
    let mut v = vec![0f32; m * nn];
    for i in 0..m {
        for p in 0..kk {
            let s = x[i * kk + p];
            for j in 0..nn {
                v[i * nn + j] += s * y[p * nn + j];
            }
        }
    }
    one(HostTensor::f32(vec![m, nn], v).cast(a.dtype))
}

/// Gemm: 2-D operands, optional transposes, C broadcast to the result.
pub(crate) fn infer_gemm(c: &Ctx) -> Result<Vec<Out>> {
    let n = c.n;
    let (a, b) = (c.input(0)?, c.input(1)?);
    if a.shape.len() != 2 || b.shape.len() != 2 {
        return Err(c.mismatch(format!("Gemm of {:?} and {:?}", a.shape, b.shape)));
    }
    let ta = n.attr_i("transA", 0)? != 0;
    let tb = n.attr_i("transB", 0)? != 0;
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (kb, nn) = if tb {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != kb {
        return Err(c.mismatch(format!("Gemm inner sizes {k} ≠ {kb}")));
    }
    if let Some(cc) = c.opt(2)
        && broadcast_shapes(&cc.shape, &[m, nn]).as_deref() != Some(&[m, nn][..])
    {
        return Err(c.mismatch(format!(
            "C {:?} does not broadcast to [{m}, {nn}]",
            cc.shape
        )));
    }
    Ok(vec![out(a.dtype, vec![m, nn])])
}

/// Largest matrix Det sums the `n!` permutation products of.
const DET_MAX_N: usize = 5;

/// Det: the batch dimensions of `[…, n, n]`.
pub(crate) fn infer_det(c: &Ctx) -> Result<Vec<Out>> {
    let x = c.input(0)?;
    let r = x.shape.len();
    if r < 2 || x.shape[r - 1] != x.shape[r - 2] {
        return Err(c.mismatch(format!("Det of shape {:?} (square matrices)", x.shape)));
    }
    if x.shape[r - 1] > DET_MAX_N {
        return Err(c.e(
            crate::error::ErrorKind::UnsupportedOp,
            format!(
                "Det of {n} × {n} matrices (at most {DET_MAX_N} × {DET_MAX_N})",
                n = x.shape[r - 1]
            ),
        ));
    }
    Ok(vec![out(x.dtype, x.shape[..r - 2].to_vec())])
}

/// The permutations of `0..n` with their signs (Heap's algorithm order is irrelevant).
fn permutations(n: usize) -> Vec<(Vec<usize>, bool)> {
    fn rec(p: &mut Vec<usize>, k: usize, neg: bool, out: &mut Vec<(Vec<usize>, bool)>) {
        if k == p.len() {
            out.push((p.clone(), neg));
            return;
        }
        for i in k..p.len() {
            p.swap(k, i);
            rec(p, k + 1, neg ^ (i != k), out);
            p.swap(k, i);
        }
    }
    let mut out = Vec::new();
    rec(&mut (0..n).collect(), 0, false, &mut out);
    out
}

impl<'a> Lowerer<'a> {
    /// Det: `Σ_σ sign(σ) Π_i x[…, i, σ(i)]`, each factor a strided view of one element per
    /// matrix; products and the signed sum on DVE.
    pub(crate) fn lower_det(&mut self, at: At<'a>) -> Result<()> {
        let At {
            n, c, o0, oshape, ..
        } = at;
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let m = xv.shape[r - 1];
        let y = self.alloc(o0);
        let total: usize = oshape.iter().product();
        if total == 0 {
            return Ok(());
        }
        if m == 0 {
            return self.fill(Engine::Dve, &y, 1.0);
        }
        let x = self.input_view(n, 0)?;
        let elem = |i: usize, j: usize| View {
            addr: x.elems(i as i64 * x.strides[r - 2] + j as i64 * x.strides[r - 1]),
            dtype: DType::F32,
            shape: oshape.to_vec(),
            strides: x.strides[..r - 2].to_vec(),
        };
        let term = View::dense(self.temp(total * 4), DType::F32, oshape);
        for (k, (p, neg)) in permutations(m).into_iter().enumerate() {
            let dst = if k == 0 { y.clone() } else { term.clone() };
            if m == 1 {
                self.copy(Engine::Dve, &elem(0, p[0]), &dst)?;
            } else {
                self.binary(&elem(0, p[0]), &elem(1, p[1]), &dst, BinaryOp::Mul)?;
                for (i, &pi) in p.iter().enumerate().skip(2) {
                    self.binary(&dst, &elem(i, pi), &dst, BinaryOp::Mul)?;
                }
            }
            match (k, neg) {
                (0, true) => self.tensor_scalar(&y, &y, BinaryOp::Mul, -1.0)?,
                (0, false) => {}
                (_, false) => self.binary(&y, &term, &y, BinaryOp::Add)?,
                (_, true) => self.binary(&y, &term, &y, BinaryOp::Sub)?,
            }
        }
        Ok(())
    }

    /// Emits one MatMul without an epilogue (see [`Self::matmul_epi`]).
    pub(crate) fn matmul_aps(
        &mut self,
        a: AccessPattern,
        b: AccessPattern,
        c: AccessPattern,
        alpha: f32,
        flags: u32,
    ) {
        self.matmul_epi(a, b, c, alpha, flags, Epilogue::NONE);
    }

    /// The elementwise nodes after a MatMul/Gemm result `v` that its epilogue can compute:
    /// up to `slots` `Add`s of a tensor that broadcasts to `v`'s shape and is available
    /// now (a constant, or a value already computed: a bias or a residual), then one
    /// activation (any ACT function node, or a GELU recognized from its decomposition,
    /// whose bias add counts as one of the adds). Each intermediate must have that node as
    /// its only reader and not be a graph output. f32 only.
    pub(crate) fn epilogue_chain(&self, v: ValueId, slots: usize) -> EpilogueChain {
        let g = self.g;
        let mut ch = EpilogueChain {
            addends: Vec::new(),
            act: None,
            out: v,
            nodes: Vec::new(),
        };
        if g.values[v].dtype != DType::F32 {
            return ch;
        }
        let shape = g.values[v].shape.clone();
        let ready = |x: ValueId| g.values[x].konst.is_some() || self.loc[x].is_some();
        let fits = |x: ValueId| {
            g.values[x].dtype == DType::F32
                && broadcast_shapes(&g.values[x].shape, &shape).as_deref() == Some(&shape[..])
        };
        while ch.addends.len() < slots {
            let Some(j) = self.sole_consumer(ch.out) else {
                break;
            };
            let nj = &g.nodes[j];
            let ins: Vec<ValueId> = nj.inputs.iter().flatten().copied().collect();
            let other = match (nj.op.as_str(), ins.as_slice()) {
                ("Add", &[p, q]) if p == ch.out && q != ch.out => q,
                ("Add", &[p, q]) if q == ch.out && p != ch.out => p,
                _ => break,
            };
            let Some(oj) = nj.outputs.first().copied().flatten() else {
                break;
            };
            if self.fused.values().any(|f| f.nodes.contains(&j))
                || g.values[oj].shape != shape
                || g.values[oj].dtype != DType::F32
                || !ready(other)
                || !fits(other)
            {
                break;
            }
            ch.addends.push(other);
            ch.nodes.push(j);
            ch.out = oj;
        }
        // A GELU spelled out in elementwise nodes, recognized before lowering.
        if let Some((&root, f)) = self.fused.iter().find(|(_, f)| f.x == ch.out)
            && !self.out_vars.contains_key(&ch.out)
            && self.consumers[ch.out].iter().all(|c| f.nodes.contains(c))
            && f.bias
                .is_none_or(|b| ready(b) && fits(b) && ch.addends.len() < slots)
            && let Some(o) = g.nodes[root].outputs.first().copied().flatten()
            && g.values[o].shape == shape
        {
            ch.addends.extend(f.bias);
            ch.act = Some((f.func, 0.0, 0.0));
            ch.nodes.extend(f.nodes.iter().copied());
            ch.out = o;
            return ch;
        }
        if let Some(j) = self.sole_consumer(ch.out)
            && !self.fused.contains_key(&j)
        {
            let cj = Ctx { g, n: &g.nodes[j] };
            if let Ok(Some(f)) = act_of(&cj)
                && g.nodes[j].inputs.first().copied().flatten() == Some(ch.out)
                && let Some(o) = g.nodes[j].outputs.first().copied().flatten()
                && g.values[o].shape == shape
                && g.values[o].dtype == DType::F32
            {
                ch.act = Some(f);
                ch.nodes.push(j);
                ch.out = o;
            }
        }
        ch
    }

    /// Under `--auto-cast`: the constant 2-D f32 weight `v` stored once in the cast type as
    /// `[N, K]` (K contiguous, what the device's half-precision MatMul reads), viewed as the
    /// product stores it: `[N, K]` when `stored_nk` (Gemm's `transB`), else `[K, N]` with
    /// strides `[1, K]`. `None` when nothing is cast.
    pub(crate) fn cast_weight(&mut self, v: ValueId, stored_nk: bool) -> Option<View> {
        let dtype = self.auto_cast?;
        let val = &self.g.values[v];
        let t = val.konst.as_deref()?;
        if val.dtype != DType::F32 || val.shape.len() != 2 {
            return None;
        }
        let (r, c) = (val.shape[0], val.shape[1]);
        let addr = match self.cast_addr.get(&v) {
            Some(&a) => a,
            None => {
                let x = t.to_f32s();
                let nk: Box<dyn Iterator<Item = f64>> = if stored_nk {
                    Box::new(x.iter().map(|&f| f as f64))
                } else {
                    Box::new(
                        (0..c)
                            .flat_map(|j| (0..r).map(move |p| (p, j)))
                            .map(|(p, j)| x[p * c + j] as f64),
                    )
                };
                let h = HostTensor::from_f64s(dtype, vec![r * c], nk);
                let a = self.add_const(&h).ok()?;
                self.cast_addr.insert(v, a);
                a
            }
        };
        Some(if stored_nk {
            View::dense(addr, dtype, &[r, c])
        } else {
            View {
                addr,
                dtype,
                shape: vec![r, c],
                strides: vec![1, r as i64],
            }
        })
    }

    /// Without `--auto-cast` (f32) or with bf16 auto-cast (bf16, pairs of K), for a product
    /// of any number of rows (up to [`nrt_hal::tuning::GEMV_MAX_ROWS`] the packed GEMV
    /// streams the panels), at least [`nrt_hal::tuning::GEMM_PACK_MIN_K`] terms (f32) and
    /// [`nrt_hal::tuning::GEMM_PACK_BF16_MIN_N`] columns (bf16): the
    /// constant 2-D f32 weight `v`
    /// (`[N, K]` when `stored_nk`, else `[K, N]`) packed once in panels of
    /// [`nrt_hal::tuning::GEMM_PACK_NR`] columns (`matmul_flags::PACKED_B`: the device's GEMM
    /// then packs nothing per call). Returned as a placeholder dense `[K, N]` view of the
    /// packed constant's address, which [`Self::matmul_epi`] turns into the panel layout;
    /// the original weight is not stored unless another consumer reads it. `None`: not
    /// packed.
    pub(crate) fn pack_weight(&mut self, v: ValueId, stored_nk: bool) -> Option<View> {
        let val = &self.g.values[v];
        if val.shape.len() != 2 {
            return None;
        }
        let (k, n) = if stored_nk {
            (val.shape[1], val.shape[0])
        } else {
            (val.shape[0], val.shape[1])
        };
        self.pack_weight_at(v, 0, k, n, stored_nk)
    }

    /// [`Self::pack_weight`] for the `k × n` matrix at element `offset` of the constant f32
    /// `v` (any rank), stored `[N, K]` when `stored_nk`, else `[K, N]`, densely: a recurrent
    /// layer's weights for one direction (`W[d]`, `R[d]`, `[N, K]`).
    pub(crate) fn pack_weight_at(
        &mut self,
        v: ValueId,
        offset: usize,
        k: usize,
        n: usize,
        stored_nk: bool,
    ) -> Option<View> {
        use nrt_hal::tuning::{GEMM_PACK_BF16_MIN_N, GEMM_PACK_MIN_K, GEMM_PACK_NR};
        // f32, or bf16 under `--auto-cast … bf16` (pairs of K per 32-bit word: `vdpbf16ps`);
        // fp16 weights stay as `cast_weight` stores them.
        let dtype = self.auto_cast.unwrap_or(DType::F32);
        if dtype == DType::F16 {
            return None;
        }
        let val = &self.g.values[v];
        let t = val.konst.as_deref()?;
        let elems = k.checked_mul(n)?.checked_add(offset)?;
        if val.dtype != DType::F32 || elems > val.shape.iter().product::<usize>() {
            return None;
        }
        // Narrow outputs (a panel mostly padding) and strides past the AP's i32 stay as stored;
        // f32 also short K (the GEMM crate's tiles win there), bf16 not (its other kernel
        // loses at every K).
        let (min_k, min_n) = if dtype == DType::Bf16 {
            (1, GEMM_PACK_BF16_MIN_N)
        } else {
            (GEMM_PACK_MIN_K, GEMM_PACK_NR / 2)
        };
        if k < min_k || n < min_n || i32::try_from((k + 1) * GEMM_PACK_NR).is_err() {
            return None;
        }
        let key = (v, stored_nk, offset);
        let addr = match self.packed_addr.get(&key) {
            Some(&a) => a,
            None => {
                let nr = GEMM_PACK_NR;
                let x = t.to_f32s();
                let get = |p: usize, j: usize| {
                    if stored_nk {
                        x[offset + j * k + p]
                    } else {
                        x[offset + p * n + j]
                    }
                };
                // Padding to whole panels (under 2× for n ≥ NR/2) within the size budget.
                crate::tensor::within_budget(&[n.div_ceil(nr) * nr, k + 1], dtype)?;
                let h = if dtype == DType::Bf16 {
                    // Panels of `ceil(k/2)` rows of `nr` pairs, zero-padded (the tensor
                    // rounds the values to bf16).
                    let kp = k.div_ceil(2);
                    let panels = n.div_ceil(nr);
                    let len = panels.checked_mul(kp)?.checked_mul(2 * nr)?;
                    let vals = (0..len).map(|i| {
                        let (h, jj) = (i % 2, (i / 2) % nr);
                        let (t, q) = ((i / (2 * nr)) % kp, i / (2 * nr * kp));
                        let (p, j) = (2 * t + h, q * nr + jj);
                        if p < k && j < n {
                            get(p, j) as f64
                        } else {
                            0.0
                        }
                    });
                    HostTensor::from_f64s(DType::Bf16, vec![len], vals)
                } else {
                    let len = matmul_flags::packed_len(k, n, nr)?;
                    let mut out = crate::tensor::try_vec::<f32>(len, "a packed weight").ok()?;
                    out.resize(len, 0.0);
                    matmul_flags::pack_b(k, n, nr, get, &mut out);
                    HostTensor::f32(vec![len], out)
                };
                let a = self.add_const(&h).ok()?;
                self.packed_addr.insert(key, a);
                a
            }
        };
        Some(View::dense(addr, dtype, &[k, n]))
    }

    /// Emits one MatMul with an epilogue, split between the cores (N, else M) when there
    /// are two. With `PACKED_B`, `b` is the placeholder `[.., .., K, N]` of
    /// [`Self::pack_weight`] (batch strides 0): it becomes the panel layout, and an N split
    /// falls on a panel boundary.
    pub(crate) fn matmul_epi(
        &mut self,
        a: AccessPattern,
        b: AccessPattern,
        c: AccessPattern,
        alpha: f32,
        flags: u32,
        epilogue: Epilogue,
    ) {
        let (m, n) = (c.shape[2] as i64, c.shape[3] as i64);
        let ta = flags & matmul_flags::TRANSPOSE_A != 0;
        let tb = flags & matmul_flags::TRANSPOSE_B != 0;
        let nr = nrt_hal::tuning::GEMM_PACK_NR as i64;
        let packed = flags & matmul_flags::PACKED_B != 0;
        // The panels holding columns `start..start + len` of a packed B.
        // (bf16: `ceil(K/2)` rows of `NR` pairs.)
        let panels = |start: i64, len: i64| {
            let pairs = b.dtype == DType::Bf16;
            let rows = if pairs {
                b.shape[2].div_ceil(2)
            } else {
                b.shape[2]
            };
            let row = if pairs { 2 * nr } else { nr };
            let es = b.dtype.size() as i64;
            AccessPattern {
                addr: (b.addr as i64 + start / nr * rows as i64 * row * es) as u64,
                dtype: b.dtype,
                shape: [1, (len as u32).div_ceil(nr as u32), rows, row as u32],
                stride: [0, (rows as i64 * row) as i32, row as i32, 1],
            }
        };
        if self.cores < 2 || (m < 2 && n < 2) || (packed && m < 2 && n < 2 * nr) {
            let b = if packed { panels(0, n) } else { b };
            self.emit(
                0,
                Engine::Pe,
                Op::MatMul(op::MatMul {
                    a,
                    b,
                    c,
                    alpha,
                    flags,
                    epilogue,
                }),
            );
            return;
        }
        // A batched product (attention's heads) splits its batch: each core multiplies whole
        // matrices, and a row-split softmax between two such products then finds its rows
        // on the core that computed them (no cross-core wait). An N split of `[4, 128, 64]`
        // halves gave each core 32-column products at ~0.9× the 1-core time of the whole.
        // Only an even batch (or one large enough that an odd split is nearly even).
        let batch_dim = (0..2).rev().find(|&d| c.shape[d] >= 2).filter(|&d| {
            let nb = c.shape[d];
            !packed && (nb.is_multiple_of(2) || nb >= 8)
        });
        // A packed B splits at a panel boundary (or not at all: then M splits).
        let split_n = batch_dim.is_none() && if packed { n >= 2 * nr } else { n >= 2 };
        let total = match batch_dim {
            Some(d) => c.shape[d] as i64,
            None if split_n => n,
            None => m,
        };
        let half = if split_n && packed {
            (n / 2 + nr - 1) / nr * nr
        } else {
            total / 2
        };
        for (core, start, len) in [(0u8, 0i64, half), (1u8, half, total - half)] {
            let (mut a2, mut b2, mut c2, mut e2) = (a, b, c, epilogue);
            let adv = |ap: &mut AccessPattern, dim: usize| {
                let es = ap.dtype.size() as i64;
                ap.shape[dim] = len as u32;
                ap.addr = (ap.addr as i64 + start * ap.stride[dim] as i64 * es) as u64;
            };
            let cdim = match batch_dim {
                Some(d) => d,
                None if split_n => 3,
                None => 2,
            };
            adv(&mut c2, cdim);
            for x in [&mut e2.bias, &mut e2.residual].into_iter().flatten() {
                adv(x, cdim);
            }
            if let Some(d) = batch_dim {
                // Broadcast batches (stride 0) stay put: `adv` moves by the stride.
                adv(&mut a2, d);
                adv(&mut b2, d);
            } else if packed && split_n {
                b2 = panels(start, len);
            } else if split_n {
                adv(&mut b2, if tb { 2 } else { 3 });
            } else {
                if packed {
                    b2 = panels(0, n);
                }
                adv(&mut a2, if ta { 3 } else { 2 });
            }
            self.emit(
                core,
                Engine::Pe,
                Op::MatMul(op::MatMul {
                    a: a2,
                    b: b2,
                    c: c2,
                    alpha,
                    flags,
                    epilogue: e2,
                }),
            );
        }
    }

    pub(crate) fn lower_matmul(&mut self, at: At<'a>) -> Result<()> {
        let At { g, n, o0, .. } = at;
        let (av, bv) = (n.inputs[0].expect("p"), n.inputs[1].expect("p"));
        // Fuse a following multiplication (or division) by a compile-time scalar into alpha.
        let mut alpha = 1.0f32;
        let mut target = o0;
        if let Some(j) = self.sole_consumer(o0) {
            let nj = &g.nodes[j];
            let ins: Vec<ValueId> = nj.inputs.iter().flatten().copied().collect();
            let scalar = |v: ValueId| {
                g.values[v]
                    .konst
                    .as_deref()
                    .filter(|t| t.len() == 1 && t.dtype == DType::F32)
                    .map(|t| t.get_f64(0) as f32)
            };
            let factor = match (nj.op.as_str(), ins.as_slice()) {
                ("Mul", &[p, q]) if p == o0 && q != o0 => scalar(q),
                ("Mul", &[p, q]) if q == o0 && p != o0 => scalar(p),
                ("Div", &[p, q]) if p == o0 && q != o0 => {
                    scalar(q).filter(|&d| d != 0.0).map(|d| 1.0 / d)
                }
                _ => None,
            };
            if let Some(f) = factor {
                let oj = self.out(j, 0)?;
                if g.values[oj].shape == g.values[o0].shape {
                    alpha = f;
                    target = oj;
                    self.skip[j] = true;
                }
            }
        }
        // The bias/residual adds and the activation that follow: the MatMul's epilogue
        // (only for a product that computes something: an empty one writes no tile).
        let nonempty = g.values[o0].shape.iter().all(|&d| d > 0)
            && g.values[av].shape.last().is_some_and(|&k| k > 0);
        let mut epilogue = Epilogue::NONE;
        let mut addends = Vec::new();
        if nonempty {
            let ch = self.epilogue_chain(target, 2);
            if !ch.nodes.is_empty() {
                for &j in &ch.nodes {
                    self.skip[j] = true;
                }
                if let Some((f, p, q)) = ch.act {
                    epilogue.func = f;
                    epilogue.act_alpha = p;
                    epilogue.act_beta = q;
                }
                addends = ch.addends;
                target = ch.out;
            }
        }
        // Operands as they are stored: transposed and head-split views need no copy (the
        // engine takes any strides). A constant weight may be cast (`--auto-cast`).
        let mut a = self.sview(av)?;
        let mut flags = 0;
        let mut b = match self.pack_weight(bv, false) {
            Some(v) => {
                flags |= matmul_flags::PACKED_B;
                v
            }
            None => match self.cast_weight(bv, false) {
                Some(v) => v,
                None => self.sview(bv)?,
            },
        };
        if a.strides.iter().any(|&s| s < 0) {
            a = self.view(av)?;
        }
        if b.strides.iter().any(|&s| s < 0) {
            b = self.view(bv)?;
        }
        // A bf16 input read through its `Cast` to f32 (`lower_cast`): the product of A's f32
        // values with the widened weights, as ONNX defines it (auto-cast rounds A instead).
        if b.dtype == DType::Bf16
            && g.values[bv].dtype == DType::F32
            && g.values[bv].konst.is_none()
        {
            flags |= matmul_flags::F32_A;
        }
        let y = self.alloc_any(target)?;
        let mut ev = Vec::new();
        for &x in &addends {
            let v = self.sview(x)?;
            let v = if v.strides.iter().any(|&s| s < 0) {
                self.view(x)?
            } else {
                v
            };
            ev.push(v.broadcast(&y.shape));
        }
        let (a1, b1) = (a.shape.len() == 1, b.shape.len() == 1);
        if a1 {
            a = View {
                shape: vec![1, a.shape[0]],
                strides: vec![0, a.strides[0]],
                ..a
            };
        }
        if b1 {
            b = View {
                shape: vec![b.shape[0], 1],
                strides: vec![b.strides[0], 0],
                ..b
            };
        }
        let mut c = y.clone();
        if a1 {
            let at = c.shape.len() - usize::from(!b1);
            c.shape.insert(at, 1);
            c.strides.insert(at, 0);
        }
        if b1 {
            c.shape.push(1);
            c.strides.push(0);
        }
        for e in &mut ev {
            if a1 {
                let at = e.shape.len() - usize::from(!b1);
                e.shape.insert(at, 1);
                e.strides.insert(at, 0);
            }
            if b1 {
                e.shape.push(1);
                e.strides.push(0);
            }
        }
        let re = c.shape.len();
        let (ra, rb, rc) = (a.shape.len(), b.shape.len(), c.shape.len());
        let (mut m, k) = (a.shape[ra - 2], a.shape[ra - 1]);
        let nn = b.shape[rb - 1];
        let batch = c.shape[..rc - 2].to_vec();
        let (a_rs, a_cs) = (a.strides[ra - 2], a.strides[ra - 1]);
        let (b_rs, b_cs) = (b.strides[rb - 2], b.strides[rb - 1]);
        let (c_rs, c_cs) = (c.strides[rc - 2], c.strides[rc - 1]);
        if m * nn == 0 || batch.contains(&0) {
            debug_assert!(
                epilogue.is_none() && ev.is_empty(),
                "fused only when nonempty"
            );
            return self.finish_fused_target(target, o0);
        }
        if k == 0 {
            self.fill(Engine::Dve, &y, 0.0)?;
            return self.finish_fused_target(target, o0);
        }
        // Batch strides, right-aligned, 0 where an operand broadcasts.
        let bstr = |v: &View, r: usize| -> Vec<i64> {
            let vb = &v.shape[..r - 2];
            let off = batch.len() - vb.len();
            (0..batch.len())
                .map(|i| {
                    if i < off || vb[i - off] == 1 {
                        0
                    } else {
                        v.strides[i - off]
                    }
                })
                .collect()
        };
        let (sa, sb, sc) = (bstr(&a, ra), bstr(&b, rb), c.strides[..rc - 2].to_vec());
        let mut all = vec![sa, sb, sc];
        all.extend(ev.iter().map(|e| e.strides[..re - 2].to_vec()));
        let (mut bs, mut bst, _) = simplify(&batch, &all, usize::MAX);
        // Batches that share B and continue A's and C's rows are more rows (one taller
        // product, which two cores can split).
        while let Some(&last) = bs.last() {
            let d = bs.len() - 1;
            let rows_a = a_rs * m as i64;
            let rows_c = c_rs * m as i64;
            let rows_e = |i: usize| ev[i].strides[re - 2] * m as i64;
            if bst[1][d] == 0
                && bst[0][d] == rows_a
                && bst[2][d] == rows_c
                && (0..ev.len()).all(|i| bst[3 + i][d] == rows_e(i))
            {
                m *= last;
                bs.pop();
                for s in &mut bst {
                    s.pop();
                }
            } else {
                break;
            }
        }
        let (bs, bst, offs) = simplify(&bs, &bst, 2);
        for o in offs {
            let shape = |x: usize, y: usize| {
                let mut s = bs.clone();
                s.extend([x, y]);
                s
            };
            let strides = |v: usize, r: i64, c: i64| {
                let mut s = bst[v].clone();
                s.extend([r, c]);
                s
            };
            let a_ap = mk_ap(
                a.elems(o[0]),
                a.dtype,
                &shape(m, k),
                &strides(0, a_rs, a_cs),
            )?;
            let b_ap = mk_ap(
                b.elems(o[1]),
                b.dtype,
                &shape(k, nn),
                &strides(1, b_rs, b_cs),
            )?;
            let c_ap = mk_ap(
                c.elems(o[2]),
                c.dtype,
                &shape(m, nn),
                &strides(2, c_rs, c_cs),
            )?;
            let mut epi = epilogue;
            for (i, e) in ev.iter().enumerate() {
                let ap = mk_ap(
                    e.elems(o[3 + i]),
                    e.dtype,
                    &shape(m, nn),
                    &strides(3 + i, e.strides[re - 2], e.strides[re - 1]),
                )?;
                if i == 0 {
                    epi.bias = Some(ap);
                } else {
                    epi.residual = Some(ap);
                }
            }
            self.matmul_epi(a_ap, b_ap, c_ap, alpha, flags, epi);
        }
        self.finish_fused_target(target, o0)
    }

    /// After a MatMul that also computed its consumer's output `target`: that output is
    /// final (the node loop only finishes the MatMul's own outputs).
    pub(crate) fn finish_fused_target(&mut self, target: ValueId, o0: ValueId) -> Result<()> {
        if target != o0 {
            self.finish_value(target)?;
        }
        Ok(())
    }

    pub(crate) fn lower_gemm(&mut self, at: At<'a>) -> Result<()> {
        let At { g, n, o0, .. } = at;
        let alpha = n.attr_finite_f("alpha", 1.0)?;
        let beta = n.attr_finite_f("beta", 1.0)?;
        let ta = n.attr_i("transA", 0)? != 0;
        let tb = n.attr_i("transB", 0)? != 0;
        let (av, bv) = (n.inputs[0].expect("p"), n.inputs[1].expect("p"));
        let mut a = self.sview(av)?;
        // A packed weight is `[K, N]` whatever `transB` said of the stored one.
        let (mut b, tb, packed) = match self.pack_weight(bv, tb) {
            Some(v) => (v, false, matmul_flags::PACKED_B),
            None => match self.cast_weight(bv, tb) {
                Some(v) => (v, tb, 0),
                None => (self.sview(bv)?, tb, 0),
            },
        };
        if a.strides.iter().any(|&s| s < 0) {
            a = self.view(av)?;
        }
        if b.strides.iter().any(|&s| s < 0) {
            b = self.view(bv)?;
        }
        let cv = n.inputs.get(2).copied().flatten().filter(|_| beta != 0.0);
        let (m, nn) = (
            g.values[o0].shape[0],
            g.values[o0].shape.get(1).copied().unwrap_or(1),
        );
        let k = if ta { a.shape[0] } else { a.shape[1] };
        // C (scaled by beta: a constant's copy is scaled at compile time) and the adds and
        // activation that follow go into the MatMul's epilogue.
        let c_bias = match cv {
            Some(c) if k > 0 && m * nn > 0 && g.values[o0].dtype == DType::F32 => {
                if beta == 1.0 {
                    Some(self.sview(c)?)
                } else if let Some(t) = g.values[c].konst.as_deref() {
                    let scaled: Vec<f32> = t.to_f32s().iter().map(|v| v * beta).collect();
                    let addr = self.add_const(&HostTensor::f32(t.shape.clone(), scaled))?;
                    Some(View::dense(addr, DType::F32, &t.shape))
                } else {
                    None
                }
            }
            _ => None,
        };
        let ch = if k > 0 && m * nn > 0 && (c_bias.is_some() || cv.is_none()) {
            Some(self.epilogue_chain(o0, 2 - usize::from(c_bias.is_some())))
        } else {
            None
        };
        if c_bias.is_some() || ch.as_ref().is_some_and(|c| !c.nodes.is_empty()) {
            let ch = ch.expect("computed when C fuses or is absent");
            for &j in &ch.nodes {
                self.skip[j] = true;
            }
            let y = self.alloc_any(ch.out)?;
            let mut epilogue = Epilogue::NONE;
            if let Some((f, p, q)) = ch.act {
                epilogue.func = f;
                epilogue.act_alpha = p;
                epilogue.act_beta = q;
            }
            let mut adds = Vec::new();
            if let Some(b) = c_bias {
                adds.push(b);
            }
            for &x in &ch.addends {
                let v = self.sview(x)?;
                adds.push(if v.strides.iter().any(|&s| s < 0) {
                    self.view(x)?
                } else {
                    v
                });
            }
            for (i, v) in adds.iter().enumerate() {
                let v = v.broadcast(&y.shape);
                let ap = mk_ap(v.addr, v.dtype, &v.shape, &v.strides)?;
                if i == 0 {
                    epilogue.bias = Some(ap);
                } else {
                    epilogue.residual = Some(ap);
                }
            }
            let (a_ap, b_ap, c_ap) = (
                mk_ap(a.addr, a.dtype, &a.shape, &a.strides)?,
                mk_ap(b.addr, b.dtype, &b.shape, &b.strides)?,
                mk_ap(y.addr, y.dtype, &y.shape, &y.strides)?,
            );
            let mut flags = packed;
            if ta {
                flags |= matmul_flags::TRANSPOSE_A;
            }
            if tb {
                flags |= matmul_flags::TRANSPOSE_B;
            }
            self.matmul_epi(a_ap, b_ap, c_ap, alpha, flags, epilogue);
            return self.finish_fused_target(ch.out, o0);
        }
        let y = self.alloc_any(o0)?;
        let mut flags = packed;
        if let Some(cv) = cv {
            let cview = self.sview(cv)?.broadcast(&y.shape);
            if beta == 1.0 {
                self.copy(Engine::Dve, &cview, &y)?;
            } else {
                self.emit_nd(0, Engine::Dve, &[&cview, &y], |x| {
                    Op::TensorScalar(op::TensorScalar {
                        a: x[0],
                        out: x[1],
                        op: BinaryOp::Mul,
                        scalar: beta,
                        reverse: false,
                    })
                })?;
            }
            flags |= matmul_flags::ACCUMULATE;
        }
        if m * nn == 0 {
            return Ok(());
        }
        if k == 0 {
            if flags & matmul_flags::ACCUMULATE == 0 {
                self.fill(Engine::Dve, &y, 0.0)?;
            }
            return Ok(());
        }
        let a_ap = mk_ap(a.addr, a.dtype, &a.shape, &a.strides)?;
        let b_ap = mk_ap(b.addr, b.dtype, &b.shape, &b.strides)?;
        let c_ap = mk_ap(y.addr, y.dtype, &y.shape, &y.strides)?;
        if ta {
            flags |= matmul_flags::TRANSPOSE_A;
        }
        if tb {
            flags |= matmul_flags::TRANSPOSE_B;
        }
        self.matmul_aps(a_ap, b_ap, c_ap, alpha, flags);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{fold, fold1};
    use crate::tensor::HostTensor;

    #[test]
    fn a_2d_float_matmul_folds() {
        let a = HostTensor::f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let b = HostTensor::f32(vec![3, 2], vec![1., 0., 0., 1., 1., 1.]);
        let p = fold1("MatMul", 13, vec![a, b], vec![]);
        assert_eq!(p, HostTensor::f32(vec![2, 2], vec![4., 5., 10., 11.]));
    }

    /// Batched (3-D) products are computed on the device.
    #[test]
    fn other_ranks_stay_for_the_device() {
        let a = HostTensor::f32(vec![1, 2, 2], vec![1., 2., 3., 4.]);
        let p = fold("MatMul", 13, vec![Some(a.clone()), Some(a)], vec![], 1).unwrap();
        assert_eq!(p, vec![None]);
    }
}
