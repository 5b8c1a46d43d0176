/* Tests of the core C API, in plain C99 against the shared library: options, calibrators (moments,
 * merge, distributed export/import), transforms (the WUSH equalization theorem checked through
 * the API), progress callbacks, pre-quantized weights and the layerwise loss, the built-in
 * example layers and handle checks.
 *
 * Oracles are independent of the code under test: float64 loops written here (second moments,
 * Y = X W^T, the loss), theorems (T M_X T^T = H S H^T has a constant diagonal tr(S)/G, and
 * sum S^2 = tr(M_W M_X)), or a second path through the API (quantize_rows vs the qweight). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wush/wush.h"
#include "check.h"

/* Like CHECK, with a printed value pair when the comparison fails. */
#define CHECK_CLOSE(a, b, rel)                                                                       \
    do {                                                                                             \
        double ca_ = (a), cb_ = (b);                                                                 \
        ++g_checks;                                                                                  \
        if (!rel_close(ca_, cb_, (rel))) {                                                           \
            ++g_failures;                                                                            \
            fprintf(stderr, "%s:%d: CHECK_CLOSE failed: %s = %.17g vs %s = %.17g (rel tol %g)\n",    \
                    __FILE__, __LINE__, #a, ca_, #b, cb_, (double)(rel));                            \
        }                                                                                            \
    } while (0)

/* ------------------------------------------------------------------------------------------------
 * Helpers: deterministic data, float64 linear algebra
 * ----------------------------------------------------------------------------------------------*/

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static void rng_seed(uint64_t s) { g_rng = s * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull; }

static uint64_t rng_next(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}

static double rng_uniform(void) { return ((double)(rng_next() >> 11) + 0.5) / 9007199254740992.0; }

static double rng_gauss(void) { /* Box-Muller */
    const double u = rng_uniform(), v = rng_uniform();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

/* n x d activations: Gaussian, correlated within each 8-channel group, per-channel scales and one
 * outlier channel (index `outlier`, scaled by 25) unless outlier >= d. */
static void make_activations(float* x, size_t n, size_t d, size_t outlier, uint64_t seed) {
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

static int rel_close(double a, double b, double rel) {
    const double scale = fmax(fabs(a), fabs(b));
    if (a == b) return 1;
    if (!isfinite(a) || !isfinite(b)) return 0;
    return fabs(a - b) <= rel * scale;
}

/* max |a_i - b_i| / max |b_i| */
static double max_rel_diff(const double* a, const double* b, size_t n) {
    double diff = 0.0, scale = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) {
        diff = fmax(diff, fabs(a[i] - b[i]));
        scale = fmax(scale, fabs(b[i]));
    }
    return scale > 0.0 ? diff / scale : diff;
}

/* M = X_b^T X_b / n for block b (columns [b G, (b+1) G)) of the n x d float matrix x. */
static void ref_block_moment(const float* x, size_t n, size_t d, size_t g, size_t b, double* m) {
    size_t i, j, t;
    for (i = 0; i < g; ++i)
        for (j = 0; j < g; ++j) {
            double s = 0.0;
            for (t = 0; t < n; ++t) s += (double)x[t * d + b * g + i] * (double)x[t * d + b * g + j];
            m[i * g + j] = s / (double)n;
        }
}

/* m += lambda tr(m) / g I */
static void damp(double* m, size_t g, double lambda) {
    double tr = 0.0;
    size_t i;
    for (i = 0; i < g; ++i) tr += m[i * g + i];
    for (i = 0; i < g; ++i) m[i * g + i] += lambda * tr / (double)g;
}

/* out = A M A^T for g x g matrices (A given in double). */
static void sandwich(const double* a, const double* m, size_t g, double* out) {
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
static int invert(const double* a, size_t g, double* inv) {
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
static void ref_matmul_t(const float* x, const float* w, size_t n, size_t d, size_t r, double* y) {
    size_t t, o, j;
    for (t = 0; t < n; ++t)
        for (o = 0; o < r; ++o) {
            double s = 0.0;
            for (j = 0; j < d; ++j) s += (double)x[t * d + j] * (double)w[o * d + j];
            y[t * r + o] = s;
        }
}

static int all_doubles_are(const double* p, size_t n, double v) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (p[i] != v) return 0;
    return 1;
}

static int all_floats_are(const float* p, size_t n, float v) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (p[i] != v) return 0;
    return 1;
}

static uint16_t float_to_bf16_truncate(float f) { /* exact for values with <= 8 significant bits */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* binary16 bits of a float that is exactly representable as a normal half (or zero). */
static uint16_t float_to_f16_exact(float f) {
    uint32_t u, sign, exp, mant;
    memcpy(&u, &f, sizeof u);
    sign = (u >> 31) & 1u;
    if ((u & 0x7FFFFFFFu) == 0) return (uint16_t)(sign << 15);
    exp = (u >> 23) & 0xFFu;
    mant = u & 0x7FFFFFu;
    return (uint16_t)((sign << 15) | ((exp - 127u + 15u) << 10) | (mant >> 13));
}

/* Exports the whole state of a calibrator (malloc'ed; *n receives the size). */
static double* export_all(const wush_calibrator* c, size_t* n) {
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
static int state_equals(const wush_calibrator* c, const double* state, size_t n) {
    size_t m = 0;
    double* now = export_all(c, &m);
    int same = now != NULL && m == n && memcmp(now, state, n * sizeof(double)) == 0;
    free(now);
    return same;
}

/* ------------------------------------------------------------------------------------------------
 * Options
 * ----------------------------------------------------------------------------------------------*/

static void test_options(void) {
    wush_options* o = NULL;
    wush_transform* untouched = (wush_transform*)0x1;
    wush_calibrator* cal = NULL;
    double d = -1.0;
    int64_t i = -1;

    CHECK_STATUS(wush_options_create(NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK(o != NULL);

    /* defaults */
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.01);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &i), WUSH_OK);
    CHECK(i == 0);

    /* set / get, bounds included */
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 0.0), WUSH_OK);
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.0);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 1e6), WUSH_OK);
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_OK);
    CHECK(d == 1e6);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 0.25), WUSH_OK);
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.25);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, 12345), WUSH_OK);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &i), WUSH_OK);
    CHECK(i == 12345);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, (int64_t)1 << 62), WUSH_OK);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &i), WUSH_OK);
    CHECK(i == ((int64_t)1 << 62));
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, 12345), WUSH_OK);

    /* out of bounds and NaN: rejected, value unchanged */
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, -1e-9), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strlen(wush_last_error()) > 0);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 1e6 * (1.0 + 1e-15)), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, NAN), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, INFINITY), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, -INFINITY), WUSH_ERR_INVALID_ARGUMENT);
    d = -1.0;
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.25);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, -1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, ((int64_t)1 << 62) + 1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, INT64_MIN), WUSH_ERR_INVALID_ARGUMENT);
    i = -1;
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &i), WUSH_OK);
    CHECK(i == 12345);

    /* an option of the other type, or unknown: rejected, nothing changes, outputs untouched */
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_SEED, 3.0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_DAMPING, 0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_double(o, (wush_option)2, 0.5), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, (wush_option)-1, 5), WUSH_ERR_INVALID_ARGUMENT);
    d = -7.0;
    i = -7;
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_SEED, &d), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_DAMPING, &i), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_double(o, (wush_option)77, &d), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(d == -7.0 && i == -7);
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.25);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &i), WUSH_OK);
    CHECK(i == 12345);

    /* NULL arguments */
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_double(NULL, WUSH_OPTION_DAMPING, 0.1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(NULL, WUSH_OPTION_SEED, 1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_double(NULL, WUSH_OPTION_DAMPING, &d), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_int(NULL, WUSH_OPTION_SEED, &i), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_progress(NULL, NULL, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_progress(o, NULL, NULL), WUSH_OK); /* removing: fine */

    /* a handle of the wrong type */
    CHECK_STATUS(wush_calibrator_create(64, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
    CHECK_STATUS(wush_options_set_double((wush_options*)cal, WUSH_OPTION_DAMPING, 0.1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_int((const wush_options*)cal, WUSH_OPTION_SEED, &i), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 64, 32, (const wush_options*)cal, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_transform*)0x1);
    wush_options_destroy((wush_options*)cal); /* wrong type: must not release the calibrator */
    {
        uint64_t n = 99;
        CHECK_STATUS(wush_calibrator_token_count(cal, &n), WUSH_OK);
        CHECK(n == 0);
    }
    wush_calibrator_destroy(cal);

    wush_options_destroy(NULL); /* no-op */
    wush_options_destroy(o);
    /* a destroyed options handle is rejected */
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &d), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, 1), WUSH_ERR_INVALID_ARGUMENT);
    wush_options_destroy(o); /* double destroy: no-op */
}

/* ------------------------------------------------------------------------------------------------
 * Calibrator
 * ----------------------------------------------------------------------------------------------*/

enum { CD = 64, CG = 32, CC = CD / CG };

