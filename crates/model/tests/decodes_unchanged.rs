//! The instruction decoder reads every committed byte the way it did when
//! `tests/data/decodes.txt` was recorded: every fuzz seed of the instruction decoder
//! (`fuzz/seeds/isa`: an engine byte, then a block) and every committed compiled model
//! (`fuzz/seeds/ncm`, `tests/data`). For each instruction the record holds its offset,
//! mnemonic, opcode, length, the engines that may run it, each operand (slot, name, role)
//! and address field (offset, extent), and whether it re-encodes to its own bytes; for a
//! block or model that does not decode, the error as the user reads it. Each seed is also
//! decoded with every third byte corrupted (two ways), its records kept as one digest. A change to how an
//! instruction is represented in code (the op-as-unit refactor) must leave this unchanged.
//! Re-record with `NRT_BLESS=1` only for an intended change of the format, and say so.

use nrt_hal::Engine;
use nrt_isa::{BlockDecoder, Instruction};
use nrt_model::CompiledModel;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sorted_files(dir: &Path, ext: Option<&str>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)))
        .collect();
    v.sort();
    v
}

fn record_instruction(out: &mut String, at: usize, ins: &Instruction, bytes: &[u8]) {
    let op = &ins.op;
    let engines: String = Engine::ALL
        .iter()
        .map(|&e| if op.runs_on(e) { '1' } else { '0' })
        .collect();
    let mut again = Vec::new();
    ins.encode(&mut again);
    let same = again.as_slice() == &bytes[at..at + again.len()];
    write!(
        out,
        "  @{at} {} {:#04x} len={} engines={engines} identity={same} ops=[",
        op.name(),
        op.opcode(),
        ins.encoded_len()
    )
    .unwrap();
    op.operands(|o| write!(out, "{}:{}:{:?} ", o.slot, o.name, o.role).unwrap());
    out.push_str("] fields=[");
    ins.address_fields(|a| write!(out, "{}:{}:{:?} ", a.offset, a.name, a.extent).unwrap());
    out.push_str("]\n");
}

fn record_block(out: &mut String, block: &[u8], engine: Engine) {
    for r in BlockDecoder::new(block, engine) {
        match r {
            Ok((at, ins)) => record_instruction(out, at, &ins, block),
            Err(e) => writeln!(out, "  error: {e}").unwrap(),
        }
    }
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn record_all() -> String {
    let mut out = String::new();
    let root = root();
    for p in sorted_files(&root.join("fuzz/seeds/isa"), None) {
        let data = std::fs::read(&p).unwrap();
        writeln!(out, "isa {}", p.file_name().unwrap().to_string_lossy()).unwrap();
        let Some((&e, block)) = data.split_first() else {
            continue;
        };
        let engine = Engine::ALL[e as usize % Engine::ALL.len()];
        record_block(&mut out, block, engine);
        // Every third byte corrupted two ways: what the decoder makes of each block (every
        // check of every op it reaches), as one digest per seed.
        let mut corrupted = String::new();
        let mut bytes = block.to_vec();
        for at in (0..block.len()).step_by(3) {
            for x in [0x5a, 0xff] {
                bytes[at] = block[at] ^ x;
                writeln!(corrupted, "{at}^{x}").unwrap();
                record_block(&mut corrupted, &bytes, engine);
            }
            bytes[at] = block[at];
        }
        writeln!(out, "  corrupted: {:016x}", fnv1a(corrupted.as_bytes())).unwrap();
    }
    let ncm_dirs = [
        root.join("fuzz/seeds/ncm"),
        root.join("crates/model/tests/data"),
    ];
    for dir in ncm_dirs {
        for p in sorted_files(&dir, Some("ncm")) {
            let data = std::fs::read(&p).unwrap();
            writeln!(out, "ncm {}", p.file_name().unwrap().to_string_lossy()).unwrap();
            match CompiledModel::decode(&data) {
                Err(e) => writeln!(out, "  error: {e}").unwrap(),
                Ok(m) => {
                    for b in &m.blocks {
                        writeln!(out, " block core={} engine={:?}", b.core, b.engine).unwrap();
                        record_block(&mut out, &b.code, b.engine);
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_committed_seed_and_model_decodes_as_recorded() {
    let got = record_all();
    let path = root().join("crates/model/tests/data/decodes.txt");
    if std::env::var_os("NRT_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).expect("tests/data/decodes.txt (NRT_BLESS=1)");
    if got != want {
        let (g, w): (Vec<_>, Vec<_>) = (got.lines().collect(), want.lines().collect());
        let first = g
            .iter()
            .zip(&w)
            .position(|(a, b)| a != b)
            .unwrap_or(g.len().min(w.len()));
        panic!(
            "decoding changed at line {}:\n  now:      {:?}\n  recorded: {:?}\n({} lines now, {} recorded)",
            first + 1,
            g.get(first),
            w.get(first),
            g.len(),
            w.len()
        );
    }
}
