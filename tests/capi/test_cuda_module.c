/* The CUDA backend is a module opened on demand (capi/backend_registry.cpp). Runs on every machine:
 *   1. a CPU context never maps a CUDA library into the process;
 *   2. WUSH_CUDA_MODULE naming a missing file: WUSH_ERR_UNSUPPORTED naming the path and the loader's
 *      reason;
 *   3. a module from another build (argv[1], the fake module): refused, with the reason;
 *   4. damaged copies of it, made here: truncated, random header bytes, one flipped byte, no
 *      digest beside it, a FIFO in its place: each refused with WUSH_ERR_UNSUPPORTED before the
 *      loader sees it, and the process lives (a truncated module used to die with SIGBUS inside
 *      the loader, a FIFO to hang every CUDA context creation);
 *   5. the digest file beside a good copy is a FIFO, or a sparse file of gigabytes that starts
 *      with the right digest line: refused before the file is read (the FIFO used to block the
 *      creation for good, the large file to be read; its first line alone let the copy load);
 *   6. without WUSH_CUDA_MODULE, a truncated copy named libwush-cuda.so in a directory of
 *      LD_LIBRARY_PATH (a child process, started with it): refused like the copies above, with a
 *      status, not a signal (the loader's own search used to be handed the bare name and died of
 *      SIGBUS inside dlopen); not run where a module sits beside libwush (found first);
 *   7. argv[2] = "real" (builds with the CUDA backend): the default search finds libwush-cuda.so
 *      beside libwush.so; the context is created (GPU) or refused for want of a device, never for
 *      want of the module; only now is the module mapped. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "wush/wush.h"

static int failures = 0;

#define CHECK(cond, ...)                                     \
  do {                                                       \
    if (!(cond)) {                                           \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                          \
      fprintf(stderr, "\n");                                 \
      ++failures;                                            \
    }                                                        \
  } while (0)

/* Whether a file whose name contains `needle` is mapped into this process. */
static int mapped(const char* needle) {
    FILE* f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    if (f == NULL) return -1;
    while (!found && fgets(line, sizeof line, f) != NULL) found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

static wush_status try_cuda(void) {
    wush_context* ctx = NULL;
    wush_status st = wush_context_create(WUSH_BACKEND_CUDA, 0, &ctx);
    if (st == WUSH_OK) wush_context_destroy(ctx);
    return st;
}

/* Reads a whole file; *size receives its length. NULL on failure. */
static unsigned char* slurp(const char* path, long* size) {
    FILE* f = fopen(path, "rb");
    unsigned char* data = NULL;
    if (f == NULL) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (*size = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
        data = malloc((size_t)*size);
        if (data != NULL && fread(data, 1, (size_t)*size, f) != (size_t)*size) {
            free(data);
            data = NULL;
        }
    }
    fclose(f);
    return data;
}

static int spill(const char* path, const unsigned char* data, long size) {
    FILE* f = fopen(path, "wb");
    int ok = f != NULL && fwrite(data, 1, (size_t)size, f) == (size_t)size;
    if (f != NULL) ok = fclose(f) == 0 && ok;
    return ok;
}

/* Writes `size` bytes of `data` to DIR/name and, when `digest` is not NULL, copies the original's
 * recorded digest beside it; points WUSH_CUDA_MODULE at it and asks for a CUDA context, which must
 * be refused (UNSUPPORTED) with `reason` (NULL: any) in the message. */
static void expect_refused(const char* dir, const char* name, const unsigned char* data, long size,
                           const unsigned char* digest, long digest_size, const char* reason) {
    char path[512], side[540];
    wush_status st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(side, sizeof side, "%s.sha256", path);
    CHECK(spill(path, data, size), "%s: cannot write the copy", name);
    if (digest != NULL) CHECK(spill(side, digest, digest_size), "%s: cannot write the digest", name);
    setenv("WUSH_CUDA_MODULE", path, 1);
    st = try_cuda();
    CHECK(st == WUSH_ERR_UNSUPPORTED, "%s: got %s", name, wush_status_string(st));
    CHECK(strstr(wush_last_error(), "not loaded") != NULL && (reason == NULL || strstr(wush_last_error(), reason)),
          "%s: not refused before loading, or for another reason than '%s': %s", name, reason ? reason : "",
          wush_last_error());
    unlink(path);
    unlink(side);
}

/* A good copy whose digest file is a FIFO, then a sparse file of 3 GiB whose first line is the
 * right digest: both refused before the digest file is read, naming it. */
static void test_digest_files(const char* dir, const unsigned char* data, long size, const unsigned char* digest,
                              long digest_size) {
    char path[512], side[540];
    int fd;
    snprintf(path, sizeof path, "%s/sidecar.so", dir);
    snprintf(side, sizeof side, "%s.sha256", path);
    CHECK(spill(path, data, size), "cannot write the copy");
    setenv("WUSH_CUDA_MODULE", path, 1);
    CHECK(mkfifo(side, 0600) == 0, "cannot make a FIFO");
    CHECK(try_cuda() == WUSH_ERR_UNSUPPORTED && strstr(wush_last_error(), "not loaded") != NULL &&
              strstr(wush_last_error(), ".sha256 file: not a regular file") != NULL,
          "FIFO digest file: %s", wush_last_error());
    unlink(side);
    CHECK(spill(side, digest, digest_size), "cannot write the digest");
    fd = open(side, O_WRONLY);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)3 << 30) == 0, "cannot extend the digest file");
    if (fd >= 0) close(fd);
    CHECK(try_cuda() == WUSH_ERR_UNSUPPORTED && strstr(wush_last_error(), "not loaded") != NULL &&
              strstr(wush_last_error(), "more than a digest line") != NULL,
          "3 GiB digest file: %s", wush_last_error());
    unlink(side);
    unlink(path);
}

