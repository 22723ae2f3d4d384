//! Every tunable of the project, each with the reason for its value.
//!
//! The figures come from `reference/machine-limits.md` (2 vCPUs, AMD Zen 4 under KVM): a
//! spinning cross-thread round trip is 0.1–0.4 µs, a park/unpark or eventfd wake 20–60 µs
//! (p99 up to 1.7 ms), `usleep(1)` sleeps 70–78 µs. One spinning thread is half the machine,
//! so every spin here is bounded and every idle thread ends up parked.

use core::time::Duration;

//===--- device (software NeuronCore) ---------------------------------------------------===//

/// A polling loop bounded by time (a device thread's idle and stalled polls, a serving
/// caller's `serve_queued`) reads the clock once every this many polls, not on each: a
/// clock read (~20–30 ns through the vDSO) beside a 12–50 ns poll would be most of the
/// loop. 64 polls are 1–4 µs, within every period those loops measure
/// ([`DEVICE_IDLE_YIELD_PERIOD`] 3 µs, [`DEVICE_STALL_SPIN`] 50 µs, [`SYNC_SERVES_CORE_MAX`]
/// 150 µs).
pub const CLOCK_READ_EVERY_POLLS: u32 = 64;

/// While idle-polling, a device thread calls `sched_yield` at most this often (it checks the
/// clock every [`CLOCK_READ_EVERY_POLLS`] polls): if the submitting or harvesting thread shares
/// its vCPU it runs at once instead of waiting a time slice; alone, the yield costs ~0.3 µs. A
/// time, not a poll count: an idle poll costs 12–20 ns on one machine (256 polls, the earlier
/// count, were 3–5 µs) and ~50 ns on another (AMD EPYC under KVM: 13–15 µs, and the
/// implicit-async worker that shared the device thread's vCPU waited that long for each turn).
pub const DEVICE_IDLE_YIELD_PERIOD: Duration = Duration::from_micros(3);

/// How often a parked device thread looks at a core that a host thread serves
/// (`Device::host_serves`: the implicit-async worker runs a short model's work itself on a
/// host with fewer CPUs than runnable threads): when the core has work that nobody took since
/// the last look, the host thread is inside a long callback, preempted or gone, and the
/// device thread runs the work. Bounds that stall to about twice this; the look costs a
/// timed wake-up per period while the core is served.
pub const DEVICE_HOST_SERVED_CHECK: Duration = Duration::from_millis(1);

/// The XU worker runs its vcore's device work itself (`Device::host_serves`) on hosts with
/// at most this many CPUs, while a short model's implicit executions are in flight: client,
/// worker and device thread were three runnable threads on two vCPUs, and each hand-off
/// between the two that shared one cost a context switch (a `sched_yield` hand-off between
/// two threads of one process: ~1.2 µs on this project's KVM guest). Implicit near-null,
/// paired runs against the worker that only harvests (`ab.sh`, 0.5 s rows): depth 8 1.73×
/// the throughput (10 pairs, 9 higher; p99 0.83×), depth 4 2.29×, depth 1 3.45×. With a
/// third CPU the device thread has one to itself, and the hand-offs it saves cost nothing.
pub const XU_SERVES_CORE_MAX_CPUS: usize = 2;

/// Polls of its core the serving XU worker runs before it harvests (each runs at most one
/// execution, each expected under [`WAIT_SPIN_CAP`]): the batch amortizes its harvest and
/// retire steps, the bound keeps the first callback from waiting behind a long queue.
/// Implicit depth 8, paired runs against 1 (`ab.sh`, 8 × 0.5 s, a slow phase): 1.13× the
/// throughput (7 of 8 higher), p99 1.16× (within its spread: 4 of 8 lower). (The first
/// version — one poll per harvest and a `sched_yield` after each retirement, so one per
/// execution — ran at 0.74× the worker that does not serve.)
pub const XU_SERVE_BATCH: u32 = 8;

/// A synchronous caller runs its execution's device work on its own thread when the model
/// is expected to finish within this ([`crate::Device::host_serves`]):
/// [`WAIT_SPIN_CAP_SPARE_CPU`], the longest execution its caller would spin through anyway.
/// For a short execution the two hand-offs between CPUs (doorbell, completion) are most of
/// its latency (near-null sync: 0.50× the latency, 12/12 pairs), and for one up to the spin
/// cap the caller holds its vCPU for the whole execution either way: run on the caller, it
/// costs one vCPU instead of two, and the caller does not learn of the completion late. Was
/// 50 µs; at 150 (`ab.sh` against 50, paired `nrt bench` medians): quiet, `mlp` (47–52 µs,
/// four GEMVs) 0.964× and 0.996× in two runs, `int8_gemm` (90 µs) 0.972× and 0.983×; beside
/// one busy co-tenant (`cotenant.sh`), where the device thread competes for a vCPU, `mlp`
/// 0.475× and `int8_gemm` 0.650× (8/8 pairs each). Longer ones stay on the device thread
/// while their caller blocks (a pre-wake and a short spin: `encoder`'s caller uses ~2% of a
/// vCPU), as on the hardware, where the caller's vCPU is free for the application's other
/// threads. (`NRT_SIM_SYNC_ON_CALLER` changes the policy: `RuntimeConfig::sync_on_caller`.)
pub const SYNC_SERVES_CORE_MAX: Duration = WAIT_SPIN_CAP_SPARE_CPU;

