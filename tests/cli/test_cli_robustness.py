#!/usr/bin/env python3
"""Regression tests of the `wush` program's handling of bad input, each of which once misbehaved:
per-command --help was an "unknown argument"; a run too large for memory aborted on
std::bad_alloc; --damping abc silently meant 0; quantize checked --out only after all the work;
eval --checkpoint read a weights file of another shape out of bounds; --json did not escape
names; inspect printed control characters from names raw; numbers overflowed ("--threads
99999999999999999999" read as -1), negative sizes ended in std::length_error, empty list items,
unknown --kind items, a repeated option, `version extra` were accepted, `--seed 0` refused; an
export or quantize whose output was one of its inputs destroyed it; a failed export (its config
unwritable) left the model file behind; inspect, eval and export used a checkpoint whose layer
digests did not match, and verify passed one whose digests were stripped; control characters of
paths (escape sequences, line breaks) reached the terminal raw; numeric options had no upper bound
(bench --repeats 1000000000000 ran until killed).

Usage: test_cli_robustness.py PATH/TO/wush
"""
import json
import os
import random
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def run(*args, timeout=120):
    try:
        p = subprocess.run([WUSH, *args], capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "", f"timed out after {timeout} s", b""
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), p.stdout


def write_f32(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def gauss(n, rng):
    return [rng.gauss(0.0, 1.0) for _ in range(n)]


WUSH = sys.argv[1]
rng = random.Random(7)

# --help of each command prints that command's usage, exit 0.
for cmd in ("eval", "quantize", "inspect", "export", "bench", "formats"):
    rc, out, err, _ = run(cmd, "--help")
    check(rc == 0 and out.startswith("usage: wush " + cmd), f"wush {cmd} --help: rc {rc}, {out[:80]!r} {err[:80]!r}")

# Too large for memory: said before it starts, no abort (a signal gives a negative returncode).
rc, out, err, _ = run("eval", "--layers", "small_256x512", "--calib-tokens", "1000000000")
check(rc == 1 and "memory" in err, f"huge --calib-tokens: rc {rc}, {err!r}")

# The memory check compares with what this process may still allocate, not with the machine's RAM:
# under an address-space limit of 2 GB, 3 million tokens of 256 floats (2.9 GiB) are refused at
# once, with the figures (the run used to start and be killed, or to fail on its first allocation).
def limit_as():
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2_000_000_000, 2_000_000_000))


# (AddressSanitizer reserves terabytes of address space for its shadow: no run under a 2 GB limit.)
with open(WUSH, "rb") as f:
    asan = b"__asan_init" in f.read()
if not asan:
    p = subprocess.run([WUSH, "eval", "--layers", "small_256x512", "--calib-tokens", "3000000", "--format", "mxfp4",
                        "--transform", "h"], capture_output=True, timeout=60, preexec_fn=limit_as)
    err = p.stderr.decode("utf-8", "replace")
    check(p.returncode == 1 and "RLIMIT_AS" in err and "2.9 GiB" in err, f"eval over RLIMIT_AS: rc {p.returncode}, {err!r}")
else:
    print("cli robustness: ASan build, the RLIMIT_AS case is not run")

# Strict numbers.
for bad in ("abc", "0.1x", "", "nan", "1e999"):
    rc, out, err, _ = run("eval", "--layers", "small_256x512", "--damping", bad)
    check(rc == 2 and "--damping" in err, f"--damping {bad!r}: rc {rc}, {err!r}")
    rc, out, err, _ = run("eval", "--layers", "small_256x512", "--hessian-damping", bad)
    check(rc == 2 and "--hessian-damping" in err, f"--hessian-damping {bad!r}: rc {rc}, {err!r}")
rc, out, err, _ = run("eval", "--layers", "small_256x512", "--hessian-damping", "-1")
check(rc == 2 and "--hessian-damping" in err and "0 to 1000000" in err, f"--hessian-damping -1: rc {rc}, {err!r}")


# --hessian-damping reaches GPTQ's Hessian only: the default is --damping's value (the same
# losses), another value changes GPTQ's loss and leaves RTN's.
def eval_losses(*extra):
    rc, out, err, _ = run("eval", "--layers", "small_256x512", "--format", "mxfp4", "--transform", "wush",
                          "--method", "all", "--json", *extra)
    check(rc == 0, f"eval {extra}: rc {rc}, {err!r}")
    return {r["method"]: r["loss"] for r in json.loads(out)["results"]} if rc == 0 else {}


