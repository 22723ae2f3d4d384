//! Every tunable of the project, each with the reason for its value in a line or two; the
//! measurements behind each value (figures, commands, what was tried) are in the ledger,
//! `docs/measurements.md`, one section per knob.
//!
//! The figures come from `reference/machine-limits.md` (2 vCPUs, AMD Zen 4 under KVM): a
//! spinning cross-thread round trip is 0.1–0.4 µs, a park/unpark or eventfd wake 20–60 µs
//! (p99 up to 1.7 ms), `usleep(1)` sleeps 70–78 µs. One spinning thread is half the machine,
//! so every spin here is bounded and every idle thread ends up parked.

use core::time::Duration;

//===--- device (software NeuronCore) ---------------------------------------------------===//

/// A time-bounded polling loop reads the clock once every this many polls: a clock read
/// (~20–30 ns) beside a 12–50 ns poll would be most of the loop.
/// See docs/measurements.md#clock_read_every_polls
pub const CLOCK_READ_EVERY_POLLS: u32 = 64;

/// An idle-polling device thread calls `sched_yield` at most this often, so a host thread that
/// shares its vCPU runs at once; a time, not a poll count, because a poll's cost differs by host.
/// See docs/measurements.md#device_idle_yield_period
pub const DEVICE_IDLE_YIELD_PERIOD: Duration = Duration::from_micros(3);

/// How often a parked device thread looks at a core a host thread serves, and runs work nobody
/// took since the last look (a serving thread inside a long callback, preempted or gone).
/// See docs/measurements.md#device_host_served_check
pub const DEVICE_HOST_SERVED_CHECK: Duration = Duration::from_millis(1);

/// On hosts with at most this many CPUs the XU worker runs a short model's implicit executions
/// itself: three runnable threads on two vCPUs paid a context switch per hand-off.
/// See docs/measurements.md#xu_serves_core_max_cpus
pub const XU_SERVES_CORE_MAX_CPUS: usize = 2;

/// Polls of its core the serving XU worker runs before it harvests: amortizes harvest and
/// retire, bounded so the first callback does not wait behind a long queue.
/// See docs/measurements.md#xu_serve_batch
pub const XU_SERVE_BATCH: u32 = 8;

/// A synchronous caller runs its execution's device work on its own thread when the model is
/// expected within this ([`WAIT_SPIN_CAP_SPARE_CPU`], which it would spin through anyway).
/// See docs/measurements.md#sync_serves_core_max
pub const SYNC_SERVES_CORE_MAX: Duration = WAIT_SPIN_CAP_SPARE_CPU;

/// Polls without progress (~10 µs) after which a synchronous caller that serves its core hands
/// it back to the device thread and waits as usual.
/// See docs/measurements.md#sync_serve_idle_polls
pub const SYNC_SERVE_IDLE_POLLS: u32 = 256;

/// How long a device thread polls for doorbells after its last work before it parks:
/// back-to-back executions never pay the 20–60 µs wake, an idle process sits at ~0% CPU.
/// See docs/measurements.md#device_spin_after_work
pub const DEVICE_SPIN_AFTER_WORK: Duration = Duration::from_micros(200);

/// How long an execution may sit with no engine able to progress before the core's watchdog
/// declares a hang (cause bit 29); well below [`MIN_EXEC_TIMEOUT`].
/// See docs/measurements.md#device_hang_watchdog
pub const DEVICE_HANG_WATCHDOG: Duration = Duration::from_millis(20);

/// How long the interrupt-cause read watches a core with work before reporting it busy past the
/// deadline (bit 29): far above one poll of a short execution, far below any timeout.
/// See docs/measurements.md#device_busy_probe
pub const DEVICE_BUSY_PROBE: Duration = Duration::from_millis(1);

/// Control instructions a core's scheduler runs on one engine before it looks at the others:
/// keeps a long run of them from monopolizing the device thread.
/// See docs/measurements.md#device_engine_quantum
pub const DEVICE_ENGINE_QUANTUM: u32 = 64;

