//! Model load and unload: everything an execution will ever need is allocated and wired here.
//!
//! Load decodes the NCM container, instantiates its static memory plan (each plan entry gets
//! a fixed physical address), resolves every relocation as `addr = offset +
//! mr.physical_address` (bounds were checked by the decoder; an entry with no address is an
//! *unstaged variable* and fails the load, naming it), writes the instruction blocks and
//! constants to device memory, and allocates per core the exec-request ring, the request
//! buffer, and registers the ring with the device. It also builds the model's I/O descriptor
//! sets (one per in-flight slot) and the host-clone buffers the synchronous surface copies
//! host tensors into. After load, an execution only patches and appends.

use crate::error::{NrtError, Result};
use crate::tensor::Tensor;
use crate::{RuntimeInner, VCore};
use nrt_hal::wire::{EXEC_RING_SLOT_SIZE, REQUEST_SLOT_SIZE, TRIGGER_PAIR_SIZE};
use nrt_hal::{
    DType, DevAddr, Device, DeviceMapping, DmaKind, ExecQueueDesc, NUM_ENGINES, NrtStatus,
    TriggerPair, tuning,
};
use nrt_model::{CompiledModel, MemRefKind, Usage};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Options for [`crate::Runtime::load`].
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Execution timeout; `None` reads `NEURON_RT_EXEC_TIMEOUT` (default 30 s).
    pub exec_timeout: Option<Duration>,
    /// **Resident I/O**: device tensors bound to inputs (by name) once, at load. The program
    /// reads (and, for an in-place output over such an input, writes) the tensor where it
    /// lies: nothing is copied per execution, and several models can share one tensor —
    /// an LLM's programs all read the same weights and update the same KV cache. An
    /// execution may leave a resident input (or its in-place output) out of its sets, or
    /// pass the same tensor; another tensor is refused. The tensor must be a device tensor
    /// of the model's logical core, of the input's size, 64-byte aligned; it stays alive
    /// while the model is loaded.
    pub resident: Vec<(String, Tensor)>,
}

/// What a model input or output is (`nrt_tensor_info_t`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name.
    pub name: String,
    /// Input or output.
    pub usage: Usage,
    /// Size in bytes.
    pub size: u64,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<u32>,
    /// For an output that updates an input in place (in-place state, NCM 1.10): that
    /// input's name. Bind the same tensor to both.
    pub in_place_of: Option<String>,
}

pub(crate) struct IoBinding {
    pub(crate) info: TensorInfo,
    /// The tensor bound at load ([`LoadOptions::resident`]; an in-place output shares its
    /// input's): the program addresses it directly, no descriptor copies it.
    pub(crate) resident: Option<Tensor>,
    /// The index in the model's I/O of the input this output updates in place.
    pub(crate) in_place_of: Option<usize>,
    /// PA of the MR_IO buffer the instructions read or write.
    pub(crate) buf: DevAddr,
}

/// One core's share of a loaded model.
pub(crate) struct CoreResources {
    /// Physical core.
    pub(crate) phys: u32,
    /// Exec queue id on the device.
    pub(crate) queue: u16,
    /// PA of each engine's block.
    pub(crate) blocks: [DevAddr; NUM_ENGINES],
    pub(crate) ring: DevAddr,
    pub(crate) tail_addr: DevAddr,
    pub(crate) event_addr: DevAddr,
    /// Host view of the request buffer (one 64-byte slot per ring slot).
    pub(crate) req_buf: DeviceMapping,
    /// Next ring slot. Written only under the vcore's staging lock.
    pub(crate) tail: AtomicU32,
}

/// One I/O descriptor set: owned by one execution from bind until retire.
pub(crate) struct IoSet {
    /// Tensor id last patched into each I/O's descriptor (0 = the set's own clone buffer or
    /// nothing). Read and written by the set's owner only.
    pub(crate) bound_ids: Box<[AtomicU64]>,
    /// The tensors bound for the current execution (streaming completion, pending counts).
    /// Written by the owner at bind and cleared at retire; read by the harvest in between.
    pub(crate) tensors: UnsafeCell<Box<[Option<Tensor>]>>,
}

