// `wush formats`: the round-trip error of every block format on built-in test tensors.
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"

namespace {

struct Tensor {
    const char* name;
    const char* description;
    std::vector<float> values;
};

// Built-in data: three seeded tensors with the value distributions LLM layers show.
std::vector<Tensor> builtin_tensors(std::size_t rows, std::size_t cols, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::student_t_distribution<float> heavy(3.0f);
    const std::size_t n = rows * cols;
    std::vector<Tensor> t = {{"gaussian", "N(0, 1)", std::vector<float>(n)},
                             {"student-t3", "Student t, 3 dof (heavy tails)", std::vector<float>(n)},
                             {"outliers", "N(0, 1), 4 channels x 30", std::vector<float>(n)}};
    for (std::size_t i = 0; i < n; ++i) {
        t[0].values[i] = normal(rng);
        t[1].values[i] = heavy(rng);
        const std::size_t col = i % cols;
        t[2].values[i] = normal(rng) * ((col % (cols / 4 + 1)) == 7 ? 30.0f : 1.0f);
    }
    return t;
}

struct Errors {
    double relative_mse;  // ||x - q(x)||^2 / ||x||^2
    double max_abs;
};

int quantize_error(wush_context* ctx, wush_format format, const Tensor& t, std::size_t rows, std::size_t cols,
                   Errors* out) {
    std::size_t codes_bytes = 0, scales_bytes = 0;
    wush_status st = wush_format_buffer_sizes(format, rows, cols, &codes_bytes, &scales_bytes);
    if (st != WUSH_OK) return cli::report("wush_format_buffer_sizes", st);
    std::vector<std::uint8_t> codes(codes_bytes), scales(scales_bytes);
    std::vector<float> back(rows * cols);
    st = wush_quantize_rows(ctx, format, WUSH_DTYPE_F32, t.values.data(), rows, cols, codes.data(), codes.size(),
                            scales.data(), scales.size());
    if (st != WUSH_OK) return cli::report("wush_quantize_rows", st);
    st = wush_dequantize_rows(ctx, format, codes.data(), codes.size(), scales.data(), scales.size(), rows, cols,
                              back.data(), back.size());
    if (st != WUSH_OK) return cli::report("wush_dequantize_rows", st);
    double err = 0.0, ref = 0.0, max_abs = 0.0;
    for (std::size_t i = 0; i < back.size(); ++i) {
        const double d = double(back[i]) - double(t.values[i]);
        err += d * d;
        ref += double(t.values[i]) * double(t.values[i]);
        max_abs = std::fmax(max_abs, std::fabs(d));
    }
    *out = {err / ref, max_abs};
    return 0;
}

}  // namespace

int cmd_formats(int argc, char** argv) {
    cli::Args a(argc, argv, {}, {"--rows", "--cols", "--seed"});
    // Bounded so that rows x cols floats are far from overflowing; the memory check is below
    // (three tensors and the round trip's buffers).
    constexpr std::size_t kMaxDim = std::size_t(1) << 24;
    const std::size_t rows = a.get_size("--rows", 256, 1, kMaxDim), cols = a.get_size("--cols", 4096, 1, kMaxDim);
    const std::size_t seed = a.get_size("--seed", 1, 0, UINT_MAX);
    if (!a.ok()) return cli::usage_error("formats", a);
    if (!cli::fits_in_memory("formats", std::to_string(rows) + " x " + std::to_string(cols) + " tensors",
                             cli::mul_or_max(cli::mul_or_max(rows, cols), 5 * sizeof(float))))
        return 1;
    wush_context* ctx = nullptr;
    wush_status st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx);
    if (st != WUSH_OK) return cli::report("wush_context_create", st);
    const std::vector<Tensor> tensors = builtin_tensors(rows, cols, unsigned(seed));
    const wush_format formats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_MXFP4_OCP, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4};
    std::printf("libwush %s: round-trip error of %zu x %zu built-in tensors (seed %zu)\n", wush_version_string(), rows,
                cols, seed);
    std::printf("%-12s %-10s %14s %10s %12s\n", "tensor", "format", "relative MSE", "SQNR dB", "max |err|");
    int rc = 0;
    for (const Tensor& t : tensors) {
        for (wush_format f : formats) {
            Errors e{};
            rc = quantize_error(ctx, f, t, rows, cols, &e);
            if (rc != 0) break;
            std::printf("%-12s %-10s %14.6f %10.2f %12.4f\n", t.name, wush_format_name(f), e.relative_mse,
                        -10.0 * std::log10(e.relative_mse), e.max_abs);
        }
        if (rc != 0) break;
    }
    wush_context_destroy(ctx);
    return rc;
}
