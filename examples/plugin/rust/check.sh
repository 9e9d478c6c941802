#!/usr/bin/env bash
# Builds into BUILD_DIR the minimal C plugin, the Rust plugin that forwards to it and forward_check.c,
# then checks the Rust plugin's table (name "rust-forward", version 2) and a create and propose through
# it; and that the check can fail: it refuses the C plugin's own name, and the forwarder without
# DFLASH_FORWARD_TO. Exit 0 pass, 1 fail, 125 when rustc is not installed ($RUSTC, $CC: other compilers).
set -uo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
include=$here/../../../include
out=$1
cc=${CC:-cc}
fail() {
  echo "check.sh: FAIL: $*" >&2
  exit 1
}

mkdir -p "$out" || fail "cannot create $out"
"$here/build.sh" "$out"
status=$?
[ $status -eq 125 ] && exit 125
[ $status -eq 0 ] || fail "build.sh exited $status"
flags=(-std=c99 -Wall -Wextra -pedantic -Werror -I"$include")
"$cc" "${flags[@]}" -fPIC -shared -fvisibility=hidden "$here/../minimal_plugin.c" -o "$out/libdflash_minimal_plugin.so" ||
  fail "the minimal plugin does not build"
"$cc" "${flags[@]}" "$here/forward_check.c" -o "$out/forward_check" -ldl || fail "forward_check.c does not build"

export DFLASH_FORWARD_TO=$out/libdflash_minimal_plugin.so
"$out/forward_check" "$out/libdflash_forward.so" rust-forward || fail "the Rust plugin"

# The check can fail: the C plugin is named "minimal", and the forwarder needs DFLASH_FORWARD_TO.
echo "check.sh: expected to fail (the C plugin's own name):"
"$out/forward_check" "$DFLASH_FORWARD_TO" rust-forward
[ $? -eq 1 ] || fail "forward_check accepted the name \"minimal\" as \"rust-forward\""
echo "check.sh: expected to fail (no DFLASH_FORWARD_TO):"
env -u DFLASH_FORWARD_TO "$out/forward_check" "$out/libdflash_forward.so" rust-forward
[ $? -eq 1 ] || fail "forward_check passed without the plugin to forward to"
echo "check.sh: pass"
