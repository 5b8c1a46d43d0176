// Shared by the benchmarks in bench/: a console reporter that also remembers every run, so that a
// benchmark binary can end with a summary comparing each measured variant with the baseline it
// competes with, measured in the same run (docs/ARCHITECTURE.md, "Verification").
//
// Benchmarks are registered with names "<case>/<variant>" (e.g. "block_G32/calibrator" and
// "block_G32/dsyrk"); the summary pairs variants of the same case. With --benchmark_repetitions=N
// the summary uses the median of the N repetitions (computed here from the individual runs, so it
// does not depend on which aggregates Google Benchmark prints).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace wush::bench {

class CollectingReporter : public benchmark::ConsoleReporter {
public:
    // Tabular counters, no colour escapes (the output is meant to be pasted into docs).
    CollectingReporter() : ConsoleReporter(OO_Tabular) {}

    void ReportRuns(const std::vector<Run>& runs) override {
        for (const Run& r : runs) {
            if (r.run_type != Run::RT_Iteration || r.error_occurred || r.iterations == 0) continue;
            seconds_[r.run_name.function_name].push_back(r.real_accumulated_time / double(r.iterations));
            cpu_seconds_[r.run_name.function_name].push_back(r.cpu_accumulated_time / double(r.iterations));
        }
        ConsoleReporter::ReportRuns(runs);
    }

    // Median wall time per iteration (seconds) of "<case>/<variant>", or a negative value when
    // it did not run (filtered out, or failed).
    double median_seconds(const std::string& name) const {
        const auto it = seconds_.find(name);
        if (it == seconds_.end() || it->second.empty()) return -1.0;
        std::vector<double> v = it->second;
        std::sort(v.begin(), v.end());
        const std::size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }

    // The fastest repetition (seconds), negative when it did not run: on a shared machine the
    // least disturbed one.
    double min_seconds(const std::string& name) const {
        const auto it = seconds_.find(name);
        if (it == seconds_.end() || it->second.empty()) return -1.0;
        return *std::min_element(it->second.begin(), it->second.end());
    }

    // The median CPU time of the calling thread (seconds; negative when it did not run): with
    // one thread (OMP_NUM_THREADS=1) all of the work, and unlike wall time not stretched by other
    // processes on a shared machine.
    double median_cpu_seconds(const std::string& name) const {
        const auto it = cpu_seconds_.find(name);
        if (it == cpu_seconds_.end() || it->second.empty()) return -1.0;
        std::vector<double> v = it->second;
        std::sort(v.begin(), v.end());
        const std::size_t n = v.size();
        return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    }

    std::size_t repetitions(const std::string& name) const {
        const auto it = seconds_.find(name);
        return it == seconds_.end() ? 0 : it->second.size();
    }

private:
    std::map<std::string, std::vector<double>> seconds_, cpu_seconds_;
};

// Registers a benchmark timed in wall-clock milliseconds (the library runs its own threads).
template <typename Fn, typename... Args>
benchmark::internal::Benchmark* register_wall_ms(const std::string& name, Fn&& fn, Args&&... args) {
    return benchmark::RegisterBenchmark(name.c_str(), std::forward<Fn>(fn), std::forward<Args>(args)...)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
}

// Runs the registered benchmarks with the collecting reporter; returns false on bad flags.
inline bool run_benchmarks(int argc, char** argv, CollectingReporter& reporter) {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return false;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return true;
}

}  // namespace wush::bench
