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
 *    destroyed handle to a function returns WUSH_ERR_INVALID_ARGUMENT instead of crashing, also
 *    when a new object has since been created at the destroyed one's address (a handle carries
 *    the generation of its object; the check misses only after 65,536 objects at that very
 *    address). A wush_linear whose context was destroyed is refused the same way. Handles are
 *    opaque values, not addresses to dereference.
 *  - The caller owns every bulk buffer (inputs, packed codes, scales, outputs) and passes its size
 *    in bytes or elements; a function never writes past the size it was given, and reports
 *    WUSH_ERR_BUFFER_TOO_SMALL when the size is not enough. Size queries say how much is needed.
 *  - Thread safety: distinct handles may be used from distinct threads at the same time. Calls
 *    that only read an object (documented as such) may run concurrently on one object. A
 *    wush_context is not reentrant: calls that take the same context are serialized by the
 *    library (a second thread waits), so give each thread its own context for parallel work.
 *    wush_last_error() is per thread.
 *  - fork(): a child fork()ed at any time, also while other threads are inside libwush calls,
 *    gets a return from every call, never a hang. The library's own locks are taken around the
 *    fork and made anew in the child. A context that was inside a call on another thread at the
 *    fork is refused in the child: every call given it returns WUSH_ERR_INVALID_ARGUMENT with a
 *    message naming the fork (its lock is held by a thread the child does not have, and its
 *    state may be half-updated); wush_context_destroy() releases its handle but not its memory.
 *    Create a new context in the child. Every other context works there. The CPU runtime
 *    (wush_quantize_activations, wush_gemm, wush_linear_forward, the wush_linear_* prepared
 *    layers) runs on libwush's own thread pool, which is reset in the child (new threads of its
 *    own; a context set to WUSH_CONTEXT_OPENMP_TEAM uses them too there, not OpenMP's).
 *    Calibration, transform building, weight quantization (wush_qweight_create,
 *    wush_layer_quantize, wush_quantize_rows, GPTQ) and the reference evaluation (wush_layer_loss)
 *    use OpenMP and OpenMP-built BLAS, whose worker threads a thread keeps for its next parallel
 *    region (libgomp): in the child the thread that called fork() has none, so there libwush
 *    runs that work on one thread (threads the child creates run it on the context's threads).
 *    For parallel OpenMP work in worker processes, start them with exec/spawn (Python:
 *    multiprocessing.set_start_method("spawn") or "forkserver"), or call from a thread the
 *    child creates.
 *
 * Layouts (framework conventions, as PyTorch's nn.Linear): a weight W is d_out x d_in row-major,
 * activations X are n_tokens x d_in row-major, the layer output is Y = X W^T. Quantization groups
 * run along d_in; the group size G divides d_in.
 *
 * ------------------------------------------------------------------------------------------------
 * Stability
 * ------------------------------------------------------------------------------------------------
 * Stable, covered by the ABI promise (docs/API.md): everything in this header not marked
 * "Experimental". Within one SONAME major version (libwush.so.<WUSH_VERSION_MAJOR>) no function
 * is removed or changes its signature, no enumerator changes its value (enums only grow), and a
 * documented behaviour changes only to fix a defect.
 *
 * Experimental: the parts marked "Experimental:" in their comment. Their declarations are held
 * by the same ABI check (a program built against them keeps linking and running within a major
 * version), but what they do may change in any release: defaults, the candidates and the rules
 * they choose by, the layer they return, their cost. A later major version may remove them.
 *   - the per-block search and its guard: WUSH_OPTION_SEARCH, WUSH_OPTION_SEARCH_TOKENS,
 *     WUSH_OPTION_SEARCH_GUARD, wush_options_sample_size(), the calibrator's token and validation
 *     samples (wush_calibrator_set_sample_size(), _sample_count(), _set_validation_size(),
 *     _add_validation(), _validation_count()), the sequence and document marks
 *     (wush_calibrator_add_sequences(), wush_calibrator_add_document()), the "+s" of wush_transform_spec_from_name(), and the
 *     guard's report (wush_guard_source, wush_guard_candidate, wush_transform_guard(),
 *     wush_transform_guard_candidate(), wush_transform_guard_undecided());
 *   - the CUDA backend's own parts: WUSH_BACKEND_CUDA contexts (the module, its kernels and
 *     their selection), wush_context_set_stream() / wush_context_get_stream() with a CUDA
 *     stream, the environment variable WUSH_CUDA_MODULE, and the kernel switches
 *     WUSH_CONTEXT_CUDA_* (context parameters from 1000 up, see wush_context_parameter);
 *   - the prepared layer's split run and its report: wush_linear_run_quantized() and
 *     wush_linear_last_kernels() (the kernel names it writes follow the CUDA backend's kernels).
 *
 * This header states contracts: behaviour, errors, ownership, costs in O-terms. Measured figures
 * (times, ratios, bandwidths) are in docs/PERFORMANCE.md and docs/EVAL.md;
 * tests/repo/check_header_figures.py keeps them out of this header.
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
#define WUSH_VERSION_MINOR 3
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
 *          the next libwush call on this thread. A successful call does not clear it. The text
 *          is valid UTF-8 whose only control characters are line breaks and tabs; a path it
 *          quotes has all of its control characters, line breaks included, written as a
 *          backslash, 'x' and two lower-case hexadecimal digits (an escape character as the four
 *          characters of "\\x1b" in C), so that printing the message cannot act on a terminal or
 *          forge a line. */
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
 *    nothing;
 *  - the largest finite inputs: MXFP4 refuses (WUSH_ERR_NON_FINITE, nothing written) an element
 *    with |x| > 5/3 * 2^127 (about 2.836e38, up to +-FLT_MAX): under the largest scale 2^127
 *    (byte 0xFE) it would get E2M1 code 6, whose value 6 * 2^127 / 3 = 2^128 no float holds, so
 *    dequantizing it would fail. Elements up to 5/3 * 2^127 get code 4 (a tie at 5/3 * 2^127
 *    rounds to even, 4) and decode to +-4 * 2^127 / 3. wush_quantize_activations() applies the
 *    same rule to the transformed values on a CPU context (WUSH_ERR_NON_FINITE; the buffers may
 *    have been written); a CUDA context does not yet check it. MXFP4_OCP, NVFP4 and INT4 accept every
 *    finite input, and what they write dequantizes to finite values (+-FLT_MAX decodes to
 *    +-6 * 2^125 in MXFP4_OCP and saturates at +-6 * 448 / 10 in NVFP4).
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
WUSH_API wush_status wush_format_buffer_sizes(wush_format format, size_t n_rows, size_t d_in, size_t* codes_bytes,
                                              size_t* scales_bytes);

/* ================================================================================================
 * Contexts
 * ==============================================================================================*/

/* Where a context runs its work. Values are pinned. Experimental: WUSH_BACKEND_CUDA (see
 * "Stability" at the top). */
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
 *  WUSH_BACKEND_CUDA `device` is the CUDA device index. Experimental: the CUDA backend and its
 *  module lookup (see "Stability").
 *  The CUDA backend is a separate shared object, libwush-cuda.so, which libwush opens the first
 *  time a CUDA context is asked for (libwush itself links no CUDA library, so it loads on machines
 *  without one). It is looked for at the path in the environment variable WUSH_CUDA_MODULE when
 *  that is set and not empty (there only; ignored in a set-user-ID or set-group-ID process), else
 *  beside libwush.so, else in the folders the dynamic loader searches for libwush's own
 *  libraries (libwush's DT_RPATH, LD_LIBRARY_PATH, its DT_RUNPATH, the default folders; not the
 *  loader cache); it must come from the same build as libwush. A value without a '/' is a bare
 *  file name, looked for in those folders. Every copy is checked before it is handed to the
 *  loader (the library walks the folders itself, so that no path reaches dlopen() unchecked): a
 *  regular file, an ELF shared object for this machine whose headers and segments lie inside the
 *  file, and whose SHA-256 equals the one its build or install recorded beside it in
 *  `<module>.sha256` (a regular file of at most 4 KiB, opened without blocking); a truncated,
 *  damaged or replaced module, or a FIFO, is refused with WUSH_ERR_UNSUPPORTED and the reason (a
 *  refused copy in a search folder is passed over for the next). Once loaded it stays loaded.
 *  Ownership: on success *ctx receives a new context that the caller releases with
 *  wush_context_destroy().
 *  Thread safety: may be called from any thread; loading the module is serialized internally.
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT for NULL `ctx`, an unknown backend or a bad device index;
 *          WUSH_ERR_UNSUPPORTED for WUSH_BACKEND_CUDA when the module cannot be loaded (the
 *          message gives each path tried and the loader's reason, or why the module found is not
 *          this build's), no usable CUDA device/driver is present (the message says which), or
 *          the device's compute capability is below 8.0 (sm_80; the message names it);
 *          WUSH_ERR_CUDA when the device cannot be initialized;
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
     * (OMP_NUM_THREADS or the number of cores). Bounds: [0, 4096]. A value above the number of
     * processors the process may run on when it is set counts as that number (read again only
     * when the parameter is set again). */
    WUSH_CONTEXT_NUM_THREADS = 0,
    /* Which SIMD kernels the CPU runtime (wush_quantize_activations, wush_gemm,
     * wush_linear_forward) uses: a wush_cpu_isa value (see "Runtime"). 0, the default,
     * (WUSH_CPU_ISA_AUTO) picks the fastest the CPU supports. Setting an ISA this CPU cannot run
     * fails with WUSH_ERR_UNSUPPORTED and leaves the context unchanged. (The transform search,
     * WUSH_OPTION_SEARCH, uses the fastest the CPU supports whatever this says: its results are
     * the same bits on every ISA.) */
    WUSH_CONTEXT_CPU_ISA = 1,
    /* 1: the CPU runtime (wush_quantize_activations, wush_gemm, wush_linear_forward, the
     * wush_linear_* prepared layers) runs its parallel work on the process's OpenMP threads (the
     * calling thread starts an OpenMP team of WUSH_CONTEXT_NUM_THREADS threads), for a host that
     * runs OpenMP itself, as PyTorch does: the host's workers, which spin for a while after each
     * of its operations, then run the library's work instead of competing for the cores with
     * libwush's own threads. The runtime looks up the OpenMP runtime already in the process
     * (the global symbol GOMP_parallel, which GNU, LLVM and Intel OpenMP export), so it joins
     * the host's copy. It uses its own pool instead inside an OpenMP parallel region, in a child
     * fork()ed after the first such call, and where no OpenMP runtime is loaded; and per kind
     * and size of job it keeps timing both ways (each tried now and then) and runs a job on its
     * own pool while that is the faster (a machine busy with other processes, where an OpenMP
     * team waits for members the OS does not run). 0 (the default): libwush's own pool.
     * Results are the same bits either way. Bounds: [0, 1]. */
    WUSH_CONTEXT_OPENMP_TEAM = 2,

    /* ---- Experimental: the CUDA backend's kernel switches (ids from 1000 up) ----
     * Experimental (see "Stability"): ids in this range may change meaning or go in any release.
     * Each switches on kernels that are not the CUDA backend's default choice, for measurement
     * (docs/RUNTIME.md, "Kernels and dispatch", says what each selects; docs/PERFORMANCE.md what
     * is measured). A layer reads them when it is prepared (wush_linear_create): changing one
     * later leaves prepared layers as they are. The per-call functions (wush_quantize_activations,
     * wush_gemm, wush_linear_forward and their workspace queries) read them at each call. A CPU
     * context accepts them (same bounds) and ignores them, so that one program can set them
     * whatever its backend. All default to 0 (off). */
    /* From this many tokens on (and above 32), sm_80+ GPUs run the INT8 tensor-core prefill GEMM
     * for every format (by default only INT4 from 128 tokens does); a value of 1 to 32 means 33.
     * 0: off. Bounds: [0, 2147483647]. */
    WUSH_CONTEXT_CUDA_PREFILL_MIN_M = 1000,
    /* 1: above 32 tokens, sm_100 / sm_120 GPUs run cuBLASLt's block-scaled FP4 GEMM (MXFP4,
     * NVFP4) where cuBLASLt offers an algorithm; the exact reference path otherwise. Bounds:
     * [0, 1]. */
    WUSH_CONTEXT_CUDA_BLOCKSCALED = 1001,
    /* 1: up to 32 tokens, sm_80+ GPUs run the streaming decode GEMM kernel (same bits as the
     * default decode kernel; the prepared layer keeps a restaged copy of the weight). Bounds:
     * [0, 1]. */
    WUSH_CONTEXT_CUDA_STREAM_DECODE = 1002,
    /* 1: above 32 tokens, the E2M1 formats on sm_80+ run a BF16 tensor-core GEMM that converts
     * the weight codes in registers (no bias: a forward with a bias keeps the reference path).
     * Bounds: [0, 1]. */
    WUSH_CONTEXT_CUDA_BF16_PREFILL = 1003,
    /* 1: from 17 tokens on, sm_80+ GPUs quantize BF16 and F16 activations with a matrix
     * transform on tensor cores (same bytes as the CUDA-core kernels), once an accumulator probe,
     * run on the device at the first such prepare, passes; the CUDA-core kernels otherwise.
     * Bounds: [0, 1]. */
    WUSH_CONTEXT_CUDA_TC_QUANTIZE = 1004,

    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_CONTEXT_PARAMETER_ENUM_MIN_ = -2147483647 - 1,
    WUSH_CONTEXT_PARAMETER_ENUM_MAX_ = 2147483647
} wush_context_parameter;

/*! wush_context_set_parameter() :
 *  Sets `param` of `ctx` to `value`.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for a bad handle, an unknown parameter or a value
 *          outside the parameter's bounds (the context is unchanged then). */
WUSH_API wush_status wush_context_set_parameter(wush_context* ctx, wush_context_parameter param, int64_t value);

/*! wush_context_get_parameter() :
 *  Writes the current value of `param` of `ctx` to *value.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_context_get_parameter(const wush_context* ctx, wush_context_parameter param, int64_t* value);

/*! wush_context_set_stream() :
 *  Experimental (the CUDA backend, see "Stability").
 *  Sets the queue the context's launches go to. For a CUDA context `stream` is a cudaStream_t
 *  (passed as void*; NULL = the CUDA default stream), which the caller creates and must keep
 *  alive while the context uses it; the context never destroys it. A CPU context has no queue and
 *  accepts only NULL. Launches already enqueued are not moved.
 *  Order across a switch (CUDA): the context's launches share device state (cuBLAS's workspace,
 *  the NaN/Inf flag), so switching from one stream to another makes the new stream wait for
 *  everything enqueued on the old one so far (an event recorded on the old stream; no host wait).
 *  Not when either stream is capturing a graph (a wait on an event from outside the capture would
 *  break it): a caller that moves a context into or out of a capture orders the streams itself,
 *  e.g. captures on a stream forked from the old one by an event. Work the caller enqueues on the
 *  old stream after the switch is not ordered.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handle, non-NULL stream on a CPU context);
 *          WUSH_ERR_CUDA (the event could not be recorded or waited on).
 *  Thread safety: serialized per context. */
WUSH_API wush_status wush_context_set_stream(wush_context* ctx, void* stream);

/*! wush_context_get_stream() : writes the context's stream (NULL for a CPU context or the CUDA
 *  default stream) to *stream. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. Experimental, as
 *  wush_context_set_stream(). */
WUSH_API wush_status wush_context_get_stream(const wush_context* ctx, void** stream);

/*! wush_context_synchronize() :
 *  Waits until every launch enqueued on the context's stream has finished (a no-op on a CPU
 *  context), and reports an error a launch found on the device after it returned.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT; WUSH_ERR_NON_FINITE (NaN/Inf in the activations of
 *          an earlier wush_linear_quantize / wush_linear_run; the message names the first row and
 *          column; the error is cleared once reported); WUSH_ERR_CUDA (the message has the CUDA
 *          runtime's text). Thread safety: serialized per context. */
WUSH_API wush_status wush_context_synchronize(wush_context* ctx);

/*! wush_context_describe() :
 *  Writes a NUL-terminated description of the context's backend to `text` (`text_bytes` bytes),
 *  e.g. "cpu (avx2)" or "cuda:0 (NVIDIA H100 80GB HBM3, sm_90, driver 13000)".
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT; WUSH_ERR_BUFFER_TOO_SMALL (nothing written; 256
 *          bytes are always enough). */
WUSH_API wush_status wush_context_describe(const wush_context* ctx, char* text, size_t text_bytes);

/* ================================================================================================
 * Quantizing and dequantizing rows (no transform)
 * ==============================================================================================*/

/*! wush_quantize_rows() :
 *  Quantizes the n_rows x d_in row-major matrix `x` of element type `dtype` into packed codes and
 *  group scales in `format` (see wush_format for the rules and layouts). Host memory on every
 *  backend (a CUDA context too: this is a host utility, not a launch); the work runs on the CPU
 *  with the context's threads.
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
WUSH_API wush_status wush_quantize_rows(wush_context* ctx, wush_format format, wush_dtype dtype, const void* x,
                                        size_t n_rows, size_t d_in, void* codes, size_t codes_bytes, void* scales,
                                        size_t scales_bytes);

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
WUSH_API wush_status wush_dequantize_rows(wush_context* ctx, wush_format format, const void* codes, size_t codes_bytes,
                                          const void* scales, size_t scales_bytes, size_t n_rows, size_t d_in, float* y,
                                          size_t y_count);

/* ================================================================================================
 * Options and progress
 * ==============================================================================================*/

/*! wush_progress_fn :
 *  Called by long operations (transform building, quantization of a layer, loss evaluation) with
 *  the fraction done in [0, 1], from the calling thread. Return 0 to continue, non-zero to stop:
 *  the operation then fails with WUSH_ERR_CANCELLED and produces nothing. Must not call libwush
 *  functions on the same objects. */
typedef int (*wush_progress_fn)(void* user_data, double fraction);

/* Settings of the transform and quantization builders. Opaque; a NULL options pointer means all
 * defaults. Not thread-safe to modify while in use; const use from several threads is safe. */
typedef struct wush_options wush_options;

/* Option ids. Values are pinned; retired ids are never reused. */
typedef enum wush_option {
    /* double, default 0.01, bounds [0, 1e6]: the damping lambda of Algorithm 1 (and of GPTQ's
     * Hessian unless WUSH_OPTION_HESSIAN_DAMPING is set): each moment M gets lambda * tr(M) / G
     * added to its diagonal. */
    WUSH_OPTION_DAMPING = 0,
    /* int, default 0, bounds [0, 2^62]: seed of WUSH_TRANSFORM_RANDOM rotations. */
    WUSH_OPTION_SEED = 1,
    /* int, default WUSH_DTYPE_F32: the precision the activation transforms are rounded to when
     * built (WUSH_DTYPE_F32, WUSH_DTYPE_BF16 or WUSH_DTYPE_F16). The weight side is always derived
     * from the rounded matrices, so the unquantized product stays exact. Use BF16 for transforms
     * that a bf16 runtime (or the fp_quant export) will apply. On a CPU with AVX2 or AVX-512, a
     * prepared layer (wush_linear_create) of such a transform keeps its matrices as bf16 pairs as
     * well (half their float32 size): calls of a few tokens read those, and with AVX512_BF16 many
     * BF16 tokens quantize with the bf16 dot product (the same bytes as the float path). */
    WUSH_OPTION_TRANSFORM_DTYPE = 2,
    /* Experimental (see "Stability").
     * int, default 0, bounds {0, 1}: 1 = per-block search over WUSH's free parameters (the CLI's
     * transform `wush+s`). Algorithm 1 fixes a block's transform only up to a positive scale, the
     * signs of its singular vectors and an orthogonal mixing, which leave the exact product
     * unchanged but not what a 4-bit quantizer does. The search gives each WUS/WUSH block the
     * best of those choices (scales; sign patterns for MXFP4 and INT4, rotations for NVFP4) and
     * of the identity, Hadamard and random-rotation blocks, scored by the block's output error
     * with both operands quantized in the target format on WUSH_OPTION_SEARCH_TOKENS tokens (the
     * calibrator's token sample when it keeps one, else a Gaussian with the block's moment); a
     * winner must also score lower on each half of those tokens. The choice is folded into the
     * stored matrices and is seeded (WUSH_OPTION_SEED). It needs the format, so it applies only
     * through wush_layer_quantize() (wush_transform_build() refuses it; I, H and R have nothing
     * to search: every function taking options refuses a search of them). A per-layer guard
     * then compares the searched layer with plain WUSH and the I, H and R layers (same method
     * and seed) on held-out tokens, by the rule WUSH_OPTION_SEARCH_GUARD states: the validation
     * tokens (wush_calibrator_set_validation_size) when there are any, else, by default, half of
     * the calibrator's token sample. So the result may be plain WUSH or a data-free transform
     * (its kind says which). Candidates and rules: docs/EVAL.md, "The per-block search". */
    WUSH_OPTION_SEARCH = 3,
    /* Experimental (see "Stability").
     * int, default 256, bounds [16, 65536]: the search's sample size, in tokens per block (at most
     * as many as the calibrator's token sample holds, when it keeps one). Cost and noise trade
     * here: each candidate's score costs O((tokens + 256) G^2) per block (256 weight rows), so the
     * search's time grows linearly with the tokens, and fewer tokens make its choices noisier.
     * From 4096 real tokens up (the calibrator's token sample holding that many), MXFP4 and INT4
     * also search 16 sign patterns instead of 2 (25 scored candidates per block instead of 11),
     * which pays on held-out tokens only with that many. The Gaussian surrogate keeps 2 sign
     * patterns at any size. Measured gains: docs/EVAL.md; build times: docs/PERFORMANCE.md. */
    WUSH_OPTION_SEARCH_TOKENS = 4,
    /* Experimental (see "Stability").
     * int, default 1, bounds {0, 1}: the search's per-layer guard (WUSH_OPTION_SEARCH) when the
     * calibrator holds no validation tokens. With 1, half of the calibrator's token sample is
     * held out: whole sequences when the tokens were added as sequences
     * (wush_calibrator_add_sequences) and the sample holds at least two, each at least 32 tokens
     * a side (the sequences in an order seeded by WUSH_OPTION_SEED, each going to the half with
     * fewer tokens so far; WUSH_GUARD_HOLD_OUT_SEQUENCES), whole documents the same way when
     * they were added as documents (wush_calibrator_add_document; WUSH_GUARD_HOLD_OUT_DOCUMENTS,
     * where the data-aware layers are scored as built from the other documents' sampled
     * tokens alone), else every second token of the sample
     * (a random half; WUSH_GUARD_HOLD_OUT). The search scores the other half, and the searched
     * layer competes on the held-out half with plain WUSH (Algorithm 1, unsearched), plain WUSH
     * with both moments shrunk halfway to isotropic (damping max(WUSH_OPTION_DAMPING, 1):
     * M + tr(M)/G I, which can hold on text unlike the calibration text where the default damping
     * over-fits; WUSH_GUARD_SHRUNK) and the identity, Hadamard and random layers built by the
     * same method. An alternative replaces it only when its layer loss there is below 0.99 times the searched layer's and lower by more
     * than two standard errors of the per-token differences (or, under the sequence hold-out with
     * at least 8 held-out sequences, of the per-sequence sums of those differences, which a few
     * heavy tokens per sequence do not swamp), so noise keeps the searched layer;
     * a candidate lower by the margin but inside the noise makes the layer undecided
     * (wush_transform_guard_undecided), which is reported, not hidden.
     * Needs at least 64 sample tokens (else no guard); size the sample with
     * wush_options_sample_size(). 0 turns
     * the default guard off (validation tokens, when given, are still used, by the same rule).
     * The layer losses compared are over a fixed subset of the output rows when the layer has
     * 2048 or more (k = d_out / 512; rows i * k + i % k for i < d_out / k, about 512 of them),
     * else over every row; the kept layer is returned whole. It costs six held-out layer losses
     * and the alternatives' builds (RTN: the plain transform comes with the search, and the
     * alternatives' weights are quantized on the scored rows, on every row only when kept;
     * GPTQ: plain and shrunk GPTQ-WUSH built whole, I, H and R built on the scored rows, all
     * sharing one inverse Hessian factor, so the O(d_in^3) factorization is paid once); build
     * times: docs/PERFORMANCE.md.
     * wush_transform_guard() reports what it compared and kept. The plain `wush` transform (no
     * search) is Algorithm 1 and never guarded. */
    WUSH_OPTION_SEARCH_GUARD = 5,
    /* double, default: WUSH_OPTION_DAMPING's value, bounds [0, 1e6]: GPTQ's Hessian damping
     * alone (H gets lambda_H * tr(H) / d_in added to its diagonal, raised tenfold up to 3 times
     * when still not positive definite), so that the transform's moments and the Hessian can be
     * damped apart. Reading it before it is set gives WUSH_OPTION_DAMPING's current value. RTN
     * ignores it. The search's guard builds its shrunk candidate (WUSH_GUARD_SHRUNK) this way:
     * the transform damped more, the Hessian as the options say. */
    WUSH_OPTION_HESSIAN_DAMPING = 6,
    WUSH_OPTION_ENUM_MIN_ = -2147483647 - 1,
    WUSH_OPTION_ENUM_MAX_ = 2147483647
} wush_option;

/*! wush_options_create() : a new options object holding the defaults; release it with
 *  wush_options_destroy(). @return WUSH_OK, WUSH_ERR_INVALID_ARGUMENT (NULL) or OUT_OF_MEMORY. */
WUSH_API wush_status wush_options_create(wush_options** options);

/*! wush_options_destroy() : releases `options`; NULL is a no-op. */
WUSH_API void wush_options_destroy(wush_options* options);

/*! wush_options_set_double() / wush_options_set_int() :
 *  Sets a double- or integer-valued option.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for a bad handle, an unknown id, an option of the
 *          other type, or a value outside its bounds (NaN included); the options are unchanged
 *          then. */
WUSH_API wush_status wush_options_set_double(wush_options* options, wush_option option, double value);
WUSH_API wush_status wush_options_set_int(wush_options* options, wush_option option, int64_t value);

/*! wush_options_get_double() / wush_options_get_int() : read an option's current value.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT (bad handle, id or type). */
WUSH_API wush_status wush_options_get_double(const wush_options* options, wush_option option, double* value);
WUSH_API wush_status wush_options_get_int(const wush_options* options, wush_option option, int64_t* value);

/*! wush_options_set_progress() : installs (or, with fn == NULL, removes) a progress callback.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_options_set_progress(wush_options* options, wush_progress_fn fn, void* user_data);

/*! wush_options_sample_size() :
 *  Experimental (the search, see "Stability").
 *  Writes to *tokens the token sample a calibrator needs for wush_layer_quantize() with these
 *  options (wush_calibrator_set_sample_size): 0 without WUSH_OPTION_SEARCH; else
 *  WUSH_OPTION_SEARCH_TOKENS, doubled when the default guard (WUSH_OPTION_SEARCH_GUARD) holds out
 *  half of it. The one rule a client needs so that the search and the calibrator agree.
 *  `options` may be NULL (the defaults). Thread safety: reads the options only.
 *  @return WUSH_OK, or WUSH_ERR_INVALID_ARGUMENT for a bad handle or NULL `tokens`. */
WUSH_API wush_status wush_options_sample_size(const wush_options* options, size_t* tokens);

/* ================================================================================================
 * Calibration: streaming second moments of a layer's input activations
 * ==============================================================================================*/

typedef struct wush_calibrator wush_calibrator;

/* What a calibrator accumulates. Values are pinned. */
typedef enum wush_moment_mode {
    /* the C = d_in / G diagonal G x G blocks: all that WUSH with RTN needs */
    WUSH_MOMENTS_BLOCK_DIAGONAL = 1,
    /* the whole d_in x d_in moment (the GPTQ Hessian); its diagonal blocks serve WUSH too */
    WUSH_MOMENTS_FULL = 2,
    WUSH_MOMENTS_ENUM_MIN_ = -2147483647 - 1,
    WUSH_MOMENTS_ENUM_MAX_ = 2147483647
} wush_moment_mode;

/*! wush_calibrator_create() :
 *  Creates an empty calibrator for activations of width d_in, grouped in blocks of group_size
 *  (a power of two, at most 256, dividing d_in; use wush_format_group_size() of the target format).
 *  Ownership: release with wush_calibrator_destroy().
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for bad sizes, mode or NULL; WUSH_ERR_OUT_OF_MEMORY
 *          (a full-mode calibrator holds d_in^2 doubles). */
WUSH_API wush_status wush_calibrator_create(size_t d_in, size_t group_size, wush_moment_mode mode,
                                            wush_calibrator** calibrator);

/*! wush_calibrator_destroy() : releases `calibrator`; NULL is a no-op. */
WUSH_API void wush_calibrator_destroy(wush_calibrator* calibrator);

/*! wush_calibrator_add() :
 *  Adds n_tokens x d_in row-major activations `x` of `dtype` to the sums, in float64. On a CPU
 *  context `x` is host memory (BLAS-3 over token tiles, with the context's threads); on a CUDA
 *  context `x` is device memory: the moments of the batch are computed on the device in float64
 *  and added to the calibrator before the call returns (it synchronizes the context's stream).
 *  Both give the same sums to float64 rounding (1e-9 relative or better).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for bad handles/pointers, n_tokens == 0 or a bad
 *          dtype; WUSH_ERR_NON_FINITE if `x` holds NaN/Inf — the calibrator is then unchanged.
 *  Thread safety: modifies `calibrator`; do not share it between threads without a lock. */
WUSH_API wush_status wush_calibrator_add(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                         const void* x, size_t n_tokens);

/*! wush_calibrator_add_sequences() :
 *  Experimental (the search, see "Stability").
 *  wush_calibrator_add() of n_tokens tokens that are n_tokens / sequence_length whole sequences
 *  (documents, or a forward's batch rows) of sequence_length tokens each, back to back: the same
 *  sums and count, and the token sample (wush_calibrator_set_sample_size) remembers which
 *  sequence each sampled token came from. A sequence's id is a hash of its tokens in order, so
 *  it does not depend on batch order or sharding either; it travels inside the sampled token's
 *  priority (bit 20 set, bit 19 clear, bits 0-18 the sequence hash, the top 32 bits the token's
 *  own hash), so
 *  merges and exported states (any layout version) keep it. The search's default guard
 *  (WUSH_OPTION_SEARCH_GUARD) then holds out whole sequences (WUSH_GUARD_HOLD_OUT_SEQUENCES)
 *  when every sampled token carries an id and there are at least two sequences. A batch whose
 *  rows are sequences of different lengths takes one call per sequence.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for wush_calibrator_add()'s reasons, or a
 *          sequence_length of 0 or one that does not divide n_tokens; WUSH_ERR_NON_FINITE as
 *          wush_calibrator_add(). The calibrator is unchanged on any error.
 *  Thread safety: modifies `calibrator`; do not share it between threads without a lock. */
WUSH_API wush_status wush_calibrator_add_sequences(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                                   const void* x, size_t n_tokens, size_t sequence_length);

/*! wush_calibrator_add_document() :
 *  Experimental (the search, see "Stability").
 *  wush_calibrator_add() of n_tokens tokens that all belong to one document (text from one
 *  source: a file, a page, a conversation), which the caller names by `document`, any 64-bit
 *  id (every uint64_t value, 0 to UINT64_MAX, is valid, and none is reserved; a binding from a
 *  language with signed or unbounded integers refuses values outside [0, 2^64) rather than
 *  wrapping them, since -1 and UINT64_MAX would then name one document): the same sums and
 *  count, and the token sample remembers each sampled token's document.
 *  The windows of one document may come in several calls (batches, shards, in any order) with
 *  the same id: they are then one document. The id travels inside the sampled token's priority
 *  like wush_calibrator_add_sequences()'s (bit 20 set, bit 19 set, bits 0-18 a hash of
 *  `document`), so merges and exported states keep it. The search's default guard
 *  (WUSH_OPTION_SEARCH_GUARD) then holds out whole documents (WUSH_GUARD_HOLD_OUT_DOCUMENTS)
 *  when every sampled token was added this way and there are at least two documents; and since
 *  documents the moments saw cannot show a transform that fits the calibration documents only,
 *  the guard scores the searched and plain layers as built from the other documents' sampled
 *  tokens alone (a cross-fit; the layer kept is built from every token, a searched one with the
 *  per-block choices the cross-fit's search made, so the search runs once).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for wush_calibrator_add()'s reasons;
 *          WUSH_ERR_NON_FINITE as wush_calibrator_add(). The calibrator is unchanged on any error.
 *  Thread safety: modifies `calibrator`; do not share it between threads without a lock. */
WUSH_API wush_status wush_calibrator_add_document(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                                  const void* x, size_t n_tokens, uint64_t document);

/*! wush_calibrator_merge() :
 *  Adds the sums and token count of `from` into `into` (same d_in, group size and mode): the
 *  result equals one calibrator that saw both streams. `from` is unchanged.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT (bad handles, geometry mismatch, into == from). */
WUSH_API wush_status wush_calibrator_merge(wush_calibrator* into, const wush_calibrator* from);

/*! wush_calibrator_token_count() : writes the number of tokens seen to *n_tokens. */
WUSH_API wush_status wush_calibrator_token_count(const wush_calibrator* calibrator, uint64_t* n_tokens);

/*! wush_calibrator_second_moment() :
 *  Copies M_X = X_b^T X_b / n_tokens of diagonal block `block` (G x G row-major float64) to `m`,
 *  which holds `count` doubles (at least G * G).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad block, no tokens yet);
 *          WUSH_ERR_BUFFER_TOO_SMALL. */
WUSH_API wush_status wush_calibrator_second_moment(const wush_calibrator* calibrator, size_t block, double* m,
                                                   size_t count);

/*! wush_calibrator_state_size() :
 *  Writes the number of doubles of the calibrator's exported state to *n_doubles.
 *
 *  State layout (version 1), for distributed calibration: a flat array of doubles
 *    [0] r            replica count: 1 in a fresh export
 *    [1] r * 1        layout version
 *    [2] r * mode     wush_moment_mode value
 *    [3] r * d_in
 *    [4] r * G
 *    [5] tokens       token count (exact up to 2^53)
 *    [6 ...]          sums: BLOCK_DIAGONAL: C blocks of G x G row-major, block after block;
 *                     FULL: d_in x d_in row-major (both triangles).
 *  An elementwise SUM of the exports of R calibrators with the same geometry (MPI_Allreduce,
 *  ncclAllReduce on float64) is a valid state of R replicas: importing it gives the merged
 *  calibrator (the header fields are divided by r and checked). */
WUSH_API wush_status wush_calibrator_state_size(const wush_calibrator* calibrator, size_t* n_doubles);

/*! wush_calibrator_export_state() :
 *  Writes the state (layout above) to `state`, which holds `n_doubles` doubles.
 *  @return WUSH_OK; WUSH_ERR_BUFFER_TOO_SMALL; WUSH_ERR_INVALID_ARGUMENT. Read-only on the
 *          calibrator. */
WUSH_API wush_status wush_calibrator_export_state(const wush_calibrator* calibrator, double* state, size_t n_doubles);

/*! wush_calibrator_import_state() :
 *  Replaces the calibrator's sums and count by the (possibly all-reduced) state `state` of
 *  exactly the calibrator's state size. The state's geometry must equal the calibrator's.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for a size, version, geometry or replica-count
 *          mismatch or non-finite sums — the calibrator is then unchanged. */
WUSH_API wush_status wush_calibrator_import_state(wush_calibrator* calibrator, const double* state, size_t n_doubles);

/*! wush_calibrator_set_sample_size() :
 *  Experimental (the search, see "Stability"), as are the four functions after it.
 *  Makes the calibrator keep a bounded sample of up to n_tokens of its calibration tokens
 *  (n_tokens x d_in floats of memory; 0 keeps none, the default), which WUSH_OPTION_SEARCH then
 *  scores its candidates on instead of a Gaussian surrogate drawn from the moments. Bottom-k
 *  sampling: each token's priority is a hash of its float32 values and the sample is the
 *  n_tokens tokens of lowest priority, so it is a uniform sample without replacement that does
 *  not depend on batch order or sharding — wush_calibrator_merge() of shards gives exactly the
 *  sample of one calibrator that saw every token. With a sample, the exported state is layout
 *  version 2: the version-1 layout (with [1] = 2) followed by [k, m, k priorities, k x d_in
 *  values] (the first m entries used, ascending priority). A sample does not add, so a version-2
 *  state must not be SUM-all-reduced: gather the states, import each into a calibrator and merge
 *  (import rejects a summed version-2 state). Version-1 states still import, with an empty sample.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handle, tokens already added, n_tokens > 65536);
 *          WUSH_ERR_OUT_OF_MEMORY.
 *  Thread safety: modifies `calibrator`. */
WUSH_API wush_status wush_calibrator_set_sample_size(wush_calibrator* calibrator, size_t n_tokens);

/*! wush_calibrator_sample_count() : writes the number of tokens in the sample (<= its size) to
 *  *n_tokens. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. Thread-safe (read only). */
WUSH_API wush_status wush_calibrator_sample_count(const wush_calibrator* calibrator, size_t* n_tokens);

/*! wush_calibrator_set_validation_size() :
 *  Makes the calibrator keep a bounded sample of up to n_tokens *validation* tokens
 *  (n_tokens x d_in floats of memory; 0 keeps none, the default): tokens of documents held out
 *  from calibration, given with wush_calibrator_add_validation(). They never enter the moments or
 *  the token count. With them, the per-layer guard of WUSH_OPTION_SEARCH in
 *  wush_layer_quantize() scores its candidates on the validation tokens (the rule is
 *  WUSH_OPTION_SEARCH_GUARD's) — a check the search's own token sample cannot make, since it
 *  comes from the documents the transform was fitted to. Sampled by the same bottom-k rule as
 *  the token sample (independent of batch order and sharding). With a validation sample the
 *  exported state is layout version 3: version 2's layout (with [1] = 3 and the token sample's
 *  [k, m, ...] block present even for k = 0, as [0, 0]) followed by the validation sample's
 *  [k, m, k priorities, k x d_in values]; like version 2 it must not be SUM-all-reduced.
 *  Version-1 and -2 states still import, with an empty validation sample.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handle, validation tokens already added,
 *          n_tokens > 65536); WUSH_ERR_OUT_OF_MEMORY.
 *  Thread safety: modifies `calibrator`. */
WUSH_API wush_status wush_calibrator_set_validation_size(wush_calibrator* calibrator, size_t n_tokens);

/*! wush_calibrator_add_validation() :
 *  Offers n_tokens x d_in row-major activations `x` of `dtype` (host memory on a CPU context,
 *  device memory on a CUDA context, as for wush_calibrator_add()) to the validation sample. Give
 *  it tokens of whole documents (or batches) that wush_calibrator_add() did not see: a guard
 *  scored on tokens of the fitted documents cannot tell a transform that fits those documents
 *  from one that generalizes.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles or pointers, n_tokens == 0, a bad
 *          dtype, no validation sample: set its size first); WUSH_ERR_NON_FINITE (NaN/Inf in `x`;
 *          the calibrator is then unchanged).
 *  Thread safety: modifies `calibrator`. */
WUSH_API wush_status wush_calibrator_add_validation(wush_context* ctx, wush_calibrator* calibrator, wush_dtype dtype,
                                                    const void* x, size_t n_tokens);

/*! wush_calibrator_validation_count() : writes the number of tokens in the validation sample
 *  (<= its size) to *n_tokens. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. Thread-safe (read
 *  only). */
WUSH_API wush_status wush_calibrator_validation_count(const wush_calibrator* calibrator, size_t* n_tokens);

/* ================================================================================================
 * Transforms
 * ==============================================================================================*/

typedef struct wush_transform wush_transform;

/* Per-block transform kinds (the paper's I, H, R, WUS, WUSH). Values are pinned. */
typedef enum wush_transform_kind {
    WUSH_TRANSFORM_IDENTITY = 0,
    WUSH_TRANSFORM_HADAMARD = 1, /* normalized Sylvester Hadamard, the same for every block     */
    WUSH_TRANSFORM_RANDOM = 2,   /* a seeded random rotation per block (WUSH_OPTION_SEED)        */
    WUSH_TRANSFORM_WUS = 3,      /* S^{-1/2} U^T W'^T: WUSH without the Hadamard factor          */
    WUSH_TRANSFORM_WUSH = 4,     /* H S^{-1/2} U^T W'^T (Algorithm 1)                             */
    WUSH_TRANSFORM_ENUM_MIN_ = -2147483647 - 1,
    WUSH_TRANSFORM_ENUM_MAX_ = 2147483647
} wush_transform_kind;

/*! wush_transform_kind_name() : static short name ("i", "h", "r", "wus", "wush") or NULL. */
WUSH_API const char* wush_transform_kind_name(wush_transform_kind kind);

/*! wush_transform_kind_from_name() : parses a short name (case-insensitive; also "identity",
 *  "hadamard", "random"). @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_transform_kind_from_name(const char* name, wush_transform_kind* kind);

/*! wush_transform_spec_from_name() :
 *  Experimental: the "+s" suffix (the search, see "Stability").
 *  Parses a transform as the tools spell it: a name accepted by wush_transform_kind_from_name(),
 *  optionally followed by "+s" (lower-case) for the per-block search (WUSH_OPTION_SEARCH), as in
 *  "wush+s".
 *  Writes the kind to *kind and 1 (with "+s") or 0 to *search. Only WUS and WUSH have free
 *  parameters to search, so "i+s", "h+s" and "r+s" are refused (wush_layer_quantize() refuses
 *  the same combination). Thread-safe. Both outputs are written only on success.
 *  @return WUSH_OK, or WUSH_ERR_INVALID_ARGUMENT for NULL arguments, an unknown name, or a search
 *          asked of a data-free kind (the message says which). */
WUSH_API wush_status wush_transform_spec_from_name(const char* name, wush_transform_kind* kind, int* search);

/*! wush_transform_build() :
 *  Builds the per-block transforms of a layer with weight `weight` (d_out x d_in row-major, of
 *  `dtype`) from the calibrator's moments, with Algorithm 1 for WUS/WUSH (LAPACKE Cholesky and
 *  SVD, blocks in parallel). The geometry (d_in, G) is the calibrator's; a FULL calibrator's
 *  diagonal blocks are used. For the data-free kinds (I, H, R) the weight and moments are not
 *  read (weight may be NULL) but d_in must still match.
 *  The activation-side matrices T_wush are stored in float32; the weight side is derived from
 *  those stored values in float64 (T_xvsh = T_wush^{-T}), so the unquantized product is exact.
 *  Degenerate blocks never fail the layer: moments are damped (WUSH_OPTION_DAMPING); a block whose
 *  moment is zero, or whose decomposition still fails, or whose singular values span more than
 *  1e12, falls back to the data-free H (WUSH) or I (WUS) transform and is reported by
 *  wush_transform_fallback_blocks().
 *  Ownership: release *transform with wush_transform_destroy().
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, NULL weight for WUS/WUSH, d_in
 *          mismatch, a calibrator without tokens for WUS/WUSH, bad kind or dtype);
 *          WUSH_ERR_NON_FINITE (NaN/Inf in the weight); WUSH_ERR_CANCELLED. */
WUSH_API wush_status wush_transform_build(wush_context* ctx, const wush_calibrator* calibrator, wush_dtype dtype,
                                          const void* weight, size_t d_out, size_t d_in, wush_transform_kind kind,
                                          const wush_options* options, wush_transform** transform);

/*! wush_transform_create_fixed() :
 *  A data-free transform (IDENTITY, HADAMARD or RANDOM) for width d_in and block size group_size
 *  (a power of two, at most 256, dividing d_in; the transform holds d_in * group_size floats).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (WUS/WUSH need wush_transform_build(); a bad
 *          geometry, or d_in * group_size overflowing size_t); WUSH_ERR_OUT_OF_MEMORY. */
WUSH_API wush_status wush_transform_create_fixed(wush_transform_kind kind, size_t d_in, size_t group_size,
                                                 const wush_options* options, wush_transform** transform);

/*! wush_transform_destroy() : releases `transform`; NULL is a no-op. */
WUSH_API void wush_transform_destroy(wush_transform* transform);

/*! wush_transform_info() : writes the kind, d_in and group size G (any pointer may be NULL).
 *  Thread-safe (read only). */
WUSH_API wush_status wush_transform_info(const wush_transform* transform, wush_transform_kind* kind, size_t* d_in,
                                         size_t* group_size);

/*! wush_transform_matrices() :
 *  Copies the activation-side matrices, (C, G, G) float32 row-major (matrix b maps a token's
 *  block slice x_b to T_b x_b), into `out`, which holds `count` floats (at least d_in * G).
 *  @return WUSH_OK, WUSH_ERR_BUFFER_TOO_SMALL or WUSH_ERR_INVALID_ARGUMENT. Thread-safe. */
WUSH_API wush_status wush_transform_matrices(const wush_transform* transform, float* out, size_t count);

/*! wush_transform_fallback_blocks() :
 *  Writes the number of blocks that fell back (see wush_transform_build) to *n_blocks and, if
 *  `blocks` is not NULL, up to `count` of their indices (ascending).
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. Thread-safe. */
WUSH_API wush_status wush_transform_fallback_blocks(const wush_transform* transform, size_t* n_blocks, size_t* blocks,
                                                    size_t count);

/*! wush_transform_singular_values() :
 *  Copies the singular values S of every block (C x G doubles, row b = block b, descending) into
 *  `out` (at least d_in doubles). They are zero for data-free kinds and fallen-back blocks.
 *  @return WUSH_OK, WUSH_ERR_BUFFER_TOO_SMALL or WUSH_ERR_INVALID_ARGUMENT. Thread-safe. */
WUSH_API wush_status wush_transform_singular_values(const wush_transform* transform, double* out, size_t count);

/* Where the search's per-layer guard (WUSH_OPTION_SEARCH) took its held-out tokens. Values are
 * pinned. Experimental, as is wush_guard_candidate (see "Stability"). */
typedef enum wush_guard_source {
    WUSH_GUARD_NONE = 0,               /* no guard ran: no search, a data-free kind, the default hold-out
                                * off (WUSH_OPTION_SEARCH_GUARD = 0) or too small a token sample,
                                * or a transform not made by wush_layer_quantize()              */
    WUSH_GUARD_VALIDATION = 1,         /* the calibrator's validation tokens                             */
    WUSH_GUARD_HOLD_OUT = 2,           /* every second token of the calibrator's token sample            */
    WUSH_GUARD_HOLD_OUT_SEQUENCES = 3, /* whole sequences of the token sample, about half its
                                        * tokens (wush_calibrator_add_sequences)               */
    WUSH_GUARD_HOLD_OUT_DOCUMENTS = 4, /* whole documents of the token sample, about half its
                                        * tokens, left out of the data-aware candidates' fit
                                        * too (wush_calibrator_add_document)                   */
    WUSH_GUARD_SOURCE_ENUM_MIN_ = -2147483647 - 1,
    WUSH_GUARD_SOURCE_ENUM_MAX_ = 2147483647
} wush_guard_source;

/* The guard's candidate layers, all built by the same method and seed. Values are pinned. */
typedef enum wush_guard_candidate {
    WUSH_GUARD_SEARCHED = 0, /* the searched WUS/WUSH layer (`kind` with WUSH_OPTION_SEARCH)  */
    WUSH_GUARD_PLAIN = 1,    /* `kind` without the search (Algorithm 1)                      */
    WUSH_GUARD_IDENTITY = 2,
    WUSH_GUARD_HADAMARD = 3,
    WUSH_GUARD_RANDOM = 4,
    WUSH_GUARD_SHRUNK = 5, /* `kind` without the search, damping max(WUSH_OPTION_DAMPING, 1) */
    WUSH_GUARD_CANDIDATE_ENUM_MIN_ = -2147483647 - 1,
    WUSH_GUARD_CANDIDATE_ENUM_MAX_ = 2147483647
} wush_guard_candidate;

/*! wush_transform_guard() :
 *  Experimental (the search's guard, see "Stability").
 *  What the search's per-layer guard decided for the layer whose transform this is, as
 *  wush_layer_quantize() recorded it on the transform: *source (WUSH_GUARD_NONE when no guard
 *  ran), *n_tokens (held-out tokens scored; 0 without a guard) and *kept (the candidate returned;
 *  WUSH_GUARD_SEARCHED without a guard, i.e. the layer as built). Any pointer may be NULL. Only
 *  the transform made by wush_layer_quantize() carries a report: transforms built, created,
 *  loaded from a checkpoint or otherwise made report WUSH_GUARD_NONE.
 *  Thread-safe (read only).
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT (bad handle). */
WUSH_API wush_status wush_transform_guard(const wush_transform* transform, wush_guard_source* source, size_t* n_tokens,
                                          wush_guard_candidate* kept);

/*! wush_transform_guard_candidate() :
 *  Experimental (the search's guard, see "Stability").
 *  One candidate's score in the guard's decision (see wush_transform_guard): *loss, its layer
 *  loss on the held-out tokens (as wush_layer_loss() computes it for that candidate's layer on
 *  those tokens, over the output rows the guard scores: every row below d_out = 2048, else the
 *  subset WUSH_OPTION_SEARCH_GUARD describes; equal to wush_layer_loss() of that layer, built
 *  separately with the same options from the same calibrator, up to the order of its float64
 *  sums: relative difference below 1e-12, on every CPU and ISA); *difference, the mean over
 *  tokens of the paired per-token loss differences (searched - candidate: positive where the
 *  candidate is better);
 *  *std_error, the standard error of that mean (sample standard deviation / sqrt(n_tokens));
 *  *replaces, 1 when the candidate met the rule (loss below 0.99 x the searched loss and
 *  difference > 2 std_error, or under WUSH_GUARD_HOLD_OUT_SEQUENCES or _DOCUMENTS with at least
 *  8 held-out sequences or documents the same test on their sums of the differences), else 0.
 *  For WUSH_GUARD_SEARCHED: its loss, 0, 0, 0. Under WUSH_GUARD_HOLD_OUT_DOCUMENTS the searched,
 *  plain and shrunk candidates' scores are those of their builds without the held-out documents.
 *  The kept candidate is the lowest loss among those with
 *  *replaces = 1, or the searched layer when there is none. Any output pointer may be NULL.
 *  Thread-safe (read only).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handle, unknown candidate, or no guard ran for
 *          this transform). */
WUSH_API wush_status wush_transform_guard_candidate(const wush_transform* transform, wush_guard_candidate candidate,
                                                    double* loss, double* difference, double* std_error, int* replaces);

/*! wush_transform_guard_undecided() :
 *  Experimental (the search's guard, see "Stability").
 *  Whether the guard could not decide (see wush_transform_guard): *undecided is 1 when some
 *  candidate's held-out loss is below 0.99 times the kept candidate's but it did not meet the
 *  rule against the searched layer (the difference inside two standard errors), i.e. the
 *  held-out tokens cannot tell; more held-out documents (wush_calibrator_add_validation) would.
 *  *candidate is the lowest-loss such candidate (WUSH_GUARD_SEARCHED when *undecided is 0).
 *  *n_sequences is the number of held-out sequences under WUSH_GUARD_HOLD_OUT_SEQUENCES (of
 *  documents under WUSH_GUARD_HOLD_OUT_DOCUMENTS), else 0.
 *  Without a guard: 0, WUSH_GUARD_SEARCHED, 0. Any pointer may be NULL. Thread-safe (read only).
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT (bad handle). */
WUSH_API wush_status wush_transform_guard_undecided(const wush_transform* transform, int* undecided,
                                                    wush_guard_candidate* candidate, size_t* n_sequences);

/* ================================================================================================
 * Pre-quantized weights and the layerwise loss
 * ==============================================================================================*/

typedef struct wush_qweight wush_qweight;

/* Weight quantization methods. Values are pinned. */
typedef enum wush_method {
    /* Round to nearest after the weight-side transform (Algorithm 2, RTN case). */
    WUSH_METHOD_RTN = 0,
    /* GPTQ interleaved with the transform construction (Algorithm 2, GPTQ case): needs a
     * full-mode calibrator (the Hessian) and builds transform and weights together, so it is only
     * available through wush_layer_quantize(). */
    WUSH_METHOD_GPTQ = 1,
    WUSH_METHOD_ENUM_MIN_ = -2147483647 - 1,
    WUSH_METHOD_ENUM_MAX_ = 2147483647
} wush_method;

/*! wush_method_name() :
 *  @return a static lower-case name ("rtn", "gptq"), or NULL for a value that is not a
 *          wush_method. The checkpoint records a layer's method under this name. Thread-safe. */
WUSH_API const char* wush_method_name(wush_method method);

/*! wush_method_from_name() :
 *  Parses a name as returned by wush_method_name() (case-insensitive) into *method.
 *  Thread-safe. @return WUSH_OK, or WUSH_ERR_INVALID_ARGUMENT for NULL arguments or an unknown
 *  name. */
WUSH_API wush_status wush_method_from_name(const char* name, wush_method* method);

/*! wush_qweight_create() :
 *  Pre-quantizes the layer weight `weight` (d_out x d_in row-major, `dtype`) with `method`, which
 *  must be WUSH_METHOD_RTN: q(T_xvsh,b w_b) for every output row and block b, in `format`, whose
 *  group size must equal the transform's G. (GPTQ changes the transform as it goes: use
 *  wush_layer_quantize().)
 *  Ownership: release *qweight with wush_qweight_destroy(); it does not keep `transform`.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, shapes, format/G mismatch, method);
 *          WUSH_ERR_NON_FINITE; WUSH_ERR_CANCELLED. */
WUSH_API wush_status wush_qweight_create(wush_context* ctx, const wush_transform* transform, wush_format format,
                                         wush_method method, wush_dtype dtype, const void* weight, size_t d_out,
                                         size_t d_in, const wush_options* options, wush_qweight** qweight);

/*! wush_layer_quantize() :
 *  Builds a layer's transform of `kind` and its pre-quantized weights in `format` in one call,
 *  with either method:
 *   - WUSH_METHOD_RTN: the same as wush_transform_build() then wush_qweight_create();
 *   - WUSH_METHOD_GPTQ: Algorithm 2's GPTQ case. `calibrator` must be in WUSH_MOMENTS_FULL mode
 *     (its d_in x d_in moment is GPTQ's Hessian H = X^T X / n; its diagonal blocks are the M_X of
 *     the transforms). Each block's transform is built from the weights as updated by the error
 *     propagation of the earlier blocks, its group scales are fixed from the transformed weights,
 *     then GPTQ quantizes the block column by column and propagates the error to later blocks.
 *     WUSH_OPTION_DAMPING is both Algorithm 1's lambda and the Hessian damping
 *     (H + lambda tr(H)/d_in I); when the damped Hessian is not positive definite the damping is
 *     raised tenfold, up to three times, before failing with WUSH_ERR_NUMERICAL.
 *     Memory: about 8 (d_in^2 + d_out d_in) bytes besides the results.
 *  With WUSH_OPTION_SEARCH, the per-layer guard (see WUSH_OPTION_SEARCH and
 *  WUSH_OPTION_SEARCH_GUARD) may return the plain (unsearched) `kind` or an identity, Hadamard or
 *  random transform instead of the searched one; wush_transform_guard() on *transform reports
 *  what it compared and kept.
 *  `weight` is d_out x d_in row-major in `dtype`; the format's group size must equal the
 *  calibrator's G. WUSH_OPTION_TRANSFORM_DTYPE and the progress callback apply as for
 *  wush_transform_build() (with the guard and GPTQ, the callback also runs through the builds of
 *  the alternative layers).
 *  Ownership: on success *transform and *qweight are new objects the caller releases with
 *  wush_transform_destroy() / wush_qweight_destroy(); on failure both are left untouched.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles or enums, shapes, G mismatch, GPTQ with
 *          a block-diagonal calibrator, a calibrator without tokens); WUSH_ERR_NON_FINITE (weight);
 *          WUSH_ERR_NUMERICAL (a Hessian that stays indefinite, or is zero); WUSH_ERR_CANCELLED;
 *          WUSH_ERR_OUT_OF_MEMORY.
 *  Thread safety: serialized per context; the calibrator and weight are only read. */
WUSH_API wush_status wush_layer_quantize(wush_context* ctx, const wush_calibrator* calibrator, wush_transform_kind kind,
                                         wush_format format, wush_method method, wush_dtype dtype, const void* weight,
                                         size_t d_out, size_t d_in, const wush_options* options,
                                         wush_transform** transform, wush_qweight** qweight);

/*! wush_qweight_destroy() : releases `qweight`; NULL is a no-op. */
WUSH_API void wush_qweight_destroy(wush_qweight* qweight);

/*! wush_qweight_info() : writes format, method, d_out and d_in (any pointer may be NULL). */
WUSH_API wush_status wush_qweight_info(const wush_qweight* qweight, wush_format* format, wush_method* method,
                                       size_t* d_out, size_t* d_in);

/*! wush_qweight_data() :
 *  Borrows the packed codes and scales (layouts of wush_quantize_rows, d_out rows of d_in): the
 *  pointers stay valid, read-only, until the qweight is destroyed. Any pointer may be NULL.
 *  Thread-safe (read only). */
WUSH_API wush_status wush_qweight_data(const wush_qweight* qweight, const void** codes, size_t* codes_bytes,
                                       const void** scales, size_t* scales_bytes);

/*! wush_layer_loss() :
 *  The layerwise output loss ||Y_q - Y||_F^2 / (d_out * n_tokens) on held-out activations `x`
 *  (n_tokens x d_in, `x_dtype`): the activations are transformed with the transform and
 *  quantized (RTN) in the qweight's format, multiplied with the dequantized qweight (the exact
 *  dequantized values, element x scale / per-tensor divisor, summed group by group in float64:
 *  Y_q is the same bits on every ISA), and compared with the float64 product Y = X W^T of the
 *  original weight `weight` (d_out x d_in, `w_dtype`).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (handles, shapes, n_tokens == 0);
 *          WUSH_ERR_NON_FINITE. */
WUSH_API wush_status wush_layer_loss(wush_context* ctx, const wush_transform* transform, const wush_qweight* qweight,
                                     wush_dtype w_dtype, const void* weight, wush_dtype x_dtype, const void* x,
                                     size_t n_tokens, double* loss);

/* ================================================================================================
 * Runtime: fused transform + quantization, the W4A4 GEMM and the linear forward
 * ==============================================================================================*/

/* The inference path of a quantized linear layer (paper eq. layer_forward_pass):
 *   Y = sum_b q(T_xvsh,b W_b)^T q(T_wush,b X_b)
 * The weight side is the wush_qweight (quantized once, offline). At run time each token's block
 * slices are transformed with T_wush and quantized (wush_quantize_activations), and the packed
 * activations are multiplied with the packed weights (wush_gemm); wush_linear_forward does both.
 * For repeated use, bind the layer to a context once with wush_linear_create() (below): its
 * calls then do no per-call preparation at all.
 *
 * Memory and streams - the rule for every function of this section and of "Prepared layers"
 * (changed in 0.2: before, these functions took host memory and rejected a CUDA context):
 *  - On a WUSH_BACKEND_CPU context, tensor arguments (x, codes, scales, y, workspace) are host
 *    memory, and a call has finished its work when it returns. The work runs with the context's
 *    threads (WUSH_CONTEXT_NUM_THREADS) and SIMD kernels (WUSH_CONTEXT_CPU_ISA).
 *  - On a WUSH_BACKEND_CUDA context, tensor arguments are DEVICE pointers on the context's
 *    device (a host pointer, or another device's memory, is rejected with
 *    WUSH_ERR_INVALID_ARGUMENT where the CUDA runtime can tell). Typed tensors (x: F32, F16,
 *    BF16; y: F32, BF16) must be aligned to their element size (4 or 2 bytes), else
 *    WUSH_ERR_INVALID_ARGUMENT; codes and scales may have any alignment (16-byte aligned codes
 *    and x are stored / read with wider accesses). Every call restores the calling thread's
 *    current CUDA device. Objects (transforms, qweights, calibrators) stay host objects.
 *    The prepared-layer launches (wush_linear_quantize, wush_linear_run) enqueue their kernels
 *    on the context's stream (wush_context_set_stream) and return without synchronizing the host
 *    and without allocating (device scratch comes from the caller's workspace), so they can be
 *    captured in a CUDA graph. The per-call functions of this section (wush_quantize_activations,
 *    wush_gemm, wush_linear_forward) are conveniences: they copy the transform or the weights to
 *    the device on every call, allocate, and synchronize the stream before returning.
 *    Errors found on the device after a launch returned (NaN/Inf in x) are reported by the next
 *    synchronizing call on the context (wush_context_synchronize) as WUSH_ERR_NON_FINITE; the
 *    outputs of the faulty launch are unspecified.
 *  - wush_quantize_rows, wush_dequantize_rows, wush_layer_loss and wush_layer_loss_runtime are
 *    host-memory functions on every backend (they measure; they do not launch).
 * Groups of 16 and 32 (every wush_format) are supported.
 *
 * Thread safety: a transform and a qweight are only read, so one of each may serve any number of
 * threads at once, each with its own context and buffers; results do not depend on that. Calls
 * on one context are serialized. Results are deterministic and do not depend on the thread count;
 * the activation codes and scales do not depend on the ISA or the backend either (Y may differ
 * between ISAs and backends in the last bits, from the float32 summation order, and on a CPU
 * context a token's Y between a batch of at most 4 tokens and a larger one, which sum in another
 * order). docs/RUNTIME.md describes the kernels. */

/* SIMD kernel sets of the CPU runtime, for WUSH_CONTEXT_CPU_ISA. Values are pinned. */
typedef enum wush_cpu_isa {
    WUSH_CPU_ISA_AUTO = 0,        /* the fastest this CPU supports                              */
    WUSH_CPU_ISA_SCALAR = 1,      /* portable C++, any CPU                                      */
    WUSH_CPU_ISA_AVX2 = 2,        /* AVX2 + FMA + F16C (Haswell, Zen 1 and later)                */
    WUSH_CPU_ISA_AVX512_VNNI = 3, /* AVX-512 F/BW/DQ/VL + VNNI (Ice Lake, Zen 4 and later)       */
    WUSH_CPU_ISA_ENUM_MIN_ = -2147483647 - 1,
    WUSH_CPU_ISA_ENUM_MAX_ = 2147483647
} wush_cpu_isa;

/*! wush_cpu_isa_name() :
 *  @return a static name ("auto", "scalar", "avx2", "avx512_vnni"), or NULL for a value that is not
 *          a wush_cpu_isa. Thread-safe. */
WUSH_API const char* wush_cpu_isa_name(wush_cpu_isa isa);

/*! wush_cpu_isa_supported() :
 *  @return 1 if this CPU (and operating system) can run the kernels of `isa`, else 0 (also for a
 *          value that is not a wush_cpu_isa). WUSH_CPU_ISA_AUTO and WUSH_CPU_ISA_SCALAR are always
 *          supported. Thread-safe. */
WUSH_API int wush_cpu_isa_supported(wush_cpu_isa isa);

/*! wush_context_cpu_isa() :
 *  Writes the ISA the context's CPU runtime calls use (WUSH_CONTEXT_CPU_ISA resolved: never
 *  WUSH_CPU_ISA_AUTO) to *isa. @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. */
WUSH_API wush_status wush_context_cpu_isa(const wush_context* ctx, wush_cpu_isa* isa);

/*! wush_quantize_activations() :
 *  Transforms and quantizes activations in one pass: for every token (row of `x`) and block b,
 *  the block slice x_b (G values) becomes T_wush,b x_b, which is quantized in `format` with the
 *  rules of wush_format. A transform whose blocks are all the identity skips the multiply (a -0.0
 *  input keeps its sign, as in wush_quantize_rows); one whose blocks are all equal (Hadamard)
 *  reads that one matrix. Both are decided by the matrices' values, once per transform.
 *  @param transform    the layer's transform (its G must be the format's group size).
 *  @param format       the block format (the qweight's format, for a later wush_gemm).
 *  @param dtype        the element type of `x`: F32, F16 or BF16.
 *  @param x            n_tokens x d_in row-major activations.
 *  @param d_in         must equal the transform's d_in.
 *  @param codes        receives n_tokens * d_in / 2 bytes, scales n_tokens * (d_in / G) scales:
 *                      the layouts of wush_quantize_rows (wush_format_buffer_sizes gives them).
 *  Precision: the result is the float64 definition - the transform computed in float64, then the
 *  format's scale rule and RNE. The SIMD kernels compute in float32 with a rigorous error bound
 *  and recompute in float64 the groups whose values lie within that bound of a rounding boundary,
 *  so every ISA writes the same bytes (differences are possible only where the float64 value
 *  itself lies within about 1e-15 relative of a boundary).
 *  Memory: allocates d_in / G floats per call (wush_linear_forward allocates nothing).
 *  n_tokens == 0 is a valid no-op.
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT for bad handles, a bad dtype or format,
 *          NULL pointers (with n_tokens > 0), d_in different from the transform's, or a format
 *          whose group size is not the transform's G;
 *          WUSH_ERR_BUFFER_TOO_SMALL if codes_bytes or scales_bytes is less than required
 *          (nothing is written then);
 *          WUSH_ERR_NON_FINITE if `x` holds NaN or +-Inf (the message names the first row and
 *          column); the contents of `codes` and `scales` are unspecified then;
 *          WUSH_ERR_CUDA for a CUDA runtime failure (the message has its text).
 *  Thread safety: serialized per context; `transform` and `x` are only read. */
WUSH_API wush_status wush_quantize_activations(wush_context* ctx, const wush_transform* transform, wush_format format,
                                               wush_dtype dtype, const void* x, size_t n_tokens, size_t d_in,
                                               void* codes, size_t codes_bytes, void* scales, size_t scales_bytes);

/*! wush_gemm() :
 *  The W4A4 GEMM: Y = A W_q^T, with A the m x d_in packed activations (`a_codes`, `a_scales`, in
 *  the qweight's format and the layouts of wush_quantize_rows) and W_q the qweight (d_out x d_in).
 *  Y is m x d_out row-major, F32 or BF16 (`y_dtype`; BF16 is rounded to nearest even).
 *  Arithmetic: every group's inner product of 4-bit codes is exact in integer arithmetic; the two
 *  group scales and the per-tensor factors are applied once per group in float32, and groups are
 *  summed in float32. The result equals the float64 product of the dequantized operands to about
 *  1e-6 relative (Frobenius norm).
 *  Memory: allocates a scratch of about m * d_in + threads * 40 * d_in bytes per call; use
 *  wush_linear_forward with a workspace to avoid allocations.
 *  m == 0 is a valid no-op.
 *  @param y_count  number of elements `y` can hold (at least m * d_out).
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT for bad handles, NULL pointers (with m > 0), a y_dtype other
 *          than F32/BF16;
 *          WUSH_ERR_BUFFER_TOO_SMALL if a_codes_bytes, a_scales_bytes or y_count is too small;
 *          WUSH_ERR_NON_FINITE if an activation scale is NaN/Inf (nothing is written to `y`),
 *          or (CPU) if the product overflows float32 (or, for a BF16 `y`, its rounding to BF16)
 *          although every operand is finite (valid extremes such as E8M0 scales of 2^127; `y`
 *          then holds the overflowed values);
 *          WUSH_ERR_CUDA; WUSH_ERR_OUT_OF_MEMORY.
 *  Thread safety: serialized per context; `qweight` and the activations are only read. */
WUSH_API wush_status wush_gemm(wush_context* ctx, const wush_qweight* qweight, const void* a_codes,
                               size_t a_codes_bytes, const void* a_scales, size_t a_scales_bytes, size_t m,
                               wush_dtype y_dtype, void* y, size_t y_count);

/*! wush_linear_forward_workspace_size() :
 *  Writes to *bytes the workspace wush_linear_forward needs for n_tokens tokens with this
 *  context's current thread count (WUSH_CONTEXT_NUM_THREADS, or OpenMP's default when 0). It
 *  grows about linearly with n_tokens and never shrinks as n_tokens grows (the kernels chosen
 *  change with n_tokens; the answer is the largest need of any count up to n_tokens), so a
 *  workspace sized for the largest batch serves all smaller ones. Any alignment is fine.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT for bad handles, NULL `bytes`, or a transform and
 *          qweight that do not belong together (d_in, G). */
WUSH_API wush_status wush_linear_forward_workspace_size(wush_context* ctx, const wush_transform* transform,
                                                        const wush_qweight* qweight, size_t n_tokens, size_t* bytes);

/*! wush_linear_forward() :
 *  One quantized linear layer: y = q(T_wush x) q(T_xvsh W)^T for the n_tokens x d_in activations
 *  `x` (`x_dtype`: F32, F16 or BF16) - wush_quantize_activations then wush_gemm, with everything
 *  intermediate in `workspace`. Nothing is allocated. y is n_tokens x d_out (F32 or BF16).
 *  A workspace sized for fewer threads than the context now has runs on fewer threads.
 *  @param y_count          elements `y` can hold (at least n_tokens * d_out).
 *  @param workspace        caller-owned scratch of `workspace_bytes` bytes (may be NULL when
 *                          n_tokens == 0); see wush_linear_forward_workspace_size.
 *  n_tokens == 0 is a valid no-op.
 *  @return WUSH_OK;
 *          WUSH_ERR_INVALID_ARGUMENT as for wush_quantize_activations and wush_gemm;
 *          WUSH_ERR_BUFFER_TOO_SMALL if y_count or workspace_bytes is too small (nothing is
 *          written then);
 *          WUSH_ERR_NON_FINITE if `x` holds NaN/Inf (`y` is left untouched, the workspace's
 *          contents are unspecified), or (CPU) if the product overflows float32 (or, for a BF16
 *          `y`, its rounding to BF16) although the inputs are finite (transform entries or scales
 *          near float32's maximum);
 *          WUSH_ERR_CUDA for a CUDA runtime failure.
 *  Thread safety: serialized per context; `transform`, `qweight` and `x` are only read. */
WUSH_API wush_status wush_linear_forward(wush_context* ctx, const wush_transform* transform,
                                         const wush_qweight* qweight, wush_dtype x_dtype, const void* x,
                                         size_t n_tokens, wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
                                         size_t workspace_bytes);

/*! wush_layer_loss_runtime() :
 *  The layerwise loss of wush_layer_loss(), with Y_q computed by the CPU runtime
 *  (wush_linear_forward: the fused transform + quantization and the W4A4 GEMM, accumulated in
 *  float32) instead of the float64 product of the dequantized operands. The two agree to about
 *  1e-6 relative; this is what `wush eval --runtime` reports.
 *  Host memory and the CPU kernels on every backend.
 *  @return as wush_layer_loss(). */
WUSH_API wush_status wush_layer_loss_runtime(wush_context* ctx, const wush_transform* transform,
                                             const wush_qweight* qweight, wush_dtype w_dtype, const void* weight,
                                             wush_dtype x_dtype, const void* x, size_t n_tokens, double* loss);

/* ================================================================================================
 * Prepared layers: a transform and a qweight bound to one context
 * ==============================================================================================*/

/* A wush_linear holds what the context's backend needs to run one layer, prepared once: on the
 * CPU a copy of the transform and the weights' GEMM panels packed once (wush_gemm packs them on
 * every call; the pack takes O(d_out * d_in) bytes, a small multiple of the packed weight bytes:
 * docs/RUNTIME.md, "Memory"); on CUDA device copies of the
 * transform matrices, their error-bound row norms, and the codes and scales in the layout the
 * GEMM kernels read. It does not reference the transform or the qweight afterwards: they may be
 * destroyed. Memory rules: "Runtime" above (device pointers and stream-ordered, allocation-free
 * launches on a CUDA context). Opaque. */
typedef struct wush_linear wush_linear;

/*! wush_linear_create() :
 *  Prepares the layer made of `transform` and `qweight` (same d_in, the qweight's format group
 *  equal to the transform's G) on the backend of `ctx`. On a CUDA context this allocates device
 *  memory and copies synchronously: call it outside a graph capture of the context's stream
 *  (prepare before capturing). It is safe while another thread captures in global mode (as
 *  PyTorch does): its allocations run in relaxed capture mode and its copies on a private
 *  non-blocking stream, never on the legacy default stream; wush_context_create does the same.
 *  Ownership: release *layer with wush_linear_destroy() before destroying `ctx`.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, NULL `layer`, mismatched objects);
 *          WUSH_ERR_UNSUPPORTED (a group size the runtime does not support);
 *          WUSH_ERR_OUT_OF_MEMORY (host or device); WUSH_ERR_CUDA.
 *  Thread safety: serialized per context; `transform` and `qweight` are only read. */
WUSH_API wush_status wush_linear_create(wush_context* ctx, const wush_transform* transform, const wush_qweight* qweight,
                                        wush_linear** layer);

/*! wush_linear_destroy() : releases `layer` (and its device memory); NULL is a no-op. On a CUDA
 *  context, work still enqueued that uses the layer must have finished (synchronize first). */
WUSH_API void wush_linear_destroy(wush_linear* layer);

/*! wush_linear_info() : writes d_out, d_in and the format (any pointer may be NULL).
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT. Thread-safe (read only). */
WUSH_API wush_status wush_linear_info(const wush_linear* layer, size_t* d_out, size_t* d_in, wush_format* format);

/*! wush_linear_workspace_size() :
 *  Writes to *bytes the workspace wush_linear_run needs for up to n_tokens tokens on `ctx` (the
 *  context the layer was prepared on), with its current thread count on a CPU context: the largest
 *  need of any count up to n_tokens (the kernels chosen change with the count), so the answer
 *  never shrinks as n_tokens grows and one workspace serves every smaller batch. Host
 *  memory for a CPU context, device memory (any alignment; 256-byte aligned is fastest) for CUDA.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, another context, NULL `bytes`). */
WUSH_API wush_status wush_linear_workspace_size(wush_context* ctx, const wush_linear* layer, size_t n_tokens,
                                                size_t* bytes);

/*! wush_linear_quantize() :
 *  The layer's activation side alone: what wush_quantize_activations writes for the layer's
 *  transform and format (the same bytes on every backend). On a CUDA context x, codes and scales
 *  are device pointers and the launch is stream-ordered and allocation-free.
 *  n_tokens == 0 is a valid no-op.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, another context, NULL pointers with
 *          n_tokens > 0, bad dtype); WUSH_ERR_BUFFER_TOO_SMALL; WUSH_ERR_NON_FINITE (CPU: now;
 *          CUDA: from the next wush_context_synchronize); WUSH_ERR_CUDA.
 *  Thread safety: serialized per context. */
WUSH_API wush_status wush_linear_quantize(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x,
                                          size_t n_tokens, void* codes, size_t codes_bytes, void* scales,
                                          size_t scales_bytes);

/*! wush_linear_run() :
 *  The layer's forward pass, as wush_linear_forward: y (n_tokens x d_out, F32 or BF16) =
 *  q(T_wush x) q(T_xvsh W)^T for x (n_tokens x d_in, F32, F16 or BF16), intermediates in the
 *  caller's `workspace` (wush_linear_workspace_size; a CPU workspace sized for fewer threads runs
 *  on fewer threads). Nothing is allocated. On a CUDA context every pointer is device memory and
 *  the work is enqueued on the context's stream (no host synchronization; graph-capturable); the
 *  GEMM kernel is chosen by n_tokens and the device's architecture. A workspace serves one call in
 *  flight at a time (on CUDA, until the stream has passed the call); calls in flight with their
 *  own workspaces (two streams, two graph instances) do not interfere.
 *  n_tokens == 0 is a valid no-op.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, another context, NULL pointers,
 *          dtypes); WUSH_ERR_BUFFER_TOO_SMALL (y_count or workspace_bytes; nothing written);
 *          WUSH_ERR_NON_FINITE (CPU: now, y untouched; CUDA: from the next
 *          wush_context_synchronize, y unspecified); WUSH_ERR_CUDA.
 *  Thread safety: serialized per context; the layer is only read by the kernels. */
WUSH_API wush_status wush_linear_run(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x,
                                     size_t n_tokens, wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
                                     size_t workspace_bytes);

/*! wush_linear_run_bias() :
 *  wush_linear_run with a bias, as a linear layer of an engine has one: y = q(T_wush x)
 *  q(T_xvsh W)^T + b, b added to every row. The bias is added in float32 to the float32 product,
 *  in the GEMM's final store (no second pass over y), before the rounding to BF16 when y_dtype is
 *  BF16: y[r][j] = round_y(float(acc[r][j] + b[j])). With bias == NULL the call is
 *  wush_linear_run, bit for bit (bias_dtype and bias_count are not read).
 *  @param bias_dtype   the element type of `bias`: F32, F16 or BF16 (independent of x_dtype and
 *                      y_dtype).
 *  @param bias         d_out values, or NULL. Memory as `x` (host on a CPU context, device on a
 *                      CUDA context, aligned to its element size); only read, and not kept after
 *                      the call (on CUDA: after the enqueued work has run).
 *  @param bias_count   elements of `bias`: must equal the layer's d_out.
 *  Everything else as wush_linear_run (workspace sizes are the same; nothing is allocated; on a
 *  CUDA context the launch is stream-ordered and graph-capturable).
 *  n_tokens == 0 is a valid no-op (the bias arguments are still checked).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT as wush_linear_run, and for a bad bias_dtype or
 *          bias_count != d_out (with a non-NULL bias);
 *          WUSH_ERR_BUFFER_TOO_SMALL as wush_linear_run;
 *          WUSH_ERR_NON_FINITE if `bias` holds NaN or +-Inf (the message names "bias" and the
 *          column; CPU: now, y untouched; CUDA: from the next wush_context_synchronize, y
 *          unspecified), for NaN/Inf in `x` as wush_linear_run, or (CPU) if the sum overflows
 *          float32 (or, for a BF16 `y`, its rounding to BF16) although the inputs are finite;
 *          WUSH_ERR_CUDA.
 *  Thread safety: serialized per context; the layer and `bias` are only read. */
WUSH_API wush_status wush_linear_run_bias(wush_context* ctx, wush_linear* layer, wush_dtype x_dtype, const void* x,
                                          size_t n_tokens, wush_dtype bias_dtype, const void* bias, size_t bias_count,
                                          wush_dtype y_dtype, void* y, size_t y_count, void* workspace,
                                          size_t workspace_bytes);

/*! wush_linear_run_quantized() :
 *  The GEMM half of wush_linear_run: y (n_tokens x d_out, F32 or BF16) = a q(T_xvsh W)^T for
 *  activations `a` already quantized for this layer, as wush_linear_quantize() writes them
 *  (n_tokens rows in the layer's format, the layouts of wush_quantize_rows()). Together the two
 *  calls give wush_linear_run's bytes; apart, a caller times or overlaps the halves, or runs one
 *  quantization for several layers prepared with one transform. No bias.
 *  @param codes        the activations' codes, `codes_bytes` bytes; with `scales` (`scales_bytes`
 *                      bytes) at least wush_format_buffer_sizes(format, n_tokens, d_in). Memory as
 *                      `y`, aligned as wush_linear_quantize's outputs; only read.
 *  Everything else as wush_linear_run: the same workspace sizes (wush_linear_workspace_size), the
 *  GEMM kernel chosen the same way, nothing allocated; on a CUDA context every pointer is device
 *  memory and the work is enqueued on the context's stream (graph-capturable).
 *  n_tokens == 0 is a valid no-op.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, another context, NULL pointers, y_dtype);
 *          WUSH_ERR_BUFFER_TOO_SMALL (codes_bytes, scales_bytes, y_count or workspace_bytes;
 *          nothing written); WUSH_ERR_NON_FINITE (CPU: the product overflowed float32 or, for a
 *          BF16 y, its rounding); WUSH_ERR_CUDA.
 *  Experimental (see "Stability").
 *  Thread safety: serialized per context; the layer and the activations are only read. */
WUSH_API wush_status wush_linear_run_quantized(wush_context* ctx, wush_linear* layer, const void* codes,
                                               size_t codes_bytes, const void* scales, size_t scales_bytes,
                                               size_t n_tokens, wush_dtype y_dtype, void* y, size_t y_count,
                                               void* workspace, size_t workspace_bytes);

/*! wush_linear_last_kernels() :
 *  Writes to `text` (NUL-terminated, `text_bytes` bytes) the names of the kernels the layer's last
 *  wush_linear_quantize / _run / _run_bias / _run_quantized call ran, separated by one space: its
 *  activation quantize, then its GEMM (one of them for the quantize alone and the GEMM alone).
 *  On a CUDA context the kernel actually launched, fallbacks included: "quantize.small_m",
 *  "quantize.tile", "quantize.tensor_core"; "gemm.decode", "gemm.stream_decode", "gemm.prefill",
 *  "gemm.bf16_prefill", "gemm.blockscaled", "gemm.reference". On a CPU context
 *  "cpu.quantize.<isa> cpu.gemm.<isa>" with the ISA of wush_cpu_isa_name(). An empty string
 *  before the layer's first call; a call that failed before launching leaves the previous names.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handle, NULL text);
 *          WUSH_ERR_BUFFER_TOO_SMALL (nothing written; 64 bytes are always enough).
 *  Experimental (see "Stability").
 *  Thread safety: thread-safe; while a call on the layer runs it reports that call or the one
 *  before. */
WUSH_API wush_status wush_linear_last_kernels(const wush_linear* layer, char* text, size_t text_bytes);

/* ================================================================================================
 * Checkpoints: transforms and pre-quantized weights in a safetensors file (docs/CHECKPOINT.md)
 * ==============================================================================================*/

/* A checkpoint is either being written (wush_checkpoint_create, add layers, write) or opened for
 * reading (wush_checkpoint_open). Opaque. */
typedef struct wush_checkpoint wush_checkpoint;

/*! wush_checkpoint_create() : a new, empty checkpoint to write. Release with
 *  wush_checkpoint_destroy(). @return WUSH_OK, WUSH_ERR_INVALID_ARGUMENT or OUT_OF_MEMORY. */
WUSH_API wush_status wush_checkpoint_create(wush_checkpoint** checkpoint);

/*! wush_checkpoint_add_layer() :
 *  Adds layer `name` (non-empty UTF-8, unique, not ending in ".codes", ".scales",
 *  ".tensor_scale" or ".transform") made of `transform` and `qweight`, whose format group size and
 *  d_in must match the transform's. The checkpoint REFERENCES both objects, it does not copy
 *  them: they must stay alive until wush_checkpoint_write() returns (it checks, and fails with
 *  WUSH_ERR_INVALID_ARGUMENT if one was destroyed, even if a new object now has its address).
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (bad handles, a checkpoint opened for reading, bad
 *          or repeated name, mismatched objects). */
WUSH_API wush_status wush_checkpoint_add_layer(wush_checkpoint* checkpoint, const char* name,
                                               const wush_transform* transform, const wush_qweight* qweight);

/*! wush_checkpoint_add_grouped_layer() :
 *  Adds a grouped layer: layers that read the same input (a block's q/k/v projections, or its
 *  gate/up pair) built as one, over their concatenated weight rows with one transform (from the
 *  concatenated weights and the input statistics they share), so that a host runs one activation
 *  quantization and one GEMM for all of them. `part_count` (>= 2) parts name, in row order, the
 *  layers the grouped rows stand for: part i is `part_rows[i]` consecutive output rows (> 0; they
 *  sum to the qweight's d_out); a host uses those rows of the grouped output as that layer's.
 *  Part names follow the layer-name rules, hold no newline, and are unique among every layer
 *  and part of the checkpoint; `name` is the group's own (a layer name like any other). The
 *  strings are copied; `transform` and `qweight` are referenced as by
 *  wush_checkpoint_add_layer(). A checkpoint with a grouped layer is written as format version
 *  3 (docs/CHECKPOINT.md), which libraries before this function do not read; one without stays
 *  version 2.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (what wush_checkpoint_add_layer() refuses, fewer
 *          than two parts, NULL arrays or names, bad or repeated part names, rows that are zero
 *          or do not sum to d_out). Not thread-safe on one checkpoint. */
WUSH_API wush_status wush_checkpoint_add_grouped_layer(wush_checkpoint* checkpoint, const char* name,
                                                       const wush_transform* transform, const wush_qweight* qweight,
                                                       size_t part_count, const char* const* part_names,
                                                       const size_t* part_rows);

/*! wush_checkpoint_write() :
 *  Writes all added layers to `path` atomically: a temporary file in the same directory, fsync,
 *  then rename, so an interrupted write never leaves a truncated file under `path`. The data is
 *  streamed from the layers' objects (no second copy in memory); each layer's SHA-256 digest is
 *  recorded in the file's metadata (docs/CHECKPOINT.md, format version 2, or 3 with a grouped
 *  layer). `path` must be absent or a
 *  regular file (a symbolic link to one is written through); anything else is refused before
 *  anything is written and left as it was. The progress callback of
 *  `options` (may be NULL) is called after each layer.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (including a `path` that is a device, FIFO, socket
 *          or directory); WUSH_ERR_IO (the message has the system's reason);
 *          WUSH_ERR_CANCELLED (no file is left behind). */
WUSH_API wush_status wush_checkpoint_write(wush_checkpoint* checkpoint, const char* path, const wush_options* options);

/*! wush_checkpoint_open() :
 *  Opens a checkpoint read-only (memory-mapped) and validates it completely before returning:
 *  everything wush_tensor_file_open() checks, plus the libwush rules of docs/CHECKPOINT.md (format
 *  version, every tensor belonging to a layer, each layer's four tensors with the dtypes and
 *  shapes its metadata implies, known format/transform/method names, G matching the format, the
 *  per-tensor factor, a valid damping, no unknown metadata keys, a grouped layer's parts).
 *  The mapping: these calls read the mapped file, so a file truncated after the open makes them
 *  raise SIGBUS in the host (replace checkpoints by rename, which never does this; a file changed
 *  before a load is refused with WUSH_ERR_IO): wush_checkpoint_open() itself (validation),
 *  wush_checkpoint_load_layer(), wush_checkpoint_export_fp_quant(), and, for as long as a
 *  qweight loaded from the checkpoint lives, every call given that qweight (wush_qweight_data()'s
 *  pointers point into the mapping; wush_linear_create(), wush_layer_loss(),
 *  wush_layer_loss_runtime() and the other functions taking a wush_qweight read it) or a
 *  wush_linear prepared from it on a CPU context (its calls may read the weights in place).
 *  A host that cannot accept SIGBUS opens with
 *  wush_checkpoint_open_mode(path, WUSH_CHECKPOINT_COPY, &checkpoint).
 *  @return WUSH_OK; WUSH_ERR_IO; WUSH_ERR_CORRUPT_FILE naming the first violation. */
WUSH_API wush_status wush_checkpoint_open(const char* path, wush_checkpoint** checkpoint);

/* How wush_checkpoint_open_mode() holds a checkpoint's bytes. Values are pinned. */
typedef enum wush_checkpoint_mode {
    WUSH_CHECKPOINT_MAP = 0,  /* memory-mapped, read on demand: wush_checkpoint_open()         */
    WUSH_CHECKPOINT_COPY = 1, /* read whole into memory at the open; the file is not used again */
    /* Not values: these pin the type to the whole range of int, so that any int a caller
     * passes is a valid object of the type (and is checked and rejected by the library). */
    WUSH_CHECKPOINT_MODE_ENUM_MIN_ = -2147483647 - 1,
    WUSH_CHECKPOINT_MODE_ENUM_MAX_ = 2147483647
} wush_checkpoint_mode;

/*! wush_checkpoint_open_mode() :
 *  wush_checkpoint_open() with a choice of how the file's bytes are held. WUSH_CHECKPOINT_COPY
 *  reads the whole file into memory owned by the library (as much memory as the file is large,
 *  released with the checkpoint and the last qweight loaded from it) and validates that copy:
 *  nothing is mapped, so truncating, rewriting or deleting the file afterwards never reaches the
 *  host (no SIGBUS) and changes nothing that was opened. The header is checked before the rest
 *  of the file is read, and every layer digest the writer recorded (format version 2) is
 *  recomputed from the copy: a changed byte is WUSH_ERR_CORRUPT_FILE naming its layer.
 *  WUSH_CHECKPOINT_MAP is wush_checkpoint_open(), which does not read the data and so does not
 *  verify digests.
 *  Ownership: release *checkpoint with wush_checkpoint_destroy(). Thread-safe.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT (NULL pointers, an unknown mode); WUSH_ERR_IO
 *          (including a file that shrinks while it is read); WUSH_ERR_OUT_OF_MEMORY;
 *          WUSH_ERR_CORRUPT_FILE naming the first violation. */
WUSH_API wush_status wush_checkpoint_open_mode(const char* path, wush_checkpoint_mode mode,
                                               wush_checkpoint** checkpoint);

/*! wush_checkpoint_destroy() : releases `checkpoint` (and unmaps an opened file once no loaded
 *  qweight borrows from it); NULL is a no-op. */
WUSH_API void wush_checkpoint_destroy(wush_checkpoint* checkpoint);

/*! wush_checkpoint_layer_count() / wush_checkpoint_layer_name() :
 *  The layers of a checkpoint (opened or being written), in file / insertion order. The name
 *  string stays valid until the checkpoint is destroyed.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT (bad handle or index). Thread-safe for an opened
 *          checkpoint. */
WUSH_API wush_status wush_checkpoint_layer_count(const wush_checkpoint* checkpoint, size_t* count);
WUSH_API wush_status wush_checkpoint_layer_name(const wush_checkpoint* checkpoint, size_t index, const char** name);

/*! wush_checkpoint_layer_part_count() / wush_checkpoint_layer_part() :
 *  The parts of layer `name` (wush_checkpoint_add_grouped_layer()) of a checkpoint opened or being
 *  written: *count is 0 for a plain layer. Part `index` (in row order) is the layer *part_name
 *  (valid until the checkpoint is destroyed), output rows [*row_begin, *row_begin + *rows) of
 *  the grouped layer's forward; any of the three outputs may be NULL.
 *  @return WUSH_OK; WUSH_ERR_NOT_FOUND (no layer `name`); WUSH_ERR_INVALID_ARGUMENT (bad handle,
 *          NULL name or count, index out of range). Thread-safe for an opened checkpoint. */
WUSH_API wush_status wush_checkpoint_layer_part_count(const wush_checkpoint* checkpoint, const char* name,
                                                      size_t* count);
WUSH_API wush_status wush_checkpoint_layer_part(const wush_checkpoint* checkpoint, const char* name, size_t index,
                                                const char** part_name, size_t* row_begin, size_t* rows);

/*! wush_checkpoint_load_layer() :
 *  Creates the transform and qweight of layer `name` of an opened checkpoint; `name` may also be
 *  a part of a grouped layer (wush_checkpoint_layer_part()): the group's transform with the
 *  part's rows, which run as the part's own layer (the migration of a grouped file to one layer
 *  per part adds each such pair with wush_checkpoint_add_layer()). The qweight's codes
 *  and scales are used in place from the mapped file (no copy); the file stays mapped while any
 *  loaded qweight lives, even after wush_checkpoint_destroy(). The transform's weight side is
 *  derived from the stored matrices. Either output may be NULL if not wanted. The file must not be
 *  truncated or rewritten in place while open (replace it by rename): a change before the load
 *  gives WUSH_ERR_IO, one after it is undefined (docs/CHECKPOINT.md).
 *  Ownership: release the outputs with wush_transform_destroy() / wush_qweight_destroy().
 *  @return WUSH_OK; WUSH_ERR_NOT_FOUND; WUSH_ERR_CORRUPT_FILE (a singular or non-finite transform,
 *          a NaN scale); WUSH_ERR_INVALID_ARGUMENT. Thread-safe (read only). */
WUSH_API wush_status wush_checkpoint_load_layer(const wush_checkpoint* checkpoint, const char* name,
                                                wush_transform** transform, wush_qweight** qweight);

/*! wush_checkpoint_export_fp_quant() :
 *  Writes the layers of an opened checkpoint in the layout that the FP-Quant / HF-transformers
 *  "fp_quant" integration loads (docs/CHECKPOINT.md): per layer `<name>.qweight` (U8, d_out x d_in/2),
 *  `<name>.scales` (U8, d_out x d_in/G), `<name>.forward_hadamard_matrix` and
 *  `<name>.backward_hadamard_matrix` (BF16: (G, d_in) for WUSH, column block j holding T_j^T; the
 *  shared (G, G) matrix for identity and Hadamard), `<name>.weight_global_scale` and
 *  `<name>.act_global_scale` (F32 (1,): 3 for MXFP4, 10 for NVFP4), atomically to `path`; and,
 *  when `config_path` is not NULL, a JSON file {"quantization_config": {...}} for the model's
 *  config.json. Both files are written to temporaries and committed together: a failed export
 *  leaves neither file changed (only a crash between the two final renames can replace one). An
 *  existing file replaced keeps its permissions.
 *  A checkpoint with at least one WUSH layer is exported per block: every layer, whatever its
 *  kind (a search's guard may keep identity, Hadamard or random on some), as (G, d_in) matrices
 *  and transform_init "wush".
 *  @return WUSH_OK; WUSH_ERR_UNSUPPORTED (a grouped layer, INT4 or mixed formats, WUS or random transforms without
 *          a WUSH layer, NVFP4 with a WUSH layer (the per-block export, which no fp_quant consumer
 *          loads for NVFP4: they apply one shared rotation), a transform not exactly
 *          representable in bf16 — build with WUSH_OPTION_TRANSFORM_DTYPE = WUSH_DTYPE_BF16);
 *          WUSH_ERR_IO; WUSH_ERR_INVALID_ARGUMENT (e.g. not an opened checkpoint, an empty path,
 *          `path` or `config_path` naming the checkpoint's own file, or both naming one file). */
WUSH_API wush_status wush_checkpoint_export_fp_quant(const wush_checkpoint* checkpoint, const char* path,
                                                     const char* config_path, const wush_options* options);

/* ================================================================================================
 * Built-in example layers (seeded, LLM-like), the default data of `wush eval`
 * ==============================================================================================*/

/*! wush_example_layer_count() / wush_example_layer_name() :
 *  The built-in layer shapes: "small_256x512", "small_512x256" (quick, used by the tests),
 *  "4096x4096", "4096x14336", "14336x4096" (Llama-like projections), "384x384", "384x1536",
 *  "1536x384" (a small encoder's attention, FFN up and FFN down projections), "576x576", "576x192",
 *  "576x1536", "1536x576" (a small decoder's q/o, k/v, gate/up and down projections); named
 *  d_in x d_out.
 *  wush_example_layer_name() returns a static name, or NULL for index >= count. */
WUSH_API size_t wush_example_layer_count(void);
WUSH_API const char* wush_example_layer_name(size_t index);

/*! wush_example_layer_shape() : writes d_out and d_in of the named layer.
 *  @return WUSH_OK or WUSH_ERR_INVALID_ARGUMENT (unknown name, NULL). */
WUSH_API wush_status wush_example_layer_shape(const char* name, size_t* d_out, size_t* d_in);

/*! wush_example_layer_generate() :
 *  Generates the named layer deterministically from `seed`: its weight (d_out x d_in) and two
 *  independent activation sets, n_calibration and n_heldout tokens (x d_in), drawn from the same
 *  heavy-tailed, correlated, outlier-channel distribution (docs/EVAL.md describes it). The
 *  weight does not depend on the token counts. Buffers hold the given counts of floats; a
 *  buffer for zero tokens may be NULL.
 *  @return WUSH_OK; WUSH_ERR_INVALID_ARGUMENT; WUSH_ERR_BUFFER_TOO_SMALL. */
WUSH_API wush_status wush_example_layer_generate(const char* name, uint64_t seed, size_t n_calibration,
                                                 size_t n_heldout, float* weight, size_t weight_count,
                                                 float* calibration, size_t calibration_count, float* heldout,
                                                 size_t heldout_count);

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
