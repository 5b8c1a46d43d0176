#!/usr/bin/env python3
"""Checks that a wush wheel installs and runs on a Linux machine other than the one that built it.

    check_wheel.py WHEEL

Static checks on the wheel's files:
- the tag is py3-none-manylinux_2_NN_<arch> (a native library inside: not `any`, and not the
  build-machine-only linux_<arch>), and no ELF file inside needs a glibc newer than 2.NN;
- one copy of the library (libwush.so.N), no development files, the `wush` console command;
- RECORD lists every file with its hash; each Debian package the bundled libraries came from
  (auditwheel's SBOM) has its copyright file in <dist-info>/licenses/third_party/;
- every DT_NEEDED of every ELF file inside (libraries and the `wush` program) is either on the
  manylinux policy's system list below or found inside the wheel through that file's own RUNPATH;
  every RUNPATH/RPATH entry is $ORIGIN-relative (no path of the build machine).

Then at run time: the wheel is installed with pip into a fresh venv (numpy, its one dependency,
is taken from this interpreter's installation through a .pth file, since the test runs offline),
and `wush version` plus a quantize + a WUSH/GPTQ layer + its W4A4 forward from Python run with
LD_LIBRARY_PATH empty and, in a private mount namespace (`unshare -rm`), with the system's
BLAS/LAPACK/LAPACKE/OpenBLAS/libgomp/libgfortran/libquadmath files replaced by empty files, so
the loader cannot fall back to them. Every shared object the process maps after `import numpy`
(Python: /proc/self/maps; the program: LD_DEBUG=libs) must come from the installed wheel or be on
the system list. Without user namespaces the run goes on unhidden and says so; the mapping check
still holds.

Exits 1 with every problem found, listed.
"""
import base64
import csv
import glob
import hashlib
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

# Libraries every manylinux system has (the policy's list, minus X11/GL/glib, which libwush does
# not use). libgomp, libgfortran, libquadmath, BLAS/LAPACK are not on it: they must be bundled.
SYSTEM = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
          "libresolv.so.2", "libstdc++.so.6", "libgcc_s.so.1", "libatomic.so.1", "libmvec.so.1"}
SYSTEM_RE = re.compile(r"^ld-linux[-a-z0-9_.]*\.so\.\d+$|^ld64\.so\.\d+$|^linux-vdso\.so\.1$")
# What the run hides from the loader (files of the system's library directories).
HIDE_RE = re.compile(r"^lib(openblas|blas|cblas|lapack|lapacke|tmglib|gomp|gfortran|quadmath|flexiblas)[-_.p0-9]")
TAG_RE = re.compile(r"wush-[^-]+-py3-none-(manylinux_(\d+)_(\d+)_([a-z0-9_]+))(\.manylinux[a-z0-9_]+)*\.whl")


def system_lib(name):
    return name in SYSTEM or bool(SYSTEM_RE.match(name))


