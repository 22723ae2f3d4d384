//! The loss operators ONNX defines as functions of others, decomposed during inference (see
//! [`super::attention`] for the mechanism): `NegativeLogLikelihoodLoss` and
//! `SoftmaxCrossEntropyLoss` (opset 12+; the decomposition uses opset-13 forms, so the model
//! must import opset 13 or later).
//!
//! The class of each target is picked with a one-hot mask (`Equal` of the target against the
//! class indices, `Where`, `ReduceSum` over the class axis) rather than a gather, so a target
//! equal to `ignore_index` (in range or not) selects nothing; the per-target weight is picked
//! the same way. Semantics are the ONNX reference's: `none` keeps the per-element loss,
//! `sum` adds it, `mean` divides by the summed weights of the targets not ignored (by the
//! element count when there are neither weights nor `ignore_index`).

use super::Registry;
use super::attention::{Expansion, a_int, g_splice, never_inferred};
use crate::error::{ErrorKind, Result};
use crate::graph::Graph;
use crate::tensor::HostTensor;
use nrt_hal::DType;

pub(super) fn register(r: &mut Registry) {
    r.op("NegativeLogLikelihoodLoss", 12, never_inferred)
        .expands(expand_nll)
        .note("decomposed (one-hot select, ReduceSum); opset 13+ models");
    r.op("SoftmaxCrossEntropyLoss", 12, never_inferred)
        .expands(expand_sce)
        .note("decomposed (LogSoftmax + the NLL decomposition); opset 13+ models");
}

fn expand_nll(g: &mut Graph, ni: usize) -> Result<()> {
    expand_loss(g, ni, false)
}

fn expand_sce(g: &mut Graph, ni: usize) -> Result<()> {
    expand_loss(g, ni, true)
}

