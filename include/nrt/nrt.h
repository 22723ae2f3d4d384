/*
 * nrt/nrt.h — the Neuron runtime C API (libnrt.so.1), as implemented by nrt-rs on the
 * software NeuronCore.
 *
 * Written from the public signatures of the AWS Neuron runtime headers (SDK 2.28 content,
 * dtype values in the hardware encoding); the enum values and struct layouts are ABI and
 * only ever appended to. Link with -lnrt (SONAME libnrt.so.1).
 *
 * Differences from libnrt worth knowing:
 *   - nrt_load() takes a compiled model in the nrt-rs NCM container (where libnrt takes a
 *     NEFF): `nrt compile model.onnx -o model.ncm`.
 *   - Collectives are not supported (nrt_load_collectives: see below).
 *
 * Life cycle (one runtime per process):
 *   - Before nrt_init(), every API that needs the runtime returns NRT_UNINITIALIZED; after
 *     nrt_close(), NRT_CLOSED. Callable at any time: nrt_get_status_as_str,
 *     nrt_get_version, nrt_get_total_[v]nc_count and nrt_get_visible_[v]nc_count (before
 *     nrt_init they answer from the environment, as nrt_init would see it), and the
 *     release functions nrt_tensor_free, nrt_destroy_tensor_set,
 *     nrt_free_model_tensor_info, and after nrt_close also nrt_get_tensor_from_tensor_set
 *     (so cleanup after nrt_close can find and release everything).
 *   - nrt_init() while a runtime is open returns NRT_FAILURE and keeps the open runtime
 *     (and all its handles) unchanged.
 *   - nrt_init() after nrt_close() starts a new runtime on a new software device. Handles
 *     of the closed runtime stay dead: its models were unloaded by nrt_close (using one
 *     gives NRT_INVALID), its tensors give NRT_CLOSED (they may still be freed), and a
 *     tensor set holding them cannot be executed (NRT_INVALID) until they are replaced.
 *   - Environment variables (NEURON_RT_LOG_LEVEL[_NRT|_NMGR|_TDRV],
 *     NEURON_RT_VISIBLE_CORES, NEURON_RT_NUM_CORES, NEURON_LOGICAL_NC_CONFIG,
 *     NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS, NRT_SIM_FAULTS) are read by nrt_init;
 *     NEURON_RT_EXEC_TIMEOUT by nrt_load.
 *
 * Faults and statistics:
 *   - The software NeuronCore injects faults from NRT_SIM_FAULTS (read by nrt_init) or, in
 *     this process only, from nrt_sim_inject_faults (nrt_experimental.h). Non-fatal faults
 *     (transient, nan, parity, dma-abort, hbm-ue, hang, drop) affect the executions
 *     they hit; the next execution succeeds. A fatal fault makes the logical core return
 *     NRT_EXEC_UNIT_UNRECOVERABLE (101) for the execution it hits, for every execution queued
 *     behind it (at once, not after a timeout) and for every new submission, until
 *     nrt_reset_vnc.
 *   - Each process publishes execution statistics for `nrt monitor` / `nrt ls` (the host
 *     view); the error summary classes the final statuses so:
 *       numerical  NRT_EXEC_COMPLETED_WITH_NUM_ERR                    (fault kind nan)
 *       transient  NRT_EXEC_COMPLETED_WITH_ERR                        (transient)
 *       model      NRT_EXEC_BAD_INPUT, NRT_EXEC_OOB, a refused input
 *       runtime    NRT_TIMEOUT, NRT_EXEC_SW_NQ_OVERFLOW, NRT_QUEUE_FULL  (hang, drop)
 *       hardware   NRT_EXEC_HW_ERR_*, NRT_EXEC_UNIT_UNRECOVERABLE     (parity, dma-abort,
 *                                                                      hbm-ue, fatal)
 *       generic    anything else.
 *
 * Handles (nrt_model_t *, nrt_tensor_t *, nrt_tensor_set_t *):
 *   - NULL where a handle or pointer is required gives NRT_INVALID and a log line naming
 *     the argument.
 *   - A handle that is not live — freed, unloaded, destroyed (including a stale copy of
 *     a pointer that nrt_tensor_free/nrt_destroy_tensor_set nulled), a handle of another
 *     kind, or any pointer this library did not return — gives NRT_INVALID, never a
 *     crash: the pointer is checked against the library's handle pools before it is used.
 *     Limit: freed handle storage is recycled (oldest first) once more than 4096 other
 *     handles of the same kind have been freed since; a stale pointer used after that may
 *     name a newer object of that kind.
 *   - nrt_unload twice, nrt_tensor_free of a stale copy, nrt_destroy_tensor_set twice:
 *     NRT_INVALID / logged, harmless.
 *   - A tensor set keeps its own reference to each tensor added: freeing a tensor that is
 *     still in a set leaves the set's bytes valid (they are released with the set).
 *   - Concurrent use of one handle from several threads is safe.
 *   - Freeing a handle while other threads use it (nrt_unload of a model that other threads
 *     keep executing, nrt_tensor_free, nrt_destroy_tensor_set): the free closes the handle
 *     first — every call that starts using it from then on gets NRT_INVALID at once — and
 *     then waits only for the calls already inside (an execution: at most its
 *     NEURON_RT_EXEC_TIMEOUT), never for newcomers.
 *   - Mutating a set while other threads execute with it (nrt_add_tensor_to_tensor_set):
 *     the mutation waits for the executions already inside; executions that start meanwhile
 *     wait for the mutation (microseconds) and then see the new tensor.
 *   - nrt_close while other threads are inside API calls: calls that start afterwards get
 *     NRT_CLOSED (or NRT_INVALID for a model handle, which nrt_close unloads); executions
 *     already inside finish first, or are refused before they reach the device; the close
 *     never waits for newcomers.
 *   - Sizes and counts from the caller are checked: a tensor larger than the host can back
 *     (HOST: MemAvailable) or than device memory, including SIZE_MAX, is NRT_RESOURCE, never
 *     an abort.
 *   - Not guaranteed: buffers you pass (read/write destinations, attached buffers, *ret of
 *     the async API) must be valid for their stated sizes and lifetimes.
 *
 * Logging: NEURON_RT_LOG_LEVEL (ERROR by default) on stderr, lines like
 * `<time> ERROR NRT:nrt_tensor_read <message naming the culprit> (NRT_INVALID)`; at DEBUG
 * every call is traced (`NRT:nrt_load API:IN: (...)`, `API:OUT: NRT_SUCCESS`).
 */
