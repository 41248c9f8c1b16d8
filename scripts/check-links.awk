# The relative links of markdown files: each target exists in the repository and, where it names a
# heading of a markdown file (file.md#anchor, or #anchor alone), that heading exists (GitHub's
# anchors: lower case, punctuation dropped, spaces as '-', '-1', '-2'... for repeats). Links in
# code blocks and code spans are not links. Run from the repository root by scripts/check-links.sh.
#   awk -f scripts/check-links.awk FILE.md...
function dir_of(p) { if (p !~ /\//) return ""; sub(/\/[^\/]*$/, "", p); return p "/" }
function norm(p,   n, i, parts, out, k) {
  n = split(p, parts, "/"); k = 0
  for (i = 1; i <= n; ++i) {
    if (parts[i] == "" || parts[i] == ".") continue
    if (parts[i] == "..") { if (k > 0) --k; else return "../" ; continue }
    out[++k] = parts[i]
  }
  p = ""
  for (i = 1; i <= k; ++i) p = p (i > 1 ? "/" : "") out[i]
  return p
}
function slug(h,   s) {
  s = tolower(h)
  gsub(/[^a-z0-9 _-]/, "", s)
  gsub(/ /, "-", s)
  return s
}
function anchors(file,   line, fence, h, s, n) {
  if (file in scanned) return
  scanned[file] = 1
  fence = 0
  while ((getline line < file) > 0) {
    if (line ~ /^[ \t]*```/) { fence = !fence; continue }
    if (fence || line !~ /^#+ /) continue
    h = line; sub(/^#+ +/, "", h); sub(/ +#*$/, "", h)
    s = slug(h)
    n = seen[file, s]++
    has[file, (n ? s "-" n : s)] = 1
  }
  close(file)
}
function exists(p) { return system("test -e '" p "'") == 0 }
function check(target,   path, frag, resolved) {
  if (target ~ /^[a-z]+:/) return  # http:, https:, mailto:
  frag = ""
  if (index(target, "#")) { frag = substr(target, index(target, "#") + 1); target = substr(target, 1, index(target, "#") - 1) }
  resolved = target == "" ? FILENAME : norm(dir_of(FILENAME) target)
  ++links
  if (target ~ /^\// || resolved ~ /^\.\.\//) { printf("%s:%d: %s leaves the repository\n", FILENAME, FNR, target); ++bad; return }
  if (!exists(resolved)) { printf("%s:%d: %s: no such file (%s)\n", FILENAME, FNR, target, resolved); ++bad; return }
  if (frag != "" && resolved ~ /\.md$/) {
    anchors(resolved)
    if (!((resolved, frag) in has)) { printf("%s:%d: %s#%s: no such heading in %s\n", FILENAME, FNR, target, frag, resolved); ++bad }
  }
}
FNR == 1 { fence = 0 }
/^[ \t]*```/ { fence = !fence; next }
fence { next }
{
  line = $0
  gsub(/`[^`]*`/, "", line)  # code spans
  while (match(line, /\]\([^)]+\)/)) {
    t = substr(line, RSTART + 2, RLENGTH - 3)
    sub(/ +"[^"]*"$/, "", t)  # a title
    check(t)
    line = substr(line, RSTART + RLENGTH)
  }
}
END {
  printf("%d relative links checked, %d broken\n", links, bad)
  exit bad > 0
}
