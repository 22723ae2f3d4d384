/*
 * first_app.c — the shape of the Neuron runtime docs' "first application", on libnrt.so.1
 * of nrt-rs (the software NeuronCore).
 *
 *   first_app MODEL.ncm
 *
 * Maps the compiled model, initializes the runtime, loads the model, allocates one DEVICE
 * tensor per input and output, fills every input from a file named after the tensor in the
 * current directory (zeros if there is none), executes once, writes every output to
 * `<name>.out`, then frees everything and closes the runtime.
 *
 * Build: gcc -Iinclude examples/c/first_app.c -Ltarget/release -lnrt \
 *            -Wl,-rpath,$PWD/target/release -o first_app
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nrt/nrt.h"
#include "nrt/nrt_experimental.h"

#define CHECK_STATUS(call)                                                                  \
    do {                                                                                    \
        NRT_STATUS status_ = (call);                                                        \
        if (status_ != NRT_SUCCESS) {                                                       \
            fprintf(stderr, "first_app: %s failed: %s (%d)\n", #call,                       \
                    nrt_get_status_as_str(status_), (int)status_);                          \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

typedef struct {
    void *data;
    size_t size;
} mapped_file_t;

static int map_file(const char *path, mapped_file_t *out) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        return -1;
    }
    out->data = p;
    out->size = (size_t)st.st_size;
    return 0;
}

/* Fills `tensor` from the file `name` (as many bytes as both have), zeros elsewhere. */
static void fill_input(nrt_tensor_t *tensor, const char *name, size_t size) {
    void *buf = calloc(1, size ? size : 1);
    if (buf == NULL) {
        fprintf(stderr, "first_app: out of memory\n");
        exit(1);
    }
    FILE *f = fopen(name, "rb");
    if (f != NULL) {
        size_t n = fread(buf, 1, size, f);
        fclose(f);
        printf("input  %-24s %zu bytes (%zu from file)\n", name, size, n);
    } else {
        printf("input  %-24s %zu bytes (zeros: no file)\n", name, size);
    }
    CHECK_STATUS(nrt_tensor_write(tensor, buf, 0, size));
    free(buf);
}

/* One set holding a new DEVICE tensor for every tensor of `usage`. */
static nrt_tensor_set_t *allocate_tensors(const nrt_tensor_info_array_t *info, nrt_tensor_usage_t usage) {
    nrt_tensor_set_t *set = NULL;
    CHECK_STATUS(nrt_allocate_tensor_set(&set));
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *ti = &info->tensor_array[i];
        if (ti->usage != usage) {
            continue;
        }
        nrt_tensor_t *tensor = NULL;
        CHECK_STATUS(nrt_tensor_allocate(NRT_TENSOR_PLACEMENT_DEVICE, 0, ti->size, ti->name, &tensor));
        if (usage == NRT_TENSOR_USAGE_INPUT) {
            fill_input(tensor, ti->name, ti->size);
        }
        CHECK_STATUS(nrt_add_tensor_to_tensor_set(set, ti->name, tensor));
    }
    return set;
}

static void write_outputs(const nrt_tensor_info_array_t *info, nrt_tensor_set_t *outputs) {
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *ti = &info->tensor_array[i];
        if (ti->usage != NRT_TENSOR_USAGE_OUTPUT) {
            continue;
        }
        nrt_tensor_t *tensor = NULL;
        CHECK_STATUS(nrt_get_tensor_from_tensor_set(outputs, ti->name, &tensor));
        void *buf = malloc(ti->size ? ti->size : 1);
        if (buf == NULL) {
            fprintf(stderr, "first_app: out of memory\n");
            exit(1);
        }
        CHECK_STATUS(nrt_tensor_read(tensor, buf, 0, ti->size));
        char path[NRT_TENSOR_NAME_MAX + 8];
        snprintf(path, sizeof path, "%s.out", ti->name);
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(buf, 1, ti->size, f) != ti->size) {
            fprintf(stderr, "first_app: cannot write %s\n", path);
            exit(1);
        }
        fclose(f);
        printf("output %-24s %zu bytes -> %s\n", ti->name, ti->size, path);
        free(buf);
    }
}

/* Frees every tensor of the set (found by name) and the set. */
static void free_tensors(nrt_tensor_set_t **set, const nrt_tensor_info_array_t *info, nrt_tensor_usage_t usage) {
    for (uint64_t i = 0; i < info->tensor_count; i++) {
        const nrt_tensor_info_t *ti = &info->tensor_array[i];
        if (ti->usage != usage) {
            continue;
        }
        nrt_tensor_t *tensor = NULL;
        CHECK_STATUS(nrt_get_tensor_from_tensor_set(*set, ti->name, &tensor));
        nrt_tensor_free(&tensor);
        if (tensor != NULL) {
            fprintf(stderr, "first_app: nrt_tensor_free did not null the pointer\n");
            exit(1);
        }
    }
    nrt_destroy_tensor_set(set);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.ncm\n", argv[0]);
        return 2;
    }
    mapped_file_t neff;
    if (map_file(argv[1], &neff) != 0) {
        fprintf(stderr, "first_app: cannot map %s\n", argv[1]);
        return 1;
    }

    CHECK_STATUS(nrt_init(NRT_FRAMEWORK_TYPE_NO_FW, "", ""));

    nrt_model_t *model = NULL;
    CHECK_STATUS(nrt_load(neff.data, neff.size, -1, -1, &model));

    nrt_tensor_info_array_t *info = NULL;
    CHECK_STATUS(nrt_get_model_tensor_info(model, &info));
    printf("model %s: %llu tensors\n", argv[1], (unsigned long long)info->tensor_count);

    nrt_tensor_set_t *inputs = allocate_tensors(info, NRT_TENSOR_USAGE_INPUT);
    nrt_tensor_set_t *outputs = allocate_tensors(info, NRT_TENSOR_USAGE_OUTPUT);

    CHECK_STATUS(nrt_execute(model, inputs, outputs));
    write_outputs(info, outputs);

    free_tensors(&inputs, info, NRT_TENSOR_USAGE_INPUT);
    free_tensors(&outputs, info, NRT_TENSOR_USAGE_OUTPUT);
    if (inputs != NULL || outputs != NULL) {
        fprintf(stderr, "first_app: nrt_destroy_tensor_set did not null the pointer\n");
        return 1;
    }
    CHECK_STATUS(nrt_free_model_tensor_info(info));
    CHECK_STATUS(nrt_unload(model));
    nrt_close();
    munmap(neff.data, neff.size);
    printf("first_app: ok\n");
    return 0;
}