static void test_calibrator_basics(wush_context* ctx) {
    wush_calibrator* c = NULL;
    wush_calibrator* untouched = (wush_calibrator*)0x1;
    const size_t n = 300; /* more than one internal tile of tokens */
    float* x = (float*)malloc(n * CD * sizeof(float));
    double m[CG * CG], ref[CG * CG];
    uint64_t tokens = 77;
    size_t b;

    make_activations(x, n, CD, 5, 11);

    /* bad geometry, mode or output */
    CHECK_STATUS(wush_calibrator_create(0, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(48, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(96, 24, WUSH_MOMENTS_BLOCK_DIAGONAL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(96, 12, WUSH_MOMENTS_FULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(1024, 512, WUSH_MOMENTS_BLOCK_DIAGONAL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(64, 0, WUSH_MOMENTS_BLOCK_DIAGONAL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(64, 32, (wush_moment_mode)0, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_create(64, 32, (wush_moment_mode)3, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_calibrator*)0x1);
    CHECK_STATUS(wush_calibrator_create(64, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, NULL), WUSH_ERR_INVALID_ARGUMENT);

    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &c), WUSH_OK);
    CHECK_STATUS(wush_calibrator_token_count(c, &tokens), WUSH_OK);
    CHECK(tokens == 0);
    CHECK_STATUS(wush_calibrator_token_count(c, NULL), WUSH_ERR_INVALID_ARGUMENT);
    /* no tokens yet: the moment is undefined */
    m[0] = -3.0;
    CHECK_STATUS(wush_calibrator_second_moment(c, 0, m, CG * CG), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(m[0] == -3.0);

    /* bad adds leave the calibrator empty */
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, x, 0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, NULL, 4), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add(ctx, c, (wush_dtype)9, x, 4), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add(NULL, c, WUSH_DTYPE_F32, x, 4), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add(ctx, NULL, WUSH_DTYPE_F32, x, 4), WUSH_ERR_INVALID_ARGUMENT);
    {
        const float saved = x[3 * CD + 40];
        x[3 * CD + 40] = NAN;
        CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, x, 4), WUSH_ERR_NON_FINITE);
        x[3 * CD + 40] = saved;
    }
    CHECK_STATUS(wush_calibrator_token_count(c, &tokens), WUSH_OK);
    CHECK(tokens == 0);

    /* two adds (100 + 200 tokens) equal the float64 moment of all 300 */
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, x, 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, x + 100 * CD, n - 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_token_count(c, &tokens), WUSH_OK);
    CHECK(tokens == n);
    for (b = 0; b < CC; ++b) {
        CHECK_STATUS(wush_calibrator_second_moment(c, b, m, CG * CG), WUSH_OK);
        ref_block_moment(x, n, CD, CG, b, ref);
        CHECK(max_rel_diff(m, ref, CG * CG) <= 1e-12);
    }

    /* a NaN or Inf batch after data: rejected, tokens and moments unchanged */
    {
        size_t before_n = 0;
        double* before = export_all(c, &before_n);
        const float saved = x[7 * CD + 1];
        x[7 * CD + 1] = NAN;
        CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, x, 10), WUSH_ERR_NON_FINITE);
        CHECK(strlen(wush_last_error()) > 0);
        x[7 * CD + 1] = -INFINITY;
        CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, x, 10), WUSH_ERR_NON_FINITE);
        x[7 * CD + 1] = saved;
        CHECK_STATUS(wush_calibrator_token_count(c, &tokens), WUSH_OK);
        CHECK(tokens == n);
        CHECK(before != NULL && state_equals(c, before, before_n));
        free(before);
    }

    /* second_moment argument checks */
    m[0] = -3.0;
    CHECK_STATUS(wush_calibrator_second_moment(c, CC, m, CG * CG), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_second_moment(c, (size_t)-1, m, CG * CG), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_second_moment(c, 0, m, CG * CG - 1), WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK(m[0] == -3.0);
    CHECK_STATUS(wush_calibrator_second_moment(c, 0, NULL, CG * CG), WUSH_ERR_INVALID_ARGUMENT);
    {
        /* a larger buffer is fine and only G*G doubles are written */
        double big[CG * CG + 4];
        big[CG * CG] = 42.0;
        CHECK_STATUS(wush_calibrator_second_moment(c, 1, big, CG * CG + 4), WUSH_OK);
        CHECK(big[CG * CG] == 42.0);
        ref_block_moment(x, n, CD, CG, 1, ref);
        CHECK(max_rel_diff(big, ref, CG * CG) <= 1e-12);
    }

    /* a FULL-mode calibrator's diagonal blocks equal the block-diagonal ones */
    {
        wush_calibrator* full = NULL;
        size_t sz = 0;
        CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_FULL, &full), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, full, WUSH_DTYPE_F32, x, n), WUSH_OK);
        for (b = 0; b < CC; ++b) {
            CHECK_STATUS(wush_calibrator_second_moment(full, b, m, CG * CG), WUSH_OK);
            ref_block_moment(x, n, CD, CG, b, ref);
            CHECK(max_rel_diff(m, ref, CG * CG) <= 1e-12);
        }
        CHECK_STATUS(wush_calibrator_state_size(full, &sz), WUSH_OK);
        CHECK(sz == 6 + (size_t)CD * CD);
        wush_calibrator_destroy(full);
    }

    /* BF16 and F16 inputs: values with few significant bits convert exactly, so the moment equals
     * the float64 moment of the float values. */
    {
        const size_t nh = 40;
        float* xs = (float*)malloc(nh * CD * sizeof(float));
        uint16_t* hb = (uint16_t*)malloc(nh * CD * sizeof(uint16_t));
        uint16_t* hf = (uint16_t*)malloc(nh * CD * sizeof(uint16_t));
        wush_calibrator* cb = NULL;
        wush_calibrator* cf = NULL;
        size_t k;
        rng_seed(5);
        for (k = 0; k < nh * CD; ++k) {
            xs[k] = (float)((double)((int)(rng_next() % 255) - 127) / 8.0); /* |k| <= 127: 7 bits */
            hb[k] = float_to_bf16_truncate(xs[k]);
            hf[k] = float_to_f16_exact(xs[k]);
        }
        CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &cb), WUSH_OK);
        CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &cf), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, cb, WUSH_DTYPE_BF16, hb, nh), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, cf, WUSH_DTYPE_F16, hf, nh), WUSH_OK);
        for (b = 0; b < CC; ++b) {
            ref_block_moment(xs, nh, CD, CG, b, ref);
            CHECK_STATUS(wush_calibrator_second_moment(cb, b, m, CG * CG), WUSH_OK);
            CHECK(max_rel_diff(m, ref, CG * CG) <= 1e-12);
            CHECK_STATUS(wush_calibrator_second_moment(cf, b, m, CG * CG), WUSH_OK);
            CHECK(max_rel_diff(m, ref, CG * CG) <= 1e-12);
        }
        /* a BF16 NaN (0x7FC0) and an F16 Inf (0x7C00) are rejected */
        hb[CD + 3] = 0x7FC0;
        hf[2 * CD + 9] = 0x7C00;
        CHECK_STATUS(wush_calibrator_add(ctx, cb, WUSH_DTYPE_BF16, hb, nh), WUSH_ERR_NON_FINITE);
        CHECK_STATUS(wush_calibrator_add(ctx, cf, WUSH_DTYPE_F16, hf, nh), WUSH_ERR_NON_FINITE);
        CHECK_STATUS(wush_calibrator_token_count(cb, &tokens), WUSH_OK);
        CHECK(tokens == nh);
        CHECK_STATUS(wush_calibrator_token_count(cf, &tokens), WUSH_OK);
        CHECK(tokens == nh);
        wush_calibrator_destroy(cb);
        wush_calibrator_destroy(cf);
        free(xs);
        free(hb);
        free(hf);
    }

    wush_calibrator_destroy(c);
    free(x);
}