/// How long a device thread stalled at a lockstep barrier polls before blocking until the
/// partner's next cross-core event: a longer spin could hold the vCPU the partner needs.
/// See docs/measurements.md#device_stall_spin
pub const DEVICE_STALL_SPIN: Duration = Duration::from_micros(50);

/// Longest block of a stalled device thread before it looks again by itself, for the hang
/// watchdog (also capped at a quarter of the configured watchdog).
/// See docs/measurements.md#device_stall_block_max
pub const DEVICE_STALL_BLOCK_MAX: Duration = Duration::from_millis(5);

/// A lockstep core whose part of an execution runs shorter than this on average is served
/// jointly by the group leader's thread; between a hand-off (10–20 µs) and a parallel win.
/// See docs/measurements.md#device_joint_part_max
pub const DEVICE_JOINT_PART_MAX: Duration = Duration::from_micros(50);

/// Weight (`1 / 2^shift`) of a new sample in a core's average lockstep part duration: a few
/// executions move it, one outlier does not flip the mode.
/// See docs/measurements.md#device_joint_ewma_shift
pub const DEVICE_JOINT_EWMA_SHIFT: u32 = 3;

/// Executions a probe of the other lockstep serving mode runs; its median is compared with the
/// current mode's last 16. Five, so one or two descheduled ones do not move the median.
/// See docs/measurements.md#serve_mode_probe_parts
pub const SERVE_MODE_PROBE_PARTS: usize = 5;

/// First wait between probes of the other serving mode, doubled after each probe that keeps
/// the current mode up to [`SERVE_MODE_PROBE_MAX`], reset after a switch.
/// See docs/measurements.md#serve_mode_probe_min
pub const SERVE_MODE_PROBE_MIN: Duration = Duration::from_millis(50);
/// Longest wait between probes of the other serving mode (see [`SERVE_MODE_PROBE_MIN`]).
/// See docs/measurements.md#serve_mode_probe_min
pub const SERVE_MODE_PROBE_MAX: Duration = Duration::from_secs(1);

/// A parallel lockstep group probes the joint mode only when its median cost is at least this
/// share (%) of its parts' summed running time (50% is a perfect two-way split).
/// See docs/measurements.md#serve_mode_probe_ratio_percent
pub const SERVE_MODE_PROBE_RATIO_PERCENT: u32 = 80;

/// A probe switches modes only when it beats the current mode's median by this much (%); less
/// is noise between two runs of the same mode on a shared host.
/// See docs/measurements.md#serve_mode_switch_gain_percent
pub const SERVE_MODE_SWITCH_GAIN_PERCENT: u64 = 10;

//===--- rings and queues ----------------------------------------------------------------===//

/// Records per notification ring: at the 63-request in-flight cap one execution's records
/// stay < 1,024 per ring even if the host stops reading.
/// See docs/measurements.md#nq_ring_capacity
pub const NQ_RING_CAPACITY: u32 = 1024;

/// Slots of each model's exec-request ring per core: the public in-flight cap (63) plus one,
/// a power of two, so a full async queue never waits for a ring slot.
/// See docs/measurements.md#exec_ring_slots
pub const EXEC_RING_SLOTS: u32 = 64;
const _: () = assert!(
    EXEC_RING_SLOTS.is_power_of_two(),
    "slot indices are taken modulo EXEC_RING_SLOTS on the hot path: a mask, not a division"
);

/// Trigger pairs in each core's DMA queue: 3 per staged request for every ring slot of up to
/// 4 models; if ever full, staging waits (bounded) for the device to drain it.
/// See docs/measurements.md#dma_queue_capacity
pub const DMA_QUEUE_CAPACITY: u32 = 1024;

/// I/O descriptor sets per model with host-clone buffers: each synchronous host-tensor caller
/// holds one for its execution; four concurrent ones are plenty on 2 vCPUs.
/// See docs/measurements.md#host_clone_sets
pub const HOST_CLONE_SETS: u32 = 4;

