//! Building a [`CompiledModel`] in code: the compiler's emitter, the runtime's built-in models
//! and the tests use it.
//!
//! Instructions are written with *virtual addresses* ([`vaddr`]: the plan entry in the high
//! bits, the offset inside it in the low 40). [`ModelBuilder::build`] turns every address
//! field into a relocation and zeroes it, which is exactly the form the container stores.

use crate::*;
use nrt_hal::wire::TRIGGER_PAIR_SIZE;
use nrt_isa::op;
use nrt_isa::{Instruction, Op};

/// Bits of a virtual address that hold the offset inside the plan entry.
pub const VADDR_OFFSET_BITS: u32 = 40;

/// The virtual address of byte `offset` of plan entry `mem_ref`.
pub const fn vaddr(mem_ref: u32, offset: u64) -> u64 {
    ((mem_ref as u64 + 1) << VADDR_OFFSET_BITS) | offset
}

/// Splits a virtual address; `None` if it names no plan entry.
pub const fn split_vaddr(addr: u64) -> Option<(u32, u64)> {
    let hi = addr >> VADDR_OFFSET_BITS;
    if hi == 0 {
        None
    } else {
        Some(((hi - 1) as u32, addr & ((1 << VADDR_OFFSET_BITS) - 1)))
    }
}

/// Incrementally builds a model.
#[derive(Debug, Clone)]
pub struct ModelBuilder {
    name: String,
    producer: String,
    sg_count: u32,
    io: Vec<IoTensor>,
    mem_refs: Vec<MemRef>,
    blocks: Vec<Vec<Instruction>>,
    constants: Vec<u8>,
    io_descriptors: Option<u32>,
}

impl ModelBuilder {
    /// A model named `name` running on `sg_count` cores.
    pub fn new(name: &str, sg_count: u32) -> Self {
        assert!((1..=MAX_CORES).contains(&sg_count), "sg_count {sg_count}");
        ModelBuilder {
            name: name.to_owned(),
            producer: format!("nrt-rs {}", env!("CARGO_PKG_VERSION")),
            sg_count,
            io: Vec::new(),
            mem_refs: Vec::new(),
            blocks: vec![Vec::new(); sg_count as usize * nrt_hal::NUM_ENGINES],
            constants: Vec::new(),
            io_descriptors: None,
        }
    }

    /// Sets the producer string.
    pub fn producer(&mut self, producer: &str) -> &mut Self {
        self.producer = producer.to_owned();
        self
    }

    fn add_io(&mut self, name: &str, usage: Usage, dtype: DType, shape: &[u32]) -> u32 {
        let index = self.io.len() as u32;
        let mut t = IoTensor {
            name: name.to_owned(),
            usage,
            dtype,
            shape: shape.to_vec(),
            mem_ref: 0,
            in_place_of: None,
        };
        // Saturating: an oversized shape must reach the decoder's check, not wrap to a
        // plausible size here.
        t.mem_ref = self.mem_ref(MemRef {
            kind: MemRefKind::Io,
            align: 64,
            size: t.byte_size(),
            offset: index as u64,
        });
        self.io.push(t);
        index
    }

