/* Helpers shared by the core C API tests (test_capi_options.c, test_capi_calibrator.c,
 * test_capi_transforms.c, test_capi_qweight.c, test_capi_handles.c): deterministic data, float64 linear algebra written here as the oracles,
 * and the small built-in example layer. Included once per test program, after check.h. */
#ifndef WUSH_TESTS_CAPI_CORE_COMMON_H
#define WUSH_TESTS_CAPI_CORE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "wush/wush.h"

/* The block size the transform tests calibrate with. */
enum { TG = 32 };

/* Like CHECK, with a printed value pair when the comparison fails. */
#define CHECK_CLOSE(a, b, rel)                                                                                      \
  do {                                                                                                              \
    double ca_ = (a), cb_ = (b);                                                                                    \
    ++g_checks;                                                                                                     \
    if (!rel_close(ca_, cb_, (rel))) {                                                                              \
      ++g_failures;                                                                                                 \
      fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.17g vs %s = %.17g (rel tol %g)\n", __FILE__, __LINE__, #a, \
              ca_, #b, cb_, (double)(rel));                                                                         \
    }                                                                                                               \
  } while (0)

/* ------------------------------------------------------------------------------------------------
 * Helpers: deterministic data, float64 linear algebra
 * ----------------------------------------------------------------------------------------------*/

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static inline void rng_seed(uint64_t s) {
    g_rng = s * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
}

static inline uint64_t rng_next(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}

static inline double rng_uniform(void) {
    return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0;
}

static inline double rng_gauss(void) { /* Box-Muller */
    const double u = rng_uniform(), v = rng_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* n x d activations: Gaussian, correlated within each 8-channel group, per-channel scales and one
 * outlier channel (index `outlier`, scaled by 25) unless outlier >= d. */
static inline void make_activations(float* x, size_t n, size_t d, size_t outlier, uint64_t seed) {
    size_t t, j;
    rng_seed(seed);
    for (t = 0; t < n; ++t) {
        double shared = 0.0;
        for (j = 0; j < d; ++j) {
            double v;
            if (j % 8 == 0) shared = rng_gauss();
            v = (0.6 * shared + rng_gauss()) * (0.5 + (double)(j % 5) * 0.3);
            if (j == outlier) v *= 25.0;
            x[t * d + j] = (float)v;
        }
    }
}

static inline int rel_close(double a, double b, double rel) {
    const double scale = fmax(fabs(a), fabs(b));
    if (a == b) return 1;
    if (!isfinite(a) || !isfinite(b)) return 0;
    return fabs(a - b) <= rel * scale;
}

/* max |a_i - b_i| / max |b_i| */
static inline double max_rel_diff(const double* a, const double* b, size_t n) {
    double diff = 0.0, scale = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) {
        diff = fmax(diff, fabs(a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return scale > 0.0 ? diff / scale : diff;
}

/* M = X_b^T X_b / n for block b (columns [b G, (b+1) G)) of the n x d float matrix x. */
static inline void ref_block_moment(const float* x, size_t n, size_t d, size_t g, size_t b, double* m) {
    size_t i, j, t;
    for (i = 0; i < g; ++i)
        for (j = 0; j < g; ++j) {
            double s = 0.0;
            for (t = 0; t < n; ++t) s += (double)x[t * d + b * g + i] * (double)x[t * d + b * g + j];
            m[i * g + j] = s / (double)n;
        }
}

/* m += lambda tr(m) / g I */
static inline void damp(double* m, size_t g, double lambda) {
    double tr = 0.0;
    size_t i;
    for (i = 0; i < g; ++i) tr += m[i * g + i];
    for (i = 0; i < g; ++i) m[i * g + i] += lambda * tr / (double)g;
}

/* out = A M A^T for g x g matrices (A given in double). */
static inline void sandwich(const double* a, const double* m, size_t g, double* out) {
    size_t i, j, k, l;
    for (i = 0; i < g; ++i)
        for (j = 0; j < g; ++j) {
            double s = 0.0;
            for (k = 0; k < g; ++k) {
                double r = 0.0;
                for (l = 0; l < g; ++l) r += m[k * g + l] * a[j * g + l];
                s += a[i * g + k] * r;
            }
            out[i * g + j] = s;
        }
}

/* inv = a^{-1} by Gauss-Jordan with partial pivoting; returns 0 if singular. */
static inline int invert(const double* a, size_t g, double* inv) {
    double* w = (double*)malloc(g * g * sizeof(double));
    size_t i, j, k;
    int ok = 1;
    memcpy(w, a, g * g * sizeof(double));
    for (i = 0; i < g; ++i)
        for (j = 0; j < g; ++j) inv[i * g + j] = i == j ? 1.0 : 0.0;
    for (k = 0; k < g && ok; ++k) {
        size_t p = k;
        double pivot;
        for (i = k + 1; i < g; ++i)
            if (fabs(w[i * g + k]) > fabs(w[p * g + k])) p = i;
        if (w[p * g + k] == 0.0) {
            ok = 0;
            break;
        }
        if (p != k)
            for (j = 0; j < g; ++j) {
                double t = w[k * g + j];
                w[k * g + j] = w[p * g + j];
                w[p * g + j] = t;
                t = inv[k * g + j];
                inv[k * g + j] = inv[p * g + j];
                inv[p * g + j] = t;
            }
        pivot = w[k * g + k];
        for (j = 0; j < g; ++j) {
            w[k * g + j] /= pivot;
            inv[k * g + j] /= pivot;
        }
        for (i = 0; i < g; ++i) {
            double f;
            if (i == k) continue;
            f = w[i * g + k];
            if (f == 0.0) continue;
            for (j = 0; j < g; ++j) {
                w[i * g + j] -= f * w[k * g + j];
                inv[i * g + j] -= f * inv[k * g + j];
            }
        }
    }
    free(w);
    return ok;
}

/* Y = X W^T in float64 (x: n x d, w: r x d, y: n x r). */
static inline void ref_matmul_t(const float* x, const float* w, size_t n, size_t d, size_t r, double* y) {
    size_t t, o, j;
    for (t = 0; t < n; ++t)
        for (o = 0; o < r; ++o) {
            double s = 0.0;
            for (j = 0; j < d; ++j) s += (double)x[t * d + j] * (double)w[o * d + j];
            y[t * r + o] = s;
        }
}

static inline int all_doubles_are(const double* p, size_t n, double v) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (p[i] != v) return 0;
    return 1;
}

static inline int all_floats_are(const float* p, size_t n, float v) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (p[i] != v) return 0;
    return 1;
}

static inline uint16_t float_to_bf16_truncate(float f) { /* exact for values with <= 8 significant bits */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* binary16 bits of a float that is exactly representable as a normal half (or zero). */
static inline uint16_t float_to_f16_exact(float f) {
    uint32_t u, sign, exp, mant;
    memcpy(&u, &f, sizeof u);
    sign = (u >> 31) & 1u;
    if ((u & 0x7FFFFFFFu) == 0) return (uint16_t)(sign << 15);
    exp = (u >> 23) & 0xFFu;
    mant = u & 0x7FFFFFu;
    return (uint16_t)((sign << 15) | ((exp - 127u + 15u) << 10) | (mant >> 13));
}

/* Exports the whole state of a calibrator (malloc'ed; *n receives the size). */
static inline double* export_all(const wush_calibrator* c, size_t* n) {
    double* s;
    *n = 0;
    if (wush_calibrator_state_size(c, n) != WUSH_OK || *n == 0) return NULL;
    s = (double*)malloc(*n * sizeof(double));
    if (wush_calibrator_export_state(c, s, *n) != WUSH_OK) {
        free(s);
        return NULL;
    }
    return s;
}

/* 1 if the calibrator's exported state equals `state` bit for bit. */
static inline int state_equals(const wush_calibrator* c, const double* state, size_t n) {
    size_t m = 0;
    double* now = export_all(c, &m);
    int same = now != NULL && m == n && memcmp(now, state, n * sizeof(double)) == 0;
    free(now);
    return same;
}

/* ------------------------------------------------------------------------------------------------
 * The small example layer, shared by the transform, progress and loss tests
 * ----------------------------------------------------------------------------------------------*/

typedef struct {
    size_t d_out, d_in, n_cal, n_held;
    float *w, *cal, *held;
} Layer;

static inline int load_layer(const char* name, uint64_t seed, size_t n_cal, size_t n_held, Layer* l) {
    memset(l, 0, sizeof *l);
    if (wush_example_layer_shape(name, &l->d_out, &l->d_in) != WUSH_OK) return 0;
    l->n_cal = n_cal;
    l->n_held = n_held;
    l->w = (float*)malloc(l->d_out * l->d_in * sizeof(float));
    l->cal = (float*)malloc(n_cal * l->d_in * sizeof(float));
    l->held = (float*)malloc(n_held * l->d_in * sizeof(float));
    return wush_example_layer_generate(name, seed, n_cal, n_held, l->w, l->d_out * l->d_in, l->cal, n_cal * l->d_in,
                                       l->held, n_held * l->d_in) == WUSH_OK;
}

static inline void free_layer(Layer* l) {
    free(l->w);
    free(l->cal);
    free(l->held);
}

/* A test on a CPU context and the small example layer ("small_256x512", seed 1, 1024 calibration
 * and 256 held-out tokens). */
typedef void (*LayerTest)(wush_context* ctx, const Layer* layer);

/* Runs the NULL-terminated `tests` on one CPU context and the small layer; then prints the
 * program's totals and returns main()'s exit code. */
static inline int run_layer_tests(const char* program, const LayerTest* tests) {
    wush_context* ctx = NULL;
    Layer small;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    CHECK(load_layer("small_256x512", 1, 1024, 256, &small));
    if (ctx != NULL && small.w && small.cal && small.held)
        for (; *tests != NULL; ++tests) (*tests)(ctx, &small);
    free_layer(&small);
    wush_context_destroy(ctx);
    printf("%s: %d checks, %d failed\n", program, g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}

#endif
