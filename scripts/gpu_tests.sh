#!/usr/bin/env bash
# The GPU tests in JOBS concurrent pytest processes sharing the device.
#
#   scripts/gpu_tests.sh LOGDIR [JOBS] [pytest options...]
#
# Kernel compiles (CPU-bound, 1-3 s each, and cold on a fresh machine) dominate the GPU tests,
# so one process per few cores finishes several times sooner than a single pytest. The test
# files are dealt out largest first to the lightest shard (size in bytes stands in for cost; a
# fuzz file, a few test functions that each run a thousand problems, counts 20 times its size,
# so each gets a shard nearly to itself); each shard logs to LOGDIR/shard-N.log, which is
# printed whole once all shards end.
# Exit status: 0 when every shard passed, else the first non-zero one.
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
LOGDIR=$1; shift
JOBS=${1:-4}; [ $# -ge 1 ] && shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
mkdir -p "$LOGDIR" || exit 1
trap 'kill 0 2>/dev/null' TERM INT

mapfile -t ASSIGNED < <(grep -rlE 'mark\.gpu' tests --include='test_*.py' | xargs wc -c | grep -v ' total$' \
  | awk '{ print ($2 ~ /_fuzz_gpu\.py$/ ? 20 * $1 : $1), $2 }' | sort -rn | awk -v jobs="$JOBS" '
      { best = 0; for (i = 1; i < jobs; i++) if (load[i] < load[best]) best = i
        load[best] += $1; files[best] = files[best] " " $2 }
      END { for (i = 0; i < jobs; i++) if (files[i] != "") print files[i] }')

# the deal first, so a shard cut off by a caller's time cap still says which files it held
for i in "${!ASSIGNED[@]}"; do echo "shard $i:${ASSIGNED[$i]}"; done

PIDS=()
for i in "${!ASSIGNED[@]}"; do
  # shellcheck disable=SC2086  # the shard's file list
  python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider "$@" ${ASSIGNED[$i]} > "$LOGDIR/shard-$i.log" 2>&1 &
  PIDS+=($!)
done
RC=0
for i in "${!PIDS[@]}"; do
  wait "${PIDS[$i]}"; rc=$?
  [ $RC -eq 0 ] && [ $rc -ne 0 ] && [ $rc -ne 5 ] && RC=$rc  # 5: a shard whose tests all deselected
done
for i in "${!ASSIGNED[@]}"; do
  echo "--- shard $i:${ASSIGNED[$i]}"
  cat "$LOGDIR/shard-$i.log"
done
exit $RC
