//! The public API of the runtime: every method of [`Runtime`], in one file. The pipeline
//! (`pipeline`), the harvest (`harvest`), the completion seam (`completion`) and the
//! surfaces (`surface/`) are internal; these methods call into them.

use crate::config::{self, RuntimeConfig};
use crate::error::{NrtError, Result};
use crate::harvest::{self, Harvest, Progress};
use crate::model::{self, LoadOptions, ModelShared, STATE_LOADED, STATE_UNLOADING};
use crate::pipeline::{self, BindMode};
use crate::surface::explicit::{self, XuKind, parse_seq, xu_id};
use crate::surface::implicit::{
    self, AsyncCallback, CallbackBox, ImplicitAsync, in_async_callback, refused_in_callback,
};
use crate::surface::sync;
use crate::surface::worker::{self, drain_all, drain_vcore};
use crate::tensor::{Placement, Tensor, TensorSet};
use crate::trace::{self, Span};
use crate::vcore::{
    InflightSlot, SlotInfo, Staging, StatsRef, Surface, VCore, VcoreCounters, Xu, signal_efd,
};
use crate::{
    CLOSED, CLOSING, CloseOnDrop, MAX_LOCKSTEP_CORES, MemoryStats, Model, OPEN, PipelineCounters,
    Runtime, RuntimeInner, SwitchCounters, ensure_open, host, log, nrt_log, unload_model,
};
use nrt_hal::{
    Device, NUM_ENGINES, NrtStatus, PlaneConsumer, Producer, SeqId, TriggerPair, tuning,
};
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

