/* api_tour.c — every C API function the examples do not exercise, with its documented
 * behaviour, on the near-null model (y = x, f32[1,4]). Run by tests/api_tour.rs:
 *
 *   api_tour MODEL.ncm sync        synchronous runtime: tensors of every kind, slices,
 *                                  attached buffers, batches, completion counts, queries,
 *                                  eventfds, 4 threads executing concurrently,
 *                                  nrt_memcpy_to_device, profiling and tracing
 *   api_tour MODEL.ncm implicit    with NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS set:
 *                                  callback, queued nrt_execute, drain
 */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "nrt/nrt_profile.h"
#include "nrt/nrt_version.h"

static atomic_int checks = 0, failures = 0; /* updated by the worker threads too */

static void expect_status(const char *what, NRT_STATUS got, NRT_STATUS want, int line) {
    checks++;
    if (got != want) {
        failures++;
        fprintf(stderr, "api_tour:%d: %s returned %s (%d), expected %s\n", line, what,
                nrt_get_status_as_str(got), (int)got, nrt_get_status_as_str(want));
    }
}

static void expect_true(const char *what, int ok, int line) {
    checks++;
    if (!ok) {
        failures++;
        fprintf(stderr, "api_tour:%d: check failed: %s\n", line, what);
    }
}

#define EXPECT(call, want) expect_status(#call, (call), (want), __LINE__)
#define OK(call) EXPECT(call, NRT_SUCCESS)
#define TRUE(cond) expect_true(#cond, (cond) ? 1 : 0, __LINE__)

static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc((size_t)n);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        exit(2);
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static nrt_model_t *model;
static void on_done(void *params, uint32_t model_id, uint32_t vnc, uint64_t job_id, NRT_STATUS status);

/* Executes with `x` bound to input "x" and a fresh output; returns y in out[4]. */
static void run_with_input(nrt_tensor_t *x, float out[4], int line) {
    nrt_tensor_set_t *in = NULL, *outs = NULL;
    nrt_tensor_t *y = NULL;
    expect_status("alloc set", nrt_allocate_tensor_set(&in), NRT_SUCCESS, line);
    expect_status("alloc set", nrt_allocate_tensor_set(&outs), NRT_SUCCESS, line);
    expect_status("alloc y", nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "y", &y), NRT_SUCCESS, line);
    expect_status("add x", nrt_add_tensor_to_tensor_set(in, "x", x), NRT_SUCCESS, line);
    expect_status("add y", nrt_add_tensor_to_tensor_set(outs, "y", y), NRT_SUCCESS, line);
    expect_status("nrt_execute", nrt_execute(model, in, outs), NRT_SUCCESS, line);
    expect_status("read y", nrt_tensor_read(y, out, 0, 16), NRT_SUCCESS, line);
    nrt_tensor_free(&y);
    nrt_destroy_tensor_set(&in);
    nrt_destroy_tensor_set(&outs);
}

/* ---- threads executing one model concurrently, each with its own tensors ---- */
static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    nrt_tensor_t *x = NULL, *y = NULL;
    nrt_tensor_set_t *in = NULL, *out = NULL;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &x));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "y", &y));
    OK(nrt_allocate_tensor_set(&in));
    OK(nrt_allocate_tensor_set(&out));
    OK(nrt_add_tensor_to_tensor_set(in, "x", x));
    OK(nrt_add_tensor_to_tensor_set(out, "y", y));
    int bad = 0;
    for (int i = 0; i < 200; i++) {
        float xs[4] = {(float)id, (float)i, (float)(id * i), 1.5f}, ys[4];
        if (nrt_tensor_write(x, xs, 0, 16) != NRT_SUCCESS || nrt_execute(model, in, out) != NRT_SUCCESS ||
            nrt_tensor_read(y, ys, 0, 16) != NRT_SUCCESS || memcmp(xs, ys, 16) != 0) {
            bad++;
        }
    }
    nrt_tensor_free(&x);
    nrt_tensor_free(&y);
    nrt_destroy_tensor_set(&in);
    nrt_destroy_tensor_set(&out);
    return (void *)(intptr_t)bad;
}

