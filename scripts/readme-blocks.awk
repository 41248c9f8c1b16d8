# Every ```cpp block of a markdown file is an excerpt of a program in examples/, which
# package.examples builds and runs: the block's lines appear in one example file, in the same order
# (indentation aside). A line "// ..." stands for lines left out. Exit 1, naming the block's first
# line that no example has at that point, otherwise. A file with no cpp block fails unless
# -v need=0 is given (README.md must show at least one; a page of doc/ need not).
#   awk -v readme=README.md -v whole=1 -f scripts/readme-blocks.awk examples/*.cpp README.md
#   awk -v readme=doc/guide/traces.md -v need=0 -f scripts/readme-blocks.awk examples/*.cpp doc/guide/traces.md
# scripts/check-doc-blocks.sh runs it over README.md and every doc/**/*.md.
function trim(s) {
  sub(/^[ \t]+/, "", s)
  sub(/[ \t\r]+$/, "", s)
  return s
}
# -v whole=1 (README.md): each block is a whole example, every line of one file in order
# (blank lines aside) and no "// ...", so that it compiles as a program on its own.
function check_whole(   f, i, j, k) {
  for (f = 1; f <= nfiles; ++f) {
    j = 1
    for (i = 1; i <= nblock; ++i) {
      if (block[i] == "") continue
      while (j <= nlines[f] && lines[f, j] == "") ++j
      if (j > nlines[f] || lines[f, j] != block[i]) break
      ++j
    }
    while (j <= nlines[f] && lines[f, j] == "") ++j
    if (i > nblock && j > nlines[f]) { ++matched; return }
  }
  printf("%s:%d: this cpp block is no whole program of examples/ (a README block must be one)\n",
         readme, start)
  ++failed
}
function check(   f, i, j, ok, worst, worst_line) {
  if (whole == "1") { check_whole(); return }
  worst = 0
  for (f = 1; f <= nfiles; ++f) {
    j = 1
    ok = 1
    for (i = 1; i <= nblock; ++i) {
      if (block[i] == "" || block[i] == "// ...") continue
      while (j <= nlines[f] && lines[f, j] != block[i]) ++j
      if (j > nlines[f]) { ok = 0; break }
      ++j
    }
    if (ok) { ++matched; return }
    if (i > worst) { worst = i; worst_line = block[i] " (closest: " names[f] ")" }
  }
  printf("%s:%d: this cpp block is no excerpt of examples/: no example has, at that point, the line\n    %s\n",
         readme, start, worst_line)
  ++failed
}
FILENAME != readme {
  if (FNR == 1) names[++nfiles] = FILENAME
  lines[nfiles, ++nlines[nfiles]] = trim($0)
  next
}
inblock && trim($0) == "```" { inblock = 0; ++blocks; check(); next }
inblock { block[++nblock] = trim($0); next }
trim($0) == "```cpp" { inblock = 1; nblock = 0; start = FNR; next }
END {
  printf("%s: %d cpp blocks, %d %s of examples/\n", readme, blocks, matched,
         whole == "1" ? "whole programs" : "excerpts")
  if (blocks == 0 && need != "0") printf("%s: no cpp block at all (it must show at least one)\n", readme)
  exit failed > 0 || (blocks == 0 && need != "0")
}