#ifndef NRT_NRT_H
#define NRT_NRT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"
#include "ndl/neuron_driver_shared_tensor_batch_op.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NRT_MAJOR_VERSION 2
#define NRT_MINOR_VERSION 0

typedef struct nrt_model nrt_model_t;
typedef struct nrt_tensor nrt_tensor_t;
typedef struct nrt_cc_context nrt_cc_context_t;
typedef void nrt_tensor_set_t;

typedef enum {
    NRT_TENSOR_PLACEMENT_DEVICE = 0,  /* device memory */
    NRT_TENSOR_PLACEMENT_HOST = 1,    /* host memory (deprecated upstream) */
    NRT_TENSOR_PLACEMENT_VIRTUAL = 2, /* ordinary host memory (treated as HOST) */
} nrt_tensor_placement_t;

typedef enum {
    NRT_FRAMEWORK_TYPE_INVALID = 0,
    NRT_FRAMEWORK_TYPE_NO_FW = 1,
    NRT_FRAMEWORK_TYPE_TENSORFLOW = 2,
    NRT_FRAMEWORK_TYPE_PYTORCH = 3,
    NRT_FRAMEWORK_TYPE_MXNET = 4,
    NRT_FRAMEWORK_TYPE_PRECHECK = 5,
} nrt_framework_type_t;

typedef enum {
    NRT_INSTANCE_UNKNOWN = 0, /* what the software NeuronCore reports */
    NRT_INSTANCE_INF1 = 1,
    NRT_INSTANCE_TRN1 = 2,
    NRT_INSTANCE_TRN1N = 3,
    NRT_INSTANCE_INF2 = 4,
    NRT_INSTANCE_TRN2 = 5,
    NRT_INSTANCE_TRN2N = 6,
    NRT_INSTANCE_INF2E = 7,
    NRT_INSTANCE_TRN2P = 8,
    NRT_INSTANCE_TRN2U = 9,
    NRT_INSTANCE_TRN2E = 10,
    NRT_INSTANCE_TRN2EU = 11,
    NRT_INSTANCE_TRN2AC = 12,
    NRT_INSTANCE_TRN2UAC = 13,
    NRT_INSTANCE_TRN3 = 14,
    NRT_INSTANCE_TRN3PDS98 = 15,
} nrt_instance_family_t;

