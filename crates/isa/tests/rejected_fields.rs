//! Corrupt and hostile fields: decoding reports each with its instruction index, offset and
//! field name, and rejects reserved semaphores, bad windows, wrong layouts (`PACKED_B`), non
//! canonical encodings and bad operands of the newer instructions — never overflowing.

mod common;

use common::*;
use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::*;

#[test]
fn errors_name_index_offset_and_field() {
    let a = AccessPattern::dense(0x1000, DType::F32, &[2, 3]);
    let b = AccessPattern::dense(0x2000, DType::F32, &[4, 5]); // K mismatch: 3 vs 4
    let c = AccessPattern::dense(0x3000, DType::F32, &[2, 5]);
    let ok = Instruction::new(Op::Nop(op::Nop));
    let bad = Instruction::new(Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags: 0,
        epilogue: nrt_isa::Epilogue::NONE,
    }));
    let mut block = Vec::new();
    ok.encode(&mut block);
    let mut mm = Vec::new();
    bad.encode(&mut mm);
    block.extend_from_slice(&mm);
    Instruction::new(Op::End(op::End)).encode(&mut block);
    let e = decode_block(&block, Engine::Pe).unwrap_err();
    assert_eq!(e.index, 1);
    assert_eq!(e.block_offset, HEADER_SIZE);
    assert_eq!(e.field, "b.shape");
    assert_eq!(e.opcode, Some("MatMul"));
    let msg = e.to_string();
    assert!(
        msg.contains("instruction 1") && msg.contains("MatMul") && msg.contains("b.shape"),
        "{msg}"
    );
}

#[test]
fn engine_mismatch_missing_end_and_trailing_bytes() {
    let mm = Instruction::new(Op::Softmax(op::Softmax {
        input: AccessPattern::dense(0, DType::F32, &[4]),
        output: AccessPattern::dense(64, DType::F32, &[4]),
        log: false,
    }));
    let block = encode_block(&[mm]);
    let e = decode_block(&block, Engine::Pe).unwrap_err();
    assert_eq!(e.reason, Reason::WrongEngine(Engine::Pe));
    assert!(decode_block(&block, Engine::Pool).is_ok());

    let mut no_end = Vec::new();
    Instruction::new(Op::Nop(op::Nop)).encode(&mut no_end);
    assert_eq!(
        decode_block(&no_end, Engine::Sp).unwrap_err().reason,
        Reason::MissingEnd
    );

    let mut trailing = encode_block(&[]);
    trailing.extend_from_slice(&[0; 8]);
    assert_eq!(
        decode_block(&trailing, Engine::Sp).unwrap_err().reason,
        Reason::TrailingBytes(8)
    );
}

#[test]
fn reserved_semaphores_and_bad_fields_are_rejected() {
    let mut b = Vec::new();
    Instruction::new(Op::Nop(op::Nop))
        .wait(SemRef::local(0), 1)
        .encode(&mut b);
    let e = Instruction::decode(&b).unwrap_err();
    assert_eq!(e.field, "header.wait_sem");
    assert_eq!(e.reason, Reason::BadSemaphore(0));

    let mut b = Vec::new();
    Instruction::new(Op::Nop(op::Nop)).encode(&mut b);
    b[0] = 0xEE;
    assert_eq!(
        Instruction::decode(&b).unwrap_err().reason,
        Reason::UnknownOpcode(0xEE)
    );

    let mut b = Vec::new();
    Instruction::new(Op::Nop(op::Nop)).encode(&mut b);
    b[2] = 24;
    assert_eq!(Instruction::decode(&b).unwrap_err().field, "header.length");

    let ins = Instruction::new(Op::Activation(op::Activation {
        input: AccessPattern::dense(0, DType::F32, &[4]),
        output: AccessPattern::dense(64, DType::F32, &[4]),
        bias: None,
        func: ActFunc::Relu,
        scale: 1.0,
        alpha: 0.0,
        beta: 0.0,
    }));
    let mut b = Vec::new();
    ins.encode(&mut b);
    b[HEADER_SIZE + 3 * AP_SIZE] = 200; // func
    let e = Instruction::decode(&b).unwrap_err();
    assert_eq!(
        (e.field, e.reason, e.field_offset),
        ("func", Reason::BadEnum(200), HEADER_SIZE + 3 * AP_SIZE)
    );
    b[HEADER_SIZE + 3 * AP_SIZE] = ActFunc::Relu as u8;
    b[HEADER_SIZE + 8] = 0x0B; // input.dtype: not a dtype
    assert_eq!(Instruction::decode(&b).unwrap_err().field, "input");
}

