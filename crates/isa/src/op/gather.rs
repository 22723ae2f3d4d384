//! The pooling engine (POOL), indexed access: gathers, scatters, top-k, and the sampling gathers of
//! detection models (RoiAlign, deformable im2col).
//!
//! Each instruction: its fields, then its encoding, decoding (with every check the
//! decoder makes) and operands side by side. Opcodes, sizes and engines: the table in
//! [`super`].

use crate::ap::{AP_SIZE, AccessPattern};
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::instr::{HEADER_SIZE, Role};
use crate::op::block_format::check_block_rows;
use crate::op::*;
use nrt_hal::DType;

wire_enum!(
    /// How [`Op::ScatterElements`] combines an update with the element it lands on.
    ScatterReduce {
        /// Replace.
        None = 0,
        /// Add.
        Add = 1,
        /// Multiply.
        Mul = 2,
        /// Maximum.
        Max = 3,
        /// Minimum.
        Min = 4,
    }
);

/// Most samples per cell and dimension [`Op::RoiAlign`] takes (an adaptive grid of a huge
/// or hostile region would otherwise make one instruction loop without bound).
pub const ROI_MAX_GRID: u32 = 1 << 10;

/// Flags of [`Op::RoiAlign`].
pub mod roi_flags {
    /// Maximum, else average.
    pub const MAX: u32 = 1;
    /// `half_pixel` coordinates (subtract ½; no minimum region size), else
    /// `output_half_pixel` (regions at least 1 × 1).
    pub const HALF_PIXEL: u32 = 2;
    /// Every flag.
    pub const ALL: u32 = 3;
}

/// POOL: indexed copy along dimension 2: `out[a,b,i,d] = data[a,b,idx[i],d]`. An index
/// out of range is a device error (`NRT_EXEC_OOB`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gather {
    /// `[d0, d1, A, d3]`.
    pub data: AccessPattern,
    /// `[1, 1, 1, N]` of i32 or i64 (negative counts from the end).
    pub indices: AccessPattern,
    /// `[d0, d1, N, d3]`.
    pub output: AccessPattern,
}

impl Unit for Gather {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            data,
            indices,
            output,
        } = self;
        w.ap(data);
        w.ap(indices);
        w.ap(output);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let data = r.ap("data")?;
        let indices = r.ap("indices")?;
        let output = r.ap("output")?;
        require_dtype(&indices, "indices.dtype", &[DType::I32, DType::I64])
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        if output.dtype != data.dtype {
            return Err(
                DecodeError::field("output.dtype", Reason::UnsupportedDType(output.dtype))
                    .at(HEADER_SIZE + 2 * AP_SIZE + 8),
            );
        }
        let n = indices.shape[3];
        same_shape("indices.shape", &[1, 1, 1, n], &indices)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let want = [data.shape[0], data.shape[1], n, data.shape[3]];
        same_shape("output.shape", &want, &output)
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        Ok(Self {
            data,
            indices,
            output,
        })
    }

    operands!(|f| Self {
        data,
        indices,
        output,
    } => {
        f(0, "data", Role::Read, data);
        f(1, "indices", Role::Read, indices);
        f(2, "output", Role::Write, output);
    });
}

/// POOL: gather along dimension `axis`, one index per output element:
/// `out[p] = data[p with p[axis] = idx[p]]` (ONNX GatherElements; with a broadcast
/// indices operand it gathers whole rows). An index outside `[-A, A)` (negative counts
/// from the end) is a device error (`NRT_EXEC_OOB`) and nothing is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatherElements {
    /// The shape of `output` except `A` at `axis`.
    pub data: AccessPattern,
    /// i32 or i64, the shape of `output`.
    pub indices: AccessPattern,
    /// Output.
    pub output: AccessPattern,
    /// The indexed dimension (0..4).
    pub axis: u8,
}