typedef enum {
    NRT_INSTANCE_SIZE_1XL = 0,
    NRT_INSTANCE_SIZE_2XL,
    NRT_INSTANCE_SIZE_4XL,
    NRT_INSTANCE_SIZE_6XL,
    NRT_INSTANCE_SIZE_8XL,
    NRT_INSTANCE_SIZE_24XL,
    NRT_INSTANCE_SIZE_32XL,
    NRT_INSTANCE_SIZE_48XL,
    NRT_INSTANCE_SIZE_3XL,
    NRT_INSTANCE_SIZE_UNKNOWN, /* what the software NeuronCore reports */
    NRT_INSTANCE_SIZE_NUM = NRT_INSTANCE_SIZE_UNKNOWN,
} nrt_instance_size_t;

typedef enum {
    NRT_OP_ADD = 0x0,
    NRT_OP_FMA = 0x1,
    NRT_OP_MAX = 0x2,
    NRT_OP_MIN = 0x3,
    NRT_OP_INVALID = 0xF,
} nrt_op_type_t;

/* Element types, in the hardware encoding of the current public header. */
typedef enum nrt_dtype {
    NRT_DTYPE_UNKNOWN = 0x0,
    NRT_DTYPE_INVALID = 0x0,
    NRT_DTYPE_UINT64 = 0x1,
    NRT_DTYPE_INT8 = 0x2,
    NRT_DTYPE_UINT8 = 0x3, /* also how boolean tensors are reported */
    NRT_DTYPE_INT16 = 0x4,
    NRT_DTYPE_UINT16 = 0x5,
    NRT_DTYPE_BFLOAT16 = 0x6,
    NRT_DTYPE_FLOAT16 = 0x7,
    NRT_DTYPE_INT32 = 0x8,
    NRT_DTYPE_UINT32 = 0x9,
    NRT_DTYPE_FLOAT32 = 0xA,
    NRT_DTYPE_FP32R = 0xB,
    NRT_DTYPE_INT64 = 0xC,
    NRT_DTYPE_FP8_E3 = 0xD,
    NRT_DTYPE_FP8_E4 = 0xE,
    NRT_DTYPE_FP8_E5 = 0xF,
} nrt_dtype_t;

typedef enum {
    NRT_CC_ALLGATHER = 0,
    NRT_CC_ALLREDUCE = 1,
    NRT_CC_REDUCESCATTER = 2,
} nrt_cc_op_type_t;

typedef struct nrt_instance_info {
    uint32_t family; /* nrt_instance_family_t */
    uint32_t size;   /* nrt_instance_size_t */
    char arch_name[16];
    char device_revision[8];
} nrt_instance_info_t;

typedef struct nrt_tensor_batch {
    const nrt_tensor_t *tensor;
    const nrt_tensor_batch_op_t *ops;
    uint32_t num_ops;
} nrt_tensor_batch_t;

typedef struct nrt_tensor_device_allocation_info {
    uint64_t physical_address;
    size_t size;
    int hbm_index;
} nrt_tensor_device_allocation_info_t;

typedef struct nrt_vnc_memory_stats {
    size_t bytes_used;
    size_t bytes_limit;
    /* append only */
} nrt_vnc_memory_stats_t;

typedef struct nrt_cc_comm {
    uint32_t *replica_group;
    uint32_t rank;
    uint32_t rank_n;
    uint32_t ctx_device_id;
    uint32_t ctx_device_count;
    uint32_t vnc;
} nrt_cc_comm_t;

typedef struct nrt_tensor_list {
    nrt_tensor_t **tensors;
    size_t num_tensors;
} nrt_tensor_list_t;

/* Instance family/size (UNKNOWN here), arch_name and device_revision of the device.
 * Writes the first instance_info_len bytes of *info. Needs nrt_init. */
NRT_STATUS nrt_get_instance_info(nrt_instance_info_t *info, size_t instance_info_len);

/* Starts the runtime. framework: NRT_FRAMEWORK_TYPE_NO_FW for direct users, with "" and ""
 * (NULL accepted). See "Life cycle" above for calling it twice or after nrt_close. */
NRT_STATUS nrt_init(nrt_framework_type_t framework, const char *fw_version, const char *fal_version);

/* Drains in-flight executions, unloads every model, releases the cores. */
void nrt_close(void);

