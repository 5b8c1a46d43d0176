/* Tests of the public C API, in plain C99 against the shared library: status and error
 * reporting, handle checks, argument validation, buffer bounds, and the format functions. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "wush/wush.h"

static const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

static int all_bytes_are(const unsigned char* p, size_t n, unsigned char v) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (p[i] != v) return 0;
    return 1;
}

static float gauss(unsigned* state) { /* deterministic, crude: sum of 4 uniforms */
    float s = 0.0f;
    int k;
    for (k = 0; k < 4; ++k) {
        *state = *state * 1103515245u + 12345u;
        s += (float)((*state >> 8) & 0xFFFF) / 65536.0f - 0.5f;
    }
    return s * 1.7f;
}

static void test_version_and_status(void) {
    CHECK(wush_version() == WUSH_VERSION_NUMBER);
    {
        char expect[32];
        snprintf(expect, sizeof expect, "%d.%d.%d", WUSH_VERSION_MAJOR, WUSH_VERSION_MINOR, WUSH_VERSION_PATCH);
        CHECK(strcmp(wush_version_string(), expect) == 0);
    }
    CHECK(strcmp(wush_status_string(WUSH_OK), "WUSH_OK") == 0);
    CHECK(strcmp(wush_status_string(WUSH_ERR_NON_FINITE), "WUSH_ERR_NON_FINITE") == 0);
    CHECK(strcmp(wush_status_string(WUSH_ERR_INTERNAL), "WUSH_ERR_INTERNAL") == 0);
    CHECK(strcmp(wush_status_string((wush_status)999), "WUSH_ERR_UNKNOWN") == 0);
    CHECK(strcmp(wush_status_string((wush_status)-1), "WUSH_ERR_UNKNOWN") == 0);
}

static void test_contexts(void) {
    wush_context* ctx = NULL;
    wush_context* untouched = (wush_context*)0x1;
    wush_backend backend = WUSH_BACKEND_CUDA;
    int64_t value = -5;
    wush_status st;

    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "ctx is NULL") != NULL);
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 1, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_create((wush_backend)7, 0, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_context*)0x1); /* outputs untouched on failure */

    /* CUDA: either a device is there, or a clear UNSUPPORTED. */
    st = wush_context_create(WUSH_BACKEND_CUDA, 0, &ctx);
    CHECK(st == WUSH_OK || st == WUSH_ERR_UNSUPPORTED);
    if (st == WUSH_ERR_UNSUPPORTED) CHECK(strlen(wush_last_error()) > 20);
    wush_context_destroy(ctx);
    ctx = NULL;

    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    CHECK_STATUS(wush_context_backend(ctx, &backend), WUSH_OK);
    CHECK(backend == WUSH_BACKEND_CPU);
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, &value), WUSH_OK);
    CHECK(value == 0);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 2), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, -1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 5000), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, (wush_context_parameter)42, 1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, &value), WUSH_OK);
    CHECK(value == 2); /* rejected values left the context unchanged */
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_OPENMP_TEAM, &value), WUSH_OK);
    CHECK(value == 0); /* the library's own pool by default */
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_OPENMP_TEAM, 1), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_OPENMP_TEAM, 2), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_OPENMP_TEAM, -1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_OPENMP_TEAM, &value), WUSH_OK);
    CHECK(value == 1);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_OPENMP_TEAM, 0), WUSH_OK);
    /* The experimental CUDA kernel switches: a CPU context checks the same bounds, keeps the value
     * and ignores it (wush.h); a rejected value names the parameter and leaves it unchanged. */
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, &value), WUSH_OK);
    CHECK(value == 0);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 33), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, -1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "WUSH_CONTEXT_CUDA_PREFILL_MIN_M must be in [0, 2147483647]") != NULL);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 2147483648LL),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 2147483647LL), WUSH_OK);
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, &value), WUSH_OK);
    CHECK(value == 2147483647LL);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CUDA_PREFILL_MIN_M, 0), WUSH_OK);
    {
        static const wush_context_parameter switches[] = {
            WUSH_CONTEXT_CUDA_BLOCKSCALED, WUSH_CONTEXT_CUDA_STREAM_DECODE, WUSH_CONTEXT_CUDA_BF16_PREFILL,
            WUSH_CONTEXT_CUDA_TC_QUANTIZE};
        static const char* const names[] = {
            "WUSH_CONTEXT_CUDA_BLOCKSCALED must be 0 or 1", "WUSH_CONTEXT_CUDA_STREAM_DECODE must be 0 or 1",
            "WUSH_CONTEXT_CUDA_BF16_PREFILL must be 0 or 1", "WUSH_CONTEXT_CUDA_TC_QUANTIZE must be 0 or 1"};
        size_t i, j;
        for (i = 0; i < 4; ++i) {
            CHECK_STATUS(wush_context_get_parameter(ctx, switches[i], &value), WUSH_OK);
            CHECK(value == 0); /* off by default */
            CHECK_STATUS(wush_context_set_parameter(ctx, switches[i], 1), WUSH_OK);
            CHECK_STATUS(wush_context_set_parameter(ctx, switches[i], 2), WUSH_ERR_INVALID_ARGUMENT);
            CHECK(strstr(wush_last_error(), names[i]) != NULL);
            CHECK_STATUS(wush_context_set_parameter(ctx, switches[i], -1), WUSH_ERR_INVALID_ARGUMENT);
            for (j = 0; j < 4; ++j) { /* each switch is its own: only switches[0..i] are on */
                CHECK_STATUS(wush_context_get_parameter(ctx, switches[j], &value), WUSH_OK);
                CHECK(value == (j <= i ? 1 : 0));
            }
        }
        for (i = 0; i < 4; ++i) CHECK_STATUS(wush_context_set_parameter(ctx, switches[i], 0), WUSH_OK);
    }
    /* Ids between the stable ones and the experimental range are unknown. */
    CHECK_STATUS(wush_context_set_parameter(ctx, (wush_context_parameter)999, 0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, (wush_context_parameter)1005, 0), WUSH_ERR_INVALID_ARGUMENT);

    /* A pointer that is not a handle, and a destroyed handle, are reported, not dereferenced. */
    {
        int not_a_handle = 0;
        CHECK_STATUS(wush_context_backend((const wush_context*)&not_a_handle, &backend), WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "not a live wush_context") != NULL);
    }
    wush_context_destroy(ctx);
    CHECK_STATUS(wush_context_backend(ctx, &backend), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 1), WUSH_ERR_INVALID_ARGUMENT);
    wush_context_destroy(ctx);  /* double destroy: detected, no-op */
    wush_context_destroy(NULL); /* no-op */
}

