/*
 * libwush — closed-form, data-aware block transforms for 4-bit (W4A4) quantization.
 *
 * This is the library's only public header. It is plain C99; nothing in it mentions C++ or CUDA
 * types. Link with `pkg-config --cflags --libs wush`.
 *
 * ------------------------------------------------------------------------------------------------
 * Conventions that hold for every function below
 * ------------------------------------------------------------------------------------------------
 *  - Every fallible function returns a wush_status. WUSH_OK (0) means success. On failure, a
 *    message describing the problem is available from wush_last_error() on the same thread, and
 *    output arguments are left untouched unless the function's comment says otherwise.
 *  - No function aborts, exits, prints to stdout/stderr, or lets a C++ exception escape. Running
 *    out of memory is reported as WUSH_ERR_OUT_OF_MEMORY.
 *  - Objects are opaque handles created by `wush_<object>_create` and released by
 *    `wush_<object>_destroy`; destroy(NULL) is a no-op. Each handle carries a type tag and the
 *    library keeps a table of live handles: passing NULL, a handle of the wrong type or an already
 *    destroyed handle to a function returns WUSH_ERR_INVALID_ARGUMENT instead of crashing.
 *  - The caller owns every bulk buffer (inputs, packed codes, scales, outputs) and passes its size
 *    in bytes or elements; a function never writes past the size it was given, and reports
 *    WUSH_ERR_BUFFER_TOO_SMALL when the size is not enough. Size queries say how much is needed.
 *  - Thread safety: distinct handles may be used from distinct threads at the same time. Calls
 *    that only read an object (documented as such) may run concurrently on one object. A
 *    wush_context is not reentrant: calls that take the same context are serialized by the
 *    library (a second thread waits), so give each thread its own context for parallel work.
 *    wush_last_error() is per thread.
 *
 * Layouts (framework conventions, as PyTorch's nn.Linear): a weight W is d_out x d_in row-major,
 * activations X are n_tokens x d_in row-major, the layer output is Y = X W^T. Quantization groups
 * run along d_in; the group size G divides d_in.
 */
#ifndef WUSH_WUSH_H
#define WUSH_WUSH_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#  define WUSH_API
#elif defined(__GNUC__) && __GNUC__ >= 4
#  define WUSH_API __attribute__((visibility("default")))
#else
#  define WUSH_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================================================
 * Version
 * ==============================================================================================*/

/* These three lines are the single source of truth for the version; the build reads them, and
 * the shared library's SONAME is libwush.so.<WUSH_VERSION_MAJOR>. */
#define WUSH_VERSION_MAJOR 0
#define WUSH_VERSION_MINOR 1
#define WUSH_VERSION_PATCH 0

#define WUSH_VERSION_NUMBER (WUSH_VERSION_MAJOR * 10000 + WUSH_VERSION_MINOR * 100 + WUSH_VERSION_PATCH)

/*! wush_version() :
 *  @return the version of the library actually loaded at run time, as
 *          MAJOR * 10000 + MINOR * 100 + PATCH. Compare with WUSH_VERSION_NUMBER to detect a
 *          header/library mismatch. Never fails; thread-safe. */
WUSH_API unsigned wush_version(void);

/*! wush_version_string() :
 *  @return the loaded library's version as a static "MAJOR.MINOR.PATCH" string (never NULL;
 *          do not free). Thread-safe. */
WUSH_API const char* wush_version_string(void);

/* ================================================================================================
 * Status and errors
 * ==============================================================================================*/

/* Status codes. Values are pinned: they never change meaning between versions, and new codes are
 * only ever appended. */
