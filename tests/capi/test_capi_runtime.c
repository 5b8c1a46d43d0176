/* Tests of the CPU runtime's C API, in plain C99 against the shared library: ISA queries and the
 * WUSH_CONTEXT_CPU_ISA parameter, wush_quantize_activations, wush_gemm, wush_linear_forward and
 * its workspace, wush_linear_run_bias's bias on every ISA, wush_layer_loss_runtime, argument
 * checks, and one transform + qweight shared by several threads (each with its own context).
 *
 * Oracles are independent of the code under test: the float64 product of operands dequantized
 * with wush_dequantize_rows, wush_quantize_rows on the same values (identity transform; a float64
 * transform computed here otherwise), a second path through the API (quantize then gemm), the
 * reference loss wush_layer_loss, and the single-threaded result. Every supported ISA is forced in
 * turn through the context parameter. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "wush/wush.h"

/* ---- data ------------------------------------------------------------------------------------*/

static uint64_t g_rng = 1;

static void rng_seed(uint64_t s) {
    g_rng = s * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
}

static double rng_gauss(void) { /* sum of uniforms: Gaussian enough for test data */
    double s = 0.0;
    int i;
    for (i = 0; i < 12; ++i) {
        g_rng ^= g_rng >> 12;
        g_rng ^= g_rng << 25;
        g_rng ^= g_rng >> 27;
        s += (double)((g_rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
    }
    return s - 6.0;
}

enum { D_IN = 256, D_OUT = 48, N_TOK = 19, N_CAL = 128 };

typedef struct {
    float w[D_OUT * D_IN];
    float x[N_TOK * D_IN];
    float cal[N_CAL * D_IN];
} LayerData;

static LayerData g_layer;

static void make_layer(void) {
    size_t i;
    rng_seed(7);
    for (i = 0; i < D_OUT * D_IN; ++i) g_layer.w[i] = (float)(0.05 * rng_gauss());
    for (i = 0; i < N_TOK * D_IN; ++i) g_layer.x[i] = (float)(rng_gauss() * (i % 11 == 0 ? 6.0 : 1.0));
    for (i = 0; i < N_CAL * D_IN; ++i) g_layer.cal[i] = (float)(rng_gauss() * (i % 11 == 0 ? 6.0 : 1.0));
}

static size_t group_of(wush_format f) {
    size_t g = 0;
    wush_format_group_size(f, &g);
    return g;
}

static wush_transform* make_transform(wush_context* ctx, wush_transform_kind kind, size_t g) {
    wush_calibrator* cal = NULL;
    wush_transform* t = NULL;
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, g_layer.cal, N_CAL), WUSH_OK);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, g_layer.w, D_OUT, D_IN, kind, NULL, &t), WUSH_OK);
    wush_calibrator_destroy(cal);
    return t;
}

static wush_qweight* make_qweight(wush_context* ctx, const wush_transform* t, wush_format f) {
    wush_qweight* q = NULL;
    CHECK_STATUS(wush_qweight_create(ctx, t, f, WUSH_METHOD_RTN, WUSH_DTYPE_F32, g_layer.w, D_OUT, D_IN, NULL, &q),
                 WUSH_OK);
    return q;
}

static const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

static size_t supported_isas(wush_cpu_isa out[3]) {
    size_t n = 0;
    int i;
    for (i = WUSH_CPU_ISA_SCALAR; i <= WUSH_CPU_ISA_AVX512_VNNI; ++i)
        if (wush_cpu_isa_supported((wush_cpu_isa)i)) out[n++] = (wush_cpu_isa)i;
    return n;
}

/* ---- ISA queries and the context parameter -----------------------------------------------------*/