static void test_format_queries(void) {
    size_t g = 0, codes = 0, scales = 0, sb = 0;
    float factor = 0.0f;
    wush_format f = WUSH_FORMAT_INT4;

    CHECK_STATUS(wush_format_group_size(WUSH_FORMAT_MXFP4, &g), WUSH_OK);
    CHECK(g == 32);
    CHECK_STATUS(wush_format_group_size(WUSH_FORMAT_NVFP4, &g), WUSH_OK);
    CHECK(g == 16);
    CHECK_STATUS(wush_format_group_size(WUSH_FORMAT_INT4, &g), WUSH_OK);
    CHECK(g == 32);
    CHECK_STATUS(wush_format_group_size((wush_format)9, &g), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_format_group_size(WUSH_FORMAT_MXFP4, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_format_tensor_factor(WUSH_FORMAT_MXFP4, &factor), WUSH_OK);
    CHECK(factor == 1.0f / 3.0f);
    CHECK_STATUS(wush_format_tensor_factor(WUSH_FORMAT_NVFP4, &factor), WUSH_OK);
    CHECK(factor == 1.0f / 10.0f);
    CHECK_STATUS(wush_format_tensor_factor(WUSH_FORMAT_MXFP4_OCP, &factor), WUSH_OK);
    CHECK(factor == 1.0f);
    CHECK_STATUS(wush_format_scale_bytes(WUSH_FORMAT_INT4, &sb), WUSH_OK);
    CHECK(sb == 2);
    CHECK_STATUS(wush_format_buffer_sizes(WUSH_FORMAT_NVFP4, 3, 64, &codes, &scales), WUSH_OK);
    CHECK(codes == 3 * 32 && scales == 3 * 4);
    CHECK_STATUS(wush_format_buffer_sizes(WUSH_FORMAT_INT4, 2, 64, &codes, NULL), WUSH_OK);
    CHECK_STATUS(wush_format_buffer_sizes(WUSH_FORMAT_INT4, 2, 64, NULL, &scales), WUSH_OK);
    CHECK(scales == 2 * 2 * 2);
    CHECK_STATUS(wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, 1, 48, &codes, &scales), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, 1, 0, &codes, &scales), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, SIZE_MAX / 16, 64, &codes, &scales),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "overflow") != NULL);

    CHECK(strcmp(wush_format_name(WUSH_FORMAT_NVFP4), "nvfp4") == 0);
    CHECK(wush_format_name((wush_format)77) == NULL);
    CHECK_STATUS(wush_format_from_name("MXFP4", &f), WUSH_OK);
    CHECK(f == WUSH_FORMAT_MXFP4);
    CHECK_STATUS(wush_format_from_name("fp4", &f), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_format_from_name(NULL, &f), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(f == WUSH_FORMAT_MXFP4);
}

/* Quantizes rows x cols f32 values with canary bytes after each output buffer. */
enum { ROWS = 5, COLS = 64, CANARY = 64 };

