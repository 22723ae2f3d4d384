//! The machine's peaks and the GEMM and int8 rows: one MatMul through the device, as a share
//! of the peak, beside the instruction alone on host memory; and the models they compile.

use super::*;
use crate::session::{self, Res};
use nrt_isa::op;
use std::time::{Duration, Instant};

/// A model with one MatMul `Y[M,N] = X[M,K] · W[K,N]` (W a constant), through the whole
/// device path: what the GEMM rows time.
/// The MatMul of a [`matmul_model`], with the model's constants placed in host memory
/// laid out as its plan says nothing about: A, B (the constant) and C in one buffer.
struct Standalone {
    op: nrt_isa::Op,
    mem: Vec<u64>,
}

fn model_matmul(bytes: &[u8]) -> Res<Standalone> {
    let m = nrt_model::CompiledModel::decode(bytes).map_err(|e| e.to_string())?;
    let pe = m.block(0, nrt_hal::Engine::Pe).ok_or("no PE block")?;
    let ops = nrt_isa::decode_block(&pe.code, nrt_hal::Engine::Pe).map_err(|e| e.to_string())?;
    let Some(nrt_isa::Op::MatMul(op::MatMul {
        a,
        b,
        c,
        alpha,
        flags,
        epilogue,
    })) = ops
        .into_iter()
        .map(|(_, i)| i.op)
        .find(|o| matches!(o, nrt_isa::Op::MatMul(_)))
    else {
        return Err("no MatMul".into());
    };
    let bytes = |ap: &nrt_isa::AccessPattern| ap.byte_extent().1 as u64;
    let (na, nb, nc) = (bytes(&a), bytes(&b), bytes(&c));
    let at = |x: u64| x.next_multiple_of(64);
    let (oa, ob) = (0, at(na));
    let oc = at(ob + nb);
    let mut mem = vec![0u64; (at(oc + nc) / 8) as usize];
    // SAFETY: u64 storage viewed as bytes.
    let raw =
        unsafe { core::slice::from_raw_parts_mut(mem.as_mut_ptr() as *mut u8, mem.len() * 8) };
    raw[ob as usize..(ob + nb) as usize].copy_from_slice(&m.constants[..nb as usize]);
    for (i, x) in raw[oa as usize..na as usize]
        .chunks_exact_mut(4)
        .enumerate()
    {
        x.copy_from_slice(&((i % 17) as f32 * 0.01).to_le_bytes());
    }
    let op = nrt_isa::Op::MatMul(op::MatMul {
        a: nrt_isa::AccessPattern { addr: oa, ..a },
        b: nrt_isa::AccessPattern { addr: ob, ..b },
        c: nrt_isa::AccessPattern { addr: oc, ..c },
        alpha,
        flags,
        epilogue,
    });
    Ok(Standalone { op, mem })
}

/// The first compute instruction of a compiled model's PE block, its every operand moved
/// into one host buffer (filled with small bytes: integer kernels' speed does not depend on
/// the values): what the int8 rows time alone.
fn model_op(bytes: &[u8]) -> Res<Standalone> {
    let m = nrt_model::CompiledModel::decode(bytes).map_err(|e| e.to_string())?;
    let pe = m.block(0, nrt_hal::Engine::Pe).ok_or("no PE block")?;
    let ops = nrt_isa::decode_block(&pe.code, nrt_hal::Engine::Pe).map_err(|e| e.to_string())?;
    let mut op = ops
        .into_iter()
        .map(|(_, i)| i.op)
        .find(|o| o.output().is_some())
        .ok_or("no compute instruction on PE")?;
    let mut end = 0u64;
    op.operands_mut(|o| {
        let (lo, hi) = o.ap.byte_extent();
        // `lo` is ≤ 0 only for negative strides, which these models do not have.
        let at = end.next_multiple_of(64);
        o.ap.addr = (at as i128 - lo) as u64;
        end = at + (hi - lo) as u64;
    });
    let mem = vec![0x0101_0101_0101_0101u64; (end.next_multiple_of(64) / 8) as usize];
    Ok(Standalone { op, mem })
}

/// The instruction alone (the kernel on host memory, no execution around it): what the
/// device's engine spends of the whole execution.
#[derive(Clone, Copy, Debug)]
struct KernelTime {
    /// Median time of one call, in ns.
    median_ns: f64,
    /// Mean time of a call in the best batch of consecutive calls lasting about
    /// [`PEAK_BATCH`] each, in ns — the statistic of the machine's limit ([`peak_measure`]:
    /// the best of such batches), so that the share compares like with like.
    best_batch_ns: f64,
}

