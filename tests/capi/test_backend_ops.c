/* Cross-backend test of the runtime operations (in the spirit of ggml's test-backend-ops): every
 * operation runs on the backend under test and on a CPU reference context with the portable
 * (scalar, float64-definition) kernels, on the same inputs:
 *   - activation codes and scales: bit-equal;
 *   - the layer output: against a float64 product of the dequantized operands (wush_dequantize_rows
 *     of both sides), within float32 accumulation tolerance;
 *   - the prepared layer (wush_linear) and the per-call functions agree;
 *   - bad input returns the documented statuses.
 * Usage: test_backend_ops cpu|cuda. For cuda, exit code 77 (ctest: SKIPPED, never passed) when no
 * CUDA device is usable. Built with WUSH_TEST_CUDA, tensors travel through cudaMalloc'ed memory
 * and the launches are also captured in a CUDA graph. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#ifdef WUSH_TEST_CUDA
#  include <cuda_runtime_api.h>
#endif

enum { D_IN = 256, D_OUT = 100, N_CAL = 512 };

static wush_backend g_backend;

/* ---- memory of the backend under test ------------------------------------------------------- */

static void* dev_alloc(size_t bytes) {
#ifdef WUSH_TEST_CUDA
    if (g_backend == WUSH_BACKEND_CUDA) {
        void* p = NULL;
        return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
    }
#endif
    return malloc(bytes ? bytes : 1);
}

