/*
 * Compares layer "layer" of two checkpoints written by calibrate_mpi: the activation transforms
 * must agree to a relative Frobenius distance of 1e-10 and the packed weight codes and scales must
 * be identical. Prints the distance and the number of differing codes and scales.
 *
 *   compare_checkpoints A.safetensors B.safetensors
 *
 * Build: cc -std=c99 compare_checkpoints.c $(pkg-config --cflags --libs wush) -lm
 */
#include <wush/wush.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    wush_checkpoint* ck;
    wush_transform* t;
    wush_qweight* q;
    size_t d_in, g;
    float* m;
} Loaded;

static int load(const char* path, Loaded* l) {
    memset(l, 0, sizeof *l);
    if (wush_checkpoint_open(path, &l->ck) != WUSH_OK ||
        wush_checkpoint_load_layer(l->ck, "layer", &l->t, &l->q) != WUSH_OK ||
        wush_transform_info(l->t, NULL, &l->d_in, &l->g) != WUSH_OK) {
        fprintf(stderr, "compare_checkpoints: %s: %s\n", path, wush_last_error());
        return 0;
    }
    l->m = malloc(l->d_in * l->g * sizeof *l->m);
    if (!l->m || wush_transform_matrices(l->t, l->m, l->d_in * l->g) != WUSH_OK) return 0;
    return 1;
}

static void release(Loaded* l) {
    free(l->m);
    wush_qweight_destroy(l->q);
    wush_transform_destroy(l->t);
    wush_checkpoint_destroy(l->ck);
}

static size_t differing_bytes(const unsigned char* a, const unsigned char* b, size_t n) {
    size_t i, d = 0;
    for (i = 0; i < n; ++i) d += a[i] != b[i];
    return d;
}

/* Differing 4-bit codes (two per byte). */
static size_t differing_nibbles(const unsigned char* a, const unsigned char* b, size_t n) {
    size_t i, d = 0;
    for (i = 0; i < n; ++i) d += ((a[i] ^ b[i]) & 0x0F) != 0, d += ((a[i] ^ b[i]) & 0xF0) != 0;
    return d;
}

int main(int argc, char** argv) {
    Loaded a, b;
    const void *ca, *cb, *sa, *sb;
    size_t nca, ncb, nsa, nsb, i, codes_diff, scales_diff;
    double diff = 0.0, norm = 0.0, rel;
    int ok;
    if (argc != 3) {
        fprintf(stderr, "usage: compare_checkpoints A.safetensors B.safetensors\n");
        return 2;
    }
    if (!load(argv[1], &a) || !load(argv[2], &b)) return 1;
    if (a.d_in != b.d_in || a.g != b.g) {
        fprintf(stderr, "compare_checkpoints: different geometry\n");
        return 1;
    }
    for (i = 0; i < a.d_in * a.g; ++i) {
        diff += ((double)a.m[i] - b.m[i]) * ((double)a.m[i] - b.m[i]);
        norm += (double)a.m[i] * a.m[i];
    }
    rel = sqrt(diff / norm);
    wush_qweight_data(a.q, &ca, &nca, &sa, &nsa);
    wush_qweight_data(b.q, &cb, &ncb, &sb, &nsb);
    if (nca != ncb || nsa != nsb) {
        fprintf(stderr, "compare_checkpoints: different weight sizes\n");
        return 1;
    }
    codes_diff = differing_nibbles(ca, cb, nca);
    scales_diff = differing_bytes(sa, sb, nsa);
    ok = rel <= 1e-10 && codes_diff == 0 && scales_diff == 0;
    printf("transform relative distance %.3e (limit 1e-10); %zu of %zu codes and %zu of %zu scales differ: %s\n", rel,
           codes_diff, 2 * nca, scales_diff, nsa, ok ? "OK" : "MISMATCH");
    release(&a);
    release(&b);
    return ok ? 0 : 1;
}
