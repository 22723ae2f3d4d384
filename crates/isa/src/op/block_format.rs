//! Block-quantized weights (NCM 1.11): the [`BlockFormat`] of the operands that
//! `MatMulBlockQuant` (PE) and `GatherBlockQuant` (POOL) read — ggml's blocks, plain or with
//! groups of 8 rows interleaved — its layout, and the check of such an operand.

use crate::ap::AccessPattern;
use crate::codec::*;
use crate::error::{DecodeError, Reason};
use crate::op::*;
use nrt_hal::DType;

wire_enum! {
    /// A block-quantized weight format (NCM 1.11): ggml's blocks of 32 weights, each with its
    /// scale (and min), stored as in a GGUF file — the wire byte is ggml's type id. A row of
    /// `K` weights is `K/32` blocks; [`BlockFormat::block_bytes`] each.
    ///
    /// | format | block | bytes | value of weight `i` |
    /// |---|---|---|---|
    /// | `Q4_0` | f16 `d`, 16 bytes of nibbles | 18 | `d·(q − 8)` |
    /// | `Q4_1` | f16 `d`, f16 `m`, 16 bytes of nibbles | 20 | `d·q + m` |
    /// | `Q8_0` | f16 `d`, 32 × i8 | 34 | `d·q` |
    ///
    /// Nibbles: byte `j` (0..16) holds weight `j` in its low four bits and weight `j + 16`
    /// in its high four bits.
    ///
    /// The `x8` formats (wire byte `0x80 |` the ggml id) hold the same blocks of 8 rows
    /// interleaved, so one 256-bit register holds the same block of several rows: rows
    /// `8g..8g+8` are `K/32` *superblocks* of 8 blocks each (the group takes exactly 8 row
    /// lengths, groups follow each other). A superblock is the 8 rows' `d` (f16, row order),
    /// for `Q4_1` then their 8 `m`, then for `p` in 0..4 the quants of rows `p` and `p + 4`:
    /// `Q4_*` 16 bytes of nibbles of row `p` then 16 of row `p + 4`; `Q8_0` row `p`'s quants
    /// 0..16, row `p + 4`'s 0..16, row `p`'s 16..32, row `p + 4`'s 16..32. Only the layout
    /// differs: every weight's value is the ggml block's.
    BlockFormat {
        /// 4-bit, symmetric (ggml `Q4_0`).
        Q4_0 = 2,
        /// 4-bit with a per-block minimum (ggml `Q4_1`).
        Q4_1 = 3,
        /// 8-bit, symmetric (ggml `Q8_0`).
        Q8_0 = 8,
        /// `Q4_0`, 8 rows interleaved.
        Q4_0x8 = 0x82,
        /// `Q4_1`, 8 rows interleaved.
        Q4_1x8 = 0x83,
        /// `Q8_0`, 8 rows interleaved.
        Q8_0x8 = 0x88,
    }
}

impl BlockFormat {
    /// Weights per block.
    pub const BLOCK: u32 = 32;

    /// Rows an `x8` format interleaves.
    pub const GROUP: u32 = 8;

