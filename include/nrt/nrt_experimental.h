/*
 * nrt/nrt_experimental.h — tensor info, the implicit-async controls and model info.
 *
 * Part of nrt-rs (libnrt.so.1 on the software NeuronCore); see nrt/nrt.h for the life
 * cycle and handle rules.
 */
#ifndef NRT_NRT_EXPERIMENTAL_H
#define NRT_NRT_EXPERIMENTAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt.h"
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nrt_tensor_usage {
    NRT_TENSOR_USAGE_INPUT = 0,
    NRT_TENSOR_USAGE_OUTPUT,
} nrt_tensor_usage_t;

#define NRT_TENSOR_NAME_MAX 256

/* Outputs whose extent depends on the data (ONNX NonZero, Unique, NonMaxSuppression; NCM 1.4):
 * the device has static shapes, so such an output "Y" is listed at its static upper bound
 * (shape, size), followed by an int64 output "Y:shape" of shape [ndim] into which every
 * execution writes Y's actual shape. The first prod(Y:shape) elements of Y hold the actual
 * result in row-major order of that shape (packed, not a corner of the bound); the rest of
 * Y is zero. C callers see and read both tensors; nrt run, nrt conformance and the Python
 * package return Y trimmed to its actual shape and hide "Y:shape". */
typedef struct nrt_tensor_info {
    char name[NRT_TENSOR_NAME_MAX]; /* NUL-terminated (longer names are truncated) */
    nrt_tensor_usage_t usage;
    size_t size;                    /* bytes (an upper bound for a data-dependent output, above) */
    nrt_dtype_t dtype;
    uint32_t *shape;                /* ndim entries (NULL for a scalar); the bound, as size */
    uint32_t ndim;
} nrt_tensor_info_t;

typedef struct nrt_tensor_info_array {
    uint64_t tensor_count;
    nrt_tensor_info_t tensor_array[];
} nrt_tensor_info_array_t;

/* Implicit-async completion callback: called on the logical core's XU worker thread, once
 * per execution, after the execution was retired (its outputs are final).
 *
 * Calls from inside the callback:
 *   - work: nrt_tensor_read/write (they do not wait for other pending executions there: an
 *     execution still in flight that shares the tensor may be writing it, as on hardware),
 *     nrt_execute (queues another execution, or NRT_QUEUE_FULL at once), tensor and set
 *     allocation/free, nrt_get_model_tensor_info, nrt_tensor_check_output_completion, the
 *     nrta_* queries, nrt_register_async_exec_callback, the count and stats queries;
 *   - refused at once with NRT_INVALID (logged) and nothing changed, because each would wait
 *     for executions that only this worker completes: nrt_async_drain_queued_execs,
 *     nrt_unload; nrt_close logs the same error and returns with the runtime still open.
 * Keep callbacks short: the worker reports nothing else while one runs. On a host with two
 * CPUs or fewer the worker also runs a short model's device work itself (the device thread
 * parks: one runnable thread fewer), so a long callback also holds that logical core's queued
 * executions, until the device thread's next look takes them over (1-2 ms).
 *
 * Waiting for callbacks: a thread that blocks on something the callback signals (a condition
 * variable, a futex) does best to spin briefly and sched_yield() once before it blocks. With
 * more runnable threads than CPUs the worker usually shares the waiter's CPU; the yield lets
 * it run this batch's callbacks without a wake-up per batch (near-null model, depth 8, 2
 * vCPUs, measured before the worker ran device work: 0.45-0.56 M executions/s with the
 * yield, 0.12-0.21 M/s blocking right after the spin). */
typedef void (*NRT_ASYNC_EXEC_STATUS_CALLBACK)(void *params, uint32_t model_id, uint32_t vnc, uint64_t job_id,
                                               NRT_STATUS status);

/* The model's inputs and outputs, in one allocation; free with nrt_free_model_tensor_info. */
NRT_STATUS nrt_get_model_tensor_info(nrt_model_t *model, nrt_tensor_info_array_t **tensor_info);
/* Frees an array of nrt_get_model_tensor_info (also after nrt_close). Anything else,
 * including a second free, is NRT_INVALID and is not freed. */
NRT_STATUS nrt_free_model_tensor_info(nrt_tensor_info_array_t *tensor_info);

/* Replaces the implicit-async completion callback (the default one logs failures).
 * NRT_INVALID unless NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0 at nrt_init. */
NRT_STATUS nrt_register_async_exec_callback(NRT_ASYNC_EXEC_STATUS_CALLBACK callback, void *params);

/* Waits until every queued implicit-async execution on `vnc` (-1: all) was reported. */
NRT_STATUS nrt_async_drain_queued_execs(int32_t vnc);

typedef struct nrt_model_info {
    uint32_t vnc; /* logical NeuronCore the model is loaded on */
    /* append only */
} nrt_model_info_t;

/* Writes the first info_size_in bytes; *info_size_out (may be NULL) receives the bytes
 * written. */
NRT_STATUS nrt_get_model_info(const nrt_model_t *model, nrt_model_info_t *info, size_t info_size_in,
                              size_t *info_size_out);

/* --- nrt-rs extensions (not in libnrt): the software NeuronCore's controls -------------- */

/* Arms a fault plan on this process's software NeuronCore, in the syntax of the
 * NRT_SIM_FAULTS environment variable (e.g. "fatal@core=0,exec=2;nan@count=3"). Unlike the
 * variable, which every child process and every restart inherits, this arms the plan in this
 * process only (one replica of a service, one test). `exec` counts executions of the core
 * from 1 since nrt_init; an entry without `exec` fires on the core's next execution.
 * NRT_INVALID (with a log line naming the entry) for a malformed plan or a core that does
 * not exist; nothing is armed then. */
NRT_STATUS nrt_sim_inject_faults(const char *plan);

/* ONNX `double` tensors (an nrt-rs extension of nrt_dtype_t: the hardware has no float64).
 * Storage only: the software NeuronCore computes them in float32. nrt_get_model_tensor_info
 * reports a double input or output with this value. */
#define NRT_DTYPE_FLOAT64 ((nrt_dtype_t)0x11)

/* Removes every planned fault that has not fired yet (NRT_SIM_FAULTS's included). */
NRT_STATUS nrt_sim_clear_faults(void);

/* Resets logical NeuronCore `vnc` after a fatal error (NRT_EXEC_UNIT_UNRECOVERABLE): its
 * cores are reset and it accepts executions again. Loaded models stay loaded. */
NRT_STATUS nrt_reset_vnc(int32_t vnc);

/* Not provided by this library (collectives and firmware hooks of the hardware runtime):
 * nrt_get_libnccl_net, nrt_set_pool_eng_ucode, nrt_barrier, nrt_all_gather. */

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_EXPERIMENTAL_H */
