//! Recurrent networks: RNN, GRU, LSTM, unrolled over the sequence length (known at compile
//! time, as every shape here is). Design: per direction, one PE MatMul computes the input
//! projection of all time steps (`X·Wᵀ`, plus the biases); each step then accumulates
//! `H_{t−1}·Rᵀ` into its slice with one more MatMul (`ACCUMULATE`) and runs the gates on ACT
//! and DVE, writing `H_t` straight into its slot of `Y` (the next step reads it there). The
//! program grows linearly with the sequence length; a model that streams state across
//! executions passes `initial_h` / `initial_c` in and takes `Y_h` / `Y_c` out.
//!
//! Supported: forward, reverse and bidirectional; `layout` 0 and 1; `clip`; LSTM peepholes;
//! GRU `linear_before_reset` 0 and 1; the default activations; `sequence_lens` (a constant
//! or computed at run time). Not supported (named in the error): other activations, LSTM
//! `input_forget`.
//!
//! `sequence_lens` (batch entry `b` is `L_b` steps long, the rest padding) is a mask the
//! device computes once, `M[t, b] = t < L_b`: each step computes as usual, then keeps its
//! new state only where `M` holds (`Select` into the running state) and zeroes its `Y` rows
//! where it does not. Steps past `L_b` so leave entry `b`'s state as it was — the final
//! state is the one at step `L_b − 1` — and in the reverse direction, which runs `t = seq − 1
//! … 0`, entry `b` starts from its initial state at `t = L_b − 1`, as ONNX defines. Without
//! `sequence_lens` (or with a constant equal to the sequence length) none of this is
//! emitted. Lengths outside `0..=seq` are refused: constant ones when compiled, run-time ones
//! on the device, which fails the execution with `NRT_EXEC_OOB` (`checked_lens`).

use super::{Dtypes, Registry};
use crate::error::{ErrorKind, Result};
use crate::graph::Node;
use crate::lower::view::{View, dense_ap, mk_ap};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use crate::tensor::HostTensor;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, BinaryOp, Op, matmul_flags};

pub(super) fn register(r: &mut Registry) {
    for name in ["RNN", "GRU", "LSTM"] {
        r.op(name, 7, infer_rnn)
            .dtypes(Dtypes::Float)
            .note("unrolled over the sequence; default activations; sequence_lens constant or computed at run time (a mask)")
            .device(lower!(lower_rnn));
    }
}

/// The geometry of one recurrent node.
struct Rnn {
    /// Gates: 1 (RNN), 3 (GRU), 4 (LSTM).
    gates: usize,
    dirs: usize,
    /// Direction 0 runs backwards (`direction = reverse`).
    reverse: bool,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    /// `layout = 1`: batch first.
    batch_first: bool,
    clip: Option<f32>,
    linear_before_reset: bool,
    /// `sequence_lens` is given and may be shorter than the sequence: steps are masked.
    masked: bool,
}

