#!/bin/sh
# doc/reference/cmake-options.md against the build: every cache entry named AMPACTOR_* (option(),
# set(... CACHE ...), find_path/find_library/find_program) of any CMakeLists.txt or cmake/*.cmake
# is named on the page, and every AMPACTOR_* name in the first cell of one of the page's table
# rows is such an entry; every program that bench/, tools/, demo/ and fuzz/ add (add_executable)
# is named on the page, and every ampactor-* name in the first cell of a table row is a program
# some CMakeLists.txt adds. Exit 1 naming each difference.
#   scripts/check-options.sh [SOURCE_DIR]
src=${1:-.}
cd "$src" || exit 2
page=doc/reference/cmake-options.md
[ -f "$page" ] || { echo "$page: missing"; exit 1; }
tmp=${TMPDIR:-/tmp}/ampactor-check-options.$$
mkdir -p "$tmp" || exit 2
trap 'rm -rf "$tmp"' EXIT

lists=$(find . -path ./.git -prune -o -path './build*' -prune -o \
          \( -name CMakeLists.txt -o -path './cmake/*.cmake' \) -type f -print | LC_ALL=C sort)
# The cache entries (a set(... CACHE ...) may span lines: each file is read as one line).
for f in $lists; do tr '\n' ' ' <"$f"; echo; done |
  grep -oE '(option|find_path|find_library|find_program|find_file)\( *AMPACTOR_[A-Z0-9_]+|set\( *AMPACTOR_[A-Z0-9_]+[^()]* CACHE ' |
  grep -oE 'AMPACTOR_[A-Z0-9_]+' | LC_ALL=C sort -u >"$tmp/built"
# The programs.
for d in bench tools demo fuzz; do
  [ -f "$d/CMakeLists.txt" ] && grep -oE 'add_executable\( *[A-Za-z0-9_.-]+' "$d/CMakeLists.txt"
done | sed 's/add_executable( *//' | LC_ALL=C sort -u >"$tmp/programs"
for f in $lists; do grep -oE 'add_executable\( *[A-Za-z0-9_.-]+' "$f"; done |
  sed 's/add_executable( *//' | LC_ALL=C sort -u >"$tmp/all-programs"

# What the page's tables name in their first cell (not the header's separator row).
grep -E '^\|' "$page" | grep -vE '^\|[ :-]*\|' | cut -d'|' -f2 >"$tmp/cells"
grep -oE 'AMPACTOR_[A-Z0-9_]+' "$tmp/cells" | LC_ALL=C sort -u >"$tmp/rows"
grep -oE 'ampactor-[a-z0-9-]+' "$tmp/cells" | LC_ALL=C sort -u >"$tmp/program-rows"

status=0
for o in $(cat "$tmp/built"); do
  grep -q "\`$o\`" "$page" || { echo "$page: the cache entry $o is not documented"; status=1; }
done
for o in $(cat "$tmp/rows"); do
  grep -qx "$o" "$tmp/built" || { echo "$page: $o is in a table but is no cache entry of the build"; status=1; }
done
for p in $(cat "$tmp/programs"); do
  grep -q "\`$p\`" "$page" || { echo "$page: the program $p is not listed"; status=1; }
done
for p in $(cat "$tmp/program-rows"); do
  grep -qx "$p" "$tmp/all-programs" || { echo "$page: $p is in a table but no CMakeLists.txt adds it"; status=1; }
done
[ $status -eq 0 ] && echo "$page: $(wc -l <"$tmp/built") cache entries and $(wc -l <"$tmp/programs") programs, all documented"
exit $status
