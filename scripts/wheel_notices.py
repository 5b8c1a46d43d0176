#!/usr/bin/env python3
"""Adds the licence texts of the libraries auditwheel bundled into a repaired wheel.

    wheel_notices.py WHEEL [DOC_ROOT]

auditwheel copies OpenBLAS, LAPACK(E), libgomp, libgfortran and libquadmath into wush.libs/ and
records in <dist-info>/sboms/auditwheel.cdx.json which Debian package each file came from, but it
copies none of their licence texts, which their licences require to travel with the binaries.
This script reads that record and, for every Debian package in it, stores the package's
copyright file (DOC_ROOT/<package>/copyright, DOC_ROOT defaulting to /usr/share/doc) as
<dist-info>/licenses/third_party/<package>.copyright, plus a THIRD_PARTY_NOTICES.txt listing the
bundled files and the packages with their versions. RECORD gets a line for each new file. The wheel is
rewritten in place. Exits 1, naming the package, when a copyright file is missing: a wheel
without its notices is not written.
"""
import base64
import hashlib
import json
import os
import re
import sys
import tempfile
import zipfile

PURL_RE = re.compile(r"^pkg:deb/[^/]+/([^@?]+)@([^?]+)")


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def bundled_packages(sbom):
    """{Debian package: version} of the files auditwheel bundled (its record names the package of
    each file, not the file)."""
    out = {}
    for comp in sbom.get("components", []):
        m = PURL_RE.match(comp.get("purl", ""))
        if m:
            out[comp.get("name") or m.group(1)] = comp.get("version") or m.group(2)
    return out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    whl = sys.argv[1]
    doc_root = sys.argv[2] if len(sys.argv) == 3 else "/usr/share/doc"
    with zipfile.ZipFile(whl) as z:
        infos = z.infolist()
        names = [i.filename for i in infos]
        dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
        sbom_name = f"{dist_info}/sboms/auditwheel.cdx.json"
        if sbom_name not in names:
            sys.exit(f"wheel_notices: {whl} has no {sbom_name} (not repaired by auditwheel >= 6.2?)")
        packages = bundled_packages(json.loads(z.read(sbom_name)))
        contents = {i.filename: z.read(i.filename) for i in infos}
    if not packages:
        sys.exit(f"wheel_notices: {sbom_name} names no Debian package")
    new = {}
    libs = sorted(os.path.basename(n) for n in names if n.startswith("wush.libs/") and not n.endswith("/"))
    lines = ["wush itself is licensed under the Apache License 2.0 (SPDX: Apache-2.0): LICENSE, next to this file.",
             "",
             "Libraries bundled in wush.libs/ by auditwheel: " + ", ".join(libs) + ".",
             "They come from these Debian packages; each package's copyright file, with its licence",
             "texts, is in third_party/<package>.copyright:", ""]
    for pkg in sorted(packages):
        path = os.path.join(doc_root, pkg, "copyright")
        if not os.path.isfile(path):
            sys.exit(f"wheel_notices: no copyright file for the bundled package {pkg} at {path}")
        with open(path, "rb") as f:
            new[f"{dist_info}/licenses/third_party/{pkg}.copyright"] = f.read()
        lines.append(f"  {pkg} {packages[pkg]}")
    new[f"{dist_info}/licenses/THIRD_PARTY_NOTICES.txt"] = ("\n".join(lines) + "\n").encode()

    record = f"{dist_info}/RECORD"
    kept = [l for l in contents[record].decode().splitlines() if l and l.split(",")[0] not in new]
    rows = [l for l in kept if not l.startswith(record + ",")]
    rows += [record_line(n, d) for n, d in sorted(new.items())] + [f"{record},,"]
    contents.update(new)
    contents[record] = ("\n".join(rows) + "\n").encode()
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(whl)), suffix=".whl")
    os.close(fd)
    by_name = {i.filename: i for i in infos}
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        order = [n for n in names if n != record] + sorted(n for n in new if n not in by_name) + [record]
        for n in order:
            info = by_name.get(n)  # the original entry keeps its mode bits (the `wush` program's x bit)
            if info is None:
                info = zipfile.ZipInfo(n, date_time=by_name[record].date_time)
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, contents[n])
    os.replace(tmp, whl)
    print(f"wheel_notices: {len(packages)} packages' copyright files added to {os.path.basename(whl)}", file=sys.stderr)


if __name__ == "__main__":
    main()
