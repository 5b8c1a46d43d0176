// Shared pieces of the `wush` subcommands: argument parsing, error reporting, the progress bar.
// A client of the public C API only.
#pragma once

#include <cstddef>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "wush/wush.h"

namespace cli {

// Parsed "--name value" / "--flag" arguments. Unknown options are errors.
class Args {
public:
    // `flags`: options without a value; `valued`: options taking one value.
    Args(int argc, char** argv, const std::vector<std::string>& flags, const std::vector<std::string>& valued);
    bool ok() const { return error_.empty(); }
    const std::string& error() const { return error_; }
    bool has(const std::string& name) const { return values_.count(name) != 0; }
    std::string get(const std::string& name, const std::string& fallback = "") const;
    // Parses a positive integer option; sets error() and returns `fallback` when malformed.
    std::size_t get_size(const std::string& name, std::size_t fallback);

private:
    std::map<std::string, std::string> values_;
    std::string error_;
};

std::vector<std::string> split(const std::string& s, char sep);

// Prints "wush: <what> failed: STATUS: message" to stderr; returns exit code 1.
int report(const char* what, wush_status status);

// "rtn" / "gptq" (the JSON and checkpoint spelling), "?" for anything else.
const char* method_name(wush_method method);
// Parses "rtn" / "gptq"; false for anything else.
bool method_from_name(const std::string& name, wush_method* method);

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