/// Largest `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS` (the public runtime's hard limit).
/// See docs/measurements.md#max_inflight_requests
pub const MAX_INFLIGHT_REQUESTS: u32 = 63;

//===--- runtime harvest (the sync caller's wait) ----------------------------------------===//

/// How often a harvest that found nothing new sweeps executions past their deadline:
/// deadlines are seconds, a millisecond of lateness is invisible.
/// See docs/measurements.md#harvest_deadline_sweep
pub const HARVEST_DEADLINE_SWEEP: Duration = Duration::from_millis(1);

/// One idle harvest poll in this many takes the harvest token and reads the clock for the
/// deadline sweep; both cost more than the idle poll itself.
/// See docs/measurements.md#harvest_deadline_every_idle_steps
pub const HARVEST_DEADLINE_EVERY_IDLE_STEPS: u32 = 64;

/// Polls a harvesting thread spins before it starts yielding (~1–3 µs, in which a near-null
/// execution completes), so the fast path makes no syscall.
/// See docs/measurements.md#harvest_pure_spin_polls
pub const HARVEST_PURE_SPIN_POLLS: u32 = 256;

/// After the pure spin, a waiter yields once every this many polls ([`crate::wake::Waiter`]),
/// handing the CPU to a device thread that shares its vCPU instead of spinning out a slice.
/// See docs/measurements.md#harvest_yield_every_polls
pub const HARVEST_YIELD_EVERY_POLLS: u32 = 64;

/// After its pure spin, a spinning host thread lends itself to the device
/// ([`crate::Device::assist`]) once every this many idle polls, right before each yield.
/// See docs/measurements.md#host_assist_every_idle_polls
pub const HOST_ASSIST_EVERY_IDLE_POLLS: u32 = 64;

/// At this many idle polls a waiter checks once whether the device took its doorbell, and if not
/// runs the work itself ([`crate::Device::assist_untaken`]).
/// See docs/measurements.md#host_early_assist_polls
pub const HOST_EARLY_ASSIST_POLLS: u32 = 6;

/// A client polling `nrta_is_completed` lends its thread to the device once every this many
/// idle harvest polls of the vcore: the assist must come before the client's own yields.
/// See docs/measurements.md#poller_assist_every_idle_polls
pub const POLLER_ASSIST_EVERY_IDLE_POLLS: u32 = 32;

/// The longest a waiter spins before it blocks on the completion wake
/// ([`crate::wake::SpinBudget`]), and the longest expected execution it spins for at all.
/// See docs/measurements.md#wait_spin_cap
pub const WAIT_SPIN_CAP: Duration = Duration::from_micros(50);

/// With a vCPU to spare, a waiter for an execution past [`WAIT_SPIN_CAP`] but too short to
/// pre-wake for spins up to this instead of blocking (blocked, it learned 40 µs late).
/// See docs/measurements.md#wait_spin_cap_spare_cpu
pub const WAIT_SPIN_CAP_SPARE_CPU: Duration = Duration::from_micros(150);

/// How long a waiter spins after its pre-wake ([`WAIT_PREWAKE_MARGIN`]) before blocking again:
/// later than that, the completion is late by more than the expectation's jitter.
/// See docs/measurements.md#wait_prewake_spin
pub const WAIT_PREWAKE_SPIN: Duration = Duration::from_micros(25);

/// Added to twice the expected execution time to make a waiter's spin limit: the jitter of a
/// near-null execution, so one late completion does not cost a block and a wake.
/// See docs/measurements.md#wait_spin_slack
pub const WAIT_SPIN_SLACK: Duration = Duration::from_micros(2);

/// Weight (`1 / 2^shift`) of a new sample in the spin budget's moving average: follows a changed
/// model within ~16 executions, one outlier moves it by an eighth only.
/// See docs/measurements.md#wait_ewma_shift
pub const WAIT_EWMA_SHIFT: u32 = 3;