impl Unit for GatherElements {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            data,
            indices,
            output,
            axis,
        } = self;
        w.ap(data);
        w.ap(indices);
        w.ap(output);
        w.u8(*axis);
        w.zeros(7);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let data = r.ap("data")?;
        let indices = r.ap("indices")?;
        let output = r.ap("output")?;
        let axis = r.axis()?;
        r.zeros(7, "reserved")?;
        require_dtype(&indices, "indices.dtype", &[DType::I32, DType::I64])
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        if output.dtype != data.dtype {
            return Err(
                DecodeError::field("output.dtype", Reason::UnsupportedDType(output.dtype))
                    .at(HEADER_SIZE + 2 * AP_SIZE + 8),
            );
        }
        same_shape("indices.shape", &output.shape, &indices)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let mut want = output.shape;
        want[axis as usize] = data.shape[axis as usize];
        same_shape("data.shape", &want, &data).map_err(|e| e.shifted(HEADER_SIZE))?;
        Ok(Self {
            data,
            indices,
            output,
            axis,
        })
    }

    operands!(|f| Self {
        data,
        indices,
        output,
        ..
    } => {
        f(0, "data", Role::Read, data);
        f(1, "indices", Role::Read, indices);
        f(2, "output", Role::Write, output);
    });
}

/// POOL: scatter along dimension `axis`, in element order:
/// `out[p with p[axis] = idx[p]] = out[…] ∘ updates[p]` for every position `p` of
/// `updates` (ONNX ScatterElements / ScatterND with a broadcast indices operand). Indices
/// are checked as for [`Op::GatherElements`] before anything is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScatterElements {
    /// i32 or i64, the shape of `updates`.
    pub indices: AccessPattern,
    /// The values.
    pub updates: AccessPattern,
    /// Read and written: the shape of `updates` except `A` at `axis`.
    pub output: AccessPattern,
    /// The indexed dimension (0..4).
    pub axis: u8,
    /// How an update combines with the element (a reduction: f32, i32 or i64).
    pub reduce: ScatterReduce,
}

impl Unit for ScatterElements {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            indices,
            updates,
            output,
            axis,
            reduce,
        } = self;
        w.ap(indices);
        w.ap(updates);
        w.ap(output);
        w.u8(*axis);
        w.u8(*reduce as u8);
        w.zeros(6);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let indices = r.ap("indices")?;
        let updates = r.ap("updates")?;
        let output = r.ap("output")?;
        let axis = r.axis()?;
        let reduce = r.enum_u8("reduce", ScatterReduce::from_u8)?;
        r.zeros(6, "reserved")?;
        require_dtype(&indices, "indices.dtype", &[DType::I32, DType::I64])
            .map_err(|e| e.shifted(HEADER_SIZE))?;
        if reduce != ScatterReduce::None {
            require_dtype(&output, "output.dtype", NUMERIC)
                .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        }
        if updates.dtype != output.dtype {
            return Err(DecodeError::field(
                "updates.dtype",
                Reason::UnsupportedDType(updates.dtype),
            )
            .at(HEADER_SIZE + AP_SIZE + 8));
        }
        same_shape("indices.shape", &updates.shape, &indices)
            .map_err(|e| e.shifted(HEADER_SIZE))?;
        let mut want = updates.shape;
        want[axis as usize] = output.shape[axis as usize];
        same_shape("output.shape", &want, &output)
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        Ok(Self {
            indices,
            updates,
            output,
            axis,
            reduce,
        })
    }

    operands!(|f| Self {
        indices,
        updates,
        output,
        ..
    } => {
        f(0, "indices", Role::Read, indices);
        f(1, "updates", Role::Read, updates);
        f(2, "output", Role::ReadWrite, output);
    });
}

/// POOL: the `K` largest (or smallest) elements of every row along dimension 3, in
/// order (equal elements: the lower index first; NaN above every number), and their
/// indices (ONNX TopK).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TopK {
    /// `[d0, d1, d2, N]`: f32 or any integer type.
    pub input: AccessPattern,
    /// `[d0, d1, d2, K]`, `K ≤ N`, the input's type.
    pub values: AccessPattern,
    /// `[d0, d1, d2, K]` of i64.
    pub indices: AccessPattern,
    /// The largest (else the smallest).
    pub largest: bool,
}

