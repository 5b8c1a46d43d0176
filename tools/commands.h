// The `wush` subcommands; each returns the process exit code.
#pragma once

#include <cstddef>
#include <string>

int cmd_formats(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_verify(int argc, char** argv);
int cmd_export(int argc, char** argv);
int cmd_ungroup(int argc, char** argv);
int cmd_bench(int argc, char** argv);

// `wush eval --checkpoint`: the loss of each stored layer against its original weight, on the
// activations (the last n_held tokens, or all of them when n_held is 0); with `runtime`, Y_q comes
// from the CPU runtime (wush_layer_loss_runtime).
int eval_checkpoint(const std::string& checkpoint, const std::string& weights, const std::string& activations,
                    std::size_t n_held, bool json, bool runtime = false);