    /// Adds an input; returns its var_id (I/O index).
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[u32]) -> u32 {
        self.add_io(name, Usage::Input, dtype, shape)
    }

    /// Adds an output; returns its var_id (I/O index).
    pub fn output(&mut self, name: &str, dtype: DType, shape: &[u32]) -> u32 {
        self.add_io(name, Usage::Output, dtype, shape)
    }

    /// Declares output `output` an in-place update of input `input` (both var_ids): the
    /// caller binds one tensor to both, and the program writes only what it changes.
    pub fn in_place(&mut self, output: u32, input: u32) -> &mut Self {
        self.io[output as usize].in_place_of = Some(input);
        self
    }

    /// The plan entry of I/O tensor `var_id`.
    pub fn io_mem_ref(&self, var_id: u32) -> u32 {
        self.io[var_id as usize].mem_ref
    }

    /// Adds a raw plan entry; returns its id.
    pub fn mem_ref(&mut self, m: MemRef) -> u32 {
        self.mem_refs.push(m);
        (self.mem_refs.len() - 1) as u32
    }

    /// Adds constant data as an `MR_BUFFER` entry; returns its id.
    pub fn constant(&mut self, bytes: &[u8], align: u64) -> u32 {
        let offset = self.constants.len().next_multiple_of(align as usize);
        self.constants.resize(offset, 0);
        self.constants.extend_from_slice(bytes);
        self.mem_ref(MemRef {
            kind: MemRefKind::Buffer,
            align,
            size: bytes.len() as u64,
            offset: offset as u64,
        })
    }

    /// Bytes of constant data added so far.
    pub fn constants_len(&self) -> usize {
        self.constants.len()
    }

    /// [`ModelBuilder::constant`] for data whose size comes from a model (the compiler's
    /// constants): the room is reserved fallibly first, so a host out of memory (or an
    /// address-space limit) is an error the caller reports, not an abort.
    pub fn try_constant(
        &mut self,
        bytes: &[u8],
        align: u64,
    ) -> Result<u32, std::collections::TryReserveError> {
        let offset = self.constants.len().next_multiple_of(align as usize);
        let grow = (offset - self.constants.len()).saturating_add(bytes.len());
        // The amortized growth first (doubling keeps many constants linear); when the host
        // cannot give that much, exactly what this one needs.
        if self.constants.try_reserve(grow).is_err() {
            self.constants.try_reserve_exact(grow)?;
        }
        Ok(self.constant(bytes, align))
    }

    /// Adds a scratch placement (`MR_VIRTUAL_TMP_BUF`) at `offset` of the arena.
    pub fn scratch(&mut self, offset: u64, size: u64, align: u64) -> u32 {
        self.mem_ref(MemRef {
            kind: MemRefKind::VirtualTmpBuf,
            align,
            size,
            offset,
        })
    }

    /// The virtual address of I/O tensor `var_id`'s descriptor pair (for
    /// [`Op::DmaDescriptors`]). The table is created on first use and sized in [`build`].
    ///
    /// [`build`]: ModelBuilder::build
    pub fn io_descriptor(&mut self, var_id: u32) -> u64 {
        let id = match self.io_descriptors {
            Some(id) => id,
            None => {
                let id = self.mem_ref(MemRef {
                    kind: MemRefKind::IoDescriptors,
                    align: 64,
                    size: 0,
                    offset: 0,
                });
                self.io_descriptors = Some(id);
                id
            }
        };
        vaddr(id, var_id as u64 * TRIGGER_PAIR_SIZE as u64)
    }

    /// Appends an instruction to `engine`'s block on `core` (address fields hold [`vaddr`]s).
    pub fn push(&mut self, core: u8, engine: Engine, ins: Instruction) -> &mut Self {
        assert!(
            ins.op.runs_on(engine),
            "{} cannot run on {engine}",
            ins.op.name()
        );
        assert!(
            !matches!(ins.op, Op::End(op::End)),
            "End is appended by build()"
        );
        self.blocks[core as usize * nrt_hal::NUM_ENGINES + engine.index()].push(ins);
        self
    }

    /// Instructions pushed so far on `core`'s `engine`.
    pub fn len(&self, core: u8, engine: Engine) -> usize {
        self.blocks[core as usize * nrt_hal::NUM_ENGINES + engine.index()].len()
    }

    /// Finishes the model: ends every block, turns virtual addresses into relocations.
    ///
    /// # Panics
    /// If an address field does not hold a virtual address of an existing plan entry — a bug
    /// in the producer, not bad input.
    pub fn build(mut self) -> CompiledModel {
        if let Some(id) = self.io_descriptors {
            self.mem_refs[id as usize].size = self.io.len() as u64 * TRIGGER_PAIR_SIZE as u64;
        }
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for (i, ins) in self.blocks.iter().enumerate() {
            let core = (i / nrt_hal::NUM_ENGINES) as u8;
            let engine = Engine::ALL[i % nrt_hal::NUM_ENGINES];
            let mut code = Vec::new();
            let mut relocations = Vec::new();
            for ins in ins
                .iter()
                .chain(core::iter::once(&Instruction::new(Op::End(op::End))))
            {
                let at = code.len();
                ins.encode(&mut code);
                ins.address_fields(|f| {
                    let p = at + f.offset;
                    let v = u64::from_le_bytes(code[p..p + 8].try_into().expect("8 bytes"));
                    let (mem_ref, offset) = split_vaddr(v).unwrap_or_else(|| {
                        panic!(
                            "{} operand `{}` has no virtual address ({v:#x})",
                            ins.op.name(),
                            f.name
                        )
                    });
                    assert!(
                        (mem_ref as usize) < self.mem_refs.len(),
                        "operand `{}` names plan entry {mem_ref}",
                        f.name
                    );
                    code[p..p + 8].fill(0);
                    relocations.push(Relocation {
                        patch_offset: p as u32,
                        mem_ref,
                        offset,
                    });
                });
            }
            blocks.push(Block {
                core,
                engine,
                code,
                relocations,
            });
        }
        CompiledModel {
            name: self.name,
            producer: self.producer,
            sg_count: self.sg_count,
            io: self.io,
            mem_refs: self.mem_refs,
            blocks,
            constants: self.constants,
        }
    }
}