#[test]
fn address_fields_cover_every_operand() {
    let a = AccessPattern::dense(0, DType::F32, &[2, 3]);
    let b = AccessPattern::dense(0, DType::F32, &[3, 4]);
    let c = AccessPattern::dense(0, DType::F32, &[2, 4]);
    let mut seen = Vec::new();
    Instruction::new(Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags: 0,
        epilogue: nrt_isa::Epilogue::NONE,
    }))
    .address_fields(|f| seen.push((f.name, f.offset, f.extent)));
    assert_eq!(
        seen,
        vec![("a", 16, (0, 24)), ("b", 64, (0, 48)), ("c", 112, (0, 32))]
    );
    // With an epilogue: its bias (a broadcast row) and residual are operands too.
    let bias = AccessPattern {
        shape: [1, 1, 2, 4],
        stride: [0, 0, 0, 1],
        ..AccessPattern::dense(0, DType::F32, &[4])
    };
    let mut seen = Vec::new();
    let ins = Instruction::new(Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags: 0,
        epilogue: nrt_isa::Epilogue {
            bias: Some(bias),
            residual: Some(c),
            func: ActFunc::Relu,
            ..nrt_isa::Epilogue::NONE
        },
    }));
    assert_eq!(ins.op.opcode(), nrt_isa::opcode::MATMUL_EPI);
    ins.address_fields(|f| seen.push((f.name, f.offset, f.extent)));
    assert_eq!(
        seen,
        vec![
            ("a", 16, (0, 24)),
            ("b", 64, (0, 48)),
            ("c", 112, (0, 32)),
            ("bias", 160, (0, 16)),
            ("residual", 208, (0, 32))
        ]
    );
    let mut bytes = Vec::new();
    ins.encode(&mut bytes);
    assert_eq!(Instruction::decode(&bytes).unwrap().0, ins);
    // A bias of another shape, an undefined epilogue flag, an empty epilogue: rejected,
    // naming the field.
    let mut bad = bytes.clone();
    bad[160 + 24..160 + 28].copy_from_slice(&3u32.to_le_bytes());
    assert_eq!(Instruction::decode(&bad).unwrap_err().field, "bias.shape");
    let flags_at = HEADER_SIZE + 5 * nrt_isa::AP_SIZE + 12;
    let mut bad = bytes.clone();
    bad[flags_at] |= 4;
    assert_eq!(
        Instruction::decode(&bad).unwrap_err().field,
        "epilogue.flags"
    );
    let mut empty = Vec::new();
    Instruction::new(Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags: 0,
        epilogue: nrt_isa::Epilogue::NONE,
    }))
    .encode(&mut empty);
    assert_eq!(
        empty[0],
        nrt_isa::opcode::MATMUL,
        "no epilogue: the 1.0 encoding"
    );
    let mut bad = bytes.clone();
    bad[flags_at] = 0;
    bad[160..256].fill(0);
    bad[flags_at - 4] = 0; // Identity
    assert_eq!(Instruction::decode(&bad).unwrap_err().field, "epilogue");
}