static void test_isa_parameter(void) {
    wush_context* ctx = NULL;
    int64_t v = -1;
    wush_cpu_isa isa = WUSH_CPU_ISA_AUTO;
    int i;
    CHECK(strcmp(wush_cpu_isa_name(WUSH_CPU_ISA_AUTO), "auto") == 0);
    CHECK(strcmp(wush_cpu_isa_name(WUSH_CPU_ISA_AVX512_VNNI), "avx512_vnni") == 0);
    CHECK(wush_cpu_isa_name((wush_cpu_isa)4) == NULL && wush_cpu_isa_name((wush_cpu_isa)-1) == NULL);
    CHECK(wush_cpu_isa_supported(WUSH_CPU_ISA_AUTO) == 1 && wush_cpu_isa_supported(WUSH_CPU_ISA_SCALAR) == 1);
    CHECK(wush_cpu_isa_supported((wush_cpu_isa)99) == 0);

    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_CPU_ISA, &v), WUSH_OK);
    CHECK(v == WUSH_CPU_ISA_AUTO);
    CHECK_STATUS(wush_context_cpu_isa(ctx, &isa), WUSH_OK);
    CHECK(isa != WUSH_CPU_ISA_AUTO && wush_cpu_isa_supported(isa));
    for (i = WUSH_CPU_ISA_SCALAR; i <= WUSH_CPU_ISA_AVX512_VNNI; ++i) {
        const wush_status st = wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, i);
        if (wush_cpu_isa_supported((wush_cpu_isa)i)) {
            CHECK(st == WUSH_OK);
            CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_CPU_ISA, &v), WUSH_OK);
            CHECK(v == i);
            CHECK_STATUS(wush_context_cpu_isa(ctx, &isa), WUSH_OK);
            CHECK((int)isa == i);
        } else {
            CHECK(st == WUSH_ERR_UNSUPPORTED);
        }
    }
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, WUSH_CPU_ISA_SCALAR), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, 4), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, -1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_get_parameter(ctx, WUSH_CONTEXT_CPU_ISA, &v), WUSH_OK);
    CHECK(v == WUSH_CPU_ISA_SCALAR); /* unchanged by the failures */
    CHECK_STATUS(wush_context_cpu_isa(NULL, &isa), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_cpu_isa(ctx, NULL), WUSH_ERR_INVALID_ARGUMENT);
    wush_context_destroy(ctx);
}

/* ---- quantize_activations ----------------------------------------------------------------------*/

/* The identity transform must give exactly wush_quantize_rows; a WUSH transform must give
 * wush_quantize_rows of the float64 transform computed here (rounded to float32), except for a
 * few values whose rounding to float32 crosses a boundary. Every ISA writes the same bytes. */
static void test_quantize_activations(void) {
    wush_cpu_isa isas[3];
    const size_t n_isas = supported_isas(isas);
    size_t fi, ii, i, j, b;
    wush_context* ctx = NULL;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (fi = 0; fi < 4; ++fi) {
        const wush_format f = kFormats[fi];
        const size_t g = group_of(f);
        size_t cb = 0, sb = 0, differ = 0;
        unsigned char *codes, *scales, *ref_codes, *ref_scales, *first_codes, *first_scales;
        float* y = (float*)malloc(sizeof(float) * N_TOK * D_IN);
        float* mats = (float*)malloc(sizeof(float) * D_IN * g);
        wush_transform* ident = NULL;
        wush_transform* wt = make_transform(ctx, WUSH_TRANSFORM_WUSH, g);
        CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, D_IN, g, NULL, &ident), WUSH_OK);
        CHECK_STATUS(wush_format_buffer_sizes(f, N_TOK, D_IN, &cb, &sb), WUSH_OK);
        codes = (unsigned char*)malloc(cb);
        scales = (unsigned char*)malloc(sb);
        ref_codes = (unsigned char*)malloc(cb);
        ref_scales = (unsigned char*)malloc(sb);
        first_codes = (unsigned char*)malloc(cb);
        first_scales = (unsigned char*)malloc(sb);

        /* identity == quantize_rows, on every ISA */
        CHECK_STATUS(wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, ref_codes, cb, ref_scales, sb),
                     WUSH_OK);
        for (ii = 0; ii < n_isas; ++ii) {
            CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, isas[ii]), WUSH_OK);
            memset(codes, 0x5A, cb);
            CHECK_STATUS(
                wush_quantize_activations(ctx, ident, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, codes, cb, scales, sb),
                WUSH_OK);
            CHECK(memcmp(codes, ref_codes, cb) == 0 && memcmp(scales, ref_scales, sb) == 0);
        }

        /* WUSH: float64 transform here, then quantize_rows */
        CHECK_STATUS(wush_transform_matrices(wt, mats, D_IN * g), WUSH_OK);
        for (i = 0; i < N_TOK; ++i)
            for (b = 0; b < D_IN / g; ++b)
                for (j = 0; j < g; ++j) {
                    double s = 0.0;
                    size_t k;
                    for (k = 0; k < g; ++k)
                        s += (double)mats[(b * g + j) * g + k] * (double)g_layer.x[i * D_IN + b * g + k];
                    y[i * D_IN + b * g + j] = (float)s;
                }
        CHECK_STATUS(wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, y, N_TOK, D_IN, ref_codes, cb, ref_scales, sb),
                     WUSH_OK);
        for (ii = 0; ii < n_isas; ++ii) {
            CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, isas[ii]), WUSH_OK);
            CHECK_STATUS(
                wush_quantize_activations(ctx, wt, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, codes, cb, scales, sb),
                WUSH_OK);
            if (ii == 0) {
                memcpy(first_codes, codes, cb);
                memcpy(first_scales, scales, sb);
                for (i = 0; i < cb; ++i) differ += codes[i] != ref_codes[i];
                for (i = 0; i < sb; ++i) differ += scales[i] != ref_scales[i];
            } else {
                CHECK(memcmp(codes, first_codes, cb) == 0 && memcmp(scales, first_scales, sb) == 0);
            }
        }
        CHECK(differ <= cb / 200); /* float32 rounding of y decides a handful of values */

        free(y);
        free(mats);
        free(codes);
        free(scales);
        free(ref_codes);
        free(ref_scales);
        free(first_codes);
        free(first_scales);
        wush_transform_destroy(ident);
        wush_transform_destroy(wt);
    }
    wush_context_destroy(ctx);
}