plain, same, apart = eval_losses(), eval_losses("--hessian-damping", "0.01"), eval_losses("--hessian-damping", "1")
check(plain and plain == same, f"--hessian-damping 0.01 (the default) changed the losses: {plain} vs {same}")
check(plain and apart and apart["rtn"] == plain["rtn"] and apart["gptq"] != plain["gptq"],
      f"--hessian-damping 1: {plain} vs {apart}")

# One strict parser: a usage error exits 2 and names the option and the value.
usage_errors = [
    (("eval", "--threads", "99999999999999999999"), "--threads", "99999999999999999999"),
    (("eval", "--seed", "18446744073709551616"), "--seed", "18446744073709551616"),
    (("eval", "--search-tokens", "99999999999999999999", "--transform", "wush+s"), "--search-tokens", "9999"),
    (("eval", "--layers", "small_256x512", "--no-search-guard"), "--no-search-guard", "searched column"),
    (("quantize", "--threads", "-1"), "--threads", "-1"),
    (("bench", "--m", "-1"), "--m", "-1"),
    (("formats", "--rows", "-1"), "--rows", "-1"),
    (("formats", "--cols", "0"), "--cols", "0"),
    (("bench", "--kind", "gemm,nope"), "--kind", "nope"),
    (("bench", "--min-time", "-1"), "--min-time", "-1"),
    (("bench", "--contend-cpu", "99999"), "--contend-cpu", "99999"),
    (("bench", "--m", "1,,2"), "--m", "1,,2"),
    (("bench", "--layers", "4096x4096,"), "--layers", "4096x4096,"),
    (("bench", "--device", "gpu"), "--device", "gpu"),
    (("bench", "--timing", "graph"), "--timing", "--device cuda"),
    (("eval", "--layers", ""), "--layers", "''"),
    (("eval", "--layers", "small_256x512", "--format", "mxfp4,"), "--format", "mxfp4,"),
    (("eval", "--layers", "small_256x512", "--method", "rtn,nope"), "--method", "nope"),
    (("eval", "--weights", "a", "--weights", "b", "--activations", "c"), "--weights", "more than once"),
    (("quantize", "--out", "", "--weights", "w", "--activations", "x", "--format", "mxfp4", "--transform", "wush"),
     "--out", "''"),
    (("export", "--fp-quant", "--checkpoint", "ck", "--out", "o", "--config", ""), "--config", "''"),
    (("version", "extra"), "version", "extra"),
]
# Every numeric option of every command has an upper bound (usage texts, docs/EVAL.md): one past
# it is refused at once in one line, naming the option and the bound.
TOO_LARGE = "4294967297"  # 2^32 + 1: one past the bound of token counts, lengths and bench --m
bounded = [
    ("eval", "--calib-tokens", TOO_LARGE, "4294967296"), ("eval", "--heldout-tokens", TOO_LARGE, "4294967296"),
    ("eval", "--validation-tokens", "65537", "65536"), ("eval", "--search-tokens", "65537", "65536"),
    ("eval", "--threads", "4097", "4096"), ("eval", "--damping", "1000001", "1000000"),
    ("eval", "--hessian-damping", "2e6", "1000000"), ("eval", "--seed", str(2**62 + 1), str(2**62)),
    ("eval", "--sequence-length", TOO_LARGE, "4294967296"), ("eval", "--documents", "16," + TOO_LARGE, "4294967296"),
    ("quantize", "--threads", "4097", "4096"), ("quantize", "--search-tokens", "65537", "65536"),
    ("quantize", "--validation-tokens", TOO_LARGE, "4294967296"), ("quantize", "--damping", "1e300", "1000000"),
    ("quantize", "--hessian-damping", "1000001", "1000000"), ("quantize", "--seed", str(2**62 + 1), str(2**62)),
    ("quantize", "--sequence-length", TOO_LARGE, "4294967296"), ("quantize", "--documents", TOO_LARGE, "4294967296"),
    ("bench", "--repeats", "1000000000000", "10000"), ("bench", "--min-time", "1e9", "60"),
    ("bench", "--threads", "4097", "4096"), ("bench", "--m", "1," + TOO_LARGE, "4294967296"),
    ("formats", "--rows", "16777217", "16777216"), ("formats", "--cols", "16777217", "16777216"),
    ("formats", "--seed", "4294967296", "4294967295"),
]
for command, option, value, bound in bounded:
    rc, out, err, _ = run(command, option, value, timeout=20)
    check(rc == 2 and option in err and value.split(",")[-1] in err and bound in err and err.count("\n") == 1,
          f"wush {command} {option} {value}: rc {rc} (want 2, naming the bound {bound}), {err[-300:]!r}")