static void test_calibrator_merge_and_state(wush_context* ctx) {
    const size_t n1 = 150, n2 = 200, n3 = 250, n = n1 + n2 + n3;
    float* x = (float*)malloc(n * CD * sizeof(float));
    const float* x2 = x + n1 * CD;
    const float* x3 = x + (n1 + n2) * CD;
    wush_calibrator *all = NULL, *c1 = NULL, *c2 = NULL, *c3 = NULL, *two = NULL, *merged = NULL, *fresh = NULL;
    double m[CG * CG], ref[CG * CG];
    size_t sz = 0, b, k;
    uint64_t tokens = 0;

    make_activations(x, n, CD, 40, 23);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &all), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &c1), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &c2), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &c3), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &two), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &merged), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &fresh), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, all, WUSH_DTYPE_F32, x, n), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, c1, WUSH_DTYPE_F32, x, n1), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, c2, WUSH_DTYPE_F32, x2, n2), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, c3, WUSH_DTYPE_F32, x3, n3), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, two, WUSH_DTYPE_F32, x, n1 + n2), WUSH_OK);

    /* state size: 6 header doubles + C blocks of G x G */
    CHECK_STATUS(wush_calibrator_state_size(all, &sz), WUSH_OK);
    CHECK(sz == 6 + (size_t)CC * CG * CG);
    CHECK_STATUS(wush_calibrator_state_size(all, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_state_size(NULL, &sz), WUSH_ERR_INVALID_ARGUMENT);

    /* merge of two shards equals one pass over both */
    {
        size_t sn = 0, tn = 0, from_n = 0;
        double *s_two, *s_merged, *from_before;
        CHECK_STATUS(wush_calibrator_add(ctx, merged, WUSH_DTYPE_F32, x, n1), WUSH_OK);
        from_before = export_all(c2, &from_n);
        CHECK_STATUS(wush_calibrator_merge(merged, c2), WUSH_OK);
        CHECK(from_before != NULL && state_equals(c2, from_before, from_n)); /* `from` unchanged */
        free(from_before);
        CHECK_STATUS(wush_calibrator_token_count(merged, &tokens), WUSH_OK);
        CHECK(tokens == n1 + n2);
        for (b = 0; b < CC; ++b) {
            double m2[CG * CG];
            CHECK_STATUS(wush_calibrator_second_moment(merged, b, m, CG * CG), WUSH_OK);
            CHECK_STATUS(wush_calibrator_second_moment(two, b, m2, CG * CG), WUSH_OK);
            CHECK(max_rel_diff(m, m2, CG * CG) <= 1e-12);
            ref_block_moment(x, n1 + n2, CD, CG, b, ref);
            CHECK(max_rel_diff(m, ref, CG * CG) <= 1e-12);
        }
        s_two = export_all(two, &tn);
        s_merged = export_all(merged, &sn);
        CHECK(s_two != NULL && s_merged != NULL && sn == tn && sn == sz);
        if (s_two && s_merged && sn == tn) {
            for (k = 0; k < 6; ++k) CHECK(s_two[k] == s_merged[k]);
            CHECK(max_rel_diff(s_merged + 6, s_two + 6, sn - 6) <= 1e-12);
        }
        free(s_two);
        free(s_merged);
    }

    /* merge: self, geometry mismatch, bad handles -> rejected, calibrator unchanged */
    {
        size_t bn = 0;
        double* before = export_all(merged, &bn);
        wush_calibrator *other_g = NULL, *other_mode = NULL;
        CHECK_STATUS(wush_calibrator_merge(merged, merged), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_create(CD, 16, WUSH_MOMENTS_BLOCK_DIAGONAL, &other_g), WUSH_OK);
        CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_FULL, &other_mode), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, other_g, WUSH_DTYPE_F32, x, 10), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, other_mode, WUSH_DTYPE_F32, x, 10), WUSH_OK);
        CHECK_STATUS(wush_calibrator_merge(merged, other_g), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_merge(merged, other_mode), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_merge(merged, NULL), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_merge(NULL, merged), WUSH_ERR_INVALID_ARGUMENT);
        CHECK(before != NULL && state_equals(merged, before, bn));
        free(before);
        wush_calibrator_destroy(other_g);
        wush_calibrator_destroy(other_mode);
    }

    /* fresh export header: [1, 1, mode, d_in, G, tokens]; BUFFER_TOO_SMALL leaves the buffer */
    {
        double* s = (double*)malloc((sz + 1) * sizeof(double));
        for (k = 0; k < sz + 1; ++k) s[k] = -5.0;
        CHECK_STATUS(wush_calibrator_export_state(c1, s, sz - 1), WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK(all_doubles_are(s, sz + 1, -5.0));
        CHECK_STATUS(wush_calibrator_export_state(c1, NULL, sz), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_export_state(c1, s, sz + 1), WUSH_OK); /* larger: fine */
        CHECK(s[sz] == -5.0);
        CHECK(s[0] == 1.0 && s[1] == 1.0 && s[2] == (double)WUSH_MOMENTS_BLOCK_DIAGONAL && s[3] == (double)CD &&
              s[4] == (double)CG && s[5] == (double)n1);
        /* the sums are the unnormalized moments, both triangles, block after block */
        for (b = 0; b < CC; ++b) {
            double sums[CG * CG];
            ref_block_moment(x, n1, CD, CG, b, ref);
            for (k = 0; k < CG * CG; ++k) sums[k] = s[6 + b * CG * CG + k] / (double)n1;
            CHECK(max_rel_diff(sums, ref, CG * CG) <= 1e-12);
        }
        free(s);
    }

    /* elementwise SUM of three exports (an all-reduce) imported into a fresh calibrator equals one
     * calibrator that saw all the data */
    {
        size_t a = 0, bb = 0, cc = 0;
        double* s1 = export_all(c1, &a);
        double* s2 = export_all(c2, &bb);
        double* s3 = export_all(c3, &cc);
        double* sum = (double*)malloc(sz * sizeof(double));
        CHECK(s1 && s2 && s3 && a == sz && bb == sz && cc == sz);
        for (k = 0; k < sz; ++k) sum[k] = s1[k] + s2[k] + s3[k];
        CHECK(sum[0] == 3.0);
        CHECK_STATUS(wush_calibrator_import_state(fresh, sum, sz), WUSH_OK);
        CHECK_STATUS(wush_calibrator_token_count(fresh, &tokens), WUSH_OK);
        CHECK(tokens == n);
        for (b = 0; b < CC; ++b) {
            double m2[CG * CG];
            CHECK_STATUS(wush_calibrator_second_moment(fresh, b, m, CG * CG), WUSH_OK);
            CHECK_STATUS(wush_calibrator_second_moment(all, b, m2, CG * CG), WUSH_OK);
            CHECK(max_rel_diff(m, m2, CG * CG) <= 1e-12);
            ref_block_moment(x, n, CD, CG, b, ref);
            CHECK(max_rel_diff(m, ref, CG * CG) <= 1e-12);
        }
        /* re-export: a single-replica header again, the same sums */
        {
            size_t en = 0;
            double* e = export_all(fresh, &en);
            CHECK(e != NULL && en == sz);
            if (e && en == sz) {
                CHECK(e[0] == 1.0 && e[1] == 1.0 && e[2] == 1.0 && e[3] == CD && e[4] == CG && e[5] == (double)n);
                CHECK(memcmp(e + 6, sum + 6, (sz - 6) * sizeof(double)) == 0);
            }
            free(e);
        }

        /* invalid states: rejected, the calibrator unchanged */
        {
            size_t bn = 0;
            double* before = export_all(fresh, &bn);
            double* bad = (double*)malloc((sz + 1) * sizeof(double));
            memcpy(bad, s1, sz * sizeof(double));
            bad[sz] = 0.0;
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz - 1), WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz + 1), WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, 3), WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_calibrator_import_state(fresh, NULL, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[1] = 2.0; /* version 2 */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[1] = 1.0;
            bad[0] = 2.0; /* replica count 2, header fields not multiplied */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[0] = 0.0;
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[0] = NAN;
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[0] = 1.0;
            bad[2] = (double)WUSH_MOMENTS_FULL; /* mode */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[2] = 1.0;
            bad[3] = 128.0; /* d_in */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[3] = CD;
            bad[4] = 16.0; /* G */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[4] = CG;
            bad[5] = -1.0; /* tokens */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[5] = 1.5;
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[5] = (double)n1;
            bad[6 + CG * CG + 7] = NAN; /* non-finite sums */
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            bad[6 + CG * CG + 7] = INFINITY;
            CHECK_STATUS(wush_calibrator_import_state(fresh, bad, sz), WUSH_ERR_INVALID_ARGUMENT);
            CHECK(before != NULL && state_equals(fresh, before, bn));

            /* a state of equal size but another geometry: d_in 128, G 16 has 8 blocks of 16 x 16,
             * i.e. also 6 + 2048 doubles */
            {
                wush_calibrator* geo = NULL;
                size_t gn = 0;
                double* gs;
                float* xg = (float*)malloc(8 * 128 * sizeof(float));
                make_activations(xg, 8, 128, 200, 3);
                CHECK_STATUS(wush_calibrator_create(128, 16, WUSH_MOMENTS_BLOCK_DIAGONAL, &geo), WUSH_OK);
                CHECK_STATUS(wush_calibrator_add(ctx, geo, WUSH_DTYPE_F32, xg, 8), WUSH_OK);
                gs = export_all(geo, &gn);
                CHECK(gs != NULL && gn == sz);
                if (gs && gn == sz) CHECK_STATUS(wush_calibrator_import_state(fresh, gs, gn), WUSH_ERR_INVALID_ARGUMENT);
                CHECK(state_equals(fresh, before, bn));
                free(gs);
                free(xg);
                wush_calibrator_destroy(geo);
            }
            free(before);
            free(bad);
        }
        free(s1);
        free(s2);
        free(s3);
        free(sum);
    }

    /* an empty calibrator's export imports as an empty calibrator */
    {
        wush_calibrator* e1 = NULL;
        size_t en = 0;
        double* es;
        CHECK_STATUS(wush_calibrator_create(CD, CG, WUSH_MOMENTS_BLOCK_DIAGONAL, &e1), WUSH_OK);
        es = export_all(e1, &en);
        CHECK(es != NULL && es[5] == 0.0 && all_doubles_are(es + 6, en - 6, 0.0));
        CHECK_STATUS(wush_calibrator_import_state(c1, es, en), WUSH_OK); /* replaces, not adds */
        CHECK_STATUS(wush_calibrator_token_count(c1, &tokens), WUSH_OK);
        CHECK(tokens == 0);
        CHECK_STATUS(wush_calibrator_second_moment(c1, 0, m, CG * CG), WUSH_ERR_INVALID_ARGUMENT);
        free(es);
        wush_calibrator_destroy(e1);
    }

    wush_calibrator_destroy(all);
    wush_calibrator_destroy(c1);
    wush_calibrator_destroy(c2);
    wush_calibrator_destroy(c3);
    wush_calibrator_destroy(two);
    wush_calibrator_destroy(merged);
    wush_calibrator_destroy(fresh);
    free(x);
}

/* ------------------------------------------------------------------------------------------------
 * The small example layer, shared by the transform, progress and loss tests
 * ----------------------------------------------------------------------------------------------*/

typedef struct {
    size_t d_out, d_in, n_cal, n_held;
    float *w, *cal, *held;
} Layer;

