#!/usr/bin/env python3
"""zerort's headers are included as "zerort/<room>/<file>.h" everywhere ([Note: include paths] in
the top CMakeLists.txt): a quoted include that names a room without the prefix, or a zerort/ path
that names no file, fails here with its file and line; so does an include of a header that says
it is "internal to <room>/" in its first lines from outside that room (the tests excepted). (The libraries' own include path holds
only the build tree's include/, so there they would not compile; the tests also have the
repository's root on theirs, for tests/ helpers, and rely on this check.)"""
import pathlib
import re
import subprocess
import sys

ROOMS = ("runtime", "kernels", "offload", "sharding", "layers", "data", "config", "checkpoint",
         "estimate", "engine")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
INTERNAL = re.compile(r"internal to ([a-z]+(?:/[a-z]+)?)/?")


def internal_room(root, header):
    """The room a header keeps itself to ("internal to layers/" in its first lines), or None."""
    head = "".join((root / header).read_text(encoding="utf-8").splitlines(keepends=True)[:3])
    m = INTERNAL.search(head.replace("\n//", ""))
    return m.group(1) if m else None


def main(root):
    root = pathlib.Path(root)
    files = subprocess.run(["git", "ls-files", "*.h", "*.cc", "*.cu", "*.in"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    bad = []
    checked = 0
    for name in files:
        text = (root / name).read_text(encoding="utf-8", errors="replace")
        for m in INCLUDE.finditer(text):
            path = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            first = path.split("/", 1)[0]
            if (root / name).parent.joinpath(path).is_file():
                continue  # next to its includer: the includer's own (examples/own_folders)
            if first in ROOMS:
                bad.append(f"{name}:{line}: \"{path}\" is spelled \"zerort/{path}\"")
            elif first == "zerort" and not name.startswith("examples/"):
                checked += 1
                rest = path.split("/", 1)[1] if "/" in path else ""
                if rest.split("/", 1)[0] not in ROOMS or not (root / rest).is_file():
                    bad.append(f"{name}:{line}: \"{path}\" names no file of zerort's rooms")
                    continue
                room = internal_room(root, rest)
                if room and not name.startswith(room + "/") and not name.startswith("tests/"):
                    bad.append(f"{name}:{line}: \"{path}\" is internal to {room}/")
    for b in bad:
        print(b)
    print(f"include_spelling: {checked} zerort/ includes in {len(files)} files, {len(bad)} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
