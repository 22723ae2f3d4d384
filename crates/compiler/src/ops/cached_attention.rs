//! `CachedAttention` (domain `ai.nrt`, the project's own operator; NCM 1.12): a decoder
//! LLM's attention over its KV cache, lowered to the PE instruction `Op::CachedAttention`
//! (`kernels/src/attention.rs`).
//!
//! Inputs: `q` f32 `[B, L, H·D]` (the queries, rotated), `key_cache` and `value_cache` f32
//! `[S, T, G, D]` (slot, position, KV head — the caches after this step's rows were written),
//! `slots` i64 `[B]` (each row's slot), `positions` i64 `[B, L]` (each query's position).
//! Attributes: `num_heads` (H), `kv_num_heads` (G, dividing H), `scale` (default `1/√D`).
//! Output f32 `[B, L, H·D]`: each query attends its slot's positions `0..=p`, query head `h`
//! reading KV head `h / (H/G)` — what the standard decomposition (gather the slot, mask the
//! positions after `p`, softmax, the product with the values) computes, without reading the
//! rows past `p`.
//!
//! With two cores: a prefill's queries split by position (at `L/√2`: the causal work is a
//! triangle), a batch by rows, a single decode row by heads.

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::view::mk_ap;
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use nrt_hal::{DType, Engine};
use nrt_isa::{Op, op};

pub(super) fn register(r: &mut Registry) {
    r.op("CachedAttention", 1, infer)
        .fold(Fold::Never)
        .note("domain ai.nrt: attention of q [B, L, H·D] over the KV-cache slots [S, T, G, D] of each row, positions 0..=p (attributes num_heads, kv_num_heads, scale)")
        .device(lower!(lower_cached_attention));
}

/// The checked geometry: `(B, L, H, D, G, scale)`.
fn geometry(c: &Ctx) -> Result<(usize, usize, usize, usize, usize, f32)> {
    let h = c.n.attr_i("num_heads", 0)?;
    let g = c.n.attr_i("kv_num_heads", 0)?;
    if h <= 0 || g <= 0 || h % g != 0 || h > u32::MAX as i64 {
        return Err(c.bad_attr(format!(
            "num_heads = {h}, kv_num_heads = {g}; positive, kv_num_heads dividing num_heads"
        )));
    }
    let (h, g) = (h as usize, g as usize);
    for i in 0..5 {
        let want = if i < 3 { DType::F32 } else { DType::I64 };
        let v = c.input(i)?;
        if v.dtype != want {
            return Err(c.e(
                ErrorKind::UnsupportedDType,
                format!("input {i} of type {}; {want} expected", v.dtype),
            ));
        }
    }
    let (q, kc, vc) = (c.input(0)?, c.input(1)?, c.input(2)?);
    let (slots, pos) = (c.input(3)?, c.input(4)?);
    let [b, l, hd] = q.shape[..] else {
        return Err(c.mismatch(format!("q of shape {:?}; [B, L, H·D] expected", q.shape)));
    };
    if hd % h != 0 || hd == 0 {
        return Err(c.mismatch(format!(
            "q's last dimension {hd} is not num_heads = {h} heads"
        )));
    }
    let d = hd / h;
    match kc.shape[..] {
        [_, _, kg, kd] if kg == g && kd == d && vc.shape == kc.shape => {}
        _ => {
            return Err(c.mismatch(format!(
                "caches of shapes {:?} and {:?}; [slots, positions, {g}, {d}] both expected",
                kc.shape, vc.shape
            )));
        }
    }
    if slots.shape != [b] || pos.shape != [b, l] {
        return Err(c.mismatch(format!(
            "slots {:?} and positions {:?}; [{b}] and [{b}, {l}] expected",
            slots.shape, pos.shape
        )));
    }
    let scale = c.n.attr_finite_f("scale", 1.0 / (d as f32).sqrt())?;
    Ok((b, l, h, d, g, scale))
}

fn infer(c: &Ctx) -> Result<Vec<Out>> {
    let (b, l, h, d, ..) = geometry(c)?;
    Ok(vec![out(DType::F32, vec![b, l, h * d])])
}