// SAFETY: `tensors` is accessed under the set-ownership protocol described on the field:
// one owner writes it before publishing the execution (ticket, Release) and clears it after
// the execution is done (done word, Acquire); the harvest reads it only in between.
unsafe impl Sync for IoSet {}

/// One set's host-clone buffers: per I/O its device address and host mapping.
pub(crate) type HostClones = Vec<(DevAddr, DeviceMapping)>;

pub(crate) struct IoSets {
    /// Host view of all sets' descriptor tables (`sets × stride` bytes).
    pub(crate) table: Option<DeviceMapping>,
    pub(crate) stride: u64,
    pub(crate) sets: Box<[IoSet]>,
    /// Free sets, one bit each.
    pub(crate) free: AtomicU64,
    /// Host-clone buffers: `clone[s][i]` for the first `HOST_CLONE_SETS` sets, allocated by
    /// the first bind of host tensors with set `s` ([`ModelShared::host_clones`]).
    pub(crate) clone: Box<[std::sync::OnceLock<HostClones>]>,
}

impl IoSets {
    /// Takes the lowest free set (< `limit`), or `None` if all are in use.
    pub(crate) fn acquire(&self, limit: u32) -> Option<u32> {
        let mask = if limit >= 64 {
            u64::MAX
        } else {
            (1u64 << limit) - 1
        };
        let mut cur = self.free.load(Ordering::Acquire);
        loop {
            let avail = cur & mask;
            if avail == 0 {
                return None;
            }
            let s = avail.trailing_zeros();
            match self.free.compare_exchange_weak(
                cur,
                cur & !(1 << s),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(s),
                Err(x) => cur = x,
            }
        }
    }

    pub(crate) fn release(&self, s: u32) {
        self.free.fetch_or(1 << s, Ordering::Release);
    }

    /// Whether every set is free: no execution of the model is bound, staged or in flight
    /// (each holds its set from `bind` until it is retired, or unbound on a failure path).
    pub(crate) fn all_free(&self) -> bool {
        let all = match self.sets.len() {
            n if n >= 64 => u64::MAX,
            n => (1u64 << n) - 1,
        };
        self.free.load(Ordering::Acquire) == all
    }

    /// Writes the tensor-side address of I/O `i` in set `s`.
    pub(crate) fn patch(&self, s: u32, i: usize, input: bool, addr: DevAddr) {
        if let Some(t) = &self.table {
            let off = s as usize * self.stride as usize
                + i * TRIGGER_PAIR_SIZE
                + if input { 0 } else { 16 };
            t.write(off, &addr.to_le_bytes());
        }
    }
}

pub(crate) const STATE_LOADED: u8 = 0;
pub(crate) const STATE_UNLOADING: u8 = 1;
pub(crate) const STATE_UNLOADED: u8 = 2;

/// A loaded model, shared by the registry and every execution in flight.
pub(crate) struct ModelShared {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) vnc: u32,
    pub(crate) sg_count: u32,
    pub(crate) io: Vec<IoBinding>,
    pub(crate) exec_timeout: Duration,
    pub(crate) cores: Vec<CoreResources>,
    pub(crate) io_sets: IoSets,
    pub(crate) state: AtomicU8,
    allocations: Mutex<Vec<DevAddr>>,
    /// Device bytes by [`crate::host::MEM_NAMES`] (published while loaded).
    pub(crate) mem: [u64; 6],
    /// How long its synchronous callers spin before they block: the moving average of its
    /// sampled latency (written by the harvest, under the token).
    pub(crate) spin: nrt_hal::SpinBudget,
    /// How long its sampled executions took to run, queueing left out: from their staging or
    /// the previous execution's completion, whichever came later, to their own completion
    /// ([`crate::wait::service_time`]; written by the harvest, under the token).
    pub(crate) service: nrt_hal::SpinBudget,
    /// Its entry in the published record's model table (`None`: no record, or the table
    /// was full).
    pub(crate) published: Option<usize>,
}

