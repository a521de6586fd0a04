#!/bin/sh
# Rewrites README.md's DeepSpeed key table (between its markers) from `zerort config keys`.
# deepspeed_config_test fails until the two agree.
set -e
zerort=${1:-build/tools/zerort}
table=$("$zerort" --log-level off config keys)
python3 - "$table" <<'PY'
import sys
table = sys.argv[1] + "\n"
text = open("README.md").read()
begin, end = "<!-- deepspeed-keys:begin -->\n", "<!-- deepspeed-keys:end -->"
i, j = text.index(begin) + len(begin), text.index(end)
open("README.md", "w").write(text[:i] + table + text[j:])
PY