/// Polls without progress after which a synchronous caller that serves its core hands it
/// back to the device thread and waits as usual. A poll is an assist that found nothing (or
/// a core another thread holds) and an idle harvest step, ~120 instructions: 256 of them are
/// ~10 µs, far beyond any gap inside a near-null execution and long enough to ride out a
/// device thread finishing a poll it began before the caller served the core. (A hang or an
/// execution much longer than expected then waits as usual, blocking after its spin.)
pub const SYNC_SERVE_IDLE_POLLS: u32 = 256;

/// How long a device thread keeps polling for doorbells after its last work before it parks.
/// Back-to-back executions (a caller looping on `execute`) arrive well within it and never
/// pay the 20–60 µs wake; an idle device stops burning its vCPU 200 µs after the last
/// execution, so an idle process sits at ~0% CPU.
pub const DEVICE_SPIN_AFTER_WORK: Duration = Duration::from_micros(200);

/// How long an execution may sit with no engine able to make progress on a device core
/// before the core's watchdog declares a hang (sets cause bit 29), abandons the execution and
/// moves on. This bound covers waits on the other core of a lockstep pair. It is wall-clock
/// time, so it runs only once every core of the pair took the execution (before that the wait
/// is on the host: it rings the cores one after the other, and may be preempted in between)
/// and while no other core of the pair is running it (a partner computing on its own device
/// thread, or preempted there, is busy, not hung). It must stay
/// well below the smallest `NEURON_RT_EXEC_TIMEOUT` the runtime accepts
/// ([`MIN_EXEC_TIMEOUT`]) so the runtime's sweep timeout finds the bit set.
pub const DEVICE_HANG_WATCHDOG: Duration = Duration::from_millis(20);

/// How long the software device's interrupt-cause read watches a core that has work before it
/// reports it busy past the deadline (cause bit 29, `NRT_TIMEOUT`): the core's lock is taken
/// by whichever thread runs it, for as long as one poll — one instruction — lasts, and a
/// kernel still running at the runtime's deadline holds it throughout, while a device thread
/// between instructions releases it within microseconds. Read only at a deadline, so the
/// window costs nothing on the hot path; 1 ms is far above one poll of a short execution and
/// far below any timeout (a long kernel: `NRT_TIMEOUT`, not dropped notifications).
pub const DEVICE_BUSY_PROBE: Duration = Duration::from_millis(1);

/// Control instructions (no-ops, semaphore sets, notifications) a core's scheduler runs on
/// one engine before it looks at the other engines again. An instruction that does real work
/// (a kernel or a DMA) always ends the engine's turn, and a semaphore wait switches engines
/// regardless; this bound only keeps a long run of control instructions from monopolizing
/// the device thread.
pub const DEVICE_ENGINE_QUANTUM: u32 = 64;

/// How long a device thread whose execution is stalled at a lockstep barrier (waiting for
/// the partner core, which another device thread runs) keeps polling before it blocks until
/// the partner's next cross-core event (a global semaphore change, a take, an abort). With
/// both device threads on their own vCPU the partner arrives within microseconds of balanced
/// work; with more runnable threads than vCPUs (a co-tenant) the partner may not be running,
/// and a spin past this would hold the very vCPU it needs. Polls yield at most every
/// [`DEVICE_IDLE_YIELD_PERIOD`] meanwhile.
pub const DEVICE_STALL_SPIN: Duration = Duration::from_micros(50);

/// Longest block of a stalled device thread before it looks again by itself. Cross-core
/// events wake it; the bound is for the hang watchdog, which needs a look now and then (the
/// block is also capped at a quarter of the configured watchdog).
pub const DEVICE_STALL_BLOCK_MAX: Duration = Duration::from_millis(5);

/// A core of a lockstep group whose part of an execution runs for less than this on average
/// (its own running time: stalls at the barriers, which a descheduled partner can stretch
/// to milliseconds under a co-tenant, do not count) is served *jointly*: the group leader's device thread runs it too (the doorbell wakes
/// the leader's thread, not the core's own), so a short two-core execution needs no
/// hand-off between threads at each barrier. Longer parts run on the core's own thread, in
/// parallel. On this project's 2-vCPU machine (`nrt bench`, one run each): the near-null
/// lockstep model took 2.5 µs on one thread and 19 µs on a thread per core (the caller and
/// two device threads share two vCPUs, and every barrier became a hand-off), while
/// `mlp_b64 --cores 2` (~75 µs per layer per core) took 360–390 µs on a thread per core
/// and 650 µs on one. 50 µs sits between: a hand-off costs 10–20 µs here.
pub const DEVICE_JOINT_PART_MAX: Duration = Duration::from_micros(50);

