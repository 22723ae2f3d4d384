//! `Scan` and `Loop` unrolled at compile time: one copy of the body per step or iteration.

use super::body::{captured, identity, inline_body, subgraph};
use super::{Graph, Node, Value, ValueId, input_deps};
use crate::error::{ErrorKind, Result};
use crate::onnx::{AttributeProto, GraphProto, attribute_type as at};
use crate::tensor::HostTensor;
use nrt_hal::DType;
use std::collections::HashMap;
use std::rc::Rc;

/// Longest Scan unrolled (steps, times the batch of an opset-8 Scan).
const MAX_SCAN_STEPS: usize = 4096;

/// Most nodes a graph may hold after unrolling a Scan or Loop (nested bodies multiply:
/// a hostile model must not turn into millions of node copies).
const MAX_GRAPH_NODES: usize = 1 << 18;

/// The error when unrolling `copies` copies of a body of `body` nodes would pass
/// [`MAX_GRAPH_NODES`].
fn check_unrolled_size(g: &Graph, n: &Node, copies: usize, body: usize) -> Result<()> {
    let total = copies
        .checked_mul(body)
        .and_then(|x| x.checked_add(g.nodes.len()));
    if total.is_none_or(|t| t > MAX_GRAPH_NODES) {
        return Err(n.error(
            ErrorKind::TooLarge,
            format!(
                "unrolling {copies} copies of a body of {body} nodes into a graph of {} would pass {MAX_GRAPH_NODES} nodes",
                g.nodes.len()
            ),
        ));
    }
    Ok(())
}

/// What one unrolled scan needs: the body, its state and scan inputs, and how its outputs
/// are stacked.
struct ScanRun<'a> {
    gp: &'a GraphProto,
    /// Number of states.
    ns: usize,
    /// Per scan input: the value, its sequence axis, whether it is read from the end.
    scan_in: Vec<(ValueId, usize, bool)>,
    steps: usize,
    outer: &'a HashMap<String, ValueId>,
    out_axes: &'a [i64],
    out_dirs: &'a [i64],
}