/// Found by the isa_decode fuzz target: a window whose dilation × (kernel − 1) overflowed i64.
#[test]
fn huge_window_fields_are_rejected_not_overflowed() {
    let w = Window {
        kernel: [0, 0],
        stride: [1, 1],
        pad: [0; 4],
        dilation: [u32::MAX, 1],
    };
    assert_eq!(w.out_dim(0, 10, u32::MAX), None);
    assert_eq!(w.out_dim(0, 10, 0), None);
    let w = Window {
        kernel: [0, 0],
        stride: [1, 1],
        pad: [u32::MAX; 4],
        dilation: [1, 1],
    };
    assert_eq!(
        w.out_dim(0, u32::MAX, 1),
        None,
        "more than u32::MAX outputs"
    );
    let crash = base64_decode(
        "AlEDoAAFAAYAAQAAAAEAAAAAAAAAAIAAAAoAAAAAAAAAAQAAABAAAAAgAAAAIAAAAABAAAAABAAAIAAAAAEAAAAAAAAAAAAAAAoAAAAAAAAAAQAAABAAAAAQAAAAEAAAAAAQAAAAAQAAEAAAAAEAAAAC/////wAAAAIAAAACAAAAAAAAAAAAAAAAAAAAAAAAAAD/////s4kAAAAAAAAAAAAgAAAAAA==",
    );
    let _ = decode_block(&crash[1..], Engine::Pool);
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= (val(c) as u32) << (18 - 6 * i);
        }
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// A MatMul of `a`, `b`, `c` with `flags`, encoded and decoded again.
fn matmul_round_trip(
    a: AccessPattern,
    b: AccessPattern,
    c: AccessPattern,
    flags: u32,
) -> Result<Instruction, DecodeError> {
    let mut bytes = Vec::new();
    Instruction::new(Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha: 1.0,
        flags,
        epilogue: nrt_isa::Epilogue::NONE,
    }))
    .encode(&mut bytes);
    Instruction::decode(&bytes).map(|(i, _)| i)
}

/// A `PACKED_B` MatMul (NCM 1.3): B's panels `[1, ceil(N/NR), K, NR]`, strides
/// `[_, K·NR, NR, 1]` (f32) or pairs of K (bf16), never transposed; anything else is
/// rejected naming the field.
#[test]
fn packed_b_layout_is_checked() {
    use nrt_isa::matmul_flags::{PACKED_B, TRANSPOSE_B};
    let (m, k, n) = (3u32, 5u32, 40u32);
    let a = AccessPattern::dense(0, DType::F32, &[m, k]);
    let c = AccessPattern::dense(4096, DType::F32, &[m, n]);
    let b = AccessPattern {
        addr: 8192,
        dtype: DType::F32,
        shape: [1, 2, k, 32],
        stride: [0, (k * 32) as i32, 32, 1],
    };
    let enc = |b: AccessPattern, flags: u32| matmul_round_trip(a, b, c, flags);
    assert!(enc(b, PACKED_B).is_ok());
    assert!(enc(b, PACKED_B | nrt_isa::matmul_flags::ACCUMULATE).is_ok());
    assert_eq!(enc(b, PACKED_B | TRANSPOSE_B).unwrap_err().field, "flags");
    let bad = [
        (
            AccessPattern {
                shape: [1, 2, k, 48],
                ..b
            },
            "b.shape",
        ),
        (
            AccessPattern {
                shape: [1, 3, k, 32],
                ..b
            },
            "b.shape",
        ),
        (
            AccessPattern {
                shape: [1, 2, k + 1, 32],
                ..b
            },
            "b.shape",
        ),
        (
            AccessPattern {
                shape: [2, 2, k, 32],
                ..b
            },
            "b.shape",
        ),
        (
            AccessPattern {
                stride: [0, 32, 32, 1],
                ..b
            },
            "b.stride",
        ),
        (
            AccessPattern {
                stride: [0, (k * 32) as i32, 33, 1],
                ..b
            },
            "b.stride",
        ),
        (
            AccessPattern {
                stride: [0, (k * 32) as i32, 32, 2],
                ..b
            },
            "b.stride",
        ),
        (
            AccessPattern {
                dtype: DType::F16,
                ..b
            },
            "b.dtype",
        ),
        // bf16 needs the pair layout.
        (
            AccessPattern {
                dtype: DType::Bf16,
                ..b
            },
            "b.shape",
        ),
        (
            AccessPattern {
                dtype: DType::Bf16,
                shape: [1, 2, 3, 64],
                stride: [0, 3 * 64, 32, 1],
                ..b
            },
            "b.stride",
        ),
    ];
    for (ap, field) in bad {
        assert_eq!(enc(ap, PACKED_B).unwrap_err().field, field, "{ap:?}");
    }
    // bf16 pairs of K: `[1, 2, ceil(5/2), 2·32]`, strides `[_, 3·64, 64, 1]`.
    let pairs = AccessPattern {
        dtype: DType::Bf16,
        shape: [1, 2, 3, 64],
        stride: [0, 3 * 64, 64, 1],
        ..b
    };
    assert!(enc(pairs, PACKED_B).is_ok());
    // Without the flag the same operand is an ordinary (and here mismatched) B.
    assert!(enc(b, 0).is_err());
}

