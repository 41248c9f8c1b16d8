#!/bin/sh
# ampactor-ckpt is an offline file tool: it links ampactor::checkpoint and the layers below it,
# never the actors or CAF. Fails if its link line names the actor, message or keeper library or
# CAF, or if the tool defines a caf:: symbol.
# Usage: ckpt_link_line.sh TOOL LINK_TXT
set -eu
tool=$1 link=$2
[ -x "$tool" ] || { echo "no tool at $tool" >&2; exit 1; }
[ -f "$link" ] || { echo "no link line at $link" >&2; exit 1; }
status=0
for lib in ampactor_actors ampactor_messages ampactor_keeper libcaf_; do
  if grep -q "$lib" "$link"; then
    echo "ampactor-ckpt's link line names $lib:" >&2
    tr ' ' '\n' <"$link" | grep "$lib" >&2
    status=1
  fi
done
n=$(nm -C "$tool" | grep -c ' caf::' || true)
[ "$n" = 0 ] || { echo "ampactor-ckpt defines $n caf:: symbols" >&2; status=1; }
[ $status = 0 ] && echo "ampactor-ckpt links no actors and no CAF ($(tr ' ' '\n' <"$link" | grep -c 'libampactor_') ampactor libraries)"
exit $status
