//! Round trips and every decoder error class of the NCM container.

use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ActFunc, Instruction, Op, SemRef};
use nrt_model::*;
use proptest::prelude::*;

/// A small but complete model: y = relu(x + w), with an output DMA and a streaming notify.
fn sample(sg_count: u32, n: u32, name_len: usize) -> CompiledModel {
    let mut b = ModelBuilder::new("sample", sg_count);
    let x = b.input(&"x".repeat(name_len.max(1)), DType::F32, &[n]);
    let y = b.output("y", DType::F32, &[n]);
    let w = b.constant(&vec![1u8; n as usize * 4], 64);
    let tmp = b.scratch(0, n as u64 * 4, 64);
    let (xr, yr) = (b.io_mem_ref(x), b.io_mem_ref(y));
    for core in 0..sg_count as u8 {
        let dx = b.io_descriptor(x);
        b.push(
            core,
            Engine::Sp,
            Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
                table: dx,
                count: 1,
            }))
            .signal(SemRef::local(4), 1),
        );
        b.push(
            core,
            Engine::Dve,
            Instruction::new(Op::Binary(op::Binary {
                a: AccessPattern::dense(vaddr(xr, 0), DType::F32, &[n]),
                b: AccessPattern::dense(vaddr(w, 0), DType::F32, &[n]),
                out: AccessPattern::dense(vaddr(tmp, 0), DType::F32, &[n]),
                op: nrt_isa::BinaryOp::Add,
            }))
            .wait(SemRef::local(4), 1)
            .signal(SemRef::local(5), 1),
        );
        b.push(
            core,
            Engine::Act,
            Instruction::new(Op::Activation(op::Activation {
                input: AccessPattern::dense(vaddr(tmp, 0), DType::F32, &[n]),
                output: AccessPattern::dense(vaddr(yr, 0), DType::F32, &[n]),
                bias: None,
                func: ActFunc::Relu,
                scale: 1.0,
                alpha: 0.0,
                beta: 0.0,
            }))
            .wait(SemRef::local(5), 1),
        );
    }
    b.build()
}

fn fix_crc(bytes: &mut [u8]) {
    bytes[32..36].fill(0);
    let crc = crc32fast::hash(bytes);
    bytes[32..36].copy_from_slice(&crc.to_le_bytes());
}

fn section_offset(bytes: &[u8], kind: u32) -> usize {
    let count = u32::from_le_bytes(bytes[24..28].try_into().unwrap()) as usize;
    for i in 0..count {
        let e = &bytes[64 + 24 * i..64 + 24 * (i + 1)];
        if u32::from_le_bytes(e[0..4].try_into().unwrap()) == kind {
            return u64::from_le_bytes(e[8..16].try_into().unwrap()) as usize;
        }
    }
    panic!("no section {kind}");
}

fn err(bytes: &[u8]) -> ModelError {
    CompiledModel::decode(bytes).unwrap_err()
}

#[test]
fn sample_round_trips() {
    for sg in [1, 2] {
        let m = sample(sg, 16, 3);
        let bytes = m.encode();
        let back = CompiledModel::decode(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.scratch_bytes(), 64);
        assert_eq!(back.inputs().count(), 1);
    }
}

proptest! {
    #[test]
    fn models_round_trip(sg in 1u32..3, n in 1u32..64, name_len in 1usize..=255) {
        let m = sample(sg, n, name_len);
        let back = CompiledModel::decode(&m.encode()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, m);
    }

    #[test]
    fn corrupted_files_never_panic(at in any::<prop::sample::Index>(), v in any::<u8>(), recrc in any::<bool>()) {
        let mut bytes = sample(2, 8, 4).encode();
        let i = at.index(bytes.len());
        bytes[i] = v;
        if recrc { fix_crc(&mut bytes); }
        let _ = CompiledModel::decode(&bytes);
    }

    #[test]
    fn truncated_files_are_errors(cut in any::<prop::sample::Index>()) {
        let bytes = sample(1, 8, 4).encode();
        let n = cut.index(bytes.len());
        prop_assert!(CompiledModel::decode(&bytes[..n]).is_err());
    }
}

#[test]
fn truncated() {
    let e = err(&sample(1, 4, 1).encode()[..10]);
    assert!(matches!(e.kind, ModelErrorKind::Truncated { .. }), "{e}");
    assert!(e.field.starts_with("header"), "{e}");
}

