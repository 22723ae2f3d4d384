//! Static shape inference and constant folding.
//!
//! Nodes are visited in topological order. Each gets its outputs' element types and shapes
//! from its operator's entry in [`crate::ops`]; a node whose inputs are all constants (and
//! whose operator folds) is evaluated at compile time by its operator's folding hook
//! ([`crate::eval`]), and operators that only need shapes (`Shape`, `Size`) or compile-time
//! inputs (`ConstantOfShape`, `Range`) always fold. Inputs that decide shapes (Reshape's
//! shape, Slice's starts, Pad's pads, Resize's sizes…) must be constants here, possibly
//! through `input_values` specialization.
//!
//! The operator parameter helpers (`slice_params`, `window_params`, …) live in
//! [`crate::params`], shared with folding and lowering.

use crate::error::{ErrorKind, Result};
use crate::graph::{Graph, Guard};
use crate::ops::{self, Fold};
use crate::params::Ctx;
use crate::tensor::{HostTensor, budget};
use nrt_hal::DType;
use std::rc::Rc;

/// Gives the `count` nodes from `at` the guard `guard`: the nodes that replaced a node of a
/// predicated `If` branch (its decomposition, an unrolled body) run under its condition.
fn inherit_guard(g: &mut Graph, at: usize, count: usize, guard: Option<Guard>) {
    if guard.is_some() {
        for n in &mut g.nodes[at..at + count] {
            n.guard = guard;
        }
    }
}

/// Whether node `c`'s fold (outputs `outs`) may run on the host: its working set
/// ([`nrt_hal::tuning::FOLD_WORKING_SET_FACTOR`] × its outputs' host bytes, plus a copy of
/// its inputs) must be memory the host can give now (see [`crate::tensor::host_can_hold`]).
/// A fold it cannot hold stays on the device when the device computes the operator;
/// otherwise the error says why.
fn fold_fits_host(c: &Ctx, outs: &[crate::params::Out], def: &ops::OpDef) -> Result<bool> {
    // The evaluator holds floating values as f32 and the others as i64.
    let held = |elems: usize, float: bool| elems.saturating_mul(if float { 4 } else { 8 });
    let outputs = outs
        .iter()
        .map(|o| {
            let elems = o.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            held(
                elems.unwrap_or(usize::MAX),
                crate::tensor::is_float(o.dtype),
            )
        })
        .fold(0usize, usize::saturating_add);
    // Some folds also copy an input whole (a reduction's values as f32).
    let inputs = (0..c.n.inputs.len())
        .filter_map(|i| c.konst(i))
        .map(|t| held(t.len(), matches!(t.data, crate::tensor::Data::F32(_))))
        .fold(0usize, usize::saturating_add);
    let bytes = outputs
        .saturating_mul(nrt_hal::tuning::FOLD_WORKING_SET_FACTOR)
        .saturating_add(inputs);
    if crate::tensor::host_can_hold(bytes) {
        return Ok(true);
    }
    if !matches!(def.fold, Fold::Only) && def.check_device_dtypes(c).is_ok() {
        return Ok(false);
    }
    Err(c.e(
        ErrorKind::TooLarge,
        format!(
            "folding this node on the host needs ~{bytes} bytes, more than the host can give \
             now, and the device cannot compute it instead"
        ),
    ))
}

/// Infers every value's type and shape and folds what can be computed at compile time.
pub fn infer(g: &mut Graph) -> Result<()> {
    infer_span(g, 0, 0)
}

