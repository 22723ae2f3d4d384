//! Wire formats shared by the runtime and the device: the 52-byte execution request, the
//! 16-byte notification record, DMA descriptors and the trigger pairs staging appends.
//!
//! Every format is little-endian, has a compile-time size assertion, and converts to and from
//! its byte image with `to_bytes` / `from_bytes`. Each field's comment says who writes it and
//! when. On a little-endian host the byte image is exactly the in-memory representation of
//! the `#[repr(C)]` struct (a test proves it), so the device may also read a request straight
//! out of its memory.

use core::fmt;

/// A device physical address.
pub type DevAddr = u64;

//===------------------------------------------------------------------------------------===//
// Engines
//===------------------------------------------------------------------------------------===//

/// The five engines of a NeuronCore (TPB).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// Processing engine: the systolic array (matmul, convolution).
    Pe = 0,
    /// Activation engine: `y = f(x·scale + bias)`.
    Act = 1,
    /// Pooling engine: reductions, pooling windows, row ops (softmax, layer-norm), resize.
    Pool = 2,
    /// Vector engine: elementwise arithmetic, copies, casts.
    Dve = 3,
    /// Sequencer: DMA, semaphores, notifications, barriers.
    Sp = 4,
}

/// Number of engines per core.
pub const NUM_ENGINES: usize = 5;

impl Engine {
    /// All engines in index order.
    pub const ALL: [Engine; NUM_ENGINES] = [
        Engine::Pe,
        Engine::Act,
        Engine::Pool,
        Engine::Dve,
        Engine::Sp,
    ];

    /// The engine's index (0..5).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Decodes an engine index.
    pub const fn from_index(i: u8) -> Option<Engine> {
        match i {
            0 => Some(Engine::Pe),
            1 => Some(Engine::Act),
            2 => Some(Engine::Pool),
            3 => Some(Engine::Dve),
            4 => Some(Engine::Sp),
            _ => None,
        }
    }

    /// Upper-case short name, as the seed writes them.
    pub const fn name(self) -> &'static str {
        match self {
            Engine::Pe => "PE",
            Engine::Act => "ACT",
            Engine::Pool => "POOL",
            Engine::Dve => "DVE",
            Engine::Sp => "SP",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

//===------------------------------------------------------------------------------------===//
// ExecRequest — 52 bytes
//===------------------------------------------------------------------------------------===//

/// Flag bits of [`ExecRequest::flags`].
pub mod exec_flags {
    /// The model on this core changed since its last execution: the device drops whatever
    /// it cached about the previous model (decoded instruction blocks, semaphore state) and
    /// reloads. Set by the runtime on the first execution after a model switch only.
    pub const RELOAD_CONFIG: u16 = 1 << 0;
    /// Trace mode: the device stamps this execution's START and END records with its clock
    /// ([`super::NqRecord::timestamp_ns`]), which gives each engine's active interval.
    pub const TRACE: u16 = 1 << 1;
    /// Every defined bit.
    pub const ALL: u16 = RELOAD_CONFIG | TRACE;
}

/// One execution request for one core: what the device reads from its exec-request ring.
///
/// The runtime writes it into the model's request buffer at stage time (one per core of the
/// execution); the first trigger pair copies it, by DMA, into the ring slot the device reads.
///
/// | offset | size | field | written by, when |
/// |---:|---:|---|---|
/// | 0 | 40 | `engine_block[5]` | runtime, at stage: PA of each engine's instruction block (PE, ACT, POOL, DVE, SP) |
/// | 40 | 4 | `compute_idx` | runtime, at stage: the vcore's `compute_idx_tail` for this execution (same on every core) |
/// | 44 | 2 | `flags` | runtime, at stage: [`exec_flags`] |
/// | 46 | 1 | `sg_index` | runtime, at load: which core of the model's vcore this request drives |
/// | 47 | 1 | `sg_count` | runtime, at load: how many cores execute the request in lockstep |
/// | 48 | 4 | `io_set` | runtime, at bind: which of the model's I/O descriptor sets this execution uses; the device adds `io_set × io_set_stride` (from the exec queue's registration) to every `DmaDescriptors` table address |
#[repr(C, packed(4))]
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecRequest {
    /// Physical address of each engine's instruction block, indexed by [`Engine`].
    pub engine_block: [DevAddr; NUM_ENGINES],
    /// The execution's compute index (wrapping 32-bit counter on the vcore's first core).
    pub compute_idx: u32,
    /// [`exec_flags`] bits.
    pub flags: u16,
    /// Index of this core within the model's vcore.
    pub sg_index: u8,
    /// Number of cores executing this request in lockstep.
    pub sg_count: u8,
    /// The I/O descriptor set of this execution (several executions of one model can be in
    /// flight with different tensors bound).
    pub io_set: u32,
}

/// Size of [`ExecRequest`] on the wire.
pub const EXEC_REQUEST_SIZE: usize = 52;
const _: () = assert!(core::mem::size_of::<ExecRequest>() == EXEC_REQUEST_SIZE);
const _: () = assert!(core::mem::align_of::<ExecRequest>() == 4);

impl ExecRequest {
    /// The byte image.
    pub fn to_bytes(&self) -> [u8; EXEC_REQUEST_SIZE] {
        let mut b = [0u8; EXEC_REQUEST_SIZE];
        let blocks = self.engine_block;
        for (i, a) in blocks.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&a.to_le_bytes());
        }
        b[40..44].copy_from_slice(&{ self.compute_idx }.to_le_bytes());
        b[44..46].copy_from_slice(&{ self.flags }.to_le_bytes());
        b[46] = self.sg_index;
        b[47] = self.sg_count;
        b[48..52].copy_from_slice(&{ self.io_set }.to_le_bytes());
        b
    }