/// A Conv's fused activation (NCM 1.5): `CONV_ACT` round-trips, `Identity` must be plain
/// `CONV` (a `CONV_ACT` saying Identity is rejected, naming `act.func`), reserved bytes are
/// checked, and a Conv without activation still encodes as `CONV`, byte for byte as in 1.0.
#[test]
fn conv_activation_is_its_own_opcode_and_canonical() {
    let conv = |act: (ActFunc, f32, f32)| {
        Instruction::new(Op::Conv(op::Conv {
            input: AccessPattern::dense(0, DType::F32, &[1, 2, 5, 5]),
            weight: AccessPattern::dense(4096, DType::F32, &[3, 2, 3, 3]),
            output: AccessPattern::dense(8192, DType::F32, &[1, 3, 3, 3]),
            bias: None,
            workspace: None,
            window: Window {
                kernel: [0, 0],
                stride: [1, 1],
                pad: [0; 4],
                dilation: [1, 1],
            },
            groups: 1,
            act,
        }))
    };
    let mut plain = Vec::new();
    conv((ActFunc::Identity, 0.0, 0.0)).encode(&mut plain);
    assert_eq!(plain[0], opcode::CONV);
    assert_eq!(plain.len(), HEADER_SIZE + 5 * 48 + 48);
    let relu = conv((ActFunc::LeakyRelu, 0.25, 0.0));
    let mut b = Vec::new();
    relu.encode(&mut b);
    assert_eq!(b[0], opcode::CONV_ACT);
    assert_eq!(b.len(), HEADER_SIZE + 5 * 48 + 64);
    assert_eq!(Instruction::decode(&b).unwrap().0, relu);
    let func_at = HEADER_SIZE + 5 * 48 + 48;
    let mut bad = b.clone();
    bad[func_at] = ActFunc::Identity as u8;
    assert_eq!(Instruction::decode(&bad).unwrap_err().field, "act.func");
    let mut bad = b.clone();
    bad[func_at + 1] = 1;
    assert_eq!(Instruction::decode(&bad).unwrap_err().field, "reserved");
    let mut bad = b;
    bad[func_at + 12] = 1;
    assert_eq!(Instruction::decode(&bad).unwrap_err().field, "reserved");
}

/// A Guard's condition is one bool/u8 element; a lifted guard has no operand and no
/// polarity (the encoding is canonical).
#[test]
fn guard_condition_is_one_byte_element_and_lifted_guard_is_canonical() {
    let enc = |op: Op| {
        let mut b = Vec::new();
        Instruction::new(op).encode(&mut b);
        b
    };
    let ok = Op::Guard(op::Guard {
        cond: Some(AccessPattern::dense(64, DType::Bool, &[1])),
        when: true,
    });
    assert_eq!(Instruction::decode(&enc(ok)).unwrap().0.op, ok);
    let two = enc(Op::Guard(op::Guard {
        cond: Some(AccessPattern::dense(64, DType::Bool, &[2])),
        when: true,
    }));
    assert_eq!(Instruction::decode(&two).unwrap_err().field, "cond.shape");
    let wide = enc(Op::Guard(op::Guard {
        cond: Some(AccessPattern::dense(64, DType::F32, &[1])),
        when: true,
    }));
    assert_eq!(Instruction::decode(&wide).unwrap_err().field, "cond.dtype");
    let mut lifted_when = enc(Op::Guard(op::Guard {
        cond: None,
        when: false,
    }));
    lifted_when[HEADER_SIZE + AP_SIZE] = 2;
    assert_eq!(
        Instruction::decode(&lifted_when).unwrap_err().field,
        "flags"
    );
    let mut lifted_operand = enc(Op::Guard(op::Guard {
        cond: None,
        when: false,
    }));
    lifted_operand[HEADER_SIZE] = 1;
    assert_eq!(
        Instruction::decode(&lifted_operand).unwrap_err().reason,
        Reason::ReservedNonZero
    );
    // Every engine runs it.
    for e in Engine::ALL {
        assert!(ok.runs_on(e));
    }
}

