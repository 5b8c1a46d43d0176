/* Pre-quantized weights and the layerwise loss; the built-in example layers.
 *
 * Plain C99 against the shared library. Oracles are independent of the code under test: float64
 * loops written here (core_common.h), theorems, or a second path through the API. */
#define _POSIX_C_SOURCE 200809L
#include "core_common.h"

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
    if (wush_layer_loss(ctx, t, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss) != WUSH_OK)
        loss = -1.0;
    wush_qweight_destroy(q);
    return loss;
}

static void test_qweight_and_loss(wush_context* ctx, const Layer* l) {
    static const wush_format formats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4,
                                          WUSH_FORMAT_MXFP4_OCP};
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
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, (wush_method)1, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, (wush_format)4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out, d,
                                     NULL, &untouched),
                 WUSH_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(wush_qweight_create(ctx, id32, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out,
                                     d - 32, NULL, &untouched),
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
        CHECK_STATUS(wush_qweight_create(ctx, g == 32 ? id32 : id16, f, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w, l->d_out,
                                         d, NULL, &q),
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
        /* The library multiplies the exact dequantized values (element x scale / divisor); this
         * path rounds them to float32 first (wush_dequantize_rows), about 1e-7 apart in the loss
         * where the divisor is 3 or 10. */
        CHECK_CLOSE(got, want, 1e-6);
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
        CHECK_STATUS(
            wush_transform_build(ctx, cal, WUSH_DTYPE_F32, l->w, l->d_out, d, WUSH_TRANSFORM_HADAMARD, NULL, &th),
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
            CHECK_STATUS(wush_qweight_create(ctx, tw, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, l->w,
                                             l->d_out, d, NULL, &q),
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
            CHECK_STATUS(wush_layer_loss(ctx, tw, (const wush_qweight*)tw, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32,
                                         l->held, l->n_held, &loss),
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
                CHECK_STATUS(
                    wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
                    WUSH_ERR_NON_FINITE);
                l->held[5 * d + 77] = saved;
            }
            {
                const float saved = l->w[9];
                l->w[9] = -INFINITY;
                CHECK_STATUS(
                    wush_layer_loss(ctx, tw, q, WUSH_DTYPE_F32, l->w, WUSH_DTYPE_F32, l->held, l->n_held, &loss),
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

int main(void) {
    test_example_layers();
    static const LayerTest tests[] = {test_qweight_and_loss, NULL};
    return run_layer_tests("capi_qweight", tests);
}