/// Inlines the `Scan` node `ni` as its body's nodes once per step of its (inferred, so
/// compile-time) sequence: step `t` reads element `t` of each scan input along its axis
/// (`Gather` of a constant index; from the end for a reverse direction) and the state the
/// previous step produced; the final states are the Scan's state outputs and each scan
/// output is the steps' values stacked along its axis (`Unsqueeze` + `Concat`, reversed for
/// a reverse direction). Body values are renamed `<Scan name>/<t>/<name>`; the outer values
/// the body reads are the node's inputs after its own. The batched form of opset 8 (a
/// leading batch axis on states and scan inputs, an optional `sequence_lens` first input)
/// is unrolled per batch entry the same way (`<Scan name>/b<b>/<t>/<name>`), the entries'
/// results stacked along axis 0.
pub(crate) fn inline_scan(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |kind, msg: String| n.error(kind, msg);
    let v8 = g.opset < 9;
    let a = n
        .attrs
        .iter()
        .find(|a| a.name == "body" && a.g.is_some())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, "no body subgraph".into()))?;
    let gp = subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
    let m = usize::try_from(n.attr_i("num_scan_inputs", 0)?)
        .ok()
        .filter(|&m| m >= 1 && m <= gp.input.len())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, "num_scan_inputs".into()))?;
    let ns = gp.input.len() - m;
    let k_out = gp.output.len().checked_sub(ns).ok_or_else(|| {
        bad(
            ErrorKind::ShapeMismatch,
            "fewer body outputs than states".into(),
        )
    })?;
    // Opset 8: `sequence_lens` comes first.
    let first = usize::from(v8);
    if n.inputs.len() < first + ns + m || n.outputs.len() > ns + k_out {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "{} inputs and {} outputs for a body of {} inputs and {} outputs",
                n.inputs.len(),
                n.outputs.len(),
                gp.input.len(),
                gp.output.len()
            ),
        ));
    }
    let ints = |name: &str, len: usize| -> Result<Vec<i64>> {
        match n.attr_ints(name)? {
            None => Ok(vec![0; len]),
            Some(v) if v.len() == len => Ok(v),
            Some(v) => Err(bad(ErrorKind::BadAttribute, format!("{name} {v:?}"))),
        }
    };
    let (in_axes, in_dirs, out_axes, out_dirs) = if v8 {
        // Opset 8: the sequence axis is 1 of the batched inputs, 0 of a batch entry.
        (
            vec![1; m],
            ints("directions", m)?,
            vec![0; k_out],
            vec![0; k_out],
        )
    } else {
        (
            ints("scan_input_axes", m)?,
            ints("scan_input_directions", m)?,
            ints("scan_output_axes", k_out)?,
            ints("scan_output_directions", k_out)?,
        )
    };
    let mut scan_in = Vec::new();
    let mut steps = None;
    let mut batch = None;
    for j in 0..m {
        let v = n.inputs[first + ns + j].ok_or_else(|| {
            bad(
                ErrorKind::ShapeMismatch,
                format!("scan input {j} is missing"),
            )
        })?;
        let shape = &g.values[v].shape;
        let r = shape.len() as i64;
        let ax = in_axes[j];
        if ax < -r || ax >= r {
            return Err(bad(
                ErrorKind::BadAttribute,
                format!("scan_input_axes {in_axes:?} for an input of rank {r}"),
            ));
        }
        let ax = if ax < 0 { ax + r } else { ax } as usize;
        let len = shape[ax];
        if steps.is_some_and(|s| s != len) || (v8 && batch.is_some_and(|b| b != shape[0])) {
            return Err(bad(
                ErrorKind::ShapeMismatch,
                "scan inputs of different lengths".into(),
            ));
        }
        steps = Some(len);
        batch = Some(shape[0]);
        // A batch entry's sequence axis is one less.
        scan_in.push((v, if v8 { ax - 1 } else { ax }, in_dirs[j] != 0));
    }
    let steps = steps.unwrap_or(0);
    let batch = if v8 { batch.unwrap_or(0) } else { 1 };
    if steps == 0 || batch == 0 || steps.saturating_mul(batch) > MAX_SCAN_STEPS {
        return Err(bad(
            ErrorKind::UnsupportedOp,
            format!(
                "a Scan of {steps} steps × {batch} batch entries (1 to {MAX_SCAN_STEPS} in all are unrolled)"
            ),
        ));
    }
    if v8 && let Some(lens) = n.inputs[0] {
        match g.values[lens].konst.as_deref() {
            Some(t) if t.to_i64s().iter().all(|&l| l == steps as i64) => {}
            Some(t) => {
                return Err(bad(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "sequence_lens {:?} shorter than the sequence ({steps}): only full sequences are unrolled",
                        t.to_i64s()
                    ),
                ));
            }
            None => {
                return Err(bad(
                    ErrorKind::UnsupportedOp,
                    format!(
                        "sequence_lens '{}' must be known at compile time (and equal the sequence length {steps})",
                        g.values[lens].name
                    ),
                )
                .needing(input_deps(g, lens)));
            }
        }
    }
    check_unrolled_size(g, &n, steps * batch, gp.node.len() + m + 2)?;
    let outer: HashMap<String, ValueId> = captured(&n.attrs)?
        .into_iter()
        .zip(n.inputs.iter().skip(first + ns + m))
        .filter_map(|(name, id)| id.map(|id| (name, id)))
        .collect();
    let states: Vec<ValueId> = (0..ns)
        .map(|i| {
            n.inputs[first + i]
                .ok_or_else(|| bad(ErrorKind::ShapeMismatch, format!("state {i} is missing")))
        })
        .collect::<Result<_>>()?;
    let mut run = ScanRun {
        gp: &gp,
        ns,
        scan_in,
        steps,
        outer: &outer,
        out_axes: &out_axes,
        out_dirs: &out_dirs,
    };
    let targets: Vec<Option<ValueId>> = (0..ns + k_out)
        .map(|k| n.outputs.get(k).copied().flatten())
        .collect();
    let mut new_nodes = Vec::new();
    if !v8 {
        scan_steps(
            g,
            &n,
            &run,
            states,
            &format!("{}/", n.name),
            &targets,
            &mut new_nodes,
        )?;
    } else {
        // Per batch entry `b`: its states and scan inputs (`Gather` of index `b` on axis
        // 0), one scan, its outputs stacked over the entries along axis 0.
        let batched: Vec<(ValueId, usize, bool)> = run.scan_in.clone();
        let mut per_entry: Vec<Vec<ValueId>> = vec![Vec::new(); ns + k_out];
        for b in 0..batch {
            let prefix = format!("{}/b{b}/", n.name);
            let mut pick = |g: &mut Graph, v: ValueId, tag: String| {
                let idx = new_konst_i64(g, format!("{prefix}#entry{tag}"), vec![], vec![b as i64]);
                let o = new_value(g, format!("{prefix}#{tag}"));
                new_nodes.push(gather_node(format!("{prefix}#pick{tag}"), v, idx, 0, o));
                o
            };
            let entry_states: Vec<ValueId> = states
                .iter()
                .enumerate()
                .map(|(i, &s)| pick(g, s, format!("state{i}")))
                .collect();
            run.scan_in = batched
                .iter()
                .enumerate()
                .map(|(j, &(v, ax, rev))| (pick(g, v, format!("input{j}")), ax, rev))
                .collect();
            let entry_targets: Vec<Option<ValueId>> = targets
                .iter()
                .enumerate()
                .map(|(k, t)| t.map(|_| new_value(g, format!("{prefix}#out{k}"))))
                .collect();
            scan_steps(
                g,
                &n,
                &run,
                entry_states,
                &prefix,
                &entry_targets,
                &mut new_nodes,
            )?;
            for (k, t) in entry_targets.iter().enumerate() {
                if let Some(t) = t {
                    per_entry[k].push(*t);
                }
            }
        }
        let prefix = format!("{}/", n.name);
        for (k, t) in targets.iter().enumerate() {
            if let Some(t) = t {
                stack_along_0(
                    g,
                    &prefix,
                    &format!("batch{k}"),
                    &per_entry[k],
                    *t,
                    &mut new_nodes,
                );
            }
        }
    }
    g.nodes.splice(ni..=ni, new_nodes);
    Ok(())
}

