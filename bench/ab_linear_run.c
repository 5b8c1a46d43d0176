/* Two libwush builds in one process, one prepared layer each, timed alternately: the A/B that a
 * VM whose speed moves by a third between minutes still resolves (both sides share the minutes).
 *
 *   bench_ab_linear_run LIB_A LIB_B D_IN D_OUT FORMAT ISA THREADS [BLOCKS [THREADS_B [TRANSFORM [COPIES [BF16]]]]]
 *
 * FORMAT, ISA and TRANSFORM are the wush_format / wush_cpu_isa / wush_transform_kind values
 * (0 MXFP4, 1 NVFP4, 2 INT4; 0 auto, 2 AVX2, 3 AVX-512 VNNI; 1 Hadamard, the default: one matrix
 * for every block, 2 random: a matrix per block, as WUSH has). BF16 = 1 stores the transform's
 * matrices rounded to bf16, as `python -m wush quantize-model` does (WUSH_OPTION_TRANSFORM_DTYPE). Each library is dlopen()ed with
 * RTLD_LOCAL, so both keep their own symbols and thread pools. Both build the same random
 * d_out x d_in weight (RTN) and run wush_linear_run at m = 1 on the same token: BLOCKS rounds
 * (default 40) of 500 calls each, A and B alternating which goes first. With COPIES > 1 each side
 * prepares that many copies of the layer and the calls rotate through them: enough copies to
 * overflow the last-level cache put every call's bytes in memory, as in a model's token loop.
 * Prints each side's minimum and median per-call time, their ratios A/B, and whether the two
 * outputs are bit-equal. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <wush/wush.h>

enum { kCallsPerBlock = 500 };

typedef wush_status (*RunFn)(wush_context*, const wush_linear*, wush_dtype, const void*, size_t, wush_dtype, void*,
                             size_t, void*, size_t);

typedef struct {
    void* lib;
    wush_context* ctx;
    wush_linear** layers; /* copies of the one layer */
    void* workspace;
    size_t workspace_bytes;
    RunFn run;
} Side;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static int fail(const Side* s, const char* path, const char* what) {
    const char* (*last_error)(void) = s->lib ? (const char* (*)(void))dlsym(s->lib, "wush_last_error") : NULL;
    fprintf(stderr, "%s: %s: %s\n", path, what, last_error ? last_error() : dlerror());
    return 1;
}

/* The data-free transform; with bf16, built through wush_transform_build (which rounds the stored
 * matrices to bf16; a data-free kind reads no moments, so the calibrator stays empty). */
static wush_status make_transform(
    Side* s, wush_status (*fixed)(wush_transform_kind, size_t, size_t, const void*, wush_transform**),
    wush_status (*cal_create)(size_t, size_t, wush_moment_mode, wush_calibrator**),
    wush_status (*opt_create)(wush_options**), wush_status (*opt_set)(wush_options*, wush_option, int64_t),
    wush_status (*build)(wush_context*, const wush_calibrator*, wush_dtype, const void*, size_t, size_t,
                         wush_transform_kind, const wush_options*, wush_transform**),
    wush_transform_kind kind, int bf16, size_t d_in, size_t g, wush_transform** t) {
    if (!bf16) return fixed(kind, d_in, g, NULL, t);
    wush_calibrator* cal = NULL;
    wush_options* opts = NULL;
    wush_status st = cal_create(d_in, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal);
    if (st == WUSH_OK) st = opt_create(&opts);
    if (st == WUSH_OK) st = opt_set(opts, WUSH_OPTION_TRANSFORM_DTYPE, WUSH_DTYPE_BF16);
    if (st == WUSH_OK) st = build(s->ctx, cal, WUSH_DTYPE_F32, NULL, 1, d_in, kind, opts, t);
    /* the calibrator and options are left to the process's end, as the layers are */
    return st;
}

