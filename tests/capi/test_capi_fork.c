/* The CPU runtime in a fork()ed child (Python multiprocessing's default start method): after a
 * 2-thread activation quantization, GEMM, prepared-layer creation and forward in the parent, the
 * child makes the same 2-thread calls. They must finish (alarm() is the watchdog: a runtime whose
 * parallel calls wait for threads that do not exist in the child hangs) and give the parent's
 * bytes, and the child must run them on a helper thread of its own again (on Linux, the child's
 * thread count is read from /proc/self/task), not fall back to one thread for good.
 *
 * Oracle: the parent's results of the same calls (the runtime's results do not depend on the
 * thread count, and the child computes from the same inputs).
 *
 * Then a fork() while another thread is inside a call on a context (a WUSH transform build, held
 * in its progress callback until the child is done), after the forking thread itself ran 2-thread
 * OpenMP regions (calibration, transform builds). In the child, within the watchdog's seconds:
 * calls on that context are refused (WUSH_ERR_INVALID_ARGUMENT naming the fork: its lock is held
 * by a thread the child does not have; they used to wait for it forever), its destroy returns,
 * and a new context runs the runtime (the parent's bytes) and the OpenMP paths (calibration, a
 * WUSH transform build: libgomp's team of the forking thread does not exist in the child, and a
 * 2-thread region used to wait for it forever). The parent's call then finishes normally. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "wush/wush.h"

/* GCC's ThreadSanitizer keeps the parent's threads in its registry after fork(): a thread the
 * child starts at the stack address of the parent's thread that was inside a call is reported as
 * "dup thread with used id" and the child exits 66. Under TSan the fork-during-call child therefore
 * checks only the refusal and the destroy (no new threads); the release and ASan builds run all of
 * it. */
#if defined(__SANITIZE_THREAD__)
#  define UNDER_TSAN 1
#elif defined(__has_feature)
#  if __has_feature(thread_sanitizer)
#    define UNDER_TSAN 1
#  endif
#endif
#ifndef UNDER_TSAN
#  define UNDER_TSAN 0
#endif

/* GCC 12's AddressSanitizer takes no allocator locks around fork(): a parent thread inside malloc
 * at the fork leaves its size-class lock held in the child for good, and the child's next malloc
 * of that size waits forever (seen in CI: the second thread of the busy build's 2-thread team was
 * in LAPACKE's workspace malloc). glibc's malloc takes its locks around fork(), so the release build
 * keeps the busy build on 2 threads (a worker may be in malloc at the fork, as in a real program);
 * under ASan the busy build runs on its own thread, which sits in read() at the fork. */
#if defined(__SANITIZE_ADDRESS__)
#  define UNDER_ASAN 1
#elif defined(__has_feature)
#  if __has_feature(address_sanitizer)
#    define UNDER_ASAN 1
#  endif
#endif
#ifndef UNDER_ASAN
#  define UNDER_ASAN 0
#endif

/* Large enough that every call runs on the work pool's threads (above the runtime's thresholds). */
enum { D_IN = 1024, D_OUT = 1024, M = 32, G = 32, WATCHDOG_S = 30 };

typedef struct {
    unsigned char* codes;
    unsigned char* scales;
    float* y_gemm;
    float* y_run;
    size_t codes_bytes, scales_bytes;
} Results;

static float* gaussian_like(size_t n, uint64_t seed) {
    float* v = malloc(n * sizeof *v);
    size_t i;
    for (i = 0; v != NULL && i < n; ++i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(seed >> 11) / 9007199254740992.0 - 0.5) * (i % 13 == 0 ? 8.0f : 1.0f);
    }
    return v;
}

static int alloc_results(Results* r) {
    wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, M, D_IN, &r->codes_bytes, &r->scales_bytes);
    r->codes = malloc(r->codes_bytes);
    r->scales = malloc(r->scales_bytes);
    r->y_gemm = malloc(sizeof(float) * M * D_OUT);
    r->y_run = malloc(sizeof(float) * M * D_OUT);
    return r->codes && r->scales && r->y_gemm && r->y_run;
}

static void free_results(Results* r) {
    free(r->codes);
    free(r->scales);
    free(r->y_gemm);
    free(r->y_run);
}

