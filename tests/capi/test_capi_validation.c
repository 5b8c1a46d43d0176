/* Tests of the calibrator's validation sample and the search's per-layer guard, in plain C99
 * against the shared library.
 *
 * Oracles: a second path through the API (the guarded layer must be, loss for loss and matrix
 * for matrix, the best of the layers built separately without validation tokens, compared
 * with wush_layer_loss on the validation tokens), and the sample's own rules (merge of shards =
 * one calibrator; exported state layout as documented in wush.h). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "wush/wush.h"

enum { D_IN = 64, D_OUT = 48, N_CAL = 512, N_VAL = 256 };

static uint64_t g_rng = 1;

static void rng_seed(uint64_t s) {
    g_rng = s * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
}

static double rng_uniform(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return ((double)((g_rng * 0x2545F4914F6CDD1Dull) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_gauss(void) {
    return sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform());
}

/* Tokens whose channels have standard deviation `loud` where j % 4 == 0 and `quiet` elsewhere:
 * calibration uses (4, 0.05); "shifted" validation documents swap the two, so a transform fitted
 * to the calibration moments amplifies exactly the channels that are now loud. */
static void make_tokens(float* x, size_t n, double loud, double quiet, uint64_t seed) {
    size_t t, j;
    rng_seed(seed);
    for (t = 0; t < n; ++t)
        for (j = 0; j < D_IN; ++j) x[t * D_IN + j] = (float)(rng_gauss() * (j % 4 == 0 ? loud : quiet));
}

static wush_calibrator* make_calibrator(wush_context* ctx, size_t g, wush_moment_mode mode, const float* cal,
                                        const float* val) {
    wush_calibrator* c = NULL;
    CHECK_STATUS(wush_calibrator_create(D_IN, g, mode, &c), WUSH_OK);
    if (c == NULL) return NULL;
    CHECK_STATUS(wush_calibrator_set_sample_size(c, 256), WUSH_OK);
    if (val != NULL) CHECK_STATUS(wush_calibrator_set_validation_size(c, N_VAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
    if (val != NULL) CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, val, N_VAL), WUSH_OK);
    return c;
}

typedef struct {
    wush_transform* t;
    wush_qweight* q;
    double loss; /* on the validation tokens */
} Built;

/* `o` less the search (seed, damping and storage dtype kept): the library refuses a search of
 * I, H and R, which have nothing to search, so the guard's data-free candidates are these. */
static wush_options* without_search(const wush_options* o) {
    wush_options* out = NULL;
    double damping = 0.0;
    int64_t seed = 0, storage = 0;
    CHECK_STATUS(wush_options_create(&out), WUSH_OK);
    if (o != NULL && out != NULL) {
        CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &damping), WUSH_OK);
        CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_SEED, &seed), WUSH_OK);
        CHECK_STATUS(wush_options_get_int(o, WUSH_OPTION_TRANSFORM_DTYPE, &storage), WUSH_OK);
        CHECK_STATUS(wush_options_set_double(out, WUSH_OPTION_DAMPING, damping), WUSH_OK);
        CHECK_STATUS(wush_options_set_int(out, WUSH_OPTION_SEED, seed), WUSH_OK);
        CHECK_STATUS(wush_options_set_int(out, WUSH_OPTION_TRANSFORM_DTYPE, storage), WUSH_OK);
    }
    return out;
}

/* The guard's shrunk candidate as the header defines it: plain WUSH with WUSH_OPTION_DAMPING
 * max(lambda, 1) and GPTQ's Hessian damped by lambda (WUSH_OPTION_HESSIAN_DAMPING). */
static wush_options* shrunk_options(const wush_options* searched) {
    wush_options* o = without_search(searched);
    double lambda = 0.0;
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_DAMPING, &lambda), WUSH_OK);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_HESSIAN_DAMPING, lambda), WUSH_OK);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, lambda > 1.0 ? lambda : 1.0), WUSH_OK);
    return o;
}

static Built build(wush_context* ctx, wush_calibrator* c, wush_transform_kind kind, wush_format f, wush_method m,
                   const float* w, const wush_options* o, const float* val) {
    Built b = {NULL, NULL, -1.0};
    const int data_free = kind != WUSH_TRANSFORM_WUS && kind != WUSH_TRANSFORM_WUSH;
    wush_options* plain = data_free ? without_search(o) : NULL;
    CHECK_STATUS(
        wush_layer_quantize(ctx, c, kind, f, m, WUSH_DTYPE_F32, w, D_OUT, D_IN, data_free ? plain : o, &b.t, &b.q),
        WUSH_OK);
    wush_options_destroy(plain);
    if (b.t != NULL && b.q != NULL && val != NULL)
        CHECK_STATUS(wush_layer_loss(ctx, b.t, b.q, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, val, N_VAL, &b.loss), WUSH_OK);
    return b;
}

static void release(Built* b) {
    wush_transform_destroy(b->t);
    wush_qweight_destroy(b->q);
}

static int same_matrices(const wush_transform* a, const wush_transform* b) {
    size_t g = 0, n;
    float *ma, *mb;
    int same;
    if (wush_transform_info(a, NULL, NULL, &g) != WUSH_OK) return 0;
    n = (size_t)D_IN * g;
    ma = malloc(n * sizeof(float));
    mb = malloc(n * sizeof(float));
    same = ma && mb && wush_transform_matrices(a, ma, n) == WUSH_OK && wush_transform_matrices(b, mb, n) == WUSH_OK &&
           memcmp(ma, mb, n * sizeof(float)) == 0;
    free(ma);
    free(mb);
    return same;
}

/* The packed codes and scales, byte for byte. */
static int same_qweights(const wush_qweight* a, const wush_qweight* b) {
    const void *ca = NULL, *sa = NULL, *cb = NULL, *sb = NULL;
    size_t nca = 0, nsa = 0, ncb = 0, nsb = 0;
    if (wush_qweight_data(a, &ca, &nca, &sa, &nsa) != WUSH_OK || wush_qweight_data(b, &cb, &ncb, &sb, &nsb) != WUSH_OK)
        return 0;
    return nca == ncb && nsa == nsb && memcmp(ca, cb, nca) == 0 && memcmp(sa, sb, nsa) == 0;
}

static int close_to(double got, double want, double tol) {
    return fabs(got - want) <= tol;
}

static wush_transform_kind kind_of(const wush_transform* t) {
    wush_transform_kind k = (wush_transform_kind)-1;
    wush_transform_info(t, &k, NULL, NULL);
    return k;
}

/* The guard on one format and method: with validation tokens from shifted documents the layer
 * is the best of WUSH+s, I, H, R on them (here a data-free one: the data make WUSH lose); with
 * validation tokens from the calibration documents' distribution, WUSH+s stays, unchanged. */
