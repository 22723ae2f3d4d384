//! Block-quantized weights (domain `ai.nrt`, the project's own operators; NCM 1.11): a
//! linear layer or an embedding table kept in ggml's `Q4_0`, `Q4_1` or `Q8_0` blocks as a
//! GGUF file stores them, so a decoder LLM's weights stay compressed on the device.
//!
//! - `MatMulBlockQuant(A, W)`: `A` f32 `[..., K]`, `W` u8 `[N, K/32 · block bytes]` (the
//!   `N` rows of the layer, each `K/32` blocks); attributes `format` (`"Q4_0"`, `"Q4_1"`,
//!   `"Q8_0"`, or the same with `x8`: groups of 8 rows interleaved, see
//!   `nrt_isa::op::BlockFormat`) and `K`. Output f32 `[..., N]` = `A·Wᵀ`, as the PE instruction
//!   `Op::MatMulBlockQuant` (A rounded to 8-bit blocks on the fly, as llama.cpp does); with
//!   two cores each takes half of the N rows.
//! - `GatherBlockQuant(W, indices)`: `W` u8 `[V, K/32 · block bytes]`, `indices` i64 (any
//!   shape); attributes `format` and `K`. Output f32 `[..., K]`: the rows, decoded (POOL
//!   `Op::GatherBlockQuant`).

use super::{Fold, Registry};
use crate::error::{ErrorKind, Result};
use crate::lower::{At, Lowerer};
use crate::params::{Ctx, Out, out};
use nrt_hal::{DType, Engine};
use nrt_isa::op::BlockFormat;
use nrt_isa::{AccessPattern, Op, op};

pub(super) fn register(r: &mut Registry) {
    r.op("MatMulBlockQuant", 1, infer_matmul)
        .fold(Fold::Never)
        .note("domain ai.nrt: A·Wᵀ with W u8 [N, K/32·block bytes] in ggml's Q4_0 / Q4_1 / Q8_0 blocks (attributes format, K)")
        .device(lower!(lower_matmul_block_quant));
    r.op("GatherBlockQuant", 1, infer_gather)
        .fold(Fold::Never)
        .note("domain ai.nrt: rows of a Q4_0 / Q4_1 / Q8_0 table decoded to f32 (attributes format, K)")
        .device(lower!(lower_gather_block_quant));
}

/// The `format` and `K` attributes, and the row bytes they imply.
fn format_and_k(c: &Ctx) -> Result<(BlockFormat, usize, usize)> {
    let name = c.n.attr_s("format", "")?;
    let f = BlockFormat::from_name(&name).ok_or_else(|| {
        c.bad_attr(format!(
            "format '{name}'; expected one of Q4_0, Q4_1, Q8_0 (or Q4_0x8, Q4_1x8, Q8_0x8)"
        ))
    })?;
    let k = c.n.attr_i("K", 0)?;
    let rb = u32::try_from(k)
        .ok()
        .and_then(|k| f.row_bytes(k))
        .ok_or_else(|| c.bad_attr(format!("K = {k}; a positive multiple of 32 is expected")))?;
    Ok((f, k as usize, rb as usize))
}

/// Checks the table operand `i` (u8 `[rows, rb]`); returns its rows.
fn table_rows(c: &Ctx, i: usize, f: BlockFormat, k: usize, rb: usize) -> Result<usize> {
    let w = c.input(i)?;
    match w.shape[..] {
        [rows, bytes]
            if w.dtype == DType::U8
                && bytes == rb
                && (!f.interleaved() || rows.is_multiple_of(BlockFormat::GROUP as usize)) =>
        {
            Ok(rows)
        }
        _ => Err(c.mismatch(format!(
            "weights are {} {:?}; {} rows of K = {k} take u8 [rows, {rb}]",
            w.dtype,
            w.shape,
            f.name()
        ))),
    }
}