    /// Parses a byte image (every bit pattern is a well-formed request; the device validates
    /// the contents when it runs it).
    pub fn from_bytes(b: &[u8; EXEC_REQUEST_SIZE]) -> Self {
        let mut engine_block = [0u64; NUM_ENGINES];
        for (i, a) in engine_block.iter_mut().enumerate() {
            *a = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        }
        ExecRequest {
            engine_block,
            compute_idx: u32::from_le_bytes([b[40], b[41], b[42], b[43]]),
            flags: u16::from_le_bytes([b[44], b[45]]),
            sg_index: b[46],
            sg_count: b[47],
            io_set: u32::from_le_bytes([b[48], b[49], b[50], b[51]]),
        }
    }
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let blocks = self.engine_block;
        f.debug_struct("ExecRequest")
            .field("engine_block", &blocks)
            .field("compute_idx", &{ self.compute_idx })
            .field("flags", &{ self.flags })
            .field("sg_index", &self.sg_index)
            .field("sg_count", &self.sg_count)
            .field("io_set", &{ self.io_set })
            .finish()
    }
}

//===------------------------------------------------------------------------------------===//
// NqRecord — 16 bytes
//===------------------------------------------------------------------------------------===//

/// What a notification record reports.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// An engine started executing its block for an execution.
    Start = 1,
    /// An engine finished its block (reached end-of-block).
    End = 2,
    /// An error, on the ERROR ring; `subtype` is an [`ErrorSubtype`].
    Error = 3,
    /// A custom notification emitted by an instruction; `subtype`/`sub_id` say which.
    Custom = 4,
}

impl RecordKind {
    /// Decodes the kind byte.
    pub const fn from_u8(v: u8) -> Option<RecordKind> {
        match v {
            1 => Some(RecordKind::Start),
            2 => Some(RecordKind::End),
            3 => Some(RecordKind::Error),
            4 => Some(RecordKind::Custom),
            _ => None,
        }
    }
}

/// Custom-notification subtype for per-tensor notifications (the seed's subtype 6).
pub const CUSTOM_SUBTYPE_TENSOR: u8 = 6;
/// Custom sub-id of "this output tensor is final" (the seed's sub-id 7); the payload is the
/// output's var_id.
pub const CUSTOM_SUB_ID_OUTPUT_DONE: u16 = 7;

