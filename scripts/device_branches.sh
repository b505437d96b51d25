#!/usr/bin/env bash
# On the GPU machine, in one call: run scripts/device_run.sh (build, tests, checks, benches, summary)
# in several source trees, e.g. git worktrees of branches carried to the device. One call instead of
# one per branch: every call costs about a minute of device time before its command starts.
#   scripts/device_branches.sh NAME=DIR [NAME=DIR ...] -- [device_run.sh arguments]
# Each tree runs its own scripts/device_run.sh with the same arguments, in its own build-device/;
# with $OUT set (the device tool) its logs come back as $OUT/NAME/logs.tgz. Run the script several
# times in one device command to give trees different arguments.
# Locally, before the device call (wt/ is in .gitignore; pass carry: ["wt"]):
#   git worktree add wt/rs next/dynamic-rs
#   device: timeout 560 bash scripts/device_branches.sh rs=wt/rs -- --filter 'GpuDynamic*' --bench "…"
set -uo pipefail
trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do trees+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the "--"
[ ${#trees[@]} -gt 0 ] || { echo "usage: device_branches.sh NAME=DIR... -- [device_run.sh arguments]" >&2; exit 2; }
for tree in "${trees[@]}"; do
  [[ "$tree" == *=* ]] || { echo "$tree: trees are NAME=DIR" >&2; exit 2; }
  [ -f "${tree#*=}/scripts/device_run.sh" ] || { echo "${tree#*=}: no scripts/device_run.sh" >&2; exit 2; }
done
child=0
trap '[ $child -ne 0 ] && kill -TERM $child && wait $child; exit 143' TERM  # device_run.sh packs its logs on TERM
rc=0
for tree in "${trees[@]}"; do
  name=${tree%%=*} dir=${tree#*=} out=""
  if [ -n "${OUT:-}" ]; then out="$OUT/$name" && mkdir -p "$out"; fi
  echo "==== $name ($dir)"
  OUT="$out" bash "$dir/scripts/device_run.sh" "$@" &
  child=$!
  wait $child || rc=1
  child=0
done
exit $rc
