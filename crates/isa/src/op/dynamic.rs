//! The pooling engine (POOL), data-dependent shapes (NCM 1.4): NonZero, Unique, NonMaxSuppression.
//!
//! Each instruction: its fields, then its encoding, decoding (with every check the
//! decoder makes) and operands side by side. Opcodes, sizes and engines: the table in
//! [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use crate::op::*;
use nrt_hal::DType;

/// The static shape of a value whose extent along one axis depends on the data
/// ([`Op::Unique`]'s `y`): `rank` dimensions (1..=8), `dims[axis]` the upper bound, the
/// dimensions past `rank` zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeTemplate {
    /// Number of dimensions (1..=8).
    pub rank: u8,
    /// The data-dependent dimension (< `rank`).
    pub axis: u8,
    /// The dimensions (the bound at `axis`).
    pub dims: [u32; 8],
}

/// Flags of [`Op::NonMaxSuppression`].
pub mod nms_flags {
    /// Boxes are `[x_center, y_center, width, height]` (else `[y1, x1, y2, x2]`).
    pub const CENTER_POINT_BOX: u32 = 1;
    /// The `max_out` operand is present.
    pub const MAX_OUT: u32 = 2;
    /// The `iou` operand is present.
    pub const IOU: u32 = 4;
    /// The `score_threshold` operand is present.
    pub const SCORE: u32 = 8;
    /// `score_const` is a threshold (without [`SCORE`]).
    pub const SCORE_CONST: u32 = 16;
    /// Every flag.
    pub const ALL: u32 = 31;
}

/// POOL: the coordinates of the nonzero elements of `input` (ONNX NonZero; NCM 1.4), an
/// output whose extent depends on the data. `output` is the static upper bound
/// `[R, N]`; the actual result `[R, count]` is written packed first (row-major: row `r`
/// holds coordinate `r` of every nonzero element, in element order), the rest of
/// `output` is zero, and `shape` receives `[R, count]`. A float element is nonzero when
/// it compares unequal to 0 (NaN is nonzero).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonZero {
    /// `[d0, d1, d2, d3]`, any element type; the coordinates are those of its last `R`
    /// dimensions (the first `4 − R` are 1).
    pub input: AccessPattern,
    /// `[1, 1, R, N]` of i64, `R` in 1..=4, `N` the elements of `input`.
    pub output: AccessPattern,
    /// `[1, 1, 1, 2]` of i64.
    pub shape: AccessPattern,
}

impl Unit for NonZero {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            output,
            shape,
        } = self;
        w.ap(input);
        w.ap(output);
        w.ap(shape);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let output = r.ap("output")?;
        let shape = r.ap("shape")?;
        let at = HEADER_SIZE + AP_SIZE;
        require_dtype(&output, "output.dtype", &[DType::I64]).map_err(|e| e.shifted(at))?;
        let rank = output.shape[2];
        if !(1..=4).contains(&rank) {
            return Err(
                DecodeError::field("output.shape", Reason::OutOfRange(rank as u64)).at(at + 16 + 8),
            );
        }
        let mut lead = [1u32; 4];
        lead[4 - rank as usize..].copy_from_slice(&input.shape[4 - rank as usize..]);
        same_shape("input.shape", &lead, &input).map_err(|e| e.shifted(HEADER_SIZE))?;
        let n = input.elements();
        let n = u32::try_from(n).map_err(|_| {
            DecodeError::field("input.shape", Reason::OutOfRange(n)).at(HEADER_SIZE + 16)
        })?;
        same_shape("output.shape", &[1, 1, rank, n], &output).map_err(|e| e.shifted(at))?;
        shape_operand(&shape, 2, HEADER_SIZE + 2 * AP_SIZE)?;
        Ok(Self {
            input,
            output,
            shape,
        })
    }

    operands!(|f| Self {
        input,
        output,
        shape,
    } => {
        f(0, "input", Role::Read, input);
        f(1, "output", Role::Write, output);
        f(2, "shape", Role::Write, shape);
    });
}

/// POOL: the distinct slices `input[o, j, i]` (`j` along dimension 2, each slice the
/// `(o, i)` elements in order) of `input` (ONNX Unique; NCM 1.4). `y` is the static upper
/// bound (every slice distinct); the `U` distinct slices are written packed first (the
/// actual `[outer, U, inner]` row-major), zeros after. `sorted`: ascending
/// (lexicographic, NaN above every number and equal to itself), else in order of first
/// occurrence. `indices[u]` is the first occurrence of slice `u`, `counts[u]` how often
/// it occurs (both `U` long, zeros after), `inverse[j]` the slice of `y` that slice `j`
/// equals. `shape` receives `y`'s actual shape: `dims` with `U` at `dims.axis`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Unique {
    /// `[1, outer, A, inner]`, f32 or an integer type.
    pub input: AccessPattern,
    /// `[1, outer, A, inner]`, the input's type.
    pub y: AccessPattern,
    /// `[1, 1, 1, A]` of i64.
    pub indices: AccessPattern,
    /// `[1, 1, 1, A]` of i64.
    pub inverse: AccessPattern,
    /// `[1, 1, 1, A]` of i64.
    pub counts: AccessPattern,
    /// `[1, 1, 1, dims.rank]` of i64.
    pub shape: AccessPattern,
    /// `y`'s ONNX shape with the bound `A` at `dims.axis`.
    pub dims: ShapeTemplate,
    /// Ascending, else in order of first occurrence.
    pub sorted: bool,
}

