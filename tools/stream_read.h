// The baseline of `wush bench --kind decode`: a plain multi-threaded streaming read of a buffer
// as large as a layer's weights. A one-token product reads every weight byte once and does little
// else, so its speed is judged against how fast the same threads can merely read that many bytes.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

class StreamRead {
public:
    // `copies` buffers of `bytes` each (rounded up to 64), read one per run() in turn by `threads`
    // threads: the caller and threads - 1 workers, which sleep between reads.
    StreamRead(std::size_t threads, std::size_t bytes, std::size_t copies = 1);
    ~StreamRead();
    StreamRead(const StreamRead&) = delete;
    StreamRead& operator=(const StreamRead&) = delete;

    // Reads the next buffer once, each thread its contiguous share; returns when all are done.
    void run();
    // Bytes read by one run().
    std::size_t bytes() const { return words_ * sizeof(std::uint64_t); }

private:
    void read_share(std::size_t id);
    void worker(std::size_t id);

    std::vector<std::uint64_t> buffer_;
    std::size_t words_, copies_, threads_;
    std::size_t current_ = 0;  // the buffer being read (set before the workers are woken)
    std::atomic<std::uint64_t> generation_{0};
    std::atomic<std::size_t> done_{0};
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> sink_{0};  // keeps the sums, so the reads are not optimized away
    std::vector<std::thread> workers_;
};

// The baseline of `wush bench --kind l2`: one thread reading the same buffer again and again, so
// that after the first read it comes from the core's caches (L2 for a small layer's weights), with
// the widest loads the CPU has: as fast as one thread can merely read those bytes there.
class WarmRead {
public:
    explicit WarmRead(std::size_t bytes);
    // Reads the buffer once.
    void run();
    std::size_t bytes() const { return lines_ * 64; }

private:
    std::vector<std::uint64_t> buffer_;
    std::size_t lines_;
    std::uint64_t sink_ = 0;
};
