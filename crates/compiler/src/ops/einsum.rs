//! `Einsum`, decomposed into the operators that compute it (the mechanism of
//! [`super::attention`]): per operand, a repeated label takes the diagonal (a product with an
//! identity mask, then `ReduceSum`) and a label no one else uses is summed out; the operands
//! are then contracted left to right, each pair as one batched `MatMul` —
//! `[batch, free_a, summed] · [batch, summed, free_b]` after `Transpose` / `Reshape` — and
//! the result is transposed into the output's label order. Ellipsis dimensions are labels
//! of their own (right-aligned, a size-1 one broadcast by `Expand`).

use super::Registry;
use super::attention::{Expansion, a_int, a_ints, g_splice, never_inferred};
use crate::error::{ErrorKind, Result};
use crate::graph::{Graph, Node, ValueId};
use crate::tensor::HostTensor;

pub(super) fn register(r: &mut Registry) {
    r.op("Einsum", 12, never_inferred)
        .expands(expand_einsum)
        .note("decomposed into Transpose/Reshape/MatMul/ReduceSum (diagonals by a mask)");
}

/// A label: a letter, or ellipsis dimension `k` (counted from the left of the widest
/// ellipsis).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Label {
    Letter(char),
    Ellipsis(usize),
}

/// The labels of one term (`ell` the ellipsis rank it gets, `None` if it has no ellipsis).
fn parse_term(n: &Node, term: &str, rank: Option<usize>) -> Result<(Vec<char>, Option<usize>)> {
    let bad = |m: String| n.error(ErrorKind::BadAttribute, m);
    let (head, tail, has_ell) = match term.find("...") {
        Some(p) => (&term[..p], &term[p + 3..], true),
        None => (term, "", false),
    };
    if head.contains('.') || tail.contains('.') {
        return Err(bad(format!("equation term '{term}': stray '.'")));
    }
    let mut letters: Vec<char> = head.chars().collect();
    letters.extend(tail.chars());
    if let Some(c) = letters.iter().find(|c| !c.is_ascii_alphabetic()) {
        return Err(bad(format!(
            "equation term '{term}': label '{c}' is not a letter"
        )));
    }
    let ell = match (has_ell, rank) {
        (false, Some(r)) if r != letters.len() => {
            return Err(n.error(
                ErrorKind::ShapeMismatch,
                format!(
                    "equation term '{term}' has {} labels for an operand of rank {r}",
                    letters.len()
                ),
            ));
        }
        (true, Some(r)) => Some(r.checked_sub(letters.len()).ok_or_else(|| {
            n.error(
                ErrorKind::ShapeMismatch,
                format!("equation term '{term}' has more labels than the operand's rank {r}"),
            )
        })?),
        (true, None) => Some(0),
        (false, _) => None,
    };
    Ok((letters, ell))
}

/// Labels of a term with its ellipsis (`ell` dims) expanded, right-aligned within `width`.
fn labels_of(term: &str, ell: Option<usize>, width: usize) -> Vec<Label> {
    let (head, tail) = match term.find("...") {
        Some(p) => (&term[..p], &term[p + 3..]),
        None => (term, ""),
    };
    let mut v: Vec<Label> = head.chars().map(Label::Letter).collect();
    if let Some(e) = ell {
        v.extend((width - e..width).map(Label::Ellipsis));
    }
    v.extend(tail.chars().map(Label::Letter));
    v
}