static void test_guard(wush_context* ctx, wush_format f, wush_method m, const float* w, const float* cal,
                       const float* shifted, const float* same) {
    static const wush_transform_kind kAlternatives[3] = {WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD,
                                                         WUSH_TRANSFORM_RANDOM};
    const wush_moment_mode mode = m == WUSH_METHOD_GPTQ ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL;
    size_t g = 0;
    wush_options* o = NULL;
    wush_calibrator *plain, *guarded_shift, *guarded_same;
    Built ref[5], got, kept;
    wush_options* shrunk;
    int i, best = 0;
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_GUARD, 0), WUSH_OK); /* the oracle's layers: unguarded */
    plain = make_calibrator(ctx, g, mode, cal, NULL);
    guarded_shift = make_calibrator(ctx, g, mode, cal, shifted);
    guarded_same = make_calibrator(ctx, g, mode, cal, same);
    if (o == NULL || plain == NULL || guarded_shift == NULL || guarded_same == NULL) return;

    /* The oracle: the five layers built without validation tokens, scored on the shifted ones
     * (plain WUSH is not among them: on these documents it loses to the searched layer). */
    ref[0] = build(ctx, plain, WUSH_TRANSFORM_WUSH, f, m, w, o, shifted);
    for (i = 0; i < 3; ++i) {
        ref[i + 1] = build(ctx, plain, kAlternatives[i], f, m, w, o, shifted);
        if (ref[i + 1].loss < ref[best].loss) best = i + 1;
    }
    shrunk = shrunk_options(o);
    ref[4] = build(ctx, plain, WUSH_TRANSFORM_WUSH, f, m, w, shrunk, shifted);
    if (ref[4].loss < ref[best].loss) best = 4;
    wush_options_destroy(shrunk);
    /* The data must make WUSH lose clearly, or this test would not test the guard. */
    CHECK(best != 0 && ref[best].loss < 0.8 * ref[0].loss);

    got = build(ctx, guarded_shift, WUSH_TRANSFORM_WUSH, f, m, w, o, shifted);
    CHECK(got.loss == ref[best].loss);
    CHECK(kind_of(got.t) == kind_of(ref[best].t));
    CHECK(got.t != NULL && ref[best].t != NULL && same_matrices(got.t, ref[best].t));
    {
        wush_guard_source source = WUSH_GUARD_NONE;
        wush_guard_candidate k = WUSH_GUARD_SEARCHED;
        size_t n = 0;
        double loss = -1.0;
        int replaces = 0;
        CHECK_STATUS(wush_transform_guard(got.t, &source, &n, &k), WUSH_OK);
        CHECK(source == WUSH_GUARD_VALIDATION && n == N_VAL &&
              (int)k == (best == 4 ? WUSH_GUARD_SHRUNK : best + 1)); /* I, H, R are 2, 3, 4 */
        CHECK_STATUS(wush_transform_guard_candidate(got.t, k, &loss, NULL, NULL, &replaces), WUSH_OK);
        /* The same tokens, in the validation sample's order (its sums round differently). */
        CHECK(close_to(loss, ref[best].loss, 1e-12 * ref[best].loss) && replaces == 1);
        CHECK_STATUS(wush_transform_guard_candidate(got.t, WUSH_GUARD_SEARCHED, &loss, NULL, NULL, NULL), WUSH_OK);
        CHECK(close_to(loss, ref[0].loss, 1e-12 * ref[0].loss));
    }

    /* Validation tokens like the calibration ones: WUSH+s wins there and is kept as is. */
    kept = build(ctx, guarded_same, WUSH_TRANSFORM_WUSH, f, m, w, o, same);
    CHECK(kind_of(kept.t) == WUSH_TRANSFORM_WUSH);
    CHECK(kept.t != NULL && ref[0].t != NULL && same_matrices(kept.t, ref[0].t));

    for (i = 0; i < 5; ++i) release(&ref[i]);
    release(&got);
    release(&kept);
    wush_calibrator_destroy(plain);
    wush_calibrator_destroy(guarded_shift);
    wush_calibrator_destroy(guarded_same);
    wush_options_destroy(o);
}

static double* export_state(const wush_calibrator* c, size_t* n) {
    double* s;
    *n = 0;
    if (wush_calibrator_state_size(c, n) != WUSH_OK) return NULL;
    s = malloc(*n * sizeof(double));
    if (s != NULL && wush_calibrator_export_state(c, s, *n) != WUSH_OK) {
        free(s);
        return NULL;
    }
    return s;
}