static void dev_free(void* p) {
#ifdef WUSH_TEST_CUDA
    if (g_backend == WUSH_BACKEND_CUDA) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

static void to_dev(void* dst, const void* src, size_t bytes) {
#ifdef WUSH_TEST_CUDA
    if (g_backend == WUSH_BACKEND_CUDA) {
        CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

static void to_host(void* dst, const void* src, size_t bytes) {
#ifdef WUSH_TEST_CUDA
    if (g_backend == WUSH_BACKEND_CUDA) {
        CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

/* ---- data ------------------------------------------------------------------------------------ */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static double uniform(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

/* Heavy-ish tails and a few loud channels, so that blocks differ and scales vary. */
static void fill(float* x, size_t rows, size_t cols, double outlier) {
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) {
            double v = sqrt(-2.0 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform());
            if (c % 37 == 5) v *= outlier;
            x[r * cols + c] = (float)v;
        }
}

typedef struct {
    wush_transform* t;
    wush_qweight* w;
    wush_format format;
} Layer;

static Layer make_layer(wush_context* cpu, wush_transform_kind kind, wush_format format, const float* weight,
                        const float* cal) {
    Layer l = {NULL, NULL, format};
    size_t g = 0;
    CHECK_STATUS(wush_format_group_size(format, &g), WUSH_OK);
    if (kind == WUSH_TRANSFORM_WUSH) {
        wush_calibrator* c = NULL;
        CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &c), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(cpu, c, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
        CHECK_STATUS(wush_transform_build(cpu, c, WUSH_DTYPE_F32, weight, D_OUT, D_IN, kind, NULL, &l.t), WUSH_OK);
        wush_calibrator_destroy(c);
    } else {
        CHECK_STATUS(wush_transform_create_fixed(kind, D_IN, g, NULL, &l.t), WUSH_OK);
    }
    CHECK_STATUS(
        wush_qweight_create(cpu, l.t, format, WUSH_METHOD_RTN, WUSH_DTYPE_F32, weight, D_OUT, D_IN, NULL, &l.w),
        WUSH_OK);
    return l;
}

/* Y_ref (float64) = dequantized activations times dequantized weights transposed; `mag` gets
 * sum |terms| per output, the scale of float32 accumulation error. */
static void reference(wush_context* cpu, const Layer* l, const uint8_t* codes, const uint8_t* scales, size_t m,
                      double* y, double* mag) {
    const void *wc = NULL, *ws = NULL;
    size_t wcb = 0, wsb = 0, acb = 0, asb = 0;
    CHECK_STATUS(wush_qweight_data(l->w, &wc, &wcb, &ws, &wsb), WUSH_OK);
    CHECK_STATUS(wush_format_buffer_sizes(l->format, m, D_IN, &acb, &asb), WUSH_OK);
    float* a = malloc(sizeof(float) * m * D_IN);
    float* w = malloc(sizeof(float) * D_OUT * D_IN);
    CHECK_STATUS(wush_dequantize_rows(cpu, l->format, codes, acb, scales, asb, m, D_IN, a, m * D_IN), WUSH_OK);
    CHECK_STATUS(wush_dequantize_rows(cpu, l->format, wc, wcb, ws, wsb, D_OUT, D_IN, w, D_OUT * D_IN), WUSH_OK);
    for (size_t r = 0; r < m; ++r)
        for (size_t n = 0; n < D_OUT; ++n) {
            double s = 0.0, t = 0.0;
            for (size_t k = 0; k < D_IN; ++k) {
                s += (double)a[r * D_IN + k] * w[n * D_IN + k];
                t += fabs((double)a[r * D_IN + k] * w[n * D_IN + k]);
            }
            y[r * D_OUT + n] = s;
            mag[r * D_OUT + n] = t;
        }
    free(a);
    free(w);
}

static int close_to(const float* y, const double* ref, const double* mag, size_t count) {
    for (size_t i = 0; i < count; ++i)
        if (!(fabs((double)y[i] - ref[i]) <= 1e-5 * mag[i] + 1e-30)) {
            fprintf(stderr, "y[%zu] = %.9g, float64 reference %.9g (sum|terms| %.3g)\n", i, y[i], ref[i], mag[i]);
            return 0;
        }
    return 1;
}

/* ---- one layer, one token count ------------------------------------------------------------- */

/* wush_linear_run_quantized after wush_linear_quantize gives wush_linear_run's bytes (`y` holds
 * them, read back); wush_linear_last_kernels names a quantize and a GEMM kernel of the backend for
 * the run, the quantize alone for wush_linear_quantize and the GEMM alone for the split GEMM. */
static void check_split_run(wush_context* ctx, wush_linear* lin, const void* dx, void* dc, void* ds, size_t cb,
                            size_t sb, void* dy, const float* y, size_t m, void* dws, size_t ws_bytes) {
    const char* q = g_backend == WUSH_BACKEND_CPU ? "cpu.quantize." : "quantize.";
    const char* g = g_backend == WUSH_BACKEND_CPU ? "cpu.gemm." : "gemm.";
    char names[64];
    CHECK_STATUS(wush_linear_last_kernels(lin, names, sizeof names), WUSH_OK);
    CHECK(strncmp(names, q, strlen(q)) == 0 && strstr(names, " ") != NULL &&
          strncmp(strstr(names, " ") + 1, g, strlen(g)) == 0);
    CHECK_STATUS(wush_linear_last_kernels(lin, names, strlen(names)), WUSH_ERR_BUFFER_TOO_SMALL); /* no room for NUL */

    float* y2 = malloc(sizeof(float) * m * D_OUT);
    void* dy2 = dev_alloc(sizeof(float) * m * D_OUT);
    CHECK_STATUS(wush_linear_quantize(ctx, lin, WUSH_DTYPE_F32, dx, m, dc, cb, ds, sb), WUSH_OK);
    CHECK_STATUS(wush_linear_last_kernels(lin, names, sizeof names), WUSH_OK);
    CHECK(strncmp(names, q, strlen(q)) == 0 && strchr(names, ' ') == NULL);
    CHECK_STATUS(wush_linear_run_quantized(ctx, lin, dc, cb, ds, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    CHECK_STATUS(wush_linear_last_kernels(lin, names, sizeof names), WUSH_OK);
    CHECK(strncmp(names, g, strlen(g)) == 0 && strchr(names, ' ') == NULL);
    to_host(y2, dy2, sizeof(float) * m * D_OUT);
    CHECK(memcmp(y2, y, sizeof(float) * m * D_OUT) == 0);

    /* Errors: short activations, y or workspace; NULL operands; a bad dtype. Nothing written. */
    CHECK_STATUS(
        wush_linear_run_quantized(ctx, lin, dc, cb - 1, ds, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, ws_bytes),
        WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(
        wush_linear_run_quantized(ctx, lin, dc, cb, ds, sb - 1, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, ws_bytes),
        WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(
        wush_linear_run_quantized(ctx, lin, dc, cb, ds, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT - 1, dws, ws_bytes),
        WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(wush_linear_run_quantized(ctx, lin, dc, cb, ds, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, 0),
                 WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(
        wush_linear_run_quantized(ctx, lin, NULL, cb, ds, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, ws_bytes),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_linear_run_quantized(ctx, lin, dc, cb, NULL, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, ws_bytes),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_run_quantized(ctx, lin, dc, cb, ds, sb, m, WUSH_DTYPE_F16, dy2, m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_run_quantized(ctx, lin, NULL, 0, NULL, 0, 0, WUSH_DTYPE_F32, NULL, 0, NULL, 0), WUSH_OK);
    CHECK_STATUS(wush_linear_run_quantized(ctx, NULL, dc, cb, ds, sb, m, WUSH_DTYPE_F32, dy2, m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_last_kernels(NULL, names, sizeof names), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_last_kernels(lin, NULL, sizeof names), WUSH_ERR_INVALID_ARGUMENT);
    dev_free(dy2);
    free(y2);
}

static void check_layer(wush_context* ctx, wush_context* ref_ctx, const Layer* l, const float* x, size_t m) {
    size_t cb = 0, sb = 0, ws_bytes = 0;
    CHECK_STATUS(wush_format_buffer_sizes(l->format, m, D_IN, &cb, &sb), WUSH_OK);
    uint8_t *ref_codes = malloc(cb), *ref_scales = malloc(sb), *codes = malloc(cb), *scales = malloc(sb);
    CHECK_STATUS(
        wush_quantize_activations(ref_ctx, l->t, l->format, WUSH_DTYPE_F32, x, m, D_IN, ref_codes, cb, ref_scales, sb),
        WUSH_OK);

    void *dx = dev_alloc(sizeof(float) * m * D_IN), *dc = dev_alloc(cb), *ds = dev_alloc(sb);
    void* dy = dev_alloc(sizeof(float) * m * D_OUT);
    to_dev(dx, x, sizeof(float) * m * D_IN);

    /* Per-call fused quantization: the same bytes as the float64-definition path. */
    CHECK_STATUS(wush_quantize_activations(ctx, l->t, l->format, WUSH_DTYPE_F32, dx, m, D_IN, dc, cb, ds, sb), WUSH_OK);
    to_host(codes, dc, cb);
    to_host(scales, ds, sb);
    CHECK(memcmp(codes, ref_codes, cb) == 0 && memcmp(scales, ref_scales, sb) == 0);

    /* The prepared layer: same bytes, and the forward against the float64 product. */
    wush_linear* lin = NULL;
    char names[64];
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, &lin), WUSH_OK);
    CHECK_STATUS(wush_linear_last_kernels(lin, names, sizeof names), WUSH_OK);
    CHECK(names[0] == '\0'); /* no call yet */
    memset(codes, 0xAB, cb);
    to_dev(dc, codes, cb);
    CHECK_STATUS(wush_linear_quantize(ctx, lin, WUSH_DTYPE_F32, dx, m, dc, cb, ds, sb), WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(codes, dc, cb);
    to_host(scales, ds, sb);
    CHECK(memcmp(codes, ref_codes, cb) == 0 && memcmp(scales, ref_scales, sb) == 0);

    double* yref = malloc(sizeof(double) * m * D_OUT);
    double* mag = malloc(sizeof(double) * m * D_OUT);
    float* y = malloc(sizeof(float) * m * D_OUT);
    reference(ref_ctx, l, ref_codes, ref_scales, m, yref, mag);

    CHECK_STATUS(wush_linear_workspace_size(ctx, lin, m, &ws_bytes), WUSH_OK);
    void* dws = dev_alloc(ws_bytes);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(y, dy, sizeof(float) * m * D_OUT);
    CHECK(close_to(y, yref, mag, m * D_OUT));
    check_split_run(ctx, lin, dx, dc, ds, cb, sb, dy, y, m, dws, ws_bytes);

    /* The per-call GEMM and forward give the same product. */
    to_dev(dc, ref_codes, cb);
    to_dev(ds, ref_scales, sb);
    CHECK_STATUS(wush_gemm(ctx, l->w, dc, cb, ds, sb, m, WUSH_DTYPE_F32, dy, m * D_OUT), WUSH_OK);
    to_host(y, dy, sizeof(float) * m * D_OUT);
    CHECK(close_to(y, yref, mag, m * D_OUT));
    size_t fw_bytes = 0;
    CHECK_STATUS(wush_linear_forward_workspace_size(ctx, l->t, l->w, m, &fw_bytes), WUSH_OK);
    void* dfw = dev_alloc(fw_bytes);
    CHECK_STATUS(
        wush_linear_forward(ctx, l->t, l->w, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dfw, fw_bytes),
        WUSH_OK);
    to_host(y, dy, sizeof(float) * m * D_OUT);
    CHECK(close_to(y, yref, mag, m * D_OUT));

    /* Errors: a workspace one byte short, y too short; nothing crashes. */
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, 0),
                 WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT - 1, dws, ws_bytes),
                 WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, NULL, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F16, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);

    wush_linear_destroy(lin);
    dev_free(dws);
    dev_free(dfw);
    dev_free(dx);
    dev_free(dc);
    dev_free(ds);
    dev_free(dy);
    free(ref_codes);
    free(ref_scales);
    free(codes);
    free(scales);
    free(yref);
    free(mag);
    free(y);
}

/* ---- the bias of wush_linear_run_bias ------------------------------------------------------- */

/* Bias values k / 64 with |k| <= 255: exact in F32, F16 and BF16, so the three dtypes carry the
 * same values. One is -0.0 (its sign must not matter to the sum). */
static void make_bias(float* b, uint16_t* b_bf16, uint16_t* b_f16, size_t n) {
    for (size_t j = 0; j < n; ++j) {
        const int k = (int)(uniform() * 511.0) - 255;
        b[j] = j == 3 ? -0.0f : (float)k / 64.0f;
        uint32_t u;
        memcpy(&u, &b[j], 4);
        b_bf16[j] = (uint16_t)(u >> 16); /* exact: at most 8 significant bits */
        /* binary16 from the value's exponent and 10 mantissa bits (exact, normal or zero) */
        const double a = fabs((double)b[j]);
        uint16_t h = (uint16_t)(signbit(b[j]) ? 0x8000u : 0u);
        if (a != 0.0) {
            int e = 0;
            const double f = frexp(a, &e); /* a = f 2^e, f in [0.5, 1): 1.m x 2^(e - 1) */
            h |= (uint16_t)((unsigned)(e - 1 + 15) << 10 | (unsigned)((2.0 * f - 1.0) * 1024.0));
        }
        b_f16[j] = h;
    }
}

/* Round-to-nearest-even float32 -> bf16 bits, written here from the definition (finite values). */
static uint16_t bf16_rne(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* y = product + bias, added in float32 before the rounding. Oracles: the bias-free forward of the
 * same layer, plus the bias, rounded here (bit for bit: the bias is added to the very float32 the
 * bias-free forward stores); the float64 product of the dequantized operands plus the bias (to
 * float32 accumulation tolerance); a NULL bias gives wush_linear_run's bytes. */
static void check_bias(wush_context* ctx, wush_context* ref_ctx, const Layer* l, const float* x, size_t m) {
    size_t cb = 0, sb = 0, ws_bytes = 0;
    CHECK_STATUS(wush_format_buffer_sizes(l->format, m, D_IN, &cb, &sb), WUSH_OK);
    uint8_t *codes = malloc(cb), *scales = malloc(sb);
    CHECK_STATUS(wush_quantize_activations(ref_ctx, l->t, l->format, WUSH_DTYPE_F32, x, m, D_IN, codes, cb, scales, sb),
                 WUSH_OK);
    double* yref = malloc(sizeof(double) * m * D_OUT);
    double* mag = malloc(sizeof(double) * m * D_OUT);
    reference(ref_ctx, l, codes, scales, m, yref, mag);

    float b[D_OUT];
    uint16_t b_bf16[D_OUT], b_f16[D_OUT];
    make_bias(b, b_bf16, b_f16, D_OUT);
    wush_linear* lin = NULL;
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, &lin), WUSH_OK);
    CHECK_STATUS(wush_linear_workspace_size(ctx, lin, m, &ws_bytes), WUSH_OK);
    void *dx = dev_alloc(sizeof(float) * m * D_IN), *dy = dev_alloc(sizeof(float) * m * D_OUT);
    void *dws = dev_alloc(ws_bytes), *db = dev_alloc(sizeof b), *db16 = dev_alloc(sizeof b_bf16),
         *dh16 = dev_alloc(sizeof b_f16);
    to_dev(dx, x, sizeof(float) * m * D_IN);
    to_dev(db, b, sizeof b);
    to_dev(db16, b_bf16, sizeof b_bf16);
    to_dev(dh16, b_f16, sizeof b_f16);
    float* y0 = malloc(sizeof(float) * m * D_OUT);
    float* y = malloc(sizeof(float) * m * D_OUT);
    float* want = malloc(sizeof(float) * m * D_OUT);
    double* ref_b = malloc(sizeof(double) * m * D_OUT);
    double* mag_b = malloc(sizeof(double) * m * D_OUT);
    uint16_t* yh0 = malloc(sizeof(uint16_t) * m * D_OUT);
    uint16_t* yh = malloc(sizeof(uint16_t) * m * D_OUT);

    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(y0, dy, sizeof(float) * m * D_OUT);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_BF16, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(yh0, dy, sizeof(uint16_t) * m * D_OUT);
    for (size_t i = 0; i < m * D_OUT; ++i) {
        want[i] = y0[i] + b[i % D_OUT];
        ref_b[i] = yref[i] + (double)b[i % D_OUT];
        mag_b[i] = mag[i] + fabs((double)b[i % D_OUT]);
    }

    /* NULL bias: wush_linear_run's bytes (the bias arguments are not read). */
    CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, (wush_dtype)9, NULL, 0, WUSH_DTYPE_F32, dy,
                                      m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(y, dy, sizeof(float) * m * D_OUT);
    CHECK(memcmp(y, y0, sizeof(float) * m * D_OUT) == 0);
    CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, NULL, D_OUT, WUSH_DTYPE_BF16, dy,
                                      m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(yh, dy, sizeof(uint16_t) * m * D_OUT);
    CHECK(memcmp(yh, yh0, sizeof(uint16_t) * m * D_OUT) == 0);

    /* Each bias dtype, each output dtype. */
    const wush_dtype dtypes[] = {WUSH_DTYPE_F32, WUSH_DTYPE_F16, WUSH_DTYPE_BF16};
    const void* biases[] = {db, dh16, db16};
    for (int d = 0; d < 3; ++d) {
        memset(y, 0, sizeof(float) * m * D_OUT);
        to_dev(dy, y, sizeof(float) * m * D_OUT);
        CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, dtypes[d], biases[d], D_OUT, WUSH_DTYPE_F32,
                                          dy, m * D_OUT, dws, ws_bytes),
                     WUSH_OK);
        CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
        to_host(y, dy, sizeof(float) * m * D_OUT);
        CHECK(memcmp(y, want, sizeof(float) * m * D_OUT) == 0);
        CHECK(close_to(y, ref_b, mag_b, m * D_OUT));
        CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, dtypes[d], biases[d], D_OUT, WUSH_DTYPE_BF16,
                                          dy, m * D_OUT, dws, ws_bytes),
                     WUSH_OK);
        CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
        to_host(yh, dy, sizeof(uint16_t) * m * D_OUT);
        size_t bad = 0;
        for (size_t i = 0; i < m * D_OUT; ++i) bad += yh[i] != bf16_rne(want[i]);
        CHECK(bad == 0);
    }

    /* Errors: the bias's length and dtype (also with no tokens), a NaN or infinity in it. */
    CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, db, D_OUT - 1, WUSH_DTYPE_F32,
                                      dy, m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "d_out") != NULL);
    CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, NULL, 0, WUSH_DTYPE_F32, db, D_OUT + 1, WUSH_DTYPE_F32,
                                      NULL, 0, NULL, 0),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, NULL, 0, WUSH_DTYPE_F32, db, D_OUT, WUSH_DTYPE_F32,
                                      NULL, 0, NULL, 0),
                 WUSH_OK);
    CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, (wush_dtype)9, db, D_OUT, WUSH_DTYPE_F32, dy,
                                      m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);
    const float specials[] = {NAN, -INFINITY};
    for (int s = 0; s < 2; ++s) {
        float bad_b[D_OUT];
        memcpy(bad_b, b, sizeof b);
        bad_b[57] = specials[s];
        to_dev(db, bad_b, sizeof bad_b);
        for (size_t i = 0; i < m * D_OUT; ++i) y[i] = 1.5f;
        to_dev(dy, y, sizeof(float) * m * D_OUT);
        wush_status st = wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, db, D_OUT,
                                              WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes);
        if (g_backend == WUSH_BACKEND_CUDA) {
            CHECK(st == WUSH_OK);
            st = wush_context_synchronize(ctx);
        }
        CHECK(st == WUSH_ERR_NON_FINITE);
        CHECK(strstr(wush_last_error(), "bias holds a NaN or infinite value at column 57") != NULL);
        CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK); /* reported once */
        if (g_backend == WUSH_BACKEND_CPU) {                  /* y untouched */
            size_t changed = 0;
            to_host(y, dy, sizeof(float) * m * D_OUT);
            for (size_t i = 0; i < m * D_OUT; ++i) changed += y[i] != 1.5f;
            CHECK(changed == 0);
        }
    }
    to_dev(db, b, sizeof b);
