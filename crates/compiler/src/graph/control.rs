//! `If`. A condition known at compile time (a constant, a folded shape comparison, an input
//! given with `input_values`) inlines the branch it takes; nothing of the `If` reaches the
//! device. A condition computed at run time keeps both branches, **predicated**: every node
//! of the then-branch runs under the guard `cond`, every node of the else-branch under
//! `!cond` ([`Guard`]); the lowering brackets their instructions with [`nrt_isa::Op::Guard`],
//! so on the device the branch not taken only passes its synchronization — it moves no data,
//! costs no compute and cannot fault (a `Gather` past the end that the condition rules out
//! stays harmless, as in ONNX Runtime, which never runs that branch). Each output is then
//! selected by a `Where(cond, then_k, else_k)`.
//!
//! Why predication rather than a device-side jump: the five engines of a core and the cores
//! of a lockstep execution are ordered by semaphore counts that the scheduler computes from
//! one static instruction order. A predicated instruction keeps its wait and its signal, so
//! every count stays what the scheduler proved; a jump would change the counts with the
//! branch, and every engine that waits across it would need both counts.
//!
//! Nested `If`s combine the conditions: a branch's guard is a bool value computed by
//! unguarded nodes (`And` of the enclosing guard with the inner condition or its `Not`), so
//! a guard is never a stale value of a branch that did not run. Both branches must give each
//! output the same static shape and type (the device has static shapes); an `If` whose
//! branches disagree is an error naming it, the output and both shapes.

use super::body::{captured, inline_body, subgraph};
use super::{Graph, Guard, Node, Value, ValueId};
use crate::error::{ErrorKind, Result};
use crate::onnx::GraphProto;
use nrt_hal::DType;
use std::collections::HashMap;

/// Inlines the `If` node `ni` and returns the index of the first node left to infer. With
/// a compile-time condition, the taken branch's nodes replace it (values renamed `<If
/// name>/<name>`, its outputs become the `If`'s; a nested `If` keeps its own branches for
/// later) and inference goes on from them. With a run-time condition, both branches are
/// inlined predicated (`<If name>/then/…`, `<If name>/else/…`) and inferred here, then the
/// `Where` nodes selecting the outputs follow, from which inference goes on.
pub(crate) fn inline_if(g: &mut Graph, ni: usize) -> Result<usize> {
    let n = g.nodes[ni].clone();
    let bad = |kind, msg: String| n.error(kind, msg);
    let cond = n.inputs.first().copied().flatten().ok_or_else(|| {
        bad(
            ErrorKind::ShapeMismatch,
            "the condition input is missing".into(),
        )
    })?;
    let cv = &g.values[cond];
    let elements = cv.konst.as_ref().map_or(cv.elements(), |k| k.len());
    if elements != 1 {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "condition '{}' has {elements} elements (one expected)",
                cv.name,
            ),
        ));
    }
    let branch = |which: &str| -> Result<GraphProto> {
        let a = n
            .attrs
            .iter()
            .find(|a| a.name == which && a.g.is_some())
            .ok_or_else(|| bad(ErrorKind::BadAttribute, format!("no {which} subgraph")))?;
        let gp = subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
        if gp.output.len() != n.outputs.len() {
            return Err(bad(
                ErrorKind::ShapeMismatch,
                format!(
                    "{which} has {} outputs for the If's {}",
                    gp.output.len(),
                    n.outputs.len()
                ),
            ));
        }
        Ok(gp)
    };
    // The enclosing scope: the values the branches capture, as the If's inputs after the
    // condition (resolved where the If stood, so a nested If sees its parent branch's
    // names); the branch's own names are added (and shadow them) when it is inlined.
    let mut scope: HashMap<String, ValueId> = HashMap::new();
    for (name, id) in captured(&n.attrs)?.into_iter().zip(n.inputs.iter().skip(1)) {
        if let Some(id) = id {
            scope.insert(name, *id);
        }
    }
    let Some(k) = g.values[cond].konst.clone() else {
        return predicated(
            g,
            ni,
            &n,
            cond,
            scope,
            [branch("then_branch")?, branch("else_branch")?],
        );
    };
    let which = if k.get_f64(0) != 0.0 {
        "then_branch"
    } else {
        "else_branch"
    };
    let gp = branch(which)?;
    let prefix = format!("{}/", n.name);
    let (mut new_nodes, _) =
        inline_body(g, &gp, &prefix, scope, &n.outputs).map_err(|e| e.at_node(&n.name, &n.op))?;
    for x in &mut new_nodes {
        x.guard = n.guard;
    }
    g.nodes.splice(ni..=ni, new_nodes);
    Ok(ni)
}