/* The sample's API: errors, independence from the moments, merge, the version-3 state. */
static void test_validation_sample(wush_context* ctx, const float* cal, const float* val) {
    wush_calibrator *c = NULL, *a = NULL, *b = NULL, *back = NULL, *old = NULL;
    double m_with[32 * 32], m_without[32 * 32];
    double *state, *again, *old_state;
    size_t n = 0, n2 = 0, n_old = 0, count = 0;
    uint64_t tokens = 0;
    float bad[D_IN];

    CHECK_STATUS(wush_calibrator_create(D_IN, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &c), WUSH_OK);
    if (c == NULL) return;
    CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, val, 4),
                 WUSH_ERR_INVALID_ARGUMENT); /* no size */
    CHECK(strstr(wush_last_error(), "validation") != NULL);
    CHECK_STATUS(wush_calibrator_set_validation_size(c, 65537), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_set_validation_size(NULL, 4), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_set_validation_size(c, 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, val, 0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, NULL, 4), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add_validation(NULL, c, WUSH_DTYPE_F32, val, 4), WUSH_ERR_INVALID_ARGUMENT);
    memcpy(bad, val, sizeof bad);
    bad[7] = NAN;
    CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, bad, 1), WUSH_ERR_NON_FINITE);
    CHECK_STATUS(wush_calibrator_validation_count(c, &count), WUSH_OK);
    CHECK(count == 0);
    CHECK_STATUS(wush_calibrator_validation_count(c, NULL), WUSH_ERR_INVALID_ARGUMENT);

    /* Validation tokens never reach the moments or the token count. */
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_second_moment(c, 1, m_without, 32 * 32), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, val, N_VAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_validation_size(c, 50), WUSH_ERR_INVALID_ARGUMENT); /* tokens already in */
    CHECK_STATUS(wush_calibrator_validation_count(c, &count), WUSH_OK);
    CHECK(count == 100);
    CHECK_STATUS(wush_calibrator_token_count(c, &tokens), WUSH_OK);
    CHECK(tokens == N_CAL);
    CHECK_STATUS(wush_calibrator_second_moment(c, 1, m_with, 32 * 32), WUSH_OK);
    CHECK(memcmp(m_with, m_without, sizeof m_with) == 0);

    /* Shards merged give the state of one calibrator that saw every token. */
    CHECK_STATUS(wush_calibrator_create(D_IN, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &a), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &b), WUSH_OK);
    if (a == NULL || b == NULL) return;
    CHECK_STATUS(wush_calibrator_set_validation_size(a, 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_validation_size(b, 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, a, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_validation(ctx, a, WUSH_DTYPE_F32, val + 100 * D_IN, N_VAL - 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_validation(ctx, b, WUSH_DTYPE_F32, val, 100), WUSH_OK);
    CHECK_STATUS(wush_calibrator_merge(a, b), WUSH_OK);
    state = export_state(c, &n);
    again = export_state(a, &n2);
    CHECK(state != NULL && again != NULL && n == n2 && memcmp(state, again, n * sizeof(double)) == 0);
    free(again);

    /* Version 3: [1] = 3, the empty token sample's block [0, 0], then the validation block. */
    CHECK(n == 6 + 2 * 32 * 32 + 2 + (2 + 100 + 100 * (size_t)D_IN));
    if (state != NULL && n > 6 + 2 * 32 * 32 + 4) {
        CHECK(state[0] == 1.0 && state[1] == 3.0);
        CHECK(state[6 + 2 * 32 * 32] == 0.0 && state[7 + 2 * 32 * 32] == 0.0);
        CHECK(state[8 + 2 * 32 * 32] == 100.0 && state[9 + 2 * 32 * 32] == 100.0);
    }
    CHECK_STATUS(wush_calibrator_create(D_IN, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &back), WUSH_OK);
    if (back != NULL && state != NULL) {
        CHECK_STATUS(wush_calibrator_import_state(back, state, n), WUSH_ERR_INVALID_ARGUMENT); /* no validation size */
        CHECK_STATUS(wush_calibrator_set_validation_size(back, 100), WUSH_OK);
        CHECK_STATUS(wush_calibrator_import_state(back, state, n), WUSH_OK);
        again = export_state(back, &n2);
        CHECK(again != NULL && n2 == n && memcmp(state, again, n * sizeof(double)) == 0);
        free(again);
        /* A summed (r = 2) version-3 state is refused: samples do not add. */
        state[0] = 2.0;
        state[1] = 6.0;
        CHECK_STATUS(wush_calibrator_import_state(back, state, n), WUSH_ERR_INVALID_ARGUMENT);
        state[0] = 1.0;
        state[1] = 3.0;
        /* A validation count beyond its capacity is refused, the calibrator unchanged. */
        state[9 + 2 * 32 * 32] = 101.0;
        CHECK_STATUS(wush_calibrator_import_state(back, state, n), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_calibrator_validation_count(back, &count), WUSH_OK);
        CHECK(count == 100);
    }
    /* A version-1 state (a calibrator without samples) still imports, with an empty validation sample. */
    CHECK_STATUS(wush_calibrator_create(D_IN, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &old), WUSH_OK);
    if (old != NULL && back != NULL) {
        CHECK_STATUS(wush_calibrator_add(ctx, old, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
        old_state = export_state(old, &n_old);
        CHECK(old_state != NULL && n_old == 6 + 2 * 32 * 32 && old_state[1] == 1.0);
        if (old_state != NULL) CHECK_STATUS(wush_calibrator_import_state(back, old_state, n_old), WUSH_OK);
        CHECK_STATUS(wush_calibrator_validation_count(back, &count), WUSH_OK);
        CHECK(count == 0);
        CHECK_STATUS(wush_calibrator_token_count(back, &tokens), WUSH_OK);
        CHECK(tokens == N_CAL);
        free(old_state);
    }
    free(state);
    wush_calibrator_destroy(c);
    wush_calibrator_destroy(a);
    wush_calibrator_destroy(b);
    wush_calibrator_destroy(back);
    wush_calibrator_destroy(old);
}

/* The shrunk candidate: validation documents whose channels carry the calibration documents'
 * loud/quiet pattern plus as much isotropic energy as the calibration's mean channel (the
 * calibration moment shrunk halfway to isotropic, M + tr(M)/G I, in distribution). WUSH fitted to
 * the calibration moment over-amplifies the quiet channels there, the data-free layers ignore the
 * pattern, and the guard keeps WUSH_GUARD_SHRUNK: the very layer built with shrunk_options(). */
static void test_guard_shrunk(wush_context* ctx, wush_format f, wush_method m, const float* w, const float* cal,
                              const float* mixed) {
    static const wush_transform_kind kOthers[3] = {WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD,
                                                   WUSH_TRANSFORM_RANDOM};
    const wush_moment_mode mode = m == WUSH_METHOD_GPTQ ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL;
    wush_options *o = NULL, *shrunk;
    wush_calibrator *plain, *guarded;
    wush_guard_candidate kept = (wush_guard_candidate)-1;
    Built want, got, other;
    size_t g = 0;
    int i;
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    plain = make_calibrator(ctx, g, mode, cal, NULL);
    guarded = make_calibrator(ctx, g, mode, cal, mixed);
    shrunk = shrunk_options(o);
    if (o == NULL || plain == NULL || guarded == NULL || shrunk == NULL) return;
    want = build(ctx, plain, WUSH_TRANSFORM_WUSH, f, m, w, shrunk, mixed);
    /* The data must make the shrunk layer the best by a clear margin, or this tests nothing. */
    for (i = 0; i < 4; ++i) {
        other = i < 3 ? build(ctx, plain, kOthers[i], f, m, w, o, mixed)
                      : build(ctx, plain, WUSH_TRANSFORM_WUSH, f, m, w, NULL, mixed);
        CHECK(want.loss < 0.95 * other.loss);
        release(&other);
    }
    got = build(ctx, guarded, WUSH_TRANSFORM_WUSH, f, m, w, o, mixed);
    CHECK_STATUS(wush_transform_guard(got.t, NULL, NULL, &kept), WUSH_OK);
    CHECK(kept == WUSH_GUARD_SHRUNK);
    CHECK(got.t != NULL && want.t != NULL && same_matrices(got.t, want.t));
    CHECK(got.q != NULL && want.q != NULL && same_qweights(got.q, want.q));
    CHECK(got.loss == want.loss);
    release(&want);
    release(&got);
    wush_calibrator_destroy(plain);
    wush_calibrator_destroy(guarded);
    wush_options_destroy(shrunk);
    wush_options_destroy(o);
}

/* ---- The guard's rule, against a second implementation ------------------------------------- */

enum { N_CANDIDATES = 6 }; /* the searched layer, plain WUSH, I, H, R, shrunk WUSH */

/* Per-token losses of a layer on n tokens: wush_layer_loss on one token at a time. */
static void token_losses(wush_context* ctx, const Built* b, const float* w, const float* x, size_t n, double* out) {
    size_t t;
    for (t = 0; t < n; ++t) {
        out[t] = -1.0;
        CHECK_STATUS(wush_layer_loss(ctx, b->t, b->q, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, x + t * D_IN, 1, &out[t]),
                     WUSH_OK);
    }
}

static double mean_of(const double* v, size_t n) {
    double m = 0.0;
    size_t t;
    for (t = 0; t < n; ++t) m += v[t];
    return m / (double)n;
}

/* The rule as wush.h states it (WUSH_OPTION_SEARCH_GUARD): `alt` replaces `base` only when its
 * mean is lower by more than 1% and the paired differences' mean exceeds two standard errors. */
static int clearly_better(const double* alt, const double* base, size_t n) {
    double md = 0.0, var = 0.0;
    size_t t;
    if (!(mean_of(alt, n) < 0.99 * mean_of(base, n))) return 0;
    for (t = 0; t < n; ++t) md += base[t] - alt[t];
    md /= (double)n;
    for (t = 0; t < n; ++t) var += (base[t] - alt[t] - md) * (base[t] - alt[t] - md);
    var /= (double)(n - 1);
    return md > 2.0 * sqrt(var / (double)n);
}

/* The candidate the rule picks (0 = the searched layer); *naive gets the lowest mean's index. */
static int rule_choice(double* const losses[N_CANDIDATES], size_t n, int* naive) {
    int i, chosen = 0;
    *naive = 0;
    for (i = 1; i < N_CANDIDATES; ++i) {
        if (mean_of(losses[i], n) < mean_of(losses[*naive], n)) *naive = i;
        if (clearly_better(losses[i], losses[0], n) && mean_of(losses[i], n) < mean_of(losses[chosen], n)) chosen = i;
    }
    return chosen;
}

/* The six candidates built separately, without any guard, on a calibrator without validation
 * tokens; `searched` options have the search on and the default guard off. */
static void build_candidates(wush_context* ctx, wush_calibrator* c, wush_format f, wush_method m, const float* w,
                             const wush_options* searched, Built out[N_CANDIDATES]) {
    static const wush_transform_kind kData[3] = {WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD,
                                                 WUSH_TRANSFORM_RANDOM};
    int i;
    out[0] = build(ctx, c, WUSH_TRANSFORM_WUSH, f, m, w, searched, NULL);
    wush_options* shrunk = shrunk_options(searched);
    out[1] = build(ctx, c, WUSH_TRANSFORM_WUSH, f, m, w, NULL, NULL);
    for (i = 0; i < 3; ++i) out[i + 2] = build(ctx, c, kData[i], f, m, w, searched, NULL);
    out[5] = build(ctx, c, WUSH_TRANSFORM_WUSH, f, m, w, shrunk, NULL);
    wush_options_destroy(shrunk);
}

/* The guard's report on a guarded layer (wush_transform_guard*) against the oracle: each
 * candidate's loss is wush_layer_loss of the separately built candidate on the same held-out
 * tokens; the paired difference and its standard error are recomputed from per-token losses
 * (wush_layer_loss one token at a time); `replaces` and `kept` follow the rule written again here. */
static void check_report(wush_context* ctx, const Built cand[N_CANDIDATES], const Built* got, const float* w,
                         const float* held, size_t n, double* const losses[N_CANDIDATES], int chosen,
                         wush_guard_source want_source) {
    wush_guard_source source = WUSH_GUARD_NONE;
    wush_guard_candidate kept = (wush_guard_candidate)-1;
    size_t n_tokens = 0, t;
    int i;
    CHECK_STATUS(wush_transform_guard(got->t, &source, &n_tokens, &kept), WUSH_OK);
    CHECK(source == want_source);
    CHECK(n_tokens == n);
    CHECK((int)kept == chosen);
    for (i = 0; i < N_CANDIDATES; ++i) {
        double loss = -1.0, diff = -1.0, se = -1.0, want_loss = -2.0, md = 0.0, var = 0.0, scale;
        int replaces = -1;
        CHECK_STATUS(wush_transform_guard_candidate(got->t, (wush_guard_candidate)i, &loss, &diff, &se, &replaces),
                     WUSH_OK);
        CHECK_STATUS(wush_layer_loss(ctx, cand[i].t, cand[i].q, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, held, n, &want_loss),
                     WUSH_OK);
        CHECK(close_to(loss, want_loss, 1e-12 * want_loss));
        for (t = 0; t < n; ++t) md += losses[0][t] - losses[i][t];
        md /= (double)n;
        for (t = 0; t < n; ++t) var += (losses[0][t] - losses[i][t] - md) * (losses[0][t] - losses[i][t] - md);
        var /= (double)(n - 1);
        scale = mean_of(losses[0], n) + mean_of(losses[i], n);
        CHECK(close_to(diff, md, 1e-9 * scale));
        CHECK(close_to(se, sqrt(var / (double)n), 1e-9 * scale));
        CHECK(replaces == (i == 0 ? 0 : clearly_better(losses[i], losses[0], n)));
    }
    { /* undecided: some candidate below 0.99 x the kept one's loss that the rule did not take */
        int undecided = -1, want = 0, want_which = 0;
        wush_guard_candidate which = (wush_guard_candidate)-1;
        size_t n_seq = 99;
        for (i = 0; i < N_CANDIDATES; ++i) {
            if (i == chosen || !(mean_of(losses[i], n) < 0.99 * mean_of(losses[chosen], n))) continue;
            if (!want || mean_of(losses[i], n) < mean_of(losses[want_which], n)) want_which = i;
            want = 1;
        }
        CHECK_STATUS(wush_transform_guard_undecided(got->t, &undecided, &which, &n_seq), WUSH_OK);
        CHECK(undecided == want && (int)which == want_which);
        CHECK(want_source == WUSH_GUARD_HOLD_OUT_SEQUENCES ? n_seq > 0 : n_seq == 0);
    }
}

/* Checks a guarded layer against the rule on `n` held-out tokens, and its report
 * (check_report); returns whether the naive lowest-mean choice would have differed from the
 * rule's. */
static int check_rule(wush_context* ctx, const Built cand[N_CANDIDATES], const Built* got, const float* w,
                      const float* held, size_t n, wush_guard_source source) {
    double* losses[N_CANDIDATES];
    int i, naive = 0, chosen;
    for (i = 0; i < N_CANDIDATES; ++i) {
        losses[i] = malloc(n * sizeof(double));
        if (losses[i] != NULL) token_losses(ctx, &cand[i], w, held, n, losses[i]);
    }
    for (i = 0; i < N_CANDIDATES; ++i)
        if (losses[i] == NULL) return 0;
    chosen = rule_choice(losses, n, &naive);
    CHECK(got->t != NULL && cand[chosen].t != NULL && same_matrices(got->t, cand[chosen].t));
    CHECK(kind_of(got->t) == kind_of(cand[chosen].t));
    CHECK(got->q != NULL && cand[chosen].q != NULL && same_qweights(got->q, cand[chosen].q));
    if (got->t != NULL) check_report(ctx, cand, got, w, held, n, losses, chosen, source);
    for (i = 0; i < N_CANDIDATES; ++i) free(losses[i]);
    return naive != chosen;
}

/* No guard: the report says so, and the candidate query fails with a reason. */
static void check_no_report(const wush_transform* t) {
    wush_guard_source source = WUSH_GUARD_VALIDATION;
    wush_guard_candidate kept = WUSH_GUARD_RANDOM;
    size_t n = 7;
    double loss = 0.0;
    CHECK_STATUS(wush_transform_guard(t, &source, &n, &kept), WUSH_OK);
    CHECK(source == WUSH_GUARD_NONE && n == 0 && kept == WUSH_GUARD_SEARCHED);
    CHECK_STATUS(wush_transform_guard_candidate(t, WUSH_GUARD_PLAIN, &loss, NULL, NULL, NULL),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "no per-layer guard") != NULL);
}

/* Validation tokens, few and from the calibration documents' distribution: over many small
 * slices the guarded layer is always the rule's choice, and on some slice the lowest mean alone
 * (the old rule) would have switched on noise where the rule keeps the searched layer. */
static void test_guard_small_slices(wush_context* ctx, wush_format f, wush_method m, const float* w, const float* cal,
                                    const float* same) {
    enum { N_SMALL = 40, SLICES = 6 };
    const wush_moment_mode mode = m == WUSH_METHOD_GPTQ ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL;
    wush_options* o = NULL;
    wush_calibrator* plain;
    Built cand[N_CANDIDATES];
    size_t g = 0;
    int i, s, noisy = 0;
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_GUARD, 0), WUSH_OK);
    plain = make_calibrator(ctx, g, mode, cal, NULL);
    if (o == NULL || plain == NULL) return;
    build_candidates(ctx, plain, f, m, w, o, cand);
    for (s = 0; s < SLICES; ++s) {
        const float* slice = same + (size_t)s * N_SMALL * D_IN;
        wush_calibrator* c = NULL;
        Built got;
        CHECK_STATUS(wush_calibrator_create(D_IN, g, mode, &c), WUSH_OK);
        if (c == NULL) continue;
        CHECK_STATUS(wush_calibrator_set_sample_size(c, 256), WUSH_OK);
        CHECK_STATUS(wush_calibrator_set_validation_size(c, N_SMALL), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
        CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, slice, N_SMALL), WUSH_OK);
        got = build(ctx, c, WUSH_TRANSFORM_WUSH, f, m, w, o, NULL);
        noisy += check_rule(ctx, cand, &got, w, slice, N_SMALL, WUSH_GUARD_VALIDATION);
        release(&got);
        wush_calibrator_destroy(c);
    }
    /* Not a check of the library: a sign that these slices exercise the noise margin at all. */
    printf("guard on small slices (%s, %s): the lowest mean alone would differ on %d of %d\n", wush_format_name(f),
           m == WUSH_METHOD_GPTQ ? "gptq" : "rtn", noisy, SLICES);
    for (i = 0; i < N_CANDIDATES; ++i) release(&cand[i]);
    wush_calibrator_destroy(plain);
    wush_options_destroy(o);
}

