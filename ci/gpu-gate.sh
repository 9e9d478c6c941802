#!/usr/bin/env bash
# The GPU gate: everything that needs the device, in ONE call on the GPU machine.
#
# Here (a machine with nvcc, no GPU needed):
#   ci/gpu-gate.sh [--build-dir DIR]
#     configures and builds the CUDA drafter, its GPU tests and the benchmark into DIR
#     (default build-cuda), and stages the binaries plus libhwy.so.1 and libsleef.so.3 in .gpu/ (git-ignored,
#     carried to the device; it must stay under 64 MiB).
# On the device machine (through the `run` tool, from the repository root, carry [".gpu"]):
#   ci/gpu-gate.sh --remote [--out DIR] [--quick] [--variant KERNELS]... [--sweep KERNELS]...
#                  [--sweep-without CLASSES]...
#     runs the GPU tests (fp8 quantization bytes, every GEMM kernel at every m, the NVFP4 lm_head
#     GEMM against its w4a16 emulation, attention at head_dim 64/128/256 and generic, the q/k norm
#     + RoPE kernels at positions up to 128k, graph replay vs eager, the drafter's invariants, CUDA vs
#     the CPU reference on every oracle fixture in bf16 and fp8, and the real geometries of
#     docs/spec/drafter.md §8 and Qwen3.8-27B-DFlash2 (one propose), on compare/'s tolerance
#     model: the same-precision pairs, the fp8 envelope against the bf16 reference, and at
#     Qwen3-8B the envelope's planted-bug negative controls,
#     with observed/bound ratios in gpu-tests.log), the replay of the oracle and capture fixtures
#     through dflash-harness when it was staged, the propose benchmark (batch 1-64, HBM floor and
#     roofline; and Qwen3.8-27B-DFlash2 at batch 1, 8, 32, context 1024) and the GEMM kernel
#     benchmark (gemm_bench, with the CUTLASS candidate's rows and its test
#     gpu_gemm_cutlass_mixed_test); writes logs, benchmarks.md, benchmarks-dflash2.md and
#     summary.txt under DIR (default $OUT).
#     --quick skips the real-geometry comparisons and the bf16 benchmark. Each --variant (a
#     DFLASH_CUDA_KERNELS value, e.g. "gemm=cublaslt,ctx_gemm=auto") runs the drafter
#     tests, the CUDA properties, the replay and the fp8 benchmark again with those kernels, so
#     two kernel choices are compared in the same run. The CUDA properties (RapidCheck, properties
#     1-8 and 10 on the CUDA drafter, graphs on and off) run in every pass.
#     --profile adds an ncu run of one timed fp8 forward (batch 1, context 1024; the bench's
#     --profile-one) with each kernel's time and DRAM bytes, written to ncu.csv (ncu-dflash2.csv for
#     the Qwen3.8-27B-DFlash2 geometry), and a detailed ncu report of one GEMM launch per
#     block-forward shape (ncu-gemm.txt).
#     --sweep KERNELS (repeatable) times only the fp8 propose benchmark at batch 1 (contexts 1024
#     and 4096) under each DFLASH_CUDA_KERNELS value, one line each in sweep.txt, to choose between
#     kernel levers in one call (--sweep-batches "1 8 32" times those batch sizes instead of 1);
#     --sweep-without CLASSES (repeatable) does the same for the block forward without those kernel
#     classes (cuda_propose_bench --without, e.g. "o+down": what they cost inside the graph);
#     --bench-only skips every test and the default benchmark (for such
#     exploration: its numbers are not a gate result), keeping the GEMM benchmark (cold and, with
#     --hot, L2-resident weights) and the sweeps; --no-gemm-bench leaves the GEMM benchmark out,
#     --no-propose-bench the propose benchmark.
#     Every pass also injects a device-allocation failure and a kernel-launch failure into one
#     replay (DFLASH_CUDA_FAULT, cuda/cuda_check.h): each must exit 125 or 2 naming the failed
#     call, with the JSON report written.
#     --propose-only runs only the propose benchmark (the tests and the benchmarks together exceed
#     a call's 600 s: --no-propose-bench in one call, --propose-only in the next).
#     --batched-geometry runs only what the default pass leaves out for time: CUDA vs the CPU
#     reference at Qwen3-8B in batches of 8 and 32 (128 and 512 block rows: the library GEMMs of
#     gemm_m64=library at the real shapes), bf16 and fp8, in one call (times: docs/cuda-drafter.md);
#     --batched-geometry=8 (both modes), =32-bf16 and =32-fp8 run one test each.
#     --sanitize runs compute-sanitizer instead of everything else (its own call: the tools slow
#     the kernels tenfold and more): memcheck, racecheck, synccheck and initcheck, each over a
#     subset of gpu_drafter_test (graph replay against eager in fp8 at head_dim 64 and 16, the
#     failed-propose paths, the layer chain; racecheck and synccheck the graph replay at head_dim
#     64 and the layer chain only) and over one replay of fixtures/oracle/tiny-gqa on the CUDA
#     drafter in fp8; any report fails the gate. --sanitize-filter FILTER replaces the gtest filter.
#     Exit 0 when every step passed, 1 otherwise.
#
# The catch suite of planted kernel bugs (cuda/mutations.h, docs/catch-rate.md), its own build and call:
#   ci/gpu-gate.sh --mutations [--build-dir DIR]
#     here: configures DIR (default build-mutations) with -DDFLASH_MUTATIONS=ON and stages only what the
#     suite runs (dflash-harness, properties_drafter_test, mutation_catch_table, libhwy, libsleef) as
#     .gpu-mutations/bundle.tar.xz (git-ignored, carried to the device).
#   ci/gpu-gate.sh --remote --mutations [--out DIR] [--mutation-ids "ID ..."]
#     on the device machine: for the unmutated build (id none) and every mutation (or those listed),
#     replays every fixture the gate replays (fixtures/oracle, fixtures/recorded, fixtures/blind-spots)
#     with `dflash-harness replay --backend both --warmup 1` in bf16 and in fp8, DFLASH_MUTATION=<id>;
#     a mutation no replay fails also runs the CUDA properties (properties_drafter_test). Then
#     mutation_catch_table judges every mutation against its registry row and writes the catch table
#     (catch-table.md, the format of docs/catch-rate.md) and summary.txt; the control must have no
#     failure. Exit 0 when every mutation is caught as declared and the control is clean.
# Example:
#   ci/gpu-gate.sh && run(command="ci/gpu-gate.sh --remote --no-propose-bench", carry=[".gpu"], timeout_s=600)
#   then run(command="ci/gpu-gate.sh --remote --batched-geometry", carry=[".gpu"], timeout_s=600)
#   and run(command="ci/gpu-gate.sh --remote --propose-only", carry=[".gpu"], timeout_s=600)
#   then run(command="ci/gpu-gate.sh --remote --sanitize", carry=[".gpu"], timeout_s=600)
#   ci/gpu-gate.sh --mutations && run(command="ci/gpu-gate.sh --remote --mutations", carry=[".gpu-mutations"], timeout_s=600)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