typedef enum wush_status {
    WUSH_OK = 0,
    WUSH_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad handle, bad enum, inconsistent sizes    */
    WUSH_ERR_OUT_OF_MEMORY = 2,    /* an allocation failed (host or device)                      */
    WUSH_ERR_UNSUPPORTED = 3,      /* valid request this build or machine cannot serve           */
    WUSH_ERR_NON_FINITE = 4,       /* an input holds NaN or +-Inf                                */
    WUSH_ERR_BUFFER_TOO_SMALL = 5, /* a caller-provided buffer is smaller than required          */
    WUSH_ERR_NUMERICAL = 6,        /* a decomposition failed even after the documented fallbacks */
    WUSH_ERR_IO = 7,               /* a file could not be opened, read or written                */
    WUSH_ERR_CORRUPT_FILE = 8,     /* a file is not a valid libwush / safetensors file           */
    WUSH_ERR_CUDA = 9,             /* the CUDA runtime reported an error                         */
    WUSH_ERR_CANCELLED = 10,       /* a progress callback asked to stop                          */
    WUSH_ERR_INTERNAL = 11,        /* a bug in libwush: please report it with wush_last_error()  */
    WUSH_ERR_NOT_FOUND = 12,       /* a named tensor, layer or key does not exist                */
    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_STATUS_ENUM_MIN_ = -2147483647 - 1,
    WUSH_STATUS_ENUM_MAX_ = 2147483647
} wush_status;

/*! wush_status_string() :
 *  @return a static, human-readable name for `status` (e.g. "WUSH_ERR_NON_FINITE"), or
 *          "WUSH_ERR_UNKNOWN" for a value that is not a wush_status. Never NULL; do not free.
 *          Thread-safe. */
WUSH_API const char* wush_status_string(wush_status status);

/*! wush_last_error() :
 *  @return the message of the most recent failure of a libwush function on the calling thread,
 *          or "" if none has failed yet. The string is owned by the library and stays valid until
 *          the next libwush call on this thread. A successful call does not clear it. */
WUSH_API const char* wush_last_error(void);

/* ================================================================================================
 * Element types and block formats
 * ==============================================================================================*/

/* Element types of dense input tensors. Values are pinned. */
typedef enum wush_dtype {
    WUSH_DTYPE_F32 = 0,  /* IEEE binary32                                   */
    WUSH_DTYPE_F16 = 1,  /* IEEE binary16                                   */
    WUSH_DTYPE_BF16 = 2, /* bfloat16 (the upper 16 bits of a binary32)      */
    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_DTYPE_ENUM_MIN_ = -2147483647 - 1,
    WUSH_DTYPE_ENUM_MAX_ = 2147483647
} wush_dtype;

/*! wush_dtype_size() :
 *  Writes the size in bytes of one element of `dtype` to *size.
 *  @return WUSH_OK, or WUSH_ERR_INVALID_ARGUMENT for an unknown dtype or NULL `size`. */
WUSH_API wush_status wush_dtype_size(wush_dtype dtype, size_t* size);

/* 4-bit block formats. All are round-to-nearest with one scale per group of G consecutive
 * elements along a row. Codes are packed two per byte: element 2k in the low nibble, element 2k+1
 * in the high nibble. Scales are stored row-major, (n_rows, d_in / G). Values are pinned.
 *
 *  format               G   element              group scale            per-tensor factor
 *  WUSH_FORMAT_MXFP4    32  E2M1                 E8M0 (1 byte)          1/3
 *  WUSH_FORMAT_NVFP4    16  E2M1                 E4M3 (1 byte)          1/10
 *  WUSH_FORMAT_INT4     32  signed midrise int4  BF16 (2 bytes, LE)     1
 *  WUSH_FORMAT_MXFP4_OCP 32 E2M1                 E8M0 (1 byte)          1
 *
 * E2M1 codes: bit 3 is the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
 * A decoded element is  element_value * scale_value * per_tensor_factor.
 *
 * Scale rules for a group with absolute maximum `amax` (computed exactly, in float64):
 *  - MXFP4 (the rule of the WUSH paper's code and the QuTLASS kernels):
 *      e = floor(log2(amax)) taken from the float's exponent bits, clamped to [-127, 127];
 *      scale = 2^e (E8M0 byte e + 127); code = RNE_e2m1(x * 3 / 2^e).
 *      The largest element maps into [3, 6), so no element saturates.
 *  - MXFP4_OCP (OCP Microscaling Formats v1.0):
 *      e = floor(log2(amax)) - 2, clamped to [-127, 127]; code = RNE_e2m1(x / 2^e), saturating
 *      at 6 (values in (6, 8) * 2^e become +-6 * 2^e).
 *  - NVFP4: s = RNE_e4m3(amax * 10 / 6), saturating at 448; code = RNE_e2m1(x * 10 / s),
 *      saturating at 6 (this happens when s rounded down).
 *  - INT4 ("INT4 with Gaussian MSE clipping" of the paper):
 *      s = RNE_bf16(2.5139305785684 * 2/15 * rms(group)); q = clamp(floor(x / s), -8, 7),
 *      stored as the 4-bit two's complement of q; the decoded value is (q + 0.5) * s.
 *      Values beyond the clipping range saturate to q = -8 or 7 (that is the clipping).
 * RNE = round to nearest, ties to even. E2M1/E4M3/E8M0 conversions agree bit for bit with
 * NVIDIA's __nv_cvt_double_to_fp4 / __nv_cvt_double_to_fp8(__NV_SATFINITE) /
 * __nv_cvt_double_to_e8m0(cudaRoundZero).
 *
 * Edge cases (all defined; none is an error):
 *  - an all-zero group gets scale byte(s) 0 (MXFP4: 2^-127, NVFP4/INT4: 0.0) and all codes 0;
 *  - zero inputs keep their sign in E2M1 (-0.0 is code 8), as NVIDIA's converter does;
 *  - subnormal inputs are quantized like any other value; a group whose MXFP4 exponent would be
 *    below -127 uses -127; an NVFP4/INT4 group whose scale rounds to 0 gets all codes 0 (the
 *    group decodes to zeros);
 *  - NaN or +-Inf anywhere in the input makes the call fail with WUSH_ERR_NON_FINITE and write
 *    nothing.
 */
