#include "runtime.h"

#include <cuda_runtime_api.h>

namespace wush::cuda {

DeviceQuery query_devices() {
    DeviceQuery q;
    const cudaError_t err = cudaGetDeviceCount(&q.count);
    if (err != cudaSuccess) {
        q.count = 0;
        q.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
        cudaGetLastError();  // clear the sticky-free error so later calls start clean
    } else if (q.count == 0) {
        q.error = "the CUDA runtime reports no devices";
    }
    return q;
}

}  // namespace wush::cuda