fn rnn_params(c: &Ctx) -> Result<Rnn> {
    let n = c.n;
    let op = n.op.as_str();
    let gates = match op {
        "RNN" => 1,
        "GRU" => 3,
        _ => 4,
    };
    let (x, w, r) = (c.input(0)?, c.input(1)?, c.input(2)?);
    if x.shape.len() != 3 || w.shape.len() != 3 || r.shape.len() != 3 {
        return Err(c.mismatch(format!(
            "X {:?}, W {:?}, R {:?} (each of rank 3)",
            x.shape, w.shape, r.shape
        )));
    }
    let (dirs, reverse) = match n.attr_s("direction", "forward")?.as_str() {
        "forward" => (1, false),
        "reverse" => (1, true),
        "bidirectional" => (2, false),
        d => return Err(c.bad_attr(format!("direction '{d}'"))),
    };
    let batch_first = match n.attr_i("layout", 0)? {
        0 => false,
        1 => true,
        l => return Err(c.bad_attr(format!("layout {l}"))),
    };
    let (seq, batch) = if batch_first {
        (x.shape[1], x.shape[0])
    } else {
        (x.shape[0], x.shape[1])
    };
    let input = x.shape[2];
    let hidden = match n.attr_i("hidden_size", -1)? {
        -1 => w.shape[1] / gates,
        h => usize::try_from(h).map_err(|_| c.bad_attr(format!("hidden_size {h}")))?,
    };
    if w.shape != [dirs, gates * hidden, input] || r.shape != [dirs, gates * hidden, hidden] {
        return Err(c.mismatch(format!(
            "W {:?} and R {:?} for {dirs} direction(s), {gates} gate(s) of {hidden}, input {input}",
            w.shape, r.shape
        )));
    }
    let defaults: &[&str] = match gates {
        1 => &["tanh"],
        3 => &["sigmoid", "tanh"],
        _ => &["sigmoid", "tanh", "tanh"],
    };
    if let Some(acts) = n.attr_strings("activations")? {
        let want: Vec<&str> = (0..dirs).flat_map(|_| defaults.iter().copied()).collect();
        let same = acts.len() == want.len()
            && acts
                .iter()
                .zip(&want)
                .all(|(a, b)| a.eq_ignore_ascii_case(b));
        if !same {
            return Err(c.e(
                ErrorKind::UnsupportedOp,
                format!("activations {acts:?} (only the defaults {defaults:?} are supported)"),
            ));
        }
    }
    if gates == 4 && n.attr_i("input_forget", 0)? != 0 {
        return Err(c.e(
            ErrorKind::UnsupportedOp,
            "input_forget = 1 is not supported",
        ));
    }
    let clip = match n.attr_f("clip", f32::NAN)? {
        v if v.is_nan() => None,
        v if v > 0.0 => Some(v),
        v => return Err(c.bad_attr(format!("clip {v}"))),
    };
    let mut masked = false;
    if let Some(lens) = c.opt(4) {
        if lens.dtype != DType::I32 || lens.shape != [batch] {
            return Err(c.mismatch(format!(
                "sequence_lens is {} {:?} (int32 [{batch}] expected)",
                lens.dtype, lens.shape
            )));
        }
        masked = match &lens.konst {
            Some(t) => {
                let lens = t.to_i64s();
                if let Some(l) = lens.iter().find(|&&l| l < 0 || l > seq as i64) {
                    return Err(c.e(
                        ErrorKind::BadShape,
                        format!("sequence_lens holds {l}, outside 0..={seq} (the sequence length)"),
                    ));
                }
                lens.iter().any(|&l| l != seq as i64)
            }
            None => true,
        };
    }
    let state = if batch_first {
        [batch, dirs, hidden]
    } else {
        [dirs, batch, hidden]
    };
    for i in [5, 6] {
        if let Some(v) = c.opt(i)
            && v.shape != state
        {
            return Err(c.mismatch(format!("initial state {:?}, expected {state:?}", v.shape)));
        }
    }
    if let Some(b) = c.opt(3)
        && b.shape != [dirs, 2 * gates * hidden]
    {
        return Err(c.mismatch(format!("B {:?}", b.shape)));
    }
    if gates == 4
        && let Some(p) = c.opt(7)
        && p.shape != [dirs, 3 * hidden]
    {
        return Err(c.mismatch(format!("P {:?}", p.shape)));
    }
    Ok(Rnn {
        gates,
        dirs,
        reverse,
        seq,
        batch,
        input,
        hidden,
        batch_first,
        clip,
        linear_before_reset: gates == 3 && n.attr_i("linear_before_reset", 0)? != 0,
        masked,
    })
}

/// Y, Y_h (and Y_c for LSTM).
pub(crate) fn infer_rnn(c: &Ctx) -> Result<Vec<Out>> {
    let p = rnn_params(c)?;
    let dt = c.input(0)?.dtype;
    let (y, h) = if p.batch_first {
        (
            vec![p.batch, p.seq, p.dirs, p.hidden],
            vec![p.batch, p.dirs, p.hidden],
        )
    } else {
        (
            vec![p.seq, p.dirs, p.batch, p.hidden],
            vec![p.dirs, p.batch, p.hidden],
        )
    };
    let mut outs = vec![out(dt, y), out(dt, h.clone())];
    if p.gates == 4 {
        outs.push(out(dt, h));
    }
    Ok(outs)
}