/* The default guard, without validation tokens: the held-out tokens are the odd rows of the
 * calibrator's token sample (read from its exported state, layout version 2 in wush.h), the
 * search scores the even ones, and the result is the rule's choice among the six candidates. */
static void test_default_guard(wush_context* ctx, wush_format f, wush_method m, const float* w, const float* cal) {
    const wush_moment_mode mode = m == WUSH_METHOD_GPTQ ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL;
    wush_options *o = NULL, *off = NULL;
    wush_calibrator* c;
    Built cand[N_CANDIDATES], got;
    size_t g = 0, n_state = 0, sums, base, k, rows, t, j, want = 0;
    double* state;
    float* held;
    int i;
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    CHECK_STATUS(wush_options_sample_size(o, &want), WUSH_OK);
    CHECK(want == 256); /* the search's 128 tokens and as many held out */
    CHECK_STATUS(wush_options_create(&off), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(off, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(off, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(off, WUSH_OPTION_SEARCH_GUARD, 0), WUSH_OK);
    c = make_calibrator(ctx, g, mode, cal, NULL); /* sample 256 */
    if (o == NULL || off == NULL || c == NULL) return;
    /* With 256 sample tokens and 128 search tokens the unguarded search already scores the even
     * rows (evenly spread), so `cand[0]` is the searched layer the guard sees. */
    build_candidates(ctx, c, f, m, w, off, cand);
    got = build(ctx, c, WUSH_TRANSFORM_WUSH, f, m, w, o, NULL);

    CHECK_STATUS(wush_calibrator_state_size(c, &n_state), WUSH_OK);
    state = malloc(n_state * sizeof(double));
    held = malloc(128 * D_IN * sizeof(float));
    if (state != NULL && held != NULL && wush_calibrator_export_state(c, state, n_state) == WUSH_OK) {
        sums = mode == WUSH_MOMENTS_FULL ? (size_t)D_IN * D_IN : (size_t)D_IN * g;
        base = 6 + sums;
        k = (size_t)state[base];
        rows = (size_t)state[base + 1];
        CHECK(k == 256 && rows == 256);
        for (t = 0; t < 128; ++t)
            for (j = 0; j < D_IN; ++j) held[t * D_IN + j] = (float)state[base + 2 + k + (2 * t + 1) * D_IN + j];
        check_rule(ctx, cand, &got, w, held, 128, WUSH_GUARD_HOLD_OUT);
    }
    free(state);
    free(held);
    /* Off: the same build as the unguarded search. */
    release(&got);
    got = build(ctx, c, WUSH_TRANSFORM_WUSH, f, m, w, off, NULL);
    CHECK(got.t != NULL && same_matrices(got.t, cand[0].t));
    if (got.t != NULL) check_no_report(got.t);
    if (cand[1].t != NULL) check_no_report(cand[1].t); /* plain WUSH: never guarded */
    {
        wush_guard_source source;
        double loss;
        CHECK_STATUS(wush_transform_guard(NULL, &source, NULL, NULL), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_guard_candidate(got.t, (wush_guard_candidate)6, &loss, NULL, NULL, NULL),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "unknown wush_guard_candidate 6") != NULL);
        CHECK_STATUS(wush_transform_guard_candidate(got.t, (wush_guard_candidate)-1, &loss, NULL, NULL, NULL),
                     WUSH_ERR_INVALID_ARGUMENT);
        CHECK(strstr(wush_last_error(), "unknown wush_guard_candidate -1") != NULL);
    }
    release(&got);
    for (i = 0; i < N_CANDIDATES; ++i) release(&cand[i]);
    wush_calibrator_destroy(c);
    wush_options_destroy(o);
    wush_options_destroy(off);
}

/* The sequence hold-out (wush_calibrator_add_sequences): the calibration tokens as 16 sequences
 * of 32. The report says WUSH_GUARD_HOLD_OUT_SEQUENCES; the held-out tokens are the sampled
 * tokens of whole sequences (their count is a sum of whole sequences' sampled counts, found
 * here from the exported sample by matching rows to the data), about half the sample; the same
 * layer comes from the sequences added in reverse order over two merged calibrators and from an
 * imported state; one sequence alone, or plain wush_calibrator_add, holds out tokens. */
static void test_sequence_guard(wush_context* ctx, wush_format f, const float* w, const float* cal) {
    enum { SEQ = 32, N_SEQ = N_CAL / SEQ };
    wush_options* o = NULL;
    wush_calibrator *c = NULL, *a = NULL, *b = NULL, *imported = NULL, *one = NULL;
    size_t g = 0, n_held = 0, n_seq = 0, n_state = 0, k, t, j, s, counts[N_SEQ] = {0};
    wush_guard_source source = WUSH_GUARD_NONE;
    wush_guard_candidate kept;
    Built got, again, from_state, single;
    double* state = NULL;
    int sub, found = 0;
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &c), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &a), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &b), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &imported), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &one), WUSH_OK);
    if (o == NULL || c == NULL || a == NULL || b == NULL || imported == NULL || one == NULL) return;
    CHECK_STATUS(wush_calibrator_set_sample_size(c, 256), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_sample_size(a, 256), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_sample_size(b, 256), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_sample_size(imported, 256), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_sample_size(one, 256), WUSH_OK);
    /* Errors: no length, a length that does not divide the tokens (the calibrator unchanged). */
    CHECK_STATUS(wush_calibrator_add_sequences(ctx, c, WUSH_DTYPE_F32, cal, N_CAL, 0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add_sequences(ctx, c, WUSH_DTYPE_F32, cal, N_CAL - 1, SEQ), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "does not divide") != NULL);
    CHECK_STATUS(wush_calibrator_add_sequences(ctx, NULL, WUSH_DTYPE_F32, cal, N_CAL, SEQ), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add_sequences(ctx, c, WUSH_DTYPE_F32, cal, N_CAL, SEQ), WUSH_OK);
    for (s = N_SEQ; s-- > 0;)
        CHECK_STATUS(wush_calibrator_add_sequences(ctx, s % 2 ? a : b, WUSH_DTYPE_F32, cal + s * SEQ * D_IN, SEQ, SEQ),
                     WUSH_OK);
    CHECK_STATUS(wush_calibrator_merge(a, b), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_sequences(ctx, one, WUSH_DTYPE_F32, cal, N_CAL, N_CAL), WUSH_OK);
    got = build(ctx, c, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, o, NULL);
    again = build(ctx, a, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, o, NULL);
    single = build(ctx, one, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, o, NULL);
    CHECK_STATUS(wush_transform_guard(got.t, &source, &n_held, &kept), WUSH_OK);
    CHECK(source == WUSH_GUARD_HOLD_OUT_SEQUENCES);
    CHECK_STATUS(wush_transform_guard_undecided(got.t, NULL, NULL, &n_seq), WUSH_OK);
    CHECK(n_seq >= 1 && n_seq < N_SEQ);
    /* Which sequence each sampled token is (the sample's rows in the exported state, version 2). */
    CHECK_STATUS(wush_calibrator_state_size(c, &n_state), WUSH_OK);
    state = malloc(n_state * sizeof(double));
    if (state != NULL && wush_calibrator_export_state(c, state, n_state) == WUSH_OK) {
        const size_t base = 6 + (size_t)D_IN * g;
        k = (size_t)state[base];
        CHECK(k == 256 && (size_t)state[base + 1] == 256);
        for (t = 0; t < k; ++t)
            for (s = 0; s < (size_t)N_CAL; ++s) {
                for (j = 0; j < D_IN && (float)state[base + 2 + k + t * D_IN + j] == cal[s * D_IN + j]; ++j) {
                }
                if (j == D_IN) {
                    ++counts[s / SEQ];
                    break;
                }
            }
        /* n_held is the sampled count of some n_seq whole sequences (a subset sum over 16). */
        for (sub = 0; sub < (1 << N_SEQ) && !found; ++sub) {
            size_t sum = 0, bits = 0;
            for (s = 0; s < N_SEQ; ++s)
                if (sub >> s & 1) sum += counts[s], ++bits;
            found = sum == n_held && bits == n_seq;
        }
        CHECK(found);
        CHECK(n_held >= 96 && n_held <= 160); /* about half of 256: balanced within a sequence or so */
        CHECK_STATUS(wush_calibrator_import_state(imported, state, n_state), WUSH_OK);
        from_state = build(ctx, imported, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, o, NULL);
        CHECK(from_state.t != NULL && got.t != NULL && same_matrices(from_state.t, got.t));
        CHECK_STATUS(wush_transform_guard(from_state.t, &source, NULL, NULL), WUSH_OK);
        CHECK(source == WUSH_GUARD_HOLD_OUT_SEQUENCES);
        release(&from_state);
    }
    free(state);
    CHECK(again.t != NULL && got.t != NULL && same_matrices(again.t, got.t) && same_qweights(again.q, got.q));
    CHECK_STATUS(wush_transform_guard(single.t, &source, NULL, NULL), WUSH_OK);
    CHECK(source == WUSH_GUARD_HOLD_OUT);
    release(&got);
    release(&again);
    release(&single);
    wush_calibrator_destroy(c);
    wush_calibrator_destroy(a);
    wush_calibrator_destroy(b);
    wush_calibrator_destroy(imported);
    wush_calibrator_destroy(one);
    wush_options_destroy(o);
}

