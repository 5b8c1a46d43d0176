#include "stream_read.h"

#include <algorithm>

namespace {

// Eight independent sums, so the loop is limited by the loads, not by one dependency chain.
std::uint64_t sum_words(const std::uint64_t* p, std::size_t n) {
    std::uint64_t s[8] = {};
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) s[j] += p[i + std::size_t(j)];
    for (; i < n; ++i) s[0] += p[i];
    std::uint64_t total = 0;
    for (std::uint64_t v : s) total += v;
    return total;
}

// Sums of 64-byte lines, four lines at a time into four vectors (independent chains), in one
// vector register per line where the CPU has AVX-512 (a clone per ISA, picked at load time).
using Line = std::uint64_t __attribute__((vector_size(64)));

__attribute__((target_clones("avx512f", "avx2", "default"))) std::uint64_t sum_lines(const std::uint64_t* p,
                                                                                     std::size_t lines) {
    Line s[4] = {};
    std::size_t i = 0;
    for (; i + 4 <= lines; i += 4)
        for (int j = 0; j < 4; ++j) {
            Line v;
            __builtin_memcpy(&v, p + 8 * (i + std::size_t(j)), sizeof v);
            s[j] += v;
        }
    for (; i < lines; ++i) {
        Line v;
        __builtin_memcpy(&v, p + 8 * i, sizeof v);
        s[0] += v;
    }
    const Line t = s[0] + s[1] + s[2] + s[3];
    std::uint64_t total = 0;
    for (int j = 0; j < 8; ++j) total += t[j];
    return total;
}

}  // namespace

WarmRead::WarmRead(std::size_t bytes) : lines_((bytes + 63) / 64) {
    buffer_.assign(lines_ * 8, 1);
}

void WarmRead::run() {
    sink_ += sum_lines(buffer_.data(), lines_);
    // The sum leaves through a compiler barrier, so the read is never optimized away.
    asm volatile("" : : "r"(sink_) : "memory");
}

StreamRead::StreamRead(std::size_t threads, std::size_t bytes, std::size_t copies)
    : words_((bytes + 63) / 64 * 8), copies_(std::max<std::size_t>(copies, 1)),
      threads_(std::max<std::size_t>(threads, 1)) {
    buffer_.assign(words_ * copies_, 1);
    for (std::size_t id = 1; id < threads_; ++id) workers_.emplace_back([this, id] { worker(id); });
}

StreamRead::~StreamRead() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
}

void StreamRead::read_share(std::size_t id) {
    // Shares of whole cache lines (8 words).
    const std::size_t lines = words_ / 8;
    const std::size_t l0 = lines * id / threads_, l1 = lines * (id + 1) / threads_;
    const std::uint64_t* copy = buffer_.data() + current_ * words_;
    sink_.fetch_add(sum_words(copy + 8 * l0, 8 * (l1 - l0)), std::memory_order_relaxed);
}

void StreamRead::worker(std::size_t id) {
    std::uint64_t seen = 0;
    for (;;) {
        generation_.wait(seen);
        seen = generation_.load();
        if (stop_.load()) return;
        read_share(id);
        done_.fetch_add(1, std::memory_order_release);
    }
}

void StreamRead::run() {
    current_ = (current_ + 1) % copies_;
    done_.store(0);
    generation_.fetch_add(1);
    generation_.notify_all();
    read_share(0);
    while (done_.load(std::memory_order_acquire) < threads_ - 1) {
    }
}