static int setup(Side* s, const char* path, size_t d_in, size_t d_out, wush_format format, int isa, int threads,
                 wush_transform_kind kind, int bf16, size_t copies, const float* w) {
    s->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!s->lib) return fail(s, path, "dlopen");
    wush_status (*context_create)(wush_backend, int, wush_context**) = dlsym(s->lib, "wush_context_create");
    wush_status (*set_parameter)(wush_context*, wush_context_parameter, int64_t) =
        dlsym(s->lib, "wush_context_set_parameter");
    wush_status (*group_size)(wush_format, size_t*) = dlsym(s->lib, "wush_format_group_size");
    wush_status (*transform_fixed)(wush_transform_kind, size_t, size_t, const void*, wush_transform**) =
        dlsym(s->lib, "wush_transform_create_fixed");
    wush_status (*calibrator_create)(size_t, size_t, wush_moment_mode, wush_calibrator**) =
        dlsym(s->lib, "wush_calibrator_create");
    wush_status (*options_create)(wush_options**) = dlsym(s->lib, "wush_options_create");
    wush_status (*options_set_int)(wush_options*, wush_option, int64_t) = dlsym(s->lib, "wush_options_set_int");
    wush_status (*transform_build)(wush_context*, const wush_calibrator*, wush_dtype, const void*, size_t, size_t,
                                   wush_transform_kind, const wush_options*, wush_transform**) =
        dlsym(s->lib, "wush_transform_build");
    wush_status (*qweight_create)(wush_context*, const wush_transform*, wush_format, wush_method, wush_dtype,
                                  const void*, size_t, size_t, const void*, wush_qweight**) =
        dlsym(s->lib, "wush_qweight_create");
    wush_status (*linear_create)(wush_context*, const wush_transform*, const wush_qweight*, wush_linear**) =
        dlsym(s->lib, "wush_linear_create");
    wush_status (*workspace_size)(wush_context*, const wush_linear*, size_t, size_t*) =
        dlsym(s->lib, "wush_linear_workspace_size");
    s->run = (RunFn)dlsym(s->lib, "wush_linear_run");
    size_t g = 0;
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    s->layers = calloc(copies, sizeof(wush_linear*));
    if (s->layers == NULL) return 1;
    if (context_create(WUSH_BACKEND_CPU, 0, &s->ctx) != WUSH_OK ||
        set_parameter(s->ctx, WUSH_CONTEXT_NUM_THREADS, threads) != WUSH_OK ||
        set_parameter(s->ctx, WUSH_CONTEXT_CPU_ISA, isa) != WUSH_OK || group_size(format, &g) != WUSH_OK ||
        make_transform(s, transform_fixed, calibrator_create, options_create, options_set_int, transform_build, kind,
                       bf16, d_in, g, &t) != WUSH_OK ||
        qweight_create(s->ctx, t, format, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w, d_out, d_in, NULL, &q) != WUSH_OK)
        return fail(s, path, "setting up the layer");
    for (size_t c = 0; c < copies; ++c) /* each copy prepares its own transform and row blocks */
        if (linear_create(s->ctx, t, q, &s->layers[c]) != WUSH_OK) return fail(s, path, "preparing a copy");
    if (workspace_size(s->ctx, s->layers[0], 1, &s->workspace_bytes) != WUSH_OK)
        return fail(s, path, "the workspace size");
    s->workspace = malloc(s->workspace_bytes + 1);
    return s->workspace == NULL;
}

static int by_value(const void* a, const void* b) {
    const double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

int main(int argc, char** argv) {
    if (argc < 8) {
        fprintf(
            stderr,
            "usage: %s LIB_A LIB_B D_IN D_OUT FORMAT ISA THREADS [BLOCKS [THREADS_B [TRANSFORM [COPIES [BF16]]]]]\n",
            argv[0]);
        return 2;
    }
    const size_t d_in = strtoul(argv[3], NULL, 10), d_out = strtoul(argv[4], NULL, 10);
    const wush_format format = (wush_format)atoi(argv[5]);
    const int isa = atoi(argv[6]), threads = atoi(argv[7]);
    const int blocks = argc > 8 ? atoi(argv[8]) : 40, threads_b = argc > 9 ? atoi(argv[9]) : threads;
    const wush_transform_kind kind = argc > 10 ? (wush_transform_kind)atoi(argv[10]) : WUSH_TRANSFORM_HADAMARD;
    const int copies = argc > 11 ? atoi(argv[11]) : 1;
    const int bf16 = argc > 12 ? atoi(argv[12]) : 0;
    float* w = malloc(sizeof(float) * d_in * d_out);
    float* x = malloc(sizeof(float) * d_in);
    float* y = malloc(sizeof(float) * d_out * 2);
    double* t[2] = {malloc(sizeof(double) * blocks), malloc(sizeof(double) * blocks)};
    if (!w || !x || !y || !t[0] || !t[1] || blocks < 1 || copies < 1) return 1;
    srand(1);
    for (size_t i = 0; i < d_in * d_out; ++i) w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < d_in; ++i) x[i] = (float)rand() / RAND_MAX - 0.5f;
    Side s[2] = {{0}, {0}};
    if (setup(&s[0], argv[1], d_in, d_out, format, isa, threads, kind, bf16, (size_t)copies, w) ||
        setup(&s[1], argv[2], d_in, d_out, format, isa, threads_b, kind, bf16, (size_t)copies, w))
        return 1;
    int next[2] = {0, 0}; /* each side's next copy */
    for (int b = 0; b < blocks; ++b)
        for (int k = 0; k < 2; ++k) {
            const int side = (b + k) % 2; /* who goes first alternates */
            Side* c = &s[side];
            const double start = now_us();
            for (int i = 0; i < kCallsPerBlock; ++i) {
                if (c->run(c->ctx, c->layers[next[side]], WUSH_DTYPE_F32, x, 1, WUSH_DTYPE_F32, y + d_out * side, d_out,
                           c->workspace, c->workspace_bytes) != WUSH_OK)
                    return fail(c, argv[1 + side], "wush_linear_run");
                next[side] = (next[side] + 1) % copies;
            }
            t[side][b] = (now_us() - start) / kCallsPerBlock;
        }
    int equal = 1;
    for (size_t i = 0; i < d_out; ++i) equal &= y[i] == y[d_out + i];
    for (int k = 0; k < 2; ++k) qsort(t[k], blocks, sizeof(double), by_value);
    printf(
        "%zux%zu format %d isa %d transform %d%s copies %d: A min %.2f med %.2f | B min %.2f med %.2f us | "
        "A/B med %.3f min %.3f | outputs %s\n",
        d_in, d_out, (int)format, isa, (int)kind, bf16 ? " bf16" : "", copies, t[0][0], t[0][blocks / 2], t[1][0],
        t[1][blocks / 2], t[0][blocks / 2] / t[1][blocks / 2], t[0][0] / t[1][0], equal ? "equal" : "DIFFER");
    return 0;
}