/// The error subtype of a record on the ERROR ring.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorSubtype {
    /// A transient error; the execution ran to its end but its results are suspect.
    Transient = 1,
    /// A numerical error (NaN produced); the execution ran to its end.
    Numerical = 2,
    /// Uncorrectable on-chip memory (parity) error; the core aborted the execution.
    Uncorrectable = 3,
    /// The DMA engine aborted (e.g. a descriptor pointed outside device memory).
    DmaAbort = 4,
    /// An indexed copy (gather) read out of bounds; the engine aborted the execution.
    OutOfBounds = 5,
    /// Uncorrectable HBM error.
    HbmUncorrectable = 6,
    /// The core is wedged: it stops taking requests until reset.
    Fatal = 7,
    /// An instruction block or request the device cannot execute (corrupt code memory, an
    /// operand outside device memory): the core aborts the execution.
    InvalidInstruction = 8,
}

impl ErrorSubtype {
    /// Every subtype.
    pub const ALL: [ErrorSubtype; 8] = [
        Self::Transient,
        Self::Numerical,
        Self::Uncorrectable,
        Self::DmaAbort,
        Self::OutOfBounds,
        Self::HbmUncorrectable,
        Self::Fatal,
        Self::InvalidInstruction,
    ];

    /// Decodes the subtype byte.
    pub const fn from_u8(v: u8) -> Option<ErrorSubtype> {
        match v {
            1 => Some(Self::Transient),
            2 => Some(Self::Numerical),
            3 => Some(Self::Uncorrectable),
            4 => Some(Self::DmaAbort),
            5 => Some(Self::OutOfBounds),
            6 => Some(Self::HbmUncorrectable),
            7 => Some(Self::Fatal),
            8 => Some(Self::InvalidInstruction),
            _ => None,
        }
    }

    /// Whether the device stops the execution when it raises this error (no END records
    /// follow from the failing core; the runtime fails the execution on the record alone).
    pub const fn aborts_execution(self) -> bool {
        !matches!(self, Self::Transient | Self::Numerical)
    }

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Transient => "transient",
            Self::Numerical => "numerical",
            Self::Uncorrectable => "uncorrectable",
            Self::DmaAbort => "dma-abort",
            Self::OutOfBounds => "out-of-bounds",
            Self::HbmUncorrectable => "hbm-uncorrectable",
            Self::Fatal => "fatal",
            Self::InvalidInstruction => "invalid-instruction",
        }
    }
}

/// One notification: what the device writes into a notification ring.
///
/// Written by the device only, into the ring slot it owns, before it publishes the ring's
/// tail; read by the runtime's harvest after it observes the tail.
///
/// | offset | size | field | meaning |
/// |---:|---:|---|---|
/// | 0 | 1 | `kind` | [`RecordKind`] |
/// | 1 | 1 | `engine` | [`Engine`] index of the engine that wrote it |
/// | 2 | 1 | `core` | physical core index |
/// | 3 | 1 | `subtype` | CUSTOM: custom subtype (6 = tensor); ERROR: [`ErrorSubtype`]; else 0 |
/// | 4 | 2 | `sub_id` | CUSTOM: custom sub-id (7 = output done); START/END in trace mode: bits 32–47 of the timestamp; else 0 |
/// | 6 | 2 | `seq` | per-ring record counter, low 16 bits (lets a reader see gaps) |
/// | 8 | 4 | `compute_idx` | the execution the record belongs to |
/// | 12 | 4 | `payload` | CUSTOM/7: the output's var_id; ERROR: failing instruction index; START/END: 0, or in trace mode ([`exec_flags::TRACE`]) bits 0–31 of the timestamp |
///
/// A START/END timestamp is the device clock ([`crate::Device::clock_ns`]) when the engine
/// started or ended, 48 bits of nanoseconds (78 hours before it wraps); see
/// [`NqRecord::timestamp_ns`].
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct NqRecord {
    /// [`RecordKind`] byte.
    pub kind: u8,
    /// [`Engine`] index.
    pub engine: u8,
    /// Physical core index.
    pub core: u8,
    /// Custom subtype or [`ErrorSubtype`].
    pub subtype: u8,
    /// Custom sub-id.
    pub sub_id: u16,
    /// Per-ring record counter (low 16 bits).
    pub seq: u16,
    /// The execution's compute index.
    pub compute_idx: u32,
    /// Kind-specific payload.
    pub payload: u32,
}

