/*
 * Distributed calibration with MPI: every rank calibrates on its own shard of a layer's
 * activations, the ranks all-reduce the calibrator state with a plain MPI_SUM on doubles, and
 * rank 0 builds the WUSH transform and RTN weights from the merged moments and writes a
 * checkpoint. The result equals a single-process calibration on all the tokens (up to the order
 * of the float64 additions).
 *
 *   mpirun -np 4 ./calibrate_mpi --out CK.safetensors [--layer small_256x512] [--tokens 4096]
 *                                [--format mxfp4] [--fail-rank R]
 *
 * The layer is a built-in example layer (wush_example_layer_generate), generated identically on
 * every rank; rank r keeps tokens [r n / size, (r + 1) n / size). --fail-rank R puts a NaN into
 * rank R's shard to show error handling: the failing rank's message reaches every rank, each
 * prints it and the job exits non-zero instead of hanging in a collective.
 *
 * Build: mpicc -std=c99 calibrate_mpi.c $(pkg-config --cflags --libs wush) -o calibrate_mpi
 */
#include <mpi.h>
#include <wush/wush.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MESSAGE_BYTES 512

typedef struct {
    const char* layer;
    const char* out;
    const char* format;
    size_t tokens;
    int fail_rank;
} Args;

static int parse_args(int argc, char** argv, Args* a) {
    int i;
    a->layer = "small_256x512";
    a->out = NULL;
    a->format = "mxfp4";
    a->tokens = 4096;
    a->fail_rank = -1;
    for (i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--layer") == 0) a->layer = argv[i + 1];
        else if (strcmp(argv[i], "--out") == 0) a->out = argv[i + 1];
        else if (strcmp(argv[i], "--format") == 0) a->format = argv[i + 1];
        else if (strcmp(argv[i], "--tokens") == 0) a->tokens = (size_t)strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--fail-rank") == 0) a->fail_rank = atoi(argv[i + 1]);
        else return 0;
    }
    return i == argc && a->out != NULL && a->tokens > 0;
}

/* Every rank learns whether any rank failed; the lowest failing rank's message is broadcast and
 * printed by all. Returns 1 when the job must stop. Collective: every rank must call it at the
 * same point, failed or not (a rank that returned early would leave the others in a hang). */
static int any_rank_failed(int rank, const char* what, wush_status st) {
    int mine = st == WUSH_OK ? 0x7FFFFFFF : rank, first = 0;
    char message[MESSAGE_BYTES];
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == 0x7FFFFFFF) return 0;
    if (rank == first) snprintf(message, sizeof message, "%s: %s: %s", what, wush_status_string(st), wush_last_error());
    MPI_Bcast(message, MESSAGE_BYTES, MPI_CHAR, first, MPI_COMM_WORLD);
    fprintf(stderr, "rank %d: calibration failed on rank %d: %s\n", rank, first, message);
    return 1;
}

/* Rank 0: transform + RTN weights from the merged calibrator, written as layer "layer". */
static wush_status build_and_write(wush_context* ctx, const wush_calibrator* cal, const float* w, size_t d_out,
                                   size_t d_in, wush_format format, const char* path) {
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    wush_checkpoint* ck = NULL;
    wush_status st = wush_layer_quantize(ctx, cal, WUSH_TRANSFORM_WUSH, format, WUSH_METHOD_RTN, WUSH_DTYPE_F32, w,
                                         d_out, d_in, NULL, &t, &q);
    if (st == WUSH_OK) st = wush_checkpoint_create(&ck);
    if (st == WUSH_OK) st = wush_checkpoint_add_layer(ck, "layer", t, q);
    if (st == WUSH_OK) st = wush_checkpoint_write(ck, path, NULL);
    wush_checkpoint_destroy(ck);
    wush_qweight_destroy(q);
    wush_transform_destroy(t);
    return st;
}

int main(int argc, char** argv) {
    Args a;
    int rank = 0, size = 1, rc = 1;
    size_t d_out = 0, d_in = 0, g = 0, n_state = 0, begin, end;
    float *w = NULL, *x = NULL;
    double *state = NULL, *merged = NULL;
    wush_context* ctx = NULL;
    wush_calibrator *local = NULL, *all = NULL;
    wush_format format = WUSH_FORMAT_MXFP4;
    wush_status st;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (!parse_args(argc, argv, &a)) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: calibrate_mpi --out CK.safetensors [--layer L] [--tokens N] "
                    "[--format F] [--fail-rank R]\n");
        MPI_Finalize();
        return 2;
    }

    /* Setup and the local calibration; a failure anywhere is reported by all ranks. */
    st = wush_format_from_name(a.format, &format);
    if (st == WUSH_OK) st = wush_format_group_size(format, &g);
    if (st == WUSH_OK) st = wush_example_layer_shape(a.layer, &d_out, &d_in);
    if (st == WUSH_OK) {
        w = malloc(d_out * d_in * sizeof *w);
        x = malloc(a.tokens * d_in * sizeof *x);
        if (!w || !x) st = WUSH_ERR_OUT_OF_MEMORY;
    }
    if (st == WUSH_OK)
        st = wush_example_layer_generate(a.layer, 1, a.tokens, 0, w, d_out * d_in, x, a.tokens * d_in, NULL, 0);
    begin = a.tokens * (size_t)rank / (size_t)size;
    end = a.tokens * (size_t)(rank + 1) / (size_t)size;
    if (st == WUSH_OK && rank == a.fail_rank && end > begin) x[begin * d_in + 3] = NAN;
    if (st == WUSH_OK) st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx);
    if (st == WUSH_OK) st = wush_calibrator_create(d_in, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &local);
    if (st == WUSH_OK && end > begin)
        st = wush_calibrator_add(ctx, local, WUSH_DTYPE_F32, x + begin * d_in, end - begin);
    if (st == WUSH_OK) st = wush_calibrator_state_size(local, &n_state);
    if (st == WUSH_OK) {
        state = malloc(n_state * sizeof *state);
        merged = malloc(n_state * sizeof *merged);
        if (!state || !merged) st = WUSH_ERR_OUT_OF_MEMORY;
    }
    if (st == WUSH_OK) st = wush_calibrator_export_state(local, state, n_state);
    if (any_rank_failed(rank, "local calibration", st)) goto done;

    /* The whole distributed part: one all-reduce with a plain SUM. */
    MPI_Allreduce(state, merged, (int)n_state, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    st = wush_calibrator_create(d_in, g, WUSH_MOMENTS_BLOCK_DIAGONAL, &all);
    if (st == WUSH_OK) st = wush_calibrator_import_state(all, merged, n_state);
    if (any_rank_failed(rank, "importing the all-reduced state", st)) goto done;

    st = rank == 0 ? build_and_write(ctx, all, w, d_out, d_in, format, a.out) : WUSH_OK;
    if (any_rank_failed(rank, "building and writing the checkpoint", st)) goto done;
    if (rank == 0) printf("calibrate_mpi: %d ranks, %zu tokens, wrote %s\n", size, a.tokens, a.out);
    rc = 0;

done:
    wush_calibrator_destroy(all);
    wush_calibrator_destroy(local);
    wush_context_destroy(ctx);
    free(state);
    free(merged);
    free(w);
    free(x);
    MPI_Finalize();
    return rc;
}