#[test]
fn bad_magic_and_version() {
    let mut b = sample(1, 4, 1).encode();
    b[0] = b'X';
    let e = err(&b);
    assert!(
        matches!(e.kind, ModelErrorKind::BadMagic(_)) && e.offset == 0,
        "{e}"
    );

    let mut b = sample(1, 4, 1).encode();
    b[4] = 2; // major 2
    fix_crc(&mut b);
    let e = err(&b);
    assert!(e.is_unsupported_version(), "{e}");
    assert_eq!(e.field, "header.version");
}

/// An ONNX or GGUF file given where a compiled model is expected says what it is and what
/// to do with it, not only that its magic is wrong.
#[test]
fn onnx_and_gguf_files_are_named_as_such() {
    // An ONNX ModelProto: ir_version 8, then producer_name "pytorch".
    let mut onnx = vec![0x08, 0x08, 0x12, 0x07];
    onnx.extend_from_slice(b"pytorch");
    onnx.resize(256, 0);
    let e = err(&onnx).to_string();
    assert!(
        e.contains("this is ONNX") && e.contains("`nrt compile`") && e.contains("`nrt run`"),
        "{e}"
    );
    let mut gguf = b"GGUF".to_vec();
    gguf.resize(256, 0);
    let e = err(&gguf).to_string();
    assert!(e.contains("GGUF") && e.contains("`nrt llm build`"), "{e}");
    let mut other = b"XYZW".to_vec();
    other.resize(256, 0);
    assert!(err(&other).to_string().contains("bad magic"));
}

/// The core count comes from the header alone: the rest of the file is neither read nor
/// checked (a load does that), but the header's own checks hold, and the count is in range.
#[test]
fn core_count_reads_the_header_only() {
    for cores in [1, 2, 4] {
        let b = sample(cores, 4, 1).encode();
        assert_eq!(CompiledModel::core_count(&b).unwrap(), cores);
        // A damaged body: the count still reads; decoding the whole file does not.
        let mut damaged = b.clone();
        let end = damaged.len() - 1;
        damaged[end] ^= 0xFF;
        assert_eq!(CompiledModel::core_count(&damaged).unwrap(), cores);
        assert!(CompiledModel::decode(&damaged).is_err());
    }
    let mut b = sample(1, 4, 1).encode();
    b[0] = b'X';
    assert!(matches!(
        CompiledModel::core_count(&b).unwrap_err().kind,
        ModelErrorKind::BadMagic(_)
    ));
    let e = CompiledModel::core_count(&sample(1, 4, 1).encode()[..20]).unwrap_err();
    assert!(matches!(e.kind, ModelErrorKind::Truncated { .. }), "{e}");
    for bad in [0u32, 1000] {
        let mut b = sample(1, 4, 1).encode();
        b[28..32].copy_from_slice(&bad.to_le_bytes());
        let e = CompiledModel::core_count(&b).unwrap_err();
        assert_eq!(e.field, "header.sg_count", "{e}");
    }
}

/// A file written by format 1.0 (before the minor bump to 1.1) still loads; a newer minor
/// than this crate's is refused.
#[test]
fn older_minor_loads_newer_minor_is_refused() {
    let v10 = include_bytes!("../../../fuzz/seeds/ncm/conv_s2.ncm");
    assert_eq!(
        &v10[4..8],
        &[1, 0, 0, 0],
        "the committed file is version 1.0"
    );
    CompiledModel::decode(v10).expect("a 1.0 file loads");

    let mut b = sample(1, 4, 1).encode();
    assert_eq!(u16::from_le_bytes([b[6], b[7]]), VERSION_MINOR);
    b[6..8].copy_from_slice(&(VERSION_MINOR + 1).to_le_bytes());
    fix_crc(&mut b);
    let e = err(&b);
    assert!(e.is_unsupported_version(), "{e}");
}

#[test]
fn checksum_and_size() {
    let mut b = sample(1, 4, 1).encode();
    let n = b.len();
    b[n - 1] ^= 0xFF;
    let e = err(&b);
    assert!(
        matches!(e.kind, ModelErrorKind::ChecksumMismatch { .. }) && e.field == "header.checksum",
        "{e}"
    );

    let mut b = sample(1, 4, 1).encode();
    b.push(0);
    let e = err(&b);
    assert!(matches!(e.kind, ModelErrorKind::SizeMismatch { .. }), "{e}");
}

