// Layers handed to the `wush` subcommands: built-in example layers, or weight/activation pairs
// from safetensors files. A client of the public C API only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "wush/wush.h"

// RAII for the handles used here.
template <typename T, void (*Destroy)(T*)>
struct Handle {
    T* p = nullptr;
    ~Handle() { Destroy(p); }
};

// One layer's data: the weight and its activations (calibration rows first, then validation
// rows, if any, then held-out rows), in the element type they came in.
struct Layer {
    std::string name;
    std::size_t d_out = 0, d_in = 0;
    wush_dtype w_dtype = WUSH_DTYPE_F32, x_dtype = WUSH_DTYPE_F32;
    std::vector<unsigned char> weight, x;
    std::size_t n_calibration = 0, n_validation = 0, n_heldout = 0;

    const void* validation() const { return rows_from(n_calibration); }
    const void* heldout() const { return rows_from(n_calibration + n_validation); }

private:
    const void* rows_from(std::size_t token) const {
        std::size_t elem = 0;
        wush_dtype_size(x_dtype, &elem);
        return x.data() + token * d_in * elem;
    }
};

// Makes the last n_val calibration tokens validation tokens. Returns an exit code (1 when fewer
// than n_val + 1 calibration tokens are left).
int split_validation(std::size_t n_val, Layer* layer);

// Generates built-in layer `name` (wush_example_layer_generate). Returns an exit code.
int load_builtin(const std::string& name, std::uint64_t seed, std::size_t n_cal, std::size_t n_held, Layer* out);

// Every tensor of the weights file that has an activation tensor of the same name, or of its name
// without ".weight" (then the layer's name), each a 2-D F32/F16/BF16 pair; the other tensors are
// left out and named in one stderr line, so a model's own safetensors file can be given as it is.
// The last n_held tokens (0: a quarter of them) are held out, or all of them with `all_heldout`
// (nothing to calibrate). Returns an exit code (1 also when no tensor has activations).
int load_layer_files(const std::string& weights_path, const std::string& activations_path, std::size_t n_held,
                     std::vector<Layer>* layers, bool all_heldout = false);
