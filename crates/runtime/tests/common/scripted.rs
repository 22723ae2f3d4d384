//! A scripted [`Device`]: it executes nothing. It keeps what the runtime stages (the exec
//! requests, read from the DMA trigger queue) and posts exactly the notification records a
//! test chooses, in the order it chooses — START/END interleavings, errors, dropped
//! notifications, a lockstep partner that is late — so the harvest's step function is tested
//! on every path without a simulator deciding the order.

use nrt_hal::wire::{DevAddr, EXEC_REQUEST_SIZE, TriggerPair};
use nrt_hal::{
    Consumer, Device, DeviceInfo, DeviceMapping, DmaKind, Engine, ErrorSubtype, ExecQueueDesc,
    ExecRequest, HalError, MemUsage, NqRecord, PlaneConsumer, PlaneProducer, Producer, RecordKind,
    plane, ring,
};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Mutex;

/// Bytes of scripted device memory (allocated zeroed, committed lazily by the OS).
const MEMORY: usize = 64 << 20;
/// Addresses below this are never handed out (a zero address always faults).
const RESERVED_LOW: u64 = 1 << 16;

#[derive(Default)]
struct Core {
    dma: Option<Consumer<TriggerPair>>,
    plane: Option<PlaneProducer>,
    queues: u16,
    cause: u32,
    doorbells: u32,
}

/// See the module docs.
pub struct ScriptedDevice {
    base: NonNull<u8>,
    next: Mutex<u64>,
    cores: Vec<Mutex<Core>>,
    prepared: Mutex<Vec<std::thread::ThreadId>>,
    serve_requests: Mutex<Vec<(u32, bool)>>,
    serving: Mutex<Option<nrt_hal::LockstepServing>>,
}

// SAFETY: `base` is a private allocation owned by the device for its whole life; every access
// goes through bounds-checked copies (`range`) or mappings the runtime orders itself.
unsafe impl Send for ScriptedDevice {}
// SAFETY: as above; the per-core state is behind mutexes.
unsafe impl Sync for ScriptedDevice {}

impl std::fmt::Debug for ScriptedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedDevice")
            .field("cores", &self.cores.len())
            .finish()
    }
}

impl Drop for ScriptedDevice {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), Self::layout()) };
    }
}

impl ScriptedDevice {
    fn layout() -> Layout {
        Layout::from_size_align(MEMORY, 4096).expect("layout")
    }

    /// A device with `cores` cores.
    pub fn new(cores: u32) -> ScriptedDevice {
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        ScriptedDevice {
            base: NonNull::new(p).expect("scripted device memory"),
            next: Mutex::new(RESERVED_LOW),
            cores: (0..cores).map(|_| Mutex::new(Core::default())).collect(),
            prepared: Mutex::new(Vec::new()),
            serve_requests: Mutex::new(Vec::new()),
            serving: Mutex::new(None),
        }
    }

    /// The threads the runtime readied for device work ([`Device::prepare_thread`]), in call
    /// order (a thread twice: called twice).
    pub fn prepared_threads(&self) -> Vec<std::thread::ThreadId> {
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The runtime's [`Device::host_serves`] calls, `(core, on)` in call order (the scripted
    /// device refuses each: it runs nothing, so nobody may serve it).
    pub fn serve_requests(&self) -> Vec<(u32, bool)> {
        self.serve_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What [`Device::lockstep_serving`] reports from now on (for every core).
    pub fn set_lockstep_serving(&self, s: Option<nrt_hal::LockstepServing>) {
        *self.serving.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    fn core(&self, nc: u32) -> Result<std::sync::MutexGuard<'_, Core>, HalError> {
        self.cores
            .get(nc as usize)
            .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()))
            .ok_or(HalError::BadCore(nc))
    }

    fn range(&self, addr: DevAddr, len: u64) -> Result<*mut u8, HalError> {
        match addr.checked_add(len) {
            Some(end) if addr >= RESERVED_LOW && end <= MEMORY as u64 => {
                Ok(self.base.as_ptr().wrapping_add(addr as usize))
            }
            _ => Err(HalError::BadAddress { addr, len }),
        }
    }

