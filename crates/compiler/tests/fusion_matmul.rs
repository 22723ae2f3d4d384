//! MatMul lowering: bias, residual and activation fused into the epilogue, half-precision
//! weights, constant weights packed in panels (and split between cores on their boundaries).

mod common;

use common::fusion::*;
use common::*;
use nrt_compiler::check::check_ordering;
use nrt_compiler::onnx::data_type as dt;
use nrt_compiler::{CompileOptions, Compiled, compile};
use nrt_hal::Engine;
use nrt_isa::op;
use nrt_isa::{ActFunc, Epilogue, Op, decode_block};

#[test]
fn gemm_bias_and_relu_are_the_matmul_epilogue() {
    let m = model(
        vec![
            node(
                "Gemm",
                &["X", "W", "b"],
                &["g"],
                vec![a_i("transB", 1), a_f("beta", 0.5)],
            ),
            node("Relu", &["g"], &["r"], vec![]),
            node("Gemm", &["r", "W2", "b2"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[6, 4], ramp(24, 0.1)),
            f32_init("b", &[6], ramp(6, 0.1)),
            f32_init("W2", &[6, 3], ramp(18, 0.1)),
            f32_init("b2", &[3], ramp(3, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[5, 4])],
        vec![vi("Y", dt::FLOAT, &[5, 3])],
        13,
    );
    let c = ok(&m);
    assert!(ops(&c, Engine::Act).is_empty());
    assert!(
        ops(&c, Engine::Dve).is_empty(),
        "no copy of C, no scaling pass"
    );
    let pe = ops(&c, Engine::Pe);
    assert_eq!(pe.len(), 2);
    let epis: Vec<Epilogue> = pe
        .iter()
        .map(|o| match o {
            Op::MatMul(op::MatMul { epilogue, .. }) => *epilogue,
            _ => panic!("{o:?}"),
        })
        .collect();
    // The first Gemm: its (beta-scaled) C and the Relu; the second: its C alone.
    assert_eq!(epis[0].func, ActFunc::Relu);
    assert!(epis[0].bias.is_some() && epis[0].residual.is_none());
    assert_eq!(epis[1].func, ActFunc::Identity);
    assert!(epis[1].bias.is_some() && epis[1].residual.is_none());
    let bias = epis[0].bias.expect("bias");
    assert_eq!(
        bias.stride,
        [0, 0, 0, 1],
        "one value per column, broadcast over rows"
    );
}

/// Every MatMul epilogue of `c`'s PE block on core 0, in order.
fn epilogues(c: &Compiled) -> Vec<Epilogue> {
    ops(c, Engine::Pe)
        .iter()
        .filter_map(|o| match o {
            Op::MatMul(op::MatMul { epilogue, .. }) => Some(*epilogue),
            _ => None,
        })
        .collect()
}

#[test]
fn mlp_layers_are_one_matmul_each_with_bias_and_relu_fused() {
    let c = ok(&mlp(64, 32, 4));
    let e = epilogues(&c);
    assert_eq!(e.len(), 4);
    for x in &e {
        assert_eq!(x.func, ActFunc::Relu);
        assert_eq!(x.bias.expect("bias").stride, [0, 0, 0, 1]);
        assert!(x.residual.is_none());
    }
    assert!(
        ops(&c, Engine::Act).is_empty(),
        "no separate activation pass"
    );
    assert!(ops(&c, Engine::Dve).is_empty());
    // Two cores: each core's MatMul carries its half of the bias.
    let two = compile(
        &mlp(64, 32, 4),
        None,
        &CompileOptions {
            cores: 2,
            ..Default::default()
        },
    )
    .unwrap();
    for core in 0..2 {
        let b = two.model.block(core, Engine::Pe).expect("block");
        let pe: Vec<Op> = decode_block(&b.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .map(|(_, i)| i.op)
            .filter(|o| matches!(o, Op::MatMul(_)))
            .collect();
        assert_eq!(pe.len(), 4, "core {core}");
        for o in pe {
            let Op::MatMul(op::MatMul { c, epilogue, .. }) = o else {
                unreachable!()
            };
            let bias = epilogue.bias.expect("bias");
            assert_eq!(bias.shape, c.shape);
            assert_eq!(c.shape[3], 16, "half of N");
        }
    }
}

#[test]
fn bias_then_residual_adds_fill_both_epilogue_operands() {
    let m = model(
        vec![
            node("MatMul", &["X", "W"], &["h"], vec![]),
            node("Add", &["h", "b"], &["hb"], vec![]),
            node("Add", &["X", "hb"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[16, 16], ramp(256, 0.01)),
            f32_init("b", &[16], ramp(16, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[2, 5, 16])],
        vec![vi("Y", dt::FLOAT, &[2, 5, 16])],
        17,
    );
    let c = ok(&m);
    let e = sole_epilogue(&c);
    assert_eq!(e.func, ActFunc::Identity);
    assert_eq!(e.bias.expect("bias").stride[2..], [0, 1]);
    assert_eq!(e.residual.expect("residual").stride[2..], [16, 1]);
    assert!(ops(&c, Engine::Dve).is_empty() && ops(&c, Engine::Act).is_empty());
}

#[test]
fn adds_that_cannot_fuse_stay_separate() {
    // The residual is computed after the MatMul in node order; the MatMul's result is a graph
    // output: neither fuses.
    let late = model(
        vec![
            node("MatMul", &["X", "W"], &["h"], vec![]),
            node("Abs", &["Z"], &["R"], vec![]),
            node("Add", &["h", "R"], &["Y"], vec![]),
        ],
        vec![f32_init("W", &[6, 3], ramp(18, 0.1))],
        vec![vi("X", dt::FLOAT, &[4, 6]), vi("Z", dt::FLOAT, &[4, 3])],
        vec![vi("Y", dt::FLOAT, &[4, 3])],
        17,
    );
    assert!(sole_epilogue(&ok(&late)).is_none());
    let shown = model(
        vec![
            node("MatMul", &["X", "W"], &["H"], vec![]),
            node("Add", &["H", "b"], &["a"], vec![]),
            node("Relu", &["a"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[6, 3], ramp(18, 0.1)),
            f32_init("b", &[3], ramp(3, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[4, 6])],
        vec![vi("H", dt::FLOAT, &[4, 3]), vi("Y", dt::FLOAT, &[4, 3])],
        17,
    );
    let c = ok(&shown);
    assert!(sole_epilogue(&c).is_none());
    assert_eq!(acts(&c), vec![ActFunc::Relu]);
}

#[test]
fn auto_cast_stores_matmul_and_gemm_weights_in_half_precision() {
    use nrt_compiler::{AutoCast, CastType};
    use nrt_hal::DType;
    let gemm = model(
        vec![
            node("Gemm", &["X", "W", "b"], &["g"], vec![a_i("transB", 1)]),
            node("Relu", &["g"], &["Y"], vec![]),
        ],
        vec![
            f32_init("W", &[6, 4], ramp(24, 0.1)),
            f32_init("b", &[6], ramp(6, 0.1)),
        ],
        vec![vi("X", dt::FLOAT, &[5, 4])],
        vec![vi("Y", dt::FLOAT, &[5, 6])],
        13,
    );
    for (bytes, want_mm) in [(mlp(4, 64, 3), 3), (gemm, 1)] {
        let plain = ok(&bytes);
        for (ty, d) in [(CastType::Bf16, DType::Bf16), (CastType::Fp16, DType::F16)] {
            for cores in [1, 2] {
                let o = CompileOptions {
                    auto_cast: AutoCast::MatMult,
                    auto_cast_type: ty,
                    cores,
                    ..Default::default()
                };
                let c = compile(&bytes, None, &o).unwrap();
                check_ordering(&c.model).unwrap();
                assert!(
                    c.model
                        .producer
                        .ends_with(&format!("auto-cast matmult {d}"))
                );
                let pe = ops(&c, Engine::Pe);
                let mms: Vec<_> = pe
                    .iter()
                    .filter_map(|o| match o {
                        Op::MatMul(op::MatMul { b, epilogue, .. }) => Some((*b, *epilogue)),
                        _ => None,
                    })
                    .collect();
                assert_eq!(mms.len(), want_mm);
                for (b, e) in mms {
                    assert_eq!(b.dtype, d);
                    // Read K-contiguous (stored [N, K]): MatMul's [K, N] view has stride 1
                    // along K, Gemm's transB view is [N, K] itself.
                    assert!(b.stride[2] == 1 || b.stride[3] == 1, "{b:?}");
                    assert_eq!(e.func, ActFunc::Relu, "the epilogue still fuses");
                }
                if cores == 1 {
                    assert!(
                        c.model.constants.len() * 10 < plain.model.constants.len() * 7,
                        "{} vs {} constant bytes",
                        c.model.constants.len(),
                        plain.model.constants.len()
                    );
                }
            }
        }
    }
}

/// Constant MatMul weights of products with K ≥ 128 (f32; bf16 any K and N ≥ 32) are stored
/// packed in panels of 32 columns (`PACKED_B`); two cores split N on a panel boundary, each reading its own
/// panels of the one packed constant. Four rows or fewer (the GEMV kernels) keep B as stored.
#[test]
fn constant_weights_are_packed_in_panels_and_split_on_panel_boundaries() {
    use nrt_isa::matmul_flags::PACKED_B;
    let matmuls = |c: &Compiled, core: u8| -> Vec<Op> {
        let b = c.model.block(core, Engine::Pe).expect("block");
        decode_block(&b.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .map(|(_, i)| i.op)
            .filter(|o| matches!(o, Op::MatMul(_)))
            .collect()
    };
    let one = ok(&mlp(8, 200, 1));
    let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&one, 0)[..] else {
        panic!("one MatMul")
    };
    assert_ne!(flags & PACKED_B, 0);
    assert_eq!(b.shape, [1, 7, 200, 32]);
    assert_eq!(b.stride, [0, 6400, 32, 1]);
    let two = compile(
        &mlp(8, 200, 1),
        None,
        &CompileOptions {
            cores: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut seen = Vec::new();
    for core in 0..2 {
        let [Op::MatMul(op::MatMul { b, c, flags, .. })] = matmuls(&two, core)[..] else {
            panic!("one MatMul per core")
        };
        assert_ne!(flags & PACKED_B, 0);
        // B's address: the relocation of its field (16-byte header, then A's 48 bytes).
        let blk = two.model.block(core, Engine::Pe).unwrap();
        let (at, _) = decode_block(&blk.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .find(|(_, i)| matches!(i.op, Op::MatMul(_)))
            .unwrap();
        let r = blk
            .relocations
            .iter()
            .find(|r| r.patch_offset as usize == at + 64)
            .expect("B is relocated");
        seen.push(((r.mem_ref, r.offset), b.shape, c.shape));
    }
    // Columns 0..128 (four panels) and 128..200 (three panels, the last one padded).
    assert_eq!(seen[0].1, [1, 4, 200, 32]);
    assert_eq!(seen[1].1, [1, 3, 200, 32]);
    assert_eq!(seen[0].2[3], 128);
    assert_eq!(seen[1].2[3], 72);
    assert_eq!(seen[0].0.0, seen[1].0.0, "one packed constant");
    assert_eq!(seen[1].0.1 - seen[0].0.1, 128 * 200 * 4);
    // bf16 auto-cast: the same panels with pairs of K (`[1, 7, 100, 64]`), split the same
    // way; fp16 weights stay `[N, K]`.
    for (ty, packed) in [
        (nrt_compiler::CastType::Bf16, true),
        (nrt_compiler::CastType::Fp16, false),
    ] {
        for cores in [1u32, 2] {
            let o = CompileOptions {
                auto_cast: nrt_compiler::AutoCast::MatMult,
                auto_cast_type: ty,
                cores,
                ..Default::default()
            };
            let c = compile(&mlp(8, 200, 1), None, &o).unwrap();
            check_ordering(&c.model).unwrap();
            for core in 0..cores as u8 {
                let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&c, core)[..] else {
                    panic!("one MatMul")
                };
                assert_eq!(flags & PACKED_B != 0, packed, "{ty:?}");
                if packed {
                    assert_eq!(b.dtype, nrt_hal::DType::Bf16);
                    let panels = [7, 4, 3][(cores - 1 + core as u32) as usize];
                    assert_eq!(b.shape, [1, panels, 100, 64]);
                    assert_eq!(b.stride, [0, 6400, 64, 1]);
                }
            }
        }
    }
    // Four rows, one row: packed too (the packed GEMV streams whole panels), f32 and bf16.
    for rows in [4, 1] {
        let small = ok(&mlp(rows, 200, 1));
        let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&small, 0)[..] else {
            panic!("one MatMul")
        };
        assert_ne!(flags & PACKED_B, 0);
        assert_eq!(b.shape, [1, 7, 200, 32]);
        let o = CompileOptions {
            auto_cast: nrt_compiler::AutoCast::MatMult,
            auto_cast_type: nrt_compiler::CastType::Bf16,
            ..Default::default()
        };
        let small = compile(&mlp(rows, 200, 1), None, &o).unwrap();
        let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&small, 0)[..] else {
            panic!("one MatMul")
        };
        assert_ne!(flags & PACKED_B, 0);
        assert_eq!(b.shape, [1, 7, 100, 64]);
    }
    // Short K (the GEMM crate is faster there): as stored in f32; bf16 packed whatever K
    // (its dot-product kernel loses at every K), unless N is under a whole panel
    // (`GEMM_PACK_BF16_MIN_N`: a 32-column panel of 16–31 columns is mostly padding).
    let short = ok(&mlp(8, 100, 1));
    let [Op::MatMul(op::MatMul { flags, .. })] = matmuls(&short, 0)[..] else {
        panic!("one MatMul")
    };
    assert_eq!(flags & PACKED_B, 0);
    let bf16 = CompileOptions {
        auto_cast: nrt_compiler::AutoCast::MatMult,
        auto_cast_type: nrt_compiler::CastType::Bf16,
        ..Default::default()
    };
    for (width, shape) in [
        (100, Some([1, 4, 50, 64])),
        (24, None),
        (32, Some([1, 1, 16, 64])),
    ] {
        let c = compile(&mlp(8, width, 1), None, &bf16).unwrap();
        let [Op::MatMul(op::MatMul { b, flags, .. })] = matmuls(&c, 0)[..] else {
            panic!("one MatMul")
        };
        assert_eq!(
            flags & PACKED_B != 0,
            shape.is_some(),
            "bf16, width {width}"
        );
        if let Some(shape) = shape {
            assert_eq!(b.shape, shape, "bf16, width {width}");
        }
    }
}

/// A recurrent layer's constant weights are packed in panels per direction like a MatMul's
/// (`Lowerer::pack_weight_at`): W[d] (K = input) and R[d] (K = hidden) once each at K ≥ 128,
/// except GRU's R, whose gates multiply parts of it; bf16 auto-cast packs them at any K.
/// (`lstm_bidirectional_packed` and its kin in the numerics check the values.)
#[test]
fn recurrent_weights_are_packed_per_direction() {
    use nrt_isa::matmul_flags::PACKED_B;
    let rnn = |op: &str, gates: i64, input: i64, hidden: i64| {
        model(
            vec![node(
                op,
                &["X", "W", "R"],
                &["Y"],
                vec![
                    a_i("hidden_size", hidden),
                    a_s("direction", "bidirectional"),
                ],
            )],
            vec![
                f32_init(
                    "W",
                    &[2, gates * hidden, input],
                    ramp((2 * gates * hidden * input) as usize, 0.001),
                ),
                f32_init(
                    "R",
                    &[2, gates * hidden, hidden],
                    ramp((2 * gates * hidden * hidden) as usize, 0.001),
                ),
            ],
            vec![vi("X", dt::FLOAT, &[3, 2, input])],
            vec![vi("Y", dt::FLOAT, &[3, 2, 2, hidden])],
            14,
        )
    };
    let packed = |c: &Compiled| -> (usize, usize) {
        let b = c.model.block(0, Engine::Pe).expect("block");
        let mms: Vec<u32> = decode_block(&b.code, Engine::Pe)
            .unwrap()
            .into_iter()
            .filter_map(|(_, i)| match i.op {
                Op::MatMul(op::MatMul { flags, .. }) => Some(flags),
                _ => None,
            })
            .collect();
        (
            mms.iter().filter(|&&f| f & PACKED_B != 0).count(),
            mms.len(),
        )
    };
    // LSTM, 3 steps, 2 directions: per direction one input product and 3 recurrent ones.
    assert_eq!(packed(&ok(&rnn("LSTM", 4, 128, 128))), (8, 8));
    // Hidden 32: R's K is short (f32 keeps it as stored), W's is not.
    assert_eq!(packed(&ok(&rnn("LSTM", 4, 128, 32))), (2, 8));
    let bf16 = CompileOptions {
        auto_cast: nrt_compiler::AutoCast::MatMult,
        auto_cast_type: nrt_compiler::CastType::Bf16,
        ..Default::default()
    };
    let c = compile(&rnn("LSTM", 4, 128, 32), None, &bf16).unwrap();
    assert_eq!(packed(&c), (8, 8), "bf16 packs any K");
    // GRU: only W.
    let (p, all) = packed(&ok(&rnn("GRU", 3, 128, 128)));
    assert_eq!(p, 2, "GRU packs W[d] only ({all} MatMuls)");
}

/// A weight bound as a bf16 or f16 input and widened by a `Cast` only to be a MatMul's B
/// (`MatMul(X, Cast(Transpose(W)))`, how a decoder LLM's bf16 weights enter its programs):
/// the product reads the half values in place — no DVE copy widens them, B is the input's
/// own storage, K contiguous — on one core and split between two.
#[test]
fn a_half_weight_input_cast_for_a_matmul_is_read_in_place() {
    use nrt_hal::DType;
    for (elem, d) in [(dt::BFLOAT16, DType::Bf16), (dt::FLOAT16, DType::F16)] {
        let m = model(
            vec![
                node("Transpose", &["W"], &["wt"], vec![a_ints("perm", &[1, 0])]),
                node("Cast", &["wt"], &["w32"], vec![a_i("to", dt::FLOAT as i64)]),
                node("MatMul", &["X", "w32"], &["Y"], vec![]),
            ],
            vec![],
            vec![vi("X", dt::FLOAT, &[5, 64]), vi("W", elem, &[48, 64])],
            vec![vi("Y", dt::FLOAT, &[5, 48])],
            13,
        );
        for cores in [1u8, 2] {
            let o = CompileOptions {
                cores: u32::from(cores),
                ..Default::default()
            };
            let c = compile(&m, None, &o).unwrap();
            check_ordering(&c.model).unwrap();
            let mut columns = 0;
            for core in 0..cores {
                for e in [Engine::Dve, Engine::Pool, Engine::Act] {
                    let work: Vec<Op> = c.model.block(core, e).map_or(vec![], |b| {
                        decode_block(&b.code, e)
                            .unwrap()
                            .into_iter()
                            .map(|(_, i)| i.op)
                            .filter(|o| !matches!(o, Op::End(_) | Op::Nop(_)))
                            .collect()
                    });
                    assert!(
                        work.is_empty(),
                        "{d}, {cores} cores: nothing but the product on core {core}: {work:?}"
                    );
                }
                let pe = c.model.block(core, Engine::Pe).expect("a PE block");
                for (_, i) in decode_block(&pe.code, Engine::Pe).unwrap() {
                    let (b, flags) = match i.op {
                        Op::MatMul(op::MatMul { b, flags, .. }) => (b, flags),
                        Op::End(_) | Op::Nop(_) => continue,
                        o => panic!("{o:?}"),
                    };
                    assert_eq!(b.dtype, d);
                    // bf16: A's f32 values unrounded, as ONNX's MatMul of the Cast defines.
                    let f32_a = flags & nrt_isa::matmul_flags::F32_A != 0;
                    assert_eq!(f32_a, d == DType::Bf16, "{flags:#x}");
                    assert_eq!(b.stride[2], 1, "K contiguous: {b:?}");
                    columns += b.shape[3];
                }
            }
            assert_eq!(columns, 48, "{d}, {cores} cores: every column once");
        }
    }
}
