//! Patterns recognized before lowering: activations that a model spells out as elementwise
//! arithmetic become one ACT instruction.
//!
//! Recognized: the tanh GELU `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` and the erf GELU
//! `0.5·x·(1 + erf(x/√2))`, whatever the order of commutative operands and the association
//! of products and sums (`x·x·x` or `x³`, `x/√2` or `x·(1/√2)`, `a − b` as `a + (−1)·b`…).
//! The pattern's nodes must compute only for it: every intermediate value is read by one node
//! of the pattern and is not a graph output. When `x` is itself `u + bias` (a bias add of a
//! MatMul or Gemm, with a constant bias) read only by the pattern, the add is folded in as the
//! activation's bias operand.
//!
//! Matching works on the expression the nodes compute, as a function of the one tensor `x`:
//! products and sums are flattened and their constants folded; the argument of `tanh`/`erf`
//! is expanded into a polynomial in `x` and compared coefficient by coefficient (relative
//! tolerance 1e-4, so rounded constants in exported models still match).

use crate::graph::{Graph, ValueId};
use crate::tensor::is_float;
use nrt_hal::DType;
use nrt_isa::ActFunc;
use std::collections::{HashMap, HashSet};

/// An activation recognized from its decomposition: the node that ends the pattern computes
/// `func(x + bias)`; the other nodes of the pattern are not lowered.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Fusion {
    /// The tensor the activation reads.
    pub x: ValueId,
    /// A constant added first (broadcast to `x`'s shape), if the pattern's input was a bias add.
    pub bias: Option<ValueId>,
    /// The function.
    pub func: ActFunc,
    /// Every node of the pattern, the final one included.
    pub nodes: Vec<usize>,
}

/// A scalar expression of one tensor `x`.
#[derive(Clone, Debug)]
enum Expr {
    X,
    C(f64),
    Add(Vec<Expr>),
    Mul(Vec<Expr>),
    Pow(Box<Expr>, u32),
    Tanh(Box<Expr>),
    Erf(Box<Expr>),
}

struct Builder<'a> {
    g: &'a Graph,
    consumers: &'a [Vec<usize>],
    outputs: &'a HashSet<ValueId>,
    producer: &'a [Option<usize>],
    shape: &'a [usize],
    guard: Option<crate::graph::Guard>,
    x: Option<ValueId>,
    nodes: Vec<usize>,
}

const MAX_NODES: usize = 16;

impl Builder<'_> {
    fn value(&mut self, v: ValueId) -> Option<Expr> {
        let val = &self.g.values[v];
        if let Some(k) = &val.konst {
            return (k.len() == 1 && is_float(k.dtype)).then(|| Expr::C(k.get_f64(0)));
        }
        if val.dtype != DType::F32 || val.shape != self.shape {
            return None;
        }
        let inner = Some(v) != self.x
            && !self.outputs.contains(&v)
            && self.consumers[v].len() == 1
            && self.producer[v].is_some_and(|p| {
                matches!(
                    self.g.nodes[p].op.as_str(),
                    "Add" | "Sum" | "Sub" | "Mul" | "Div" | "Pow" | "Tanh" | "Erf"
                )
            });
        if inner {
            return self.node(self.producer[v].expect("checked"));
        }
        match self.x {
            None => self.x = Some(v),
            Some(x) if x == v => {}
            Some(_) => return None,
        }
        Some(Expr::X)
    }

    fn node(&mut self, p: usize) -> Option<Expr> {
        // A recognized activation runs under one guard (never across a predicated branch's
        // edge).
        if self.nodes.len() >= MAX_NODES || self.g.nodes[p].guard != self.guard {
            return None;
        }
        if !self.nodes.contains(&p) {
            self.nodes.push(p);
        }
        let n = &self.g.nodes[p];
        if n.outputs.iter().flatten().count() != 1 {
            return None;
        }
        let ins: Vec<ValueId> = n.inputs.iter().flatten().copied().collect();
        let unary = |b: &mut Self, f: fn(Box<Expr>) -> Expr| -> Option<Expr> {
            match ins.as_slice() {
                [a] => Some(f(Box::new(b.value(*a)?))),
                _ => None,
            }
        };
        let [a, b] = match n.op.as_str() {
            "Tanh" => return unary(self, Expr::Tanh),
            "Erf" => return unary(self, Expr::Erf),
            "Sum" if !ins.is_empty() => {
                let t = ins
                    .iter()
                    .map(|&v| self.value(v))
                    .collect::<Option<Vec<_>>>()?;
                return Some(Expr::Add(t));
            }
            _ => match ins.as_slice() {
                [a, b] => [*a, *b],
                _ => return None,
            },
        };
        let (ea, eb) = (self.value(a)?, self.value(b)?);
        Some(match n.op.as_str() {
            "Add" => Expr::Add(vec![ea, eb]),
            "Sub" => Expr::Add(vec![ea, Expr::Mul(vec![Expr::C(-1.0), eb])]),
            "Mul" => Expr::Mul(vec![ea, eb]),
            "Div" => match eb {
                Expr::C(c) if c != 0.0 => Expr::Mul(vec![ea, Expr::C(1.0 / c)]),
                _ => return None,
            },
            "Pow" => match eb {
                Expr::C(e) if (1.0..=4.0).contains(&e) && e.fract() == 0.0 => {
                    Expr::Pow(Box::new(ea), e as u32)
                }
                _ => return None,
            },
            _ => return None,
        })
    }
}