static void test_quantize_bounds_and_errors(void) {
    wush_context* ctx = NULL;
    float x[ROWS * COLS], y[ROWS * COLS + CANARY];
    unsigned char codes[ROWS * COLS / 2 + CANARY], scales[ROWS * COLS / 16 * 2 + CANARY];
    unsigned state = 3;
    size_t i, k, need_codes, need_scales;

    for (i = 0; i < ROWS * COLS; ++i) x[i] = gauss(&state);
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (k = 0; k < sizeof kFormats / sizeof kFormats[0]; ++k) {
        const wush_format f = kFormats[k];
        CHECK_STATUS(wush_format_buffer_sizes(f, ROWS, COLS, &need_codes, &need_scales), WUSH_OK);

        /* Success writes exactly the documented bytes: canaries after them survive. */
        memset(codes, 0xAB, sizeof codes);
        memset(scales, 0xAB, sizeof scales);
        CHECK_STATUS(wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, x, ROWS, COLS, codes, need_codes, scales, need_scales),
                     WUSH_OK);
        CHECK(all_bytes_are(codes + need_codes, sizeof codes - need_codes, 0xAB));
        CHECK(all_bytes_are(scales + need_scales, sizeof scales - need_scales, 0xAB));
        for (i = 0; i < sizeof y / sizeof y[0]; ++i) y[i] = 12345.0f;
        CHECK_STATUS(wush_dequantize_rows(ctx, f, codes, need_codes, scales, need_scales, ROWS, COLS, y, ROWS * COLS),
                     WUSH_OK);
        CHECK(y[ROWS * COLS] == 12345.0f && y[ROWS * COLS + CANARY - 1] == 12345.0f);
        {
            double err = 0.0, ref = 0.0;
            for (i = 0; i < ROWS * COLS; ++i) {
                err += (y[i] - x[i]) * (y[i] - x[i]);
                ref += x[i] * x[i];
            }
            CHECK(err < 0.05 * ref); /* 4-bit formats keep Gaussian-like data within ~15 dB */
        }

        /* Too-small buffers: status, and nothing written. */
        memset(codes, 0xCD, sizeof codes);
        memset(scales, 0xCD, sizeof scales);
        CHECK_STATUS(
            wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, x, ROWS, COLS, codes, need_codes - 1, scales, need_scales),
            WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(
            wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, x, ROWS, COLS, codes, need_codes, scales, need_scales - 1),
            WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK(all_bytes_are(codes, sizeof codes, 0xCD) && all_bytes_are(scales, sizeof scales, 0xCD));
        CHECK_STATUS(
            wush_dequantize_rows(ctx, f, codes, need_codes, scales, need_scales, ROWS, COLS, y, ROWS * COLS - 1),
            WUSH_ERR_BUFFER_TOO_SMALL);

        /* Bad shapes and pointers. */
        CHECK_STATUS(
            wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, x, ROWS, COLS - 8, codes, need_codes, scales, need_scales),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "not a positive multiple") != NULL);
        CHECK_STATUS(
            wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, NULL, ROWS, COLS, codes, need_codes, scales, need_scales),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, x, ROWS, COLS, NULL, need_codes, scales, need_scales),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_quantize_rows(ctx, f, (wush_dtype)9, x, ROWS, COLS, codes, need_codes, scales, need_scales),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_quantize_rows(NULL, f, WUSH_DTYPE_F32, x, ROWS, COLS, codes, need_codes, scales, need_scales),
                     WUSH_ERR_INVALID_ARGUMENT);
        /* Zero rows: a no-op, NULL buffers allowed. */
        CHECK_STATUS(wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, NULL, 0, COLS, NULL, 0, NULL, 0), WUSH_OK);
        CHECK_STATUS(wush_dequantize_rows(ctx, f, NULL, 0, NULL, 0, 0, COLS, NULL, 0), WUSH_OK);
    }

    /* NaN and Inf: NON_FINITE naming the position, nothing written. */
    {
        const float saved = x[2 * COLS + 17];
        x[2 * COLS + 17] = NAN;
        memset(codes, 0xEE, sizeof codes);
        CHECK_STATUS(wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, ROWS, COLS, codes, sizeof codes,
                                        scales, sizeof scales),
                     WUSH_ERR_NON_FINITE);
        CHECK(strstr(wush_last_error(), "row 2, column 17") != NULL);
        CHECK(all_bytes_are(codes, sizeof codes, 0xEE));
        x[2 * COLS + 17] = -INFINITY;
        CHECK_STATUS(wush_quantize_rows(ctx, WUSH_FORMAT_INT4, WUSH_DTYPE_F32, x, ROWS, COLS, codes, sizeof codes,
                                        scales, sizeof scales),
                     WUSH_ERR_NON_FINITE);
        x[2 * COLS + 17] = saved;
    }
    /* A NaN scale (E8M0 0xFF) cannot be dequantized; y untouched. */
    {
        CHECK_STATUS(wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, 1, COLS, codes, sizeof codes, scales,
                                        sizeof scales),
                     WUSH_OK);
        scales[1] = 0xFF;
        y[0] = 777.0f;
        CHECK_STATUS(wush_dequantize_rows(ctx, WUSH_FORMAT_MXFP4, codes, COLS / 2, scales, 2, 1, COLS, y, COLS),
                     WUSH_ERR_NON_FINITE);
        CHECK(y[0] == 777.0f);
    }
    wush_context_destroy(ctx);
}

/* A CPU context, a Hadamard transform, its MXFP4 qweight of wt (d_out x d_in) and a checkpoint
 * being written that holds them as layer "layer". */
static void one_layer_checkpoint(const float* wt, size_t d_out, size_t d_in, wush_context** ctx, wush_transform** t,
                                 wush_qweight** q, wush_checkpoint** w) {
    CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, ctx) == WUSH_OK);
    CHECK(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, d_in, 32, NULL, t) == WUSH_OK);
    CHECK(wush_qweight_create(*ctx, *t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, wt, d_out, d_in, NULL, q) ==
          WUSH_OK);
    CHECK(wush_checkpoint_create(w) == WUSH_OK);
    CHECK(wush_checkpoint_add_layer(*w, "layer", *t, *q) == WUSH_OK);
}

/* y (n x d_out) = the layer's forward of x (n x d_in) on ctx, float32. */
static void forward(wush_context* ctx, const wush_transform* t, const wush_qweight* q, const float* x, size_t n,
                    size_t d_out, float* y) {
    size_t bytes = 0;
    void* ws = NULL;
    CHECK(wush_linear_forward_workspace_size(ctx, t, q, n, &bytes) == WUSH_OK);
    ws = malloc(bytes ? bytes : 1);
    CHECK(wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, x, n, WUSH_DTYPE_F32, y, n * d_out, ws, bytes) == WUSH_OK);
    free(ws);
}

