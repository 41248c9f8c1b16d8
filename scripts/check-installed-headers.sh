#!/bin/sh
# The installed headers are the public surface and nothing else: installs BUILD_DIR into a fresh
# prefix, then fails if a header lies under an internal/ folder, if an installed header includes
# an ampactor header (<ampactor/...> or "...") that was not installed, or if one pulls in what
# belongs in a source file (<fstream>, <mutex>, <thread>, <condition_variable>).
# Usage: check-installed-headers.sh BUILD_DIR WORK_DIR
set -eu
build=$1 work=$2
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
inc=$work/prefix/include
status=0
[ -f "$inc/ampactor/ampactor.h" ] || { echo "no umbrella header <ampactor/ampactor.h>" >&2; status=1; }
headers=$(cd "$inc" && find ampactor -name '*.h' | sort)
for h in $headers; do
  case "/$h" in
    */internal/*) echo "installed internal header: $h" >&2; status=1 ;;
  esac
  dir=$(dirname "$h")
  # Angle includes of ampactor's own headers resolve under the prefix; quoted ones beside h.
  for dep in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\(ampactor\/[^>]*\)>.*/\1/p' "$inc/$h"); do
    [ -f "$inc/$dep" ] || { echo "$h includes <$dep>, which is not installed" >&2; status=1; }
  done
  for dep in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$inc/$h"); do
    [ -f "$inc/$dir/$dep" ] || { echo "$h includes \"$dep\", which is not installed" >&2; status=1; }
  done
  if grep -Eq '^[[:space:]]*#[[:space:]]*include[[:space:]]*<(fstream|mutex|thread|condition_variable)>' "$inc/$h"; then
    echo "$h includes a header its users need not pay for (keep it in the source file)" >&2
    status=1
  fi
done
echo "$(echo "$headers" | wc -l) installed headers checked"
exit $status
