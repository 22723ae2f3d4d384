//! The strict decoder. Every read is bounds-checked against the bytes that remain, every
//! count is checked against the bytes it would need before anything is allocated, and every
//! problem is reported with its file offset and field.

use crate::error::{ModelError, ModelErrorKind as K};
use crate::*;
use nrt_isa::BlockDecoder;

struct Cur<'a> {
    data: &'a [u8],
    pos: usize,
    /// File offset of `data[0]`.
    base: u64,
}

type R<T> = Result<T, ModelError>;

impl<'a> Cur<'a> {
    fn new(data: &'a [u8], base: u64) -> Self {
        Cur { data, pos: 0, base }
    }

    fn at(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn left(&self) -> usize {
        self.data.len() - self.pos
    }

    fn err(&self, field: impl Into<String>, kind: K) -> ModelError {
        ModelError::new(self.at(), field, kind)
    }

    fn take(&mut self, n: usize, field: &dyn Fn() -> String) -> R<&'a [u8]> {
        if self.left() < n {
            return Err(self.err(
                field(),
                K::Truncated {
                    needed: n as u64,
                    available: self.left() as u64,
                },
            ));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self, field: &dyn Fn() -> String) -> R<u8> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &dyn Fn() -> String) -> R<u16> {
        Ok(u16::from_le_bytes(
            self.take(2, field)?.try_into().expect("2 bytes"),
        ))
    }

