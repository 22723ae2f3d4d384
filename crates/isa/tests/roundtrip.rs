//! Property tests: every valid instruction encodes and decodes to itself; decoding arbitrary
//! bytes never panics; corrupting a field is reported with its name and offset.

use nrt_hal::{DType, Engine};
use nrt_isa::op;
use nrt_isa::*;
use proptest::prelude::*;

fn arb_dims() -> impl Strategy<Value = [u32; 4]> {
    prop::array::uniform4(1u32..6)
}

fn ap_of(dtype: DType, shape: [u32; 4], addr: u64) -> AccessPattern {
    AccessPattern {
        addr,
        dtype,
        shape,
        stride: dense_strides(&shape),
    }
}

fn arb_ap(dtype: DType, shape: [u32; 4]) -> impl Strategy<Value = AccessPattern> {
    (
        0u64..1 << 30,
        prop::array::uniform4(prop_oneof![Just(None), (0i32..4).prop_map(Some)]),
    )
        .prop_map(move |(addr, strides)| {
            let mut ap = ap_of(dtype, shape, addr * 4 + (1 << 20));
            for (d, s) in strides.iter().enumerate() {
                if let Some(s) = s {
                    ap.stride[d] = *s; // 0 = broadcast
                }
            }
            ap
        })
}

fn opt(
    present: bool,
    s: impl Strategy<Value = AccessPattern> + 'static,
) -> BoxedStrategy<Option<AccessPattern>> {
    if present {
        s.prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    }
}

fn arb_sem() -> impl Strategy<Value = SemRef> {
    prop_oneof![
        (4u16..256).prop_map(SemRef::local),
        (0u16..GLOBAL_SEMAPHORES).prop_map(SemRef::global)
    ]
}

fn arb_sync() -> impl Strategy<Value = Sync> {
    (
        prop::option::of((arb_sem(), any::<u32>())),
        prop::option::of((arb_sem(), any::<u32>())),
    )
        .prop_map(|(wait, signal)| Sync { wait, signal })
}

fn finite() -> impl Strategy<Value = f32> {
    -1e6f32..1e6
}

/// A valid instruction: [`arb_op_any`] with each written operand that repeats elements
/// (the generator's broadcast strides) made dense — the decoder refuses the others.
fn arb_op() -> impl Strategy<Value = Op> {
    arb_op_any().prop_map(|mut op| {
        op.operands_mut(|o| {
            if o.role.writes() && o.ap.repeats_elements() {
                o.ap.stride = dense_strides(&o.ap.shape);
            }
        });
        op
    })
}