/// A sample enters the spin budget's average at most this many times the average, so one
/// descheduled execution does not switch a near-null model's waiter to blocking.
/// See docs/measurements.md#wait_ewma_outlier_factor
pub const WAIT_EWMA_OUTLIER_FACTOR: u64 = 4;

/// A waiter for an execution too long to spin for asks its timer to wake it this much (plus the
/// timer's learned lateness) before the expected completion, then spins the rest.
/// See docs/measurements.md#wait_prewake_margin
pub const WAIT_PREWAKE_MARGIN: Duration = Duration::from_micros(10);

/// The timer lateness assumed before a model has measured any ([`WAIT_PREWAKE_MARGIN`]); low
/// enough that a 50–110 µs model arms a pre-wake and learns its own.
/// See docs/measurements.md#wait_prewake_initial_lateness
pub const WAIT_PREWAKE_INITIAL_LATENESS: Duration = Duration::from_micros(30);

/// A pre-wake is armed only when the block before it would last at least this long; below, the
/// execution is waited for by blocking alone (a short timed sleep is mostly lateness).
/// See docs/measurements.md#wait_prewake_min_sleep
pub const WAIT_PREWAKE_MIN_SLEEP: Duration = Duration::from_micros(20);

/// Timer slack (`PR_SET_TIMERSLACK`) a thread gets the first time it arms a pre-wake: the
/// kernel's default 50 µs would make every pre-wake that much later.
/// See docs/measurements.md#wait_prewake_timer_slack_ns
pub const WAIT_PREWAKE_TIMER_SLACK_NS: u64 = 1_000;

/// Longest block of a waiter on the completion wake before it looks again by itself: only for
/// what nobody signals (the deadline sweep of a hung execution, a device without a wake).
/// See docs/measurements.md#wait_block_recheck
pub const WAIT_BLOCK_RECHECK: Duration = Duration::from_millis(10);

/// The first park of an XU worker that stays out of the way of a client harvesting by itself
/// (doubling up to [`XU_DEFER_MAX`]): its "has the client stopped polling?" look.
/// See docs/measurements.md#harvest_sleep
pub const HARVEST_SLEEP: Duration = Duration::from_micros(50);

/// How long the XU worker keeps looking for new async work after the last execution it
/// harvested before it parks: a pipelining client's in-flight count touches 0 between submits.
/// See docs/measurements.md#xu_park_grace
pub const XU_PARK_GRACE: Duration = Duration::from_micros(50);

/// Longest park of an XU worker deferring to a client that polls by itself: how late the
/// worker takes over once the client stops polling without saying so.
/// See docs/measurements.md#xu_defer_max
pub const XU_DEFER_MAX: Duration = Duration::from_millis(2);

/// [`XU_DEFER_MAX`] while an eventfd for every completion of the compute XU is registered:
/// its client may block on it unannounced, so the worker looks as often as before.
/// See docs/measurements.md#xu_defer_max_xu_eventfd
pub const XU_DEFER_MAX_XU_EVENTFD: Duration = Duration::from_micros(500);

/// Default `NEURON_RT_EXEC_TIMEOUT` (the public configuration guide's table says 30 s).
/// See docs/measurements.md#default_exec_timeout
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// Smallest accepted `NEURON_RT_EXEC_TIMEOUT` (fractional seconds are an extension): 5 × the
/// device watchdog, so a hang always decodes as a timeout (cause bit 29).
/// See docs/measurements.md#min_exec_timeout
pub const MIN_EXEC_TIMEOUT: Duration = Duration::from_millis(100);

/// Host tensors of at least this many bytes are checked against what the process can still
/// get before allocation, not killed later (overcommit); below, the check costs more than it saves.
/// See docs/measurements.md#host_alloc_backing_check_bytes
pub const HOST_ALLOC_BACKING_CHECK_BYTES: u64 = 64 << 20;

//===--- async surfaces ------------------------------------------------------------------===//

/// How long an XU worker keeps polling after its last completion before it parks: a client
/// that keeps its queue fed never waits for the worker to wake.
/// See docs/measurements.md#xu_spin_after_work
pub const XU_SPIN_AFTER_WORK: Duration = Duration::from_micros(200);