/* A grouped layer (issue 60: q/k/v built as one): its parts are found by name, load as layers of
 * their own (the group's transform, the part's rows), and each part's forward gives exactly the
 * bytes of its rows in the group's forward; the argument errors say what is wrong. */
static void test_checkpoint_grouped_layer(void) {
    enum { D_OUT = 12, D_IN = 64, N = 5 };
    const char* names[] = {"q", "k", "v"};
    const size_t rows[] = {4, 6, 2}, bad_rows[] = {4, 6, 3};
    wush_context* ctx = NULL;
    wush_transform *t = NULL, *pt = NULL;
    wush_qweight *q = NULL, *pq = NULL;
    wush_checkpoint *w = NULL, *ck = NULL;
    float wt[D_OUT * D_IN], x[N * D_IN], y[N * D_OUT], py[N * D_OUT];
    const char* name = NULL;
    size_t i, count = 99, begin = 0, n = 0, info[2];
    char path[64];
    unsigned seed = 11;
    snprintf(path, sizeof path, "/tmp/wush_capi_group_%ld.safetensors", (long)getpid());
    for (i = 0; i < D_OUT * D_IN; ++i) wt[i] = gauss(&seed);
    for (i = 0; i < N * D_IN; ++i) x[i] = gauss(&seed);
    one_layer_checkpoint(wt, D_OUT, D_IN, &ctx, &t, &q, &w);
    CHECK_STATUS(wush_checkpoint_add_grouped_layer(w, "qkv", t, q, 1, names, rows), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "two or more parts") != NULL);
    CHECK_STATUS(wush_checkpoint_add_grouped_layer(w, "qkv", t, q, 3, NULL, rows), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_checkpoint_add_grouped_layer(w, "qkv", t, q, 3, names, bad_rows), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "do not sum to its 12 output rows") != NULL);
    CHECK(wush_checkpoint_add_grouped_layer(w, "qkv", t, q, 3, names, rows) == WUSH_OK);
    /* "layer" (a plain layer) and "k" (a part) are taken. */
    CHECK_STATUS(wush_checkpoint_add_layer(w, "k", t, q), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(wush_checkpoint_layer_part_count(w, "layer", &count) == WUSH_OK && count == 0);
    CHECK(wush_checkpoint_layer_part_count(w, "qkv", &count) == WUSH_OK && count == 3);
    CHECK(wush_checkpoint_write(w, path, NULL) == WUSH_OK);
    CHECK(wush_checkpoint_open(path, &ck) == WUSH_OK);
    CHECK(wush_checkpoint_layer_count(ck, &n) == WUSH_OK && n == 2);
    CHECK(wush_checkpoint_layer_part_count(ck, "qkv", &count) == WUSH_OK && count == 3);
    CHECK_STATUS(wush_checkpoint_layer_part_count(ck, "k", &count), WUSH_ERR_NOT_FOUND);
    CHECK_STATUS(wush_checkpoint_layer_part(ck, "qkv", 3, &name, &begin, &n), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "has 3 parts") != NULL);
    forward(ctx, t, q, x, N, D_OUT, y);
    for (i = 0; i < 3; ++i) {
        size_t r, tok;
        CHECK(wush_checkpoint_layer_part(ck, "qkv", i, &name, &begin, &n) == WUSH_OK);
        CHECK(strcmp(name, names[i]) == 0 && n == rows[i]);
        CHECK(begin == (i == 0 ? 0 : i == 1 ? 4 : 10));
        CHECK(wush_checkpoint_load_layer(ck, names[i], &pt, &pq) == WUSH_OK);
        CHECK(wush_qweight_info(pq, NULL, NULL, &info[0], &info[1]) == WUSH_OK && info[0] == rows[i] &&
              info[1] == D_IN);
        forward(ctx, pt, pq, x, N, rows[i], py);
        for (tok = 0; tok < N; ++tok)
            for (r = 0; r < rows[i]; ++r) CHECK(memcmp(&py[tok * rows[i] + r], &y[tok * D_OUT + begin + r], 4) == 0);
        wush_transform_destroy(pt);
        wush_qweight_destroy(pq);
    }
    wush_checkpoint_destroy(ck);
    wush_checkpoint_destroy(w);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    wush_context_destroy(ctx);
    remove(path);
}

/* A checkpoint opened in copy mode never touches its file again (issue 29, F4): truncating a
 * mapped checkpoint after the load raised SIGBUS in the host. Here the file is truncated, then
 * deleted, after the load; the loaded qweight's bytes, a loss through it and a second load all
 * give what they gave before. */