impl Runtime {
    /// Starts a runtime on `device`: reserves the selected cores (sets up their DMA trigger
    /// queues and notification rings, exclusively) and, if configured, the implicit-async
    /// worker pool.
    pub fn init(device: Arc<dyn Device>, config: RuntimeConfig) -> Result<Runtime> {
        config.validate()?;
        let info = device.info();
        let cores = config::select_cores(&config, info.num_cores)?;
        let lnc = config.lnc() as usize;
        let nvc = cores.len() / lnc;
        // Ownership first: a core another process holds is refused before this runtime
        // touches the device.
        let (ownership, stats) = match &config.ownership {
            Some(dir) => {
                let (o, s) = host::acquire(dir, &cores, lnc as u32, nvc, info.num_cores)?;
                (Some(o), s)
            }
            None => (None, host::StatsArea::private(nvc)),
        };
        let mut vcores = Vec::with_capacity(cores.len() / lnc);
        let mut reserved: Vec<u32> = Vec::new();
        let release = |dev: &dyn Device, reserved: &[u32]| {
            for &c in reserved {
                let _ = dev.dma_queue_release(c);
                let _ = dev.notification_release(c);
            }
        };
        for (vi, group) in cores.chunks(lnc).enumerate() {
            let mut dma = Vec::new();
            let mut rings = Vec::new();
            for &c in group {
                let setup = || -> Result<(Producer<TriggerPair>, PlaneConsumer)> {
                    let d = device
                        .dma_queue_init(c, tuning::DMA_QUEUE_CAPACITY)
                        .map_err(|e| {
                            NrtError::new(
                                NrtStatus::Resource,
                                format!("NeuronCore {c} is not available: {e}"),
                            )
                        })?;
                    let r = device
                        .notification_init(c, tuning::NQ_RING_CAPACITY)
                        .map_err(|e| {
                            let _ = device.dma_queue_release(c);
                            NrtError::new(
                                NrtStatus::Resource,
                                format!("NeuronCore {c} is not available: {e}"),
                            )
                        })?;
                    Ok((d, r))
                };
                match setup() {
                    Ok((d, r)) => {
                        reserved.push(c);
                        dma.push(d);
                        rings.push(r);
                    }
                    Err(e) => {
                        // Only what this call reserved: core `c` may belong to another runtime.
                        release(&*device, &reserved);
                        return Err(e);
                    }
                }
            }
            // The completion interrupt: every core of the vcore signals one wake, on which
            // the vcore's waiting threads block once their spin budget is spent. A device that
            // cannot signal leaves them spinning and yielding (never blocking).
            let wake = Arc::new(nrt_hal::CompletionWake::new());
            let wake = group
                .iter()
                .all(|&c| device.notification_wake(c, Some(wake.clone())).is_ok())
                .then_some(wake);
            // Each execution's own completion interrupt, for the one thread that waits for
            // it (a synchronous caller): woken for its execution alone, not for every
            // publication of the vcore. Only beside the vcore's wake.
            let exec_wakes = wake.as_ref().and_then(|_| {
                let w = Arc::new(nrt_hal::ExecutionWakes::new(tuning::EXEC_RING_SLOTS));
                group
                    .iter()
                    .all(|&c| device.execution_wakes(c, Some(w.clone())).is_ok())
                    .then_some(w)
            });
            let slots = tuning::EXEC_RING_SLOTS as usize;
            let now = harvest::coarse_now();
            let st = stats.core(vi);
            st.first_core.store(group[0] as u64, Ordering::Relaxed);
            st.cores.store(group.len() as u64, Ordering::Relaxed);
            let stats_ref = StatsRef(st);
            vcores.push(VCore {
                index: vi as u32,
                cores: group.to_vec(),
                staging: Mutex::new(Staging {
                    submitted: 0,
                    dma,
                    last_model: vec![0; group.len()],
                }),
                watch: rings.iter().map(PlaneConsumer::watch).collect(),
                idle_polls: AtomicU32::new(0),
                assisting: AtomicBool::new(false),
                served: nrt_hal::ServedCore::new(),
                harvest: Mutex::new(Harvest {
                    rings,
                    progress: vec![Progress::EMPTY; slots].into_boxed_slice(),
                    times: vec![[[[0; 2]; NUM_ENGINES]; MAX_LOCKSTEP_CORES]; slots]
                        .into_boxed_slice(),
                    last_sweep: now,
                }),
                slots: (0..slots)
                    .map(|_| InflightSlot {
                        ticket: nrt_hal::SlotTicket::new(),
                        info: UnsafeCell::new(SlotInfo {
                            model: None,
                            io_set: 0,
                            sg_count: 1,
                            deadline: now,
                            timeout: Duration::ZERO,
                            surface: Surface::Sync,
                            pending_marked: false,
                            t0_ns: 0,
                        }),
                    })
                    .collect(),
                completed: AtomicU64::new(0),
                unrecoverable: AtomicBool::new(false),
                counters: VcoreCounters::default(),
                models: AtomicU32::new(0),
                submitted: AtomicU64::new(0),
                xu: Xu::new(),
                stats: stats_ref,
                wake,
                exec_wakes,
                spin: nrt_hal::SpinBudget::new(),
                service: nrt_hal::SpinBudget::new(),
                before_sample: [AtomicU64::new(0), AtomicU64::new(0)],
            });
        }
        let implicit_async = if config.async_inflight > 0 {
            Some(ImplicitAsync::new(config.async_inflight, vcores.len()))
        } else {
            None
        };
        let inner = Arc::new(RuntimeInner {
            device,
            state: AtomicU8::new(OPEN),
            config,
            vcores: vcores.into_boxed_slice(),
            models: Mutex::new(Vec::new()),
            next_model_id: AtomicU32::new(1),
            implicit_async,
            trace: trace::Trace::new(),
            workers: Mutex::new(Vec::new()),
            workers_started: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            ownership: Mutex::new(ownership),
            stats,
        });
        inner
            .trace
            .start_inspect(&inner.config, || inner.device.clock_ns());
        if let Err(e) = worker::start_workers(&inner) {
            release(&*inner.device, &reserved);
            return Err(e);
        }
        nrt_log!(
            log::Module::Nrt,
            log::Level::Info,
            "nrt_init",
            "reserved {} NeuronCore(s) as {} logical core(s); {}",
            reserved.len(),
            inner.vcores.len(),
            if inner.implicit_async.is_some() {
                "implicit async mode"
            } else {
                "synchronous mode"
            }
        );
        let guard = Arc::new(CloseOnDrop(inner.clone()));
        Ok(Runtime(inner, guard))
    }

    /// [`Runtime::init`] with [`RuntimeConfig::from_env`].
    pub fn init_from_env(device: Arc<dyn Device>) -> Result<Runtime> {
        log::configure_from_env();
        Runtime::init(device, RuntimeConfig::from_env()?)
    }

    /// Closes the runtime: drains in-flight executions, unloads every model, releases the
    /// cores. Later calls on this runtime or its handles return `NRT_CLOSED`. Closing twice
    /// is a no-op.
    pub fn close(&self) {
        Runtime::close_inner(&self.0);
    }