impl ModelShared {
    pub(crate) fn tensor_info(&self) -> Vec<TensorInfo> {
        self.io.iter().map(|b| b.info.clone()).collect()
    }

    /// Set `s`'s host-clone buffers, allocated now if this is the set's first bind of host
    /// tensors. The caller owns set `s` (from `IoSets::acquire`), so nobody else fills it.
    /// Device memory running out is an error naming the model, not an abort.
    #[cold]
    pub(crate) fn host_clones(
        &self,
        dev: &dyn Device,
        s: u32,
    ) -> Result<&[(DevAddr, DeviceMapping)]> {
        let cell = &self.io_sets.clone[s as usize];
        if let Some(v) = cell.get() {
            return Ok(v);
        }
        let mut v = Vec::with_capacity(self.io.len());
        let mut got: Vec<DevAddr> = Vec::with_capacity(self.io.len());
        let fail = |got: &[DevAddr], e: String| {
            for &a in got {
                let _ = dev.mem_free(a);
            }
            NrtError::new(
                NrtStatus::Resource,
                format!(
                    "model '{}': cannot allocate the device buffers that host tensors are \
                     copied through ({e}); bind device tensors instead",
                    self.name
                ),
            )
        };
        for b in &self.io {
            let a = dev.mem_alloc(b.info.size.max(1), 64).map_err(|e| {
                fail(
                    &got,
                    format!("'{}', {} bytes: {e}", b.info.name, b.info.size),
                )
            })?;
            got.push(a);
            let m = dev
                .map(a, b.info.size)
                .map_err(|e| fail(&got, format!("'{}': {e}", b.info.name)))?;
            v.push((a, m));
        }
        self.allocations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(&got);
        Ok(cell.get_or_init(|| v))
    }

    /// Frees the device resources (at unload, once nothing is in flight).
    pub(crate) fn release(&self, dev: &dyn Device) {
        for c in &self.cores {
            let _ = dev.exec_queue_release(c.phys, c.queue);
        }
        let mut a = self.allocations.lock().unwrap_or_else(|e| e.into_inner());
        for addr in a.drain(..) {
            let _ = dev.mem_free(addr);
        }
    }
}

/// Device allocations made during a load, freed if the load fails.
struct Allocs<'d> {
    dev: &'d dyn Device,
    /// For the memory-usage dump of an allocation that runs out of memory.
    rt: &'d RuntimeInner,
    vnc: u32,
    model: &'d str,
    list: Vec<DevAddr>,
    /// Bytes by [`crate::host::MEM_NAMES`].
    bytes: [u64; 6],
}

/// The memory category ([`crate::host::mem`]) of a load allocation, by what it is for.
fn category(what: &str) -> usize {
    use crate::host::mem;
    if what == "constants" {
        mem::CONSTANTS
    } else if what == "instruction blocks" {
        mem::MODEL_CODE
    } else if what.starts_with("the scratch") || what.starts_with("the state buffer") {
        mem::SCRATCHPAD
    } else {
        mem::RUNTIME
    }
}

impl Allocs<'_> {
    fn alloc(&mut self, size: u64, align: u64, what: &str) -> Result<DevAddr> {
        let c = category(what);
        let a = self
            .dev
            .mem_alloc(size.max(1), align.max(64))
            .map_err(|e| match e {
                nrt_hal::HalError::OutOfMemory { free, .. } => crate::host::out_of_device_memory(
                    self.rt,
                    self.vnc,
                    size,
                    what,
                    c,
                    Some((self.model, &self.bytes)),
                    free,
                ),
                e => NrtError::new(
                    NrtStatus::Resource,
                    format!("cannot allocate {size} bytes of device memory for {what}: {e}"),
                ),
            })?;
        self.list.push(a);
        self.bytes[c] = self.bytes[c].saturating_add(size);
        Ok(a)
    }

    fn map(&self, addr: DevAddr, len: u64) -> Result<DeviceMapping> {
        Ok(self.dev.map(addr, len)?)
    }
}