/// Size of [`NqRecord`] on the wire.
pub const NQ_RECORD_SIZE: usize = 16;
const _: () = assert!(core::mem::size_of::<NqRecord>() == NQ_RECORD_SIZE);

impl NqRecord {
    /// Stamps a START or END record with the device clock (trace mode): the low 48 bits of
    /// `ns`, split over `payload` and `sub_id`.
    pub const fn with_timestamp(mut self, ns: u64) -> Self {
        self.payload = ns as u32;
        self.sub_id = (ns >> 32) as u16;
        self
    }

    /// The timestamp of a START or END record written in trace mode (48 bits of device
    /// nanoseconds; 0 when the execution was not traced).
    pub const fn timestamp_ns(&self) -> u64 {
        (self.sub_id as u64) << 32 | self.payload as u64
    }

    /// A START or END record.
    pub const fn engine_event(
        kind: RecordKind,
        engine: Engine,
        core: u8,
        compute_idx: u32,
    ) -> Self {
        NqRecord {
            kind: kind as u8,
            engine: engine as u8,
            core,
            subtype: 0,
            sub_id: 0,
            seq: 0,
            compute_idx,
            payload: 0,
        }
    }

    /// An ERROR record.
    pub const fn error(
        subtype: ErrorSubtype,
        engine: Engine,
        core: u8,
        compute_idx: u32,
        instruction: u32,
    ) -> Self {
        NqRecord {
            kind: RecordKind::Error as u8,
            engine: engine as u8,
            core,
            subtype: subtype as u8,
            sub_id: 0,
            seq: 0,
            compute_idx,
            payload: instruction,
        }
    }

    /// A CUSTOM record.
    pub const fn custom(
        subtype: u8,
        sub_id: u16,
        engine: Engine,
        core: u8,
        compute_idx: u32,
        payload: u32,
    ) -> Self {
        NqRecord {
            kind: RecordKind::Custom as u8,
            engine: engine as u8,
            core,
            subtype,
            sub_id,
            seq: 0,
            compute_idx,
            payload,
        }
    }

    /// The decoded kind, if valid.
    pub const fn record_kind(&self) -> Option<RecordKind> {
        RecordKind::from_u8(self.kind)
    }

    /// The byte image.
    pub fn to_bytes(&self) -> [u8; NQ_RECORD_SIZE] {
        let mut b = [0u8; NQ_RECORD_SIZE];
        b[0] = self.kind;
        b[1] = self.engine;
        b[2] = self.core;
        b[3] = self.subtype;
        b[4..6].copy_from_slice(&self.sub_id.to_le_bytes());
        b[6..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..12].copy_from_slice(&self.compute_idx.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload.to_le_bytes());
        b
    }

    /// Parses a byte image.
    pub fn from_bytes(b: &[u8; NQ_RECORD_SIZE]) -> Self {
        NqRecord {
            kind: b[0],
            engine: b[1],
            core: b[2],
            subtype: b[3],
            sub_id: u16::from_le_bytes([b[4], b[5]]),
            seq: u16::from_le_bytes([b[6], b[7]]),
            compute_idx: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            payload: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        }
    }

    /// The record as two little-endian words (how rings store it).
    pub fn to_words(&self) -> [u64; 2] {
        let b = self.to_bytes();
        [
            u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
        ]
    }

    /// Inverse of [`NqRecord::to_words`].
    pub fn from_words(w: [u64; 2]) -> Self {
        let mut b = [0u8; NQ_RECORD_SIZE];
        b[0..8].copy_from_slice(&w[0].to_le_bytes());
        b[8..16].copy_from_slice(&w[1].to_le_bytes());
        Self::from_bytes(&b)
    }
}