    pub(crate) fn close_inner(rt: &Arc<RuntimeInner>) {
        if rt
            .state
            .compare_exchange(OPEN, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        drain_all(rt);
        let models: Vec<Arc<ModelShared>> =
            std::mem::take(&mut *rt.models.lock().unwrap_or_else(|e| e.into_inner()));
        for m in &models {
            unload_model(rt, m);
        }
        rt.trace.finish_inspect();
        rt.state.store(CLOSED, Ordering::Release);
        worker::stop_workers(rt);
        for vc in rt.vcores.iter() {
            for &c in &vc.cores {
                let _ = rt.device.dma_queue_release(c);
                let _ = rt.device.notification_release(c);
            }
        }
        // The cores are free for other processes now (the record goes with them).
        drop(
            rt.ownership
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
    }

    /// The statistics of logical core `vnc` as published ([`host`]); `None` past the
    /// last vcore.
    pub fn stats(&self, vnc: u32) -> Option<host::VcoreSnapshot> {
        let vc = self.0.vcores.get(vnc as usize)?;
        Some(host::snapshot(vc.stats()))
    }

    /// Whether the runtime is open.
    pub fn is_open(&self) -> bool {
        ensure_open(&self.0).is_ok()
    }

    /// The configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.0.config
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.0.device
    }

    /// Logical cores of this runtime (`nrt_get_visible_vnc_count`).
    pub fn vnc_count(&self) -> u32 {
        self.0.vcores.len() as u32
    }

    /// Loads a compiled model (NCM bytes) onto logical core `vnc` (`-1`: the one with the
    /// fewest models) (`nrt_load`).
    pub fn load(&self, bytes: &[u8], vnc: i32, opts: &LoadOptions) -> Result<Model> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = if vnc < 0 {
            rt.vcores
                .iter()
                .min_by_key(|v| v.models.load(Ordering::Relaxed))
                .expect("at least one vcore")
        } else {
            rt.vcores.get(vnc as usize).ok_or_else(|| {
                NrtError::new(
                    NrtStatus::LoadNotEnoughNc,
                    format!(
                        "logical NeuronCore {vnc} does not exist ({} visible)",
                        rt.vcores.len()
                    ),
                )
            })?
        };
        let id = rt.next_model_id.fetch_add(1, Ordering::Relaxed);
        let m = Arc::new(model::load(rt, bytes, vc, id, opts).inspect_err(|e| {
            nrt_log!(log::Module::Nrt, log::Level::Error, "nrt_load", "{e}");
        })?);
        vc.models.fetch_add(1, Ordering::Relaxed);
        let st = vc.stats();
        st.models.fetch_add(1, Ordering::Relaxed);
        for (c, b) in m.mem.iter().enumerate() {
            st.mem[c].fetch_add(*b, Ordering::Relaxed);
        }
        rt.models
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(m.clone());
        nrt_log!(
            log::Module::Nrt,
            log::Level::Info,
            "nrt_load",
            "loaded model '{}' (id {}) on vnc {} ({} core(s))",
            m.name,
            m.id,
            m.vnc,
            m.sg_count
        );
        Ok(Model(m))
    }

