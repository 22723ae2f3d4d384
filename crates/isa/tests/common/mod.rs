//! Proptest strategies shared by the ISA tests: dimensions, access patterns, semaphores and
//! sync fields, and every instruction (`arb_op_any`; `arb_op` the valid ones).

#![allow(dead_code)]

use nrt_hal::DType;
use nrt_isa::op;
use nrt_isa::*;
use proptest::prelude::*;

pub fn arb_dims() -> impl Strategy<Value = [u32; 4]> {
    prop::array::uniform4(1u32..6)
}

pub fn ap_of(dtype: DType, shape: [u32; 4], addr: u64) -> AccessPattern {
    AccessPattern {
        addr,
        dtype,
        shape,
        stride: dense_strides(&shape),
    }
}

pub fn arb_ap(dtype: DType, shape: [u32; 4]) -> impl Strategy<Value = AccessPattern> {
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

pub fn opt(
    present: bool,
    s: impl Strategy<Value = AccessPattern> + 'static,
) -> BoxedStrategy<Option<AccessPattern>> {
    if present {
        s.prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    }
}

pub fn arb_sem() -> impl Strategy<Value = SemRef> {
    prop_oneof![
        (4u16..256).prop_map(SemRef::local),
        (0u16..GLOBAL_SEMAPHORES).prop_map(SemRef::global)
    ]
}

pub fn arb_sync() -> impl Strategy<Value = Sync> {
    (
        prop::option::of((arb_sem(), any::<u32>())),
        prop::option::of((arb_sem(), any::<u32>())),
    )
        .prop_map(|(wait, signal)| Sync { wait, signal })
}

pub fn finite() -> impl Strategy<Value = f32> {
    -1e6f32..1e6
}

/// A valid instruction: [`arb_op_any`] with each written operand that repeats elements
/// (the generator's broadcast strides) made dense — the decoder refuses the others.
pub fn arb_op() -> impl Strategy<Value = Op> {
    arb_op_any().prop_map(|mut op| {
        op.operands_mut(|o| {
            if o.role.writes() && o.ap.repeats_elements() {
                o.ap.stride = dense_strides(&o.ap.shape);
            }
        });
        op
    })
}

pub fn arb_op_any() -> impl Strategy<Value = Op> {
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
