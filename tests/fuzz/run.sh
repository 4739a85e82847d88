#!/usr/bin/env bash
# Runs kiln's libFuzzer targets one after another, each for SECONDS:
#   tests/fuzz/run.sh FUZZ_BUILD_DIR SECONDS [TARGET...]   (default: every target)
# FUZZ_BUILD_DIR is where the targets were built (<build>/tests/fuzz/targets). Seeds come
# from tests/fuzz/corpus/<target> (the IR parser's: the tests' tests/compiler/ir); new inputs go
# to FUZZ_BUILD_DIR/corpus/<target>, crashing ones to FUZZ_BUILD_DIR/artifacts/. Exits
# non-zero when a target crashes, leaks, or times out on an input.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 FUZZ_BUILD_DIR SECONDS [TARGET...]" >&2
  exit 2
fi
build=$1 seconds=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(json safetensors ir idx jpeg wordpiece wordnet)

status=0
for target in "${targets[@]}"; do
  binary=$build/kiln-fuzz-$target
  if [ ! -x "$binary" ]; then
    echo "kiln: $binary is missing: build kiln with a clang++ that links -fsanitize=fuzzer" >&2
    exit 1
  fi
  seeds=()
  [ -d "$here/corpus/$target" ] && seeds+=("$here/corpus/$target")
  [ "$target" = ir ] && seeds+=("$here/../compiler/ir")
  mkdir -p "$build/corpus/$target" "$build/artifacts"
  echo "kiln: fuzzing $target for $seconds s"
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb: one that needs 2 GB is a
  # missing size bound. libFuzzer prints its statistics at the end.
  if ! "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$build/artifacts/$target-" "$build/corpus/$target" "${seeds[@]}"; then
    echo "kiln: fuzz target $target failed; the input is in $build/artifacts/" >&2
    status=1
  fi
done
exit $status