/// Weight of a new sample in a core's running average of its lockstep part's duration
/// (`1 / 2^shift`): a few executions move it, one outlier does not flip the mode.
pub const DEVICE_JOINT_EWMA_SHIFT: u32 = 3;

/// Executions a probe of the other serving mode of a lockstep group runs (parallel: a
/// thread per core; joint: the leader's thread for all), its median compared with the
/// median of the current mode's last 16. Five: a descheduled thread stretches one or two of
/// them by milliseconds under a co-tenant, and the median does not move with them.
pub const SERVE_MODE_PROBE_PARTS: usize = 5;

/// First wait between probes of the other serving mode, doubled after each probe that
/// keeps the current one up to [`SERVE_MODE_PROBE_MAX`], and back here after a switch.
/// A probe of the slower mode costs its five executions' difference, a probe interval
/// is how long the group may stay in the worse mode after the host changed: a busy phase
/// of the host (another tenant of the machine) sends a quiet group joint for a while too,
/// and with 200 ms … 2 s here `mlp_b64 --cores 2` lost 14% of its executions per second on
/// the quiet host (paired); with 50 ms … 1 s, 2% (within noise), while beside a co-tenant
/// the parallel probes (5 executions per second at most) cost little.
pub const SERVE_MODE_PROBE_MIN: Duration = Duration::from_millis(50);
/// See [`SERVE_MODE_PROBE_MIN`].
pub const SERVE_MODE_PROBE_MAX: Duration = Duration::from_secs(1);

/// A parallel lockstep group tries the joint mode only when its executions' median cost
/// (wall time, or the interval between finishes when shorter) is at least this share (%) of
/// their parts' summed own running time: 50% is a
/// perfect split of two parts; a quiet 2-vCPU host ran `encoder` at 53% and `mlp_b64` at
/// 50%, beside a busy co-tenant `encoder` read 103% (its parts ran one after the other).
pub const SERVE_MODE_PROBE_RATIO_PERCENT: u32 = 80;

/// A probe of parallel serving switches to it when its median is at least this much (%)
/// below the joint mode's; a probe of the joint mode (tried only when parallel serving does
/// not pay) is taken unless this much above parallel's. Less is noise between two runs of
/// the same mode on a shared host.
pub const SERVE_MODE_SWITCH_GAIN_PERCENT: u64 = 10;

//===--- rings and queues ----------------------------------------------------------------===//

/// Records per notification ring. One execution writes 2 records per engine (START, END)
/// plus one per streamed output; at the 63-request in-flight cap that is < 1,024 per ring
/// even if the host stops reading for the whole queue.
pub const NQ_RING_CAPACITY: u32 = 1024;

/// Slots of each model's exec-request ring per core. One more than the public in-flight cap
/// (63), rounded to a power of two, so a full async queue never waits for a ring slot.
pub const EXEC_RING_SLOTS: u32 = 64;
const _: () = assert!(
    EXEC_RING_SLOTS.is_power_of_two(),
    "slot indices are taken modulo EXEC_RING_SLOTS on the hot path: a mask, not a division"
);

/// Trigger pairs in each core's DMA queue: 3 per staged request, for every ring slot of up to
/// 4 models staging at once — enough that staging never finds it full in practice; if it
/// does, staging waits (bounded) for the device to drain it.
pub const DMA_QUEUE_CAPACITY: u32 = 1024;

/// I/O descriptor sets per model that have host-clone buffers: each synchronous caller that
/// binds host tensors holds one for the length of its execution. Four concurrent
/// synchronous host-tensor callers per model is plenty on a 2-vCPU machine; a fifth waits for
/// a set. Device-tensor executions use any of the model's 64 sets and never wait here. The
/// buffers are device memory, committed only when touched.
pub const HOST_CLONE_SETS: u32 = 4;

/// Largest `NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS` (the public runtime's hard limit).
pub const MAX_INFLIGHT_REQUESTS: u32 = 63;

//===--- runtime harvest (the sync caller's wait) ----------------------------------------===//

/// How often a harvest that found nothing new sweeps executions past their deadline.
/// Deadlines are seconds; a millisecond of lateness is invisible. (The clock it reads is the
/// coarse one, so in practice the sweep runs once per timer tick, 1–4 ms.)
pub const HARVEST_DEADLINE_SWEEP: Duration = Duration::from_millis(1);

/// A harvest poll that finds nothing published returns after a few loads, without taking
/// the harvest token; one in this many takes it anyway and looks at the (coarse) clock for
/// the deadline sweep. The token's lock round trip and the clock read cost more than the
/// idle poll itself, and deadlines are seconds.
pub const HARVEST_DEADLINE_EVERY_IDLE_STEPS: u32 = 64;

/// Polls a harvesting thread spins before it starts yielding: ~1–3 µs, in which a near-null
/// execution completes, so the fast path makes no syscall.
pub const HARVEST_PURE_SPIN_POLLS: u32 = 256;

/// After the pure spin, a waiting thread calls `sched_yield` once every this many polls while
/// it spins within its budget ([`crate::wake::Waiter`]). When the device thread shares the
/// caller's vCPU (another process took the other one) this hands it the CPU at once; a pure
/// spin would hold it for a whole time slice (ms). Alone on its vCPU a yield returns in
/// ~0.3 µs.
pub const HARVEST_YIELD_EVERY_POLLS: u32 = 64;

