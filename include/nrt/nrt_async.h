/*
 * nrt/nrt_async.h — the NRT 3.0 explicit async API (nrta_*).
 *
 * Part of nrt-rs (libnrt.so.1 on the software NeuronCore). This is the 3.0 ABI (status
 * pointer instead of an error tracker, lnc_idx on tensor operations, eventfd completion),
 * written from the public documentation; the header published with SDK 2.28 is the older
 * pre-3.0 ABI and is NOT what this library implements.
 *
 * Each request gets a sequence id: the execution unit id in the top 16 bits, a sequence
 * number in the low 48 bits that starts at 1 and increases by one per request on that
 * unit. `*ret` (may be NULL) receives the request's final status when it completes, before
 * nrta_is_completed reports it, so it must stay valid until then. If scheduling fails the
 * function returns the status and writes it to *ret as well. Tensor operations complete
 * before their schedule call returns.
 */
#ifndef NRT_NRT_ASYNC_H
#define NRT_NRT_ASYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt.h"
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Execution units (append only). */
typedef enum nrta_xu {
    NRTA_XU_TENSOR_OP = 0, /* tensor reads, writes, copies */
    NRTA_XU_COMPUTE,       /* model executions */
    NRTA_XU_COLLECTIVES,   /* collectives (not supported here) */
    NRTA_XU_TYPE_NUM,
} nrta_xu_t;

typedef uint64_t nrta_seq_t;
typedef uint16_t nrta_xu_id_t;

#define NRTA_SEQ_NUM_MAX ((1ull << 48) - 1)
#define NRTA_SEQ_NUM_MASK NRTA_SEQ_NUM_MAX
#define NRTA_SEQ_GET_SEQ_NUM(seq) ((seq) & NRTA_SEQ_NUM_MASK)
#define NRTA_SEQ_GET_XU_ID(seq) ((nrta_xu_id_t)((seq) >> 48))

/* Queues an execution on the model's compute unit and returns at once. queue must be 0.
 * NRT_QUEUE_FULL when the unit has no room: wait for a completion and retry. */
NRT_STATUS nrta_execute_schedule(nrt_model_t *model, const nrt_tensor_set_t *input, nrt_tensor_set_t *output,
                                 int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence);

/* Tensor operations on the tensor-op unit of logical NeuronCore lnc_idx; queue must be 0. */
NRT_STATUS nrta_tensor_read(void *buf, nrt_tensor_t *tensor, uint64_t offset, uint64_t size, int lnc_idx, int queue,
                            NRT_STATUS *ret, nrta_seq_t *req_sequence);
NRT_STATUS nrta_tensor_write(nrt_tensor_t *tensor, const void *buf, uint64_t offset, uint64_t size, int lnc_idx,
                             int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence);
NRT_STATUS nrta_tensor_copy(nrt_tensor_t *src, uint64_t src_offset, nrt_tensor_t *dst, uint64_t dst_offset,
                            uint64_t size, int lnc_idx, int queue, NRT_STATUS *ret, nrta_seq_t *req_sequence);

/* NRT_SUCCESS with *is_completed, or NRT_INVALID for a sequence that was never issued. */
NRT_STATUS nrta_is_completed(nrta_seq_t seq, bool *is_completed);

/* The last completed sequence of (lnc, xu, queue) (sequence number 0 if none yet). */
NRT_STATUS nrta_get_sequence(uint32_t lnc, nrta_xu_t xu, int queue, nrta_seq_t *seq);

/* Signals eventfd `efd` (writes 1) when `seq` completes, at once if it already has.
 * efd = -1 deregisters. The caller owns the eventfd. */
NRT_STATUS nrta_event_register_seq_id_completion(nrta_seq_t seq, int efd);

/* Signals `efd` on every completion of (lnc, xu, queue): drain it (read), then ask
 * nrta_get_sequence. efd = -1 deregisters. */
NRT_STATUS nrta_event_register_xu_completion(int lnc, nrta_xu_t xu, int queue, int efd);

/* Not provided by this library: nrta_cc_prepare, nrta_cc_prepare_coalesced,
 * nrta_cc_schedule. */

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_ASYNC_H */
