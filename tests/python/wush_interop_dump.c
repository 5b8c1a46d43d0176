/* What libwush's public C API reports about a file, as JSON on stdout, for the Python
 * interoperability tests (tests/python). Plain C99 against the shared library; binary data is
 * written as lower-case hex of its little-endian bytes.
 *
 *   wush_interop_dump tensors FILE [KEY...]
 *       wush_tensor_file_*: every tensor in file order (name, dtype, shape, bytes) and the
 *       metadata value of each KEY (null when absent).
 *   wush_interop_dump checkpoint FILE
 *       wush_checkpoint_*: every layer (format, method, transform kind, d_out, d_in, G, the codes
 *       and scales as stored, the activation transform (C, G, G) float32, and the weights
 *       decoded with wush_dequantize_rows as float32).
 *   wush_interop_dump forward FILE LAYER X.f32 N_TOKENS
 *       The layer's forward pass assembled from library calls: the stored activation transform
 *       applied to the N_TOKENS x d_in float32 activations in X.f32 (float64 sums, rounded to
 *       float32), those quantized with wush_quantize_rows in the layer's format, and the product
 *       of wush_dequantize_rows of both (float64 sums): y (N_TOKENS x d_out, float64), and the
 *       activation codes and scales.
 *
 * Exit status 0 on success; 1 with {"status": ..., "error": ...} when a call fails; 2 for usage.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wush/wush.h"

static void put_string(const char* s) {
    const unsigned char* p = (const unsigned char*)s;
    putchar('"');
    for (; *p; ++p) {
        if (*p == '"' || *p == '\\') printf("\\%c", *p);
        else if (*p < 0x20) printf("\\u%04x", *p);
        else putchar(*p);
    }
    putchar('"');
}

static void put_hex(const void* data, size_t n) {
    static const char digits[] = "0123456789abcdef";
    const unsigned char* p = (const unsigned char*)data;
    size_t i;
    putchar('"');
    for (i = 0; i < n; ++i) {
        putchar(digits[p[i] >> 4]);
        putchar(digits[p[i] & 15]);
    }
    putchar('"');
}

static int failed(const char* what, wush_status st) {
    printf("{\"status\": ");
    put_string(wush_status_string(st));
    printf(", \"call\": ");
    put_string(what);
    printf(", \"error\": ");
    put_string(wush_last_error());
    printf("}\n");
    return 1;
}

static void* xmalloc(size_t n) {
    void* p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(3);
    }
    return p;
}

static int cmd_tensors(const char* path, int n_keys, char** keys) {
    wush_tensor_file* f = NULL;
    size_t count = 0, i, d;
    int k;
    wush_status st = wush_tensor_file_open(path, &f);
    if (st != WUSH_OK) return failed("wush_tensor_file_open", st);
    wush_tensor_file_count(f, &count);
    printf("{\"status\": \"WUSH_OK\", \"tensors\": [");
    for (i = 0; i < count; ++i) {
        const char *name = NULL, *dtype = NULL;
        size_t ndim = 0, bytes = 0, found = (size_t)-1;
        const uint64_t* shape = NULL;
        const void* data = NULL;
        st = wush_tensor_file_tensor(f, i, &name, &dtype, &ndim, &shape, &data, &bytes);
        if (st != WUSH_OK) {
            wush_tensor_file_destroy(f);
            return failed("wush_tensor_file_tensor", st);
        }
        printf("%s\n  {\"name\": ", i ? "," : "");
        put_string(name);
        printf(", \"dtype\": ");
        put_string(dtype);
        printf(", \"shape\": [");
        for (d = 0; d < ndim; ++d) printf("%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
        printf("], \"bytes\": ");
        put_hex(data, bytes);
        /* find() must give this index back */
        st = wush_tensor_file_find(f, name, &found);
        printf(", \"find\": %lld}", st == WUSH_OK ? (long long)found : -1LL);
    }
    printf("\n], \"metadata\": {");
    for (k = 0; k < n_keys; ++k) {
        const char* value = NULL;
        printf("%s", k ? ", " : "");
        put_string(keys[k]);
        printf(": ");
        st = wush_tensor_file_metadata(f, keys[k], &value);
        if (st == WUSH_OK) put_string(value);
        else printf("null");
    }
    printf("}}\n");
    wush_tensor_file_destroy(f);
    return 0;
}

