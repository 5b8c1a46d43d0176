// Shared pieces of the `wush` subcommands: argument parsing, error reporting, the progress bar.
// A client of the public C API only.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "wush/wush.h"

namespace cli {

// Parsed "--name value" / "--flag" arguments: the one strict parser of every command. Unknown
// options, a missing or empty value and an option given twice are errors; so is a malformed
// value asked for through the typed getters, whose messages name the option and the value. The
// first error is kept (error()); commands print it and exit with kUsageError.
class Args {
public:
    // `flags`: options without a value; `valued`: options taking one value.
    Args(int argc, char** argv, const std::vector<std::string>& flags, const std::vector<std::string>& valued);
    bool ok() const { return error_.empty(); }
    const std::string& error() const { return error_; }
    bool has(const std::string& name) const { return values_.count(name) != 0; }
    std::string get(const std::string& name, const std::string& fallback = "") const;
    // An integer in [min, max] written in decimal digits only (no sign, no spaces; overflow is an
    // error, not a wrap-around); `fallback` when the option is absent or malformed.
    std::size_t get_size(const std::string& name, std::size_t fallback, std::size_t min = 1,
                         std::size_t max = SIZE_MAX);
    // A finite number in [min, max] (the whole value, nothing else), so "--damping abc" is an
    // error rather than 0.
    double get_double(const std::string& name, double fallback, double min = -HUGE_VAL, double max = HUGE_VAL);
    // A comma-separated list (the option's value, or `fallback`) without empty items.
    std::vector<std::string> get_list(const std::string& name, const std::string& fallback);
    // A list of integers in [min, max] (get_size's rules for each item).
    std::vector<std::size_t> get_size_list(const std::string& name, const std::string& fallback, std::size_t min = 1,
                                           std::size_t max = SIZE_MAX);
    // One of `choices` (the option's value, or `fallback`).
    std::string get_choice(const std::string& name, const std::string& fallback,
                           const std::vector<std::string>& choices);
    // A list (get_list) whose items are each one of `choices`.
    std::vector<std::string> get_choice_list(const std::string& name, const std::string& fallback,
                                             const std::vector<std::string>& choices);
    // Records a usage error of the command's own (a rule between options); the first one wins.
    void set_error(const std::string& message) {
        if (error_.empty()) error_ = message;
    }

private:
    bool parse_size(const std::string& name, const std::string& v, std::size_t min, std::size_t max, std::size_t* out);
    std::map<std::string, std::string> values_;
    std::string error_;
};

// The exit status of a usage error (a malformed command line), as in POSIX utilities.
inline constexpr int kUsageError = 2;
// Prints "wush <command>: <a.error()>" and returns kUsageError.
int usage_error(const char* command, const Args& a);
// Prints "wush <command>: <message>" and returns kUsageError.
int usage_error(const char* command, const std::string& message);

// Whether the output `path` of option `option` is none of `inputs` (option, path) and does not
// name the same file as another output already checked: same device and inode when both exist, the
// same name in the same directory otherwise. Writing over an input would destroy it. Prints why
// not (a usage error).
bool output_is_not_an_input(const char* command, const std::string& option, const std::string& path,
                            const std::vector<std::pair<std::string, std::string>>& inputs);

// Whether a file can be written to `path` (option `option`), checked before any work: `path` is
// absent or a regular file (through symbolic links; the library refuses anything else too, but
// only once the work is done), and a new file can be created in its directory (tried, not guessed
// from permission bits: root passes access() on /proc). Prints why not (a usage error).
bool writable_destination(const char* command, const std::string& option, const std::string& path);

std::vector<std::string> split(const std::string& s, char sep);

// `s` as a quoted JSON string: quotes, backslashes and control characters escaped, bytes that are
// not UTF-8 replaced by U+FFFD (names come from files and may be anything).
std::string json_string(const std::string& s);
// A JSON number, or null for NaN and infinities (which JSON cannot spell).
std::string json_number(double v);
// `s` safe to print on a terminal: control characters and bytes that are not UTF-8 as \xNN (and,
// unless told otherwise, a backslash as \\, so that the result reads back unambiguously).
std::string printable(const std::string& s, bool escape_backslash = true);
// A library message (wush_last_error()) safe to print: printable() line by line, keeping its line
// breaks (some messages list one item per line; the paths they quote have theirs escaped) and its
// backslashes (its own escapes, e.g. \x1b for an escape character in a path).
std::string printable_message(const std::string& s);

// The memory a run can still allocate: the least of MemAvailable, the room under this process's
// cgroup memory limit and the room under RLIMIT_AS (SIZE_MAX if none is known), and those
// figures in words for messages.
struct AvailableMemory {
    std::uint64_t bytes = SIZE_MAX;
    std::string detail;
};
AvailableMemory available_memory();
// Checks, before a run starts, that `bytes` (what it will hold at once) fit in the available
// memory; prints the figures and returns false otherwise. `bytes` = SIZE_MAX means the size
// overflowed.
bool fits_in_memory(const char* command, const std::string& what, std::size_t bytes);
// a * b, or SIZE_MAX if that overflows.
std::size_t mul_or_max(std::size_t a, std::size_t b);
std::size_t add_or_max(std::size_t a, std::size_t b);

// Prints "wush: <what> failed: STATUS: message" to stderr; returns exit code 1.
int report(const char* what, wush_status status);

// Parses a transform name with wush_transform_spec_from_name() (i, r, h, wus, wush; `+s` for the
// per-block search). On refusal prints the library's reason for `wush <command>` and returns
// false.
bool transform_from_name(const char* command, const std::string& name, wush_transform_kind* kind, bool* search);

// Every pre-quantization method, in wush_method's order, and their names as the library spells
// them (wush_method_name: the one table), for the options that take a method.
std::vector<wush_method> all_methods();
// Parses `name` with wush_method_from_name() (its case rule); on refusal prints a usage error for
// `wush <command>` naming `option` and the methods, and returns false.
bool method_from_name(const char* command, const std::string& option, const std::string& name, wush_method* method);

// The token sample the CLI keeps for the search (wush_calibrator_set_sample_size) and scores on
// (WUSH_OPTION_SEARCH_TOKENS): more real tokens than the library's default, which is sized for
// callers that keep none (docs/EVAL.md, "The per-block search").
inline constexpr std::size_t kSearchTokens = 1024;
// The guard's candidates (wush_guard_candidate, values 0..kGuardCandidates - 1) as the tools name
// them in tables and JSON.
inline constexpr int kGuardCandidates = WUSH_GUARD_SHRUNK + 1;
inline constexpr const char* kGuardCandidateNames[kGuardCandidates] = {"searched", "plain", "i", "h", "r", "shrunk"};
// The largest WUSH_OPTION_SEED (wush.h).
inline constexpr std::size_t kMaxSeed = std::size_t(1) << 62;
// Upper bounds of the other numeric options, so that no value runs until killed (e.g. bench
// --repeats 1000000000000); the usage texts (main.cpp) and docs/EVAL.md name them, and a value
// above one is a usage error. Where the library has bounds, these are the library's.
inline constexpr std::size_t kMaxThreads = 4096;                               // --threads
inline constexpr std::size_t kMaxTokens = std::size_t(1) << 32;                // token counts, lengths, bench --m
inline constexpr double kMaxDamping = 1e6;                                     // --damping, --hessian-damping
inline constexpr std::size_t kMinSearchTokens = 16, kMaxSearchTokens = 65536;  // WUSH_OPTION_SEARCH_TOKENS
inline constexpr std::size_t kMaxRepeats = 10000;                              // bench --repeats
inline constexpr double kMaxMinTime = 60.0;                                    // bench --min-time, in seconds

// How the calibration tokens are marked for the search's guard: --documents N[,N...] (the
// documents' lengths in tokens, back to back; one length: every document that long) or
// --sequence-length N (whole sequences of N). Neither: plain tokens.
struct CalibrationMarks {
    std::vector<std::size_t> documents;
    std::size_t sequence_length = 0;
};
// Reads --documents and --sequence-length (at most one of them: a usage error otherwise).
CalibrationMarks calibration_marks(Args& a);
// The document lengths of `n_tokens` calibration tokens under `marks` (empty without documents);
// false (with `error` set) when they do not add up to n_tokens.
bool document_lengths(const CalibrationMarks& marks, std::size_t n_tokens, std::vector<std::size_t>* lengths,
                      std::string* error);
// Adds n_tokens rows of `x` to `cal`: one wush_calibrator_add_document per document (its index
// the id), else wush_calibrator_add_sequences, else wush_calibrator_add. `lengths` from
// document_lengths.
wush_status add_calibration(wush_context* ctx, wush_calibrator* cal, wush_dtype dtype, const void* x,
                            std::size_t n_tokens, std::size_t d_in, const CalibrationMarks& marks,
                            const std::vector<std::size_t>& lengths);

// A one-line progress bar on stderr, redrawn in place.
class ProgressBar {
public:
    explicit ProgressBar(std::size_t total) : total_(total) {}
    ~ProgressBar() { finish(); }
    void step(const std::string& label);  // one unit done
    void finish();

private:
    std::size_t total_;
    std::size_t done_ = 0;
    bool open_ = false;
};

}  // namespace cli