typedef enum wush_format {
    WUSH_FORMAT_MXFP4 = 0,
    WUSH_FORMAT_NVFP4 = 1,
    WUSH_FORMAT_INT4 = 2,
    WUSH_FORMAT_MXFP4_OCP = 3,
    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_FORMAT_ENUM_MIN_ = -2147483647 - 1,
    WUSH_FORMAT_ENUM_MAX_ = 2147483647
} wush_format;

/*! wush_format_name() :
 *  @return a static lower-case name ("mxfp4", "nvfp4", "int4", "mxfp4_ocp"), or NULL for a value
 *          that is not a wush_format. Thread-safe. */
WUSH_API const char* wush_format_name(wush_format format);

/*! wush_format_from_name() :
 *  Parses a name as returned by wush_format_name() (case-insensitive) into *format.
 *  @return WUSH_OK, or WUSH_ERR_INVALID_ARGUMENT for NULL arguments or an unknown name. */
WUSH_API wush_status wush_format_from_name(const char* name, wush_format* format);

/*! wush_format_group_size() :
 *  Writes the group size G of `format` (32 or 16) to *group_size.
 *  @return WUSH_OK, or WUSH_ERR_INVALID_ARGUMENT for an unknown format or NULL output. */
WUSH_API wush_status wush_format_group_size(wush_format format, size_t* group_size);

/*! wush_format_tensor_factor() :
 *  Writes the per-tensor factor of `format` (1/3, 1/10 or 1, see the table above) to *factor.
 *  GEMMs fold it into their alpha. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_format_tensor_factor(wush_format format, float* factor);

/*! wush_format_scale_bytes() :
 *  Writes the size in bytes of one group scale of `format` (1, or 2 for INT4) to *bytes.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_format_scale_bytes(wush_format format, size_t* bytes);

/*! wush_format_buffer_sizes() :
 *  Computes the buffer sizes needed to quantize an n_rows x d_in matrix in `format`:
 *  *codes_bytes = n_rows * d_in / 2 and *scales_bytes = n_rows * (d_in / G) * scale bytes.
 *  Either output pointer may be NULL if that size is not wanted.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for an unknown format, d_in == 0 or d_in not a
 *          multiple of G, or a size that overflows size_t. */
WUSH_API wush_status wush_format_buffer_sizes(wush_format format, size_t n_rows, size_t d_in,
                                              size_t* codes_bytes, size_t* scales_bytes);

/* ================================================================================================
 * Contexts
 * ==============================================================================================*/

