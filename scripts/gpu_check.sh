#!/usr/bin/env bash
# The one-call device check: GPU tests, compute-sanitizer on one small case per kernel, and the
# benchmark suites, in one go of under 10 minutes on an H200.
#
#   scripts/gpu_check.sh OUTDIR [--tar] [--skip tests,sanitize,bench] [--suites gemm,attention,...]
#
# Writes into OUTDIR:
#   gpu_check.log        everything (environment, pytest, sanitizer reports, tables, a summary)
#   results/             YYYY-MM-DD-<suite>-<device>.json and .png per benchmark suite
#   results.tar.gz       with --tar: results/ packed flat (then results/ is removed), for callers
#                        that bring back only a few files
# Exit status: 0 when every step passed, 1 otherwise (the summary at the end of the log says which).
#
# Run it from anywhere on a machine with the CuTe DSL importable. On the offline GPU machine with
# the bundle copied to .gpu/:  source .gpu/setup.sh --peers && scripts/gpu_check.sh "$OUT" --tar
#
# Time: a global budget (GPU_CHECK_BUDGET_S, default 540 s) is shared by the steps in order; each
# step also has its own cap, and a step that would start with too little budget left is skipped
# (and reported). Knobs (environment): GPU_CHECK_BUDGET_S, BENCH_ARGS (extra `cute-kernels bench`
# options, default "--rounds 3 --warmup-ms 10 --rep-ms 50"), SANITIZE_EACH=1 (one sanitizer
# process per kernel instead of one per tool), PYTEST_ARGS (extra pytest options), GPU_TEST_JOBS
# (concurrent pytest processes for the GPU tests, default 6; see scripts/gpu_tests.sh).
set -uo pipefail

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
OUTDIR=$1; shift
TAR=0; SKIP=""; SUITES="gemm,attention,attention_bwd,copy,skinny,fp8,ladder,decode,fused,overhead"
while [ $# -gt 0 ]; do
  case "$1" in
    --tar) TAR=1 ;;
    --skip) SKIP=${2:?--skip needs a list}; shift ;;
    --suites) SUITES=${2:?--suites needs a list}; shift ;;
    -h|--help) usage ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; usage ;;
  esac
  shift
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$OUTDIR/results" || exit 1
OUTDIR="$(cd "$OUTDIR" && pwd)"  # absolute before leaving the caller's directory
cd "$ROOT" || exit 1
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
BUDGET=${GPU_CHECK_BUDGET_S:-540}
BENCH_ARGS=${BENCH_ARGS:-"--rounds 3 --warmup-ms 10 --rep-ms 50"}
START=$SECONDS
SUMMARY=()
FAILED=0

skipped() { [[ ",$SKIP," == *",$1,"* ]]; }
remaining() { echo $(( BUDGET - (SECONDS - START) )); }

# step NAME CAP_S COMMAND...: run with timeout min(CAP_S, remaining budget); record rc and time.
step() {
  local name=$1 cap=$2; shift 2
  local left; left=$(remaining)
  if [ "$left" -lt 15 ]; then
    echo "=== $name: SKIPPED (budget spent: ${left}s left) ==="
    SUMMARY+=("$(printf '%-28s %-8s %5s' "$name" "skipped" "-")"); FAILED=1; return
  fi
  local limit=$(( cap < left ? cap : left ))
  echo; echo "=== $name (limit ${limit}s) === $*"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  local status="ok"
  [ $rc -eq 0 ] || status="rc=$rc"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="timeout"
  [ $rc -eq 0 ] || FAILED=1
  SUMMARY+=("$(printf '%-28s %-8s %5ss' "$name" "$status" "$((SECONDS - t0))")")
}

echo "=== environment ($(date -u +%Y-%m-%dT%H:%M:%SZ)) ==="
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>&1 || echo "nvidia-smi: not found"
python3 - <<'EOF'
import importlib, importlib.metadata as md
import torch
print(f"python torch {torch.__version__} cuda {torch.version.cuda} device "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'none'}")
for dist in ("nvidia-cutlass-dsl", "triton", "quack-kernels", "flash-attn-4"):
    try:
        print(f"{dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"{dist} (not installed)")
EOF

if ! skipped tests; then
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of options
  step "pytest -m gpu (${GPU_TEST_JOBS:-6} shards)" 240 scripts/gpu_tests.sh "$OUTDIR/pytest" "${GPU_TEST_JOBS:-6}" ${PYTEST_ARGS:-}
fi

if ! skipped sanitize; then
  SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  if [ -z "$SANITIZER" ]; then
    echo "=== compute-sanitizer: not found, sanitizer steps skipped ==="
    SUMMARY+=("$(printf '%-28s %-8s %5s' "compute-sanitizer" "absent" "-")"); FAILED=1
  else
    echo "=== kernels for the sanitizer ==="
    KERNELS=$(python3 -m cute_kernels.bench.sanitize --list)
    echo "${KERNELS:-(none registered)}"
    for tool in memcheck racecheck; do
      # --report-api-errors no: the DSL probes the driver for optional entry points
      # (cuGetProcAddress answers "invalid argument" for absent ones); memory errors still count.
      # memcheck: without torch's caching allocator every tensor is its own allocation, so an
      # out-of-bounds access lands outside any allocation and is caught.
      extra_env=""; [ $tool = memcheck ] && extra_env="PYTORCH_NO_CUDA_MEMORY_CACHING=1"
      if [ "${SANITIZE_EACH:-0}" = 1 ]; then
        for k in $KERNELS; do
          step "$tool $k" 60 env $extra_env "$SANITIZER" --tool $tool --report-api-errors no --error-exitcode 1 --print-limit 20 \
            python3 -m cute_kernels.bench.sanitize "$k"
        done
      elif [ -n "$KERNELS" ]; then
        step "$tool (all kernels)" 90 env $extra_env "$SANITIZER" --tool $tool --report-api-errors no --error-exitcode 1 --print-limit 20 \
          python3 -m cute_kernels.bench.sanitize all
      fi
    done
  fi
fi

if ! skipped bench; then
  IFS=, read -r -a SUITE_LIST <<< "$SUITES"
  for suite in "${SUITE_LIST[@]}"; do
    case $suite in gemm|attention|attention_bwd|decode|fused) cap=110 ;; ladder) cap=90 ;; *) cap=45 ;; esac
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    step "bench $suite" $cap python3 -m cute_kernels.cli bench "$suite" $BENCH_ARGS --out-dir "$OUTDIR/results"
  done
fi

if [ $TAR = 1 ]; then
  (cd "$OUTDIR/results" && tar -czf "$OUTDIR/results.tar.gz" .) && rm -rf "$OUTDIR/results"
  echo "packed $OUTDIR/results.tar.gz (unpack with: tar -xzf results.tar.gz -C docs/results)"
fi

echo
echo "=== summary ($((SECONDS - START))s of ${BUDGET}s budget) ==="
printf '%s\n' "${SUMMARY[@]}"
[ $FAILED = 0 ] && echo "gpu_check: all steps passed" || echo "gpu_check: some steps failed (see above)"
# Let tee write the last lines before the caller collects the log.
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null || sleep 1
exit $FAILED
