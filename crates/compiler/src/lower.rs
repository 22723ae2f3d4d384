//! Lowering: every node of the inferred graph becomes engine instructions, then memory is
//! planned, synchronization scheduled, and the model emitted.
//!
//! Values live in one of: their input's `MR_IO` buffer, an output's `MR_IO` buffer (the final
//! producer writes there directly, also through a chain of layout operators), a constant
//! (`MR_BUFFER`), or a temporary that the planner later places in the scratch arena. A
//! value's location is a strided view: layout operators (Reshape, Flatten, Squeeze,
//! Unsqueeze, Identity, Dropout, Transpose, Split, forward Slice) only describe their input
//! differently and never copy; a consumer that needs dense data copies a strided view once
//! (`Lowerer::view`). MatMul and the elementwise engines read any strides (attention head
//! splits and K transposes cost nothing); a producer whose only consumer is a Transpose
//! feeding something else writes the transposed layout directly, and one whose only consumer
//! is a Concat writes its part of the Concat's output. Elementwise results overwrite their
//! input in place when nothing else reads it. Operands are strided views; views of any rank
//! are merged to ≤ 4 dimensions where contiguous and looped over (several instructions)
//! where not.
//!
//! Engines: MatMul/Gemm/Conv/ConvTranspose on PE (Conv with its im2col scratch from the
//! arena; a following inference BatchNormalization folded into its weights); activations on
//! ACT (bias adds, including a Gemm's and a BatchNormalization's shift, fused with a
//! following activation into one pass in place; GELU decompositions recognized by `fuse`; a
//! scalar factor after a MatMul goes into its alpha); elementwise, select and casts on DVE;
//! reductions, pooling, softmax, layer-norm, resize, gather and layout copies on POOL; I/O
//! DMA on SP. Operators without an instruction of their own (LRN, ArgMax, CumSum, Mod, the
//! composite activations and reductions, group norms, 3-D and Lp pooling…) are sequences of
//! these. With `cores: 2`, MatMul and Conv split their N / output channels between the two
//! cores.

use crate::error::{CompileError, ErrorKind, Result};
use crate::eval::dense_strides;
use crate::fuse::{Fusion, find_activations};
use crate::graph::{Graph, ValueId};
use crate::params::{self, Ctx};
use crate::plan::{Interval, plan};
use crate::schedule::{IoInfo, for_each_ap_mut, schedule};
use crate::tensor::{HostTensor, f32_to_f16};
use crate::{CompileOptions, Compiled, PlanReport};
use nrt_hal::{DType, Engine};
use nrt_isa::{
    AccessPattern, ActFunc, BinaryOp, Instruction, Op, PoolOp, ReduceOp, Window, matmul_flags,
};
use nrt_model::{CompiledModel, ModelBuilder, split_vaddr, vaddr};
use std::collections::HashMap;

/// The window of one pooled dimension.
#[derive(Clone, Copy, Debug)]
struct PoolDim {
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
    pad_end: usize,
    /// End padding ceil mode adds (never counted in an average's divisor).
    ceil_extra: usize,
}

/// Plan-entry ids from here up name temporaries until the planner places them.
const TEMP_BASE: u32 = 1 << 20;

/// A strided view of a tensor: virtual address of element 0, element strides.
#[derive(Clone, Debug)]
struct View {
    addr: u64,
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<i64>,
}

impl View {
    fn dense(addr: u64, dtype: DType, shape: &[usize]) -> View {
        View {
            addr,
            dtype,
            shape: shape.to_vec(),
            strides: dense_strides(shape),
        }
    }

    fn elems(&self, n: i64) -> u64 {
        (self.addr as i64 + n * self.dtype.size() as i64) as u64
    }

    /// Right-aligned broadcast to `shape`.
    fn broadcast(&self, shape: &[usize]) -> View {
        let off = shape.len() - self.shape.len();
        let strides = (0..shape.len())
            .map(|i| {
                if i < off || self.shape[i - off] == 1 {
                    0
                } else {
                    self.strides[i - off]
                }
            })
            .collect();
        View {
            addr: self.addr,
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides,
        }
    }

    fn permute(&self, perm: &[usize]) -> View {
        View {
            addr: self.addr,
            dtype: self.dtype,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
        }
    }

    /// Whether the view is dense row-major (dimensions of size 1 aside).
    fn is_dense(&self) -> bool {
        let d = dense_strides(&self.shape);
        (0..self.shape.len()).all(|i| self.shape[i] <= 1 || self.strides[i] == d[i])
    }

    /// The same elements in row-major order as `shape`, without copying, when the strides
    /// allow it (dimensions that merge or split must be contiguous with each other).
    fn reshape(&self, shape: &[usize]) -> Option<View> {
        let total: usize = self.shape.iter().product();
        if shape.iter().product::<usize>() != total {
            return None;
        }
        if total == 0 || self.is_dense() {
            return Some(View::dense(self.addr, self.dtype, shape));
        }
        // Old dims without the 1s, then groups of old and new dims of equal products.
        let old: Vec<(usize, i64)> = (0..self.shape.len())
            .filter(|&i| self.shape[i] != 1)
            .map(|i| (self.shape[i], self.strides[i]))
            .collect();
        let mut strides = vec![0i64; shape.len()];
        let (mut oi, mut ni) = (0usize, 0usize);
        while ni < shape.len() || oi < old.len() {
            // Size-1 new dims take any stride.
            if ni < shape.len() && shape[ni] == 1 {
                strides[ni] = 0;
                ni += 1;
                continue;
            }
            if oi >= old.len() || ni >= shape.len() {
                return None;
            }
            let (o0, n0) = (oi, ni);
            let (mut po, mut pn) = (old[oi].0, shape[ni]);
            oi += 1;
            ni += 1;
            while po != pn {
                if po < pn {
                    po *= old.get(oi)?.0;
                    oi += 1;
                } else {
                    pn *= *shape.get(ni)?;
                    ni += 1;
                }
            }
            // The old dims of the group must be contiguous with each other.
            for k in o0..oi - 1 {
                if old[k].1 != old[k + 1].1 * old[k + 1].0 as i64 {
                    return None;
                }
            }
            let mut st = old[oi - 1].1;
            for k in (n0..ni).rev() {
                strides[k] = st;
                st *= shape[k] as i64;
            }
        }
        Some(View {
            addr: self.addr,
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides,
        })
    }

    /// Elements `start, start+step, …` (`len` of them) along `axis`.
    fn slice(&self, axis: usize, start: i64, len: usize, step: i64) -> View {
        let mut v = self.clone();
        v.addr = self.elems(start * self.strides[axis]);
        v.shape[axis] = len;
        v.strides[axis] = self.strides[axis] * step;
        v
    }
}

fn too_large(what: &str) -> CompileError {
    CompileError::new(
        ErrorKind::TooLarge,
        format!("{what} exceeds what an access pattern can address"),
    )
}

/// An access pattern from up to 4 dims (right-aligned).
fn mk_ap(addr: u64, dtype: DType, shape: &[usize], strides: &[i64]) -> Result<AccessPattern> {
    if shape.len() > 4 {
        return Err(CompileError::new(
            ErrorKind::Internal,
            "access pattern of rank > 4",
        ));
    }
    let mut s = [1u32; 4];
    let mut st = [0i32; 4];
    let off = 4 - shape.len();
    for i in 0..shape.len() {
        s[off + i] = u32::try_from(shape[i]).map_err(|_| too_large("a dimension"))?;
        st[off + i] = i32::try_from(strides[i]).map_err(|_| too_large("a stride"))?;
    }
    Ok(AccessPattern {
        addr,
        dtype,
        shape: s,
        stride: st,
    })
}

/// Merges and drops the dimensions of an iteration shared by several views (same shape,
/// own strides). Returns at most `max` dims (their size and each view's strides) and, for
/// the leading dims beyond `max`, each iteration's element offset per view.
type Simplified = (Vec<usize>, Vec<Vec<i64>>, Vec<Vec<i64>>);

fn simplify(shape: &[usize], strides: &[Vec<i64>], max: usize) -> Simplified {
    let nv = strides.len();
    if shape.contains(&0) {
        return (Vec::new(), vec![Vec::new(); nv], Vec::new());
    }
    let mut dims: Vec<(usize, Vec<i64>)> = Vec::new();
    for i in 0..shape.len() {
        if shape[i] == 1 {
            continue;
        }
        let st: Vec<i64> = strides.iter().map(|s| s[i]).collect();
        if let Some(last) = dims.last_mut()
            && (0..nv).all(|v| last.1[v] == st[v] * shape[i] as i64)
        {
            last.0 *= shape[i];
            last.1 = st;
            continue;
        }
        dims.push((shape[i], st));
    }
    let split = dims.len().saturating_sub(max);
    let (outer, inner) = dims.split_at(split);
    let mut offsets = vec![vec![0i64; nv]];
    for (size, st) in outer {
        let mut next = Vec::with_capacity(offsets.len() * size);
        for o in &offsets {
            for k in 0..*size as i64 {
                next.push((0..nv).map(|v| o[v] + k * st[v]).collect());
            }
        }
        offsets = next;
    }
    let shape_out = inner.iter().map(|d| d.0).collect();
    let strides_out = (0..nv)
        .map(|v| inner.iter().map(|d| d.1[v]).collect())
        .collect();
    (shape_out, strides_out, offsets)
}

fn fill_bits(dtype: DType, value: f64) -> u64 {
    let t = HostTensor::from_f64s(dtype, vec![1], std::iter::once(value));
    let b = t.to_bytes();
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(&b);
    if dtype == DType::F16 {
        return f32_to_f16(value as f32) as u64;
    }
    u64::from_le_bytes(w)
}

/// The activation a node computes on ACT: `(function, alpha, beta)`.
fn act_of(c: &Ctx) -> Result<Option<(ActFunc, f32, f32)>> {
    let n = c.n;
    Ok(Some(match n.op.as_str() {
        "Relu" => (ActFunc::Relu, 0.0, 0.0),
        "LeakyRelu" => (ActFunc::LeakyRelu, n.attr_f("alpha", 0.01)?, 0.0),
        "Sigmoid" => (ActFunc::Sigmoid, 0.0, 0.0),
        "HardSigmoid" => (
            ActFunc::HardSigmoid,
            n.attr_f("alpha", 0.2)?,
            n.attr_f("beta", 0.5)?,
        ),
        "Tanh" => (ActFunc::Tanh, 0.0, 0.0),
        "Gelu" => {
            if n.attr_s("approximate", "none")? == "tanh" {
                (ActFunc::GeluTanh, 0.0, 0.0)
            } else {
                (ActFunc::GeluErf, 0.0, 0.0)
            }
        }
        "Erf" => (ActFunc::Erf, 0.0, 0.0),
        "Exp" => (ActFunc::Exp, 0.0, 0.0),
        "Log" => (ActFunc::Log, 0.0, 0.0),
        "Sqrt" => (ActFunc::Sqrt, 0.0, 0.0),
        "Reciprocal" => (ActFunc::Reciprocal, 0.0, 0.0),
        "Abs" => (ActFunc::Abs, 0.0, 0.0),
        "Neg" => (ActFunc::Neg, 0.0, 0.0),
        "Floor" => (ActFunc::Floor, 0.0, 0.0),
        "Ceil" => (ActFunc::Ceil, 0.0, 0.0),
        "Softplus" => (ActFunc::Softplus, 0.0, 0.0),
        "Elu" => (ActFunc::Elu, n.attr_f("alpha", 1.0)?, 0.0),
        "Clip" => {
            let (lo, hi) = if c.opset() >= 11 {
                (
                    c.konst(1)
                        .map_or(f32::NEG_INFINITY, |t| t.get_f64(0) as f32),
                    c.konst(2).map_or(f32::INFINITY, |t| t.get_f64(0) as f32),
                )
            } else {
                (
                    n.attr_f("min", f32::NEG_INFINITY)?,
                    n.attr_f("max", f32::INFINITY)?,
                )
            };
            (ActFunc::Clip, lo, hi)
        }
        _ => return Ok(None),
    }))
}

/// BatchNormalization (inference) as a per-channel affine map: `(scale, shift)` with
/// `scale = gamma/√(var + eps)`, `shift = beta − mean·scale`.
fn bn_affine(c: &Ctx) -> Result<(Vec<f32>, Vec<f32>)> {
    let eps = c.n.attr_f("epsilon", 1e-5)?;
    let mut p = Vec::new();
    for i in 1..5 {
        p.push(
            c.konst(i)
                .ok_or_else(|| {
                    c.e(
                        ErrorKind::UnsupportedOp,
                        "BatchNormalization needs constant scale, bias, mean and variance",
                    )
                })?
                .to_f32s(),
        );
    }
    let ch = p[0].len();
    if p.iter().any(|v| v.len() != ch) {
        return Err(c.e(ErrorKind::ShapeMismatch, "parameters of different lengths"));
    }
    let scale: Vec<f32> = (0..ch).map(|i| p[0][i] / (p[3][i] + eps).sqrt()).collect();
    let shift: Vec<f32> = (0..ch).map(|i| p[1][i] - p[2][i] * scale[i]).collect();
    Ok((scale, shift))
}

struct Lowerer<'a> {
    g: &'a Graph,
    b: ModelBuilder,
    cores: u8,
    prog: Vec<(u8, Engine, Instruction)>,
    /// Where each computed value lives: a dense view of its own storage, or a strided view
    /// of another value's (layout operators only describe, never copy).
    loc: Vec<Option<View>>,
    /// Whether the value's storage is a temporary allocated for it (it may then be
    /// overwritten in place by its only consumer).
    owns: Vec<bool>,
    /// Dense copies of values whose view is strided, made for consumers that need them.
    dense_cache: HashMap<ValueId, View>,
    /// Activations recognized from decompositions (GELU), by the node that ends them.
    fused: HashMap<usize, Fusion>,
    temps: Vec<u64>,
    const_addr: HashMap<ValueId, u64>,
    io: Vec<IoInfo>,
    /// Output var_ids of each value.
    out_vars: HashMap<ValueId, Vec<u32>>,
    /// Live consumers of each value (nodes).
    consumers: Vec<Vec<usize>>,
    skip: Vec<bool>,
    lowered_nodes: usize,
}

impl<'a> Lowerer<'a> {
    fn emit(&mut self, core: u8, engine: Engine, op: Op) {
        self.prog.push((core, engine, Instruction::new(op)));
    }

    fn temp(&mut self, bytes: usize) -> u64 {
        let id = self.temps.len() as u32;
        self.temps.push(bytes as u64);
        vaddr(TEMP_BASE + id, 0)
    }

    fn add_const(&mut self, t: &HostTensor) -> u64 {
        let mr = self.b.constant(&t.to_bytes(), 64);
        vaddr(mr, 0)
    }

    /// Where value `v` lives: a strided view (constants are materialized on first use).
    fn sview(&mut self, v: ValueId) -> Result<View> {
        let val = &self.g.values[v];
        if let Some(k) = &val.konst {
            let (dtype, shape) = (val.dtype, val.shape.clone());
            let a = match self.const_addr.get(&v) {
                Some(&a) => a,
                None => {
                    let k = k.clone();
                    let a = self.add_const(&k);
                    self.const_addr.insert(v, a);
                    a
                }
            };
            return Ok(View::dense(a, dtype, &shape));
        }
        self.loc[v].clone().ok_or_else(|| {
            CompileError::new(
                ErrorKind::Internal,
                format!("value '{}' used before it was computed", val.name),
            )
        })
    }