#ifdef WUSH_TEST_CUDA
    if (g_backend == WUSH_BACKEND_CUDA) {
        CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, b, D_OUT, WUSH_DTYPE_F32, dy,
                                          m * D_OUT, dws, ws_bytes),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "host pointer") != NULL);
        CHECK_STATUS(wush_linear_run_bias(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, (char*)db + 2, D_OUT,
                                          WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "bias (F32) is not 4-byte aligned") != NULL);
    }
#endif

    wush_linear_destroy(lin);
    dev_free(dx);
    dev_free(dy);
    dev_free(dws);
    dev_free(db);
    dev_free(db16);
    dev_free(dh16);
    free(codes);
    free(scales);
    free(yref);
    free(mag);
    free(y0);
    free(y);
    free(want);
    free(ref_b);
    free(mag_b);
    free(yh0);
    free(yh);
}

/* A workspace sized for n tokens serves every smaller batch ("for up to n_tokens tokens"): the
 * sizes never shrink as n grows, though the kernels change with n (CPU: the GEMM's split layout up
 * to 4 rows; CUDA: decode, reference path, prefill kernel), and one workspace runs them all. */
static void check_workspace_up_to(wush_context* ctx, const Layer* l, const float* x) {
    wush_linear* lin = NULL;
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, &lin), WUSH_OK);
    size_t prev_layer = 0, prev_call = 0, shrinks = 0;
    for (size_t n = 1; n <= 600; ++n) {
        size_t layer_bytes = 0, call_bytes = 0;
        CHECK_STATUS(wush_linear_workspace_size(ctx, lin, n, &layer_bytes), WUSH_OK);
        CHECK_STATUS(wush_linear_forward_workspace_size(ctx, l->t, l->w, n, &call_bytes), WUSH_OK);
        shrinks += layer_bytes < prev_layer || call_bytes < prev_call;
        prev_layer = layer_bytes;
        prev_call = call_bytes;
    }
    CHECK(shrinks == 0);
    const size_t most = 130;
    size_t ws_bytes = 0;
    CHECK_STATUS(wush_linear_workspace_size(ctx, lin, most, &ws_bytes), WUSH_OK);
    void *dx = dev_alloc(sizeof(float) * most * D_IN), *dy = dev_alloc(sizeof(float) * most * D_OUT);
    void* dws = dev_alloc(ws_bytes);
    to_dev(dx, x, sizeof(float) * most * D_IN);
    const size_t counts[] = {1, 4, 5, 16, 17, 33, 64, 127, 128, most};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; ++i)
        CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, counts[i], WUSH_DTYPE_BF16, dy, counts[i] * D_OUT,
                                     dws, ws_bytes),
                     WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    wush_linear_destroy(lin);
    dev_free(dx);
    dev_free(dy);
    dev_free(dws);
}