    /// Unloads a model (`nrt_unload`): executions in flight finish first; later executions
    /// of it fail with `NRT_INVALID`. Unloading twice is `NRT_INVALID`.
    pub fn unload(&self, model: &Model) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        if in_async_callback() {
            return Err(refused_in_callback("nrt_unload"));
        }
        if model
            .0
            .state
            .compare_exchange(
                STATE_LOADED,
                STATE_UNLOADING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return Err(NrtError::invalid(format!(
                "model '{}' (id {}) is already unloaded",
                model.0.name, model.0.id
            )));
        }
        rt.models
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|m| !Arc::ptr_eq(m, &model.0));
        unload_model(rt, &model.0);
        Ok(())
    }

    /// Allocates a tensor of `size` bytes (`nrt_tensor_allocate`). Device tensors live on
    /// logical core `vnc`.
    pub fn allocate_tensor(
        &self,
        placement: Placement,
        vnc: i32,
        size: u64,
        name: &str,
    ) -> Result<Tensor> {
        ensure_open(&self.0)?;
        match placement {
            Placement::Device => {
                if vnc < 0 || vnc as usize >= self.0.vcores.len() {
                    return Err(NrtError::invalid(format!(
                        "logical NeuronCore {vnc} does not exist ({} visible) for tensor '{name}'",
                        self.0.vcores.len()
                    )));
                }
                Tensor::new_device(&self.0, vnc, size, name)
            }
            Placement::Host | Placement::Virtual => {
                Tensor::new_host(&self.0, placement, size, name)
            }
        }
    }

    /// A tensor with no storage yet (`nrt_tensor_allocate_empty`); attach a buffer with
    /// [`Tensor::attach_buffer`].
    pub fn allocate_empty_tensor(&self, name: &str) -> Result<Tensor> {
        ensure_open(&self.0)?;
        Ok(Tensor::new_empty(&self.0, name))
    }

    /// Executes `model` on `inputs`, writing `outputs` (`nrt_execute`). In implicit async
    /// mode this returns as soon as the execution is staged; completion arrives through the
    /// registered callback.
    pub fn execute(&self, model: &Model, inputs: &TensorSet, outputs: &TensorSet) -> Result<()> {
        self.execute_repeat(model, inputs, outputs, 1)
    }

    /// `nrt_execute_repeat`: `repeat` must be ≤ 1 (repeated execution needs a specially
    /// compiled model, which this runtime does not produce).
    pub fn execute_repeat(
        &self,
        model: &Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
        repeat: i32,
    ) -> Result<()> {
        match pipeline::bind_mode(&self.0) {
            mode @ BindMode::CloneHostTensors => {
                sync::execute_sync(&self.0, &model.0, inputs, outputs, repeat, mode)
            }
            mode @ BindMode::RefuseHostTensors => {
                implicit::execute_implicit(&self.0, &model.0, inputs, outputs, repeat, mode)
            }
        }
    }

    /// The mode `execute` binds in, which the fork computes from whether the implicit-async
    /// worker pool exists (the seed's inverted exec mode): [`BindMode::CloneHostTensors`]
    /// (1) without it — `execute` is synchronous and clones host tensors — and
    /// [`BindMode::RefuseHostTensors`] (0) with it. The explicit surface
    /// ([`Runtime::execute_schedule`]) refuses host tensors whatever this says.
    pub fn bind_mode(&self) -> BindMode {
        pipeline::bind_mode(&self.0)
    }

    /// Device memory in use (`nrt_get_vnc_memory_stats`).
    pub fn memory_stats(&self, vnc: u32) -> Result<MemoryStats> {
        ensure_open(&self.0)?;
        if vnc as usize >= self.0.vcores.len() {
            return Err(NrtError::invalid(format!(
                "logical NeuronCore {vnc} does not exist"
            )));
        }
        let u = self.0.device.mem_usage();
        Ok(MemoryStats {
            bytes_used: u.bytes_used,
            bytes_limit: u.bytes_limit,
        })
    }

    /// Staging/doorbell/publish counters of logical core `vnc`.
    pub fn pipeline_counters(&self, vnc: u32) -> PipelineCounters {
        let c = &self.0.vcores[vnc as usize].counters;
        PipelineCounters {
            staging_locks: c.staging_locks.load(Ordering::Relaxed),
            doorbells: c.doorbells.load(Ordering::Relaxed),
            publishes: c.publishes.load(Ordering::Relaxed),
            barrier_proxy_waits: c.barrier_proxy_waits.load(Ordering::Relaxed),
            host_clone_binds: c.host_clone_binds.load(Ordering::Relaxed),
            served_wakes: self.0.vcores[vnc as usize].served.wakes() as u64,
            execution_wakes: self.0.vcores[vnc as usize]
                .exec_wakes
                .as_ref()
                .map_or(0, |w| w.wakes() as u64),
        }
    }

    /// Model-switch counters.
    pub fn switch_counters(&self) -> SwitchCounters {
        let sum = |f: fn(&VcoreCounters) -> &AtomicU64| {
            self.0
                .vcores
                .iter()
                .map(|v| f(&v.counters).load(Ordering::Relaxed))
                .sum()
        };
        SwitchCounters {
            model_switches: sum(|c| &c.model_switches),
            steady: sum(|c| &c.steady_executions),
        }
    }

    /// Turns per-stage tracing on (clearing the ring) or off.
    pub fn set_tracing(&self, on: bool) {
        let dev = &self.0.device;
        self.0.trace.set_enabled(on, || dev.clock_ns());
    }

    /// Whether `NEURON_RT_INSPECT_ENABLE` profiles this runtime (then
    /// [`Runtime::set_tracing`] changes nothing).
    pub fn inspecting(&self) -> bool {
        self.0.trace.inspecting()
    }

    /// The device clock ([`nrt_hal::Device::clock_ns`]) when tracing was last turned on:
    /// the trace's time zero, for placing device-side events (a software device's
    /// instruction timeline) on the spans' axis. `None` while no trace was started.
    pub fn trace_device_epoch_ns(&self) -> Option<u64> {
        self.0.trace.device_epoch_ns()
    }

    /// The recorded spans, oldest first.
    pub fn trace_spans(&self) -> Vec<Span> {
        let mut v = Vec::new();
        self.0.trace.spans(&mut v);
        v
    }

    /// Resets logical core `vnc` after a fatal error: resets its cores on the device and makes
    /// its XU accept work again.
    pub fn reset_vnc(&self, vnc: u32) -> Result<()> {
        ensure_open(&self.0)?;
        let vc = self
            .0
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        let _st = vc.staging.lock().unwrap_or_else(|e| e.into_inner());
        for &c in &vc.cores {
            self.0.device.nc_reset(c)?;
        }
        vc.unrecoverable.store(false, Ordering::Release);
        Ok(())
    }
}

