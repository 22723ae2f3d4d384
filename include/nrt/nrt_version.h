/*
 * nrt/nrt_version.h — the runtime's version.
 *
 * Part of nrt-rs (libnrt.so.1 on the software NeuronCore).
 */
#ifndef NRT_NRT_VERSION_H
#define NRT_NRT_VERSION_H

#include <stddef.h>
#include <stdint.h>
#include "nrt/nrt_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NRT_VERSION_DETAIL_MAX 128
#define NRT_VERSION_GIT_HASH_MAX 64

typedef struct nrt_version {
    uint64_t rt_major;
    uint64_t rt_minor;
    uint64_t rt_patch;
    uint64_t rt_maintenance;
    char rt_detail[NRT_VERSION_DETAIL_MAX];
    char git_hash[NRT_VERSION_GIT_HASH_MAX];
} nrt_version_t;

/* Fills the first `size` bytes of *ver (pass sizeof(nrt_version_t)). Callable at any time.
 * This library reports the libnrt release whose API it implements (2.32.0.0); rt_detail
 * names nrt-rs and its version. */
NRT_STATUS nrt_get_version(nrt_version_t *ver, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_VERSION_H */