static void test_checkpoint_copy_mode(void) {
    enum { D_OUT = 8, D_IN = 64, N = 16 };
    wush_context* ctx = NULL;
    wush_transform *t = NULL, *lt = NULL, *lt2 = NULL;
    wush_qweight *q = NULL, *lq = NULL, *lq2 = NULL;
    wush_checkpoint *w = NULL, *ck = NULL;
    float wt[D_OUT * D_IN], x[N * D_IN];
    unsigned char before[D_OUT * D_IN / 2 + D_OUT * D_IN / 32];
    const void *codes = NULL, *scales = NULL;
    size_t nc = 0, ns = 0, i;
    double loss_before = -1.0, loss_after = -2.0;
    char path[64];
    unsigned seed = 5;
    snprintf(path, sizeof path, "/tmp/wush_capi_copy_%ld.safetensors", (long)getpid());
    for (i = 0; i < D_OUT * D_IN; ++i) wt[i] = gauss(&seed);
    for (i = 0; i < N * D_IN; ++i) x[i] = gauss(&seed);
    one_layer_checkpoint(wt, D_OUT, D_IN, &ctx, &t, &q, &w);
    CHECK(wush_checkpoint_write(w, path, NULL) == WUSH_OK);
    CHECK_STATUS(wush_checkpoint_open_mode(path, (wush_checkpoint_mode)7, &ck), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(ck == NULL);
    CHECK(wush_checkpoint_open_mode(path, WUSH_CHECKPOINT_COPY, &ck) == WUSH_OK);
    CHECK(wush_checkpoint_load_layer(ck, "layer", &lt, &lq) == WUSH_OK);
    CHECK(wush_qweight_data(lq, &codes, &nc, &scales, &ns) == WUSH_OK);
    CHECK(nc + ns == sizeof before);
    if (nc + ns == sizeof before) {
        memcpy(before, codes, nc);
        memcpy(before + nc, scales, ns);
    }
    CHECK(wush_layer_loss(ctx, lt, lq, WUSH_DTYPE_F32, wt, WUSH_DTYPE_F32, x, N, &loss_before) == WUSH_OK);
    /* The file shrinks to nothing, then goes away. */
    CHECK(truncate(path, 0) == 0);
    CHECK(wush_qweight_data(lq, &codes, &nc, &scales, &ns) == WUSH_OK);
    CHECK(nc + ns == sizeof before && memcmp(codes, before, nc) == 0 && memcmp(scales, before + nc, ns) == 0);
    CHECK(wush_layer_loss(ctx, lt, lq, WUSH_DTYPE_F32, wt, WUSH_DTYPE_F32, x, N, &loss_after) == WUSH_OK);
    CHECK(loss_after == loss_before && loss_before > 0.0);
    unlink(path);
    CHECK(wush_checkpoint_load_layer(ck, "layer", &lt2, &lq2) == WUSH_OK); /* the copy is what was opened */
    wush_checkpoint_destroy(ck);                                           /* the loaded qweights keep the copy */
    CHECK(wush_layer_loss(ctx, lt2, lq2, WUSH_DTYPE_F32, wt, WUSH_DTYPE_F32, x, N, &loss_after) == WUSH_OK);
    CHECK(loss_after == loss_before);
    wush_qweight_destroy(lq2);
    wush_transform_destroy(lt2);
    wush_qweight_destroy(lq);
    wush_transform_destroy(lt);
    wush_checkpoint_destroy(w);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    wush_context_destroy(ctx);
}

/* A writer refuses a destination that is not a regular file and leaves it as it was (issue 43):
 * the atomic rename used to replace a FIFO, a device or a socket with the new file. The FIFO is
 * made here, in a folder of the test's own. */
static void test_write_refuses_non_regular(void) {
    enum { D_OUT = 4, D_IN = 32 };
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    wush_checkpoint *w = NULL, *ck = NULL;
    wush_context* ctx = NULL;
    float wt[D_OUT * D_IN];
    char dir[64], fifo[96], good[96];
    struct stat st;
    size_t i;
    unsigned seed = 9;
    snprintf(dir, sizeof dir, "/tmp/wush_capi_nonregular_%ld", (long)getpid());
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(good, sizeof good, "%s/good.safetensors", dir);
    CHECK(mkdir(dir, 0700) == 0);
    CHECK(mkfifo(fifo, 0600) == 0);
    for (i = 0; i < D_OUT * D_IN; ++i) wt[i] = gauss(&seed);
    one_layer_checkpoint(wt, D_OUT, D_IN, &ctx, &t, &q, &w);
    CHECK_STATUS(wush_checkpoint_write(w, fifo, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "not a regular file") != NULL);
    CHECK(wush_checkpoint_write(w, good, NULL) == WUSH_OK);
    CHECK(wush_checkpoint_open(good, &ck) == WUSH_OK);
    CHECK_STATUS(wush_checkpoint_export_fp_quant(ck, fifo, NULL, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
    wush_checkpoint_destroy(ck);
    wush_checkpoint_destroy(w);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    wush_context_destroy(ctx);
    unlink(fifo);
    unlink(good);
    rmdir(dir);
}

/* Paths and names quoted in wush_last_error() reach a terminal when a host prints the message:
 * their control bytes are written as \xNN (issue 43), line breaks excepted; and a path's line
 * breaks and tabs too (issue 56: a path with a line break forged a line of the message). */
static void test_error_messages_hold_no_control_bytes(void) {
    wush_checkpoint* ck = NULL;
    wush_tensor_file* tf = NULL;
    const char* message;
    const unsigned char* p;
    int clean = 1;
    CHECK(wush_checkpoint_open("/nonexistent/\x1b[31mred\a\r.safetensors", &ck) == WUSH_ERR_IO);
    message = wush_last_error();
    for (p = (const unsigned char*)message; *p != '\0'; ++p)
        if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7F) clean = 0;
    CHECK(clean);
    CHECK(strstr(message, "\\x1b[31mred\\x07\\x0d") != NULL);
    CHECK(wush_tensor_file_open("/nonexistent/a\nFAKE: line\tb.safetensors", &tf) == WUSH_ERR_IO);
    message = wush_last_error();
    CHECK(strchr(message, '\n') == NULL && strchr(message, '\t') == NULL);
    CHECK(strstr(message, "a\\x0aFAKE: line\\x09b") != NULL);
}

/* A destroyed handle stays refused when a new object takes its address (issue 29, F6): handles
 * used to be the bare addresses, so wush_transform_info on a destroyed transform whose memory a
 * new transform reused returned WUSH_OK, and a wush_linear whose context was destroyed ran through
 * a new context allocated at the same address. Whether an address was reused is read from the
 * low 48 bits of the handles (the address part); where the allocator did not reuse one, the case
 * is reported and not counted. */
static int same_address(const void* a, const void* b) {
    const uintptr_t mask = ((uintptr_t)1 << 48) - 1;
    return ((uintptr_t)a & mask) == ((uintptr_t)b & mask);
}

static void test_reused_addresses(void) {
    enum { D = 32, N_TRIES = 64 };
    wush_transform *stale = NULL, *fresh[N_TRIES];
    wush_transform_kind kind;
    int i, n = 0, reused = -1;
    CHECK(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D, D, NULL, &stale) == WUSH_OK);
    wush_transform_destroy(stale);
    for (n = 0; n < N_TRIES && reused < 0; ++n) {
        CHECK(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, D, D, NULL, &fresh[n]) == WUSH_OK);
        if (same_address(fresh[n], stale)) reused = n;
    }
    if (reused < 0) {
        printf("capi: no transform address was reused (allocator quarantine?): stale-handle case not run\n");
    } else {
        CHECK(wush_transform_info(stale, &kind, NULL, NULL) == WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "not a live wush_transform") != NULL);
        CHECK(wush_transform_info(fresh[reused], &kind, NULL, NULL) == WUSH_OK && kind == WUSH_TRANSFORM_IDENTITY);
        wush_transform_destroy(stale); /* a no-op: it must not destroy the new transform */
        CHECK(wush_transform_info(fresh[reused], &kind, NULL, NULL) == WUSH_OK);
    }
    for (i = 0; i < n; ++i) wush_transform_destroy(fresh[i]);

    /* A prepared layer whose context was destroyed, used through a new context at its address. */
    {
        wush_context *old_ctx = NULL, *new_ctx[N_TRIES];
        wush_transform* t = NULL;
        wush_qweight* q = NULL;
        wush_linear* lin = NULL;
        float w[4 * D], x[D], y[4];
        size_t bytes = 0;
        void* work = NULL;
        for (i = 0; i < 4 * D; ++i) w[i] = (float)((i * 7) % 5) - 2.0f;
        for (i = 0; i < D; ++i) x[i] = (float)(i % 3);
        CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &old_ctx) == WUSH_OK);
        CHECK(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D, D, NULL, &t) == WUSH_OK);
        CHECK(wush_qweight_create(old_ctx, t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w, 4, D, NULL, &q) ==
              WUSH_OK);
        CHECK(wush_linear_create(old_ctx, t, q, &lin) == WUSH_OK);
        CHECK(wush_linear_workspace_size(old_ctx, lin, 1, &bytes) == WUSH_OK);
        work = malloc(bytes + 64);
        CHECK(wush_linear_run(old_ctx, lin, WUSH_DTYPE_F32, x, 1, WUSH_DTYPE_F32, y, 4, work, bytes + 64) == WUSH_OK);
        wush_context_destroy(old_ctx);
        reused = -1;
        for (n = 0; n < N_TRIES && reused < 0; ++n) {
            CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &new_ctx[n]) == WUSH_OK);
            if (same_address(new_ctx[n], old_ctx)) reused = n;
        }
        if (reused < 0) {
            printf("capi: no context address was reused: destroyed-context case not run\n");
        } else {
            CHECK(wush_linear_workspace_size(new_ctx[reused], lin, 1, &bytes) == WUSH_ERR_INVALID_ARGUMENT);
            CHECK(wush_linear_run(new_ctx[reused], lin, WUSH_DTYPE_F32, x, 1, WUSH_DTYPE_F32, y, 4, work, bytes + 64) ==
                  WUSH_ERR_INVALID_ARGUMENT);
            CHECK(strstr(wush_last_error(), "destroyed") != NULL);
        }
        for (i = 0; i < n; ++i) wush_context_destroy(new_ctx[i]);
        free(work);
        wush_linear_destroy(lin);
        wush_qweight_destroy(q);
        wush_transform_destroy(t);
    }
}

