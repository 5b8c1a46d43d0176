/*
 * libwush from C99: quantize a 2 x 64 float32 matrix to MXFP4 and back through the public C API,
 * and check every code, scale byte and decoded value against an independent reference written
 * here from the rules in include/wush/wush.h.
 *
 * Build (links the installed library through pkg-config only):
 *   cc -std=c99 -pedantic -Wall -Wextra -Werror example.c $(pkg-config --cflags --libs wush) \
 *      -Wl,-rpath,"$(pkg-config --variable=libdir wush)" -o example
 *
 * Prints "c binding: OK" and exits 0 on success; prints what differs and exits 1 otherwise.
 */
#include <wush/wush.h>

#include <stdio.h>
#include <string.h>

#define N_ROWS 2
#define D_IN 64
#define GROUP 32
#define N_GROUPS (N_ROWS * D_IN / GROUP)
/* The ABI major this program was written against (the SONAME is libwush.so.<major>). */
#define EXPECTED_MAJOR 0

static int failures = 0;

static void fail(const char* what) {
    fprintf(stderr, "c binding: FAIL: %s\n", what);
    ++failures;
}

/* ---- independent MXFP4 reference (header: e = floor(log2(amax)), code = RNE_e2m1(x*3/2^e)) ---- */

static const double e2m1_magnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

static double abs_d(double v) {
    return v < 0.0 ? -v : v;
}

static int is_negative(float v) {
    /* the sign bit, so that -0.0f counts as negative */
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return (bits >> 31) != 0;
}

/* 2^e exactly, without libm. */
static double pow2(int e) {
    double p = 1.0;
    for (; e > 0; --e) p *= 2.0;
    for (; e < 0; ++e) p *= 0.5;
    return p;
}

/* floor(log2(a)) for a finite a > 0, exactly, without libm. */
static int floor_log2(double a) {
    int e = 0;
    while (a >= 2.0) {
        a *= 0.5;
        ++e;
    }
    while (a < 1.0) {
        a *= 2.0;
        --e;
    }
    return e;
}

/* Round |y| to the E2M1 grid, ties to the even code (0, 2, 4, 6 have mantissa bit 0). */
static unsigned e2m1_magnitude_code(double a) {
    if (a <= 0.25) return 0; /* tie 0.25 -> 0.0 (even) */
    if (a < 0.75) return 1;  /* tie 0.75 -> 1.0 (even) */
    if (a <= 1.25) return 2; /* tie 1.25 -> 1.0 (even) */
    if (a < 1.75) return 3;  /* tie 1.75 -> 2.0 (even) */
    if (a <= 2.5) return 4;  /* tie 2.5  -> 2.0 (even) */
    if (a < 3.5) return 5;   /* tie 3.5  -> 4.0 (even) */
    if (a <= 5.0) return 6;  /* tie 5.0  -> 4.0 (even) */
    return 7;                /* saturate at 6 */
}

/* Reference for one group: scale byte, 4-bit codes, decoded values. */
static void reference_group(const float* x, unsigned char* scale_byte, unsigned char* codes, double* decoded) {
    double amax = 0.0;
    int i, e;
    for (i = 0; i < GROUP; ++i)
        if (abs_d(x[i]) > amax) amax = abs_d(x[i]);
    if (amax == 0.0) {
        *scale_byte = 0;
        for (i = 0; i < GROUP; ++i) {
            codes[i] = 0;
            decoded[i] = 0.0;
        }
        return;
    }
    e = floor_log2(amax);
    if (e < -127) e = -127;
    if (e > 127) e = 127;
    *scale_byte = (unsigned char)(e + 127);
    for (i = 0; i < GROUP; ++i) {
        double y = (double)x[i] * 3.0 / pow2(e); /* exact: 26-bit product, power-of-two divide */
        unsigned mag = e2m1_magnitude_code(abs_d(y));
        unsigned sign = is_negative(x[i]) ? 8u : 0u;
        codes[i] = (unsigned char)(sign | mag);
        decoded[i] = (sign ? -1.0 : 1.0) * e2m1_magnitude[mag] * pow2(e) / 3.0;
    }
}