/// A recurrent layer's weight for one direction.
enum Weight {
    /// As stored: `[N, K]` (`W[d]`, `R[d]`), multiplied transposed.
    Nk(View),
    /// Packed in panels ([`Lowerer::pack_weight_at`]): the placeholder `[K, N]` view.
    Packed(View),
}

/// A 2-D f32 view.
fn v2(addr: u64, rows: usize, cols: usize, row_stride: usize) -> View {
    View {
        addr,
        dtype: DType::F32,
        shape: vec![rows, cols],
        strides: vec![row_stride as i64, 1],
    }
}

/// Columns `[from, from + n)` of a 2-D view.
fn cols(v: &View, from: usize, n: usize) -> View {
    View {
        addr: v.elems(from as i64),
        dtype: v.dtype,
        shape: vec![v.shape[0], n],
        strides: v.strides.clone(),
    }
}

fn ap(v: &View) -> Result<AccessPattern> {
    mk_ap(v.addr, v.dtype, &v.shape, &v.strides)
}

impl<'a> Lowerer<'a> {
    /// A dense f32 `[rows, cols]` temporary.
    fn t2(&mut self, rows: usize, cols: usize) -> View {
        v2(self.temp(rows * cols * 4), rows, cols, cols)
    }

    /// `c (+)= a · bᵀ` on PE (`b` is `[N, K]`).
    fn mm_bt(&mut self, a: &View, b: &View, c: &View, accumulate: bool) -> Result<()> {
        self.mm_w(a, &Weight::Nk(b.clone()), c, accumulate)
    }

    /// `c (+)= a · W` for a recurrent weight as stored (`[N, K]`, multiplied transposed) or
    /// packed in panels.
    fn mm_w(&mut self, a: &View, w: &Weight, c: &View, accumulate: bool) -> Result<()> {
        let (b, layout) = match w {
            Weight::Nk(b) => (b, matmul_flags::TRANSPOSE_B),
            Weight::Packed(b) => (b, matmul_flags::PACKED_B),
        };
        let acc = if accumulate {
            matmul_flags::ACCUMULATE
        } else {
            0
        };
        self.matmul_aps(ap(a)?, ap(b)?, ap(c)?, 1.0, layout | acc);
        Ok(())
    }

    /// Gate pre-activations `g` through `f` in place (clipped first with `clip`).
    fn gate(&mut self, g: &View, f: ActFunc, clip: Option<f32>) -> Result<()> {
        if let Some(t) = clip {
            self.activation(g, g, None, (ActFunc::Clip, -t, t), 1.0)?;
        }
        self.activation(g, g, None, (f, 0.0, 0.0), 1.0)
    }

    /// The state of direction `d` given by input `i` (`[dirs, batch, hidden]` or batch
    /// first), or zeros.
    fn initial_state(&mut self, n: &Node, i: usize, p: &Rnn, d: usize) -> Result<View> {
        let (b, h) = (p.batch, p.hidden);
        if n.inputs.get(i).copied().flatten().is_none() {
            let z = self.t2(b, h);
            self.fill(Engine::Dve, &z, 0.0)?;
            return Ok(z);
        }
        let s = self.input_view(n, i)?;
        Ok(if p.batch_first {
            v2(s.elems((d * h) as i64), b, h, p.dirs * h)
        } else {
            v2(s.elems((d * b * h) as i64), b, h, h)
        })
    }

