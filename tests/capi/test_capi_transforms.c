/* Transforms (names, kinds, the WUSH equalization theorem through the API) and progress callbacks.
 *
 * Plain C99 against the shared library. Oracles are independent of the code under test: float64
 * loops written here (core_common.h), theorems, or a second path through the API. */
#define _POSIX_C_SOURCE 200809L
#include "core_common.h"

/* ------------------------------------------------------------------------------------------------
 * Transforms
 * ----------------------------------------------------------------------------------------------*/

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

/* The tools' spelling: a kind name, "+s" for the search, refused on the data-free kinds. */
static void test_transform_spec_names(void) {
    static const struct {
        const char* name;
        wush_status status;
        wush_transform_kind kind;
        int search;
    } cases[] = {
        {"wush", WUSH_OK, WUSH_TRANSFORM_WUSH, 0},   {"wush+s", WUSH_OK, WUSH_TRANSFORM_WUSH, 1},
        {"WUS+s", WUSH_OK, WUSH_TRANSFORM_WUS, 1},   {"hadamard", WUSH_OK, WUSH_TRANSFORM_HADAMARD, 0},
        {"i", WUSH_OK, WUSH_TRANSFORM_IDENTITY, 0},  {"r", WUSH_OK, WUSH_TRANSFORM_RANDOM, 0},
        {"h+s", WUSH_ERR_INVALID_ARGUMENT, 0, 0},    {"identity+s", WUSH_ERR_INVALID_ARGUMENT, 0, 0},
        {"r+s", WUSH_ERR_INVALID_ARGUMENT, 0, 0},    {"+s", WUSH_ERR_INVALID_ARGUMENT, 0, 0},
        {"wush+", WUSH_ERR_INVALID_ARGUMENT, 0, 0},  {"wush+s+s", WUSH_ERR_INVALID_ARGUMENT, 0, 0},
        {"wush+S", WUSH_ERR_INVALID_ARGUMENT, 0, 0}, {"", WUSH_ERR_INVALID_ARGUMENT, 0, 0},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        wush_transform_kind kind = (wush_transform_kind)99;
        int search = 7;
        CHECK_STATUS(wush_transform_spec_from_name(cases[i].name, &kind, &search), cases[i].status);
        if (cases[i].status == WUSH_OK) {
            CHECK(kind == cases[i].kind && search == cases[i].search);
        } else {
            CHECK(kind == (wush_transform_kind)99 && search == 7); /* outputs untouched on refusal */
            CHECK(strstr(wush_last_error(), cases[i].name) != NULL);
        }
    }
    {
        wush_transform_kind kind;
        int search;
        CHECK_STATUS(wush_transform_spec_from_name(NULL, &kind, &search), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_spec_from_name("wush", NULL, &search), WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(wush_transform_spec_from_name("wush", &kind, NULL), WUSH_ERR_INVALID_ARGUMENT);
    }
}

/* Method names: the checkpoint's spelling, parsed case-insensitively, NULL outside the enum. */
static void test_method_names(void) {
    static const char* const names[] = {"rtn", "gptq"};
    const wush_method methods[] = {WUSH_METHOD_RTN, WUSH_METHOD_GPTQ};
    wush_method m = (wush_method)99;
    size_t k;
    for (k = 0; k < 2; ++k) {
        const char* name = wush_method_name(methods[k]);
        CHECK(name != NULL && strcmp(name, names[k]) == 0);
        CHECK_STATUS(wush_method_from_name(names[k], &m), WUSH_OK);
        CHECK(m == methods[k]);
    }
    CHECK_STATUS(wush_method_from_name("GPTQ", &m), WUSH_OK);
    CHECK(m == WUSH_METHOD_GPTQ);
    m = (wush_method)99;
    CHECK_STATUS(wush_method_from_name("awq", &m), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(m == (wush_method)99 && strstr(wush_last_error(), "awq") != NULL);
    CHECK_STATUS(wush_method_from_name(NULL, &m), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_method_from_name("rtn", NULL), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(wush_method_name((wush_method)2) == NULL);
    CHECK(wush_method_name((wush_method)-1) == NULL);
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
        CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, kKinds[k], NULL, &t[k]),
                     WUSH_OK);
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
        if (worst_diag > 1e-4 || worst_wdiag > 1e-4 || worst_off > 1e-4 || worst_s2 > 1e-9 ||
            getenv("WUSH_TEST_VERBOSE"))
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
    CHECK_STATUS(wush_transform_create_fixed((wush_transform_kind)5, d, g, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 48, 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 96, 24, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, 0, 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, 64, 0, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, 64, 32, NULL, NULL), WUSH_ERR_INVALID_ARGUMENT);
    /* Absurd sizes: d_in x G overflows size_t, or G is beyond the largest block size (these used
     * to wrap the allocation size and crash). A status, never a crash; nothing is written. */
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, (size_t)1 << 60, 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_RANDOM, (size_t)1 << 59, 32, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, (size_t)1 << 32, (size_t)1 << 32, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_create_fixed(WUSH_TRANSFORM_HADAMARD, 512, 512, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    {
        /* within size_t but far beyond memory: OUT_OF_MEMORY (or INVALID_ARGUMENT), not a crash */
        const wush_status st =
            wush_transform_create_fixed(WUSH_TRANSFORM_IDENTITY, (size_t)1 << 50, 32, NULL, &untouched);
        CHECK(st == WUSH_ERR_OUT_OF_MEMORY || st == WUSH_ERR_INVALID_ARGUMENT);
    }
    CHECK(untouched == (wush_transform*)0x1);

    /* build argument checks */
    CHECK_STATUS(
        wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d + 32, WUSH_TRANSFORM_WUSH, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d + 32, WUSH_TRANSFORM_HADAMARD, NULL,
                                      &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_build(ctx, cal, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_build(ctx, cal, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_WUS, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, (wush_transform_kind)5, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_build(ctx, cal, (wush_dtype)3, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, 0, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_build(NULL, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(
        wush_transform_build(ctx, NULL, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, NULL),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_transform*)0x1);
    {
        /* NaN in the weight -> NON_FINITE */
        const float saved = l->w[17 * d + 100];
        l->w[17 * d + 100] = NAN;
        CHECK_STATUS(
            wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
            WUSH_ERR_NON_FINITE);
        l->w[17 * d + 100] = saved;
        CHECK(untouched == (wush_transform*)0x1);
    }
    {
        /* a calibrator without tokens: WUS/WUSH rejected, data-free kinds fine */
        wush_calibrator* empty = NULL;
        wush_transform* h = NULL;
        CHECK_STATUS(wush_calibrator_create(d, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &empty), WUSH_OK);
        CHECK_STATUS(
            wush_transform_build(ctx, empty, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, NULL, &untouched),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK_STATUS(
            wush_transform_build(ctx, empty, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUS, NULL, &untouched),
            WUSH_ERR_INVALID_ARGUMENT);
        CHECK(untouched == (wush_transform*)0x1);
        CHECK_STATUS(
            wush_transform_build(ctx, empty, WUSH_DTYPE_F32, NULL, l->d_out, d, WUSH_TRANSFORM_HADAMARD, NULL, &h),
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
            CHECK_STATUS(wush_transform_build(ctx, zc, WUSH_DTYPE_F32, l->w, l->d_out, d, kKinds[k], NULL, &tz),
                         WUSH_OK);
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
    CHECK_STATUS(wush_transform_build(one, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &t),
                 WUSH_OK);
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
    CHECK_STATUS(wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_WUSH, o, &t),
                 WUSH_OK);
    CHECK(log.calls == 0);
    wush_transform_destroy(t);

    wush_context_destroy(one);
    wush_context_destroy(four);
    wush_options_destroy(o);
    wush_calibrator_destroy(cal);
}

int main(void) {
    test_transform_names();
    test_transform_spec_names();
    test_method_names();
    static const LayerTest tests[] = {test_transforms, test_progress, NULL};
    return run_layer_tests("capi_transforms", tests);
}