fn expand_einsum(g: &mut Graph, ni: usize) -> Result<()> {
    let n = g.nodes[ni].clone();
    let eq: String = n
        .attr_s("equation", "")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
    let Some(Some(out)) = n.outputs.first().copied() else {
        return Err(n.error(ErrorKind::BadAttribute, "Einsum needs its output"));
    };
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if ins.is_empty() || terms.len() != ins.len() || ins.len() != n.inputs.len() {
        return Err(n.error(
            ErrorKind::BadAttribute,
            format!(
                "equation '{eq}' has {} operand term(s) for {} input(s)",
                terms.len(),
                n.inputs.len()
            ),
        ));
    }
    // Each operand's labels; the ellipsis rank is the widest one.
    let mut ells = Vec::new();
    for (k, t) in terms.iter().enumerate() {
        let rank = g.values[ins[k]].shape.len();
        ells.push(parse_term(&n, t, Some(rank))?.1);
    }
    let width = ells.iter().flatten().copied().max().unwrap_or(0);
    let labels: Vec<Vec<Label>> = terms
        .iter()
        .zip(&ells)
        .map(|(t, &e)| labels_of(t, e, width))
        .collect();
    // Sizes: letters agree across operands; ellipsis dims broadcast (1 or one size).
    let mut size: std::collections::BTreeMap<Label, usize> = Default::default();
    for (k, ls) in labels.iter().enumerate() {
        for (d, &l) in ls.iter().enumerate() {
            let s = g.values[ins[k]].shape[d];
            match size.get(&l).copied() {
                None => {
                    size.insert(l, s);
                }
                Some(p) if p == s => {}
                Some(p) if matches!(l, Label::Ellipsis(_)) && (p == 1 || s == 1) => {
                    size.insert(l, p.max(s));
                }
                Some(p) => {
                    return Err(n.error(
                        ErrorKind::ShapeMismatch,
                        format!("equation '{eq}': label {l:?} has sizes {p} and {s}"),
                    ));
                }
            }
        }
    }
    let output: Vec<Label> = match rhs {
        Some(r) => {
            // Without an ellipsis in the output, the operands' ellipsis dims are summed.
            let (letters, e) = parse_term(&n, r, None)?;
            let v = labels_of(r, e.map(|_| width), width);
            for (i, l) in letters.iter().enumerate() {
                if letters[..i].contains(l) {
                    return Err(n.error(
                        ErrorKind::BadAttribute,
                        format!("equation '{eq}': output label '{l}' repeats"),
                    ));
                }
                if !labels.iter().flatten().any(|&x| x == Label::Letter(*l)) {
                    return Err(n.error(
                        ErrorKind::BadAttribute,
                        format!("equation '{eq}': output label '{l}' is in no operand"),
                    ));
                }
            }
            v
        }
        None => {
            // Implicit: the ellipsis, then the letters used once, alphabetically.
            let mut v: Vec<Label> = (0..width).map(Label::Ellipsis).collect();
            let mut once: Vec<char> = Vec::new();
            for l in labels.iter().flatten() {
                if let Label::Letter(c) = *l
                    && labels.iter().flatten().filter(|&&x| x == *l).count() == 1
                {
                    once.push(c);
                }
            }
            once.sort_unstable();
            v.extend(once.into_iter().map(Label::Letter));
            v
        }
    };
    let opset = g.opset;
    let mut e = Expansion {
        name: n.name.clone(),
        g,
        nodes: Vec::new(),
    };
    let mut acc: Option<Operand> = None;
    for k in 0..ins.len() {
        // Labels still needed after this operand: the output's and the later operands'.
        let mut keep: Vec<Label> = output.clone();
        for ls in &labels[k + 1..] {
            keep.extend(ls.iter().copied());
        }
        let others: Vec<Label> = match &acc {
            Some(a) => a.labels.clone(),
            None => Vec::new(),
        };
        let x = Operand {
            v: ins[k],
            labels: labels[k].clone(),
            shape: e.g.values[ins[k]].shape.clone(),
        };
        let x = prep(&mut e, &n, opset, x, &keep, &others)?;
        acc = Some(match acc {
            None => x,
            Some(a) => contract(&mut e, &n, opset, a, x, &keep, &size)?,
        });
    }
    let Operand { v, labels: ls, .. } = acc.expect("one operand at least");
    // Labels of the result not in the output (a single operand's): summed by `prep`.
    let perm: Vec<i64> = output
        .iter()
        .map(|l| ls.iter().position(|x| x == l).map(|p| p as i64))
        .collect::<Option<_>>()
        .ok_or_else(|| n.error(ErrorKind::BadAttribute, format!("equation '{eq}'")))?;
    if perm.len() != ls.len() {
        return Err(n.error(ErrorKind::BadAttribute, format!("equation '{eq}'")));
    }
    if perm.iter().enumerate().all(|(i, &p)| p == i as i64) {
        e.node("Identity", &[v], vec![], Some(out));
    } else {
        e.node("Transpose", &[v], vec![a_ints("perm", &perm)], Some(out));
    }
    let Expansion { g, nodes, .. } = e;
    g_splice(g, ni, nodes);
    Ok(())
}

