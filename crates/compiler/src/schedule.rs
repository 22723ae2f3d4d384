//! Semaphore scheduling: turns the lowered program (one instruction list in program order,
//! each tagged with its core and engine) into one block per core and engine, inserting the
//! waits every cross-engine data dependency needs.
//!
//! Scheme:
//! - every instruction (except cross-core publish markers) signals its engine's *progress
//!   semaphore* `FIRST_ENGINE_SEMAPHORE + engine` by 1, so "engine E finished its k-th
//!   instruction" is `sem >= k`;
//! - an instruction that touches bytes an earlier instruction of another engine touched
//!   (read-after-write, write-after-read, write-after-write) waits for that engine's
//!   latest such instruction — waits already implied (tracked with vector clocks) are
//!   skipped; an instruction has one wait slot, so extra waits go on `Nop`s before it;
//! - across cores, the producer's engine appends a `Nop` that signals a device-wide
//!   semaphore owned by that (core, engine) (`core·5 + engine`), and the consumer waits on it.
//!
//! Each semaphore has exactly one signaling stream, which is what lets
//! [`crate::check::check_ordering`] prove the order.

use nrt_hal::{Engine, FIRST_ENGINE_SEMAPHORE, NUM_ENGINES};
use nrt_isa::{AccessPattern, Instruction, Op, SemRef};
use nrt_model::split_vaddr;

/// One memory access of an instruction: bytes `[lo, hi)` of plan entry `mem_ref`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Plan entry.
    pub mem_ref: u32,
    /// First byte.
    pub lo: i128,
    /// End (exclusive).
    pub hi: i128,
    /// Whether the instruction writes (else reads) them.
    pub write: bool,
}

impl Access {
    /// Whether two accesses are a hazard (overlap, one writes).
    pub fn conflicts(&self, o: &Access) -> bool {
        self.mem_ref == o.mem_ref && (self.write || o.write) && self.lo < o.hi && o.lo < self.hi
    }
}

/// Calls `f` on every access pattern of `op` with whether the operand is written — from the
/// ISA's one operand table ([`Op::operands_mut`]). A read-write operand (an accumulating
/// MatMul's `c`) is visited twice, as a read and then as a write, so the hazard analysis sees
/// both.
pub fn for_each_ap_mut(op: &mut Op, mut f: impl FnMut(&mut AccessPattern, bool)) {
    op.operands_mut(|o| {
        if o.role.reads() {
            f(o.ap, false);
        }
        if o.role.writes() {
            f(o.ap, true);
        }
    });
}

/// One I/O tensor as the scheduler sees it: its plan entry, byte size, and direction.
#[derive(Clone, Copy, Debug)]
pub struct IoInfo {
    /// Its `MR_IO` plan entry.
    pub mem_ref: u32,
    /// Bytes.
    pub bytes: u64,
    /// Input (the descriptor writes the buffer) or output (it reads it).
    pub input: bool,
}

/// The accesses of an instruction whose addresses are virtual addresses
/// ([`nrt_model::vaddr`]). `desc_table` is the plan entry of the I/O descriptor table.
pub fn accesses(op: &Op, io: &[IoInfo], desc_table: Option<u32>, out: &mut Vec<Access>) {
    if let Op::DmaDescriptors { table, count } = op {
        if let Some((mr, off)) = split_vaddr(*table)
            && Some(mr) == desc_table
        {
            let first = off / nrt_hal::wire::TRIGGER_PAIR_SIZE as u64;
            for v in first..first + *count as u64 {
                if let Some(t) = io.get(v as usize) {
                    out.push(Access {
                        mem_ref: t.mem_ref,
                        lo: 0,
                        hi: t.bytes as i128,
                        write: t.input,
                    });
                }
            }
        }
        return;
    }
    let mut op = *op;
    for_each_ap_mut(&mut op, |ap, write| {
        if let Some((mr, off)) = split_vaddr(ap.addr) {
            let (lo, hi) = ap.byte_extent();
            if lo != hi {
                out.push(Access {
                    mem_ref: mr,
                    lo: off as i128 + lo,
                    hi: off as i128 + hi,
                    write,
                });
            }
        }
    });
}

/// The progress semaphore of `engine` on its core.
pub fn progress_semaphore(engine: Engine) -> SemRef {
    SemRef::local((FIRST_ENGINE_SEMAPHORE as usize + engine.index()) as u16)
}