/// Which notification ring a record is written to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NqKind {
    /// The per-engine INFER_STATUS ring: START, END and CUSTOM records of that engine.
    InferStatus(Engine),
    /// The core's ERROR ring.
    Error,
}

//===------------------------------------------------------------------------------------===//
// Interrupt cause word
//===------------------------------------------------------------------------------------===//

/// Bits of a core's interrupt-cause word (INTC). The device sets them; the runtime reads and
/// clears the bits it handled.
pub mod cause {
    /// A record was written to the ERROR ring.
    pub const ERROR_NOTIFICATION: u32 = 1 << 0;
    /// A notification ring overflowed and records were dropped.
    pub const NQ_OVERFLOW: u32 = 1 << 28;
    /// The execution ran out of time on the core: an engine made no progress (the core's
    /// watchdog: a hang), or the core is still computing when the cause is read (the
    /// software device reports a kernel running at the deadline). The seed's bit 29: a
    /// sweep timeout with this bit set is `NRT_TIMEOUT`, without it `NRT_EXEC_SW_NQ_OVERFLOW`.
    pub const EXEC_TIMEOUT: u32 = 1 << 29;
    /// The core is wedged and takes no more requests until reset.
    pub const FATAL: u32 = 1 << 31;
}

//===------------------------------------------------------------------------------------===//
// DMA descriptors and trigger pairs
//===------------------------------------------------------------------------------------===//

/// What a DMA descriptor pair does (the `kind` byte of [`DmaDescriptor`]).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DmaKind {
    /// Plain data movement (I/O wiring, copies).
    Data = 0,
    /// Staging trigger 1: copy the 52-byte request into its exec-ring slot.
    RequestCopy = 1,
    /// Staging trigger 2: write the 4-byte "request ready" event word.
    EventPoke = 2,
    /// Staging trigger 3: write the 4-byte new ring tail (the device then runs the request).
    TailIncrement = 3,
}

impl DmaKind {
    /// Decodes the kind byte.
    pub const fn from_u8(v: u8) -> Option<DmaKind> {
        match v {
            0 => Some(DmaKind::Data),
            1 => Some(DmaKind::RequestCopy),
            2 => Some(DmaKind::EventPoke),
            3 => Some(DmaKind::TailIncrement),
            _ => None,
        }
    }
}

/// One side of a DMA transfer: an address and a length.
///
/// | offset | size | field | meaning |
/// |---:|---:|---|---|
/// | 0 | 8 | `addr` | device PA the side reads (tx) or writes (rx) |
/// | 8 | 4 | `len` | bytes |
/// | 12 | 1 | `kind` | [`DmaKind`] |
/// | 13 | 1 | `flags` | reserved, 0 |
/// | 14 | 2 | `queue` | TailIncrement: the exec queue whose tail this writes; else 0 |
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct DmaDescriptor {
    /// Device physical address.
    pub addr: DevAddr,
    /// Length in bytes.
    pub len: u32,
    /// [`DmaKind`] byte.
    pub kind: u8,
    /// Reserved (0).
    pub flags: u8,
    /// Exec queue id (tail-increment triggers only).
    pub queue: u16,
}

/// Size of [`DmaDescriptor`] on the wire.
pub const DMA_DESCRIPTOR_SIZE: usize = 16;
const _: () = assert!(core::mem::size_of::<DmaDescriptor>() == DMA_DESCRIPTOR_SIZE);

impl DmaDescriptor {
    /// The byte image.
    pub fn to_bytes(&self) -> [u8; DMA_DESCRIPTOR_SIZE] {
        let mut b = [0u8; DMA_DESCRIPTOR_SIZE];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..12].copy_from_slice(&self.len.to_le_bytes());
        b[12] = self.kind;
        b[13] = self.flags;
        b[14..16].copy_from_slice(&self.queue.to_le_bytes());
        b
    }

    /// Parses a byte image.
    pub fn from_bytes(b: &[u8; DMA_DESCRIPTOR_SIZE]) -> Self {
        DmaDescriptor {
            addr: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
            len: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            kind: b[12],
            flags: b[13],
            queue: u16::from_le_bytes([b[14], b[15]]),
        }
    }
}

