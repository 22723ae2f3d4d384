/*
 * ndl/neuron_driver_shared_tensor_batch_op.h — one operation of a batched tensor
 * read/write (nrt_tensor_read_batch / nrt_tensor_write_batch).
 *
 * Part of nrt-rs. nrt/nrt.h includes this file with a quoted include, as the public header
 * does, so `-I include` finds it.
 */
#ifndef NDL_NEURON_DRIVER_SHARED_TENSOR_BATCH_OP_H
#define NDL_NEURON_DRIVER_SHARED_TENSOR_BATCH_OP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nrt_tensor_batch_op {
    uint64_t offset; /* byte offset in the tensor */
    uint64_t size;   /* bytes to copy */
    void *buffer;    /* host buffer: source (write) or destination (read) */
} nrt_tensor_batch_op_t;

#ifdef __cplusplus
}
#endif

#endif /* NDL_NEURON_DRIVER_SHARED_TENSOR_BATCH_OP_H */