/// The device-wide semaphore `core`'s `engine` publishes its progress on.
pub fn publish_semaphore(core: u8, engine: Engine) -> SemRef {
    SemRef::global((core as usize * NUM_ENGINES + engine.index()) as u16)
}

struct Rec {
    idx: u32,
    accesses: Vec<Access>,
    vc: Vec<u32>,
    sig: u32,
}

struct Stream {
    instrs: Vec<Instruction>,
    recs: Vec<Rec>,
    local_sig: u32,
    published: u32,
    known: Vec<u32>,
}

/// Schedules `prog` (program order) onto `cores × 5` streams; returns the instructions of
/// each stream, indexed `core·5 + engine`.
pub fn schedule(
    prog: &[(u8, Engine, Instruction)],
    cores: usize,
    io: &[IoInfo],
    desc_table: Option<u32>,
) -> Vec<Vec<Instruction>> {
    let ns = cores * NUM_ENGINES;
    let mut st: Vec<Stream> = (0..ns)
        .map(|_| Stream {
            instrs: Vec::new(),
            recs: Vec::new(),
            local_sig: 0,
            published: 0,
            known: vec![0; ns],
        })
        .collect();
    let mut acc = Vec::new();
    for &(core, engine, ins) in prog {
        let s = core as usize * NUM_ENGINES + engine.index();
        acc.clear();
        accesses(&ins.op, io, desc_table, &mut acc);
        // Latest conflicting instruction of every other stream not already known complete.
        let mut needs: Vec<(usize, usize)> = Vec::new();
        for (t, ts) in st.iter().enumerate() {
            if t == s {
                continue;
            }
            let known = st[s].known[t];
            for (ri, r) in ts.recs.iter().enumerate().rev() {
                if r.idx < known {
                    break;
                }
                if r.accesses
                    .iter()
                    .any(|a| acc.iter().any(|b| a.conflicts(b)))
                {
                    needs.push((t, ri));
                    break;
                }
            }
        }
        // Later instructions first: their clocks are most likely to cover the others.
        needs.sort_by_key(|&(t, ri)| std::cmp::Reverse(st[t].recs[ri].vc.iter().sum::<u32>()));
        let mut waits: Vec<(SemRef, u32)> = Vec::new();
        for (t, ri) in needs {
            let r_idx = st[t].recs[ri].idx;
            if st[s].known[t] > r_idx {
                continue;
            }
            let (t_core, t_engine) = ((t / NUM_ENGINES) as u8, Engine::ALL[t % NUM_ENGINES]);
            let vc: Vec<u32>;
            if t_core == core {
                let r = &st[t].recs[ri];
                waits.push((progress_semaphore(t_engine), r.sig));
                let mut v = r.vc.clone();
                v[t] = v[t].max(r.idx + 1);
                vc = v;
            } else {
                let sem = publish_semaphore(t_core, t_engine);
                let ts = &mut st[t];
                ts.instrs.push(Instruction::new(Op::Nop).signal(sem, 1));
                ts.published += 1;
                let mut v = ts.known.clone();
                v[t] = ts.instrs.len() as u32 - 1;
                ts.known[t] = ts.instrs.len() as u32;
                waits.push((sem, ts.published));
                vc = v;
            }
            let k = &mut st[s].known;
            for (a, b) in k.iter_mut().zip(&vc) {
                *a = (*a).max(*b);
            }
        }
        let me = &mut st[s];
        let sem = progress_semaphore(engine);
        let last = waits.pop();
        for w in waits {
            me.instrs
                .push(Instruction::new(Op::Nop).wait(w.0, w.1).signal(sem, 1));
            me.local_sig += 1;
        }
        let mut ins = ins;
        ins.sync.wait = last;
        ins.sync.signal = Some((sem, 1));
        let idx = me.instrs.len() as u32;
        me.instrs.push(ins);
        me.local_sig += 1;
        me.known[s] = idx;
        let vc = me.known.clone();
        me.recs.push(Rec {
            idx,
            accesses: acc.clone(),
            vc,
            sig: me.local_sig,
        });
        me.known[s] = idx + 1;
    }
    st.into_iter().map(|s| s.instrs).collect()
}