/* A NaN in the activations: NON_FINITE from the launch (CPU) or the next synchronize (CUDA). */
static void check_non_finite(wush_context* ctx, const Layer* l, float* x) {
    const size_t m = 3;
    size_t ws_bytes = 0;
    wush_linear* lin = NULL;
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, &lin), WUSH_OK);
    CHECK_STATUS(wush_linear_workspace_size(ctx, lin, m, &ws_bytes), WUSH_OK);
    const float saved = x[D_IN + 7];
    x[D_IN + 7] = NAN;
    void *dx = dev_alloc(sizeof(float) * m * D_IN), *dy = dev_alloc(sizeof(float) * m * D_OUT);
    void* dws = dev_alloc(ws_bytes);
    to_dev(dx, x, sizeof(float) * m * D_IN);
    wush_status st = wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes);
    if (g_backend == WUSH_BACKEND_CUDA) {
        CHECK(st == WUSH_OK);
        st = wush_context_synchronize(ctx);
    }
    CHECK(st == WUSH_ERR_NON_FINITE);
    CHECK(strstr(wush_last_error(), "row 1, column 7") != NULL);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK); /* reported once */
    x[D_IN + 7] = saved;
    wush_linear_destroy(lin);
    dev_free(dx);
    dev_free(dy);
    dev_free(dws);
}