fn new_value(g: &mut Graph, name: String) -> ValueId {
    g.values.push(Value {
        name,
        dtype: DType::F32,
        shape: Vec::new(),
        konst: None,
    });
    g.values.len() - 1
}

fn new_konst_i64(g: &mut Graph, name: String, shape: Vec<usize>, v: Vec<i64>) -> ValueId {
    g.values.push(Value {
        name,
        dtype: DType::I64,
        shape: shape.clone(),
        konst: Some(Rc::new(HostTensor::ints(DType::I64, shape, v))),
    });
    g.values.len() - 1
}

fn gather_node(name: String, data: ValueId, index: ValueId, axis: usize, out: ValueId) -> Node {
    Node {
        name,
        op: "Gather".into(),
        inputs: vec![Some(data), Some(index)],
        outputs: vec![Some(out)],
        attrs: vec![AttributeProto {
            name: "axis".into(),
            r#type: at::INT,
            i: axis as i64,
            ..Default::default()
        }],
        guard: None,
    }
}

/// The nodes of one unrolled scan (see [`inline_scan`]) from `states`, named under
/// `prefix`; the final states and the stacked scan outputs are written into `targets`
/// (`None`: not needed).
fn scan_steps(
    g: &mut Graph,
    n: &Node,
    run: &ScanRun,
    mut states: Vec<ValueId>,
    prefix: &str,
    targets: &[Option<ValueId>],
    new_nodes: &mut Vec<Node>,
) -> Result<()> {
    let (gp, ns, steps) = (run.gp, run.ns, run.steps);
    let k_out = gp.output.len() - ns;
    let mut collected: Vec<Vec<ValueId>> = vec![Vec::new(); k_out];
    for t in 0..steps {
        let step = format!("{prefix}{t}/");
        let mut scope = run.outer.clone();
        for (i, inp) in gp.input.iter().enumerate().take(ns) {
            scope.insert(inp.name.clone(), states[i]);
        }
        for (j, &(v, ax, rev)) in run.scan_in.iter().enumerate() {
            let idx = if rev { steps - 1 - t } else { t };
            let iv = new_konst_i64(g, format!("{step}#index{j}"), vec![], vec![idx as i64]);
            let o = new_value(g, format!("{step}{}", gp.input[ns + j].name));
            new_nodes.push(gather_node(format!("{step}#slice{j}"), v, iv, ax, o));
            scope.insert(gp.input[ns + j].name.clone(), o);
        }
        let (nodes, outs) =
            inline_body(g, gp, &step, scope, &[]).map_err(|e| e.at_node(&n.name, &n.op))?;
        new_nodes.extend(nodes);
        states.copy_from_slice(&outs[..ns]);
        for (k, c) in collected.iter_mut().enumerate() {
            c.push(outs[ns + k]);
        }
    }
    // Final states, through an Identity into the Scan's outputs.
    for (i, &st) in states.iter().enumerate() {
        if let Some(Some(o)) = targets.get(i).copied() {
            new_nodes.push(identity(format!("{prefix}#state{i}"), st, o));
        }
    }
    for (k, vals) in collected.into_iter().enumerate() {
        let Some(Some(o)) = targets.get(ns + k).copied() else {
            continue;
        };
        let ax = run.out_axes[k];
        let mut parts = Vec::new();
        for (t, v) in vals.into_iter().enumerate() {
            let (node, u) = unsqueeze(g, &format!("{prefix}#stack{k}_{t}"), v, ax);
            new_nodes.push(node);
            parts.push(Some(u));
        }
        if run.out_dirs[k] != 0 {
            parts.reverse();
        }
        new_nodes.push(Node {
            name: format!("{prefix}#concat{k}"),
            op: "Concat".into(),
            inputs: parts,
            outputs: vec![Some(o)],
            attrs: vec![AttributeProto {
                name: "axis".into(),
                r#type: at::INT,
                i: ax,
                ..Default::default()
            }],
            guard: None,
        });
    }
    Ok(())
}