/// How long one batch of the register-only limit loop runs ([`peak_measure`]), and so one
/// batch of the instruction's calls in [`KernelTime::best_batch_ns`].
const PEAK_BATCH: Duration = Duration::from_millis(30);

fn kernel_ns(s: &Standalone, seconds: f64) -> KernelTime {
    let mut mem = s.mem.clone();
    // SAFETY: the buffer outlives every call below.
    let dm = unsafe {
        nrt_kernels::DeviceMemory::new(mem.as_mut_ptr() as *mut u8, mem.len() as u64 * 8)
    };
    let mut ws = nrt_kernels::Workspace::new();
    // SAFETY: every operand lies inside the buffer, aligned (placed by `model_matmul`).
    let run = |ws: &mut nrt_kernels::Workspace| unsafe { nrt_kernels::execute(&s.op, dm, ws) };
    let _ = run(&mut ws);
    let budget = Duration::from_secs_f64((seconds / 2.0).max(0.05));
    let start = Instant::now();
    let mut times = Vec::new();
    while start.elapsed() < budget || times.len() < 5 {
        let t = Instant::now();
        let _ = run(&mut ws);
        times.push(t.elapsed().as_nanos() as f64);
    }
    // Consecutive calls in batches of about PEAK_BATCH (at least one call each).
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median_ns = sorted[sorted.len() / 2];
    let per_batch =
        ((PEAK_BATCH.as_nanos() as f64 / median_ns.max(1.0)).ceil() as usize).clamp(1, times.len());
    let best_batch_ns = times
        .chunks_exact(per_batch)
        .map(|b| b.iter().sum::<f64>() / b.len() as f64)
        .fold(f64::INFINITY, f64::min);
    KernelTime {
        median_ns,
        best_batch_ns: if best_batch_ns.is_finite() {
            best_batch_ns
        } else {
            median_ns
        },
    }
}

fn matmul_model(m: u32, k: u32, n: u32, bf16: bool, packed: bool) -> Vec<u8> {
    use nrt_hal::wire::{CUSTOM_SUB_ID_OUTPUT_DONE, CUSTOM_SUBTYPE_TENSOR};
    use nrt_hal::{DType, Engine};
    use nrt_isa::{AccessPattern, Instruction, Op, SemRef};
    use nrt_model::{ModelBuilder, vaddr};
    let mut b = ModelBuilder::new(&format!("matmul-{m}x{k}x{n}"), 1);
    let x = b.input("x", DType::F32, &[m, k]);
    let y = b.output("y", DType::F32, &[m, n]);
    // Packed (what `nrt compile` stores for constant weights): panels of the compiler's
    // width, the last one zero-padded (random values need no order here either).
    let nr = nrt_hal::tuning::GEMM_PACK_NR as u32;
    let kp = if bf16 { k.div_ceil(2) * 2 } else { k };
    let elems = if packed {
        n.div_ceil(nr) * nr * kp
    } else {
        k * n
    };
    let mut w = Vec::with_capacity((elems * 4) as usize);
    let mut s = 0x2545_F491u32;
    for _ in 0..elems {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        let x = (s as f32 / u32::MAX as f32 - 0.5) * 0.1;
        if bf16 {
            // Stored [N, K] as `--auto-cast` writes weights (values need no order here).
            w.extend_from_slice(&nrt_kernels::elem::f32_to_bf16(x).to_le_bytes());
        } else {
            w.extend_from_slice(&x.to_le_bytes());
        }
    }
    let wap = |addr| {
        if packed && bf16 {
            // Pairs of K side by side in each panel row.
            AccessPattern {
                addr,
                dtype: DType::Bf16,
                shape: [1, n.div_ceil(nr), kp / 2, 2 * nr],
                stride: [0, (kp * nr) as i32, 2 * nr as i32, 1],
            }
        } else if packed {
            AccessPattern {
                addr,
                dtype: DType::F32,
                shape: [1, n.div_ceil(nr), k, nr],
                stride: [0, (k * nr) as i32, nr as i32, 1],
            }
        } else if bf16 {
            AccessPattern {
                shape: [1, 1, k, n],
                stride: [0, 0, 1, k as i32],
                ..AccessPattern::dense(addr, DType::Bf16, &[k, n])
            }
        } else {
            AccessPattern::dense(addr, DType::F32, &[k, n])
        }
    };
    let wr = b.constant(&w, 64);
    let (xr, yr) = (b.io_mem_ref(x), b.io_mem_ref(y));
    let (dx, dy) = (b.io_descriptor(x), b.io_descriptor(y));
    let (inp, done) = (SemRef::local(4), SemRef::local(5));
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dx,
            count: 1,
        }))
        .signal(inp, 1),
    );
    b.push(
        0,
        Engine::Pe,
        Instruction::new(Op::MatMul(op::MatMul {
            a: AccessPattern::dense(vaddr(xr, 0), DType::F32, &[m, k]),
            b: wap(vaddr(wr, 0)),
            c: AccessPattern::dense(vaddr(yr, 0), DType::F32, &[m, n]),
            alpha: 1.0,
            flags: if packed {
                nrt_isa::matmul_flags::PACKED_B
            } else {
                0
            },
            epilogue: nrt_isa::Epilogue::NONE,
        }))
        .wait(inp, 1)
        .signal(done, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::DmaDescriptors(op::DmaDescriptors {
            table: dy,
            count: 1,
        }))
        .wait(done, 1),
    );
    b.push(
        0,
        Engine::Sp,
        Instruction::new(Op::Notify(op::Notify {
            subtype: CUSTOM_SUBTYPE_TENSOR,
            sub_id: CUSTOM_SUB_ID_OUTPUT_DONE,
            payload: y,
        })),
    );
    b.build().encode()
}

