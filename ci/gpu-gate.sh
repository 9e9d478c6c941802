#!/usr/bin/env bash
# The GPU gate: everything that needs a device, on a machine with one or more NVIDIA GPUs (sm_90)
# and the CUDA toolkit. It builds two trees, then runs:
#   build-release  the default build (no tests, no fault points): dflash-harness, cuda_propose_bench,
#                  gemm_bench. What ships and what is measured.
#   build-testing  -DDFLASH_BUILD_TESTS=ON -DDFLASH_FAULT_POINTS=ON: the GPU tests and the catch suite.
#
#   ci/gpu-gate.sh [--no-build] [--build-only] [--quick] [--batched-geometry] [--mutations [--mutation-ids "ID ..."]]
#                  [--sanitize] [--sweep KERNELS]... [--sweep-batches "1 8 32"] [--profile]
#                  [--no-propose-bench] [--no-gemm-bench] [--propose-only] [--release-only] [--out DIR]
#                  [--ab-bench "BENCH ARGS"]
# The default pass:
#   1. the GPU tests by label: `ctest -L gpu` with a resource spec written from the GPUs it sees
#      (one test per GPU at a time, so a host with N GPUs runs the suite N-wide); the CUDA vs
#      reference comparisons at Qwen3-8B in batches of 8 and 32 only with --batched-geometry;
#   2. the default build's dflash-harness holds no fault point (nm) and ignores DFLASH_FAULT and
#      DFLASH_CUDA_FAULT: its replay with them set gives the same report;
#   3. every bundled fixture replayed on the shipped path (`replay --backend both`, bf16 and fp8, graphs
#      after --warmup 0 and 1; ci/graph_replays.py checks that repeated shapes were graph replays);
#   3a. the pre-quantized FP8 checkpoints in fp8 and w8a8; the CUDA drafter's fake shards at TP = 2 and 4 on
#       every bundled fixture their geometry allows;
#   3b. every bundled fixture through the CUDA drafter as a plugin (libdflash_cuda_plugin.so, isolated)
#      and in process, bf16 and fp8: the same verdicts (ci/same_verdicts.py --verdicts);
#   4. an injected allocation and launch failure in one replay of the testing build: exit 125 and 3,
#      named in the output and the JSON report;
#   5. the observed/bound table of docs/tolerances.md (ci/tolerance_table.py);
#   6. the propose benchmark and the GEMM benchmark of the release build (docs/benchmarks.md).
# --mutations runs the catch suite instead: every planted bug of testing/fault_points.h replayed over
# every bundled fixture folder in bf16 and fp8 (testing build), judged by mutation_catch_table.
# --release-only needs and runs the release build alone: steps 2, 3, 3a, 3b and 6.
# --ab-bench "ARGS" also times the baseline's propose benchmark (ci/gpu-remote.sh stage --baseline REV)
# against the release build's with ARGS, alternating (ci/ab_bench.py): ab-bench.md and the summary.
# --sanitize runs compute-sanitizer's four tools over a subset of the GPU tests and one replay.
# Writes summary.txt and logs under --out (default $OUT, else gpu-gate-out/). Exit 0 when every step
# passed, 1 otherwise. ci/gpu-remote.sh carries the built trees to a GPU machine without the toolchain.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

build=1
build_only=0
quick=0
profile=0
sweeps=()
sweep_batches="1"
sanitize=0
gemm_bench=1
propose=1
propose_only=0
release_only=0
batched_geometry=0
mutations=0
mutation_ids=""
ab_bench_args=""
ab_bench=0
out_dir=${OUT:-$root/gpu-gate-out}
release_dir=${DFLASH_RELEASE_DIR:-build-release}
testing_dir=${DFLASH_TESTING_DIR:-build-testing}
# CUDA vs the reference at Qwen3-8B in batches of 8 and 32: the CPU reference of 32 sequences takes
# most of the time the rest of the gate takes (docs/cuda-drafter.md).
batched_geometry_tests="RealGeometry.*_Batch"
while (($#)); do
  case "$1" in
    --no-build) build=0 ;;
    --build-only) build_only=1 ;;
    --quick) quick=1 ;;
    --profile) profile=1 ;;
    --out) out_dir=$2; shift ;;
    --sweep) sweeps+=("$2"); shift ;;
    --sweep-batches) sweep_batches=$2; shift ;;
    --sanitize) sanitize=1 ;;
    --no-gemm-bench) gemm_bench=0 ;;
    --no-propose-bench) propose=0 ;;
    --propose-only) propose_only=1; gemm_bench=0 ;;
    --release-only) release_only=1 ;;
    --batched-geometry) batched_geometry=1 ;;
    --mutations) mutations=1 ;;
    --mutation-ids) mutation_ids=$2; shift ;;
    --ab-bench) ab_bench=1; ab_bench_args=$2; shift ;;
    *) echo "error: ci/gpu-gate.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

