/* Options: bounds, types and defaults; WUSH_OPTION_SEARCH: where it applies and what it produces.
 *
 * Plain C99 against the shared library. Oracles are independent of the code under test: float64
 * loops written here (core_common.h), theorems, or a second path through the API. */
#define _POSIX_C_SOURCE 200809L
#include "core_common.h"

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
    /* The Hessian's damping follows WUSH_OPTION_DAMPING until it is set, then stands apart. */
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_HESSIAN_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.25);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_HESSIAN_DAMPING, 0.5), WUSH_OK);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 0.125), WUSH_OK);
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_HESSIAN_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.5);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_HESSIAN_DAMPING, -1.0), WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "WUSH_OPTION_HESSIAN_DAMPING") != NULL);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_HESSIAN_DAMPING, NAN), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_set_int(o, WUSH_OPTION_HESSIAN_DAMPING, 1), WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_options_get_double(o, WUSH_OPTION_HESSIAN_DAMPING, &d), WUSH_OK);
    CHECK(d == 0.5);
    CHECK_STATUS(wush_options_set_double(o, WUSH_OPTION_DAMPING, 0.25), WUSH_OK);
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
    /* the search needs the format: wush_transform_build refuses it for WUSH; the data-free kinds
     * have nothing to search, so both entry points refuse a search of them instead of ignoring it */
    CHECK_STATUS(
        wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, WUSH_TRANSFORM_WUSH, o, &untouched),
        WUSH_ERR_INVALID_ARGUMENT);
    CHECK(untouched == (wush_transform*)0x1);
    {
        const wush_transform_kind data_free[] = {WUSH_TRANSFORM_IDENTITY, WUSH_TRANSFORM_HADAMARD,
                                                 WUSH_TRANSFORM_RANDOM};
        size_t k;
        for (k = 0; k < 3; ++k) {
            CHECK_STATUS(
                wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, data_free[k], o, &untouched),
                WUSH_ERR_INVALID_ARGUMENT);
            CHECK(strstr(wush_last_error(), "nothing to search") != NULL);
            CHECK_STATUS(wush_layer_quantize(ctx, cal, data_free[k], WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32,
                                             l->w, l->d_out, l->d_in, o, &untouched, &untouched_q),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK(strstr(wush_last_error(), "nothing to search") != NULL);
            CHECK_STATUS(wush_transform_create_fixed(data_free[k], l->d_in, TG, o, &untouched),
                         WUSH_ERR_INVALID_ARGUMENT);
            CHECK(untouched == (wush_transform*)0x1 && untouched_q == (wush_qweight*)0x1);
            /* without the search the same calls succeed */
            CHECK_STATUS(
                wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, data_free[k], NULL, &t),
                WUSH_OK);
            wush_transform_destroy(t);
            t = NULL;
        }
    }
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
        CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss_s),
                     WUSH_OK);
        CHECK_STATUS(
            wush_layer_loss(ctx, plain_t, plain_q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss_p),
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
        CHECK_STATUS(wush_layer_quantize(ctx, sc, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN,
                                         WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, o, &t, &q),
                     WUSH_OK);
        if (t && q) {
            double ls = -1.0;
            CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &ls),
                         WUSH_OK);
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
    CHECK_STATUS(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ,
                                     WUSH_DTYPE_F32, l->w, l->d_out, l->d_in, o, &t, &q),
                 WUSH_OK);
    if (t && q) {
        CHECK_STATUS(wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss_s),
                     WUSH_OK);
        CHECK(loss_s > 0.0 && loss_s < loss_p); /* GPTQ+search below RTN WUSH */
    }
    wush_transform_destroy(t);
    wush_qweight_destroy(q);
    wush_calibrator_destroy(full);
    wush_calibrator_destroy(cal);
    wush_options_destroy(o);
}

int main(void) {
    test_options();
    static const LayerTest tests[] = {test_search, NULL};
    return run_layer_tests("capi_options", tests);
}
