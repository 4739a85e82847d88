#!/usr/bin/env bash
# make gpu-check: the one command run on a lent GPU machine. It prints the machine, builds
# kiln with CUDA against the .gpu-deps/ bundle (make gpu-deps), runs the CUDA tests, the
# kiln training benchmark on the GPU and the PyTorch baseline (tools/bench_torch.py).
# Every step runs under `timeout` inside one overall budget; a failed step is recorded and
# the next one runs; the exit status is 1 when any step failed or timed out.
#
# Results go to $OUT when set (the device runner brings back only files under it), else to
# build-gpu/gpu-check/:
#   log.txt     everything printed    tests.txt   the test binaries' output (with durations)
#   bench.jsonl one JSON line per measurement (kiln and pytorch)
#   summary.md  step, status, seconds; the bench lines
#
# Knobs (environment): GPU_CHECK_BUDGET_S (450), JOBS (nproc), GPU_DEPS (.gpu-deps),
# GPU_CHECK_BUILD (build-gpu), GPU_CHECK_CMAKE_FLAGS (extra configure flags),
# GPU_CHECK_BUILD_S (330, the build step's limit), KILN_BENCH_ARGS, TORCH_BENCH_ARGS,
# BERT_BENCH_ARGS (the BERT-base lines' model and sizes, given to kiln-bench and bench_torch.py
# alike), GPU_CHECK_SKIP_BERT=1 (no BERT lines), GPU_CHECK_SKIP_RESNET=1 (no ResNet-50 lines,
# kiln's or PyTorch's: the budget left to the BERT lines),
# GPU_CHECK_FORCE_GPU=0|1 (overrides the GPU detection), GPU_CHECK_SKIP_TORCH=1 (no PyTorch
# baseline), GPU_CHECK_SKIP_PLAN=1 (no cost-model lines), GPU_CHECK_CORE_TESTS=1 (the core tests too), GPU_CHECK_TARGETS (what to build;
# a step whose program was not built is skipped or failed as such).
set -u -o pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/build-gpu/gpu-check}
BUILD=${GPU_CHECK_BUILD:-$ROOT/build-gpu}
DEPS=${GPU_DEPS:-$ROOT/.gpu-deps}
JOBS=${JOBS:-$(nproc)}
BUDGET_S=${GPU_CHECK_BUDGET_S:-450}
RESERVE_S=10  # kept back for the summary
KILN_BENCH_ARGS=${KILN_BENCH_ARGS:---arch resnet50 --batch 128 --image-size 224 --steps 10 --warmup 3 --device cuda --compile}
# The PyTorch baseline's --compile-budget-s is added below: what the overall budget leaves.
TORCH_BENCH_ARGS=${TORCH_BENCH_ARGS:---device cuda --batch 128 --image-size 224 --steps 20 --warmup 5 --modes eager,compiled}
# BERT-base masked-LM training (AdamW, dropout 0.1) at a size whose steps take well under a
# second on an H200: the time goes to compiling (kiln's NVRTC kernels, torch.compile).
BERT_BENCH_ARGS=${BERT_BENCH_ARGS:---arch bert-base --batch 32 --seq 128 --steps 5 --warmup 2}

mkdir -p "$OUT"
LOG=$OUT/log.txt TESTS=$OUT/tests.txt BENCH=$OUT/bench.jsonl SUMMARY=$OUT/summary.md
: >"$LOG"
: >"$TESTS"
: >"$BENCH"
STEP_OUT=$(mktemp)
trap 'rm -f "$STEP_OUT"' EXIT

START=$(date +%s)
DEADLINE=$((START + BUDGET_S))
STEP_NAMES=() STEP_STATUS=() STEP_SECONDS=()
FAILED=0

say() { echo "$*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

record() {  # name status seconds
  STEP_NAMES+=("$1") STEP_STATUS+=("$2") STEP_SECONDS+=("$3")
  case $2 in FAIL* | TIMEOUT*) FAILED=1 ;; esac
  say "--- $1: $2 (${3} s)"
}

