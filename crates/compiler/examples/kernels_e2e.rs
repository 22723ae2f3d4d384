//! Numerical end-to-end check of compiled ONNX node tests on the software NeuronCore's kernels:
//! a sequential interpreter that honors every semaphore wait (engines round-robin), moves I/O
//! through the descriptor DMAs, poisons the scratch arena, and compares each output with the
//! test's expected one (|Δ| ≤ 1e-3 + 1e-3·|expected|).
//!
//! `cargo run -p nrt-compiler --features kernels-e2e --example kernels_e2e -- NODE_TEST_DIR [FILTER] [CORES]`
//!
//! With `NRT_E2E_PROFILE=N`, each passing model is run N more times and the time of every
//! instruction (kernel only, no device or runtime overhead) is printed, slowest first.
use nrt_compiler::{CompileOptions, HostTensor, compile, read_tensor_pb};
use nrt_hal::NUM_ENGINES;
use nrt_isa::op;
use nrt_isa::{Op, decode_block};
use nrt_model::{CompiledModel, MemRefKind};
use std::path::PathBuf;

fn run(m: &CompiledModel, inputs: &[HostTensor]) -> Result<Vec<Vec<u8>>, String> {
    let mut base = Vec::new();
    let mut top = 64u64;
    let mut arena_top = 0u64;
    for r in &m.mem_refs {
        if r.kind == MemRefKind::VirtualTmpBuf {
            arena_top = arena_top.max(r.offset + r.size);
        }
    }
    let arena_base = top;
    top += arena_top.next_multiple_of(64) + 64;
    for r in &m.mem_refs {
        let b = match r.kind {
            MemRefKind::VirtualTmpBuf => arena_base + r.offset,
            _ => {
                let b = top;
                top += r.size.next_multiple_of(64) + 64;
                b
            }
        };
        base.push(b);
    }
    let mut mem = vec![0u8; top as usize + 64];
    for (i, r) in m.mem_refs.iter().enumerate() {
        if r.kind == MemRefKind::Buffer {
            let b = base[i] as usize;
            mem[b..b + r.size as usize]
                .copy_from_slice(&m.constants[r.offset as usize..(r.offset + r.size) as usize]);
        }
    }
    // poison the arena
    for x in &mut mem[arena_base as usize..(arena_base + arena_top) as usize] {
        *x = 0xA5;
    }
    let desc = m
        .mem_refs
        .iter()
        .position(|r| r.kind == MemRefKind::IoDescriptors);
    let ns = m.sg_count as usize * NUM_ENGINES;
    let mut streams = vec![Vec::new(); ns];
    for b in &m.blocks {
        let mut code = b.code.clone();
        for r in &b.relocations {
            let a = base[r.mem_ref as usize] + r.offset;
            let p = r.patch_offset as usize;
            code[p..p + 8].copy_from_slice(&a.to_le_bytes());
        }
        let s = b.core as usize * NUM_ENGINES + b.engine.index();
        streams[s] = decode_block(&code, b.engine)
            .map_err(|e| format!("{e:?}"))?
            .into_iter()
            .map(|x| x.1)
            .collect();
    }
    let mut local = vec![[0u32; 256]; m.sg_count as usize];
    let mut global = [0u32; 64];
    let mut pos = vec![0usize; ns];
    let mut outs = vec![Vec::new(); m.io.len()];
    let mut ws = nrt_kernels::Workspace::new();
    // SAFETY: `mem` outlives every kernel call; operands were bounds-checked by decode.
    let dm = unsafe { nrt_kernels::DeviceMemory::new(mem.as_mut_ptr(), mem.len() as u64) };
    loop {
        let mut progressed = false;
        let mut done = true;
        for s in 0..ns {
            let core = s / NUM_ENGINES;
            while pos[s] < streams[s].len() {
                done = false;
                let ins = streams[s][pos[s]];
                if let Some((sem, v)) = ins.sync.wait {
                    let cur = if sem.is_global() {
                        global[sem.index() as usize]
                    } else {
                        local[core][sem.index() as usize]
                    };
                    if cur < v {
                        break;
                    }
                }
                match ins.op {
                    Op::End(op::End) | Op::Nop(op::Nop) | Op::Notify(_) => {}
                    Op::DmaDescriptors(op::DmaDescriptors { table, count }) => {
                        let db = base[desc.unwrap()];
                        let first = (table - db) / 32;
                        for v in first..first + count as u64 {
                            let t = &m.io[v as usize];
                            let b = base[t.mem_ref as usize] as usize;
                            let n = t.byte_size() as usize;
                            if t.usage == nrt_model::Usage::Input {
                                let bytes = inputs[v as usize].to_bytes();
                                mem[b..b + n].copy_from_slice(&bytes);
                            } else {
                                outs[v as usize] = mem[b..b + n].to_vec();
                            }
                        }
                    }
                    op => {
                        let t0 = std::time::Instant::now();
                        // SAFETY: see above.
                        unsafe { nrt_kernels::execute(&op, dm, &mut ws) }
                            .map_err(|e| format!("{e:?}"))?;
                        PROFILE.with(|p| {
                            let mut p = p.borrow_mut();
                            let key = (s, pos[s]);
                            match p.iter_mut().find(|e| e.0 == key) {
                                Some(e) => e.2 += t0.elapsed().as_secs_f64(),
                                None => p.push((key, brief(&op), t0.elapsed().as_secs_f64())),
                            }
                        });
                    }
                }
                if let Some((sem, v)) = ins.sync.signal {
                    if sem.is_global() {
                        global[sem.index() as usize] += v
                    } else {
                        local[core][sem.index() as usize] += v
                    }
                }
                pos[s] += 1;
                progressed = true;
            }
        }
        if done {
            break;
        }
        if !progressed {
            return Err("deadlock".into());
        }
    }
    Ok(outs)
}