/* Where a context runs its work. Values are pinned. */
typedef enum wush_backend {
    WUSH_BACKEND_CPU = 0,
    WUSH_BACKEND_CUDA = 1,
    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_BACKEND_ENUM_MIN_ = -2147483647 - 1,
    WUSH_BACKEND_ENUM_MAX_ = 2147483647
} wush_backend;

/* A context carries the backend, its device and execution settings. Opaque. */
typedef struct wush_context wush_context;

/*! wush_context_create() :
 *  Creates a context for `backend`. For WUSH_BACKEND_CPU `device` must be 0. For
 *  WUSH_BACKEND_CUDA `device` is the CUDA device index.
 *  Ownership: on success *ctx receives a new context that the caller releases with
 *  wush_context_destroy().
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT for NULL `ctx`, an unknown backend or a bad device index;
 *          WUSH_ERR_UNSUPPORTED for WUSH_BACKEND_CUDA when the library was built without CUDA or
 *          no usable CUDA device/driver is present (the message says which);
 *          WUSH_ERR_OUT_OF_MEMORY. */
WUSH_API wush_status wush_context_create(wush_backend backend, int device, wush_context** ctx);

/*! wush_context_destroy() :
 *  Releases `ctx`. NULL is a no-op. Must not race with other calls on the same context. */
WUSH_API void wush_context_destroy(wush_context* ctx);

/*! wush_context_backend() :
 *  Writes the backend of `ctx` to *backend. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_context_backend(const wush_context* ctx, wush_backend* backend);

/* Context parameters, set with wush_context_set_parameter(). Values are pinned; retired ids are
 * never reused. */
typedef enum wush_context_parameter {
    /* Number of CPU threads the context's work may use. 0 (the default) means OpenMP's default
     * (OMP_NUM_THREADS or the number of cores). Bounds: [0, 4096]. */
    WUSH_CONTEXT_NUM_THREADS = 0,
    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_CONTEXT_PARAMETER_ENUM_MIN_ = -2147483647 - 1,
    WUSH_CONTEXT_PARAMETER_ENUM_MAX_ = 2147483647
} wush_context_parameter;

/*! wush_context_set_parameter() :
 *  Sets `param` of `ctx` to `value`.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for a bad handle, an unknown parameter or a value
 *          outside the parameter's bounds (the context is unchanged then). */
WUSH_API wush_status wush_context_set_parameter(wush_context* ctx, wush_context_parameter param,
                                                int64_t value);

/*! wush_context_get_parameter() :
 *  Writes the current value of `param` of `ctx` to *value.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_context_get_parameter(const wush_context* ctx,
                                                wush_context_parameter param, int64_t* value);

/* ================================================================================================
 * Quantizing and dequantizing rows (no transform)
 * ==============================================================================================*/

/*! wush_quantize_rows() :
 *  Quantizes the n_rows x d_in row-major matrix `x` of element type `dtype` into packed codes and
 *  group scales in `format` (see wush_format for the rules and layouts). Host memory only, for any
 *  context backend; the work runs on the CPU with the context's threads.
 *  @param codes        receives n_rows * d_in / 2 bytes (row r starts at r * d_in / 2).
 *  @param codes_bytes  size of `codes` in bytes.
 *  @param scales       receives n_rows * d_in / G scales of wush_format_scale_bytes() each.
 *  @param scales_bytes size of `scales` in bytes.
 *  n_rows == 0 is a valid no-op (the pointers may then be NULL).
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT for a bad context, dtype or format, NULL pointers (with
 *          n_rows > 0), d_in == 0 or d_in not a multiple of the format's group size;
 *          WUSH_ERR_BUFFER_TOO_SMALL if codes_bytes or scales_bytes is less than required;
 *          WUSH_ERR_NON_FINITE if `x` holds NaN or +-Inf (the message names the first row and
 *          column). On any error nothing is written to `codes` or `scales`.
 *  Thread safety: serialized per context; `x` is only read. */
WUSH_API wush_status wush_quantize_rows(wush_context* ctx, wush_format format, wush_dtype dtype,
                                        const void* x, size_t n_rows, size_t d_in, void* codes,
                                        size_t codes_bytes, void* scales, size_t scales_bytes);