# run_step NAME LIMIT_S COPY_TO CMD...: runs CMD under timeout (never past the overall
# budget), its output into log.txt, into COPY_TO unless that is '-', and into $STEP_OUT
# for the caller. NOT_AVAILABLE_PATTERN (an ERE) turns a failure whose output matches it
# into the status 'not available yet', which is no failure (a feature of a later issue).
run_step() {
  local name=$1 limit=$2 copy=$3
  shift 3
  local left=$((DEADLINE - $(date +%s) - RESERVE_S))
  if ((left < 15)); then
    record "$name" "skipped: out of time budget" 0
    return 1
  fi
  ((limit > left)) && limit=$left
  say ""
  say "=== $name (limit ${limit} s, $(date -u +%H:%M:%S)): $*"
  local t0 rc status
  t0=$(now)
  local copies=("$LOG" "$STEP_OUT")
  [ "$copy" = - ] || copies+=("$copy")
  : >"$STEP_OUT"
  timeout -k 10 "$limit" "$@" </dev/null 2>&1 | tee -a "${copies[@]}"
  rc=${PIPESTATUS[0]}
  if ((rc == 0)); then
    status=ok
  elif ((rc == 124 || rc == 137)); then
    status="TIMEOUT after ${limit} s"
  elif [ -n "${NOT_AVAILABLE_PATTERN:-}" ] && grep -Eq "$NOT_AVAILABLE_PATTERN" "$STEP_OUT"; then
    status="not available yet (exit $rc)"
  else
    status="FAIL (exit $rc)"
  fi
  record "$name" "$status" "$(since "$t0")"
  return "$rc"
}

# The JSON lines of the last step into bench.jsonl, "impl" added where it is missing.
collect_bench() {
  local impl=$1
  grep -E '^\{.*\}$' "$STEP_OUT" | sed -E "/\"impl\":/! s/^\{/{\"impl\":\"$impl\",/" >>"$BENCH" || true
}

# --- 1. The machine ----------------------------------------------------------------------
T0=$(now)
say "kiln gpu-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC') in $ROOT, results in $OUT, budget ${BUDGET_S} s, -j$JOBS"
show() {  # a command of the environment report, under a short timeout
  say ""
  say "\$ $*"
  timeout -k 5 30 "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  ((rc == 0)) || say "(exit $rc)"
}
show uname -a
show sh -c 'grep -E "^(PRETTY_NAME|VERSION_ID)=" /etc/os-release; ldd --version | head -1'
show sh -c 'nproc; free -g | head -2; df -h . | tail -1'
show nvidia-smi
show nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
show sh -c 'command -v nvcc || ls -d /usr/local/cuda*/bin/nvcc; nvcc --version || /usr/local/cuda/bin/nvcc --version'
show sh -c 'command -v c++ g++; c++ --version | head -1; g++ --version | head -1'
show sh -c 'command -v cmake ninja ccache make; cmake --version | head -1; ninja --version'
show python3 -c 'import sys, torch, torchvision; print(sys.executable, sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "available", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""); print("torchvision", torchvision.__version__)'
show du -sh "$DEPS"
show sh -c 'ls /usr/local/cuda/lib64/ /usr/local/cuda/lib/ 2>/dev/null | grep -E "cudnn|cublas|nccl|nvrtc" | sort -u | head -20; ls /usr/local/cuda/include/cudnn.h'
# cuDNN: the toolkit's own when it has one, else the one PyTorch's wheel brings.
CUDNN_ROOT=${CUDNN_ROOT:-}
if [ -z "$CUDNN_ROOT" ] && [ ! -e /usr/local/cuda/include/cudnn.h ]; then
  CUDNN_ROOT=$(timeout 60 python3 -c 'import os, nvidia.cudnn as c; print(os.path.dirname(c.__file__) if c.__file__ else list(c.__path__)[0])' 2>/dev/null)
