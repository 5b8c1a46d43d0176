// `wush eval`: the layerwise loss of every transform x format x method on built-in or given layers
// (the structure of the WUSH paper's layerwise-loss table).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "layers.h"

namespace {

const char* const kDefaultLayers = "4096x4096,4096x14336,14336x4096";
// The validation sample the calibrator keeps for the per-layer guard is bounded.
constexpr std::size_t kMaxValidationTokens = 65536;

// A column of the table: a transform kind, optionally with the per-block search
// (WUSH_OPTION_SEARCH; the name `wush+s`).
struct Column {
    wush_transform_kind kind;
    bool search = false;
    bool operator==(const Column&) const = default;
};

std::string column_name(const Column& c) {
    return std::string(wush_transform_kind_name(c.kind)) + (c.search ? "+s" : "");
}

struct Result {
    std::string layer;
    wush_format format;
    Column kind;
    wush_method method;
    double loss;
    // The search's guard (`+s` columns; source WUSH_GUARD_NONE otherwise or when none ran).
    wush_guard_source guard = WUSH_GUARD_NONE;
    wush_guard_candidate kept = WUSH_GUARD_SEARCHED;
    int undecided = 0;
};

using cli::kGuardCandidateNames;
const char* const kGuardSourceNames[5] = {"none", "validation", "hold_out", "hold_out_sequences", "hold_out_documents"};

struct Plan {
    std::vector<wush_format> formats;
    std::vector<Column> kinds;
    std::vector<wush_method> methods;
    bool runtime = false;                            // --runtime: Y_q from the CPU runtime (wush_layer_loss_runtime)
    bool searching = false;                          // some column has the `+s` search
    std::size_t search_tokens = cli::kSearchTokens;  // --search-tokens: the `+s` columns' sample
    std::size_t sample_tokens = 0;                   // the calibrators' token sample (wush_options_sample_size)
    cli::CalibrationMarks marks;                     // --documents / --sequence-length: the guard's hold-out units
};

bool wants(const Plan& plan, wush_method m) {
    for (wush_method x : plan.methods)
        if (x == m) return true;
    return false;
}

// Loss of one (transform, qweight) pair on the layer's held-out tokens, appended to `results`.
int record_loss(wush_context* ctx, const Layer& l, wush_transform* t, wush_qweight* q, wush_format f, Column kind,
                wush_method m, bool runtime, cli::ProgressBar& bar, std::vector<Result>* results) {
    double loss = 0.0;
    const auto loss_fn = runtime ? wush_layer_loss_runtime : wush_layer_loss;
    const wush_status st = loss_fn(ctx, t, q, l.w_dtype, l.weight.data(), l.x_dtype, l.heldout(), l.n_heldout, &loss);
    if (st != WUSH_OK)
        return cli::report(
            ("layer '" + l.name + "': " + (runtime ? "wush_layer_loss_runtime" : "wush_layer_loss")).c_str(), st);
    Result r{l.name, f, kind, m, loss};
    if (kind.search) {
        wush_status gs = wush_transform_guard(t, &r.guard, nullptr, &r.kept);
        if (gs == WUSH_OK) gs = wush_transform_guard_undecided(t, &r.undecided, nullptr, nullptr);
        if (gs != WUSH_OK) return cli::report(("layer '" + l.name + "': wush_transform_guard").c_str(), gs);
    }
    results->push_back(r);
    bar.step(l.name + " " + wush_format_name(f) + " " + column_name(kind));
    return 0;
}

// Evaluates one layer for every planned combination, appending to `results`. RTN builds each
// transform once for all formats of a group size; GPTQ builds transform and weights together
// from a full-mode calibrator (whose diagonal blocks are the same moments).
// `search_opts` are `opts` with WUSH_OPTION_SEARCH on (for the `+s` columns).
int eval_layer(wush_context* ctx, const Layer& l, const Plan& plan, const wush_options* opts,
               const wush_options* search_opts, cli::ProgressBar& bar, std::vector<Result>* results) {
    std::map<std::size_t, std::vector<wush_format>> by_group;
    for (wush_format f : plan.formats) {
        std::size_t g = 0;
        wush_format_group_size(f, &g);
        by_group[g].push_back(f);
    }
    const std::string where = "layer '" + l.name + "': ";
    const wush_moment_mode mode = wants(plan, WUSH_METHOD_GPTQ) ? WUSH_MOMENTS_FULL : WUSH_MOMENTS_BLOCK_DIAGONAL;
    for (const auto& [g, formats] : by_group) {
        Handle<wush_calibrator, wush_calibrator_destroy> cal;
        wush_status st = wush_calibrator_create(l.d_in, g, mode, &cal.p);
        if (st != WUSH_OK) return cli::report((where + "wush_calibrator_create").c_str(), st);
        // The search (`+s` columns) scores its candidates on real tokens: keep a sample of them.
        if (plan.searching) {
            st = wush_calibrator_set_sample_size(cal.p, plan.sample_tokens);
            if (st != WUSH_OK) return cli::report((where + "wush_calibrator_set_sample_size").c_str(), st);
        }
        // Documents or sequences of the calibration text let the `+s` columns' guard hold out whole ones.
        std::vector<std::size_t> lengths;
        std::string why;
        if (!cli::document_lengths(plan.marks, l.n_calibration, &lengths, &why))
            return cli::usage_error("eval", where + why);
        st = cli::add_calibration(ctx, cal.p, l.x_dtype, l.x.data(), l.n_calibration, l.d_in, plan.marks, lengths);
        if (st != WUSH_OK) return cli::report((where + "wush_calibrator_add").c_str(), st);
        // Validation tokens (--validation-tokens) feed the search's per-layer guard: `+s` columns only.
        if (plan.searching && l.n_validation > 0) {
            st = wush_calibrator_set_validation_size(cal.p, l.n_validation);
            if (st == WUSH_OK)
                st = wush_calibrator_add_validation(ctx, cal.p, l.x_dtype, l.validation(), l.n_validation);
            if (st != WUSH_OK) return cli::report((where + "wush_calibrator_add_validation").c_str(), st);
        }
        for (const Column& col : plan.kinds) {
            const wush_transform_kind kind = col.kind;
            if (col.search && wants(plan, WUSH_METHOD_RTN)) {
                // The search chooses each block for one format: transform and weights together.
                for (wush_format f : formats) {
                    Handle<wush_transform, wush_transform_destroy> t;
                    Handle<wush_qweight, wush_qweight_destroy> q;
                    st = wush_layer_quantize(ctx, cal.p, kind, f, WUSH_METHOD_RTN, l.w_dtype, l.weight.data(), l.d_out,
                                             l.d_in, search_opts, &t.p, &q.p);
                    if (st != WUSH_OK) return cli::report((where + "wush_layer_quantize (rtn, search)").c_str(), st);
                    if (record_loss(ctx, l, t.p, q.p, f, col, WUSH_METHOD_RTN, plan.runtime, bar, results) != 0)
                        return 1;
                }
            } else if (wants(plan, WUSH_METHOD_RTN)) {
                Handle<wush_transform, wush_transform_destroy> t;
                st = wush_transform_build(ctx, cal.p, l.w_dtype, l.weight.data(), l.d_out, l.d_in, kind, opts, &t.p);
                if (st != WUSH_OK) return cli::report((where + "wush_transform_build").c_str(), st);
                for (wush_format f : formats) {
                    Handle<wush_qweight, wush_qweight_destroy> q;
                    st = wush_qweight_create(ctx, t.p, f, WUSH_METHOD_RTN, l.w_dtype, l.weight.data(), l.d_out, l.d_in,
                                             opts, &q.p);
                    if (st != WUSH_OK) return cli::report((where + "wush_qweight_create").c_str(), st);
                    if (record_loss(ctx, l, t.p, q.p, f, col, WUSH_METHOD_RTN, plan.runtime, bar, results) != 0)
                        return 1;
                }
            }
            if (!wants(plan, WUSH_METHOD_GPTQ)) continue;
            for (wush_format f : formats) {
                Handle<wush_transform, wush_transform_destroy> t;
                Handle<wush_qweight, wush_qweight_destroy> q;
                st = wush_layer_quantize(ctx, cal.p, kind, f, WUSH_METHOD_GPTQ, l.w_dtype, l.weight.data(), l.d_out,
                                         l.d_in, col.search ? search_opts : opts, &t.p, &q.p);
                if (st != WUSH_OK) return cli::report((where + "wush_layer_quantize (gptq)").c_str(), st);
                if (record_loss(ctx, l, t.p, q.p, f, col, WUSH_METHOD_GPTQ, plan.runtime, bar, results) != 0) return 1;
            }
        }
    }
    return 0;
}

void print_json(const std::vector<Result>& results) {
    std::printf("{\"results\": [");
    for (std::size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        std::printf("%s\n  {\"layer\": %s, \"format\": \"%s\", \"transform\": \"%s\", \"method\": \"%s\", \"loss\": %s",
                    i ? "," : "", cli::json_string(r.layer).c_str(), wush_format_name(r.format),
                    column_name(r.kind).c_str(), wush_method_name(r.method), cli::json_number(r.loss).c_str());
        if (r.kind.search && r.guard != WUSH_GUARD_NONE)  // a `+s` column's guard: what it held out and kept
            std::printf(", \"guard\": {\"source\": \"%s\", \"kept\": \"%s\", \"undecided\": %s}",
                        kGuardSourceNames[int(r.guard)], kGuardCandidateNames[int(r.kept)],
                        r.undecided ? "true" : "false");
        std::printf("}");
    }
    std::printf("\n]}\n");
}

// Rows: layer x format x method; columns: transforms (the paper's table layout).
void print_table(const std::vector<Result>& results, const Plan& plan) {
    std::printf("%-16s %-7s %-6s", "layer", "format", "method");
    for (const Column& k : plan.kinds) std::printf(" %11s", column_name(k).c_str());
    std::printf("\n");
    std::vector<std::string> layers;
    for (const Result& r : results)
        if (layers.empty() || layers.back() != r.layer) layers.push_back(r.layer);
    for (const std::string& layer : layers) {
        for (wush_format f : plan.formats) {
            for (wush_method m : plan.methods) {
                std::printf("%-16s %-7s %-6s", cli::printable(layer).c_str(), wush_format_name(f), wush_method_name(m));
                for (const Column& k : plan.kinds) {
                    for (const Result& r : results)
                        if (r.layer == layer && r.format == f && r.method == m && r.kind == k)
                            std::printf(" %11.4e", r.loss);
                }
                std::printf("\n");
            }
        }
    }
    std::printf("loss = ||Y_q - Y||_F^2 / (d_out * n_tokens) on held-out tokens; lower is better.\n");
    if (plan.runtime) std::printf("Y_q computed by the CPU runtime (fused quantization + W4A4 GEMM, float32).\n");
}

// Reads the columns and rows of the table; a malformed list is a usage error (a.error()), an
// unknown name is reported here. Returns 0 or kUsageError.
int parse_plan(cli::Args& a, Plan* plan) {
    const std::vector<std::string> formats = a.get_list("--format", "mxfp4,nvfp4,int4");
    const std::vector<std::string> transforms = a.get_list("--transform", "i,r,h,wus,wush");
    const std::vector<std::string> methods = a.get_list("--method", "rtn");  // names checked below
    if (!a.ok()) return cli::usage_error("eval", a);
    for (const std::string& s : formats) {
        wush_format f;
        if (wush_format_from_name(s.c_str(), &f) != WUSH_OK)
            return cli::usage_error("eval",
                                    "unknown format '" + cli::printable(s) + "' (mxfp4, nvfp4, int4, mxfp4_ocp)");
        plan->formats.push_back(f);
    }
    for (const std::string& s : transforms) {
        wush_transform_kind k;
        bool search = false;
        if (!cli::transform_from_name("eval", s, &k, &search)) return cli::kUsageError;
        plan->kinds.push_back({k, search});
    }
    for (const std::string& s : methods) {
        if (s == "all") {
            for (wush_method m : cli::all_methods()) plan->methods.push_back(m);
            continue;
        }
        wush_method m;
        if (!cli::method_from_name("eval", "--method", s, &m)) return cli::kUsageError;
        plan->methods.push_back(m);
    }
    for (const Column& c : plan->kinds) plan->searching |= c.search;
    if ((a.has("--search-tokens") || a.has("--no-search-guard")) && !plan->searching)
        return cli::usage_error("eval",
                                "--search-tokens and --no-search-guard need a searched column (e.g. --transform "
                                "wush,wush+s)");
    return 0;
}

}  // namespace

