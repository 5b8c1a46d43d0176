#include "formats/block_format.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/cpu_isa.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/names.h"
#include "formats/group_quantizer.h"
#include "formats/quantize_rows_kernel.h"

namespace wush::formats {

namespace {

constexpr FormatSpec kSpecs[] = {
    {WUSH_FORMAT_MXFP4, "mxfp4", 32, 1, 3.0},
    {WUSH_FORMAT_NVFP4, "nvfp4", 16, 1, 10.0},
    {WUSH_FORMAT_INT4, "int4", 32, 2, 1.0},
    {WUSH_FORMAT_MXFP4_OCP, "mxfp4_ocp", 32, 1, 1.0},
};

}  // namespace

const FormatSpec& spec(wush_format format) {
    for (const FormatSpec& s : kSpecs)
        if (s.id == format) return s;
    fail(WUSH_ERR_INVALID_ARGUMENT, "unknown wush_format " + std::to_string(int(format)));
}

const FormatSpec* spec_by_name(const char* name) {
    if (name == nullptr) return nullptr;
    for (const FormatSpec& s : kSpecs)
        if (same_name(s.name, name)) return &s;  // common/names.h's case rule
    return nullptr;
}

void require_group(const FormatSpec& format, std::size_t block_size) {
    if (format.group != block_size)
        fail(WUSH_ERR_INVALID_ARGUMENT, std::string("format ") + format.name + " has group size " +
                                            std::to_string(format.group) +
                                            " but the transform has block size G = " + std::to_string(block_size));
}

PackedSizes packed_sizes(const FormatSpec& f, std::size_t n_rows, std::size_t d_in) {
    if (d_in == 0 || d_in % f.group != 0)
        fail(WUSH_ERR_INVALID_ARGUMENT, "d_in = " + std::to_string(d_in) + " is not a positive multiple of the " +
                                            f.name + " group size " + std::to_string(f.group));
    const std::size_t elements = checked_mul(n_rows, d_in, "n_rows * d_in");
    return {elements / 2, checked_mul(elements / f.group, f.scale_bytes, "scale bytes")};
}

namespace {

// Serial kernel over `groups` consecutive groups of one contiguous float run.
void quantize_groups(const FormatSpec& f, const float* x, std::size_t groups, std::uint8_t* codes,
                     std::uint8_t* scales) {
    for (std::size_t k = 0; k < groups; ++k)
        quantize_group(f.id, x + k * f.group, int(f.group), codes + k * f.group / 2, scales + k * f.scale_bytes);
}

// The AVX2 path of the E2M1 formats for one row of `groups` groups: the groups' magnitudes and
// codes by the kernel, each scale by the float64 definition's own function (group_quantizer.h),
// so the bytes are quantize_groups'. Per-thread buffers of a row's groups.
class E2m1Rows {
public:
    explicit E2m1Rows(std::size_t groups) : amax_(groups), mul_(groups), div_(groups) {}