fn infer_matmul(c: &Ctx) -> Result<Vec<Out>> {
    let (f, k, rb) = format_and_k(c)?;
    let a = c.input(0)?;
    if a.dtype != DType::F32 {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("A of type {}", a.dtype),
        ));
    }
    if a.shape.last() != Some(&k) {
        return Err(c.mismatch(format!(
            "A of shape {:?}; its last dimension must be K = {k}",
            a.shape
        )));
    }
    let n = table_rows(c, 1, f, k, rb)?;
    let mut shape = a.shape.clone();
    *shape.last_mut().expect("rank ≥ 1") = n;
    Ok(vec![out(DType::F32, shape)])
}

fn infer_gather(c: &Ctx) -> Result<Vec<Out>> {
    let (f, k, rb) = format_and_k(c)?;
    table_rows(c, 0, f, k, rb)?;
    let idx = c.input(1)?;
    if idx.dtype != DType::I64 {
        return Err(c.e(
            ErrorKind::UnsupportedDType,
            format!("indices of type {}", idx.dtype),
        ));
    }
    let mut shape = idx.shape.clone();
    shape.push(k);
    Ok(vec![out(DType::F32, shape)])
}

/// A dense row-major `[1, 1, rows, cols]` access pattern at `addr`, `cols` elements apart
/// from row to row but `row_stride` given.
fn rows_ap(
    addr: u64,
    dtype: DType,
    rows: usize,
    cols: usize,
    row_stride: usize,
) -> Result<AccessPattern> {
    let too_large = || crate::lower::view::too_large("a block-quantized operand");
    let u = |x: usize| u32::try_from(x).map_err(|_| too_large());
    Ok(AccessPattern {
        addr,
        dtype,
        shape: [1, 1, u(rows)?, u(cols)?],
        stride: [0, 0, i32::try_from(row_stride).map_err(|_| too_large())?, 1],
    })
}

impl<'a> Lowerer<'a> {
    pub(crate) fn lower_matmul_block_quant(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (format, k, rb) = format_and_k(&c)?;
        let a = self.input_view(n, 0)?;
        let w = self.input_view(n, 1)?;
        let y = self.alloc(o0);
        let m = a.shape[..a.shape.len() - 1].iter().product::<usize>();
        let nrows = w.shape[0];
        if m == 0 || nrows == 0 {
            return Ok(());
        }
        // Two cores: each multiplies by half of the weight rows (columns of C), split at a
        // group of 8 for the interleaved formats.
        let unit = if format.interleaved() { 8 } else { 1 };
        let half = nrows / unit / 2 * unit;
        let parts: &[(u8, usize, usize)] = if self.cores >= 2 && half > 0 {
            &[(0, 0, half), (1, half, nrows - half)]
        } else {
            &[(0, 0, nrows)]
        };
        for &(core, start, len) in parts {
            let part = Op::MatMulBlockQuant(op::MatMulBlockQuant {
                a: rows_ap(a.addr, DType::F32, m, k, k)?,
                w: rows_ap(w.addr + (start * rb) as u64, DType::U8, len, rb, rb)?,
                c: rows_ap(y.addr + (start * 4) as u64, DType::F32, m, len, nrows)?,
                format,
            });
            self.emit(core, Engine::Pe, part);
        }
        Ok(())
    }

    pub(crate) fn lower_gather_block_quant(&mut self, at: At<'a>) -> Result<()> {
        let At { n, c, o0, .. } = at;
        let (format, k, rb) = format_and_k(&c)?;
        let w = self.input_view(n, 0)?;
        let idx = self.input_view(n, 1)?;
        let y = self.alloc(o0);
        let r = idx.shape.iter().product::<usize>();
        if r == 0 {
            return Ok(());
        }
        self.emit(
            0,
            Engine::Pool,
            Op::GatherBlockQuant(op::GatherBlockQuant {
                table: rows_ap(w.addr, DType::U8, w.shape[0], rb, rb)?,
                indices: rows_ap(idx.addr, DType::I64, r, 1, 1)?,
                output: rows_ap(y.addr, DType::F32, r, k, k)?,
                format,
            }),
        );
        Ok(())
    }
}
