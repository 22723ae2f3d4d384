/*
 * nrt/nrt_profile.h — profiling one model's executions.
 *
 * Part of nrt-rs (libnrt.so.1 on the software NeuronCore). libnrt writes NTFF device
 * profiles; this library records the five stages of each execution of the model (validate,
 * bind, stage, doorbell, harvest) and each device engine's active interval (one track per
 * engine, from the device's timestamps) and writes them as Chrome trace-event JSON, which
 * https://ui.perfetto.dev opens. One profile or trace (nrt_trace_start) at a time; nrt_close
 * ends it. Recording allocates nothing per execution.
 */
#ifndef NRT_NRT_PROFILE_H
#define NRT_NRT_PROFILE_H

#include "nrt/nrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Starts recording the executions of `model`; `filename` is where nrt_profile_stop writes
 * them unless it names another file. NRT_INVALID if a profile or trace is in progress. */
NRT_STATUS nrt_profile_start(nrt_model_t *model, const char *filename);
/* Writes the profile to `filename` (NULL: the file named at start) and ends it; if the
 * file cannot be written, NRT_FAILURE and the profile goes on. NRT_INVALID if no profile
 * is in progress. */
NRT_STATUS nrt_profile_stop(const char *filename);

#ifdef __cplusplus
}
#endif

#endif /* NRT_NRT_PROFILE_H */