    /// The requests the runtime staged on core `nc` since the last call (from its DMA
    /// trigger queue: each request-copy trigger's source holds the 52-byte request).
    pub fn staged(&self, nc: u32) -> Vec<ExecRequest> {
        let mut c = self.core(nc).expect("core");
        let mut pairs = Vec::new();
        if let Some(q) = c.dma.as_mut() {
            q.drain(|p| pairs.push(p));
        }
        drop(c);
        pairs
            .into_iter()
            .filter(|p| p.tx.kind == DmaKind::RequestCopy as u8)
            .map(|p| {
                let mut b = [0u8; EXEC_REQUEST_SIZE];
                self.copy_out(p.tx.addr, &mut b).expect("request in memory");
                ExecRequest::from_bytes(&b)
            })
            .collect()
    }

    /// Posts `rec` on ring `ring` (an engine's INFER_STATUS ring, or `ERROR_RING`) of core
    /// `nc` and publishes it.
    pub fn post(&self, nc: u32, ring: usize, rec: NqRecord) {
        let mut c = self.core(nc).expect("core");
        let p = c.plane.as_mut().expect("notification plane");
        assert!(p.push(ring, rec), "ring {ring} of core {nc} is full");
        p.publish();
    }

    /// START (`end == false`) or END of `engine` for the execution of compute index `idx`.
    pub fn engine(&self, nc: u32, engine: Engine, idx: u32, end: bool) {
        let kind = if end {
            RecordKind::End
        } else {
            RecordKind::Start
        };
        self.post(
            nc,
            engine as usize,
            NqRecord::engine_event(kind, engine, nc as u8, idx),
        );
    }

    /// START then END of every engine, engine by engine.
    pub fn run_all(&self, nc: u32, idx: u32) {
        for e in Engine::ALL {
            self.engine(nc, e, idx, false);
            self.engine(nc, e, idx, true);
        }
    }

    /// An ERROR record of `engine`.
    pub fn error(&self, nc: u32, sub: ErrorSubtype, engine: Engine, idx: u32) {
        self.post(
            nc,
            nrt_hal::ERROR_RING,
            NqRecord::error(sub, engine, nc as u8, idx, 0),
        );
    }

    /// Sets bits of core `nc`'s interrupt-cause word.
    pub fn set_cause(&self, nc: u32, bits: u32) {
        self.core(nc).expect("core").cause |= bits;
    }

    /// Core `nc`'s interrupt-cause word now.
    pub fn interrupt_cause_now(&self, nc: u32) -> u32 {
        self.core(nc).expect("core").cause
    }

    /// Doorbells rung on core `nc`.
    pub fn doorbells(&self, nc: u32) -> u32 {
        self.core(nc).expect("core").doorbells
    }
}

impl Device for ScriptedDevice {
    fn lockstep_serving(&self, _nc: u32) -> Option<nrt_hal::LockstepServing> {
        *self.serving.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn host_serves(&self, nc: u32, on: bool) -> bool {
        self.serve_requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((nc, on));
        false
    }

    fn prepare_thread(&self) {
        self.prepared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(std::thread::current().id());
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            arch_name: "scripted",
            revision: "0",
            num_cores: self.cores.len() as u32,
            memory_bytes: MEMORY as u64,
        }
    }

    fn clock_ns(&self) -> u64 {
        0
    }

    fn mem_alloc(&self, size: u64, align: u64) -> Result<DevAddr, HalError> {
        if !align.is_power_of_two() {
            return Err(HalError::BadAlignment(align));
        }
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let at = next.next_multiple_of(align.max(64));
        let end = at.checked_add(size.max(1)).filter(|&e| e <= MEMORY as u64);
        let Some(end) = end else {
            return Err(HalError::OutOfMemory {
                requested: size,
                free: MEMORY as u64 - *next,
            });
        };
        *next = end;
        Ok(at)
    }

    fn mem_free(&self, _addr: DevAddr) -> Result<(), HalError> {
        Ok(()) // a bump allocator: tests are short
    }

