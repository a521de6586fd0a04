#!/usr/bin/env python3
"""Every program and library built searches for its shared libraries only where it means to.

[Note: run paths] in CMakeLists.txt: CMake's default build tree links programs with absolute run
paths padded by a trailing ':', an empty entry the dynamic loader takes as the working directory,
so a program run in a folder holding a library of the right name loads it. This test reads the
dynamic section of every ELF file under the build tree (its install-test too, where present; not
the consumers' own build trees there) and
fails on an empty entry, a relative one other than $ORIGIN's, or an absolute one into the build or
source tree (an installed copy must not depend on either); then runs the zerort program from an
empty folder with the loader's trace on and fails if any library was looked for by a relative
name.

    run_paths_test.py BUILD_DIR SOURCE_DIR ZERORT
"""
import os
import re
import subprocess
import sys
import tempfile

RUN_PATH = re.compile(r"\((RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]")


def elf_files(root):
    for folder, dirs, files in os.walk(root):
        # Not CMake's scratch, nor the build trees of the installed package's consumers
        # (`make test-install` builds them inside this one, linked against its install-test/).
        dirs[:] = [d for d in dirs if d not in ("CMakeFiles", "Testing") and
                   not os.path.exists(os.path.join(folder, d, "CMakeCache.txt"))]
        for name in files:
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield path


def run_path_problems(path, trees):
    out = subprocess.run(["readelf", "-d", "--wide", path], capture_output=True, text=True,
                         check=True).stdout
    problems, entries = [], []
    for kind, value in RUN_PATH.findall(out):
        if "" in value.split(":"):
            problems.append(f"{kind} {value!r} has an empty entry (the working directory)")
        for entry in value.split(":"):
            entries.append(entry)
            if entry == "":
                continue
            elif entry.startswith(("$ORIGIN", "${ORIGIN}")):
                continue
            elif not entry.startswith("/"):
                problems.append(f"{kind} entry {entry!r} is relative to the working directory")
            elif any(entry == t or entry.startswith(t + "/") for t in trees):
                problems.append(f"{kind} entry {entry!r} is inside the build or source tree")
    return problems, entries


def main():
    build, source, zerort = (os.path.realpath(a) for a in sys.argv[1:4])
    failures, checked, with_origin = [], 0, 0
    for path in elf_files(build):
        problems, entries = run_path_problems(path, (build, source))
        checked += 1
        with_origin += any(e.startswith("$ORIGIN") for e in entries)
        if problems:
            failures.append(f"{os.path.relpath(path, build)}: {'; '.join(problems)}")
    # The walk must have seen the programs and libraries, or it proves nothing.
    if checked < 10 or with_origin < 10:
        failures.append(f"only {checked} ELF files ({with_origin} with $ORIGIN) under {build}")

    with tempfile.TemporaryDirectory() as empty:
        trace = subprocess.run([zerort, "--version"], cwd=empty, capture_output=True, text=True,
                               env=dict(os.environ, LD_DEBUG="libs"))
        tried = re.findall(r"trying file=(\S+)", trace.stderr)
        relative = sorted({t for t in tried if not t.startswith("/")})
        if trace.returncode != 0 or not tried:
            failures.append(f"zerort --version: exit {trace.returncode}, {len(tried)} files tried")
        if relative:
            failures.append(f"zerort looked in the working directory for: {relative[:5]}")

    for f in failures:
        print("FAIL", f)
    print(f"run_paths: {checked} ELF files, {with_origin} with $ORIGIN; "
          f"{len(tried)} library files tried by zerort, {len(relative)} relative")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