/// A transmit (source) descriptor and a receive (destination) descriptor: one DMA transfer.
///
/// Staging appends three per core and execution: the 52-byte request copy, the 4-byte event
/// poke and the 4-byte tail increment. The model's I/O descriptor table holds one per input
/// and output (kind [`DmaKind::Data`]); bind patches the tensor side's address.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct TriggerPair {
    /// Where the bytes come from.
    pub tx: DmaDescriptor,
    /// Where the bytes go.
    pub rx: DmaDescriptor,
}

/// Size of [`TriggerPair`] on the wire.
pub const TRIGGER_PAIR_SIZE: usize = 32;
const _: () = assert!(core::mem::size_of::<TriggerPair>() == TRIGGER_PAIR_SIZE);

impl TriggerPair {
    /// A transfer of `len` bytes from `src` to `dst`.
    pub const fn new(kind: DmaKind, src: DevAddr, dst: DevAddr, len: u32, queue: u16) -> Self {
        TriggerPair {
            tx: DmaDescriptor {
                addr: src,
                len,
                kind: kind as u8,
                flags: 0,
                queue,
            },
            rx: DmaDescriptor {
                addr: dst,
                len,
                kind: kind as u8,
                flags: 0,
                queue,
            },
        }
    }

    /// The byte image.
    pub fn to_bytes(&self) -> [u8; TRIGGER_PAIR_SIZE] {
        let mut b = [0u8; TRIGGER_PAIR_SIZE];
        b[0..16].copy_from_slice(&self.tx.to_bytes());
        b[16..32].copy_from_slice(&self.rx.to_bytes());
        b
    }

    /// Parses a byte image.
    pub fn from_bytes(b: &[u8; TRIGGER_PAIR_SIZE]) -> Self {
        TriggerPair {
            tx: DmaDescriptor::from_bytes(b[0..16].try_into().expect("16 bytes")),
            rx: DmaDescriptor::from_bytes(b[16..32].try_into().expect("16 bytes")),
        }
    }
}