impl Unit for TopK {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            values,
            indices,
            largest,
        } = self;
        w.ap(input);
        w.ap(values);
        w.ap(indices);
        w.u32(*largest as u32);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let values = r.ap("values")?;
        let indices = r.ap("indices")?;
        let largest = r.bool32("largest")?;
        r.zeros(4, "reserved")?;
        require_dtype(&input, "input.dtype", TOP_K_TYPES).map_err(|e| e.shifted(HEADER_SIZE))?;
        if values.dtype != input.dtype {
            return Err(
                DecodeError::field("values.dtype", Reason::UnsupportedDType(values.dtype))
                    .at(HEADER_SIZE + AP_SIZE + 8),
            );
        }
        require_dtype(&indices, "indices.dtype", &[DType::I64])
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        let k = values.shape[3];
        dim_eq("values.shape", 3, k.min(input.shape[3]), k)
            .map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        let mut want = input.shape;
        want[3] = k;
        same_shape("values.shape", &want, &values).map_err(|e| e.shifted(HEADER_SIZE + AP_SIZE))?;
        same_shape("indices.shape", &want, &indices)
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        Ok(Self {
            input,
            values,
            indices,
            largest,
        })
    }

    operands!(|f| Self {
        input,
        values,
        indices,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "values", Role::Write, values);
        f(2, "indices", Role::Write, indices);
    });
}

/// POOL: one token per row of `logits` (NCM 1.10): greedy where `temperature ≤ 0`, else a
/// draw from `softmax(logits / temperature)` restricted to the `top_k` most likely tokens
/// (0 or ≥ N: all) and then to the smallest prefix of them (most likely first) whose
/// probability reaches `top_p` (≥ 1: all), with `u = rng(seed, step)` from a counter-based
/// generator — the same `(seed, step)` draws the same `u` whatever else is in the batch.
/// `logprob` gets the chosen token's log-softmax under the unmodified logits. Ties go to
/// the lower index.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// `[d0, d1, d2, N]` of f32: each row's logits.
    pub logits: AccessPattern,
    /// `[d0, d1, d2, 1]` of f32.
    pub temperature: AccessPattern,
    /// `[d0, d1, d2, 1]` of i64.
    pub top_k: AccessPattern,
    /// `[d0, d1, d2, 1]` of f32.
    pub top_p: AccessPattern,
    /// `[d0, d1, d2, 1]` of i64: the request's seed.
    pub seed: AccessPattern,
    /// `[d0, d1, d2, 1]` of i64: the draw's counter (the token's position).
    pub step: AccessPattern,
    /// `[d0, d1, d2, 1]` of i64: the chosen token.
    pub token: AccessPattern,
    /// `[d0, d1, d2, 1]` of f32: its log-probability.
    pub logprob: AccessPattern,
}

impl Unit for Sample {
    fn encode(&self, w: &mut W<'_>) {
        for ap in [
            &self.logits,
            &self.temperature,
            &self.top_k,
            &self.top_p,
            &self.seed,
            &self.step,
            &self.token,
            &self.logprob,
        ] {
            w.ap(ap);
        }
        w.u32(0);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let logits = r.ap("logits")?;
        let temperature = r.ap("temperature")?;
        let top_k = r.ap("top_k")?;
        let top_p = r.ap("top_p")?;
        let seed = r.ap("seed")?;
        let step = r.ap("step")?;
        let token = r.ap("token")?;
        let logprob = r.ap("logprob")?;
        r.zeros(8, "reserved")?;
        require_dtype(&logits, "logits.dtype", &[DType::F32])
            .map_err(|e| e.shifted(HEADER_SIZE))?;
        let mut row = logits.shape;
        row[3] = 1;
        let per_row: [(&AccessPattern, &'static str, &'static str, DType); 7] = [
            (
                &temperature,
                "temperature.dtype",
                "temperature.shape",
                DType::F32,
            ),
            (&top_k, "top_k.dtype", "top_k.shape", DType::I64),
            (&top_p, "top_p.dtype", "top_p.shape", DType::F32),
            (&seed, "seed.dtype", "seed.shape", DType::I64),
            (&step, "step.dtype", "step.shape", DType::I64),
            (&token, "token.dtype", "token.shape", DType::I64),
            (&logprob, "logprob.dtype", "logprob.shape", DType::F32),
        ];
        for (i, (ap, dtype, shape, want)) in per_row.into_iter().enumerate() {
            let at = HEADER_SIZE + (i + 1) * AP_SIZE;
            require_dtype(ap, dtype, &[want]).map_err(|e| e.shifted(at))?;
            same_shape(shape, &row, ap).map_err(|e| e.shifted(at))?;
        }
        Ok(Self {
            logits,
            temperature,
            top_k,
            top_p,
            seed,
            step,
            token,
            logprob,
        })
    }