static int load_layer(const char* name, uint64_t seed, size_t n_cal, size_t n_held, Layer* l) {
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

static void free_layer(Layer* l) {
    free(l->w);
    free(l->cal);
    free(l->held);
}

/* ------------------------------------------------------------------------------------------------
 * Transforms
 * ----------------------------------------------------------------------------------------------*/

enum { TG = 32 };

static const wush_transform_kind kKinds[] = {WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD, WUSH_TRANSFORM_RANDOM,
                                             WUSH_TRANSFORM_WUS, WUSH_TRANSFORM_WUSH};

/* max |A A^T - I| of the g x g float matrix a */
static double orthogonality_error(const float* a, size_t g) {
    double err = 0.0;
    size_t i, j, k;
    for (i = 0; i < g; ++i)
        for (j = 0; j < g; ++j) {
            double s = 0.0;
            for (k = 0; k < g; ++k) s += (double)a[i * g + k] * (double)a[j * g + k];
            err = fmax(err, fabs(s - (i == j ? 1.0 : 0.0)));
        }
    return err;
}

static void test_transform_names(void) {
    static const char* const names[] = {"i", "h", "r", "wus", "wush"};
    static const char* const long_names[] = {"identity", "hadamard", "random", "WUS", "WuSh"};
    size_t k;
    for (k = 0; k < 5; ++k) {
        wush_transform_kind kind = (wush_transform_kind)99, kind2 = (wush_transform_kind)99;
        const char* name = wush_transform_kind_name(kKinds[k]);
        CHECK(name != NULL && strcmp(name, names[k]) == 0);
        CHECK_STATUS(wush_transform_kind_from_name(name ? name : "", &kind), WUSH_OK);
        CHECK(kind == kKinds[k]);
        CHECK_STATUS(wush_transform_kind_from_name(long_names[k], &kind2), WUSH_OK);
        CHECK(kind2 == kKinds[k]);
    }
    {
        wush_transform_kind kind = (wush_transform_kind)99;
        CHECK_STATUS(wush_transform_kind_from_name("IDENTITY", &kind), WUSH_OK);
        CHECK(kind == WUSH_TRANSFORM_IDENTITY);
        CHECK_STATUS(wush_transform_kind_from_name("H", &kind), WUSH_OK);
        CHECK(kind == WUSH_TRANSFORM_HADAMARD);
        kind = (wush_transform_kind)99;
        CHECK_STATUS(wush_transform_kind_from_name("wushh", &kind), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_kind_from_name("", &kind), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_kind_from_name("rotation", &kind), WUSH_ERR_INVALID_ARGUMENT);
        CHECK(kind == (wush_transform_kind)99);
        CHECK_STATUS(wush_transform_kind_from_name(NULL, &kind), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_kind_from_name("i", NULL), WUSH_ERR_INVALID_ARGUMENT);
    }
    CHECK(wush_transform_kind_name((wush_transform_kind)5) == NULL);
    CHECK(wush_transform_kind_name((wush_transform_kind)-1) == NULL);
}

static void test_transforms(wush_context* ctx, const Layer* l) {
    const size_t d = l->d_in, g = TG, c = d / TG;
    wush_calibrator* cal = NULL;
    wush_transform* t[5] = {NULL, NULL, NULL, NULL, NULL};
    wush_transform* untouched = (wush_transform*)0x1;
    float* mats = (float*)malloc(d * g * sizeof(float));
    double* sv = (double*)malloc(d * sizeof(double));
    double* mx = (double*)malloc(g * g * sizeof(double));
    double* mw = (double*)malloc(g * g * sizeof(double));
    double* tb = (double*)malloc(g * g * sizeof(double));
    double* ti = (double*)malloc(g * g * sizeof(double));
    double* a = (double*)malloc(g * g * sizeof(double));
    size_t k, b, i, j, nfb;

    CHECK_STATUS(wush_calibrator_create(d, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);

    for (k = 0; k < 5; ++k) {
        wush_transform_kind kind = (wush_transform_kind)99;
        size_t td = 0, tg = 0;
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, kKinds[k], NULL, &t[k]), WUSH_OK);
        CHECK_STATUS(wush_transform_info(t[k], &kind, &td, &tg), WUSH_OK);
        CHECK(kind == kKinds[k] && td == d && tg == g);
        CHECK_STATUS(wush_transform_info(t[k], NULL, NULL, NULL), WUSH_OK);
        nfb = 99;
        CHECK_STATUS(wush_transform_fallback_blocks(t[k], &nfb, NULL, 0), WUSH_OK);
        CHECK(nfb == 0);
    }

    /* identity: exact identity matrices; Hadamard: +-1/sqrt(G), orthogonal, the same in every
     * block; random: orthogonal, blocks differ */
    CHECK_STATUS(wush_transform_matrices(t[0], mats, d * g), WUSH_OK);
    {
        int ok = 1;
        for (b = 0; b < c; ++b)
            for (i = 0; i < g; ++i)
                for (j = 0; j < g; ++j) ok &= mats[b * g * g + i * g + j] == (i == j ? 1.0f : 0.0f);
        CHECK(ok);
    }
    CHECK_STATUS(wush_transform_matrices(t[1], mats, d * g), WUSH_OK);
    {
        int ok = 1;
        const double h = 1.0 / sqrt((double)g);
        for (k = 0; k < d * g; ++k) ok &= fabs(fabs((double)mats[k]) - h) <= 1e-7 * h;
        CHECK(ok);
        CHECK(orthogonality_error(mats, g) <= 1e-6);
        for (b = 1; b < c; ++b) CHECK(memcmp(mats, mats + b * g * g, g * g * sizeof(float)) == 0);
        /* Sylvester: the first row and the first column are all positive */
        for (i = 0; i < g; ++i) CHECK(mats[i] > 0.0f && mats[i * g] > 0.0f);
    }
    CHECK_STATUS(wush_transform_matrices(t[2], mats, d * g), WUSH_OK);
    for (b = 0; b < c; ++b) CHECK(orthogonality_error(mats + b * g * g, g) <= 1e-5);
    CHECK(memcmp(mats, mats + g * g, g * g * sizeof(float)) != 0);

    /* the data-free kinds have zero singular values */
    for (k = 0; k < 3; ++k) {
        for (i = 0; i < d; ++i) sv[i] = -1.0;
        CHECK_STATUS(wush_transform_singular_values(t[k], sv, d), WUSH_OK);
        CHECK(all_doubles_are(sv, d, 0.0));
    }

    /* WUSH and WUS: the equalization theorem, through the API.
     * With M_Xd = M_X + lambda tr(M_X)/G I (and M_Wd likewise) and U S V^T = svd(W'^T X'):
     *   WUSH: T M_Xd T^T = H S H^T        -> constant diagonal tr(S)/G,
     *         T^{-T} M_Wd T^{-1} = H S H^T -> the same on the weight side;
     *   WUS:  T M_Xd T^T = S (diagonal).
     * And, independently of the transform, sum S^2 = tr(M_Wd M_Xd) (S^2 are the eigenvalues of
     * W'^T M_Xd W', which is similar to M_Wd M_Xd). */
    for (k = 3; k < 5; ++k) {
        const int is_wush = kKinds[k] == WUSH_TRANSFORM_WUSH;
        double worst_diag = 0.0, worst_off = 0.0, worst_wdiag = 0.0, worst_s2 = 0.0;
        int descending = 1, positive = 1;
        CHECK_STATUS(wush_transform_matrices(t[k], mats, d * g), WUSH_OK);
        CHECK_STATUS(wush_transform_singular_values(t[k], sv, d), WUSH_OK);
        for (b = 0; b < c; ++b) {
            const double* s = sv + b * g;
            double trs = 0.0, s2 = 0.0, trmm = 0.0;
            size_t r, o;
            for (i = 0; i < g; ++i) {
                trs += s[i];
                s2 += s[i] * s[i];
                if (!(s[i] > 0.0)) positive = 0;
                if (i > 0 && s[i] > s[i - 1]) descending = 0;
            }
            CHECK_STATUS(wush_calibrator_second_moment(cal, b, mx, g * g), WUSH_OK);
            damp(mx, g, 0.01);
            /* M_W = W_b^T W_b / d_out from the framework slice W[:, bG:(b+1)G] */
            for (i = 0; i < g; ++i)
                for (j = 0; j < g; ++j) {
                    double acc = 0.0;
                    for (o = 0; o < l->d_out; ++o)
                        acc += (double)l->w[o * d + b * g + i] * (double)l->w[o * d + b * g + j];
                    mw[i * g + j] = acc / (double)l->d_out;
                }
            damp(mw, g, 0.01);
            for (i = 0; i < g; ++i)
                for (j = 0; j < g; ++j) trmm += mw[i * g + j] * mx[j * g + i];
            worst_s2 = fmax(worst_s2, fabs(s2 - trmm) / trmm);

            for (r = 0; r < g * g; ++r) tb[r] = (double)mats[b * g * g + r];
            sandwich(tb, mx, g, a);
            for (i = 0; i < g; ++i) {
                const double want = is_wush ? trs / (double)g : s[i];
                worst_diag = fmax(worst_diag, fabs(a[i * g + i] - want) / want);
                if (!is_wush)
                    for (j = 0; j < g; ++j)
                        if (j != i) worst_off = fmax(worst_off, fabs(a[i * g + j]) / s[0]);
            }
            if (is_wush) {
                /* weight side: T_xvsh = T^{-T}; T_xvsh M_Wd T_xvsh^T = T^{-T} M_Wd T^{-1} */
                double* tit = a; /* reuse: a is free now */
                double* out = (double*)malloc(g * g * sizeof(double));
                CHECK(invert(tb, g, ti));
                for (i = 0; i < g; ++i)
                    for (j = 0; j < g; ++j) tit[i * g + j] = ti[j * g + i];
                sandwich(tit, mw, g, out);
                for (i = 0; i < g; ++i) worst_wdiag = fmax(worst_wdiag, fabs(out[i * g + i] - trs / g) / (trs / g));
                free(out);
            }
        }
        CHECK(positive);
        CHECK(descending);
        CHECK(worst_s2 <= 1e-9);
        CHECK(worst_diag <= 1e-4);
        if (is_wush) CHECK(worst_wdiag <= 1e-4);
        else CHECK(worst_off <= 1e-4);
        if (worst_diag > 1e-4 || worst_wdiag > 1e-4 || worst_off > 1e-4 || worst_s2 > 1e-9 || getenv("WUSH_TEST_VERBOSE"))
            fprintf(stderr, "  %s: diag %.3g, weight diag %.3g, off-diag %.3g, sum S^2 %.3g\n",
                    wush_transform_kind_name(kKinds[k]), worst_diag, worst_wdiag, worst_off, worst_s2);
    }

    /* the equalization needs the damping actually used: with lambda = 0.5 the diagonal is constant
     * for M_X damped by 0.5, and not for 0.01 (so the check above can fail) */
    {
        wush_options* o = NULL;
        wush_transform* tw = NULL;
        double worst_right = 0.0, worst_wrong = 0.0;
        CHECK_STATUS(wush_options_create(&o), WUSH_OK);
        CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 0.5), WUSH_OK);
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &tw),
                     WUSH_OK);
        CHECK_STATUS(wush_transform_matrices(tw, mats, d * g), WUSH_OK);
        CHECK_STATUS(wush_transform_singular_values(tw, sv, d), WUSH_OK);
        for (b = 0; b < c; ++b) {
            double trs = 0.0;
            size_t r;
            for (i = 0; i < g; ++i) trs += sv[b * g + i];
            for (r = 0; r < g * g; ++r) tb[r] = (double)mats[b * g * g + r];
            CHECK_STATUS(wush_calibrator_second_moment(cal, b, mx, g * g), WUSH_OK);
            memcpy(mw, mx, g * g * sizeof(double));
            damp(mx, g, 0.5);
            damp(mw, g, 0.01);
            sandwich(tb, mx, g, a);
            for (i = 0; i < g; ++i) worst_right = fmax(worst_right, fabs(a[i * g + i] - trs / g) / (trs / g));
            sandwich(tb, mw, g, a);
            for (i = 0; i < g; ++i) worst_wrong = fmax(worst_wrong, fabs(a[i * g + i] - trs / g) / (trs / g));
        }
        CHECK(worst_right <= 1e-4);
        CHECK(worst_wrong > 1e-3);
        wush_transform_destroy(tw);
        wush_options_destroy(o);
    }

    /* buffer sizes */
    for (k = 0; k < d * g; ++k) mats[k] = 7.0f;
    CHECK_STATUS(wush_transform_matrices(t[4], mats, d * g - 1), WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK(all_floats_are(mats, d * g, 7.0f));
    CHECK_STATUS(wush_transform_matrices(t[4], NULL, d * g), WUSH_ERR_INVALID_ARGUMENT);
    for (k = 0; k < d; ++k) sv[k] = 7.0;
    CHECK_STATUS(wush_transform_singular_values(t[4], sv, d - 1), WUSH_ERR_BUFFER_TOO_SMALL);
    CHECK(all_doubles_are(sv, d, 7.0));
    CHECK_STATUS(wush_transform_singular_values(t[4], NULL, d), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_fallback_blocks(t[4], NULL, NULL, 0), WUSH_ERR_INVALID_ARGUMENT);

    /* data-free kinds through create_fixed equal those built from the calibrator */
    for (k = 0; k < 3; ++k) {
        wush_transform* f = NULL;
        float* mf = (float*)malloc(d * g * sizeof(float));
        wush_transform_kind kind = (wush_transform_kind)99;
        size_t fd = 0, fg = 0;
        CHECK_STATUS(wush_transform_create_fixed(kKinds[k], d, g, NULL, &f), WUSH_OK);
        CHECK_STATUS(wush_transform_info(f, &kind, &fd, &fg), WUSH_OK);
        CHECK(kind == kKinds[k] && fd == d && fg == g);
        CHECK_STATUS(wush_transform_matrices(f, mf, d * g), WUSH_OK);
        CHECK_STATUS(wush_transform_matrices(t[k], mats, d * g), WUSH_OK);
        CHECK(memcmp(mf, mats, d * g * sizeof(float)) == 0);
        free(mf);
        wush_transform_destroy(f);
    }

    /* random rotations: the seed option decides them */
    {
        wush_options* o = NULL;
        wush_transform *r0 = NULL, *r1 = NULL, *r1b = NULL;
        float* m0 = (float*)malloc(d * g * sizeof(float));
        float* m1 = (float*)malloc(d * g * sizeof(float));
        CHECK_STATUS(wush_options_create(&o), WUSH_OK);
        CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_RANDOM, d, g, o, &r0), WUSH_OK);
        CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEED, 1234), WUSH_OK);
        CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_RANDOM, d, g, o, &r1), WUSH_OK);
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_RANDOM, o, &r1b),
                     WUSH_OK); /* data-free: weight may be NULL */
        CHECK_STATUS(wush_transform_matrices(r0, m0, d * g), WUSH_OK);
        CHECK_STATUS(wush_transform_matrices(r1, m1, d * g), WUSH_OK);
        CHECK(memcmp(m0, m1, d * g * sizeof(float)) != 0);
        CHECK_STATUS(wush_transform_matrices(t[2], mats, d * g), WUSH_OK); /* built with default seed 0 */
        CHECK(memcmp(m0, mats, d * g * sizeof(float)) == 0);
        CHECK_STATUS(wush_transform_matrices(r1b, m0, d * g), WUSH_OK);
        CHECK(memcmp(m0, m1, d * g * sizeof(float)) == 0);
        for (b = 0; b < c; ++b) CHECK(orthogonality_error(m1 + b * g * g, g) <= 1e-5);
        free(m0);
        free(m1);
        wush_transform_destroy(r0);
        wush_transform_destroy(r1);
        wush_transform_destroy(r1b);
        wush_options_destroy(o);
    }

    /* create_fixed argument checks */
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_WUS, d, g, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_WUSH, d, g, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed((wush_transform_kind)5, d, g, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 48, 32, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 96, 24, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, 0, 32, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, 64, 0, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, 64, 32, NULL, NULL), WUSH_ERR_INVALID_ARGUMENT);
    /* Absurd sizes: d_in x G overflows size_t, or G is beyond the largest block size (these used
     * to wrap the allocation size and crash). A status, never a crash; nothing is written. */
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, (size_t)1 << 60, 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_RANDOM, (size_t)1 << 59, 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, (size_t)1 << 32, (size_t)1 << 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 512, 512, NULL, &untouched), WUSH_ERR_INVALID_ARGUMENT);
    {
        /* within size_t but far beyond memory: OUT_OF_MEMORY (or INVALID_ARGUMENT), not a crash */
        const wush_status st = wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, (size_t)1 << 50, 32, NULL, &untouched);
        CHECK(st == WUSH_ERR_OUT_OF_MEMORY || st == WUSH_ERR_INVALID_ARGUMENT);
    }
    CHECK(untouched == (wush_transform*)0x1);

    /* build argument checks */
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d + 32, WUSH_TRANSFORM_WUSH, NULL,
                                      &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d + 32, WUSH_TRANSFORM_HADAMARD, NULL,
                                      &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_WUS, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, (wush_transform_kind)5, NULL,
                                      &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, (wush_dtype)3, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, 0, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(NULL, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, NULL, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, NULL),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_transform*)0x1);
    {
        /* NaN in the weight -> NON_FINITE */
        const float saved = l->w[17 * d + 100];
        l->w[17 * d + 100] = NAN;
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL,
                                          &untouched),
                     WUSH_ERR_NON_FINITE);
        l->w[17 * d + 100] = saved;
        CHECK(untouched == (wush_transform*)0x1);
    }
    {
        /* a calibrator without tokens: WUS/WUSH rejected, data-free kinds fine */
        wush_calibrator* empty = NULL;
        wush_transform* h = NULL;
        CHECK_STATUS(wush_calibrator_create(d, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &empty), WUSH_OK);
        CHECK_STATUS(wush_transform_build(ctx, empty, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL,
                                          &untouched),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_build(ctx, empty, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUS, NULL,
                                          &untouched),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK(untouched == (wush_transform*)0x1);
        CHECK_STATUS(wush_transform_build(ctx, empty, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_HADAMARD, NULL, &h),
                     WUSH_OK);
        wush_transform_destroy(h);
        wush_calibrator_destroy(empty);
    }

    /* a block whose activations are all zero: the build succeeds, the block falls back (to H for
     * WUSH, to I for WUS) with zero singular values, and is reported */
    {
        wush_calibrator* zc = NULL;
        const size_t zb = 2, n = 256;
        float* xz = (float*)malloc(n * d * sizeof(float));
        memcpy(xz, l->cal, n * d * sizeof(float));
        for (i = 0; i < n; ++i)
            for (j = 0; j < g; ++j) xz[i * d + zb * g + j] = 0.0f;
        CHECK_STATUS(wush_calibrator_create(d, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &zc), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, zc, WUSH_DTYPE_F32, xz, n), WUSH_OK);
        for (k = 3; k < 5; ++k) {
            wush_transform* tz = NULL;
            size_t blocks[4] = {99, 99, 99, 99};
            float* ref = (float*)malloc(d * g * sizeof(float));
            nfb = 0;
            CHECK_STATUS(wush_transform_build(ctx, zc, WUSH_DTYPE_F32, l->w, l->d_out, d, kKinds[k], NULL, &tz), WUSH_OK);
            CHECK_STATUS(wush_transform_fallback_blocks(tz, &nfb, blocks, 4), WUSH_OK);
            CHECK(nfb == 1 && blocks[0] == zb && blocks[1] == 99);
            CHECK_STATUS(wush_transform_fallback_blocks(tz, &nfb, blocks, 0), WUSH_OK); /* count 0: nothing written */
            CHECK(nfb == 1);
            CHECK_STATUS(wush_transform_singular_values(tz, sv, d), WUSH_OK);
            CHECK(all_doubles_are(sv + zb * g, g, 0.0));
            CHECK(sv[0] > 0.0 && sv[(zb + 1) * g] > 0.0);
            CHECK_STATUS(wush_transform_matrices(tz, mats, d * g), WUSH_OK);
            CHECK_STATUS(wush_transform_matrices(kKinds[k] == WUSH_TRANSFORM_WUSH ? t[1] : t[0], ref, d * g), WUSH_OK);
            CHECK(memcmp(mats + zb * g * g, ref + zb * g * g, g * g * sizeof(float)) == 0);
            /* other blocks are data-driven, not the fallback */
            CHECK(memcmp(mats, ref, g * g * sizeof(float)) != 0);
            free(ref);
            wush_transform_destroy(tz);
        }
        free(xz);
        wush_calibrator_destroy(zc);
    }

    for (k = 0; k < 5; ++k) wush_transform_destroy(t[k]);
    wush_calibrator_destroy(cal);
    free(mats);
    free(sv);
    free(mx);
    free(mw);
    free(tb);
    free(ti);
    free(a);
}