def elf_dynamic(path):
    """(needed, runpaths, soname, glibc_versions) of an ELF64 little-endian file, read with the
    section headers: .dynamic and .gnu.version_r with their string tables."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path}: not an ELF64 little-endian file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def cstr(sec, off):
        base = secs[sec][4] + off
        return data[base:data.index(b"\0", base)].decode()

    needed, runpaths, soname, glibc = [], [], None, set()
    for _name, typ, _fl, _addr, off, size, link, _info, _al, entsize in secs:
        if typ == 6:  # SHT_DYNAMIC
            for i in range(size // 16):
                tag, val = struct.unpack_from("<qQ", data, off + i * 16)
                if tag == 0:
                    break
                if tag == 1:
                    needed.append(cstr(link, val))
                elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                    runpaths += [p for p in cstr(link, val).split(":") if p]
                elif tag == 14:
                    soname = cstr(link, val)
        elif typ == 0x6FFFFFFE:  # SHT_GNU_verneed
            vn = off
            while True:
                _v, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, vn)
                va = vn + aux
                for _ in range(cnt):
                    _h, _f, _o, name, vnext = struct.unpack_from("<IHHII", data, va)
                    m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", cstr(link, name))
                    if m:
                        glibc.add((int(m.group(1)), int(m.group(2))))
                    va += vnext
                if not nxt:
                    break
                vn += nxt
    return needed, runpaths, soname, glibc


def check_files(whl, unpacked):
    """The static checks; returns the problems found."""
    bad = []
    m = TAG_RE.fullmatch(os.path.basename(whl))
    if not m:
        bad.append(f"wheel tag: {os.path.basename(whl)} is not py3-none-manylinux_2_NN_<arch>")
        tag_glibc = None
    else:
        tag_glibc = (int(m.group(2)), int(m.group(3)))
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        z.extractall(unpacked)
        ep = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        if not ep or "wush = wush._cli:main" not in z.read(ep[0]).decode():
            bad.append("no `wush` console command in entry_points.txt")
    libs = [n for n in names if re.search(r"(^|/)libwush\.so", n)]
    if len(libs) != 1 or not re.search(r"/libwush\.so\.\d+$", libs[0]):
        bad.append(f"the wheel should hold one libwush.so.N, holds {libs}")
    if [n for n in names if n.endswith((".h", ".pc", ".cmake", ".a"))]:
        bad.append("development files in the wheel")
    elves = []
    for n in names:
        p = os.path.join(unpacked, n)
        if n.endswith("/"):
            continue
        with open(p, "rb") as f:
            if f.read(4) == b"\x7fELF":
                elves.append(n)
    if not any(n.endswith("/bin/wush") for n in elves):
        bad.append("no bundled `wush` program")
    for n in elves:
        p = os.path.join(unpacked, n)
        needed, runpaths, _soname, glibc = elf_dynamic(p)
        for r in runpaths:
            if not r.startswith("$ORIGIN"):
                bad.append(f"{n}: RUNPATH entry {r!r} is not relative to $ORIGIN (a directory of the build machine)")
        dirs = [os.path.normpath(r.replace("$ORIGIN", os.path.dirname(p))) for r in runpaths if r.startswith("$ORIGIN")]
        for lib in needed:
            if system_lib(lib):
                continue
            hits = [d for d in dirs if os.path.isfile(os.path.join(d, lib))
                    and os.path.realpath(os.path.join(d, lib)).startswith(os.path.realpath(unpacked) + os.sep)]
            if not hits:
                bad.append(f"{n}: needs {lib}, neither a manylinux system library nor bundled where its RUNPATH "
                           f"{runpaths} looks")
        if tag_glibc and glibc and max(glibc) > tag_glibc:
            bad.append(f"{n}: needs GLIBC_{max(glibc)[0]}.{max(glibc)[1]}, newer than the tag's {tag_glibc}")
    bad += check_record_and_notices(unpacked, names)
    print(f"check_wheel: {len(elves)} ELF files: " + ", ".join(
        f"{os.path.basename(n)} (NEEDED {' '.join(elf_dynamic(os.path.join(unpacked, n))[0])})" for n in elves))
    return bad


def check_record_and_notices(unpacked, names):
    """RECORD lists every file with its sha256 and size; every Debian package auditwheel's record
    names has its copyright file in <dist-info>/licenses/third_party/ (scripts/wheel_notices.py)."""
    bad = []
    dist_info = next((n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")), None)
    if dist_info is None:
        return ["no .dist-info directory"]
    record = {}
    with open(os.path.join(unpacked, dist_info, "RECORD"), newline="") as f:
        for row in csv.reader(f):
            if row:
                record[row[0]] = row[1:]
    for n in names:
        if n.endswith("/") or n == f"{dist_info}/RECORD":
            continue
        with open(os.path.join(unpacked, n), "rb") as f:
            data = f.read()
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if record.get(n) != [digest, str(len(data))]:
            bad.append(f"RECORD: {n} is {'missing' if n not in record else 'listed with another hash or size'}")
    # The package's own licence: the SPDX expression in METADATA (PEP 639) and the repository's
    # LICENSE text in <dist-info>/licenses/.
    with open(os.path.join(unpacked, dist_info, "METADATA"), encoding="utf-8") as f:
        meta = f.read().split("\n\n", 1)[0].splitlines()
    if "License-Expression: Apache-2.0" not in meta:
        bad.append("METADATA has no License-Expression: Apache-2.0")
    lic = os.path.join(unpacked, dist_info, "licenses", "LICENSE")
    repo_license = pathlib.Path(__file__).resolve().parents[2] / "LICENSE"
    if not os.path.isfile(lic) or (repo_license.is_file() and pathlib.Path(lic).read_bytes() != repo_license.read_bytes()):
        bad.append(f"{dist_info}/licenses/LICENSE is missing or is not the repository's LICENSE")
    sbom = os.path.join(unpacked, dist_info, "sboms", "auditwheel.cdx.json")
    if any(n.startswith("wush.libs/") for n in names):
        if not os.path.isfile(sbom):
            return bad + ["bundled libraries but no auditwheel SBOM naming their packages"]
        with open(sbom) as f:
            pkgs = {c.get("name") for c in json.load(f).get("components", []) if c.get("purl", "").startswith("pkg:deb/")}
        if not pkgs:
            bad.append("the SBOM names no Debian package for the bundled libraries")
        for pkg in sorted(pkgs):
            p = os.path.join(unpacked, dist_info, "licenses", "third_party", f"{pkg}.copyright")
            if not os.path.isfile(p) or os.path.getsize(p) == 0:
                bad.append(f"no licence text of the bundled package {pkg} ({os.path.relpath(p, unpacked)})")
        if pkgs and not bad:
            print(f"check_wheel: RECORD complete; licence texts of {len(pkgs)} bundled packages: {' '.join(sorted(pkgs))}")
    return bad


PROBE = r"""
import ctypes, ctypes.util, json, os, sys
import numpy as np
np.random.default_rng(0), np.linalg.norm(np.ones(2))  # numpy's own lazily loaded modules, before the snapshot

