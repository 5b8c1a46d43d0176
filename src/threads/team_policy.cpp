#include "threads/team_policy.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

namespace wush::threads {

namespace {

// Jobs of one kind whose work differs by more than a factor 2 are timed apart: a kernel's time
// per unit of work changes with the shape (memory-bound at one token, compute-bound at many).
int size_class(double work) {
    return work > 0.0 ? std::ilogb(work) : -1000;
}

std::size_t hash(std::uintptr_t kind, int size_class) {
    const std::uint64_t h = (std::uint64_t(kind) >> 4) * 0x9E3779B97F4A7C15ull +
                            std::uint64_t(std::int64_t(size_class)) * 0xC2B2AE3D27D4EB4Full;
    return std::size_t(h >> 58);  // 64 slots
}

// The slot of (kind, size class) in a table of Rates (TeamPolicy's, PoolChoice's): found, or
// reclaimed from whatever kind held it (a collision forgets the other kind's times).
template <class Rate, std::size_t N>
Rate& claim_slot(std::array<Rate, N>& rates, std::uintptr_t kind, double work) {
    const int cls = size_class(work);
    Rate& r = rates[hash(kind, cls)];
    if (r.kind != kind || r.size_class != cls) {
        r = Rate{};
        r.kind = kind;
        r.size_class = cls;
    }
    return r;
}

// A running mean that follows a machine whose load changes within a few dozen calls.
void update(double& mean, double sample) {
    mean = mean > 0.0 ? mean + 0.125 * (sample - mean) : sample;
}

}  // namespace

double TeamPolicy::Samples::median() const {
    const unsigned count = std::min(n, kSamples);
    if (count == 0) return 0.0;
    std::array<double, kSamples> sorted = v;
    for (unsigned i = 1; i < count; ++i)  // insertion sort: at most 8 values
        for (unsigned j = i; j > 0 && sorted[j - 1] > sorted[j]; --j) std::swap(sorted[j - 1], sorted[j]);
    return count % 2 ? sorted[count / 2] : 0.5 * (sorted[count / 2 - 1] + sorted[count / 2]);
}

const TeamPolicy::Rate* TeamPolicy::find(std::uintptr_t kind, double work) const {
    const int cls = size_class(work);
    const Rate& r = rates_[hash(kind, cls)];
    return r.kind == kind && r.size_class == cls ? &r : nullptr;
}

TeamPolicy::Rate* TeamPolicy::find(std::uintptr_t kind, double work) {
    return const_cast<Rate*>(static_cast<const TeamPolicy*>(this)->find(kind, work));
}

TeamPolicy::Rate& TeamPolicy::slot(std::uintptr_t kind, double work) {
    return claim_slot(rates_, kind, work);
}

double TeamPolicy::estimate(std::uintptr_t kind, double work) const {
    const Rate* r = find(kind, work);
    if (r == nullptr) return -1.0;
    const double rate = r->alone.n > 0 ? r->alone.median() : r->chunk_estimate;
    return rate > 0.0 ? rate * work : -1.0;
}

double TeamPolicy::penalty(double now) const {
    if (penalty_ <= 0.0) return 0.0;
    return penalty_ * std::exp2(-(now - penalty_at_) / half_life_);
}

// The measured-outcome rule: whether this call runs alone (every kExplore-th call tries the way
// that is not in favour, or not yet measured).
bool TeamPolicy::faster_alone(Rate& r) {
    const bool explore = ++r.calls % kExplore == 0;
    if (r.alone.n == 0) return explore;
    if (r.team.n == 0) return !explore;
    return (r.team.median() > kTeamMargin * r.alone.median()) != explore;
}

bool TeamPolicy::use_team(std::uintptr_t kind, double work, double now) {
    trying_team_ = false;
    const double t1 = estimate(kind, work);
    if (t1 < 0.0 || t1 >= kLargeJob) return true;  // unknown: tried on the team (and timed)
    Rate& r = slot(kind, work);
    const bool straggling = t1 < kTeamFactor * penalty(now);
    const bool alone = faster_alone(r);
    const bool team = !straggling && !alone;
    trying_team_ = team && (r.team.n == 0 || (r.alone.n > 0 && r.team.median() > kTeamMargin * r.alone.median()));
    return team;
}

bool TeamPolicy::postpone_trial(std::uintptr_t kind, double work, bool still_waking) {
    Rate& r = slot(kind, work);
    if (r.postponed && !still_waking) {
        r.postponed = false;
        return false;
    }
    r.postponed = true;
    --r.calls;  // the next call takes this one's turn in the rotation
    return true;
}

void TeamPolicy::ran_alone(std::uintptr_t kind, double work, double seconds) {
    if (work > 0.0 && seconds > 0.0) slot(kind, work).alone.add(seconds / work);
}

void TeamPolicy::ran_on_team(std::uintptr_t kind, double work, double seconds, double own_seconds,
                             std::size_t own_chunks, std::size_t chunks, double wait_seconds, double now) {
    if (!(work > 0.0) || own_chunks == 0) return;  // the caller ran nothing: no time per chunk to go by
    Rate& r = slot(kind, work);
    r.team.add(seconds / work);
    r.postponed = false;
    const double per_chunk = own_seconds / double(own_chunks);
    // The caller's chunks ran beside the helpers' (sharing caches and memory bandwidth): an upper
    // bound of the one-thread time, which errs towards keeping the team.
    update(r.chunk_estimate, per_chunk * double(chunks) / work);
    // A wait up to about a chunk is the ordinary tail of the last chunks; longer, a helper stalled.
    if (wait_seconds > kMinStraggle && wait_seconds > 2.0 * per_chunk) straggled(wait_seconds - per_chunk, now);
}

void TeamPolicy::straggled(double wait, double now) {
    const double remembered = penalty(now);
    const bool soon = penalty_ > 0.0 && now - penalty_at_ < 8.0 * half_life_;
    half_life_ = soon ? std::fmin(2.0 * half_life_, kMaxHalfLife) : kBaseHalfLife;
    penalty_ = std::fmax(remembered, wait);
    penalty_at_ = now;
}

PoolChoice::Rate& PoolChoice::slot(std::uintptr_t kind, double work) {
    return claim_slot(rates_, kind, work);
}

bool PoolChoice::use_openmp(std::uintptr_t kind, double work) {
    Rate& r = slot(kind, work);
    const bool explore = ++r.calls % TeamPolicy::kExplore == 0;
    if (r.openmp.n == 0) return true;
    if (r.own.n == 0) return !explore;
    return (r.openmp.median() <= r.own.median()) != explore;
}

void PoolChoice::ran(std::uintptr_t kind, double work, bool openmp, double seconds) {
    if (!(work > 0.0) || !(seconds > 0.0)) return;
    Rate& r = slot(kind, work);
    (openmp ? r.openmp : r.own).add(seconds / work);
}

}  // namespace wush::threads
