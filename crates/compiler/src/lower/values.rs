//! Value placement: where each value lives (its input or output buffer, its part of a
//! Concat, a constant, a temporary, or a view of another value), allocation, and writing
//! results in place.

use super::{Lowerer, View};
use crate::error::{CompileError, ErrorKind, Result};
use crate::graph::{Node, ValueId};
use crate::params;
use crate::params::Ctx;
use nrt_hal::Engine;
use nrt_isa::Op;
use nrt_isa::op;
use nrt_model::vaddr;

impl<'a> Lowerer<'a> {
    /// Where value `v` lives: a strided view (constants are materialized on first use).
    pub(crate) fn sview(&mut self, v: ValueId) -> Result<View> {
        let val = &self.g.values[v];
        if let Some(k) = &val.konst {
            let (dtype, shape) = (val.dtype, val.shape.clone());
            let a = match self.const_addr.get(&v) {
                Some(&a) => a,
                None => {
                    let k = k.clone();
                    let a = self.add_const(&k)?;
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

    /// Input `i` of node `n` (present: inference checked the node's arity).
    pub(crate) fn input_id(n: &Node, i: usize) -> Result<ValueId> {
        n.inputs.get(i).copied().flatten().ok_or_else(|| {
            n.error(
                ErrorKind::Internal,
                format!("input {i} is absent at lowering"),
            )
        })
    }

    /// [`Self::sview`] of node `n`'s input `i`.
    pub(crate) fn input_sview(&mut self, n: &Node, i: usize) -> Result<View> {
        self.sview(Self::input_id(n, i)?)
    }

    /// A unary operator's operands: the dense view of `n`'s input 0, and its output `o0`
    /// allocated.
    pub(crate) fn unary_io(&mut self, n: &Node, o0: ValueId) -> Result<(View, View)> {
        let x = self.input_view(n, 0)?;
        Ok((x, self.alloc(o0)))
    }

    /// [`Self::view`] of node `n`'s input `i`.
    pub(crate) fn input_view(&mut self, n: &Node, i: usize) -> Result<View> {
        self.view(Self::input_id(n, i)?)
    }

    /// A dense row-major view of `v`: its storage, or (made once, then reused) a dense copy
    /// when `v` is a strided view of another value.
    pub(crate) fn view(&mut self, v: ValueId) -> Result<View> {
        let s = self.sview(v)?;
        if s.is_dense() {
            return Ok(View::dense(s.addr, s.dtype, &s.shape));
        }
        // Keyed by the guard too: a copy made in a predicated branch exists only when the
        // branch ran.
        if let Some(d) = self.dense_cache.get(&(v, self.guard)) {
            return Ok(d.clone());
        }
        let bytes = s.shape.iter().product::<usize>() * s.dtype.size();
        let d = View::dense(self.temp(bytes), s.dtype, &s.shape);
        self.copy(Engine::Pool, &s, &d)?;
        self.dense_cache.insert((v, self.guard), d.clone());
        Ok(d)
    }

    /// The Concat that `v` is an input of (once) and the only reader of, with `v`'s offset
    /// along its axis: `(concat node, output, axis, offset)`.
    pub(crate) fn concat_of(&self, v: ValueId) -> Option<(usize, ValueId, usize, usize)> {
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
    pub(crate) fn concat_slot(&mut self, v: ValueId, dense_only: bool) -> Option<View> {
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
    pub(crate) fn alloc(&mut self, v: ValueId) -> View {
        if let Some(part) = self.concat_slot(v, true) {
            let val = &self.g.values[v];
            return View::dense(part.addr, val.dtype, &val.shape);
        }
        self.alloc_plain(v)
    }

    /// [`Self::alloc`] without the Concat placement.
    pub(crate) fn alloc_plain(&mut self, v: ValueId) -> View {
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
    pub(crate) fn alloc_any(&mut self, v: ValueId) -> Result<View> {
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
    pub(crate) fn in_place(&mut self, x: ValueId, readers: &[usize], out: ValueId) -> Option<View> {
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
    pub(crate) fn alloc_over(
        &mut self,
        x: ValueId,
        readers: &[usize],
        out: ValueId,
    ) -> Result<View> {
        match self.in_place(x, readers, out) {
            Some(v) => Ok(v),
            None => self.alloc_any(out),
        }
    }

    /// Makes `o` the view `x` (no copy), or copies `x` into `o`'s output buffer when `o`
    /// is a graph output.
    pub(crate) fn alias_or_copy(&mut self, o: ValueId, x: View) -> Result<()> {
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

    /// Where the actual shape of `v` (an output whose extent depends on the data) is
    /// written: its `<name>:shape` output buffer, or a temporary when `v` is not a graph
    /// output (an unused output of its node). A dense i64 `[rank]` view.
    pub(crate) fn shape_out(&mut self, v: ValueId) -> View {
        let rank = self.g.values[v].shape.len();
        let addr = match self.shape_vars.get(&v) {
            Some(&var) => vaddr(self.b.io_mem_ref(var), 0),
            None => self.temp(8 * rank),
        };
        View::dense(addr, nrt_hal::DType::I64, &[rank])
    }

    /// After `v` is final: copies it into any output buffer it is not already in, then
    /// stores and notifies those outputs (and its `<name>:shape` companion).
    pub(crate) fn finish_value(&mut self, v: ValueId) -> Result<()> {
        let Some(vars) = self.out_vars.get(&v).cloned() else {
            return Ok(());
        };
        let src = self.sview(v)?;
        let companion = self.shape_vars.get(&v).copied();
        for j in vars.into_iter().chain(companion) {
            let dst_addr = vaddr(self.b.io_mem_ref(j), 0);
            // (a companion `<name>:shape` was written in place by the value's producer)
            if Some(j) != companion && (src.addr != dst_addr || !src.is_dense()) {
                let dst = View::dense(dst_addr, src.dtype, &src.shape);
                self.copy(Engine::Dve, &src, &dst)?;
            }
            let table = self.b.io_descriptor(j);
            self.emit(
                0,
                Engine::Sp,
                Op::DmaDescriptors(op::DmaDescriptors { table, count: 1 }),
            );
            self.emit(
                0,
                Engine::Sp,
                Op::Notify(op::Notify {
                    subtype: 6,
                    sub_id: 7,
                    payload: j,
                }),
            );
        }
        Ok(())
    }
}
