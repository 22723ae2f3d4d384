//! The back end, stage by stage: I/O and live nodes (dead-node removal), activation fusion,
//! lowering of every live node ([`crate::lower`]), liveness of the temporaries, arena
//! placement ([`crate::plan`]), scheduling ([`crate::schedule`]), emission and its decode
//! round trip, and the report.

use crate::error::{CompileError, ErrorKind, Result};
use crate::fuse::find_activations;
use crate::graph::{Graph, ValueId};
use crate::lower::{
    Lowerer, View,
    view::{TEMP_BASE, too_large},
};
use crate::plan::{Interval, plan};
use crate::schedule::{IoInfo, for_each_ap_mut, schedule};
use crate::{CompileOptions, Compiled, PlanReport};
use nrt_hal::Engine;
use nrt_isa::Op;
use nrt_isa::op;
use nrt_model::{CompiledModel, ModelBuilder};
use nrt_model::{split_vaddr, vaddr};
use std::collections::HashMap;

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
    let auto_cast = match opts.auto_cast {
        crate::AutoCast::None => None,
        crate::AutoCast::MatMult | crate::AutoCast::All => Some(opts.auto_cast_type.dtype()),
    };
    match auto_cast {
        None => b.producer(concat!("nrt-rs compiler ", env!("CARGO_PKG_VERSION"))),
        Some(d) => b.producer(&format!(
            "{}; auto-cast {} {d}",
            concat!("nrt-rs compiler ", env!("CARGO_PKG_VERSION")),
            if opts.auto_cast == crate::AutoCast::All {
                "all"
            } else {
                "matmult"
            }
        )),
    };
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
    let mut shape_vars: HashMap<ValueId, u32> = HashMap::new();
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
        // A value whose extent depends on the data: its static upper bound above, and right
        // after it the i64 companion `<name>:shape` the device writes its actual shape to.
        if g.bounded.contains(&v) {
            let name = format!("{}:shape", val.name);
            if !names.insert(name.clone()) {
                return Err(CompileError::new(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "'{name}' (the actual shape of output '{}') is already a name of the model",
                        val.name
                    ),
                ));
            }
            let rank = val.shape.len();
            let var = b.output(&name, nrt_hal::DType::I64, &[rank as u32]);
            io.push(IoInfo {
                mem_ref: b.io_mem_ref(var),
                bytes: 8 * rank as u64,
                input: false,
            });
            shape_vars.insert(v, var);
        }
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
            for i in n.reads() {
                if g.values[i].konst.is_none() {
                    needed[i] = true;
                }
            }
        }
    }
    let mut consumers = vec![Vec::new(); g.values.len()];
    for (ni, n) in g.nodes.iter().enumerate() {
        if live[ni] {
            for i in n.reads() {
                if !consumers[i].contains(&ni) {
                    consumers[i].push(ni);
                }
            }
        }
    }
    let in_place = declare_in_place(g, opts, &mut b, &consumers, &out_vars)?;
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
        auto_cast,
        cast_addr: HashMap::new(),
        packed_addr: HashMap::new(),
        qpacked_addr: HashMap::new(),
        prog: Vec::new(),
        guards: Vec::new(),
        guard: None,
        guard_ap: None,
        loc: vec![None; g.values.len()],
        owns: vec![false; g.values.len()],
        dense_cache: HashMap::new(),
        fused,
        temps: Vec::new(),
        const_addr: HashMap::new(),
        io: io.clone(),
        out_vars,
        shape_vars,
        consumers,
        in_place,
        skip,
        lowered_nodes: 0,
    };
    if !g.inputs.is_empty() {
        let table = l.b.io_descriptor(0);
        l.emit(
            0,
            Engine::Sp,
            Op::DmaDescriptors(op::DmaDescriptors {
                table,
                count: g.inputs.len() as u32,
            }),
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
        l.set_guard(n.guard)
            .and_then(|()| l.lower_node(ni))
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        for &o in n.outputs.iter().flatten() {
            if l.loc[o].is_some() {
                l.finish_value(o).map_err(|e| e.at_node(&n.name, &n.op))?;
            }
        }
    }
    let Lowerer {
        b: mut builder,
        prog,
        guards,
        temps,
        io,
        lowered_nodes,
        ..
    } = l;

    // Predication (a run-time If): each engine's guarded instructions behind an Op::Guard.
    let mut program = crate::lower::predicate(prog, &guards);
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
    let image = model
        .try_encode()
        .map_err(|e| CompileError::new(ErrorKind::TooLarge, e.to_string()))?;
    drop(model);
    let model = CompiledModel::decode(&image).map_err(|e| {
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

/// Checks and declares the in-place pairs of [`CompileOptions::in_place`]: output `o` must be
/// what a `ScatterND` of input `i` produces, with `i` read by nothing else (the program reads
/// the old rows from `o`'s buffer, which is `i`'s tensor at run time). Returns the outputs
/// whose scatter skips its copy.
fn declare_in_place(
    g: &Graph,
    opts: &CompileOptions,
    b: &mut ModelBuilder,
    consumers: &[Vec<usize>],
    out_vars: &HashMap<ValueId, Vec<u32>>,
) -> Result<std::collections::HashSet<ValueId>> {
    let mut set = std::collections::HashSet::new();
    let err = |m: String| CompileError::new(ErrorKind::UnsupportedOp, m);
    for (out_name, in_name) in &opts.in_place {
        let find = |list: &[ValueId], what: &str, name: &str| {
            list.iter()
                .position(|&v| g.values[v].name == *name)
                .ok_or_else(|| err(format!("in-place pair: the model has no {what} '{name}'")))
        };
        let ik = find(&g.inputs, "input", in_name)?;
        let ok = find(&g.outputs, "output", out_name)?;
        let (iv, ov) = (g.inputs[ik], g.outputs[ok]);
        let (iva, ova) = (&g.values[iv], &g.values[ov]);
        if iva.dtype != ova.dtype || iva.shape != ova.shape {
            return Err(err(format!(
                "in-place pair: output '{out_name}' is {:?} {} but input '{in_name}' is {:?} {}",
                ova.shape, ova.dtype, iva.shape, iva.dtype
            )));
        }
        let producer = g
            .nodes
            .iter()
            .enumerate()
            .find(|(_, n)| n.outputs.first().copied().flatten() == Some(ov));
        let scatter = producer.filter(|(_, n)| {
            n.op == "ScatterND" && n.inputs.first().copied().flatten() == Some(iv)
        });
        let Some((ni, _)) = scatter else {
            return Err(err(format!(
                "in-place pair: output '{out_name}' must be a ScatterND into input '{in_name}' \
                 (it is produced by {})",
                producer.map_or("no node".to_owned(), |(_, n)| format!(
                    "{} '{}'",
                    n.op, n.name
                ))
            )));
        };
        if consumers[iv].iter().any(|&c| c != ni) {
            return Err(err(format!(
                "in-place pair: input '{in_name}' is read by other nodes than the ScatterND \
                 into output '{out_name}' (read the output instead: it holds the updated state)"
            )));
        }
        let vars = out_vars.get(&ov).map_or(&[][..], Vec::as_slice);
        if set.contains(&ov) || vars.len() != 1 {
            return Err(err(format!(
                "in-place pair: output '{out_name}' is also another output of the model"
            )));
        }
        set.insert(ov);
        b.in_place(vars[0], ik as u32);
    }
    Ok(set)
}