/* ---- gemm and linear_forward -----------------------------------------------------------------*/

static double rel_frobenius(const float* got, const double* ref, size_t n) {
    double num = 0.0, den = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static uint16_t bf16_rne(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void test_gemm_and_forward(void) {
    wush_cpu_isa isas[3];
    const size_t n_isas = supported_isas(isas);
    size_t fi, ii, mi, i, r, c, k;
    wush_context* ctx = NULL;
    static const size_t ms[] = {1, 3, 5, N_TOK};
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (fi = 0; fi < 4; ++fi) {
        const wush_format f = kFormats[fi];
        const size_t g = group_of(f);
        size_t cb = 0, sb = 0, ws_bytes = 0, wcb = 0, wsb = 0;
        const void *wcodes = NULL, *wscales = NULL;
        wush_transform* t = make_transform(ctx, WUSH_TRANSFORM_WUSH, g);
        wush_qweight* q = make_qweight(ctx, t, f);
        float* wd = (float*)malloc(sizeof(float) * D_OUT * D_IN);
        float* ad = (float*)malloc(sizeof(float) * N_TOK * D_IN);
        float* y = (float*)malloc(sizeof(float) * N_TOK * D_OUT);
        float* y2 = (float*)malloc(sizeof(float) * N_TOK * D_OUT);
        uint16_t* yh = (uint16_t*)malloc(sizeof(uint16_t) * N_TOK * D_OUT);
        double* ref = (double*)malloc(sizeof(double) * N_TOK * D_OUT);
        unsigned char *codes, *scales, *ws;
        CHECK_STATUS(wush_format_buffer_sizes(f, N_TOK, D_IN, &cb, &sb), WUSH_OK);
        codes = (unsigned char*)malloc(cb);
        scales = (unsigned char*)malloc(sb);
        CHECK_STATUS(wush_qweight_data(q, &wcodes, &wcb, &wscales, &wsb), WUSH_OK);
        CHECK_STATUS(wush_dequantize_rows(ctx, f, wcodes, wcb, wscales, wsb, D_OUT, D_IN, wd, D_OUT * D_IN), WUSH_OK);
        CHECK_STATUS(
            wush_quantize_activations(ctx, t, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, codes, cb, scales, sb),
            WUSH_OK);
        CHECK_STATUS(wush_dequantize_rows(ctx, f, codes, cb, scales, sb, N_TOK, D_IN, ad, N_TOK * D_IN), WUSH_OK);
        for (r = 0; r < N_TOK; ++r)
            for (c = 0; c < D_OUT; ++c) {
                double s = 0.0;
                for (k = 0; k < D_IN; ++k) s += (double)ad[r * D_IN + k] * (double)wd[c * D_IN + k];
                ref[r * D_OUT + c] = s;
            }
        CHECK_STATUS(wush_linear_forward_workspace_size(ctx, t, q, N_TOK, &ws_bytes), WUSH_OK);
        CHECK(ws_bytes > 0);
        ws = (unsigned char*)malloc(ws_bytes + 1);
        for (ii = 0; ii < n_isas; ++ii) {
            CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, isas[ii]), WUSH_OK);
            for (mi = 0; mi < 4; ++mi) {
                const size_t m = ms[mi];
                /* the first m rows of the packed activations are the packed first m tokens */
                CHECK_STATUS(wush_gemm(ctx, q, codes, cb, scales, sb, m, WUSH_DTYPE_F32, y, m * D_OUT), WUSH_OK);
                {
                    double num = 0.0, den = 0.0;
                    for (i = 0; i < m * D_OUT; ++i) {
                        num += ((double)y[i] - ref[i]) * ((double)y[i] - ref[i]);
                        den += ref[i] * ref[i];
                    }
                    CHECK(sqrt(num / den) <= 1e-5);
                }
                CHECK_STATUS(wush_gemm(ctx, q, codes, cb, scales, sb, m, WUSH_DTYPE_BF16, yh, m * D_OUT), WUSH_OK);
                for (i = 0; i < m * D_OUT; ++i) CHECK(yh[i] == bf16_rne(y[i]));
                /* forward == quantize + gemm, in a workspace with one spare byte of misalignment */
                CHECK_STATUS(wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, g_layer.x, m, WUSH_DTYPE_F32, y2, m * D_OUT,
                                                 ws + 1, ws_bytes),
                             WUSH_OK);
                CHECK(memcmp(y, y2, sizeof(float) * m * D_OUT) == 0);
            }
            CHECK(rel_frobenius(y, ref, N_TOK * D_OUT) <= 1e-5);
        }
        /* errors: sizes, NULLs, dtypes, handle types, format vs G */
        CHECK_STATUS(wush_gemm(ctx, q, codes, cb - 1, scales, sb, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT),
                     WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(wush_gemm(ctx, q, codes, cb, scales, sb - 1, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT),
                     WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(wush_gemm(ctx, q, codes, cb, scales, sb, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT - 1),
                     WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(wush_gemm(ctx, q, NULL, cb, scales, sb, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_gemm(ctx, q, codes, cb, scales, sb, N_TOK, WUSH_DTYPE_F16, y, N_TOK * D_OUT),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(
            wush_gemm(ctx, (const wush_qweight*)t, codes, cb, scales, sb, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_gemm(ctx, q, NULL, 0, NULL, 0, 0, WUSH_DTYPE_F32, NULL, 0), WUSH_OK);
        CHECK_STATUS(
            wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, g_layer.x, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT, ws, 16),
            WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(
            wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, g_layer.x, N_TOK, WUSH_DTYPE_F32, y, 3, ws, ws_bytes),
            WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(
            wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, NULL, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT, ws, ws_bytes),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_linear_forward(ctx, t, q, (wush_dtype)9, g_layer.x, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT,
                                         ws, ws_bytes),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_linear_forward(ctx, (const wush_transform*)q, q, WUSH_DTYPE_F32, g_layer.x, N_TOK,
                                         WUSH_DTYPE_F32, y, N_TOK * D_OUT, ws, ws_bytes),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, NULL, 0, WUSH_DTYPE_F32, NULL, 0, NULL, 0),
                     WUSH_OK);
        CHECK_STATUS(wush_linear_forward_workspace_size(ctx, t, q, N_TOK, NULL), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(
            wush_quantize_activations(ctx, t, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, codes, cb, scales, sb - 1),
            WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(
            wush_quantize_activations(ctx, t, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN - g, codes, cb, scales, sb),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_quantize_activations(ctx, t, g == 32 ? WUSH_FORMAT_NVFP4 : WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32,
                                               g_layer.x, N_TOK, D_IN, codes, cb, scales, sb),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "group size") != NULL);
        CHECK_STATUS(wush_quantize_activations(ctx, t, f, WUSH_DTYPE_F32, NULL, N_TOK, D_IN, codes, cb, scales, sb),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(
            wush_quantize_activations(NULL, t, f, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, codes, cb, scales, sb),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_quantize_activations(ctx, t, f, WUSH_DTYPE_F32, NULL, 0, D_IN, NULL, 0, NULL, 0), WUSH_OK);
        free(wd);
        free(ad);
        free(y);
        free(y2);
        free(yh);
        free(ref);
        free(codes);
        free(scales);
        free(ws);
        wush_qweight_destroy(q);
        wush_transform_destroy(t);
    }
    wush_context_destroy(ctx);
}

/* A transform and a qweight whose group sizes differ cannot make a layer. */
static void test_mismatched_layer(void) {
    wush_context* ctx = NULL;
    wush_transform* t32 = NULL;
    wush_transform* t16 = NULL;
    wush_qweight* q16 = NULL;
    size_t bytes = 0;
    float y[D_OUT];
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D_IN, 32, NULL, &t32), WUSH_OK);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D_IN, 16, NULL, &t16), WUSH_OK);
    q16 = make_qweight(ctx, t16, WUSH_FORMAT_NVFP4);
    CHECK_STATUS(wush_linear_forward_workspace_size(ctx, t32, q16, 1, &bytes), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_linear_forward(ctx, t32, q16, WUSH_DTYPE_F32, g_layer.x, 1, WUSH_DTYPE_F32, y, D_OUT, y, sizeof y),
        WUSH_ERR_INVALID_ARGUMENT);
    wush_qweight_destroy(q16);
    wush_transform_destroy(t16);
    wush_transform_destroy(t32);
    wush_context_destroy(ctx);
}

static void test_non_finite(void) {
    wush_context* ctx = NULL;
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    float* x = (float*)malloc(sizeof(float) * N_TOK * D_IN);
    float y[N_TOK * D_OUT];
    unsigned char codes[N_TOK * D_IN / 2], scales[N_TOK * D_IN / 32];
    size_t ws_bytes = 0;
    unsigned char* ws;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    t = make_transform(ctx, WUSH_TRANSFORM_WUSH, 32);
    q = make_qweight(ctx, t, WUSH_FORMAT_MXFP4);
    memcpy(x, g_layer.x, sizeof(float) * N_TOK * D_IN);
    x[7 * D_IN + 100] = (float)NAN;
    CHECK_STATUS(wush_quantize_activations(ctx, t, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, N_TOK, D_IN, codes,
                                           sizeof codes, scales, sizeof scales),
                 WUSH_ERR_NON_FINITE);
    CHECK(strstr(wush_last_error(), "row 7, column 100") != NULL);
    CHECK_STATUS(wush_linear_forward_workspace_size(ctx, t, q, N_TOK, &ws_bytes), WUSH_OK);
    ws = (unsigned char*)malloc(ws_bytes);
    y[0] = 42.0f;
    CHECK_STATUS(
        wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, x, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT, ws, ws_bytes),
        WUSH_ERR_NON_FINITE);
    CHECK(y[0] == 42.0f); /* y untouched */
    /* a NaN activation scale (E8M0 0xFF) */
    CHECK_STATUS(wush_quantize_activations(ctx, t, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, g_layer.x, N_TOK, D_IN, codes,
                                           sizeof codes, scales, sizeof scales),
                 WUSH_OK);
    scales[3] = 0xFF;
    CHECK_STATUS(wush_gemm(ctx, q, codes, sizeof codes, scales, sizeof scales, N_TOK, WUSH_DTYPE_F32, y, N_TOK * D_OUT),
                 WUSH_ERR_NON_FINITE);
    CHECK(y[0] == 42.0f);
    free(ws);
    free(x);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    wush_context_destroy(ctx);
}

