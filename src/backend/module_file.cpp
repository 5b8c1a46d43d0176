#include "backend/module_file.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/read_at.h"
#include "common/sha256.h"

namespace wush::backend {

namespace {

// An open file descriptor, closed on every path out.
struct Fd {
    int fd;
    explicit Fd(int f) : fd(f) {}
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
};

// Whether [offset, offset + size) lies inside a file of `file_size` bytes, without overflow.
bool inside(std::uint64_t offset, std::uint64_t size, std::uint64_t file_size) {
    return offset <= file_size && size <= file_size - offset;
}

#if defined(__x86_64__)
constexpr int kMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr int kMachine = EM_AARCH64;
#else
constexpr int kMachine = EM_NONE;  // any: other hosts are not built for
#endif

std::string elf_problem(int fd, std::uint64_t size) {
    ElfW(Ehdr) eh{};
    if (read_at(fd, &eh, sizeof eh, 0) != 0 || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return "not an ELF file";
    const bool native_class = eh.e_ident[EI_CLASS] == (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32);
    const bool native_order =
        eh.e_ident[EI_DATA] == (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB);
    if (!native_class || !native_order || eh.e_type != ET_DYN || (kMachine != EM_NONE && eh.e_machine != kMachine))
        return "not a shared object for this machine";
    if (eh.e_phentsize != sizeof(ElfW(Phdr)) || eh.e_phnum == 0 ||
        !inside(eh.e_phoff, std::uint64_t(eh.e_phnum) * sizeof(ElfW(Phdr)), size))
        return "its program headers lie outside the file (truncated or damaged)";
    if (eh.e_shoff != 0 &&
        (eh.e_shentsize != sizeof(ElfW(Shdr)) || !inside(eh.e_shoff, std::uint64_t(eh.e_shnum) * eh.e_shentsize, size)))
        return "its section headers lie outside the file (truncated or damaged)";
    std::vector<ElfW(Phdr)> ph(eh.e_phnum);
    if (read_at(fd, ph.data(), ph.size() * sizeof(ElfW(Phdr)), off_t(eh.e_phoff)) != 0)
        return "cannot read its program headers";
    for (const ElfW(Phdr) & p : ph) {
        if ((p.p_type == PT_LOAD || p.p_type == PT_DYNAMIC) && !inside(p.p_offset, p.p_filesz, size))
            return "a segment extends past the end of the file (truncated or damaged)";
        if (p.p_type == PT_LOAD && p.p_filesz > p.p_memsz) return "a segment is larger on disk than in memory";
    }
    return {};
}

// The largest digest file read: one line of 64 hex digits, two spaces and the module's name.
constexpr std::uint64_t kMaxDigestFileBytes = 4096;

// The digest recorded beside the module: the first 64 characters of `<path>.sha256`, in
// sha256sum's format ("<hex>  <name>"), in `hex`; or, in the result, why there is none. The file
// is opened without blocking and must be a regular file of at most kMaxDigestFileBytes: a FIFO
// there used to block the search for good, a file of gigabytes to be read whole.
std::string recorded_digest(const std::string& path, std::string& hex) {
    const std::string side = path + kModuleDigestSuffix;
    const Fd file(::open(side.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (file.fd < 0) return std::string("cannot open it: ") + std::strerror(errno);
    struct stat st {};
    if (::fstat(file.fd, &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    if (std::uint64_t(st.st_size) > kMaxDigestFileBytes)
        return std::to_string(st.st_size) + " bytes, more than a digest line (at most " +
               std::to_string(kMaxDigestFileBytes) + ")";
    std::string text(std::size_t(st.st_size), '\0');
    if (read_at(file.fd, text.data(), text.size(), 0) != 0) return "cannot read it";
    hex = text.substr(0, text.find_first_of(" \t\r\n"));
    if (hex.size() != 64) return "its first word is not 64 hexadecimal digits";
    for (char& c : hex) {
        if (!std::isxdigit(static_cast<unsigned char>(c))) return "its first word is not 64 hexadecimal digits";
        c = char(std::tolower(static_cast<unsigned char>(c)));
    }
    return {};
}

std::string file_digest(int fd, std::uint64_t size) {
    Sha256 h;
    std::vector<std::byte> chunk(1 << 20);
    for (std::uint64_t at = 0; at < size;) {
        const std::size_t n = std::size_t(std::min<std::uint64_t>(chunk.size(), size - at));
        if (read_at(fd, chunk.data(), n, off_t(at)) != 0) return {};
        h.update(std::span(chunk.data(), n));
        at += n;
    }
    return to_hex(h.finish());
}

}  // namespace

std::string module_file_problem(const std::string& path) {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    const Fd file(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (file.fd < 0) return std::strerror(errno);
    struct stat st {};
    if (::fstat(file.fd, &st) != 0) return std::strerror(errno);
    if (!S_ISREG(st.st_mode)) return "not a regular file";
    const auto size = std::uint64_t(st.st_size);
    if (std::string bad = elf_problem(file.fd, size); !bad.empty()) return bad;
    std::string recorded;
    if (const std::string bad = recorded_digest(path, recorded); !bad.empty())
        return std::string("no digest beside it (its ") + kModuleDigestSuffix + " file: " + bad +
               "; the build and the install write it)";
    const std::string actual = file_digest(file.fd, size);
    if (actual != recorded) return "its SHA-256 differs from the one its build recorded (damaged or replaced)";
    return {};
}

}  // namespace wush::backend