/* The document hold-out (wush_calibrator_add_document): 4 documents of 1, 2, 4 and 9 windows of
 * 32 tokens, each window added in its own call with its document's id (among them 0 and
 * UINT64_MAX, the ends of the id range), each document loud on its
 * own quarter of the channels. The sample holds every token, so the held-out count names the
 * held-out documents (the sizes' subset sums are distinct). The report says
 * WUSH_GUARD_HOLD_OUT_DOCUMENTS with whole documents held out (not windows); the plain and
 * identity candidates' losses equal, to rounding, wush_layer_loss on the held-out documents'
 * tokens of plain WUSH built from a calibrator that saw only the other documents (the cross-fit)
 * and of the identity layer; the same tokens added as windows (sequences) say
 * WUSH_GUARD_HOLD_OUT_SEQUENCES, where the plain candidate was fit on every token. */
static void test_document_guard(wush_context* ctx, wush_format f, const float* w) {
    enum { WIN = 32, N_DOC = 4 };
    static const size_t kWindows[N_DOC] = {1, 2, 4, 9}; /* 16 windows: N_CAL tokens */
    /* The ends of the documented range, every uint64_t (UINT64_MAX is what C makes of -1), are
     * ids of their own documents like any other. */
    static const uint64_t kIds[N_DOC] = {0, UINT64_MAX, 1002, UINT64_MAX - 1};
    float* x = malloc(sizeof(float) * N_CAL * D_IN);
    float* held = malloc(sizeof(float) * N_CAL * D_IN);
    float* rest = malloc(sizeof(float) * N_CAL * D_IN);
    size_t start[N_DOC], g = 0, n_held = 0, n_doc = 0, t, j, d, win, n_h = 0, n_r = 0;
    wush_options *o = NULL, *plain = NULL;
    wush_calibrator *c = NULL, *windows = NULL, *fit = NULL;
    wush_guard_source source = WUSH_GUARD_NONE;
    int sub, found = -1;
    Built got, by_window, oracle, ident;
    double want = -1.0, reported = -1.0;
    if (x == NULL || held == NULL || rest == NULL) return;
    rng_seed(21);
    for (d = 0, t = 0; d < N_DOC; ++d) {
        start[d] = t;
        for (; t < start[d] + kWindows[d] * WIN; ++t)
            for (j = 0; j < D_IN; ++j) x[t * D_IN + j] = (float)(rng_gauss() * (j % 4 == d ? 4.0 : 0.05));
    }
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    plain = without_search(o);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &c), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &windows), WUSH_OK);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &fit), WUSH_OK);
    if (o == NULL || plain == NULL || c == NULL || windows == NULL || fit == NULL) return;
    CHECK_STATUS(wush_calibrator_set_sample_size(c, N_CAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_sample_size(windows, N_CAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_document(NULL, c, WUSH_DTYPE_F32, x, WIN, 0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_calibrator_add_document(ctx, c, WUSH_DTYPE_F32, NULL, WIN, 0), WUSH_ERR_INVALID_ARGUMENT);
    for (d = 0; d < N_DOC; ++d)
        for (win = 0; win < kWindows[d]; ++win) {
            const float* at = x + (start[d] + win * WIN) * D_IN;
            CHECK_STATUS(wush_calibrator_add_document(ctx, c, WUSH_DTYPE_F32, at, WIN, kIds[d]), WUSH_OK);
            CHECK_STATUS(wush_calibrator_add_sequences(ctx, windows, WUSH_DTYPE_F32, at, WIN, WIN), WUSH_OK);
        }
    got = build(ctx, c, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, o, NULL);
    by_window = build(ctx, windows, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, o, NULL);
    CHECK_STATUS(wush_transform_guard(by_window.t, &source, NULL, NULL), WUSH_OK);
    CHECK(source == WUSH_GUARD_HOLD_OUT_SEQUENCES);
    CHECK_STATUS(wush_transform_guard(got.t, &source, &n_held, NULL), WUSH_OK);
    CHECK(source == WUSH_GUARD_HOLD_OUT_DOCUMENTS);
    CHECK_STATUS(wush_transform_guard_undecided(got.t, NULL, NULL, &n_doc), WUSH_OK);
    /* The held-out documents: the one subset of whole documents with n_held tokens. */
    for (sub = 1; sub < (1 << N_DOC) - 1; ++sub) {
        size_t sum = 0, bits = 0;
        for (d = 0; d < N_DOC; ++d)
            if (sub >> d & 1) sum += kWindows[d] * WIN, ++bits;
        if (sum == n_held && bits == n_doc) found = sub;
    }
    CHECK(found > 0);
    if (found > 0) {
        for (d = 0; d < N_DOC; ++d) {
            const int is_held = found >> d & 1;
            for (t = start[d]; t < start[d] + kWindows[d] * WIN; ++t)
                memcpy(is_held ? held + n_h++ * D_IN : rest + n_r++ * D_IN, x + t * D_IN, sizeof(float) * D_IN);
        }
        CHECK_STATUS(wush_calibrator_add(ctx, fit, WUSH_DTYPE_F32, rest, n_r), WUSH_OK);
        oracle = build(ctx, fit, WUSH_TRANSFORM_WUSH, f, WUSH_METHOD_RTN, w, plain, NULL);
        ident = build(ctx, fit, WUSH_TRANSFORM_IDENTITY, f, WUSH_METHOD_RTN, w, plain, NULL);
        CHECK_STATUS(wush_layer_loss(ctx, oracle.t, oracle.q, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, held, n_h, &want),
                     WUSH_OK);
        CHECK_STATUS(wush_transform_guard_candidate(got.t, WUSH_GUARD_PLAIN, &reported, NULL, NULL, NULL), WUSH_OK);
        CHECK(close_to(reported, want, 1e-6 * want));
        CHECK_STATUS(wush_layer_loss(ctx, ident.t, ident.q, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, held, n_h, &want),
                     WUSH_OK);
        CHECK_STATUS(wush_transform_guard_candidate(got.t, WUSH_GUARD_IDENTITY, &reported, NULL, NULL, NULL), WUSH_OK);
        CHECK(close_to(reported, want, 1e-6 * want));
        release(&oracle);
        release(&ident);
    }
    release(&got);
    release(&by_window);
    wush_calibrator_destroy(c);
    wush_calibrator_destroy(windows);
    wush_calibrator_destroy(fit);
    wush_options_destroy(o);
    wush_options_destroy(plain);
    free(x);
    free(held);
    free(rest);
}

/* The rows `rows` (n of them) of a qweight's codes and scales equal `sub`'s, byte for byte. */
static int same_rows(const wush_qweight* whole, const wush_qweight* sub, const size_t* rows, size_t n) {
    const unsigned char *cw = NULL, *sw = NULL, *cs = NULL, *ss = NULL;
    size_t ncw = 0, nsw = 0, ncs = 0, nss = 0, d_out = 0, i;
    if (wush_qweight_data(whole, (const void**)&cw, &ncw, (const void**)&sw, &nsw) != WUSH_OK ||
        wush_qweight_data(sub, (const void**)&cs, &ncs, (const void**)&ss, &nss) != WUSH_OK ||
        wush_qweight_info(whole, NULL, NULL, &d_out, NULL) != WUSH_OK || d_out == 0 || ncs != n * (ncw / d_out) ||
        nss != n * (nsw / d_out))
        return 0;
    for (i = 0; i < n; ++i)
        if (memcmp(cw + rows[i] * (ncw / d_out), cs + i * (ncw / d_out), ncw / d_out) != 0 ||
            memcmp(sw + rows[i] * (nsw / d_out), ss + i * (nsw / d_out), nsw / d_out) != 0)
            return 0;
    return 1;
}

/* A wide layer (d_out >= 2048): the guard scores a fixed subset of output rows, rows
 * i * k + i % k for i < d_out / k with k = d_out / 512 (wush.h, WUSH_OPTION_SEARCH_GUARD),
 * written again here. Validation tokens from shifted documents make a data-free candidate win,
 * so the rebuild of a kept alternative on every row is checked too.
 * RTN: each reported loss is wush_layer_loss of the separately built candidate's transform on
 * those rows' weights (RTN quantizes rows alone: wush_qweight_create on the rows gives the rows
 * of the whole layer), and differs from the whole layer's loss.
 * GPTQ: the guard builds the data-free candidates on the scored rows alone; that the rows of a
 * data-free GPTQ layer are the same bytes when built alone is checked here, and their reported
 * losses against wush_layer_loss of those row builds. The kept layer comes back whole. */
static void test_guard_wide_layer(wush_context* ctx, wush_format f, wush_method m, const float* cal,
                                  const float* shifted) {
    enum { WIDE = 2100 };
    static const wush_transform_kind kKinds[N_CANDIDATES] = {WUSH_TRANSFORM_WUSH,     WUSH_TRANSFORM_WUSH,
                                                             WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD,
                                                             WUSH_TRANSFORM_RANDOM,   WUSH_TRANSFORM_WUSH};
    const wush_moment_mode mode = m == WUSH_METHOD_GPTQ ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL;
    const size_t k = WIDE / 512, n_rows = WIDE / k;
    float* w = malloc(sizeof(float) * WIDE * D_IN);
    float* rows = malloc(sizeof(float) * n_rows * D_IN);
    size_t* index = malloc(sizeof(size_t) * n_rows);
    wush_options *o = NULL, *plain = NULL, *shrunk = NULL;
    wush_calibrator* c = NULL;
    wush_transform* got_t = NULL;
    wush_qweight* got_q = NULL;
    wush_guard_candidate kept = (wush_guard_candidate)-1;
    size_t g = 0, i, j, d_out = 0;
    int cand_i, differs = 0, checked = 0;
    if (w == NULL || rows == NULL || index == NULL) return;
    rng_seed(21);
    for (i = 0; i < (size_t)WIDE * D_IN; ++i) w[i] = (float)(rng_gauss() * 0.1);
    for (i = 0; i < n_rows; ++i) {
        index[i] = i * k + i % k;
        for (j = 0; j < D_IN; ++j) rows[i * D_IN + j] = w[index[i] * D_IN + j];
    }
    wush_format_group_size(f, &g);
    CHECK_STATUS(wush_options_create(&o), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH, 1), WUSH_OK);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_TOKENS, 128), WUSH_OK);
    plain = without_search(o);
    shrunk = shrunk_options(o);
    CHECK_STATUS(wush_calibrator_create(D_IN, g, mode, &c), WUSH_OK);
    if (o == NULL || plain == NULL || shrunk == NULL || c == NULL) return;
    CHECK_STATUS(wush_calibrator_set_sample_size(c, 256), WUSH_OK);
    CHECK_STATUS(wush_calibrator_set_validation_size(c, N_VAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add(ctx, c, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
    CHECK_STATUS(wush_calibrator_add_validation(ctx, c, WUSH_DTYPE_F32, shifted, N_VAL), WUSH_OK);
    CHECK_STATUS(
        wush_layer_quantize(ctx, c, WUSH_TRANSFORM_WUSH, f, m, WUSH_DTYPE_F32, w, WIDE, D_IN, o, &got_t, &got_q),
        WUSH_OK);
    if (got_t == NULL || got_q == NULL) return;
    CHECK_STATUS(wush_transform_guard(got_t, NULL, NULL, &kept), WUSH_OK);
    CHECK(kept >= WUSH_GUARD_IDENTITY && kept <= WUSH_GUARD_RANDOM); /* the shifted documents make WUSH lose */
    CHECK_STATUS(wush_qweight_info(got_q, NULL, NULL, &d_out, NULL), WUSH_OK);
    CHECK(d_out == WIDE);
    for (cand_i = 0; cand_i < N_CANDIDATES; ++cand_i) {
        const int data_free = cand_i >= WUSH_GUARD_IDENTITY && cand_i <= WUSH_GUARD_RANDOM;
        wush_transform *t = NULL, *t_rows = NULL;
        wush_qweight *q = NULL, *q_rows = NULL;
        double loss = -1.0, want = -2.0, whole = -3.0;
        CHECK_STATUS(wush_transform_guard_candidate(got_t, (wush_guard_candidate)cand_i, &loss, NULL, NULL, NULL),
                     WUSH_OK);
        if (cand_i == 0) { /* the searched layer as the guard saw it: the unguarded search on the same tokens */
            wush_calibrator* unguarded = NULL;
            CHECK_STATUS(wush_calibrator_create(D_IN, g, mode, &unguarded), WUSH_OK);
            if (unguarded == NULL) continue;
            CHECK_STATUS(wush_calibrator_set_sample_size(unguarded, 256), WUSH_OK);
            CHECK_STATUS(wush_calibrator_add(ctx, unguarded, WUSH_DTYPE_F32, cal, N_CAL), WUSH_OK);
            CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_GUARD, 0), WUSH_OK);
            CHECK_STATUS(wush_layer_quantize(ctx, unguarded, WUSH_TRANSFORM_WUSH, f, m, WUSH_DTYPE_F32, w, WIDE, D_IN,
                                             o, &t, &q),
                         WUSH_OK);
            CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_SEARCH_GUARD, 1), WUSH_OK);
            wush_calibrator_destroy(unguarded);
        } else {
            CHECK_STATUS(wush_layer_quantize(ctx, c, kKinds[cand_i], f, m, WUSH_DTYPE_F32, w, WIDE, D_IN,
                                             cand_i == WUSH_GUARD_SHRUNK ? shrunk : plain, &t, &q),
                         WUSH_OK);
        }
        if (t != NULL && m == WUSH_METHOD_RTN)
            CHECK_STATUS(
                wush_qweight_create(ctx, t, f, WUSH_METHOD_RTN, WUSH_DTYPE_F32, rows, n_rows, D_IN, NULL, &q_rows),
                WUSH_OK);
        if (t != NULL && m == WUSH_METHOD_GPTQ && data_free) {
            CHECK_STATUS(wush_layer_quantize(ctx, c, kKinds[cand_i], f, m, WUSH_DTYPE_F32, rows, n_rows, D_IN, plain,
                                             &t_rows, &q_rows),
                         WUSH_OK);
            CHECK(q != NULL && q_rows != NULL && same_rows(q, q_rows, index, n_rows));
        }
        if (q_rows != NULL) {
            CHECK_STATUS(wush_layer_loss(ctx, t, q_rows, WUSH_DTYPE_F32, rows, WUSH_DTYPE_F32, shifted, N_VAL, &want),
                         WUSH_OK);
            CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, shifted, N_VAL, &whole),
                         WUSH_OK);
            CHECK(close_to(loss, want, 1e-12 * want));
            differs += !close_to(whole, want, 1e-6 * want); /* the subset is not the whole layer */
            ++checked;
        }
        if (cand_i == (int)kept) { /* the returned layer is this candidate's, on every row */
            CHECK(t != NULL && same_matrices(got_t, t));
            CHECK(q != NULL && same_qweights(got_q, q));
        }
        wush_qweight_destroy(q_rows);
        wush_transform_destroy(t_rows);
        wush_qweight_destroy(q);
        wush_transform_destroy(t);
    }
    CHECK(checked == (m == WUSH_METHOD_RTN ? N_CANDIDATES : 3));
    CHECK(differs == checked);
    wush_transform_destroy(got_t);
    wush_qweight_destroy(got_q);
    wush_calibrator_destroy(c);
    wush_options_destroy(o);
    wush_options_destroy(plain);
    wush_options_destroy(shrunk);
    free(w);
    free(rows);
    free(index);
}