fi
say "cuDNN root: ${CUDNN_ROOT:-(the toolkit folder)}"
[ -n "$CUDNN_ROOT" ] && export CUDNN_ROOT && show ls "$CUDNN_ROOT" "$CUDNN_ROOT/lib"
# NCCL (dist/'s nccl backend): the toolkit's own when it has nccl.h, else PyTorch's wheel's.
NCCL_ROOT=${NCCL_ROOT:-}
if [ -z "$NCCL_ROOT" ] && [ ! -e /usr/local/cuda/include/nccl.h ]; then
  NCCL_ROOT=$(timeout 60 python3 -c 'import os, nvidia.nccl as c; print(os.path.dirname(c.__file__) if c.__file__ else list(c.__path__)[0])' 2>/dev/null)
fi
say "NCCL root: ${NCCL_ROOT:-(the toolkit folder)}"
[ -n "$NCCL_ROOT" ] && export NCCL_ROOT

HAVE_GPU=0
if timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  HAVE_GPU=1
elif timeout 60 python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  HAVE_GPU=1  # a container without nvidia-smi
fi
[ -n "${GPU_CHECK_FORCE_GPU:-}" ] && HAVE_GPU=$GPU_CHECK_FORCE_GPU
say ""
say "GPU present: $([ "$HAVE_GPU" = 1 ] && echo yes || echo no)"
record environment "ok (GPU: $([ "$HAVE_GPU" = 1 ] && echo yes || echo no))" "$(since "$T0")"

# --- 2. Configure and build ----------------------------------------------------------------
CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_BLAS=OFF)
command -v ninja >/dev/null && CMAKE_ARGS+=(-G Ninja)
command -v ccache >/dev/null && CMAKE_ARGS+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ -d "$DEPS/include" ]; then
  # Every dependency named explicitly, so that nothing of the machine's own is mixed in.
  CMAKE_ARGS+=(-DCMAKE_PREFIX_PATH="$DEPS"
    -Dfmt_DIR="$DEPS/lib/cmake/fmt" -DEigen3_DIR="$DEPS/share/eigen3/cmake" -DCatch2_DIR="$DEPS/lib/cmake/Catch2"
    -DJPEG_INCLUDE_DIR="$DEPS/include" -DJPEG_LIBRARY="$DEPS/lib/libjpeg.so.62"
    -DJPEG_LIBRARY_RELEASE="$DEPS/lib/libjpeg.so.62"
    -DZLIB_INCLUDE_DIR="$DEPS/include" -DZLIB_LIBRARY="$DEPS/lib/libz.so.1"
    -DZLIB_LIBRARY_RELEASE="$DEPS/lib/libz.so.1")
else
  say "WARNING: no bundle at $DEPS (make gpu-deps, then carry .gpu-deps): using the machine's own packages"
fi
# shellcheck disable=SC2206  # word splitting of the extra flags is wanted
CMAKE_ARGS+=(${GPU_CHECK_CMAKE_FLAGS:-})

# --fresh: a build folder carried from another machine must not keep its cache.
run_step configure 150 - cmake --fresh "${CMAKE_ARGS[@]}"
CONFIGURED=$?
# shellcheck disable=SC2206  # GPU_CHECK_TARGETS is a list
TARGETS=(${GPU_CHECK_TARGETS:-kiln kiln-tests-cuda kiln-bench kiln-tests-tools kiln-train kiln-tests-dist})
[ "${GPU_CHECK_CORE_TESTS:-0}" = 1 ] && TARGETS+=(kiln-tests-core)
if ((CONFIGURED == 0)); then
  # -k 0 (Ninja) / -k (Make): keep going, so one broken file leaves the other targets built.
  KEEP_GOING=-k
  grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$BUILD/CMakeCache.txt" && KEEP_GOING="-k 0"
  # shellcheck disable=SC2086
  run_step build "${GPU_CHECK_BUILD_S:-330}" - cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" -- $KEEP_GOING
  show sh -c "ldd '$BUILD/lib/libkiln.so' | grep -E 'jpeg|libz|cuda|nvrtc|fmt|gomp|stdc'"
