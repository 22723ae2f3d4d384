//! # nrt-hal — the device contract
//!
//! The bottom layer of nrt-rs. It defines what a NeuronCore device is to the runtime, and
//! nothing about models or executions:
//!
//! - [`Device`]: the one trait through which the runtime talks to a device (memory, DMA
//!   queues, exec-request queues, the semaphore doorbell, notification rings, cause words);
//! - the wire formats both sides share ([`ExecRequest`] 52 B, [`NqRecord`] 16 B,
//!   [`DmaDescriptor`] / [`TriggerPair`]), little-endian, sizes asserted at compile time;
//! - [`NrtStatus`] with the public values and names, [`DType`] in the hardware encoding,
//!   [`SeqId`] packing;
//! - the lock-free protocols the runtime and device share: the SPSC [`ring`](mod@ring) (DMA
//!   trigger queues), the notification [`plane`](mod@plane) (a core's six notification rings)
//!   and the [`IdleGate`] park handshake, the [`UseGate`] admission gate of handles that are freed
//!   while in use and the [`SlotTicket`] ownership protocol of an in-flight slot, all
//!   model-checked with loom; the [`CompletionWake`] a waiting host thread blocks on until
//!   the device signals a completion (with the [`SpinBudget`] that says how long to spin
//!   first), model-checked too, and the [`SeqEvent`] handshake that signals an eventfd
//!   registered for one execution however registration and completion interleave, and the
//!   [`ServedCore`] hand-off between a synchronous caller serving a core and those queued
//!   behind it;
//! - [`host_memory`]: what the process can still get from the host (`MemAvailable` and its
//!   memory cgroups' headroom), checked before a large allocation sized from outside;
//! - [`tuning`]: every knob of the project with its reason.

pub mod device;
pub mod dtype;
pub mod gate;
pub mod host_memory;
pub mod plane;
pub mod ring;
pub mod seq;
pub mod seq_event;
pub mod served;
pub mod slot_ticket;
pub mod status;
pub mod sync;
pub mod tuning;
pub mod use_gate;
pub mod wake;
pub mod wire;

pub use device::{
    Device, DeviceInfo, DeviceMapping, ExecQueueDesc, FIRST_ENGINE_SEMAPHORE, HalError,
    LockstepServing, MemUsage, SEMAPHORE_INFERENCE_START, SEMAPHORES_PER_CORE,
};
pub use dtype::DType;
pub use gate::IdleGate;
pub use plane::{
    ERROR_RING, PLANE_RINGS, PlaneConsumer, PlaneProducer, PlaneWatch, plane, ring_index,
};
pub use ring::{Consumer, Producer, ring};
pub use seq::{NRTA_SEQ_NUM_MASK, NRTA_SEQ_NUM_MAX, SeqId};
pub use seq_event::SeqEvent;
pub use served::{Served, ServedCore};
pub use slot_ticket::SlotTicket;
pub use status::NrtStatus;
pub use use_gate::{GateRefused, UseGate};
pub use wake::{
    CompletionWake, ExecutionWakes, LockstepParts, SpinBudget, WaitOutcome, Waiter, monotonic_ns,
};
pub use wire::{
    DevAddr, DmaDescriptor, DmaKind, Engine, ErrorSubtype, ExecRequest, NUM_ENGINES, NqKind,
    NqRecord, RecordKind, TriggerPair,
};

pub use host_memory::host_memory_available;