impl<'a> Lowerer<'a> {
    pub(crate) fn lower_cached_attention(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (b, l, h, d, g, scale) = geometry(&c)?;
        let q = self.input_view(n, 0)?;
        let kc = self.input_view(n, 1)?;
        let vc = self.input_view(n, 2)?;
        let slots = self.input_view(n, 3)?;
        let pos = self.input_view(n, 4)?;
        let y = self.alloc(o0);
        let [s, t] = [kc.shape[0], kc.shape[1]];
        if b == 0 || l == 0 || s == 0 || t == 0 {
            return Ok(());
        }
        // One part per core: rows [b0, b0 + bn), queries [l0, l0 + ln), heads [h0, h0 + hn).
        let whole = (0, b, 0, l, 0, h);
        let parts = if self.cores < 2 {
            vec![whole]
        } else if l >= 2 {
            let cut = ((l as f64 / std::f64::consts::SQRT_2).round() as usize).clamp(1, l - 1);
            vec![(0, b, 0, cut, 0, h), (0, b, cut, l - cut, 0, h)]
        } else if b >= 2 {
            vec![(0, b / 2, 0, l, 0, h), (b / 2, b - b / 2, 0, l, 0, h)]
        } else if h >= 2 {
            vec![(0, b, 0, l, 0, h / 2), (0, b, 0, l, h / 2, h - h / 2)]
        } else {
            vec![whole]
        };
        let cache = |addr: u64| mk_ap(addr, DType::F32, &[s, t, g, d], &strides(&[s, t, g, d]));
        let rows = [l * h * d, h * d, d, 1].map(|x| x as i64);
        for (core, &(b0, bn, l0, ln, h0, hn)) in parts.iter().enumerate() {
            let first = (b0 * l * h * d + l0 * h * d + h0 * d) as u64 * 4;
            let pos_at = pos.addr + (b0 * l + l0) as u64 * 8;
            let instr = op::CachedAttention {
                q: mk_ap(q.addr + first, DType::F32, &[bn, ln, hn, d], &rows)?,
                k: cache(kc.addr)?,
                v: cache(vc.addr)?,
                slots: mk_ap(
                    slots.addr + b0 as u64 * 8,
                    DType::I64,
                    &[1, 1, 1, bn],
                    &[0, 0, 0, 1],
                )?,
                positions: mk_ap(pos_at, DType::I64, &[1, 1, bn, ln], &[0, 0, l as i64, 1])?,
                out: mk_ap(y.addr + first, DType::F32, &[bn, ln, hn, d], &rows)?,
                scale,
                group: (h / g) as u32,
                first_head: h0 as u32,
            };
            self.emit(core as u8, Engine::Pe, Op::CachedAttention(instr));
        }
        Ok(())
    }
}

/// Row-major element strides of `shape`.
fn strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![1i64; shape.len()];
    for i in (1..shape.len()).rev() {
        st[i - 1] = st[i] * shape[i] as i64;
    }
    st
}

#[cfg(test)]
mod tests {
    use crate::eval::testing::{Arg, out_types, var};
    use crate::ops::attention::a_int;
    use nrt_hal::DType;

    fn inputs(q: &[usize], cache: &[usize], slots: &[usize], pos: &[usize]) -> Vec<Option<Arg>> {
        vec![
            var(DType::F32, q),
            var(DType::F32, cache),
            var(DType::F32, cache),
            var(DType::I64, slots),
            var(DType::I64, pos),
        ]
    }

    fn heads(h: i64, g: i64) -> Vec<crate::onnx::AttributeProto> {
        vec![a_int("num_heads", h), a_int("kv_num_heads", g)]
    }

    /// The output has q's shape; bad head counts, caches of another geometry, slots or
    /// positions of the wrong shape and wrong element types are refused, naming them.
    #[test]
    fn cached_attention_shapes_and_refusals() {
        let good = inputs(&[2, 3, 576], &[5, 64, 3, 64], &[2], &[2, 3]);
        let t = out_types("CachedAttention", 1, good.clone(), heads(9, 3), 1).unwrap();
        assert_eq!(t, vec![(DType::F32, vec![2, 3, 576])]);
        let refused = |ins: Vec<Option<Arg>>, h: i64, g: i64, what: &str| {
            let e = out_types("CachedAttention", 1, ins, heads(h, g), 1).unwrap_err();
            assert!(e.message.contains(what), "{what}: {e}");
        };
        refused(good.clone(), 9, 2, "kv_num_heads dividing num_heads");
        refused(good.clone(), 0, 3, "num_heads = 0");
        refused(good.clone(), 7, 7, "is not num_heads = 7 heads");
        let bad_cache = inputs(&[2, 3, 576], &[5, 64, 3, 32], &[2], &[2, 3]);
        refused(bad_cache, 9, 3, "[slots, positions, 3, 64] both expected");
        let bad_rows = inputs(&[2, 3, 576], &[5, 64, 3, 64], &[3], &[2, 3]);
        refused(bad_rows, 9, 3, "[2] and [2, 3] expected");
        let mut bad_type = good;
        bad_type[4] = var(DType::I32, &[2, 3]);
        refused(bad_type, 9, 3, "input 4 of type i32; i64 expected");
    }
}