else
  record build "skipped: configure failed" 0
fi

# --- 3. Tests --------------------------------------------------------------------------------
run_tests() {  # name binary limit
  if [ ! -x "$BUILD/bin/$2" ]; then
    record "$1" "FAIL (not built)" 0
    return
  fi
  echo "### $2 ($(date -u +%H:%M:%S))" >>"$TESTS"
  run_step "$1" "$3" "$TESTS" "$BUILD/bin/$2" --durations yes
  grep -E '^(All tests passed|test cases:)' "$STEP_OUT" | tee -a "$LOG" >/dev/null
}
# kiln-tests-cuda one source file at a time, so that a crash (a CUDA error that kills the
# process) loses that file's remaining cases only. The emulated cases run on every machine
# (make test) and are left out here.
if [ ! -x "$BUILD/bin/kiln-tests-cuda" ]; then
  record tests-cuda "FAIL (not built)" 0
else
  for source in "$ROOT"/tests/cuda/test_*.cpp; do
    file=$(basename "$source" .cpp)
    case $file in test_cuda_emulated*) continue ;; esac
    echo "### kiln-tests-cuda $file ($(date -u +%H:%M:%S))" >>"$TESTS"
    run_step "tests-cuda $file" 90 "$TESTS" "$BUILD/bin/kiln-tests-cuda" -# "[#$file]~[cuda_emulated]" --durations yes
    grep -E '^(All tests passed|test cases:|No tests ran)' "$STEP_OUT" | tee -a "$LOG" >/dev/null
  done
fi
if [[ " ${TARGETS[*]} " != *" kiln-tests-tools "* ]]; then
  record tests-tools-cuda "skipped: not in GPU_CHECK_TARGETS" 0
elif [ -x "$BUILD/bin/kiln-tests-tools" ]; then
  echo "### kiln-tests-tools [cuda] ($(date -u +%H:%M:%S))" >>"$TESTS"
  run_step tests-tools-cuda 120 "$TESTS" "$BUILD/bin/kiln-tests-tools" "[cuda]" --durations yes
else
  record tests-tools-cuda "FAIL (not built)" 0
fi
# The NCCL backend (tests/dist/test_nccl.cpp): every collective of one rank through NCCL,
# backend auto, DDP steps on CUDA; SyncBatchNorm's statistics through NCCL against cuDNN's
# batch norm (test_sync_batch_norm_nccl.cpp); the 2-rank cases where 2 GPUs are visible. A case that
# cannot run says why ("skipped: ...", copied into the log).
if [[ " ${TARGETS[*]} " != *" kiln-tests-dist "* ]]; then
  record tests-nccl "skipped: not in GPU_CHECK_TARGETS" 0
elif [ -x "$BUILD/bin/kiln-tests-dist" ]; then
  echo "### kiln-tests-dist [nccl] ($(date -u +%H:%M:%S))" >>"$TESTS"
  run_step tests-nccl 120 "$TESTS" "$BUILD/bin/kiln-tests-dist" "[nccl]" --durations yes
  grep -A1 "skipped:" "$STEP_OUT" | tee -a "$LOG" >/dev/null
else
  record tests-nccl "FAIL (not built)" 0
fi
if [ "$HAVE_GPU" = 1 ] && [ -x "$BUILD/bin/kiln-train" ]; then
  run_step train-cuda 90 - "$BUILD/bin/kiln-train" --data synthetic --arch resnet18 --device cuda --steps 20 \
    --batch 64 --micro-batch 32 --workers 4 --print-every 5
fi
if [ "$HAVE_GPU" = 1 ] && [ -x "$BUILD/bin/kiln-bench" ]; then
  run_step bench-ops 60 - "$BUILD/bin/kiln-bench" ops --device cuda
  collect_bench kiln
fi