/// Longest Loop unrolled.
const MAX_LOOP_ITERATIONS: u64 = 4096;

/// An `Unsqueeze` of `v` at `axis` into a new value named `name` (the axes an input from
/// opset 13, an attribute before): the node and the value.
fn unsqueeze(g: &mut Graph, name: &str, v: ValueId, axis: i64) -> (Node, ValueId) {
    let u = new_value(g, name.to_owned());
    let (inputs, attrs) = if g.opset >= 13 {
        let a = new_konst_i64(g, format!("{name}#axes"), vec![1], vec![axis]);
        (vec![Some(v), Some(a)], Vec::new())
    } else {
        (
            vec![Some(v)],
            vec![AttributeProto {
                name: "axes".into(),
                r#type: at::INTS,
                ints: vec![axis],
                ..Default::default()
            }],
        )
    };
    let node = Node {
        name: format!("{name}#unsqueeze"),
        op: "Unsqueeze".into(),
        inputs,
        outputs: vec![Some(u)],
        attrs,
        guard: None,
    };
    (node, u)
}

/// The nodes stacking `parts` (one value per step) along a new leading axis into `out`
/// (`Unsqueeze` each, then `Concat`), named under `prefix` with `tag`.
fn stack_along_0(
    g: &mut Graph,
    prefix: &str,
    tag: &str,
    parts: &[ValueId],
    out: ValueId,
    nodes: &mut Vec<Node>,
) {
    let mut stacked = Vec::with_capacity(parts.len());
    for (t, &v) in parts.iter().enumerate() {
        let (node, u) = unsqueeze(g, &format!("{prefix}#stack{tag}_{t}"), v, 0);
        nodes.push(node);
        stacked.push(Some(u));
    }
    nodes.push(Node {
        name: format!("{prefix}#concat{tag}"),
        op: "Concat".into(),
        inputs: stacked,
        outputs: vec![Some(out)],
        attrs: vec![AttributeProto {
            name: "axis".into(),
            r#type: at::INT,
            i: 0,
            ..Default::default()
        }],
        guard: None,
    });
}