def mapped():
    with open("/proc/self/maps") as f:
        return {l.split(None, 5)[5].strip() for l in f if len(l.split(None, 5)) == 6 and ".so" in l}

before = mapped()
import wush, wush._ffi as f
c, s = wush.quantize_rows(np.full((1, 32), 1.5, np.float32), "mxfp4")
# 1.5 = 2^0 x 1.5: E8M0 scale byte 127, E2M1 code of 1.5 (0b0110) in both nibbles
assert s.tolist() == [[127]], s
assert c[0, 0] == 0x66, hex(c[0, 0])
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 128)).astype(np.float32)
w = rng.standard_normal((32, 128)).astype(np.float32)
with wush.Calibrator(128, wush.format_group_size("mxfp4"), "full") as cal:
    cal.add(x)
    t, q = wush.layer_quantize(cal, w, "wush", "mxfp4", "gptq")  # LAPACK(E) and BLAS inside
y = wush.Linear(t, q)(x)
ref = x @ w.T
err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
assert y.shape == (64, 32) and err < 0.5, (y.shape, err)
print(json.dumps({"module": wush.__file__, "library": f.library_path, "version": wush.version(),
                  "err": err, "new": sorted(mapped() - before)}))
"""


def hidden_files():
    """The system's BLAS/LAPACK/OpenMP/Fortran runtime files, resolved and deduplicated."""
    dirs = ["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"]
    dirs += glob.glob("/usr/lib/*-linux-gnu*") + glob.glob("/lib/*-linux-gnu*")
    out = set()
    for d in dirs:
        for p in glob.glob(os.path.join(d, "*")) + glob.glob(os.path.join(d, "*", "*")):
            if HIDE_RE.match(os.path.basename(p)) and ".so" in os.path.basename(p):
                r = os.path.realpath(p)
                if os.path.isfile(r):
                    out.add(r)
    return sorted(out)


def run_hidden(cmd, env, hide, unshare_ok, cwd):
    """cmd with `hide` replaced by empty files (bind mounts of /dev/null in a private mount
    namespace) when unshare works; else cmd as it is."""
    if unshare_ok and hide:
        script = 'for f in "$@"; do [ "$f" = -- ] && break; mount --bind /dev/null "$f" || exit 99; shift; done; ' \
                 'shift; exec "$@"'
        cmd = ["unshare", "-rm", "sh", "-c", script, "sh"] + hide + ["--"] + cmd
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)