    /// The ggml block type (the `x8` formats: their rows' type).
    pub const fn base(self) -> BlockFormat {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q4_0x8 => BlockFormat::Q4_0,
            BlockFormat::Q4_1 | BlockFormat::Q4_1x8 => BlockFormat::Q4_1,
            BlockFormat::Q8_0 | BlockFormat::Q8_0x8 => BlockFormat::Q8_0,
        }
    }

    /// Whether rows come in interleaved groups of [`Self::GROUP`].
    pub const fn interleaved(self) -> bool {
        self as u8 & 0x80 != 0
    }

    /// The format with `base`'s blocks, interleaved or not.
    pub const fn with_interleave(base: BlockFormat, interleaved: bool) -> BlockFormat {
        match (base.base(), interleaved) {
            (BlockFormat::Q4_0, false) => BlockFormat::Q4_0,
            (BlockFormat::Q4_1, false) => BlockFormat::Q4_1,
            (_, false) => BlockFormat::Q8_0,
            (BlockFormat::Q4_0, true) => BlockFormat::Q4_0x8,
            (BlockFormat::Q4_1, true) => BlockFormat::Q4_1x8,
            (_, true) => BlockFormat::Q8_0x8,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> u32 {
        match self.base() {
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            _ => 34,
        }
    }

    /// Bytes of a row of `k` weights; `None` when `k` is not a positive multiple of 32.
    pub const fn row_bytes(self, k: u32) -> Option<u32> {
        if k == 0 || !k.is_multiple_of(Self::BLOCK) {
            return None;
        }
        (k / Self::BLOCK).checked_mul(self.block_bytes())
    }

    /// The name: ggml's (`Q4_1`), `x8` appended for the interleaved formats.
    pub const fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4_0 => "Q4_0",
            BlockFormat::Q4_1 => "Q4_1",
            BlockFormat::Q8_0 => "Q8_0",
            BlockFormat::Q4_0x8 => "Q4_0x8",
            BlockFormat::Q4_1x8 => "Q4_1x8",
            BlockFormat::Q8_0x8 => "Q8_0x8",
        }
    }

    /// The format of a name (`Q4_1`, `Q4_1x8`), if it is one.
    pub fn from_name(s: &str) -> Option<BlockFormat> {
        Self::ALL.iter().copied().find(|f| f.name() == s)
    }

    /// The pieces of row `i` (0..8) of an `x8` superblock, as `(offset in the plain ggml
    /// block, offset in the superblock, bytes)`: its `d`, its `m` (`Q4_1`), its quants in
    /// runs of 16 bytes (the layout in the type's docs). The one definition both directions
    /// ([`Self::interleave`], [`Self::block_of_group`]) read.
    fn pieces(self, i: usize) -> [(usize, usize, usize); 3] {
        let (p, h) = (i % 4, i / 4);
        match self.base() {
            BlockFormat::Q4_0 => [(0, 2 * i, 2), (2, 16 + 32 * p + 16 * h, 16), (0, 0, 0)],
            BlockFormat::Q4_1 => [
                (0, 2 * i, 2),
                (2, 16 + 2 * i, 2),
                (4, 32 + 32 * p + 16 * h, 16),
            ],
            _ => [
                (0, 2 * i, 2),
                (2, 16 + 64 * p + 16 * h, 16),
                (18, 16 + 64 * p + 32 + 16 * h, 16),
            ],
        }
    }

    /// Copies block `b` of row `i` (0..8) of the interleaved group `group` (8 rows of `nb`
    /// blocks, this `x8` format) into `out` as a plain ggml block
    /// ([`Self::block_bytes`] bytes). `group` must hold the 8 rows.
    pub fn block_of_group(self, group: &[u8], i: usize, b: usize, out: &mut [u8]) {
        let bb = self.block_bytes() as usize;
        let sb = &group[b * 8 * bb..(b + 1) * 8 * bb];
        for (at, from, len) in self.pieces(i) {
            out[at..at + len].copy_from_slice(&sb[from..from + len]);
        }
    }

    /// `rows` rows of `k` weights in this format's plain ggml blocks, laid out as its `x8`
    /// format (see the type's docs); `None` when `rows` is not a multiple of 8, `k` not whole
    /// blocks, or `data` not `rows` rows.
    pub fn interleave(self, data: &[u8], rows: usize, k: u32) -> Option<Vec<u8>> {
        let rb = self.row_bytes(k)? as usize;
        if !rows.is_multiple_of(8) || data.len() != rows.checked_mul(rb)? {
            return None;
        }
        let bb = self.block_bytes() as usize;
        let mut out = vec![0u8; data.len()];
        for (g, dst) in out.chunks_exact_mut(8 * rb).enumerate() {
            for (b, sb) in dst.chunks_exact_mut(8 * bb).enumerate() {
                for i in 0..8 {
                    let blk = &data[(g * 8 + i) * rb + b * bb..][..bb];
                    for (at, to, len) in self.pieces(i) {
                        sb[to..to + len].copy_from_slice(&blk[at..at + len]);
                    }
                }
            }
        }
        Some(out)
    }
}

/// The field names of a block-quantized matrix operand, for error messages.
pub(crate) type BlockRowFields = (&'static str, &'static str, &'static str);

/// Checks a block-quantized matrix operand of rows of `k` weights in `format`: u8
/// `[1, 1, rows, row_bytes]`, strides `[any, any, ≥ row_bytes, 1]` (interleaved: rows a
/// multiple of 8, stride exactly `row_bytes`). `fields`: the operand's
/// `dtype`, `shape` and `stride` names.
pub(crate) fn check_block_rows(
    w: &AccessPattern,
    (f_dtype, f_shape, f_stride): BlockRowFields,
    format: BlockFormat,
    k: u32,
) -> Result<(), DecodeError> {
    require_dtype(w, f_dtype, &[DType::U8])?;
    let rb = format
        .row_bytes(k)
        .ok_or_else(|| DecodeError::field(f_shape, Reason::OutOfRange(k as u64)).at(16 + 12))?;
    dim_eq(f_shape, 0, 1, w.shape[0])?;
    dim_eq(f_shape, 1, 1, w.shape[1])?;
    dim_eq(f_shape, 3, rb, w.shape[3])?;
    if format.interleaved() && !w.shape[2].is_multiple_of(BlockFormat::GROUP) {
        return Err(DecodeError::field(f_shape, Reason::OutOfRange(w.shape[2] as u64)).at(16 + 8));
    }
    // Interleaved groups take exactly 8 row lengths: the rows are exactly a row apart.
    let close = if format.interleaved() {
        w.shape[2] > 1 && w.stride[2] as i64 != rb as i64
    } else {
        w.shape[2] > 1 && (w.stride[2] as i64) < rb as i64
    };
    let d = if w.stride[3] != 1 {
        3
    } else if close {
        2
    } else {
        return Ok(());
    };
    Err(DecodeError::field(f_stride, Reason::OutOfRange(w.stride[d] as u64)).at(32 + 4 * d))
}