/* wush_context_describe names the ISA the context runs with (WUSH_CONTEXT_CPU_ISA), not the
 * machine's best: it used to print the best ISA for a context set to scalar. */
static void test_describe_follows_isa(void) {
    wush_context* ctx = NULL;
    char text[256];
    int isa;
    CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx) == WUSH_OK);
    for (isa = WUSH_CPU_ISA_SCALAR; isa <= WUSH_CPU_ISA_AVX512_VNNI; ++isa) {
        char want[64];
        if (wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, isa) != WUSH_OK) continue; /* not on this CPU */
        snprintf(want, sizeof want, "cpu (%s)", wush_cpu_isa_name((wush_cpu_isa)isa));
        CHECK(wush_context_describe(ctx, text, sizeof text) == WUSH_OK);
        CHECK(strcmp(text, want) == 0);
    }
    wush_context_destroy(ctx);
}

/* The largest finite inputs (issue 29, N9): quantize and dequantize agree with each other and with
 * the header. MXFP4 of +-FLT_MAX used to return WUSH_OK with scale byte 0xFE and code 6, which
 * dequantize then refused (6 * 2^127 / 3 = 2^128 is not a float). The oracle is float64
 * arithmetic on the header's rule, not the library. */
static void test_largest_finite_inputs(void) {
    enum { G = 32 };
    wush_context* ctx = NULL;
    float x[G], y[G];
    unsigned char codes[G / 2], scales[2 * (G / 16)];
    size_t i, k;
    /* The largest |x| MXFP4 accepts: |x| * 3 <= 5 * 2^127 (exact in float64). */
    const double limit = ldexp(5.0, 127);
    float edge = (float)(limit / 3.0);
    while ((double)edge * 3.0 > limit) edge = nextafterf(edge, 0.0f);
    while ((double)nextafterf(edge, INFINITY) * 3.0 <= limit) edge = nextafterf(edge, INFINITY);
    CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx) == WUSH_OK);
    for (k = 0; k < sizeof kFormats / sizeof kFormats[0]; ++k) {
        const wush_format f = kFormats[k];
        int sign;
        for (sign = -1; sign <= 1; sign += 2) {
            wush_status q;
            for (i = 0; i < G; ++i) x[i] = (float)i - 16.0f;
            x[5] = (float)sign * FLT_MAX;
            memset(codes, 0xEE, sizeof codes);
            q = wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, x, 1, G, codes, sizeof codes, scales, sizeof scales);
            if (f == WUSH_FORMAT_MXFP4) {
                CHECK(q == WUSH_ERR_NON_FINITE);
                CHECK(strstr(wush_last_error(), "row 0, column 5") != NULL);
                CHECK(all_bytes_are(codes, sizeof codes, 0xEE));
                continue;
            }
            /* Every other format: accepted, and what it wrote dequantizes to finite values. */
            CHECK(q == WUSH_OK);
            CHECK(wush_dequantize_rows(ctx, f, codes, sizeof codes, scales, sizeof scales, 1, G, y, G) == WUSH_OK);
            for (i = 0; i < G; ++i) CHECK(isfinite(y[i]));
            if (f == WUSH_FORMAT_MXFP4_OCP) CHECK(y[5] == (float)(sign * 6.0 * ldexp(1.0, 125)));
            if (f == WUSH_FORMAT_NVFP4) CHECK(y[5] == (float)(sign * 6.0 * 448.0 / 10.0));
        }
    }
    /* MXFP4 at the edge: accepted, scale 2^127 (byte 0xFE), code 4, decoded 4 * 2^127 / 3; the next
     * float up is refused. bf16 inputs follow the same rule. */
    for (i = 0; i < G; ++i) x[i] = 0.0f;
    x[0] = edge;
    x[1] = -edge;
    CHECK(wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, 1, G, codes, sizeof codes, scales, 1) ==
          WUSH_OK);
    CHECK(scales[0] == 0xFE);
    CHECK((codes[0] & 0x0F) == 0x6 && (codes[0] >> 4) == 0xE); /* E2M1 index 6 is 4; bit 3 is the sign */
    CHECK(wush_dequantize_rows(ctx, WUSH_FORMAT_MXFP4, codes, sizeof codes, scales, 1, 1, G, y, G) == WUSH_OK);
    CHECK(y[0] == (float)(4.0 * ldexp(1.0, 127) / 3.0) && y[1] == -y[0]);
    x[1] = -nextafterf(edge, INFINITY);
    CHECK(wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, 1, G, codes, sizeof codes, scales, 1) ==
          WUSH_ERR_NON_FINITE);
    {
        uint16_t b[G];
        memset(b, 0, sizeof b);
        b[3] = 0x7F7F; /* the largest finite bf16, about 3.39e38 */
        CHECK(wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_BF16, b, 1, G, codes, sizeof codes, scales, 1) ==
              WUSH_ERR_NON_FINITE);
        CHECK(wush_quantize_rows(ctx, WUSH_FORMAT_INT4, WUSH_DTYPE_BF16, b, 1, G, codes, sizeof codes, scales, 2) ==
              WUSH_OK);
    }
    /* The activation path follows the same rule (issue 43: it wrote scale 0xFE and code 6 for
     * +-FLT_MAX, which wush_dequantize_rows then refused): through the identity transform the
     * edge value is accepted and decodes, the next float up is refused. */
    {
        wush_transform* t = NULL;
        CHECK(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, G, G, NULL, &t) == WUSH_OK);
        for (i = 0; i < G; ++i) x[i] = 0.0f;
        x[0] = edge;
        CHECK(wush_quantize_activations(ctx, t, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, 1, G, codes, sizeof codes, scales,
                                        1) == WUSH_OK);
        CHECK(wush_dequantize_rows(ctx, WUSH_FORMAT_MXFP4, codes, sizeof codes, scales, 1, 1, G, y, G) == WUSH_OK);
        x[0] = -FLT_MAX;
        CHECK(wush_quantize_activations(ctx, t, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, 1, G, codes, sizeof codes, scales,
                                        1) == WUSH_ERR_NON_FINITE);
        CHECK(strstr(wush_last_error(), "float32 range") != NULL);
        wush_transform_destroy(t);
    }
    wush_context_destroy(ctx);
}