/* Quantizes x, multiplies, prepares the layer and runs it: every runtime path that goes parallel. */
static int compute(wush_context* ctx, const wush_transform* t, const wush_qweight* q, const float* x, Results* r) {
    wush_linear* layer = NULL;
    size_t ws_bytes = 0;
    void* ws = NULL;
    int ok = wush_quantize_activations(ctx, t, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, M, D_IN, r->codes, r->codes_bytes,
                                       r->scales, r->scales_bytes) == WUSH_OK &&
             wush_gemm(ctx, q, r->codes, r->codes_bytes, r->scales, r->scales_bytes, M, WUSH_DTYPE_F32, r->y_gemm,
                       (size_t)M * D_OUT) == WUSH_OK &&
             wush_linear_create(ctx, t, q, &layer) == WUSH_OK &&
             wush_linear_workspace_size(ctx, layer, M, &ws_bytes) == WUSH_OK && (ws = malloc(ws_bytes)) != NULL &&
             wush_linear_run(ctx, layer, WUSH_DTYPE_F32, x, M, WUSH_DTYPE_F32, r->y_run, (size_t)M * D_OUT, ws,
                             ws_bytes) == WUSH_OK;
    if (!ok) fprintf(stderr, "runtime call failed: %s\n", wush_last_error());
    free(ws);
    wush_linear_destroy(layer);
    return ok;
}

static int same(const Results* a, const Results* b) {
    return memcmp(a->codes, b->codes, a->codes_bytes) == 0 && memcmp(a->scales, b->scales, a->scales_bytes) == 0 &&
           memcmp(a->y_gemm, b->y_gemm, sizeof(float) * M * D_OUT) == 0 &&
           memcmp(a->y_run, b->y_run, sizeof(float) * M * D_OUT) == 0;
}

/* This process's thread count (Linux); -1 where /proc/self/task cannot be read. */
static int thread_count(void) {
    DIR* d = opendir("/proc/self/task");
    struct dirent* e;
    int n = 0;
    if (d == NULL) return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') ++n;
    closedir(d);
    return n;
}

/* The child's checks; its exit status: 0 passed, 1 a result differed or a call failed, 2 the
 * child ran on its one thread only. */
static int child(wush_context* ctx, const wush_transform* t, const wush_qweight* q, const float* x,
                 const Results* parent) {
    Results r;
    const int before = thread_count();
    alarm(WATCHDOG_S);
    if (!alloc_results(&r) || !compute(ctx, t, q, x, &r) || !same(&r, parent)) return 1;
    if (before > 0 && sysconf(_SC_NPROCESSORS_ONLN) >= 2 && thread_count() <= before) {
        fprintf(stderr, "the child ran its 2-thread calls on %d thread(s)\n", thread_count());
        return 2;
    }
    return 0;
}

/* The thread inside a call at the fork: a WUSH transform build on `ctx`, which stops in its first
 * progress callback, says so through `in_call` and waits there for a byte on `resume`. */
typedef struct {
    wush_context* ctx;
    wush_calibrator* cal;
    wush_options* opts;
    const float* w;
    int in_call[2], resume[2];
    int stopped;
    wush_status status;
    wush_transform* t;
} Busy;

static int hold_in_callback(void* user, double fraction) {
    Busy* b = user;
    char c = 'x';
    (void)fraction;
    if (!b->stopped) {
        b->stopped = 1;
        if (write(b->in_call[1], &c, 1) != 1 || read(b->resume[0], &c, 1) != 1) return 1;
    }
    return 0;
}

static void* busy_thread(void* p) {
    Busy* b = p;
    b->status =
        wush_transform_build(b->ctx, b->cal, WUSH_DTYPE_F32, b->w, D_OUT, D_IN, WUSH_TRANSFORM_WUSH, b->opts, &b->t);
    return NULL;
}

/* A calibrator of the tokens x and the WUSH transform of w built from it on `ctx`. */
static int build_wush(wush_context* ctx, const float* x, const float* w) {
    wush_calibrator* cal = NULL;
    wush_transform* t = NULL;
    int ok = wush_calibrator_create(D_IN, G, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal) == WUSH_OK &&
             wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, x, M) == WUSH_OK &&
             wush_transform_build(ctx, cal, WUSH_DTYPE_F32, w, D_OUT, D_IN, WUSH_TRANSFORM_WUSH, NULL, &t) == WUSH_OK;
    if (!ok) fprintf(stderr, "calibration or transform build failed: %s\n", wush_last_error());
    wush_transform_destroy(t);
    wush_calibrator_destroy(cal);
    return ok;
}

/* The child forked while `busy` was inside its call; its exit status: 0 passed, 3 a call on the
 * busy context was not refused as documented, 1 the new context failed. */