    operands!(|f| Self {
        logits,
        temperature,
        top_k,
        top_p,
        seed,
        step,
        token,
        logprob,
    } => {
        f(0, "logits", Role::Read, logits);
        f(1, "temperature", Role::Read, temperature);
        f(2, "top_k", Role::Read, top_k);
        f(3, "top_p", Role::Read, top_p);
        f(4, "seed", Role::Read, seed);
        f(5, "step", Role::Read, step);
        f(6, "token", Role::Write, token);
        f(7, "logprob", Role::Write, logprob);
    });
}

/// POOL: region-of-interest align (ONNX RoiAlign; NCM 1.4): for each region `r` (its
/// `rois` row `[x1, y1, x2, y2]` times `spatial_scale`, minus ½ with
/// [`roi_flags::HALF_PIXEL`]) and each output cell, the bilinear samples of a
/// `grid × grid` lattice of the cell (`sampling_ratio`, or `ceil(cell size)` when 0,
/// capped at [`ROI_MAX_GRID`]) from image `batch_indices[r]` of `input`, averaged (or
/// their maximum, [`roi_flags::MAX`], of the weighted corner values as ONNX Runtime
/// takes it). A batch index outside `[0, N)` is a device error (`NRT_EXEC_OOB`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoiAlign {
    /// `[N, C, H, W]` of f32.
    pub input: AccessPattern,
    /// `[1, 1, R, 4]` of f32.
    pub rois: AccessPattern,
    /// `[1, 1, 1, R]` of i64.
    pub batch_indices: AccessPattern,
    /// `[R, C, out_h, out_w]` of f32.
    pub output: AccessPattern,
    /// Scale of the region coordinates.
    pub spatial_scale: f32,
    /// Samples per cell and dimension (0: adaptive).
    pub sampling_ratio: u32,
    /// [`roi_flags`].
    pub flags: u32,
}

impl Unit for RoiAlign {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            rois,
            batch_indices,
            output,
            spatial_scale,
            sampling_ratio,
            flags,
        } = self;
        w.ap(input);
        w.ap(rois);
        w.ap(batch_indices);
        w.ap(output);
        w.f32(*spatial_scale);
        w.u32(*sampling_ratio);
        w.u32(*flags);
        w.u32(0);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let input = r.ap("input")?;
        let rois = r.ap("rois")?;
        let batch_indices = r.ap("batch_indices")?;
        let output = r.ap("output")?;
        let spatial_scale = r.f32("spatial_scale")?;
        let at = r.pos;
        let sampling_ratio = r.u32();
        if sampling_ratio > ROI_MAX_GRID {
            return Err(DecodeError::field(
                "sampling_ratio",
                Reason::OutOfRange(sampling_ratio as u64),
            )
            .at(at));
        }
        let flags = r.flags("flags", roi_flags::ALL)?;
        r.zeros(4, "reserved")?;
        require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(HEADER_SIZE))?;
        let off = |k: usize| HEADER_SIZE + k * AP_SIZE;
        require_dtype(&rois, "rois.dtype", F32).map_err(|e| e.shifted(off(1)))?;
        require_dtype(&batch_indices, "batch_indices.dtype", &[DType::I64])
            .map_err(|e| e.shifted(off(2)))?;
        require_dtype(&output, "output.dtype", F32).map_err(|e| e.shifted(off(3)))?;
        let nr = output.shape[0];
        same_shape("rois.shape", &[1, 1, nr, 4], &rois).map_err(|e| e.shifted(off(1)))?;
        same_shape("batch_indices.shape", &[1, 1, 1, nr], &batch_indices)
            .map_err(|e| e.shifted(off(2)))?;
        dim_eq("output.shape", 1, input.shape[1], output.shape[1])
            .map_err(|e| e.shifted(off(3)))?;
        Ok(Self {
            input,
            rois,
            batch_indices,
            output,
            spatial_scale,
            sampling_ratio,
            flags,
        })
    }

    operands!(|f| Self {
        input,
        rois,
        batch_indices,
        output,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "rois", Role::Read, rois);
        f(2, "batch_indices", Role::Read, batch_indices);
        f(3, "output", Role::Write, output);
    });
}