/// A host thread spinning for a completion lends itself to the device ([`crate::Device::assist`])
/// once its pure spin ([`HARVEST_PURE_SPIN_POLLS`]) is over, and then once every this many
/// polls that found nothing — right before each `sched_yield` ([`HARVEST_YIELD_EVERY_POLLS`]).
/// A near-null execution completes within the pure spin on a quiet machine, so this does not
/// fire there; when a co-tenant holds the device thread's vCPU for a time slice (ms), the
/// waiting caller runs the execution itself instead of yielding — a yield hands its own vCPU
/// to the co-tenant for a slice. (Assisting only every 512 polls, after four such yields,
/// one busy co-tenant cut sync throughput to 0.07× quiet.)
pub const HOST_ASSIST_EVERY_IDLE_POLLS: u32 = 64;

/// Before its pure spin is over, a waiting host thread checks once, at this many idle polls
/// (~0.3 µs), whether the device has even taken its doorbell, and if not runs the work itself
/// ([`crate::Device::assist_untaken`]). A running device thread takes a doorbell within
/// 0.1–0.2 µs (the cross-core pingpong), so on a quiet machine the check finds it taken and
/// does nothing; beside a co-tenant that holds the device thread's vCPU, the waiter no longer
/// spins the whole pure spin (~7 µs at 256 polls) before the first assist. At 48 polls
/// (~2 µs on an AMD EPYC under KVM, where a poll costs ~40 ns) near-null sync beside one
/// busy co-tenant ran 0.61× the throughput of 16 polls, and 16 polls 0.71× of 6 (`ab.sh`,
/// 10 pairs each, all lower); quiet sync within noise (0.975, 1.025).
pub const HOST_EARLY_ASSIST_POLLS: u32 = 6;

/// A client polling `nrta_is_completed` lends its thread to the device once every this many
/// idle harvest polls of the vcore (anyone's: the count is the vcore's; only while executions
/// are expected within [`WAIT_SPIN_CAP`]). A polling client typically yields its vCPU every
/// few dozen polls of its own (`nrt bench` every 64), handing it to a co-tenant for a time
/// slice: the assist must come first. At 512, explicit depth 8 beside one busy process ran
/// 0.28 M exec/s; at 32, 0.84–0.96 M/s (`scripts/ab_binaries.sh … cotenant`), quiet within
/// noise. On a quiet machine the device thread holds the core while it runs, so an assist
/// is one failed `try_lock`.
pub const POLLER_ASSIST_EVERY_IDLE_POLLS: u32 = 32;

/// The longest a waiter spins before it blocks on the completion wake
/// ([`crate::wake::SpinBudget`]), and the longest expected execution for which it spins at
/// all. A futex block costs the device ~1–2 µs to wake it and the waiter 20–60 µs of wake
/// latency, so spinning pays for executions that finish well within that; a near-null
/// execution (0.5–1 µs) and small models (tens of µs) stay on the spinning path. Past this an
/// execution is waited for by blocking at once — a 600 µs model's caller spinning from the
/// start would hold a vCPU the device threads need — except for the end of a synchronous
/// wait, which the pre-wake spins ([`WAIT_PREWAKE_MARGIN`]), and, with a vCPU to spare, an
/// execution too short to pre-wake for ([`WAIT_SPIN_CAP_SPARE_CPU`]).
pub const WAIT_SPIN_CAP: Duration = Duration::from_micros(50);

/// With a vCPU to spare beside the vcore's device threads, a waiter for an execution past
/// [`WAIT_SPIN_CAP`] but too short for a pre-wake (its sleep would be under
/// [`WAIT_PREWAKE_MIN_SLEEP`] once the timer's lateness and the margin are left) spins for
/// it, up to this, instead of blocking: blocked, it learned of the completion 40 µs late (the
/// `int8_gemm` sample: 72 µs of device time, 110–118 µs a call; spinning, 69 µs).
pub const WAIT_SPIN_CAP_SPARE_CPU: Duration = Duration::from_micros(150);

/// How long a waiter spins after its pre-wake ([`WAIT_PREWAKE_MARGIN`]) before it blocks
/// again: the completion is expected a margin after the timer, and one that has not come
/// this long after it is late by more than the expectation's jitter — the rest is waited for
/// on the completion wake. Was [`WAIT_SPIN_CAP`] (50 µs): the `encoder` peer model's caller
/// CPU per execution 0.90× and 0.93× with 25 µs (`ab.sh`, 10 and 12 pairs, 7 of each lower),
/// its latency 0.985× (within noise); `mlp` (a spinning waiter, no pre-wake) unchanged.
pub const WAIT_PREWAKE_SPIN: Duration = Duration::from_micros(25);

/// Added to twice the expected execution time to make a waiter's spin limit: the jitter of a
/// near-null execution (a cross-core round trip is 0.1–0.4 µs, a missed poll of the device
/// thread about as much), so one late completion does not cost a block and a wake.
pub const WAIT_SPIN_SLACK: Duration = Duration::from_micros(2);

