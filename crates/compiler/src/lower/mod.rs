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
use crate::fuse::Fusion;
use crate::graph::{Graph, Guard, Node, ValueId};
use crate::ops;
use crate::params::Ctx;
use crate::schedule::IoInfo;
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, BinaryOp, Instruction, Op};
use nrt_model::{ModelBuilder, vaddr};
use std::collections::HashMap;
use view::{TEMP_BASE, fill_bits, mk_ap, simplify};

mod values;
pub(crate) mod view;

pub(crate) use view::View;

pub(crate) struct Lowerer<'a> {
    pub(crate) g: &'a Graph,
    pub(crate) b: ModelBuilder,
    pub(crate) cores: u8,
    /// The element type constant MatMul/Gemm weights are cast to (`--auto-cast`), if any.
    pub(crate) auto_cast: Option<DType>,
    /// Cast weights already stored, by value: their `[N, K]` constant.
    pub(crate) cast_addr: HashMap<ValueId, u64>,
    /// Weights already packed in panels (`matmul_flags::PACKED_B`), by value and whether
    /// the value holds `[N, K]`, and the element offset of the matrix in it (a recurrent
    /// layer packs each direction's weights): the packed constant.
    pub(crate) packed_addr: HashMap<(ValueId, bool, usize), u64>,
    /// Integer-product weights already stored packed (`qmatmul_layout`), by value.
    pub(crate) qpacked_addr: HashMap<ValueId, u64>,
    pub(crate) prog: Vec<(u8, Engine, Instruction)>,
    /// The guard of each instruction of `prog` (its condition's access pattern and the value
    /// under which it runs): [`predicate`] turns them into [`Op::Guard`] instructions.
    pub(crate) guards: Vec<Option<(AccessPattern, bool)>>,
    /// The guard of the node being lowered, and its access pattern.
    pub(crate) guard: Option<Guard>,
    pub(crate) guard_ap: Option<(AccessPattern, bool)>,
    /// Where each computed value lives: a dense view of its own storage, or a strided view
    /// of another value's (layout operators only describe, never copy).
    pub(crate) loc: Vec<Option<View>>,
    /// Whether the value's storage is a temporary allocated for it (it may then be
    /// overwritten in place by its only consumer).
    pub(crate) owns: Vec<bool>,
    /// Dense copies of values whose view is strided, made for consumers that need them (by
    /// value and the guard they were made under).
    pub(crate) dense_cache: HashMap<(ValueId, Option<Guard>), View>,
    /// Activations recognized from decompositions (GELU), by the node that ends them.
    pub(crate) fused: HashMap<usize, Fusion>,
    pub(crate) temps: Vec<u64>,
    pub(crate) const_addr: HashMap<ValueId, u64>,
    pub(crate) io: Vec<IoInfo>,
    /// Output var_ids of each value.
    pub(crate) out_vars: HashMap<ValueId, Vec<u32>>,
    /// The `<name>:shape` output var_id of each output whose extent depends on the data.
    pub(crate) shape_vars: HashMap<ValueId, u32>,
    /// Live consumers of each value (nodes).
    pub(crate) consumers: Vec<Vec<usize>>,
    /// Outputs declared in place over an input ([`crate::CompileOptions::in_place`]): their
    /// buffer already holds the input's data when the program starts, so their `ScatterND`
    /// writes only the updates.
    pub(crate) in_place: std::collections::HashSet<ValueId>,
    pub(crate) skip: Vec<bool>,
    pub(crate) lowered_nodes: usize,
}

/// The node being lowered, with what every operator's lowering reads first.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub ni: usize,
    pub g: &'a Graph,
    pub n: &'a Node,
    pub c: Ctx<'a>,
    pub op: &'a str,
    /// The first output, its shape and element type.
    pub o0: ValueId,
    pub oshape: &'a [usize],
    pub odt: DType,
}

impl<'a> Lowerer<'a> {
    pub(crate) fn emit(&mut self, core: u8, engine: Engine, op: Op) {
        self.prog.push((core, engine, Instruction::new(op)));
        self.guards.push(self.guard_ap);
    }

