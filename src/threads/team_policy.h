// When a parallel call should not use its helper threads: the work pool's policy.
//
// A helper that the OS preempts in the middle of a chunk holds the calling thread until it runs
// again (on a machine where another process keeps a core busy: 0.5 to a few ms), and the caller
// cannot redo that chunk and return, since the helper may still read the caller's buffers. A job
// whose one-thread time is of the order of such a wait then loses to one thread. Two rules, both
// only for jobs estimated below kLargeJob (a large job keeps the team: a straggler costs it
// little):
//  - Stragglers: the policy notices these waits and, while a recent one is larger than a quarter
//    of a job's estimated one-thread time, runs that job on the calling thread alone. The
//    remembered wait halves every `half_life`, so small jobs probe the team again now and then;
//    a straggler soon after the last one doubles the half-life (up to kMaxHalfLife), so a
//    machine that stays busy is probed less and less often.
//  - Measured outcome: per kind and size of job, the median wall time per unit of work alone and
//    on the team over their last kSamples runs (medians: on a loaded machine one preempted run
//    must not decide); once both are known the job takes the team only while it wins by
//    kTeamMargin, trying the other way every kExplore-th call so that both stay current.
//    This catches what the straggler rule does not (a caller that loses its core while it waits,
//    a helper that runs at half speed beside another process).
//  - A fair trial: a helper asleep on its futex takes tens of microseconds to run (a VM's vCPU
//    wakes up in its hypervisor first), more than a small job's whole time, so a team trial that
//    finds the helpers asleep would time their wake-up, not the team, and a job that runs alone
//    would never see a team that wins. The pool then wakes them, runs that call alone and asks
//    for the trial on the kind's next call (postpone_trial), once: if the helpers are asleep
//    again by then, the calls come too far apart for the team, and the trial times it as it is.
//    A helper found asleep sooner after its wake than it polls before sleeping again has not
//    woken yet (a VM's vCPU can take longer than a 10 us call): the trial moves on again, else
//    such trials timed the wake-up after all, and kept back-to-back calls of 10-20 us alone.
// Not thread-safe: the pool calls it only while it holds its job lock.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace wush::threads {

class TeamPolicy {
public:
    // A job: `kind` tells jobs with different costs per unit of work apart (the pool uses the
    // chunk body), `work` is the caller's estimate in any unit proportional to the time (e.g.
    // multiply-adds). Times are seconds on a monotonic clock. Counts the call (for exploring).
    bool use_team(std::uintptr_t kind, double work, double now);
    // Whether the last use_team that chose the team did so as a trial (the team not yet measured
    // for this kind and size, or the rotation's turn while running alone is in favour).
    bool trying_team() const { return trying_team_; }
    // The last call's team trial found the helpers asleep: true when the trial moves to the kind's
    // next call (this call then runs alone), false when it was moved once already (it runs now).
    // `still_waking`: the helpers were woken for the moved trial so recently that they cannot have
    // fallen asleep again (they are still waking up): the trial moves again.
    bool postpone_trial(std::uintptr_t kind, double work, bool still_waking = false);
    // The job ran on the calling thread alone in `seconds`.
    void ran_alone(std::uintptr_t kind, double work, double seconds);
    // The job ran on the team in `seconds`: the caller ran `own_chunks` of `chunks` in
    // `own_seconds`, then waited `wait_seconds` for chunks still running on helpers; it ended at
    // `now`.
    void ran_on_team(std::uintptr_t kind, double work, double seconds, double own_seconds, std::size_t own_chunks,
                     std::size_t chunks, double wait_seconds, double now);

    // The straggler wait still remembered at `now` (seconds; 0 when none).
    double penalty(double now) const;
    // The estimated one-thread time of a job (seconds; negative when the kind/size is unknown):
    // measured alone if it ever ran alone, else from the caller's chunks on the team.
    double estimate(std::uintptr_t kind, double work) const;

    static constexpr double kTeamFactor = 4.0;      // team when estimate >= kTeamFactor * penalty
    static constexpr double kMinStraggle = 100e-6;  // shorter waits are ordinary chunk tails
    static constexpr double kBaseHalfLife = 20e-3;
    static constexpr double kMaxHalfLife = 1.0;
    static constexpr double kLargeJob = 20e-3;   // from this estimate on, always the team
    static constexpr double kTeamMargin = 0.95;  // the team must take at most this of alone's time
    static constexpr unsigned kExplore = 16;
    static constexpr unsigned kSamples = 8;

    // The last kSamples values of a measured time.
    struct Samples {
        std::array<double, kSamples> v{};
        unsigned n = 0;
        void add(double x) { v[n++ % kSamples] = x; }
        double median() const;  // 0 when empty
    };

private:
    struct Rate {
        std::uintptr_t kind = 0;
        int size_class = 0;
        double chunk_estimate = 0.0;  // seconds per work; 0: unknown
        Samples alone, team;          // measured wall seconds per work
        unsigned calls = 0;
        bool postponed = false;  // a team trial moved to the next call
    };
    Rate* find(std::uintptr_t kind, double work);
    const Rate* find(std::uintptr_t kind, double work) const;
    Rate& slot(std::uintptr_t kind, double work);  // found or (re)claimed
    bool faster_alone(Rate& r);
    void straggled(double wait, double now);

    std::array<Rate, 64> rates_{};
    double penalty_ = 0.0, penalty_at_ = 0.0, half_life_ = kBaseHalfLife;
    bool trying_team_ = false;
};

// Where a job that takes the team runs when the caller asked for the process's OpenMP team
// (OpenMpTeamScope): on that team or on the pool's own helpers. The team wins where the host's
// OpenMP workers spin on the cores after their own work (they run the chunks at once, where the
// own helpers would share cores with them); the own pool wins on a machine busy with other
// processes, where an OpenMP team waits at its barrier for members the OS does not run. So, per
// kind and size of job as in TeamPolicy, the median wall time per unit of work of each way over
// its last kSamples runs; the job takes the faster (the team until both are measured), trying the
// other way every kExplore-th call so that both stay current. Not thread-safe (the job lock).
class PoolChoice {
public:
    bool use_openmp(std::uintptr_t kind, double work);
    // The job ran in `seconds` on the OpenMP team (`openmp`) or on the own helpers.
    void ran(std::uintptr_t kind, double work, bool openmp, double seconds);

private:
    struct Rate {
        std::uintptr_t kind = 0;
        int size_class = 0;
        TeamPolicy::Samples openmp, own;  // wall seconds per work
        unsigned calls = 0;
    };
    Rate& slot(std::uintptr_t kind, double work);
    std::array<Rate, 64> rates_{};
};

}  // namespace wush::threads