    fn u32(&mut self, field: &dyn Fn() -> String) -> R<u32> {
        Ok(u32::from_le_bytes(
            self.take(4, field)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, field: &dyn Fn() -> String) -> R<u64> {
        Ok(u64::from_le_bytes(
            self.take(8, field)?.try_into().expect("8 bytes"),
        ))
    }

    fn zeros(&mut self, n: usize, field: &dyn Fn() -> String) -> R<()> {
        let at = self.at();
        if self.take(n, field)?.iter().any(|&b| b != 0) {
            return Err(ModelError::new(
                at,
                field(),
                K::Inconsistent("reserved bytes are not zero"),
            ));
        }
        Ok(())
    }

    /// Fails unless `count` records of at least `min_size` bytes each fit in what is left —
    /// the guard against allocating from a corrupt length field.
    fn check_count(&self, count: u64, min_size: usize, field: &dyn Fn() -> String) -> R<()> {
        if count.saturating_mul(min_size as u64) > self.left() as u64 {
            return Err(ModelError::new(
                self.at().saturating_sub(4),
                field(),
                K::Truncated {
                    needed: count.saturating_mul(min_size as u64),
                    available: self.left() as u64,
                },
            ));
        }
        Ok(())
    }

    fn name(&mut self, field: &dyn Fn() -> String, allow_empty: bool) -> R<String> {
        let at = self.at();
        let len = self.u16(field)? as usize;
        if len > MAX_NAME_LEN {
            return Err(ModelError::new(at, field(), K::NameTooLong(len as u64)));
        }
        let bytes = self.take(len, field)?;
        name_from(bytes, at, field, allow_empty)
    }
}

fn name_from(bytes: &[u8], at: u64, field: &dyn Fn() -> String, allow_empty: bool) -> R<String> {
    match core::str::from_utf8(bytes) {
        Ok(s) if (allow_empty || !s.is_empty()) && !s.contains('\0') => Ok(s.to_owned()),
        _ => Err(ModelError::new(at, field(), K::BadName)),
    }
}

fn f(s: &'static str) -> impl Fn() -> String {
    move || s.to_owned()
}

/// An address field of a decoded instruction, with what its relocation is checked against.
struct Field {
    /// Offset of the field in the block.
    at: u64,
    /// Bytes the operand touches relative to its address (exact).
    lo: i128,
    hi: i128,
    /// Index of the instruction in its block, its opcode and the operand (for the error).
    instruction: u32,
    opcode: u8,
    operand: &'static str,
}

struct Section {
    offset: u64,
    size: u64,
}

/// The fixed header's fields that the rest of the file is read by.
struct Header {
    file_size: u64,
    section_count: u32,
    sg_count: u32,
    stored_crc: u32,
}

/// Reads and checks the fixed header (magic, version, size, flags, reserved bytes).
fn header(bytes: &[u8]) -> R<Header> {
    let mut h = Cur::new(bytes, 0);
    let magic: [u8; 4] = h.take(4, &f("header.magic"))?.try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(ModelError::new(0, "header.magic", K::BadMagic(magic)));
    }
    let major = h.u16(&f("header.version_major"))?;
    let minor = h.u16(&f("header.version_minor"))?;
    if major != VERSION_MAJOR || minor > VERSION_MINOR {
        return Err(ModelError::new(
            4,
            "header.version",
            K::UnsupportedVersion { major, minor },
        ));
    }
    let header_size = h.u32(&f("header.header_size"))?;
    if header_size as usize != HEADER_SIZE {
        return Err(ModelError::new(
            8,
            "header.header_size",
            K::OutOfRange(header_size as u64),
        ));
    }
    let flags = h.u32(&f("header.flags"))?;
    if flags != 0 {
        return Err(ModelError::new(
            12,
            "header.flags",
            K::OutOfRange(flags as u64),
        ));
    }
    let file_size = h.u64(&f("header.file_size"))?;
    let section_count = h.u32(&f("header.section_count"))?;
    let sg_count = h.u32(&f("header.sg_count"))?;
    let stored_crc = h.u32(&f("header.checksum"))?;
    h.zeros(HEADER_SIZE - 36, &f("header.reserved"))?;
    Ok(Header {
        file_size,
        section_count,
        sg_count,
        stored_crc,
    })
}

/// The model's core count from its header alone (`header.sg_count`, range-checked), without
/// reading or checking the rest: what a runtime is sized by before the model loads (a load
/// decodes and validates the whole file).
pub(crate) fn core_count(bytes: &[u8]) -> R<u32> {
    checked_core_count(header(bytes)?.sg_count)
}

fn checked_core_count(sg_count: u32) -> R<u32> {
    if sg_count == 0 || sg_count > MAX_CORES {
        return Err(ModelError::new(
            28,
            "header.sg_count",
            K::OutOfRange(sg_count as u64),
        ));
    }
    Ok(sg_count)
}

pub(crate) fn decode(bytes: &[u8]) -> R<CompiledModel> {
    let len = bytes.len() as u64;
    let Header {
        file_size,
        section_count,
        sg_count,
        stored_crc,
    } = header(bytes)?;
    if file_size != len {
        return Err(ModelError::new(
            16,
            "header.file_size",
            K::SizeMismatch {
                header: file_size,
                actual: len,
            },
        ));
    }
    let computed = {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&bytes[..32]);
        hasher.update(&[0u8; 4]);
        hasher.update(&bytes[36..]);
        hasher.finalize()
    };
    // Under cargo-fuzz the checksum is not enforced, so mutated files reach every other check
    // (a fuzzer almost never produces a matching CRC).
    if computed != stored_crc && !cfg!(fuzzing) {
        return Err(ModelError::new(
            32,
            "header.checksum",
            K::ChecksumMismatch {
                stored: stored_crc,
                computed,
            },
        ));
    }
    checked_core_count(sg_count)?;
    if section_count > 16 {
        return Err(ModelError::new(
            24,
            "header.section_count",
            K::OutOfRange(section_count as u64),
        ));
    }