/// `ReduceSum` of `v` over `axes` without keeping them.
fn reduce_sum(e: &mut Expansion<'_>, opset: i64, v: ValueId, axes: &[i64]) -> ValueId {
    let keep = a_int("keepdims", 0);
    if opset >= 13 {
        let a = e.ints("axes", axes);
        e.node("ReduceSum", &[v, a], vec![keep], None)
    } else {
        e.node("ReduceSum", &[v], vec![keep, a_ints("axes", axes)], None)
    }
}

/// A value of the decomposition with its labels and shape (values made here are inferred
/// only after the expansion).
struct Operand {
    v: ValueId,
    labels: Vec<Label>,
    shape: Vec<usize>,
}

/// One operand alone: its diagonals taken, then the labels in no one else summed out.
fn prep(
    e: &mut Expansion<'_>,
    n: &Node,
    opset: i64,
    x: Operand,
    keep: &[Label],
    others: &[Label],
) -> Result<Operand> {
    let Operand {
        mut v,
        labels: mut ls,
        mut shape,
    } = x;
    // Repeated labels: x · I (identity over the two axes), summed over the second.
    while let Some((p, q)) =
        (0..ls.len()).find_map(|q| (0..q).find(|&p| ls[p] == ls[q]).map(|p| (p, q)))
    {
        let d = shape[p];
        let mut ms = vec![1usize; shape.len()];
        ms[p] = d;
        ms[q] = d;
        let dtype = e.g.values[v].dtype;
        let total = d
            .checked_mul(d)
            .ok_or_else(|| n.error(ErrorKind::TooLarge, format!("a diagonal of {d} × {d}")))?;
        let mask = HostTensor::try_from_f64s(
            "Einsum diagonal mask",
            dtype,
            ms,
            (0..total).map(|i| f64::from(u8::from(i / d == i % d))),
        )
        .map_err(|e| e.at_node(&n.name, &n.op))?;
        let m = e.konst("eye", mask);
        let prod = e.node("Mul", &[v, m], vec![], None);
        v = reduce_sum(e, opset, prod, &[q as i64]);
        ls.remove(q);
        shape.remove(q);
    }
    let lonely: Vec<i64> = (0..ls.len())
        .filter(|&i| !keep.contains(&ls[i]) && !others.contains(&ls[i]))
        .map(|i| i as i64)
        .collect();
    if !lonely.is_empty() {
        v = reduce_sum(e, opset, v, &lonely);
        let kept = |i: &usize| !lonely.contains(&(*i as i64));
        ls = (0..ls.len()).filter(kept).map(|i| ls[i]).collect();
        shape = (0..shape.len()).filter(kept).map(|i| shape[i]).collect();
    }
    Ok(Operand {
        v,
        labels: ls,
        shape,
    })
}

/// `v` (of shape `from`) reshaped to `shape` (nothing when it already has it).
fn reshape(
    e: &mut Expansion<'_>,
    opset: i64,
    v: ValueId,
    from: &[usize],
    shape: &[usize],
) -> ValueId {
    if from == shape {
        return v;
    }
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let s = e.ints("shape", &dims);
    let attrs = if opset >= 14 {
        vec![a_int("allowzero", 1)]
    } else {
        vec![]
    };
    e.node("Reshape", &[v, s], attrs, None)
}

/// `v` transposed by `perm` (nothing for the identity).
fn transpose(e: &mut Expansion<'_>, v: ValueId, perm: &[usize]) -> ValueId {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return v;
    }
    let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
    e.node("Transpose", &[v], vec![a_ints("perm", &p)], None)
}