/* ------------------------------------------------------------------------------------------------
 * Progress callbacks
 * ----------------------------------------------------------------------------------------------*/

typedef struct {
    int calls;
    int cancel_at; /* return non-zero on this call (1-based); 0: never */
    double first, last;
    int in_range, monotone;
} ProgressLog;

static int progress_cb(void* user, double fraction) {
    ProgressLog* p = (ProgressLog*)user;
    ++p->calls;
    if (p->calls == 1) p->first = fraction;
    if (!(fraction >= 0.0 && fraction <= 1.0)) p->in_range = 0;
    if (p->calls > 1 && fraction < p->last) p->monotone = 0;
    p->last = fraction;
    return p->cancel_at != 0 && p->calls >= p->cancel_at;
}

static void progress_reset(ProgressLog* p, int cancel_at) {
    p->calls = 0;
    p->cancel_at = cancel_at;
    p->first = p->last = -1.0;
    p->in_range = p->monotone = 1;
}

static void test_progress(wush_context* ctx, const Layer* l) {
    const size_t d = l->d_in;
    wush_calibrator* cal = NULL;
    wush_options* o = NULL;
    wush_context* one = NULL;
    wush_context* four = NULL;
    ProgressLog log;
    wush_transform* untouched = (wush_transform*)0x1;
    wush_transform* t = NULL;
    int rep;

    CHECK_STATUS(wush_calibrator_create(d, TG, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_progress(o, progress_cb, &log), WUSH_OK);
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &one), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(one, WUSH_CONTEXT_NUM_THREADS, 1), WUSH_OK);
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &four), WUSH_OK);
    CHECK_STATUS(wush_context_set_parameter(four, WUSH_CONTEXT_NUM_THREADS, 4), WUSH_OK);

    /* cancel on the first call: CANCELLED, exactly one call, *transform untouched (one thread:
     * every block reports) */
    progress_reset(&log, 1);
    CHECK_STATUS(wush_transform_build(one, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &untouched),
                 WUSH_ERR_CANCELLED);
    CHECK(log.calls == 1);
    CHECK(untouched == (wush_transform*)0x1);
    CHECK(strlen(wush_last_error()) > 0);

    /* cancel on the second call */
    progress_reset(&log, 2);
    CHECK_STATUS(wush_transform_build(one, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUS, o, &untouched),
                 WUSH_ERR_CANCELLED);
    CHECK(log.calls == 2);
    CHECK(untouched == (wush_transform*)0x1);

    /* a callback returning 0: fractions in [0, 1], non-decreasing, ending at 1.0 */
    progress_reset(&log, 0);
    CHECK_STATUS(wush_transform_build(one, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &t), WUSH_OK);
    CHECK(log.calls >= 1 && log.in_range && log.monotone && log.last == 1.0);
    CHECK(log.calls == (int)(d / TG)); /* one report per block */
    wush_transform_destroy(t);
    t = NULL;

    /* the same with several threads, repeated since blocks may finish on any thread: the callback
     * must still be called, end at 1.0, and a cancel request must still cancel */
    {
        int bad_end = 0, bad_order = 0, no_calls = 0, not_cancelled = 0;
        for (rep = 0; rep < 20; ++rep) {
            progress_reset(&log, 0);
            CHECK_STATUS(wush_transform_build(four, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &t),
                         WUSH_OK);
            wush_transform_destroy(t);
            t = NULL;
            if (log.calls == 0) ++no_calls;
            if (!(log.in_range && log.monotone)) ++bad_order;
            if (log.last != 1.0) ++bad_end;
        }
        for (rep = 0; rep < 20; ++rep) {
            wush_transform* tc = NULL;
            progress_reset(&log, 1);
            if (wush_transform_build(four, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &tc) !=
                    WUSH_ERR_CANCELLED ||
                tc != NULL || log.calls != 1)
                ++not_cancelled;
            wush_transform_destroy(tc);
        }
        CHECK(no_calls == 0);
        CHECK(bad_order == 0);
        CHECK(bad_end == 0);
        CHECK(not_cancelled == 0);
        if (no_calls || bad_end || not_cancelled)
            fprintf(stderr,
                    "  progress with 4 threads, of 20 builds each: %d saw no callback, %d did not end at 1.0, "
                    "%d were not cancelled by a callback that always returns 1\n",
                    no_calls, bad_end, not_cancelled);
    }

    /* the options still work after a cancelled build, and removing the callback stops the calls */
    CHECK_STATUS(wush_options_set_progress(o, NULL, NULL), WUSH_OK);
    progress_reset(&log, 1);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &t), WUSH_OK);
    CHECK(log.calls == 0);
    wush_transform_destroy(t);

    wush_context_destroy(one);
    wush_context_destroy(four);
    wush_options_destroy(o);
    wush_calibrator_destroy(cal);
}