/// Weight of a new sample in the spin budget's moving average: `1 / 2^WAIT_EWMA_SHIFT`. An
/// eighth follows a model whose time changes (another model loaded on the core, a co-tenant)
/// within ~16 executions, and one outlier (a preemption) moves it by an eighth only.
pub const WAIT_EWMA_SHIFT: u32 = 3;

/// A sample enters the spin budget's average at most this many times the average (once
/// there is one). Beside a co-tenant a near-null execution now and then waits out a time
/// slice (ms): one such sample moved a 0.5 µs average to ~50 µs, past `WAIT_SPIN_CAP`, and
/// the caller switched to blocking — the worst policy when the device thread is merely
/// descheduled. Clamped, an outlier moves it by under half; a model that really got slower
/// still gets there (×1.375 per sample: 0.5 µs → 600 µs in ~22 samples).
pub const WAIT_EWMA_OUTLIER_FACTOR: u64 = 4;

/// A waiter for an execution too long to spin for ([`WAIT_SPIN_CAP`]) blocks, but asks its
/// timer to wake it this much plus the timer's learned lateness before the expected
/// completion, then spins the rest: a device-signaled wake-up comes 20–60 µs after the
/// completion on a VM (the `mlp` peer model: 28 µs from the device's last record to the
/// caller's return, ~15% of its 190 µs), a timer wake-up taken early costs nothing but the
/// spin. The margin covers the expectation's jitter.
pub const WAIT_PREWAKE_MARGIN: Duration = Duration::from_micros(10);

/// The timer lateness assumed before a model measured any ([`WAIT_PREWAKE_MARGIN`]): a futex
/// timeout with the default 50 µs timer slack came back 72–80 µs late on the 2-vCPU VM, with
/// a 1 ns slack 24–27 µs — and a pre-wake lowers the thread's slack to
/// [`WAIT_PREWAKE_TIMER_SLACK_NS`] before its first sleep, so the second figure applies.
/// Learned per model from each pre-wake (moving average, [`WAIT_EWMA_SHIFT`]) — but only
/// once one is armed: assumed at 80 µs, a model of 50–110 µs never had a sleep long enough
/// ([`WAIT_PREWAKE_MIN_SLEEP`]), so it never learned better and blocked until the device
/// woke it, 40 µs after its completion (the `int8_gemm` sample: 72 µs of device time, 115 µs
/// a call).
pub const WAIT_PREWAKE_INITIAL_LATENESS: Duration = Duration::from_micros(30);

/// A pre-wake is only armed when the block before it would last at least this long; below,
/// the execution is waited for by blocking alone (a short timed sleep is mostly lateness).
pub const WAIT_PREWAKE_MIN_SLEEP: Duration = Duration::from_micros(20);

/// Timer slack (`PR_SET_TIMERSLACK`) a thread gets the first time it arms a pre-wake: the
/// kernel's default 50 µs would make every pre-wake that much later (and the lead, hence the
/// spin, that much longer). Per thread; set once, left as it is.
pub const WAIT_PREWAKE_TIMER_SLACK_NS: u64 = 1_000;

/// Longest block of a waiter on the completion wake before it looks again by itself. The
/// device signals every completion, so this bound is only for what nobody signals: the
/// deadline sweep of a hung execution (deadlines are ≥ 100 ms) and a device without a wake.
pub const WAIT_BLOCK_RECHECK: Duration = Duration::from_millis(10);

/// The first park of an XU worker that stays out of the way of a client harvesting by itself
/// (its parks double from this up to [`XU_DEFER_MAX`] while the client keeps polling). No
/// waiting caller sleeps any more (they block on the completion wake); this is only the
/// worker's "has the client stopped polling?" look, the one wait that is not an event.
pub const HARVEST_SLEEP: Duration = Duration::from_micros(50);

/// How long the XU worker keeps looking (spinning, yielding every
/// [`HARVEST_YIELD_EVERY_POLLS`]) for new async work after the last async execution it
/// harvested left, before it parks on the XU gate. A pipelining implicit-async client lets
/// the in-flight count touch 0 between its submissions; parking at once cost a futex wait on
/// the worker and a wake in the client's `nrt_execute` every ~17 executions at depth 8
/// (77,860 futex calls in a 1.3 s run; 69 with the grace). Implicit depth 8, paired runs:
/// 1.44–1.47× the throughput with 50 µs; 20 µs gave 0.885× of 50, 200 µs 1.10× (3 of 8
/// pairs lower: noise). Not after a client's own harvests (explicit polling), where a
/// lingering worker took the CPU the client needed.
pub const XU_PARK_GRACE: Duration = Duration::from_micros(50);

