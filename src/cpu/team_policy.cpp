#include "cpu/team_policy.h"

#include <cmath>

namespace wush::runtime {

namespace {

// Jobs of one kind whose work differs by more than a factor 2 are timed apart: a kernel's time
// per unit of work changes with the shape (memory-bound at one token, compute-bound at many).
int size_class(double work) { return work > 0.0 ? std::ilogb(work) : -1000; }

std::size_t hash(std::uintptr_t kind, int size_class) {
    const std::uint64_t h = (std::uint64_t(kind) >> 4) * 0x9E3779B97F4A7C15ull + std::uint64_t(std::int64_t(size_class)) * 0xC2B2AE3D27D4EB4Full;
    return std::size_t(h >> 58);  // 64 slots
}

}  // namespace

TeamPolicy::Rate& TeamPolicy::slot(std::uintptr_t kind, int cls) { return rates_[hash(kind, cls)]; }

const TeamPolicy::Rate* TeamPolicy::find(std::uintptr_t kind, double work) const {
    const int cls = size_class(work);
    const Rate& r = rates_[hash(kind, cls)];
    return r.seconds_per_work > 0.0 && r.kind == kind && r.size_class == cls ? &r : nullptr;
}

double TeamPolicy::estimate(std::uintptr_t kind, double work) const {
    const Rate* r = find(kind, work);
    return r != nullptr ? r->seconds_per_work * work : -1.0;
}

double TeamPolicy::penalty(double now) const {
    if (penalty_ <= 0.0) return 0.0;
    return penalty_ * std::exp2(-(now - penalty_at_) / half_life_);
}

bool TeamPolicy::use_team(std::uintptr_t kind, double work, double now) const {
    const double p = penalty(now);
    if (p <= 0.0) return true;
    const double t1 = estimate(kind, work);
    return t1 < 0.0 || t1 >= kTeamFactor * p;  // an unknown job is tried on the team (and timed)
}

void TeamPolicy::learn(std::uintptr_t kind, double work, double seconds) {
    if (!(work > 0.0) || !(seconds > 0.0)) return;
    const int cls = size_class(work);
    Rate& r = slot(kind, cls);
    const double rate = seconds / work;
    if (r.kind != kind || r.size_class != cls || r.seconds_per_work <= 0.0) r = {kind, cls, rate};
    else r.seconds_per_work = 0.5 * (r.seconds_per_work + rate);  // follows a machine that changes
}

void TeamPolicy::ran_alone(std::uintptr_t kind, double work, double seconds) { learn(kind, work, seconds); }

void TeamPolicy::ran_on_team(std::uintptr_t kind, double work, double own_seconds, std::size_t own_chunks,
                             std::size_t chunks, double wait_seconds, double now) {
    if (own_chunks == 0) return;  // the caller ran nothing: no time per chunk to go by
    const double per_chunk = own_seconds / double(own_chunks);
    // The caller's chunks ran beside the helpers' (sharing caches and memory bandwidth): an upper
    // bound of the one-thread time, which errs towards keeping the team.
    learn(kind, work, per_chunk * double(chunks));
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

}  // namespace wush::runtime
