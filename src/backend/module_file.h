// What the core checks of a backend module's file before handing it to the dynamic loader, which
// trusts its input: a truncated libwush-cuda.so (an interrupted install, a partial copy) made
// dlopen die with SIGBUS, random header bytes with SIGSEGV, and a FIFO at WUSH_CUDA_MODULE made it
// wait forever. The checks, in order:
//   1. the path names a regular file (opened without blocking, so a FIFO cannot stall us);
//   2. its ELF header is this machine's kind of shared object, and every header table and segment
//      it describes lies inside the file;
//   3. its SHA-256 equals the one its build recorded beside it, in `<module>.sha256` (written when
//      the module is built and again when it is installed, since installing rewrites its RPATH),
//      itself opened without blocking and read only if it is a regular file of one line's size.
// The digest guards against accidents, not against someone who can rewrite both files.
#pragma once

#include <string>

namespace wush::backend {

inline constexpr const char* kModuleDigestSuffix = ".sha256";

// Empty when the module at `path` passes every check; otherwise why not, in a few words.
std::string module_file_problem(const std::string& path);

}  // namespace wush::backend
