#!/usr/bin/env python3
"""Every shell script in the repository passes shellcheck (Debian's, installed by
scripts/install-deps.sh) at its default severity. tools/gpu-check.sh and tools/gpu-pack.sh run
only on a lent GPU machine, where a quoting slip costs minutes of a 15-minute loan; this is where
such a slip is caught. A line that means what shellcheck warns of says so with a
`# shellcheck disable=SCnnnn` and the reason.
Skipped (exit 77) where shellcheck is missing.

    shell_scripts_test.py SOURCE_DIR
"""
import os
import shutil
import subprocess
import sys

SHELLS = ("#!/bin/sh", "#!/bin/bash", "#!/usr/bin/env bash", "#!/usr/bin/env sh")


def scripts(root):
    listed = subprocess.run(["git", "-C", root, "ls-files"], capture_output=True, text=True)
    if listed.returncode == 0:
        names = listed.stdout.split()
    else:  # a copy without git
        names = [os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root)
                 if "/build" not in d and "/.git" not in d for f in files]
    for name in sorted(names):
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            first = f.readline().decode("utf-8", "replace").strip()
        if name.endswith(".sh") or first.startswith(SHELLS):
            yield name


def main():
    root = sys.argv[1]
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        print("shell_scripts: SKIPPED: no shellcheck (scripts/install-deps.sh installs it)")
        return 77
    names = list(scripts(root))
    r = subprocess.run([shellcheck, "-f", "gcc", *names], cwd=root, capture_output=True, text=True)
    print(r.stdout + r.stderr, end="")
    print(f"shell_scripts: {len(names)} scripts, shellcheck exit {r.returncode}")
    return 1 if r.returncode != 0 or len(names) < 5 else 0


if __name__ == "__main__":
    sys.exit(main())