/// POOL: the columns of a deformable convolution (ONNX DeformConv; NCM 1.4), for a
/// MatMul with the weights to finish: `cols[n, (c·kH + i)·kW + j, y, x]` is
/// `mask[n, (g·kH + i)·kW + j, y, x]` times the bilinear sample of `input[n, c]` (zero
/// outside the image) at `(y·sH − padT + i·dH + Δh, x·sW − padL + j·dW + Δw)`, where
/// `g = c / (C / offset_groups)` and `(Δh, Δw)` is `offset[n, ((g·kH + i)·kW + j)·2 +
/// {0, 1}, y, x]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeformIm2col {
    /// `[N, C, H, W]` of f32.
    pub input: AccessPattern,
    /// `[N, G·kH·kW·2, oH, oW]` of f32.
    pub offset: AccessPattern,
    /// `[N, G·kH·kW, oH, oW]` of f32 (absent: 1).
    pub mask: Option<AccessPattern>,
    /// `[N, C·kH·kW, oH, oW]` of f32.
    pub cols: AccessPattern,
    /// Kernel, stride, top/left padding, dilation (the bottom/right padding is 0: the
    /// output size is `cols`').
    pub window: Window,
    /// `G` (≥ 1, divides C).
    pub offset_groups: u32,
}

impl Unit for DeformIm2col {
    fn encode(&self, w: &mut W<'_>) {
        let Self {
            input,
            offset,
            mask,
            cols,
            window,
            offset_groups,
        } = self;
        w.ap(input);
        w.ap(offset);
        w.opt_ap(mask);
        w.ap(cols);
        w.window(window);
        w.u32(*offset_groups);
        w.u32(mask.is_some() as u32);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let b = r.b;
        let flags_at = HEADER_SIZE + 4 * AP_SIZE + 44;
        let flags = u32::from_le_bytes(b[flags_at..flags_at + 4].try_into().expect("4"));
        if flags & !1 != 0 {
            return Err(DecodeError::field("flags", Reason::UnknownFlags(flags & !1)).at(flags_at));
        }
        let input = r.ap("input")?;
        let offset = r.ap("offset")?;
        let mask = r.opt_ap("mask", flags & 1 != 0)?;
        let cols = r.ap("cols")?;
        let win_at = r.pos;
        let window = r.window(true)?;
        if window.pad[2] != 0 || window.pad[3] != 0 {
            return Err(DecodeError::field(
                "window.pad",
                Reason::OutOfRange(window.pad[2].max(window.pad[3]) as u64),
            )
            .at(win_at + 24));
        }
        let g_at = r.pos;
        let groups = r.u32();
        r.u32();
        let off = |k: usize| HEADER_SIZE + k * AP_SIZE;
        require_dtype(&input, "input.dtype", F32).map_err(|e| e.shifted(off(0)))?;
        require_dtype(&offset, "offset.dtype", F32).map_err(|e| e.shifted(off(1)))?;
        require_dtype(&cols, "cols.dtype", F32).map_err(|e| e.shifted(off(3)))?;
        let [n, c, _, _] = input.shape;
        if groups == 0 || !c.is_multiple_of(groups) {
            return Err(
                DecodeError::field("offset_groups", Reason::OutOfRange(groups as u64)).at(g_at),
            );
        }
        let k = window.kernel[0] as u64 * window.kernel[1] as u64;
        let fit = |v: u64, field: &'static str, at: usize| {
            u32::try_from(v).map_err(|_| DecodeError::field(field, Reason::OutOfRange(v)).at(at))
        };
        let (oh, ow) = (cols.shape[2], cols.shape[3]);
        let gk = fit(groups as u64 * k, "window.kernel", win_at)?;
        let gk2 = fit(gk as u64 * 2, "window.kernel", win_at)?;
        let ck = fit(c as u64 * k, "window.kernel", win_at)?;
        same_shape("offset.shape", &[n, gk2, oh, ow], &offset).map_err(|e| e.shifted(off(1)))?;
        if let Some(m) = &mask {
            require_dtype(m, "mask.dtype", F32).map_err(|e| e.shifted(off(2)))?;
            same_shape("mask.shape", &[n, gk, oh, ow], m).map_err(|e| e.shifted(off(2)))?;
        }
        same_shape("cols.shape", &[n, ck, oh, ow], &cols).map_err(|e| e.shifted(off(3)))?;
        Ok(Self {
            input,
            offset,
            mask,
            cols,
            window,
            offset_groups: groups,
        })
    }

    operands!(|f| Self {
        input,
        offset,
        mask,
        cols,
        ..
    } => {
        f(0, "input", Role::Read, input);
        f(1, "offset", Role::Read, offset);
        if let Some(x) = mask {
            f(2, "mask", Role::Read, x);
        }
        f(3, "cols", Role::Write, cols);
    });
}

