// The streaming decode kernel (cuda/gemm/stream_decode_kernel.cuh, stream_decode_plan.h) on the CPU:
// the prepare-time staging of the weight (round trip; each lane's 16-byte fragment holds the codes
// of its unit, read here nibble by nibble from the packed rows), the persistent schedule (every
// chunk of every tile exactly once, balanced, workspace and shared-memory sizes), and the kernel's
// own source run by tests/unit/cuda_host_emulation.h: its output bytes equal the existing decode
// kernel's run with the streaming kernel's partition of k (run the same way, with its split-K
// reduce kernel) for every grid size, with activations staged per chunk or once per work item.
#include "cuda_host_emulation.h"  // first: defines the CUDA spellings

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "formats/group_quantizer.h"
#include "gemm/gemm_decode_kernel.cuh"
#include "gemm/gemm_plan.h"
#include "gemm/stream_decode_kernel.cuh"
#include "gemm/stream_decode_plan.h"

namespace {

using namespace wush;
namespace plan = wush::cuda::plan;
namespace st = wush::cuda::stream;

const wush_format kFormats[] = {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4, WUSH_FORMAT_MXFP4_OCP};

struct Packed {
    std::vector<std::uint8_t> codes, scales;
};

Packed random_packed(wush_format f, std::size_t rows, std::size_t k, std::mt19937& rng, int force_e8m0 = -1) {
    const int sb = st::scale_bytes_of(f);
    Packed p;
    p.codes.resize(rows * k / 2);
    p.scales.resize(rows * (k / st::group_of(f)) * sb);
    for (auto& c : p.codes) c = std::uint8_t(rng());
    for (std::size_t i = 0; i < p.scales.size(); i += sb) {
        if (f == WUSH_FORMAT_NVFP4) {
            p.scales[i] = std::uint8_t(0x20 + rng() % 0x40) | (rng() % 4 == 0 ? 0x80 : 0);  // some negative
        } else if (f == WUSH_FORMAT_INT4) {
            const std::uint16_t b = std::uint16_t(0x3E00 + rng() % 0x0200) | (rng() % 4 == 0 ? 0x8000 : 0);
            p.scales[i] = std::uint8_t(b & 0xFF);
            p.scales[i + 1] = std::uint8_t(b >> 8);
        } else {
            p.scales[i] = std::uint8_t(force_e8m0 >= 0 ? force_e8m0 : int(120 + rng() % 14));
        }
    }
    return p;
}

// ---- staging -----------------------------------------------------------------------------------

TEST(StreamStaging, RoundTripAndZeroPadding) {
    std::mt19937 rng(41);
    for (wush_format f : kFormats)
        for (const auto& [n, k] : {std::pair<std::size_t, std::size_t>{1, 32}, {17, 1056}, {33, 2048}, {40, 3104}}) {
            SCOPED_TRACE(::testing::Message() << "format " << int(f) << " n " << n << " k " << k);
            const Packed w = random_packed(f, n, k, rng);
            const std::vector<std::uint8_t> staged = st::stage_weights(f, n, k, w.codes.data(), w.scales.data());
            const st::Layout l = st::layout_of(f, n, k);
            ASSERT_EQ(staged.size(), l.tiles * l.chunks * std::size_t(st::stage_bytes(f)));
            Packed back{std::vector<std::uint8_t>(w.codes.size(), 0xEE),
                        std::vector<std::uint8_t>(w.scales.size(), 0xEE)};
            st::unstage_weights(f, n, k, staged.data(), back.codes.data(), back.scales.data());
            EXPECT_EQ(back.codes, w.codes);
            EXPECT_EQ(back.scales, w.scales);
            // Every staged byte that holds no weight byte is zero: mark the ones that do.
            std::vector<int> used(staged.size(), 0);
            for (std::size_t r = 0; r < n; ++r) {
                for (std::size_t b = 0; b < k / 2; ++b) ++used[st::staged_code_offset(l, r, b)];
                for (std::size_t s = 0; s < w.scales.size() / n; ++s) ++used[st::staged_scale_offset(f, l, r, s)];
            }
            for (std::size_t i = 0; i < staged.size(); ++i) {
                ASSERT_LE(used[i], 1) << "two weight bytes at staged byte " << i;
                if (!used[i]) {
                    ASSERT_EQ(staged[i], 0) << "padding byte " << i;
                }
            }
        }
}

// The kernel's thread (warp, lane) reads, for its rows j = 0, 1 of stage (tile, chunk), the 16 bytes
// at ((2 warp + j) * 32 + lane) * 16 and its unit's scale bytes at kCodeStageBytes + ((2 warp + j)
// * 32 + lane) * unit_scale_bytes: they must be the codes of elements 32 lane .. 32 lane + 31 of
// the chunk of weight row 16 tile + 2 warp + j, and the scales of their groups.
TEST(StreamStaging, EachLaneFragmentIsItsUnit) {
    std::mt19937 rng(42);
    for (wush_format f : kFormats) {
        const std::size_t n = 35, k = 2080;
        const int G = st::group_of(f), sb = st::scale_bytes_of(f);
        const Packed w = random_packed(f, n, k, rng);
        const std::vector<std::uint8_t> staged = st::stage_weights(f, n, k, w.codes.data(), w.scales.data());
        const st::Layout l = st::layout_of(f, n, k);
        for (std::size_t tile = 0; tile < l.tiles; ++tile)
            for (std::size_t chunk = 0; chunk < l.chunks; ++chunk)
                for (int warp = 0; warp < st::kWarps; ++warp)
                    for (int j = 0; j < st::kRowsPerWarp; ++j)
                        for (int lane = 0; lane < 32; ++lane) {
                            const std::size_t row = tile * 16 + std::size_t(2 * warp + j);
                            const std::size_t e0 = chunk * 1024 + std::size_t(32 * lane);
                            const std::uint8_t* frag =
                                &staged[l.stage_offset(tile, chunk) + std::size_t((2 * warp + j) * 32 + lane) * 16];
                            const std::uint8_t* sc =
                                &staged[l.stage_offset(tile, chunk) + st::kCodeStageBytes +
                                        std::size_t((2 * warp + j) * 32 + lane) * std::size_t(st::unit_scale_bytes(f))];
                            const bool real = row < n && e0 < k;
                            for (int e = 0; e < 32; ++e) {
                                const unsigned got = (frag[e / 2] >> (4 * (e % 2))) & 0xF;
                                const unsigned want =
                                    real ? unsigned(formats::get_nibble(&w.codes[row * k / 2], int(e0 + e))) : 0u;
                                ASSERT_EQ(got, want) << "tile " << tile << " chunk " << chunk << " warp " << warp
                                                     << " j " << j << " lane " << lane << " element " << e;
                            }
                            for (int h = 0; h < 32 / G; ++h)
                                for (int b = 0; b < sb; ++b) {
                                    const std::uint8_t want =
                                        real ? w.scales[(row * (k / G) + (e0 / G) + std::size_t(h)) * sb + b] : 0;
                                    ASSERT_EQ(sc[h * sb + b], want) << "scale of row " << row << " element " << e0;
                                }
                        }
    }
}

// ---- schedule ----------------------------------------------------------------------------------

TEST(StreamSchedule, EveryChunkOnceBalancedAnySize) {
    using wush::cuda::stream_detail::Cursor;
    using wush::cuda::stream_detail::cursor_at;
    using wush::cuda::stream_detail::next_stage;
    for (const auto& [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 4096, 4096},
                                  {1, 14336, 4096},
                                  {1, 4096, 14336},
                                  {16, 4096, 4096},
                                  {17, 4096, 4096},
                                  {32, 40, 14336},
                                  {3, 13, 96}}) {
        const st::Schedule s = st::schedule_of(m, n, k);
        const plan::DecodePlan d = st::split_plan(m, n, k);
        EXPECT_EQ(s.splits, d.splits);
        EXPECT_EQ(s.chunks_per_split, d.chunks_per_split);
        EXPECT_EQ(s.items, plan::ceil_div(n, 16) * d.splits);
        // The partials, then (256-byte aligned) one counter per tile; nothing without split-K.
        const std::size_t partials = s.splits > 1 ? s.splits * m * n * 4 : 0;
        EXPECT_EQ(st::workspace_bytes(m, n, k), partials ? (partials + 255) / 256 * 256 + st::counter_bytes(n) : 0);
        EXPECT_EQ(st::counter_bytes(n), plan::ceil_div(n, 16) * 4);
        for (int blocks_per_sm : {1, 2})
            for (int sms : {1, 7, 108, 132, 1000}) {
                SCOPED_TRACE(::testing::Message()
                             << "m " << m << " n " << n << " k " << k << " grid " << sms << " x " << blocks_per_sm);
                const std::size_t grid = st::grid_blocks(s, sms, blocks_per_sm);
                ASSERT_GE(grid, 1u);
                ASSERT_LE(grid, s.items);
                wush::cuda::stream_detail::StreamParams p{};
                p.chunks = int(s.chunks);
                p.splits = int(s.splits);
                p.chunks_per_split = int(s.chunks_per_split);
                p.items = (long long)s.items;
                wush_emu::g_grid = wush_emu::Dim{unsigned(grid), 1, 1};
                std::vector<int> seen(s.tiles * s.chunks, 0);
                std::size_t most = 0, least = ~std::size_t(0), most_items = 0, least_items = ~std::size_t(0);
                for (std::size_t b = 0; b < grid; ++b) {
                    std::size_t stages = 0;
                    std::set<long long> items;
                    for (Cursor c = cursor_at(p, (long long)b); c.item < p.items; c = next_stage(p, c)) {
                        ASSERT_EQ(c.item % (long long)grid, (long long)b);
                        ++seen[std::size_t(c.item / p.splits) * s.chunks + std::size_t(c.chunk)];
                        ++stages;
                        items.insert(c.item);
                    }
                    most = std::max(most, stages);
                    least = std::min(least, stages);
                    most_items = std::max(most_items, items.size());
                    least_items = std::min(least_items, items.size());
                }
                for (std::size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "stage " << i;
                // Round-robin items: item counts differ by at most one, and no block streams more
                // than its share of items at the longest split.
                EXPECT_LE(most_items - least_items, 1u);
                EXPECT_LE(most, plan::ceil_div(s.items, grid) * s.chunks_per_split);
                EXPECT_GE(least, (s.items / grid) * (s.chunks - (s.splits - 1) * s.chunks_per_split));
            }
    }
}

// The persistent grid's split rule (split_plan), against its statement: at most one work item per
// target slot wherever the tiles leave room to split (so one round), as many as fit below that,
// never more splits than chunks, no empty split; one split once the tiles alone fill the slots; a
// function of the shape alone. The decode kernel's own partition (plan_decode) is not touched.
TEST(StreamSchedule, SplitRuleOneItemPerSlot) {
    for (std::size_t m : {1, 2, 8, 9, 16, 32})
        for (std::size_t n : {13, 40, 576, 1536, 2048, 4096, 4224, 14336})
            for (std::size_t k : {96, 576, 1536, 4096, 9248, 14336}) {
                SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
                const plan::DecodePlan p = st::split_plan(m, n, k);
                const std::size_t tiles = plan::ceil_div(n, 16), chunks = plan::ceil_div(k, 1024);
                const std::size_t target = (st::stream_mr(m) <= 8 ? 2 : 1) * 132;
                ASSERT_EQ(p.blocks_n, tiles);
                ASSERT_EQ(p.chunks, chunks);
                ASSERT_GE(p.splits, 1u);
                ASSERT_LE(p.splits, chunks);
                EXPECT_LT((p.splits - 1) * p.chunks_per_split, chunks) << "an empty split";
                EXPECT_GE(p.splits * p.chunks_per_split, chunks);
                if (tiles >= target) {
                    EXPECT_EQ(p.splits, 1u);
                    continue;
                }
                EXPECT_LE(tiles * p.splits, target);
                // No partition into more (non-empty, equal-length) splits also stays within the target.
                for (std::size_t cps = 1; cps < p.chunks_per_split; ++cps)
                    EXPECT_GT(tiles * plan::ceil_div(chunks, cps), target) << "cps " << cps;
            }
    EXPECT_EQ(st::split_plan(1, 4096, 14336).splits, 1u);     // 256 tiles fill 264 slots
    EXPECT_EQ(st::split_plan(1, 1024, 8192).splits, 4u);      // 64 tiles x 4 = 256
    EXPECT_EQ(plan::plan_decode(1, 4096, 14336).splits, 3u);  // the decode kernel's rule is its own
}

// Activations stay in shared memory for a whole work item where the item's chunks fit the budget,
// per chunk otherwise.
TEST(StreamSchedule, ResidentActivationsWithinBudget) {
    for (int g : {16, 32})
        for (std::size_t m : {1, 2, 4, 8, 16, 32})
            for (std::size_t n : {40, 576, 4096})
                for (std::size_t k : {96, 2048, 5120, 14336, 30720}) {
                    const st::Schedule s = st::schedule_of(m, n, k);
                    const int c = st::resident_chunks(s, g);
                    const int one = st::activation_chunk_bytes(s.mr, g);
                    if (c > 1) {
                        EXPECT_EQ(std::size_t(c), s.chunks_per_split);
                        EXPECT_LE(c * one, st::kResidentActivationBytes);
                        EXPECT_LE(c, st::max_resident_chunks(s.mr, g));
                    } else {
                        EXPECT_TRUE(s.chunks_per_split == 1 ||
                                    s.chunks_per_split * std::size_t(one) > std::size_t(st::kResidentActivationBytes));
                    }
                }
    EXPECT_EQ(st::resident_chunks(st::schedule_of(1, 4096, 14336), 32), 14);  // m = 1: the whole of k
}

TEST(StreamSchedule, SharedMemoryFitsAndRingBudget) {
    for (int g : {16, 32})
        for (int mr = 1; mr <= 32; mr *= 2) {
            EXPECT_LE(st::smem_bytes(mr, g), 227 * 1024) << mr << " " << g;  // sm_90
            // With resident activations, the blocks per SM of the launch bounds still fit 228 KB
            // (sm_90, sm_100; 1 KB reserved per block).
            const int most = std::max(1, st::max_resident_chunks(mr, g));
            EXPECT_LE(st::blocks_per_sm_bound(mr) * (st::smem_bytes(mr, g, most) + 1024), 228 * 1024) << mr << " " << g;
        }
    for (wush_format f : kFormats) {
        EXPECT_EQ(st::stage_bytes(f) % 16, 0);
        EXPECT_LE(st::stage_bytes(f), st::kSlotBytes);
        // In flight while one stage is consumed, with one block per SM: the design's budget.
        EXPECT_GE((st::kStages - 1) * st::stage_bytes(f), st::kInFlightBudgetBytes);
    }
}

// ---- the kernel's source against the existing decode kernel's ----------------------------------

struct Aligned {
    std::vector<std::uint8_t> buf;
    std::uint8_t* p;
    explicit Aligned(const std::vector<std::uint8_t>& v) : buf(v.size() + 16) {
        p = buf.data() + ((16 - reinterpret_cast<std::uintptr_t>(buf.data()) % 16) % 16);
        std::memcpy(p, v.data(), v.size());
    }
};

float alpha_q_of(wush_format f) {
    const double t = f == WUSH_FORMAT_MXFP4 ? 1.0 / 3.0 : f == WUSH_FORMAT_NVFP4 ? 0.1 : 1.0;
    return float(t * t) * 0.25f;
}

template <int MR, int G>
void run_old(const cuda::decode_detail::DecodeParams& p, wush_emu::Dim grid) {
    wush_emu::launch(grid, plan::kDecodeWarps * 32, 0, [&] { cuda::decode_detail::decode_gemm_kernel<MR, G>(p); });
}

// The existing decode path's output bytes (decode kernel, then its split-K reduce), with k cut
// into splits of `chunks_per_split` chunks.
std::vector<std::uint8_t> old_decode(wush_format f, std::size_t m, std::size_t n, std::size_t k, const Packed& a,
                                     const Packed& w, bool bf16, const cuda::OutputBias& bias,
                                     std::size_t chunks_per_split) {
    const Aligned ac(a.codes), wc(w.codes);
    const plan::DecodePlan pl = plan::with_chunks_per_split(plan::plan_decode(m, n, k), chunks_per_split);
    const std::size_t ybytes = m * n * (bf16 ? 2 : 4);
    std::vector<std::uint8_t> y(ybytes, 0xAB);
    std::vector<float> partial(pl.splits * m * n, NAN);
    cuda::decode_detail::DecodeParams p;
    p.format = f;
    p.m = int(m);
    p.n = int(n);
    p.k = (long long)k;
    p.a_codes = ac.p;
    p.a_scales = a.scales.data();
    p.w_codes = wc.p;
    p.w_scales = w.scales.data();
    p.alpha_q = alpha_q_of(f);
    p.y = y.data();
    p.y_bf16 = bf16;
    p.bias = bias;
    p.partial = pl.splits > 1 ? partial.data() : nullptr;
    p.split_len = (long long)(pl.chunks_per_split * plan::kDecodeChunk);
    const wush_emu::Dim grid{unsigned(pl.blocks_n), unsigned(pl.splits), unsigned(pl.row_passes)};
    const int G = st::group_of(f);
#define WUSH_OLD(MRV)                       \
  case MRV:                                 \
    if (G == 16) run_old<MRV, 16>(p, grid); \
    else run_old<MRV, 32>(p, grid);         \
    break;
    switch (pl.mr) {
        WUSH_OLD(1)
        WUSH_OLD(2)
        WUSH_OLD(4)
        WUSH_OLD(8)
        WUSH_OLD(16)
        default: ADD_FAILURE() << pl.mr;
    }
#undef WUSH_OLD
    if (pl.splits > 1)
        wush_emu::launch(wush_emu::Dim{2, 1, 1}, 64, 0, [&] {
            cuda::decode_detail::splitk_reduce_kernel(partial.data(), int(pl.splits), m * n, n, y.data(), bf16, bias);
        });
    return y;
}

template <int MR, int G>
void run_new(const cuda::stream_detail::StreamParams& p, unsigned grid) {
    wush_emu::launch(wush_emu::Dim{grid, 1, 1}, st::kThreads, std::size_t(st::smem_bytes(MR, G, p.act_chunks)),
                     [&] { cuda::stream_detail::stream_decode_kernel<MR, G>(p); });
}

// A launch's partition of k and its activation staging: schedule_of's and resident_chunks' by
// default; the tests also force others on small shapes (the kernel takes any).
struct Partition {
    std::size_t chunks_per_split = 0;  // 0: schedule_of's
    int act_chunks = 0;                // 0: resident_chunks'; 1: per chunk; chunks_per_split: resident
};

st::Schedule schedule_with(std::size_t m, std::size_t n, std::size_t k, const Partition& part) {
    st::Schedule s = st::schedule_of(m, n, k);
    if (part.chunks_per_split > 0) {
        const plan::DecodePlan p = plan::with_chunks_per_split(st::split_plan(m, n, k), part.chunks_per_split);
        s.chunks_per_split = p.chunks_per_split;
        s.splits = p.splits;
        s.items = s.tiles * s.splits;
    }
    return s;
}

std::vector<std::uint8_t> stream_decode(wush_format f, std::size_t m, std::size_t n, std::size_t k, const Packed& a,
                                        const Packed& w, bool bf16, unsigned grid, const cuda::OutputBias& bias,
                                        const Partition& part = {}) {
    const Aligned ac(a.codes);
    const std::vector<std::uint8_t> staged_v = st::stage_weights(f, n, k, w.codes.data(), w.scales.data());
    const Aligned staged(staged_v);
    const st::Schedule s = schedule_with(m, n, k, part);
    std::vector<std::uint8_t> y(m * n * (bf16 ? 2 : 4), 0xAB);
    // The launch's workspace as launch_stream_decode_gemm lays it out: NaN partials, then the
    // counters, which the launch zeroes on its stream before the kernel (done here by hand).
    // (A forced partition gets the same layout at its own size.)
    const std::size_t partials = s.splits > 1 ? s.splits * m * n * sizeof(float) : 0;
    const std::size_t at = (partials + 255) / 256 * 256;
    if (part.chunks_per_split == 0) {
        EXPECT_EQ(st::counters_offset(m, n, k), at);
        EXPECT_EQ(st::workspace_bytes(m, n, k), partials ? at + st::counter_bytes(n) : 0);
    }
    std::vector<float> workspace((at + st::counter_bytes(n) + 3) / 4, NAN);
    float* partial = workspace.data();
    unsigned* counters = nullptr;
    if (s.splits > 1) {
        counters = reinterpret_cast<unsigned*>(reinterpret_cast<std::uint8_t*>(workspace.data()) + at);
        std::memset(counters, 0, st::counter_bytes(n));
    }
    cuda::stream_detail::StreamParams p;
    p.format = f;
    p.m = int(m);
    p.n = int(n);
    p.k = (long long)k;
    p.a_codes = ac.p;
    p.a_scales = a.scales.data();
    p.stages = staged.p;
    p.alpha_q = alpha_q_of(f);
    p.y = y.data();
    p.y_bf16 = bf16;
    p.bias = bias;
    p.partial = s.splits > 1 ? partial : nullptr;
    p.counters = counters;
    p.chunks = int(s.chunks);
    p.splits = int(s.splits);
    p.chunks_per_split = int(s.chunks_per_split);
    p.stage_bytes = st::stage_bytes(f);
    p.act_chunks = part.act_chunks > 0 ? part.act_chunks : st::resident_chunks(s, st::group_of(f));
    p.items = (long long)s.items;
    grid = unsigned(std::min<std::size_t>(grid, s.items));
    const int G = st::group_of(f);
#define WUSH_NEW(MRV)                       \
  case MRV:                                 \
    if (G == 16) run_new<MRV, 16>(p, grid); \
    else run_new<MRV, 32>(p, grid);         \
    break;
    switch (s.mr) {
        WUSH_NEW(1)
        WUSH_NEW(2)
        WUSH_NEW(4)
        WUSH_NEW(8)
        WUSH_NEW(16)
        WUSH_NEW(32)
        default: ADD_FAILURE() << s.mr;
    }
#undef WUSH_NEW
    // Every split of every tile arrived once (and nothing reset a counter under a later arrival).
    for (std::size_t t = 0; counters != nullptr && t < s.tiles; ++t)
        EXPECT_EQ(counters[t], unsigned(s.splits)) << "tile " << t;
    return y;
}

void check_equal(wush_format f, std::size_t m, std::size_t n, std::size_t k, std::mt19937& rng,
                 std::initializer_list<unsigned> grids, int force_a = -1, const cuda::OutputBias& bias = {},
                 const Partition& part = {}) {
    SCOPED_TRACE(::testing::Message() << "format " << int(f) << " m " << m << " n " << n << " k " << k << " split "
                                      << part.chunks_per_split << " resident " << part.act_chunks);
    const Packed a = random_packed(f, m, k, rng, force_a), w = random_packed(f, n, k, rng);
    const st::Schedule s = schedule_with(m, n, k, part);
    for (bool bf16 : {false, true}) {
        const std::vector<std::uint8_t> want = old_decode(f, m, n, k, a, w, bf16, bias, s.chunks_per_split);
        for (unsigned grid : grids) {
            const std::vector<std::uint8_t> got = stream_decode(f, m, n, k, a, w, bf16, grid, bias, part);
            std::size_t diff = 0;
            for (std::size_t i = 0; i < want.size(); ++i) diff += got[i] != want[i];
            EXPECT_EQ(diff, 0u) << "bytes differ from the decode kernel's (grid " << grid << ", bf16 " << bf16 << ")";
        }
    }
}

TEST(StreamDecodeEmulation, BytesEqualTheDecodeKernelsOnAnyGrid) {
    std::mt19937 rng(43);
    for (wush_format f : kFormats) {
        check_equal(f, 1, 13, 96, rng, {1, 3});       // one chunk, ragged rows and units
        check_equal(f, 3, 40, 2080, rng, {1, 2, 7});  // 3 splits over 3 tiles: the fix-up, any grid
        check_equal(f, 17, 8, 160, rng, {1});         // m > 16: one pass here, two there
    }
    check_equal(WUSH_FORMAT_NVFP4, 32, 20, 2048, rng, {3});         // 32 rows in one pass, 2 chunks
    check_equal(WUSH_FORMAT_MXFP4, 2, 17, 9248, rng, {2});          // 10 stages per block: the ring wraps
    check_equal(WUSH_FORMAT_MXFP4, 3, 9, 96, rng, {2}, 127 + 103);  // huge activation scales
}

// Activations staged once per work item (act_chunks = chunks_per_split) against per chunk, both
// against the decode kernel run with the same partition: splits of several chunks over a grid
// where a block's next item has the same k range (grid a multiple of the splits: kept) and where it
// has another (restaged), ragged last split and last chunk included.
TEST(StreamDecodeEmulation, ResidentActivationsSameBytes) {
    std::mt19937 rng(45);
    for (wush_format f : kFormats)
        for (int resident : {1, 2}) {
            // 5 chunks in splits of 2, 2, 1 (the last chunk ragged) over 3 tiles.
            check_equal(f, 2, 40, 4640, rng, {1, 2, 3, 7}, -1, {}, Partition{2, resident});
        }
    // One split of all 4 chunks, resident (as schedule_of gives m = 1 once the tiles fill the GPU).
    check_equal(WUSH_FORMAT_MXFP4, 1, 40, 3104, rng, {1, 2}, -1, {}, Partition{4, 4});
    check_equal(WUSH_FORMAT_NVFP4, 3, 24, 3104, rng, {2}, -1, {}, Partition{4, 4});
}

// A bias (wush_linear_run_bias) is added in both kernels' final stores: on the direct store (one
// split) and in the fix-up (several), so the two paths still agree byte for byte. The bias-free
// run beside it must differ, or the bias never reached y.
TEST(StreamDecodeEmulation, BiasAddedInTheFinalStoreAsTheDecodeKernels) {
    std::mt19937 rng(44);
    std::vector<float> b(40);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.37f * float(i) - 5.0f;
    unsigned long long flag = ~0ull;
    const cuda::OutputBias bias{b.data(), WUSH_DTYPE_F32, &flag};
    check_equal(WUSH_FORMAT_NVFP4, 1, 13, 96, rng, {1, 3}, -1, bias);    // one split: the direct store
    check_equal(WUSH_FORMAT_MXFP4, 3, 40, 2080, rng, {1, 2}, -1, bias);  // 3 splits: the fix-up
    const Packed a = random_packed(WUSH_FORMAT_MXFP4, 3, 2080, rng),
                 w = random_packed(WUSH_FORMAT_MXFP4, 40, 2080, rng);
    EXPECT_NE(stream_decode(WUSH_FORMAT_MXFP4, 3, 40, 2080, a, w, false, 2, bias),
              stream_decode(WUSH_FORMAT_MXFP4, 3, 40, 2080, a, w, false, 2, cuda::OutputBias{}));
    EXPECT_EQ(flag, ~0ull) << "a finite bias was reported";
}

}  // namespace
