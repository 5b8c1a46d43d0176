// CUDA / cuBLAS errors as wush::Error, and device memory as an RAII buffer (cuda/ internal).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "common/error.h"

namespace wush::cuda {

// "<call>: <cudaGetErrorName>: <cudaGetErrorString>"; an allocation failure is OUT_OF_MEMORY.
inline void check_cuda(cudaError_t err, const char* call) {
    if (err == cudaSuccess) return;
    cudaGetLastError();  // clear a non-sticky error so that later calls start clean
    const std::string msg = std::string(call) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    fail(err == cudaErrorMemoryAllocation ? WUSH_ERR_OUT_OF_MEMORY : WUSH_ERR_CUDA, msg);
}

inline void check_cublas(cublasStatus_t st, const char* call) {
    if (st == CUBLAS_STATUS_SUCCESS) return;
    const std::string msg = std::string(call) + ": " + cublasGetStatusName(st) + ": " + cublasGetStatusString(st);
    fail(st == CUBLAS_STATUS_ALLOC_FAILED ? WUSH_ERR_OUT_OF_MEMORY : WUSH_ERR_CUDA, msg);
}

// A launch's configuration / launch errors (kernels report asynchronous faults at the next sync).
inline void check_launch(const char* kernel) {
    check_cuda(cudaGetLastError(), kernel);
}

// Compute capability of the current device as major * 10 + minor (e.g. 90); CUDA error if none.
inline int current_sm(const char* who) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        fail(WUSH_ERR_CUDA, std::string(who) + ": no current CUDA device");
    return major * 10 + minor;
}

#define WUSH_CUDA_CHECK(call) ::wush::cuda::check_cuda((call), #call)
#define WUSH_CUBLAS_CHECK(call) ::wush::cuda::check_cublas((call), #call)

// Makes `device` current for a scope and restores the caller's current device at its end, so
// that a host thread working on another GPU (a framework on device 1 calling a context on device
// 0) finds its device unchanged. Every entry point of the backend holds one.
class DeviceGuard {
public:
    explicit DeviceGuard(int device) {
        WUSH_CUDA_CHECK(cudaGetDevice(&previous_));
        if (previous_ != device) {
            WUSH_CUDA_CHECK(cudaSetDevice(device));
            switched_ = true;
        }
    }
    ~DeviceGuard() {
        if (switched_) cudaSetDevice(previous_);  // cannot fail for a device that was current
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int previous_ = 0;
    bool switched_ = false;
};

// Lets this thread make the CUDA calls a graph capture forbids (cudaMalloc, cudaMallocHost,
// cudaStreamCreate, ...) while another thread captures in global mode, as PyTorch does: in this
// thread's default (global) mode such a call fails and invalidates that other capture. Context
// creation and prepare() hold one; the thread's previous mode is restored at the end of the scope.
// Nothing they do touches the capturing stream, so relaxed is safe for them.
class RelaxedCaptureMode {
public:
    RelaxedCaptureMode() { WUSH_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode_)); }
    ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }  // cannot fail for a valid mode
    RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
    RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

private:
    cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;  // the caller's mode after the exchange
};

// Owned device memory (cudaMalloc / cudaFree on the device current at allocation, restored
// afterwards); move-only.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
        if (bytes == 0) return;
        WUSH_CUDA_CHECK(cudaGetDevice(&device_));
        WUSH_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
    }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        std::swap(ptr_, o.ptr_);
        std::swap(bytes_, o.bytes_);
        std::swap(device_, o.device_);
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    template <class T = void>
    T* get() const noexcept {
        return static_cast<T*>(ptr_);
    }
    std::size_t bytes() const noexcept { return bytes_; }

    // A device copy of host bytes, stream-ordered on `stream` and waited for (for prepare() and
    // the convenience paths; no legacy-stream operation unless `stream` is the legacy stream).
    static DeviceBuffer upload(const void* host, std::size_t bytes, cudaStream_t stream = nullptr) {
        DeviceBuffer b(bytes);
        if (bytes == 0) return b;
        WUSH_CUDA_CHECK(cudaMemcpyAsync(b.ptr_, host, bytes, cudaMemcpyHostToDevice, stream));
        WUSH_CUDA_CHECK(cudaStreamSynchronize(stream));
        return b;
    }

private:
    void release() noexcept {
        if (!ptr_) return;
        int current = 0;
        const bool switch_back =
            cudaGetDevice(&current) == cudaSuccess && current != device_ && cudaSetDevice(device_) == cudaSuccess;
        cudaFree(ptr_);  // errors here cannot be reported (destructor)
        if (switch_back) cudaSetDevice(current);
        ptr_ = nullptr;
    }

    void* ptr_ = nullptr;
    std::size_t bytes_ = 0;
    int device_ = 0;
};

// Page-locked host memory for stream-ordered device-to-host copies (the non-finite flag).
template <class T>
class PinnedHost {
public:
    PinnedHost() { WUSH_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), sizeof(T))); }
    ~PinnedHost() { cudaFreeHost(ptr_); }
    PinnedHost(const PinnedHost&) = delete;
    PinnedHost& operator=(const PinnedHost&) = delete;
    T* get() const noexcept { return ptr_; }

private:
    T* ptr_ = nullptr;
};

}  // namespace wush::cuda