/* Group 0 (amax 4.0 -> e = 2, scale byte 129), with its codes worked out by hand. */
static const float group0[GROUP] = {0.0f,
                                    -0.0f,
                                    4.0f,
                                    -4.0f,
                                    1.0f,
                                    -1.0f,
                                    2.0f,
                                    0.5f,
                                    0.25f,
                                    0.3333333432674408f,
                                    0.3333333134651184f,
                                    1.6666666269302368f,
                                    1.666666746139526f,
                                    2.3333332538604736f,
                                    2.3333334922790527f,
                                    3.3333332538604736f,
                                    3.3333334922790527f,
                                    3.9f,
                                    -2.5f,
                                    0.1f,
                                    -0.1f,
                                    3.0f,
                                    -3.0f,
                                    2.6666667461395264f,
                                    1.25f,
                                    1.5f,
                                    -0.75f,
                                    0.6f,
                                    2.2f,
                                    -3.5f,
                                    3.6f,
                                    0.75f};
/* x*3/4 -> nearest E2M1 (ties to even) -> code; e.g. 1.0 -> 0.75 (tie) -> 1.0 -> code 2. */
static const unsigned char group0_codes[GROUP] = {0, 8, 5,  13, 2, 10, 3,  1, 0, 1, 0, 2, 3, 3,  4, 4,
                                                  5, 5, 12, 0,  8, 4,  12, 4, 2, 2, 9, 1, 3, 13, 5, 1};

static int close_enough(double got, double want) {
    double tol = 1e-6 * abs_d(want);
    if (want == 0.0) return got == 0.0;
    return abs_d(got - want) <= tol;
}