/* Calibration on the backend (x in its memory) equals the CPU calibrator's float64 sums to 1e-9
 * relative, in both moment modes; the result merges with a CPU calibrator. */
static void check_calibration(wush_context* ctx, wush_context* cpu, const float* x, size_t n) {
    const wush_moment_mode modes[] = {WUSH_MOMENTS_BLOCK_DIAGONAL, WUSH_MOMENTS_FULL};
    void* dx = dev_alloc(sizeof(float) * n * D_IN);
    to_dev(dx, x, sizeof(float) * n * D_IN);
    for (int i = 0; i < 2; ++i) {
        wush_calibrator *on_backend = NULL, *on_cpu = NULL;
        CHECK_STATUS(wush_calibrator_create(D_IN, 32, modes[i], &on_backend), WUSH_OK);
        CHECK_STATUS(wush_calibrator_create(D_IN, 32, modes[i], &on_cpu), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, on_backend, WUSH_DTYPE_F32, dx, n), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(cpu, on_cpu, WUSH_DTYPE_F32, x, n), WUSH_OK);
        double a[32 * 32], b[32 * 32];
        for (size_t block = 0; block < D_IN / 32; ++block) {
            CHECK_STATUS(wush_calibrator_second_moment(on_backend, block, a, 32 * 32), WUSH_OK);
            CHECK_STATUS(wush_calibrator_second_moment(on_cpu, block, b, 32 * 32), WUSH_OK);
            double worst = 0.0;
            for (size_t e = 0; e < 32 * 32; ++e) {
                const double rel = fabs(a[e] - b[e]) / (fabs(b[e]) + 1e-300);
                if (b[e] != 0.0 && rel > worst) worst = rel;
            }
            CHECK(worst <= 1e-9);
        }
        CHECK_STATUS(wush_calibrator_merge(on_cpu, on_backend), WUSH_OK);
        uint64_t tokens = 0;
        CHECK_STATUS(wush_calibrator_token_count(on_cpu, &tokens), WUSH_OK);
        CHECK(tokens == 2 * n);
        wush_calibrator_destroy(on_backend);
        wush_calibrator_destroy(on_cpu);
    }
    dev_free(dx);
}

