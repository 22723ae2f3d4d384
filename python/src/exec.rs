//! How one execution of a [`Model`] runs. Off the main thread (or with
//! `configure(interruptible=False)`, or while tracing): the sync surface, the call's arrays
//! bound to pooled empty host tensors. On the main thread: the explicit surface, inputs
//! copied into pooled device tensors and the completion waited for on an eventfd in slices,
//! running Python's signal handlers between them (Ctrl-C), with an interrupted execution's
//! tensors parked until it completes.

use crate::arrays::{data_ptr, nbytes};
use crate::lock;
use crate::model::Model;
use nrt_hal::{NrtStatus, SeqId};
use nrt_runtime::{NrtError as RtError, Placement, Tensor as RtTensor, TensorSet};
use numpy::PyUntypedArray;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Empty host tensors, one per input and output, re-attached to each call's buffers.
struct IoPair {
    ins: TensorSet,
    outs: TensorSet,
    in_t: Vec<RtTensor>,
    out_t: Vec<RtTensor>,
}

/// The interruptible path's I/O ([`Model::run_interruptible`]): device tensors, one per
/// input and output, and the execution's status slot.
struct DevPair {
    ins: TensorSet,
    outs: TensorSet,
    in_t: Vec<RtTensor>,
    out_t: Vec<RtTensor>,
    /// Written by the runtime when the execution completes (`execute_schedule_raw`).
    status: Box<AtomicI32>,
}

/// A model's pooled I/O.
#[derive(Default)]
pub(crate) struct Pools {
    /// The sync path's empty host tensors.
    host: Vec<IoPair>,
    /// The interruptible path's device tensors.
    dev: Vec<DevPair>,
    /// Device tensors of executions a signal interrupted the wait for: still in flight, so
    /// not reused until the runtime says they completed (a hung one: after its timeout).
    abandoned: Vec<(SeqId, DevPair)>,
}

/// At most this many pooled I/O sets of each kind per model.
const POOL_MAX: usize = 64;

/// How often a wait for an execution on the main thread wakes to run Python's signal
/// handlers (Ctrl-C: `KeyboardInterrupt`).
const SIGNAL_CHECK_EVERY: Duration = Duration::from_millis(50);

/// Whether the main thread's calls wait interruptibly (`configure(interruptible=...)`).
pub(crate) static INTERRUPTIBLE: AtomicBool = AtomicBool::new(true);

/// The thread ident (`threading.get_ident()`, pthread_self) of Python's main thread, the
/// one thread signal handlers run on (0: unknown).
static MAIN_THREAD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Registers Python's main thread (`threading.main_thread().ident`; again in a fork child).
#[pyfunction]
pub(crate) fn _set_main_thread(ident: u64) {
    MAIN_THREAD.store(ident, Ordering::Relaxed);
}

pub(crate) fn on_main_thread() -> bool {
    // SAFETY: pthread_self has no preconditions.
    let me = unsafe { libc::pthread_self() } as u64;
    MAIN_THREAD.load(Ordering::Relaxed) == me
}

/// An eventfd, closed on drop.
struct EventFd(i32);