static void sync_tour(void) {
    uint32_t n = 0;
    OK(nrt_get_visible_vnc_count(&n));
    TRUE(n >= 1);
    OK(nrt_get_visible_nc_count(&n));
    OK(nrt_get_total_nc_count(&n));
    OK(nrt_get_model_vnc_count(model, &n));
    TRUE(n == 1);
    OK(nrt_get_model_nc_count(model, &n));
    TRUE(n == 1);
    nrt_model_info_t mi = {99};
    size_t got = 0;
    OK(nrt_get_model_info(model, &mi, sizeof mi, &got));
    TRUE(mi.vnc == 0 && got == sizeof mi);

    /* Versioned structs: only the first `size` bytes are written. */
    nrt_vnc_memory_stats_t st = {0, 0};
    OK(nrt_get_vnc_memory_stats(0, &st, sizeof st, &got));
    TRUE(got == sizeof st && st.bytes_used > 0 && st.bytes_limit >= st.bytes_used);
    nrt_vnc_memory_stats_t half = {0, 12345};
    OK(nrt_get_vnc_memory_stats(0, &half, sizeof(size_t), &got));
    TRUE(got == sizeof(size_t) && half.bytes_used > 0 && half.bytes_limit == 12345);
    EXPECT(nrt_get_vnc_memory_stats(7, &st, sizeof st, NULL), NRT_INVALID);
    nrt_version_t v;
    memset(&v, 0xAB, sizeof v);
    OK(nrt_get_version(&v, sizeof(uint64_t)));
    TRUE(v.rt_major == 2 && v.rt_minor == 0xABABABABABABABABull);

    /* Memset, copy, va, device allocation info. */
    nrt_tensor_t *a = NULL, *b = NULL, *h = NULL;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 32, "a", &a));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 32, "b", &b));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, 0, 32, "h", &h));
    unsigned char bytes[32];
    OK(nrt_tensor_read(a, bytes, 0, 32));
    TRUE(bytes[0] == 0 && bytes[31] == 0); /* zero-filled */
    OK(nrt_tensor_memset(a, 8, 0x1FF, 16)); /* value converts to unsigned char 0xFF */
    OK(nrt_tensor_read(a, bytes, 0, 32));
    TRUE(bytes[7] == 0 && bytes[8] == 0xFF && bytes[23] == 0xFF && bytes[24] == 0);
    OK(nrt_tensor_copy(a, 8, b, 0, 16));
    OK(nrt_tensor_copy(b, 0, h, 16, 16));
    OK(nrt_tensor_read(h, bytes, 0, 32));
    TRUE(bytes[15] == 0 && bytes[16] == 0xFF && bytes[31] == 0xFF);
    EXPECT(nrt_tensor_copy(a, 30, b, 0, 4), NRT_INVALID); /* out of range */
    unsigned char *va = nrt_tensor_get_va(a);
    TRUE(va != NULL && va[8] == 0xFF);
    va[0] = 0x42;
    OK(nrt_tensor_read(a, bytes, 0, 1));
    TRUE(bytes[0] == 0x42);
    nrt_tensor_device_allocation_info_t ai = {0, 0, -1};
    OK(nrt_tensor_get_device_allocation_info(a, &ai));
    TRUE(ai.size == 32 && ai.physical_address != 0 && ai.hbm_index == 0);
    EXPECT(nrt_tensor_get_device_allocation_info(h, &ai), NRT_INVALID);
    TRUE(nrt_tensor_get_size(h) == 32);

    /* nrt_memcpy_to_device: into a device tensor's memory, by address. */
    const unsigned char src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    OK(nrt_memcpy_to_device(va + 20, src, 8));
    OK(nrt_tensor_read(a, bytes, 0, 32));
    TRUE(bytes[19] == 0xFF && bytes[20] == 1 && bytes[27] == 8 && bytes[28] == 0);
    EXPECT(nrt_memcpy_to_device(va + 28, src, 8), NRT_INVALID); /* runs past the tensor */
    EXPECT(nrt_memcpy_to_device((void *)src, src, 8), NRT_INVALID); /* not device memory */
    EXPECT(nrt_memcpy_to_device(nrt_tensor_get_va(h), src, 8), NRT_INVALID); /* host tensor */
    EXPECT(nrt_memcpy_to_device(NULL, src, 8), NRT_INVALID);
    EXPECT(nrt_memcpy_to_device(va, NULL, 8), NRT_INVALID);
    OK(nrt_memcpy_to_device(va, NULL, 0));
    OK(nrt_tensor_read(a, bytes, 0, 32));
    TRUE(bytes[0] == 0x42 && bytes[20] == 1); /* the refused calls changed nothing */
    uint32_t instances = 0;
    OK(nrt_get_model_instance_count(model, &instances));
    TRUE(instances == 1);

    /* Batches. */
    float w0[2] = {1, 2}, w1[2] = {3, 4}, r[4] = {0};
    nrt_tensor_batch_op_t wops[2] = {{0, 8, w0}, {24, 8, w1}};
    nrt_tensor_batch_op_t rops[2] = {{0, 8, &r[0]}, {24, 8, &r[2]}};
    nrt_tensor_batch_t wb[2] = {{a, wops, 2}, {h, wops, 1}};
    nrt_tensor_batch_t rb[1] = {{a, rops, 2}};
    OK(nrt_tensor_write_batch(wb, 2, false));
    OK(nrt_tensor_read_batch(rb, 1, true));
    TRUE(r[0] == 1 && r[1] == 2 && r[2] == 3 && r[3] == 4);
    nrt_tensor_batch_op_t bad_op = {30, 8, w0};
    nrt_tensor_batch_t bad_b = {a, &bad_op, 1};
    EXPECT(nrt_tensor_write_batch(&bad_b, 1, false), NRT_INVALID);
    OK(nrt_tensor_write_batch(NULL, 0, false)); /* nothing to do */

    /* Slices: a view of a's second half, used as a model input. */
    nrt_tensor_t *s = NULL;
    OK(nrt_tensor_allocate_slice(a, 16, 16, "x", &s));
    TRUE(nrt_tensor_get_size(s) == 16);
    EXPECT(nrt_tensor_allocate_slice(a, 24, 16, "x", &s), NRT_INVALID);
    float xs[4] = {9, 8, 7, 6}, ys[4] = {0};
    OK(nrt_tensor_write(s, xs, 0, 16));
    OK(nrt_tensor_read(a, r, 16, 16));
    TRUE(memcmp(r, xs, 16) == 0); /* the slice writes its parent */
    run_with_input(s, ys, __LINE__);
    TRUE(memcmp(xs, ys, 16) == 0);
    nrt_tensor_free(&a); /* the slice keeps its parent's memory */
    OK(nrt_tensor_read(s, r, 0, 16));
    TRUE(memcmp(r, xs, 16) == 0);

    /* An empty tensor with an attached host buffer, as a model input (sync mode clones host
     * tensors). */
    nrt_tensor_t *e = NULL;
    OK(nrt_tensor_allocate_empty("x", &e));
    TRUE(nrt_tensor_get_va(e) == NULL);
    float user[4] = {0.5f, -1, 2, 1e6f};
    OK(nrt_tensor_attach_buffer(e, user, sizeof user));
    TRUE(nrt_tensor_get_va(e) == (void *)user && nrt_tensor_get_size(e) == 16);
    run_with_input(e, ys, __LINE__);
    TRUE(memcmp(user, ys, 16) == 0);
    EXPECT(nrt_tensor_attach_buffer(b, user, sizeof user), NRT_INVALID); /* not an empty tensor */

    /* Output completion counts (the model reports y final once per execution). */
    nrt_tensor_t *x = NULL, *y = NULL;
    nrt_tensor_set_t *in = NULL, *out = NULL;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &x));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "y", &y));
    OK(nrt_allocate_tensor_set(&in));
    OK(nrt_allocate_tensor_set(&out));
    OK(nrt_add_tensor_to_tensor_set(in, "x", x));
    OK(nrt_add_tensor_to_tensor_set(out, "y", y));
    OK(nrt_execute(model, in, out));
    OK(nrt_execute_repeat(model, in, out, 1));
    OK(nrt_tensor_check_output_completion(y, 1000000, 2));
    EXPECT(nrt_tensor_check_output_completion(y, 1000, 3), NRT_TIMEOUT);
    OK(nrt_tensor_reset_output_completion(y));
    EXPECT(nrt_tensor_check_output_completion(y, 0, 1), NRT_TIMEOUT);
    OK(nrt_execute(model, in, out));
    OK(nrt_tensor_check_output_completion(y, -1, 1)); /* unbounded wait, already reached */

    /* NRT 3.0: a copy on the tensor-op unit; a per-sequence eventfd registered while the
     * execution may still be pending. */
    NRT_STATUS ret = NRT_FAILURE;
    nrta_seq_t seq = 0, last = 0;
    OK(nrta_tensor_copy(x, 0, y, 0, 16, 0, 0, &ret, &seq));
    TRUE(ret == NRT_SUCCESS && NRTA_SEQ_GET_XU_ID(seq) == NRTA_XU_TENSOR_OP);
    OK(nrta_get_sequence(0, NRTA_XU_TENSOR_OP, 0, &last));
    TRUE(last == seq);
    EXPECT(nrta_get_sequence(0, NRTA_XU_COLLECTIVES, 0, &last), NRT_INVALID);
    int efd = eventfd(0, EFD_CLOEXEC);
    ret = NRT_FAILURE;
    OK(nrta_execute_schedule(model, in, out, 0, &ret, &seq));
    OK(nrta_event_register_seq_id_completion(seq, efd));
    struct pollfd p = {.fd = efd, .events = POLLIN};
    TRUE(poll(&p, 1, 5000) == 1);
    uint64_t cnt = 0;
    TRUE(read(efd, &cnt, sizeof cnt) == sizeof cnt && cnt == 1);
    bool done = false;
    OK(nrta_is_completed(seq, &done));
    TRUE(done && ret == NRT_SUCCESS);
    close(efd);

    /* No implicit async here: registering a callback is refused. */
    EXPECT(nrt_register_async_exec_callback(on_done, NULL), NRT_INVALID);

    /* Threads. */
    pthread_t th[4];
    for (intptr_t i = 0; i < 4; i++) {
        pthread_create(&th[i], NULL, worker, (void *)i);
    }
    for (int i = 0; i < 4; i++) {
        void *bad = NULL;
        pthread_join(th[i], &bad);
        TRUE(bad == NULL);
    }

    nrt_tensor_free(&b);
    nrt_tensor_free(&h);
    nrt_tensor_free(&s);
    nrt_tensor_free(&e);
    nrt_tensor_free(&x);
    nrt_tensor_free(&y);
    nrt_destroy_tensor_set(&in);
    nrt_destroy_tensor_set(&out);
}