/// Unrolls the `Loop` node `ni`, whose trip count `M` and condition must be known at
/// compile time: the node is replaced by its body's nodes once per iteration (values
/// renamed `<Loop name>/<i>/<name>`), iteration `i` reading the constant iteration number
/// `i`, the condition, the loop-carried values the previous iteration produced and the
/// outer values the body captures (the node's inputs after its own). Each iteration is
/// inferred ([`crate::infer::infer_span`]) before the next is decided, so a condition the
/// body computes is known by then (or the error names it). The final loop-carried values
/// are the Loop's first outputs (through `Identity`), each scan output the iterations'
/// values stacked along a new axis 0. Returns the index of the first node not yet
/// inferred (the nodes writing the Loop's outputs).
pub(crate) fn inline_loop(g: &mut Graph, ni: usize) -> Result<usize> {
    let n = g.nodes[ni].clone();
    let bad = |kind, msg: String| n.error(kind, msg);
    let a = n
        .attrs
        .iter()
        .find(|a| a.name == "body" && a.g.is_some())
        .ok_or_else(|| bad(ErrorKind::BadAttribute, "no body subgraph".into()))?;
    let gp = subgraph(a).map_err(|e| e.at_node(&n.name, &n.op))?;
    let nc = gp.input.len().checked_sub(2).ok_or_else(|| {
        bad(
            ErrorKind::BadAttribute,
            format!(
                "the body has {} inputs (iteration number, condition, loop-carried values…)",
                gp.input.len()
            ),
        )
    })?;
    let k_out = gp.output.len().checked_sub(1 + nc).ok_or_else(|| {
        bad(
            ErrorKind::BadAttribute,
            format!(
                "the body has {} outputs for {nc} loop-carried values (condition, values, scan outputs…)",
                gp.output.len()
            ),
        )
    })?;
    if n.inputs.len() < 2 + nc || n.outputs.len() > nc + k_out {
        return Err(bad(
            ErrorKind::ShapeMismatch,
            format!(
                "{} inputs and {} outputs for a body of {} inputs and {} outputs",
                n.inputs.len(),
                n.outputs.len(),
                gp.input.len(),
                gp.output.len()
            ),
        ));
    }
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    // One compile-time scalar of input `k` (the trip count, the condition), or the error
    // naming it and the graph inputs it depends on.
    let scalar = |g: &Graph, v: ValueId, what: &str| -> Result<i64> {
        let val = &g.values[v];
        match val.konst.as_deref() {
            Some(t) if t.len() == 1 => Ok(t.to_i64s()[0]),
            Some(t) => Err(bad(
                ErrorKind::ShapeMismatch,
                format!("{what} '{}' has {} elements (one expected)", val.name, t.len()),
            )),
            None => Err(bad(
                ErrorKind::UnsupportedOp,
                format!(
                    "{what} '{}' is computed at run time: only a Loop whose trip count and condition are known at compile time (constants, folded shapes, inputs given with input_values) is supported; it is unrolled",
                    val.name
                ),
            )
            .needing(input_deps(g, v))),
        }
    };
    let trip = match input(0) {
        Some(m) => Some(scalar(g, m, "trip count")?.max(0) as u64),
        None => None,
    };
    let mut cond = match input(1) {
        Some(c) => Some(scalar(g, c, "condition")? != 0),
        None => None,
    };
    if trip.is_none() && cond.is_none() {
        return Err(bad(
            ErrorKind::UnsupportedOp,
            "a Loop with neither a trip count nor a condition never ends".into(),
        ));
    }
    let outer: HashMap<String, ValueId> = captured(&n.attrs)?
        .into_iter()
        .zip(n.inputs.iter().skip(2 + nc))
        .filter_map(|(name, id)| id.map(|id| (name, id)))
        .collect();
    let mut states: Vec<ValueId> = (0..nc)
        .map(|i| {
            input(2 + i).ok_or_else(|| {
                bad(
                    ErrorKind::ShapeMismatch,
                    format!("loop-carried value {i} is missing"),
                )
            })
        })
        .collect::<Result<_>>()?;
    let mut scans: Vec<Vec<ValueId>> = vec![Vec::new(); k_out];
    g.nodes.remove(ni);
    let tail = g.nodes.len() - ni;
    let mut pos = ni;
    let mut i = 0u64;
    while trip.is_none_or(|m| i < m) && cond != Some(false) {
        if i >= MAX_LOOP_ITERATIONS {
            return Err(bad(
                ErrorKind::UnsupportedOp,
                format!("a Loop of more than {MAX_LOOP_ITERATIONS} iterations (they are unrolled)"),
            ));
        }
        check_unrolled_size(g, &n, 1, gp.node.len())?;
        let prefix = format!("{}/{i}/", n.name);
        let mut scope = outer.clone();
        for (k, t) in [
            HostTensor::ints(DType::I64, vec![], vec![i as i64]),
            HostTensor::ints(DType::Bool, vec![], vec![1]),
        ]
        .into_iter()
        .enumerate()
        {
            g.values.push(Value {
                name: format!("{prefix}{}", gp.input[k].name),
                dtype: t.dtype,
                shape: Vec::new(),
                konst: Some(Rc::new(t)),
            });
            scope.insert(gp.input[k].name.clone(), g.values.len() - 1);
        }
        for (j, &st) in states.iter().enumerate() {
            scope.insert(gp.input[2 + j].name.clone(), st);
        }
        let (mut nodes, outs) =
            inline_body(g, &gp, &prefix, scope, &[]).map_err(|e| e.at_node(&n.name, &n.op))?;
        for x in &mut nodes {
            x.guard = n.guard;
        }
        g.nodes.splice(pos..pos, nodes);
        crate::infer::infer_span(g, pos, tail)?;
        pos = g.nodes.len() - tail;
        if cond.is_some() {
            cond = Some(scalar(g, outs[0], "the condition the body computes")? != 0);
        }
        states.copy_from_slice(&outs[1..1 + nc]);
        for (k, s) in scans.iter_mut().enumerate() {
            s.push(outs[1 + nc + k]);
        }
        i += 1;
    }
    let prefix = format!("{}/", n.name);
    let mut fin = Vec::new();
    for (k, &st) in states.iter().enumerate() {
        if let Some(Some(o)) = n.outputs.get(k).copied() {
            fin.push(identity(format!("{prefix}#final{k}"), st, o));
        }
    }
    for (k, parts) in scans.iter().enumerate() {
        let Some(Some(o)) = n.outputs.get(nc + k).copied() else {
            continue;
        };
        if parts.is_empty() {
            return Err(bad(
                ErrorKind::UnsupportedOp,
                format!(
                    "scan output {k} of a Loop that runs no iteration (an empty tensor of unknown shape)"
                ),
            ));
        }
        stack_along_0(g, &prefix, &k.to_string(), parts, o, &mut fin);
    }
    for x in &mut fin {
        x.guard = n.guard;
    }
    g.nodes.splice(pos..pos, fin);
    Ok(pos)
}