/// Longest park of an XU worker that stays out of the way of a client harvesting by itself
/// (its parks double from [`HARVEST_SLEEP`] up to this while the client keeps polling; a
/// close or a submission ends one early).
/// With the worker spinning next to a polling client and the device thread, three runnable
/// threads shared two vCPUs and explicit async at depth 8 ran slower than sync; the cap is
/// how late the worker takes over completions once the client stops polling without saying
/// so (a client that arms a completion eventfd says so: the worker takes over at once).
/// Each look is a timer wake-up that takes the vCPU from the device thread or the client
/// (~1,800 a second at 500 µs, each a context switch there and back). 2 ms against 500 µs
/// (`scripts/ab_binaries.sh … explicit,cotenant`, `ab.sh`): explicit depth 8 1.033×,
/// 1.042×, 1.030× the throughput (12, 12, 16 pairs; 1, 0, 1 lower), beside a busy co-tenant
/// 1.163× (0 of 12 lower); implicit depth 8, which the worker harvests itself, 0.990× and
/// 0.955× — within that row's spread here (a rebuild that leaves its path alone read 0.874×).
/// 20 ms read explicit depth 8 1.04–1.16× but depth 1 0.56× and the co-tenant row 0.92×.
/// While the client keeps an XU completion eventfd registered it may block on it at any
/// moment without a call that says so: then [`XU_DEFER_MAX_XU_EVENTFD`].
pub const XU_DEFER_MAX: Duration = Duration::from_millis(2);

/// [`XU_DEFER_MAX`] while an eventfd for every completion of the vcore's compute XU is
/// registered (`nrta_event_register_xu_completion`): its client can stop polling and block on
/// it without a call the worker could take as a signal (arming the eventfd came earlier), so
/// the worker looks as often as before the longer cap.
pub const XU_DEFER_MAX_XU_EVENTFD: Duration = Duration::from_micros(500);

/// Default `NEURON_RT_EXEC_TIMEOUT` (the public configuration guide's table says 30 s).
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// Smallest accepted `NEURON_RT_EXEC_TIMEOUT` (we accept fractional seconds as an
/// extension, so tests of hangs do not wait 30 s): 5 × the device watchdog, so a hang is
/// always decoded as a timeout (cause bit 29) and never mistaken for dropped notifications.
pub const MIN_EXEC_TIMEOUT: Duration = Duration::from_millis(100);

/// Host tensors of at least this many bytes are checked against what the process can still
/// get (`crate::host_memory`: the host's `MemAvailable` and its memory cgroups' headroom)
/// before they are allocated. With overcommit, a huge zeroed allocation succeeds and the OOM
/// killer ends the process later; below this size the check (reads of `/proc/meminfo` and the
/// cgroup files, ~80 µs) would cost more than the allocation and the risk is nil.
pub const HOST_ALLOC_BACKING_CHECK_BYTES: u64 = 64 << 20;

//===--- async surfaces ------------------------------------------------------------------===//

/// How long an XU worker keeps polling after its last completion before it parks. A client
/// that keeps its queue fed (the public guidance is 2–3 requests per XU) never waits for the
/// worker to wake; an idle runtime parks 200 µs after its last completion.
pub const XU_SPIN_AFTER_WORK: Duration = Duration::from_micros(200);

/// Work items per explicit-async XU (executions scheduled and not yet reported). Equal to
/// the exec ring: schedule returns `NRT_QUEUE_FULL` beyond it instead of queuing unboundedly.
pub const XU_QUEUE_DEPTH: u32 = EXEC_RING_SLOTS;

//===--- tracing -------------------------------------------------------------------------===//

/// Spans kept by the per-runtime trace ring (oldest overwritten). 64 Ki spans × 32 bytes =
/// 2 MiB, allocated when tracing is enabled, never on the hot path.
pub const TRACE_RING_CAPACITY: usize = 1 << 16;

//===--- kernels (the software NeuronCore's math) ----------------------------------------===//

/// Largest number of rows of A (M) for which `MatMul` runs the hand-written GEMV kernels
/// (groups of up to 4 rows of A share one pass over B) instead of the GEMM crate, whose
/// packing costs as much as the product for a few rows. ×512×512 here, GEMV vs GEMM: M = 1
/// 17–20 vs 35 µs (B transposed: 17–20 vs 88), M = 2 25 vs 33, M = 4 41–44 vs 47 (B
/// transposed 31), M = 8 (two groups) 93 vs 76–82. Measured with
/// `cargo bench -p nrt-kernels -- matmul`.
pub const GEMV_MAX_ROWS: usize = 4;

/// K block of the packed-B GEMM (`nrt_kernels::gemm_packed`): a row block of A (14 rows ×
/// this many floats, 28 KiB) stays in L1 (48 KiB on Zen 5, 32 on Zen 4) while every panel of
/// B streams past it from L2. Measured on the project's machine at 64×512×512.
pub const GEMM_PACKED_KC: usize = 512;

/// Bytes of packed B (one K block × whole panels) the packed-B GEMM keeps in L2 while every
/// row block of A passes over them: half of Zen 5's 1 MiB L2 (Intel's is 2 MiB), the rest
/// for A, C and the next block's lines. 512³ with four weights taken in turn (B from L3, as
/// in a model): 94% of the f32 peak against 89% with B walked whole (paired, 8/8 higher);
/// 64×512×512 (B 1 MiB) 0.98× the time, 128×512×1024 0.96×.
pub const GEMM_PACKED_B_BLOCK_BYTES: usize = 512 * 1024;