/// Work items per explicit-async XU; equal to the exec ring, so schedule returns
/// `NRT_QUEUE_FULL` beyond it instead of queuing unboundedly.
/// See docs/measurements.md#xu_queue_depth
pub const XU_QUEUE_DEPTH: u32 = EXEC_RING_SLOTS;

//===--- tracing -------------------------------------------------------------------------===//

/// Spans kept by the per-runtime trace ring (oldest overwritten): 64 Ki × 32 bytes = 2 MiB,
/// allocated when tracing is enabled, never on the hot path.
/// See docs/measurements.md#trace_ring_capacity
pub const TRACE_RING_CAPACITY: usize = 1 << 16;

//===--- kernels (the software NeuronCore's math) ----------------------------------------===//

/// Largest M for which `MatMul` runs the hand-written GEMV kernels instead of the GEMM crate,
/// whose packing costs as much as the product for a few rows.
/// See docs/measurements.md#gemv_max_rows
pub const GEMV_MAX_ROWS: usize = 4;

/// K block of the packed-B GEMM: a 14-row block of A (28 KiB) stays in L1 while every panel of
/// B streams past it from L2.
/// See docs/measurements.md#gemm_packed_kc
pub const GEMM_PACKED_KC: usize = 512;

/// Bytes of packed B the packed-B GEMM keeps in L2 while every row block of A passes over
/// them: half of a 1 MiB L2, the rest for A, C and the next block's lines.
/// See docs/measurements.md#gemm_packed_b_block_bytes
pub const GEMM_PACKED_B_BLOCK_BYTES: usize = 512 * 1024;

/// Rows of a packed-B panel ahead of the current one that the AVX-512 f32 tile prefetches into
/// L1 (`prefetcht0`).
/// See docs/measurements.md#gemm_packed_prefetch_rows
pub const GEMM_PACKED_PREFETCH_ROWS: usize = 16;

/// Panel width (columns) of the constant weights the compiler packs for the packed-B GEMM
/// (`nrt_isa::matmul_flags::PACKED_B`): one AVX-512 tile width (2 × 16 floats).
/// See docs/measurements.md#gemm_pack_nr
pub const GEMM_PACK_NR: usize = 32;

/// The compiler packs a constant f32 MatMul/Gemm weight only for K at least this (bf16:
/// [`GEMM_PACK_BF16_MIN_N`]): the packed kernel's fixed cost per tile needs K to amortize it.
/// See docs/measurements.md#gemm_pack_min_k
pub const GEMM_PACK_MIN_K: usize = 128;

/// bf16 weights are packed whatever K, for products at least this wide (N); narrower ones use
/// the dot-product kernel, where a 32-column panel would be mostly padding.
/// See docs/measurements.md#gemm_pack_bf16_min_n
pub const GEMM_PACK_BF16_MIN_N: usize = 32;

/// A `MatMul` with a fused epilogue runs its product in row blocks of C of about this many
/// bytes and applies the epilogue to each while it is still in L2.
/// See docs/measurements.md#epilogue_tile_bytes
pub const EPILOGUE_TILE_BYTES: usize = 512 * 1024;

/// The bf16/f16-weight MatMul walks B in column panels of about this many bytes, each passed
/// by every 4-row block of A while it stays in L2.
/// See docs/measurements.md#half_gemm_panel_bytes
pub const HALF_GEMM_PANEL_BYTES: usize = 128 * 1024;

/// Fewest rows of C in one epilogue block, whatever N is: fewer rows would repack (GEMM) or
/// re-stream (GEMV) B for too little work.
/// See docs/measurements.md#epilogue_min_rows
pub const EPILOGUE_MIN_ROWS: usize = 64;

/// Bytes of B from which the 1- and 2-row GEMV kernels read B row by row, in memory order,
/// instead of in column strips: strips prefetch worse once B comes from L3.
/// See docs/measurements.md#gemv_stream_min_bytes
pub const GEMV_STREAM_MIN_BYTES: usize = 256 << 10;

