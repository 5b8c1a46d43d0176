// The work pool's policy (src/threads/team_policy.h) against its documented rules: a small job runs
// on the team unless a remembered straggler wait, halving every half-life, exceeds a quarter of
// the job's estimated one-thread time, or the team's median time (last 8 runs) does not beat the
// time alone (each way still tried every kExplore-th call); a large job always runs on the team.
#include <gtest/gtest.h>

#include <cmath>

#include "threads/team_policy.h"

namespace {

using wush::threads::TeamPolicy;

constexpr std::uintptr_t kKind = 0x1000, kOther = 0x2000;
constexpr double kMs = 1e-3;

// Teaches `p` the one-thread time of a job of `work` by a clean team run (no wait), at `now`:
// the caller ran 4 of 8 chunks in half the one-thread time.
void learn(TeamPolicy& p, std::uintptr_t kind, double work, double one_thread, double now) {
    p.ran_on_team(kind, work, one_thread / 2, one_thread / 2, 4, 8, 0.0, now);
}

// A team run of a known job whose caller then waited `wait` for a helper.
void straggle(TeamPolicy& p, double wait, double now) {
    p.ran_on_team(kKind, 1e3, 0.1 * kMs + wait, 0.1 * kMs, 4, 8, wait, now);
}

// How many of `calls` calls of a job choose the team.
int team_calls(TeamPolicy& p, std::uintptr_t kind, double work, int calls) {
    int team = 0;
    for (int i = 0; i < calls; ++i) team += p.use_team(kind, work, 0.0) ? 1 : 0;
    return team;
}

TEST(RuntimeTeamPolicy, FreshPolicyUsesTheTeam) {
    TeamPolicy p;
    EXPECT_TRUE(p.use_team(kKind, 1.0, 0.0));
    EXPECT_EQ(p.penalty(0.0), 0.0);
}

TEST(RuntimeTeamPolicy, EstimatesOneThreadTimeFromTheCallersChunks) {
    TeamPolicy p;
    learn(p, kKind, 1e6, 2 * kMs, 0.0);
    EXPECT_NEAR(p.estimate(kKind, 1e6), 2 * kMs, 1e-12);
    EXPECT_NEAR(p.estimate(kKind, 0.9e6), 1.8 * kMs, 1e-12);  // same size class: scales with the work
    EXPECT_LT(p.estimate(kKind, 1e9), 0.0);                   // another size class: unknown
    EXPECT_LT(p.estimate(kOther, 1e6), 0.0);                  // another kind: unknown
    p.ran_alone(kKind, 1e6, 4 * kMs);                         // a time measured alone takes precedence
    EXPECT_NEAR(p.estimate(kKind, 1e6), 4 * kMs, 1e-12);
}

TEST(RuntimeTeamPolicy, OrdinaryChunkTailsAreNotStragglers) {
    TeamPolicy p;
    p.ran_on_team(kKind, 1e6, 1.09 * kMs, 1 * kMs, 4, 8, 0.09 * kMs, 0.0);  // below 100 us
    p.ran_on_team(kKind, 1e6, 1.45 * kMs, 1 * kMs, 4, 8, 0.45 * kMs, 0.0);  // below two chunks (0.5 ms)
    EXPECT_EQ(p.penalty(0.0), 0.0);
}

TEST(RuntimeTeamPolicy, AStragglerSendsSmallJobsAloneAndKeepsLargeOnesOnTheTeam) {
    TeamPolicy p;
    learn(p, kKind, 1e6, 0.6 * kMs, 0.0);   // a small job: 0.6 ms on one thread
    learn(p, kOther, 1e9, 100 * kMs, 0.0);  // a large one: 100 ms
    straggle(p, 2.025 * kMs, 1.0);          // waited 2 ms beyond the chunk in flight
    EXPECT_NEAR(p.penalty(1.0), 2 * kMs, 1e-9);
    EXPECT_FALSE(p.use_team(kKind, 1e6, 1.0));
    EXPECT_TRUE(p.use_team(kOther, 1e9, 1.0));
    EXPECT_TRUE(p.use_team(kOther, 1e3, 1.0));  // unknown size: tried on the team and timed
    // The small job probes the team again once 2 ms has halved below 0.6 / 4 ms: after
    // log2(2 / 0.15) = 3.74 half-lives of 20 ms.
    EXPECT_FALSE(p.use_team(kKind, 1e6, 1.0 + 70 * kMs));
    EXPECT_TRUE(p.use_team(kKind, 1e6, 1.0 + 80 * kMs));
}

TEST(RuntimeTeamPolicy, StragglersThatRecurAreProbedLessOften) {
    TeamPolicy p;
    learn(p, kKind, 1e6, 0.6 * kMs, 0.0);
    straggle(p, 2.025 * kMs, 1.0);
    const double probe = 1.0 + 80 * kMs;  // the first probe (previous test)
    ASSERT_TRUE(p.use_team(kKind, 1e6, probe));
    straggle(p, 2.025 * kMs, probe);  // the probe straggles too: the half-life doubles to 40 ms
    EXPECT_FALSE(p.use_team(kKind, 1e6, probe + 140 * kMs));
    EXPECT_TRUE(p.use_team(kKind, 1e6, probe + 160 * kMs));
    // A straggler long after the last one starts again from the base half-life.
    straggle(p, 2.025 * kMs, probe + 10.0);
    EXPECT_TRUE(p.use_team(kKind, 1e6, probe + 10.0 + 80 * kMs));
}

TEST(RuntimeTeamPolicy, ATeamThatDoesNotWinIsLeftExceptEverySixteenthCall) {
    TeamPolicy p;
    p.ran_alone(kKind, 1e6, 1.0 * kMs);
    p.ran_on_team(kKind, 1e6, 1.0 * kMs, 0.45 * kMs, 4, 8, 0.0, 0.0);  // no faster than alone
    EXPECT_EQ(team_calls(p, kKind, 1e6, 64), 64 / int(TeamPolicy::kExplore));
}

TEST(RuntimeTeamPolicy, ATeamThatWinsIsKeptExceptEverySixteenthCall) {
    TeamPolicy p;
    p.ran_alone(kKind, 1e6, 1.0 * kMs);
    p.ran_on_team(kKind, 1e6, 0.8 * kMs, 0.4 * kMs, 4, 8, 0.0, 0.0);
    EXPECT_EQ(team_calls(p, kKind, 1e6, 64), 64 - 64 / int(TeamPolicy::kExplore));
}

TEST(RuntimeTeamPolicy, ALargeJobKeepsTheTeamWhateverItMeasured) {
    TeamPolicy p;
    p.ran_alone(kKind, 1e9, 30 * kMs);
    p.ran_on_team(kKind, 1e9, 40 * kMs, 15 * kMs, 4, 8, 0.0, 0.0);
    straggle(p, 5 * kMs, 0.0);
    EXPECT_EQ(team_calls(p, kKind, 1e9, 64), 64);
}

TEST(RuntimeTeamPolicy, OnePreemptedRunAloneDoesNotDecide) {
    TeamPolicy p;
    for (int i = 0; i < 7; ++i) p.ran_alone(kKind, 1e6, 1.0 * kMs);
    p.ran_alone(kKind, 1e6, 30.0 * kMs);  // preempted: a mean of the 8 runs would be 4.6 ms
    for (int i = 0; i < 8; ++i) p.ran_on_team(kKind, 1e6, 1.2 * kMs, 0.5 * kMs, 4, 8, 0.0, 0.0);
    EXPECT_EQ(team_calls(p, kKind, 1e6, 64), 64 / int(TeamPolicy::kExplore));
}

TEST(RuntimeTeamPolicy, TheMeasuredTimesFollowTheMachine) {
    TeamPolicy p;
    p.ran_alone(kKind, 1e6, 1.0 * kMs);
    p.ran_on_team(kKind, 1e6, 2.0 * kMs, 0.45 * kMs, 4, 8, 0.0, 0.0);                              // the team lost
    for (int i = 0; i < 40; ++i) p.ran_on_team(kKind, 1e6, 0.6 * kMs, 0.3 * kMs, 4, 8, 0.0, 0.0);  // now it wins
    EXPECT_EQ(team_calls(p, kKind, 1e6, 64), 64 - 64 / int(TeamPolicy::kExplore));
}

// A fair trial: a team trial that finds the helpers asleep moves to the kind's next call, once.
TEST(RuntimeTeamPolicy, ATeamTrialIsReportedAsOne) {
    TeamPolicy p;
    p.ran_alone(kKind, 1e6, 1.0 * kMs);
    int call = 0;
    while (!p.use_team(kKind, 1e6, 0.0)) {  // the team not yet measured: tried in the rotation
        EXPECT_FALSE(p.trying_team());
        ASSERT_LT(++call, 64);
    }
    EXPECT_TRUE(p.trying_team());
    p.ran_on_team(kKind, 1e6, 0.6 * kMs, 0.3 * kMs, 4, 8, 0.0, 0.0);  // it wins
    EXPECT_TRUE(p.use_team(kKind, 1e6, 0.0));
    EXPECT_FALSE(p.trying_team());  // the team in favour: not a trial
    TeamPolicy q;
    q.ran_alone(kKind, 1e6, 1.0 * kMs);
    q.ran_on_team(kKind, 1e6, 1.0 * kMs, 0.45 * kMs, 4, 8, 0.0, 0.0);  // no faster than alone
    int trials = 0;
    for (unsigned i = 0; i < TeamPolicy::kExplore; ++i)
        if (q.use_team(kKind, 1e6, 0.0)) trials += q.trying_team() ? 1 : 0;
        else EXPECT_FALSE(q.trying_team());
    EXPECT_EQ(trials, 1);  // the rotation's one turn
}

TEST(RuntimeTeamPolicy, APostponedTrialRunsOnTheNextCallAndOnlyOnce) {
    TeamPolicy p;
    p.ran_alone(kKind, 1e6, 1.0 * kMs);
    p.ran_on_team(kKind, 1e6, 1.0 * kMs, 0.45 * kMs, 4, 8, 0.0, 0.0);  // no faster than alone
    int call = 0;
    while (!p.use_team(kKind, 1e6, 0.0)) ASSERT_LT(++call, 64);
    ASSERT_TRUE(p.trying_team());
    EXPECT_TRUE(p.postpone_trial(kKind, 1e6));  // helpers asleep: this call runs alone
    EXPECT_TRUE(p.use_team(kKind, 1e6, 0.0));   // the trial on the next call
    EXPECT_TRUE(p.trying_team());
    EXPECT_TRUE(p.postpone_trial(kKind, 1e6, true));  // still waking up: moved again
    EXPECT_TRUE(p.use_team(kKind, 1e6, 0.0));
    EXPECT_TRUE(p.trying_team());
    EXPECT_FALSE(p.postpone_trial(kKind, 1e6));  // asleep again: the trial runs as it is
    // A trial that ran on the team ends the postponement: the next one may be moved again.
    p.ran_on_team(kKind, 1e6, 1.0 * kMs, 0.45 * kMs, 4, 8, 0.0, 0.0);
    while (!p.use_team(kKind, 1e6, 0.0)) ASSERT_LT(++call, 128);
    EXPECT_TRUE(p.postpone_trial(kKind, 1e6));
    // Postponing keeps the rotation: 64 calls after it still try the team 4 times (and the
    // postponed one).
    EXPECT_EQ(team_calls(p, kKind, 1e6, 64), 1 + 64 / int(TeamPolicy::kExplore) - 1);
}

// PoolChoice: the host's OpenMP team until the own helpers are measured faster; each way tried
// every sixteenth call against the other.
int openmp_calls(wush::threads::PoolChoice& c, std::uintptr_t kind, double work, int calls) {
    int n = 0;
    for (int i = 0; i < calls; ++i) n += c.use_openmp(kind, work) ? 1 : 0;
    return n;
}

TEST(RuntimePoolChoice, TheTeamFirstAndTheOwnPoolTriedEverySixteenthCall) {
    wush::threads::PoolChoice c;
    const std::uintptr_t kind = 0x1000;
    EXPECT_TRUE(c.use_openmp(kind, 1e6));
    c.ran(kind, 1e6, true, 1e-3);
    EXPECT_EQ(openmp_calls(c, kind, 1e6, 64), 64 - 64 / int(TeamPolicy::kExplore));
}

TEST(RuntimePoolChoice, TheFasterWayWinsBothWays) {
    wush::threads::PoolChoice c;
    const std::uintptr_t kind = 0x2000;
    for (int i = 0; i < 8; ++i) {
        c.ran(kind, 1e6, true, 2e-3);  // the team slower (a busy machine)
        c.ran(kind, 1e6, false, 1e-3);
    }
    EXPECT_EQ(openmp_calls(c, kind, 1e6, 64), 64 / int(TeamPolicy::kExplore));
    for (int i = 0; i < 8; ++i) {
        c.ran(kind, 1e6, true, 0.5e-3);  // now the team wins (the host's workers spin)
        c.ran(kind, 1e6, false, 1e-3);
    }
    EXPECT_EQ(openmp_calls(c, kind, 1e6, 64), 64 - 64 / int(TeamPolicy::kExplore));
    // Another size class is timed apart: unmeasured, it takes the team.
    EXPECT_TRUE(c.use_openmp(kind, 1e3));
}

}  // namespace
