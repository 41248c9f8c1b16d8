#!/bin/sh
# Every ```cpp block of every doc/**/*.md is an excerpt of a program in examples/, and every one of
# README.md a whole program there (scripts/readme-blocks.awk, once per markdown file). README.md
# must have at least one block; a page of doc/ with none is fine. Exit 1 if any file fails, naming each failing block.
#   scripts/check-doc-blocks.sh [SOURCE_DIR]
src=${1:-.}
cd "$src" || exit 2
status=0
for md in README.md $(find doc -name '*.md' -type f | LC_ALL=C sort); do
  need=0 whole=0
  [ "$md" = README.md ] && need=1 whole=1
  awk -v readme="$md" -v need="$need" -v whole="$whole" -f scripts/readme-blocks.awk examples/*.cpp "$md" || status=1
done
exit $status
