/* abi_probe.c — prints the sizes, offsets and enum values the public headers give, for
 * tests/abi.rs to compare with the Rust side. Compiled as C (gcc) and as C++ (g++), linked
 * with -lnrt (the C++ build checks the extern "C" guards: unmangled names must link). */
#include <stddef.h>
#include <stdio.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "nrt/nrt_profile.h"
#include "nrt/nrt_status.h"
#include "nrt/nrt_version.h"

#define V(x) printf("%s %lld\n", #x, (long long)(x))
#define SZ(T) printf("sizeof %s %zu\n", #T, sizeof(T))
#define OFF(T, f) printf("offsetof %s.%s %zu\n", #T, #f, offsetof(T, f))

int main(void) {
    SZ(nrt_tensor_info_t);
    OFF(nrt_tensor_info_t, name);
    OFF(nrt_tensor_info_t, usage);
    OFF(nrt_tensor_info_t, size);
    OFF(nrt_tensor_info_t, dtype);
    OFF(nrt_tensor_info_t, shape);
    OFF(nrt_tensor_info_t, ndim);
    SZ(nrt_tensor_info_array_t);
    OFF(nrt_tensor_info_array_t, tensor_count);
    OFF(nrt_tensor_info_array_t, tensor_array);
    SZ(nrt_version_t);
    OFF(nrt_version_t, rt_major);
    OFF(nrt_version_t, rt_minor);
    OFF(nrt_version_t, rt_patch);
    OFF(nrt_version_t, rt_maintenance);
    OFF(nrt_version_t, rt_detail);
    OFF(nrt_version_t, git_hash);
    SZ(nrt_instance_info_t);
    OFF(nrt_instance_info_t, family);
    OFF(nrt_instance_info_t, size);
    OFF(nrt_instance_info_t, arch_name);
    OFF(nrt_instance_info_t, device_revision);
    SZ(nrt_vnc_memory_stats_t);
    OFF(nrt_vnc_memory_stats_t, bytes_used);
    OFF(nrt_vnc_memory_stats_t, bytes_limit);
    SZ(nrt_model_info_t);
    OFF(nrt_model_info_t, vnc);
    SZ(nrt_tensor_batch_op_t);
    OFF(nrt_tensor_batch_op_t, offset);
    OFF(nrt_tensor_batch_op_t, size);
    OFF(nrt_tensor_batch_op_t, buffer);
    SZ(nrt_tensor_batch_t);
    OFF(nrt_tensor_batch_t, tensor);
    OFF(nrt_tensor_batch_t, ops);
    OFF(nrt_tensor_batch_t, num_ops);
    SZ(nrt_tensor_device_allocation_info_t);
    OFF(nrt_tensor_device_allocation_info_t, physical_address);
    OFF(nrt_tensor_device_allocation_info_t, size);
    OFF(nrt_tensor_device_allocation_info_t, hbm_index);
    SZ(NRT_STATUS);
    SZ(nrt_dtype_t);
    SZ(nrta_xu_t);
    SZ(nrta_seq_t);
    SZ(nrta_xu_id_t);

    V(NRT_SUCCESS);
    V(NRT_FAILURE);
    V(NRT_INVALID);
    V(NRT_INVALID_HANDLE);
    V(NRT_RESOURCE);
    V(NRT_TIMEOUT);
    V(NRT_HW_ERROR);
    V(NRT_QUEUE_FULL);
    V(NRT_LOAD_NOT_ENOUGH_NC);
    V(NRT_UNSUPPORTED_NEFF_VERSION);
    V(NRT_FAIL_HOST_MEM_ALLOC);
    V(NRT_UNINITIALIZED);
    V(NRT_CLOSED);
    V(NRT_QUEUE_EMPTY);
    V(NRT_EXEC_UNIT_UNRECOVERABLE);
    V(NRT_EXEC_BAD_INPUT);
    V(NRT_EXEC_COMPLETED_WITH_NUM_ERR);
    V(NRT_EXEC_COMPLETED_WITH_ERR);
    V(NRT_EXEC_NC_BUSY);
    V(NRT_EXEC_OOB);
    V(NRT_COLL_PENDING);
    V(NRT_EXEC_HW_ERR_COLLECTIVES);
    V(NRT_EXEC_HW_ERR_HBM_UE);
    V(NRT_EXEC_HW_ERR_NC_UE);
    V(NRT_EXEC_HW_ERR_DMA_ABORT);
    V(NRT_EXEC_SW_NQ_OVERFLOW);
    V(NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE);
    V(NRT_NETWORK_PROXY_FAILURE);

    V(NRT_DTYPE_UNKNOWN);
    V(NRT_DTYPE_INVALID);
    V(NRT_DTYPE_UINT64);
    V(NRT_DTYPE_INT8);
    V(NRT_DTYPE_UINT8);
    V(NRT_DTYPE_INT16);
    V(NRT_DTYPE_UINT16);
    V(NRT_DTYPE_BFLOAT16);
    V(NRT_DTYPE_FLOAT16);
    V(NRT_DTYPE_INT32);
    V(NRT_DTYPE_UINT32);
    V(NRT_DTYPE_FLOAT32);
    V(NRT_DTYPE_FP32R);
    V(NRT_DTYPE_INT64);
    V(NRT_DTYPE_FP8_E3);
    V(NRT_DTYPE_FP8_E4);
    V(NRT_DTYPE_FP8_E5);
    V(NRT_DTYPE_FLOAT64);

    V(NRT_TENSOR_PLACEMENT_DEVICE);
    V(NRT_TENSOR_PLACEMENT_HOST);
    V(NRT_TENSOR_PLACEMENT_VIRTUAL);
    V(NRT_FRAMEWORK_TYPE_INVALID);
    V(NRT_FRAMEWORK_TYPE_NO_FW);
    V(NRT_FRAMEWORK_TYPE_TENSORFLOW);
    V(NRT_FRAMEWORK_TYPE_PYTORCH);
    V(NRT_FRAMEWORK_TYPE_MXNET);
    V(NRT_FRAMEWORK_TYPE_PRECHECK);
    V(NRT_TENSOR_USAGE_INPUT);
    V(NRT_TENSOR_USAGE_OUTPUT);
    V(NRT_INSTANCE_UNKNOWN);
    V(NRT_INSTANCE_TRN3PDS98);
    V(NRT_INSTANCE_SIZE_3XL);
    V(NRT_INSTANCE_SIZE_UNKNOWN);
    V(NRT_INSTANCE_SIZE_NUM);
    V(NRT_OP_ADD);
    V(NRT_OP_INVALID);
    V(NRT_CC_REDUCESCATTER);
    V(NRT_TENSOR_NAME_MAX);
    V(NRT_MAJOR_VERSION);
    V(NRT_MINOR_VERSION);

    V(NRTA_XU_TENSOR_OP);
    V(NRTA_XU_COMPUTE);
    V(NRTA_XU_COLLECTIVES);
    V(NRTA_XU_TYPE_NUM);
    V(NRTA_SEQ_NUM_MAX);
    V(NRTA_SEQ_GET_SEQ_NUM(0x0203000000001234ull));
    V(NRTA_SEQ_GET_XU_ID(0x0203000000001234ull));

    /* Links: the names are exported unmangled. */
    printf("status_str %s\n", nrt_get_status_as_str(NRT_EXEC_OOB));
    return 0;
}