# The bounds hold whichever device would run the bench (the CUDA one is a separate program).
rc, out, err, _ = run("bench", "--device", "cuda", "--repeats", "1000000000000", timeout=20)
check(rc == 2 and "--repeats" in err and "10000" in err, f"bench --device cuda --repeats: rc {rc}, {err[-300:]!r}")
for args, option, value in usage_errors:
    rc, out, err, _ = run(*args, timeout=20)  # refused at once, before any work
    check(rc == 2 and option in err and value in err and "Traceback" not in err and "max_size" not in err,
          f"wush {' '.join(args)!s}: rc {rc} (want 2), {err[-300:]!r}")

# Seed 0 is a seed; a bench --help tells of --device.
rc, out, err, _ = run("formats", "--rows", "4", "--cols", "64", "--seed", "0")
check(rc == 0 and "seed 0" in out, f"formats --seed 0: rc {rc}, {err!r}")
rc, out, err, _ = run("eval", "--layers", "small_256x512", "--calib-tokens", "300", "--heldout-tokens", "64",
                      "--format", "mxfp4", "--transform", "h", "--seed", "0", "--json")
check(rc == 0, f"eval --seed 0: rc {rc}, {err[-300:]!r}")
rc, out, err, _ = run("bench", "--help")
check(rc == 0 and "--device" in out, f"bench --help does not mention --device: {out!r}")
# A batch no machine holds is refused before any set-up, naming memory.
rc, out, err, _ = run("bench", "--layers", "4096x4096", "--format", "mxfp4", "--m", "1,4000000000", timeout=20)
check(rc == 1 and "memory" in err and "m = 4000000000" in err, f"bench with a huge --m: rc {rc}, {err!r}")