if ((build)); then
  set -e
  [ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S . -B "$release_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DDFLASH_BUILD_TESTS=OFF -DDFLASH_FAULT_POINTS=OFF >/dev/null
  cmake -S . -B "$testing_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DDFLASH_BUILD_TESTS=ON -DDFLASH_FAULT_POINTS=ON -DDFLASH_BUILD_BENCHMARKS=OFF >/dev/null
  ninja -C "$release_dir" -j "$(nproc)" dflash-harness cuda_propose_bench gemm_bench dflash_cuda_plugin
  # gpu_tests: every binary with a test labelled gpu (dflash_add_test), the catch table, the command.
  ((release_only)) || ninja -C "$testing_dir" -j "$(nproc)" gpu_tests mutation_catch_table dflash-harness
  set +e
fi
((build_only)) && exit 0

[ -x "$release_dir/tools/dflash-harness" ] && { ((release_only)) || [ -x "$testing_dir/tools/dflash-harness" ]; } ||
  { echo "error: ci/gpu-gate.sh: $release_dir and $testing_dir are not built (run without --no-build)" >&2; exit 2; }
mkdir -p "$out_dir"
summary="$out_dir/summary.txt"
tests_log="$out_dir/gpu-tests.log"
: >"$summary"
export DFLASH_REF_THREADS=${DFLASH_REF_THREADS:-$(nproc)}
export DFLASH_SOURCE_DIR="$root"
export NCCL_NVLS_ENABLE=0
status=0
note() { echo "$*" | tee -a "$summary"; }
release=$release_dir/tools/dflash-harness
testing=$testing_dir/tools/dflash-harness
fixtures=(fixtures/oracle/*/ fixtures/recorded/*/ fixtures/blind-spots/*/ fixtures/dflash2/*/ fixtures/acceptance/*/)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU ")
note "gpu-gate $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?') on $gpus GPU(s): $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
((gpus > 0)) || { note "FAIL no GPU visible (nvidia-smi -L)"; note "gpu-gate: FAIL"; exit 1; }

# gpu_ctest ARGS...: ctest over the testing build's GPU tests, one GPU per test from a resource spec
# of every visible GPU; a skipped GPU test fails the gate (the device is here).
gpu_ctest() {
  local spec="$out_dir/resources.json" start rc
  {
    echo '{"version": {"major": 1, "minor": 0}, "local": [{"gpus": ['
    for ((i = 0; i < gpus; ++i)); do echo "  {\"id\": \"$i\", \"slots\": 1}$( ((i + 1 < gpus)) && echo ,)"; done
    echo ']}]}'
  } >"$spec"
  start=$(date +%s)
  ctest --test-dir "$testing_dir" -L gpu --resource-spec-file "$spec" -j "$gpus" --timeout 900 \
    --output-on-failure -V "$@" >>"$tests_log" 2>&1
  rc=$?
  local counts
  counts=$(grep -E "tests passed, [0-9]+ tests failed out of" "$tests_log" | tail -1)
  if ((rc == 0)) && ! grep -qE "^[0-9]+: \[ +SKIPPED +\] [A-Za-z]" "$tests_log"; then
    note "PASS ctest -L gpu $* on $gpus GPU(s) ($(($(date +%s) - start)) s): $counts"
  else
    note "FAIL ctest -L gpu $* (exit $rc, $(($(date +%s) - start)) s): $counts"
    grep -E "\*\*\*Failed|\(Failed\)|SKIPPED \] [A-Za-z]|Timeout" "$tests_log" | head -20 | tee -a "$summary"
    status=1
  fi
  grep -E "^([0-9]+: )?\[(gemm|nvfp4|attention|rope|selector|oracle|geometry|planted|levers|property)\]" "$tests_log" |
    sed -E 's/^[0-9]+: //' | head -150 >>"$summary"
}

if ((mutations)); then
  reports=$(mktemp -d)
  # Each registered id with the replay options it needs (--tp N), as `mutation_catch_table --list` prints them.
  declare -A replay_options=([none]="")
  while read -r listed_id listed_options; do replay_options[$listed_id]=$listed_options; done \
    < <("$testing_dir/tests/catch/mutation_catch_table" --list)
  ids=(none)
  if [ -n "$mutation_ids" ]; then read -ra listed <<<"$mutation_ids"; ids+=("${listed[@]}"); else
    mapfile -t -O 1 ids < <("$testing_dir/tests/catch/mutation_catch_table" --list | cut -d' ' -f1); fi
  for id in "${ids[@]}"; do
    start=$(date +%s)
    codes=""
    read -ra options <<<"${replay_options[$id]:-}"
    for precision in bf16 fp8; do
      DFLASH_FAULT=$id timeout 300 "$testing" replay "${fixtures[@]}" --backend both --precision "$precision" \
        --warmup 1 "${options[@]}" --json "$reports/$id.$precision.json" >"$reports/$id.$precision.log" 2>&1
      codes+=" $precision exit $?"
    done
    # A mutation that no replay failed runs the CUDA properties (whose first failure then names it).
    if [ "$id" != none ] && [ "$codes" = " bf16 exit 0 fp8 exit 0" ]; then
      DFLASH_FAULT=$id timeout 300 "$testing_dir/tests/properties/properties_drafter_test" --gtest_filter="*Cuda*:*cuda*" \
        >"$reports/$id.property.log" 2>&1
      codes+=", properties exit $?"
      grep -m1 -E "^\[  FAILED  \]" "$reports/$id.property.log" | sed 's/^\[  FAILED  \] //' >"$reports/$id.property.txt"
    fi
    note "mutation $id:$codes ($(($(date +%s) - start)) s)"
  done
  "$testing_dir/tests/catch/mutation_catch_table" "$reports" --markdown "$out_dir/catch-table.md" >>"$summary" 2>&1 || status=1
  cat "$out_dir/catch-table.md" 2>/dev/null
  if ((status)); then for f in "$reports"/*.log; do echo "=== $(basename "$f")"; tail -n 20 "$f"; done >"$out_dir/mutation-logs.txt"; fi
  # The reports travel back, so runs split by --mutation-ids can be judged together (mutation_catch_table DIR).
  tar -cJf "$out_dir/mutation-reports.tar.xz" -C "$reports" .
  rm -rf "$reports"
  note "gpu-gate --mutations: $( ((status == 0)) && echo PASS || echo FAIL )"
  exit $status
fi

if ((batched_geometry)); then
  gpu_ctest -R "$batched_geometry_tests"
  note "gpu-gate --batched-geometry: $( ((status == 0)) && echo PASS || echo FAIL )"
  exit $status
fi

# sanitize_run TOOL LABEL COMMAND...: COMMAND under compute-sanitizer --tool TOOL; any report, a
# failed or skipped test, a filter that matches nothing, or the time limit fails the gate.
sanitize_run() {
  local tool=$1 label=$2 log="$out_dir/sanitize-$1.log" rc start
  shift 2
  start=$(date +%s)
  echo "=== $tool: $label" >>"$log"
  timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 "$@" >>"$log" 2>&1
  rc=$?
  if ((rc == 0)) && ! grep -q "SKIPPED \] [0-9]" "$log" && ! grep -q "Running 0 tests" "$log"; then
    note "PASS compute-sanitizer $tool: $label ($(($(date +%s) - start)) s)"
  else
    note "FAIL compute-sanitizer $tool: $label (exit $rc, see sanitize-$tool.log)"
    grep -E "^========= (Invalid|Race|Barrier|Uninitialized|Program hit|ERROR SUMMARY)|FAILED" "$log" | head -10 | tee -a "$summary"
    status=1
  fi
}

if ((sanitize)); then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  [ -n "$sanitizer" ] || { note "FAIL --sanitize: no compute-sanitizer on this machine"; note "gpu-gate: FAIL"; exit 1; }
  drafter_test="$testing_dir/tests/gpu/gpu_drafter_test"
  full="Variants/DrafterGpu.GraphReplayIsBitIdenticalToEager/d64_fp8:Variants/DrafterGpu.GraphReplayIsBitIdenticalToEager/d64_bf16:DrafterGpuErrors.FailedProposesLeaveEverySequenceUnchanged:DrafterGpuErrors.LaunchLeversChangeNoBit"
  short="Variants/DrafterGpu.GraphReplayIsBitIdenticalToEager/d64_fp8:DrafterGpuErrors.FailedProposesLeaveEverySequenceUnchanged"
  for tool in memcheck racecheck synccheck initcheck; do
    filter=$full
    [ "$tool" = racecheck ] || [ "$tool" = synccheck ] && filter=$short
    sanitize_run "$tool" "gpu_drafter_test $filter" "$drafter_test" --gtest_filter="$filter"
    sanitize_run "$tool" "replay tiny-gqa --backend cuda --precision fp8" "$release" replay fixtures/oracle/tiny-gqa \
      --backend cuda --precision fp8
  done
  note "gpu-gate: $( ((status == 0)) && echo PASS || echo FAIL )"
  exit $status
fi

# release_checks: the shipped command holds no fault point and ignores the test-only variables.
release_checks() {
  local symbols
  symbols=$(nm -C "$release" | grep -ciE "mutation|fault_point|injected_failure|planted|Fp8Fault|Dflash2Fault")
  if ((symbols == 0)); then note "PASS release dflash-harness: no fault-point symbols (nm -C)"; else
    note "FAIL release dflash-harness: $symbols fault-point symbols (nm -C)"; status=1; fi
  local a="$out_dir/release-plain.json" b="$out_dir/release-faults.json" rc_a rc_b
  "$release" replay fixtures/oracle/tiny-mha --backend cuda --precision fp8 --json "$a" >/dev/null 2>&1
  rc_a=$?
  DFLASH_FAULT=alloc:1 DFLASH_CUDA_FAULT=alloc:1 DFLASH_MUTATION=rope-pair-layout \
    "$release" replay fixtures/oracle/tiny-mha --backend cuda --precision fp8 --json "$b" >/dev/null 2>&1
  rc_b=$?
  if ((rc_a == 0 && rc_b == 0)) && python3 ci/same_verdicts.py "$a" "$b" >/dev/null; then
    note "PASS release dflash-harness ignores DFLASH_FAULT, DFLASH_CUDA_FAULT and DFLASH_MUTATION (exit 0 both, same verdicts)"
  else
    note "FAIL release dflash-harness with the test-only variables: exit $rc_a then $rc_b"; status=1
  fi
  rm -f "$a" "$b"
}

# fault_replay FAULT EXIT ERROR: one replay of the testing build with DFLASH_FAULT=FAULT must exit
# EXIT, print ERROR, and still write its JSON report with the fixture's error in it.
fault_replay() {
  local fault=$1 want=$2 error=$3 json="$out_dir/fault.json" rc
  rm -f "$json"
  DFLASH_FAULT="$fault" "$testing" replay fixtures/oracle/tiny-mha --backend cuda --precision fp8 --json "$json" \
    >"$out_dir/fault.log" 2>&1
  rc=$?
  if ((rc == want)) && grep -q "$error" "$out_dir/fault.log" && [ -f "$json" ] &&
     grep -q "\"exit_code\": $want" "$json" && grep -q "$error" "$json"; then
    note "PASS injected failure $fault: exit $rc, named in the output and the JSON report"
  else
    note "FAIL injected failure $fault: exit $rc (want $want, '$error' in the output and the JSON report)"
    tail -n 5 "$out_dir/fault.log" | tee -a "$summary"
    status=1
  fi
  rm -f "$json" "$out_dir/fault.log"
}

# replays: every bundled fixture on the shipped path, graphs after --warmup 0 and 1.
replays() {
  local precision warmup what
  for precision in bf16 fp8 w8a8; do
    for warmup in 0 1; do
      what="dflash-harness replay --backend both --precision $precision --warmup $warmup"
      if "$release" replay "${fixtures[@]}" --backend both --precision "$precision" --warmup "$warmup" \
           --json "$out_dir/replay.json" >>"$out_dir/replay.log" 2>&1 &&
         ci/graph_replays.py "$out_dir/replay.json" "$warmup" >"$out_dir/graph-replays.txt" 2>&1; then
        note "PASS $what"
      else
        note "FAIL $what (see replay.log)"
        status=1
      fi
      tail -n 1 "$out_dir/replay.log" | sed 's/^/  /' >>"$summary"
      sed 's/^/  /' "$out_dir/graph-replays.txt" >>"$summary"
      rm -f "$out_dir/graph-replays.txt" "$out_dir/replay.json"
    done
  done
}

# checkpoint_replays: the pre-quantized FP8 checkpoints (fixtures/fp8ckpt/) in fp8 and w8a8 (their
# static activation scales), the modes they are stored for (bf16 holds bf16 weights only).
checkpoint_replays() {
  local precision what
  for precision in fp8 w8a8; do
    what="dflash-harness replay fixtures/fp8ckpt --backend both --precision $precision --warmup 1"
    if "$release" replay fixtures/fp8ckpt/*/ --backend both --precision "$precision" --warmup 1 \
         >>"$out_dir/replay.log" 2>&1; then
      note "PASS $what"
    else
      note "FAIL $what (see replay.log)"
      status=1
    fi
    tail -n 1 "$out_dir/replay.log" | sed 's/^/  /' >>"$summary"
  done
}

# tp_replays: the CUDA drafter's fake shards at TP = 2 and 4 (docs/spec/tensor-parallel.md) on every
# bundled fixture whose geometry the TP size divides (ci/tp_fixtures.py), bf16 and fp8 with graphs
# after one eager pass, and a bf16 wire at TP = 2: against the reference emulating the same TP.
tp_replays() {
  local tp precision reduce what
  for tp in 2 4; do
    mapfile -t tp_fixtures < <(python3 ci/tp_fixtures.py "$tp" "${fixtures[@]}")
    for precision in bf16 fp8; do
      for reduce in fp32 bf16; do
        [ "$reduce" = bf16 ] && [ "$tp" != 2 ] && continue
        what="dflash-harness replay --backend both --precision $precision --tp $tp --tp-reduce $reduce (${#tp_fixtures[@]} fixtures)"
        if "$release" replay "${tp_fixtures[@]}" --backend both --precision "$precision" --warmup 1 --tp "$tp" \
             --tp-reduce "$reduce" >>"$out_dir/tp-replay.log" 2>&1; then
          note "PASS $what"
        else
          note "FAIL $what (see tp-replay.log)"
          status=1
        fi
        tail -n 1 "$out_dir/tp-replay.log" | sed 's/^/  /' >>"$summary"
      done
    done
  done
}

# plugin_replays: every bundled fixture through the CUDA drafter as a plugin (isolated, in a child
# process) and in the harness's process: the verdicts must be the same (docs/plugin.md).
plugin_replays() {
  local plugin="$release_dir/cuda/libdflash_cuda_plugin.so" a="$out_dir/in-process.json" b="$out_dir/plugin.json"
  local precision
  for precision in bf16 fp8; do
    "$release" replay "${fixtures[@]}" --backend cuda --precision "$precision" --json "$a" >>"$out_dir/plugin.log" 2>&1
    "$release" replay "${fixtures[@]}" --backend "plugin:$plugin" --precision "$precision" --json "$b" \
      >>"$out_dir/plugin.log" 2>&1
    if python3 ci/same_verdicts.py --verdicts "$a" "$b" >"$out_dir/plugin-verdicts.txt" 2>&1; then
      note "PASS CUDA plugin ($precision): the in-process backend's verdicts on every bundled fixture"
    else
      note "FAIL CUDA plugin ($precision): $(tail -n 1 "$out_dir/plugin-verdicts.txt") (see plugin.log)"
      status=1
    fi
    sed 's/^/  /' "$out_dir/plugin-verdicts.txt" >>"$summary"
    rm -f "$a" "$b" "$out_dir/plugin-verdicts.txt"
  done
}

# propose_bench NAME ARGS...: the release build's propose benchmark into NAME.md; its table goes to
# the summary.
propose_bench() {
  local name=$1
  shift
  local args=("$@" --markdown "$out_dir/$name.md")
  ((quick)) && args+=(--precisions fp8)
  if "$release_dir/bench/cuda_propose_bench" "${args[@]}" >"$out_dir/$name.log" 2>&1; then
    note "PASS cuda_propose_bench $*"
  else
    note "FAIL cuda_propose_bench $* (see $name.log)"
    status=1
  fi
  sed -n '/^| precision/,$p' "$out_dir/$name.log" >>"$summary"
}

if ((propose_only == 0)); then
  if ((release_only == 0)); then
    : >"$tests_log"
    filter=(-E "$batched_geometry_tests")
    ((quick)) && filter=(-E "RealGeometry")
    gpu_ctest "${filter[@]}"
  fi
  release_checks
  replays
  checkpoint_replays
  tp_replays
  plugin_replays
  if ((release_only == 0)); then
    fault_replay alloc:1 125 cudaErrorMemoryAllocation
    fault_replay launch:3 3 cudaErrorLaunchFailure  # an internal error: exit 3
    if python3 ci/tolerance_table.py "$tests_log" >"$out_dir/tolerance-table.md" 2>&1; then
      note "PASS tolerance table (tolerance-table.md)"
    else
      note "FAIL tolerance table: $(tail -n 1 "$out_dir/tolerance-table.md")"
      status=1
    fi
  fi
fi
if ((propose)); then
  propose_bench benchmarks --contexts 1024
  propose_bench benchmarks-dflash2 --geometry qwen3.8-27b-dflash2 --contexts 1024 --batches 1 8 32
fi
if ((gemm_bench)); then
  gemm=$release_dir/cuda/gemm_bench
  if { "$gemm" && echo && "$gemm" --m 16 --format e4m3 --hot && echo && "$gemm" --format nvfp4 --m 32 128; } \
       >"$out_dir/gemm-bench.log" 2>&1; then
    note "PASS gemm_bench (gemm-bench.log)"
    grep -E "^\| lm_head \| .* \| nvfp4 \||GEMM peak|^CUTLASS candidate|\(cutlass\)" "$out_dir/gemm-bench.log" >>"$summary"
  else
    note "FAIL gemm_bench (see gemm-bench.log)"
    status=1
  fi
fi
if ((ab_bench)); then
  baseline_bench=build-baseline/release/bench/cuda_propose_bench
  # shellcheck disable=SC2086 # the benchmark's arguments are separate words
  if [ ! -x "$baseline_bench" ]; then
    note "FAIL --ab-bench: no $baseline_bench (ci/gpu-remote.sh stage --baseline REV builds it)"; status=1
  elif python3 ci/ab_bench.py "$baseline_bench" "$release_dir/bench/cuda_propose_bench" --out "$out_dir/ab-bench.md" \
       -- $ab_bench_args >"$out_dir/ab-bench.log" 2>&1; then
    note "PASS ab_bench $ab_bench_args (ab-bench.md)"
    sed -n '/^| precision/,$p' "$out_dir/ab-bench.md" >>"$summary"
  else
    note "FAIL ab_bench $ab_bench_args (see ab-bench.log)"; tail -n 5 "$out_dir/ab-bench.log" | tee -a "$summary"; status=1
  fi
fi
for v in "${sweeps[@]}"; do
  # shellcheck disable=SC2086 # the batch sizes are separate words
  if DFLASH_CUDA_KERNELS="$v" "$release_dir/bench/cuda_propose_bench" --precisions fp8 --batches $sweep_batches \
       --contexts 1024 4096 >"$out_dir/sweep-one.log" 2>&1; then
    grep -E "^  fp8 +batch" "$out_dir/sweep-one.log" | sed "s|^|[$v] |" | tee -a "$out_dir/sweep.txt" >>"$summary"
  else
    note "FAIL sweep [$v]:"; tail -n 5 "$out_dir/sweep-one.log" | tee -a "$summary"; status=1
  fi
  rm -f "$out_dir/sweep-one.log"
done
if ((profile)); then
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -n "$ncu_bin" ] && "$ncu_bin" --profile-from-start off --clock-control none --cache-control none --csv \
       --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
       "$release_dir/bench/cuda_propose_bench" --profile-one --precisions fp8 --replays 100 >"$out_dir/ncu.csv" 2>"$out_dir/ncu.err"; then
    note "PASS profile: ncu.csv ($(grep -c gpu__time_duration "$out_dir/ncu.csv") kernels)"
  else
    note "FAIL profile (no ncu, or see ncu.err)"; status=1
  fi
fi
note "gpu-gate: $( ((status == 0)) && echo PASS || echo FAIL )"
exit $status