/* ---- profiling and tracing ---- */
/* Occurrences of `needle` in the file at `path`. */
static int count_in_file(const char *path, const char *needle) {
    size_t n = 0;
    char *text = read_file(path, &n);
    char *z = realloc(text, n + 1);
    if (z == NULL) {
        free(text);
        return -1;
    }
    z[n] = 0;
    int count = 0;
    for (const char *p = strstr(z, needle); p != NULL; p = strstr(p + 1, needle)) {
        count++;
    }
    free(z);
    return count;
}

static void profile_tour(void) {
    nrt_tensor_t *x = NULL;
    float y[4];
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &x));
    EXPECT(nrt_profile_stop("none.json"), NRT_INVALID); /* nothing in progress */
    EXPECT(nrt_profile_start(NULL, "p.json"), NRT_INVALID);
    EXPECT(nrt_profile_start(model, NULL), NRT_INVALID);
    OK(nrt_profile_start(model, "profile.json"));
    EXPECT(nrt_profile_start(model, "again.json"), NRT_INVALID); /* one at a time */
    EXPECT(nrt_trace_start(false), NRT_INVALID);
    for (int i = 0; i < 3; i++) {
        run_with_input(x, y, __LINE__);
    }
    EXPECT(nrt_trace_stop("t.json"), NRT_INVALID);                      /* not a trace */
    EXPECT(nrt_profile_stop("/nonexistent-dir/p.json"), NRT_FAILURE);  /* the profile goes on */
    OK(nrt_profile_stop(NULL));                                         /* the start's file */
    TRUE(count_in_file("profile.json", "\"traceEvents\"") == 1);
    TRUE(count_in_file("profile.json", "\"name\":\"harvest\"") == 3); /* 3 executions */
    /* 5 host stages and 5 device engines each */
    TRUE(count_in_file("profile.json", "\"model_name\":\"near-null\"") == 30);
    TRUE(count_in_file("profile.json", "\"cat\":\"engine\"") == 15);
    TRUE(count_in_file("profile.json", "\"name\":\"device core 0 engine SP\"") == 1);
    EXPECT(nrt_profile_stop(NULL), NRT_INVALID); /* ended */

    OK(nrt_trace_start(true));
    run_with_input(x, y, __LINE__);
    EXPECT(nrt_trace_stop(NULL), NRT_INVALID);
    OK(nrt_trace_stop("trace.json"));
    TRUE(count_in_file("trace.json", "\"name\":\"doorbell\"") == 1);
    EXPECT(nrt_trace_stop("trace.json"), NRT_INVALID);
    nrt_tensor_free(&x);
}