    /// A dense row-major view of `v`: its storage, or (made once, then reused) a dense copy
    /// when `v` is a strided view of another value.
    fn view(&mut self, v: ValueId) -> Result<View> {
        let s = self.sview(v)?;
        if s.is_dense() {
            return Ok(View::dense(s.addr, s.dtype, &s.shape));
        }
        if let Some(d) = self.dense_cache.get(&v) {
            return Ok(d.clone());
        }
        let bytes = s.shape.iter().product::<usize>() * s.dtype.size();
        let d = View::dense(self.temp(bytes), s.dtype, &s.shape);
        self.copy(Engine::Pool, &s, &d)?;
        self.dense_cache.insert(v, d.clone());
        Ok(d)
    }

    /// The Concat that `v` is an input of (once) and the only reader of, with `v`'s offset
    /// along its axis: `(concat node, output, axis, offset)`.
    fn concat_of(&self, v: ValueId) -> Option<(usize, ValueId, usize, usize)> {
        let j = self.sole_consumer(v)?;
        let nj = &self.g.nodes[j];
        if nj.op != "Concat" || self.skip[j] {
            return None;
        }
        let ins: Vec<ValueId> = nj.inputs.iter().flatten().copied().collect();
        if ins.iter().filter(|&&i| i == v).count() != 1 {
            return None;
        }
        let t = nj.outputs.first().copied().flatten()?;
        let r = self.g.values[t].shape.len();
        let axis = nj.attr_i("axis", 1).ok()?;
        let axis = if axis < 0 { axis + r as i64 } else { axis };
        let axis = usize::try_from(axis).ok().filter(|&a| a < r)?;
        let at = ins
            .iter()
            .take_while(|&&i| i != v)
            .map(|&i| self.g.values[i].shape.get(axis).copied().unwrap_or(0))
            .sum();
        Some((j, t, axis, at))
    }

    /// `v`'s part of the output of the Concat that alone reads it (allocating that output
    /// on first use), so `v`'s producer writes it in place. `dense_only`: only when the part
    /// is dense (producers that write dense outputs only).
    fn concat_slot(&mut self, v: ValueId, dense_only: bool) -> Option<View> {
        let (_, t, axis, at) = self.concat_of(v)?;
        let len = self.g.values[v].shape.get(axis).copied()?;
        if dense_only {
            // Dense when every dim before the axis has size 1.
            let ts = &self.g.values[t].shape;
            if ts[..axis].iter().any(|&d| d > 1) {
                return None;
            }
        }
        let y = match self.loc[t].clone() {
            Some(y) => y,
            // (itself placed in an enclosing Concat when that part is dense)
            None => self.alloc(t),
        };
        let part = y.slice(axis, at as i64, len, 1);
        self.loc[v] = Some(part.clone());
        self.owns[v] = false;
        Some(part)
    }

    /// Dense storage for a value a node produces: its part of a Concat that alone reads it,
    /// an output buffer if the value is a graph output, else a temporary.
    fn alloc(&mut self, v: ValueId) -> View {
        if let Some(part) = self.concat_slot(v, true) {
            let val = &self.g.values[v];
            return View::dense(part.addr, val.dtype, &val.shape);
        }
        self.alloc_plain(v)
    }

    /// [`Self::alloc`] without the Concat placement.
    fn alloc_plain(&mut self, v: ValueId) -> View {
        let val = &self.g.values[v];
        // A value that only a chain of layout operators turns into a graph output is
        // stored in that output's buffer (the chain then copies nothing).
        let mut target = v;
        while !self.out_vars.contains_key(&target) {
            let Some(j) = self.sole_consumer(target) else {
                break;
            };
            let nj = &self.g.nodes[j];
            let layout = matches!(
                nj.op.as_str(),
                "Identity" | "Dropout" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze"
            );
            match nj.outputs.first().copied().flatten() {
                Some(o) if layout && !self.skip[j] => target = o,
                _ => break,
            }
        }
        let (addr, own) = match self.out_vars.get(&target) {
            Some(vars) => (vaddr(self.b.io_mem_ref(vars[0]), 0), false),
            None => (self.temp(val.bytes()), true),
        };
        let view = View::dense(addr, val.dtype, &val.shape);
        self.loc[v] = Some(view.clone());
        self.owns[v] = own;
        view
    }

    /// Storage for a value whose producer writes through any strided view. When the
    /// value's only consumer is a Transpose whose result is not read by MatMuls alone
    /// (they take strided operands as they are), the value is stored in the transposed
    /// layout: the Transpose is then free, and what follows it reads dense data.
    fn alloc_any(&mut self, v: ValueId) -> Result<View> {
        if let Some(part) = self.concat_slot(v, false) {
            return Ok(part);
        }
        if let Some(j) = self.sole_consumer(v)
            && self.g.nodes[j].op == "Transpose"
            && !self.skip[j]
        {
            let t = self.out(j, 0)?;
            let only_matmuls = !self.out_vars.contains_key(&t)
                && !self.consumers[t].is_empty()
                && self.consumers[t]
                    .iter()
                    .all(|&k| self.g.nodes[k].op == "MatMul");
            if !only_matmuls {
                let c = Ctx {
                    g: self.g,
                    n: &self.g.nodes[j],
                };
                let r = self.g.values[v].shape.len();
                let perm = params::transpose_perm(&c, r)?;
                let st = self.alloc(t);
                let mut strides = vec![0i64; r];
                for k in 0..r {
                    strides[perm[k]] = st.strides[k];
                }
                let view = View {
                    addr: st.addr,
                    dtype: st.dtype,
                    shape: self.g.values[v].shape.clone(),
                    strides,
                };
                self.loc[v] = Some(view.clone());
                return Ok(view);
            }
        }
        Ok(self.alloc(v))
    }

    /// `x`'s storage, for `out` to be written over it in place: `x` is a temporary
    /// allocated for it and not a graph output, only `readers` (the nodes being lowered)
    /// read it, `out` has its shape and type and is not a graph output.
    fn in_place(&mut self, x: ValueId, readers: &[usize], out: ValueId) -> Option<View> {
        if !self.owns[x]
            || self.out_vars.contains_key(&out)
            || self.out_vars.contains_key(&x)
            || !self.consumers[x].iter().all(|c| readers.contains(c))
            || self.concat_of(out).is_some()
        {
            // (An output a Concat alone reads goes straight into its part of the Concat.)
            return None;
        }
        let (xv, ov) = (&self.g.values[x], &self.g.values[out]);
        if xv.shape != ov.shape || xv.dtype != ov.dtype {
            return None;
        }
        let v = self.loc[x].clone()?;
        if !v.is_dense() {
            return None;
        }
        self.loc[out] = Some(v.clone());
        self.owns[out] = true;
        Some(v)
    }

    /// Output storage for an elementwise result of `x` (in place when [`Self::in_place`]
    /// allows, else [`Self::alloc_any`]).
    fn alloc_over(&mut self, x: ValueId, readers: &[usize], out: ValueId) -> Result<View> {
        match self.in_place(x, readers, out) {
            Some(v) => Ok(v),
            None => self.alloc_any(out),
        }
    }

    /// Makes `o` the view `x` (no copy), or copies `x` into `o`'s output buffer when `o`
    /// is a graph output.
    fn alias_or_copy(&mut self, o: ValueId, x: View) -> Result<()> {
        if self.out_vars.contains_key(&o) {
            let y = self.alloc(o);
            if !(x.addr == y.addr && x.is_dense()) {
                self.copy(Engine::Pool, &x, &y)?;
            }
        } else {
            self.loc[o] = Some(x);
            self.owns[o] = false;
        }
        Ok(())
    }

    /// After `v` is final: copies it into any output buffer it is not already in, then
    /// stores and notifies those outputs.
    fn finish_value(&mut self, v: ValueId) -> Result<()> {
        let Some(vars) = self.out_vars.get(&v).cloned() else {
            return Ok(());
        };
        let src = self.sview(v)?;
        for j in vars {
            let dst_addr = vaddr(self.b.io_mem_ref(j), 0);
            if src.addr != dst_addr || !src.is_dense() {
                let dst = View::dense(dst_addr, src.dtype, &src.shape);
                self.copy(Engine::Dve, &src, &dst)?;
            }
            let table = self.b.io_descriptor(j);
            self.emit(0, Engine::Sp, Op::DmaDescriptors { table, count: 1 });
            self.emit(
                0,
                Engine::Sp,
                Op::Notify {
                    subtype: 6,
                    sub_id: 7,
                    payload: j,
                },
            );
        }
        Ok(())
    }

    /// Emits `f` over views of one shared shape, merging and looping dimensions.
    fn emit_nd(
        &mut self,
        core: u8,
        engine: Engine,
        views: &[&View],
        f: impl Fn(&[AccessPattern]) -> Op,
    ) -> Result<()> {
        let owned: Vec<View> = views.iter().map(|v| (*v).clone()).collect();
        self.emit_nd_dyn(core, engine, &owned, &f)
    }

    fn emit_nd_dyn(
        &mut self,
        core: u8,
        engine: Engine,
        views: &[View],
        f: &dyn Fn(&[AccessPattern]) -> Op,
    ) -> Result<()> {
        let shape = &views[0].shape;
        // The container validates access patterns before relocation (address 0), so a
        // negative stride cannot be encoded: walk such dimensions one index at a time.
        if let Some(d) =
            (0..shape.len()).find(|&d| shape[d] > 1 && views.iter().any(|v| v.strides[d] < 0))
        {
            for k in 0..shape[d] as i64 {
                let sub: Vec<View> = views.iter().map(|v| v.slice(d, k, 1, 1)).collect();
                self.emit_nd_dyn(core, engine, &sub, f)?;
            }
            return Ok(());
        }
        let strides: Vec<Vec<i64>> = views.iter().map(|v| v.strides.clone()).collect();
        let (s, st, offs) = simplify(shape, &strides, 4);
        for o in offs {
            let aps = views
                .iter()
                .enumerate()
                .map(|(i, v)| mk_ap(v.elems(o[i]), v.dtype, &s, &st[i]))
                .collect::<Result<Vec<_>>>()?;
            self.emit(core, engine, f(&aps));
        }
        Ok(())
    }

    fn copy(&mut self, engine: Engine, src: &View, dst: &View) -> Result<()> {
        self.emit_nd(0, engine, &[src, dst], |a| Op::Copy {
            input: a[0],
            output: a[1],
        })
    }

    fn fill(&mut self, engine: Engine, dst: &View, value: f64) -> Result<()> {
        let bits = fill_bits(dst.dtype, value);
        self.emit_nd(0, engine, &[dst], |a| Op::Fill { out: a[0], bits })
    }

    fn activation(
        &mut self,
        x: &View,
        y: &View,
        bias: Option<&View>,
        (func, alpha, beta): (ActFunc, f32, f32),
        scale: f32,
    ) -> Result<()> {
        let mut views = vec![x, y];
        if let Some(b) = bias {
            views.push(b);
        }
        self.emit_nd(0, Engine::Act, &views, |a| Op::Activation {
            input: a[0],
            output: a[1],
            bias: a.get(2).copied(),
            func,
            scale,
            alpha,
            beta,
        })
    }

    /// The single live consumer of `v`, if `v` has exactly one and is not a graph output.
    fn sole_consumer(&self, v: ValueId) -> Option<usize> {
        if self.out_vars.contains_key(&v) || self.consumers[v].len() != 1 {
            return None;
        }
        Some(self.consumers[v][0])
    }

    fn out(&self, ni: usize, k: usize) -> Result<ValueId> {
        self.g.nodes[ni]
            .outputs
            .get(k)
            .copied()
            .flatten()
            .ok_or_else(|| CompileError::new(ErrorKind::Internal, "missing output"))
    }

