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
//! - across cores, the producer's engine signals a device-wide semaphore owned by that
//!   (core, engine) (`core·5 + engine`) with a `Nop` *right after the producing instruction*,
//!   and the consumer waits on it. Which instructions another core waits for is known only
//!   once the consumer is scheduled, so scheduling runs in passes: a pass that finds a
//!   dependency on an instruction without such a `Nop` appends one at the producer's current
//!   end (correct, but it also waits for everything the producer was given since — with the
//!   halves of each layer of a split MLP given alternately, that serialized the two cores)
//!   and reports it; the next pass publishes right after it. Two or three passes settle.
//!
//! Each semaphore has exactly one signaling stream, which is what lets
//! [`crate::check::check_ordering`] prove the order.

use nrt_hal::{Engine, FIRST_ENGINE_SEMAPHORE, NUM_ENGINES};
use nrt_isa::op;
use nrt_isa::{AccessPattern, ByteRows, Instruction, Op, SemRef};
use nrt_model::split_vaddr;
use std::collections::HashSet;

/// One memory access of an instruction: bytes `[lo, hi)` of plan entry `mem_ref`, of which
/// only `rows` may be touched (a block of columns touches rows of bytes inside its extent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Plan entry.
    pub mem_ref: u32,
    /// First byte.
    pub lo: i128,
    /// End (exclusive).
    pub hi: i128,
    /// The bytes touched, as rows, inside `[lo, hi)` (plan-entry offsets).
    pub rows: ByteRows,
    /// The access pattern and its offset in the plan entry, when the access is one: the
    /// finest test ([`AccessPattern::may_overlap`]) compares it row by row.
    pub ap: Option<(AccessPattern, i128)>,
    /// Whether the instruction writes (else reads) them.
    pub write: bool,
}

impl Access {
    /// An access to the rows `rows` (relative to `off`) of plan entry `mem_ref`.
    pub fn new(mem_ref: u32, off: i128, rows: ByteRows, write: bool) -> Access {
        let rows = rows.shifted(off);
        let (lo, hi) = rows.extent();
        Access {
            mem_ref,
            lo,
            hi,
            rows,
            ap: None,
            write,
        }
    }

    /// The access of pattern `ap` placed at offset `off` of plan entry `mem_ref`.
    pub fn of_pattern(mem_ref: u32, off: i128, ap: AccessPattern, write: bool) -> Access {
        Access {
            ap: Some((ap, off)),
            ..Access::new(mem_ref, off, ap.byte_rows(), write)
        }
    }

    /// Whether two accesses are a hazard (they may share a byte, one writes). The two column
    /// halves of a matrix split across cores are not: their rows of bytes interleave.
    pub fn conflicts(&self, o: &Access) -> bool {
        self.mem_ref == o.mem_ref
            && (self.write || o.write)
            && self.lo < o.hi
            && o.lo < self.hi
            && self.rows.may_overlap(&o.rows)
            && match (self.ap, o.ap) {
                (Some((a, ao)), Some((b, bo))) => {
                    a.may_overlap(ao, &b, bo, nrt_hal::tuning::HAZARD_ROW_LIST_MAX)
                }
                _ => true,
            }
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
    if let Op::DmaDescriptors(op::DmaDescriptors { table, count }) = op {
        if let Some((mr, off)) = split_vaddr(*table)
            && Some(mr) == desc_table
        {
            let first = off / nrt_hal::wire::TRIGGER_PAIR_SIZE as u64;
            for v in first..first + *count as u64 {
                if let Some(t) = io.get(v as usize) {
                    out.push(Access::new(
                        t.mem_ref,
                        0,
                        ByteRows::range(0, t.bytes as i128),
                        t.input,
                    ));
                }
            }
        }
        return;
    }
    let mut op = *op;
    for_each_ap_mut(&mut op, |ap, write| {
        if let Some((mr, off)) = split_vaddr(ap.addr)
            && ap.byte_rows().width > 0
        {
            let mut at = *ap;
            at.addr = 0;
            out.push(Access::of_pattern(mr, off as i128, at, write));
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
    /// The count of its stream's device-wide semaphore that the `Nop` right after it
    /// brings, when it has one.
    published: Option<u32>,
}

struct Stream {
    instrs: Vec<Instruction>,
    recs: Vec<Rec>,
    local_sig: u32,
    published: u32,
    known: Vec<u32>,
}

/// Most scheduling passes (each pass only adds instructions to publish right after).
const MAX_PASSES: usize = 4;

/// Schedules `prog` (program order) onto `cores × 5` streams; returns the instructions of
/// each stream, indexed `core·5 + engine`.
pub fn schedule(
    prog: &[(u8, Engine, Instruction)],
    cores: usize,
    io: &[IoInfo],
    desc_table: Option<u32>,
) -> Vec<Vec<Instruction>> {
    // Instructions (by position in `prog`) that publish their completion right after.
    let mut eager: HashSet<usize> = HashSet::new();
    let mut pass = 0;
    loop {
        let (out, late) = schedule_pass(prog, cores, io, desc_table, &eager);
        pass += 1;
        if late.is_empty() || pass == MAX_PASSES {
            return out;
        }
        eager.extend(late);
    }
}

/// One scheduling pass; also returns the instructions (positions in `prog`) another core
/// waited for that did not publish right after themselves.
fn schedule_pass(
    prog: &[(u8, Engine, Instruction)],
    cores: usize,
    io: &[IoInfo],
    desc_table: Option<u32>,
    eager: &HashSet<usize>,
) -> (Vec<Vec<Instruction>>, Vec<usize>) {
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
    // Position in `prog` of each stream's records.
    let mut origin: Vec<Vec<usize>> = vec![Vec::new(); ns];
    let mut late: Vec<usize> = Vec::new();
    let mut acc = Vec::new();
    for (pos, &(core, engine, ins)) in prog.iter().enumerate() {
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
            } else if let Some(count) = st[t].recs[ri].published {
                let r = &st[t].recs[ri];
                waits.push((publish_semaphore(t_core, t_engine), count));
                let mut v = r.vc.clone();
                v[t] = v[t].max(r.idx + 1);
                vc = v;
            } else {
                late.push(origin[t][ri]);
                let sem = publish_semaphore(t_core, t_engine);
                let ts = &mut st[t];
                ts.instrs
                    .push(Instruction::new(Op::Nop(op::Nop)).signal(sem, 1));
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
            me.instrs.push(
                Instruction::new(Op::Nop(op::Nop))
                    .wait(w.0, w.1)
                    .signal(sem, 1),
            );
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
        let published = eager.contains(&pos).then(|| {
            me.instrs.push(
                Instruction::new(Op::Nop(op::Nop)).signal(publish_semaphore(core, engine), 1),
            );
            me.published += 1;
            me.published
        });
        me.recs.push(Rec {
            idx,
            accesses: acc.clone(),
            vc,
            sig: me.local_sig,
            published,
        });
        origin[s].push(pos);
        me.known[s] = idx + 1;
    }
    late.sort_unstable();
    late.dedup();
    (st.into_iter().map(|s| s.instrs).collect(), late)
}
