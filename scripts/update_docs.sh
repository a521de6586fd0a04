#!/bin/sh
# Rewrites the generated tables of the docs from the binary that owns them: docs/deepspeed.md's
# DeepSpeed key table (`zerort config keys`) and docs/config.md's reference (`zerort config reference`),
# each between its markers. deepspeed_config_test and config_schema_test fail until they agree.
set -e
zerort=${1:-build/tools/zerort}
update() {  # FILE MARKER COMMAND...
  file=$1 marker=$2
  shift 2
  table=$("$zerort" --log-level off "$@")
  python3 - "$file" "$marker" "$table" <<'PY'
import sys
path, marker, table = sys.argv[1], sys.argv[2], sys.argv[3] + "\n"
text = open(path).read()
begin, end = f"<!-- {marker}:begin -->\n", f"<!-- {marker}:end -->"
i, j = text.index(begin) + len(begin), text.index(end)
open(path, "w").write(text[:i] + table + text[j:])
PY
}
update docs/deepspeed.md deepspeed-keys config keys
update docs/config.md config-reference config reference