# --- 4. kiln's training benchmark on the GPU -----------------------------------------------------
if [ "$HAVE_GPU" != 1 ]; then
  record bench-kiln "skipped: no GPU" 0
elif [ "${GPU_CHECK_SKIP_RESNET:-0}" = 1 ]; then
  record bench-kiln "skipped: GPU_CHECK_SKIP_RESNET=1" 0
elif [[ " ${TARGETS[*]} " != *" kiln-bench "* ]]; then
  record bench-kiln "skipped: not in GPU_CHECK_TARGETS" 0
elif [ ! -x "$BUILD/bin/kiln-bench" ]; then
  record bench-kiln "FAIL (not built)" 0
else
  # shellcheck disable=SC2086
  NOT_AVAILABLE_PATTERN='not available yet' run_step bench-kiln 150 - "$BUILD/bin/kiln-bench" train $KILN_BENCH_ARGS
  collect_bench kiln
  # The same step channels-last: eager on NHWC batches and the compiled modes with the layout
  # pass on (on CUDA its automatic policy keeps NCHW until batch norm and pooling have NHWC
  # kernels there; this measures whether it should). GPU_CHECK_SKIP_NHWC=1 leaves it out.
  if [ "${GPU_CHECK_SKIP_NHWC:-0}" != 1 ]; then
    # shellcheck disable=SC2086
    NOT_AVAILABLE_PATTERN='not available yet' run_step bench-kiln-nhwc 150 - "$BUILD/bin/kiln-bench" train \
      $KILN_BENCH_ARGS --steps 5 --warmup 2 --channels-last --layout channels_last
    collect_bench kiln
  fi
  # Mixed precision (GPU_CHECK_SKIP_AMP=1 leaves it out): bf16 autocast, channels-last, batch
  # 256, eager and compiled against f32 in the same run; and one fp16 + GradScaler line.
  if [ "${GPU_CHECK_SKIP_AMP:-0}" != 1 ]; then
    NOT_AVAILABLE_PATTERN='not available yet' run_step bench-kiln-bf16 240 - "$BUILD/bin/kiln-bench" train \
      --arch resnet50 --batch 256 --image-size 224 --steps 5 --warmup 2 --device cuda --compile \
      --channels-last --layout channels_last --amp bf16
    collect_bench kiln
    NOT_AVAILABLE_PATTERN='not available yet' run_step bench-kiln-fp16 120 - "$BUILD/bin/kiln-bench" train \
      --arch resnet50 --batch 256 --image-size 224 --steps 5 --warmup 2 --device cuda --channels-last --amp fp16
    collect_bench kiln
  fi
  # Where the eager step's time goes (one step synchronized after every op; stderr table).
  run_step bench-kiln-profile 60 - "$BUILD/bin/kiln-bench" train --arch resnet50 --batch 128 --image-size 224 \
    --steps 2 --warmup 2 --device cuda --profile
fi

# --- 5. The PyTorch baseline ---------------------------------------------------------------
if [ "$HAVE_GPU" != 1 ]; then
  record bench-pytorch "skipped: no GPU" 0
elif [ "${GPU_CHECK_SKIP_RESNET:-0}" = 1 ]; then
  record bench-pytorch "skipped: GPU_CHECK_SKIP_RESNET=1" 0
elif [ "${GPU_CHECK_SKIP_TORCH:-0}" = 1 ]; then
  record bench-pytorch "skipped: GPU_CHECK_SKIP_TORCH=1" 0
