/*
 * nrt/nrt_status.h — NRT_STATUS, the return codes of the Neuron runtime C API.
 *
 * Part of nrt-rs (libnrt.so.1 on the software NeuronCore). Written from the public
 * signatures and values of the AWS Neuron runtime headers; the values are ABI.
 */
#ifndef NRT_NRT_STATUS_H
#define NRT_NRT_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NRT_SUCCESS = 0,                        /* ok */
    NRT_FAILURE = 1,                        /* non-specific failure */
    NRT_INVALID = 2,                        /* invalid model, argument, handle, name or size */
    NRT_INVALID_HANDLE = 3,                 /* invalid handle (unused: stale handles give NRT_INVALID) */
    NRT_RESOURCE = 4,                       /* failed to allocate a resource */
    NRT_TIMEOUT = 5,                        /* operation timed out */
    NRT_HW_ERROR = 6,                       /* hardware failure */
    NRT_QUEUE_FULL = 7,                     /* too many executions in flight; retry after a completion */
    NRT_LOAD_NOT_ENOUGH_NC = 9,             /* not enough NeuronCores to load the model */
    NRT_UNSUPPORTED_NEFF_VERSION = 10,      /* unsupported compiled-model version */
    NRT_FAIL_HOST_MEM_ALLOC = 11,           /* kept for backward compatibility; not returned */
    NRT_UNINITIALIZED = 13,                 /* called before nrt_init() */
    NRT_CLOSED = 14,                        /* called after nrt_close() */
    NRT_QUEUE_EMPTY = 15,                   /* queue has no data */
    NRT_EXEC_UNIT_UNRECOVERABLE = 101,      /* execution unit in a fatal state; needs reset */
    NRT_EXEC_BAD_INPUT = 1002,              /* invalid input submitted to an execution */
    NRT_EXEC_COMPLETED_WITH_NUM_ERR = 1003, /* completed with numerical errors (NaN) */
    NRT_EXEC_COMPLETED_WITH_ERR = 1004,     /* completed with other errors */
    NRT_EXEC_NC_BUSY = 1005,                /* NeuronCore locked by another model/process/thread */
    NRT_EXEC_OOB = 1006,                    /* indirect memory access out of bounds */
    NRT_COLL_PENDING = 1100,                /* collective operation still pending */
    NRT_EXEC_HW_ERR_COLLECTIVES = 1200,     /* stuck in collectives */
    NRT_EXEC_HW_ERR_HBM_UE = 1201,          /* HBM uncorrectable error */
    NRT_EXEC_HW_ERR_NC_UE = 1202,           /* NeuronCore on-chip memory parity error */
    NRT_EXEC_HW_ERR_DMA_ABORT = 1203,       /* DMA engine unrecoverable error */
    NRT_EXEC_SW_NQ_OVERFLOW = 1204,         /* timed out: notifications were dropped */
    NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE = 1205, /* HBM repairable uncorrectable error */
    NRT_NETWORK_PROXY_FAILURE = 1206,       /* network proxy operation failed */
} NRT_STATUS;

/* The status's name ("NRT_SUCCESS", ...), or "NRT_UNKNOWN_STATUS". Static storage;
 * callable at any time. */
const char *nrt_get_status_as_str(NRT_STATUS status);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_STATUS_H */
