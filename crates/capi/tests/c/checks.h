/* checks.h — what the C test programs share: status and condition checks that count
 * failures instead of stopping, and reading a model file. Define CHECK_PROGRAM (the
 * program's name, printed before each failure) before including it; `check_context` (e.g.
 * a scenario name) is printed after the name when set. */
#ifndef NRT_TEST_CHECKS_H
#define NRT_TEST_CHECKS_H

#include <stdio.h>
#include <stdlib.h>

#include "nrt/nrt.h"

#ifndef CHECK_PROGRAM
#error "define CHECK_PROGRAM before including checks.h"
#endif

static int checks = 0, failures = 0;
static const char *check_context = "";

static void expect_status(const char *what, NRT_STATUS got, NRT_STATUS want, int line) {
    checks++;
    if (got != want) {
        failures++;
        fprintf(stderr, "%s%s%s:%d: %s returned %s (%d), expected %s (%d)\n", CHECK_PROGRAM,
                *check_context ? " " : "", check_context, line, what, nrt_get_status_as_str(got),
                (int)got, nrt_get_status_as_str(want), (int)want);
    }
}

static void expect_true(const char *what, int ok, int line) {
    checks++;
    if (!ok) {
        failures++;
        fprintf(stderr, "%s%s%s:%d: check failed: %s\n", CHECK_PROGRAM, *check_context ? " " : "",
                check_context, line, what);
    }
}

#define EXPECT(call, want) expect_status(#call, (call), (want), __LINE__)
#define TRUE(cond) expect_true(#cond, (cond) ? 1 : 0, __LINE__)

/* The whole file at `path` (exits with status 2 if it cannot be read). */
static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (n < 0 || buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        exit(2);
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

#endif /* NRT_TEST_CHECKS_H */