int cmd_eval(int argc, char** argv) {
    cli::Args a(argc, argv, {"--json", "--runtime", "--no-search-guard"},
                {"--layers", "--seed", "--calib-tokens", "--heldout-tokens", "--validation-tokens", "--weights",
                 "--activations", "--format", "--transform", "--method", "--damping", "--hessian-damping", "--threads",
                 "--checkpoint", "--search-tokens", "--sequence-length", "--documents"});
    const std::size_t seed = a.get_size("--seed", 1, 0, cli::kMaxSeed);
    const std::size_t n_cal = a.get_size("--calib-tokens", 2048, 1, cli::kMaxTokens);
    const std::size_t n_held = a.get_size("--heldout-tokens", a.has("--weights") ? 0 : 256, 1, cli::kMaxTokens);
    const std::size_t n_val = a.get_size("--validation-tokens", 0, 1, kMaxValidationTokens);
    const std::size_t n_search =
        a.get_size("--search-tokens", cli::kSearchTokens, cli::kMinSearchTokens, cli::kMaxSearchTokens);
    const std::size_t threads = a.get_size("--threads", 0, 1, cli::kMaxThreads);
    const double damping = a.get_double("--damping", 0.0, 0.0, cli::kMaxDamping);
    const double hessian_damping = a.get_double("--hessian-damping", 0.0, 0.0, cli::kMaxDamping);
    if (!a.ok() || a.has("--weights") != a.has("--activations")) {
        std::fprintf(stderr, "wush eval: %s\n", a.ok() ? "--weights and --activations go together" : a.error().c_str());
        return 2;
    }
    if (a.has("--checkpoint")) {
        if (!a.has("--weights")) {
            std::fprintf(stderr,
                         "wush eval: --checkpoint needs --weights and --activations: the loss compares the "
                         "quantized layer with the unquantized weights\n");
            return 2;
        }
        return eval_checkpoint(a.get("--checkpoint"), a.get("--weights"), a.get("--activations"),
                               a.get_size("--heldout-tokens", 0, 1, cli::kMaxTokens), a.has("--json"),
                               a.has("--runtime"));
    }
    const std::vector<std::string> names =
        a.has("--weights") ? std::vector<std::string>{"files"} : a.get_list("--layers", kDefaultLayers);
    if (!a.ok()) return cli::usage_error("eval", a);
    Plan plan;
    if (parse_plan(a, &plan) != 0) return cli::kUsageError;
    plan.search_tokens = n_search;
    plan.marks = cli::calibration_marks(a);
    if (!a.ok()) return cli::usage_error("eval", a);
    plan.runtime = a.has("--runtime");

    Handle<wush_context, wush_context_destroy> ctx;
    Handle<wush_options, wush_options_destroy> opts, search_opts;
    wush_status st = wush_context_create(WUSH_BACKEND_CPU, 0, &ctx.p);
    if (st == WUSH_OK && threads) st = wush_context_set_parameter(ctx.p, WUSH_CONTEXT_NUM_THREADS, int64_t(threads));
    if (st == WUSH_OK) st = wush_options_create(&opts.p);
    if (st == WUSH_OK) st = wush_options_set_int(opts.p, WUSH_OPTION_SEED, int64_t(seed));
    if (st == WUSH_OK && a.has("--damping")) st = wush_options_set_double(opts.p, WUSH_OPTION_DAMPING, damping);
    if (st == WUSH_OK && a.has("--hessian-damping"))
        st = wush_options_set_double(opts.p, WUSH_OPTION_HESSIAN_DAMPING, hessian_damping);
    if (st == WUSH_OK) st = wush_options_create(&search_opts.p);
    if (st == WUSH_OK) st = wush_options_set_int(search_opts.p, WUSH_OPTION_SEED, int64_t(seed));
    if (st == WUSH_OK && a.has("--damping")) st = wush_options_set_double(search_opts.p, WUSH_OPTION_DAMPING, damping);
    if (st == WUSH_OK && a.has("--hessian-damping"))
        st = wush_options_set_double(search_opts.p, WUSH_OPTION_HESSIAN_DAMPING, hessian_damping);
    if (st == WUSH_OK) st = wush_options_set_int(search_opts.p, WUSH_OPTION_SEARCH, 1);
    if (st == WUSH_OK && a.has("--no-search-guard"))
        st = wush_options_set_int(search_opts.p, WUSH_OPTION_SEARCH_GUARD, 0);
    if (st == WUSH_OK) st = wush_options_set_int(search_opts.p, WUSH_OPTION_SEARCH_TOKENS, int64_t(plan.search_tokens));
    // The library says how many tokens the calibrators keep for the search and its guard.
    if (st == WUSH_OK) st = wush_options_sample_size(search_opts.p, &plan.sample_tokens);
    if (st != WUSH_OK) return cli::report("setting up", st);

    // A run too large for the memory this process may still use says so before it starts (not
    // with the kernel's OOM killer after minutes of work). What one built-in layer holds at once:
    // its tokens and weight as float32 here (the generator writes into them in place, with
    // float64 temporaries of one weight and 1024 tokens), the loss's float64 copy of the weight
    // and its product's layout of the quantized weight (eval/quantized_product.h: a byte per
    // weight and at most 0.75 per weight of group scales and sums; 10 bytes per weight), and for
    // GPTQ about four float64 d_in x d_in matrices (Hessian, its sums, inverse, factor). Tiles of
    // tokens add a few MiB.
    if (!a.has("--weights")) {
        const bool gptq = std::find(plan.methods.begin(), plan.methods.end(), WUSH_METHOD_GPTQ) != plan.methods.end();
        for (const std::string& name : names) {
            std::size_t d_out = 0, d_in = 0;
            if (wush_example_layer_shape(name.c_str(), &d_out, &d_in) != WUSH_OK) continue;  // reported when loaded
            using cli::add_or_max, cli::mul_or_max;
            const std::size_t tokens = add_or_max(add_or_max(n_cal, n_val), n_held);
            const std::size_t weights = mul_or_max(d_out, d_in);
            std::size_t bytes = mul_or_max(add_or_max(mul_or_max(tokens, d_in), weights), sizeof(float));
            bytes = add_or_max(bytes, mul_or_max(weights, 10));
            if (gptq) bytes = add_or_max(bytes, mul_or_max(mul_or_max(d_in, d_in), 4 * sizeof(double)));
            if (!cli::fits_in_memory("eval", "layer " + name + " with " + std::to_string(tokens) + " tokens", bytes))
                return 1;
        }
    }
    std::vector<Layer> file_layers;
    if (a.has("--weights") && load_layer_files(a.get("--weights"), a.get("--activations"), n_held, &file_layers) != 0)
        return 1;
    for (Layer& l : file_layers)
        if (n_val > 0 && split_validation(n_val, &l) != 0) return 1;
    const std::size_t n_layers = a.has("--weights") ? file_layers.size() : names.size();

    std::vector<Result> results;
    cli::ProgressBar bar(n_layers * plan.formats.size() * plan.kinds.size() * plan.methods.size());
    for (std::size_t i = 0; i < n_layers; ++i) {
        Layer builtin;
        if (!a.has("--weights") && (load_builtin(names[i], seed, n_cal + n_val, n_held, &builtin) != 0 ||
                                    (n_val > 0 && split_validation(n_val, &builtin) != 0)))
            return 1;
        const Layer& l = a.has("--weights") ? file_layers[i] : builtin;
        if (eval_layer(ctx.p, l, plan, opts.p, search_opts.p, bar, &results) != 0) return 1;
    }
    bar.finish();
    if (a.has("--json")) print_json(results);
    else print_table(results, plan);
    return 0;
}