int main(void) {
    float x[N_ROWS * D_IN];
    unsigned char codes[N_ROWS * D_IN / 2];
    unsigned char scales[N_GROUPS];
    float y[N_ROWS * D_IN];
    unsigned char want_codes[N_ROWS * D_IN];
    unsigned char want_scales[N_GROUPS];
    double want_y[N_ROWS * D_IN];
    size_t codes_bytes = 0, scales_bytes = 0, group_size = 0;
    wush_context* ctx = NULL;
    wush_status st;
    char msg[256];
    int i, g;

    if (wush_version() / 10000u != EXPECTED_MAJOR) fail("loaded library has another ABI major");
    if (wush_version() != WUSH_VERSION_NUMBER) fail("header and loaded library versions differ");

    /* Input: group 0 hand-checked; group 1 amax 0.75 (e = -1); group 2 amax 7.9 (top value
     * rounds up to 6); group 3 all zeros (scale byte 0). */
    for (i = 0; i < GROUP; ++i) {
        x[i] = group0[i];
        x[GROUP + i] = (float)((i * 11) % 23 - 11) * (0.75f / 11.0f);
        x[2 * GROUP + i] = (float)((i * 7) % 19 - 9) * (7.9f / 9.0f);
        x[3 * GROUP + i] = 0.0f;
    }
    for (g = 0; g < N_GROUPS; ++g)
        reference_group(x + g * GROUP, &want_scales[g], want_codes + g * GROUP, want_y + g * GROUP);

    /* The reference must agree with the hand-worked group before it is trusted for the rest. */
    if (want_scales[0] != 129) fail("reference: group 0 scale byte is not 129");
    if (memcmp(want_codes, group0_codes, GROUP) != 0) fail("reference: group 0 codes differ from the hand table");
    if (want_scales[1] != 126 || want_scales[2] != 129 || want_scales[3] != 0)
        fail("reference: unexpected scale bytes for groups 1-3");

    st = wush_format_group_size(WUSH_FORMAT_MXFP4, &group_size);
    if (st != WUSH_OK || group_size != GROUP) fail("wush_format_group_size(MXFP4) != 32");
    st = wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, N_ROWS, D_IN, &codes_bytes, &scales_bytes);
    if (st != WUSH_OK || codes_bytes != sizeof codes || scales_bytes != sizeof scales)
        fail("wush_format_buffer_sizes returned unexpected sizes");

    st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx);
    if (st != WUSH_OK) {
        fprintf(stderr, "c binding: FAIL: wush_context_create: %s: %s\n", wush_status_string(st), wush_last_error());
        return 1;
    }

    st = wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, N_ROWS, D_IN, codes, sizeof codes, scales,
                            sizeof scales);
    if (st != WUSH_OK) {
        fprintf(stderr, "c binding: FAIL: wush_quantize_rows: %s: %s\n", wush_status_string(st), wush_last_error());
        wush_context_destroy(ctx);
        return 1;
    }
    for (g = 0; g < N_GROUPS; ++g) {
        if (scales[g] != want_scales[g]) {
            sprintf(msg, "group %d: scale byte %u, expected %u", g, scales[g], want_scales[g]);
            fail(msg);
        }
    }
    for (i = 0; i < N_ROWS * D_IN; ++i) {
        /* element 2k in the low nibble, element 2k+1 in the high nibble */
        unsigned got = (i % 2 == 0) ? (codes[i / 2] & 0x0Fu) : (codes[i / 2] >> 4);
        if (got != want_codes[i]) {
            sprintf(msg, "element %d (x = %.9g): code %u, expected %u", i, (double)x[i], got, want_codes[i]);
            fail(msg);
        }
    }

    st = wush_dequantize_rows(ctx, WUSH_FORMAT_MXFP4, codes, sizeof codes, scales, sizeof scales, N_ROWS, D_IN, y,
                              N_ROWS * D_IN);
    if (st != WUSH_OK) {
        sprintf(msg, "wush_dequantize_rows returned %s", wush_status_string(st));
        fail(msg);
    } else {
        for (i = 0; i < N_ROWS * D_IN; ++i) {
            if (!close_enough(y[i], want_y[i])) {
                sprintf(msg, "element %d: decoded %.9g, expected %.9g", i, (double)y[i], want_y[i]);
                fail(msg);
            }
        }
    }

    /* Failure path: d_in = 48 is not a multiple of G = 32. */
    st = wush_format_buffer_sizes(WUSH_FORMAT_MXFP4, 1, 48, &codes_bytes, &scales_bytes);
    if (st != WUSH_ERR_INVALID_ARGUMENT) fail("wush_format_buffer_sizes(d_in = 48) did not fail");
    memset(codes, 0xAB, sizeof codes);
    memset(scales, 0xCD, sizeof scales);
    st = wush_quantize_rows(ctx, WUSH_FORMAT_MXFP4, WUSH_DTYPE_F32, x, 1, 48, codes, sizeof codes, scales,
                            sizeof scales);
    if (st != WUSH_ERR_INVALID_ARGUMENT) {
        sprintf(msg, "wush_quantize_rows(d_in = 48) returned %s", wush_status_string(st));
        fail(msg);
    }
    if (wush_last_error() == NULL || wush_last_error()[0] == '\0') fail("wush_last_error() is empty after a failure");
    if (strcmp(wush_status_string(WUSH_ERR_INVALID_ARGUMENT), "WUSH_ERR_INVALID_ARGUMENT") != 0)
        fail("wush_status_string(WUSH_ERR_INVALID_ARGUMENT)");
    for (i = 0; i < (int)sizeof codes; ++i)
        if (codes[i] != 0xAB) {
            fail("a failed wush_quantize_rows wrote to codes");
            break;
        }
    for (i = 0; i < (int)sizeof scales; ++i)
        if (scales[i] != 0xCD) {
            fail("a failed wush_quantize_rows wrote to scales");
            break;
        }

    wush_context_destroy(ctx);
    wush_context_destroy(NULL); /* documented no-op */

    if (failures != 0) {
        fprintf(stderr, "c binding: %d mismatch(es)\n", failures);
        return 1;
    }
    printf("c binding: OK\n");
    return 0;
}