/// Bulk copies in the kernels between these sizes (bytes) use an AVX load/store loop instead of
/// libc `memcpy`, whose `rep movsb` path is slow there on the project's machine.
/// See docs/measurements.md#kernel_copy_loop_bytes
pub const KERNEL_COPY_LOOP_BYTES: (usize, usize) = (2048, 1 << 20);

/// Tile edge (elements) of the blocked transpose in `Copy`/`DmaCopy`: with power-of-two row
/// pitches larger tiles thrash L1's sets; 4-byte elements use 8×8 AVX register transposes.
/// See docs/measurements.md#kernel_transpose_tile
pub const KERNEL_TRANSPOSE_TILE: usize = 8;

/// Superblocks (one block of each of 8 interleaved rows of a block-quantized matrix) ahead
/// of the one in use that the AVX2 product asks the cache for: a decode step streams every
/// weight once, and the hardware prefetcher alone leaves the loads waiting.
/// See docs/measurements.md#blockq_prefetch_superblocks
pub const BLOCKQ_PREFETCH_SUPERBLOCKS: usize = 12;

/// Allocated bytes after every kernel scratch slice (`nrt_kernels::Workspace`), so a masked
/// vector load at a slice's end never crosses into an unmapped page (a microcode assist).
/// See docs/measurements.md#kernel_scratch_slack_bytes
pub const KERNEL_SCRATCH_SLACK_BYTES: usize = 64;

/// Most bytes one thread's kernel scratch may hold (4 GiB): past it the instruction fails
/// (`NRT_EXEC_BAD_INPUT`) instead of a stride-0 view growing the process until the OOM killer.
/// See docs/measurements.md#kernel_scratch_max_bytes
pub const KERNEL_SCRATCH_MAX_BYTES: usize = 4 << 30;

/// The widest pooling window (columns) the AVX-512 pool takes (its taps' column ranges live in
/// a stack array this long); wider windows take the portable loop.
/// See docs/measurements.md#kernel_pool_vector_max_kw
pub const KERNEL_POOL_VECTOR_MAX_KW: usize = 64;

/// Bytes of im2col patch matrix that `Conv` unrolls before each GEMM: small enough to stay in
/// the 1 MiB L2 between being written and being packed.
/// See docs/measurements.md#kernel_im2col_band_bytes
pub const KERNEL_IM2COL_BAND_BYTES: usize = 512 << 10;

/// Bytes of patch panels `Conv`'s panel path unrolls before each packed-GEMM call: enough to
/// amortize the call over a small K, few enough to stay in L1 (at least one panel).
/// See docs/measurements.md#kernel_conv_panel_bytes
pub const KERNEL_CONV_PANEL_BYTES: usize = 16 << 10;

/// Elements per chunk of the kernels' strided elementwise paths: a chunk of every operand stays
/// in L1, and the per-chunk overhead is amortized over hundreds of elements.
/// See docs/measurements.md#kernel_chunk_elems
pub const KERNEL_CHUNK_ELEMS: usize = 512;

//===--- compiler -------------------------------------------------------------------------===//

/// The host evaluator (constant folding) is admitted for a node only if the host could hold this
/// many times its outputs' host bytes; otherwise the fold stays on the device.
/// See docs/measurements.md#fold_working_set_factor
pub const FOLD_WORKING_SET_FACTOR: usize = 4;

/// Most rows per operand the compiler's hazard analysis enumerates to tell two overlapping
/// accesses apart; beyond, one level of rows (which may order two disjoint accesses).
/// See docs/measurements.md#hazard_row_list_max
pub const HAZARD_ROW_LIST_MAX: usize = 4096;

/// A row operation on a two-core model is split between the cores when it has at least this
/// many elements; below, the cross-core wait costs more than the half it saves.
/// See docs/measurements.md#split_row_op_min_elements
pub const SPLIT_ROW_OP_MIN_ELEMENTS: usize = 16 << 10;