impl Drop for Allocs<'_> {
    fn drop(&mut self) {
        for a in self.list.drain(..) {
            let _ = self.dev.mem_free(a);
        }
    }
}

pub(crate) fn load(
    rt: &Arc<RuntimeInner>,
    bytes: &[u8],
    vcore: &VCore,
    id: u32,
    opts: &LoadOptions,
) -> Result<ModelShared> {
    let m = CompiledModel::decode(bytes)?;
    let dev = &*rt.device;
    if m.sg_count as usize > vcore.cores.len() {
        return Err(NrtError::new(
            NrtStatus::LoadNotEnoughNc,
            format!(
                "model '{}' needs {} NeuronCores per logical core; logical core {} has {} (NEURON_LOGICAL_NC_CONFIG)",
                m.name,
                m.sg_count,
                vcore.index,
                vcore.cores.len()
            ),
        ));
    }
    let exec_timeout = match opts.exec_timeout {
        Some(t) => t.max(tuning::MIN_EXEC_TIMEOUT),
        None => crate::config::exec_timeout_from_env()?,
    };
    let resident = resident_io(&m, vcore, opts)?;
    let mut allocs = Allocs {
        dev,
        rt,
        vnc: vcore.index,
        model: &m.name,
        list: Vec::new(),
        bytes: [0; 6],
    };

    // 1. Instantiate the static plan: a physical address for every entry.
    let sg = m.sg_count as usize;
    let mut pa: Vec<Option<Vec<DevAddr>>> = vec![None; m.mem_refs.len()];
    let max_align = |kind: MemRefKind| {
        m.mem_refs
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.align)
            .max()
            .unwrap_or(64)
    };
    let consts = if m.constants.is_empty() {
        0
    } else {
        let a = allocs.alloc(
            m.constants.len() as u64,
            max_align(MemRefKind::Buffer),
            "constants",
        )?;
        dev.copy_in(a, &m.constants)?;
        a
    };
    let scratch = if m.scratch_bytes() > 0 {
        allocs.alloc(
            m.scratch_bytes(),
            max_align(MemRefKind::VirtualTmpBuf),
            "the scratch arena",
        )?
    } else {
        0
    };
    let mut sb = Vec::new();
    if m.sb_bytes() > 0 {
        for c in 0..sg {
            sb.push(allocs.alloc(
                m.sb_bytes(),
                max_align(MemRefKind::Sb),
                &format!("the state buffer of core {c}"),
            )?);
        }
    }
    let sets = tuning::EXEC_RING_SLOTS as usize;
    let mut io_table = None;
    let mut stride = 0;
    for (i, r) in m.mem_refs.iter().enumerate() {
        pa[i] = match r.kind {
            MemRefKind::Buffer => Some(vec![consts + r.offset]),
            MemRefKind::VirtualTmpBuf => Some(vec![scratch + r.offset]),
            MemRefKind::Sb => Some(sb.iter().map(|b| b + r.offset).collect()),
            MemRefKind::Io => {
                let k = r.offset as usize;
                let name = &m.io[k].name;
                match (&resident[k], m.io[k].in_place_of) {
                    (Some(t), _) => Some(vec![t.device_address().expect("checked: device")]),
                    // An in-place output shares its input's buffer (filled later).
                    (None, Some(_)) => None,
                    (None, None) => Some(vec![allocs.alloc(
                        r.size,
                        r.align,
                        &format!("tensor '{name}'"),
                    )?]),
                }
            }
            MemRefKind::IoDescriptors => {
                stride = r.size.next_multiple_of(64);
                let a = allocs.alloc(stride * sets as u64, 64, "I/O descriptor sets")?;
                io_table = Some((a, allocs.map(a, stride * sets as u64)?));
                Some(vec![a])
            }
            MemRefKind::Remote => None,
        };
    }
    // In-place outputs: the buffer of the input they update (so the program starts from
    // the input's data whether or not the tensor is resident).
    for t in m.io.iter() {
        if let Some(k) = t.in_place_of {
            pa[t.mem_ref as usize] = pa[m.io[k as usize].mem_ref as usize].clone();
        }
    }
    let addr_of = |mr: u32, core: usize| -> Option<DevAddr> {
        let v = pa[mr as usize].as_ref()?;
        Some(if v.len() == 1 { v[0] } else { v[core] })
    };

    // 2. Relocate and write the instruction blocks (one allocation for all of them).
    let code_bytes: u64 = m
        .blocks
        .iter()
        .map(|b| (b.code.len() as u64).next_multiple_of(64))
        .sum();
    let code_base = allocs.alloc(code_bytes, 64, "instruction blocks")?;
    let mut at = code_base;
    let mut block_addr = vec![[0u64; NUM_ENGINES]; sg];
    for b in &m.blocks {
        let mut code = b.code.clone();
        for r in &b.relocations {
            let kind = m.mem_refs[r.mem_ref as usize].kind;
            let base = addr_of(r.mem_ref, b.core as usize).ok_or_else(|| {
                NrtError::invalid(format!(
                    "variable plan[{}] ({}) used by core {} engine {} is not staged in device memory",
                    r.mem_ref,
                    kind.name(),
                    b.core,
                    b.engine
                ))
            })?;
            let p = r.patch_offset as usize;
            code[p..p + 8].copy_from_slice(&(base + r.offset).to_le_bytes());
        }
        dev.copy_in(at, &code)?;
        block_addr[b.core as usize][b.engine.index()] = at;
        at += (code.len() as u64).next_multiple_of(64);
    }

    // 3. I/O buffers, descriptor sets, host-clone buffers.
    let io: Vec<IoBinding> =
        m.io.iter()
            .enumerate()
            .map(|(k, t)| IoBinding {
                info: TensorInfo {
                    name: t.name.clone(),
                    usage: t.usage,
                    size: t.byte_size(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    in_place_of: t.in_place_of.map(|k| m.io[k as usize].name.clone()),
                },
                in_place_of: t.in_place_of.map(|k| k as usize),
                resident: resident[k].clone(),
                buf: addr_of(t.mem_ref, 0).expect("MR_IO entries are always staged"),
            })
            .collect();
    // Host-clone buffers are allocated by the first bind of host tensors that uses a set
    // ([`ModelShared::host_clones`]): a model bound only to device tensors (an LLM program
    // whose inputs are the weights and the KV cache) never pays `HOST_CLONE_SETS` copies of
    // its whole I/O.
    let clone = (0..tuning::HOST_CLONE_SETS)
        .map(|_| std::sync::OnceLock::new())
        .collect();
    if let Some((_, map)) = &io_table {
        for s in 0..sets {
            for (i, b) in io.iter().enumerate() {
                // A resident tensor is where the program reads it: nothing to copy.
                let len = if b.resident.is_some() {
                    0
                } else {
                    b.info.size as u32
                };
                let pair = TriggerPair::new(DmaKind::Data, b.buf, b.buf, len, 0);
                map.write(
                    s * stride as usize + i * TRIGGER_PAIR_SIZE,
                    &pair.to_bytes(),
                );
            }
        }
    }
    let io_sets = IoSets {
        table: io_table.map(|(_, m)| m),
        stride,
        sets: (0..sets)
            .map(|_| IoSet {
                bound_ids: (0..io.len()).map(|_| AtomicU64::new(0)).collect(),
                tensors: UnsafeCell::new((0..io.len()).map(|_| None).collect()),
            })
            .collect(),
        free: AtomicU64::new(if sets >= 64 {
            u64::MAX
        } else {
            (1u64 << sets) - 1
        }),
        clone,
    };

    // 4. Per core: exec ring, tail/event words, request buffer; register the ring.
    let slots = tuning::EXEC_RING_SLOTS;
    let mut cores = Vec::with_capacity(sg);
    let mut registered: Vec<(u32, u16)> = Vec::new();
    let unregister = |r: &[(u32, u16)]| {
        for &(c, q) in r {
            let _ = dev.exec_queue_release(c, q);
        }
    };
    for (c, blocks) in block_addr.iter().enumerate() {
        let phys = vcore.cores[c];
        let build = |allocs: &mut Allocs| -> Result<CoreResources> {
            let ring = allocs.alloc(slots as u64 * EXEC_RING_SLOT_SIZE, 64, "the exec ring")?;
            let words = allocs.alloc(64, 64, "the exec ring words")?;
            dev.memset(words, 0, 64)?;
            let req = allocs.alloc(slots as u64 * REQUEST_SLOT_SIZE, 64, "the request buffer")?;
            let req_buf = allocs.map(req, slots as u64 * REQUEST_SLOT_SIZE)?;
            let queue = dev.exec_queue_register(
                phys,
                ExecQueueDesc {
                    ring_addr: ring,
                    slots,
                    tail_addr: words,
                    event_addr: words + 4,
                    io_set_stride: stride,
                },
            )?;
            Ok(CoreResources {
                phys,
                queue,
                blocks: *blocks,
                ring,
                tail_addr: words,
                event_addr: words + 4,
                req_buf,
                tail: AtomicU32::new(0),
            })
        };
        match build(&mut allocs) {
            Ok(r) => {
                registered.push((phys, r.queue));
                cores.push(r);
            }
            Err(e) => {
                unregister(&registered);
                return Err(e);
            }
        }
    }
    let list = std::mem::take(&mut allocs.list);
    let mem = allocs.bytes;
    let published = rt.stats.publish_model(id, vcore.index, &m.name, &mem);
    rt.trace.note_model(id, &m.name, vcore.index);
    Ok(ModelShared {
        id,
        name: m.name.clone(),
        vnc: vcore.index,
        sg_count: m.sg_count,
        io,
        exec_timeout,
        cores,
        io_sets,
        state: AtomicU8::new(STATE_LOADED),
        allocations: Mutex::new(list),
        mem,
        spin: nrt_hal::SpinBudget::new(),
        service: nrt_hal::SpinBudget::new(),
        published,
    })
}