fn expand_loss(g: &mut Graph, ni: usize, softmax: bool) -> Result<()> {
    let n = g.nodes[ni].clone();
    let bad = |msg: String| n.error(ErrorKind::BadAttribute, msg);
    if g.opset < 13 {
        return Err(n.error(
            ErrorKind::UnsupportedOp,
            format!(
                "{} is decomposed for opset 13 or later (the model imports {})",
                n.op, g.opset
            ),
        ));
    }
    let input = |k: usize| n.inputs.get(k).copied().flatten();
    let (Some(x), Some(t)) = (input(0), input(1)) else {
        return Err(bad("scores/input and labels/target are required".into()));
    };
    let weight = input(2);
    let reduction = n.attr_s("reduction", "mean")?;
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(bad(format!("reduction '{reduction}' (none, sum or mean)")));
    }
    let ii = n
        .has_attr("ignore_index")
        .then(|| n.attr_i("ignore_index", 0))
        .transpose()?;
    let xs = g.values[x].shape.clone();
    if xs.len() < 2 {
        return Err(n.error(
            ErrorKind::ShapeMismatch,
            format!("input must have at least 2 dimensions (N, C, …), not {xs:?}"),
        ));
    }
    let dtype = g.values[x].dtype;
    let c = xs[1];
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let out0 = n.outputs.first().copied().flatten();
    let log_prob_out = n.outputs.get(1).copied().flatten();
    // SoftmaxCrossEntropyLoss: the NLL of LogSoftmax over the class axis (and its second,
    // optional output).
    let scores = if softmax {
        e.node("LogSoftmax", &[x], vec![a_int("axis", 1)], log_prob_out)
    } else {
        x
    };
    // One-hot of the targets: [N, 1, d…] == [1, C, 1…] → [N, C, d…].
    let axes1 = e.ints("axes", &[1]);
    let tu = e.node("Unsqueeze", &[t, axes1], vec![], None);
    let mut cshape = vec![1usize; xs.len()];
    cshape[1] = c;
    let classes = e.konst(
        "classes",
        HostTensor::ints(DType::I64, cshape.clone(), (0..c as i64).collect()),
    );
    let tdt = e.g.values[t].dtype;
    let classes = if tdt == DType::I64 {
        classes
    } else {
        e.node(
            "Cast",
            &[classes],
            vec![a_int("to", crate::tensor::dtype_to_onnx(tdt) as i64)],
            None,
        )
    };
    let hot = e.node("Equal", &[tu, classes], vec![], None);
    let zero = e.scalar("zero", dtype, 0.0);
    let picked = e.node("Where", &[hot, scores, zero], vec![], None);
    let axes1 = e.ints("axes", &[1]);
    let picked = e.node(
        "ReduceSum",
        &[picked, axes1],
        vec![a_int("keepdims", 0)],
        None,
    );
    let minus = e.scalar("minus_one", dtype, -1.0);
    let mut loss = e.node("Mul", &[picked, minus], vec![], None);
    // The weight of each target: weight[target] (0 for an ignored one), or 1 / 0.
    let keep = ii.map(|ii| {
        let iiv = e.konst("ignore_index", HostTensor::ints(tdt, vec![], vec![ii]));
        let is = e.node("Equal", &[t, iiv], vec![], None);
        e.node("Not", &[is], vec![], None)
    });
    let gw = match (weight, keep) {
        (Some(w), _) => {
            let shape = e.ints(
                "shape",
                &cshape.iter().map(|&d| d as i64).collect::<Vec<_>>(),
            );
            let wb = e.node("Reshape", &[w, shape], vec![], None);
            let sel = e.node("Where", &[hot, wb, zero], vec![], None);
            let axes1 = e.ints("axes", &[1]);
            let wt = e.node("ReduceSum", &[sel, axes1], vec![a_int("keepdims", 0)], None);
            Some(match keep {
                Some(k) => e.node("Where", &[k, wt, zero], vec![], None),
                None => wt,
            })
        }
        (None, Some(k)) => {
            let one = e.scalar("one", dtype, 1.0);
            Some(e.node("Where", &[k, one, zero], vec![], None))
        }
        (None, None) => None,
    };
    if let Some(w) = gw {
        loss = e.node("Mul", &[loss, w], vec![], None);
    }
    let keep0 = vec![a_int("keepdims", 0)];
    match (reduction.as_str(), gw) {
        ("none", _) => {
            e.node("Identity", &[loss], vec![], out0);
        }
        ("sum", _) => {
            e.node("ReduceSum", &[loss], keep0, out0);
        }
        ("mean", Some(w)) => {
            let num = e.node("ReduceSum", &[loss], keep0.clone(), None);
            let den = e.node("ReduceSum", &[w], keep0, None);
            e.node("Div", &[num, den], vec![], out0);
        }
        _ => {
            e.node("ReduceMean", &[loss], keep0, out0);
        }
    }
    let nodes = std::mem::take(&mut e.nodes);
    g_splice(e.g, ni, nodes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_i, a_s, fold1, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    fn nll(reduction: &str, ignore: Option<i64>) -> HostTensor {
        let x = HostTensor::f32(vec![2, 3], vec![-1., -2., -3., -4., -5., -6.]);
        let t = HostTensor::i64(vec![2], vec![2, 0]);
        let mut attrs = vec![a_s("reduction", reduction)];
        attrs.extend(ignore.map(|i| a_i("ignore_index", i)));
        fold1("NegativeLogLikelihoodLoss", 13, vec![x, t], attrs)
    }

    #[test]
    fn nll_picks_each_target_and_reduces() {
        assert_eq!(nll("none", None), HostTensor::f32(vec![2], vec![3., 4.]));
        assert_eq!(nll("sum", None), HostTensor::f32(vec![], vec![7.]));
        assert_eq!(nll("mean", None), HostTensor::f32(vec![], vec![3.5]));
        // The ignored target (class 0) counts neither in the sum nor in the mean.
        assert_eq!(nll("mean", Some(0)), HostTensor::f32(vec![], vec![3.]));
    }

    #[test]
    fn losses_need_opset_13_and_a_known_reduction() {
        let ins = || vec![var(DType::F32, &[2, 3]), var(DType::I64, &[2])];
        let e = out_types("SoftmaxCrossEntropyLoss", 12, ins(), vec![], 1).unwrap_err();
        assert!(
            e.message
                .contains("opset 13 or later (the model imports 12)"),
            "{e}"
        );
        let e = out_types(
            "SoftmaxCrossEntropyLoss",
            13,
            ins(),
            vec![a_s("reduction", "max")],
            1,
        );
        assert!(e.unwrap_err().message.contains("reduction 'max'"));
        let t = out_types("SoftmaxCrossEntropyLoss", 13, ins(), vec![], 2).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![]), (DType::F32, vec![2, 3])]);
    }
}