static int dequantize(wush_context* ctx, const wush_qweight* q, float** out) {
    wush_format format;
    size_t d_out = 0, d_in = 0, codes_bytes = 0, scales_bytes = 0;
    const void *codes = NULL, *scales = NULL;
    wush_status st = wush_qweight_info(q, &format, NULL, &d_out, &d_in);
    if (st == WUSH_OK) st = wush_qweight_data(q, &codes, &codes_bytes, &scales, &scales_bytes);
    if (st != WUSH_OK) return failed("wush_qweight_info/data", st);
    *out = (float*)xmalloc(d_out * d_in * sizeof(float));
    st = wush_dequantize_rows(ctx, format, codes, codes_bytes, scales, scales_bytes, d_out, d_in, *out, d_out * d_in);
    if (st != WUSH_OK) return failed("wush_dequantize_rows", st);
    return 0;
}

static int cmd_checkpoint(const char* path) {
    wush_checkpoint* ck = NULL;
    wush_context* ctx = NULL;
    size_t n = 0, i;
    wush_status st = wush_checkpoint_open(path, &ck);
    if (st != WUSH_OK) return failed("wush_checkpoint_open", st);
    st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx);
    if (st != WUSH_OK) return failed("wush_context_create", st);
    wush_checkpoint_layer_count(ck, &n);
    printf("{\"status\": \"WUSH_OK\", \"version\": ");
    put_string(wush_version_string());
    printf(", \"layers\": [");
    for (i = 0; i < n; ++i) {
        const char* name = NULL;
        wush_transform* t = NULL;
        wush_qweight* q = NULL;
        wush_format format;
        wush_method method;
        wush_transform_kind kind;
        size_t d_out = 0, d_in = 0, g = 0, codes_bytes = 0, scales_bytes = 0;
        const void *codes = NULL, *scales = NULL;
        float *matrices = NULL, *deq = NULL;
        wush_checkpoint_layer_name(ck, i, &name);
        st = wush_checkpoint_load_layer(ck, name, &t, &q);
        if (st != WUSH_OK) return failed("wush_checkpoint_load_layer", st);
        wush_qweight_info(q, &format, &method, &d_out, &d_in);
        wush_qweight_data(q, &codes, &codes_bytes, &scales, &scales_bytes);
        wush_transform_info(t, &kind, NULL, &g);
        matrices = (float*)xmalloc(d_in * g * sizeof(float));
        st = wush_transform_matrices(t, matrices, d_in * g);
        if (st != WUSH_OK) return failed("wush_transform_matrices", st);
        if (dequantize(ctx, q, &deq) != 0) return 1;
        printf("%s\n  {\"name\": ", i ? "," : "");
        put_string(name);
        printf(", \"format\": ");
        put_string(wush_format_name(format));
        printf(", \"method\": %s, \"transform\": ", method == WUSH_METHOD_RTN ? "\"rtn\"" : "null");
        put_string(wush_transform_kind_name(kind));
        printf(", \"d_out\": %zu, \"d_in\": %zu, \"group_size\": %zu, \"codes\": ", d_out, d_in, g);
        put_hex(codes, codes_bytes);
        printf(", \"scales\": ");
        put_hex(scales, scales_bytes);
        printf(", \"matrices\": ");
        put_hex(matrices, d_in * g * sizeof(float));
        printf(", \"dequantized\": ");
        put_hex(deq, d_out * d_in * sizeof(float));
        printf("}");
        free(matrices);
        free(deq);
        wush_transform_destroy(t);
        wush_qweight_destroy(q);
    }
    printf("\n]}\n");
    wush_context_destroy(ctx);
    wush_checkpoint_destroy(ck);
    return 0;
}