static int busy_child(Busy* busy, const wush_transform* t, const wush_qweight* q, const float* x, const float* w,
                      const Results* parent) {
    wush_context* fresh = NULL;
    int64_t v = 0;
    wush_status st;
    Results r;
    alarm(WATCHDOG_S);
    st = wush_context_get_parameter(busy->ctx, WUSH_CONTEXT_NUM_THREADS, &v);
    if (st != WUSH_ERR_INVALID_ARGUMENT || strstr(wush_last_error(), "fork") == NULL) {
        fprintf(stderr, "the busy context in the child: %s: %s\n", wush_status_string(st), wush_last_error());
        return 3;
    }
    if (wush_calibrator_add(busy->ctx, busy->cal, WUSH_DTYPE_F32, x, M) != WUSH_ERR_INVALID_ARGUMENT) return 3;
    wush_context_destroy(busy->ctx);
    if (UNDER_TSAN) return 0;
    if (wush_context_create(WUSH_BACKEND_CPU, 0, &fresh) != WUSH_OK ||
        wush_context_set_parameter(fresh, WUSH_CONTEXT_NUM_THREADS, 2) != WUSH_OK || !alloc_results(&r) ||
        !compute(fresh, t, q, x, &r) || !same(&r, parent) || !build_wush(fresh, x, w))
        return 1;
    wush_context_destroy(fresh);
    return 0;
}

/* Forks while another thread is inside a call on its own context (see the top). */
static void fork_during_call(const wush_transform* t, const wush_qweight* q, const float* x, const float* w,
                             const Results* parent) {
    Busy busy;
    pthread_t thread;
    int status = 0;
    char c = 'x';
    pid_t pid;
    memset(&busy, 0, sizeof busy);
    busy.w = w;
    CHECK(pipe(busy.in_call) == 0 && pipe(busy.resume) == 0);
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &busy.ctx), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(busy.ctx, WUSH_CONTEXT_NUM_THREADS, UNDER_ASAN ? 1 : 2), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, G, WUSH_MOMENTS_BLOCK_DIAGONAL, &busy.cal), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(busy.ctx, busy.cal, WUSH_DTYPE_F32, x, M), WUSH_OK);
    CHECK_STATUS(wush_options_create(&busy.opts), WUSH_OK);
    CHECK_STATUS(wush_options_set_progress(busy.opts, hold_in_callback, &busy), WUSH_OK);
    if (g_failures != 0) return;
    CHECK(pthread_create(&thread, NULL, busy_thread, &busy) == 0);
    CHECK(read(busy.in_call[0], &c, 1) == 1); /* the thread is inside the call, holding its context */
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(busy_child(&busy, t, q, x, w, parent));
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
        fprintf(stderr, "fork during a call: the child was killed by signal %d%s\n", WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (the watchdog: it hung)" : "");
    else if (WEXITSTATUS(status) != 0)
        fprintf(stderr, "fork during a call: the child failed (%d)\n", WEXITSTATUS(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(write(busy.resume[1], &c, 1) == 1);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK_STATUS(busy.status, WUSH_OK);
    wush_transform_destroy(busy.t);
    wush_options_destroy(busy.opts);
    wush_calibrator_destroy(busy.cal);
    wush_context_destroy(busy.ctx);
    close(busy.in_call[0]);
    close(busy.in_call[1]);
    close(busy.resume[0]);
    close(busy.resume[1]);
}

int main(void) {
    wush_context* ctx = NULL;
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    float* w = gaussian_like((size_t)D_OUT * D_IN, 1);
    float* x = gaussian_like((size_t)M * D_IN, 2);
    Results parent = {0}, single = {0};
    int round;
    CHECK(w != NULL && x != NULL && alloc_results(&parent) && alloc_results(&single));
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 2), WUSH_OK);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D_IN, G, NULL, &t), WUSH_OK);
    CHECK_STATUS(
        wush_qweight_create(ctx, t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w, D_OUT, D_IN, NULL, &q),
        WUSH_OK);
    if (g_failures != 0) return 1;
    CHECK(compute(ctx, t, q, x, &parent));
    /* The parent's 2-thread results equal its 1-thread ones (the oracle does not depend on a thread). */
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 1), WUSH_OK);
    CHECK(compute(ctx, t, q, x, &single) && same(&parent, &single));
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 2), WUSH_OK);
    for (round = 0; round < 2; ++round) { /* a second fork after the parent's pool ran again */
        int status = 0;
        pid_t pid;
        fflush(stderr);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) _exit(child(ctx, t, q, x, &parent));
        CHECK(waitpid(pid, &status, 0) == pid);
        if (WIFSIGNALED(status))
            fprintf(stderr, "round %d: the child was killed by signal %d%s\n", round, WTERMSIG(status),
                    WTERMSIG(status) == SIGALRM ? " (the watchdog: it hung)" : "");
        else if (WEXITSTATUS(status) != 0)
            fprintf(stderr, "round %d: the child failed (%d)\n", round, WEXITSTATUS(status));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK(compute(ctx, t, q, x, &single) && same(&parent, &single));
    }
    /* This thread runs 2-thread OpenMP regions before the fork below: its libgomp team exists in
     * the parent only. */
    CHECK(build_wush(ctx, x, w));
    fork_during_call(t, q, x, w, &parent);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    wush_context_destroy(ctx);
    free_results(&parent);
    free_results(&single);
    free(w);
    free(x);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures != 0;
}
