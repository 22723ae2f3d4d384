//! Writing an NCM image. The layout is described in `docs/ncm-format.md`.

use crate::{
    CompiledModel, HEADER_SIZE, MAGIC, SECTION_ENTRY_SIZE, VERSION_MAJOR, VERSION_MINOR, section,
};

fn pad8(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(8) {
        v.push(0);
    }
}

fn meta(m: &CompiledModel) -> Vec<u8> {
    let mut s = Vec::new();
    for text in [&m.name, &m.producer] {
        s.extend_from_slice(&(text.len() as u16).to_le_bytes());
        s.extend_from_slice(text.as_bytes());
    }
    s
}

fn io(m: &CompiledModel) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&(m.io.len() as u32).to_le_bytes());
    for t in &m.io {
        s.extend_from_slice(&(t.name.len() as u16).to_le_bytes());
        s.push(t.usage as u8);
        s.push(t.dtype.code());
        s.push(t.shape.len() as u8);
        let in_place = t.in_place_of.map_or(0, |i| i as u16 + 1);
        s.extend_from_slice(&in_place.to_le_bytes());
        s.push(0);
        s.extend_from_slice(&t.mem_ref.to_le_bytes());
        for d in &t.shape {
            s.extend_from_slice(&d.to_le_bytes());
        }
        s.extend_from_slice(t.name.as_bytes());
    }
    s
}

fn plan(m: &CompiledModel) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&(m.mem_refs.len() as u32).to_le_bytes());
    s.extend_from_slice(&0u32.to_le_bytes());
    for r in &m.mem_refs {
        s.push(r.kind as u8);
        s.extend_from_slice(&[0u8; 3]);
        s.extend_from_slice(&(r.align as u32).to_le_bytes());
        s.extend_from_slice(&r.size.to_le_bytes());
        s.extend_from_slice(&r.offset.to_le_bytes());
        s.extend_from_slice(&0u64.to_le_bytes());
    }
    s
}

fn blocks(m: &CompiledModel) -> Vec<u8> {
    let mut s = Vec::new();
    s.extend_from_slice(&(m.blocks.len() as u32).to_le_bytes());
    s.extend_from_slice(&0u32.to_le_bytes());
    for b in &m.blocks {
        s.push(b.core);
        s.push(b.engine as u8);
        s.extend_from_slice(&0u16.to_le_bytes());
        s.extend_from_slice(&(b.code.len() as u32).to_le_bytes());
        s.extend_from_slice(&(b.relocations.len() as u32).to_le_bytes());
        s.extend_from_slice(&0u32.to_le_bytes());
        s.extend_from_slice(&b.code);
        for r in &b.relocations {
            s.extend_from_slice(&r.patch_offset.to_le_bytes());
            s.extend_from_slice(&r.mem_ref.to_le_bytes());
            s.extend_from_slice(&r.offset.to_le_bytes());
        }
    }
    s
}

/// The NCM image of `m`. Its size comes from the model (the constants may be gigabytes), so
/// the one buffer it is written into is reserved fallibly, at its final size: the constants
/// are copied once, straight into it.
pub(crate) fn encode(m: &CompiledModel) -> Result<Vec<u8>, crate::ImageTooLarge> {
    let sections: [(u32, std::borrow::Cow<'_, [u8]>); 5] = [
        (section::META, meta(m).into()),
        (section::IO, io(m).into()),
        (section::PLAN, plan(m).into()),
        (section::BLOCKS, blocks(m).into()),
        (section::CONSTANTS, m.constants.as_slice().into()),
    ];
    let table_end = HEADER_SIZE + sections.len() * SECTION_ENTRY_SIZE;
    let body_at = table_end.next_multiple_of(8);
    let mut table = Vec::new();
    let mut at = body_at;
    for (kind, data) in &sections {
        table.extend_from_slice(&kind.to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
        table.extend_from_slice(&(at as u64).to_le_bytes());
        table.extend_from_slice(&(data.len() as u64).to_le_bytes());
        at = at.saturating_add(data.len()).next_multiple_of(8);
    }
    let mut out = Vec::new();
    out.try_reserve_exact(at)
        .map_err(|_| crate::ImageTooLarge { bytes: at })?;
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION_MAJOR.to_le_bytes());
    out.extend_from_slice(&VERSION_MINOR.to_le_bytes());
    out.extend_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // flags
    out.extend_from_slice(&0u64.to_le_bytes()); // file size, below
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    out.extend_from_slice(&m.sg_count.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // checksum, below
    out.resize(HEADER_SIZE, 0);
    out.extend_from_slice(&table);
    pad8(&mut out);
    for (_, data) in &sections {
        out.extend_from_slice(data);
        pad8(&mut out);
    }
    debug_assert_eq!(out.len(), at);
    let size = out.len() as u64;
    out[16..24].copy_from_slice(&size.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}