    void quantize(const FormatSpec& f, const float* x, std::uint8_t* codes, std::uint8_t* scales) {
        const int g = int(f.group);
        const std::size_t groups = amax_.size();
        avx2::group_amax(x, groups, g, amax_.data());
        for (std::size_t k = 0; k < groups; ++k) {
            const E2m1GroupScale s = f.id == WUSH_FORMAT_NVFP4
                                         ? nvfp4_group_scale(double(amax_[k]))
                                         : mx_group_scale(double(amax_[k]), f.id == WUSH_FORMAT_MXFP4_OCP);
            scales[k] = s.scale;
            mul_[k] = s.mul;
            div_[k] = s.div;
        }
        avx2::encode_e2m1(x, groups, g, mul_.data(), div_.data(), f.id == WUSH_FORMAT_NVFP4, codes);
    }

private:
    std::vector<float> amax_;
    std::vector<double> mul_, div_;
};

// Whether quantize_rows takes the AVX2 path for `f` under `isa` (the E2M1 formats; INT4's scale
// sums squares in an order its definition fixes, so it stays scalar).
bool has_e2m1_kernel(const FormatSpec& f, Isa isa) {
    return f.id != WUSH_FORMAT_INT4 && isa != Isa::Scalar && isa_supported(Isa::Avx2);
}

void require_room(const FormatSpec& f, std::size_t n_rows, std::size_t d_in, std::size_t codes, std::size_t scales) {
    const PackedSizes need = packed_sizes(f, n_rows, d_in);
    require(codes >= need.codes && scales >= need.scales, "quantize_rows: buffers smaller than the shape requires");
}

// Quantizes every row in parallel; row(r, scratch) gives row r as floats (scratch: a per-thread
// buffer it may fill).
template <typename Row>
void quantize_each_row(const FormatSpec& f, std::size_t n_rows, std::size_t d_in, std::span<std::uint8_t> codes,
                       std::span<std::uint8_t> scales, bool simd, Row row) {
    const std::size_t groups_per_row = d_in / f.group;
    const std::size_t row_scales = groups_per_row * f.scale_bytes;
#pragma omp parallel
    {
        std::vector<float> scratch;
        E2m1Rows e2m1(simd ? groups_per_row : 0);
#pragma omp for schedule(static)
        for (std::size_t r = 0; r < n_rows; ++r) {
            const float* xr = row(r, scratch);
            std::uint8_t* c = codes.data() + r * d_in / 2;
            std::uint8_t* s = scales.data() + r * row_scales;
            if (simd) e2m1.quantize(f, xr, c, s);
            else quantize_groups(f, xr, groups_per_row, c, s);
        }
    }
}

}  // namespace

void quantize_rows(const FormatSpec& f, std::span<const float> x, std::size_t n_rows, std::size_t d_in,
                   std::span<std::uint8_t> codes, std::span<std::uint8_t> scales, Isa isa) {
    require_room(f, n_rows, d_in, codes.size(), scales.size());
    require(x.size() >= n_rows * d_in, "quantize_rows: input smaller than the shape requires");
    quantize_each_row(f, n_rows, d_in, codes, scales, has_e2m1_kernel(f, isa),
                      [&](std::size_t r, std::vector<float>&) { return x.data() + r * d_in; });
}

void quantize_rows(const FormatSpec& f, wush_dtype dtype, const void* x, std::size_t n_rows, std::size_t d_in,
                   std::span<std::uint8_t> codes, std::span<std::uint8_t> scales) {
    if (dtype == WUSH_DTYPE_F32) {
        quantize_rows(f, {static_cast<const float*>(x), n_rows * d_in}, n_rows, d_in, codes, scales);
        return;
    }
    require_room(f, n_rows, d_in, codes.size(), scales.size());
    quantize_each_row(f, n_rows, d_in, codes, scales, has_e2m1_kernel(f, best_isa()),
                      [&](std::size_t r, std::vector<float>& row) {
                          row.resize(d_in);
                          to_float(dtype, x, r * d_in, row);
                          return static_cast<const float*>(row.data());
                      });
}

void require_encodable(const FormatSpec& f, wush_dtype dtype, const void* x, std::size_t n_rows, std::size_t d_in,
                       const char* what) {
    // Other formats never overflow: OCP MXFP4's largest decoded value is 6 * 2^125, NVFP4's
    // 6 * 448 / 10, and INT4's (q + 0.5) s stays within half a step of |x| (s <= 0.34 rms).
    if (f.id != WUSH_FORMAT_MXFP4) return;
    // |x| * 3 is exact in float64 (24 + 2 bits), as is 5 * 2^127: the comparison is the rule's.
    const double limit = std::ldexp(5.0, 127);
    std::vector<float> row(d_in);
    for (std::size_t r = 0; r < n_rows; ++r) {
        to_float(dtype, x, r * d_in, row);
        for (std::size_t c = 0; c < d_in; ++c)
            if (std::fabs(double(row[c])) * 3.0 > limit)
                fail(WUSH_ERR_NON_FINITE, std::string(what) + " holds a value at row " + std::to_string(r) +
                                              ", column " + std::to_string(c) +
                                              " whose mxfp4 code would decode beyond the float32 "
                                              "range (|x| > 5/3 * 2^127)");
    }
}

void require_decodable(const FormatSpec& f, std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales,
                       std::size_t n_rows, std::size_t d_in) {
    // No element of any format exceeds 8 in magnitude (E2M1: 6, INT4: 7.5), so only groups whose
    // scale is within a factor 8 of overflow need their codes looked at.
    constexpr double kMaxElement = 8.0;
    const PackedSizes need = packed_sizes(f, n_rows, d_in);
    require(codes.size() >= need.codes && scales.size() >= need.scales, "buffers smaller than the shape requires");
    const std::size_t groups_per_row = d_in / f.group;
    const std::size_t groups = n_rows * groups_per_row;
    for (std::size_t k = 0; k < groups; ++k) {
        const double scale = decode_scale(f.id, scales.data() + k * f.scale_bytes);
        const auto where = [&] {
            return std::string(f.name) + " scale of row " + std::to_string(k / groups_per_row) + ", group " +
                   std::to_string(k % groups_per_row);
        };
        if (!std::isfinite(scale)) fail(WUSH_ERR_NON_FINITE, where() + " is NaN or infinite");
        if (std::fabs(scale) * kMaxElement / f.tensor_divisor <= double(std::numeric_limits<float>::max())) continue;
        const std::uint8_t* group_codes = codes.data() + k * f.group / 2;
        for (int i = 0; i < int(f.group); ++i)
            if (std::isinf(float(double(decode_element(f.id, get_nibble(group_codes, i))) * scale / f.tensor_divisor)))
                fail(WUSH_ERR_NON_FINITE,
                     where() + " decodes element " + std::to_string(i) + " beyond the float32 range");
    }
}

void dequantize_rows(const FormatSpec& f, std::span<const std::uint8_t> codes, std::span<const std::uint8_t> scales,
                     std::size_t n_rows, std::size_t d_in, std::span<float> y) {
    const PackedSizes need = packed_sizes(f, n_rows, d_in);
    require(codes.size() >= need.codes && scales.size() >= need.scales && y.size() >= n_rows * d_in,
            "dequantize_rows: buffers smaller than the shape requires");
    require_decodable(f, codes, scales, n_rows, d_in);
    const std::size_t groups = n_rows * (d_in / f.group);
    // The 16 element values, decoded once (decode_element per element was most of this loop).
    float element[16];
    for (int c = 0; c < 16; ++c) element[c] = decode_element(f.id, std::uint8_t(c));
#pragma omp parallel for schedule(static)
    for (std::size_t k = 0; k < groups; ++k) {
        // element * scale is exact in double; the division by the per-tensor divisor rounds once.
        const double scale = decode_scale(f.id, scales.data() + k * f.scale_bytes);
        const std::uint8_t* group_codes = codes.data() + k * f.group / 2;
        float* out = y.data() + k * f.group;
        for (int i = 0; i < int(f.group); ++i)
            out[i] = float(double(element[get_nibble(group_codes, i)]) * scale / f.tensor_divisor);
    }
}

}  // namespace wush::formats