#[test]
fn out_of_range_mem_ref_in_relocation() {
    let mut m = sample(1, 4, 1);
    let blk = m
        .blocks
        .iter_mut()
        .find(|b| !b.relocations.is_empty())
        .unwrap();
    blk.relocations[0].mem_ref = 99;
    let e = err(&m.encode());
    assert!(
        matches!(e.kind, ModelErrorKind::OutOfRangeId { id: 99, .. }),
        "{e}"
    );
    assert!(e.field.contains("relocs[0].mem_ref"), "{e}");
}

#[test]
fn relocation_past_block() {
    let mut m = sample(1, 4, 1);
    let blk = m
        .blocks
        .iter_mut()
        .find(|b| !b.relocations.is_empty())
        .unwrap();
    blk.relocations[0].patch_offset = blk.code.len() as u32 - 4;
    let e = err(&m.encode());
    assert!(
        matches!(e.kind, ModelErrorKind::RelocationPastBlock { .. }),
        "{e}"
    );
}

#[test]
fn relocation_not_on_an_address_field() {
    let mut m = sample(1, 4, 1);
    let blk = m
        .blocks
        .iter_mut()
        .find(|b| !b.relocations.is_empty())
        .unwrap();
    blk.relocations[0].patch_offset = 0;
    let e = err(&m.encode());
    assert!(
        matches!(e.kind, ModelErrorKind::RelocationMismatch(0)),
        "{e}"
    );
}