    fn lower_node(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let op = n.op.as_str();
        let o0 = self.out(ni, 0)?;
        let oshape = g.values[o0].shape.clone();
        let odt = g.values[o0].dtype;
        if let Some(f) = self.fused.get(&ni).cloned() {
            // The end of a recognized activation: one ACT pass (in place when it can be).
            let x = self.sview(f.x)?;
            let bias = match f.bias {
                Some(b) => Some(self.sview(b)?.broadcast(&oshape)),
                None => None,
            };
            let y = self.alloc_over(f.x, &f.nodes, o0)?;
            return self.activation(&x, &y, bias.as_ref(), (f.func, 0.0, 0.0), 1.0);
        }
        match op {
            "Identity" | "Dropout" | "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
                // Views of the input's storage; a copy only when the input is a strided view
                // the new shape cannot describe.
                let xi = n.inputs[0].expect("present");
                let x = self.sview(xi)?;
                let v = match x.reshape(&oshape) {
                    Some(v) => v,
                    None => self
                        .view(xi)?
                        .reshape(&oshape)
                        .ok_or_else(|| c.e(ErrorKind::Internal, "dense reshape failed"))?,
                };
                self.alias_or_copy(o0, v)?;
            }
            "Cast" | "CastLike" => {
                let src = self.view(n.inputs[0].expect("present"))?;
                let dst = self.alloc(o0);
                self.copy(Engine::Dve, &src, &dst)?;
            }
            "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Sum" | "Equal" | "Less"
            | "Greater" | "GreaterOrEqual" | "LessOrEqual" | "And" | "Or" => {
                self.lower_binary(ni)?
            }
            "Where" => {
                let cond = self.view(n.inputs[0].expect("p"))?.broadcast(&oshape);
                let a = self.view(n.inputs[1].expect("p"))?.broadcast(&oshape);
                let b = self.view(n.inputs[2].expect("p"))?.broadcast(&oshape);
                let y = self.alloc(o0);
                self.emit_nd(0, Engine::Dve, &[&cond, &a, &b, &y], |x| Op::Select {
                    cond: x[0],
                    a: x[1],
                    b: x[2],
                    out: x[3],
                })?;
            }
            "Not" => {
                let x = self.view(n.inputs[0].expect("p"))?;
                let f = self.add_const(&HostTensor::ints(DType::Bool, vec![1], vec![0]));
                let t = self.add_const(&HostTensor::ints(DType::Bool, vec![1], vec![1]));
                let fv = View::dense(f, DType::Bool, &[1]).broadcast(&oshape);
                let tv = View::dense(t, DType::Bool, &[1]).broadcast(&oshape);
                let y = self.alloc(o0);
                self.emit_nd(0, Engine::Dve, &[&x, &fv, &tv, &y], |a| Op::Select {
                    cond: a[0],
                    a: a[1],
                    b: a[2],
                    out: a[3],
                })?;
            }
            "MatMul" => self.lower_matmul(ni)?,
            "Gemm" => self.lower_gemm(ni)?,
            "Softmax" | "LogSoftmax" => {
                let xv = c.input(0)?;
                let x = self.view(n.inputs[0].expect("p"))?;
                let y = self.alloc(o0);
                let r = xv.shape.len();
                let axis =
                    c.norm_axis(n.attr_i("axis", if c.opset() >= 13 { -1 } else { 1 })?, r)?;
                let outer: usize = xv.shape[..axis].iter().product();
                let (a, inner) = if c.opset() >= 13 {
                    (
                        xv.shape[axis],
                        xv.shape[axis + 1..].iter().product::<usize>(),
                    )
                } else {
                    (xv.shape[axis..].iter().product(), 1)
                };
                let sh = [outer, inner, a];
                let st = [(a * inner) as i64, 1, inner as i64];
                let log = op == "LogSoftmax";
                let xa = View {
                    shape: sh.to_vec(),
                    strides: st.to_vec(),
                    ..x
                };
                let ya = View {
                    shape: sh.to_vec(),
                    strides: st.to_vec(),
                    ..y
                };
                self.row_op(&xa, &ya, |i, o| Op::Softmax {
                    input: i,
                    output: o,
                    log,
                })?;
            }
            "LayerNormalization" => {
                let xv = c.input(0)?;
                let r = xv.shape.len();
                let axis = c.norm_axis(n.attr_i("axis", -1)?, r)?;
                let eps = n.attr_f("epsilon", 1e-5)?;
                let outer: usize = xv.shape[..axis].iter().product();
                let d: usize = xv.shape[axis..].iter().product();
                let x = self.view(n.inputs[0].expect("p"))?;
                let gamma = self.view(n.inputs[1].expect("p"))?;
                let beta = match n.inputs.get(2).copied().flatten() {
                    Some(b) => Some(self.view(b)?),
                    None => None,
                };
                let y = self.alloc(o0);
                let sh = [outer, d];
                let row = |v: &View, bcast: bool| View {
                    shape: sh.to_vec(),
                    strides: if bcast { vec![0, 1] } else { vec![d as i64, 1] },
                    ..v.clone()
                };
                let (xa, ya, ga) = (row(&x, false), row(&y, false), row(&gamma, true));
                let ba = beta.as_ref().map(|b| row(b, true));
                // One instruction over [rows, d] (not emit_nd: dims of size 1 would be
                // dropped, a normalized axis of size 1 with them).
                if outer * d > 0 {
                    let ap = |v: &View| mk_ap(v.addr, v.dtype, &v.shape, &v.strides);
                    let op = Op::LayerNorm {
                        input: ap(&xa)?,
                        gamma: ap(&ga)?,
                        beta: ba.as_ref().map(ap).transpose()?,
                        output: ap(&ya)?,
                        eps,
                    };
                    self.emit(0, Engine::Pool, op);
                }
                // Optional outputs: Mean and InvStdDev over the normalized axes.
                let mean_out = n.outputs.get(1).copied().flatten();
                let inv_out = n.outputs.get(2).copied().flatten();
                if (mean_out.is_some() || inv_out.is_some()) && outer * d > 0 {
                    let stat = |l: &mut Self, v: Option<ValueId>| match v {
                        Some(v) => l.alloc(v).addr,
                        None => l.temp(outer * 4),
                    };
                    let mean = stat(self, mean_out);
                    let col = |addr: u64| View {
                        addr,
                        dtype: DType::F32,
                        shape: vec![outer, 1],
                        strides: vec![1, 1],
                    };
                    let mean_v = col(mean);
                    self.emit(
                        0,
                        Engine::Pool,
                        Op::Reduce {
                            input: mk_ap(x.addr, x.dtype, &sh, &[d as i64, 1])?,
                            output: mk_ap(mean, DType::F32, &[outer, 1], &[1, 1])?,
                            op: ReduceOp::Mean,
                            axes: 0b1000,
                        },
                    );
                    if inv_out.is_some() {
                        let centered = View::dense(self.temp(outer * d * 4), DType::F32, &sh);
                        let mb = View {
                            strides: vec![1, 0],
                            shape: sh.to_vec(),
                            ..mean_v.clone()
                        };
                        self.emit_nd(0, Engine::Dve, &[&xa, &mb, &centered], |a| Op::Binary {
                            a: a[0],
                            b: a[1],
                            out: a[2],
                            op: BinaryOp::Sub,
                        })?;
                        self.activation(
                            &centered,
                            &centered,
                            None,
                            (ActFunc::Square, 0.0, 0.0),
                            1.0,
                        )?;
                        let inv = stat(self, inv_out);
                        let var = col(self.temp(outer * 4));
                        self.emit(
                            0,
                            Engine::Pool,
                            Op::Reduce {
                                input: mk_ap(centered.addr, DType::F32, &sh, &[d as i64, 1])?,
                                output: mk_ap(var.addr, DType::F32, &[outer, 1], &[1, 1])?,
                                op: ReduceOp::Mean,
                                axes: 0b1000,
                            },
                        );
                        self.emit_nd(0, Engine::Dve, &[&var, &var], |a| Op::TensorScalar {
                            a: a[0],
                            out: a[1],
                            op: BinaryOp::Add,
                            scalar: eps,
                            reverse: false,
                        })?;
                        self.activation(&var, &col(inv), None, (ActFunc::Rsqrt, 0.0, 0.0), 1.0)?;
                    }
                }
            }
            "BatchNormalization" => {
                // y = x·scale[c] + shift[c]: the per-channel product on DVE, then the shift
                // (and a following activation) as one ACT pass in place.
                let (scale, shift) = bn_affine(&c)?;
                let ch = scale.len();
                let sa = self.add_const(&HostTensor::f32(vec![ch], scale));
                let sb = self.add_const(&HostTensor::f32(vec![ch], shift));
                let xi = n.inputs[0].expect("p");
                let x = self.sview(xi)?;
                let mut cs = vec![0i64; oshape.len()];
                cs[1] = 1;
                let av = View {
                    addr: sa,
                    dtype: DType::F32,
                    shape: oshape.clone(),
                    strides: cs.clone(),
                };
                let bv = View {
                    addr: sb,
                    dtype: DType::F32,
                    shape: oshape.clone(),
                    strides: cs,
                };
                let act = self.sole_consumer(o0).and_then(|j| {
                    let cj = Ctx { g, n: &g.nodes[j] };
                    act_of(&cj).ok().flatten().map(|f| (j, f))
                });
                let y = self.alloc_over(xi, &[ni], o0)?;
                self.emit_nd(0, Engine::Dve, &[&x, &av, &y], |a| Op::Binary {
                    a: a[0],
                    b: a[1],
                    out: a[2],
                    op: BinaryOp::Mul,
                })?;
                match act {
                    Some((j, f)) => {
                        let oj = self.out(j, 0)?;
                        let z = self.alloc_over(o0, &[j], oj)?;
                        self.activation(&y, &z, Some(&bv), f, 1.0)?;
                        self.skip[j] = true;
                        self.finish_value(oj)?;
                    }
                    None => {
                        self.activation(&y, &y, Some(&bv), (ActFunc::Identity, 0.0, 0.0), 1.0)?
                    }
                }
            }
            "Selu" | "Celu" | "HardSwish" | "Softsign" | "ThresholdedRelu" | "Shrink" | "Sign"
            | "Swish" | "Mish" | "PRelu" => self.lower_composite_activation(ni)?,
            "RMSNormalization" => self.lower_rms_norm(ni)?,
            "InstanceNormalization" | "GroupNormalization" => self.lower_group_norm(ni)?,
            "Mean" => {
                self.lower_binary(ni)?;
                let y = self.sview(o0)?;
                let k = n.inputs.iter().flatten().count() as f32;
                self.emit_nd(0, Engine::Dve, &[&y, &y], |a| Op::TensorScalar {
                    a: a[0],
                    out: a[1],
                    op: BinaryOp::Mul,
                    scalar: 1.0 / k,
                    reverse: false,
                })?;
            }
            "Tile" => {
                // Each dim d becomes [repeats, d] of a broadcast view: one copy.
                let x = self.sview(n.inputs[0].expect("p"))?;
                let y = self.alloc(o0);
                let reps = c.const_ints(1, "repeats")?.unwrap_or_default();
                let (mut sh, mut st) = (Vec::new(), Vec::new());
                for (i, &r) in reps.iter().enumerate() {
                    sh.extend([r as usize, x.shape[i]]);
                    st.extend([0, x.strides[i]]);
                }
                let src = View {
                    shape: sh.clone(),
                    strides: st,
                    ..x
                };
                self.copy(Engine::Pool, &src, &View::dense(y.addr, y.dtype, &sh))?;
            }
            "DepthToSpace" | "SpaceToDepth" => {
                // A 6-D permutation of the input, copied once.
                let x = self.view(n.inputs[0].expect("p"))?;
                let y = self.alloc(o0);
                let b = n.attr_i("blocksize", 1)? as usize;
                let [nn, ch, h, w] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
                let (split, perm): (Vec<usize>, [usize; 6]) = if op == "SpaceToDepth" {
                    (vec![nn, ch, h / b, b, w / b, b], [0, 3, 5, 1, 2, 4])
                } else if n.attr_s("mode", "DCR")? == "CRD" {
                    (vec![nn, ch / (b * b), b, b, h, w], [0, 1, 4, 2, 5, 3])
                } else {
                    (vec![nn, b, b, ch / (b * b), h, w], [0, 3, 4, 1, 5, 2])
                };
                let src = View::dense(x.addr, x.dtype, &split).permute(&perm);
                let dst = View::dense(y.addr, y.dtype, &src.shape);
                self.copy(Engine::Pool, &src, &dst)?;
            }
            "CumSum" => self.lower_cumsum(ni)?,
            "Mod" => self.lower_mod(ni)?,
            "ArgMax" | "ArgMin" => self.lower_arg_reduce(ni)?,
            "Hardmax" => self.lower_hardmax(ni)?,
            "Trilu" => {
                // Select through a constant triangular mask (broadcast over the batch).
                let xv = c.input(0)?;
                let r = xv.shape.len();
                let (rows, cols) = (xv.shape[r - 2], xv.shape[r - 1]);
                let k = c.const_ints(1, "k")?.map_or(0, |v| v[0]);
                let upper = n.attr_i("upper", 1)? != 0;
                let mask: Vec<i64> = (0..rows * cols)
                    .map(|e| {
                        let d = (e % cols) as i64 - (e / cols) as i64;
                        i64::from(if upper { d >= k } else { d <= k })
                    })
                    .collect();
                let m = self.add_const(&HostTensor::ints(DType::Bool, vec![rows, cols], mask));
                let mv = View::dense(m, DType::Bool, &[rows, cols]).broadcast(&oshape);
                let zero = HostTensor::from_f64s(odt, vec![1], std::iter::once(0.0));
                let z = self.add_const(&zero);
                let zv = View::dense(z, odt, &[1]).broadcast(&oshape);
                let x = self.sview(n.inputs[0].expect("p"))?;
                let y = self.alloc_any(o0)?;
                self.emit_nd(0, Engine::Dve, &[&mv, &x, &zv, &y], |a| Op::Select {
                    cond: a[0],
                    a: a[1],
                    b: a[2],
                    out: a[3],
                })?;
            }
            "LRN" => self.lower_lrn(ni)?,
            "Conv" => self.lower_conv(ni)?,
            "ConvTranspose" => self.lower_conv_transpose(ni)?,
            "MaxPool" | "AveragePool" | "LpPool" => self.lower_pool(ni)?,
            "GlobalAveragePool" | "GlobalMaxPool" => {
                let xv = c.input(0)?;
                let x = self.view(n.inputs[0].expect("p"))?;
                let y = self.alloc(o0);
                let (nn, ch) = (xv.shape[0], xv.shape[1]);
                let s: usize = xv.shape[2..].iter().product();
                let rop = if op == "GlobalMaxPool" {
                    ReduceOp::Max
                } else {
                    ReduceOp::Mean
                };
                let xa = mk_ap(
                    x.addr,
                    x.dtype,
                    &[nn, ch, s],
                    &[(ch * s) as i64, s as i64, 1],
                )?;
                let ya = mk_ap(y.addr, y.dtype, &[nn, ch, 1], &[ch as i64, 1, 1])?;
                if nn * ch * s > 0 {
                    self.emit(
                        0,
                        Engine::Pool,
                        Op::Reduce {
                            input: xa,
                            output: ya,
                            op: rop,
                            axes: 0b1000,
                        },
                    );
                }
            }
            "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2"
            | "ReduceSumSquare" | "ReduceLogSum" | "ReduceLogSumExp" => self.lower_reduce(ni)?,
            "Transpose" => {
                // A permuted view; consumers that need dense data copy it (once).
                let xv = c.input(0)?;
                let perm = params::transpose_perm(&c, xv.shape.len())?;
                let x = self.sview(n.inputs[0].expect("p"))?.permute(&perm);
                let stored = self.loc[o0]
                    .as_ref()
                    .is_some_and(|y| y.addr == x.addr && x.is_dense());
                if !stored {
                    // (else the producer already wrote the transposed layout: alloc_any)
                    self.alias_or_copy(o0, x)?;
                }
            }
            "Concat" => {
                // Inputs whose producers wrote their part in place (`concat_slot`) are
                // already there; the others are copied.
                let axis = c.norm_axis(n.attr_i("axis", 1)?, oshape.len())?;
                let y = match self.loc[o0].clone() {
                    Some(y) => y,
                    None => self.alloc(o0),
                };
                let mut at = 0usize;
                for i in 0..n.inputs.len() {
                    let Some(v) = n.inputs[i] else { continue };
                    let x = self.sview(v)?;
                    let len = x.shape[axis];
                    let dst = y.slice(axis, at as i64, len, 1);
                    let placed = x.addr == dst.addr
                        && (0..x.shape.len())
                            .all(|d| x.shape[d] <= 1 || x.strides[d] == dst.strides[d]);
                    if !placed {
                        self.copy(Engine::Pool, &x, &dst)?;
                    }
                    at += len;
                }
            }
            "Split" => {
                let xv = c.input(0)?;
                let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
                let sizes = params::split_sizes(&c, xv.shape[axis])?;
                // Views of the input (copied only into graph outputs).
                let x = self.sview(n.inputs[0].expect("p"))?;
                let mut at = 0usize;
                for (k, &len) in sizes.iter().enumerate() {
                    if let Some(Some(ov)) = n.outputs.get(k).copied() {
                        self.alias_or_copy(ov, x.slice(axis, at as i64, len, 1))?;
                    }
                    at += len;
                }
            }
            "Slice" => {
                let xv = c.input(0)?;
                let p = params::slice_params(&c, &xv.shape)?;
                let mut x = self.sview(n.inputs[0].expect("p"))?;
                for (axis, &(start, len, step)) in p.iter().enumerate() {
                    x = x.slice(axis, start, len, step);
                }
                if x.strides.iter().all(|&s| s >= 0) {
                    // A view (a reversed one would make its readers walk it index by index).
                    self.alias_or_copy(o0, x)?;
                } else {
                    let y = self.alloc(o0);
                    self.copy(Engine::Pool, &x, &y)?;
                }
            }
            "Gather" => {
                let xv = c.input(0)?;
                let iv = c.input(1)?;
                let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
                let x = self.view(n.inputs[0].expect("p"))?;
                let idx = self.view(n.inputs[1].expect("p"))?;
                let y = self.alloc(o0);
                let outer: usize = xv.shape[..axis].iter().product();
                let a = xv.shape[axis];
                let inner: usize = xv.shape[axis + 1..].iter().product();
                let ni_ = iv.elements();
                if outer * inner * ni_ > 0 {
                    let data = mk_ap(
                        x.addr,
                        x.dtype,
                        &[outer, a, inner],
                        &[(a * inner) as i64, inner as i64, 1],
                    )?;
                    let ind = mk_ap(idx.addr, idx.dtype, &[ni_], &[1])?;
                    let out = mk_ap(
                        y.addr,
                        y.dtype,
                        &[outer, ni_, inner],
                        &[(ni_ * inner) as i64, inner as i64, 1],
                    )?;
                    self.emit(
                        0,
                        Engine::Pool,
                        Op::Gather {
                            data,
                            indices: ind,
                            output: out,
                        },
                    );
                }
            }
            "Expand" => {
                let x = self.view(n.inputs[0].expect("p"))?.broadcast(&oshape);
                let y = self.alloc(o0);
                self.copy(Engine::Pool, &x, &y)?;
            }
            "Pad" => self.lower_pad(ni)?,
            "Resize" => {
                let xv = c.input(0)?;
                if xv.shape.len() > 4 {
                    return Err(c.e(ErrorKind::UnsupportedOp, "Resize of rank > 4"));
                }
                let p = params::resize_params(&c, &xv.shape)?;
                let x = self.view(n.inputs[0].expect("p"))?;
                let y = self.alloc(o0);
                let mut scales = [0f32; 4];
                let off = 4 - xv.shape.len();
                for (i, &s) in p.scales.iter().enumerate() {
                    scales[off + i] = s;
                }
                let xa = mk_ap(x.addr, x.dtype, &x.shape, &x.strides)?;
                let ya = mk_ap(y.addr, y.dtype, &y.shape, &y.strides)?;
                self.emit(
                    0,
                    Engine::Pool,
                    Op::Resize {
                        input: xa,
                        output: ya,
                        mode: p.mode,
                        coord: p.coord,
                        nearest: p.nearest,
                        scales,
                    },
                );
            }
            _ => {
                if let Some(f) = act_of(&c)? {
                    let xi = n.inputs[0].expect("p");
                    let x = self.sview(xi)?;
                    let y = self.alloc_over(xi, &[ni], o0)?;
                    self.activation(&x, &y, None, f, 1.0)?;
                } else {
                    return Err(c.e(
                        ErrorKind::UnsupportedOp,
                        format!(
                            "operator '{op}' cannot be computed on the device here (dtype {odt})"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// A row operation (softmax) over `[outer, inner, axis]` views: dim 3 is the axis.
    fn row_op(
        &mut self,
        x: &View,
        y: &View,
        f: impl Fn(AccessPattern, AccessPattern) -> Op,
    ) -> Result<()> {
        // Loop the outer dims beyond what fits in AP dims 0..3.
        let (s, st, offs) = simplify(
            &x.shape[..2],
            &[x.strides[..2].to_vec(), y.strides[..2].to_vec()],
            2,
        );
        if x.shape.contains(&0) {
            return Ok(());
        }
        let a = x.shape[2];
        for o in offs {
            let mut sh = s.clone();
            sh.push(a);
            let mut sx = st[0].clone();
            sx.push(x.strides[2]);
            let mut sy = st[1].clone();
            sy.push(y.strides[2]);
            let xa = mk_ap(x.elems(o[0]), x.dtype, &sh, &sx)?;
            let ya = mk_ap(y.elems(o[1]), y.dtype, &sh, &sy)?;
            self.emit(0, Engine::Pool, f(xa, ya));
        }
        Ok(())
    }

    fn lower_binary(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let op = n.op.as_str();
        let o0 = self.out(ni, 0)?;
        let oshape = g.values[o0].shape.clone();
        let bop = match op {
            "Add" | "Sum" | "Mean" => BinaryOp::Add,
            "Sub" => BinaryOp::Sub,
            "Mul" => BinaryOp::Mul,
            "Div" => BinaryOp::Div,
            "Pow" => BinaryOp::Pow,
            "Max" => BinaryOp::Max,
            "Min" => BinaryOp::Min,
            "Equal" => BinaryOp::Equal,
            "Greater" | "GreaterOrEqual" => BinaryOp::Greater,
            "Less" | "LessOrEqual" => BinaryOp::Less,
            "And" => BinaryOp::And,
            _ => BinaryOp::Or,
        };
        // a ≥ b is (a > b) ∨ (a = b): false with a NaN, like the operator.
        let or_equal = matches!(op, "GreaterOrEqual" | "LessOrEqual");
        let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
        // Types the DVE does not compute go through a wider one and back.
        let wide = |d: DType| match d {
            DType::F32 | DType::I32 | DType::I64 | DType::Bool => d,
            DType::F16 | DType::Bf16 => DType::F32,
            _ => DType::I64,
        };
        let cd = if bop == BinaryOp::Pow {
            DType::F32
        } else {
            wide(g.values[ins[0]].dtype)
        };
        let odt = g.values[o0].dtype;
        if ins.iter().any(|&v| g.values[v].dtype != cd) || (odt != cd && odt != DType::Bool) {
            let mut views = Vec::new();
            for &v in &ins {
                let x = self.view(v)?;
                if x.dtype == cd {
                    views.push(x.broadcast(&oshape));
                } else {
                    let t = View::dense(
                        self.temp(x.shape.iter().product::<usize>() * cd.size()),
                        cd,
                        &x.shape,
                    );
                    self.copy(Engine::Dve, &x, &t)?;
                    views.push(t.broadcast(&oshape));
                }
            }
            let rdt = if bop.is_comparison() { DType::Bool } else { cd };
            let y = self.alloc(o0);
            let acc = if rdt == odt {
                y.clone()
            } else {
                View::dense(
                    self.temp(y.shape.iter().product::<usize>() * rdt.size()),
                    rdt,
                    &oshape,
                )
            };
            self.emit_nd(0, Engine::Dve, &[&views[0], &views[1], &acc], |a| {
                Op::Binary {
                    a: a[0],
                    b: a[1],
                    out: a[2],
                    op: bop,
                }
            })?;
            if or_equal {
                self.or_equal(&views[0], &views[1], &acc)?;
            }
            for v in &views[2..] {
                self.emit_nd(0, Engine::Dve, &[&acc, v, &acc], |a| Op::Binary {
                    a: a[0],
                    b: a[1],
                    out: a[2],
                    op: bop,
                })?;
            }
            if rdt != odt {
                self.copy(Engine::Dve, &acc, &y)?;
            }
            return Ok(());
        }
        if ins.len() == 1 {
            let x = self.view(ins[0])?;
            let y = self.alloc(o0);
            return self.copy(Engine::Dve, &x.broadcast(&oshape), &y);
        }
        if ins.len() == 2
            && g.values[ins[0]].dtype == DType::F32
            && g.values[o0].dtype == DType::F32
        {
            // One side a compile-time scalar: TensorScalar (or an activation).
            for (k, other) in [(1usize, 0usize), (0, 1)] {
                let kv = &g.values[ins[k]];
                let Some(t) = kv.konst.as_deref() else {
                    continue;
                };
                if t.len() != 1 || g.values[ins[other]].shape != oshape {
                    continue;
                }
                let s = t.get_f64(0) as f32;
                let x = self.sview(ins[other])?;
                if bop == BinaryOp::Pow && k == 1 {
                    // Small integer and half powers without `powf`.
                    let f = match s {
                        1.0 => Some(ActFunc::Identity),
                        2.0 | 3.0 | 4.0 => Some(ActFunc::Square),
                        0.5 => Some(ActFunc::Sqrt),
                        -0.5 => Some(ActFunc::Rsqrt),
                        -1.0 => Some(ActFunc::Reciprocal),
                        _ => None,
                    };
                    if let Some(f) = f {
                        if s == 3.0 {
                            // x² then x²·x (not in place: x is read again).
                            let y = self.alloc_any(o0)?;
                            self.activation(&x, &y, None, (f, 0.0, 0.0), 1.0)?;
                            return self.emit_nd(0, Engine::Dve, &[&y, &x, &y], |a| Op::Binary {
                                a: a[0],
                                b: a[1],
                                out: a[2],
                                op: BinaryOp::Mul,
                            });
                        }
                        let y = self.alloc_over(ins[other], &[ni], o0)?;
                        self.activation(&x, &y, None, (f, 0.0, 0.0), 1.0)?;
                        if s == 4.0 {
                            self.activation(&y, &y, None, (f, 0.0, 0.0), 1.0)?;
                        }
                        return Ok(());
                    }
                }
                if matches!(bop, BinaryOp::Equal | BinaryOp::Less | BinaryOp::Greater) {
                    break;
                }
                let y = self.alloc_over(ins[other], &[ni], o0)?;
                return self.emit_nd(0, Engine::Dve, &[&x, &y], |a| Op::TensorScalar {
                    a: a[0],
                    out: a[1],
                    op: bop,
                    scalar: s,
                    reverse: k == 0,
                });
            }
            // Bias add on ACT, fused with a following activation when possible.
            if bop == BinaryOp::Add {
                for (k, other) in [(1usize, 0usize), (0, 1)] {
                    if g.values[ins[k]].konst.is_none() || g.values[ins[other]].shape != oshape {
                        continue;
                    }
                    let x = self.sview(ins[other])?;
                    let bias = self.sview(ins[k])?.broadcast(&oshape);
                    let fused = self.sole_consumer(o0).and_then(|j| {
                        let cj = Ctx { g, n: &g.nodes[j] };
                        act_of(&cj).ok().flatten().map(|f| (j, f))
                    });
                    if let Some((j, f)) = fused {
                        let oj = self.out(j, 0)?;
                        let y = self.alloc_over(ins[other], &[ni], oj)?;
                        self.activation(&x, &y, Some(&bias), f, 1.0)?;
                        self.skip[j] = true;
                        return self.finish_value(oj);
                    }
                    let y = self.alloc_over(ins[other], &[ni], o0)?;
                    return self.activation(
                        &x,
                        &y,
                        Some(&bias),
                        (ActFunc::Identity, 0.0, 0.0),
                        1.0,
                    );
                }
            }
        }
        let _ = c;
        let first = self.sview(ins[0])?.broadcast(&oshape);
        let second = self.sview(ins[1])?.broadcast(&oshape);
        let y = if ins.len() == 2 && !or_equal {
            // In place over an operand of the output's shape that nothing else reads.
            match self.in_place(ins[0], &[ni], o0) {
                Some(y) => y,
                None => self.alloc_over(ins[1], &[ni], o0)?,
            }
        } else {
            self.alloc_any(o0)?
        };
        self.emit_nd(0, Engine::Dve, &[&first, &second, &y], |a| Op::Binary {
            a: a[0],
            b: a[1],
            out: a[2],
            op: bop,
        })?;
        if or_equal {
            return self.or_equal(&first, &second, &y);
        }
        for &v in &ins[2..] {
            let x = self.view(v)?.broadcast(&oshape);
            self.emit_nd(0, Engine::Dve, &[&y, &x, &y], |a| Op::Binary {
                a: a[0],
                b: a[1],
                out: a[2],
                op: bop,
            })?;
        }
        Ok(())
    }

    /// `y ∨= (a = b)` for a boolean `y` of `a` and `b`'s (broadcast) shape.
    fn or_equal(&mut self, a: &View, b: &View, y: &View) -> Result<()> {
        let eq = View::dense(
            self.temp(y.shape.iter().product::<usize>()),
            DType::Bool,
            &y.shape,
        );
        self.emit_nd(0, Engine::Dve, &[a, b, &eq], |x| Op::Binary {
            a: x[0],
            b: x[1],
            out: x[2],
            op: BinaryOp::Equal,
        })?;
        self.emit_nd(0, Engine::Dve, &[y, &eq, y], |x| Op::Binary {
            a: x[0],
            b: x[1],
            out: x[2],
            op: BinaryOp::Or,
        })
    }

    /// Emits one MatMul, split between the cores (N, else M) when there are two.
    fn matmul_aps(
        &mut self,
        a: AccessPattern,
        b: AccessPattern,
        c: AccessPattern,
        alpha: f32,
        flags: u32,
    ) {
        let es = 4i64;
        let (m, n) = (c.shape[2] as i64, c.shape[3] as i64);
        let ta = flags & matmul_flags::TRANSPOSE_A != 0;
        let tb = flags & matmul_flags::TRANSPOSE_B != 0;
        if self.cores < 2 || (m < 2 && n < 2) {
            self.emit(
                0,
                Engine::Pe,
                Op::MatMul {
                    a,
                    b,
                    c,
                    alpha,
                    flags,
                },
            );
            return;
        }
        let split_n = n >= 2;
        let total = if split_n { n } else { m };
        let half = total / 2;
        for (core, start, len) in [(0u8, 0i64, half), (1u8, half, total - half)] {
            let (mut a2, mut b2, mut c2) = (a, b, c);
            let adv = |ap: &mut AccessPattern, dim: usize| {
                ap.shape[dim] = len as u32;
                ap.addr = (ap.addr as i64 + start * ap.stride[dim] as i64 * es) as u64;
            };
            if split_n {
                adv(&mut c2, 3);
                adv(&mut b2, if tb { 2 } else { 3 });
            } else {
                adv(&mut c2, 2);
                adv(&mut a2, if ta { 3 } else { 2 });
            }
            self.emit(
                core,
                Engine::Pe,
                Op::MatMul {
                    a: a2,
                    b: b2,
                    c: c2,
                    alpha,
                    flags,
                },
            );
        }
    }

    fn lower_matmul(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let o0 = self.out(ni, 0)?;
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
        // Operands as they are stored: transposed and head-split views need no copy (the
        // engine takes any strides).
        let mut a = self.sview(av)?;
        let mut b = self.sview(bv)?;
        if a.strides.iter().any(|&s| s < 0) {
            a = self.view(av)?;
        }
        if b.strides.iter().any(|&s| s < 0) {
            b = self.view(bv)?;
        }
        let y = self.alloc_any(target)?;
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
        let (ra, rb, rc) = (a.shape.len(), b.shape.len(), c.shape.len());
        let (mut m, k) = (a.shape[ra - 2], a.shape[ra - 1]);
        let nn = b.shape[rb - 1];
        let batch = c.shape[..rc - 2].to_vec();
        let (a_rs, a_cs) = (a.strides[ra - 2], a.strides[ra - 1]);
        let (b_rs, b_cs) = (b.strides[rb - 2], b.strides[rb - 1]);
        let (c_rs, c_cs) = (c.strides[rc - 2], c.strides[rc - 1]);
        if m * nn == 0 || batch.contains(&0) {
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
        let (mut bs, mut bst, _) = simplify(&batch, &[sa, sb, sc], usize::MAX);
        // Batches that share B and continue A's and C's rows are more rows (one taller
        // product, which two cores can split).
        while let Some(&last) = bs.last() {
            let d = bs.len() - 1;
            let rows_a = a_rs * m as i64;
            let rows_c = c_rs * m as i64;
            if bst[1][d] == 0 && bst[0][d] == rows_a && bst[2][d] == rows_c {
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
            self.matmul_aps(a_ap, b_ap, c_ap, alpha, 0);
        }
        self.finish_fused_target(target, o0)
    }

    /// After a MatMul that also computed its consumer's output `target`: that output is
    /// final (the node loop only finishes the MatMul's own outputs).
    fn finish_fused_target(&mut self, target: ValueId, o0: ValueId) -> Result<()> {
        if target != o0 {
            self.finish_value(target)?;
        }
        Ok(())
    }

    fn lower_gemm(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let o0 = self.out(ni, 0)?;
        let alpha = n.attr_f("alpha", 1.0)?;
        let beta = n.attr_f("beta", 1.0)?;
        let ta = n.attr_i("transA", 0)? != 0;
        let tb = n.attr_i("transB", 0)? != 0;
        let (av, bv) = (n.inputs[0].expect("p"), n.inputs[1].expect("p"));
        let mut a = self.sview(av)?;
        let mut b = self.sview(bv)?;
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
        // Bias and a following activation: the product, then ONE activation pass in place
        // (bias + function). The bias must be a constant when beta scales it.
        let act = self.sole_consumer(o0).and_then(|j| {
            let cj = Ctx { g, n: &g.nodes[j] };
            act_of(&cj).ok().flatten().map(|f| (j, f))
        });
        let bias_for_act = match (cv, act) {
            (Some(c), Some(_)) if k > 0 && m * nn > 0 => {
                if beta == 1.0 {
                    Some(self.sview(c)?)
                } else if let Some(t) = g.values[c].konst.as_deref() {
                    let scaled: Vec<f32> = t.to_f32s().iter().map(|v| v * beta).collect();
                    let addr = self.add_const(&HostTensor::f32(t.shape.clone(), scaled));
                    Some(View::dense(addr, DType::F32, &t.shape))
                } else {
                    None
                }
            }
            _ => None,
        };
        let y = self.alloc_any(o0)?;
        let mut flags = 0;
        if let (Some(bias), Some((j, f))) = (bias_for_act, act) {
            let (a_ap, b_ap, c_ap) = (
                mk_ap(a.addr, a.dtype, &a.shape, &a.strides)?,
                mk_ap(b.addr, b.dtype, &b.shape, &b.strides)?,
                mk_ap(y.addr, y.dtype, &y.shape, &y.strides)?,
            );
            if ta {
                flags |= matmul_flags::TRANSPOSE_A;
            }
            if tb {
                flags |= matmul_flags::TRANSPOSE_B;
            }
            self.matmul_aps(a_ap, b_ap, c_ap, alpha, flags);
            let oj = self.out(j, 0)?;
            let out = self.alloc_over(o0, &[j], oj)?;
            let bias = bias.broadcast(&y.shape);
            self.activation(&y, &out, Some(&bias), f, 1.0)?;
            self.skip[j] = true;
            return self.finish_value(oj);
        }
        if let Some(cv) = cv {
            let cview = self.sview(cv)?.broadcast(&y.shape);
            if beta == 1.0 {
                self.copy(Engine::Dve, &cview, &y)?;
            } else {
                self.emit_nd(0, Engine::Dve, &[&cview, &y], |x| Op::TensorScalar {
                    a: x[0],
                    out: x[1],
                    op: BinaryOp::Mul,
                    scalar: beta,
                    reverse: false,
                })?;
            }
            flags |= matmul_flags::ACCUMULATE;
        }
        if m * nn == 0 {
            return Ok(());
        }
        if k == 0 {
            if flags == 0 {
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

    /// Emits a Conv over `[N, C, H, W]` views, split by output channels (or groups) on 2 cores.
    #[allow(clippy::too_many_arguments)]
    fn conv_op(
        &mut self,
        x: AccessPattern,
        w: AccessPattern,
        y: AccessPattern,
        bias: Option<AccessPattern>,
        window: Window,
        groups: u32,
    ) {
        let o = w.shape[0];
        let split_groups = groups > 1 && groups.is_multiple_of(2);
        if self.cores < 2 || (groups == 1 && o < 2) || (groups > 1 && !split_groups) {
            let workspace = self.conv_workspace(&x, &w, &y, &window, groups);
            self.emit(
                0,
                Engine::Pe,
                Op::Conv {
                    input: x,
                    weight: w,
                    output: y,
                    bias,
                    workspace,
                    window,
                    groups,
                },
            );
            return;
        }
        let adv = |ap: &AccessPattern, dim: usize, start: u32, len: u32| {
            let mut a = *ap;
            a.shape[dim] = len;
            a.addr = (a.addr as i64 + start as i64 * a.stride[dim] as i64 * 4) as u64;
            a
        };
        let (o0, g0) = if split_groups {
            (o / 2, groups / 2)
        } else {
            (o / 2, 1)
        };
        let c0 = x.shape[1] / 2;
        // One scratch block for both cores, each its own half: they convolve at the same
        // time (two temporaries would each be live for one instruction only, and the
        // planner could overlap them).
        let mut scratch: Option<(u64, u64)> = None;
        for (core, first) in [(0u8, true), (1u8, false)] {
            let (os, ol) = if first { (0, o0) } else { (o0, o - o0) };
            let w2 = adv(&w, 0, os, ol);
            let y2 = adv(&y, 1, os, ol);
            let b2 = bias.map(|b| adv(&b, 3, os, ol));
            let (x2, g2) = if split_groups {
                let (cs, cl) = if first {
                    (0, c0)
                } else {
                    (c0, x.shape[1] - c0)
                };
                (adv(&x, 1, cs, cl), if first { g0 } else { groups - g0 })
            } else {
                (x, 1)
            };
            let workspace = match self.conv_workspace_len(&x2, &w2, &y2, &window, g2) {
                None => None,
                Some(len) => {
                    // (The halves have equal channels per group, so equal patch matrices.)
                    let bytes = (u64::from(len) * 4).next_multiple_of(64);
                    let at = match scratch {
                        Some((base, half)) if bytes <= half => base + half,
                        _ => {
                            let base = self.temp(2 * bytes as usize);
                            scratch = Some((base, bytes));
                            base
                        }
                    };
                    mk_ap(at, DType::F32, &[len as usize], &[1]).ok()
                }
            };
            self.emit(
                core,
                Engine::Pe,
                Op::Conv {
                    input: x2,
                    weight: w2,
                    output: y2,
                    bias: b2,
                    workspace,
                    window,
                    groups: g2,
                },
            );
        }
    }

    /// Scratch (from the arena) for the engine's im2col + GEMM convolution: the patch matrix
    /// `(C/g)·KH·KW × OH·OW` (the engine fills it a cache-sized band at a time, so only the
    /// first band's pages are touched). Not for pointwise convolutions (the input already is
    /// that matrix) or one output channel per group (depthwise: a GEMM of one row, the
    /// engine convolves directly). Measured on this project's machine (conv + relu, batch 1):
    /// 3→16 ch 32² 3×3 53 → 33 µs; 16→32 ch 16² 3×3 stride 2 264 → 25 µs; 64→64 ch 56²
    /// 12.0 → 4.1 ms; 3→64 ch 224² 7×7 stride 2 70 → 5.8 ms; 256→512 1×1 stride 2 62 →
    /// 3.7 ms: im2col wins at every size tried.
    fn conv_workspace(
        &mut self,
        x: &AccessPattern,
        w: &AccessPattern,
        y: &AccessPattern,
        window: &Window,
        groups: u32,
    ) -> Option<AccessPattern> {
        let len = self.conv_workspace_len(x, w, y, window, groups)?;
        let addr = self.temp(len as usize * 4);
        mk_ap(addr, DType::F32, &[len as usize], &[1]).ok()
    }

    /// Elements of [`Self::conv_workspace`]'s scratch, `None` when the convolution goes
    /// without.
    fn conv_workspace_len(
        &self,
        x: &AccessPattern,
        w: &AccessPattern,
        y: &AccessPattern,
        window: &Window,
        groups: u32,
    ) -> Option<u32> {
        let g = groups.max(1) as u64;
        let (og, cg) = (w.shape[0] as u64 / g, x.shape[1] as u64 / g);
        let (kh, kw) = (w.shape[2] as u64, w.shape[3] as u64);
        let kk = cg * kh * kw;
        let pointwise = kh == 1 && kw == 1 && window.stride == [1, 1] && window.pad == [0; 4];
        if pointwise || og < 2 || kk == 0 {
            return None;
        }
        u32::try_from(kk * y.shape[2] as u64 * y.shape[3] as u64).ok()
    }

    fn lower_conv(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let wv = c.input(1)?;
        let group = n.attr_i("group", 1)? as u32;
        let p = params::window_params(&c, &xv.shape[2..], wv.shape[2..].to_vec(), false)?;
        let x = self.view(n.inputs[0].expect("p"))?;
        // A BatchNormalization that only this convolution feeds folds into its constant
        // weights and bias: w'[o] = w[o]·scale[o], b'[o] = b[o]·scale[o] + shift[o].
        let bn = self.sole_consumer(o0).filter(|&j| {
            g.nodes[j].op == "BatchNormalization"
                && !self.skip[j]
                && c.konst(1).is_some()
                && n.inputs
                    .get(2)
                    .copied()
                    .flatten()
                    .is_none_or(|_| c.konst(2).is_some())
        });
        let folded = match bn {
            Some(j) => {
                let cj = Ctx { g, n: &g.nodes[j] };
                let (scale, shift) = bn_affine(&cj)?;
                let wt = c.konst(1).expect("checked");
                let o = wv.shape[0];
                if scale.len() != o {
                    return Err(c.e(ErrorKind::ShapeMismatch, "BatchNormalization channels"));
                }
                let per = wv.elements() / o.max(1);
                let mut wf = wt.to_f32s();
                for (i, v) in wf.iter_mut().enumerate() {
                    *v *= scale[i / per];
                }
                let b0 = c.konst(2).map_or(vec![0.0; o], |t| t.to_f32s());
                let bf: Vec<f32> = (0..o).map(|i| b0[i] * scale[i] + shift[i]).collect();
                let wa = self.add_const(&HostTensor::f32(wv.shape.clone(), wf));
                let ba = self.add_const(&HostTensor::f32(vec![o], bf));
                self.skip[j] = true;
                Some((
                    j,
                    View::dense(wa, DType::F32, &wv.shape),
                    View::dense(ba, DType::F32, &[o]),
                ))
            }
            None => None,
        };
        let (w, bias, target) = match folded {
            Some((j, w, b)) => (w, Some(b), self.out(j, 0)?),
            None => (
                self.view(n.inputs[1].expect("p"))?,
                match n.inputs.get(2).copied().flatten() {
                    Some(b) => Some(self.view(b)?),
                    None => None,
                },
                o0,
            ),
        };
        let y = self.alloc(target);
        if y.shape.contains(&0) {
            return self.finish_fused_target(target, o0);
        }
        let to4 = |s: &[usize]| -> Vec<usize> {
            if s.len() == 3 {
                vec![s[0], s[1], 1, s[2]]
            } else {
                s.to_vec()
            }
        };
        let two = |v: &[usize], d: usize| -> [u32; 2] {
            if v.len() == 1 {
                [d as u32, v[0] as u32]
            } else {
                [v[0] as u32, v[1] as u32]
            }
        };
        let (xs, ws, ys) = (to4(&x.shape), to4(&w.shape), to4(&y.shape));
        let xa = mk_ap(x.addr, x.dtype, &xs, &dense_strides(&xs))?;
        let wa = mk_ap(w.addr, w.dtype, &ws, &dense_strides(&ws))?;
        let ya = mk_ap(y.addr, y.dtype, &ys, &dense_strides(&ys))?;
        let ba = match &bias {
            Some(b) => Some(mk_ap(b.addr, b.dtype, &[b.shape.iter().product()], &[1])?),
            None => None,
        };
        let pb = two(&p.pad_begin, 0);
        let pe = two(&p.pad_end, 0);
        let window = Window {
            kernel: [0, 0],
            stride: two(&p.strides, 1),
            pad: [pb[0], pb[1], pe[0], pe[1]],
            dilation: two(&p.dilations, 1),
        };
        self.conv_op(xa, wa, ya, ba, window, group);
        self.finish_fused_target(target, o0)
    }

    fn lower_conv_transpose(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let wv = c.input(1)?;
        let group = n.attr_i("group", 1)? as usize;
        let p = params::conv_transpose_params(&c, &xv.shape[2..], wv.shape[2..].to_vec())?;
        if p.conv_pad_begin
            .iter()
            .chain(&p.conv_pad_end)
            .any(|&v| v < 0)
        {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                "ConvTranspose whose pads exceed the kernel extent (negative equivalent padding)",
            ));
        }
        let to4 = |s: &[usize]| -> Vec<usize> {
            if s.len() == 3 {
                vec![s[0], s[1], 1, s[2]]
            } else {
                s.to_vec()
            }
        };
        let xs = to4(&xv.shape);
        let ws = to4(&wv.shape); // [C, O/g, kh, kw]
        let sp = if p.strides.len() == 1 {
            vec![1, p.strides[0]]
        } else {
            p.strides.clone()
        };
        let dl = if p.dilations.len() == 1 {
            vec![1, p.dilations[0]]
        } else {
            p.dilations.clone()
        };
        let (pb, pe): (Vec<i64>, Vec<i64>) = if p.conv_pad_begin.len() == 1 {
            (vec![0, p.conv_pad_begin[0]], vec![0, p.conv_pad_end[0]])
        } else {
            (p.conv_pad_begin.clone(), p.conv_pad_end.clone())
        };
        let x = self.view(n.inputs[0].expect("p"))?;
        let x4 = View::dense(x.addr, x.dtype, &xs);
        // 1. Zero-insert the input when strided.
        let xz = if sp.iter().all(|&s| s == 1) {
            x4
        } else {
            let zs = vec![
                xs[0],
                xs[1],
                (xs[2] - 1) * sp[0] + 1,
                (xs[3] - 1) * sp[1] + 1,
            ];
            let bytes = zs.iter().product::<usize>() * 4;
            let t = View::dense(self.temp(bytes), DType::F32, &zs);
            self.fill(Engine::Pool, &t, 0.0)?;
            let mut dst = t.clone();
            dst.shape = xs.clone();
            dst.strides[2] *= sp[0] as i64;
            dst.strides[3] *= sp[1] as i64;
            self.copy(Engine::Pool, &x4, &dst)?;
            t
        };
        // 2. Weights [C, O/g, kh, kw] → [O, C/g, kh, kw], flipped spatially.
        let (cin, og, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
        let cg = cin / group;
        let o = og * group;
        let wshape = vec![o, cg, kh, kw];
        let waddr = if let Some(t) = c.konst(1) {
            let src = t.to_f32s();
            let mut dst = vec![0f32; o * cg * kh * kw];
            for gi in 0..group {
                for oo in 0..og {
                    for cc in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let s = (((gi * cg + cc) * og + oo) * kh + (kh - 1 - i)) * kw
                                    + (kw - 1 - j);
                                let d = (((gi * og + oo) * cg + cc) * kh + i) * kw + j;
                                dst[d] = src[s];
                            }
                        }
                    }
                }
            }
            self.add_const(&HostTensor::f32(wshape.clone(), dst))
        } else {
            let w = self.view(n.inputs[1].expect("p"))?;
            let t = View::dense(self.temp(o * cg * kh * kw * 4), DType::F32, &wshape);
            for gi in 0..group {
                // src[o', c', i, j] = W[gi*cg + c', o', kh-1-i, kw-1-j]
                let base = ((gi * cg * og) * kh * kw + (kh - 1) * kw + (kw - 1)) as i64;
                let src = View {
                    addr: w.elems(base),
                    dtype: w.dtype,
                    shape: vec![og, cg, kh, kw],
                    strides: vec![(kh * kw) as i64, (og * kh * kw) as i64, -(kw as i64), -1],
                };
                let dst = View::dense(
                    t.elems((gi * og * cg * kh * kw) as i64),
                    DType::F32,
                    &[og, cg, kh, kw],
                );
                self.copy(Engine::Pool, &src, &dst)?;
            }
            t.addr
        };
        let bias = match n.inputs.get(2).copied().flatten() {
            Some(b) => Some(self.view(b)?),
            None => None,
        };
        let y = self.alloc(o0);
        let ys = to4(&y.shape);
        if ys.contains(&0) {
            return Ok(());
        }
        let xa = mk_ap(xz.addr, xz.dtype, &xz.shape, &xz.strides)?;
        let wa = mk_ap(waddr, DType::F32, &wshape, &dense_strides(&wshape))?;
        let ya = mk_ap(y.addr, y.dtype, &ys, &dense_strides(&ys))?;
        let ba = match &bias {
            Some(b) => Some(mk_ap(b.addr, b.dtype, &[o], &[1])?),
            None => None,
        };
        let window = Window {
            kernel: [0, 0],
            stride: [1, 1],
            pad: [pb[0] as u32, pb[1] as u32, pe[0] as u32, pe[1] as u32],
            dilation: [dl[0] as u32, dl[1] as u32],
        };
        self.conv_op(xa, wa, ya, ba, window, group as u32);
        Ok(())
    }

    /// MaxPool / AveragePool over 1, 2 or 3 spatial dimensions. A 3-D pool is separable:
    /// a 2-D pool over (H, W) of the `[N, C·D, H, W]` view, then a pool over D of the
    /// `[N·C, 1, D, OH·OW]` view of that result. Both reductions factor over the dimensions
    /// (max of maxima; for averages the divisor is a product of per-dimension counts, so
    /// averaging averages divides by it), whatever the padding counts.
    fn lower_pool(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let ks: Vec<usize> = n
            .attr_ints("kernel_shape")?
            .unwrap_or_default()
            .iter()
            .map(|&k| k as usize)
            .collect();
        let ceil = n.attr_i("ceil_mode", 0)? != 0;
        let p = params::window_params(&c, &xv.shape[2..], ks, ceil)?;
        let is_max = n.op == "MaxPool";
        // LpPool: (Σ|x|^p)^(1/p), the sum an average over whole windows (overhang and
        // padding counted) times the window size.
        let lp = (n.op == "LpPool").then(|| n.attr_i("p", 2)).transpose()?;
        let include_pad = lp.is_some() || (!is_max && n.attr_i("count_include_pad", 0)? != 0);
        let mut x = self.view(n.inputs[0].expect("p"))?;
        let y = self.alloc(o0);
        if y.shape.contains(&0) || x.shape.contains(&0) {
            return Ok(());
        }
        let f = |f: ActFunc| (f, 0.0, 0.0);
        if let Some(pw) = lp {
            if pw < 1 {
                return Err(c.bad_attr(format!("p = {pw}")));
            }
            let t = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
            match pw {
                1 => self.activation(&x, &t, None, f(ActFunc::Abs), 1.0)?,
                2 => self.activation(&x, &t, None, f(ActFunc::Square), 1.0)?,
                _ => {
                    self.activation(&x, &t, None, f(ActFunc::Abs), 1.0)?;
                    self.activation(&t, &t, None, f(ActFunc::Log), 1.0)?;
                    self.activation(&t, &t, None, f(ActFunc::Exp), pw as f32)?;
                }
            }
            x = t;
        }
        let (nn, ch) = (xv.shape[0], xv.shape[1]);
        let dim = |k: usize| PoolDim {
            kernel: p.kernel[k],
            stride: p.strides[k],
            dilation: p.dilations[k],
            pad_begin: p.pad_begin[k],
            pad_end: p.pad_end[k],
            ceil_extra: p.ceil_extra[k],
        };
        let unit = PoolDim {
            kernel: 1,
            stride: 1,
            dilation: 1,
            pad_begin: 0,
            pad_end: 0,
            ceil_extra: 0,
        };
        let sp = &xv.shape[2..];
        let os = &y.shape[2..];
        let pooled = match sp.len() {
            1 => self.pool2d(
                &View::dense(x.addr, x.dtype, &[nn, ch, 1, sp[0]]),
                &View::dense(y.addr, y.dtype, &[nn, ch, 1, os[0]]),
                [unit, dim(0)],
                is_max,
                include_pad,
                lp.is_some(),
            ),
            2 => self.pool2d(&x, &y, [dim(0), dim(1)], is_max, include_pad, lp.is_some()),
            3 => {
                let mid = [nn, ch * sp[0], os[1], os[2]];
                let t = View::dense(
                    self.temp(mid.iter().product::<usize>() * 4),
                    DType::F32,
                    &mid,
                );
                self.pool2d(
                    &View::dense(x.addr, x.dtype, &[nn, ch * sp[0], sp[1], sp[2]]),
                    &t,
                    [dim(1), dim(2)],
                    is_max,
                    include_pad,
                    lp.is_some(),
                )?;
                self.pool2d(
                    &View::dense(t.addr, t.dtype, &[nn * ch, 1, sp[0], os[1] * os[2]]),
                    &View::dense(y.addr, y.dtype, &[nn * ch, 1, os[0], os[1] * os[2]]),
                    [dim(0), unit],
                    is_max,
                    include_pad,
                    lp.is_some(),
                )
            }
            r => Err(c.e(ErrorKind::UnsupportedOp, format!("{r}-D pooling"))),
        };
        pooled?;
        if let Some(pw) = lp {
            let win = p.kernel.iter().product::<usize>() as f32;
            match pw {
                1 => self.tensor_scalar(&y, &y, BinaryOp::Mul, win)?,
                2 => self.activation(&y, &y, None, f(ActFunc::Sqrt), win)?,
                _ => {
                    self.activation(&y, &y, None, f(ActFunc::Log), win)?;
                    self.activation(&y, &y, None, f(ActFunc::Exp), 1.0 / pw as f32)?;
                }
            }
        }
        Ok(())
    }

    /// One Pool instruction over dense `[N, C, H, W]` views.
    fn pool2d(
        &mut self,
        x: &View,
        y: &View,
        d: [PoolDim; 2],
        is_max: bool,
        include_pad: bool,
        whole_windows: bool,
    ) -> Result<()> {
        let mut x = x.clone();
        let xs = x.shape.clone();
        let (mut pb, mut pe) = (d.map(|v| v.pad_begin), d.map(|v| v.pad_end));
        let extra = d.map(|v| v.ceil_extra);
        let mut count_pad = include_pad;
        if include_pad && extra != [0, 0] && !whole_windows {
            // Counted padding but uncounted ceil-mode overhang: count only the cells inside
            // the padded image, the padding made real cells (zeros) when there is any.
            count_pad = false;
        }
        if !count_pad && include_pad && (pb != [0, 0] || pe != [0, 0]) {
            let ps = vec![xs[0], xs[1], xs[2] + pb[0] + pe[0], xs[3] + pb[1] + pe[1]];
            let t = View::dense(self.temp(ps.iter().product::<usize>() * 4), DType::F32, &ps);
            self.fill(Engine::Pool, &t, 0.0)?;
            let inner = t
                .slice(2, pb[0] as i64, xs[2], 1)
                .slice(3, pb[1] as i64, xs[3], 1);
            self.copy(Engine::Pool, &x, &inner)?;
            x = t;
            pb = [0, 0];
            pe = [0, 0];
        }
        let window = Window {
            kernel: d.map(|v| v.kernel as u32),
            stride: d.map(|v| v.stride as u32),
            pad: [
                pb[0] as u32,
                pb[1] as u32,
                (pe[0] + extra[0]) as u32,
                (pe[1] + extra[1]) as u32,
            ],
            dilation: d.map(|v| v.dilation as u32),
        };
        let xa = mk_ap(x.addr, x.dtype, &x.shape, &x.strides)?;
        let ya = mk_ap(y.addr, y.dtype, &y.shape, &y.strides)?;
        self.emit(
            0,
            Engine::Pool,
            Op::Pool {
                input: xa,
                output: ya,
                window,
                op: if is_max { PoolOp::Max } else { PoolOp::Avg },
                count_include_pad: count_pad,
            },
        );
        Ok(())
    }

    /// LRN: `y = x · (bias + alpha/size · Σ_window x²)^-beta`, the sum over a window of
    /// `size` channels. Square on ACT; the channel-window mean is an average Pool over the
    /// `[N, 1, C, H·W]` view with a `[size, 1]` kernel and zero padding counted in the
    /// divisor; `(bias + alpha·mean)^-beta` is `exp(-beta · ln(alpha·mean + bias))` (two ACT
    /// passes, in place); the product on DVE.
    fn lower_lrn(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let o0 = self.out(ni, 0)?;
        let size = n.attr_i("size", 0)? as usize;
        let alpha = n.attr_f("alpha", 1e-4)?;
        let beta = n.attr_f("beta", 0.75)?;
        let bias = n.attr_f("bias", 1.0)?;
        let x = self.view(n.inputs[0].expect("p"))?;
        let y = self.alloc(o0);
        let total: usize = x.shape.iter().product();
        if total == 0 {
            return Ok(());
        }
        let (nn, ch) = (x.shape[0], x.shape[1]);
        let sp = total / (nn * ch);
        let sq = View::dense(self.temp(total * 4), DType::F32, &x.shape);
        self.activation(&x, &sq, None, (ActFunc::Square, 0.0, 0.0), 1.0)?;
        let mean = View::dense(self.temp(total * 4), DType::F32, &x.shape);
        let s4 = [nn, 1, ch, sp];
        let st4 = [(ch * sp) as i64, (ch * sp) as i64, sp as i64, 1];
        let window = Window {
            kernel: [size as u32, 1],
            stride: [1, 1],
            pad: [((size - 1) / 2) as u32, 0, (size / 2) as u32, 0],
            dilation: [1, 1],
        };
        self.emit(
            0,
            Engine::Pool,
            Op::Pool {
                input: mk_ap(sq.addr, DType::F32, &s4, &st4)?,
                output: mk_ap(mean.addr, DType::F32, &s4, &st4)?,
                window,
                op: PoolOp::Avg,
                count_include_pad: true,
            },
        );
        let b = self.add_const(&HostTensor::f32(vec![1], vec![bias]));
        let bv = View::dense(b, DType::F32, &[1]).broadcast(&x.shape);
        self.activation(&mean, &mean, Some(&bv), (ActFunc::Log, 0.0, 0.0), alpha)?;
        self.activation(&mean, &mean, None, (ActFunc::Exp, 0.0, 0.0), -beta)?;
        self.emit_nd(0, Engine::Dve, &[&x, &mean, &y], |a| Op::Binary {
            a: a[0],
            b: a[1],
            out: a[2],
            op: BinaryOp::Mul,
        })
    }

    /// A compile-time scalar broadcast to `shape`.
    fn scalar(&mut self, v: f32, shape: &[usize]) -> View {
        let a = self.add_const(&HostTensor::f32(vec![1], vec![v]));
        View::dense(a, DType::F32, &[1]).broadcast(shape)
    }

    /// `out = a ∘ b` on DVE.
    fn binary(&mut self, a: &View, b: &View, out: &View, op: BinaryOp) -> Result<()> {
        self.emit_nd(0, Engine::Dve, &[a, b, out], |x| Op::Binary {
            a: x[0],
            b: x[1],
            out: x[2],
            op,
        })
    }

    /// `out = a ∘ s` on DVE.
    fn tensor_scalar(&mut self, a: &View, out: &View, op: BinaryOp, s: f32) -> Result<()> {
        self.emit_nd(0, Engine::Dve, &[a, out], |x| Op::TensorScalar {
            a: x[0],
            out: x[1],
            op,
            scalar: s,
            reverse: false,
        })
    }

    /// `out = cond ? a : b` on DVE.
    fn select(&mut self, cond: &View, a: &View, b: &View, out: &View) -> Result<()> {
        self.emit_nd(0, Engine::Dve, &[cond, a, b, out], |x| Op::Select {
            cond: x[0],
            a: x[1],
            b: x[2],
            out: x[3],
        })
    }

    /// Activations without an ACT function of their own, from those and DVE operations.
    fn lower_composite_activation(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let o0 = self.out(ni, 0)?;
        let xi = n.inputs[0].expect("p");
        let x = self.sview(xi)?;
        let sh = g.values[o0].shape.clone();
        let total: usize = sh.iter().product();
        let f = |f: ActFunc| (f, 0.0, 0.0);
        let tmp = |l: &mut Self, d: DType| View::dense(l.temp(total * d.size()), d, &sh);
        let y = self.alloc(o0);
        if total == 0 {
            return Ok(());
        }
        match n.op.as_str() {
            "Selu" => {
                let alpha = n.attr_f("alpha", 1.673_263_2)?;
                let gamma = n.attr_f("gamma", 1.050_701)?;
                self.activation(&x, &y, None, (ActFunc::Elu, alpha, 0.0), 1.0)?;
                self.tensor_scalar(&y, &y, BinaryOp::Mul, gamma)
            }
            "Celu" => {
                // alpha · Elu(x / alpha) with Elu's own alpha 1.
                let alpha = n.attr_f("alpha", 1.0)?;
                self.activation(&x, &y, None, (ActFunc::Elu, 1.0, 0.0), 1.0 / alpha)?;
                self.tensor_scalar(&y, &y, BinaryOp::Mul, alpha)
            }
            "HardSwish" => {
                self.activation(&x, &y, None, (ActFunc::HardSigmoid, 1.0 / 6.0, 0.5), 1.0)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "Swish" => {
                let alpha = n.attr_f("alpha", 1.0)?;
                self.activation(&x, &y, None, f(ActFunc::Sigmoid), alpha)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "Mish" => {
                self.activation(&x, &y, None, f(ActFunc::Softplus), 1.0)?;
                self.activation(&y, &y, None, f(ActFunc::Tanh), 1.0)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "Softsign" => {
                // x / (1 + |x|): |x|, then 1/(|x| + 1) with the 1 as the ACT bias.
                self.activation(&x, &y, None, f(ActFunc::Abs), 1.0)?;
                let one = self.scalar(1.0, &sh);
                self.activation(&y, &y, Some(&one), f(ActFunc::Reciprocal), 1.0)?;
                self.binary(&x, &y, &y, BinaryOp::Mul)
            }
            "ThresholdedRelu" => {
                let alpha = n.attr_f("alpha", 1.0)?;
                let (a, zero) = (self.scalar(alpha, &sh), self.scalar(0.0, &sh));
                let cond = tmp(self, DType::Bool);
                self.binary(&x, &a, &cond, BinaryOp::Greater)?;
                self.select(&cond, &x, &zero, &y)
            }
            "Shrink" => {
                let bias = n.attr_f("bias", 0.0)?;
                let lambd = n.attr_f("lambd", 0.5)?;
                let (lo, hi, zero) = (
                    self.scalar(-lambd, &sh),
                    self.scalar(lambd, &sh),
                    self.scalar(0.0, &sh),
                );
                let (c_lo, c_hi) = (tmp(self, DType::Bool), tmp(self, DType::Bool));
                self.binary(&x, &lo, &c_lo, BinaryOp::Less)?;
                self.binary(&x, &hi, &c_hi, BinaryOp::Greater)?;
                let t = tmp(self, DType::F32);
                self.tensor_scalar(&x, &t, BinaryOp::Sub, bias)?;
                self.select(&c_hi, &t, &zero, &y)?;
                self.tensor_scalar(&x, &t, BinaryOp::Add, bias)?;
                self.select(&c_lo, &t, &y, &y)
            }
            "Sign" => {
                // 1, −1, or x·0 (0, or NaN for NaN).
                let (one, minus, zero) = (
                    self.scalar(1.0, &sh),
                    self.scalar(-1.0, &sh),
                    self.scalar(0.0, &sh),
                );
                let (pos, neg) = (tmp(self, DType::Bool), tmp(self, DType::Bool));
                self.binary(&x, &zero, &pos, BinaryOp::Greater)?;
                self.binary(&x, &zero, &neg, BinaryOp::Less)?;
                self.tensor_scalar(&x, &y, BinaryOp::Mul, 0.0)?;
                self.select(&neg, &minus, &y, &y)?;
                self.select(&pos, &one, &y, &y)
            }
            _ => {
                // PRelu: x < 0 ? slope·x : x.
                let slope = self.sview(n.inputs[1].expect("p"))?.broadcast(&sh);
                let zero = self.scalar(0.0, &sh);
                let neg = tmp(self, DType::Bool);
                self.binary(&x, &zero, &neg, BinaryOp::Less)?;
                let t = tmp(self, DType::F32);
                self.binary(&x, &slope, &t, BinaryOp::Mul)?;
                self.select(&neg, &t, &x, &y)
            }
        }
    }

    /// Mod. Integers (through i64 when narrower): `r = a − (a/b)·b` with the truncating
    /// division, and without `fmod` the remainder takes the divisor's sign: `r + b` where
    /// `r` and `b` have opposite signs (`b < 0 ? r > 0 : r < 0`). Floats (`fmod` only):
    /// `a − b·trunc(a/b)`, `trunc` by Floor/Ceil on the quotient's sign.
    fn lower_mod(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let o0 = self.out(ni, 0)?;
        let fmod = n.attr_i("fmod", 0)? != 0;
        let sh = g.values[o0].shape.clone();
        let odt = g.values[o0].dtype;
        let total: usize = sh.iter().product();
        let float = crate::tensor::is_float(odt);
        let cd = match odt {
            DType::I32 | DType::I64 => odt,
            _ if float => DType::F32,
            _ => DType::I64,
        };
        let mut ops = Vec::new();
        for v in n.inputs.iter().flatten().copied() {
            let x = self.sview(v)?;
            let x = if x.dtype == cd {
                x
            } else {
                let t = View::dense(
                    self.temp(x.shape.iter().product::<usize>() * cd.size()),
                    cd,
                    &x.shape,
                );
                self.copy(Engine::Dve, &x, &t)?;
                t
            };
            ops.push(x.broadcast(&sh));
        }
        let (a, b) = (ops[0].clone(), ops[1].clone());
        let y = self.alloc(o0);
        if total == 0 {
            return Ok(());
        }
        let tmp = |l: &mut Self, d: DType| View::dense(l.temp(total * d.size()), d, &sh);
        let acc = if odt == cd { y.clone() } else { tmp(self, cd) };
        let zc = self.add_const(&HostTensor::from_f64s(cd, vec![1], std::iter::once(0.0)));
        let zero = View::dense(zc, cd, &[1]).broadcast(&sh);
        let t = tmp(self, cd);
        self.binary(&a, &b, &t, BinaryOp::Div)?;
        if float {
            let neg = tmp(self, DType::Bool);
            self.binary(&t, &zero, &neg, BinaryOp::Less)?;
            let fl = tmp(self, cd);
            self.activation(&t, &fl, None, (ActFunc::Floor, 0.0, 0.0), 1.0)?;
            self.activation(&t, &t, None, (ActFunc::Ceil, 0.0, 0.0), 1.0)?;
            self.select(&neg, &t, &fl, &t)?;
        }
        self.binary(&t, &b, &t, BinaryOp::Mul)?;
        self.binary(&a, &t, &acc, BinaryOp::Sub)?;
        if !fmod && !float {
            let (neg_r, pos_r, neg_b) = (
                tmp(self, DType::Bool),
                tmp(self, DType::Bool),
                tmp(self, DType::Bool),
            );
            self.binary(&acc, &zero, &neg_r, BinaryOp::Less)?;
            self.binary(&acc, &zero, &pos_r, BinaryOp::Greater)?;
            self.binary(&b, &zero, &neg_b, BinaryOp::Less)?;
            self.select(&neg_b, &pos_r, &neg_r, &neg_r)?;
            self.binary(&acc, &b, &t, BinaryOp::Add)?;
            self.select(&neg_r, &t, &acc, &acc)?;
        }
        if odt != cd {
            self.copy(Engine::Dve, &acc, &y)?;
        }
        Ok(())
    }

    /// CumSum as a product with a constant triangular 0/1 matrix `T` (`T[i][j] = 1` where
    /// `j ≤ i`; `<` when exclusive; reversed: `≥`, `>`): along the last axis one GEMM
    /// `X[rows, L] · Tᵀ`, else `T · X[o]` for each outer index, batched.
    fn lower_cumsum(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let axis = c.const_ints(1, "axis")?.map_or(0, |a| a[0]);
        let axis = c.norm_axis(axis, xv.shape.len())?;
        let exclusive = n.attr_i("exclusive", 0)? != 0;
        let reverse = n.attr_i("reverse", 0)? != 0;
        let x = self.view(n.inputs[0].expect("p"))?;
        let y = self.alloc(o0);
        let len = xv.shape[axis];
        let outer: usize = xv.shape[..axis].iter().product();
        let inner: usize = xv.shape[axis + 1..].iter().product();
        if outer * len * inner == 0 {
            return Ok(());
        }
        let takes = |i: usize, j: usize| match (reverse, exclusive) {
            (false, false) => j <= i,
            (false, true) => j < i,
            (true, false) => j >= i,
            (true, true) => j > i,
        };
        let t: Vec<f32> = (0..len * len)
            .map(|e| f32::from(u8::from(takes(e / len, e % len))))
            .collect();
        let ta = self.add_const(&HostTensor::f32(vec![len, len], t));
        let l = len as i64;
        if inner == 1 {
            // y[r, i] = Σ_j x[r, j]·T[i][j]: B = Tᵀ, read through swapped strides.
            let a = mk_ap(x.addr, x.dtype, &[outer, len], &[l, 1])?;
            let b = mk_ap(ta, DType::F32, &[len, len], &[1, l])?;
            let cc = mk_ap(y.addr, y.dtype, &[outer, len], &[l, 1])?;
            self.matmul_aps(a, b, cc, 1.0, 0);
        } else {
            let (inn, blk) = (inner as i64, (len * inner) as i64);
            let a = mk_ap(ta, DType::F32, &[outer, len, len], &[0, l, 1])?;
            let b = mk_ap(x.addr, x.dtype, &[outer, len, inner], &[blk, inn, 1])?;
            let cc = mk_ap(y.addr, y.dtype, &[outer, len, inner], &[blk, inn, 1])?;
            self.matmul_aps(a, b, cc, 1.0, 0);
        }
        Ok(())
    }

    /// InstanceNormalization and GroupNormalization with the LayerNorm instruction over the
    /// `[N, G, (C/G)·spatial]` view. Per-group (and, for instances, per-channel) scale and
    /// bias ride along as LayerNorm's broadcast gamma/beta; per-channel ones of a group
    /// norm are a DVE product and an ACT bias pass after it.
    fn lower_group_norm(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let eps = n.attr_f("epsilon", 1e-5)?;
        let (nn, ch) = (xv.shape[0], xv.shape[1]);
        let sp: usize = xv.shape[2..].iter().product();
        let groups = if n.op == "GroupNormalization" {
            n.attr_i("num_groups", 1)? as usize
        } else {
            ch
        };
        let x = self.view(n.inputs[0].expect("p"))?;
        let scale = self.view(n.inputs[1].expect("p"))?;
        let bias = self.view(n.inputs[2].expect("p"))?;
        let y = self.alloc(o0);
        if nn * ch * sp == 0 {
            return Ok(());
        }
        let d = ch / groups * sp;
        let sh = [nn, groups, d];
        let grid = |v: &View, st: [i64; 3]| View {
            addr: v.addr,
            dtype: v.dtype,
            shape: sh.to_vec(),
            strides: st.to_vec(),
        };
        let per_group = scale.shape.iter().product::<usize>() == groups;
        let (gamma, beta) = if per_group {
            (grid(&scale, [0, 1, 0]), grid(&bias, [0, 1, 0]))
        } else {
            let one = self.scalar(1.0, &sh);
            (one, self.scalar(0.0, &sh))
        };
        let dense = [(groups * d) as i64, d as i64, 1];
        let (xa, ya) = (grid(&x, dense), grid(&y, dense));
        // (Not emit_nd: merging dims would merge the normalized one with the groups.)
        let ap = |v: &View| mk_ap(v.addr, v.dtype, &v.shape, &v.strides);
        let op = Op::LayerNorm {
            input: ap(&xa)?,
            gamma: ap(&gamma)?,
            beta: Some(ap(&beta)?),
            output: ap(&ya)?,
            eps,
        };
        self.emit(0, Engine::Pool, op);
        if !per_group {
            let cs = [nn, ch, sp];
            let by_channel = |v: &View| View {
                addr: v.addr,
                dtype: v.dtype,
                shape: cs.to_vec(),
                strides: vec![0, 1, 0],
            };
            let y3 = View::dense(y.addr, y.dtype, &cs);
            self.binary(&y3, &by_channel(&scale), &y3, BinaryOp::Mul)?;
            let b = by_channel(&bias);
            self.activation(&y3, &y3, Some(&b), (ActFunc::Identity, 0.0, 0.0), 1.0)?;
        }
        Ok(())
    }

    /// RMSNormalization: `x / √(mean(x²) + eps) · scale` over the dims from `axis` on.
    fn lower_rms_norm(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let axis = c.norm_axis(n.attr_i("axis", -1)?, r)?;
        let eps = n.attr_f("epsilon", 1e-5)?;
        let x = self.view(n.inputs[0].expect("p"))?;
        let scale = self.sview(n.inputs[1].expect("p"))?.broadcast(&xv.shape);
        let y = self.alloc(o0);
        let outer: usize = xv.shape[..axis].iter().product();
        let d: usize = xv.shape[axis..].iter().product();
        if outer * d == 0 {
            return Ok(());
        }
        let sq = View::dense(self.temp(outer * d * 4), DType::F32, &[outer, d]);
        let x2 = View::dense(x.addr, x.dtype, &[outer, d]);
        self.activation(&x2, &sq, None, (ActFunc::Square, 0.0, 0.0), 1.0)?;
        let ms = View::dense(self.temp(outer * 4), DType::F32, &[outer, 1]);
        self.reduce(&c, &sq, &ms, Some(&[1]), ReduceOp::Mean)?;
        let e = self.scalar(eps, &[outer, 1]);
        self.activation(&ms, &ms, Some(&e), (ActFunc::Rsqrt, 0.0, 0.0), 1.0)?;
        let y2 = View::dense(y.addr, y.dtype, &[outer, d]);
        self.binary(&x2, &ms.broadcast(&[outer, d]), &y2, BinaryOp::Mul)?;
        self.binary(&y, &scale, &y, BinaryOp::Mul)
    }

    /// ArgMax / ArgMin along one axis.
    fn lower_arg_reduce(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let axis = c.norm_axis(n.attr_i("axis", 0)?, xv.shape.len())?;
        let last = n.attr_i("select_last_index", 0)? != 0;
        let x = self.view(n.inputs[0].expect("p"))?;
        let y = self.alloc(o0);
        if xv.elements() == 0 {
            return Ok(());
        }
        let mut kept = xv.shape.clone();
        kept[axis] = 1;
        let out = View::dense(y.addr, y.dtype, &kept);
        self.arg_index(&c, &x, axis, last, n.op == "ArgMax", &out)
    }

    /// Hardmax: 1 at the first maximum along the axis (of the 2-D `[outer, inner]` view
    /// before opset 13), 0 elsewhere.
    fn lower_hardmax(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let r = xv.shape.len();
        let axis = c.norm_axis(n.attr_i("axis", if c.opset() >= 13 { -1 } else { 1 })?, r)?;
        let shape = if c.opset() >= 13 {
            xv.shape.clone()
        } else {
            vec![
                xv.shape[..axis].iter().product(),
                xv.shape[axis..].iter().product(),
            ]
        };
        let axis = if c.opset() >= 13 { axis } else { 1 };
        let x0 = self.view(n.inputs[0].expect("p"))?;
        let y0 = self.alloc(o0);
        let total = xv.elements();
        if total == 0 {
            return Ok(());
        }
        let x = View::dense(x0.addr, x0.dtype, &shape);
        let y = View::dense(y0.addr, y0.dtype, &shape);
        let mut kept = shape.clone();
        kept[axis] = 1;
        let idx = View::dense(
            self.temp(kept.iter().product::<usize>() * 8),
            DType::I64,
            &kept,
        );
        self.arg_index(&c, &x, axis, false, true, &idx)?;
        let rv = self.index_ramp(&shape, axis);
        let eq = View::dense(self.temp(total), DType::Bool, &shape);
        let ib = idx.broadcast(&shape);
        self.emit_nd(0, Engine::Dve, &[&rv, &ib, &eq], |a| Op::Binary {
            a: a[0],
            b: a[1],
            out: a[2],
            op: BinaryOp::Equal,
        })?;
        self.copy(Engine::Dve, &eq, &y)
    }

    /// `[0, 1, …]` along `axis` of `shape` (a constant, broadcast over the other dims).
    fn index_ramp(&mut self, shape: &[usize], axis: usize) -> View {
        let len = shape[axis];
        let ramp = self.add_const(&HostTensor::ints(
            DType::I64,
            vec![len],
            (0..len as i64).collect(),
        ));
        let mut st = vec![0i64; shape.len()];
        st[axis] = 1;
        View {
            addr: ramp,
            dtype: DType::I64,
            shape: shape.to_vec(),
            strides: st,
        }
    }

    /// The index of the extreme (max, else min) of dense `x` along `axis` into `out` (i64,
    /// `x`'s shape with 1 at `axis`): the extreme (Reduce, kept dims), where each element
    /// equals it (DVE), those elements' indices with the others replaced by a sentinel
    /// (Select from a constant index ramp), and the smallest index (largest with `last`).
    fn arg_index(
        &mut self,
        c: &Ctx,
        x: &View,
        axis: usize,
        last: bool,
        max: bool,
        out: &View,
    ) -> Result<()> {
        let shape = x.shape.clone();
        let total: usize = shape.iter().product();
        let mut kept = shape.clone();
        kept[axis] = 1;
        let kn: usize = kept.iter().product();
        let m = View::dense(self.temp(kn * x.dtype.size()), x.dtype, &kept);
        let extreme = if max { ReduceOp::Max } else { ReduceOp::Min };
        self.reduce(c, x, &m, Some(&[axis]), extreme)?;
        let eq = View::dense(self.temp(total), DType::Bool, &shape);
        let mb = m.broadcast(&shape);
        self.emit_nd(0, Engine::Dve, &[x, &mb, &eq], |a| Op::Binary {
            a: a[0],
            b: a[1],
            out: a[2],
            op: BinaryOp::Equal,
        })?;
        let rv = self.index_ramp(&shape, axis);
        let sentinel = if last { -1 } else { shape[axis] as i64 };
        let sc = self.add_const(&HostTensor::ints(DType::I64, vec![1], vec![sentinel]));
        let sv = View::dense(sc, DType::I64, &[1]).broadcast(&shape);
        let idx = View::dense(self.temp(total * 8), DType::I64, &shape);
        self.emit_nd(0, Engine::Dve, &[&eq, &rv, &sv, &idx], |a| Op::Select {
            cond: a[0],
            a: a[1],
            b: a[2],
            out: a[3],
        })?;
        let pick = if last { ReduceOp::Max } else { ReduceOp::Min };
        self.reduce(c, &idx, out, Some(&[axis]), pick)
    }

    fn lower_reduce(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let x = self.view(n.inputs[0].expect("p"))?;
        let y = self.alloc(o0);
        let axes = params::reduce_axes(&c, xv.shape.len())?;
        let rop = match n.op.as_str() {
            "ReduceMean" => ReduceOp::Mean,
            "ReduceMax" => ReduceOp::Max,
            "ReduceMin" => ReduceOp::Min,
            _ => ReduceOp::Sum,
        };
        let f = |f: ActFunc| (f, 0.0, 0.0);
        // The composite reductions: an elementwise map before the sum, one after.
        let (pre, post) = match n.op.as_str() {
            "ReduceL1" => (Some(f(ActFunc::Abs)), None),
            "ReduceL2" => (Some(f(ActFunc::Square)), Some(f(ActFunc::Sqrt))),
            "ReduceSumSquare" => (Some(f(ActFunc::Square)), None),
            "ReduceLogSum" => (None, Some(f(ActFunc::Log))),
            "ReduceLogSumExp" => {
                // max + ln Σ exp(x − max), the max kept for broadcasting.
                let mut kept = xv.shape.clone();
                if let Some(a) = &axes {
                    for &i in a {
                        kept[i] = 1;
                    }
                }
                let mv = View::dense(
                    self.temp(kept.iter().product::<usize>() * 4),
                    DType::F32,
                    &kept,
                );
                self.reduce(&c, &x, &mv, axes.as_deref(), ReduceOp::Max)?;
                let d = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
                let mb = mv.broadcast(&xv.shape);
                self.emit_nd(0, Engine::Dve, &[&x, &mb, &d], |a| Op::Binary {
                    a: a[0],
                    b: a[1],
                    out: a[2],
                    op: BinaryOp::Sub,
                })?;
                self.activation(&d, &d, None, f(ActFunc::Exp), 1.0)?;
                self.reduce(&c, &d, &y, axes.as_deref(), ReduceOp::Sum)?;
                self.activation(&y, &y, None, f(ActFunc::Log), 1.0)?;
                let m = View::dense(mv.addr, mv.dtype, &y.shape);
                return self.emit_nd(0, Engine::Dve, &[&y, &m, &y], |a| Op::Binary {
                    a: a[0],
                    b: a[1],
                    out: a[2],
                    op: BinaryOp::Add,
                });
            }
            _ => (None, None),
        };
        let src = match pre {
            Some(pf) => {
                let t = View::dense(self.temp(xv.elements() * 4), DType::F32, &xv.shape);
                self.activation(&x, &t, None, pf, 1.0)?;
                t
            }
            None => x,
        };
        self.reduce(&c, &src, &y, axes.as_deref(), rop)?;
        if let Some(pf) = post {
            self.activation(&y, &y, None, pf, 1.0)?;
        }
        Ok(())
    }

    /// Reduces dense `x` over `axes` (`None`: a copy) into dense `y` (same elements as the
    /// kept dimensions).
    fn reduce(
        &mut self,
        c: &Ctx,
        x: &View,
        y: &View,
        axes: Option<&[usize]>,
        rop: ReduceOp,
    ) -> Result<()> {
        let Some(axes) = axes else {
            return self.copy(Engine::Pool, x, &View::dense(y.addr, y.dtype, &x.shape));
        };
        let xs = x.shape.clone();
        if xs.iter().product::<usize>() == 0 {
            if y.shape.iter().product::<usize>() > 0 {
                let v = match rop {
                    ReduceOp::Max => f64::NEG_INFINITY,
                    ReduceOp::Min => f64::INFINITY,
                    ReduceOp::Mean => f64::NAN,
                    ReduceOp::Sum => 0.0,
                };
                self.fill(Engine::Pool, y, v)?;
            }
            return Ok(());
        }
        // Groups of consecutive dims, reduced or kept (size-1 dims dropped).
        let mut groups: Vec<(usize, bool)> = Vec::new();
        for (i, &d) in xs.iter().enumerate() {
            if d == 1 {
                continue;
            }
            let red = axes.contains(&i);
            match groups.last_mut() {
                Some(l) if l.1 == red => l.0 *= d,
                _ => groups.push((d, red)),
            }
        }
        if !groups.iter().any(|g| g.1) {
            return self.copy(Engine::Pool, x, &View::dense(y.addr, y.dtype, &xs));
        }
        // Loop over a leading kept group when there are more than four.
        let (loops, groups) = if groups.len() > 4 {
            if groups[0].1 || groups.len() > 5 {
                return Err(c.e(
                    ErrorKind::UnsupportedOp,
                    "reduction over more than four alternating axis groups",
                ));
            }
            (groups[0].0, groups[1..].to_vec())
        } else {
            (1, groups)
        };
        let ishape: Vec<usize> = groups.iter().map(|g| g.0).collect();
        let oshape: Vec<usize> = groups.iter().map(|g| if g.1 { 1 } else { g.0 }).collect();
        let ist = dense_strides(&ishape);
        let ost = dense_strides(&oshape);
        let mut mask = 0u8;
        for (i, gr) in groups.iter().enumerate() {
            if gr.1 {
                mask |= 1 << (4 - groups.len() + i);
            }
        }
        let in_chunk: usize = ishape.iter().product();
        let out_chunk: usize = oshape.iter().product();
        for l in 0..loops {
            let xa = mk_ap(x.elems((l * in_chunk) as i64), x.dtype, &ishape, &ist)?;
            let ya = mk_ap(y.elems((l * out_chunk) as i64), y.dtype, &oshape, &ost)?;
            self.emit(
                0,
                Engine::Pool,
                Op::Reduce {
                    input: xa,
                    output: ya,
                    op: rop,
                    axes: mask,
                },
            );
        }
        Ok(())
    }

    fn lower_pad(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let o0 = self.out(ni, 0)?;
        let xv = c.input(0)?;
        let (pads, mode, value) = params::pad_params(&c, xv.shape.len())?;
        let x = self.view(n.inputs[0].expect("p"))?;
        let y = self.alloc(o0);
        if y.shape.contains(&0) {
            return Ok(());
        }
        let r = xv.shape.len();
        // Interior: the input (cropped where pads are negative) at its place in the output.
        let mut src = x.clone();
        let mut dst = y.clone();
        let mut inner = vec![0usize; r];
        for (i, &(b, e)) in pads.iter().enumerate() {
            let crop_b = (-b).max(0);
            let len = (xv.shape[i] as i64 - crop_b - (-e).max(0)).max(0) as usize;
            inner[i] = len;
            src = src.slice(i, crop_b, len, 1);
            dst = dst.slice(i, b.max(0), len, 1);
        }
        let any_pad = pads.iter().any(|&(b, e)| b > 0 || e > 0);
        if mode == "constant" && any_pad {
            self.fill(Engine::Pool, &y, value)?;
        }
        self.copy(Engine::Pool, &src, &dst)?;
        if mode == "constant" {
            return Ok(());
        }
        // Axis by axis (like numpy): earlier axes full, later axes interior only.
        for d in 0..r {
            let (b, e) = (pads[d].0.max(0), pads[d].1.max(0));
            if b == 0 && e == 0 {
                continue;
            }
            let mut base = y.clone();
            for k in d + 1..r {
                base = base.slice(k, pads[k].0.max(0), inner[k], 1);
            }
            let nlen = inner[d] as i64;
            let (lsrc, lstep, rsrc, rstep) = match mode.as_str() {
                "edge" => (b, 0, b + nlen - 1, 0),
                "reflect" => (2 * b, -1, b + nlen - 2, -1),
                _ => (nlen, 1, b, 1), // wrap
            };
            if b > 0 {
                let s = base.slice(d, lsrc, b as usize, lstep);
                let t = base.slice(d, 0, b as usize, 1);
                self.copy(Engine::Pool, &s, &t)?;
            }
            if e > 0 {
                let s = base.slice(d, rsrc, e as usize, rstep);
                let t = base.slice(d, b + nlen, e as usize, 1);
                self.copy(Engine::Pool, &s, &t)?;
            }
        }
        Ok(())
    }
}

/// Lowers an inferred graph, plans memory, schedules and emits the model.
pub(crate) fn compile_graph(g: &Graph, opts: &CompileOptions) -> Result<Compiled> {
    let name = opts.name.clone().unwrap_or_else(|| {
        if g.name.is_empty() {
            "model".to_owned()
        } else {
            g.name.clone()
        }
    });
    let mut b = ModelBuilder::new(&name, opts.cores);
    b.producer(concat!("nrt-rs compiler ", env!("CARGO_PKG_VERSION")));
    let dims = |v: ValueId| -> Result<Vec<u32>> {
        let val = &g.values[v];
        if val.shape.len() > nrt_model::MAX_RANK {
            return Err(CompileError::new(
                ErrorKind::UnsupportedOp,
                format!(
                    "I/O tensor '{}' has rank {} > {}",
                    val.name,
                    val.shape.len(),
                    nrt_model::MAX_RANK
                ),
            ));
        }
        val.shape
            .iter()
            .map(|&d| u32::try_from(d).map_err(|_| too_large("an I/O dimension")))
            .collect()
    };
    let mut io = Vec::new();
    let mut names = std::collections::HashSet::new();
    for &v in &g.inputs {
        let val = &g.values[v];
        names.insert(val.name.clone());
        let var = b.input(&val.name, val.dtype, &dims(v)?);
        io.push(IoInfo {
            mem_ref: b.io_mem_ref(var),
            bytes: val.bytes() as u64,
            input: true,
        });
    }
    let mut out_vars: HashMap<ValueId, Vec<u32>> = HashMap::new();
    for &v in &g.outputs {
        let val = &g.values[v];
        if !names.insert(val.name.clone()) {
            return Err(CompileError::new(
                ErrorKind::UnsupportedOp,
                format!(
                    "'{}' is listed twice among the model's inputs and outputs",
                    val.name
                ),
            ));
        }
        let var = b.output(&val.name, val.dtype, &dims(v)?);
        io.push(IoInfo {
            mem_ref: b.io_mem_ref(var),
            bytes: val.bytes() as u64,
            input: false,
        });
        out_vars.entry(v).or_default().push(var);
    }
    // Live nodes: those an output needs (constants need nothing).
    let mut needed = vec![false; g.values.len()];
    for &v in &g.outputs {
        needed[v] = true;
    }
    let mut live = vec![false; g.nodes.len()];
    for (ni, n) in g.nodes.iter().enumerate().rev() {
        let wanted = n
            .outputs
            .iter()
            .flatten()
            .any(|&o| needed[o] && g.values[o].konst.is_none());
        if wanted {
            live[ni] = true;
            for &i in n.inputs.iter().flatten() {
                if g.values[i].konst.is_none() {
                    needed[i] = true;
                }
            }
        }
    }
    let mut consumers = vec![Vec::new(); g.values.len()];
    for (ni, n) in g.nodes.iter().enumerate() {
        if live[ni] {
            for &i in n.inputs.iter().flatten() {
                if !consumers[i].contains(&ni) {
                    consumers[i].push(ni);
                }
            }
        }
    }
    let graph_outputs: std::collections::HashSet<ValueId> = g.outputs.iter().copied().collect();
    let fused = find_activations(g, &live, &consumers, &graph_outputs);
    let mut skip = vec![false; g.nodes.len()];
    for (&root, f) in &fused {
        for &i in &f.nodes {
            skip[i] = i != root;
        }
    }
    let mut l = Lowerer {
        g,
        b,
        cores: opts.cores as u8,
        prog: Vec::new(),
        loc: vec![None; g.values.len()],
        owns: vec![false; g.values.len()],
        dense_cache: HashMap::new(),
        fused,
        temps: Vec::new(),
        const_addr: HashMap::new(),
        io: io.clone(),
        out_vars,
        consumers,
        skip,
        lowered_nodes: 0,
    };
    if !g.inputs.is_empty() {
        let table = l.b.io_descriptor(0);
        l.emit(
            0,
            Engine::Sp,
            Op::DmaDescriptors {
                table,
                count: g.inputs.len() as u32,
            },
        );
    }
    for (k, &v) in g.inputs.iter().enumerate() {
        let val = &g.values[v];
        l.loc[v] = Some(View::dense(
            vaddr(l.b.io_mem_ref(k as u32), 0),
            val.dtype,
            &val.shape,
        ));
    }
    // Outputs that are inputs or constants.
    let mut early: Vec<ValueId> = g
        .outputs
        .iter()
        .copied()
        .filter(|&v| g.values[v].konst.is_some() || g.inputs.contains(&v))
        .collect();
    early.dedup();
    for v in early {
        l.finish_value(v)?;
    }
    for (ni, &is_live) in live.iter().enumerate() {
        if !is_live || l.skip[ni] {
            continue;
        }
        l.lowered_nodes += 1;
        let n = &g.nodes[ni];
        l.lower_node(ni).map_err(|e| e.at_node(&n.name, &n.op))?;
        for &o in n.outputs.iter().flatten() {
            if l.loc[o].is_some() {
                l.finish_value(o).map_err(|e| e.at_node(&n.name, &n.op))?;
            }
        }
    }
    let Lowerer {
        b: mut builder,
        prog: mut program,
        temps,
        io,
        lowered_nodes,
        ..
    } = l;

    // Liveness of the temporaries, then placement.
    let mut iv: Vec<Interval> = temps
        .iter()
        .map(|&s| Interval {
            size: s,
            first: usize::MAX,
            last: 0,
        })
        .collect();
    for (i, (_, _, ins)) in program.iter_mut().enumerate() {
        for_each_ap_mut(&mut ins.op, |ap, _| {
            if let Some((mr, _)) = split_vaddr(ap.addr)
                && mr >= TEMP_BASE
            {
                let t = &mut iv[(mr - TEMP_BASE) as usize];
                t.first = t.first.min(i);
                t.last = t.last.max(i);
            }
        });
    }
    for t in &mut iv {
        if t.first == usize::MAX {
            t.size = 0;
            t.first = 0;
        }
    }
    let p = plan(&iv, 64);
    if p.arena_bytes > 0 {
        let arena = builder.scratch(0, p.arena_bytes, 64);
        for (_, _, ins) in program.iter_mut() {
            for_each_ap_mut(&mut ins.op, |ap, _| {
                if let Some((mr, off)) = split_vaddr(ap.addr)
                    && mr >= TEMP_BASE
                {
                    ap.addr = vaddr(arena, p.offsets[(mr - TEMP_BASE) as usize] + off);
                }
            });
        }
    }
    let desc = if io.is_empty() {
        None
    } else {
        Some(split_vaddr(builder.io_descriptor(0)).expect("vaddr").0)
    };
    let streams = schedule(&program, opts.cores as usize, &io, desc);
    let mut counts = vec![[0usize; nrt_hal::NUM_ENGINES]; opts.cores as usize];
    for (s, instrs) in streams.into_iter().enumerate() {
        let core = (s / nrt_hal::NUM_ENGINES) as u8;
        let engine = Engine::ALL[s % nrt_hal::NUM_ENGINES];
        counts[core as usize][engine.index()] = instrs.len();
        for ins in instrs {
            builder.push(core, engine, ins);
        }
    }
    let model = builder.build();
    let model = CompiledModel::decode(&model.encode()).map_err(|e| {
        CompileError::new(
            ErrorKind::Internal,
            format!("the emitted model does not validate: {e:?}"),
        )
    })?;
    let folded = g
        .nodes
        .iter()
        .filter(|n| {
            n.outputs
                .iter()
                .flatten()
                .all(|&o| g.values[o].konst.is_some())
        })
        .count();
    let report = PlanReport {
        mem_refs: model.mem_refs.len(),
        arena_bytes: p.arena_bytes,
        live_bytes_lower_bound: p.lower_bound,
        constant_bytes: model.constants.len() as u64,
        instructions: counts,
        specialized_inputs: g.specialized.clone(),
        nodes: (g.nodes.len(), folded, lowered_nodes),
    };
    Ok(Compiled { model, report })
}
