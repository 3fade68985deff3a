#!/usr/bin/env bash
# `make test`, one phase at a time: `tests/phase.sh NAME COMMAND...` says what the phase runs, runs
# it, and says how long it took and whether it passed, so a failure names its phase.
name=$1
shift
echo "== $name: $*"
start=$(date +%s)
"$@"
rc=$?
secs=$(( $(date +%s) - start ))
took="$((secs / 60)) min $((secs % 60)) s"
if [ "$rc" -eq 0 ]; then
  echo "== $name: passed in $took"
else
  echo "== $name: FAILED (exit status $rc) after $took"
fi
exit "$rc"