#[test]
fn dynamic_quantize_operands_are_checked() {
    let enc = |op: Op| {
        let mut b = Vec::new();
        Instruction::new(op).encode(&mut b);
        b
    };
    let ok = Op::DynamicQuantize(op::DynamicQuantize {
        input: AccessPattern::dense(64, DType::F32, &[2, 3]),
        output: AccessPattern::dense(128, DType::U8, &[2, 3]),
        scale: AccessPattern::dense(192, DType::F32, &[1]),
        zero_point: AccessPattern::dense(200, DType::U8, &[1]),
    });
    assert_eq!(Instruction::decode(&enc(ok)).unwrap().0.op, ok);
    assert!(ok.runs_on(Engine::Pool) && !ok.runs_on(Engine::Dve));
    let Op::DynamicQuantize(op::DynamicQuantize {
        input,
        output,
        scale,
        zero_point,
    }) = ok
    else {
        unreachable!()
    };
    let with = |input, output, scale, zero_point| {
        let e = Instruction::decode(&enc(Op::DynamicQuantize(op::DynamicQuantize {
            input,
            output,
            scale,
            zero_point,
        })))
        .unwrap_err();
        (e.field, e.field_offset)
    };
    let i8_out = AccessPattern {
        dtype: DType::I8,
        ..output
    };
    assert_eq!(
        with(input, i8_out, scale, zero_point),
        ("output.dtype", HEADER_SIZE + AP_SIZE + 8)
    );
    let f16_in = AccessPattern {
        dtype: DType::F16,
        ..input
    };
    assert_eq!(with(f16_in, output, scale, zero_point).0, "input.dtype");
    let short_out = AccessPattern::dense(128, DType::U8, &[2, 2]);
    assert_eq!(with(input, short_out, scale, zero_point).0, "output.shape");
    let two_scales = AccessPattern::dense(192, DType::F32, &[2]);
    assert_eq!(
        with(input, output, two_scales, zero_point),
        ("scale.shape", HEADER_SIZE + 2 * AP_SIZE + 16)
    );
    let i32_zero = AccessPattern::dense(200, DType::I32, &[1]);
    assert_eq!(with(input, output, scale, i32_zero).0, "zero_point.dtype");
    let mut reserved = enc(ok);
    let last = reserved.len() - 1;
    reserved[last] = 1;
    assert_eq!(
        Instruction::decode(&reserved).unwrap_err().reason,
        Reason::ReservedNonZero
    );
}

#[test]
fn rms_norm_operands_and_eps_are_checked() {
    let shape = [1, 2, 3, 64];
    let ap = |addr: u64, dtype: DType| ap_of(dtype, shape, addr);
    let good = op::RmsNorm {
        input: ap(0, DType::F32),
        gamma: AccessPattern {
            stride: [0, 0, 0, 1],
            ..ap(4096, DType::F32)
        },
        output: ap(8192, DType::F32),
        eps: 1e-5,
    };
    let bytes = |o: op::RmsNorm| {
        let mut v = Vec::new();
        Instruction::new(Op::RmsNorm(o)).encode(&mut v);
        v
    };
    let v = bytes(good);
    assert_eq!(v[0], nrt_isa::opcode::RMS_NORM);
    assert_eq!(v.len(), nrt_isa::HEADER_SIZE + 3 * nrt_isa::AP_SIZE + 8);
    let (back, _) = Instruction::decode(&v).unwrap();
    assert_eq!(back.op, Op::RmsNorm(good));
    assert!(back.op.runs_on(Engine::Pool) && !back.op.runs_on(Engine::Dve));
    let refused = |o: op::RmsNorm| Instruction::decode(&bytes(o)).unwrap_err().to_string();
    for eps in [f32::NAN, f32::INFINITY, -1e-5] {
        let e = refused(op::RmsNorm { eps, ..good });
        assert!(e.contains("eps"), "{e}");
    }
    let e = refused(op::RmsNorm {
        output: ap(8192, DType::I32),
        ..good
    });
    assert!(e.contains("output.dtype"), "{e}");
    let e = refused(op::RmsNorm {
        gamma: ap_of(DType::F32, [1, 2, 3, 63], 4096),
        ..good
    });
    assert!(e.contains("gamma.shape"), "{e}");
    let mut v = bytes(good);
    let last = v.len() - 1;
    v[last] = 1;
    let e = Instruction::decode(&v).unwrap_err().to_string();
    assert!(e.contains("reserved"), "{e}");
}