remote=0
quick=0
profile=0
variants=()
sweeps=()
sweeps_without=()
sweep_batches="1"
bench_only=0
sanitize=0
sanitize_filter=""
gemm_bench=1
propose=1
batched_geometry=0
# CUDA vs the reference at Qwen3-8B in batches of 8 and 32 (the library GEMMs at the real shapes):
# the CPU reference of 32 sequences takes too long for the default call (docs/cuda-drafter.md).
batched_geometry_filter="CudaVsReferenceRealGeometry.*_Batch*"
propose_only=0
mutations=0
mutation_ids=""
build_dir=""
out_dir=${OUT:-}
while (($#)); do
  case "$1" in
    --remote) remote=1 ;;
    --quick) quick=1 ;;
    --profile) profile=1 ;;
    --build-dir) build_dir=$2; shift ;;
    --out) out_dir=$2; shift ;;
    --variant) variants+=("$2"); shift ;;
    --sweep) sweeps+=("$2"); shift ;;
    --sweep-without) sweeps_without+=("$2"); shift ;;
    --sweep-batches) sweep_batches=$2; shift ;;
    --bench-only) bench_only=1 ;;
    --sanitize) sanitize=1 ;;
    --sanitize-filter) sanitize_filter=$2; shift ;;
    --no-gemm-bench) gemm_bench=0 ;;
    --no-propose-bench) propose=0 ;;
    --batched-geometry) batched_geometry=1 ;;
    --batched-geometry=8) batched_geometry=1; batched_geometry_filter="CudaVsReferenceRealGeometry.Qwen3_8B_Batch8" ;;
    --batched-geometry=32-bf16) batched_geometry=1; batched_geometry_filter="CudaVsReferenceRealGeometry.Qwen3_8B_Batch32_Bf16" ;;
    --batched-geometry=32-fp8) batched_geometry=1; batched_geometry_filter="CudaVsReferenceRealGeometry.Qwen3_8B_Batch32_Fp8" ;;
    --propose-only) propose_only=1; gemm_bench=0 ;;
    --mutations) mutations=1 ;;
    --mutation-ids) mutation_ids=$2; shift ;;
    *) echo "ci/gpu-gate.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