else
  # torch.compile gets at most 150 s for its first step, less when the budget is short, so
  # that the eager line and the error line still come out before the step's timeout.
  COMPILE_BUDGET_S=$((DEADLINE - $(date +%s) - RESERVE_S - 60))
  ((COMPILE_BUDGET_S > 150)) && COMPILE_BUDGET_S=150
  ((COMPILE_BUDGET_S < 20)) && COMPILE_BUDGET_S=20
  # shellcheck disable=SC2086
  run_step bench-pytorch 240 - python3 "$ROOT/tools/bench_torch.py" --compile-budget-s "$COMPILE_BUDGET_S" \
    $TORCH_BENCH_ARGS
  collect_bench pytorch
  if [ "${GPU_CHECK_SKIP_AMP:-0}" != 1 ]; then
    # PyTorch's AMP at kiln's bf16 and fp16 lines' batch: torch.autocast(bfloat16), channels_last,
    # eager and torch.compile; fp16 with torch.amp.GradScaler, eager.
    run_step bench-pytorch-bf16 240 - python3 "$ROOT/tools/bench_torch.py" --compile-budget-s "$COMPILE_BUDGET_S" \
      --device cuda --batch 256 --image-size 224 --steps 10 --warmup 3 --modes eager,compiled --amp bf16
    collect_bench pytorch
    run_step bench-pytorch-fp16 120 - python3 "$ROOT/tools/bench_torch.py" \
      --device cuda --batch 256 --image-size 224 --steps 10 --warmup 3 --modes eager --amp fp16
    collect_bench pytorch
  fi
fi

# --- 5a. BERT-base masked LM: kiln eager and compiled against PyTorch eager and torch.compile --
# The same model, batch and optimizer on both sides (tools/bench_text.cpp, tools/bench_torch.py's
# text models): kiln's modes eager and compiled (forward and backward one graph, AdamW eager),
# PyTorch's Hugging Face BertForMaskedLM, which needs `transformers` (skipped without it).
if [ "${GPU_CHECK_SKIP_BERT:-0}" = 1 ]; then
  record bench-bert-kiln "skipped: GPU_CHECK_SKIP_BERT=1" 0
  record bench-bert-pytorch "skipped: GPU_CHECK_SKIP_BERT=1" 0
elif [ "$HAVE_GPU" != 1 ]; then
  record bench-bert-kiln "skipped: no GPU" 0
  record bench-bert-pytorch "skipped: no GPU" 0
else
  if [[ " ${TARGETS[*]} " != *" kiln-bench "* ]]; then
    record bench-bert-kiln "skipped: not in GPU_CHECK_TARGETS" 0
  elif [ ! -x "$BUILD/bin/kiln-bench" ]; then
    record bench-bert-kiln "FAIL (not built)" 0
  else
    # shellcheck disable=SC2086
    run_step bench-bert-kiln 150 - "$BUILD/bin/kiln-bench" train $BERT_BENCH_ARGS --device cuda --compile \
      --only eager,compiled
    collect_bench kiln
  fi
  if [ "${GPU_CHECK_SKIP_TORCH:-0}" = 1 ]; then
    record bench-bert-pytorch "skipped: GPU_CHECK_SKIP_TORCH=1" 0
  elif ! timeout 60 python3 -c 'import transformers' >/dev/null 2>&1; then
    record bench-bert-pytorch "skipped: transformers not installed" 0
  else
    # torch.compile's first step gets at most 90 s, less when the budget is short.
    BERT_COMPILE_BUDGET_S=$((DEADLINE - $(date +%s) - RESERVE_S - 45))
    ((BERT_COMPILE_BUDGET_S > 90)) && BERT_COMPILE_BUDGET_S=90
    ((BERT_COMPILE_BUDGET_S < 20)) && BERT_COMPILE_BUDGET_S=20
    # shellcheck disable=SC2086
    run_step bench-bert-pytorch 150 - python3 "$ROOT/tools/bench_torch.py" --device cuda \
      --compile-budget-s "$BERT_COMPILE_BUDGET_S" $BERT_BENCH_ARGS --modes eager,compiled
    collect_bench pytorch
  fi
fi

# --- 5b. The cost model's predictions beside the kiln lines (compiler/cost.h) ---------------
# Traced on this machine's CPU (no GPU needed): the same steps as the kiln lines above, NCHW
# and channels-last in TF32 at batch 128, bf16 channels-last at 256, for the GPU found here.
# docs/cuda.md, "The cost model", compares them with the measured steps. Last, since it
# measures nothing on the GPU; GPU_CHECK_SKIP_PLAN=1 leaves it out.
case "$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H100*) PLAN_GPU=h100 ;;
  *A100*) PLAN_GPU=a100 ;;
  *) PLAN_GPU=h200 ;;