/// A new bool value computed by `op(inputs)` (unguarded), inserted at `at`.
fn bool_node(g: &mut Graph, at: usize, name: String, op: &str, inputs: &[ValueId]) -> ValueId {
    g.values.push(Value {
        name: name.clone(),
        dtype: DType::Bool,
        shape: Vec::new(),
        konst: None,
    });
    let out = g.values.len() - 1;
    g.nodes.insert(
        at,
        Node {
            name,
            op: op.to_owned(),
            inputs: inputs.iter().map(|&v| Some(v)).collect(),
            outputs: vec![Some(out)],
            attrs: Vec::new(),
            guard: None,
        },
    );
    out
}

/// The run-time-condition path of [`inline_if`] for node `n` (at `ni`, condition `cond`).
fn predicated(
    g: &mut Graph,
    ni: usize,
    n: &Node,
    cond: ValueId,
    scope: HashMap<String, ValueId>,
    branches: [GraphProto; 2],
) -> Result<usize> {
    if g.values[cond].dtype != DType::Bool {
        return Err(n.error(
            ErrorKind::UnsupportedDType,
            format!(
                "condition '{}' is {}, not bool",
                g.values[cond].name, g.values[cond].dtype
            ),
        ));
    }
    g.nodes.remove(ni);
    let tail = g.nodes.len() - ni;
    let mut pos = ni;
    // Unguarded bool nodes inserted before the branches: the condition as a scalar for the
    // selects (a `[1]` condition must not broadcast a scalar output to `[1]`), and the
    // branches' guards — the condition itself at the top level; inside a predicated branch,
    // its conjunction with the enclosing guard.
    let p = format!("{}/#cond", n.name);
    let mut at = pos;
    let mut node = |g: &mut Graph, name: String, op: &str, ins: &[ValueId]| {
        let v = bool_node(g, at, name, op, ins);
        at += 1;
        v
    };
    let select = if g.values[cond].shape.is_empty() {
        cond
    } else {
        node(g, format!("{p}_scalar"), "Squeeze", &[cond])
    };
    let guards = match n.guard {
        None => [Guard { cond, when: true }, Guard { cond, when: false }],
        Some(outer) => {
            let enclosing = if outer.when {
                outer.cond
            } else {
                node(g, format!("{p}_enclosing"), "Not", &[outer.cond])
            };
            let not_cond = node(g, format!("{p}_not"), "Not", &[select]);
            let then_g = node(g, format!("{p}_then"), "And", &[enclosing, select]);
            let else_g = node(g, format!("{p}_else"), "And", &[enclosing, not_cond]);
            [then_g, else_g].map(|cond| Guard { cond, when: true })
        }
    };
    if g.nodes.len() - tail > pos {
        crate::infer::infer_span(g, pos, tail)?;
        pos = g.nodes.len() - tail;
    }
    let mut results: Vec<Vec<ValueId>> = Vec::with_capacity(2);
    for ((gp, guard), tag) in branches.iter().zip(guards).zip(["then", "else"]) {
        let prefix = format!("{}/{tag}/", n.name);
        let (mut nodes, outs) = inline_body(g, gp, &prefix, scope.clone(), &[])
            .map_err(|e| e.at_node(&n.name, &n.op))?;
        for x in &mut nodes {
            x.guard = Some(guard);
        }
        g.nodes.splice(pos..pos, nodes);
        crate::infer::infer_span(g, pos, tail)?;
        pos = g.nodes.len() - tail;
        results.push(outs);
    }
    let mut merge = Vec::with_capacity(n.outputs.len());
    for (k, out) in n.outputs.iter().enumerate() {
        let Some(out) = *out else { continue };
        let (t, e) = (&g.values[results[0][k]], &g.values[results[1][k]]);
        if t.shape != e.shape || t.dtype != e.dtype {
            return Err(n.error(
                ErrorKind::ShapeMismatch,
                format!(
                    "output {k} ('{}') is {} {:?} in then_branch ('{}') but {} {:?} in else_branch ('{}'): with a condition computed at run time both branches must give it the same static shape and type",
                    g.values[out].name, t.dtype, t.shape, t.name, e.dtype, e.shape, e.name
                ),
            ));
        }
        merge.push(Node {
            name: format!("{}/#select{k}", n.name),
            op: "Where".into(),
            inputs: vec![Some(select), Some(results[0][k]), Some(results[1][k])],
            outputs: vec![Some(out)],
            attrs: Vec::new(),
            guard: n.guard,
        });
    }
    g.nodes.splice(pos..pos, merge);
    Ok(pos)
}