/// Rows of a packed-B panel ahead of the current one that the AVX-512 f32 tile prefetches
/// into L1 (`prefetcht0`, one or two lines per step of K). `mlp_b64` (four 1 MiB layers
/// streaming from L3), paired runs against no prefetch: 16 rows 0.908 (8/8 pairs lower), 32
/// the same as 16 (1.003 against it), 8 rows 1.017 against 16; `prefetcht1` at 16 was 1.06×
/// the `prefetcht0` time.
pub const GEMM_PACKED_PREFETCH_ROWS: usize = 16;

/// Panel width (columns) of the constant weights the compiler packs for the packed-B GEMM
/// (`nrt_isa::matmul_flags::PACKED_B`): one AVX-512 tile width (2 × 16 floats). At 64×512×512
/// on this project's machine the kernel ran at 79% of the f32 peak with 16-column panels
/// (one vector per row: as many broadcasts as FMAs), 96% with 32 and 97% with 64; 32 keeps
/// the last panel's zero padding small and lets the two cores split N = 64 layers.
pub const GEMM_PACK_NR: usize = 32;

/// The compiler packs a constant f32 MatMul/Gemm weight (bf16: [`GEMM_PACK_BF16_MIN_N`]; any
/// number of rows: up to [`GEMV_MAX_ROWS`] the packed GEMV reads each panel as one
/// sequential stream, `mlp` 0.898× the time of the row-streaming GEMV over the weights as
/// stored) only for products with at least this many terms per output (K): the packed kernel
/// pays a fixed cost per 14×32 tile (zeroing, scaling and storing 28 accumulators) that
/// short K does not amortize. Isolated kernel on this project's machine (one busy run):
/// 128×64×128 77% of the f32 peak packed against 92% for the GEMM crate; 64×512×512 94%
/// against 89%, 128×256×256 96% against 94%.
pub const GEMM_PACK_MIN_K: usize = 128;

/// bf16 weights (`--auto-cast matmult`) are packed whatever K, for products at least this
/// wide (N): [`GEMM_PACK_MIN_K`] is the f32 rule. The other bf16 kernel, dot products over
/// the `[N, K]` weights as cast (`matmul_half`), ran 2–4× the packed kernel's time at every
/// short K on this project's machine (`cargo run --release -p nrt-kernels --example
/// half_bench`, N = 128: K 3–128 at M 1–128, packed/dot 0.22–0.71; 128×64×128 0.43), and
/// wins only on narrow products, where a 32-column panel is mostly padding (N 16–24:
/// packed/dot 1.10–1.86; N 32: 0.46, 40–48: 0.67–0.80).
pub const GEMM_PACK_BF16_MIN_N: usize = 32;

/// A `MatMul` with a fused epilogue (bias, residual, activation) runs its product in row
/// blocks of C of about this many bytes and applies the epilogue to each block right after
/// it, while the block is still in L2 (1 MiB per core on Zen 4, 2 MiB on Sapphire Rapids).
/// Each block is a separate call of the GEMM crate, which packs B again, so the blocks are
/// as large as L2 allows: `mlp_b64`'s 64×512 outputs (128 KiB) are one block.
pub const EPILOGUE_TILE_BYTES: usize = 512 * 1024;

/// The bf16/f16-weight MatMul (`--auto-cast`) walks B in column panels of about this many
/// bytes, each passed by every 4-row block of A while it stays in L2: a whole 512×512 bf16
/// B (512 KiB) re-read per row block does not stay there beside A's rows (512³ in bf16: 119
/// GFLOP/s without panels).
pub const HALF_GEMM_PANEL_BYTES: usize = 128 * 1024;

/// Fewest rows of C in one epilogue block, whatever N is: fewer rows would repack (GEMM) or
/// re-stream (GEMV) B for too little work.
pub const EPILOGUE_MIN_ROWS: usize = 64;

/// Bytes of B from which the 1- and 2-row GEMV kernels read B row by row, in memory order,
/// accumulating into the output rows in L1, instead of in column strips with the
/// accumulators in registers. Strips walk B down its columns in short runs, which the
/// prefetcher serves worse once B comes from L3: 512×512 (1 MiB, 4 such matrices cycled)
/// 21–24 µs in strips, 16.7–17.1 µs by rows; 768×768 58 vs 42; 256×1024 26 vs 17. Below
/// ~256 KiB (B in L2) strips are as fast or faster (512×64: 1.9 vs 2.1 µs). With AVX-512
/// the same rows stream 16 lanes wide, 4 rows a step (`mlp`: 0.90× the AVX2 kernel).
pub const GEMV_STREAM_MIN_BYTES: usize = 256 << 10;

/// Bulk copies in the kernels between these sizes (bytes) use an AVX load/store loop instead
/// of libc `memcpy`. On the project's machine (AMD EPYC under KVM) glibc's `memcpy` takes its
/// `rep movsb` path from 4 KiB to ~64 KiB and runs at 2–3 GB/s there, against 42–58 GB/s
/// for the loop; below 2 KiB and above ~128 KiB both run at the same speed, and past 1 MiB
/// glibc's non-temporal stores are the better choice.
pub const KERNEL_COPY_LOOP_BYTES: (usize, usize) = (2048, 1 << 20);