/* Valid-by-spec extremes whose product overflows float32 (activation scales 2^127 under code 6):
 * NON_FINITE, never infinities with WUSH_OK. (CPU: the CUDA launches do not read y back.) */
static void check_overflowing_product(wush_context* ctx, const Layer* l) {
    if (l->format != WUSH_FORMAT_MXFP4 || g_backend != WUSH_BACKEND_CPU) return;
    const size_t m = 2;
    size_t cb = 0, sb = 0;
    CHECK_STATUS(wush_format_buffer_sizes(l->format, m, D_IN, &cb, &sb), WUSH_OK);
    uint8_t* codes = malloc(cb);
    uint8_t* scales = malloc(sb);
    float* y = malloc(sizeof(float) * m * D_OUT);
    memset(codes, 0x77, cb); /* every element +6 */
    memset(scales, 127, sb); /* 2^0 */
    CHECK_STATUS(wush_gemm(ctx, l->w, codes, cb, scales, sb, m, WUSH_DTYPE_F32, y, m * D_OUT), WUSH_OK);
    memset(scales, 254, sb); /* 2^127: valid, but 6 x 2^127 x weights overflows */
    CHECK_STATUS(wush_gemm(ctx, l->w, codes, cb, scales, sb, m, WUSH_DTYPE_F32, y, m * D_OUT), WUSH_ERR_NON_FINITE);
    CHECK(strstr(wush_last_error(), "overflows float32") != NULL);
    free(codes);
    free(scales);
    free(y);
}