/* f16 and bf16 inputs quantize exactly like the f32 values they encode. */
static void test_half_inputs(void) {
    wush_context* ctx = NULL;
    uint16_t half[COLS], bhalf[COLS];
    float as_float[COLS];
    unsigned char c16[COLS / 2], cf[COLS / 2], s16[8], sf[8];
    size_t i, k;
    for (i = 0; i < COLS; ++i) {
        /* f16 1.mmm x 2^(e-15) with e in [13, 17]: exact small values */
        const unsigned e = 13 + (unsigned)(i % 5), m = (unsigned)(i * 37 % 1024);
        half[i] = (uint16_t)(((i & 1) << 15) | (e << 10) | m);
        as_float[i] = ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15) * ((i & 1) ? -1.0f : 1.0f);
    }
    for (i = 0; i < COLS; ++i) {
        uint32_t u;
        memcpy(&u, &as_float[i], 4);
        bhalf[i] = (uint16_t)(u >> 16);
    }
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (k = 0; k < sizeof kFormats / sizeof kFormats[0]; ++k) {
        float bf_as_float[COLS];
        for (i = 0; i < COLS; ++i) {
            uint32_t u = (uint32_t)bhalf[i] << 16;
            memcpy(&bf_as_float[i], &u, 4);
        }
        memset(s16, 0, sizeof s16);
        memset(sf, 0, sizeof sf);
        CHECK_STATUS(
            wush_quantize_rows(ctx, kFormats[k], WUSH_DTYPE_F16, half, 1, COLS, c16, sizeof c16, s16, sizeof s16),
            WUSH_OK);
        CHECK_STATUS(
            wush_quantize_rows(ctx, kFormats[k], WUSH_DTYPE_F32, as_float, 1, COLS, cf, sizeof cf, sf, sizeof sf),
            WUSH_OK);
        CHECK(memcmp(c16, cf, sizeof cf) == 0 && memcmp(s16, sf, sizeof sf) == 0);
        memset(s16, 0, sizeof s16);
        memset(sf, 0, sizeof sf);
        CHECK_STATUS(
            wush_quantize_rows(ctx, kFormats[k], WUSH_DTYPE_BF16, bhalf, 1, COLS, c16, sizeof c16, s16, sizeof s16),
            WUSH_OK);
        CHECK_STATUS(
            wush_quantize_rows(ctx, kFormats[k], WUSH_DTYPE_F32, bf_as_float, 1, COLS, cf, sizeof cf, sf, sizeof sf),
            WUSH_OK);
        CHECK(memcmp(c16, cf, sizeof cf) == 0 && memcmp(s16, sf, sizeof sf) == 0);
    }
    /* A half infinity is caught too. */
    half[5] = 0x7C00;
    CHECK_STATUS(
        wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F16, half, 1, COLS, c16, sizeof c16, s16, sizeof s16),
        WUSH_ERR_NON_FINITE);
    wush_context_destroy(ctx);
}