fn arb_op_any() -> impl Strategy<Value = Op> {
    let f = DType::F32;
    prop_oneof![
        Just(Op::End(op::End)),
        Just(Op::Nop(op::Nop)),
        Just(Op::Guard(op::Guard {
            cond: None,
            when: false
        })),
        (
            prop_oneof![Just(DType::Bool), Just(DType::U8)]
                .prop_flat_map(|d| arb_ap(d, [1, 1, 1, 1])),
            any::<bool>()
        )
            .prop_map(|(c, when)| Op::Guard(op::Guard {
                cond: Some(c),
                when
            })),
        arb_dims()
            .prop_flat_map(move |s| (arb_ap(f, s), arb_ap(f, s)))
            .prop_map(|(src, dst)| Op::DmaCopy(op::DmaCopy { src, dst })),
        (any::<u64>(), 1u32..100)
            .prop_map(|(table, count)| Op::DmaDescriptors(op::DmaDescriptors { table, count })),
        (arb_sem(), any::<u32>()).prop_map(|(sem, value)| Op::SemSet(op::SemSet { sem, value })),
        (any::<u8>(), any::<u16>(), any::<u32>()).prop_map(|(subtype, sub_id, payload)| {
            Op::Notify(op::Notify {
                subtype,
                sub_id,
                payload,
            })
        }),
        ((0u16..GLOBAL_SEMAPHORES), 1u32..=8).prop_map(|(s, count)| Op::Barrier(op::Barrier {
            sem: SemRef::global(s),
            count
        })),
        (
            1u32..4,
            1u32..4,
            1u32..9,
            1u32..9,
            1u32..9,
            0u32..8,
            finite(),
            (any::<bool>(), any::<bool>(), 0u8..22, finite(), finite())
        )
            .prop_flat_map(move |(b1, b2, m, k, n, flags, alpha, e)| {
                let ta = flags & 2 != 0;
                let tb = flags & 4 != 0;
                let a = if ta { [b1, b2, k, m] } else { [b1, b2, m, k] };
                let b = if tb { [b1, b2, n, k] } else { [b1, b2, k, n] };
                let cs = [b1, b2, m, n];
                (
                    arb_ap(f, a),
                    arb_ap(f, b),
                    arb_ap(f, cs),
                    opt(e.0, arb_ap(f, cs)),
                    opt(e.1, arb_ap(f, cs)),
                )
                    .prop_map(move |(a, b, c, bias, residual)| {
                        let epilogue = nrt_isa::Epilogue {
                            bias,
                            residual,
                            func: ActFunc::from_u8(e.2).expect("in range"),
                            act_alpha: e.3,
                            act_beta: e.4,
                        };
                        Op::MatMul(op::MatMul {
                            a,
                            b,
                            c,
                            alpha,
                            flags,
                            // No epilogue has no parameters either (the 1.0 encoding).
                            epilogue: if epilogue.is_none() {
                                nrt_isa::Epilogue::NONE
                            } else {
                                epilogue
                            },
                        })
                    })
            }),
        (
            1u32..3,
            1u32..3,
            1u32..3,
            1u32..4,
            1u32..4,
            3u32..9,
            0u32..2,
            1u32..3,
            any::<bool>(),
            0usize..ActFunc::ALL.len(),
            finite(),
        )
            .prop_flat_map(
                move |(n, g, cg, og, k, hw, pad, stride, has_bias, fi, alpha)| {
                    // Identity encodes as CONV, which carries no parameters.
                    let func = ActFunc::ALL[fi];
                    let act = if matches!(func, ActFunc::Identity) {
                        (func, 0.0, 0.0)
                    } else {
                        (func, alpha, 0.5)
                    };
                    let c = g * cg;
                    let o = g * og;
                    let window = Window {
                        kernel: [0, 0],
                        stride: [stride; 2],
                        pad: [pad; 4],
                        dilation: [1, 1],
                    };
                    let oh = window.out_dim(0, hw, k).unwrap();
                    let ws = cg * k * k * oh * oh;
                    (
                        arb_ap(f, [n, c, hw, hw]),
                        arb_ap(f, [o, cg, k, k]),
                        arb_ap(f, [n, o, oh, oh]),
                        opt(has_bias, arb_ap(f, [1, 1, 1, o])),
                        prop::option::of(Just(ap_of(f, [1, 1, 1, ws], 1 << 24))),
                    )
                        .prop_map(
                            move |(input, weight, output, bias, workspace)| {
                                Op::Conv(op::Conv {
                                    input,
                                    weight,
                                    output,
                                    bias,
                                    workspace,
                                    window,
                                    groups: g,
                                    act,
                                })
                            },
                        )
                }
            ),
        (
            arb_dims(),
            0usize..ActFunc::ALL.len(),
            finite(),
            finite(),
            finite(),
            any::<bool>()
        )
            .prop_flat_map(move |(s, fi, scale, alpha, beta, hb)| {
                (arb_ap(f, s), arb_ap(f, s), opt(hb, arb_ap(f, s))).prop_map(
                    move |(input, output, bias)| {
                        Op::Activation(op::Activation {
                            input,
                            output,
                            bias,
                            func: ActFunc::ALL[fi],
                            scale,
                            alpha,
                            beta,
                        })
                    },
                )
            }),
        (
            arb_dims(),
            0usize..BinaryOp::ALL.len(),
            prop::sample::select(vec![DType::F32, DType::I64, DType::I32])
        )
            .prop_flat_map(move |(s, oi, dt)| {
                let op = BinaryOp::ALL[oi];
                let dt = if op.is_logical() {
                    DType::Bool
                } else if op.is_bitwise() && dt == DType::F32 {
                    DType::I32
                } else {
                    dt
                };
                let od = if op.is_comparison() { DType::Bool } else { dt };
                (arb_ap(dt, s), arb_ap(dt, s), arb_ap(od, s))
                    .prop_map(move |(a, b, out)| Op::Binary(op::Binary { a, b, out, op }))
            }),
        (arb_dims(), 0usize..7, finite(), any::<bool>()).prop_flat_map(
            move |(s, oi, scalar, reverse)| {
                (arb_ap(f, s), arb_ap(f, s)).prop_map(move |(a, out)| {
                    Op::TensorScalar(op::TensorScalar {
                        a,
                        out,
                        op: BinaryOp::ALL[oi],
                        scalar,
                        reverse,
                    })
                })
            }
        ),
        (
            arb_dims(),
            prop::sample::select(DType::ALL.to_vec()),
            prop::sample::select(DType::ALL.to_vec())
        )
            .prop_flat_map(|(s, a, b)| (arb_ap(a, s), arb_ap(b, s))
                .prop_map(|(input, output)| Op::Copy(op::Copy { input, output }))),
        arb_dims()
            .prop_flat_map(move |s| (
                arb_ap(DType::Bool, s),
                arb_ap(f, s),
                arb_ap(f, s),
                arb_ap(f, s)
            ))
            .prop_map(|(cond, a, b, out)| Op::Select(op::Select { cond, a, b, out })),
        (arb_dims(), any::<u32>()).prop_flat_map(move |(s, v)| arb_ap(f, s).prop_map(move |out| {
            Op::Fill(op::Fill {
                out,
                bits: v as u64,
            })
        })),
        (arb_dims(), 0u8..16, 0usize..4).prop_flat_map(move |(s, axes, oi)| {
            let mut o = s;
            for (d, x) in o.iter_mut().enumerate() {
                if axes & (1 << d) != 0 {
                    *x = 1;
                }
            }
            (arb_ap(f, s), arb_ap(f, o)).prop_map(move |(input, output)| {
                Op::Reduce(op::Reduce {
                    input,
                    output,
                    op: ReduceOp::ALL[oi],
                    axes,
                })
            })
        }),
        (
            1u32..3,
            1u32..3,
            4u32..9,
            1u32..4,
            1u32..3,
            0u32..2,
            any::<bool>(),
            any::<bool>()
        )
            .prop_flat_map(move |(n, c, hw, k, st, pad, max, cip)| {
                let window = Window {
                    kernel: [k, k],
                    stride: [st, st],
                    pad: [pad; 4],
                    dilation: [1, 1],
                };
                let oh = window.out_dim(0, hw, k).unwrap();
                (arb_ap(f, [n, c, hw, hw]), arb_ap(f, [n, c, oh, oh])).prop_map(
                    move |(input, output)| {
                        Op::Pool(op::Pool {
                            input,
                            output,
                            window,
                            op: if max { PoolOp::Max } else { PoolOp::Avg },
                            count_include_pad: cip,
                        })
                    },
                )
            }),
        (arb_dims(), any::<bool>()).prop_flat_map(move |(s, log)| (arb_ap(f, s), arb_ap(f, s))
            .prop_map(move |(input, output)| Op::Softmax(op::Softmax { input, output, log }))),
        arb_dims().prop_flat_map(move |s| (
            arb_ap(f, s),
            arb_ap(DType::U8, s),
            arb_ap(f, [1, 1, 1, 1]),
            arb_ap(DType::U8, [1, 1, 1, 1])
        )
            .prop_map(|(input, output, scale, zero_point)| Op::DynamicQuantize(
                op::DynamicQuantize {
                    input,
                    output,
                    scale,
                    zero_point
                }
            ))),
        (arb_dims(), 0f32..1e-2, any::<bool>()).prop_flat_map(move |(s, eps, hb)| {
            (
                arb_ap(f, s),
                arb_ap(f, s),
                opt(hb, arb_ap(f, s)),
                arb_ap(f, s),
            )
                .prop_map(move |(input, gamma, beta, output)| {
                    Op::LayerNorm(op::LayerNorm {
                        input,
                        gamma,
                        beta,
                        output,
                        eps,
                    })
                })
        }),
        (arb_dims(), 0f32..1e-2).prop_flat_map(move |(s, eps)| {
            (arb_ap(f, s), arb_ap(f, s), arb_ap(f, s)).prop_map(move |(input, gamma, output)| {
                Op::RmsNorm(op::RmsNorm {
                    input,
                    gamma,
                    output,
                    eps,
                })
            })
        }),
        (
            arb_dims(),
            arb_dims(),
            0usize..2,
            0usize..6,
            0usize..4,
            prop::array::uniform4(0f32..4.0)
        )
            .prop_flat_map(move |(si, so, m, c, n, scales)| {
                (arb_ap(f, si), arb_ap(f, so)).prop_map(move |(input, output)| {
                    Op::Resize(op::Resize {
                        input,
                        output,
                        mode: ResizeMode::ALL[m],
                        coord: CoordMode::ALL[c],
                        nearest: NearestMode::ALL[n],
                        scales,
                    })
                })
            }),
        (arb_dims(), 1u32..6, any::<bool>()).prop_flat_map(move |(s, n, i64_)| {
            let it = if i64_ { DType::I64 } else { DType::I32 };
            (
                arb_ap(f, s),
                arb_ap(it, [1, 1, 1, n]),
                arb_ap(f, [s[0], s[1], n, s[3]]),
            )
                .prop_map(|(data, indices, output)| {
                    Op::Gather(op::Gather {
                        data,
                        indices,
                        output,
                    })
                })
        }),
        (arb_dims(), 0u8..4, 1u32..6, any::<bool>()).prop_flat_map(move |(s, axis, a, i64_)| {
            let it = if i64_ { DType::I64 } else { DType::I32 };
            let mut ds = s;
            ds[axis as usize] = a;
            (arb_ap(f, ds), arb_ap(it, s), arb_ap(f, s)).prop_map(move |(data, indices, output)| {
                Op::GatherElements(op::GatherElements {
                    data,
                    indices,
                    output,
                    axis,
                })
            })
        }),
        (arb_dims(), 0u8..4, 1u32..6, 0usize..5).prop_flat_map(move |(s, axis, a, r)| {
            let mut os = s;
            os[axis as usize] = a;
            (arb_ap(DType::I64, s), arb_ap(f, s), arb_ap(f, os)).prop_map(
                move |(indices, updates, output)| {
                    Op::ScatterElements(op::ScatterElements {
                        indices,
                        updates,
                        output,
                        axis,
                        reduce: ScatterReduce::ALL[r],
                    })
                },
            )
        }),
        (
            arb_dims(),
            1u32..6,
            0usize..8,
            any::<(bool, bool, bool, bool)>()
        )
            .prop_flat_map(move |(s, n, zps, (ai8, bi8, _, _))| {
                let (at, bt) = (
                    if ai8 { DType::I8 } else { DType::U8 },
                    if bi8 { DType::I8 } else { DType::U8 },
                );
                let [b1, b2, m, k] = s;
                (
                    arb_ap(at, s),
                    arb_ap(bt, [b1, b2, k, n]),
                    arb_ap(DType::I32, [b1, b2, m, n]),
                    arb_ap(at, [b1, b2, m, 1]),
                    arb_ap(bt, [b1, b2, 1, n]),
                    arb_ap(DType::F32, [b1, b2, 1, n]),
                    any::<bool>(),
                )
                    .prop_map(move |(a, b, mut c, za, zb, sc, packed)| {
                        // A packed B (`qmatmul_layout`): `[1, 1, K4 + 1, 4·Np]`, dense rows.
                        let b = if packed {
                            let np4 = 4 * nrt_isa::qmatmul_layout::padded_columns(n as usize)
                                .unwrap() as u32;
                            AccessPattern {
                                addr: b.addr & !3,
                                dtype: b.dtype,
                                shape: [1, 1, k.div_ceil(4) + 1, np4],
                                stride: [0, 0, np4 as i32, 1],
                            }
                        } else {
                            b
                        };
                        let scaled = zps & 4 != 0;
                        if scaled {
                            c.dtype = DType::F32;
                        }
                        Op::MatMulInteger(op::MatMulInteger {
                            a,
                            b,
                            c,
                            a_zero: (zps & 1 != 0).then_some(za),
                            b_zero: (zps & 2 != 0).then_some(zb),
                            packed_b: packed,
                            scale: scaled.then_some(sc),
                        })
                    })
            },),
        (arb_dims(), 0u32..4, any::<bool>()).prop_flat_map(move |(s, k, largest)| {
            let k = k.min(s[3]);
            let mut vs = s;
            vs[3] = k;
            (arb_ap(f, s), arb_ap(f, vs), arb_ap(DType::I64, vs)).prop_map(
                move |(input, values, indices)| {
                    Op::TopK(op::TopK {
                        input,
                        values,
                        indices,
                        largest,
                    })
                },
            )
        }),
        (arb_dims(), 1u32..5).prop_flat_map(move |(s, rank)| {
            let mut s = s;
            for d in &mut s[..4 - rank as usize] {
                *d = 1;
            }
            let n: u32 = s.iter().product();
            (
                arb_ap(DType::U8, s),
                arb_ap(DType::I64, [1, 1, rank, n]),
                arb_ap(DType::I64, [1, 1, 1, 2]),
            )
                .prop_map(|(input, output, shape)| {
                    Op::NonZero(op::NonZero {
                        input,
                        output,
                        shape,
                    })
                })
        }),
        (1u32..4, 0u32..5, 1u32..4, any::<bool>()).prop_flat_map(move |(o, a, i, sorted)| {
            let s = [1, o, a, i];
            let k = [1, 1, 1, a];
            (
                (arb_ap(f, s), arb_ap(f, s)),
                (
                    arb_ap(DType::I64, k),
                    arb_ap(DType::I64, k),
                    arb_ap(DType::I64, k),
                ),
                arb_ap(DType::I64, [1, 1, 1, 3]),
            )
                .prop_map(move |((input, y), (indices, inverse, counts), shape)| {
                    Op::Unique(op::Unique {
                        input,
                        y,
                        indices,
                        inverse,
                        counts,
                        shape,
                        dims: ShapeTemplate {
                            rank: 3,
                            axis: 1,
                            dims: [o, a, i, 0, 0, 0, 0, 0],
                        },
                        sorted,
                    })
                })
        }),
        (1u32..3, 0u32..5, 1u32..3, 0u32..9, 0u32..32, 0u32..100).prop_flat_map(
            move |(b, s, c, bound, flags, max)| {
                let flags = if flags & nms_flags::SCORE != 0 {
                    flags & !nms_flags::SCORE_CONST
                } else {
                    flags
                };
                let one = [1, 1, 1, 1];
                (
                    (arb_ap(f, [1, b, s, 4]), arb_ap(f, [1, b, c, s])),
                    (
                        opt(flags & nms_flags::MAX_OUT != 0, arb_ap(DType::I64, one)),
                        opt(flags & nms_flags::IOU != 0, arb_ap(f, one)),
                        opt(flags & nms_flags::SCORE != 0, arb_ap(f, one)),
                    ),
                    (
                        arb_ap(DType::I64, [1, 1, bound, 3]),
                        arb_ap(DType::I64, [1, 1, 1, 2]),
                    ),
                    (finite(), finite()),
                )
                    .prop_map(
                        move |(
                            (boxes, scores),
                            (max_out, iou, score_threshold),
                            (selected, shape),
                            (iou_const, score_const),
                        )| {
                            Op::NonMaxSuppression(op::NonMaxSuppression {
                                boxes,
                                scores,
                                max_out,
                                iou,
                                score_threshold,
                                selected,
                                shape,
                                flags,
                                max_out_const: max,
                                iou_const,
                                score_const,
                            })
                        },
                    )
            }
        ),
        (arb_dims(), 1u32..4, 1u32..4, 0u32..5, 0u32..4, finite()).prop_flat_map(
            move |(x, nr, oh, ratio, flags, scale)| {
                (
                    arb_ap(f, x),
                    arb_ap(f, [1, 1, nr, 4]),
                    arb_ap(DType::I64, [1, 1, 1, nr]),
                    arb_ap(f, [nr, x[1], oh, 2]),
                )
                    .prop_map(move |(input, rois, batch_indices, output)| {
                        Op::RoiAlign(op::RoiAlign {
                            input,
                            rois,
                            batch_indices,
                            output,
                            spatial_scale: scale,
                            sampling_ratio: ratio,
                            flags,
                        })
                    })
            }
        ),
        (1u32..3, 1u32..4, 1u32..3, 1u32..3, 1u32..4, any::<bool>()).prop_flat_map(
            move |(n, cg, g, kh, o, masked)| {
                let c = cg * g;
                (
                    arb_ap(f, [n, c, 5, 5]),
                    arb_ap(f, [n, g * kh * 2 * 2, o, o]),
                    opt(masked, arb_ap(f, [n, g * kh * 2, o, o])),
                    arb_ap(f, [n, c * kh * 2, o, o]),
                )
                    .prop_map(move |(input, offset, mask, cols)| {
                        Op::DeformIm2col(op::DeformIm2col {
                            input,
                            offset,
                            mask,
                            cols,
                            window: Window {
                                kernel: [kh, 2],
                                stride: [1, 2],
                                pad: [1, 0, 0, 0],
                                dilation: [1, 1],
                            },
                            offset_groups: g,
                        })
                    })
            }
        ),
    ]
}