impl EventFd {
    fn new() -> Result<EventFd, RtError> {
        // SAFETY: eventfd has no memory preconditions; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(RtError::new(
                NrtStatus::Resource,
                format!("eventfd: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(EventFd(fd))
    }

    /// Waits up to `timeout` for the eventfd to be signaled (and consumes the signal).
    fn wait(&self, timeout: Duration) {
        let mut p = libc::pollfd {
            fd: self.0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; poll returns early on a signal (EINTR), which is fine.
        unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
        let mut v = 0u64;
        // SAFETY: an 8-byte read into a u64 from our non-blocking eventfd.
        unsafe { libc::read(self.0, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for EventFd {
    fn drop(&mut self) {
        // SAFETY: our descriptor, closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Where one input's bytes come from.
pub(crate) enum Src<'py> {
    /// A host buffer (kept alive by the array).
    Host(Bound<'py, PyUntypedArray>),
    /// A device tensor.
    Device(RtTensor),
}

impl Model {
    fn take_pair(&self) -> Result<IoPair, RtError> {
        if let Some(p) = lock(&self.pool).host.pop() {
            return Ok(p);
        }
        let rt = &self.g.rt;
        let mut p = IoPair {
            ins: TensorSet::new(),
            outs: TensorSet::new(),
            in_t: Vec::new(),
            out_t: Vec::new(),
        };
        for i in &self.inputs {
            let t = rt.allocate_empty_tensor(&i.get().name)?;
            p.ins.add(&i.get().name, &t);
            p.in_t.push(t);
        }
        for o in &self.outputs {
            let t = rt.allocate_empty_tensor(&o.get().name)?;
            p.outs.add(&o.get().name, &t);
            p.out_t.push(t);
        }
        Ok(p)
    }

    fn give_back(&self, p: IoPair) {
        let mut pool = lock(&self.pool);
        if pool.host.len() < POOL_MAX {
            pool.host.push(p);
        }
    }

    /// A set of device tensors for the interruptible path: a pooled one, one whose
    /// interrupted execution has completed since, or a new one.
    fn take_dev_pair(&self) -> Result<DevPair, RtError> {
        {
            let mut pool = lock(&self.pool);
            let rt = &self.g.rt;
            // An interrupted execution's tensors come back once it completed (an error —
            // the runtime closed — drops them).
            let mut k = 0;
            while k < pool.abandoned.len() {
                match rt.is_completed(pool.abandoned[k].0) {
                    Ok(false) => k += 1,
                    done => {
                        let (_, p) = pool.abandoned.swap_remove(k);
                        if done.is_ok() && pool.dev.len() < POOL_MAX {
                            pool.dev.push(p);
                        }
                    }
                }
            }
            if let Some(p) = pool.dev.pop() {
                return Ok(p);
            }
        }
        let (rt, vnc) = (&self.g.rt, self.m.vnc() as i32);
        let mut p = DevPair {
            ins: TensorSet::new(),
            outs: TensorSet::new(),
            in_t: Vec::new(),
            out_t: Vec::new(),
            status: Box::new(AtomicI32::new(0)),
        };
        for i in &self.inputs {
            let i = i.get();
            let t = rt.allocate_tensor(Placement::Device, vnc, i.size, &i.name)?;
            p.ins.add(&i.name, &t);
            p.in_t.push(t);
        }
        for o in &self.outputs {
            let o = o.get();
            let t = rt.allocate_tensor(Placement::Device, vnc, o.size, &o.name)?;
            p.outs.add(&o.name, &t);
            p.out_t.push(t);
        }
        Ok(p)
    }

    /// Runs on the main thread: the execution is scheduled on the explicit surface (its
    /// inputs copied into pooled device tensors, as the sync surface copies host inputs
    /// into its clone buffers) and waited for in slices of [`SIGNAL_CHECK_EVERY`], running
    /// Python's signal handlers between them, so that Ctrl-C raises `KeyboardInterrupt`
    /// within ~50 ms even while the execution hangs. An interrupted execution stays in
    /// flight: its tensors are parked ([`Pools::abandoned`]) until the runtime reports it
    /// completed (a hung one times out), never reused before. Returns the execution's
    /// result; the outputs are in `outs` on success.
    pub(crate) fn run_interruptible(
        &self,
        py: Python<'_>,
        srcs: &[Src<'_>],
        outs: &[Bound<'_, PyUntypedArray>],
    ) -> PyResult<Result<(), RtError>> {
        let mut pair = match self.take_dev_pair() {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        // Host inputs: their bytes, copied without the GIL below.
        let mut copies: Vec<(usize, usize, usize)> = Vec::with_capacity(srcs.len());
        for (k, (src, info)) in srcs.iter().zip(&self.inputs).enumerate() {
            match src {
                Src::Host(a) => {
                    pair.ins.add(&info.get().name, &pair.in_t[k]);
                    copies.push((k, data_ptr(a) as usize, nbytes(a)));
                }
                Src::Device(t) => pair.ins.add(&info.get().name, t),
            }
        }
        let (rt, m) = (&self.g.rt, &*self.m);
        // As an address: a raw pointer cannot cross into the GIL-free closure.
        let status = pair.status.as_ptr() as usize;
        pair.status.store(-1, Ordering::Relaxed);
        let scheduled = py.allow_threads(|| -> Result<SeqId, RtError> {
            for &(k, p, n) in &copies {
                // SAFETY: the arrays are C-contiguous, `n` bytes long and referenced by
                // `srcs` for the whole call; only read.
                let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n) };
                pair.in_t[k].write(bytes, 0)?;
            }
            loop {
                // SAFETY: the status slot lives in `pair`, which is kept (pooled or parked
                // in `abandoned`, never dropped) until the execution completed.
                match unsafe {
                    rt.execute_schedule_raw(m, &pair.ins, &pair.outs, 0, status as *mut i32)
                } {
                    // Every I/O set is in flight (other threads, interrupted executions):
                    // wait for one as the sync surface does.
                    Err(e) if e.status == NrtStatus::QueueFull => {
                        std::thread::sleep(Duration::from_micros(200))
                    }
                    r => return r,
                }
            }
        });
        let seq = match scheduled {
            Ok(seq) => seq,
            Err(e) => {
                self.give_back_dev(pair);
                return Ok(Err(e));
            }
        };
        let waited = self.wait_interruptible(py, seq);
        match waited {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // The runtime closed under it: nothing is reused.
                return Ok(Err(e));
            }
            Err(interrupted) => {
                lock(&self.pool).abandoned.push((seq, pair));
                return Err(interrupted);
            }
        }
        let st = pair.status.load(Ordering::Acquire);
        let result = match NrtStatus::try_from(st).ok() {
            Some(NrtStatus::Success) => {
                let reads: Vec<(usize, usize)> = outs
                    .iter()
                    .map(|a| (data_ptr(a) as usize, nbytes(a)))
                    .collect();
                py.allow_threads(|| -> Result<(), RtError> {
                    for (&(p, n), t) in reads.iter().zip(&pair.out_t) {
                        // SAFETY: fresh C-contiguous output arrays of the outputs' sizes,
                        // referenced by `outs` and seen by nobody else yet.
                        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) };
                        t.read(buf, 0)?;
                    }
                    Ok(())
                })
            }
            Some(s) => Err(RtError::new(
                s,
                format!(
                    "execution {} of model '{}' failed: {}",
                    seq.seq_num(),
                    m.name(),
                    s.description()
                ),
            )),
            None => Err(RtError::new(
                NrtStatus::Failure,
                format!("execution of model '{}' ended with status {st}", m.name()),
            )),
        };
        self.give_back_dev(pair);
        Ok(result)
    }

    fn give_back_dev(&self, p: DevPair) {
        let mut pool = lock(&self.pool);
        if pool.dev.len() < POOL_MAX {
            pool.dev.push(p);
        }
    }

    /// Waits for `seq` without the GIL, waking every [`SIGNAL_CHECK_EVERY`] to run Python's
    /// signal handlers. `Err` is the handlers' exception (the execution is still in flight);
    /// `Ok(Err)` a runtime error of the wait itself.
    fn wait_interruptible(&self, py: Python<'_>, seq: SeqId) -> PyResult<Result<(), RtError>> {
        let rt = &self.g.rt;
        // Blocks on an eventfd the runtime signals at completion, in slices. Polling
        // `is_completed` first (helping the harvest) was slower: with 500 µs of polling
        // before blocking, the mlp sample's p50 from the main thread was 650 µs (the
        // spinning caller kept the device's thread off a CPU on a 2-vCPU host), 30 µs of it
        // 178 µs, none 128 µs (the sync surface: 85 µs).
        let efd = match EventFd::new() {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        if let Err(e) = rt.register_seq_eventfd(seq, efd.0) {
            return Ok(Err(e));
        }
        let out = loop {
            let done = py.allow_threads(|| -> Result<bool, RtError> {
                let until = Instant::now() + SIGNAL_CHECK_EVERY;
                loop {
                    if rt.is_completed(seq)? {
                        return Ok(true);
                    }
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    efd.wait(left);
                }
            });
            match done {
                Ok(true) => break Ok(Ok(())),
                Ok(false) => {
                    if let Err(e) = py.check_signals() {
                        break Err(e);
                    }
                }
                Err(e) => break Ok(Err(e)),
            }
        };
        // Deregistered before the descriptor closes (a later completion must not write to
        // a number the process may reuse).
        let _ = rt.register_seq_eventfd(seq, -1);
        drop(efd);
        out
    }

    /// The sync surface: the arrays' buffers bound to pooled empty host tensors, the whole
    /// execution on this thread without the GIL (not interruptible by signals).
    pub(crate) fn run_sync(
        &self,
        py: Python<'_>,
        srcs: &[Src<'_>],
        outs: &[Bound<'_, PyUntypedArray>],
    ) -> Result<(), RtError> {
        let mut pair = self.take_pair()?;
        let attached = (|| -> Result<(), RtError> {
            for (src, t) in srcs.iter().zip(&pair.in_t) {
                if let Src::Host(a) = src {
                    // SAFETY: the array is C-contiguous, `nbytes` long (its shape was checked
                    // against the model's) and referenced by `srcs` until after the
                    // execution; the tensor is detached again before this returns.
                    unsafe { t.attach_buffer(data_ptr(a), nbytes(a))? }
                }
            }
            for (a, t) in outs.iter().zip(&pair.out_t) {
                // SAFETY: a fresh C-contiguous output array of the output's size, referenced
                // by `outs` until after the execution; detached again before return.
                unsafe { t.attach_buffer(data_ptr(a), nbytes(a))? }
            }
            Ok(())
        })();
        for (src, info) in srcs.iter().zip(&self.inputs) {
            if let Src::Device(t) = src {
                pair.ins.add(&info.get().name, t);
            }
        }
        let result = match attached {
            Ok(()) => {
                let (rt, m, p) = (&self.g.rt, &self.m, &pair);
                py.allow_threads(|| rt.execute(m, &p.ins, &p.outs))
            }
            Err(e) => Err(e),
        };
        // Detach every buffer (so no tensor keeps a pointer into an array that may be freed)
        // and put the pooled empty tensors back where device tensors were bound.
        for t in pair.in_t.iter().chain(&pair.out_t) {
            // SAFETY: a null buffer of length 0 is never dereferenced.
            let _ = unsafe { t.attach_buffer(std::ptr::null_mut(), 0) };
        }
        for ((src, t), info) in srcs.iter().zip(&pair.in_t).zip(&self.inputs) {
            if let Src::Device(_) = src {
                pair.ins.add(&info.get().name, t);
            }
        }
        if result.is_ok() || self.g.rt.is_open() {
            // Keep the pool only while the runtime is usable.
            self.give_back(pair);
        }
        result
    }
}