    // Section table.
    let table_end = HEADER_SIZE as u64 + section_count as u64 * SECTION_ENTRY_SIZE as u64;
    let mut t = Cur::new(bytes, 0);
    t.pos = HEADER_SIZE;
    let mut sections: [Option<Section>; 6] = Default::default();
    let mut spans: Vec<(u64, u64, usize)> = Vec::new();
    for i in 0..section_count as usize {
        let fi = move || format!("sections[{i}]");
        let at = t.at();
        let kind = t.u32(&fi)?;
        t.zeros(4, &fi)?;
        let offset = t.u64(&fi)?;
        let size = t.u64(&fi)?;
        let slot = match kind {
            section::META | section::IO | section::PLAN | section::BLOCKS | section::CONSTANTS => {
                kind as usize
            }
            _ => {
                return Err(ModelError::new(
                    at,
                    format!("sections[{i}].kind"),
                    K::BadSection("unknown kind"),
                ));
            }
        };
        if sections[slot].is_some() {
            return Err(ModelError::new(
                at,
                format!("sections[{i}].kind"),
                K::BadSection("duplicate kind"),
            ));
        }
        if offset % 8 != 0 || offset < table_end {
            return Err(ModelError::new(
                at + 8,
                format!("sections[{i}].offset"),
                K::BadSection("offset misaligned or inside the header"),
            ));
        }
        if offset.checked_add(size).is_none_or(|e| e > len) {
            return Err(ModelError::new(
                at + 16,
                format!("sections[{i}].size"),
                K::BadSection("extends past the end of the file"),
            ));
        }
        spans.push((offset, size, i));
        sections[slot] = Some(Section { offset, size });
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[0].0 + w[0].1 > w[1].0 {
            let at = HEADER_SIZE as u64 + w[1].2 as u64 * SECTION_ENTRY_SIZE as u64 + 8;
            return Err(ModelError::new(
                at,
                format!("sections[{}].offset", w[1].2),
                K::BadSection("overlaps another section"),
            ));
        }
    }
    let sec = |kind: u32| {
        sections[kind as usize].as_ref().map(|s| {
            Cur::new(
                &bytes[s.offset as usize..(s.offset + s.size) as usize],
                s.offset,
            )
        })
    };
    let required = |kind: u32, name: &'static str| {
        sec(kind).ok_or(ModelError::new(
            24,
            "header.sections",
            K::MissingSection(name),
        ))
    };

    // META (optional).
    let (name, producer) = match sec(section::META) {
        Some(mut c) => (
            c.name(&f("meta.name"), true)?,
            c.name(&f("meta.producer"), true)?,
        ),
        None => (String::new(), String::new()),
    };
    let constants: Vec<u8> = sec(section::CONSTANTS)
        .map(|c| c.data.to_vec())
        .unwrap_or_default();

    // PLAN.
    let mut c = required(section::PLAN, "PLAN")?;
    let count = c.u32(&f("plan.count"))? as u64;
    c.zeros(4, &f("plan.reserved"))?;
    c.check_count(count, MEM_REF_SIZE, &f("plan.count"))?;
    let mut mem_refs = Vec::with_capacity(count as usize);
    let mut plan_at = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let fi = move |x: &str| format!("plan[{i}].{x}");
        let at = c.at();
        let kind_byte = c.u8(&|| fi("kind"))?;
        let kind = MemRefKind::from_u8(kind_byte).ok_or(ModelError::new(
            at,
            fi("kind"),
            K::BadEnum(kind_byte as u64),
        ))?;
        c.zeros(3, &|| fi("reserved"))?;
        let align = c.u32(&|| fi("align"))? as u64;
        let size = c.u64(&|| fi("size"))?;
        let offset = c.u64(&|| fi("offset"))?;
        c.zeros(8, &|| fi("reserved"))?;
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(ModelError::new(at + 4, fi("align"), K::BadAlignment(align)));
        }
        if size > MAX_TENSOR_BYTES {
            return Err(ModelError::new(at + 8, fi("size"), K::OutOfRange(size)));
        }
        match kind {
            MemRefKind::Sb | MemRefKind::VirtualTmpBuf => {
                if offset % align != 0 {
                    return Err(ModelError::new(
                        at + 16,
                        fi("offset"),
                        K::Misaligned { offset, align },
                    ));
                }
                let limit = if kind == MemRefKind::Sb {
                    SB_SIZE
                } else {
                    1 << 40
                };
                if offset.checked_add(size).is_none_or(|e| e > limit) {
                    return Err(ModelError::new(
                        at + 16,
                        fi("offset"),
                        K::OutOfRange(offset),
                    ));
                }
            }
            MemRefKind::Buffer => {
                if offset
                    .checked_add(size)
                    .is_none_or(|e| e > constants.len() as u64)
                {
                    return Err(ModelError::new(
                        at + 16,
                        fi("offset"),
                        // Saturating: the sum is what overflowed or ran past the end (D8).
                        K::OutOfRangeId {
                            id: offset.saturating_add(size),
                            limit: constants.len() as u64,
                        },
                    ));
                }
            }
            MemRefKind::Remote => {
                if offset != 0 {
                    return Err(ModelError::new(
                        at + 16,
                        fi("offset"),
                        K::OutOfRange(offset),
                    ));
                }
            }
            MemRefKind::Io | MemRefKind::IoDescriptors => {} // checked against the I/O table below
        }
        mem_refs.push(MemRef {
            kind,
            align,
            size,
            offset,
        });
        plan_at.push(at);
    }
    // Overlaps within the SB and scratch regions.
    for kind in [MemRefKind::Sb, MemRefKind::VirtualTmpBuf] {
        let mut placed: Vec<(u64, u64, usize)> = mem_refs
            .iter()
            .enumerate()
            .filter(|(_, m)| m.kind == kind && m.size > 0)
            .map(|(i, m)| (m.offset, m.size, i))
            .collect();
        placed.sort_unstable();
        for w in placed.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                let (i, other) = (w[1].2, w[0].2);
                return Err(ModelError::new(
                    plan_at[i] + 16,
                    format!("plan[{i}].offset"),
                    K::Overlap {
                        other: other as u32,
                    },
                ));
            }
        }
    }

    // IO.
    let mut c = required(section::IO, "IO")?;
    let count = c.u32(&f("io.count"))? as u64;
    c.check_count(count, 12, &f("io.count"))?;
    let mut io: Vec<IoTensor> = Vec::with_capacity(count as usize);
    let mut io_ref_seen = vec![false; mem_refs.len()];
    let mut in_place_at_of: Vec<(usize, u64)> = Vec::new();
    for i in 0..count as usize {
        let fi = move |x: &str| format!("io[{i}].{x}");
        let at = c.at();
        let name_len = c.u16(&|| fi("name"))? as usize;
        if name_len > MAX_NAME_LEN {
            return Err(ModelError::new(
                at,
                fi("name"),
                K::NameTooLong(name_len as u64),
            ));
        }
        let usage_at = c.at();
        let usage = match c.u8(&|| fi("usage"))? {
            0 => Usage::Input,
            1 => Usage::Output,
            v => return Err(ModelError::new(usage_at, fi("usage"), K::BadEnum(v as u64))),
        };
        let dt_at = c.at();
        let dt = c.u8(&|| fi("dtype"))?;
        let dtype = DType::from_code(dt).ok_or(ModelError::new(
            dt_at,
            fi("dtype"),
            K::BadEnum(dt as u64),
        ))?;
        let rank_at = c.at();
        let rank = c.u8(&|| fi("rank"))? as usize;
        if rank > MAX_RANK {
            return Err(ModelError::new(
                rank_at,
                fi("rank"),
                K::OutOfRange(rank as u64),
            ));
        }
        let in_place_at = c.at();
        let in_place = c.u16(&|| fi("in_place_of"))?;
        c.zeros(1, &|| fi("reserved"))?;
        let mr_at = c.at();
        let mem_ref = c.u32(&|| fi("mem_ref"))?;
        let shape_at = c.at();
        let mut shape = Vec::with_capacity(rank);
        for _ in 0..rank {
            shape.push(c.u32(&|| fi("shape"))?);
        }
        let name_at = c.at();
        let name = name_from(
            c.take(name_len, &|| fi("name"))?,
            name_at,
            &|| fi("name"),
            false,
        )?;
        if io.iter().any(|t| t.name == name) {
            return Err(ModelError::new(name_at, fi("name"), K::DuplicateName(name)));
        }
        let t = IoTensor {
            name,
            usage,
            dtype,
            shape,
            mem_ref,
            in_place_of: in_place.checked_sub(1).map(u32::from),
        };
        if in_place != 0 {
            in_place_at_of.push((i, in_place_at));
        }
        let mr = mem_refs.get(mem_ref as usize).ok_or(ModelError::new(
            mr_at,
            fi("mem_ref"),
            K::OutOfRangeId {
                id: mem_ref as u64,
                limit: mem_refs.len() as u64,
            },
        ))?;
        if mr.kind != MemRefKind::Io || mr.offset != i as u64 {
            return Err(ModelError::new(
                mr_at,
                fi("mem_ref"),
                K::Inconsistent(
                    "an I/O tensor must use the MR_IO entry whose placement is its own index",
                ),
            ));
        }
        // Checked (D7): `[2^31, 2^31, 4]` wrapped to 0 elements and matched a 0-byte entry.
        if t.checked_byte_size().is_none_or(|b| b > MAX_TENSOR_BYTES) {
            return Err(ModelError::new(
                shape_at,
                fi("shape"),
                K::TensorTooLarge {
                    shape: t.shape,
                    elem_size: dtype.size() as u64,
                },
            ));
        }
        if mr.size != t.byte_size() {
            return Err(ModelError::new(
                mr_at,
                fi("mem_ref"),
                K::Inconsistent("MR_IO entry size differs from the tensor's byte size"),
            ));
        }
        io_ref_seen[mem_ref as usize] = true;
        io.push(t);
    }
    if c.left() != 0 {
        return Err(c.err("io", K::BadSection("bytes after the last I/O tensor")));
    }
    check_in_place(&io, &in_place_at_of)?;
    let mut descriptor_tables = 0;
    for (i, m) in mem_refs.iter().enumerate() {
        match m.kind {
            MemRefKind::Io if !io_ref_seen[i] => {
                return Err(ModelError::new(
                    plan_at[i] + 16,
                    format!("plan[{i}].offset"),
                    K::OutOfRangeId {
                        id: m.offset,
                        limit: io.len() as u64,
                    },
                ));
            }
            MemRefKind::IoDescriptors => {
                descriptor_tables += 1;
                let want = io.len() as u64 * nrt_hal::wire::TRIGGER_PAIR_SIZE as u64;
                if descriptor_tables > 1 || m.size != want || m.offset != 0 {
                    return Err(ModelError::new(
                        plan_at[i] + 8,
                        format!("plan[{i}].size"),
                        K::Inconsistent(
                            "the I/O descriptor table must be unique and hold one pair per I/O tensor",
                        ),
                    ));
                }
            }
            _ => {}
        }
    }

    // BLOCKS.
    let mut c = required(section::BLOCKS, "BLOCKS")?;
    let count = c.u32(&f("blocks.count"))? as u64;
    c.zeros(4, &f("blocks.reserved"))?;
    c.check_count(count, 16 + 8, &f("blocks.count"))?;
    if count != sg_count as u64 * NUM_ENGINES_U64 {
        return Err(ModelError::new(
            c.at() - 8,
            "blocks.count",
            K::Inconsistent("there must be one block per core and engine"),
        ));
    }
    let mut blocks: Vec<Block> = Vec::with_capacity(count as usize);
    let mut seen = vec![false; count as usize];
    for i in 0..count as usize {
        let fi = move |x: &str| format!("blocks[{i}].{x}");
        let at = c.at();
        let core = c.u8(&|| fi("core"))?;
        let eng = c.u8(&|| fi("engine"))?;
        if core as u32 >= sg_count {
            return Err(ModelError::new(
                at,
                fi("core"),
                K::OutOfRangeId {
                    id: core as u64,
                    limit: sg_count as u64,
                },
            ));
        }
        let engine = Engine::from_index(eng).ok_or(ModelError::new(
            at + 1,
            fi("engine"),
            K::BadEnum(eng as u64),
        ))?;
        let slot = core as usize * 5 + eng as usize;
        if seen[slot] {
            return Err(ModelError::new(
                at,
                fi("core"),
                K::Inconsistent("two blocks for the same core and engine"),
            ));
        }
        seen[slot] = true;
        c.zeros(2, &|| fi("reserved"))?;
        let code_size = c.u32(&|| fi("code_size"))? as u64;
        let reloc_count = c.u32(&|| fi("reloc_count"))? as u64;
        c.zeros(4, &|| fi("reserved"))?;
        if !code_size.is_multiple_of(8) {
            return Err(ModelError::new(
                at + 4,
                fi("code_size"),
                K::OutOfRange(code_size),
            ));
        }
        c.check_count(code_size, 1, &|| fi("code_size"))?;
        let code_at = c.at();
        let code = c.take(code_size as usize, &|| fi("code"))?;
        c.check_count(reloc_count, RELOC_SIZE, &|| fi("reloc_count"))?;
        // Decode and validate every instruction; collect its address fields.
        let mut fields: Vec<Field> = Vec::new();
        for (index, r) in BlockDecoder::new(code, engine).enumerate() {
            let (ins_at, ins) = r.map_err(|e| {
                ModelError::new(
                    code_at + (e.block_offset + e.field_offset) as u64,
                    fi("code"),
                    K::Instruction(e),
                )
            })?;
            ins.address_fields(|a| {
                fields.push(Field {
                    at: (ins_at + a.offset) as u64,
                    lo: a.extent.0,
                    hi: a.extent.1,
                    instruction: index as u32,
                    opcode: ins.op.opcode(),
                    operand: a.name,
                })
            });
        }
        let mut relocations = Vec::with_capacity(reloc_count as usize);
        let mut covered = vec![false; fields.len()];
        for j in 0..reloc_count as usize {
            let fr = move |x: &str| format!("blocks[{i}].relocs[{j}].{x}");
            let rat = c.at();
            let patch_offset = c.u32(&|| fr("patch_offset"))?;
            let mem_ref = c.u32(&|| fr("mem_ref"))?;
            let offset = c.u64(&|| fr("offset"))?;
            if patch_offset as u64 + 8 > code_size {
                return Err(ModelError::new(
                    rat,
                    fr("patch_offset"),
                    K::RelocationPastBlock {
                        patch_offset,
                        block_size: code_size,
                    },
                ));
            }
            let mr = mem_refs.get(mem_ref as usize).ok_or(ModelError::new(
                rat + 4,
                fr("mem_ref"),
                K::OutOfRangeId {
                    id: mem_ref as u64,
                    limit: mem_refs.len() as u64,
                },
            ))?;
            let k = fields
                .binary_search_by_key(&(patch_offset as u64), |x| x.at)
                .map_err(|_| {
                    ModelError::new(rat, fr("patch_offset"), K::RelocationMismatch(patch_offset))
                })?;
            if covered[k] {
                return Err(ModelError::new(
                    rat,
                    fr("patch_offset"),
                    K::RelocationMismatch(patch_offset),
                ));
            }
            covered[k] = true;
            let field_bytes = &code[patch_offset as usize..patch_offset as usize + 8];
            if field_bytes.iter().any(|&b| b != 0) {
                return Err(ModelError::new(
                    code_at + patch_offset as u64,
                    fr("patch_offset"),
                    K::Inconsistent("an address field must be zero before relocation"),
                ));
            }
            // Exact (`i128`) arithmetic: the offset is any u64 and the extent may span ~2^68
            // bytes; nothing here may wrap into range (D1).
            let Field { lo, hi, .. } = fields[k];
            // An empty operand touches nothing, but its address must still lie inside the
            // entry: load computes `entry base + offset`, which must not overflow.
            let (lo, hi) = if lo == hi { (0, 0) } else { (lo, hi) };
            let base = offset as i128;
            if base + lo < 0 || base + hi > mr.size as i128 {
                return Err(ModelError::new(
                    rat + 8,
                    fr("offset"),
                    K::OperandOutOfBounds {
                        instruction: fields[k].instruction,
                        opcode: fields[k].opcode,
                        operand: fields[k].operand,
                        lo: base + lo,
                        hi: base + hi,
                        size: mr.size,
                    },
                ));
            }
            relocations.push(Relocation {
                patch_offset,
                mem_ref,
                offset,
            });
        }
        if let Some(k) = covered.iter().position(|c| !c) {
            return Err(ModelError::new(
                code_at + fields[k].at,
                fi("relocs"),
                K::RelocationMismatch(fields[k].at as u32),
            ));
        }
        blocks.push(Block {
            core,
            engine,
            code: code.to_vec(),
            relocations,
        });
    }
    if c.left() != 0 {
        return Err(c.err("blocks", K::BadSection("bytes after the last block")));
    }
    blocks.sort_by_key(|b| (b.core, b.engine));
    Ok(CompiledModel {
        name,
        producer,
        sg_count,
        io,
        mem_refs,
        blocks,
        constants,
    })
}