/*! wush_dequantize_rows() :
 *  Decodes packed codes and scales in `format` (as written by wush_quantize_rows) into the
 *  n_rows x d_in row-major float matrix `y`: y = element * scale * per-tensor factor.
 *  @param y_count  number of floats `y` can hold (at least n_rows * d_in).
 *  n_rows == 0 is a valid no-op.
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT as for wush_quantize_rows;
 *          WUSH_ERR_BUFFER_TOO_SMALL if codes_bytes, scales_bytes or y_count is too small;
 *          WUSH_ERR_NON_FINITE if a scale is NaN or infinite (E8M0 0xFF, E4M3 0x7F/0xFF, a
 *          BF16 NaN/Inf); nothing is written to `y` then.
 *  Thread safety: serialized per context; `codes` and `scales` are only read. */
WUSH_API wush_status wush_dequantize_rows(wush_context* ctx, wush_format format, const void* codes,
                                          size_t codes_bytes, const void* scales,
                                          size_t scales_bytes, size_t n_rows, size_t d_in,
                                          float* y, size_t y_count);

/* ================================================================================================
 * Tensor files (safetensors, read-only)
 * ==============================================================================================*/

/* A validated, memory-mapped safetensors file: the input format of `wush eval` / `wush quantize`
 * (weights and activations) and the container of checkpoints. Opaque. */
typedef struct wush_tensor_file wush_tensor_file;

/*! wush_tensor_file_open() :
 *  Maps the safetensors file at `path` read-only and validates it completely before returning:
 *  the 8-byte header length (at most 100,000,000 and inside the file), a UTF-8 JSON object
 *  without duplicate keys, known dtypes, shapes whose products do not overflow, each tensor's
 *  byte span equal to its element count times its dtype size, and tensors that tile the data
 *  section exactly (no gap, no overlap) up to the end of the file.
 *  Ownership: on success *file receives a handle released with wush_tensor_file_destroy(); the
 *  mapping lives until then.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for NULL arguments; WUSH_ERR_IO if the file cannot
 *          be opened or mapped; WUSH_ERR_CORRUPT_FILE naming the first violation. */
WUSH_API wush_status wush_tensor_file_open(const char* path, wush_tensor_file** file);

/*! wush_tensor_file_destroy() : unmaps and releases `file`; NULL is a no-op. Pointers obtained
 *  from the file become invalid. */
WUSH_API void wush_tensor_file_destroy(wush_tensor_file* file);

/*! wush_tensor_file_count() :
 *  Writes the number of tensors in `file` to *count. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_tensor_file_count(const wush_tensor_file* file, size_t* count);

/*! wush_tensor_file_tensor() :
 *  Describes tensor `index` (0 <= index < count, in file order). Every output pointer may be NULL
 *  if not wanted. *name and *dtype (a safetensors dtype string such as "F32", "BF16", "U8") are
 *  NUL-terminated; *shape points to *ndim dimensions; *data points to *bytes bytes of the mapped
 *  file (little-endian, row-major, not necessarily aligned beyond what the writer chose). All
 *  pointers stay valid, read-only, until the file is destroyed.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for a bad handle or index. Thread-safe (read only). */
WUSH_API wush_status wush_tensor_file_tensor(const wush_tensor_file* file, size_t index, const char** name,
                                             const char** dtype, size_t* ndim, const uint64_t** shape,
                                             const void** data, size_t* bytes);

/*! wush_tensor_file_find() :
 *  Writes the index of the tensor called `name` to *index.
 *  @return WUSH_OK; WUSH_ERR_NOT_FOUND if there is none; WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_tensor_file_find(const wush_tensor_file* file, const char* name, size_t* index);

/*! wush_tensor_file_metadata() :
 *  Looks up `key` in the file's "__metadata__" map; *value points to a NUL-terminated string valid
 *  until the file is destroyed.
 *  @return WUSH_OK; WUSH_ERR_NOT_FOUND if the key is absent; WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_tensor_file_metadata(const wush_tensor_file* file, const char* key, const char** value);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* WUSH_WUSH_H */