/// POOL: rows of a block-quantized table widened to f32 (NCM 1.11) — an embedding lookup
/// whose table stays in its [`BlockFormat`] (a decoder LLM's `token_embd`, which its tied
/// LM head reads through [`super::Op::MatMulBlockQuant`]). Row `r` of `output` is row
/// `indices[r]` of `table` (a negative index counts from the end, as ONNX Gather); an
/// index outside `[−V, V)` is a device error (`NRT_EXEC_OOB`) and nothing is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GatherBlockQuant {
    /// `[1, 1, V, K/32 · block_bytes]` u8, strides `[any, any, ≥ row bytes, 1]`.
    pub table: AccessPattern,
    /// `[d0, d1, d2, 1]` i64.
    pub indices: AccessPattern,
    /// `[d0, d1, d2, K]` f32.
    pub output: AccessPattern,
    /// How `table` is stored.
    pub format: BlockFormat,
}

impl Unit for GatherBlockQuant {
    fn encode(&self, w: &mut W<'_>) {
        w.ap(&self.table);
        w.ap(&self.indices);
        w.ap(&self.output);
        w.u8(self.format as u8);
        w.zeros(7);
    }

    fn decode(r: &mut R<'_>) -> Result<Self, DecodeError> {
        let table = r.ap("table")?;
        let indices = r.ap("indices")?;
        let output = r.ap("output")?;
        let format = r.enum_u8("format", BlockFormat::from_u8)?;
        r.zeros(7, "reserved")?;
        let k = output.shape[3];
        check_block_rows(
            &table,
            ("table.dtype", "table.shape", "table.stride"),
            format,
            k,
        )
        .map_err(|e| e.shifted(HEADER_SIZE))?;
        let at = HEADER_SIZE + AP_SIZE;
        require_dtype(&indices, "indices.dtype", &[DType::I64]).map_err(|e| e.shifted(at))?;
        let mut rows = output.shape;
        rows[3] = 1;
        same_shape("indices.shape", &rows, &indices).map_err(|e| e.shifted(at))?;
        require_dtype(&output, "output.dtype", &[DType::F32])
            .map_err(|e| e.shifted(HEADER_SIZE + 2 * AP_SIZE))?;
        Ok(Self {
            table,
            indices,
            output,
            format,
        })
    }

    operands!(|f| Self {
        table,
        indices,
        output,
        ..
    } => {
        f(0, "table", Role::Read, table);
        f(1, "indices", Role::Read, indices);
        f(2, "output", Role::Write, output);
    });
}
