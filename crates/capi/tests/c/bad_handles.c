/* bad_handles.c — misuse of the C API: NULL and stale handles, handles of the wrong kind,
 * garbage pointers, calls before nrt_init and after nrt_close, init twice, init after
 * close. Every misuse must return its documented status (never crash), and the next good
 * call must work. Run by tests/bad_handles.rs with the near-null model (y = x, f32[1,4]).
 *
 *   bad_handles MODEL.ncm      (exit 0 and "bad_handles: ok" when every check passed) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nrt/nrt.h"
#include "nrt/nrt_async.h"
#include "nrt/nrt_experimental.h"
#include "nrt/nrt_version.h"

#define CHECK_PROGRAM "bad_handles"
#include "checks.h"


/* Writes x, executes, checks y == x. */
static void good_execute(nrt_model_t *model, nrt_tensor_t *x, nrt_tensor_t *y, nrt_tensor_set_t *in,
                         nrt_tensor_set_t *out, float seed, int line) {
    float xs[4] = {seed, seed + 1, seed + 2, seed + 3}, ys[4] = {0};
    expect_status("nrt_tensor_write(x)", nrt_tensor_write(x, xs, 0, sizeof xs), NRT_SUCCESS, line);
    expect_status("nrt_execute(good)", nrt_execute(model, in, out), NRT_SUCCESS, line);
    expect_status("nrt_tensor_read(y)", nrt_tensor_read(y, ys, 0, sizeof ys), NRT_SUCCESS, line);
    expect_true("y == x", memcmp(xs, ys, sizeof xs) == 0, line);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.ncm\n", argv[0]);
        return 2;
    }
    size_t size = 0;
    void *bytes = read_file(argv[1], &size);
    nrt_model_t *model = NULL;
    nrt_tensor_t *x = NULL, *y = NULL;
    nrt_tensor_set_t *in = NULL, *out = NULL;
    uint32_t count = 0;
    bool done = false;
    float buf[4] = {0};

    /* ---- before nrt_init ---- */
    EXPECT(nrt_get_total_vnc_count(&count), NRT_SUCCESS);
    TRUE(count >= 1);
    EXPECT(nrt_get_visible_vnc_count(&count), NRT_SUCCESS);
    TRUE(count >= 1);
    EXPECT(nrt_get_total_nc_count(NULL), NRT_INVALID);
    nrt_version_t ver;
    memset(&ver, 0, sizeof ver);
    EXPECT(nrt_get_version(&ver, sizeof ver), NRT_SUCCESS);
    TRUE(ver.rt_major == 2 && strstr(ver.rt_detail, "nrt-rs") != NULL);
    TRUE(strcmp(nrt_get_status_as_str(NRT_CLOSED), "NRT_CLOSED") == 0);
    TRUE(strcmp(nrt_get_status_as_str((NRT_STATUS)12345), "NRT_UNKNOWN_STATUS") == 0);
    EXPECT(nrt_load(bytes, size, -1, -1, &model), NRT_UNINITIALIZED);
    TRUE(model == NULL);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &x), NRT_UNINITIALIZED);
    EXPECT(nrt_allocate_tensor_set(&in), NRT_UNINITIALIZED);
    EXPECT(nrt_execute(model, in, out), NRT_UNINITIALIZED);
    EXPECT(nrta_is_completed(1, &done), NRT_UNINITIALIZED);
    nrt_instance_info_t inst;
    EXPECT(nrt_get_instance_info(&inst, sizeof inst), NRT_UNINITIALIZED);
    nrt_close(); /* before init: a logged no-op */

    /* ---- init, twice ---- */
    EXPECT(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""), NRT_SUCCESS);
    EXPECT(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""), NRT_FAILURE); /* the first runtime is kept */
    EXPECT(nrt_get_instance_info(&inst, sizeof inst), NRT_SUCCESS);
    TRUE(inst.family == NRT_INSTANCE_UNKNOWN && inst.size == NRT_INSTANCE_SIZE_UNKNOWN);
    TRUE(strlen(inst.arch_name) > 0);
    EXPECT(nrt_load(bytes, size, -1, -1, &model), NRT_SUCCESS);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &x), NRT_SUCCESS);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "y", &y), NRT_SUCCESS);
    EXPECT(nrt_allocate_tensor_set(&in), NRT_SUCCESS);
    EXPECT(nrt_allocate_tensor_set(&out), NRT_SUCCESS);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", x), NRT_SUCCESS);
    EXPECT(nrt_add_tensor_to_tensor_set(out, "y", y), NRT_SUCCESS);
    good_execute(model, x, y, in, out, 1.0f, __LINE__);

    /* ---- NULL arguments ---- */
    nrt_model_t *m2 = NULL;
    EXPECT(nrt_load(NULL, size, -1, -1, &m2), NRT_INVALID);
    EXPECT(nrt_load(bytes, size, -1, -1, NULL), NRT_INVALID);
    EXPECT(nrt_load(bytes, 0, -1, -1, &m2), NRT_INVALID);
    EXPECT(nrt_load("garbage", 7, -1, -1, &m2), NRT_INVALID);
    EXPECT(nrt_load(bytes, size, 99, -1, &m2), NRT_LOAD_NOT_ENOUGH_NC);
    TRUE(m2 == NULL);
    EXPECT(nrt_execute(NULL, in, out), NRT_INVALID);
    EXPECT(nrt_execute(model, NULL, out), NRT_INVALID);
    EXPECT(nrt_execute(model, in, NULL), NRT_INVALID);
    EXPECT(nrt_unload(NULL), NRT_INVALID);
    nrt_tensor_t *t = NULL;
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "t", NULL), NRT_INVALID);
    EXPECT(nrt_tensor_allocate((nrt_tensor_placement_t)7, 0, 16, "t", &t), NRT_INVALID);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 42, 16, "t", &t), NRT_INVALID);
    TRUE(t == NULL);
    EXPECT(nrt_tensor_read(NULL, buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_read(x, NULL, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_write(NULL, buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_write(x, NULL, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_write(x, buf, 12, 8), NRT_INVALID); /* past the end */
    EXPECT(nrt_tensor_copy(NULL, 0, y, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_copy(x, 0, NULL, 0, 4), NRT_INVALID);
    EXPECT(nrt_tensor_memset(NULL, 0, 0, 4), NRT_INVALID);
    TRUE(nrt_tensor_get_size(NULL) == 0);
    TRUE(nrt_tensor_get_va(NULL) == NULL);
    EXPECT(nrt_tensor_check_output_completion(NULL, 0, 1), NRT_INVALID);
    EXPECT(nrt_tensor_reset_output_completion(NULL), NRT_INVALID);
    EXPECT(nrt_tensor_get_device_allocation_info(x, NULL), NRT_INVALID);
    EXPECT(nrt_tensor_allocate_slice(NULL, 0, 4, "s", &t), NRT_INVALID);
    EXPECT(nrt_tensor_attach_buffer(NULL, buf, sizeof buf), NRT_INVALID);
    EXPECT(nrt_allocate_tensor_set(NULL), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(NULL, "x", x), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(in, NULL, x), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", NULL), NRT_INVALID);
    EXPECT(nrt_get_tensor_from_tensor_set(NULL, "x", &t), NRT_INVALID);
    EXPECT(nrt_get_tensor_from_tensor_set(in, "x", NULL), NRT_INVALID);
    nrt_destroy_tensor_set(NULL); /* logged, harmless */
    nrt_tensor_free(NULL);        /* logged, harmless */
    nrt_tensor_t *null_tensor = NULL;
    nrt_tensor_free(&null_tensor); /* free(NULL)-like: nothing */
    EXPECT(nrt_get_model_tensor_info(model, NULL), NRT_INVALID);
    nrt_tensor_info_array_t *info = NULL;
    EXPECT(nrt_get_model_tensor_info(NULL, &info), NRT_INVALID);
    EXPECT(nrt_free_model_tensor_info(NULL), NRT_INVALID);
    EXPECT(nrt_get_model_vnc_count(model, NULL), NRT_INVALID);
    EXPECT(nrt_get_model_info(NULL, NULL, 0, NULL), NRT_INVALID);
    EXPECT(nrt_get_vnc_memory_stats(0, NULL, 0, NULL), NRT_INVALID);
    EXPECT(nrt_register_async_exec_callback(NULL, NULL), NRT_INVALID);
    EXPECT(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, NULL, NULL), NRT_FAILURE); /* NULL strings ok; still twice */
    NRT_STATUS ret = NRT_SUCCESS;
    nrta_seq_t seq = 0;
    EXPECT(nrta_execute_schedule(model, in, out, 0, &ret, NULL), NRT_INVALID);
    EXPECT(nrta_execute_schedule(NULL, in, out, 0, &ret, &seq), NRT_INVALID);
    TRUE(ret == NRT_INVALID); /* a failed schedule also reports through *ret */
    EXPECT(nrta_execute_schedule(model, in, out, 1, &ret, &seq), NRT_INVALID); /* queue must be 0 */
    EXPECT(nrta_tensor_read(NULL, x, 0, 16, 0, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(NULL, buf, 0, 16, 0, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_copy(x, 0, NULL, 0, 16, 0, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_tensor_write(x, buf, 0, 16, -1, 0, &ret, &seq), NRT_INVALID);
    EXPECT(nrta_is_completed(0x1000000000001ull, NULL), NRT_INVALID);
    EXPECT(nrta_is_completed(0x10000000003e8ull, &done), NRT_INVALID); /* never issued */
    EXPECT(nrta_get_sequence(0, (nrta_xu_t)7, 0, &seq), NRT_INVALID);
    EXPECT(nrta_get_sequence(0, NRTA_XU_COMPUTE, 0, NULL), NRT_INVALID);
    EXPECT(nrta_event_register_xu_completion(0, NRTA_XU_COMPUTE, 0, -5), NRT_INVALID);
    good_execute(model, x, y, in, out, 2.0f, __LINE__);

    /* ---- handles of the wrong kind, garbage pointers ---- */
    int local = 0;
    EXPECT(nrt_execute((nrt_model_t *)x, in, out), NRT_INVALID);
    EXPECT(nrt_execute(model, (nrt_tensor_set_t *)x, out), NRT_INVALID);
    EXPECT(nrt_tensor_read((nrt_tensor_t *)in, buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_read((nrt_tensor_t *)model, buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_read((nrt_tensor_t *)&local, buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_tensor_read((nrt_tensor_t *)((char *)x + 1), buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_unload((nrt_model_t *)(uintptr_t)0x1234), NRT_INVALID);
    EXPECT(nrt_unload((nrt_model_t *)in), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", (nrt_tensor_t *)out), NRT_INVALID);
    good_execute(model, x, y, in, out, 3.0f, __LINE__);

    /* ---- tensor sets: unknown name, replace ---- */
    nrt_tensor_t *sentinel = (nrt_tensor_t *)(uintptr_t)0xdeadbeef, *got = sentinel;
    EXPECT(nrt_get_tensor_from_tensor_set(in, "no_such_tensor", &got), NRT_FAILURE);
    TRUE(got == sentinel); /* nothing written */
    EXPECT(nrt_get_tensor_from_tensor_set(in, "x", &got), NRT_SUCCESS);
    TRUE(got == x);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "extra", y), NRT_SUCCESS); /* names need not match */
    EXPECT(nrt_get_tensor_from_tensor_set(in, "extra", &got), NRT_SUCCESS);
    TRUE(got == y);
    good_execute(model, x, y, in, out, 4.0f, __LINE__);

    /* ---- a freed tensor: the nulled pointer, and a stale copy ---- */
    nrt_tensor_t *tmp = NULL;
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "tmp", &tmp), NRT_SUCCESS);
    nrt_tensor_t *stale = tmp;
    nrt_tensor_free(&tmp);
    TRUE(tmp == NULL);
    EXPECT(nrt_tensor_read(tmp, buf, 0, sizeof buf), NRT_INVALID);   /* NULL */
    EXPECT(nrt_tensor_read(stale, buf, 0, sizeof buf), NRT_INVALID); /* stale copy */
    EXPECT(nrt_tensor_write(stale, buf, 0, sizeof buf), NRT_INVALID);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", stale), NRT_INVALID);
    TRUE(nrt_tensor_get_size(stale) == 0);
    TRUE(nrt_tensor_get_va(stale) == NULL);
    nrt_tensor_t *stale2 = stale;
    nrt_tensor_free(&stale2); /* double free through a copy: logged, nulled, harmless */
    TRUE(stale2 == NULL);
    EXPECT(nrt_tensor_read(x, buf, 0, sizeof buf), NRT_SUCCESS); /* the next good call */

    /* A tensor freed while a set still holds it: the set keeps its bytes. */
    nrt_tensor_t *x2 = NULL;
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x2", &x2), NRT_SUCCESS);
    float sevens[4] = {7, 7, 7, 7};
    EXPECT(nrt_tensor_write(x2, sevens, 0, sizeof sevens), NRT_SUCCESS);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", x2), NRT_SUCCESS); /* replaces x */
    nrt_tensor_t *x2_copy = x2;
    nrt_tensor_free(&x2);
    EXPECT(nrt_execute(model, in, out), NRT_SUCCESS);
    EXPECT(nrt_tensor_read(y, buf, 0, sizeof buf), NRT_SUCCESS);
    TRUE(memcmp(buf, sevens, sizeof buf) == 0);
    EXPECT(nrt_get_tensor_from_tensor_set(in, "x", &got), NRT_SUCCESS);
    TRUE(got == x2_copy);                                           /* the handle that was added */
    EXPECT(nrt_tensor_read(got, buf, 0, sizeof buf), NRT_INVALID); /* ...which is stale now */
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", x), NRT_SUCCESS);
    good_execute(model, x, y, in, out, 5.0f, __LINE__);

    /* ---- a destroyed set ---- */
    nrt_tensor_set_t *set2 = NULL;
    EXPECT(nrt_allocate_tensor_set(&set2), NRT_SUCCESS);
    nrt_tensor_set_t *set2_copy = set2;
    nrt_destroy_tensor_set(&set2);
    TRUE(set2 == NULL);
    EXPECT(nrt_add_tensor_to_tensor_set(set2_copy, "x", x), NRT_INVALID);
    EXPECT(nrt_execute(model, set2_copy, out), NRT_INVALID);
    nrt_destroy_tensor_set(&set2_copy); /* twice: logged, nulled */
    TRUE(set2_copy == NULL);

    /* ---- tensor info freed twice ---- */
    EXPECT(nrt_get_model_tensor_info(model, &info), NRT_SUCCESS);
    TRUE(info->tensor_count == 2);
    TRUE(info->tensor_array[0].dtype == NRT_DTYPE_FLOAT32 && info->tensor_array[0].ndim == 2);
    EXPECT(nrt_free_model_tensor_info(info), NRT_SUCCESS);
    EXPECT(nrt_free_model_tensor_info(info), NRT_INVALID);

    /* ---- unload twice; the stale model ---- */
    EXPECT(nrt_load(bytes, size, -1, -1, &m2), NRT_SUCCESS);
    nrt_model_t *m2_copy = m2;
    EXPECT(nrt_unload(m2), NRT_SUCCESS);
    EXPECT(nrt_unload(m2_copy), NRT_INVALID);
    EXPECT(nrt_execute(m2_copy, in, out), NRT_INVALID);
    EXPECT(nrt_get_model_tensor_info(m2_copy, &info), NRT_INVALID);
    EXPECT(nrta_execute_schedule(m2_copy, in, out, 0, &ret, &seq), NRT_INVALID);

    /* ---- collectives ---- */
    EXPECT(nrt_load_collectives(bytes, size, -1, -1, 1, 2, &m2), NRT_FAILURE);
    EXPECT(nrt_load_collectives(bytes, size, -1, -1, 0, 1, &m2), NRT_SUCCESS); /* single worker */
    EXPECT(nrt_unload(m2), NRT_SUCCESS);
    EXPECT(nrt_execute_repeat(model, in, out, 2), NRT_INVALID);
    EXPECT(nrt_execute_repeat(model, in, out, 1), NRT_SUCCESS);
    good_execute(model, x, y, in, out, 6.0f, __LINE__);

    /* ---- close with things still loaded and allocated ---- */
    nrt_close();
    EXPECT(nrt_execute(model, in, out), NRT_CLOSED);
    EXPECT(nrt_tensor_read(x, buf, 0, sizeof buf), NRT_CLOSED);
    EXPECT(nrt_load(bytes, size, -1, -1, &m2), NRT_CLOSED);
    EXPECT(nrt_allocate_tensor_set(&set2), NRT_CLOSED);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "z", &t), NRT_CLOSED);
    EXPECT(nrta_is_completed(1, &done), NRT_CLOSED);
    EXPECT(nrt_unload(model), NRT_CLOSED);
    EXPECT(nrt_get_total_vnc_count(&count), NRT_SUCCESS); /* still callable */
    TRUE(nrt_tensor_get_size(x) == 0);
    got = NULL;
    EXPECT(nrt_get_tensor_from_tensor_set(in, "x", &got), NRT_SUCCESS); /* cleanup lookups work */
    TRUE(got == x);
    nrt_close(); /* twice: logged no-op */

    /* ---- init after close: a new runtime; the old handles stay dead ---- */
    EXPECT(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""), NRT_SUCCESS);
    EXPECT(nrt_execute(model, in, out), NRT_INVALID);                 /* unloaded by nrt_close */
    EXPECT(nrt_tensor_read(x, buf, 0, sizeof buf), NRT_CLOSED);       /* of the closed runtime */
    nrt_model_t *model2 = NULL;
    EXPECT(nrt_load(bytes, size, -1, -1, &model2), NRT_SUCCESS);
    EXPECT(nrt_execute(model2, in, out), NRT_INVALID);                /* sets hold old tensors */
    nrt_tensor_t *nx = NULL, *ny = NULL;
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "x", &nx), NRT_SUCCESS);
    EXPECT(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, 16, "y", &ny), NRT_SUCCESS);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "x", nx), NRT_SUCCESS);
    EXPECT(nrt_add_tensor_to_tensor_set(in, "extra", nx), NRT_SUCCESS);
    EXPECT(nrt_add_tensor_to_tensor_set(out, "y", ny), NRT_SUCCESS);
    good_execute(model2, nx, ny, in, out, 8.0f, __LINE__);

    /* ---- cleanup (old tensors can still be freed) ---- */
    nrt_tensor_free(&x);
    nrt_tensor_free(&y);
    nrt_tensor_free(&nx);
    nrt_tensor_free(&ny);
    TRUE(x == NULL && y == NULL && nx == NULL && ny == NULL);
    nrt_destroy_tensor_set(&in);
    nrt_destroy_tensor_set(&out);
    EXPECT(nrt_unload(model2), NRT_SUCCESS);
    nrt_close();
    free(bytes);

    if (failures != 0) {
        fprintf(stderr, "bad_handles: %d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("bad_handles: ok (%d checks)\n", checks);
    return 0;
}
