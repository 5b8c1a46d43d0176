/* Calibrators: second moments against float64 sums, merge, distributed export/import of the state.
 *
 * Plain C99 against the shared library. Oracles are independent of the code under test: float64
 * loops written here (core_common.h), theorems, or a second path through the API. */
#define _POSIX_C_SOURCE 200809L
#include "core_common.h"

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
    /* A size no machine can hold (d_in^2 doubles past what a vector can address): out of memory,
     * said so, not WUSH_ERR_INTERNAL (issue 43). No allocation is attempted. */
    CHECK_STATUS(wush_calibrator_create((size_t)1 << 31, 32, WUSH_MOMENTS_FULL, &untouched), WUSH_ERR_OUT_OF_MEMORY);
    CHECK(strstr(wush_last_error(), "out of memory") != NULL);
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
                if (gs && gn == sz)
                    CHECK_STATUS(wush_calibrator_import_state(fresh, gs, gn), WUSH_ERR_INVALID_ARGUMENT);
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

int main(void) {
    wush_context* ctx = NULL;
    CHECK_STATUS(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx), WUSH_OK);
    if (ctx == NULL) return 1;
    test_calibrator_basics(ctx);
    test_calibrator_merge_and_state(ctx);
    wush_context_destroy(ctx);

    printf("capi_calibrator: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures == 0 ? 0 : 1;
}
