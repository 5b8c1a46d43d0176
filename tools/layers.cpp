#include "layers.h"

#include <cstdio>
#include <cstring>
#include <string_view>

#include "cli.h"

namespace {

bool dtype_of(const char* s, wush_dtype* d) {
    if (std::strcmp(s, "F32") == 0) *d = WUSH_DTYPE_F32;
    else if (std::strcmp(s, "F16") == 0) *d = WUSH_DTYPE_F16;
    else if (std::strcmp(s, "BF16") == 0) *d = WUSH_DTYPE_BF16;
    else return false;
    return true;
}

// A 2-D F32/F16/BF16 tensor of a file, copied out of the mapping (which need not be aligned).
int read_matrix(const wush_tensor_file* f, std::size_t index, const char* file_name, std::size_t* rows,
                std::size_t* cols, wush_dtype* dtype, std::vector<unsigned char>* bytes) {
    const char* name = nullptr;
    const char* dt = nullptr;
    std::size_t ndim = 0, nbytes = 0;
    const std::uint64_t* shape = nullptr;
    const void* data = nullptr;
    const wush_status st = wush_tensor_file_tensor(f, index, &name, &dt, &ndim, &shape, &data, &nbytes);
    if (st != WUSH_OK) return cli::report("wush_tensor_file_tensor", st);
    if (ndim != 2 || !dtype_of(dt, dtype)) {
        std::fprintf(stderr, "wush: tensor '%s' of %s is not a 2-D F32/F16/BF16 tensor\n", cli::printable(name).c_str(),
                     cli::printable(file_name).c_str());
        return 1;
    }
    *rows = std::size_t(shape[0]);
    *cols = std::size_t(shape[1]);
    const auto* p = static_cast<const unsigned char*>(data);
    bytes->assign(p, p + nbytes);
    return 0;
}

// The activation tensor of weight `name`: the same name, or (a model's own file, whose linear
// weights are "<module>.weight") the name without ".weight". Sets *layer_name to the name found.
bool find_activations(const wush_tensor_file* xf, const std::string& name, std::size_t* index,
                      std::string* layer_name) {
    constexpr std::string_view suffix = ".weight";
    if (wush_tensor_file_find(xf, name.c_str(), index) == WUSH_OK) {
        *layer_name = name;
        return true;
    }
    if (name.size() <= suffix.size() || !name.ends_with(suffix)) return false;
    const std::string module = name.substr(0, name.size() - suffix.size());
    if (wush_tensor_file_find(xf, module.c_str(), index) != WUSH_OK) return false;
    *layer_name = module;
    return true;
}

// One stderr line naming the weights left out (at most the first four).
void report_left_out(const std::vector<std::string>& names, const std::string& wpath) {
    if (names.empty()) return;
    std::string list;
    for (std::size_t i = 0; i < names.size() && i < 4; ++i) list += (i ? ", '" : "'") + cli::printable(names[i]) + "'";
    if (names.size() > 4) list += ", ...";
    std::fprintf(stderr, "wush: %zu tensor(s) of %s have no activations and are left out: %s\n", names.size(),
                 cli::printable(wpath).c_str(), list.c_str());
}

}  // namespace

int load_builtin(const std::string& name, std::uint64_t seed, std::size_t n_cal, std::size_t n_held, Layer* out) {
    Layer l;
    l.name = name;
    wush_status st = wush_example_layer_shape(name.c_str(), &l.d_out, &l.d_in);
    if (st != WUSH_OK) return cli::report("wush_example_layer_shape", st);
    l.n_calibration = n_cal;
    l.n_heldout = n_held;
    l.weight.resize(l.d_out * l.d_in * sizeof(float));
    l.x.resize((n_cal + n_held) * l.d_in * sizeof(float));
    float* x = reinterpret_cast<float*>(l.x.data());
    st = wush_example_layer_generate(name.c_str(), seed, n_cal, n_held, reinterpret_cast<float*>(l.weight.data()),
                                     l.d_out * l.d_in, x, n_cal * l.d_in, x + n_cal * l.d_in, n_held * l.d_in);
    if (st != WUSH_OK) return cli::report("wush_example_layer_generate", st);
    *out = std::move(l);
    return 0;
}

int split_validation(std::size_t n_val, Layer* l) {
    if (n_val >= l->n_calibration) {
        std::fprintf(stderr, "wush: '%s': %zu calibration tokens leave none after %zu validation tokens\n",
                     cli::printable(l->name).c_str(), l->n_calibration, n_val);
        return 1;
    }
    l->n_calibration -= n_val;
    l->n_validation = n_val;
    return 0;
}

// Every tensor of the weights file with an activation tensor (find_activations); the last
// `n_held` tokens (default: a quarter) are held out. Tensors without one are left out and named
// on stderr, so that a model's own file (embeddings, norms, biases) can be given as it is.
int load_layer_files(const std::string& wpath, const std::string& xpath, std::size_t n_held_opt,
                     std::vector<Layer>* layers, bool all_heldout) {
    Handle<wush_tensor_file, wush_tensor_file_destroy> wf, xf;
    wush_status st = wush_tensor_file_open(wpath.c_str(), &wf.p);
    if (st != WUSH_OK) return cli::report("opening the weights file", st);
    st = wush_tensor_file_open(xpath.c_str(), &xf.p);
    if (st != WUSH_OK) return cli::report("opening the activations file", st);
    std::size_t count = 0;
    wush_tensor_file_count(wf.p, &count);
    std::vector<std::string> left_out;
    for (std::size_t i = 0; i < count; ++i) {
        const char* name = nullptr;
        wush_tensor_file_tensor(wf.p, i, &name, nullptr, nullptr, nullptr, nullptr, nullptr);
        Layer l;
        std::size_t xi = 0, n_tokens = 0, x_cols = 0;
        if (!find_activations(xf.p, name, &xi, &l.name)) {
            left_out.emplace_back(name);
            continue;
        }
        if (read_matrix(wf.p, i, wpath.c_str(), &l.d_out, &l.d_in, &l.w_dtype, &l.weight) != 0) return 1;
        if (read_matrix(xf.p, xi, xpath.c_str(), &n_tokens, &x_cols, &l.x_dtype, &l.x) != 0) return 1;
        if (x_cols != l.d_in) {
            std::fprintf(stderr, "wush: '%s': weight has d_in %zu but activations have %zu columns\n",
                         cli::printable(name).c_str(), l.d_in, x_cols);
            return 1;
        }
        l.n_heldout = all_heldout ? n_tokens : n_held_opt ? n_held_opt : n_tokens / 4;
        if (l.n_heldout == 0 || l.n_heldout > n_tokens || (l.n_heldout == n_tokens && !all_heldout)) {
            std::fprintf(stderr, "wush: '%s': %zu tokens cannot be split into calibration and %zu held-out tokens\n",
                         cli::printable(name).c_str(), n_tokens, l.n_heldout);
            return 1;
        }
        l.n_calibration = n_tokens - l.n_heldout;
        layers->push_back(std::move(l));
    }
    if (layers->empty()) {
        std::fprintf(stderr,
                     "wush: no tensor of %s has activations in %s (looked up by the weight's name, or by it "
                     "without '.weight')\n",
                     cli::printable(wpath).c_str(), cli::printable(xpath).c_str());
        return 1;
    }
    report_left_out(left_out, wpath);
    return 0;
}