impl Runtime {
    /// Schedules an execution on the compute XU (`nrta_execute_schedule`): returns its seq id
    /// at once. `queue` must be 0. `status`, if not null, receives the final status when the
    /// execution completes (before `is_completed` turns true).
    ///
    /// # Safety
    /// `status` must be null or valid for a 4-byte write until the execution completes.
    pub unsafe fn execute_schedule_raw(
        &self,
        model: &crate::Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        explicit::schedule(&self.0, &model.0, inputs, outputs, queue, status)
    }

    /// [`Runtime::execute_schedule_raw`] without a status slot; read the outcome with
    /// [`Runtime::wait`].
    pub fn execute_schedule(
        &self,
        model: &crate::Model,
        inputs: &TensorSet,
        outputs: &TensorSet,
    ) -> Result<SeqId> {
        // SAFETY: a null status slot is never written.
        unsafe { self.execute_schedule_raw(model, inputs, outputs, 0, core::ptr::null_mut()) }
    }

    /// Whether `seq` completed (`nrta_is_completed`); `NRT_INVALID` for a seq that was never
    /// issued.
    pub fn is_completed(&self, seq: SeqId) -> Result<bool> {
        let rt = &self.0;
        ensure_open(rt)?;
        let (vc, kind) = parse_seq(rt, seq)?;
        match kind {
            XuKind::Compute => explicit::is_completed(rt, vc, seq),
            XuKind::TensorOp => explicit::check_issued(vc, kind, seq).map(|_| true),
            XuKind::Collectives => Err(NrtError::invalid(format!(
                "sequence {:#x}: collectives are not supported",
                seq.0
            ))),
        }
    }

    /// Waits for `seq` on the calling thread (spinning the harvest) and returns its status.
    pub fn wait(&self, seq: SeqId) -> Result<NrtStatus> {
        let rt = &self.0;
        let (vc, kind) = parse_seq(rt, seq)?;
        if kind != XuKind::Compute {
            return self.is_completed(seq).map(|_| NrtStatus::Success);
        }
        explicit::wait(rt, vc, seq)
    }