/* ---- one transform + qweight, several threads ---------------------------------------------------*/

enum { N_THREADS = 4, ROUNDS = 5 };

typedef struct {
    const wush_transform* t;
    const wush_qweight* q;
    int isa;
    const float* expect;
    int ok;
} Job;

static void* worker(void* arg) {
    Job* job = (Job*)arg;
    wush_context* ctx = NULL;
    size_t ws_bytes = 0;
    unsigned char* ws;
    float* y = (float*)malloc(sizeof(float) * N_TOK * D_OUT);
    int round;
    job->ok = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx) == WUSH_OK &&
              wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, job->isa) == WUSH_OK &&
              wush_context_set_parameter(ctx, WUSH_CONTEXT_NUM_THREADS, 1) == WUSH_OK &&
              wush_linear_forward_workspace_size(ctx, job->t, job->q, N_TOK, &ws_bytes) == WUSH_OK;
    ws = (unsigned char*)malloc(ws_bytes);
    for (round = 0; round < ROUNDS && job->ok; ++round) {
        job->ok = wush_linear_forward(ctx, job->t, job->q, WUSH_DTYPE_F32, g_layer.x, N_TOK, WUSH_DTYPE_F32, y,
                                      N_TOK * D_OUT, ws, ws_bytes) == WUSH_OK &&
                  memcmp(y, job->expect, sizeof(float) * N_TOK * D_OUT) == 0;
    }
    free(ws);
    free(y);
    wush_context_destroy(ctx);
    return NULL;
}

