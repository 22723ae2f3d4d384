//! Small operators ONNX defines by others, decomposed during inference (the mechanism of
//! [`super::attention`]): `Xor` (`(a ∨ b) ∧ ¬(a ∧ b)`) and `LpNormalization`
//! (`x / ‖x‖ₚ` along an axis, 0 where the norm is 0, as the ONNX reference computes it:
//! `(Σ xᵖ)^(1/p)`, so p = 1 sums the values themselves).

use super::Registry;
use super::attention::{Expansion, a_int, g_splice, never_inferred};
use crate::error::{ErrorKind, Result};
use crate::graph::Graph;

pub(super) fn register(r: &mut Registry) {
    r.op("Xor", 7, never_inferred)
        .expands(expand_xor)
        .note("decomposed into And/Or/Not");
    r.op("LpNormalization", 1, never_inferred)
        .expands(expand_lp_norm)
        .note("decomposed (p = 1 or 2)");
    r.op("MeanVarianceNormalization", 9, never_inferred)
        .expands(expand_mvn)
        .note("decomposed as its ONNX function");
}

/// MeanVarianceNormalization as ONNX defines it: `(x − E[x]) / (√(E[x²] − E[x]²) + 1e-9)`
/// over `axes` (default N, H, W).
fn expand_mvn(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let axes = n.attr_ints("axes")?.unwrap_or_else(|| vec![0, 2, 3]);
    let opset = g.opset;
    let (ins, out, mut e) = begin(g, ni, 1)?;
    let x = ins[0];
    let dtype = e.g.values[x].dtype;
    let mean = |e: &mut Expansion<'_>, v: usize| {
        let keep = a_int("keepdims", 1);
        if opset >= 18 {
            let a = e.ints("axes", &axes);
            e.node("ReduceMean", &[v, a], vec![keep], None)
        } else {
            let attr = super::attention::a_ints("axes", &axes);
            e.node("ReduceMean", &[v], vec![keep, attr], None)
        }
    };
    let two = e.scalar("two", dtype, 2.0);
    let eps = e.scalar("eps", dtype, 1e-9);
    let m = mean(&mut e, x);
    let m2 = e.node("Pow", &[m, two], vec![], None);
    let x2 = e.node("Pow", &[x, two], vec![], None);
    let ex2 = mean(&mut e, x2);
    let var = e.node("Sub", &[ex2, m2], vec![], None);
    let std = e.node("Sqrt", &[var], vec![], None);
    let d = e.node("Sub", &[x, m], vec![], None);
    let se = e.node("Add", &[std, eps], vec![], None);
    e.node("Div", &[d, se], vec![], Some(out));
    finish(e, ni);
    Ok(())
}

/// Starts the expansion of node `ni`: its inputs (required), its first output, the builder.
fn begin(g: &mut Graph, ni: usize, inputs: usize) -> Result<(Vec<usize>, usize, Expansion<'_>)> {
    let n = &g.nodes[ni];
    let ins: Option<Vec<usize>> = (0..inputs)
        .map(|k| n.inputs.get(k).copied().flatten())
        .collect();
    let (Some(ins), Some(Some(out))) = (ins, n.outputs.first().copied()) else {
        return Err(n.error(
            ErrorKind::BadAttribute,
            format!("{} needs {inputs} input(s) and its output", n.op),
        ));
    };
    let name = n.name.clone();
    Ok((
        ins,
        out,
        Expansion {
            name,
            g,
            nodes: Vec::new(),
        },
    ))
}

fn finish(e: Expansion<'_>, ni: usize) {
    let Expansion { g, nodes, .. } = e;
    g_splice(g, ni, nodes);
}

fn expand_xor(g: &mut Graph, ni: usize) -> Result<()> {
    let (ins, out, mut e) = begin(g, ni, 2)?;
    let (a, b) = (ins[0], ins[1]);
    let or = e.node("Or", &[a, b], vec![], None);
    let and = e.node("And", &[a, b], vec![], None);
    let nand = e.node("Not", &[and], vec![], None);
    e.node("And", &[or, nand], vec![], Some(out));
    finish(e, ni);
    Ok(())
}

fn expand_lp_norm(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let p = n.attr_i("p", 2)?;
    let axis = n.attr_i("axis", -1)?;
    if !(p == 1 || p == 2) {
        return Err(n.error(ErrorKind::BadAttribute, format!("p = {p} (1 or 2)")));
    }
    let opset = g.opset;
    let (ins, out, mut e) = begin(g, ni, 1)?;
    let x = ins[0];
    let dtype = e.g.values[x].dtype;
    let (op, keep) = (
        if p == 2 { "ReduceL2" } else { "ReduceSum" },
        a_int("keepdims", 1),
    );
    // ReduceSum takes its axes as an input from opset 13, ReduceL2 from opset 18.
    let axes_as_input = if p == 2 { opset >= 18 } else { opset >= 13 };
    let norm = if axes_as_input {
        let axes = e.ints("axes", &[axis]);
        e.node(op, &[x, axes], vec![keep], None)
    } else {
        let attr = super::attention::a_ints("axes", &[axis]);
        e.node(op, &[x], vec![keep, attr], None)
    };
    let zero = e.scalar("zero", dtype, 0.0);
    let is_zero = e.node("Equal", &[norm, zero], vec![], None);
    let q = e.node("Div", &[x, norm], vec![], None);
    e.node("Where", &[is_zero, zero, q], vec![], Some(out));
    finish(e, ni);
    Ok(())
}
