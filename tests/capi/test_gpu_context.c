/* GPU test (ctest label "gpu"): a CUDA context on device 0. Exits 77 — reported by ctest as
 * SKIPPED, never as passed — when no usable GPU is present. */
#include <stdio.h>
#include <string.h>

#include "wush/wush.h"

int main(void) {
    wush_context* ctx = NULL;
    wush_backend backend = WUSH_BACKEND_CPU;
    wush_status st = wush_context_create(WUSH_BACKEND_CUDA, 0, &ctx);
    if (st == WUSH_ERR_UNSUPPORTED) {
        printf("SKIPPED: no CUDA device: %s\n", wush_last_error());
        return 77;
    }
    if (st != WUSH_OK || wush_context_backend(ctx, &backend) != WUSH_OK || backend != WUSH_BACKEND_CUDA) {
        fprintf(stderr, "CUDA context failed: %s: %s\n", wush_status_string(st), wush_last_error());
        return 1;
    }
    /* A device index past the last device is a bad argument, not a crash. */
    {
        wush_context* bad = NULL;
        if (wush_context_create(WUSH_BACKEND_CUDA, 1 << 20, &bad) != WUSH_ERR_INVALID_ARGUMENT) {
            fprintf(stderr, "device 2^20 was not rejected\n");
            return 1;
        }
    }
    wush_context_destroy(ctx);
    printf("gpu context: OK\n");
    return 0;
}