    /// `sequence_lens` computed at run time, range-checked on the device as every run-time
    /// index is: a length outside `0..=seq` fails the execution with `NRT_EXEC_OOB` (ONNX
    /// Runtime refuses it too; unchecked, a length past the sequence ran as a full one and a
    /// negative one as 0). The lengths go through a `GatherElements` from the constant table
    /// `[0, 1, …, seq]`, which POOL checks against `[-(seq + 1), seq + 1)`, after DVE has
    /// made each negative length `seq + 1` (past the table; the gather would count it from
    /// the end). The gathered copy — the lengths themselves — is what the mask reads, so
    /// the check cannot be skipped. Returns `[batch]` i32.
    fn checked_lens(&mut self, n: &Node, seq: usize, b: usize) -> Result<View> {
        let too_large = || n.error(ErrorKind::TooLarge, format!("sequence length {seq}"));
        let rows = seq.checked_add(1).ok_or_else(too_large)?;
        let past = i32::try_from(rows).map_err(|_| too_large())?;
        let bytes = b.checked_mul(4).ok_or_else(too_large)?;
        let lens = self.input_view(n, 4)?;
        let scalar = |l: &mut Self, v: i32| -> Result<View> {
            let a = l.add_const(&HostTensor::ints(DType::I32, vec![1], vec![i64::from(v)]))?;
            Ok(View::dense(a, DType::I32, &[1]).broadcast(&[b]))
        };
        let (zero, past) = (scalar(self, 0)?, scalar(self, past)?);
        let neg = View::dense(self.temp(b), DType::Bool, &[b]);
        self.binary(&lens, &zero, &neg, BinaryOp::Less)?;
        let idx = View::dense(self.temp(bytes), DType::I32, &[b]);
        self.select(&neg, &past, &lens, &idx)?;
        let table = self.add_const(&HostTensor::ints(
            DType::I32,
            vec![rows],
            (0..rows as i64).collect(),
        ))?;
        let checked = View::dense(self.temp(bytes), DType::I32, &[b]);
        self.emit(
            0,
            Engine::Pool,
            Op::GatherElements(op::GatherElements {
                data: mk_ap(table, DType::I32, &[b, rows], &[0, 1])?,
                indices: dense_ap(idx.addr, DType::I32, &[b, 1])?,
                output: dense_ap(checked.addr, DType::I32, &[b, 1])?,
                axis: 3,
            }),
        );
        Ok(checked)
    }

