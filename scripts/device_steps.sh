#!/usr/bin/env bash
# Named steps for one device call, each under its own time cap, logs and results packed into
# few files (the device tool brings back at most 8):
#
#   scripts/device_steps.sh OUTDIR STEP[:CAP_S] ...
#
# Steps:  tests             every `gpu` test, sharded (scripts/gpu_tests.sh, GPU_TEST_JOBS shards)
#         tests=FILES       only these test files or node ids (comma list), sharded the same way
#         sanitize          compute-sanitizer memcheck + racecheck over one small case per kernel
#         bench=SUITE       `cute-kernels bench SUITE` (BENCH_ARGS) into OUTDIR/results
#         bench=models      `cute-kernels bench models` (MODELS_ARGS) into OUTDIR/results
#         script=PATH       python3 PATH --out OUTDIR/results/<name>.json
#         on=PATHS          the following steps run with these unverified paths on (runtime.unverified;
#                           CUTE_KERNELS_UNVERIFIED=PATHS) and write results under results/on-PATHS/,
#                           so a suite run before and after compares a path off and on in one call
#         off               the following steps run with no unverified path on, results in results/
# Writes OUTDIR/steps.log (a summary line per step at the end) and OUTDIR/results.tar.gz (the
# JSON results and every step's log). With CUTE_KERNELS_RESULTS_DIR set to OUTDIR/results the
# fuzz tests write their records there too. Exit status: 0 when every step passed.
set -uo pipefail
[ $# -ge 2 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
OUTDIR=$1; shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUTDIR/results" "$OUTDIR/logs" || exit 1
OUTDIR="$(cd "$OUTDIR" && pwd)"
cd "$ROOT" || exit 1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export CUTE_KERNELS_RESULTS_DIR="$OUTDIR/results"
BENCH_ARGS=${BENCH_ARGS:-"--rounds 3 --warmup-ms 10 --rep-ms 50"}
SUMMARY=()
FAILED=0

capped() {  # CAP LOG COMMAND...: run COMMAND into LOG, killed with everything it started at CAP s
  local cap=$1 log=$2; shift 2
  if ! command -v setsid > /dev/null; then  # no util-linux: the command alone is capped
    timeout --kill-after=10 "$cap" "$@" > "$log" 2>&1
    return
  fi
  # Its own process group, killed whole when the command ends or hits the cap: a pytest cut at
  # its cap otherwise leaves xdist workers running kernels on the GPU while the next step times.
  setsid "$@" > "$log" 2>&1 &
  local pid=$!
  ( sleep "$cap"; kill -TERM -- "-$pid" 2>/dev/null; sleep 10; kill -KILL -- "-$pid" 2>/dev/null ) &
  local watchdog=$!
  wait "$pid"
  local rc=$?
  pkill -P "$watchdog" sleep 2>/dev/null; kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
  kill -KILL -- "-$pid" 2>/dev/null
  { [ $rc -eq 143 ] || [ $rc -eq 137 ]; } && return 124  # killed at the cap: as timeout(1) reports it
  return $rc
}

run_step() {  # NAME CAP COMMAND...
  local name=$1 cap=$2; shift 2
  # the log is named after the step, cut to a length any file system takes (a step naming
  # many test files would otherwise exceed NAME_MAX), numbered so two cut names stay apart
  STEP_NO=$((${STEP_NO:-0} + 1))
  local log="$OUTDIR/logs/$(printf '%02d' "$STEP_NO")-$(echo "$name" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-80).log" t0=$SECONDS
  echo "=== $name (cap ${cap}s)"
  capped "$cap" "$log" "$@"
  local rc=$?
  [ $rc -eq 0 ] || FAILED=1
  tail -n 4 "$log"
  SUMMARY+=("$(printf '%-40s rc=%-4s %5ss' "$name" "$rc" "$((SECONDS - t0))")")
}

RESULTS="$OUTDIR/results"
for spec in "$@"; do
  # the cap is a trailing :SECONDS (a test node id keeps its own ::)
  step=$spec; cap=300
  if [[ "$spec" =~ ^(.*[^:]):([0-9]+)$ ]]; then step=${BASH_REMATCH[1]}; cap=${BASH_REMATCH[2]}; fi
  case "$step" in
    on=*) export CUTE_KERNELS_UNVERIFIED="${step#on=}"
          RESULTS="$OUTDIR/results/on-$(printf %s "${step#on=}" | tr -c 'A-Za-z0-9_.,-' '_' | cut -c1-80)"
          mkdir -p "$RESULTS"; export CUTE_KERNELS_RESULTS_DIR="$RESULTS"; echo "=== unverified paths on: ${step#on=}" ;;
    off) export CUTE_KERNELS_UNVERIFIED=""; RESULTS="$OUTDIR/results"; export CUTE_KERNELS_RESULTS_DIR="$RESULTS"
         echo "=== unverified paths off" ;;
    tests) run_step tests "$cap" bash scripts/gpu_tests.sh "$OUTDIR/logs/pytest" "${GPU_TEST_JOBS:-8}" ;;
    tests=*) run_step "$step" "$cap" python3 -m pytest -q -rfE -p no:cacheprovider -n "${GPU_TEST_JOBS:-8}" \
               $(echo "${step#tests=}" | tr ',' ' ') ;;
    sanitize)
      SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
      run_step memcheck "$cap" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool memcheck --report-api-errors no \
        --error-exitcode 1 --print-limit 20 python3 -m cute_kernels.bench.sanitize all
      run_step racecheck "$cap" "$SAN" --tool racecheck --report-api-errors no --error-exitcode 1 --print-limit 20 \
        python3 -m cute_kernels.bench.sanitize all ;;
    bench=models)  # its own options (rounds and iterations of whole model steps), MODELS_ARGS
      # shellcheck disable=SC2086
      run_step "$step" "$cap" python3 -m cute_kernels.cli bench models ${MODELS_ARGS:-} --out-dir "$RESULTS" ;;
    bench=*)
      # shellcheck disable=SC2086
      run_step "$step" "$cap" python3 -m cute_kernels.cli bench "${step#bench=}" $BENCH_ARGS --out-dir "$RESULTS" ;;
    script=*)
      path=${step#script=}; name=$(basename "$path" .py)
      run_step "$step" "$cap" python3 "$path" --out "$RESULTS/$name.json" ;;
    *) echo "device_steps.sh: unknown step $step" >&2; FAILED=1 ;;
  esac
done

echo "=== summary"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUTDIR/steps.log"
(cd "$OUTDIR" && tar -czf results.tar.gz results logs) && rm -rf "$OUTDIR/results" "$OUTDIR/logs"
exit $FAILED