    /// The last completed seq of an XU (`nrta_get_sequence`).
    pub fn get_sequence(&self, vnc: u32, kind: XuKind, queue: i32) -> Result<SeqId> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = explicit::xu_vcore(rt, vnc, queue)?;
        let n = match kind {
            XuKind::Compute => vc.completed.load(Ordering::Acquire),
            XuKind::TensorOp => vc.xu.tensor_ops.load(Ordering::Acquire),
            XuKind::Collectives => return Err(NrtError::invalid("collectives are not supported")),
        };
        Ok(SeqId::new(xu_id(vnc, kind), n))
    }

    /// Signals eventfd `efd` when `seq` completes (at once if it already has);
    /// `efd = -1` deregisters (`nrta_event_register_seq_id_completion`).
    pub fn register_seq_eventfd(&self, seq: SeqId, efd: i32) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let (vc, kind) = parse_seq(rt, seq)?;
        let n = explicit::check_issued(vc, kind, seq)?;
        if efd >= 0 {
            check_eventfd(efd)?;
        }
        if kind == XuKind::TensorOp {
            signal_efd(efd);
            return Ok(());
        }
        let ev = &vc.xu.seq_efd[((n - 1) % tuning::EXEC_RING_SLOTS as u64) as usize];
        if efd < 0 {
            ev.disarm(n);
            return Ok(());
        }
        // Already complete (or completing right now): exactly one of this call and the
        // retiring owner signals it (`SeqEvent`'s handshake).
        if let Some(fd) = ev.arm(n, efd, || explicit::completed_already(vc, n)) {
            signal_efd(fd);
        } else {
            vc.xu.rely_on_worker();
        }
        Ok(())
    }

    /// Signals `efd` on every completion of an XU; `-1` deregisters
    /// (`nrta_event_register_xu_completion`).
    pub fn register_xu_eventfd(&self, vnc: u32, kind: XuKind, queue: i32, efd: i32) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = explicit::xu_vcore(rt, vnc, queue)?;
        if efd >= 0 {
            check_eventfd(efd)?;
        }
        match kind {
            XuKind::Compute => {
                vc.xu.compute_efd.store(efd.max(-1), Ordering::Release);
                if efd >= 0 {
                    vc.xu.rely_on_worker();
                }
            }
            XuKind::TensorOp => vc.xu.tensor_efd.store(efd.max(-1), Ordering::Release),
            XuKind::Collectives => return Err(NrtError::invalid("collectives are not supported")),
        }
        Ok(())
    }

    fn tensor_op(
        &self,
        vnc: u32,
        queue: i32,
        status: *mut i32,
        op: impl FnOnce() -> Result<()>,
    ) -> Result<SeqId> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = explicit::xu_vcore(rt, vnc, queue)?;
        let r = op();
        let st = r.as_ref().map_or_else(|e| e.status, |_| NrtStatus::Success);
        if !status.is_null() {
            // SAFETY: the caller's contract for the status slot (see execute_schedule_raw).
            unsafe { status.write_volatile(st.as_i32()) };
        }
        r?;
        let n = vc.xu.tensor_ops.fetch_add(1, Ordering::AcqRel) + 1;
        signal_efd(vc.xu.tensor_efd.load(Ordering::Acquire));
        Ok(SeqId::new(xu_id(vnc, XuKind::TensorOp), n))
    }

    /// Schedules a tensor write on the tensor-op XU (`nrta_tensor_write`). The copy is done
    /// when this returns; the seq completes at once.
    ///
    /// # Safety
    /// `status`: as in [`Runtime::execute_schedule_raw`].
    pub unsafe fn tensor_write_schedule(
        &self,
        t: &Tensor,
        buf: &[u8],
        offset: u64,
        vnc: u32,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        self.tensor_op(vnc, queue, status, || t.write(buf, offset))
    }

    /// Schedules a tensor read (`nrta_tensor_read`).
    ///
    /// # Safety
    /// `status`: as in [`Runtime::execute_schedule_raw`].
    pub unsafe fn tensor_read_schedule(
        &self,
        t: &Tensor,
        buf: &mut [u8],
        offset: u64,
        vnc: u32,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        self.tensor_op(vnc, queue, status, || t.read(buf, offset))
    }

    /// Schedules a tensor copy (`nrta_tensor_copy`).
    ///
    /// # Safety
    /// `status`: as in [`Runtime::execute_schedule_raw`].
    #[allow(
        clippy::too_many_arguments,
        reason = "mirrors the public nrta_tensor_copy signature"
    )]
    pub unsafe fn tensor_copy_schedule(
        &self,
        src: &Tensor,
        src_offset: u64,
        dst: &Tensor,
        dst_offset: u64,
        size: u64,
        vnc: u32,
        queue: i32,
        status: *mut i32,
    ) -> Result<SeqId> {
        self.tensor_op(vnc, queue, status, || {
            dst.copy_from(src, src_offset, dst_offset, size)
        })
    }

    /// Registers the implicit-async completion callback, replacing the previous one
    /// (`nrt_register_async_exec_callback`). `NRT_INVALID` when the runtime is not in
    /// implicit async mode.
    pub fn register_async_callback(&self, cb: AsyncCallback) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let ia = rt.implicit_async.as_ref().ok_or_else(|| {
            NrtError::invalid("not in async mode: set NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0 before nrt_init")
        })?;
        let new = Box::into_raw(Box::new(CallbackBox { cb }));
        let old = ia.callback.swap(new, Ordering::AcqRel);
        // SAFETY: `old` came from Box::into_raw; it is parked (not freed) because a worker may
        // still be calling it.
        ia.graveyard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(unsafe { Box::from_raw(old) });
        Ok(())
    }

    /// Waits until every implicit-async execution on `vnc` completed and was reported
    /// (`nrt_async_drain_queued_execs`).
    pub fn async_drain(&self, vnc: i32) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        if in_async_callback() {
            return Err(refused_in_callback("nrt_async_drain_queued_execs"));
        }
        if vnc < 0 {
            drain_all(rt);
            return Ok(());
        }
        let vc = rt
            .vcores
            .get(vnc as usize)
            .ok_or_else(|| NrtError::invalid(format!("no logical NeuronCore {vnc}")))?;
        drain_vcore(rt, vc);
        Ok(())
    }

    /// Executions ever staged on the logical core that holds physical core `core`
    /// (`compute_idx_tail`), `None` when this runtime has no such core. With
    /// `SoftDevice::inject_after_staged`, a fault armed at run time fires on the next
    /// execution submitted, not on one already queued.
    pub fn staged_on_core(&self, core: u32) -> Option<u64> {
        self.0
            .vcores
            .iter()
            .find(|v| v.cores.contains(&core))
            .map(|v| v.submitted.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Test hook: logical core `vnc`'s compute XU goes on as though `issued` executions had
    /// been issued and completed, so the next one gets sequence number `issued + 1` — the
    /// `NRTA_SEQ_NUM_MAX` boundary is 2^48 executions away otherwise. `NRT_INVALID` while
    /// anything is in flight on the vcore, backwards, or past `NRTA_SEQ_NUM_MAX`.
    #[doc(hidden)]
    pub fn fast_forward_compute_xu(&self, vnc: u32, issued: u64) -> Result<()> {
        let rt = &self.0;
        ensure_open(rt)?;
        let vc = explicit::xu_vcore(rt, vnc, 0)?;
        let mut st = vc.staging.lock().unwrap_or_else(|e| e.into_inner());
        let idle = vc.completed.load(Ordering::Acquire) == st.submitted
            && vc.slots.iter().all(|s| s.ticket.is_free());
        if !idle || issued < st.submitted || issued > nrt_hal::NRTA_SEQ_NUM_MAX {
            return Err(NrtError::invalid(format!(
                "cannot fast-forward the compute XU of vnc {vnc} from {} to {issued}",
                st.submitted
            )));
        }
        st.submitted = issued;
        vc.completed.store(issued, Ordering::Release);
        vc.submitted.store(issued, Ordering::Release);
        Ok(())
    }

    /// Whether the runtime runs implicit async (`NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS`).
    pub fn is_implicit_async(&self) -> bool {
        self.0.implicit_async.is_some()
    }
}

/// Refuses a completion descriptor that is not an eventfd: signalling writes 8 bytes to it
/// from the harvest, which must never block (a full pipe did, forever) or write into a file
/// or socket the caller did not mean. Cold: at registration only.
#[cold]
fn check_eventfd(efd: i32) -> Result<()> {
    let link = std::fs::read_link(format!("/proc/self/fd/{efd}"));
    match link {
        Ok(l) if l.as_os_str() == "anon_inode:[eventfd]" => Ok(()),
        Ok(l) => Err(NrtError::invalid(format!(
            "descriptor {efd} is not an eventfd ({}): completions are signalled through an eventfd (eventfd(2))",
            l.display()
        ))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            Err(NrtError::invalid(format!("descriptor {efd} is not open")))
        }
        // No /proc: at least an open descriptor that is no pipe, socket or file.
        Err(_) => {
            // SAFETY: fstat into a zeroed stat buffer of the right type.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: as above; `st` outlives the call.
            if unsafe { libc::fstat(efd, &mut st) } != 0 {
                return Err(NrtError::invalid(format!("descriptor {efd} is not open")));
            }
            if st.st_mode & libc::S_IFMT != 0 {
                return Err(NrtError::invalid(format!(
                    "descriptor {efd} is not an eventfd (a file, pipe or socket)"
                )));
            }
            Ok(())
        }
    }
}
