#!/usr/bin/env bash
# The remote-GPU adapter of ci/gpu-gate.sh, for a GPU machine that has the NVIDIA driver, CMake's
# ctest and python3 but not this project's toolchain: build here, carry one bundle, run there.
#
#   ci/gpu-remote.sh stage [--no-build] [--release-only] [--baseline REV]
#     here: builds both trees (ci/gpu-gate.sh --build-only; DFLASH_RELEASE_DIR and DFLASH_TESTING_DIR
#     name them) and packs what the gate runs (the
#     release command and benchmarks, every GPU test binary with its CTest files, the catch table,
#     libhwy and libsleef) into .gpu/bundle.tar.xz (git-ignored), one xz window over every binary so
#     the kernels they share cost once. --baseline REV also builds commit REV's propose benchmark
#     (release flags; sources in a worktree, build-baseline/src, and the tree build-baseline/release,
#     both kept for the next stage) and packs it, for ci/gpu-gate.sh --ab-bench.
#   ci/gpu-remote.sh run [ci/gpu-gate.sh options]
#     there, from the repository root: unpacks the bundle into build-release/ and build-testing/,
#     points the CTest files at this checkout, and runs ci/gpu-gate.sh --no-build with the options.
#   ci/gpu-remote.sh exec COMMAND...
#     there: the same unpacking, then COMMAND (e.g. one benchmark) with the same environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
release_dir=${DFLASH_RELEASE_DIR:-build-release}
testing_dir=${DFLASH_TESTING_DIR:-build-testing}
bundle=.gpu/bundle.tar.xz

case "${1:-}" in
  stage)
    shift
    no_build=0 release_only=0 baseline=""
    while (($#)); do
      case "$1" in
        --no-build) no_build=1 ;;
        --release-only) release_only=1 ;;
        --baseline)
          [ $# -ge 2 ] || { echo "error: ci/gpu-remote.sh stage: --baseline needs a commit" >&2; exit 2; }
          baseline=$(git rev-parse --verify --quiet "$2^{commit}") ||
            { echo "error: ci/gpu-remote.sh stage: --baseline '$2' is not a commit of this repository" >&2; exit 2; }
          shift ;;
        *) echo "error: ci/gpu-remote.sh stage: unknown argument '$1'" >&2; exit 2 ;;
      esac
      shift
    done
    only=()
    ((release_only)) && only=(--release-only)
    ((no_build)) || DFLASH_RELEASE_DIR=$release_dir DFLASH_TESTING_DIR=$testing_dir ci/gpu-gate.sh --build-only "${only[@]}"
    if [ -n "$baseline" ]; then
      # The baseline's sources in a worktree of their own, built with the release tree's flags.
      [ -d build-baseline/src ] || git worktree add --detach -q build-baseline/src "$baseline"
      git -C build-baseline/src checkout --detach -q "$baseline"
      cmake -S build-baseline/src -B build-baseline/release -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DDFLASH_BUILD_TESTS=OFF -DDFLASH_FAULT_POINTS=OFF >/dev/null
      ninja -C build-baseline/release -j "$(nproc)" cuda_propose_bench
    fi
    staging=$(mktemp -d)
    {
      echo "$release_dir/tools/dflash-harness"
      echo "$release_dir/bench/cuda_propose_bench"
      echo "$release_dir/cuda/gemm_bench"
      echo "$release_dir/cuda/libdflash_cuda_plugin.so"
      [ -n "$baseline" ] && echo build-baseline/release/bench/cuda_propose_bench
      if ((release_only == 0)); then
        echo "$testing_dir/tools/dflash-harness"
        echo "$testing_dir/tests/catch/mutation_catch_table"
        # Every test binary CTest runs with label gpu, and every CTest file of the testing tree.
        ctest --test-dir "$testing_dir" -N -L gpu --show-only=json-v1 |
          python3 -c 'import json, sys; print("\n".join(sorted({t["command"][0] for t in json.load(sys.stdin)["tests"]})))' |
          sed "s#^$root/##"
        find "$testing_dir" -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake'
      fi
    } | sort -u >"$staging/files"
    tar -cf "$staging/trees.tar" -T "$staging/files"
    mkdir -p "$staging/lib" && cp -L /usr/lib/x86_64-linux-gnu/libhwy.so.1 /usr/lib/x86_64-linux-gnu/libsleef.so.3 "$staging/lib/"
    echo "$root $release_dir $testing_dir" >"$staging/built-in"
    count=$(wc -l <"$staging/files")
    mkdir -p .gpu && rm -f "$bundle"  # other files stay
    tar -cf - -C "$staging" trees.tar lib built-in | xz -9 -T1 >"$bundle"
    rm -rf "$staging"
    echo "ci/gpu-remote.sh: staged $bundle ($(du -sm "$bundle" | cut -f1) MiB, $count files${baseline:+; baseline ${baseline:0:10}})"
    ;;
  run|exec)
    mode=$1
    shift
    [ -f "$bundle" ] || { echo "error: ci/gpu-remote.sh: no $bundle (ci/gpu-remote.sh stage, then carry .gpu)" >&2; exit 2; }
    unpacked=$(mktemp -d)
    tar -xJf "$bundle" -C "$unpacked"
    tar -xf "$unpacked/trees.tar"
    read -r built_in release_dir testing_dir <"$unpacked/built-in"
    export DFLASH_RELEASE_DIR=$release_dir DFLASH_TESTING_DIR=$testing_dir
    [ -d "$testing_dir" ] && find "$testing_dir" \( -name CTestTestfile.cmake -o -name '*_include.cmake' -o -name '*_tests.cmake' \) \
      -exec sed -i "s#$built_in#$root#g" {} +
    export LD_LIBRARY_PATH="$unpacked/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # The binaries need the CUDA runtime and cuBLAS(Lt) 13 of the machine's toolkit.
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
      [ -d "$d" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
    done
    if ! ldd "$release_dir/bench/cuda_propose_bench" 2>/dev/null | grep -q "libcublasLt.so.13 => /"; then
      lt=$(find /usr/local /opt -name 'libcublasLt.so.13' 2>/dev/null | head -1)
      [ -n "$lt" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$lt")"
    fi
    [ "$mode" = exec ] && exec "$@"
    exec ci/gpu-gate.sh --no-build "$@"
    ;;
  *)
    echo "error: usage: ci/gpu-remote.sh stage [--no-build] | run [ci/gpu-gate.sh options] | exec COMMAND..." >&2
    exit 2
    ;;
esac
