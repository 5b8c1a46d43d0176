#!/usr/bin/env python3
"""CHANGELOG.md, the ABI baseline and the project version name the same release.

Three places say which release the repository is at:
  - CHANGELOG.md: its latest version heading, `## X.Y.Z (YYYY-MM-DD)`;
  - the ABI baseline: abi/previous/wush.h is the latest release's header (abi/README.md), whose
    WUSH_VERSION_* macros name it, and abi/libwush.abi records the SONAME libwush.so.<major>;
  - the project version: the WUSH_VERSION_* macros of include/wush/wush.h, which CMakeLists.txt
    reads for project(VERSION) (a literal VERSION there is read instead).

Rules:
  1. Headings are `## Unreleased` (at most one, and only first) and `## X.Y.Z (YYYY-MM-DD)`,
     versions strictly decreasing from the top.
  2. The latest version heading is the version of abi/previous/wush.h.
  3. The project version is that version (work since the release goes under "Unreleased"), or a
     later one named by the Unreleased heading, `## Unreleased (X.Y.Z)`, when the header was
     bumped before the release.
  4. The SONAME in abi/libwush.abi carries the project's major version.

Usage:
  check_changelog.py [REPO_ROOT]   prints each disagreement; exits 1 if there is one
  check_changelog.py --self-test   shows the check can fail: copies of the three files that
                                   disagree in each way must fail, agreeing ones pass
"""
import os
import re
import sys
import tempfile

HEADING = re.compile(r"^## (.*)$")
RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+) \(\d{4}-\d{2}-\d{2}\)$")
UNRELEASED = re.compile(r"^Unreleased(?: \((\d+)\.(\d+)\.(\d+)\))?$")
MACRO = re.compile(r"^#define WUSH_VERSION_(MAJOR|MINOR|PATCH) (\d+)", re.M)
SONAME = re.compile(r"soname='libwush\.so\.(\d+)'")
PROJECT = re.compile(r"project\(\s*wush\s+VERSION\s+(\d+)\.(\d+)\.(\d+)\b")


def show(v):
    return ".".join(map(str, v))


def header_version(path):
    with open(path, encoding="utf-8") as f:
        found = dict(MACRO.findall(f.read()))
    if set(found) != {"MAJOR", "MINOR", "PATCH"}:
        return None
    return tuple(int(found[k]) for k in ("MAJOR", "MINOR", "PATCH"))