static int cmd_forward(const char* path, const char* layer, const char* x_path, size_t n_tokens) {
    wush_checkpoint* ck = NULL;
    wush_context* ctx = NULL;
    wush_transform* t = NULL;
    wush_qweight* q = NULL;
    wush_format format;
    size_t d_out = 0, d_in = 0, g = 0, codes_bytes = 0, scales_bytes = 0, n, b, i, j, o;
    float *x, *xt, *matrices, *xq, *wq;
    unsigned char *codes, *scales;
    double* y;
    FILE* fx;
    wush_status st = wush_checkpoint_open(path, &ck);
    if (st != WUSH_OK) return failed("wush_checkpoint_open", st);
    st = wush_checkpoint_load_layer(ck, layer, &t, &q);
    if (st != WUSH_OK) return failed("wush_checkpoint_load_layer", st);
    st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx);
    if (st != WUSH_OK) return failed("wush_context_create", st);
    wush_qweight_info(q, &format, NULL, &d_out, &d_in);
    wush_transform_info(t, NULL, NULL, &g);
    x = (float*)xmalloc(n_tokens * d_in * sizeof(float));
    fx = fopen(x_path, "rb");
    if (!fx || fread(x, sizeof(float), n_tokens * d_in, fx) != n_tokens * d_in) {
        fprintf(stderr, "cannot read %zu x %zu floats from %s\n", n_tokens, d_in, x_path);
        return 1;
    }
    fclose(fx);
    matrices = (float*)xmalloc(d_in * g * sizeof(float));
    st = wush_transform_matrices(t, matrices, d_in * g);
    if (st != WUSH_OK) return failed("wush_transform_matrices", st);
    /* x_b -> T_b x_b for every token and block */
    xt = (float*)xmalloc(n_tokens * d_in * sizeof(float));
    for (n = 0; n < n_tokens; ++n)
        for (b = 0; b < d_in / g; ++b)
            for (i = 0; i < g; ++i) {
                double s = 0.0;
                for (j = 0; j < g; ++j) s += (double)matrices[b * g * g + i * g + j] * x[n * d_in + b * g + j];
                xt[n * d_in + b * g + i] = (float)s;
            }
    st = wush_format_buffer_sizes(format, n_tokens, d_in, &codes_bytes, &scales_bytes);
    if (st != WUSH_OK) return failed("wush_format_buffer_sizes", st);
    codes = (unsigned char*)xmalloc(codes_bytes);
    scales = (unsigned char*)xmalloc(scales_bytes);
    st = wush_quantize_rows(ctx, format, WUSH_DTYPE_F32, xt, n_tokens, d_in, codes, codes_bytes, scales, scales_bytes);
    if (st != WUSH_OK) return failed("wush_quantize_rows", st);
    xq = (float*)xmalloc(n_tokens * d_in * sizeof(float));
    st = wush_dequantize_rows(ctx, format, codes, codes_bytes, scales, scales_bytes, n_tokens, d_in, xq,
                              n_tokens * d_in);
    if (st != WUSH_OK) return failed("wush_dequantize_rows", st);
    if (dequantize(ctx, q, &wq) != 0) return 1;
    y = (double*)xmalloc(n_tokens * d_out * sizeof(double));
    for (n = 0; n < n_tokens; ++n)
        for (o = 0; o < d_out; ++o) {
            double s = 0.0;
            for (i = 0; i < d_in; ++i) s += (double)xq[n * d_in + i] * wq[o * d_in + i];
            y[n * d_out + o] = s;
        }
    printf("{\"status\": \"WUSH_OK\", \"format\": ");
    put_string(wush_format_name(format));
    printf(", \"d_out\": %zu, \"d_in\": %zu, \"x_codes\": ", d_out, d_in);
    put_hex(codes, codes_bytes);
    printf(", \"x_scales\": ");
    put_hex(scales, scales_bytes);
    printf(", \"y\": ");
    put_hex(y, n_tokens * d_out * sizeof(double));
    printf("}\n");
    free(x);
    free(xt);
    free(matrices);
    free(codes);
    free(scales);
    free(xq);
    free(wq);
    free(y);
    wush_transform_destroy(t);
    wush_qweight_destroy(q);
    wush_context_destroy(ctx);
    wush_checkpoint_destroy(ck);
    return 0;
}

int main(int argc, char** argv) {
    if (argc >= 3 && strcmp(argv[1], "tensors") == 0) return cmd_tensors(argv[2], argc - 3, argv + 3);
    if (argc == 3 && strcmp(argv[1], "checkpoint") == 0) return cmd_checkpoint(argv[2]);
    if (argc == 6 && strcmp(argv[1], "forward") == 0)
        return cmd_forward(argv[2], argv[3], argv[4], (size_t)strtoull(argv[5], NULL, 10));
    fprintf(stderr, "usage: wush_interop_dump tensors FILE [KEY...] | checkpoint FILE | forward FILE LAYER X.f32 N\n");
    return 2;
}