if [ -z "$build_dir" ]; then
  build_dir=build-cuda
  ((mutations)) && build_dir=build-mutations
fi

gpu_tests=(gpu_fp8_quant_test gpu_gemm_test gpu_gemm_nvfp4_test gpu_gemm_cutlass_mixed_test gpu_attention_test gpu_rope_test gpu_selector_test gpu_fault_test gpu_drafter_test gpu_vs_reference_test gpu_kv_readback_test)
property_tests=(properties_drafter_test)

if ((remote == 0 && mutations)); then
  set -e
  [ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DDFLASH_MUTATIONS=ON \
    -DDFLASH_BUILD_BENCHMARKS=OFF >/dev/null
  ninja -C "$build_dir" -j "$(nproc)" dflash-harness properties_drafter_test mutation_catch_table
  rm -rf .gpu-mutations && mkdir -p .gpu-mutations
  cp "$build_dir/tools/dflash-harness" "$build_dir/tests/properties/properties_drafter_test" \
    "$build_dir/tests/catch/mutation_catch_table" .gpu-mutations/
  cp -L /usr/lib/x86_64-linux-gnu/libhwy.so.1 /usr/lib/x86_64-linux-gnu/libsleef.so.3 .gpu-mutations/
  strip --strip-unneeded .gpu-mutations/* 2>/dev/null || true
  staged=$(ls .gpu-mutations | tr '\n' ' ')
  tar -cf - -C .gpu-mutations . | xz -9 -T1 >.gpu-mutations-bundle.txz && rm -rf .gpu-mutations &&
    mkdir .gpu-mutations && mv .gpu-mutations-bundle.txz .gpu-mutations/bundle.tar.xz
  size=$(du -sm .gpu-mutations | cut -f1)
  echo "ci/gpu-gate.sh: staged .gpu-mutations/bundle.tar.xz (${size} MiB): $staged"
  # Carried with .gpu/ (or alone), the total must stay under the 64 MiB a call may carry.
  if ((size >= 30)); then echo "ci/gpu-gate.sh: .gpu-mutations/ is too large to carry" >&2; exit 1; fi
  exit 0
fi

if ((remote == 0)); then
  set -e
  [ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
  targets=("${gpu_tests[@]}" "${property_tests[@]}" cuda_propose_bench gemm_bench)
  grep -q "dflash-harness" "$build_dir/build.ninja" 2>/dev/null && targets+=(dflash-harness)
  ninja -C "$build_dir" -j "$(nproc)" "${targets[@]}"
  rm -rf .gpu && mkdir -p .gpu
  for t in "${gpu_tests[@]}"; do cp "$build_dir/tests/gpu/$t" .gpu/; done
  for t in "${property_tests[@]}"; do cp "$build_dir/tests/properties/$t" .gpu/; done
  cp "$build_dir/bench/cuda_propose_bench" "$build_dir/bench/gemm_bench" .gpu/
  [ -f "$build_dir/tools/dflash-harness" ] && cp "$build_dir/tools/dflash-harness" .gpu/
  cp -L /usr/lib/x86_64-linux-gnu/libhwy.so.1 /usr/lib/x86_64-linux-gnu/libsleef.so.3 .gpu/
  strip --strip-unneeded .gpu/* 2>/dev/null || true
  # Every binary holds the CUDA library's kernels (~9 MB each): carried as one xz bundle whose
  # 64 MiB window (-9) spans the binaries, so the repeated kernels cost once (5.6 MB for the 17
  # files against 28 MB with -6's 8 MiB window), unpacked on the device.
  staged=$(ls .gpu | tr '\n' ' ')
  tar -cf - -C .gpu . | xz -9 -T1 >.gpu-bundle.txz && rm -rf .gpu && mkdir .gpu &&
    mv .gpu-bundle.txz .gpu/bundle.tar.xz
  size=$(du -sm .gpu | cut -f1)
  echo "ci/gpu-gate.sh: staged .gpu/bundle.tar.xz (${size} MiB): $staged"
  if ((size >= 60)); then echo "ci/gpu-gate.sh: .gpu/ is too large to carry" >&2; exit 1; fi
  exit 0
fi

for staged_dir in .gpu .gpu-mutations; do
  if [ -f "$staged_dir/bundle.tar.xz" ]; then
    tar -xJf "$staged_dir/bundle.tar.xz" -C "$staged_dir" && rm -f "$staged_dir/bundle.tar.xz" ||
      { echo "ci/gpu-gate.sh: cannot unpack $staged_dir/bundle.tar.xz" >&2; exit 2; }
  fi
done

# --- on the device machine ---
[ -n "$out_dir" ] || { echo "ci/gpu-gate.sh --remote: no output folder (--out or \$OUT)" >&2; exit 2; }
mkdir -p "$out_dir"
summary="$out_dir/summary.txt"
tests_log="$out_dir/gpu-tests.log"
: >"$summary"
: >"$tests_log"
export DFLASH_REF_THREADS=${DFLASH_REF_THREADS:-$(nproc)}
# The staged binaries need the CUDA runtime and cuBLAS(Lt) 13 of the machine's toolkit.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
if ! ldd .gpu/cuda_propose_bench 2>/dev/null | grep -q "libcublasLt.so.13 => /"; then
  lt=$(find /usr/local /opt -name 'libcublasLt.so.13' 2>/dev/null | head -1)
  [ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):$LD_LIBRARY_PATH"
fi
export DFLASH_SOURCE_DIR="$root"
status=0
note() { echo "$*" | tee -a "$summary"; }

note "gpu-gate $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"

# run_test LABEL BINARY FILTER: one gtest binary; a skipped test fails the gate (the device is here).
run_test() {
  local label=$1 t=$2 filter=$3
  [ -x ".gpu/$t" ] || { note "FAIL $label$t: not staged"; status=1; return; }
  local start rc counts
  start=$(date +%s)
  ".gpu/$t" --gtest_filter="$filter" >"$out_dir/$t.out" 2>&1
  rc=$?
  { echo "=== $label$t ($filter)"; cat "$out_dir/$t.out"; } >>"$tests_log"
  counts=$(grep -E "^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test" "$out_dir/$t.out" | tr '\n' ' ')
  if ((rc == 0)) && ! grep -q "SKIPPED \] [0-9]" "$out_dir/$t.out"; then
    note "PASS $label$t ($(($(date +%s) - start)) s): $counts"
  else
    note "FAIL $label$t (exit $rc, $(($(date +%s) - start)) s): $counts"
    grep -E "^\[  FAILED  \]|Failure|error|reproduce" "$out_dir/$t.out" | head -20 | tee -a "$summary"
    status=1
  fi
  grep -E "^\[(gemm|nvfp4|attention|rope|selector|oracle|geometry|planted|levers|property)\]" "$out_dir/$t.out" | head -120 >>"$summary"
  rm -f "$out_dir/$t.out"
}

# run_pass LABEL: the drafter-level checks under the current DFLASH_CUDA_KERNELS.
run_pass() {
  local label=$1 t filter
  for t in gpu_drafter_test gpu_vs_reference_test gpu_kv_readback_test; do
    filter="*"
    # The batched real-geometry comparisons take a call of their own (--batched-geometry).
    [ "$t" = gpu_vs_reference_test ] && filter="-$batched_geometry_filter"
    ((quick)) && [ "$t" = gpu_vs_reference_test ] && filter="-CudaVsReferenceRealGeometry.*"
    run_test "$label" "$t" "$filter"
  done
  # Only the CUDA instances: the reference ones run in CI on every commit.
  run_test "$label" properties_drafter_test "*Cuda*:*cuda*"
  if [ -x .gpu/dflash-harness ]; then
    # The production path: graphs captured after --warmup eager passes and replayed; ci/graph_replays.py
    # checks from the JSON that every propose of a repeated shape past the warmup was a graph replay.
    for precision in bf16 fp8; do
      for warmup in 0 1; do
        local what="${label}dflash-harness replay --backend both --precision $precision --warmup $warmup"
        if .gpu/dflash-harness replay fixtures/oracle/*/ fixtures/recorded/*/ fixtures/blind-spots/*/ fixtures/dflash2/*/ --backend both --precision "$precision" --warmup "$warmup" \
             --json "$out_dir/replay.json" >>"$out_dir/replay.log" 2>&1 &&
           ci/graph_replays.py "$out_dir/replay.json" "$warmup" >"$out_dir/graph-replays.txt" 2>&1; then
          note "PASS $what"
        else
          note "FAIL $what (see replay.log)"
          status=1
        fi
        sed 's/^/  /' "$out_dir/graph-replays.txt" 2>/dev/null | tee -a "$out_dir/replay.log" >>"$summary"
        rm -f "$out_dir/graph-replays.txt"
        rm -f "$out_dir/replay.json"
      done
    done
    fault_replay "$label" alloc:1 125 cudaErrorMemoryAllocation
    fault_replay "$label" launch:3 3 cudaErrorLaunchFailure  # an internal error: exit 3
  fi
}

# fault_replay LABEL FAULT EXIT ERROR: one replay on the CUDA drafter with DFLASH_CUDA_FAULT=FAULT
# must exit EXIT, print ERROR, and still write its JSON report with the fixture's error in it.
fault_replay() {
  local label=$1 fault=$2 want=$3 error=$4 json="$out_dir/fault.json" rc
  rm -f "$json"
  DFLASH_CUDA_FAULT="$fault" .gpu/dflash-harness replay fixtures/oracle/tiny-mha --backend cuda --precision fp8 \
    --json "$json" >"$out_dir/fault.log" 2>&1
  rc=$?
  if ((rc == want)) && grep -q "$error" "$out_dir/fault.log" && [ -f "$json" ] &&
     grep -q "\"exit_code\": $want" "$json" && grep -q "$error" "$json"; then
    note "PASS ${label}fault $fault: exit $rc, named in the output and the JSON report"
  else
    note "FAIL ${label}fault $fault: exit $rc (want $want, '$error' in the output and the JSON report)"
    tail -n 5 "$out_dir/fault.log" | tee -a "$summary"
    status=1
  fi
  rm -f "$json" "$out_dir/fault.log"
}

# sanitize_run TOOL LABEL COMMAND...: COMMAND under compute-sanitizer --tool TOOL; any report, a
# failed test, a skipped test or the time limit fails the gate.
sanitize_run() {
  local tool=$1 label=$2 log rc start
  shift 2
  log="$out_dir/sanitize-$tool.log"
  start=$(date +%s)
  echo "=== $tool: $label" >>"$log"
  timeout 240 "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 20 "$@" >>"$log" 2>&1
  rc=$?
  # A filter that matches no test checks nothing: that fails too.
  if ((rc == 0)) && ! grep -q "SKIPPED \] [0-9]" "$log" && ! grep -q "Running 0 tests" "$log"; then
    note "PASS compute-sanitizer $tool: $label ($(($(date +%s) - start)) s)"
  else
    note "FAIL compute-sanitizer $tool: $label (exit $rc$( ((rc == 124)) && echo ': timed out'), see sanitize-$tool.log)"
    grep -E "^========= (Invalid|Race|Barrier|Uninitialized|Program hit|ERROR SUMMARY)|FAILED" "$log" | head -10 | tee -a "$summary"
    status=1
  fi
}

if ((mutations)); then
  m=.gpu-mutations
  for t in dflash-harness properties_drafter_test mutation_catch_table; do
    [ -x "$m/$t" ] || { note "FAIL --mutations: $m/$t not staged (ci/gpu-gate.sh --mutations here first)"; note "gpu-gate: FAIL"; exit 1; }
  done
  # The reports stay on the device (a few files come back): only the table and the summary return.
  reports=$(mktemp -d)
  fixtures=(fixtures/oracle/*/ fixtures/recorded/*/ fixtures/blind-spots/*/)  # those run_pass replays
  ids=(none)
  if [ -n "$mutation_ids" ]; then read -ra listed <<<"$mutation_ids"; ids+=("${listed[@]}"); else mapfile -t -O 1 ids < <("$m/mutation_catch_table" --list); fi
  for id in "${ids[@]}"; do
    start=$(date +%s)
    codes=""
    for precision in bf16 fp8; do
      DFLASH_MUTATION=$id timeout 240 "$m/dflash-harness" replay "${fixtures[@]}" --backend both --precision "$precision" \
        --warmup 1 --json "$reports/$id.$precision.json" >"$reports/$id.$precision.log" 2>&1
      codes+=" $precision exit $?"
    done
    # Only a mutation that no replay failed runs the properties (whose first failure then names it).
    if [ "$id" != none ] && [ "$codes" = " bf16 exit 0 fp8 exit 0" ]; then
      DFLASH_MUTATION=$id timeout 240 "$m/properties_drafter_test" --gtest_filter="*Cuda*:*cuda*" >"$reports/$id.property.log" 2>&1
      codes+=", properties exit $?"
      grep -m1 -E "^\[  FAILED  \]" "$reports/$id.property.log" | sed 's/^\[  FAILED  \] //' >"$reports/$id.property.txt"
    fi
    note "mutation $id:$codes ($(($(date +%s) - start)) s)"
  done
  if [ "${#ids[@]}" -gt 1 ] && [ -n "$mutation_ids" ]; then
    note "--mutation-ids: only ${ids[*]} ran; the table below marks the others as not replayed"
  fi
  "$m/mutation_catch_table" "$reports" --markdown "$out_dir/catch-table.md" >>"$summary" 2>&1
  rc=$?
  cat "$out_dir/catch-table.md" 2>/dev/null
  ((rc == 0)) || status=1
  # The control's and the misses' logs, when something failed, in one file.
  if ((status)); then
    for f in "$reports"/*.log; do echo "=== $(basename "$f")"; tail -n 20 "$f"; done >"$out_dir/mutation-logs.txt"
  fi
  rm -rf "$reports"
  note "gpu-gate --mutations: $( ((status == 0)) && echo PASS || echo FAIL )"
  exit $status
fi

if ((batched_geometry)); then
  run_test "" gpu_vs_reference_test "$batched_geometry_filter"
  note "gpu-gate --batched-geometry: $( ((status == 0)) && echo PASS || echo FAIL )"
  exit $status
fi

if ((sanitize)); then
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$sanitizer" ]; then
    note "FAIL --sanitize: no compute-sanitizer on this machine"
    note "gpu-gate: FAIL"
    exit 1
  fi
  note "compute-sanitizer: $("$sanitizer" --version | tail -1)"
  full_filter=${sanitize_filter:-"Variants/DrafterGpu.GraphReplayIsBitIdenticalToEager/d64_fp8:Variants/DrafterGpu.GraphReplayIsBitIdenticalToEager/d64_bf16:DrafterGpuErrors.FailedProposesLeaveEverySequenceUnchanged:DrafterGpuErrors.LaunchLeversChangeNoBit"}
  # racecheck runs every kernel many times slower: the lever sweep is left to the other tools.
  short_filter=${sanitize_filter:-"Variants/DrafterGpu.GraphReplayIsBitIdenticalToEager/d64_fp8:DrafterGpuErrors.FailedProposesLeaveEverySequenceUnchanged"}
  for tool in memcheck racecheck synccheck initcheck; do
    filter=$full_filter
    [ "$tool" = racecheck ] || [ "$tool" = synccheck ] && filter=$short_filter
    sanitize_run "$tool" "gpu_drafter_test $filter" .gpu/gpu_drafter_test --gtest_filter="$filter"
    [ -x .gpu/dflash-harness ] &&
      sanitize_run "$tool" "replay tiny-gqa --backend cuda --precision fp8" \
        .gpu/dflash-harness replay fixtures/oracle/tiny-gqa --backend cuda --precision fp8
  done
  # The logs come back only when something failed (at most 8 files return from the device).
  grep -q "FAIL compute-sanitizer" "$summary" || rm -f "$out_dir"/sanitize-*.log
  note "gpu-gate: $( ((status == 0)) && echo PASS || echo FAIL )"
  exit $status
fi

if ((bench_only == 0)); then
  if ((propose_only)); then
    note "--propose-only: the tests ran in another call; the propose benchmark alone"
  else
    for t in gpu_fp8_quant_test gpu_gemm_test gpu_gemm_nvfp4_test gpu_gemm_cutlass_mixed_test gpu_attention_test gpu_rope_test gpu_selector_test gpu_fault_test; do run_test "" "$t" "*"; done
    run_pass ""
    # The GPU observed/bound table of docs/tolerances.md, from the summary lines of the tests above.
    if python3 ci/tolerance_table.py "$tests_log" >"$out_dir/tolerance-table.md" 2>&1; then
      note "PASS tolerance table (tolerance-table.md)"
    else
      note "FAIL tolerance table: $(tail -n 1 "$out_dir/tolerance-table.md")"
      status=1
    fi
  fi

  # propose_bench NAME ARGS...: the propose benchmark into NAME.log and NAME.md; its whole table
  # (every batch and context, HBM floor and roofline) and the bar lines go to the summary.
  propose_bench() {
    local name=$1
    shift
    local args=("$@" --markdown "$out_dir/$name.md")
    ((quick)) && args+=(--precisions fp8)
    local ok=1
    .gpu/cuda_propose_bench "${args[@]}" >"$out_dir/$name.log" 2>&1 || ok=0
    if ((ok)); then note "PASS cuda_propose_bench $*"; else note "FAIL cuda_propose_bench $* (see $name.log)"; status=1; fi
    sed -n '/^| precision/,$p' "$out_dir/$name.log" >>"$summary"
    # On success its table is in NAME.md and the summary (at most 8 files come back).
    if ((ok)); then rm -f "$out_dir/$name.log"; fi
  }
  # Context 1024 only (every bar is there): the five batch sizes of both precisions and the NVFP4
  # head rows fit the call's time limit beside the real-geometry comparisons.
  if ((propose)); then
    propose_bench benchmarks --contexts 1024
    # The DFlash2 geometry at context 1024, batch 1, 8 and 32, its own table.
    propose_bench benchmarks-dflash2 --geometry qwen3.8-27b-dflash2 --contexts 1024 --batches 1 8 32
  else
    note "--no-propose-bench: the propose benchmark was not run"
  fi
else
  note "--bench-only: no tests ran; the numbers below are exploration, not a gate result"
fi
# The GEMM kernel alone: every variant with cold weights, E4M3 with L2-resident ones (--hot).
gemm_benches() {
  .gpu/gemm_bench || return 1
  echo; echo "--hot: the same weights every launch (L2-resident when they fit)"
  .gpu/gemm_bench --m 16 --format e4m3 --hot || return 1
  echo; echo "the NVFP4 lm_head at the drafter's row counts (batch 2 and 8 at width 16; 1 and 4 above)"
  .gpu/gemm_bench --format nvfp4 --m 32 128 || return 1
}
if ((gemm_bench == 0)); then
  note "--no-gemm-bench: the GEMM kernel benchmark was not run"
elif gemm_benches >"$out_dir/gemm-bench.log" 2>&1; then
  note "PASS gemm_bench (gemm-bench.log)"
  grep -E "^\| lm_head \| .* \| nvfp4 \||GEMM peak|^CUTLASS candidate|\(cutlass\)" "$out_dir/gemm-bench.log" >>"$summary"
else
  note "FAIL gemm_bench (see gemm-bench.log)"
  status=1
fi

# sweep_one LABEL COMMAND...: the fp8 propose benchmark (COMMAND and its arguments) at the sweep's
# batch sizes, one line per batch in sweep.txt and the summary, each prefixed with [LABEL].
sweep_one() {
  local label=$1
  shift
  # shellcheck disable=SC2086 # the batch sizes are separate words
  if "$@" --precisions fp8 --batches $sweep_batches --contexts 1024 4096 >"$out_dir/sweep-one.log" 2>&1; then
    grep -E "^  fp8 +batch" "$out_dir/sweep-one.log" | sed "s|^|[$label] |" | tee -a "$out_dir/sweep.txt" >>"$summary"
  else
    note "FAIL sweep [$label] cuda_propose_bench:"
    tail -n 5 "$out_dir/sweep-one.log" | tee -a "$summary"
    status=1
  fi
  rm -f "$out_dir/sweep-one.log"
}
for v in "${sweeps[@]}"; do sweep_one "$v" env DFLASH_CUDA_KERNELS="$v" .gpu/cuda_propose_bench; done
for c in "${sweeps_without[@]}"; do sweep_one "without $c" .gpu/cuda_propose_bench --without "$c"; done

if ((profile)); then
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  if [ -z "$ncu_bin" ]; then
    note "FAIL profile: no ncu on this machine"
    status=1
  elif "$ncu_bin" --profile-from-start off --clock-control none --cache-control none --csv \
         --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
         .gpu/cuda_propose_bench --profile-one --precisions fp8 --replays 100 >"$out_dir/ncu.csv" 2>"$out_dir/ncu.err"; then
    note "PASS profile: ncu.csv ($(grep -c gpu__time_duration "$out_dir/ncu.csv") kernels)"
    rm -f "$out_dir/ncu.err"
    # The same for one DFlash2 forward (Qwen3.8-27B, batch 1, context 1024).
    if "$ncu_bin" --profile-from-start off --clock-control none --cache-control none --csv \
         --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
         .gpu/cuda_propose_bench --profile-one --geometry qwen3.8-27b-dflash2 --precisions fp8 --replays 100 \
         >"$out_dir/ncu-dflash2.csv" 2>"$out_dir/ncu-dflash2.err"; then
      note "PASS profile: ncu-dflash2.csv ($(grep -c gpu__time_duration "$out_dir/ncu-dflash2.csv") kernels)"
      rm -f "$out_dir/ncu-dflash2.err"
    else
      note "FAIL profile DFlash2 (see ncu-dflash2.err)"
      status=1
    fi
    # One GEMM launch per shape in detail: throughput, occupancy, stall reasons, memory traffic.
    for spec in "q|k|v 64" "o 32" "down 32" "gate|up 64" "lm_head 64"; do
      read -r shape columns <<<"$spec"
      echo "=== gemm_bench --m 16 --shape $shape --format e4m3 --columns $columns" >>"$out_dir/ncu-gemm.txt"
      "$ncu_bin" --clock-control none --cache-control none -k regex:gemm_mma --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis .gpu/gemm_bench --m 16 --shape "$shape" --format e4m3 \
        --columns "$columns" --reps 1 >>"$out_dir/ncu-gemm.txt" 2>&1 || note "FAIL ncu gemm $spec (see ncu-gemm.txt)"
    done
    # The first attention kernel of the timed forward, in the same detail.
    echo "=== cuda_propose_bench --profile-one: first attention_mma_kernel" >>"$out_dir/ncu-gemm.txt"
    "$ncu_bin" --profile-from-start off --clock-control none --cache-control none -k regex:attention_mma --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis .gpu/cuda_propose_bench --profile-one --precisions fp8 --replays 100 \
      >>"$out_dir/ncu-gemm.txt" 2>&1 || note "FAIL ncu attention (see ncu-gemm.txt)"
  else
    note "FAIL profile (see ncu.err)"
    tail -5 "$out_dir/ncu.err" | tee -a "$summary"
    status=1
  fi
fi

for v in "${variants[@]}"; do
  export DFLASH_CUDA_KERNELS="$v"
  note "--- variant DFLASH_CUDA_KERNELS=$v"
  run_pass "[$v] "
  if .gpu/cuda_propose_bench --precisions fp8 >"$out_dir/bench-variant.log" 2>&1; then
    note "PASS [$v] cuda_propose_bench"
  else
    note "FAIL [$v] cuda_propose_bench (see bench-variant.log)"
    status=1
  fi
  tail -n 8 "$out_dir/bench-variant.log" >>"$summary"
  unset DFLASH_CUDA_KERNELS
done
# At most 8 files come back from the device: the replay log only matters when a replay failed.
grep -q "FAIL .*dflash-harness replay" "$summary" || rm -f "$out_dir/replay.log"
note "gpu-gate: $( ((status == 0)) && echo PASS || echo FAIL )"
exit $status