/// Tile edge (elements) of the blocked transpose in `Copy`/`DmaCopy` (an input whose unit
/// stride is not the output's inner dimension); 4-byte elements use 8×8 AVX register
/// transposes at 8. With power-of-two row pitches every row of a tile maps to the same L1 set
/// (8 ways), so larger tiles thrash: 1024×1024 f32 took 4.4 ns/elem with 32×32 tiles, 1.7
/// with 8×8 scalar tiles, 0.8 with 8×8 register transposes.
pub const KERNEL_TRANSPOSE_TILE: usize = 8;

/// Allocated bytes after every kernel scratch slice (`nrt_kernels::Workspace`): a masked
/// vector load at a slice's end does not touch its masked-off lanes, but on this CPU one
/// whose masked-off lanes cross into an unmapped page takes a microcode assist — the pool's
/// row buffer ending at the row's end made a 3×3 stride-2 pool over 64×111×111 take
/// 1.4–3.3 ms instead of 0.23–0.27. One 64-byte vector's worth keeps them in the allocation.
pub const KERNEL_SCRATCH_SLACK_BYTES: usize = 64;

/// Most bytes one thread's kernel scratch (`nrt_kernels::Workspace`, all its buffers together)
/// may hold: 4 GiB. Scratch is sized by operand shapes, and a stride-0 view lets a file give an
/// operand far more elements than memory behind it; past this, the instruction fails
/// (`NRT_EXEC_BAD_INPUT`) instead of the process growing until the OOM killer or the allocator
/// ends it. The largest legitimate need is well under it: the f32 copy of an f16/bf16 weight
/// matrix (`k·n` f32 — 2.1 GB for a 4096 × 128,256 language-model head), or a Softmax row.
pub const KERNEL_SCRATCH_MAX_BYTES: usize = 4 << 30;

/// The widest pooling window (columns) the AVX-512 pool (`nrt_kernels::pool`) takes: its
/// taps' valid column ranges live in a stack array of this many entries. Real models pool
/// over at most 7–13 columns (global pools take their own path); wider windows take the
/// portable tap-by-tap loop.
pub const KERNEL_POOL_VECTOR_MAX_KW: usize = 64;

/// Bytes of im2col patch matrix that `Conv` unrolls before each GEMM (a band of output rows):
/// small enough to stay in the 1 MiB L2 between being written and being packed by the GEMM.
/// 3×3 64→64 on 56×56 (a 7 MiB patch matrix unbanded): 128 KiB 62, 512 KiB 60–70, 2 MiB 36,
/// unbanded 27 GFLOP/s.
pub const KERNEL_IM2COL_BAND_BYTES: usize = 512 << 10;

/// Bytes of patch panels (K rows × 32 output pixels each) that `Conv`'s panel path unrolls
/// before each packed-GEMM call: enough panels to amortize the call over a small K (the
/// `cnn` sample's first layer, K = 27, takes 4 panels a call), few enough that they stay in
/// the 48 KiB L1 beside the weight rows the tiles broadcast; at least one panel whatever K.
pub const KERNEL_CONV_PANEL_BYTES: usize = 16 << 10;

/// Elements per chunk of the kernels' strided elementwise paths (operands that are strided,
/// broadcast or in place go through stack buffers of this many elements: 2–4 KiB each, so a
/// chunk of every operand stays in L1 while a kernel runs over it, and the per-chunk overhead
/// is amortized over hundreds of elements).
pub const KERNEL_CHUNK_ELEMS: usize = 512;

//===--- compiler -------------------------------------------------------------------------===//

/// The host evaluator (constant folding) is admitted for a node only if the host could hold
/// this many times its outputs' host bytes (`f32` or `i64` values): its inputs' views
/// broadcast to the output's shape, their converted copies, the result and its cast are at
/// most four such tensors (a binary op's path). A fold the host cannot hold stays on the
/// device, which computes it at run time from the smaller constants it came from.
pub const FOLD_WORKING_SET_FACTOR: usize = 4;

/// Most rows (per operand) the compiler's hazard analysis enumerates to tell apart two
/// accesses whose extents overlap (`nrt_isa::AccessPattern::may_overlap`); an operand
/// with more is compared by one level of rows, which may order two disjoint accesses. The
/// column halves of a batched attention product (4 heads × 128 rows) need 512; a comparison
/// of two 4,096-row lists takes ~0.1 ms, and only accesses whose cheaper tests overlap get it.
pub const HAZARD_ROW_LIST_MAX: usize = 4096;

/// A row operation (softmax, layer normalization) on a model compiled for two cores is split
/// between them — each takes half of its rows — when it has at least this many elements;
/// below, the cross-core wait costs more than the half it saves (a barrier hand-off is
/// 10–20 µs on this machine; softmax runs ~1 ns per element).
pub const SPLIT_ROW_OP_MIN_ELEMENTS: usize = 16 << 10;
