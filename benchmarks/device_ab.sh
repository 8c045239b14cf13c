#!/usr/bin/env bash
# The planned P40 job (benchmarks/p40_ppo_head_to_head.py --settings planned) for several trees on one GPU machine,
# one after another, each from a private copy under /tmp (a later device call re-syncs the working tree).
#
# Here (no GPU): an older tree as a tarball of verl (materialised from that commit's patches), verl_compat and
# benchmarks, kept out of git:
#   git worktree add -f /tmp/oldsrc REV && verl-compat fork --root /tmp/oldsrc materialize --force
#   mkdir -p .ab && tar -C /tmp/oldsrc --exclude=benchmarks/results -czf .ab/old.tgz verl verl_compat benchmarks
# On the device (`run` with carry [".devpkgs/part-01", "verl", ".ab"], after part-00's call), every .ab/NAME.tgz
# is unpacked to /tmp/NAME, then each NAME:FOLDER runs:
#   bash benchmarks/device_ab.sh new:$PWD old:/tmp/old
# A side may add verl overrides for the planned job after a second colon, separated by spaces (one tree, two
# settings): bash benchmarks/device_ab.sh "a8:$PWD:actor_rollout_ref.rollout.agent.num_workers=8" "a2:$PWD"
# STEPS (default 3) and SIDE_S (default 280, seconds per tree) set the length; results and logs go to
# $OUT/ab_NAME.json and .log. Alternate the trees (new, old, new, old) in later calls: hosts differ by tens of
# percent in start-up, so compare only runs of one machine.
set -uo pipefail
for t in .ab/*.tgz; do
  [ -e "$t" ] || continue
  n=$(basename "$t" .tgz); [ -d "/tmp/$n" ] || { mkdir -p "/tmp/$n" && tar -C "/tmp/$n" -xzf "$t"; }
done
for spec in "$@"; do
  name=${spec%%:*}; rest=${spec#*:}; src=${rest%%:*}; extra=(); d=/tmp/ab_$name
  [ "$rest" != "$src" ] && read -r -a extra <<< "${rest#*:}"
  rm -rf "$d"; mkdir -p "$d"; cp -r "$src/verl" "$src/verl_compat" "$src/benchmarks" "$d/"
  ray stop --force >/dev/null 2>&1
  t0=$(date +%s)
  (cd "$d" && PYTHONPATH=/tmp/site:$d VERL_COMPAT_DEVICE=${VERL_COMPAT_DEVICE:-p40} RAY_AUTH_MODE=disabled \
     HF_HUB_OFFLINE=1 timeout "${SIDE_S:-280}" python3 benchmarks/p40_ppo_head_to_head.py --settings planned \
     --steps "${STEPS:-3}" --trace --timeout-s "${SIDE_S:-280}" --out "$OUT/ab_$name.json" -- "${extra[@]}" > "$OUT/ab_$name.log" 2>&1)
  echo "== $name rc=$? wall=$(( $(date +%s) - t0 ))s"; grep -v Warning "$OUT/ab_$name.log" | tail -6
done
