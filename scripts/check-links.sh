#!/bin/sh
# The relative links of the project's markdown (README.md, CHANGELOG.md, demo/README.md, doc/**/*.md)
# resolve inside the repository, headings included (scripts/check-links.awk).
#   scripts/check-links.sh [SOURCE_DIR]
src=${1:-.}
cd "$src" || exit 2
files="README.md"
for f in CHANGELOG.md demo/README.md; do [ -f "$f" ] && files="$files $f"; done
files="$files $(find doc -name '*.md' -type f | LC_ALL=C sort)"
exec awk -f scripts/check-links.awk $files