/* Misuse of prepared layers and streams. */
static void check_misuse(wush_context* ctx, wush_context* other, const Layer* l) {
    wush_linear* lin = NULL;
    size_t bytes = 0, d_out = 0, d_in = 0;
    wush_format f = WUSH_FORMAT_INT4;
    CHECK_STATUS(wush_linear_create(ctx, l->t, NULL, &lin), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, &lin), WUSH_OK);
    CHECK_STATUS(wush_linear_info(lin, &d_out, &d_in, &f), WUSH_OK);
    CHECK(d_out == D_OUT && d_in == D_IN && f == l->format);
    /* A layer belongs to the context it was prepared on. */
    CHECK_STATUS(wush_linear_workspace_size(other, lin, 4, &bytes), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "another wush_context") != NULL);
    wush_linear_destroy(lin);
    /* A destroyed layer is a bad handle, not a crash; destroy(NULL) is a no-op. */
    CHECK_STATUS(wush_linear_workspace_size(ctx, lin, 4, &bytes), WUSH_ERR_INVALID_ARGUMENT);
    wush_linear_destroy(NULL);
    /* Mismatched transform and weights (another group size). */
    wush_transform* t16 = NULL;
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, D_IN, 16, NULL, &t16), WUSH_OK);
    if (l->format != WUSH_FORMAT_NVFP4)
        CHECK_STATUS(wush_linear_create(ctx, t16, l->w, &lin), WUSH_ERR_INVALID_ARGUMENT);
    wush_transform_destroy(t16);
    /* Streams: a CPU context takes only NULL. */
    void* s = (void*)1;
    CHECK_STATUS(wush_context_get_stream(ctx, &s), WUSH_OK);
    CHECK(s == NULL);
    if (g_backend == WUSH_BACKEND_CPU) CHECK_STATUS(wush_context_set_stream(ctx, (void*)16), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_context_set_stream(ctx, NULL), WUSH_OK);
    char text[256];
    CHECK_STATUS(wush_context_describe(ctx, text, sizeof text), WUSH_OK);
    CHECK(strncmp(text, g_backend == WUSH_BACKEND_CPU ? "cpu" : "cuda", g_backend == WUSH_BACKEND_CPU ? 3 : 4) == 0);
    CHECK_STATUS(wush_context_describe(ctx, text, 2), WUSH_ERR_BUFFER_TOO_SMALL);
}