    /// Lowers what follows under `guard` (the node's): its condition is a one-element value
    /// computed earlier.
    pub(crate) fn set_guard(&mut self, guard: Option<Guard>) -> Result<()> {
        self.guard = guard;
        self.guard_ap = match guard {
            None => None,
            Some(gd) => {
                let v = self.sview(gd.cond)?;
                Some((View::dense(v.addr, v.dtype, &[1]).ap()?, gd.when))
            }
        };
        Ok(())
    }

    /// Emits a row operation — one whose operands all have `op`'s shape (broadcast ones
    /// with stride 0) and whose rows, dimensions 0..=2, are independent (softmax and layer
    /// normalization over dimension 3) — split between the cores when there are two and it
    /// is large enough ([`nrt_hal::tuning::SPLIT_ROW_OP_MIN_ELEMENTS`]): each core takes half
    /// of the outermost dimension of size ≥ 2 below dimension 3. Without that split, a
    /// two-core encoder ran its softmax and layer norms on core 0 while core 1 waited.
    pub(crate) fn emit_rows(&mut self, engine: Engine, op: Op) {
        let mut shapes = Vec::new();
        op.operands(|o| shapes.push(o.ap.shape));
        let shape = shapes[0];
        let elements: u64 = shape.iter().map(|&d| d as u64).product();
        let dim = (0..3).find(|&d| shape[d] >= 2);
        let (Some(d), true, true) = (
            dim,
            self.cores >= 2,
            elements >= nrt_hal::tuning::SPLIT_ROW_OP_MIN_ELEMENTS as u64,
        ) else {
            return self.emit(0, engine, op);
        };
        if shapes.iter().any(|s| s[d] != shape[d]) {
            return self.emit(0, engine, op);
        }
        let half = shape[d] / 2;
        for (core, start, len) in [(0u8, 0u32, half), (1u8, half, shape[d] - half)] {
            let mut part = op;
            part.operands_mut(|o| {
                let es = o.ap.dtype.size() as i64;
                o.ap.shape[d] = len;
                o.ap.addr = (o.ap.addr as i64 + start as i64 * o.ap.stride[d] as i64 * es) as u64;
            });
            self.emit(core, engine, part);
        }
    }

    /// A POOL reduction of `input` into `output` over the dimensions in `axes`.
    pub(crate) fn emit_reduce(
        &mut self,
        input: AccessPattern,
        output: AccessPattern,
        op: nrt_isa::ReduceOp,
        axes: u8,
    ) {
        let r = Op::Reduce(op::Reduce {
            input,
            output,
            op,
            axes,
        });
        self.emit(0, Engine::Pool, r);
    }

    /// `x` in element type `dt`: itself, or a converting DVE copy into a dense temporary.
    pub(crate) fn converted(&mut self, x: View, dt: DType) -> Result<View> {
        if x.dtype == dt {
            return Ok(x);
        }
        let t = View::dense(
            self.temp(x.shape.iter().product::<usize>() * dt.size()),
            dt,
            &x.shape,
        );
        self.copy(Engine::Dve, &x, &t)?;
        Ok(t)
    }

    pub(crate) fn temp(&mut self, bytes: usize) -> u64 {
        let id = self.temps.len() as u32;
        self.temps.push(bytes as u64);
        vaddr(TEMP_BASE + id, 0)
    }

    pub(crate) fn add_const(&mut self, t: &HostTensor) -> Result<u64> {
        let bytes = t.try_to_bytes("a constant")?;
        let mr = self.b.try_constant(&bytes, 64).map_err(|_| {
            CompileError::new(
                ErrorKind::TooLarge,
                format!(
                    "a constant of {} bytes does not fit in the compiler's memory beside the \
                     {} bytes of constants before it",
                    bytes.len(),
                    self.b.constants_len()
                ),
            )
        })?;
        Ok(vaddr(mr, 0))
    }

    /// Emits `f` over views of one shared shape, merging and looping dimensions.
    pub(crate) fn emit_nd(
        &mut self,
        core: u8,
        engine: Engine,
        views: &[&View],
        f: impl Fn(&[AccessPattern]) -> Op,
    ) -> Result<()> {
        let owned: Vec<View> = views.iter().map(|v| (*v).clone()).collect();
        self.emit_nd_dyn(core, engine, &owned, &f)
    }