    /// RNN / GRU / LSTM, unrolled (see the module comment).
    pub(crate) fn lower_rnn(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, .. } = at;
        let p = rnn_params(&c)?;
        let (g, h, b, seq, dirs) = (p.gates, p.hidden, p.batch, p.seq, p.dirs);
        let gh = g * h;
        // Y (a temporary when the model omits it), then Y_h and Y_c, if used.
        let y_all = match n.outputs.first().copied().flatten() {
            Some(v) => self.alloc(v),
            None => View::dense(
                self.temp(seq * dirs * b * h * 4),
                DType::F32,
                &[seq * dirs * b * h],
            ),
        };
        let mut finals = Vec::new();
        for k in [1, 2] {
            let o = n.outputs.get(k).copied().flatten();
            finals.push(o.map(|v| self.alloc(v)));
        }
        if b * h * seq == 0 {
            return Ok(());
        }
        let x = self.input_view(n, 0)?;
        let (wv, rv) = (Self::input_id(n, 1)?, Self::input_id(n, 2)?);
        let bias = match n.inputs.get(3).copied().flatten() {
            Some(_) => Some(self.input_view(n, 3)?),
            None => None,
        };
        let peep = match n.inputs.get(7).copied().flatten() {
            Some(_) if g == 4 => Some(self.input_view(n, 7)?),
            _ => None,
        };
        // H_t's slot in Y: [seq, dirs, batch, h] or [batch, seq, dirs, h].
        let slot = |t: usize, d: usize| {
            if p.batch_first {
                v2(
                    y_all.elems(((t * dirs + d) * h) as i64),
                    b,
                    h,
                    seq * dirs * h,
                )
            } else {
                v2(y_all.elems((((t * dirs + d) * b) * h) as i64), b, h, h)
            }
        };
        // `sequence_lens`: the mask M[t, b] = t < L_b (bool [seq, batch]), once for both
        // directions; step t reads row t broadcast over the hidden units.
        let mask = if p.masked {
            let ramp = self.add_const(&HostTensor::ints(
                DType::I32,
                vec![seq, 1],
                (0..seq as i64).collect(),
            ))?;
            let ramp = View::dense(ramp, DType::I32, &[seq, 1]).broadcast(&[seq, b]);
            let lens = match c.opt(4).and_then(|v| v.konst.as_ref()) {
                // Checked when the node's parameters were read.
                Some(_) => self.input_view(n, 4)?,
                None => self.checked_lens(n, seq, b)?,
            };
            let lens = lens.broadcast(&[seq, b]);
            let m = View::dense(self.temp(seq * b), DType::Bool, &[seq, b]);
            self.binary(&ramp, &lens, &m, BinaryOp::Less)?;
            Some(m)
        } else {
            None
        };
        let mask_at = |m: &View, t: usize| View {
            addr: m.elems((t * b) as i64),
            dtype: DType::Bool,
            shape: vec![b, h],
            strides: vec![1, 0],
        };
        let rows = seq * b;
        for d in 0..dirs {
            let backwards = p.reverse || d == 1;
            // Constant weights are packed in panels once per direction (`pack_weight_at`:
            // `W[d]` always, `R[d]` unless GRU's, whose gates multiply parts of it); the
            // original layout is then not stored.
            let wd = match self.pack_weight_at(wv, d * gh * p.input, p.input, gh, true) {
                Some(pk) => Weight::Packed(pk),
                None => {
                    let w = self.input_view(n, 1)?;
                    Weight::Nk(v2(w.elems((d * gh * p.input) as i64), gh, p.input, p.input))
                }
            };
            let packed_r = if g == 3 {
                None
            } else {
                self.pack_weight_at(rv, d * gh * h, h, gh, true)
            };
            let rw = match packed_r {
                Some(pk) => Weight::Packed(pk),
                None => {
                    let r = self.input_view(n, 2)?;
                    Weight::Nk(v2(r.elems((d * gh * h) as i64), gh, h, h))
                }
            };
            // The input projection of every step, rows in X's order, plus the biases (R's
            // h-gate bias stays out of it for GRU with linear_before_reset).
            let xw = self.t2(rows, gh);
            self.mm_w(&v2(x.addr, rows, p.input, p.input), &wd, &xw, false)?;
            if let Some(bv) = &bias {
                let wb = v2(bv.elems((d * 2 * gh) as i64), 1, gh, gh).broadcast(&[rows, gh]);
                self.binary(&xw, &wb, &xw, BinaryOp::Add)?;
                let rn = if p.linear_before_reset { 2 * h } else { gh };
                let rb = v2(bv.elems((d * 2 * gh + gh) as i64), 1, rn, rn).broadcast(&[rows, rn]);
                self.binary(&cols(&xw, 0, rn), &rb, &cols(&xw, 0, rn), BinaryOp::Add)?;
            }
            let step = |t: usize| {
                if p.batch_first {
                    v2(xw.elems((t * gh) as i64), b, gh, seq * gh)
                } else {
                    v2(xw.elems((t * b * gh) as i64), b, gh, gh)
                }
            };
            let mut hp = self.initial_state(n, 5, &p, d)?;
            let mut cp = if g == 4 {
                Some(self.initial_state(n, 6, &p, d)?)
            } else {
                None
            };
            // Masked: the running state lives in its own buffers (a step past an entry's
            // length keeps it), not in Y's slots.
            let mut state = None;
            if mask.is_some() {
                let hs = self.t2(b, h);
                self.copy(Engine::Dve, &hp, &hs)?;
                let cs = match &cp {
                    Some(c0) => {
                        let cs = self.t2(b, h);
                        self.copy(Engine::Dve, c0, &cs)?;
                        Some(cs)
                    }
                    None => None,
                };
                hp = hs.clone();
                cp = cs.clone();
                state = Some((hs, cs));
            }
            let order: Vec<usize> = if backwards {
                (0..seq).rev().collect()
            } else {
                (0..seq).collect()
            };
            for &t in &order {
                let gt = step(t);
                let ht = slot(t, d);
                match g {
                    1 => {
                        self.mm_w(&hp, &rw, &gt, true)?;
                        if let Some(cl) = p.clip {
                            self.activation(&gt, &gt, None, (ActFunc::Clip, -cl, cl), 1.0)?;
                        }
                        self.activation(&gt, &ht, None, (ActFunc::Tanh, 0.0, 0.0), 1.0)?;
                    }
                    3 => {
                        let Weight::Nk(rd) = &rw else {
                            unreachable!("GRU's R is never packed")
                        };
                        // z, r, then the candidate h̃.
                        let zr = cols(&gt, 0, 2 * h);
                        self.mm_bt(&hp, &v2(rd.addr, 2 * h, h, h), &zr, true)?;
                        self.gate(&zr, ActFunc::Sigmoid, p.clip)?;
                        let (z, rg, hh) = (cols(&gt, 0, h), cols(&gt, h, h), cols(&gt, 2 * h, h));
                        let rh_w = v2(rd.elems((2 * h * h) as i64), h, h, h);
                        if p.linear_before_reset {
                            let tmp = self.t2(b, h);
                            self.mm_bt(&hp, &rh_w, &tmp, false)?;
                            if let Some(bv) = &bias {
                                let rbh = v2(bv.elems((d * 2 * gh + gh + 2 * h) as i64), 1, h, h)
                                    .broadcast(&[b, h]);
                                self.binary(&tmp, &rbh, &tmp, BinaryOp::Add)?;
                            }
                            self.binary(&tmp, &rg, &tmp, BinaryOp::Mul)?;
                            self.binary(&hh, &tmp, &hh, BinaryOp::Add)?;
                        } else {
                            let rhp = self.t2(b, h);
                            self.binary(&rg, &hp, &rhp, BinaryOp::Mul)?;
                            self.mm_bt(&rhp, &rh_w, &hh, true)?;
                        }
                        self.gate(&hh, ActFunc::Tanh, p.clip)?;
                        // H_t = h̃ + z ⊙ (H_{t−1} − h̃).
                        let tmp = self.t2(b, h);
                        self.binary(&hp, &hh, &tmp, BinaryOp::Sub)?;
                        self.binary(&z, &tmp, &tmp, BinaryOp::Mul)?;
                        self.binary(&hh, &tmp, &ht, BinaryOp::Add)?;
                    }
                    _ => {
                        // Gates i, o, f, c.
                        self.mm_w(&hp, &rw, &gt, true)?;
                        let (ig, og, fg, cg) = (
                            cols(&gt, 0, h),
                            cols(&gt, h, h),
                            cols(&gt, 2 * h, h),
                            cols(&gt, 3 * h, h),
                        );
                        let c_prev = cp.clone().expect("LSTM state");
                        let peep_term =
                            |l: &mut Self, k: usize, cst: &View, gv: &View| -> Result<()> {
                                if let Some(pv) = &peep {
                                    let pk = v2(pv.elems((d * 3 * h + k * h) as i64), 1, h, h)
                                        .broadcast(&[b, h]);
                                    let tmp = l.t2(b, h);
                                    l.binary(&pk, cst, &tmp, BinaryOp::Mul)?;
                                    l.binary(gv, &tmp, gv, BinaryOp::Add)?;
                                }
                                Ok(())
                            };
                        // P holds the i, o, f peepholes.
                        peep_term(self, 0, &c_prev, &ig)?;
                        peep_term(self, 2, &c_prev, &fg)?;
                        self.gate(&ig, ActFunc::Sigmoid, p.clip)?;
                        self.gate(&fg, ActFunc::Sigmoid, p.clip)?;
                        self.gate(&cg, ActFunc::Tanh, p.clip)?;
                        let ct = self.t2(b, h);
                        let tmp = self.t2(b, h);
                        self.binary(&fg, &c_prev, &ct, BinaryOp::Mul)?;
                        self.binary(&ig, &cg, &tmp, BinaryOp::Mul)?;
                        self.binary(&ct, &tmp, &ct, BinaryOp::Add)?;
                        peep_term(self, 1, &ct, &og)?;
                        self.gate(&og, ActFunc::Sigmoid, p.clip)?;
                        self.activation(&ct, &tmp, None, (ActFunc::Tanh, 0.0, 0.0), 1.0)?;
                        self.binary(&og, &tmp, &ht, BinaryOp::Mul)?;
                        cp = Some(ct);
                    }
                }
                hp = ht;
                if let (Some(m), Some((hs, cs))) = (&mask, &state) {
                    let mt = mask_at(m, t);
                    self.select(&mt, &hp, hs, hs)?;
                    if let (Some(cs), Some(ct)) = (cs, &cp) {
                        self.select(&mt, ct, cs, cs)?;
                    }
                    let zero = self.scalar(0.0, &[b, h])?;
                    self.select(&mt, &hp, &zero, &hp)?;
                    hp = hs.clone();
                    cp = cs.clone();
                }
            }
            // Final states.
            let fin = |l: &mut Self, k: usize, src: &View| -> Result<()> {
                if let Some(o) = &finals[k - 1] {
                    let dst = if p.batch_first {
                        v2(o.elems((d * h) as i64), b, h, dirs * h)
                    } else {
                        v2(o.elems((d * b * h) as i64), b, h, h)
                    };
                    l.copy(Engine::Dve, src, &dst)?;
                }
                Ok(())
            };
            fin(self, 1, &hp)?;
            if let Some(cv) = &cp {
                fin(self, 2, cv)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{Arg, a_i, a_s, ctx, konst, one_node, out_types, var};
    use crate::tensor::HostTensor;
    use nrt_hal::DType;

    fn f(s: &[usize]) -> Option<Arg> {
        var(DType::F32, s)
    }

    #[test]
    fn bidirectional_lstm_outputs() {
        let ins = vec![f(&[5, 2, 3]), f(&[2, 16, 3]), f(&[2, 16, 4])];
        let t = out_types("LSTM", 14, ins, vec![a_s("direction", "bidirectional")], 3).unwrap();
        let h = (DType::F32, vec![2, 2, 4]);
        assert_eq!(t, vec![(DType::F32, vec![5, 2, 2, 4]), h.clone(), h]);
    }

    /// A batch-first GRU (batch 2, sequence 3, hidden 4) with constant `sequence_lens`.
    fn gru(lens: [i32; 2]) -> Result<super::Rnn, String> {
        let lens = konst(HostTensor::ints(
            DType::I32,
            vec![2],
            lens.iter().map(|&l| l as i64).collect(),
        ));
        let ins = vec![f(&[2, 3, 5]), f(&[1, 12, 5]), f(&[1, 12, 4]), None, lens];
        let g = one_node(
            "GRU",
            14,
            ins,
            vec![a_i("layout", 1), a_i("linear_before_reset", 1)],
            2,
        );
        let c = ctx(&g);
        super::rnn_params(&c).map_err(|e| e.message)
    }

    #[test]
    fn gru_params_mask_only_shorter_sequences() {
        let p = gru([3, 3]).unwrap();
        let got = (
            p.gates,
            p.dirs,
            p.seq,
            p.batch,
            p.input,
            p.hidden,
            p.batch_first,
        );
        assert_eq!(got, (3, 1, 3, 2, 5, 4, true));
        assert!(p.linear_before_reset && !p.masked && !p.reverse && p.clip.is_none());
        assert!(gru([3, 1]).unwrap().masked);
        let e = gru([4, 1]).err().unwrap();
        assert!(e.contains("sequence_lens holds 4, outside 0..=3"), "{e}");
    }
}