/* Loads a compiled model (NCM bytes) on logical NeuronCore `vnc` (relative to the visible
 * cores; -1 = the least loaded one). vnc_count is deprecated: pass -1. */
NRT_STATUS nrt_load(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count, nrt_model_t **model);

/* Collectives are not supported: NRT_FAILURE (logged), except for a single-worker group
 * (ctx_device_id 0 of ctx_device_count 1), which needs no communication and loads as
 * nrt_load. */
NRT_STATUS nrt_load_collectives(const void *neff_bytes, size_t size, int32_t vnc, int32_t vnc_count,
                                uint32_t ctx_device_id, uint32_t ctx_device_count, nrt_model_t **model);

/* Waits for the model's executions and unloads it. Unloading twice: NRT_INVALID. */
NRT_STATUS nrt_unload(nrt_model_t *model);

/* Logical NeuronCores the model occupies (1: models are not replicated). */
NRT_STATUS nrt_get_model_vnc_count(const nrt_model_t *model, uint32_t *vnc_count);
/* Deprecated name of nrt_get_model_vnc_count. */
NRT_STATUS nrt_get_model_nc_count(const nrt_model_t *model, uint32_t *vnc_count);
/* Deprecated: instances one nrt_load made of the model (always 1). */
NRT_STATUS nrt_get_model_instance_count(nrt_model_t *model, uint32_t *instance_count);

/* Logical NeuronCores of the device. Callable before nrt_init. */
NRT_STATUS nrt_get_total_vnc_count(uint32_t *vnc_count);
/* Deprecated name of nrt_get_total_vnc_count. */
NRT_STATUS nrt_get_total_nc_count(uint32_t *vnc_count);
/* Logical NeuronCores this process owns (NEURON_RT_VISIBLE_CORES / NUM_CORES /
 * NEURON_LOGICAL_NC_CONFIG). Callable before nrt_init. */
NRT_STATUS nrt_get_visible_vnc_count(uint32_t *vnc_count);
/* Deprecated name of nrt_get_visible_vnc_count. */
NRT_STATUS nrt_get_visible_nc_count(uint32_t *vnc_count);

/* Tensor sets: name -> tensor maps holding a model's inputs or outputs. */
NRT_STATUS nrt_allocate_tensor_set(nrt_tensor_set_t **result);
/* Destroys the set (not its tensors) and sets *tensor_set to NULL. */
void nrt_destroy_tensor_set(nrt_tensor_set_t **tensor_set);
/* Adds `tensor` under `tensor_name`, replacing what was there. */
NRT_STATUS nrt_add_tensor_to_tensor_set(nrt_tensor_set_t *tensor_set, const char *tensor_name, nrt_tensor_t *tensor);
/* The tensor added under `tensor_name`; NRT_FAILURE and *tensor untouched if absent.
 * Also works after nrt_close. */
NRT_STATUS nrt_get_tensor_from_tensor_set(nrt_tensor_set_t *tensor_set, const char *tensor_name, nrt_tensor_t **tensor);

/* Runs the model once on the inputs, writing the outputs (synchronous unless
 * NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS > 0: then queued, reported through the
 * callback of nrt_register_async_exec_callback).
 *
 * In-place state: a model may declare an output that updates an input in place (NCM 1.10,
 * e.g. a decoder LLM's KV cache, present.N.* over past_key_values.N.*; nrt_tensor_info_t
 * lists both). Add the SAME tensor to the input and the output set under the two names:
 * the program writes only what changes (one row per token) and reads the rest where it
 * lies. Two different tensors for such a pair are refused (NRT_INVALID, naming both). This
 * holds on every surface (nrt_execute, the implicit async queue, nrta_execute_schedule). The
 * same tensor bound to an input and an output the model does not declare in place is
 * undefined, as on the hardware. */
NRT_STATUS nrt_execute(nrt_model_t *model, const nrt_tensor_set_t *input_set, nrt_tensor_set_t *output_set);
/* repeat_count <= 1 runs once; more needs a model compiled for it (NRT_INVALID here). */
NRT_STATUS nrt_execute_repeat(nrt_model_t *model, const nrt_tensor_set_t *input_set, nrt_tensor_set_t *output_set,
                              int repeat_count);

/* A zero-filled tensor of `size` bytes. name may be NULL. DEVICE tensors live on logical
 * NeuronCore `vnc`. */