#[test]
fn sample_operands_are_checked() {
    let rows = [1, 1, 3, 1];
    let logits = ap_of(DType::F32, [1, 1, 3, 100], 0);
    let row = |dtype: DType, k: u64| ap_of(dtype, rows, 4096 + 256 * k);
    let good = op::Sample {
        logits,
        temperature: row(DType::F32, 0),
        top_k: row(DType::I64, 1),
        top_p: row(DType::F32, 2),
        seed: row(DType::I64, 3),
        step: row(DType::I64, 4),
        token: row(DType::I64, 5),
        logprob: row(DType::F32, 6),
    };
    let bytes = |o: op::Sample| {
        let mut v = Vec::new();
        Instruction::new(Op::Sample(o)).encode(&mut v);
        v
    };
    let v = bytes(good);
    assert_eq!(v[0], nrt_isa::opcode::SAMPLE);
    assert_eq!(v.len(), nrt_isa::HEADER_SIZE + 8 * nrt_isa::AP_SIZE + 8);
    let (back, _) = Instruction::decode(&v).unwrap();
    assert_eq!(back.op, Op::Sample(good));
    assert!(back.op.runs_on(Engine::Pool));
    let refused = |o: op::Sample| Instruction::decode(&bytes(o)).unwrap_err().to_string();
    let e = refused(op::Sample {
        logits: ap_of(DType::I64, [1, 1, 3, 100], 0),
        ..good
    });
    assert!(e.contains("logits.dtype"), "{e}");
    let e = refused(op::Sample {
        top_k: row(DType::F32, 1),
        ..good
    });
    assert!(e.contains("top_k.dtype"), "{e}");
    let e = refused(op::Sample {
        token: ap_of(DType::I64, [1, 1, 2, 1], 4096 + 256 * 5),
        ..good
    });
    assert!(e.contains("token.shape"), "{e}");
    let mut v = bytes(good);
    let last = v.len() - 1;
    v[last] = 1;
    let e = Instruction::decode(&v).unwrap_err().to_string();
    assert!(e.contains("reserved"), "{e}");
}