/// A product flattened: its constant factor and the other factors.
fn factors(e: &Expr) -> (f64, Vec<Expr>) {
    fn go(e: &Expr, c: &mut f64, out: &mut Vec<Expr>) {
        match e {
            Expr::C(v) => *c *= v,
            Expr::Mul(v) => v.iter().for_each(|x| go(x, c, out)),
            other => out.push(other.clone()),
        }
    }
    let (mut c, mut out) = (1.0, Vec::new());
    go(e, &mut c, &mut out);
    (c, out)
}

/// A sum flattened: its constant term and the other terms.
fn terms(e: &Expr) -> (f64, Vec<Expr>) {
    fn go(e: &Expr, c: &mut f64, out: &mut Vec<Expr>) {
        match e {
            Expr::C(v) => *c += v,
            Expr::Add(v) => v.iter().for_each(|x| go(x, c, out)),
            other => out.push(other.clone()),
        }
    }
    let (mut c, mut out) = (0.0, Vec::new());
    go(e, &mut c, &mut out);
    (c, out)
}

/// Highest polynomial degree tracked.
const DEG: usize = 6;

/// The expression as a polynomial in `x` (coefficients by degree), if it is one.
fn poly(e: &Expr) -> Option<[f64; DEG + 1]> {
    let mul = |a: [f64; DEG + 1], b: [f64; DEG + 1]| -> Option<[f64; DEG + 1]> {
        let mut r = [0.0; DEG + 1];
        for (i, &x) in a.iter().enumerate() {
            for (j, &y) in b.iter().enumerate() {
                if x != 0.0 && y != 0.0 {
                    *r.get_mut(i + j)? += x * y;
                }
            }
        }
        Some(r)
    };
    let mut one = [0.0; DEG + 1];
    one[0] = 1.0;
    Some(match e {
        Expr::X => {
            let mut r = [0.0; DEG + 1];
            r[1] = 1.0;
            r
        }
        Expr::C(c) => {
            let mut r = [0.0; DEG + 1];
            r[0] = *c;
            r
        }
        Expr::Add(v) => {
            let mut r = [0.0; DEG + 1];
            for x in v {
                let p = poly(x)?;
                for i in 0..=DEG {
                    r[i] += p[i];
                }
            }
            r
        }
        Expr::Mul(v) => {
            let mut r = one;
            for x in v {
                r = mul(r, poly(x)?)?;
            }
            r
        }
        Expr::Pow(x, n) => {
            let p = poly(x)?;
            let mut r = one;
            for _ in 0..*n {
                r = mul(r, p)?;
            }
            r
        }
        Expr::Tanh(_) | Expr::Erf(_) => return None,
    })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * b.abs().max(1e-6)
}

/// Whether polynomial `p` is `Σ want[i]·x^i` (the other coefficients 0).
fn poly_is(p: &[f64; DEG + 1], want: &[f64]) -> bool {
    (0..=DEG).all(|i| match want.get(i) {
        Some(&w) if w != 0.0 => close(p[i], w),
        _ => p[i].abs() <= 1e-9,
    })
}

/// The GELU an expression computes, if it is one.
fn gelu(e: &Expr) -> Option<ActFunc> {
    let (c, f) = factors(e);
    if !close(c, 0.5) || f.len() != 2 {
        return None;
    }
    let sum = match (&f[0], &f[1]) {
        (Expr::X, s) | (s, Expr::X) => s,
        _ => return None,
    };
    let (c0, t) = terms(sum);
    if !close(c0, 1.0) || t.len() != 1 {
        return None;
    }
    let (ct, tf) = factors(&t[0]);
    if !close(ct, 1.0) || tf.len() != 1 {
        return None;
    }
    let k = (2.0 / std::f64::consts::PI).sqrt();
    match &tf[0] {
        Expr::Tanh(arg) => {
            poly_is(&poly(arg)?, &[0.0, k, 0.0, 0.044715 * k]).then_some(ActFunc::GeluTanh)
        }
        Expr::Erf(arg) => poly_is(&poly(arg)?, &[0.0, std::f64::consts::FRAC_1_SQRT_2])
            .then_some(ActFunc::GeluErf),
        _ => None,
    }
}

