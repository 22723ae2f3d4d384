/*
 * async_loop.c — the NRT 3.0 explicit async API on libnrt.so.1 of nrt-rs.
 *
 *   async_loop MODEL.ncm [N]
 *
 * Inputs are filled like first_app (files named after the tensors, else zeros), through
 * nrta_tensor_write. Then N executions (default 64) are scheduled with
 * nrta_execute_schedule: the first half is waited for by polling nrta_is_completed, the
 * second half through an eventfd registered with nrta_event_register_xu_completion and
 * poll(2) (and NRT_QUEUE_FULL is handled by waiting for a completion and retrying). The
 * program checks every status, that sequence numbers increase by one on one execution
 * unit, that the eventfd counted N completions, that nrta_get_sequence reaches the last
 * sequence, and that a never-issued sequence is NRT_INVALID. Outputs are read with
 * nrta_tensor_read into `<name>.out`.
 *
 * Build: gcc -Iinclude examples/c/async_loop.c -Ltarget/release -lnrt \
 *            -Wl,-rpath,$PWD/target/release -o async_loop
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"

static int failures = 0;

#define CHECK_STATUS(call)                                                                  \
    do {                                                                                    \
        NRT_STATUS status_ = (call);                                                        \
        if (status_ != NRT_SUCCESS) {                                                       \
            fprintf(stderr, "async_loop: %s failed: %s (%d)\n", #call,                      \
                    nrt_get_status_as_str(status_), (int)status_);                          \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

#define EXPECT(cond, ...)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "async_loop: check failed: %s: ", #cond);                      \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n");                                                          \
            failures++;                                                                     \
        }                                                                                   \
    } while (0)

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "async_loop: cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

/* Waits until the eventfd is readable (or timeout_ms passes); returns the count read. */
static uint64_t wait_efd(int efd, int timeout_ms) {
    struct pollfd p = {.fd = efd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r < 0 && errno != EINTR) {
        perror("poll");
        exit(1);
    }
    if (r <= 0) {
        return 0;
    }
    uint64_t count = 0;
    if (read(efd, &count, sizeof count) != sizeof count) {
        return 0; /* EAGAIN: another reader drained it */
    }
    return count;
}