/// NCM 1.11: a block-quantized product and gather round-trip; a bad format, a K that is
/// not whole blocks, a row length other than K/32 blocks, rows closer than a row apart and
/// a wrong element type are each rejected, naming the field.
#[test]
fn block_quant_operands_are_checked() {
    let f = op::BlockFormat::Q4_1;
    let rb = f.row_bytes(64).unwrap(); // 2 blocks of 20 bytes
    assert_eq!(rb, 40);
    let good = op::MatMulBlockQuant {
        a: ap_of(DType::F32, [1, 1, 3, 64], 0),
        w: ap_of(DType::U8, [1, 1, 5, rb], 4096),
        c: ap_of(DType::F32, [1, 1, 3, 5], 8192),
        format: f,
    };
    let bytes = |o: op::MatMulBlockQuant| {
        let mut v = Vec::new();
        Instruction::new(Op::MatMulBlockQuant(o)).encode(&mut v);
        v
    };
    let v = bytes(good);
    assert_eq!(v[0], nrt_isa::opcode::MATMUL_BLOCK_QUANT);
    assert_eq!(v.len(), nrt_isa::HEADER_SIZE + 3 * nrt_isa::AP_SIZE + 8);
    let (back, _) = Instruction::decode(&v).unwrap();
    assert_eq!(back.op, Op::MatMulBlockQuant(good));
    assert!(back.op.runs_on(Engine::Pe));
    let refused = |o: op::MatMulBlockQuant| Instruction::decode(&bytes(o)).unwrap_err().to_string();
    let e = refused(op::MatMulBlockQuant {
        format: op::BlockFormat::Q8_0,
        ..good
    });
    assert!(e.contains("w.shape"), "{e}");
    let e = refused(op::MatMulBlockQuant {
        a: ap_of(DType::F32, [1, 1, 3, 48], 0),
        ..good
    });
    assert!(e.contains("w.shape"), "{e}");
    let e = refused(op::MatMulBlockQuant {
        c: ap_of(DType::F32, [1, 1, 3, 4], 8192),
        ..good
    });
    assert!(e.contains("c.shape"), "{e}");
    let e = refused(op::MatMulBlockQuant {
        w: ap_of(DType::I8, [1, 1, 5, rb], 4096),
        ..good
    });
    assert!(e.contains("w.dtype"), "{e}");
    let mut close = good;
    close.w.stride[2] = rb as i32 - 1;
    assert!(refused(close).contains("w.stride"));
    let mut v = bytes(good);
    let at = nrt_isa::HEADER_SIZE + 3 * nrt_isa::AP_SIZE;
    v[at] = 7; // not a ggml block type the device reads
    let e = Instruction::decode(&v).unwrap_err().to_string();
    assert!(e.contains("format"), "{e}");
    let mut v = bytes(good);
    v[at + 1] = 1;
    let e = Instruction::decode(&v).unwrap_err().to_string();
    assert!(e.contains("reserved"), "{e}");

    // Interleaved rows: a multiple of 8, exactly a row length apart.
    let x8 = op::MatMulBlockQuant {
        w: ap_of(DType::U8, [1, 1, 16, rb], 4096),
        c: ap_of(DType::F32, [1, 1, 3, 16], 8192),
        format: op::BlockFormat::Q4_1x8,
        ..good
    };
    assert_eq!(
        Instruction::decode(&bytes(x8)).unwrap().0.op,
        Op::MatMulBlockQuant(x8)
    );
    let e = refused(op::MatMulBlockQuant {
        format: op::BlockFormat::Q4_1x8,
        ..good
    });
    assert!(e.contains("w.shape"), "{e}");
    let mut wide = x8;
    wide.w.stride[2] = rb as i32 + 4;
    assert!(refused(wide).contains("w.stride"));

    let gather = op::GatherBlockQuant {
        table: ap_of(DType::U8, [1, 1, 100, rb], 0),
        indices: ap_of(DType::I64, [1, 1, 4, 1], 8192),
        output: ap_of(DType::F32, [1, 1, 4, 64], 16384),
        format: f,
    };
    let gbytes = |o: op::GatherBlockQuant| {
        let mut v = Vec::new();
        Instruction::new(Op::GatherBlockQuant(o)).encode(&mut v);
        v
    };
    let v = gbytes(gather);
    assert_eq!(v[0], nrt_isa::opcode::GATHER_BLOCK_QUANT);
    let (back, _) = Instruction::decode(&v).unwrap();
    assert_eq!(back.op, Op::GatherBlockQuant(gather));
    assert!(back.op.runs_on(Engine::Pool));
    let grefused =
        |o: op::GatherBlockQuant| Instruction::decode(&gbytes(o)).unwrap_err().to_string();
    let e = grefused(op::GatherBlockQuant {
        indices: ap_of(DType::I64, [1, 1, 3, 1], 8192),
        ..gather
    });
    assert!(e.contains("indices.shape"), "{e}");
    let e = grefused(op::GatherBlockQuant {
        indices: ap_of(DType::I32, [1, 1, 4, 1], 8192),
        ..gather
    });
    assert!(e.contains("indices.dtype"), "{e}");
    let e = grefused(op::GatherBlockQuant {
        output: ap_of(DType::F32, [1, 1, 4, 96], 16384),
        ..gather
    });
    assert!(e.contains("table.shape"), "{e}");
}