/* Case 6 in a child started with LD_LIBRARY_PATH = `dir`, which holds a truncated copy of the
 * module (named as the real one) and its digest: the child's exit status says how it went. */
static void test_loader_search(const char* self, const char* module) {
    char dir[64], path[128], side[160];
    long size = 0, digest_size = 0;
    unsigned char* data;
    unsigned char* digest;
    int status = 0;
    pid_t pid;
    snprintf(side, sizeof side, "%s.sha256", module);
    data = slurp(module, &size);
    digest = slurp(side, &digest_size);
    snprintf(dir, sizeof dir, "/tmp/wush_module_search_%ld", (long)getpid());
    snprintf(path, sizeof path, "%s/libwush-cuda.so", dir);
    snprintf(side, sizeof side, "%s.sha256", path);
    CHECK(data != NULL && digest != NULL && mkdir(dir, 0700) == 0, "cannot set up %s", dir);
    if (data == NULL || digest == NULL) return;
    CHECK(spill(path, data, size / 2) && spill(side, digest, digest_size), "cannot write into %s", dir);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        char* args[5];
        args[0] = (char*)self;
        args[1] = (char*)module;
        args[2] = (char*)"search-child";
        args[3] = dir;
        args[4] = NULL;
        setenv("LD_LIBRARY_PATH", dir, 1);
        unsetenv("WUSH_CUDA_MODULE");
        execv("/proc/self/exe", args);
        _exit(127);
    }
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "cannot run the child");
    if (WIFSIGNALED(status)) CHECK(0, "loader search: the child died of signal %d", WTERMSIG(status));
    else
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "loader search: the child failed (%d)",
              WEXITSTATUS(status));
    unlink(path);
    unlink(side);
    rmdir(dir);
    free(data);
    free(digest);
}

/* The child of test_loader_search: WUSH_CUDA_MODULE unset, LD_LIBRARY_PATH holding `dir`. */
static int loader_search_child(const char* dir) {
    const wush_status st = try_cuda();
    CHECK(st == WUSH_ERR_UNSUPPORTED, "loader search: got %s", wush_status_string(st));
    CHECK(strstr(wush_last_error(), dir) != NULL && strstr(wush_last_error(), "not loaded") != NULL &&
              strstr(wush_last_error(), "truncated") != NULL,
          "loader search: the copy in %s is not refused before loading: %s", dir, wush_last_error());
    CHECK(mapped("libwush-cuda") == 0, "loader search: the refused copy is mapped");
    return failures == 0 ? 0 : 1;
}