/* ---- implicit async ---- */
static atomic_int callbacks = 0, callback_failures = 0;
static atomic_ullong last_job = 0;

static void on_done(void *params, uint32_t model_id, uint32_t vnc, uint64_t job_id, NRT_STATUS status) {
    if (params != (void *)&callbacks || status != NRT_SUCCESS || vnc != 0 || model_id == 0) {
        atomic_fetch_add(&callback_failures, 1);
    }
    unsigned long long prev = atomic_exchange(&last_job, job_id);
    if (job_id <= prev) {
        atomic_fetch_add(&callback_failures, 1); /* job ids increase */
    }
    atomic_fetch_add(&callbacks, 1);
}

static void implicit_tour(void) {
    OK(nrt_register_async_exec_callback(on_done, (void *)&callbacks));
    nrt_tensor_t *x = NULL, *y = NULL, *hx = NULL;
    nrt_tensor_set_t *in = NULL, *out = NULL, *hin = NULL;
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &x));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "y", &y));
    OK(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_HOST, 0, 16, "x", &hx));
    OK(nrt_allocate_tensor_set(&in));
    OK(nrt_allocate_tensor_set(&out));
    OK(nrt_allocate_tensor_set(&hin));
    OK(nrt_add_tensor_to_tensor_set(in, "x", x));
    OK(nrt_add_tensor_to_tensor_set(out, "y", y));
    OK(nrt_add_tensor_to_tensor_set(hin, "x", hx));
    float xs[4] = {1, 2, 3, 4}, ys[4] = {0};
    OK(nrt_tensor_write(x, xs, 0, 16));
    const int n = 100;
    int queue_full = 0;
    for (int i = 0; i < n; i++) {
        /* Queued: returns before completion; NRT_QUEUE_FULL at the in-flight cap. */
        NRT_STATUS st;
        while ((st = nrt_execute(model, in, out)) == NRT_QUEUE_FULL) {
            queue_full++;
            sched_yield();
        }
        OK(st);
    }
    printf("implicit: %d executions queued (%d NRT_QUEUE_FULL retries)\n", n, queue_full);
    OK(nrt_async_drain_queued_execs(-1));
    TRUE(atomic_load(&callbacks) == n);
    TRUE(atomic_load(&callback_failures) == 0);
    OK(nrt_tensor_read(y, ys, 0, 16));
    TRUE(memcmp(xs, ys, 16) == 0);
    EXPECT(nrt_execute(model, hin, out), NRT_INVALID); /* async mode: device tensors only */
    OK(nrt_async_drain_queued_execs(0));
    EXPECT(nrt_async_drain_queued_execs(9), NRT_INVALID);
    nrt_tensor_free(&x);
    nrt_tensor_free(&y);
    nrt_tensor_free(&hx);
    nrt_destroy_tensor_set(&in);
    nrt_destroy_tensor_set(&out);
    nrt_destroy_tensor_set(&hin);
}

int main(int argc, char **argv) {
    if (argc != 3 || (strcmp(argv[2], "sync") != 0 && strcmp(argv[2], "implicit") != 0)) {
        fprintf(stderr, "usage: %s MODEL.ncm sync|implicit\n", argv[0]);
        return 2;
    }
    size_t size = 0;
    void *bytes = read_file(argv[1], &size);
    OK(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));
    OK(nrt_load(bytes, size, 0, -1, &model));
    free(bytes);
    if (strcmp(argv[2], "sync") == 0) {
        sync_tour();
        profile_tour();
    } else {
        implicit_tour();
    }
    OK(nrt_unload(model));
    nrt_close();
    if (failures != 0) {
        fprintf(stderr, "api_tour: %d of %d checks failed\n", atomic_load(&failures), atomic_load(&checks));
        return 1;
    }
    printf("api_tour %s: ok (%d checks)\n", argv[2], atomic_load(&checks));
    return 0;
}
