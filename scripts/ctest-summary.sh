#!/bin/sh
# One line after a ctest run, with the skips counted apart from the passes (ctest's own summary
# counts a skipped test among those that did not fail): "N tests: P passed, S skipped, F failed".
# Usage: ctest-summary.sh JUNIT_XML   (what ctest --output-junit wrote)
set -eu
xml=$1
attr() { sed -n "s/^[[:space:]]*$1=\"\([0-9]*\)\".*/\1/p" "$xml" | head -1; }
tests=$(attr tests) failed=$(attr failures) skipped=$(attr skipped)
echo "ampactor: $tests tests: $((tests - failed - skipped)) passed, $skipped skipped, $failed failed"