/* ------------------------------------------------------------------------------------------------
 * Pre-quantized weights and the layerwise loss
 * ----------------------------------------------------------------------------------------------*/

/* The loss through a second path: quantize weight and held-out rows with wush_quantize_rows
 * (identity transform = no transform), dequantize, and compute ||Xq Wq^T - X W^T||^2/(d_out n)
 * here in float64. Returns -1 on an API failure. */
static double reference_identity_loss(wush_context* ctx, wush_format f, const Layer* l) {
    const size_t d = l->d_in, n = l->n_held;
    size_t wc = 0, ws = 0, xc = 0, xs = 0, k;
    unsigned char *wcodes, *wscales, *xcodes, *xscales;
    float *wq, *xq;
    double *yq, *y, sum = 0.0;
    int ok = 1;
    if (wush_format_buffer_sizes(f, l->d_out, d, &wc, &ws) != WUSH_OK) return -1.0;
    if (wush_format_buffer_sizes(f, n, d, &xc, &xs) != WUSH_OK) return -1.0;
    wcodes = (unsigned char*)malloc(wc);
    wscales = (unsigned char*)malloc(ws);
    xcodes = (unsigned char*)malloc(xc);
    xscales = (unsigned char*)malloc(xs);
    wq = (float*)malloc(l->d_out * d * sizeof(float));
    xq = (float*)malloc(n * d * sizeof(float));
    yq = (double*)malloc(n * l->d_out * sizeof(double));
    y = (double*)malloc(n * l->d_out * sizeof(double));
    ok &= wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, l->w, l->d_out, d, wcodes, wc, wscales, ws) == WUSH_OK;
    ok &= wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, l->held, n, d, xcodes, xc, xscales, xs) == WUSH_OK;
    ok &= wush_dequantize_rows(ctx, f, wcodes, wc, wscales, ws, l->d_out, d, wq, l->d_out * d) == WUSH_OK;
    ok &= wush_dequantize_rows(ctx, f, xcodes, xc, xscales, xs, n, d, xq, n * d) == WUSH_OK;
    if (ok) {
        ref_matmul_t(xq, wq, n, d, l->d_out, yq);
        ref_matmul_t(l->held, l->w, n, d, l->d_out, y);
        for (k = 0; k < n * l->d_out; ++k) sum += (yq[k] - y[k]) * (yq[k] - y[k]);
    }
    free(wcodes);
    free(wscales);
    free(xcodes);
    free(xscales);
    free(wq);
    free(xq);
    free(yq);
    free(y);
    return ok ? sum / ((double)l->d_out * (double)n) : -1.0;
}

static double api_loss(wush_context* ctx, const wush_transform* t, wush_format f, const Layer* l) {
    wush_qweight* q = NULL;
    double loss = -1.0;
    if (wush_qweight_create(ctx, t, f, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, NULL, &q) != WUSH_OK)
        return -1.0;
    if (wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss) != WUSH_OK) loss = -1.0;
    wush_qweight_destroy(q);
    return loss;
}

static void test_qweight_and_loss(wush_context* ctx, const Layer* l) {
    static const wush_format formats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};
    const size_t d = l->d_in;
    wush_transform *id32 = NULL, *id16 = NULL;
    wush_qweight* untouched = (wush_qweight*)0x1;
    size_t k;

    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, d, 32, NULL, &id32), WUSH_OK);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, d, 16, NULL, &id16), WUSH_OK);

    /* format group size must equal the transform's G */
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id16, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    /* other argument checks */
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, (wush_method)1, WUSH_DTYPE_F32, l->w, l->d_out, d, NULL,
                                     &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, (wush_format)4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d, NULL,
                                     &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d - 32,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, 0, d, NULL,
                                     &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, NULL, l->d_out, d,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, NULL, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                     NULL, NULL),
                 WUSH_ERR_INVALID_ARGUMENT);
    {
        const float saved = l->w[3];
        l->w[3] = INFINITY;
        CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out,
                                         d, NULL, &untouched),
                     WUSH_ERR_NON_FINITE);
        l->w[3] = saved;
    }
    CHECK(untouched == (wush_qweight*)0x1);

    /* info and data sizes match wush_format_buffer_sizes; with the identity transform the codes and
     * scales are those of wush_quantize_rows on the raw weight */
    for (k = 0; k < 4; ++k) {
        const wush_format f = formats[k];
        size_t g = 0, want_c = 0, want_s = 0, cb = 0, sb = 0, qd_out = 0, qd_in = 0;
        const void *codes = NULL, *scales = NULL;
        wush_format qf = (wush_format)99;
        wush_method qm = (wush_method)99;
        wush_qweight* q = NULL;
        unsigned char *rc, *rs;
        CHECK_STATUS(wush_format_group_size(f, &g), WUSH_OK);
        CHECK_STATUS(wush_format_buffer_sizes(f, l->d_out, d, &want_c, &want_s), WUSH_OK);
        CHECK_STATUS(wush_qweight_create(ctx, g == 32 ? id32 : id16, f, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                         NULL, &q),
                     WUSH_OK);
        CHECK_STATUS(wush_qweight_info(q, &qf, &qm, &qd_out, &qd_in), WUSH_OK);
        CHECK(qf == f && qm == WUSH_METHOD_RTN && qd_out == l->d_out && qd_in == d);
        CHECK_STATUS(wush_qweight_info(q, NULL, NULL, NULL, NULL), WUSH_OK);
        CHECK_STATUS(wush_qweight_data(q, &codes, &cb, &scales, &sb), WUSH_OK);
        CHECK(codes != NULL && scales != NULL && cb == want_c && sb == want_s);
        CHECK_STATUS(wush_qweight_data(q, NULL, NULL, NULL, NULL), WUSH_OK);
        rc = (unsigned char*)malloc(want_c);
        rs = (unsigned char*)malloc(want_s);
        CHECK_STATUS(wush_quantize_rows(ctx, f, WUSH_DTYPE_F32, l->w, l->d_out, d, rc, want_c, rs, want_s), WUSH_OK);
        if (codes && scales && cb == want_c && sb == want_s) {
            CHECK(memcmp(codes, rc, want_c) == 0);
            CHECK(memcmp(scales, rs, want_s) == 0);
        }
        free(rc);
        free(rs);
        wush_qweight_destroy(q);
    }

    /* the loss with the identity transform equals the second-path computation */
    for (k = 0; k < 4; ++k) {
        const wush_format f = formats[k];
        size_t g = 0;
        double got, want;
        CHECK_STATUS(wush_format_group_size(f, &g), WUSH_OK);
        got = api_loss(ctx, g == 32 ? id32 : id16, f, l);
        want = reference_identity_loss(ctx, f, l);
        CHECK(got > 0.0 && want > 0.0);
        CHECK_CLOSE(got, want, 1e-9);
    }

    /* WUSH beats identity and Hadamard for MXFP4 (and INT4) on the small layer */
    {
        wush_calibrator* cal = NULL;
        wush_transform *tw = NULL, *th = NULL;
        double lw, lh, li;
        CHECK_STATUS(wush_calibrator_create(d, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &tw),
                     WUSH_OK);
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_HADAMARD, NULL, &th),
                     WUSH_OK);
        lw = api_loss(ctx, tw, WUSH_FORMAT_MXFP4, l);
        lh = api_loss(ctx, th, WUSH_FORMAT_MXFP4, l);
        li = api_loss(ctx, id32, WUSH_FORMAT_MXFP4, l);
        CHECK(lw > 0.0 && lh > 0.0 && li > 0.0);
        CHECK(lw < li);
        CHECK(lw < lh);
        lw = api_loss(ctx, tw, WUSH_FORMAT_INT4, l);
        li = api_loss(ctx, id32, WUSH_FORMAT_INT4, l);
        CHECK(lw > 0.0 && lw < li);

        /* loss argument checks: the loss output is untouched on failure */
        {
            wush_qweight *q = NULL, *q16 = NULL;
            double loss = -9.0;
            CHECK_STATUS(wush_qweight_create(ctx, tw, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out,
                                             d, NULL, &q),
                         WUSH_OK);
            CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, 0, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, NULL, l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, NULL, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, (wush_dtype)7, l->held, l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, NULL),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(ctx, NULL, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(ctx, tw, (const wush_qweight*)tw, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held,
                                         l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(wush_layer_loss(NULL, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            /* a qweight of another G than the transform */
            CHECK_STATUS(wush_qweight_create(ctx, id16, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w,
                                             l->d_out, d, NULL, &q16),
                         WUSH_OK);
            CHECK_STATUS(wush_layer_loss(ctx, tw, q16, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                         WUSH_ERR_INVALID_ARGUMENT);
            {
                const float saved = l->held[5 * d + 77];
                l->held[5 * d + 77] = NAN;
                CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                             WUSH_ERR_NON_FINITE);
                l->held[5 * d + 77] = saved;
            }
            {
                const float saved = l->w[9];
                l->w[9] = -INFINITY;
                CHECK_STATUS(wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                             WUSH_ERR_NON_FINITE);
                l->w[9] = saved;
            }
            CHECK(loss == -9.0);
            wush_qweight_destroy(q16);
            wush_qweight_destroy(q);
        }
        wush_transform_destroy(tw);
        wush_transform_destroy(th);
        wush_calibrator_destroy(cal);
    }

    wush_transform_destroy(id32);
    wush_transform_destroy(id16);
}

/* ------------------------------------------------------------------------------------------------
 * Example layers
 * ----------------------------------------------------------------------------------------------*/

static void test_example_layers(void) {
    const size_t count = wush_example_layer_count();
    size_t i, j, d_out = 0, d_in = 0;
    int have_small = 0, have_big = 0;

    CHECK(count >= 5);
    for (i = 0; i < count; ++i) {
        const char* name = wush_example_layer_name(i);
        CHECK(name != NULL && name[0] != '\0');
        if (!name) continue;
        for (j = 0; j < i; ++j) {
            const char* other = wush_example_layer_name(j);
            CHECK(other != NULL && strcmp(other, name) != 0);
        }
        d_out = d_in = 0;
        CHECK_STATUS(wush_example_layer_shape(name, &d_out, &d_in), WUSH_OK);
        CHECK(d_out > 0 && d_in > 0 && d_in % 32 == 0);
        if (strcmp(name, "small_256x512") == 0) have_small = 1;
        if (strcmp(name, "4096x14336") == 0) have_big = 1;
    }
    CHECK(have_small && have_big);
    CHECK(wush_example_layer_name(count) == NULL);
    CHECK(wush_example_layer_name((size_t)-1) == NULL);

    /* names read d_in x d_out; the shape call writes d_out first */
    CHECK_STATUS(wush_example_layer_shape("4096x14336", &d_out, &d_in), WUSH_OK);
    CHECK(d_in == 4096 && d_out == 14336);
    CHECK_STATUS(wush_example_layer_shape("14336x4096", &d_out, &d_in), WUSH_OK);
    CHECK(d_in == 14336 && d_out == 4096);
    CHECK_STATUS(wush_example_layer_shape("small_256x512", &d_out, &d_in), WUSH_OK);
    CHECK(d_in == 256 && d_out == 512);
    CHECK_STATUS(wush_example_layer_shape("small_512x256", &d_out, &d_in), WUSH_OK);
    CHECK(d_in == 512 && d_out == 256);
    d_out = d_in = 3;
    CHECK_STATUS(wush_example_layer_shape("no_such_layer", &d_out, &d_in), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_example_layer_shape("", &d_out, &d_in), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_example_layer_shape(NULL, &d_out, &d_in), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(d_out == 3 && d_in == 3);

    /* generate: buffer sizes, determinism, seed dependence */
    {
        const size_t dO = 512, dI = 256, nc = 24, nh = 8;
        const size_t wn = dO * dI, cn = nc * dI, hn = nh * dI;
        float *w1 = (float*)malloc(wn * sizeof(float)), *w2 = (float*)malloc(wn * sizeof(float));
        float *c1 = (float*)malloc(cn * sizeof(float)), *c2 = (float*)malloc(cn * sizeof(float));
        float *h1 = (float*)malloc(hn * sizeof(float)), *h2 = (float*)malloc(hn * sizeof(float));
        float *w3 = (float*)malloc(wn * sizeof(float)), *c3 = (float*)malloc(2 * cn * sizeof(float));
        float* h3 = (float*)malloc(hn * sizeof(float));
        int finite = 1;
        for (i = 0; i < wn; ++i) w1[i] = 5.0f;
        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, nc, nh, w1, wn - 1, c1, cn, h1, hn),
                     WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, nc, nh, w1, wn, c1, cn - 1, h1, hn),
                     WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, nc, nh, w1, wn, c1, cn, h1, hn - 1),
                     WUSH_ERR_BUFFER_TOO_SMALL);
        CHECK(all_floats_are(w1, wn, 5.0f));
        CHECK_STATUS(wush_example_layer_generate("no_such_layer", 7, nc, nh, w1, wn, c1, cn, h1, hn),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_example_layer_generate(NULL, 7, nc, nh, w1, wn, c1, cn, h1, hn), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, nc, nh, NULL, wn, c1, cn, h1, hn),
                     WUSH_ERR_INVALID_ARGUMENT);

        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, nc, nh, w1, wn, c1, cn, h1, hn), WUSH_OK);
        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, nc, nh, w2, wn, c2, cn, h2, hn), WUSH_OK);
        CHECK(memcmp(w1, w2, wn * sizeof(float)) == 0);
        CHECK(memcmp(c1, c2, cn * sizeof(float)) == 0);
        CHECK(memcmp(h1, h2, hn * sizeof(float)) == 0);
        for (i = 0; i < wn; ++i) finite &= isfinite(w1[i]) != 0;
        for (i = 0; i < cn; ++i) finite &= isfinite(c1[i]) != 0;
        for (i = 0; i < hn; ++i) finite &= isfinite(h1[i]) != 0;
        CHECK(finite);
        /* calibration and held-out sets are independent draws */
        CHECK(memcmp(c1, h1, hn * sizeof(float)) != 0);

        CHECK_STATUS(wush_example_layer_generate("small_256x512", 8, nc, nh, w2, wn, c2, cn, h2, hn), WUSH_OK);
        CHECK(memcmp(w1, w2, wn * sizeof(float)) != 0);
        CHECK(memcmp(c1, c2, cn * sizeof(float)) != 0);
        CHECK(memcmp(h1, h2, hn * sizeof(float)) != 0);

        /* the weight does not depend on the token counts */
        CHECK_STATUS(wush_example_layer_generate("small_256x512", 7, 2 * nc, nh, w3, wn, c3, 2 * cn, h3, hn), WUSH_OK);
        CHECK(memcmp(w1, w3, wn * sizeof(float)) == 0);
        free(w1);
        free(w2);
        free(w3);
        free(c1);
        free(c2);
        free(c3);
        free(h1);
        free(h2);
        free(h3);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Handles
 * ----------------------------------------------------------------------------------------------*/

