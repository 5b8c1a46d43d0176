// When a parallel call should not use its helper threads: the work pool's straggler policy.
//
// A helper that the OS preempts in the middle of a chunk holds the calling thread until it runs
// again (on a machine where another process keeps a core busy: 0.5 to a few ms), and the caller
// cannot redo that chunk and return, since the helper may still read the caller's buffers. A job
// whose one-thread time is of the order of such a wait then loses to one thread. The policy
// notices these waits (stragglers) and, while a recent one is larger than a quarter of a job's
// estimated one-thread time, runs that job on the calling thread alone; a large job keeps the
// team, as a straggler costs it little. The remembered wait halves every `half_life`, so small
// jobs probe the team again now and then; a straggler soon after the last one doubles the
// half-life (up to kMaxHalfLife), so a machine that stays busy is probed less and less often.
// Not thread-safe: the pool calls it only while it holds its job lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace wush::runtime {

class TeamPolicy {
public:
    // A job: `kind` tells jobs with different costs per unit of work apart (the pool uses the
    // chunk body), `work` is the caller's estimate in any unit proportional to the time (e.g.
    // multiply-adds). Times are seconds on a monotonic clock.
    bool use_team(std::uintptr_t kind, double work, double now) const;
    // The job ran on the calling thread alone in `seconds`.
    void ran_alone(std::uintptr_t kind, double work, double seconds);
    // The job ran on the team: the caller ran `own_chunks` of `chunks` in `own_seconds`, then
    // waited `wait_seconds` for chunks still running on helpers; it ended at `now`.
    void ran_on_team(std::uintptr_t kind, double work, double own_seconds, std::size_t own_chunks, std::size_t chunks,
                     double wait_seconds, double now);

    // The straggler wait still remembered at `now` (seconds; 0 when none).
    double penalty(double now) const;
    // The estimated one-thread time of a job (seconds; negative when the kind/size is unknown).
    double estimate(std::uintptr_t kind, double work) const;

    static constexpr double kTeamFactor = 4.0;        // team when estimate >= kTeamFactor * penalty
    static constexpr double kMinStraggle = 100e-6;    // shorter waits are ordinary chunk tails
    static constexpr double kBaseHalfLife = 20e-3;
    static constexpr double kMaxHalfLife = 1.0;

private:
    struct Rate {
        std::uintptr_t kind = 0;
        int size_class = 0;
        double seconds_per_work = 0.0;  // 0: empty
    };
    Rate& slot(std::uintptr_t kind, int size_class);
    const Rate* find(std::uintptr_t kind, double work) const;
    void learn(std::uintptr_t kind, double work, double one_thread_seconds);
    void straggled(double wait, double now);

    std::array<Rate, 64> rates_{};
    double penalty_ = 0.0, penalty_at_ = 0.0, half_life_ = kBaseHalfLife;
};

}  // namespace wush::runtime