    fn mem_usage(&self) -> MemUsage {
        MemUsage {
            bytes_used: *self.next.lock().unwrap_or_else(|e| e.into_inner()) - RESERVED_LOW,
            bytes_limit: MEMORY as u64 - RESERVED_LOW,
        }
    }

    fn copy_in(&self, dst: DevAddr, src: &[u8]) -> Result<(), HalError> {
        let p = self.range(dst, src.len() as u64)?;
        // SAFETY: `range` checked dst..dst+len inside our allocation; `src` is a host slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        Ok(())
    }

    fn copy_out(&self, src: DevAddr, dst: &mut [u8]) -> Result<(), HalError> {
        let p = self.range(src, dst.len() as u64)?;
        // SAFETY: as in copy_in, the other way.
        unsafe { std::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy_device(&self, src: DevAddr, dst: DevAddr, len: u64) -> Result<(), HalError> {
        let (s, d) = (self.range(src, len)?, self.range(dst, len)?);
        // SAFETY: both ranges checked inside our allocation; `copy` allows overlap.
        unsafe { std::ptr::copy(s, d, len as usize) };
        Ok(())
    }

    fn memset(&self, dst: DevAddr, value: u8, len: u64) -> Result<(), HalError> {
        let p = self.range(dst, len)?;
        // SAFETY: checked inside our allocation.
        unsafe { std::ptr::write_bytes(p, value, len as usize) };
        Ok(())
    }

    fn map(&self, addr: DevAddr, len: u64) -> Result<DeviceMapping, HalError> {
        let p = self.range(addr, len)?;
        // SAFETY: `p..p+len` lies inside our allocation, which outlives every mapping the
        // runtime holds (the runtime keeps the device alive while it maps it).
        Ok(unsafe { DeviceMapping::new(NonNull::new(p).expect("non-null"), len as usize, addr) })
    }

    fn dma_queue_init(&self, nc: u32, capacity: u32) -> Result<Producer<TriggerPair>, HalError> {
        let mut c = self.core(nc)?;
        if c.dma.is_some() {
            return Err(HalError::BadQueue(nc));
        }
        let (p, q) = ring(capacity);
        c.dma = Some(q);
        Ok(p)
    }

    fn dma_queue_release(&self, nc: u32) -> Result<(), HalError> {
        self.core(nc)?.dma = None;
        Ok(())
    }

    fn exec_queue_register(&self, nc: u32, _desc: ExecQueueDesc) -> Result<u16, HalError> {
        let mut c = self.core(nc)?;
        c.queues += 1;
        Ok(c.queues - 1)
    }

    fn exec_queue_release(&self, nc: u32, _queue: u16) -> Result<(), HalError> {
        self.core(nc).map(|_| ())
    }

    fn notification_init(&self, nc: u32, capacity: u32) -> Result<PlaneConsumer, HalError> {
        let mut c = self.core(nc)?;
        if c.plane.is_some() {
            return Err(HalError::BadQueue(nc));
        }
        let (p, q) = plane(capacity);
        c.plane = Some(p);
        Ok(q)
    }

    fn notification_release(&self, nc: u32) -> Result<(), HalError> {
        self.core(nc)?.plane = None;
        Ok(())
    }

    fn semaphore_increment(&self, nc: u32, _semaphore: u32, value: u32) -> Result<(), HalError> {
        self.core(nc)?.doorbells += value;
        Ok(())
    }

    fn semaphore_read(&self, nc: u32, _semaphore: u32) -> Result<u32, HalError> {
        self.core(nc).map(|c| c.doorbells)
    }

    fn interrupt_cause(&self, nc: u32) -> Result<u32, HalError> {
        self.core(nc).map(|c| c.cause)
    }

    fn interrupt_cause_clear(&self, nc: u32, bits: u32) -> Result<(), HalError> {
        self.core(nc)?.cause &= !bits;
        Ok(())
    }

    fn nc_reset(&self, nc: u32) -> Result<(), HalError> {
        self.core(nc)?.cause = 0;
        Ok(())
    }
}