def problems(root):
    out = []
    p = lambda *parts: os.path.join(root, *parts)

    # The changelog's headings.
    unreleased, releases = None, []
    with open(p("CHANGELOG.md"), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            m = HEADING.match(line.rstrip("\n"))
            if not m:
                continue
            text = m.group(1).strip()
            u, r = UNRELEASED.match(text), RELEASE.match(text)
            if u:
                if unreleased is not None or releases:
                    out.append(f"CHANGELOG.md:{n}: 'Unreleased' must be the first heading, once")
                unreleased = tuple(map(int, u.groups())) if u.group(1) else ()
            elif r:
                v = tuple(map(int, r.groups()))
                if releases and v >= releases[-1]:
                    out.append(f"CHANGELOG.md:{n}: {show(v)} is not older than {show(releases[-1])} above it")
                releases.append(v)
            else:
                out.append(f"CHANGELOG.md:{n}: heading '{text}' is neither 'Unreleased [(X.Y.Z)]' "
                           "nor 'X.Y.Z (YYYY-MM-DD)'")
    if not releases:
        out.append("CHANGELOG.md: no version heading 'X.Y.Z (YYYY-MM-DD)'")
        return out
    latest = releases[0]

    # The ABI baseline.
    baseline = header_version(p("abi", "previous", "wush.h"))
    if baseline is None:
        out.append("abi/previous/wush.h: no WUSH_VERSION_MAJOR/MINOR/PATCH")
    elif baseline != latest:
        out.append(f"CHANGELOG.md's latest version {show(latest)} is not the ABI baseline's release "
                   f"{show(baseline)} (abi/previous/wush.h; abi/README.md says how to record a release)")

    # The project version.
    project = header_version(p("include", "wush", "wush.h"))
    if project is None:
        out.append("include/wush/wush.h: no WUSH_VERSION_MAJOR/MINOR/PATCH")
        return out
    with open(p("CMakeLists.txt"), encoding="utf-8") as f:
        m = PROJECT.search(f.read())
    if m and tuple(map(int, m.groups())) != project:
        out.append(f"CMakeLists.txt's project VERSION {show(tuple(map(int, m.groups())))} is not "
                   f"include/wush/wush.h's {show(project)}")
    if project < latest:
        out.append(f"the project version {show(project)} is older than CHANGELOG.md's latest {show(latest)}")
    elif project > latest and unreleased != project:
        out.append(f"the project version {show(project)} is not released in CHANGELOG.md (latest "
                   f"{show(latest)}): release it there, or head the Unreleased section "
                   f"'## Unreleased ({show(project)})'")

    with open(p("abi", "libwush.abi"), encoding="utf-8") as f:
        s = SONAME.search(f.read())
    if not s:
        out.append("abi/libwush.abi: no soname='libwush.so.<major>'")
    elif int(s.group(1)) != project[0]:
        out.append(f"abi/libwush.abi's SONAME libwush.so.{s.group(1)} is not the project's major {project[0]}")
    return out


def check(root):
    found = problems(root)
    for line in found:
        print("check_changelog: FAIL:", line)
    if not found:
        print("check_changelog: PASS: CHANGELOG.md, the ABI baseline and the project version agree")
    return not found


def self_test():
    def header(v):
        return "".join(f"#define WUSH_VERSION_{k} {x}\n" for k, x in zip(("MAJOR", "MINOR", "PATCH"), v))

    def tree(tmp, log, project=(0, 3, 0), baseline=(0, 3, 0), soname=0, cmake="project(wush VERSION ${X})\n"):
        files = {
            "CHANGELOG.md": log,
            "include/wush/wush.h": header(project),
            "abi/previous/wush.h": header(baseline),
            "abi/libwush.abi": f"<abi-corpus soname='libwush.so.{soname}'>\n",
            "CMakeLists.txt": cmake,
        }
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(tmp, name)) or tmp, exist_ok=True)
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
        return problems(tmp)

    newer = "## 0.4.0 (2026-12-01)\n\n"
    good = "# Changelog\n\n## Unreleased\n\n- api: x\n\n## 0.3.0 (2026-11-23)\n\n## 0.2.0 (2026-11-23)\n"
    cases = {  # name: (expected to pass, tree arguments)
        "agreeing": (True, dict(log=good)),
        "no Unreleased section": (True, dict(log="## 0.3.0 (2026-11-23)\n")),
        "header bumped, Unreleased names it": (True, dict(log=good.replace("Unreleased", "Unreleased (0.4.0)"),
                                                          project=(0, 4, 0))),
        "changelog ahead of the baseline": (False, dict(log=good.replace("## 0.3.0", newer + "## 0.3.0"),
                                                        project=(0, 4, 0))),
        "baseline ahead of the changelog": (False, dict(log=good, baseline=(0, 4, 0))),
        "header bumped, not in the changelog": (False, dict(log=good, project=(0, 4, 0))),
        "header older than the changelog": (False, dict(log=good, project=(0, 2, 0))),
        "Unreleased names another version": (False, dict(log=good.replace("Unreleased", "Unreleased (0.5.0)"),
                                                         project=(0, 4, 0))),
        "Unreleased below a release": (False, dict(log="## 0.3.0 (2026-11-23)\n\n## Unreleased\n")),
        "versions out of order": (False, dict(log="## 0.3.0 (2026-11-23)\n## 0.3.0 (2026-11-22)\n")),
        "a heading without a date": (False, dict(log="## Unreleased\n## 0.3.0\n")),
        "no version at all": (False, dict(log="## Unreleased\n")),
        "SONAME of another major": (False, dict(log=good, soname=1)),
        "a literal CMake version that differs": (False, dict(log=good,
                                                             cmake="project(wush VERSION 0.2.0 LANGUAGES C)\n")),
    }
    ok = True
    for name, (passes, args) in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            found = tree(tmp, **args)
        if passes and found:
            print(f"check_changelog: self-test FAIL: '{name}' was refused: {found}")
            ok = False
        elif not passes and not found:
            print(f"check_changelog: self-test FAIL: '{name}' was not caught")
            ok = False
        elif not passes:
            print(f"check_changelog: self-test: '{name}' caught: {found[0]}")
    print("check_changelog: self-test", "passed" if ok else "FAILED")
    return ok


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(0 if self_test() else 1)
    if len(sys.argv) > 2:
        sys.exit(__doc__)
    root = sys.argv[1] if len(sys.argv) == 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    sys.exit(0 if check(root) else 1)