#ifdef WUSH_TEST_CUDA
/* A host pointer where a device pointer is due; a captured graph replays the layer. */
static void check_cuda_specifics(wush_context* ctx, const Layer* l, const float* x) {
    const size_t m = 17;
    size_t ws_bytes = 0;
    wush_linear* lin = NULL;
    CHECK_STATUS(wush_linear_create(ctx, l->t, l->w, &lin), WUSH_OK);
    CHECK_STATUS(wush_linear_workspace_size(ctx, lin, m, &ws_bytes), WUSH_OK);
    void *dx = dev_alloc(sizeof(float) * m * D_IN), *dy = dev_alloc(sizeof(float) * m * D_OUT),
         *dws = dev_alloc(ws_bytes);
    float* host_y = malloc(sizeof(float) * m * D_OUT);
    float* graph_y = malloc(sizeof(float) * m * D_OUT);
    to_dev(dx, x, sizeof(float) * m * D_IN);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, x, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "host pointer") != NULL);

    cudaStream_t stream = NULL;
    CHECK(cudaStreamCreate(&stream) == cudaSuccess);
    CHECK_STATUS(wush_context_set_stream(ctx, stream), WUSH_OK);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK_STATUS(wush_context_synchronize(ctx), WUSH_OK);
    to_host(host_y, dy, sizeof(float) * m * D_OUT);
    CHECK(cudaMemset(dy, 0, sizeof(float) * m * D_OUT) == cudaSuccess);

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
    CHECK_STATUS(wush_linear_run(ctx, lin, WUSH_DTYPE_F32, dx, m, WUSH_DTYPE_F32, dy, m * D_OUT, dws, ws_bytes),
                 WUSH_OK);
    CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    to_host(graph_y, dy, sizeof(float) * m * D_OUT);
    CHECK(memcmp(graph_y, host_y, sizeof(float) * m * D_OUT) == 0);

    CHECK_STATUS(wush_context_set_stream(ctx, NULL), WUSH_OK);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    wush_linear_destroy(lin);
    dev_free(dx);
    dev_free(dy);
    dev_free(dws);
    free(host_y);
    free(graph_y);
}
#endif

int main(int argc, char** argv) {
    if (argc != 2 || (strcmp(argv[1], "cpu") != 0 && strcmp(argv[1], "cuda") != 0)) {
        fprintf(stderr, "usage: %s cpu|cuda\n", argv[0]);
        return 2;
    }
    g_backend = strcmp(argv[1], "cpu") == 0 ? WUSH_BACKEND_CPU : WUSH_BACKEND_CUDA;
    wush_context *ctx = NULL, *ref_ctx = NULL, *other = NULL;
    const wush_status st = wush_context_create(g_backend, 0, &ctx);
    if (g_backend == WUSH_BACKEND_CUDA && st == WUSH_ERR_UNSUPPORTED) {
        printf("SKIPPED: no usable CUDA device: %s\n", wush_last_error());
        return 77;
    }
    CHECK(st == WUSH_OK);
    if (st != WUSH_OK) return 1;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ref_ctx), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(ref_ctx, WUSH_CONTEXT_CPU_ISA, WUSH_CPU_ISA_SCALAR), WUSH_OK);
    CHECK_STATUS(wush_context_create(g_backend, 0, &other), WUSH_OK);

    float* weight = malloc(sizeof(float) * D_OUT * D_IN);
    float* cal = malloc(sizeof(float) * N_CAL * D_IN);
    float* x = malloc(sizeof(float) * 130 * D_IN);
    fill(weight, D_OUT, D_IN, 1.0);
    fill(cal, N_CAL, D_IN, 20.0);
    fill(x, 130, D_IN, 20.0);

    check_calibration(ctx, ref_ctx, cal, N_CAL);

    const wush_format formats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};
    const wush_transform_kind kinds[] = {WUSH_TRANSFORM_WUSH, WUSH_TRANSFORM_HADAMARD, WUSH_TRANSFORM_IDENTITY};
    const size_t token_counts[] = {1, 3, 17, 130};
    for (size_t f = 0; f < 4; ++f)
        for (size_t k = 0; k < 3; ++k) {
            Layer l = make_layer(ref_ctx, kinds[k], formats[f], weight, cal);
            for (size_t i = 0; i < 4; ++i) check_layer(ctx, ref_ctx, &l, x, token_counts[i]);
            if (k == 0) {
                for (size_t i = 0; i < 4; ++i) check_bias(ctx, ref_ctx, &l, x, token_counts[i]);
                check_non_finite(ctx, &l, x);
                check_workspace_up_to(ctx, &l, x);
                check_misuse(ctx, other, &l);
                check_overflowing_product(ctx, &l);
#ifdef WUSH_TEST_CUDA
                if (g_backend == WUSH_BACKEND_CUDA) check_cuda_specifics(ctx, &l, x);
#endif
            }
            wush_transform_destroy(l.t);
            wush_qweight_destroy(l.w);
        }

    free(weight);
    free(cal);
    free(x);
    wush_context_destroy(other);
    wush_context_destroy(ref_ctx);
    wush_context_destroy(ctx);
    printf("backend ops (%s): %d checks, %d failed\n", argv[1], g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
