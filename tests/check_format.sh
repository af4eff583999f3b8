#!/usr/bin/env bash
# The formatting check of the test command: `clang-format --dry-run --Werror` (the repository's
# .clang-format: Google style, 100 columns) over every C++ source under src/, include/, kernels/,
# tests/ and bench/, so each change arrives formatted. Only clang-format 14 (Debian 12's, which
# tests/run.sh installs) is trusted: other versions format some constructs differently, so with
# another one, or none, the check skips (exit 77) and says why.
# Usage: tests/check_format.sh [--fix]   (--fix: rewrite the files in place instead)
set -uo pipefail
cd "$(dirname "$0")/.."
cf=${CLANG_FORMAT:-clang-format}
if ! command -v "$cf" >/dev/null; then
  echo "SKIP: $cf is not installed (tests/run.sh installs Debian's clang-format)"; exit 77
fi
version=$("$cf" --version | sed -n 's/.*clang-format version \([0-9]*\)\..*/\1/p')
if [[ $version != 14 ]]; then
  echo "SKIP: $cf is version '${version:-unknown}', the check is pinned to 14 (Debian 12's)"; exit 77
fi
# The tracked files in a checkout; every file under the folders in an unpacked tarball. The
# generated Winograd tables keep their generator's layout (src/cpu/gen_winograd_tables.py).
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files -- src include kernels tests bench)
else
  mapfile -t files < <(find src include kernels tests bench -type f | sort)
fi
mapfile -t files < <(printf '%s\n' "${files[@]}" | grep -E '\.(cc|h|cu|cuh|inc)$' \
                     | grep -v '^src/cpu/winograd_tables\.h$')
(( ${#files[@]} > 0 )) || { echo "FAIL: no C++ source found under $(pwd)"; exit 1; }
if [[ ${1:-} == --fix ]]; then
  "$cf" -i "${files[@]}"; exit
fi
# One line per file that differs, then clang-format's own report of where.
bad=()
for f in "${files[@]}"; do
  "$cf" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if (( ${#bad[@]} > 0 )); then
  echo "FAIL: ${#bad[@]} of ${#files[@]} files are not formatted (fix: bash tests/check_format.sh --fix):"
  printf '  %s\n' "${bad[@]}"
  "$cf" --dry-run "${bad[@]}" 2>&1 | head -40
  exit 1
fi
echo "PASS: ${#files[@]} files formatted (clang-format $version, .clang-format)"