static void test_threads(void) {
    wush_cpu_isa isas[3];
    const size_t n_isas = supported_isas(isas);
    size_t ii;
    int i;
    wush_context* ctx = NULL;
    wush_transform* t;
    wush_qweight* q;
    float* expect = (float*)malloc(sizeof(float) * N_TOK * D_OUT);
    size_t ws_bytes = 0;
    unsigned char* ws;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    t = make_transform(ctx, WUSH_TRANSFORM_WUSH, 16);
    q = make_qweight(ctx, t, WUSH_FORMAT_NVFP4);
    for (ii = 0; ii < n_isas; ++ii) {
        pthread_t th[N_THREADS];
        Job jobs[N_THREADS];
        /* the expected result: this ISA, the context's default thread count (results do not
         * depend on the thread count) */
        CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, isas[ii]), WUSH_OK);
        CHECK_STATUS(wush_linear_forward_workspace_size(ctx, t, q, N_TOK, &ws_bytes), WUSH_OK);
        ws = (unsigned char*)malloc(ws_bytes);
        CHECK_STATUS(wush_linear_forward(ctx, t, q, WUSH_DTYPE_F32, g_layer.x, N_TOK, WUSH_DTYPE_F32, expect,
                                         N_TOK * D_OUT, ws, ws_bytes),
                     WUSH_OK);
        free(ws);
        for (i = 0; i < N_THREADS; ++i) {
            jobs[i].t = t;
            jobs[i].q = q;
            jobs[i].isa = isas[ii];
            jobs[i].expect = expect;
            jobs[i].ok = 0;
            CHECK(pthread_create(&th[i], NULL, worker, &jobs[i]) == 0);
        }
        for (i = 0; i < N_THREADS; ++i) {
            pthread_join(th[i], NULL);
            CHECK(jobs[i].ok);
        }
    }
    free(expect);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    wush_context_destroy(ctx);
}