/* The last error is per thread; one context shared by two threads serializes correctly. */
struct shared_job {
    wush_context* ctx;
    const float* x;
    unsigned char codes[ROWS * COLS / 2];
    unsigned char scales[ROWS * COLS / 32];
    wush_status status;
    char seen_error[64];
};

static void* worker(void* arg) {
    struct shared_job* job = (struct shared_job*)arg;
    int r;
    snprintf(job->seen_error, sizeof job->seen_error, "%s", wush_last_error());
    for (r = 0; r < 50; ++r)
        job->status = wush_quantize_rows(job->ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, job->x, ROWS, COLS, job->codes,
                                         sizeof job->codes, job->scales, sizeof job->scales);
    return NULL;
}

static void test_threads(void) {
    static struct shared_job jobs[2];
    float x[ROWS * COLS];
    pthread_t t[2];
    unsigned state = 9;
    size_t i;
    wush_context* ctx = NULL;
    for (i = 0; i < ROWS * COLS; ++i) x[i] = gauss(&state);
    CHECK_STATUS(wush_format_group_size((wush_format)9, &i), WUSH_ERR_INVALID_ARGUMENT); /* error on main thread */
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (i = 0; i < 2; ++i) {
        jobs[i].ctx = ctx;
        jobs[i].x = x;
        CHECK(pthread_create(&t[i], NULL, worker, &jobs[i]) == 0);
    }
    for (i = 0; i < 2; ++i) CHECK(pthread_join(t[i], NULL) == 0);
    for (i = 0; i < 2; ++i) {
        CHECK(jobs[i].status == WUSH_OK);
        CHECK(jobs[i].seen_error[0] == '\0'); /* the main thread's error is not visible there */
    }
    CHECK(memcmp(jobs[0].codes, jobs[1].codes, sizeof jobs[0].codes) == 0);
    CHECK(memcmp(jobs[0].scales, jobs[1].scales, sizeof jobs[0].scales) == 0);
    CHECK(strstr(wush_last_error(), "unknown wush_format") != NULL);
    wush_context_destroy(ctx);
}

int main(void) {
    test_version_and_status();
    test_contexts();
    test_format_queries();
    test_quantize_bounds_and_errors();
    test_half_inputs();
    test_largest_finite_inputs();
    test_describe_follows_isa();
    test_reused_addresses();
    test_checkpoint_copy_mode();
    test_checkpoint_grouped_layer();
    test_write_refuses_non_regular();
    test_error_messages_hold_no_control_bytes();
    test_threads();
    printf("capi: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
