//! An independent checker of a compiled model's synchronization.
//!
//! It decodes every block of a [`CompiledModel`], derives each instruction's memory
//! accesses from its relocations (plan entry + offset + operand extent) and the I/O table
//! (descriptor DMAs write inputs and read outputs), and computes the partial order the
//! semaphores imply: program order within a block, plus "a wait on `sem >= v` starts after
//! the instruction whose signal brings `sem` to `v`". That requires each semaphore to be
//! signaled by one block only (otherwise which signal satisfied a wait is not determined),
//! which the checker enforces. It then verifies that every pair of instructions on
//! different blocks that touch overlapping bytes, one of them writing, is ordered; that the
//! order has no deadlock; and that every input is loaded and every output stored and
//! notified.

use crate::schedule::Access;
use nrt_hal::{Engine, NUM_ENGINES};
use nrt_isa::op;
use nrt_isa::{Instruction, Op, decode_block};
use nrt_model::{CompiledModel, MemRefKind, Usage};
use std::collections::HashMap;

/// A semaphore: `(core, index)` for core-local ones, `(usize::MAX, index)` for global ones.
type SemKey = (usize, u16);

struct Ins {
    ins: Instruction,
    accesses: Vec<Access>,
}

fn block_name(s: usize) -> String {
    format!("core {} {}", s / NUM_ENGINES, Engine::ALL[s % NUM_ENGINES])
}