fn engine_for(op: &Op) -> Engine {
    *Engine::ALL.iter().find(|e| op.runs_on(**e)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_instruction_round_trips(sync in arb_sync(), op in arb_op()) {
        let ins = Instruction { sync, op };
        let mut bytes = Vec::new();
        ins.encode(&mut bytes);
        prop_assert_eq!(bytes.len(), ins.encoded_len());
        prop_assert_eq!(bytes.len() % 8, 0);
        let (back, len) = Instruction::decode(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(len, bytes.len());
        prop_assert_eq!(back, ins);
    }

    /// A written operand given a stride of 0 on a dimension of size > 1 (two of its
    /// elements on one address) is refused, naming the operand (or one of its fields, where
    /// the op requires it dense); a read operand's broadcast
    /// within the bounds still decodes (the generator's own broadcasts round-trip above).
    #[test]
    fn a_written_operand_that_repeats_elements_is_refused(op in arb_op()) {
        let mut bad = op;
        let mut target = None;
        bad.operands_mut(|o| {
            if target.is_none()
                && o.role.writes()
                && o.ap.elements() > 0
                && let Some(d) = (0..4).find(|&d| o.ap.shape[d] > 1)
            {
                o.ap.stride[d] = 0;
                target = Some(o.name);
            }
        });
        let Some(name) = target else { return Ok(()) };
        let mut bytes = Vec::new();
        Instruction::new(bad).encode(&mut bytes);
        let e = Instruction::decode(&bytes).expect_err("a repeating output decoded");
        // An operand an op requires dense (a convolution's workspace) is refused by that
        // op's own check first, naming a field of the operand.
        prop_assert!(
            e.field == name || e.field.strip_prefix(name).is_some_and(|f| f.starts_with('.')),
            "refused {} instead of {}", e.field, name
        );
        if e.field == name {
            prop_assert_eq!(e.reason, Reason::OverlappingWrite);
        }
    }

    #[test]
    fn blocks_round_trip(ops in prop::collection::vec(arb_op(), 0..8)) {
        // Keep only ops that run on the engine of the first one, then end the block.
        let engine = ops.first().map(engine_for).unwrap_or(Engine::Sp);
        let ins: Vec<Instruction> = ops.into_iter()
            .filter(|o| o.runs_on(engine) && !matches!(o, Op::End(op::End)))
            .map(Instruction::new)
            .collect();
        let block = encode_block(&ins);
        let back = decode_block(&block, engine).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back.len(), ins.len() + 1);
        for (i, (_, d)) in back.iter().enumerate().take(ins.len()) {
            prop_assert_eq!(*d, ins[i]);
        }
    }

    /// The operand table agrees with the encoder: adding 4096 to the 8-byte address at each
    /// listed operand's slot moves exactly that operand (and nothing else), and every
    /// operand the encoder wrote is listed — a table that names a wrong slot, misses an
    /// operand or lists one twice fails here, not on the device.
    #[test]
    fn operand_table_matches_the_encoding(sync in arb_sync(), op in arb_op()) {
        let ins = Instruction { sync, op };
        let mut bytes = Vec::new();
        ins.encode(&mut bytes);
        let mut slots = Vec::new();
        ins.op.operands(|o| slots.push((o.slot, o.name, o.role, *o.ap)));
        let mut seen = std::collections::BTreeSet::new();
        for &(slot, _, _, _) in &slots {
            prop_assert!(seen.insert(slot), "slot {} listed twice", slot);
        }
        let mut moved = bytes.clone();
        for &(slot, _, _, _) in &slots {
            let at = HEADER_SIZE + slot * nrt_isa::AP_SIZE;
            let addr = u64::from_le_bytes(moved[at..at + 8].try_into().unwrap());
            moved[at..at + 8].copy_from_slice(&(addr.wrapping_add(4096)).to_le_bytes());
        }
        let (back, _) = Instruction::decode(&moved).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut expect = ins;
        expect.op.operands_mut(|o| o.ap.addr = o.ap.addr.wrapping_add(4096));
        prop_assert_eq!(back, expect);
        // The same operands, through address_fields (what relocations and the loader use).
        let mut fields = Vec::new();
        ins.address_fields(|f| fields.push((f.offset, f.name)));
        if !matches!(ins.op, Op::DmaDescriptors(_)) {
            let want: Vec<_> = slots.iter().map(|&(s, n, _, _)| (HEADER_SIZE + s * nrt_isa::AP_SIZE, n)).collect();
            prop_assert_eq!(fields, want);
        }
        // Only an accumulating MatMul and a scatter read the operand they write.
        for &(_, name, role, _) in &slots {
            if role == nrt_isa::Role::ReadWrite {
                let accumulating = matches!(ins.op, Op::MatMul(op::MatMul { flags, .. }) if flags & nrt_isa::matmul_flags::ACCUMULATE != 0);
                let scatter = matches!(ins.op, Op::ScatterElements(_));
                prop_assert!(accumulating || scatter);
                prop_assert_eq!(name, if scatter { "output" } else { "c" });
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400), engine in 0u8..5) {
        let _ = decode_block(&bytes, Engine::from_index(engine).unwrap());
    }

    #[test]
    fn single_byte_corruption_never_panics(sync in arb_sync(), op in arb_op(), at in any::<prop::sample::Index>(), v in any::<u8>()) {
        let mut bytes = Vec::new();
        Instruction { sync, op }.encode(&mut bytes);
        let i = at.index(bytes.len());
        bytes[i] = v;
        let _ = Instruction::decode(&bytes);
    }
}

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
    let enc = |b: AccessPattern, flags: u32| {
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
    };
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