/// NCM 1.12: cached attention round-trips; wrong element types, caches that disagree, slots
/// or positions of the wrong shape, a strided head dimension, a group of 0 or one that maps
/// a head past the KV heads, a NaN scale and reserved bytes are each rejected, naming the
/// field.
#[test]
fn cached_attention_operands_are_checked() {
    let good = op::CachedAttention {
        q: ap_of(DType::F32, [2, 1, 9, 64], 0),
        k: ap_of(DType::F32, [3, 16, 3, 64], 8192),
        v: ap_of(DType::F32, [3, 16, 3, 64], 65536),
        slots: ap_of(DType::I64, [1, 1, 1, 2], 131072),
        positions: ap_of(DType::I64, [1, 1, 2, 1], 131072 + 64),
        out: ap_of(DType::F32, [2, 1, 9, 64], 140000),
        scale: 0.125,
        group: 3,
        first_head: 0,
    };
    let bytes = |o: op::CachedAttention| {
        let mut v = Vec::new();
        Instruction::new(Op::CachedAttention(o)).encode(&mut v);
        v
    };
    let v = bytes(good);
    assert_eq!(v[0], nrt_isa::opcode::CACHED_ATTENTION);
    assert_eq!(v.len(), nrt_isa::HEADER_SIZE + 6 * nrt_isa::AP_SIZE + 16);
    let (back, _) = Instruction::decode(&v).unwrap();
    assert_eq!(back.op, Op::CachedAttention(good));
    assert!(back.op.runs_on(Engine::Pe));
    let refused = |o: op::CachedAttention| Instruction::decode(&bytes(o)).unwrap_err().to_string();
    let cases: Vec<(op::CachedAttention, &str)> = vec![
        (
            op::CachedAttention {
                k: ap_of(DType::I32, [3, 16, 3, 64], 8192),
                ..good
            },
            "k.dtype",
        ),
        (
            op::CachedAttention {
                v: ap_of(DType::F32, [3, 15, 3, 64], 65536),
                ..good
            },
            "v.shape",
        ),
        (
            op::CachedAttention {
                k: ap_of(DType::F32, [3, 16, 3, 32], 8192),
                v: ap_of(DType::F32, [3, 16, 3, 32], 65536),
                ..good
            },
            "k.shape",
        ),
        (
            op::CachedAttention {
                slots: ap_of(DType::I64, [1, 1, 1, 3], 131072),
                ..good
            },
            "slots.shape",
        ),
        (
            op::CachedAttention {
                positions: ap_of(DType::F32, [1, 1, 2, 1], 131072 + 64),
                ..good
            },
            "positions.dtype",
        ),
        (
            op::CachedAttention {
                out: ap_of(DType::F32, [2, 1, 8, 64], 140000),
                ..good
            },
            "out.shape",
        ),
        (op::CachedAttention { group: 0, ..good }, "group"),
        (op::CachedAttention { group: 2, ..good }, "group"),
        (
            op::CachedAttention {
                first_head: 1,
                ..good
            },
            "group",
        ),
    ];
    for (o, field) in cases {
        let e = refused(o);
        assert!(e.contains(field), "{field}: {e}");
    }
    let mut strided = good;
    strided.k.stride[3] = 2;
    assert!(refused(strided).contains("k.stride"));
    let at = nrt_isa::HEADER_SIZE + 6 * nrt_isa::AP_SIZE;
    let mut v = bytes(good);
    v[at..at + 4].copy_from_slice(&f32::NAN.to_bits().to_le_bytes());
    let e = Instruction::decode(&v).unwrap_err().to_string();
    assert!(e.contains("scale"), "{e}");
    let mut v = bytes(good);
    let last = v.len() - 1;
    v[last] = 1;
    let e = Instruction::decode(&v).unwrap_err().to_string();
    assert!(e.contains("reserved"), "{e}");
}

/// `F32_A` (NCM 1.13): A's f32 values multiply a bf16 B unrounded — only with an unpacked
/// bf16 B; with an f32, f16 or packed B the flag is rejected, naming `flags`.
#[test]
fn f32_a_needs_an_unpacked_bf16_b() {
    use nrt_isa::matmul_flags::{F32_A, PACKED_B, TRANSPOSE_B};
    let (m, k, n) = (3u32, 64u32, 32u32);
    let a = AccessPattern::dense(0, DType::F32, &[m, k]);
    let c = AccessPattern::dense(4096, DType::F32, &[m, n]);
    let enc = |b: AccessPattern, flags: u32| matmul_round_trip(a, b, c, flags);
    let nk = |dtype| AccessPattern::dense(8192, dtype, &[n, k]);
    assert!(enc(nk(DType::Bf16), TRANSPOSE_B | F32_A).is_ok());
    assert!(enc(nk(DType::Bf16), TRANSPOSE_B).is_ok());
    for d in [DType::F32, DType::F16] {
        assert_eq!(
            enc(nk(d), TRANSPOSE_B | F32_A).unwrap_err().field,
            "flags",
            "{d}"
        );
    }
    let pairs = AccessPattern {
        addr: 8192,
        dtype: DType::Bf16,
        shape: [1, 1, k / 2, 64],
        stride: [0, (k / 2 * 64) as i32, 64, 1],
    };
    assert!(enc(pairs, PACKED_B).is_ok());
    assert_eq!(enc(pairs, PACKED_B | F32_A).unwrap_err().field, "flags");
}
