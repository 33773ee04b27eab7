#!/usr/bin/env bash
# The whole test suite of a build folder (default: build), two tests at a
# time, then the 20 slowest tests and the suite's own time, so that where
# CI's minutes go is in every log. Exit status: ctest's.
#   bash tests/run_tests.sh [BUILD_DIR] [ctest arguments...]   e.g. -L fast
set -uo pipefail
build=${1:-build}
shift || true
junit="$(cd "$build" && pwd)/Testing/junit.xml"
started=$(date +%s)
ctest --test-dir "$build" --output-on-failure -j2 --output-junit "$junit" "$@"
status=$?
/usr/bin/python3 - "$junit" "$(( $(date +%s) - started ))" <<'PY' || true
import sys
import xml.etree.ElementTree as ET
cases = [(float(c.get("time", 0)), c.get("name"), c.get("status", "")) for c in ET.parse(sys.argv[1]).iter("testcase")]
cases.sort(reverse=True)
print(f"\nthe 20 slowest of {len(cases)} tests ({sum(t for t, _, _ in cases):.0f} s of tests in {sys.argv[2]} s, two at a time):")
for seconds, name, status in cases[:20]:
    print(f"  {seconds:7.1f} s  {name}{'' if status in ('run', '') else '  (' + status + ')'}")
PY
exit $status