def check_run(whl, tmp):
    bad = []
    venv = os.path.join(tmp, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    py = os.path.join(venv, "bin", "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--no-index",
                    whl], check=True)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    # numpy from this interpreter's installation, alone (nothing else of it is visible).
    import numpy
    npdir = os.path.join(tmp, "numpy-only")
    os.makedirs(npdir)
    src = os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__)))
    for n in ("numpy", "numpy.libs"):
        if os.path.exists(os.path.join(src, n)):
            os.symlink(os.path.join(src, n), os.path.join(npdir, n))
    with open(os.path.join(site, "zz_numpy_of_the_test.pth"), "w") as f:
        f.write(npdir + "\n")

    env = {k: v for k, v in os.environ.items()
           if k not in ("WUSH_LIBRARY", "WUSH_CUDA_MODULE", "PYTHONPATH", "PYTHONHOME", "LD_PRELOAD")}
    env["LD_LIBRARY_PATH"] = ""
    hide = hidden_files()
    probe_file = os.path.join(tmp, "probe-file")
    open(probe_file, "w").close()
    unshare_ok = bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "-rm", "mount", "--bind", "/dev/null", probe_file], capture_output=True).returncode == 0
    if not hide:
        print("check_wheel: no system BLAS/LAPACK/libgomp file found to hide")
    elif not unshare_ok:
        print("check_wheel: `unshare -rm` does not work here (no user namespaces): the system's libraries are NOT "
              "hidden; the mapping checks below still apply")
    else:
        print(f"check_wheel: hiding {len(hide)} system files: " + " ".join(os.path.basename(h) for h in hide))
    inside = os.path.realpath(site) + os.sep
    numpy_inside = tuple(os.path.realpath(os.path.join(src, n)) + os.sep for n in ("numpy", "numpy.libs"))

    def foreign(paths):
        return sorted(p for p in paths if not os.path.realpath(p).startswith((inside,) + numpy_inside)
                      and not system_lib(os.path.basename(p)) and not p.startswith("["))

    # The console command (a Python script that execs the bundled program), then the program alone
    # under LD_DEBUG=libs (set by `env` right before it, so the namespace's tools are not traced).
    r = run_hidden([os.path.join(venv, "bin", "wush"), "version"], env, hide, unshare_ok, tmp)
    if r.returncode != 0 or not re.search(r"\d+\.\d+\.\d+", r.stdout):
        bad.append(f"`wush version` in the fresh venv: exit {r.returncode}, stdout {r.stdout.strip()!r}, "
                   f"stderr {r.stderr.strip()[-400:]!r}")
    prog = glob.glob(os.path.join(site, "wush", "_native", "bin", "wush"))
    r = run_hidden(["env", "LD_DEBUG=libs"] + prog[:1] + ["version"], env, hide, unshare_ok, tmp)
    inits = re.findall(r"calling init: (\S+)", r.stderr)
    if not prog or r.returncode != 0:
        bad.append(f"the bundled program {prog}: exit {r.returncode}, "
                   f"{[l for l in r.stderr.splitlines() if 'error' in l.lower()][-3:]}")
    elif foreign(inits):
        bad.append(f"the bundled program loaded libraries from outside the wheel: {foreign(inits)}")
    else:
        print(f"check_wheel: `wush version`: {r.stdout.strip()}; the program loaded " +
              " ".join(os.path.relpath(p, site) if p.startswith(site) else p for p in inits))

    r = run_hidden([py, "-c", PROBE], env, hide, unshare_ok, tmp)
    if r.returncode != 0:
        bad.append(f"quantize + forward in the fresh venv: exit {r.returncode}: {r.stderr.strip()[-600:]}")
    else:
        got = json.loads(r.stdout.strip().splitlines()[-1])
        if not all(os.path.realpath(got[k] or "/").startswith(inside) for k in ("module", "library")):
            bad.append(f"the fresh venv ran {got['module']} with {got['library']}, not the installed wheel's")
        if foreign(got["new"]):
            bad.append(f"`import wush` and its calls mapped libraries from outside the wheel: {foreign(got['new'])}")
        print(f"check_wheel: Python in the fresh venv: libwush {got['version']}, layer error {got['err']:.3f}, "
              f"mapped " + " ".join(os.path.relpath(p, site) if p.startswith(site) else p for p in got["new"]))
    return bad


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    whl = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="wush-checkwheel-") as tmp:
        bad = check_files(whl, os.path.join(tmp, "unpacked"))
        bad += check_run(whl, tmp)
    if bad:
        sys.exit("FAIL: " + os.path.basename(whl) + ":\n  " + "\n  ".join(bad))
    print(f"check_wheel: OK ({os.path.basename(whl)}, {os.path.getsize(whl) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