with tempfile.TemporaryDirectory() as tmp:
    # A layer name with a quote, a backslash and an escape sequence.
    name = 'blk"0\\\x1b[31mred'
    d_out, d_in, n = 8, 64, 48
    weights, acts, wrong = (os.path.join(tmp, f) for f in ("w.safetensors", "x.safetensors", "w2.safetensors"))
    write_f32(weights, {name: ((d_out, d_in), gauss(d_out * d_in, rng))})
    write_f32(acts, {name: ((n, d_in), gauss(n * d_in, rng))})
    write_f32(wrong, {name: ((2 * d_out, d_in), gauss(2 * d_out * d_in, rng))})
    ck = os.path.join(tmp, "ck.safetensors")

    # --out is checked before the work.
    start = time.monotonic()
    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", os.path.join(tmp, "missing-dir", "ck.safetensors"))
    check(rc == 2 and "cannot write into" in err, f"quantize into a missing directory: rc {rc}, {err!r}")
    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", tmp)
    check(rc == 2 and "is a directory" in err, f"quantize onto a directory: rc {rc}, {err!r}")
    # Nothing that is not a regular file is replaced (as root, --out /dev/null once made the null
    # device a regular file): a FIFO, a socket, a device node made here (where this user may), a
    # link to the FIFO, and a regular file in a folder where nothing can be created (/proc).
    specials = {"fifo": os.path.join(tmp, "fifo"), "sock": os.path.join(tmp, "sock"),
                "link": os.path.join(tmp, "link-to-fifo")}
    os.mkfifo(specials["fifo"])
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(specials["sock"])
    os.symlink(specials["fifo"], specials["link"])
    try:
        os.mknod(os.path.join(tmp, "null"), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        specials["null"] = os.path.join(tmp, "null")
    except PermissionError:
        print("cli_robustness: not allowed to make a device node here; the device case is left out")
    kinds = {k: stat.S_IFMT(os.lstat(p).st_mode) for k, p in specials.items()}
    for kind, path in list(specials.items()) + [("proc", "/proc/version")]:
        rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                              "--transform", "wush", "--out", path, timeout=20)
        check(rc == 2 and ("not a regular file" in err or "is a FIFO" in err or "is a socket" in err or
                           "is a character device" in err or "cannot write into" in err),
              f"quantize --out {kind}: rc {rc}, {err!r}")
    for kind, path in specials.items():
        check(stat.S_IFMT(os.lstat(path).st_mode) == kinds[kind], f"quantize --out {kind} replaced it")
    sock.close()

    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", ck)
    check(rc == 0, f"quantize: rc {rc}, {err!r}")

    # inspect: no control characters from the name reach the terminal.
    rc, out, err, raw = run("inspect", ck)
    check(rc == 0 and b"\x1b" not in raw and "blk" in out, f"inspect: rc {rc}, {raw[:300]!r}")

    # verify: every byte against the writer's digests; one changed scale byte is caught (it loads
    # and runs otherwise).
    rc, out, err, _ = run("verify", ck)
    check(rc == 0 and "every layer's bytes match" in out, f"verify: rc {rc}, {out!r} {err!r}")
    with open(ck, "rb") as f:
        blob = bytearray(f.read())
    n_header = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n_header])
    scales = next(v for k, v in header.items() if k.endswith(".scales"))
    at = 8 + n_header + scales["data_offsets"][0]
    blob[at] ^= 1
    damaged = os.path.join(tmp, "damaged.safetensors")
    with open(damaged, "wb") as f:
        f.write(blob)
    # inspect and eval check the digests too (they used to check the structure only).
    rc, out, err, _ = run("inspect", damaged)
    check(rc == 1 and "differ from the digest" in err, f"inspect of a changed scale byte: rc {rc}, {err!r}")
    rc, out, err, raw = run("verify", damaged)
    check(rc == 1 and "differ from the digest" in err and b"\x1b" not in raw, f"verify a changed byte: rc {rc}, {err!r}")
    rc, out, err, _ = run("eval", "--checkpoint", damaged, "--weights", weights, "--activations", acts)
    check(rc == 1 and "differ from the digest" in err, f"eval --checkpoint of a changed byte: rc {rc}, {err!r}")

    # Digests stripped from the header: the file still loads (digests are optional), but verify
    # cannot vouch for its bytes and says so, failing.
    def rewrite_header(src, dst, edit):
        with open(src, "rb") as f:
            data = f.read()
        n = struct.unpack("<Q", data[:8])[0]
        head = json.loads(data[8:8 + n])
        edit(head)
        text = json.dumps(head).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(dst, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + data[8 + n:])

    def strip_digests(head):
        head["__metadata__"] = {k: v for k, v in head["__metadata__"].items() if not k.endswith(".sha256")}

    stripped = os.path.join(tmp, "stripped.safetensors")
    rewrite_header(ck, stripped, strip_digests)
    rc, out, err, _ = run("verify", stripped)
    check(rc == 1 and "no digests" in err, f"verify without digests: rc {rc}, {out!r} {err!r}")
    rc, out, err, _ = run("inspect", stripped)
    check(rc == 0 and "blk" in out, f"inspect without digests: rc {rc}, {err!r}")

    # Paths with control characters: escaped wherever they are printed, by the program and in the
    # library's messages it passes on (a line break used to start a line of its own).
    evil = os.path.join(tmp, "ck\x1b[31m\nFAKE: all good.safetensors")
    for args in (("inspect", evil), ("verify", evil), ("export", "--fp-quant", "--checkpoint", evil, "--out",
                                                       os.path.join(tmp, "never.safetensors")),
                 ("eval", "--checkpoint", evil, "--weights", weights, "--activations", acts),
                 ("quantize", "--weights", evil, "--activations", acts, "--format", "mxfp4", "--transform", "h",
                  "--out", os.path.join(tmp, "never.safetensors")),
                 ("eval", "--weights", weights, "--activations", evil), ("\x1b[31m\nFAKE",)):
        p = subprocess.run([WUSH, *args], capture_output=True, timeout=60)
        raw = p.stdout + p.stderr
        check(p.returncode != 0 and b"\x1b" not in raw and b"\nFAKE" not in raw and b"\\x1b" in raw,
              f"wush {args[0]!r} of a path with control characters: rc {p.returncode}, {raw[-400:]!r}")
    with open(ck, "rb") as f, open(evil, "wb") as g:
        g.write(f.read())
    for args in (("inspect", evil), ("verify", evil)):
        p = subprocess.run([WUSH, *args], capture_output=True, timeout=60)
        raw = p.stdout + p.stderr
        check(p.returncode == 0 and b"\x1b" not in raw and b"\nFAKE" not in raw and b"\\x1b" in raw,
              f"wush {args[0]!r} of a checkpoint at a path with control characters: rc {p.returncode}, {raw[-400:]!r}")
    p = subprocess.run([WUSH, "quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                        "--transform", "h", "--out", evil], capture_output=True, timeout=120)
    check(p.returncode == 0 and b"\x1b" not in p.stderr and b"\nFAKE" not in p.stderr and b"\\x1b" in p.stderr,
          f"quantize --out a path with control characters: rc {p.returncode}, {p.stderr[-400:]!r}")

    # eval --checkpoint --json: valid JSON with the exact name.
    rc, out, err, _ = run("eval", "--checkpoint", ck, "--weights", weights, "--activations", acts, "--json")
    try:
        results = json.loads(out)["results"]
        check(rc == 0 and len(results) == 1 and results[0]["layer"] == name, f"eval --json: {out!r}")
        check(isinstance(results[0]["loss"], float) and results[0]["loss"] > 0, f"eval --json loss: {out!r}")
    except (ValueError, KeyError) as e:
        check(False, f"eval --json is not valid JSON ({e}): {out!r}")

    # A model's own file: "<module>.weight" pairs with activations named "<module>"; embeddings,
    # biases and norms have none and are left out, named in one line (a missing activation tensor
    # used to end the run). The layer is named by its module, so eval --checkpoint finds it again.
    model_file = os.path.join(tmp, "model.safetensors")
    write_f32(model_file, {"emb.weight": ((16, d_in), gauss(16 * d_in, rng)),
                           name + ".weight": ((d_out, d_in), gauss(d_out * d_in, rng)),
                           name + ".bias": ((d_out,), gauss(d_out, rng)),
                           "norm.weight": ((d_in,), gauss(d_in, rng))})
    ck_model = os.path.join(tmp, "ck-model.safetensors")
    rc, out, err, _ = run("quantize", "--weights", model_file, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", ck_model)
    left = [line for line in err.splitlines() if "left out" in line]
    check(rc == 0 and len(left) == 1 and "3 tensor(s)" in left[0] and "'emb.weight'" in left[0]
          and "'norm.weight'" in left[0] and ".bias'" in left[0] and "\x1b" not in err,
          f"quantize a model's file: rc {rc}, {err!r}")
    rc, out, err, _ = run("eval", "--checkpoint", ck_model, "--weights", model_file, "--activations", acts, "--json")
    check(rc == 0 and [r["layer"] for r in json.loads(out or "{}").get("results", [])] == [name],
          f"eval --checkpoint of a model's file: rc {rc}, {out!r} {err!r}")
    # No tensor with activations: an error that says how they are looked up.
    other_acts = os.path.join(tmp, "other-x.safetensors")
    write_f32(other_acts, {"other": ((n, d_in), gauss(n * d_in, rng))})
    rc, out, err, _ = run("quantize", "--weights", model_file, "--activations", other_acts, "--format", "mxfp4",
                          "--transform", "wush", "--out", os.path.join(tmp, "none.safetensors"))
    check(rc == 1 and "has activations" in err and "without '.weight'" in err, f"no pairs: rc {rc}, {err!r}")

    # A weights file of another shape than the checkpoint's layer: a clear error, not a crash.
    rc, out, err, _ = run("eval", "--checkpoint", ck, "--weights", wrong, "--activations", acts)
    check(rc == 1 and "16 x 64" in err and "8 x 64" in err, f"eval --checkpoint, wrong shape: rc {rc}, {err!r}")

    # An output that is one of the inputs is refused before anything is written (same device and
    # inode: another name of the file, a hard link, counts too).
    def digest(path):
        with open(path, "rb") as f:
            return f.read()

    ck16 = os.path.join(tmp, "ck16.safetensors")
    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--transform-dtype", "bf16", "--out", ck16)
    check(rc == 0, f"quantize bf16: rc {rc}, {err!r}")
    before = digest(ck16)
    link = os.path.join(tmp, "ck16-link.safetensors")
    os.link(ck16, link)
    for out_args in (["--out", ck16], ["--out", link], ["--out", os.path.join(tmp, ".", "ck16.safetensors")],
                     ["--out", os.path.join(tmp, "m.safetensors"), "--config", ck16]):
        rc, out, err, _ = run("export", "--fp-quant", "--checkpoint", ck16, *out_args)
        check(rc == 2 and "same file" in err, f"export {out_args}: rc {rc}, {err!r}")
    rc, out, err, _ = run("export", "--fp-quant", "--checkpoint", ck16, "--out", os.path.join(tmp, "m.safetensors"),
                          "--config", os.path.join(tmp, "m.safetensors"))
    check(rc == 2 and "same file" in err, f"export with --config = --out: rc {rc}, {err!r}")
    check(digest(ck16) == before, "export over its checkpoint changed the checkpoint")
    w_before = digest(weights)
    for victim in (weights, acts):
        rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                              "--transform", "wush", "--out", victim)
        check(rc == 2 and "same file" in err, f"quantize --out its input: rc {rc}, {err!r}")
    check(digest(weights) == w_before, "quantize over its weights changed them")

    # A failed export leaves no file: the config's directory does not exist.
    fresh = os.path.join(tmp, "fresh.safetensors")
    rc, out, err, _ = run("export", "--fp-quant", "--checkpoint", ck16, "--out", fresh,
                          "--config", os.path.join(tmp, "nonexistent", "c.json"))
    check(rc == 2 and not os.path.exists(fresh), f"failed export: rc {rc}, model left: {os.path.exists(fresh)}, {err!r}")
    for option in ("--out", "--config"):
        args = {"--out": fresh, "--config": os.path.join(tmp, "c2.json")}
        args[option] = specials["fifo"]
        rc, out, err, _ = run("export", "--fp-quant", "--checkpoint", ck16, *[x for kv in args.items() for x in kv])
        check(rc == 2 and "is a FIFO" in err and stat.S_ISFIFO(os.lstat(specials["fifo"]).st_mode),
              f"export {option} FIFO: rc {rc}, {err!r}")
    rc, out, err, _ = run("export", "--fp-quant", "--checkpoint", ck16, "--out", fresh,
                          "--config", os.path.join(tmp, "c.json"))
    check(rc == 0 and os.path.exists(fresh) and os.path.exists(os.path.join(tmp, "c.json")), f"export: rc {rc}, {err!r}")
    # export checks the digests first: a changed byte writes nothing.
    with open(ck16, "rb") as f:
        blob = bytearray(f.read())
    n_header = struct.unpack("<Q", blob[:8])[0]
    codes = next(v for k, v in json.loads(blob[8:8 + n_header]).items() if k.endswith(".codes"))
    blob[8 + n_header + codes["data_offsets"][0]] ^= 0x11
    damaged16 = os.path.join(tmp, "damaged16.safetensors")
    with open(damaged16, "wb") as f:
        f.write(blob)
    never = os.path.join(tmp, "never-exported.safetensors")
    rc, out, err, _ = run("export", "--fp-quant", "--checkpoint", damaged16, "--out", never)
    check(rc == 1 and "differ from the digest" in err and not os.path.exists(never),
          f"export of a changed byte: rc {rc}, {err!r}")

    # Rewriting a private checkpoint keeps it private.
    os.chmod(ck16, 0o600)
    rc, out, err, _ = run("quantize", "--weights", weights, "--activations", acts, "--format", "mxfp4",
                          "--transform", "wush", "--transform-dtype", "bf16", "--out", ck16)
    check(rc == 0 and (os.stat(ck16).st_mode & 0o777) == 0o600, f"rewritten checkpoint mode {oct(os.stat(ck16).st_mode)}")

print("cli robustness:", "ok" if failures == 0 else f"{failures} failures")
sys.exit(1 if failures else 0)