/// Verifies the ordering of every hazard of `m`; the error names the two instructions.
pub fn check_ordering(m: &CompiledModel) -> Result<(), String> {
    let cores = m.sg_count as usize;
    let ns = cores * NUM_ENGINES;
    let desc = m
        .mem_refs
        .iter()
        .position(|r| r.kind == MemRefKind::IoDescriptors)
        .map(|i| i as u32);
    let mut streams: Vec<Vec<Ins>> = (0..ns).map(|_| Vec::new()).collect();
    for b in &m.blocks {
        let s = b.core as usize * NUM_ENGINES + b.engine.index();
        let decoded =
            decode_block(&b.code, b.engine).map_err(|e| format!("{}: {e:?}", block_name(s)))?;
        let relocs: HashMap<u32, (u32, u64)> = b
            .relocations
            .iter()
            .map(|r| (r.patch_offset, (r.mem_ref, r.offset)))
            .collect();
        for (at, ins) in decoded {
            let mut accesses = Vec::new();
            let mut fields = Vec::new();
            ins.address_fields(|f| fields.push(f));
            for f in fields {
                let Some(&(mr, off)) = relocs.get(&((at + f.offset) as u32)) else {
                    return Err(format!(
                        "{}: operand {} has no relocation",
                        block_name(s),
                        f.name
                    ));
                };
                if let Op::DmaDescriptors(op::DmaDescriptors { count, .. }) = ins.op {
                    if Some(mr) != desc {
                        return Err(format!(
                            "{}: descriptor DMA outside the I/O table",
                            block_name(s)
                        ));
                    }
                    let first = off / nrt_hal::wire::TRIGGER_PAIR_SIZE as u64;
                    for v in first..first + count as u64 {
                        let t =
                            m.io.get(v as usize)
                                .ok_or("descriptor past the I/O table")?;
                        accesses.push(Access::new(
                            t.mem_ref,
                            0,
                            nrt_isa::ByteRows::range(0, t.byte_size() as i128),
                            t.usage == Usage::Input,
                        ));
                    }
                    continue;
                }
                if f.extent.0 == f.extent.1 {
                    continue;
                }
                let write = matches!(f.name, "dst" | "c" | "output" | "out" | "workspace");
                let reads_too = f.name == "c"
                    && matches!(ins.op, Op::MatMul(op::MatMul { flags, .. }) if flags & nrt_isa::matmul_flags::ACCUMULATE != 0);
                let a = match f.ap {
                    Some(mut ap) => {
                        ap.addr = 0;
                        Access::of_pattern(mr, off as i128, ap, write)
                    }
                    None => Access::new(mr, off as i128, f.rows, write),
                };
                accesses.push(a);
                if reads_too {
                    accesses.push(Access { write: false, ..a });
                }
            }
            streams[s].push(Ins { ins, accesses });
        }
    }

    // Who signals each semaphore: (core or global, index) → stream.
    let key = |core: usize, sem: nrt_isa::SemRef| {
        if sem.is_global() {
            (usize::MAX, sem.index())
        } else {
            (core, sem.index())
        }
    };
    let mut signals: HashMap<SemKey, (usize, Vec<(usize, u64)>)> = HashMap::new();
    for (s, st) in streams.iter().enumerate() {
        let core = s / NUM_ENGINES;
        let mut total: HashMap<(usize, u16), u64> = HashMap::new();
        for (i, x) in st.iter().enumerate() {
            if let Some((sem, v)) = x.ins.sync.signal {
                let k = key(core, sem);
                let e = signals.entry(k).or_insert((s, Vec::new()));
                if e.0 != s {
                    return Err(format!(
                        "semaphore {:?} is signaled by {} and {}: waits on it do not prove an order",
                        k,
                        block_name(e.0),
                        block_name(s)
                    ));
                }
                let t = total.entry(k).or_insert(0);
                *t += v as u64;
                e.1.push((i, *t));
            }
            if matches!(x.ins.op, Op::Barrier(_) | Op::SemSet(_)) {
                return Err(format!(
                    "{}: the checker does not model {}",
                    block_name(s),
                    x.ins.op.name()
                ));
            }
        }
    }

    // Vector clocks: vc[t] = instructions of stream t complete before this one starts.
    let mut vcs: Vec<Vec<Vec<u32>>> = (0..ns).map(|_| Vec::new()).collect();
    let mut pos = vec![0usize; ns];
    loop {
        let mut progressed = false;
        let mut done = true;
        for s in 0..ns {
            while pos[s] < streams[s].len() {
                done = false;
                let i = pos[s];
                let mut vc = if i == 0 {
                    vec![0u32; ns]
                } else {
                    vcs[s][i - 1].clone()
                };
                vc[s] = i as u32;
                if let Some((sem, v)) = streams[s][i].ins.sync.wait {
                    let k = key(s / NUM_ENGINES, sem);
                    let Some((t, list)) = signals.get(&k) else {
                        return Err(format!(
                            "{} instruction {i} waits on {:?}, which nothing signals",
                            block_name(s),
                            k
                        ));
                    };
                    let Some(&(j, _)) = list.iter().find(|&&(_, tot)| tot >= v as u64) else {
                        return Err(format!(
                            "{} instruction {i} waits for {:?} >= {v}, which is never reached",
                            block_name(s),
                            k
                        ));
                    };
                    if pos[*t] <= j {
                        break; // producer not processed yet
                    }
                    let pv = &vcs[*t][j];
                    for (a, b) in vc.iter_mut().zip(pv) {
                        *a = (*a).max(*b);
                    }
                    vc[*t] = vc[*t].max(j as u32 + 1);
                }
                vcs[s].push(vc);
                pos[s] += 1;
                progressed = true;
            }
        }
        if done {
            break;
        }
        if !progressed {
            let stuck: Vec<String> = (0..ns)
                .filter(|&s| pos[s] < streams[s].len())
                .map(|s| format!("{} at instruction {}", block_name(s), pos[s]))
                .collect();
            return Err(format!("deadlock: {}", stuck.join(", ")));
        }
    }

    // Every hazard between different streams must be ordered.
    let mut by_ref: HashMap<u32, Vec<(usize, usize, Access)>> = HashMap::new();
    for (s, st) in streams.iter().enumerate() {
        for (i, x) in st.iter().enumerate() {
            for a in &x.accesses {
                by_ref.entry(a.mem_ref).or_default().push((s, i, *a));
            }
        }
    }
    for list in by_ref.values() {
        for (p, &(s1, i1, a1)) in list.iter().enumerate() {
            for &(s2, i2, a2) in &list[..p] {
                if s1 == s2 || !a1.conflicts(&a2) {
                    continue;
                }
                let before = vcs[s2][i2][s1] > i1 as u32;
                let after = vcs[s1][i1][s2] > i2 as u32;
                if !before && !after {
                    return Err(format!(
                        "unordered hazard on plan entry {} bytes [{}, {}) / [{}, {}): {} instruction {i1} ({}, {}) and {} instruction {i2} ({}, {})",
                        a1.mem_ref,
                        a1.lo,
                        a1.hi,
                        a2.lo,
                        a2.hi,
                        block_name(s1),
                        streams[s1][i1].ins.op.name(),
                        if a1.write { "writes" } else { "reads" },
                        block_name(s2),
                        streams[s2][i2].ins.op.name(),
                        if a2.write { "writes" } else { "reads" },
                    ));
                }
            }
        }
    }

    // Inputs loaded, outputs stored and notified.
    for (v, t) in m.io.iter().enumerate() {
        let moved = streams.iter().flatten().any(|x| {
            x.accesses
                .iter()
                .any(|a| matches!(x.ins.op, Op::DmaDescriptors(_)) && a.mem_ref == t.mem_ref)
        });
        if !moved && t.byte_size() > 0 {
            return Err(format!(
                "I/O tensor {v} ('{}') is never moved by a descriptor DMA",
                t.name
            ));
        }
        if t.usage == Usage::Output {
            let notified = streams.iter().flatten().any(|x| {
                matches!(x.ins.op, Op::Notify(op::Notify { subtype: 6, sub_id: 7, payload }) if payload == v as u32)
            });
            if !notified {
                return Err(format!("output {v} ('{}') is never notified", t.name));
            }
        }
    }
    Ok(())
}