const NUM_ENGINES_U64: u64 = nrt_hal::NUM_ENGINES as u64;

/// The in-place pairs of the I/O table (NCM 1.10): each names an input of the same element
/// type and shape, from an output, and no input is updated by two outputs.
fn check_in_place(io: &[IoTensor], at_of: &[(usize, u64)]) -> Result<(), ModelError> {
    let mut claimed = Vec::with_capacity(at_of.len());
    for &(i, at) in at_of {
        let fi = format!("io[{i}].in_place_of");
        let t = &io[i];
        let Some(k) = t.in_place_of else { continue };
        let bad = |why| Err(ModelError::new(at, fi.clone(), K::Inconsistent(why)));
        if t.usage != Usage::Output {
            return bad("only an output can update an input in place");
        }
        let Some(src) = io.get(k as usize) else {
            return Err(ModelError::new(
                at,
                fi,
                K::OutOfRangeId {
                    id: k as u64,
                    limit: io.len() as u64,
                },
            ));
        };
        if src.usage != Usage::Input {
            return bad("an in-place output must name an input");
        }
        if src.dtype != t.dtype || src.shape != t.shape {
            return bad("an in-place output must have its input's element type and shape");
        }
        if claimed.contains(&k) {
            return bad("two outputs update the same input in place");
        }
        claimed.push(k);
    }
    Ok(())
}
