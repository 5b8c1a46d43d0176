/* wush_layer_quantize() in plain C99 against the shared library: RTN through it equals the
 * two-step path byte for byte; GPTQ lowers the held-out loss against RTN on a built-in layer; a
 * checkpoint records and restores the method; bad input (block-diagonal calibrator, GPTQ through
 * wush_qweight_create, zero Hessian, cancellation) gives its status and leaves outputs untouched. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "wush/wush.h"

#define LAYER "small_256x512"
#define N_CAL 1024
#define N_HELD 256

static int cancel_always(void* user, double fraction) {
    (void)fraction;
    ++*(int*)user;
    return 1;
}

static int same_weights(const wush_qweight* a, const wush_qweight* b) {
    const void *ca, *cb, *sa, *sb;
    size_t nca, ncb, nsa, nsb;
    if (wush_qweight_data(a, &ca, &nca, &sa, &nsa) != WUSH_OK || wush_qweight_data(b, &cb, &ncb, &sb, &nsb) != WUSH_OK)
        return 0;
    return nca == ncb && nsa == nsb && memcmp(ca, cb, nca) == 0 && memcmp(sa, sb, nsa) == 0;
}

int main(void) {
    size_t d_out = 0, d_in = 0;
    float *w, *cal_x, *held;
    wush_context* ctx = NULL;
    wush_calibrator *full = NULL, *block = NULL, *zero = NULL;
    wush_transform *t_rtn = NULL, *t_two = NULL, *t_gptq = NULL, *t_untouched = (wush_transform*)0x1;
    wush_qweight *q_rtn = NULL, *q_two = NULL, *q_gptq = NULL, *q_untouched = (wush_qweight*)0x1;
    wush_method method = WUSH_METHOD_RTN;
    double loss_rtn = 0.0, loss_gptq = 0.0;

    CHECK(wush_example_layer_shape(LAYER, &d_out, &d_in) == WUSH_OK);
    w = malloc(d_out * d_in * sizeof(float));
    cal_x = malloc((size_t)N_CAL * d_in * sizeof(float));
    held = malloc((size_t)N_HELD * d_in * sizeof(float));
    if (!w || !cal_x || !held) return 1;
    CHECK(wush_example_layer_generate(LAYER, 1, N_CAL, N_HELD, w, d_out * d_in, cal_x, (size_t)N_CAL * d_in, held,
                                      (size_t)N_HELD * d_in) == WUSH_OK);
    CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &ctx) == WUSH_OK);
    CHECK(wush_calibrator_create(d_in, 32, WUSH_MOMENTS_FULL, &full) == WUSH_OK);
    CHECK(wush_calibrator_add(ctx, full, WUSH_DTYPE_F32, cal_x, N_CAL) == WUSH_OK);
    CHECK(wush_calibrator_create(d_in, 32, WUSH_MOMENTS_BLOCK_DIAGONAL, &block) == WUSH_OK);
    CHECK(wush_calibrator_add(ctx, block, WUSH_DTYPE_F32, cal_x, N_CAL) == WUSH_OK);

    /* RTN through wush_layer_quantize == wush_transform_build + wush_qweight_create */
    CHECK(wush_layer_quantize(ctx, block, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, &t_rtn, &q_rtn) == WUSH_OK);
    CHECK(wush_transform_build(ctx, block, WUSH_DTYPE_F32, w, d_out, d_in, WUSH_TRANSFORM_WUSH, NULL, &t_two) ==
          WUSH_OK);
    CHECK(wush_qweight_create(ctx, t_two, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w, d_out, d_in, NULL,
                              &q_two) == WUSH_OK);
    CHECK(same_weights(q_rtn, q_two));

    /* GPTQ: a lower held-out loss than RTN with the same transform kind, method recorded */
    CHECK(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, &t_gptq, &q_gptq) == WUSH_OK);
    CHECK(wush_qweight_info(q_gptq, NULL, &method, NULL, NULL) == WUSH_OK && method == WUSH_METHOD_GPTQ);
    CHECK(wush_layer_loss(ctx, t_rtn, q_rtn, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, held, N_HELD, &loss_rtn) == WUSH_OK);
    CHECK(wush_layer_loss(ctx, t_gptq, q_gptq, WUSH_DTYPE_F32, w, WUSH_DTYPE_F32, held, N_HELD, &loss_gptq) == WUSH_OK);
    printf("  %s mxfp4 wush: rtn loss %.5e, gptq loss %.5e\n", LAYER, loss_rtn, loss_gptq);
    CHECK(loss_gptq > 0.0 && loss_gptq < loss_rtn);
    CHECK(!same_weights(q_gptq, q_rtn));

    /* the checkpoint stores the method and loads it back */
    {
        wush_checkpoint *out = NULL, *in = NULL;
        wush_qweight* loaded = NULL;
        char path[] = "/tmp/wush_test_gptq_XXXXXX";
        const int fd = mkstemp(path);
        CHECK(fd >= 0);
        CHECK(wush_checkpoint_create(&out) == WUSH_OK);
        CHECK(wush_checkpoint_add_layer(out, "proj", t_gptq, q_gptq) == WUSH_OK);
        CHECK(wush_checkpoint_write(out, path, NULL) == WUSH_OK);
        CHECK(wush_checkpoint_open(path, &in) == WUSH_OK);
        CHECK(wush_checkpoint_load_layer(in, "proj", NULL, &loaded) == WUSH_OK);
        method = WUSH_METHOD_RTN;
        CHECK(wush_qweight_info(loaded, NULL, &method, NULL, NULL) == WUSH_OK && method == WUSH_METHOD_GPTQ);
        CHECK(same_weights(loaded, q_gptq));
        wush_qweight_destroy(loaded);
        wush_checkpoint_destroy(in);
        wush_checkpoint_destroy(out);
        remove(path);
    }

    /* GPTQ needs the full Hessian */
    CHECK(wush_layer_quantize(ctx, block, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, &t_untouched, &q_untouched) == WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "full") != NULL);
    CHECK(t_untouched == (wush_transform*)0x1 && q_untouched == (wush_qweight*)0x1);
    /* and cannot run through wush_qweight_create */
    CHECK(wush_qweight_create(ctx, t_two, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32, w, d_out, d_in, NULL,
                              &q_untouched) == WUSH_ERR_INVALID_ARGUMENT);
    CHECK(strstr(wush_last_error(), "wush_layer_quantize") != NULL);
    /* group size mismatch, unknown method, NULL outputs */
    CHECK(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_NVFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, &t_untouched, &q_untouched) == WUSH_ERR_INVALID_ARGUMENT);
    CHECK(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, (wush_method)7, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, &t_untouched, &q_untouched) == WUSH_ERR_INVALID_ARGUMENT);
    CHECK(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, NULL, &q_untouched) == WUSH_ERR_INVALID_ARGUMENT);
    CHECK(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32, w,
                              d_out, d_in, NULL, &t_untouched, NULL) == WUSH_ERR_INVALID_ARGUMENT);
    CHECK(t_untouched == (wush_transform*)0x1 && q_untouched == (wush_qweight*)0x1);

    /* an all-zero Hessian: NUMERICAL, with a message */
    {
        float* zeros = calloc(64 * d_in, sizeof(float));
        if (!zeros) return 1;
        CHECK(wush_calibrator_create(d_in, 32, WUSH_MOMENTS_FULL, &zero) == WUSH_OK);
        CHECK(wush_calibrator_add(ctx, zero, WUSH_DTYPE_F32, zeros, 64) == WUSH_OK);
        CHECK(wush_layer_quantize(ctx, zero, WUSH_TRANSFORM_IDENTITY, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ,
                                  WUSH_DTYPE_F32, w, d_out, d_in, NULL, &t_untouched,
                                  &q_untouched) == WUSH_ERR_NUMERICAL);
        CHECK(strstr(wush_last_error(), "Hessian") != NULL);
        free(zeros);
    }

    /* cancellation: CANCELLED after one callback, outputs untouched */
    {
        wush_options* o = NULL;
        int calls = 0;
        CHECK(wush_options_create(&o) == WUSH_OK);
        CHECK(wush_options_set_progress(o, cancel_always, &calls) == WUSH_OK);
        CHECK(wush_layer_quantize(ctx, full, WUSH_TRANSFORM_WUSH, WUSH_FORMAT_MXFP4, WUSH_METHOD_GPTQ, WUSH_DTYPE_F32,
                                  w, d_out, d_in, o, &t_untouched, &q_untouched) == WUSH_ERR_CANCELLED);
        CHECK(calls == 1);
        CHECK(t_untouched == (wush_transform*)0x1 && q_untouched == (wush_qweight*)0x1);
        wush_options_destroy(o);
    }

    wush_transform_destroy(t_rtn);
    wush_transform_destroy(t_two);
    wush_transform_destroy(t_gptq);
    wush_qweight_destroy(q_rtn);
    wush_qweight_destroy(q_two);
    wush_qweight_destroy(q_gptq);
    wush_calibrator_destroy(full);
    wush_calibrator_destroy(block);
    wush_calibrator_destroy(zero);
    wush_context_destroy(ctx);
    free(w);
    free(cal_x);
    free(held);
    printf("capi_gptq: %d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