/// The tensor bound at load to each I/O (by index), from [`LoadOptions::resident`]: each
/// named input checked (a device tensor of this logical core, of the input's size, aligned),
/// and every in-place output over a resident input resident with it.
fn resident_io(
    m: &CompiledModel,
    vcore: &VCore,
    opts: &LoadOptions,
) -> Result<Vec<Option<Tensor>>> {
    let mut out: Vec<Option<Tensor>> = vec![None; m.io.len()];
    for (name, t) in &opts.resident {
        let bad = |why: String| {
            NrtError::invalid(format!(
                "resident input '{name}' of model '{}': {why}",
                m.name
            ))
        };
        let Some(k) = m.io.iter().position(|x| &x.name == name) else {
            return Err(bad("the model has no such input".into()));
        };
        let io = &m.io[k];
        if io.usage != Usage::Input {
            return Err(bad(
                "it is an output; name the input it updates in place".into()
            ));
        }
        let Some(addr) = t.device_address() else {
            return Err(bad(format!("tensor '{}' is not a device tensor", t.name())));
        };
        if t.vnc() != vcore.index as i32 {
            return Err(bad(format!(
                "tensor '{}' lives on logical NeuronCore {}, the model on {}",
                t.name(),
                t.vnc(),
                vcore.index
            )));
        }
        if t.size() != io.byte_size() {
            return Err(bad(format!(
                "tensor '{}' is {} bytes; the input is {}",
                t.name(),
                t.size(),
                io.byte_size()
            )));
        }
        let align = m
            .mem_refs
            .get(io.mem_ref as usize)
            .map_or(64, |r| r.align.max(1));
        if addr % align != 0 {
            return Err(bad(format!(
                "tensor '{}' is not {align}-byte aligned (a slice at an unaligned offset)",
                t.name()
            )));
        }
        if out[k].is_some() {
            return Err(bad("named twice".into()));
        }
        out[k] = Some(t.clone());
    }
    for (i, io) in m.io.iter().enumerate() {
        if let Some(k) = io.in_place_of {
            out[i] = out[k as usize].clone();
        }
    }
    Ok(out)
}