/// Infers the nodes from `ni` up to the last `tail` nodes (which stay as they are; nodes
/// inserted before them by inlining and expansion are inferred too). A `Loop` infers each
/// unrolled iteration this way before it decides whether another one runs.
pub(crate) fn infer_span(g: &mut Graph, mut ni: usize, tail: usize) -> Result<()> {
    // A node widened from a half type: its index after the inserted casts, and the type
    // its f32 outputs go back to (see `crate::widen`).
    let mut widened: Option<(usize, DType)> = None;
    while ni + tail < g.nodes.len() {
        // An If with a compile-time condition becomes its branch's nodes, inferred next; one
        // with a run-time condition becomes both branches' nodes, predicated and inferred
        // now, and the nodes that select its outputs, inferred next.
        if g.nodes[ni].op == "If" {
            ni = crate::graph::inline_if(g, ni)?;
            continue;
        }
        // A Scan becomes its body's nodes once per step (its sequence length is known).
        if g.nodes[ni].op == "Scan" {
            let (guard, before) = (g.nodes[ni].guard, g.nodes.len());
            crate::graph::inline_scan(g, ni)?;
            inherit_guard(g, ni, (g.nodes.len() + 1).saturating_sub(before), guard);
            continue;
        }
        // A Loop becomes its body's nodes once per iteration, each inferred before the
        // next is decided (its trip count and condition must be known); inference goes on
        // from the nodes that write its outputs.
        if g.nodes[ni].op == "Loop" {
            ni = crate::graph::inline_loop(g, ni)?;
            continue;
        }
        let Some(def) = ops::get(&g.nodes[ni].op) else {
            let c = Ctx { g, n: &g.nodes[ni] };
            let why = ops::out_of_scope_reason(&c.n.op)
                .map(|r| format!(" ({r})"))
                .unwrap_or_default();
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("operator '{}' is not supported{why}", c.n.op),
            ));
        };
        if let Some(expand) = def.expand
            && def.expand_when.is_none_or(|w| w(g, &g.nodes[ni]))
        {
            let (guard, before) = (g.nodes[ni].guard, g.nodes.len());
            expand(g, ni)?;
            inherit_guard(g, ni, (g.nodes.len() + 1).saturating_sub(before), guard);
            continue; // infer the decomposition, from its first node
        }
        if widened.is_none_or(|(at, _)| at != ni)
            && let Some(half) = crate::widen::needed(g, ni, def)
        {
            let inserted = crate::widen::cast_inputs(g, ni, half);
            widened = Some((ni + inserted, half));
            continue; // infer the casts first, then the node on f32 inputs
        }
        let n = &g.nodes[ni];
        let c = Ctx { g, n };
        // A value whose extent depends on the data exists only as a graph output: its
        // static shape is an upper bound, which no consumer could compute with.
        if let Some(&v) = n.inputs.iter().flatten().find(|v| g.bounded.contains(v)) {
            let producer = g
                .nodes
                .iter()
                .find(|p| p.outputs.contains(&Some(v)))
                .map_or_else(String::new, |p| format!(" of node '{}' ({})", p.name, p.op));
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!(
                    "input '{}' is the output{producer}, whose extent depends on the data; \
                     such a value may only be a graph output (the device has static shapes: \
                     it holds an upper bound, and the actual shape in '{}:shape'), not read \
                     by node '{}' ({})",
                    g.values[v].name, g.values[v].name, n.name, n.op
                ),
            ));
        }
        let mut outs = (def.infer)(&c)?;
        // One size budget for every value, checked before anything of that size is folded,
        // planned or emitted (D5, D7): shapes come from the model and may be anything.
        for (k, o) in outs.iter().enumerate() {
            let name = n
                .outputs
                .get(k)
                .copied()
                .flatten()
                .map_or("", |v| g.values[v].name.as_str());
            budget(&format!("output {k} ('{name}')"), &o.shape, o.dtype)
                .map_err(|e| e.at_node(&n.name, &n.op))?;
        }
        let all_const = n
            .inputs
            .iter()
            .all(|i| i.is_none_or(|v| g.values[v].konst.is_some()));
        // Moved, never copied: a folded value may be gigabytes (only the host-memory
        // admission below bounds it).
        let folded: Option<Vec<HostTensor>> = if outs.iter().all(|o| o.konst.is_some()) {
            Some(outs.iter_mut().filter_map(|o| o.konst.take()).collect())
        } else if all_const
            && !matches!(def.fold, Fold::Never)
            && n.inputs.iter().any(|i| i.is_some())
            && fold_fits_host(&c, &outs, def)?
        {
            match crate::eval::eval(&c, &outs) {
                Ok(f) => f,
                // A node of a predicated branch may fail on constants only when its branch
                // runs (a Gather past the end that the condition rules out): it stays on the
                // device, where it faults only if it runs, as ONNX Runtime errs only then.
                Err(_) if n.guard.is_some() && !matches!(def.fold, Fold::Only) => None,
                Err(e) => return Err(e),
            }
        } else {
            None
        };
        if folded.is_none() && matches!(def.fold, Fold::Only) {
            let mut needs: Vec<String> = Vec::new();
            for &v in n.inputs.iter().flatten() {
                for x in crate::graph::input_deps(g, v) {
                    if !needs.contains(&x) {
                        needs.push(x);
                    }
                }
            }
            return Err(c
                .e(
                    ErrorKind::UnsupportedOp,
                    "this operator is only supported on compile-time constant inputs",
                )
                .needing(needs));
        }
        // Computing ops need f32 (integer tensors are for shapes and indices).
        if folded.is_none() {
            def.check_device_dtypes(&c)?;
        }
        let was_folded = folded.is_some();
        // Each output takes its value out: `None` once taken.
        let mut folded: Vec<Option<HostTensor>> = folded.into_iter().flatten().map(Some).collect();
        let ids: Vec<Option<usize>> = n.outputs.clone();
        for (k, id) in ids.iter().enumerate() {
            let Some(id) = *id else { continue };
            let Some(o) = outs.get(k) else {
                return Err(g.nodes[ni].error(
                    ErrorKind::UnsupportedOp,
                    format!("output {k} is not supported"),
                ));
            };
            if o.bounded && !was_folded {
                g.bounded.insert(id);
            }
            let v = &mut g.values[id];
            v.dtype = o.dtype;
            v.shape = o.shape.clone();
            v.konst = if was_folded {
                folded.get_mut(k).and_then(Option::take).map(Rc::new)
            } else {
                // An output known whatever the inputs (Dropout's inference mask).
                o.konst.clone().map(Rc::new)
            };
        }
        if let Some((at, half)) = widened
            && at == ni
        {
            crate::widen::cast_outputs(g, ni, half);
            widened = None;
        }
        ni += 1;
    }
    Ok(())
}