    pub(crate) fn emit_nd_dyn(
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

    pub(crate) fn copy(&mut self, engine: Engine, src: &View, dst: &View) -> Result<()> {
        self.emit_nd(0, engine, &[src, dst], |a| {
            Op::Copy(op::Copy {
                input: a[0],
                output: a[1],
            })
        })
    }

    pub(crate) fn fill(&mut self, engine: Engine, dst: &View, value: f64) -> Result<()> {
        let bits = fill_bits(dst.dtype, value);
        self.emit_nd(0, engine, &[dst], |a| {
            Op::Fill(op::Fill { out: a[0], bits })
        })
    }

    pub(crate) fn activation(
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
        self.emit_nd(0, Engine::Act, &views, |a| {
            Op::Activation(op::Activation {
                input: a[0],
                output: a[1],
                bias: a.get(2).copied(),
                func,
                scale,
                alpha,
                beta,
            })
        })
    }

    /// The single live consumer of `v`, if `v` has exactly one, is not a graph output, and
    /// runs under the guard of the node being lowered: what a producer may fuse with (an
    /// epilogue, a folded BatchNormalization, a write into a Concat's part) — never across
    /// the edge of a predicated branch, whose nodes must not run when it is not taken.
    pub(crate) fn sole_consumer(&self, v: ValueId) -> Option<usize> {
        if self.out_vars.contains_key(&v) || self.consumers[v].len() != 1 {
            return None;
        }
        let j = self.consumers[v][0];
        (self.g.nodes[j].guard == self.guard).then_some(j)
    }

    /// Makes `v` available now by lowering its producer ahead of its place in model order,
    /// when `v` is not yet computed and the producer is one plain node (no control flow,
    /// not part of a recognized pattern, under the current guard) whose inputs all are:
    /// how a fused operand (the scale of a dequantizing product, computed from two scalars
    /// after the product in model order) becomes available to the instruction that reads
    /// it. Returns whether `v` is available.
    pub(crate) fn hoist_producer(&mut self, v: ValueId) -> Result<bool> {
        let g = self.g;
        if g.values[v].konst.is_some() || self.loc[v].is_some() {
            return Ok(true);
        }
        let Some(p) = g
            .nodes
            .iter()
            .position(|n| n.outputs.iter().flatten().any(|&o| o == v))
        else {
            return Ok(false);
        };
        let n = &g.nodes[p];
        let ready = |x: ValueId| g.values[x].konst.is_some() || self.loc[x].is_some();
        if self.skip[p]
            || self.fused.contains_key(&p)
            || self.fused.values().any(|f| f.nodes.contains(&p))
            || n.guard != self.guard
            || matches!(n.op.as_str(), "If" | "Loop" | "Scan")
            || !n.inputs.iter().flatten().all(|&x| ready(x))
        {
            return Ok(false);
        }
        self.skip[p] = true;
        self.lowered_nodes += 1;
        self.lower_node(p).map_err(|e| e.at_node(&n.name, &n.op))?;
        for &o in n.outputs.iter().flatten() {
            if self.loc[o].is_some() {
                self.finish_value(o)
                    .map_err(|e| e.at_node(&n.name, &n.op))?;
            }
        }
        Ok(self.loc[v].is_some())
    }

    pub(crate) fn out(&self, ni: usize, k: usize) -> Result<ValueId> {
        self.g.nodes[ni]
            .outputs
            .get(k)
            .copied()
            .flatten()
            .ok_or_else(|| CompileError::new(ErrorKind::Internal, "missing output"))
    }

    /// A compile-time scalar broadcast to `shape`.
    pub(crate) fn scalar(&mut self, v: f32, shape: &[usize]) -> Result<View> {
        let a = self.add_const(&HostTensor::f32(vec![1], vec![v]))?;
        // Rank-matched ones (a rank-0 `shape` included), then broadcast.
        Ok(View::dense(a, DType::F32, &vec![1; shape.len()]).broadcast(shape))
    }

    /// Allocates output `o` and copies `src` into it on `engine`.
    pub(crate) fn copy_out(&mut self, engine: Engine, src: &View, o: ValueId) -> Result<()> {
        let y = self.alloc(o);
        self.copy(engine, src, &y)
    }

    /// `out = a ∘ b` on DVE.
    pub(crate) fn binary(&mut self, a: &View, b: &View, out: &View, op: BinaryOp) -> Result<()> {
        self.emit_nd(0, Engine::Dve, &[a, b, out], |x| {
            Op::Binary(op::Binary {
                a: x[0],
                b: x[1],
                out: x[2],
                op,
            })
        })
    }

    /// `out = a ∘ s` on DVE.
    pub(crate) fn tensor_scalar(
        &mut self,
        a: &View,
        out: &View,
        op: BinaryOp,
        s: f32,
    ) -> Result<()> {
        self.emit_nd(0, Engine::Dve, &[a, out], |x| {
            Op::TensorScalar(op::TensorScalar {
                a: x[0],
                out: x[1],
                op,
                scalar: s,
                reverse: false,
            })
        })
    }

    /// `out = cond ? a : b` on DVE.
    pub(crate) fn select(&mut self, cond: &View, a: &View, b: &View, out: &View) -> Result<()> {
        self.emit_nd(0, Engine::Dve, &[cond, a, b, out], |x| {
            Op::Select(op::Select {
                cond: x[0],
                a: x[1],
                b: x[2],
                out: x[3],
            })
        })
    }

    /// Lowers one node: a recognized activation, else its operator's lowering in [`ops`].
    pub(crate) fn lower_node(&mut self, ni: usize) -> Result<()> {
        let g = self.g;
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        let op = n.op.as_str();
        // The first output the model uses (an RNN's Y may be omitted, leaving Y_h).
        let o0 = match n.outputs.iter().flatten().next() {
            Some(&v) => v,
            None => self.out(ni, 0)?,
        };
        let oshape = &g.values[o0].shape[..];
        let odt = g.values[o0].dtype;
        let at = At {
            ni,
            g,
            n,
            c,
            op,
            o0,
            oshape,
            odt,
        };
        if let Some(f) = self.fused.get(&ni).cloned() {
            // The end of a recognized activation: one ACT pass (in place when it can be).
            let x = self.sview(f.x)?;
            let bias = match f.bias {
                Some(b) => Some(self.sview(b)?.broadcast(oshape)),
                None => None,
            };
            let y = self.alloc_over(f.x, &f.nodes, o0)?;
            return self.activation(&x, &y, bias.as_ref(), (f.func, 0.0, 0.0), 1.0);
        }
        match ops::get(op).and_then(|d| d.lower) {
            Some(lower) => lower(self, at),
            None => Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("operator '{op}' cannot be computed on the device here (dtype {odt})"),
            )),
        }
    }
}