NRT_STATUS nrt_tensor_allocate(nrt_tensor_placement_t tensor_placement, int vnc, size_t size, const char *name,
                               nrt_tensor_t **tensor);
/* Frees the tensor and sets *tensor to NULL (NULL *tensor: no-op). */
void nrt_tensor_free(nrt_tensor_t **tensor);
NRT_STATUS nrt_tensor_read(const nrt_tensor_t *tensor, void *buf, size_t offset, size_t size);
NRT_STATUS nrt_tensor_write(nrt_tensor_t *tensor, const void *buf, size_t offset, size_t size);
/* Every op of every batch in order; stops at the first failure. `unsafe` changes nothing. */
NRT_STATUS nrt_tensor_read_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool unsafe);
NRT_STATUS nrt_tensor_write_batch(const nrt_tensor_batch_t *batches, uint64_t num_batches, bool unsafe);
/* Device tensors must be on the same NeuronCore, else NRT_INVALID. */
NRT_STATUS nrt_tensor_copy(const nrt_tensor_t *src, size_t src_offset, nrt_tensor_t *dst, size_t dst_offset,
                           size_t size);
/* Size in bytes; 0 (logged) for an invalid handle. */
size_t nrt_tensor_get_size(const nrt_tensor_t *tensor);
/* value is converted to unsigned char, as memset does. */
NRT_STATUS nrt_tensor_memset(nrt_tensor_t *tensor, uint64_t offset, int value, size_t size);
/* A tensor without storage, for nrt_tensor_attach_buffer. */
NRT_STATUS nrt_tensor_allocate_empty(const char *name, nrt_tensor_t **tensor);
/* The (empty) tensor uses `buffer`, which must outlive it. */
NRT_STATUS nrt_tensor_attach_buffer(nrt_tensor_t *tensor, void *buffer, size_t size);
/* A tensor viewing `size` bytes of tensor_source at `offset`. */
NRT_STATUS nrt_tensor_allocate_slice(const nrt_tensor_t *tensor_source, size_t offset, size_t size, const char *name,
                                     nrt_tensor_t **tensor_slice);
/* Host address of the tensor's bytes; NULL for an invalid handle or an empty tensor. */
void *nrt_tensor_get_va(const nrt_tensor_t *tensor);
/* Copies `size` host bytes to `dest`, an address inside a DEVICE tensor (nrt_tensor_get_va
 * plus an offset); NRT_INVALID naming the address if no device tensor holds the range. */
NRT_STATUS nrt_memcpy_to_device(void *dest, const void *src, size_t size);
/* Device tensors only; hbm_index is 0. */
NRT_STATUS nrt_tensor_get_device_allocation_info(const nrt_tensor_t *tensor,
                                                 nrt_tensor_device_allocation_info_t *alloc_info);
/* Waits until the output was reported final expected_completion_count times. timeout in
 * microseconds, negative = no limit; NRT_TIMEOUT if not reached. */
NRT_STATUS nrt_tensor_check_output_completion(const nrt_tensor_t *output_tensor, int64_t timeout,
                                              uint64_t expected_completion_count);
NRT_STATUS nrt_tensor_reset_output_completion(nrt_tensor_t *output_tensor);

/* Writes the first stats_size_in bytes of the stats; *stats_size_out (may be NULL)
 * receives the bytes written. */
NRT_STATUS nrt_get_vnc_memory_stats(uint32_t vnc, nrt_vnc_memory_stats_t *stats, size_t stats_size_in,
                                    size_t *stats_size_out);

/* Tracing: records the five stages of every execution (validate, bind, stage, doorbell,
 * harvest) of every model, and each device engine's active interval (its START to its END
 * notification, stamped by the device); nrt_trace_stop writes them to `filename` as Chrome trace-event
 * JSON (open it in https://ui.perfetto.dev) and ends the trace. `trace_mem` records nothing
 * more here. One trace or profile (nrt/nrt_profile.h) at a time; nrt_close ends it. */
NRT_STATUS nrt_trace_start(bool trace_mem);
NRT_STATUS nrt_trace_stop(const char *filename);

/* Not provided by this library (no collectives, no DMA-buf, no device mmap):
 * nrt_build_global_comm, nrt_cc_global_comm_init, nrt_get_dmabuf_fd, nrt_host_device_id_get,
 * nrt_host_device_id_rid_map_get, nrt_get_hbm_mmap_va, nrt_get_attached_efa_bdf. */

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_H */