/* ---- the runtime loss ------------------------------------------------------------------------*/

static void test_runtime_loss(void) {
    static const wush_transform_kind kinds[] = {WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD, WUSH_TRANSFORM_WUSH};
    wush_context* ctx = NULL;
    size_t fi, ki;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (fi = 0; fi < 3; ++fi)
        for (ki = 0; ki < 3; ++ki) {
            const wush_format f = kFormats[fi];
            wush_transform* t = make_transform(ctx, kinds[ki], group_of(f));
            wush_qweight* q = make_qweight(ctx, t, f);
            double ref = -1.0, got = -2.0;
            CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, g_layer.w, WUSH_DTYPE_F32, g_layer.x, N_TOK, &ref),
                         WUSH_OK);
            CHECK_STATUS(
                wush_layer_loss_runtime(ctx, t, q, WUSH_DTYPE_F32, g_layer.w, WUSH_DTYPE_F32, g_layer.x, N_TOK, &got),
                WUSH_OK);
            CHECK(ref > 0.0 && fabs(got - ref) <= 1e-6 * ref);
            CHECK_STATUS(
                wush_layer_loss_runtime(ctx, t, q, WUSH_DTYPE_F32, g_layer.w, WUSH_DTYPE_F32, g_layer.x, 0, &got),
                WUSH_ERR_INVALID_ARGUMENT);
            wush_qweight_destroy(q);
            wush_transform_destroy(t);
        }
    wush_context_destroy(ctx);
}