esac
if [ "${GPU_CHECK_SKIP_PLAN:-0}" != 1 ] && [ "${GPU_CHECK_SKIP_BERT:-0}" != 1 ] && [ -x "$BUILD/bin/kiln-bench" ]; then
  # The BERT line's step (its --arch, --batch and --seq; plan times nothing), then GPT-2
  # small's with and without the activation epilogues (compiler/passes/epilogue.cpp).
  read -r -a BERT_WORDS <<<"$BERT_BENCH_ARGS"
  PLAN_BERT_ARGS=()
  for ((i = 0; i + 1 < ${#BERT_WORDS[@]}; i++)); do
    case "${BERT_WORDS[i]}" in --arch | --batch | --seq) PLAN_BERT_ARGS+=("${BERT_WORDS[i]}" "${BERT_WORDS[i + 1]}") ;; esac
  done
  run_step plan-bert 120 - "$BUILD/bin/kiln-bench" plan "${PLAN_BERT_ARGS[@]}" --gpu "$PLAN_GPU"
  collect_bench kiln
  for activations in always never; do
    run_step "plan-gpt2-$activations" 120 - "$BUILD/bin/kiln-bench" plan --arch gpt2-small --batch 8 --seq 128 \
      --gpu "$PLAN_GPU" --gemm-activations "$activations"
    collect_bench kiln
  done
fi
if [ "${GPU_CHECK_SKIP_PLAN:-0}" != 1 ] && [ "${GPU_CHECK_SKIP_RESNET:-0}" != 1 ] && [ -x "$BUILD/bin/kiln-bench" ]; then
  run_step plan-tf32 120 - "$BUILD/bin/kiln-bench" plan --arch resnet50 --batch 128 --image-size 224 --gpu "$PLAN_GPU"
  collect_bench kiln
  if [ "${GPU_CHECK_SKIP_AMP:-0}" != 1 ]; then
    run_step plan-bf16 120 - "$BUILD/bin/kiln-bench" plan --arch resnet50 --batch 256 --image-size 224 \
      --gpu "$PLAN_GPU" --amp bf16 --layout channels_last
    collect_bench kiln
  fi
fi

# --- 6. The CPU tests of the core layer, on this machine's compiler (GPU_CHECK_CORE_TESTS=1) ---
[ "${GPU_CHECK_CORE_TESTS:-0}" = 1 ] && run_tests tests-core kiln-tests-core 90

# --- Summary -------------------------------------------------------------------------------
TOTAL=$(($(date +%s) - START))
{
  echo "# kiln gpu-check"
  echo
  GPU_NAME=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'); GPU: ${GPU_NAME:-none}; CUDA" \
    "$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2); $(c++ --version 2>/dev/null | head -1);" \
    "${TOTAL} s in all; result: $([ $FAILED = 0 ] && echo ok || echo FAILED)"
  echo
  echo "| step | status | seconds |"
  echo "|---|---|---|"
  for i in "${!STEP_NAMES[@]}"; do
    echo "| ${STEP_NAMES[$i]} | ${STEP_STATUS[$i]} | ${STEP_SECONDS[$i]} |"
  done
  echo
  echo "## Tests"
  echo
  echo '```'
  grep -E '^(### |All tests passed|test cases:|assertions:)' "$TESTS" || echo "(no test output)"
  echo '```'
  echo
  echo "## Bench (bench.jsonl)"
  echo
  echo '```'
  if [ -s "$BENCH" ]; then cat "$BENCH"; else echo "(no measurements)"; fi
  echo '```'
} >"$SUMMARY"
say ""
tee -a "$LOG" <"$SUMMARY"
exit $FAILED
