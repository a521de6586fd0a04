#!/usr/bin/env bash
# The installed headers are closed under their includes: one translation unit that includes every
# header under <prefix>/include/zerort compiles with only <prefix>/include (and the system's) on
# the path. A public header that includes an internal one (not installed) fails here, naming it.
# Usage: tests/install/public_headers.sh <install prefix>
set -euo pipefail
inc="$1/include"
cd "$inc"
mapfile -t headers < <(find zerort -name '*.h' | sort)
[ "${#headers[@]}" -gt 0 ] || { echo "public_headers: no header under $inc/zerort" >&2; exit 1; }
printf '#include "%s"\n' "${headers[@]}" |
  "${CXX:-c++}" -std=c++20 -fsyntax-only -I"$inc" -x c++ - ||
  { echo "public_headers: the installed headers do not compile from $inc alone" >&2; exit 1; }
echo "public_headers: ${#headers[@]} installed headers compile from $inc alone"