/* wush_linear_run_bias on every ISA's kernels (the layer prepared after the ISA is set, so that
 * its packed panels and row blocks are that ISA's), d_out = 45 so that the last stores are partial
 * vectors: y equals the bias-free forward plus the bias, added here in float32 (bit for bit) and
 * rounded here to bf16 for a BF16 y. */
static void test_bias_every_isa(void) {
    enum { N_OUT = 45 };
    wush_cpu_isa isas[3];
    const size_t n_isas = supported_isas(isas);
    static const size_t ms[] = {1, 3, 5, N_TOK};
    float b[N_OUT], y0[N_TOK * N_OUT], y[N_TOK * N_OUT];
    uint16_t b16[N_OUT], yh[N_TOK * N_OUT];
    size_t ii, fi, mi, i;
    wush_context* ctx = NULL;
    for (i = 0; i < N_OUT; ++i) {
        uint32_t u;
        b[i] = (float)(0.25 * rng_gauss());
        memcpy(&u, &b[i], 4);
        b16[i] = (uint16_t)(u >> 16);
        u = (uint32_t)b16[i] << 16; /* the F32 bias holds the BF16 bias's values: one expectation */
        memcpy(&b[i], &u, 4);
    }
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    for (ii = 0; ii < n_isas; ++ii) {
        CHECK_STATUS(wush_context_set_parameter(ctx, WUSH_CONTEXT_CPU_ISA, isas[ii]), WUSH_OK);
        for (fi = 0; fi < 4; ++fi) {
            wush_transform* t = make_transform(ctx, WUSH_TRANSFORM_WUSH, group_of(kFormats[fi]));
            wush_qweight* q = NULL;
            wush_linear* lin = NULL;
            size_t ws_bytes = 0;
            void* ws;
            CHECK_STATUS(wush_qweight_create(ctx, t, kFormats[fi], WUSH_METHOD_RTN, WUSH_DTYPE_F32, g_layer.w, N_OUT,
                                             D_IN, NULL, &q),
                         WUSH_OK);
            CHECK_STATUS(wush_linear_create(ctx, t, q, &lin), WUSH_OK);
            CHECK_STATUS(wush_linear_workspace_size(ctx, lin, N_TOK, &ws_bytes), WUSH_OK);
            ws = malloc(ws_bytes);
            for (mi = 0; mi < 4; ++mi) {
                const size_t m = ms[mi];
                size_t bad = 0;
                CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, g_layer.x, m, WUSH_DTYPE_F32, y0, m * N_OUT, ws,
                                             ws_bytes),
                             WUSH_OK);
                CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, g_layer.x, m, WUSH_DTYPE_F32, b, N_OUT,
                                                  WUSH_DTYPE_F32, y, m * N_OUT, ws, ws_bytes),
                             WUSH_OK);
                for (i = 0; i < m * N_OUT; ++i) {
                    const float want = y0[i] + b[i % N_OUT];
                    bad += memcmp(&y[i], &want, 4) != 0;
                }
                CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, g_layer.x, m, WUSH_DTYPE_BF16, b16, N_OUT,
                                                  WUSH_DTYPE_BF16, yh, m * N_OUT, ws, ws_bytes),
                             WUSH_OK);
                for (i = 0; i < m * N_OUT; ++i) bad += yh[i] != bf16_rne(y0[i] + b[i % N_OUT]);
                CHECK(bad == 0);
            }
            free(ws);
            wush_linear_destroy(lin);
            wush_qweight_destroy(q);
            wush_transform_destroy(t);
        }
    }
    wush_context_destroy(ctx);
}

int main(void) {
    make_layer();
    test_isa_parameter();
    test_quantize_activations();
    test_gemm_and_forward();
    test_bias_every_isa();
    test_mismatched_layer();
    test_non_finite();
    test_threads();
    test_runtime_loss();
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
