// The roofline side of tests/cuda/check_ptxas.sh: from the streaming decode kernel's compile-time
// constants (cuda/gemm/stream_decode_plan.h) and the registers ptxas gave an instantiation, the blocks
// per SM the architecture allows and so the bytes of weight stages in flight per SM; and the time
// those weights need at the HBM bandwidth of an H100 / H200 (the floor a GPU run is compared with).
//
//   roofline occupancy SM MR G REGS [STAGES]   exit 1 when the bytes in flight are under budget
//                                              (STAGES overrides the ring depth: the self-test)
//   roofline predict                           predicted times of the design shapes
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gemm/stream_decode_plan.h"

namespace {

namespace st = wush::cuda::stream;

struct Arch {
    int smem_per_sm, smem_per_block_max, reserved_per_block;
};

// Per-SM limits (CUDA C++ Programming Guide, "Compute Capabilities"): 64 K registers and 2048
// threads on both; shared memory 164 KB (sm_80) / 228 KB (sm_90) per SM, 1 KB reserved per block.
bool arch_of(int sm, Arch* a) {
    if (sm == 80) *a = Arch{164 * 1024, 163 * 1024, 1024};
    else if (sm == 90) *a = Arch{228 * 1024, 227 * 1024, 1024};
    else return false;
    return true;
}

int blocks_per_sm(const Arch& a, int regs, int smem) {
    const int warps = st::kThreads / 32;
    const int warp_regs = (regs * 32 + 255) / 256 * 256;  // allocated per warp in units of 256
    const int by_regs = regs > 255 ? 0 : 65536 / warp_regs / warps;
    const int by_smem = smem > a.smem_per_block_max ? 0 : a.smem_per_sm / (smem + a.reserved_per_block);
    const int by_threads = 2048 / st::kThreads;
    int b = by_regs < by_smem ? by_regs : by_smem;
    return b < by_threads ? b : by_threads;
}

int occupancy(int sm, int mr, int group, int regs, int stages) {
    Arch a{};
    if (!arch_of(sm, &a)) {
        std::fprintf(stderr, "roofline: no limits for sm_%d\n", sm);
        return 2;
    }
    const int smem = st::smem_bytes(mr, group) - (st::kStages - stages) * st::kSlotBytes;
    const int blocks = blocks_per_sm(a, regs, smem);
    // The smallest stage of this G (MXFP4 for G = 32): the least that can be in flight.
    const int stage = st::stage_bytes(group == 16 ? WUSH_FORMAT_NVFP4 : WUSH_FORMAT_MXFP4);
    const int in_flight = (stages - 1) * stage * blocks;  // one stage is being consumed
    const bool ok = in_flight >= st::kInFlightBudgetBytes;
    std::printf(
        "sm_%d stream_decode<MR=%d, G=%d>: %d registers, %d B shared -> %d blocks/SM, %d x %d B = %.1f KB "
        "in flight per SM (budget %d KB): %s\n",
        sm, mr, group, regs, smem, blocks, stages - 1, stage, in_flight / 1024.0, st::kInFlightBudgetBytes / 1024,
        ok ? "ok" : "UNDER BUDGET");
    return ok ? 0 : 1;
}

// Bytes the kernel streams for one product: the staged weight (codes and scales, padding
// included) plus the activations (negligible at m <= 32, counted anyway).
double bytes_of(wush_format f, std::size_t m, std::size_t n, std::size_t k) {
    const double act = double(m) * double(k) / 2 + double(m) * double(k) / st::group_of(f) * st::scale_bytes_of(f);
    return double(st::layout_of(f, n, k).bytes()) + act;
}

void predict() {
    struct Gpu {
        const char* name;
        double bytes_per_s;  // HBM datasheet bandwidth
    };
    const Gpu gpus[] = {{"H100 SXM", 3.35e12}, {"H200", 4.8e12}};
    const struct {
        std::size_t m, n, k;
    } shapes[] = {{1, 4096, 4096}, {16, 4096, 4096}, {1, 14336, 4096}, {1, 4096, 14336}};
    for (wush_format f : {WUSH_FORMAT_MXFP4, WUSH_FORMAT_NVFP4, WUSH_FORMAT_INT4})
        for (const auto& s : shapes) {
            const double b = bytes_of(f, s.m, s.n, s.k);
            std::printf("predicted stream decode %s m=%zu %zux%zu: %.2f MB",
                        f == WUSH_FORMAT_MXFP4   ? "mxfp4"
                        : f == WUSH_FORMAT_NVFP4 ? "nvfp4"
                                                 : "int4",
                        s.m, s.n, s.k, b / 1e6);
            for (const Gpu& g : gpus) std::printf(", %s %.2f us", g.name, b / g.bytes_per_s * 1e6);
            std::printf("\n");
        }
}

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "predict") == 0) {
        predict();
        return 0;
    }
    if ((argc == 6 || argc == 7) && std::strcmp(argv[1], "occupancy") == 0) {
        const int stages = argc == 7 ? std::atoi(argv[6]) : st::kStages;
        return occupancy(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]), stages);
    }
    std::fprintf(stderr, "usage: roofline occupancy SM MR G REGS [STAGES] | roofline predict\n");
    return 2;
}
