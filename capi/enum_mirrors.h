// The C enums of wush.h and their C++ mirrors in src/ share their values, so the C API converts
// between them with mirror<>(); these assertions keep the two lists in step: a value added,
// removed or renumbered on one side only fails the build instead of misreading an enum.
#pragma once

#include <iterator>

#include "common/cpu_isa.h"
#include "pipeline/layer_pipeline.h"
#include "transforms/block_transform.h"
#include "wush/wush.h"

namespace wush::capi {

// A value of one enum as the other, for enums pinned to each other below.
template <typename To, typename From>
constexpr To mirror(From value) {
    return static_cast<To>(static_cast<int>(value));
}

static_assert(int(TransformKind::Identity) == WUSH_TRANSFORM_IDENTITY);
static_assert(int(TransformKind::Hadamard) == WUSH_TRANSFORM_HADAMARD);
static_assert(int(TransformKind::Random) == WUSH_TRANSFORM_RANDOM);
static_assert(int(TransformKind::WUS) == WUSH_TRANSFORM_WUS);
static_assert(int(TransformKind::WUSH) == WUSH_TRANSFORM_WUSH);
static_assert(std::size(kTransformKinds) == WUSH_TRANSFORM_WUSH + 1, "a transform kind without a C value");

static_assert(int(pipeline::GuardSource::None) == WUSH_GUARD_NONE);
static_assert(int(pipeline::GuardSource::Validation) == WUSH_GUARD_VALIDATION);
static_assert(int(pipeline::GuardSource::HoldOut) == WUSH_GUARD_HOLD_OUT);
static_assert(int(pipeline::GuardSource::HoldOutSequences) == WUSH_GUARD_HOLD_OUT_SEQUENCES);
static_assert(int(pipeline::GuardSource::HoldOutDocuments) == WUSH_GUARD_HOLD_OUT_DOCUMENTS);

// The guard's candidates are an index into GuardReport::candidates, in the C enum's order.
static_assert(pipeline::kGuardCandidates == WUSH_GUARD_SHRUNK + 1, "a guard candidate without a C value");
static_assert(WUSH_GUARD_SEARCHED == 0 && WUSH_GUARD_PLAIN == 1 && WUSH_GUARD_IDENTITY == 2 &&
              WUSH_GUARD_HADAMARD == 3 && WUSH_GUARD_RANDOM == 4 && WUSH_GUARD_SHRUNK == 5);

static_assert(int(Isa::Scalar) == WUSH_CPU_ISA_SCALAR);
static_assert(int(Isa::Avx2) == WUSH_CPU_ISA_AVX2);
static_assert(int(Isa::Avx512Vnni) == WUSH_CPU_ISA_AVX512_VNNI);

}  // namespace wush::capi
