#!/usr/bin/env bash
# Builds source trees here (no GPU needed) and puts their binaries in .carry/NAME/ for the device
# tool to carry, so a device call spends its minutes running, not building:
#   scripts/carry_build.sh NAME=REV[+PATCH...] [NAME=REV[+PATCH...] ...] [--tests]
# REV is a commit (or "." for the working tree as it is); each +PATCH (a path relative to the repo
# root, e.g. docs/wip/x.patch) is applied on top with `git am -3`. Each tree other than "." is a
# detached git worktree in wt/NAME (ignored), built in wt/NAME/build with ccache: CCACHE_BASEDIR set
# to the repo root makes the worktree's unchanged translation units hit the main build's cache
# (~1 minute a tree on 2 cores). --tests also builds and carries fp4moe_gpu_tests.
# On the device (carry [".carry"]): scripts/device_ab.sh runs them; or by hand,
#   scripts/device_run.sh --no-tests --bin .carry/NAME --bench "…"   and   .carry/NAME/fp4moe_gpu_tests
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
specs=() tests=0
for a in "$@"; do
  case "$a" in
    --tests) tests=1 ;;
    *=*) specs+=("$a") ;;
    *) echo "carry_build.sh: arguments are NAME=REV[+PATCH...] or --tests, got '$a'" >&2; exit 2 ;;
  esac
done
[ ${#specs[@]} -gt 0 ] || { echo "usage: scripts/carry_build.sh NAME=REV[+PATCH...]... [--tests]" >&2; exit 2; }
source scripts/install_deps.sh >/dev/null
export CCACHE_BASEDIR="$root"
targets=fp4moe_cli
if [ $tests -eq 1 ]; then targets+=" fp4moe_gpu_tests"; fi
for spec in "${specs[@]}"; do
  name=${spec%%=*} rest=${spec#*=}
  [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "carry_build.sh: NAME '$name': letters, digits, _ and - only" >&2; exit 2; }
  IFS=+ read -r rev patches <<< "$rest"
  if [ "$rev" = . ]; then
    [ -z "$patches" ] || { echo "carry_build.sh: '.' takes no patches (apply them to a commit)" >&2; exit 2; }
    dir=$root
  else
    dir=$root/wt/$name
    git worktree remove --force "$dir" 2>/dev/null || rm -rf "$dir"
    git worktree prune
    git worktree add -f --detach "$dir" "$rev" >/dev/null
    IFS=+ read -r -a plist <<< "$patches"
    for p in "${plist[@]}"; do
      [ -n "$p" ] || continue
      (cd "$dir" && git am -3 -q "$root/$p") || { echo "carry_build.sh: $p does not apply to $rev" >&2; exit 1; }
    done
  fi
  echo "== $name: $(git -C "$dir" log --oneline -1 | cut -c1-100)"
  cmake -S "$dir" -B "$dir/build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$dir/build" -j"$(nproc)" --target $targets | tail -1
  mkdir -p ".carry/$name"
  cp "$dir/build/fp4moe" ".carry/$name/"
  if [ $tests -eq 1 ]; then cp "$dir/build/fp4moe_gpu_tests" ".carry/$name/"; fi
  git -C "$dir" rev-parse HEAD > ".carry/$name/commit"
done
du -sh .carry
