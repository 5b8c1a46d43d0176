/* The CUDA backend is a module opened on demand (capi/backend_registry.cpp). Runs on every machine:
 *   1. a CPU context never maps a CUDA library into the process;
 *   2. WUSH_CUDA_MODULE naming a missing file: WUSH_ERR_UNSUPPORTED naming the path and the loader's
 *      reason;
 *   3. a module from another build (argv[1], the fake module): refused, with the reason;
 *   4. argv[2] = "real" (builds with the CUDA backend): the default search finds libwush-cuda.so
 *      beside libwush.so; the context is created (GPU) or refused for want of a device, never for
 *      want of the module; only now is the module mapped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wush/wush.h"

static int failures = 0;

#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      ++failures;                                            \
    }                                                        \
  } while (0)

/* Whether a file whose name contains `needle` is mapped into this process. */
static int mapped(const char* needle) {
    FILE* f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    if (f == NULL) return -1;
    while (!found && fgets(line, sizeof line, f) != NULL) found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static wush_status try_cuda(void) {
    wush_context* ctx = NULL;
    wush_status st = wush_context_create(WUSH_BACKEND_CUDA, 0, &ctx);
    if (st == WUSH_OK) wush_context_destroy(ctx);
    return st;
}

int main(int argc, char** argv) {
    wush_context* cpu = NULL;
    wush_status st;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FAKE_MODULE [real]\n", argv[0]);
        return 2;
    }
    CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &cpu) == WUSH_OK, "CPU context: %s", wush_last_error());
    wush_context_destroy(cpu);
    CHECK(mapped("libcudart") == 0 && mapped("libcublas") == 0 && mapped("libwush-cuda") == 0,
          "a CUDA library is mapped after a CPU context only");

    setenv("WUSH_CUDA_MODULE", "/nonexistent/libwush-cuda.so", 1);
    st = try_cuda();
    CHECK(st == WUSH_ERR_UNSUPPORTED, "missing module: got %s", wush_status_string(st));
    CHECK(strstr(wush_last_error(), "/nonexistent/libwush-cuda.so") != NULL &&
              strstr(wush_last_error(), "No such file") != NULL,
          "missing module: message lacks the path or the loader's reason: %s", wush_last_error());

    setenv("WUSH_CUDA_MODULE", argv[1], 1);
    st = try_cuda();
    CHECK(st == WUSH_ERR_UNSUPPORTED, "foreign module: got %s", wush_status_string(st));
    CHECK(strstr(wush_last_error(), "not-this-build") != NULL, "foreign module: message does not name its build: %s",
          wush_last_error());
    CHECK(mapped("fake_backend_module") == 0, "the refused module stays mapped");

    if (argc > 2 && strcmp(argv[2], "real") == 0) {
        unsetenv("WUSH_CUDA_MODULE");
        st = try_cuda();
        CHECK(
            st == WUSH_OK || (st == WUSH_ERR_UNSUPPORTED && strstr(wush_last_error(), "no usable CUDA device") != NULL),
            "real module: got %s: %s", wush_status_string(st), wush_last_error());
        CHECK(mapped("libwush-cuda.so") == 1, "the real module is not mapped after a CUDA context was asked for");
        printf("real module: %s%s\n", wush_status_string(st), st == WUSH_OK ? "" : " (no GPU here)");
    }
    if (failures == 0) printf("cuda module: OK\n");
    return failures == 0 ? 0 : 1;
}