/// The machine's limit for `which`: the best of short register-only batches taken before and
/// after the GEMM rows (a co-tenant slows some batches; the best ones show the core).
fn peak_measure(which: nrt_kernels::peak::Peak) -> Option<f64> {
    nrt_kernels::peak::measure(which, PEAK_BATCH, 20)
}

fn peak_row(label: &str, g: Option<f64>) -> Row {
    Row {
        model: label.into(),
        surface: "peak".into(),
        depth: 1,
        cores: 1,
        n: 40,
        median_ns: 0.0,
        p99_ns: 0.0,
        execs_per_s: 0.0,
        allocs_per_exec: 0.0,
        caller_cpu_ns: 0.0,
        caller_cpu_share: 0.0,
        note: match g {
            Some(g) => format!("{g:.1} GFLOP/s (register-only loop, best of 40 batches)"),
            None => "not available on this CPU".into(),
        },
    }
}

/// The machine's f32 FMA and bf16 dot-product limits, then GEMM throughput through the
/// device (one MatMul per execution, GFLOP/s from the median) with f32 and bf16 weights,
/// each as a share of its limit.
pub(super) fn gemm_rows(seconds: f64) -> Res<Vec<Row>> {
    use nrt_kernels::peak::Peak;
    let max = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    let (f32_before, bf16_before) = (peak_measure(Peak::F32Fma), peak_measure(Peak::Bf16Dot));
    let tile_before = peak_measure(Peak::Bf16Tile);
    let mut gemms = Vec::new();
    let (_d, rt) = session::runtime(Some(base_config()?))?;
    for (bf16, packed) in [(false, false), (false, true), (true, false), (true, true)] {
        for (m, k, n) in [
            (1u32, 512u32, 512u32),
            (64, 512, 512),
            (512, 512, 512),
            (128, 64, 128),
        ] {
            let model = session::load(&rt, &matmul_model(m, k, n, bf16, packed), 0)?;
            let label = format!(
                "matmul {m}x{k}x{n}{}",
                if bf16 && packed {
                    " bf16 packed"
                } else if bf16 {
                    " bf16"
                } else if packed {
                    " packed"
                } else {
                    ""
                }
            );
            let mut r = sync_rows(&rt, &model, &label, 1, seconds)?;
            r.surface = "gemm".into();
            let kernel = kernel_ns(
                &model_matmul(&matmul_model(m, k, n, bf16, packed))?,
                seconds,
            );
            gemms.push((r, 2.0 * m as f64 * k as f64 * n as f64, bf16, kernel));
            rt.unload(&model).map_err(|e| e.to_string())?;
        }
    }
    // int8: one MatMulInteger (u8 × i8 → i32, AVX-512 VNNI `vpdpbusd` where present, else
    // AVX2 `vpmaddwd`), as `nrt compile` emits it, in GOPS against the machine's limit for
    // that instruction; one row, a GEMV, bound by reading the weights.
    let (i8_before, i8_tile_before) = (peak_measure(Peak::I8Dot), peak_measure(Peak::I8Tile));
    let mut int8 = Vec::new();
    for (m, k, n) in [(1i64, 512i64, 512i64), (64, 512, 512), (512, 512, 512)] {
        let onnx = crate::samples::matmul_integer(m, k, n);
        let c = nrt_compiler::compile(&onnx, None, &nrt_compiler::CompileOptions::default())
            .map_err(|e| format!("matmul_integer: {e}"))?;
        let bytes = c.model.encode();
        let model = session::load(&rt, &bytes, 0)?;
        let mut r = sync_rows(&rt, &model, &format!("matmul {m}x{k}x{n} int8"), 1, seconds)?;
        r.surface = "gemm".into();
        let kernel = kernel_ns(&model_op(&bytes)?, seconds);
        int8.push((r, 2.0 * (m * k * n) as f64, kernel));
        rt.unload(&model).map_err(|e| e.to_string())?;
    }
    let f32_peak = max(f32_before, peak_measure(Peak::F32Fma));
    let bf16_peak = max(bf16_before, peak_measure(Peak::Bf16Dot));
    // Packed bf16 weights run on the AMX tile unit where the process may use it: those rows
    // are shares of the tile limit.
    let tile_peak = max(tile_before, peak_measure(Peak::Bf16Tile));
    let i8_peak = max(i8_before, peak_measure(Peak::I8Dot));
    // MatMulInteger runs on the AMX tile unit where the process may use it: its rows are
    // shares of that limit then.
    let i8_tile_peak = max(i8_tile_before, peak_measure(Peak::I8Tile));
    let mut rows = vec![
        peak_row("peak f32 FMA", f32_peak),
        peak_row("peak bf16 dot", bf16_peak),
        peak_row("peak bf16 tile (AMX)", tile_peak),
        Row {
            note: peak_row("", i8_peak).note.replace("GFLOP/s", "GOPS"),
            ..peak_row("peak int8 dot", i8_peak)
        },
        Row {
            note: peak_row("", i8_tile_peak).note.replace("GFLOP/s", "GOPS"),
            ..peak_row("peak int8 tile (AMX)", i8_tile_peak)
        },
    ];
    let (i8_peak, i8_which) = match i8_tile_peak {
        Some(p) => (Some(p), "int8 tile"),
        None => (i8_peak, "int8"),
    };
    for (mut r, ops, kernel) in int8 {
        let (gops, kops, bops) = (
            ops / r.median_ns,
            ops / kernel.median_ns,
            ops / kernel.best_batch_ns,
        );
        r.note = match i8_peak {
            Some(p) => format!(
                "{gops:.1} GOPS (whole execution), {:.0}% of the {i8_which} peak; the \
                 instruction alone {kops:.1}, {:.0}%; its best 30 ms batch {bops:.1}, {:.0}%",
                100.0 * gops / p,
                100.0 * kops / p,
                100.0 * bops / p,
            ),
            None => format!(
                "{gops:.1} GOPS (whole execution); the instruction alone {kops:.1}; its best \
                 30 ms batch {bops:.1}"
            ),
        };
        rows.push(r);
    }
    for (mut r, flop, bf16, kernel) in gemms {
        let gflops = flop / r.median_ns;
        let kflops = flop / kernel.median_ns;
        let bflops = flop / kernel.best_batch_ns;
        let tile = bf16 && r.model.ends_with("packed") && tile_peak.is_some();
        let (peak, which) = match (bf16, tile) {
            (true, true) => (tile_peak, "bf16 tile"),
            (true, false) => (bf16_peak, "bf16"),
            _ => (f32_peak, "f32"),
        };
        r.note = match peak {
            Some(p) => format!(
                "{gflops:.1} GFLOP/s (whole execution), {:.0}% of the {which} peak; the \
                 instruction alone {kflops:.1}, {:.0}%; its best 30 ms batch {bflops:.1}, \
                 {:.0}%",
                100.0 * gflops / p,
                100.0 * kflops / p,
                100.0 * bflops / p,
            ),
            None => format!(
                "{gflops:.1} GFLOP/s (whole execution); the instruction alone {kflops:.1}; its \
                 best 30 ms batch {bflops:.1}"
            ),
        };
        rows.push(r);
    }
    Ok(rows)
}