/// Staging's per-request scratch in the model's request buffer: the request itself, then the
/// two 4-byte values the event-poke and tail-increment triggers copy.
///
/// | offset | size | field |
/// |---:|---:|---|
/// | 0 | 52 | the [`ExecRequest`] |
/// | 52 | 4 | event value (the request's compute index) |
/// | 56 | 4 | new ring tail |
/// | 60 | 4 | reserved |
pub const REQUEST_SLOT_SIZE: u64 = 64;
/// Offset of the event value inside a request-buffer slot.
pub const REQUEST_SLOT_EVENT_OFFSET: u64 = 52;
/// Offset of the new-tail value inside a request-buffer slot.
pub const REQUEST_SLOT_TAIL_OFFSET: u64 = 56;
/// Size of one exec-ring slot in device memory (a request, padded to a cache line).
pub const EXEC_RING_SLOT_SIZE: u64 = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_request() -> impl Strategy<Value = ExecRequest> {
        (
            any::<[u64; 5]>(),
            any::<u32>(),
            any::<u16>(),
            any::<u8>(),
            any::<u8>(),
            any::<u32>(),
        )
            .prop_map(
                |(engine_block, compute_idx, flags, sg_index, sg_count, io_set)| ExecRequest {
                    engine_block,
                    compute_idx,
                    flags,
                    sg_index,
                    sg_count,
                    io_set,
                },
            )
    }

    proptest! {
        #[test]
        fn exec_request_round_trips(r in arb_request()) {
            prop_assert_eq!(ExecRequest::from_bytes(&r.to_bytes()), r);
        }

        #[test]
        fn nq_record_round_trips(b in any::<[u8; 16]>()) {
            let r = NqRecord::from_bytes(&b);
            prop_assert_eq!(r.to_bytes(), b);
            prop_assert_eq!(NqRecord::from_words(r.to_words()), r);
        }

        #[test]
        fn record_timestamps_keep_48_bits_in_payload_and_sub_id(ns in any::<u64>()) {
            let r = NqRecord::engine_event(RecordKind::End, Engine::Sp, 1, 9).with_timestamp(ns);
            prop_assert_eq!(r.timestamp_ns(), ns & 0xFFFF_FFFF_FFFF);
            let b = r.to_bytes();
            prop_assert_eq!(&b[12..16], &(ns as u32).to_le_bytes()[..]);
            prop_assert_eq!(&b[4..6], &((ns >> 32) as u16).to_le_bytes()[..]);
            prop_assert_eq!((b[0], b[1], b[2], &b[8..12]), (2, 4, 1, &9u32.to_le_bytes()[..]));
        }

        #[test]
        fn trigger_pair_round_trips(b in any::<[u8; 32]>()) {
            prop_assert_eq!(TriggerPair::from_bytes(&b).to_bytes(), b);
        }
    }

    #[test]
    fn sizes_are_the_wire_sizes() {
        assert_eq!(core::mem::size_of::<ExecRequest>(), 52);
        assert_eq!(core::mem::size_of::<NqRecord>(), 16);
        assert_eq!(core::mem::size_of::<DmaDescriptor>(), 16);
        assert_eq!(core::mem::size_of::<TriggerPair>(), 32);
    }

    #[test]
    fn exec_request_field_offsets() {
        let r = ExecRequest {
            engine_block: [0x1111, 0x2222, 0x3333, 0x4444, 0x5555],
            compute_idx: 0xAABB_CCDD,
            flags: exec_flags::RELOAD_CONFIG,
            sg_index: 1,
            sg_count: 2,
            io_set: 0x0102_0304,
        };
        let b = r.to_bytes();
        assert_eq!(&b[0..2], &[0x11, 0x11]);
        assert_eq!(&b[32..34], &[0x55, 0x55]);
        assert_eq!(&b[40..44], &[0xDD, 0xCC, 0xBB, 0xAA]);
        assert_eq!(&b[44..46], &[1, 0]);
        assert_eq!(b[46], 1);
        assert_eq!(b[47], 2);
        assert_eq!(&b[48..52], &[4, 3, 2, 1]);
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn byte_image_is_the_memory_image_on_little_endian() {
        let r = ExecRequest {
            engine_block: [1, 2, 3, 4, 5],
            compute_idx: 6,
            flags: 7,
            sg_index: 8,
            sg_count: 9,
            io_set: 10,
        };
        // SAFETY: ExecRequest is repr(C, packed(4)) plain-old-data of exactly 52 bytes with no
        // padding (asserted above), so viewing it as bytes reads only initialized memory.
        let mem: [u8; 52] = unsafe { core::mem::transmute(r) };
        assert_eq!(mem, r.to_bytes());
        let n = NqRecord::custom(
            CUSTOM_SUBTYPE_TENSOR,
            CUSTOM_SUB_ID_OUTPUT_DONE,
            Engine::Sp,
            1,
            9,
            3,
        );
        // SAFETY: NqRecord is repr(C), 16 bytes, fields laid out without padding.
        let mem: [u8; 16] = unsafe { core::mem::transmute(n) };
        assert_eq!(mem, n.to_bytes());
    }

    #[test]
    fn custom_record_carries_the_seed_ids() {
        let n = NqRecord::custom(
            CUSTOM_SUBTYPE_TENSOR,
            CUSTOM_SUB_ID_OUTPUT_DONE,
            Engine::Sp,
            0,
            5,
            42,
        );
        let b = n.to_bytes();
        assert_eq!(b[0], RecordKind::Custom as u8);
        assert_eq!(b[3], 6);
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), 7);
        assert_eq!(u32::from_le_bytes([b[12], b[13], b[14], b[15]]), 42);
    }

    #[test]
    fn cause_bit_29_is_the_timeout_bit() {
        assert_eq!(cause::EXEC_TIMEOUT, 0x2000_0000);
    }
}