static uint64_t last_completed(uint32_t vnc) {
    nrta_seq_t s = 0;
    CHECK_STATUS(nrta_get_sequence(vnc, NRTA_XU_COMPUTE, 0, &s));
    return NRTA_SEQ_GET_SEQ_NUM(s);
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODEL.ncm [N]\n", argv[0]);
        return 2;
    }
    int n = argc == 3 ? atoi(argv[2]) : 64;
    if (n < 2) {
        fprintf(stderr, "async_loop: N must be at least 2\n");
        return 2;
    }
    size_t model_size = 0;
    void *model_bytes = read_file(argv[1], &model_size);
    if (model_bytes == NULL) {
        fprintf(stderr, "async_loop: cannot read %s\n", argv[1]);
        return 1;
    }

    CHECK_STATUS(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    nrt_model_t *model = NULL;
    CHECK_STATUS(nrt_load(model_bytes, model_size, -1, -1, &model));
    free(model_bytes);
    nrt_model_info_t minfo = {0};
    size_t minfo_size = 0;
    CHECK_STATUS(nrt_get_model_info(model, &minfo, sizeof minfo, &minfo_size));
    EXPECT(minfo_size == sizeof minfo, "model info size %zu", minfo_size);
    const uint32_t vnc = minfo.vnc;

    nrt_tensor_info_array_t *info = NULL;
    CHECK_STATUS(nrt_get_model_tensor_info(model, &info));
    nrt_tensor_set_t *inputs = NULL, *outputs = NULL;
    CHECK_STATUS(nrt_allocate_tensor_set(&inputs));
    CHECK_STATUS(nrt_allocate_tensor_set(&outputs));
    nrt_tensor_t **tensors = calloc(info->tensor_count, sizeof *tensors);
    uint64_t last_tensor_seq = 0;
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *ti = &info->tensor_array[i];
        CHECK_STATUS(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, (int)vnc, ti->size, ti->name, &tensors[i]));
        if (ti->usage == NRT_TENSOR_USAGE_INPUT) {
            size_t fsize = 0;
            void *data = read_file(ti->name, &fsize);
            void *buf = calloc(1, ti->size ? ti->size : 1);
            if (data != NULL) {
                memcpy(buf, data, fsize < ti->size ? fsize : ti->size);
                free(data);
            }
            NRT_STATUS ret = NRT_FAILURE;
            nrta_seq_t seq = 0;
            CHECK_STATUS(nrta_tensor_write(tensors[i], buf, 0, ti->size, (int)vnc, 0, &ret, &seq));
            bool done = false;
            CHECK_STATUS(nrta_is_completed(seq, &done));
            EXPECT(done && ret == NRT_SUCCESS, "tensor write %s: done=%d ret=%d", ti->name, done, ret);
            EXPECT(NRTA_SEQ_GET_XU_ID(seq) == vnc * NRTA_XU_TYPE_NUM + NRTA_XU_TENSOR_OP,
                   "tensor-op seq %#llx", (unsigned long long)seq);
            EXPECT(NRTA_SEQ_GET_SEQ_NUM(seq) == last_tensor_seq + 1, "tensor-op seq number %llu after %llu",
                   (unsigned long long)NRTA_SEQ_GET_SEQ_NUM(seq), (unsigned long long)last_tensor_seq);
            last_tensor_seq = NRTA_SEQ_GET_SEQ_NUM(seq);
            printf("write  %-24s status=%s seq=%#llx\n", ti->name, nrt_get_status_as_str(ret),
                   (unsigned long long)seq);
            free(buf);
            CHECK_STATUS(nrt_add_tensor_to_tensor_set(inputs, ti->name, tensors[i]));
        } else {
            CHECK_STATUS(nrt_add_tensor_to_tensor_set(outputs, ti->name, tensors[i]));
        }
    }

    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd < 0) {
        perror("eventfd");
        return 1;
    }
    CHECK_STATUS(nrta_event_register_xu_completion((int)vnc, NRTA_XU_COMPUTE, 0, efd));

    NRT_STATUS *rets = malloc((size_t)n * sizeof *rets);
    nrta_seq_t *seqs = malloc((size_t)n * sizeof *seqs);
    uint64_t signalled = 0;
    const uint64_t before = last_completed(vnc);
    const int half = n / 2;

    /* Phase 1: schedule half, poll nrta_is_completed. */
    for (int i = 0; i < half; i++) {
        rets[i] = (NRT_STATUS)-1;
        NRT_STATUS st;
        while ((st = nrta_execute_schedule(model, inputs, outputs, 0, &rets[i], &seqs[i])) == NRT_QUEUE_FULL) {
            sched_yield();
        }
        CHECK_STATUS(st);
    }
    for (int i = 0; i < half; i++) {
        bool done = false;
        while (!done) {
            CHECK_STATUS(nrta_is_completed(seqs[i], &done));
            if (!done) {
                sched_yield();
            }
        }
        EXPECT(rets[i] == NRT_SUCCESS, "execution %d status %d", i, rets[i]);
    }
    printf("phase 1: %d executions completed (polled nrta_is_completed)\n", half);

    /* Phase 2: schedule the rest, wait on the eventfd. */
    for (int i = half; i < n; i++) {
        rets[i] = (NRT_STATUS)-1;
        NRT_STATUS st;
        while ((st = nrta_execute_schedule(model, inputs, outputs, 0, &rets[i], &seqs[i])) == NRT_QUEUE_FULL) {
            signalled += wait_efd(efd, 100); /* back-pressure: wait for a completion */
        }
        CHECK_STATUS(st);
    }
    const uint64_t last = NRTA_SEQ_GET_SEQ_NUM(seqs[n - 1]);
    while (last_completed(vnc) < last) {
        signalled += wait_efd(efd, 1000);
    }
    /* Every completion signals once: wait for all N signals before closing the fd. */
    for (int tries = 0; signalled < (uint64_t)n && tries < 50; tries++) {
        signalled += wait_efd(efd, 100);
    }
    printf("phase 2: %d executions completed (eventfd + poll), %llu completions signalled\n", n - half,
           (unsigned long long)signalled);
    EXPECT(signalled == (uint64_t)n, "eventfd counted %llu completions, expected %d", (unsigned long long)signalled,
           n);

    for (int i = 0; i < n; i++) {
        EXPECT(rets[i] == NRT_SUCCESS, "execution %d status %d", i, rets[i]);
        EXPECT(NRTA_SEQ_GET_XU_ID(seqs[i]) == vnc * NRTA_XU_TYPE_NUM + NRTA_XU_COMPUTE, "seq %#llx",
               (unsigned long long)seqs[i]);
        EXPECT(NRTA_SEQ_GET_SEQ_NUM(seqs[i]) == before + 1 + (uint64_t)i, "seq number %llu at %d",
               (unsigned long long)NRTA_SEQ_GET_SEQ_NUM(seqs[i]), i);
        if (i < 3 || i == n - 1) {
            printf("exec %3d status=%s seq=%#llx (xu %u, number %llu)\n", i, nrt_get_status_as_str(rets[i]),
                   (unsigned long long)seqs[i], (unsigned)NRTA_SEQ_GET_XU_ID(seqs[i]),
                   (unsigned long long)NRTA_SEQ_GET_SEQ_NUM(seqs[i]));
        }
    }
    CHECK_STATUS(nrta_event_register_xu_completion((int)vnc, NRTA_XU_COMPUTE, 0, -1));

    /* A completed sequence signals a per-sequence eventfd at once. */
    int efd2 = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    CHECK_STATUS(nrta_event_register_seq_id_completion(seqs[n - 1], efd2));
    EXPECT(wait_efd(efd2, 1000) == 1, "per-sequence eventfd of a completed sequence");

    /* A sequence that was never issued. */
    bool done = false;
    NRT_STATUS st = nrta_is_completed(seqs[n - 1] + 1000, &done);
    EXPECT(st == NRT_INVALID, "never-issued seq gave %s", nrt_get_status_as_str(st));

    /* Outputs, through the tensor-op unit. */
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *ti = &info->tensor_array[i];
        if (ti->usage != NRT_TENSOR_USAGE_OUTPUT) {
            continue;
        }
        void *buf = malloc(ti->size ? ti->size : 1);
        NRT_STATUS ret = NRT_FAILURE;
        nrta_seq_t seq = 0;
        CHECK_STATUS(nrta_tensor_read(buf, tensors[i], 0, ti->size, (int)vnc, 0, &ret, &seq));
        EXPECT(ret == NRT_SUCCESS, "tensor read %s", ti->name);
        char path[NRT_TENSOR_NAME_MAX + 8];
        snprintf(path, sizeof path, "%s.out", ti->name);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(buf, 1, ti->size, f) != ti->size) {
            fprintf(stderr, "async_loop: cannot write %s\n", path);
            return 1;
        }
        fclose(f);
        printf("read   %-24s status=%s seq=%#llx -> %s\n", ti->name, nrt_get_status_as_str(ret),
               (unsigned long long)seq, path);
        free(buf);
    }

    close(efd2);
    close(efd);
    free(rets);
    free(seqs);
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        nrt_tensor_free(&tensors[i]);
    }
    free(tensors);
    nrt_destroy_tensor_set(&inputs);
    nrt_destroy_tensor_set(&outputs);
    CHECK_STATUS(nrt_free_model_tensor_info(info));
    CHECK_STATUS(nrt_unload(model));
    nrt_close();
    if (failures != 0) {
        fprintf(stderr, "async_loop: %d check(s) failed\n", failures);
        return 1;
    }
    printf("async_loop: ok (%d executions)\n", n);
    return 0;
}