/// Finds the GELU decompositions among the live nodes. `consumers[v]`: the live nodes that
/// read value `v`; `outputs`: the graph outputs. Returns the fusions by final node.
pub(crate) fn find_activations(
    g: &Graph,
    live: &[bool],
    consumers: &[Vec<usize>],
    outputs: &HashSet<ValueId>,
) -> HashMap<usize, Fusion> {
    let mut producer = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        if live[i] {
            for &o in n.outputs.iter().flatten() {
                producer[o] = Some(i);
            }
        }
    }
    let mut claimed = vec![false; g.nodes.len()];
    let mut found = HashMap::new();
    // Last nodes first: the end of a pattern comes after its inner products.
    for root in (0..g.nodes.len()).rev() {
        let n = &g.nodes[root];
        if !live[root] || claimed[root] || n.op != "Mul" {
            continue;
        }
        let Some(out) = n.outputs.first().copied().flatten() else {
            continue;
        };
        let mut b = Builder {
            g,
            consumers,
            outputs,
            producer: &producer,
            shape: &g.values[out].shape,
            guard: n.guard,
            x: None,
            nodes: Vec::new(),
        };
        let Some(e) = b.node(root) else { continue };
        let (Some(func), Some(mut x)) = (gelu(&e), b.x) else {
            continue;
        };
        let mut nodes = b.nodes;
        if nodes.iter().any(|&i| claimed[i]) {
            continue;
        }
        // A bias add feeding only the pattern becomes the activation's bias.
        let mut bias = None;
        if let Some(p) = producer[x]
            && !claimed[p]
            && g.nodes[p].op == "Add"
            && g.nodes[p].guard == n.guard
            && !outputs.contains(&x)
            && consumers[x].iter().all(|c| nodes.contains(c))
        {
            let ins: Vec<ValueId> = g.nodes[p].inputs.iter().flatten().copied().collect();
            if let [u, v] = ins[..] {
                for (data, k) in [(u, v), (v, u)] {
                    let shape_ok = g.values[data].shape == g.values[x].shape
                        && g.values[k].shape.len() <= g.values[x].shape.len();
                    if g.values[k].konst.is_some()
                        && g.values[data].konst.is_none()
                        && g.values[k].dtype == DType::F32
                        && shape_ok
                    {
                        bias = Some(k);
                        x = data;
                        nodes.push(p);
                        break;
                    }
                }
            }
        }
        for &i in &nodes {
            claimed[i] = true;
        }
        found.insert(
            root,
            Fusion {
                x,
                bias,
                func,
                nodes,
            },
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x() -> Expr {
        Expr::X
    }
    fn c(v: f64) -> Expr {
        Expr::C(v)
    }
    fn mul(v: Vec<Expr>) -> Expr {
        Expr::Mul(v)
    }
    fn add(v: Vec<Expr>) -> Expr {
        Expr::Add(v)
    }

    #[test]
    fn tanh_gelu_in_several_spellings() {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let inner = |cube: Expr| {
            Expr::Tanh(Box::new(mul(vec![
                add(vec![x(), mul(vec![c(0.044715), cube])]),
                c(k),
            ])))
        };
        let cubes = [
            Expr::Pow(Box::new(x()), 3),
            mul(vec![mul(vec![x(), x()]), x()]),
        ];
        for cube in cubes {
            let a = mul(vec![
                mul(vec![x(), c(0.5)]),
                add(vec![inner(cube.clone()), c(1.0)]),
            ]);
            let b = mul(vec![c(0.5), mul(vec![add(vec![c(1.0), inner(cube)]), x()])]);
            assert_eq!(gelu(&a), Some(ActFunc::GeluTanh));
            assert_eq!(gelu(&b), Some(ActFunc::GeluTanh));
        }
        // Distributed inner argument: √(2/π)·x + √(2/π)·0.044715·x³.
        let d = Expr::Tanh(Box::new(add(vec![
            mul(vec![c(k), x()]),
            mul(vec![c(k * 0.044715), Expr::Pow(Box::new(x()), 3)]),
        ])));
        let e = mul(vec![x(), c(0.5), add(vec![c(1.0), d])]);
        assert_eq!(gelu(&e), Some(ActFunc::GeluTanh));
    }

    #[test]
    fn erf_gelu_and_near_misses() {
        let erf = |s: f64| Expr::Erf(Box::new(mul(vec![x(), c(s)])));
        let g = mul(vec![
            mul(vec![
                x(),
                add(vec![erf(1.0 / f64::from(std::f32::consts::SQRT_2)), c(1.0)]),
            ]),
            c(0.5),
        ]);
        assert_eq!(gelu(&g), Some(ActFunc::GeluErf));
        // Wrong scale inside, wrong constant outside, missing x: no match.
        let bad = mul(vec![x(), add(vec![erf(0.6), c(1.0)]), c(0.5)]);
        assert_eq!(gelu(&bad), None);
        let bad = mul(vec![
            x(),
            add(vec![erf(1.0 / 2f64.sqrt()), c(1.0)]),
            c(0.25),
        ]);
        assert_eq!(gelu(&bad), None);
        let bad = mul(vec![add(vec![erf(1.0 / 2f64.sqrt()), c(1.0)]), c(0.5)]);
        assert_eq!(gelu(&bad), None);
        // tanh with an x² term.
        let t = Expr::Tanh(Box::new(add(vec![x(), Expr::Pow(Box::new(x()), 2)])));
        assert_eq!(gelu(&mul(vec![x(), c(0.5), add(vec![c(1.0), t])])), None);
    }
}