#[test]
fn operand_outside_its_plan_entry() {
    let mut m = sample(1, 4, 1);
    let blk = m
        .blocks
        .iter_mut()
        .find(|b| b.engine == Engine::Dve)
        .unwrap();
    blk.relocations[0].offset = 8; // 16-byte operand at offset 8 of a 16-byte entry
    let e = err(&m.encode());
    assert!(
        matches!(
            e.kind,
            ModelErrorKind::OperandOutOfBounds {
                lo: 8,
                hi: 24,
                size: 16,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn overlapping_and_misaligned_plan_entries() {
    let mut m = sample(1, 4, 1);
    m.mem_refs.push(MemRef {
        kind: MemRefKind::VirtualTmpBuf,
        align: 8,
        size: 32,
        offset: 8,
    });
    let e = err(&m.encode());
    assert!(matches!(e.kind, ModelErrorKind::Overlap { .. }), "{e}");
    assert!(e.field.starts_with("plan["), "{e}");

    let mut m = sample(1, 4, 1);
    m.mem_refs.push(MemRef {
        kind: MemRefKind::VirtualTmpBuf,
        align: 64,
        size: 32,
        offset: 96,
    });
    let e = err(&m.encode());
    assert!(
        matches!(
            e.kind,
            ModelErrorKind::Misaligned {
                offset: 96,
                align: 64
            }
        ),
        "{e}"
    );

    let mut m = sample(1, 4, 1);
    m.mem_refs.push(MemRef {
        kind: MemRefKind::VirtualTmpBuf,
        align: 48,
        size: 32,
        offset: 96,
    });
    assert!(matches!(
        err(&m.encode()).kind,
        ModelErrorKind::BadAlignment(48)
    ));
}

#[test]
fn oversize_and_bad_names() {
    let mut b = sample(1, 4, 1).encode();
    let io = section_offset(&b, section::IO);
    b[io + 4..io + 6].copy_from_slice(&300u16.to_le_bytes());
    fix_crc(&mut b);
    let e = err(&b);
    assert!(
        matches!(e.kind, ModelErrorKind::NameTooLong(300)) && e.field == "io[0].name",
        "{e}"
    );

    let mut m = sample(1, 4, 1);
    m.io[1].name = m.io[0].name.clone();
    assert!(matches!(
        err(&m.encode()).kind,
        ModelErrorKind::DuplicateName(_)
    ));

    let mut m = sample(1, 4, 1);
    m.io[0].name = "a\0b".into();
    assert!(matches!(err(&m.encode()).kind, ModelErrorKind::BadName));
}

#[test]
fn huge_counts_do_not_allocate() {
    let mut b = sample(1, 4, 1).encode();
    let plan = section_offset(&b, section::PLAN);
    b[plan..plan + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    fix_crc(&mut b);
    let e = err(&b);
    assert!(
        matches!(e.kind, ModelErrorKind::Truncated { .. }) && e.field == "plan.count",
        "{e}"
    );
}

#[test]
fn bad_instruction_is_named() {
    let mut m = sample(1, 4, 1);
    let blk = m
        .blocks
        .iter_mut()
        .find(|b| b.engine == Engine::Act)
        .unwrap();
    blk.code[nrt_isa::HEADER_SIZE + 3 * nrt_isa::AP_SIZE] = 99; // activation function
    let e = err(&m.encode());
    match &e.kind {
        ModelErrorKind::Instruction(d) => assert_eq!(d.field, "func"),
        k => panic!("{k:?}"),
    }
    assert!(e.to_string().contains("Activation"), "{e}");
}

#[test]
fn missing_blocks_and_bad_core() {
    let mut m = sample(2, 4, 1);
    m.blocks.pop();
    assert!(matches!(
        err(&m.encode()).kind,
        ModelErrorKind::Inconsistent(_)
    ));
    let mut m = sample(1, 4, 1);
    m.blocks[0].core = 3;
    assert!(matches!(
        err(&m.encode()).kind,
        ModelErrorKind::OutOfRangeId { id: 3, limit: 1 }
    ));
}

#[test]
fn io_entry_must_match_tensor() {
    let mut m = sample(1, 4, 1);
    m.io[0].shape = vec![5];
    assert!(matches!(
        err(&m.encode()).kind,
        ModelErrorKind::Inconsistent(_)
    ));
}

/// The D1 model: one operand of `shape [1,1,1,2^31]`, `stride [0,0,0,i32::MAX]` (its extent
/// is ~2^64 bytes, which wrapped `i64` to a small number) on a 64-byte scratch entry.
fn huge_stride_model(engine: Engine) -> CompiledModel {
    let mut b = ModelBuilder::new("d1", 1);
    let tmp = b.scratch(0, 64, 64);
    let huge = AccessPattern {
        addr: vaddr(tmp, 0),
        dtype: DType::F32,
        shape: [1, 1, 1, 1 << 31],
        stride: [0, 0, 0, i32::MAX],
    };
    let ins = match engine {
        Engine::Dve => Op::Fill(op::Fill { out: huge, bits: 0 }),
        _ => Op::DmaCopy(op::DmaCopy {
            src: huge,
            dst: huge,
        }),
    };
    b.push(0, engine, Instruction::new(ins));
    b.build()
}

#[test]
fn d1_huge_stride_operand_is_out_of_bounds() {
    for (engine, op, operand) in [(Engine::Dve, "Fill", "out"), (Engine::Sp, "DmaCopy", "src")] {
        let e = err(&huge_stride_model(engine).encode());
        let ModelErrorKind::OperandOutOfBounds {
            instruction,
            opcode,
            operand: got_operand,
            lo,
            hi,
            size,
        } = e.kind
        else {
            panic!("{engine}: {e}");
        };
        assert_eq!((instruction, size, lo), (0, 64, 0), "{e}");
        assert_eq!(
            (nrt_isa::opcode_info(opcode).unwrap().0, got_operand),
            (op, operand),
            "{e}"
        );
        assert!(
            hi > i64::MAX as i128,
            "the exact extent, not a wrapped one: {e}"
        );
        assert!(e.field.ends_with(".offset"), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&format!("`{operand}`")), "{msg}");
    }
}

/// D7: `[2^31, 2^31, 4]` f32 is 2^66 bytes; the unchecked product wrapped to 0, matched a
/// 0-byte I/O entry, and the model loaded and "ran" with an empty output.
#[test]
fn d7_io_shape_whose_size_overflows_is_rejected() {
    let mut b = ModelBuilder::new("d7", 1);
    let y = b.output("y", DType::F32, &[1 << 31, 1 << 31, 4]);
    let yr = b.io_mem_ref(y);
    let mut m = b.build();
    m.mem_refs[yr as usize].size = 0; // what the wrapped product said
    let e = err(&m.encode());
    assert!(
        matches!(e.kind, ModelErrorKind::TensorTooLarge { ref shape, elem_size: 4 } if shape == &[1 << 31, 1 << 31, 4]),
        "{e}"
    );
    assert_eq!(e.field, "io[0].shape", "{e}");
    // One that does not overflow u64 but is beyond any device: 2^41 bytes.
    let mut b = ModelBuilder::new("d7", 1);
    b.output("y", DType::F32, &[1 << 20, 1 << 19]);
    let mut m = b.build();
    m.mem_refs[0].size = 1 << 40;
    let e = err(&m.encode());
    assert!(
        matches!(e.kind, ModelErrorKind::TensorTooLarge { .. }),
        "{e}"
    );
    // The accessors saturate instead of wrapping.
    let t = &m.io[0];
    assert_eq!(t.byte_size(), 1 << 41);
    let mut t = t.clone();
    t.shape = vec![1 << 31, 1 << 31, 4];
    assert_eq!((t.checked_elements(), t.elements()), (None, u64::MAX));
    assert_eq!(t.byte_size(), u64::MAX);
}

/// D8: the error path of a constants entry computed `offset + size` unchecked (a panic with
/// overflow checks on, a wrapped id in the message without).
#[test]
fn d8_constants_entry_past_u64_is_an_error_not_an_overflow() {
    let mut m = sample(1, 4, 1);
    let k = m
        .mem_refs
        .iter()
        .position(|r| r.kind == MemRefKind::Buffer)
        .unwrap();
    m.mem_refs[k].offset = u64::MAX - 3; // + 16 bytes overflows
    let e = err(&m.encode());
    assert!(
        matches!(e.kind, ModelErrorKind::OutOfRangeId { id: u64::MAX, .. }),
        "{e}"
    );
    assert_eq!(e.field, format!("plan[{k}].offset"), "{e}");
}

/// Every older minor version is read: a file written by version 1.0 (committed) decodes,
/// and re-encodes at the current minor.
#[test]
fn version_1_0_files_are_read() {
    let bytes = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v1_0_f16_mlp.ncm"),
    )
    .unwrap();
    assert_eq!(
        u16::from_le_bytes([bytes[6], bytes[7]]),
        0,
        "the fixture is a 1.0 file"
    );
    let m = CompiledModel::decode(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.io.len(), 2);
    assert!(m.io.iter().all(|t| t.dtype == DType::F16));
    let again = m.encode();
    assert_eq!(
        u16::from_le_bytes([again[6], again[7]]),
        nrt_model::VERSION_MINOR
    );
    assert_eq!(CompiledModel::decode(&again).unwrap(), m);
}

/// A file written by the 1.0 format (committed: `tests/data/v1_0_gemm_beta_relu.ncm`, the
/// `gemm_beta_relu` fusion pattern compiled before fused epilogues existed) still loads,
/// and its MatMuls decode with no epilogue.
#[test]
fn a_version_1_0_file_still_loads() {
    let bytes = include_bytes!("data/v1_0_gemm_beta_relu.ncm");
    assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 0, "a 1.0 file");
    let m = nrt_model::CompiledModel::decode(bytes).expect("1.0 loads");
    let pe = m.block(0, nrt_hal::Engine::Pe).expect("a PE block");
    let ops = nrt_isa::decode_block(&pe.code, nrt_hal::Engine::Pe).expect("decodes");
    let matmuls: Vec<_> = ops
        .iter()
        .filter_map(|(_, i)| match i.op {
            nrt_isa::Op::MatMul(op::MatMul { epilogue, .. }) => Some(epilogue),
            _ => None,
        })
        .collect();
    assert_eq!(matmuls.len(), 2);
    assert!(matmuls.iter().all(|e| e.is_none()));
    // Re-encoded, it is a file of this crate's version.
    let again = m.encode();
    assert_eq!(
        u16::from_le_bytes([again[6], again[7]]),
        nrt_model::VERSION_MINOR
    );
    assert_eq!(
        nrt_model::CompiledModel::decode(&again).expect("decodes"),
        m
    );
}

/// A file written by the 1.1 format (committed: `tests/data/v1_1_top_k.ncm`, the node test
/// `test_top_k` compiled with `k` = 3 before the 1.2 bump) still loads, its 1.1 `TopK`
/// instruction decodes, and it re-encodes at the current minor.
#[test]
fn a_version_1_1_file_still_loads() {
    let bytes = include_bytes!("data/v1_1_top_k.ncm");
    assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 1, "a 1.1 file");
    let m = nrt_model::CompiledModel::decode(bytes).expect("1.1 loads");
    let pool = m.block(0, nrt_hal::Engine::Pool).expect("a POOL block");
    let ops = nrt_isa::decode_block(&pool.code, nrt_hal::Engine::Pool).expect("decodes");
    assert!(
        ops.iter()
            .any(|(_, i)| matches!(i.op, nrt_isa::Op::TopK(_))),
        "the TopK instruction decodes"
    );
    let again = m.encode();
    assert_eq!(
        u16::from_le_bytes([again[6], again[7]]),
        nrt_model::VERSION_MINOR
    );
    assert_eq!(
        nrt_model::CompiledModel::decode(&again).expect("decodes"),
        m
    );
}

/// A file written by the 1.1 format (committed: `tests/data/v1_1_matmul_bias_relu.ncm`, a
/// 6×8 · 8×40 MatMul + bias + Relu compiled before packed weights existed) still loads: its
/// MatMul carries the fused epilogue and reads B as stored (`[K, N]`, no `PACKED_B`).
#[test]
fn a_version_1_1_matmul_reads_b_as_stored() {
    let bytes = include_bytes!("data/v1_1_matmul_bias_relu.ncm");
    assert_eq!(u16::from_le_bytes([bytes[6], bytes[7]]), 1, "a 1.1 file");
    let m = nrt_model::CompiledModel::decode(bytes).expect("1.1 loads");
    let pe = m.block(0, nrt_hal::Engine::Pe).expect("a PE block");
    let ops = nrt_isa::decode_block(&pe.code, nrt_hal::Engine::Pe).expect("decodes");
    let matmuls: Vec<_> = ops
        .iter()
        .filter_map(|(_, i)| match i.op {
            nrt_isa::Op::MatMul(op::MatMul {
                b, flags, epilogue, ..
            }) => Some((b, flags, epilogue)),
            _ => None,
        })
        .collect();
    assert_eq!(matmuls.len(), 1);
    let (b, flags, epilogue) = matmuls[0];
    assert_eq!(flags & nrt_isa::matmul_flags::PACKED_B, 0);
    assert_eq!(b.shape, [1, 1, 8, 40]);
    assert!(epilogue.bias.is_some() && epilogue.func == nrt_isa::ActFunc::Relu);
    let again = m.encode();
    assert_eq!(
        u16::from_le_bytes([again[6], again[7]]),
        nrt_model::VERSION_MINOR
    );
    assert_eq!(
        nrt_model::CompiledModel::decode(&again).expect("decodes"),
        m
    );
}

/// NCM 1.10: an in-place pair round-trips; one that names an output, another shape, an
/// index past the table, or an input already claimed is refused, naming the field.
#[test]
fn in_place_pairs_round_trip_and_bad_ones_are_refused() {
    let build = |f: &dyn Fn(&mut ModelBuilder, [u32; 4])| {
        let mut b = ModelBuilder::new("state", 1);
        let s = b.input("s", DType::F32, &[4]);
        let t = b.input("t", DType::F32, &[2]);
        let o = b.output("o", DType::F32, &[4]);
        let p = b.output("p", DType::F32, &[4]);
        f(&mut b, [s, t, o, p]);
        b.build()
    };
    let ok = build(&|b, [s, _, o, _]| {
        b.in_place(o, s);
    });
    let back = CompiledModel::decode(&ok.encode()).unwrap();
    assert_eq!(back.io[2].in_place_of, Some(0));
    assert_eq!(back.io, ok.io);
    let bad = |m: CompiledModel, why: &str| {
        let e = err(&m.encode());
        assert!(e.field.ends_with("in_place_of"), "{e}");
        assert!(e.to_string().contains(why), "{why}: {e}");
    };
    bad(
        build(&|b, [_, _, o, p]| {
            b.in_place(o, p);
        }),
        "must name an input",
    );
    bad(
        build(&|b, [s, t, _, _]| {
            b.in_place(t, s);
        }),
        "only an output",
    );
    bad(
        build(&|b, [_, t, o, _]| {
            b.in_place(o, t);
        }),
        "shape",
    );
    bad(
        build(&|b, [s, _, o, p]| {
            b.in_place(o, s);
            b.in_place(p, s);
        }),
        "same input",
    );
    bad(
        build(&|b, [_, _, o, _]| {
            b.in_place(o, 9);
        }),
        "",
    );
}