/* Damaged copies of the module at `module`, each refused before the loader sees it. */
static void test_damaged_copies(const char* module) {
    char dir[64], side[4096], fifo[128];
    long size = 0, digest_size = 0, i;
    unsigned char *data, *digest, *copy;
    unsigned seed = 12345;
    int round;
    snprintf(dir, sizeof dir, "/tmp/wush_module_test_%ld", (long)getpid());
    snprintf(side, sizeof side, "%s.sha256", module);
    data = slurp(module, &size);
    digest = slurp(side, &digest_size);
    CHECK(data != NULL && digest != NULL, "cannot read %s and its digest", module);
    CHECK(mkdir(dir, 0700) == 0, "cannot make %s", dir);
    if (data == NULL || digest == NULL) return;
    copy = malloc((size_t)size);
    alarm(60); /* a FIFO used to hang the creation: fail instead of waiting for ctest's timeout */
    expect_refused(dir, "truncated.so", data, size / 2, digest, digest_size, "truncated");
    expect_refused(dir, "nodigest.so", data, size, NULL, 0, "no digest");
    memcpy(copy, data, (size_t)size);
    copy[size / 2] ^= 0x10; /* inside the code, where the ELF checks cannot see it */
    expect_refused(dir, "flipped.so", copy, size, digest, digest_size, "SHA-256");
    for (round = 0; round < 5;
         ++round) { /* random bytes in the ELF header, past its identification, type and machine */
        memcpy(copy, data, (size_t)size);
        for (i = 24; i < 64; ++i) copy[i] = (unsigned char)((seed = seed * 1103515245u + 12345u) >> 16);
        expect_refused(dir, "random_header.so", copy, size, digest, digest_size, NULL);
    }
    test_digest_files(dir, data, size, digest, digest_size);
    snprintf(fifo, sizeof fifo, "%s/fifo.so", dir);
    CHECK(mkfifo(fifo, 0600) == 0, "cannot make a FIFO");
    setenv("WUSH_CUDA_MODULE", fifo, 1);
    CHECK(try_cuda() == WUSH_ERR_UNSUPPORTED && strstr(wush_last_error(), "not a regular file") != NULL, "FIFO: %s",
          wush_last_error());
    alarm(0);
    unlink(fifo);
    rmdir(dir);
    free(copy);
    free(data);
    free(digest);
    CHECK(mapped("random_header") == 0 && mapped("truncated") == 0, "a refused copy is mapped");
}

int main(int argc, char** argv) {
    wush_context* cpu = NULL;
    wush_status st;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FAKE_MODULE [real]\n", argv[0]);
        return 2;
    }
    alarm(120); /* a hang in any case (the child too) fails instead of waiting for ctest's timeout */
    if (argc > 3 && strcmp(argv[2], "search-child") == 0) return loader_search_child(argv[3]);
    CHECK(wush_context_create(WUSH_BACKEND_CPU, 0, &cpu) == WUSH_OK, "CPU context: %s", wush_last_error());
    wush_context_destroy(cpu);
    CHECK(mapped("libcudart") == 0 && mapped("libcublas") == 0 && mapped("libwush-cuda") == 0,
          "a CUDA library is mapped after a CPU context only");

    setenv("WUSH_CUDA_MODULE", "/nonexistent/libwush-cuda.so", 1);
    st = try_cuda();
    CHECK(st == WUSH_ERR_UNSUPPORTED, "missing module: got %s", wush_status_string(st));
    CHECK(strstr(wush_last_error(), "/nonexistent/libwush-cuda.so") != NULL &&
              strstr(wush_last_error(), "No such file") != NULL,
          "missing module: message lacks the path or the loader's reason: %s", wush_last_error());

    setenv("WUSH_CUDA_MODULE", argv[1], 1);
    st = try_cuda();
    CHECK(st == WUSH_ERR_UNSUPPORTED, "foreign module: got %s", wush_status_string(st));
    CHECK(strstr(wush_last_error(), "not-this-build") != NULL, "foreign module: message does not name its build: %s",
          wush_last_error());
    CHECK(mapped("fake_backend_module") == 0, "the refused module stays mapped");
    test_damaged_copies(argv[1]);
    if (argc > 2 && strcmp(argv[2], "real") == 0)
        printf("a module sits beside libwush: the loader-path search is not tested\n");
    else test_loader_search(argv[0], argv[1]);

    if (argc > 2 && strcmp(argv[2], "real") == 0) {
        unsetenv("WUSH_CUDA_MODULE");
        st = try_cuda();
        CHECK(
            st == WUSH_OK || (st == WUSH_ERR_UNSUPPORTED && strstr(wush_last_error(), "no usable CUDA device") != NULL),
            "real module: got %s: %s", wush_status_string(st), wush_last_error());
        CHECK(mapped("libwush-cuda.so") == 1, "the real module is not mapped after a CUDA context was asked for");
        printf("real module: %s%s\n", wush_status_string(st), st == WUSH_OK ? "" : " (no GPU here)");
    }
    if (failures == 0) printf("cuda module: OK\n");
    return failures == 0 ? 0 : 1;
}
