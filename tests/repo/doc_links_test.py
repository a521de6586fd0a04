#!/usr/bin/env python3
"""The repository points only at itself: every relative link of a Markdown file names a file or
folder of the repository, no file cites a design note that lives outside it (DESIGN.md, the
session's shared/ folder), and every cited [Note: ...] is defined once in it: a comment line or
a Markdown heading that begins with the note's name and goes on to say it (text after the name
that starts with a capital letter, or on the comment lines that follow).
Usage: doc_links_test.py REPOSITORY_ROOT"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks, repo_files  # noqa: E402

root = os.path.abspath(sys.argv[1])
checks = Checks("doc_links_test")
files = repo_files(root)
text_ext = (".md", ".h", ".cc", ".cu", ".cuh", ".py", ".sh", ".txt", ".cmake", ".in", ".json")
outside = re.compile(r"\bDESIGN\.md\b|\.\./shared/")
link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
note = re.compile(r"\[Note: ([^\]]+)\]")
# A definition: the note first on a comment line or heading, then its text on the same line
# (capitalised) or on the next comment line.
opening = re.compile(r"^\s*(?://|#+|\*\*)\s*\[Note: ([^\]]+)\](?:\*\*)?(\s*$|\s+[A-Z])")
cited, defined = {}, {}
links = 0
for rel in files:
    if not rel.endswith(text_ext) and os.path.basename(rel) not in ("Makefile", "CMakeLists.txt"):
        continue
    if rel.startswith("tests/configs/deepspeed/") and rel.endswith(".json"):
        continue  # third-party configs, unchanged
    path = os.path.join(root, rel)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            content = f.read()
    except OSError:
        continue
    lines = content.splitlines()
    for n, line in enumerate(lines, 1):
        if rel != "tests/repo/doc_links_test.py":
            for name in note.findall(line):
                cited.setdefault(name, f"{rel}:{n}")
            m = opening.match(line)
            follows = n < len(lines) and re.match(r"^\s*(//|#)\s*\S", lines[n])
            if m and (m.group(2).strip() or follows or rel.endswith(".md")):
                defined.setdefault(m.group(1), []).append(f"{rel}:{n}")
        if outside.search(line) and rel != "tests/repo/doc_links_test.py":
            checks.check(f"{rel}:{n} points outside the repository", False, line.strip()[:120])
    if not rel.endswith(".md"):
        continue
    for m in link.finditer(content):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        links += 1
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), target))
        checks.check(f"{rel}: link to {target} exists inside the repository",
                     resolved.startswith(root + os.sep) and os.path.exists(resolved), resolved)
checks.check("some Markdown links were checked", links > 5, str(links))
for name, where in sorted(cited.items()):
    places = defined.get(name, [])
    checks.check(f"[Note: {name}] (cited at {where}) is defined once", len(places) == 1,
                 ", ".join(places) or "defined nowhere")
checks.check("some notes were checked", len(cited) > 20, str(len(cited)))
checks.finish()
