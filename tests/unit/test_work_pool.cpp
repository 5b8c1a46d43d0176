// The work pool's OpenMP team (threads::OpenMpTeamScope, a context's WUSH_CONTEXT_OPENMP_TEAM):
// inside the scope a parallel call's chunks run inside an OpenMP region of the process's OpenMP
// runtime (which omp_get_level sees), outside it and in a fork()ed child on the library's own
// threads; every chunk runs once either way.
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <vector>

#include "threads/work_pool.h"

namespace {

using wush::threads::OpenMpTeamScope;
using wush::threads::parallel_chunks;

struct Seen {
    std::vector<std::atomic<int>> runs;
    std::atomic<int> outside_openmp{0}, inside_openmp{0};
    std::atomic<std::size_t> max_slot{0};
    explicit Seen(std::size_t n) : runs(n) {}
};

// A job large enough for the team (its policy tries an unknown job on the team), each chunk
// noting whether it ran inside an OpenMP region.
void run_job(Seen& seen, std::size_t threads) {
    parallel_chunks(seen.runs.size(), 1, threads, 1e12, [&](std::size_t slot, std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) seen.runs[i].fetch_add(1);
        (omp_get_level() > 0 ? seen.inside_openmp : seen.outside_openmp).fetch_add(1);
        std::size_t m = seen.max_slot.load();
        while (slot > m && !seen.max_slot.compare_exchange_weak(m, slot)) {
        }
    });
}

void expect_each_ran_once(const Seen& seen) {
    for (std::size_t i = 0; i < seen.runs.size(); ++i) EXPECT_EQ(seen.runs[i].load(), 1) << "item " << i;
}

TEST(WorkPool, OwnThreadsByDefault) {
    Seen seen(64);
    run_job(seen, 2);
    expect_each_ran_once(seen);
    EXPECT_EQ(seen.inside_openmp.load(), 0);
    EXPECT_FALSE(wush::threads::on_openmp_team());
}

TEST(WorkPool, OpenMpTeamInsideTheScope) {
    Seen seen(64);
    {
        const OpenMpTeamScope team(true);
        EXPECT_TRUE(wush::threads::on_openmp_team());
        run_job(seen, 2);
    }
    expect_each_ran_once(seen);
    EXPECT_EQ(seen.outside_openmp.load(), 0);
    EXPECT_EQ(seen.inside_openmp.load(), 64);
    EXPECT_LT(seen.max_slot.load(), 2u);            // slots stay below the thread count
    EXPECT_FALSE(wush::threads::on_openmp_team());  // restored

    Seen off(16);
    {
        const OpenMpTeamScope team(false);
        run_job(off, 2);
    }
    EXPECT_EQ(off.inside_openmp.load(), 0);
}

// libgomp's pool does not survive fork(): a child uses the library's own threads even inside
// the scope (and finishes, where starting a team there could hang).
TEST(WorkPool, ForkedChildUsesItsOwnThreads) {
    {
        const OpenMpTeamScope team(true);
        Seen warm(8);
        run_job(warm, 2);  // the parent's OpenMP team exists now
    }
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        const OpenMpTeamScope team(true);
        Seen seen(32);
        run_job(seen, 2);
        bool ok = seen.inside_openmp.load() == 0 && !wush::threads::on_openmp_team();
        for (auto& r : seen.runs) ok = ok && r.load() == 1;
        _exit(ok ? 0 : 1);
    }
    // Without the fork rule the child hangs in libgomp: wait at most a minute, then fail.
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 6000 && done == 0; ++i) {
        done = waitpid(child, &status, WNOHANG);
        if (done == 0) usleep(10000);
    }
    if (done == 0) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        FAIL() << "the fork()ed child did not finish its parallel call";
    }
    ASSERT_EQ(done, child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
