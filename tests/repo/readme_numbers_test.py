#!/usr/bin/env python3
"""Every number a README quotes comes from a measurement or a test: in the prose of README.md and
of each folder's README.md (not code blocks, inline code or HTML comments), each number with a
unit (%, x, s, ms, KiB, MiB, GiB, MB, GB, MB/s, tokens/s, TFLOP/s) or a count "N of M" must
appear as written in docs/benchmarks.md (where measurements are recorded, with their commands) or
in a test's source (where a count is enforced). A README that drifted from what was measured
("17 MiB resident" against a measured 16364 KiB; "61 of 68" against a test that enforces 60)
fails here. Usage: readme_numbers_test.py REPOSITORY_ROOT"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
from harness import Checks, repo_files  # noqa: E402

root = os.path.abspath(sys.argv[1])
checks = Checks("readme_numbers_test")
files = repo_files(root)


def read(rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def flat(text):
    return re.sub(r"\s+", " ", text)


sources = flat(read("docs/benchmarks.md")) + " " + flat(" ".join(
    read(f) for f in files if f.startswith("tests/") and f.endswith((".py", ".cc", ".h", ".sh"))
    and f != "tests/repo/readme_numbers_test.py"))
readmes = [f for f in files if os.path.basename(f) == "README.md"
           and not f.startswith(("tests/configs/", "examples/"))]
unit = r"(?:%|x\b|\s?(?:ms|s|KiB|MiB|GiB|MB/s|MB|GB|tokens/s|TFLOP/s)\b)"
number = re.compile(r"(?<![\w.\-/+])(\d[\d,]*(?:\.\d+)?(?:" + unit + r"| of \d[\d,]*\b))")
quoted = 0
for rel in readmes:
    prose = read(rel)
    prose = re.sub(r"```.*?```", " ", prose, flags=re.S)  # code blocks
    prose = re.sub(r"<!--.*?-->", " ", prose, flags=re.S)
    prose = re.sub(r"`[^`\n]*`", " ", prose)  # inline code: commands, flags, keys
    for m in number.finditer(flat(prose)):
        token = m.group(1)
        quoted += 1
        checks.check(f"{rel}: '{token}' appears in docs/benchmarks.md or a test", token in sources,
                     "a README number must be one that was measured (benchmarks.md) or tested")
checks.check("README numbers were found and checked", quoted > 20, str(quoted))
print(f"{quoted} numbers quoted in {len(readmes)} READMEs")
checks.finish()
