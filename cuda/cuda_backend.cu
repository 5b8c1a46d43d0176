// Placeholder until the CUDA backend lands: device discovery works, launches are unsupported.
#include "cuda_backend.h"

#include <cuda_runtime_api.h>

#include "common/error.h"

namespace wush::cuda {

DeviceQuery query_devices() {
    DeviceQuery q;
    const cudaError_t err = cudaGetDeviceCount(&q.count);
    if (err != cudaSuccess) {
        q.count = 0;
        q.error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
        cudaGetLastError();  // clear the error so later calls start clean
    } else if (q.count == 0) {
        q.error = "the CUDA runtime reports no devices";
    }
    return q;
}

std::unique_ptr<backend::Backend> make_backend(int) {
    fail(WUSH_ERR_UNSUPPORTED, "the CUDA backend's launches are not built yet");
}

}  // namespace wush::cuda