static void test_handles(wush_context* ctx, const Layer* l) {
    const size_t d = l->d_in;
    wush_calibrator* cal = NULL;
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    wush_options* o = NULL;
    uint64_t tokens = 0;
    size_t dd = 0;
    double loss = -1.0;

    /* destroy(NULL) is a no-op for every object */
    wush_context_destroy(NULL);
    wush_options_destroy(NULL);
    wush_calibrator_destroy(NULL);
    wush_transform_destroy(NULL);
    wush_qweight_destroy(NULL);
    wush_tensor_file_destroy(NULL);

    CHECK_STATUS(wush_calibrator_create(d, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, d, 32, NULL, &t), WUSH_OK);
    CHECK_STATUS(wush_qweight_create(ctx, t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d, NULL,
                                     &q),
                 WUSH_OK);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);

    /* handles of the wrong type are rejected, and wrong-type destroys release nothing */
    CHECK_STATUS(wush_transform_info((const wush_transform*)q, NULL, &dd, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_info((const wush_transform*)cal, NULL, &dd, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_info((const wush_qweight*)t, NULL, NULL, NULL, &dd), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_token_count((const wush_calibrator*)t, &tokens), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add(ctx, (wush_calibrator*)o, WUSH_DTYPE_F32, l->cal, 1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add((wush_context*)cal, cal, WUSH_DTYPE_F32, l->cal, 1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_layer_loss(ctx, (const wush_transform*)q, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, 1,
                                 &loss),
                 WUSH_ERR_INVALID_ARGUMENT);
    wush_transform_destroy((wush_transform*)q);
    wush_qweight_destroy((wush_qweight*)t);
    wush_calibrator_destroy((wush_calibrator*)o);
    CHECK_STATUS(wush_transform_info(t, NULL, &dd, NULL), WUSH_OK);
    CHECK(dd == d);
    CHECK_STATUS(wush_qweight_info(q, NULL, NULL, NULL, &dd), WUSH_OK);
    CHECK_STATUS(wush_calibrator_token_count(cal, &tokens), WUSH_OK);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, NULL), WUSH_ERR_INVALID_ARGUMENT);
    {
        int64_t s = -1;
        CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &s), WUSH_OK);
    }
    /* a qweight outlives its transform (it does not keep it) */
    {
        wush_transform* t2 = NULL;
        wush_qweight* q2 = NULL;
        const void* codes = NULL;
        size_t cb = 0;
        CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, d, 32, NULL, &t2), WUSH_OK);
        CHECK_STATUS(wush_qweight_create(ctx, t2, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                         NULL, &q2),
                     WUSH_OK);
        wush_transform_destroy(t2);
        CHECK_STATUS(wush_qweight_data(q2, &codes, &cb, NULL, NULL), WUSH_OK);
        CHECK(codes != NULL && cb == l->d_out * d / 2);
        wush_qweight_destroy(q2);
    }

    /* A layer added to a checkpoint whose transform is destroyed, and whose address a new
     * transform then takes, is refused at write time (the address alone used to pass). */
    {
        wush_checkpoint* ck = NULL;
        wush_transform* gone = NULL;
        wush_transform* fresh[16] = {NULL};
        const void* old_address = NULL;
        int reused = 0, i;
        CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, d, 32, NULL, &gone), WUSH_OK);
        CHECK_STATUS(wush_checkpoint_create(&ck), WUSH_OK);
        CHECK_STATUS(wush_checkpoint_add_layer(ck, "layer", gone, q), WUSH_OK);
        old_address = gone;
        wush_transform_destroy(gone);
        for (i = 0; i < 16 && !reused; ++i) {
            CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, d, 32, NULL, &fresh[i]), WUSH_OK);
            reused = (const void*)fresh[i] == old_address;
        }
        if (!reused) printf("capi_core: note: the allocator did not reuse the address; the stale-handle check is weaker\n");
        CHECK_STATUS(wush_checkpoint_write(ck, "wush_test_stale_handle.safetensors", NULL), WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "destroyed") != NULL);
        remove("wush_test_stale_handle.safetensors");
        for (i = 0; i < 16; ++i) wush_transform_destroy(fresh[i]);
        wush_checkpoint_destroy(ck);
    }

    /* destroyed handles are rejected (checked right away, before any allocation could reuse the
     * address) */
    wush_qweight_destroy(q);
    CHECK_STATUS(wush_qweight_info(q, NULL, NULL, NULL, &dd), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_data(q, NULL, NULL, NULL, NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, 1, &loss),
                 WUSH_ERR_INVALID_ARGUMENT);
    wush_qweight_destroy(q); /* double destroy: no-op */
    wush_transform_destroy(t);
    CHECK_STATUS(wush_transform_info(t, NULL, &dd, NULL), WUSH_ERR_INVALID_ARGUMENT);
    {
        float one = 3.0f;
        CHECK_STATUS(wush_transform_matrices(t, &one, 1), WUSH_ERR_INVALID_ARGUMENT);
        CHECK(one == 3.0f);
    }
    wush_transform_destroy(t);
    wush_calibrator_destroy(cal);
    CHECK_STATUS(wush_calibrator_token_count(cal, &tokens), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, l->cal, 1), WUSH_ERR_INVALID_ARGUMENT);
    wush_calibrator_destroy(cal);
    wush_options_destroy(o);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 0.5), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(loss == -1.0);
}

/* Independent of the library's validator: RFC 3629 well-formedness, byte by byte. */
static int valid_utf8(const char* s) {
    const unsigned char* p = (const unsigned char*)s;
    while (*p) {
        size_t n, k;
        unsigned char lo = 0x80, hi = 0xBF;
        if (*p < 0x80) { ++p; continue; }
        if (*p >= 0xC2 && *p <= 0xDF) n = 2;
        else if (*p >= 0xE0 && *p <= 0xEF) { n = 3; if (*p == 0xE0) lo = 0xA0; if (*p == 0xED) hi = 0x9F; }
        else if (*p >= 0xF0 && *p <= 0xF4) { n = 4; if (*p == 0xF0) lo = 0x90; if (*p == 0xF4) hi = 0x8F; }
        else return 0;
        if (p[1] < lo || p[1] > hi) return 0;
        for (k = 2; k < n; ++k)
            if (p[k] < 0x80 || p[k] > 0xBF) return 0;
        p += n;
    }
    return 1;
}

