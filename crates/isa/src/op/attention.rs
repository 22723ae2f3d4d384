//! The processing engine (PE), fused attention of a decoder LLM over its KV cache.
//!
//! Its fields, then its encoding, decoding (with every check the decoder makes) and operands
//! side by side. Opcode, size and engine: the table in [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use crate::op::*;
use nrt_hal::DType;

/// [`Op::CachedAttention`]: each query attends the keys of its own sequence's cache slot at
/// positions `0..=p` (its position `p`: the causal mask, the padding and a slot's stale rows
/// are never read), grouped-query heads sharing their key/value rows:
///
/// `out[b, l, h] = Σ_{t ≤ p} softmax_t(scale · q[b, l, h]·k[s, t, g]) · v[s, t, g]` with
/// `s = slots[b]`, `p = positions[b, l]`, `g = (first_head + h) / group`.
///
/// An out-of-range slot or position fails the instruction before anything is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CachedAttention {
    /// `[B, L, H, D]` f32: the queries (rotated), unit stride along `D`.
    pub q: AccessPattern,
    /// `[S, T, G, D]` f32: the key cache — slot, position, KV head — unit stride along `D`.
    pub k: AccessPattern,
    /// `[S, T, G, D]` f32: the value cache, as `k`.
    pub v: AccessPattern,
    /// `[1, 1, 1, B]` i64: each row's cache slot.
    pub slots: AccessPattern,
    /// `[1, 1, B, L]` i64: each query's position in its sequence.
    pub positions: AccessPattern,
    /// `[B, L, H, D]` f32, unit stride along `D`.
    pub out: AccessPattern,
    /// Factor of the scores (`1/√D` for the usual attention).
    pub scale: f32,
    /// Query heads per KV head (grouped-query attention; 1: one each).
    pub group: u32,
    /// The model's index of `q`'s first head (a core's share of the heads starts there):
    /// head `h` of `q` reads KV head `(first_head + h) / group`, which must be `< G`.
    pub first_head: u32,
}

impl Unit for CachedAttention {
    fn encode(&self, w: &mut W<'_>) {
        for ap in [
            &self.q,
            &self.k,
            &self.v,
            &self.slots,
            &self.positions,
            &self.out,
        ] {
            w.ap(ap);
        }
        w.f32(self.scale);
        w.u32(self.group);
        w.u32(self.first_head);
        w.zeros(4);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let q = r.ap("q")?;
        let k = r.ap("k")?;
        let v = r.ap("v")?;
        let slots = r.ap("slots")?;
        let positions = r.ap("positions")?;
        let out = r.ap("out")?;
        let scale = r.f32("scale")?;
        let at_group = r.pos;
        let group = r.u32();
        let first_head = r.u32();
        r.zeros(4, "reserved")?;
        let at = |i: usize| HEADER_SIZE + i * AP_SIZE;
        let [b, l, h, d] = q.shape;
        let [_, _, g, _] = k.shape;
        let dense = [
            (0, &q, "q.dtype", "q.stride"),
            (1, &k, "k.dtype", "k.stride"),
            (2, &v, "v.dtype", "v.stride"),
            (5, &out, "out.dtype", "out.stride"),
        ];
        for (i, ap, dtype, stride) in dense {
            require_dtype(ap, dtype, F32).map_err(|e| e.shifted(at(i)))?;
            // The rows of D elements are read (and written) as contiguous vectors.
            if ap.shape[3] > 1 && ap.stride[3] != 1 {
                let bad = Reason::OutOfRange(ap.stride[3] as u64);
                return Err(DecodeError::field(stride, bad).at(at(i) + 32 + 12));
            }
        }
        same_shape("v.shape", &k.shape, &v).map_err(|e| e.shifted(at(2)))?;
        dim_eq("k.shape", 3, d, k.shape[3]).map_err(|e| e.shifted(at(1)))?;
        require_dtype(&slots, "slots.dtype", &[DType::I64]).map_err(|e| e.shifted(at(3)))?;
        same_shape("slots.shape", &[1, 1, 1, b], &slots).map_err(|e| e.shifted(at(3)))?;
        require_dtype(&positions, "positions.dtype", &[DType::I64])
            .map_err(|e| e.shifted(at(4)))?;
        same_shape("positions.shape", &[1, 1, b, l], &positions).map_err(|e| e.shifted(at(4)))?;
        same_shape("out.shape", &q.shape, &out).map_err(|e| e.shifted(at(5)))?;
        // Every head of q maps to a KV head of the cache (checked in u64: no overflow).
        let last_kv = (first_head as u64 + h as u64).saturating_sub(1) / group.max(1) as u64;
        if group == 0 || (h > 0 && last_kv >= g as u64) {
            return Err(DecodeError::field("group", Reason::OutOfRange(group as u64)).at(at_group));
        }
        Ok(Self {
            q,
            k,
            v,
            slots,
            positions,
            out,
            scale,
            group,
            first_head,
        })
    }

    operands!(|f| Self {
        q,
        k,
        v,
        slots,
        positions,
        out,
        ..
    } => {
        f(0, "q", Role::Read, q);
        f(1, "k", Role::Read, k);
        f(2, "v", Role::Read, v);
        f(3, "slots", Role::Read, slots);
        f(4, "positions", Role::Read, positions);
        f(5, "out", Role::Write, out);
    });
}
