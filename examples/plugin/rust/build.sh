#!/usr/bin/env bash
# Builds the Rust forwarding plugin (dflash_forward.rs) as OUT_DIR/libdflash_forward.so with plain rustc
# (no cargo, no crates; $RUSTC picks another rustc). Exit 125 when rustc is not installed, so a caller
# can skip with that reason.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
rustc=${RUSTC:-rustc}
if ! command -v "$rustc" >/dev/null 2>&1; then
  echo "rustc not found: the Rust example plugin is not built (Debian: apt-get install rustc)" >&2
  exit 125
fi
mkdir -p "$1"
"$rustc" --edition 2021 --crate-type cdylib -O "$(dirname "$0")/dflash_forward.rs" -o "$1/libdflash_forward.so"
echo "built $1/libdflash_forward.so with $("$rustc" --version)"