/* Non-UTF-8 layer names are refused by add_layer (they used to fail later, in write, as
 * WUSH_ERR_INTERNAL), and wush_last_error() stays valid UTF-8 when a message quotes raw bytes
 * from a path or a file. */
static void test_utf8(wush_context* ctx, const Layer* l) {
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    wush_checkpoint* ck = NULL;
    wush_checkpoint* opened = NULL;
    static const char header[] = "{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}";
    FILE* f;
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, l->d_in, 32, NULL, &t), WUSH_OK);
    CHECK_STATUS(wush_qweight_create(ctx, t, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in,
                                     NULL, &q),
                 WUSH_OK);
    CHECK_STATUS(wush_checkpoint_create(&ck), WUSH_OK);
    CHECK_STATUS(wush_checkpoint_add_layer(ck, "bad\xff\xfename", t, q), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "UTF-8") != NULL);
    CHECK(valid_utf8(wush_last_error()));
    CHECK_STATUS(wush_checkpoint_add_layer(ck, "caf\xc3\xa9", t, q), WUSH_OK);
    wush_checkpoint_destroy(ck);

    CHECK_STATUS(wush_checkpoint_open("/nonexistent-dir/\xff\xc0.safetensors", &opened), WUSH_ERR_IO);
    CHECK(valid_utf8(wush_last_error()));
    f = fopen("wush_test_bad_utf8.safetensors", "wb");
    CHECK(f != NULL);
    if (f) {
        unsigned char len[8] = {0};
        size_t n = sizeof header - 1, i;
        for (i = 0; i < 8; ++i) len[i] = (unsigned char)((n >> (8 * i)) & 0xFF);
        fwrite(len, 1, 8, f);
        fwrite(header, 1, n, f);
        fclose(f);
        CHECK_STATUS(wush_checkpoint_open("wush_test_bad_utf8.safetensors", &opened), WUSH_ERR_CORRUPT_FILE);
        CHECK(valid_utf8(wush_last_error()));
        remove("wush_test_bad_utf8.safetensors");
    }
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
}

/* ------------------------------------------------------------------------------------------------
 * WUSH_OPTION_SEARCH: the option's bounds, where it applies, and what it produces
 * ----------------------------------------------------------------------------------------------*/

static void test_search(wush_context* ctx, const Layer* l) {
    wush_options* o = NULL;
    wush_calibrator *cal = NULL, *full = NULL;
    wush_transform *t = NULL, *plain_t = NULL, *untouched = (wush_transform*)0x1;
    wush_qweight *q = NULL, *plain_q = NULL, *untouched_q = (wush_qweight*)0x1;
    int64_t v = -1;
    double loss_s = -1.0, loss_p = -1.0;
    size_t nb = 0;

    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEARCH, &v), WUSH_OK);
    CHECK(v == 0);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEARCH_TOKENS, &v), WUSH_OK);
    CHECK(v == 256);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 2), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, -1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 15), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 65537), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_SEARCH, 1.0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEARCH, &v), WUSH_OK);
    CHECK(v == 1);

    CHECK_STATUS(wush_calibrator_create(l->d_in, TG, WUSH_MOMENTS_BLOCK_DIAGONAL, &cal), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, cal, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);
    /* the search needs the format: wush_transform_build refuses it for WUSH, the data-free kinds ignore it */
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, WUSH_TRANSFORM_WUSH, o,
                                      &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_transform*)0x1);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, WUSH_TRANSFORM_HADAMARD, o, &t),
                 WUSH_OK);
    wush_transform_destroy(t);
    t = NULL;
    /* a format whose group is not the calibrator's G */
    CHECK_STATUS(wush_layer_quantize(ctx, cal, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32,
                                     l->w, l->d_out, l->d_in, o, &untouched, &untouched_q),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_transform*)0x1 && untouched_q == (wush_qweight*)0x1);

    /* RTN: an ordinary transform (kind WUSH, no fallbacks), and on held-out tokens not worse than
     * plain WUSH (the layer's measured gain is several percent; 2% tolerance for the sample) */
    CHECK_STATUS(wush_layer_quantize(ctx, cal, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32,
                                     l->w, l->d_out, l->d_in, o, &t, &q),
                 WUSH_OK);
    CHECK_STATUS(wush_layer_quantize(ctx, cal, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32,
                                     l->w, l->d_out, l->d_in, NULL, &plain_t, &plain_q),
                 WUSH_OK);
    if (t && q && plain_t && plain_q) {
        wush_transform_kind kind = WUSH_TRANSFORM_IDENTITY;
        float* a = (float*)malloc(l->d_in * TG * sizeof(float));
        float* b = (float*)malloc(l->d_in * TG * sizeof(float));
        size_t i, differ = 0;
        CHECK_STATUS(wush_transform_info(t, &kind, NULL, NULL), WUSH_OK);
        CHECK(kind == WUSH_TRANSFORM_WUSH);
        CHECK_STATUS(wush_transform_fallback_blocks(t, &nb, NULL, 0), WUSH_OK);
        CHECK(nb == 0);
        CHECK_STATUS(wush_transform_matrices(t, a, l->d_in * TG), WUSH_OK);
        CHECK_STATUS(wush_transform_matrices(plain_t, b, l->d_in * TG), WUSH_OK);
        for (i = 0; i < l->d_in * TG; ++i) differ += a[i] != b[i];
        CHECK(differ > 0);
        CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss_s), WUSH_OK);
        CHECK_STATUS(wush_layer_loss(ctx, plain_t, plain_q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held,
                                     &loss_p),
                     WUSH_OK);
        CHECK(loss_s > 0.0 && loss_s <= 1.02 * loss_p);
        free(a);
        free(b);
    }
    wush_transform_destroy(t);
    wush_qweight_destroy(q);
    wush_transform_destroy(plain_t);
    wush_qweight_destroy(plain_q);

    /* The calibrator's token sample: bounded, set before tokens, exported as layout version 2; a
     * version-1 state still imports into a sampling calibrator (with an empty sample). */
    {
        wush_calibrator *sc = NULL, *plain_c = NULL;
        size_t count = 99, n1 = 0, n2 = 0;
        double *s1 = NULL, *s2 = NULL;
        CHECK_STATUS(wush_calibrator_create(l->d_in, TG, WUSH_MOMENTS_BLOCK_DIAGONAL, &sc), WUSH_OK);
        CHECK_STATUS(wush_calibrator_set_sample_size(sc, 65537), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_set_sample_size(NULL, 4), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_set_sample_size(sc, 64), WUSH_OK);
        CHECK_STATUS(wush_calibrator_sample_count(sc, &count), WUSH_OK);
        CHECK(count == 0);
        CHECK_STATUS(wush_calibrator_add(ctx, sc, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);
        CHECK_STATUS(wush_calibrator_sample_count(sc, &count), WUSH_OK);
        CHECK(count == 64);
        CHECK_STATUS(wush_calibrator_sample_count(sc, NULL), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_set_sample_size(sc, 8), WUSH_ERR_INVALID_ARGUMENT); /* tokens already added */
        CHECK_STATUS(wush_calibrator_create(l->d_in, TG, WUSH_MOMENTS_BLOCK_DIAGONAL, &plain_c), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, plain_c, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);
        s1 = export_all(plain_c, &n1);
        s2 = export_all(sc, &n2);
        CHECK(s1 && s2 && n2 == n1 + 2 + 64 + 64 * l->d_in);
        if (s1 && s2) {
            CHECK(s1[1] == 1.0 && s2[1] == 2.0);
            CHECK_STATUS(wush_calibrator_import_state(sc, s1, n1), WUSH_OK); /* version 1 into a sampler */
            CHECK_STATUS(wush_calibrator_sample_count(sc, &count), WUSH_OK);
            CHECK(count == 0);
            CHECK_STATUS(wush_calibrator_import_state(sc, s2, n2), WUSH_OK);
            CHECK_STATUS(wush_calibrator_sample_count(sc, &count), WUSH_OK);
            CHECK(count == 64);
            CHECK_STATUS(wush_calibrator_import_state(plain_c, s2, n2), WUSH_ERR_INVALID_ARGUMENT); /* size differs */
        }
        /* the search scores on the sample: an ordinary, valid result */
        t = NULL;
        q = NULL;
        CHECK_STATUS(wush_layer_quantize(ctx, sc, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32,
                                         l->w, l->d_out, l->d_in, o, &t, &q),
                     WUSH_OK);
        if (t && q) {
            double ls = -1.0;
            CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &ls), WUSH_OK);
            CHECK(ls > 0.0 && ls <= 1.05 * loss_p);
        }
        wush_transform_destroy(t);
        wush_qweight_destroy(q);
        free(s1);
        free(s2);
        wush_calibrator_destroy(sc);
        wush_calibrator_destroy(plain_c);
    }

    /* GPTQ with the search */
    t = NULL;
    q = NULL;
    CHECK_STATUS(wush_calibrator_create(l->d_in, TG, WUSH_MOMENTS_FULL, &full), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, full, WUSH_DTYPE_F32, l->cal, l->n_cal), WUSH_OK);
    CHECK_STATUS(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32,
                                     l->w, l->d_out, l->d_in, o, &t, &q),
                 WUSH_OK);
    if (t && q) {
        CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss_s), WUSH_OK);
        CHECK(loss_s > 0.0 && loss_s < loss_p); /* GPTQ+search below RTN WUSH */
    }
    wush_transform_destroy(t);
    wush_qweight_destroy(q);
    wush_calibrator_destroy(full);
    wush_calibrator_destroy(cal);
    wush_options_destroy(o);
}

int main(void) {
    wush_context* ctx = NULL;
    Layer small;

    test_options();
    test_transform_names();
    test_example_layers();

    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    if (ctx == NULL) {
        printf("capi_core: %d checks, %d failed (no CPU context)\n", g_checks, g_failures);
        return 1;
    }
    test_calibrator_basics(ctx);
    test_calibrator_merge_and_state(ctx);

    CHECK(load_layer("small_256x512", 1, 1024, 256, &small));
    if (small.w && small.cal && small.held) {
        test_transforms(ctx, &small);
        test_progress(ctx, &small);
        test_qweight_and_loss(ctx, &small);
        test_handles(ctx, &small);
        test_utf8(ctx, &small);
        test_search(ctx, &small);
    }
    free_layer(&small);
    wush_context_destroy(ctx);

    printf("capi_core: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