int main(void) {
    wush_context* ctx = NULL;
    float* w = malloc(sizeof(float) * D_OUT * D_IN);
    float* cal = malloc(sizeof(float) * N_CAL * D_IN);
    float* shifted = malloc(sizeof(float) * N_VAL * D_IN);
    float* same = malloc(sizeof(float) * N_VAL * D_IN);
    float* mixed = malloc(sizeof(float) * N_VAL * D_IN);
    size_t i;
    if (!w || !cal || !shifted || !same || !mixed) return 1;
    rng_seed(7);
    for (i = 0; i < (size_t)D_OUT * D_IN; ++i) w[i] = (float)(rng_gauss() * 0.1);
    make_tokens(cal, N_CAL, 4.0, 0.05, 11);
    make_tokens(shifted, N_VAL, 0.05, 4.0, 12);
    make_tokens(same, N_VAL, 4.0, 0.05, 13);
    make_tokens(mixed, N_VAL, sqrt(16.0 + 4.0), sqrt(0.0025 + 4.0), 14); /* + N(0, 2^2): 2^2 = tr(M)/G */

    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    if (ctx != NULL) {
        test_validation_sample(ctx, cal, shifted);
        test_guard(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, w, cal, shifted, same);
        test_guard(ctx, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, w, cal, shifted, same);
        test_guard(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, w, cal, shifted, same);
        test_guard(ctx, WUSH_FORMAT_INT4, WUSH_METHOD_GPTQ, w, cal, shifted, same);
        test_guard_shrunk(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, w, cal, mixed);
        test_guard_shrunk(ctx, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, w, cal, mixed);
        test_guard_shrunk(ctx, WUSH_FORMAT_INT4, WUSH_METHOD_RTN, w, cal, mixed);
        test_guard_shrunk(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, w, cal, mixed);
        test_guard_small_slices(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, w, cal, same);
        test_guard_small_slices(ctx, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, w, cal, same);
        test_default_guard(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, w, cal);
        test_sequence_guard(ctx, WUSH_FORMAT_MXFP4, w, cal);
        test_sequence_guard(ctx, WUSH_FORMAT_NVFP4, w, cal);
        test_document_guard(ctx, WUSH_FORMAT_MXFP4, w);
        test_document_guard(ctx, WUSH_FORMAT_NVFP4, w);
        test_default_guard(ctx, WUSH_FORMAT_NVFP4, WUSH_METHOD_GPTQ, w, cal);
        test_guard_wide_layer(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, cal, shifted);
        test_guard_wide_layer(ctx, WUSH_FORMAT_NVFP4, WUSH_METHOD_RTN, cal, shifted);
        test_guard_wide_layer(ctx, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, cal, shifted);
        test_guard_wide_layer(ctx, WUSH_FORMAT_NVFP4, WUSH_METHOD_GPTQ, cal, shifted);
    }
    wush_context_destroy(ctx);
    free(w);
    free(cal);
    free(shifted);
    free(same);
    free(mixed);
    printf("capi_validation: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
