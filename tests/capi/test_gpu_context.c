/* GPU test (ctest label "gpu"): a CUDA context on device 0. Exits 77 — reported by ctest as
 * SKIPPED, never as passed — when no usable GPU is present.
 *
 * Issue 41 (item 2): context creation and wush_linear_create allocate and copy; in a thread's
 * default (global) capture mode cudaMalloc, and any work on the legacy stream, invalidate another
 * thread's global-mode graph capture (PyTorch captures so). A second thread holds such a capture
 * open, on a blocking stream (which the legacy stream synchronizes with), while this thread
 * creates a context and prepares a layer; the capture must still end successfully. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "wush/wush.h"

enum { D_IN = 256, D_OUT = 64 };

/* The capturing thread and this one take turns: 1 = capture begun, 2 = context work done. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int phase;
    cudaError_t begin, end;
    int graph_made;
} Capture;

static void set_phase(Capture* c, int phase) {
    pthread_mutex_lock(&c->mu);
    c->phase = phase;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void wait_phase(Capture* c, int phase) {
    pthread_mutex_lock(&c->mu);
    while (c->phase < phase) pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

static void* capture_thread(void* arg) {
    Capture* c = (Capture*)arg;
    cudaStream_t s = NULL;
    void* buf = NULL;
    cudaGraph_t graph = NULL;
    c->begin = cudaMalloc(&buf, 256);
    if (c->begin == cudaSuccess) c->begin = cudaStreamCreate(&s); /* blocking */
    if (c->begin == cudaSuccess) c->begin = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    if (c->begin == cudaSuccess) c->begin = cudaMemsetAsync(buf, 0, 256, s);
    set_phase(c, 1);
    wait_phase(c, 2);
    if (c->begin == cudaSuccess) {
        c->end = cudaStreamEndCapture(s, &graph);
        c->graph_made = graph != NULL;
        if (graph) cudaGraphDestroy(graph);
    }
    if (s) cudaStreamDestroy(s);
    cudaFree(buf);
    return NULL;
}

/* What this thread makes during the other thread's capture. Released only after the capture has
 * ended: destruction frees device memory, which is not what this test is about. */
typedef struct {
    wush_context *cpu, *gpu;
    wush_transform* t;
    wush_qweight* w;
    wush_linear* lin;
} Objects;

static void release(Objects* o) {
    wush_linear_destroy(o->lin);
    wush_qweight_destroy(o->w);
    wush_transform_destroy(o->t);
    wush_context_destroy(o->gpu);
    wush_context_destroy(o->cpu);
}

/* Creates a context and prepares one layer while the other thread captures; 0 on success. */
static int context_work_during_capture(Objects* o) {
    static float weight[D_OUT * D_IN];
    size_t i;
    int ok;
    for (i = 0; i < D_OUT * D_IN; ++i) weight[i] = (float)((int)(i * 37u % 101u) - 50) / 25.0f;
    ok = wush_context_create(WUSH_BACKEND_CPU, 0, &o->cpu) == WUSH_OK &&
         wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D_IN, 32, NULL, &o->t) == WUSH_OK &&
         wush_qweight_create(o->cpu, o->t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, weight, D_OUT, D_IN,
                             NULL, &o->w) == WUSH_OK &&
         wush_context_create(WUSH_BACKEND_CUDA, 0, &o->gpu) == WUSH_OK &&
         wush_linear_create(o->gpu, o->t, o->w, &o->lin) == WUSH_OK;
    if (!ok) fprintf(stderr, "context work during a capture failed: %s\n", wush_last_error());
    return ok ? 0 : 1;
}

static int capture_survives_context_work(void) {
    Capture c;
    Objects o;
    pthread_t th;
    int failed;
    memset(&c, 0, sizeof c);
    memset(&o, 0, sizeof o);
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    if (pthread_create(&th, NULL, capture_thread, &c) != 0) return 1;
    wait_phase(&c, 1);
    failed = c.begin != cudaSuccess ? 1 : 0;
    if (failed) fprintf(stderr, "the capture did not begin: %s\n", cudaGetErrorString(c.begin));
    if (!failed) failed = context_work_during_capture(&o);
    set_phase(&c, 2);
    pthread_join(th, NULL);
    release(&o);
    if (!failed && (c.end != cudaSuccess || !c.graph_made)) {
        fprintf(stderr, "the other thread's global capture was invalidated: %s\n", cudaGetErrorString(c.end));
        failed = 1;
    }
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    return failed;
}

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
    if (capture_survives_context_work() != 0) return 1;
    printf("gpu context: OK\n");
    return 0;
}