impl Unit for Unique {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            y,
            indices,
            inverse,
            counts,
            shape,
            dims,
            sorted,
        } = self;
        for ap in [input, y, indices, inverse, counts, shape] {
            w.ap(ap);
        }
        w.u8(dims.rank);
        w.u8(dims.axis);
        w.u8(*sorted as u8);
        w.u8(0);
        for d in dims.dims {
            w.u32(d);
        }
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let y = r.ap("y")?;
        let indices = r.ap("indices")?;
        let inverse = r.ap("inverse")?;
        let counts = r.ap("counts")?;
        let shape = r.ap("shape")?;
        let at = r.pos;
        let rank = r.u8();
        let axis = r.u8();
        let sorted = r.u8();
        r.zeros(1, "reserved")?;
        let mut dims = [0u32; 8];
        for d in &mut dims {
            *d = r.u32();
        }
        r.zeros(4, "reserved")?;
        if !(1..=8).contains(&rank) {
            return Err(DecodeError::field("dims.rank", Reason::OutOfRange(rank as u64)).at(at));
        }
        if axis >= rank {
            return Err(
                DecodeError::field("dims.axis", Reason::OutOfRange(axis as u64)).at(at + 1),
            );
        }
        if sorted > 1 {
            return Err(DecodeError::field("sorted", Reason::OutOfRange(sorted as u64)).at(at + 2));
        }
        if let Some(i) = (rank as usize..8).find(|&i| dims[i] != 0) {
            return Err(DecodeError::field("dims", Reason::ReservedNonZero).at(at + 4 + 4 * i));
        }
        require_dtype(&input, "input.dtype", TOP_K_TYPES).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&y, "y.dtype", &[input.dtype])
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        dim_eq("input.shape", 0, 1, input.shape[0]).map_err(|e| e.shifted(HEADER_SIZE))?;
        same_shape("y.shape", &input.shape, &y).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let a = input.shape[2];
        for (k, (ap, name)) in [
            (indices, "indices.shape"),
            (inverse, "inverse.shape"),
            (counts, "counts.shape"),
        ]
        .iter()
        .enumerate()
        {
            let off = HEADER_SIZE + (2 + k) * AP_SIZE;
            require_dtype(ap, "dtype", &[DType::I64]).map_err(|e| e.shifted(off))?;
            same_shape(name, &[1, 1, 1, a], ap).map_err(|e| e.shifted(off))?;
        }
        shape_operand(&shape, rank as u32, HEADER_SIZE + 5 * AP_SIZE)?;
        // The template describes `y`: outer · bound · inner.
        let prod = |ds: &[u32]| ds.iter().try_fold(1u64, |p, &d| p.checked_mul(d as u64));
        let (r_, x) = (rank as usize, axis as usize);
        let fits = prod(&dims[..x]) == Some(input.shape[1] as u64)
            && dims[x] == a
            && prod(&dims[x + 1..r_]) == Some(input.shape[3] as u64);
        if !fits {
            return Err(DecodeError::field(
                "dims",
                Reason::ShapeMismatch {
                    dim: x,
                    expected: a,
                    found: dims[x],
                },
            )
            .at(at + 4));
        }
        Ok(Self {
            input,
            y,
            indices,
            inverse,
            counts,
            shape,
            dims: ShapeTemplate { rank, axis, dims },
            sorted: sorted != 0,
        })
    }

    operands!(|f| Self {
        input,
        y,
        indices,
        inverse,
        counts,
        shape,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "y", Role::Write, y);
        f(2, "indices", Role::Write, indices);
        f(3, "inverse", Role::Write, inverse);
        f(4, "counts", Role::Write, counts);
        f(5, "shape", Role::Write, shape);
    });
}