/// Two operands contracted by one batched MatMul: the shared labels still needed are the
/// batch, the other shared ones are summed, the rest stay free. The result's labels are
/// `batch, free_a, free_b`.
fn contract(
    e: &mut Expansion<'_>,
    n: &Node,
    opset: i64,
    x: Operand,
    y: Operand,
    keep: &[Label],
    size: &std::collections::BTreeMap<Label, usize>,
) -> Result<Operand> {
    let (la, lb) = (x.labels.clone(), y.labels.clone());
    let batch: Vec<Label> = la
        .iter()
        .copied()
        .filter(|l| lb.contains(l) && keep.contains(l))
        .collect();
    let summed: Vec<Label> = la
        .iter()
        .copied()
        .filter(|l| lb.contains(l) && !keep.contains(l))
        .collect();
    let fa: Vec<Label> = la.iter().copied().filter(|l| !lb.contains(l)).collect();
    let fb: Vec<Label> = lb.iter().copied().filter(|l| !la.contains(l)).collect();
    let pos = |ls: &[Label], l: &Label| ls.iter().position(|x| x == l).expect("label");
    let sz = |l: &Label| size[l];
    // A shared label of size 1 on one side and more on the other (an ellipsis dim):
    // broadcast that side first.
    let mut ops = [x, y];
    for o in ops.iter_mut() {
        let want: Vec<usize> = o.labels.iter().map(sz).collect();
        if o.shape != want {
            if summed.iter().any(|l| o.shape[pos(&o.labels, l)] != sz(l)) {
                return Err(n.error(
                    ErrorKind::UnsupportedOp,
                    "a summed ellipsis dimension that broadcasts",
                ));
            }
            let dims: Vec<i64> = want.iter().map(|&d| d as i64).collect();
            let s = e.ints("shape", &dims);
            o.v = e.node("Expand", &[o.v, s], vec![], None);
            o.shape = want;
        }
    }
    let [x, y] = ops;
    let prod = |ls: &[Label]| -> Result<usize> {
        ls.iter().try_fold(1usize, |p, l| {
            p.checked_mul(sz(l))
                .ok_or_else(|| n.error(ErrorKind::TooLarge, "Einsum dimensions overflow"))
        })
    };
    let (nb, m, k, nn) = (prod(&batch)?, prod(&fa)?, prod(&summed)?, prod(&fb)?);
    let pa: Vec<usize> = batch
        .iter()
        .chain(&fa)
        .chain(&summed)
        .map(|l| pos(&la, l))
        .collect();
    let pb: Vec<usize> = batch
        .iter()
        .chain(&summed)
        .chain(&fb)
        .map(|l| pos(&lb, l))
        .collect();
    let at = transpose(e, x.v, &pa);
    let bt = transpose(e, y.v, &pb);
    let sa: Vec<usize> = pa.iter().map(|&p| x.shape[p]).collect();
    let sb: Vec<usize> = pb.iter().map(|&p| y.shape[p]).collect();
    let a3 = reshape(e, opset, at, &sa, &[nb, m, k]);
    let b3 = reshape(e, opset, bt, &sb, &[nb, k, nn]);
    let c = e.node("MatMul", &[a3, b3], vec![], None);
    let labels: Vec<Label> = batch.iter().chain(&fa).chain(&fb).copied().collect();
    let shape: Vec<usize> = labels.iter().map(sz).collect();
    let r = reshape(e, opset, c, &[nb, m, nn], &shape);
    Ok(Operand {
        v: r,
        labels,
        shape,
    })
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{a_s, fold1, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    #[test]
    fn einsum_contracts_and_takes_diagonals() {
        let ins = vec![var(DType::F32, &[2, 3]), var(DType::F32, &[3, 4])];
        let t = out_types("Einsum", 12, ins, vec![a_s("equation", "ij,jk->ik")], 1);
        assert_eq!(t.unwrap(), vec![(DType::F32, vec![2, 4])]);
        // On constants the decomposition folds: the diagonal, and a transpose.
        let x = HostTensor::f32(vec![2, 2], vec![1., 2., 3., 4.]);
        let d = fold1(
            "Einsum",
            12,
            vec![x.clone()],
            vec![a_s("equation", "ii->i")],
        );
        assert_eq!(d, HostTensor::f32(vec![2], vec![1., 4.]));
        let t = fold1("Einsum", 12, vec![x], vec![a_s("equation", "ij->ji")]);
        assert_eq!(t, HostTensor::f32(vec![2, 2], vec![1., 3., 2., 4.]));
    }

    #[test]
    fn a_term_must_match_its_operand() {
        let e = out_types(
            "Einsum",
            12,
            vec![var(DType::F32, &[2, 3])],
            vec![a_s("equation", "ijk->i")],
            1,
        )
        .unwrap_err();
        assert!(
            e.message
                .contains("'ijk' has 3 labels for an operand of rank 2"),
            "{e}"
        );
        let e = out_types(
            "Einsum",
            12,
            vec![var(DType::F32, &[2, 3])],
            vec![a_s("equation", "i1->i")],
            1,
        )
        .unwrap_err();
        assert!(e.message.contains("label '1' is not a letter"), "{e}");
    }
}