/// Per instruction `((stream, index), description, seconds)`.
type Profile = Vec<((usize, usize), String, f64)>;

thread_local! {
    static PROFILE: std::cell::RefCell<Profile> = const { std::cell::RefCell::new(Vec::new()) };
}

fn brief(op: &Op) -> String {
    let mut s = op.name().to_string();
    let mut op = *op;
    nrt_compiler::schedule::for_each_ap_mut(&mut op, |ap, _| {
        s.push_str(&format!(" {:?}/{:?}", ap.shape, ap.stride));
    });
    if let Op::Activation(op::Activation { func, .. }) = op {
        s.push_str(&format!(" {func:?}"));
    }
    s
}

fn main() {
    let Some(root) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: kernels_e2e NODE_TEST_DIR [FILTER] [CORES]");
        std::process::exit(2);
    };
    let filter = std::env::args().nth(2).unwrap_or_default();
    let cores: u32 = std::env::args()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    let (mut pass, mut fail, mut skip) = (0, 0, 0);
    for d in dirs {
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        if !name.contains(&filter) {
            continue;
        }
        let Ok(bytes) = std::fs::read(d.join("model.onnx")) else {
            continue;
        };
        let ops = nrt_compiler::model_op_types(&bytes).unwrap_or_default();
        if nrt_compiler::first_unsupported_op(&ops).is_some() {
            continue;
        }
        let data = d.join("test_data_set_0");
        let pb = |p: &str| -> Vec<PathBuf> {
            (0..)
                .map(|i| data.join(format!("{p}_{i}.pb")))
                .take_while(|p| p.exists())
                .collect()
        };
        let Ok(ins) = pb("input")
            .iter()
            .map(|p| read_tensor_pb(p).map(|x| x.1))
            .collect::<Result<Vec<_>, _>>()
        else {
            skip += 1;
            continue;
        };
        let Ok(exp) = pb("output")
            .iter()
            .map(|p| read_tensor_pb(p).map(|x| x.1))
            .collect::<Result<Vec<_>, _>>()
        else {
            skip += 1;
            continue;
        };
        let g = nrt_compiler::onnx::decode_model(&bytes)
            .unwrap()
            .graph
            .unwrap();
        let init: Vec<&str> = g.initializer.iter().map(|t| t.name.as_str()).collect();
        let names: Vec<String> = g
            .input
            .iter()
            .map(|i| i.name.clone())
            .filter(|n| !init.contains(&n.as_str()))
            .collect();
        let mut opts = CompileOptions {
            cores,
            ..Default::default()
        };
        let mut res = compile(&bytes, Some(&d), &opts);
        for _ in 0..names.len() {
            let Err(e) = &res else { break };
            if !e.message.contains("input_values") {
                break;
            }
            let Some(rest) = e.message.split("input '").nth(1) else {
                break;
            };
            let w = rest.split('\'').next().unwrap().to_string();
            let Some(k) = names.iter().position(|n| *n == w) else {
                break;
            };
            opts.input_values.insert(w, ins[k].clone());
            res = compile(&bytes, Some(&d), &opts);
        }
        let Ok(c) = res else {
            skip += 1;
            continue;
        };
        let feed: Vec<HostTensor> = names
            .iter()
            .zip(&ins)
            .filter(|(n, _)| !opts.input_values.contains_key(*n))
            .map(|x| x.1.clone())
            .collect();
        let mut io_in = Vec::new();
        let mut k = 0;
        for t in &c.model.io {
            if t.usage == nrt_model::Usage::Input {
                io_in.push(feed[k].clone());
                k += 1;
            } else {
                io_in.push(HostTensor::f32(vec![], vec![0.0]));
            }
        }
        match run(&c.model, &io_in) {
            Err(e) => {
                fail += 1;
                println!("FAIL {name}: {e}");
            }
            Ok(outs) => {
                let mut bad = None;
                for (j, (v, t)) in c.model.outputs().enumerate() {
                    let got = HostTensor::from_bytes(
                        t.dtype,
                        t.shape.iter().map(|&d| d as usize).collect(),
                        &outs[v as usize],
                    )
                    .unwrap();
                    let e = &exp[j];
                    let (g, w) = (got.to_f32s(), e.to_f32s());
                    for i in 0..w.len() {
                        let ok = (g[i] - w[i]).abs() <= 1e-3 + 1e-3 * w[i].abs()
                            || (g[i].is_nan() && w[i].is_nan())
                            || g[i] == w[i];
                        if !ok {
                            bad = Some(format!("output {j} [{i}] = {} expected {}", g[i], w[i]));
                            break;
                        }
                    }
                    if bad.is_some() {
                        break;
                    }
                }
                let reps: usize = std::env::var("NRT_E2E_PROFILE")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                if bad.is_none() && reps > 0 {
                    PROFILE.with(|p| p.borrow_mut().clear());
                    for _ in 0..reps {
                        let _ = run(&c.model, &io_in);
                    }
                    PROFILE.with(|p| {
                        let mut p = p.borrow_mut();
                        let total: f64 = p.iter().map(|e| e.2).sum();
                        p.sort_by(|a, b| b.2.total_cmp(&a.2));
                        println!(
                            "{name}: {:.1} µs per run (kernels)",
                            total / reps as f64 * 1e6
                        );
                        for e in p.iter() {
                            println!("  {:9.1} µs  {}", e.2 / reps as f64 * 1e6, e.1);
                        }
                    });
                }
                match bad {
                    None => pass += 1,
                    Some(b) => {
                        fail += 1;
                        println!("FAIL {name}: {b}");
                    }
                }
            }
        }
    }
    println!("pass {pass} fail {fail} skip {skip}");
    if fail > 0 {
        std::process::exit(1);
    }
}