/// POOL: greedy non-maximum suppression per batch and class (ONNX NonMaxSuppression;
/// NCM 1.4). Boxes whose score is above the score threshold (when there is one) are
/// taken by descending score (equal scores: the lower box index first); a box whose IoU
/// with one already selected in its class is above the IoU threshold is dropped; at most
/// `max_out` per class. `selected` is the static upper bound; the `count` selections
/// `(batch, class, box)` are written packed first, zeros after, and `shape` receives
/// `[count, 3]`. The scalars come from operands read at execution time when present,
/// else from the immediates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NonMaxSuppression {
    /// `[1, B, S, 4]` of f32 (`[y1, x1, y2, x2]`, or `[xc, yc, w, h]` with
    /// [`nms_flags::CENTER_POINT_BOX`]).
    pub boxes: AccessPattern,
    /// `[1, B, C, S]` of f32.
    pub scores: AccessPattern,
    /// `[1, 1, 1, 1]` of i64 ([`nms_flags::MAX_OUT`]); negative counts as 0.
    pub max_out: Option<AccessPattern>,
    /// `[1, 1, 1, 1]` of f32 ([`nms_flags::IOU`]).
    pub iou: Option<AccessPattern>,
    /// `[1, 1, 1, 1]` of f32 ([`nms_flags::SCORE`]).
    pub score_threshold: Option<AccessPattern>,
    /// `[1, 1, bound, 3]` of i64; selections past `bound` are not written.
    pub selected: AccessPattern,
    /// `[1, 1, 1, 2]` of i64.
    pub shape: AccessPattern,
    /// [`nms_flags`] (the operand flags follow the operands).
    pub flags: u32,
    /// Boxes per class without a `max_out` operand.
    pub max_out_const: u32,
    /// IoU threshold without an `iou` operand.
    pub iou_const: f32,
    /// Score threshold without a `score_threshold` operand, with
    /// [`nms_flags::SCORE_CONST`] (without either, every box is a candidate).
    pub score_const: f32,
}

impl Unit for NonMaxSuppression {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            boxes,
            scores,
            max_out,
            iou,
            score_threshold,
            selected,
            shape,
            flags,
            max_out_const,
            iou_const,
            score_const,
        } = self;
        w.ap(boxes);
        w.ap(scores);
        w.opt_ap(max_out);
        w.opt_ap(iou);
        w.opt_ap(score_threshold);
        w.ap(selected);
        w.ap(shape);
        w.u32(*flags);
        w.u32(*max_out_const);
        w.f32(*iou_const);
        w.f32(*score_const);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let flags_at = HEADER_SIZE + 7 * AP_SIZE;
        let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
        if flags & !nms_flags::ALL != 0 {
            return Err(
                DecodeError::field("flags", Reason::UnknownFlags(flags & !nms_flags::ALL))
                    .at(flags_at),
            );
        }
        if flags & nms_flags::SCORE != 0 && flags & nms_flags::SCORE_CONST != 0 {
            return Err(
                DecodeError::field("flags", Reason::UnknownFlags(nms_flags::SCORE_CONST))
                    .at(flags_at),
            );
        }
        let boxes = r.ap("boxes")?;
        let scores = r.ap("scores")?;
        let max_out = r.opt_ap("max_out", flags & nms_flags::MAX_OUT != 0)?;
        let iou = r.opt_ap("iou", flags & nms_flags::IOU != 0)?;
        let score_threshold = r.opt_ap("score_threshold", flags & nms_flags::SCORE != 0)?;
        let selected = r.ap("selected")?;
        let shape = r.ap("shape")?;
        r.u32();
        let max_out_const = r.u32();
        let iou_const = r.f32("iou_const")?;
        let score_const = r.f32("score_const")?;
        require_dtype(&boxes, "boxes.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        require_dtype(&scores, "scores.dtype", F32)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let [_, nb, ns, _] = boxes.shape;
        same_shape("boxes.shape", &[1, nb, ns, 4], &boxes).map_err(|e| e.shifted(HEADER_SIZE))?;
        let nc = scores.shape[2];
        same_shape("scores.shape", &[1, nb, nc, ns], &scores)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        for (k, (op, dt)) in [
            (max_out, DType::I64),
            (iou, DType::F32),
            (score_threshold, DType::F32),
        ]
        .iter()
        .enumerate()
        {
            if let Some(ap) = op {
                let off = HEADER_SIZE + (2 + k) * AP_SIZE;
                require_dtype(ap, "dtype", &[*dt]).map_err(|e| e.shifted(off))?;
                same_shape("shape", &[1, 1, 1, 1], ap).map_err(|e| e.shifted(off))?;
            }
        }
        let off = HEADER_SIZE + 5 * AP_SIZE;
        require_dtype(&selected, "selected.dtype", &[DType::I64]).map_err(|e| e.shifted(off))?;
        same_shape("selected.shape", &[1, 1, selected.shape[2], 3], &selected)
            .map_err(|e| e.shifted(off))?;
        shape_operand(&shape, 2, HEADER_SIZE + 6 * AP_SIZE)?;
        Ok(Self {
            boxes,
            scores,
            max_out,
            iou,
            score_threshold,
            selected,
            shape,
            flags,
            max_out_const,
            iou_const,
            score_const,
        })
    }

    operands!(|f| Self {
        boxes,
        scores,
        max_out,
        iou,
        score_threshold,
        selected,
        shape,
        ..
    } => {
        f(0, "boxes", Role::Read, boxes);
        f(1, "scores", Role::Read, scores);
        if let Some(x) = max_out {
            f(2, "max_out", Role::Read, x);
        }
        if let Some(x) = iou {
            f(3, "iou", Role::Read, x);
        }
        if let Some(x) = score_threshold {
            f(4, "score_threshold", Role::Read, x);
        }
        f(5, "selected", Role::Write, selected);
        f(6, "shape", Role::Write, shape);
    });
}