/// Brackets the guarded instructions of `prog` (`guards`, one per instruction): on each
/// core's engine, a [`Op::Guard`] goes before the first instruction whose guard differs from
/// the one before it on that engine (lifting it when the new one is none). The engine's
/// instructions keep their program order (the scheduler keeps each stream's order), so the
/// guard covers exactly them; its condition is an operand like any other, so the scheduler
/// orders it after the condition's producer and the planner keeps the condition alive.
pub(crate) fn predicate(
    prog: Vec<(u8, Engine, Instruction)>,
    guards: &[Option<(AccessPattern, bool)>],
) -> Vec<(u8, Engine, Instruction)> {
    if guards.iter().all(Option::is_none) {
        return prog;
    }
    let mut current: HashMap<(u8, Engine), Option<(AccessPattern, bool)>> = HashMap::new();
    let mut out = Vec::with_capacity(prog.len() + guards.len() / 4);
    for ((core, engine, ins), &want) in prog.into_iter().zip(guards) {
        let now = current.entry((core, engine)).or_insert(None);
        if *now != want {
            let op = match want {
                Some((cond, when)) => Op::Guard(op::Guard {
                    cond: Some(cond),
                    when,
                }),
                None => Op::Guard(op::Guard {
                    cond: None,
                    when: false,
                }),
            };
            out.push((core, engine, Instruction::new(op)));
            *now = want;
        }
        out.push((core, engine, ins));
    }
    out
}
