#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/) from the bundled
oracle fixtures and a few small hand-made safetensors files (every dtype, an empty tensor,
metadata). Run from the repository root; ci/fuzz --merge adds what fuzzing finds on top."""
import json
import os
import struct

ORACLE = "fixtures/oracle"
OUT = "tests/fuzz/corpus"
DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I32": 4, "I64": 8, "F8_E4M3": 1}


def safetensors(tensors, metadata=None):
    """tensors: [(name, dtype, shape)], data filled with a byte pattern."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        count = 1
        for d in shape:
            count *= d
        size = count * DTYPE_SIZES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += bytes((i * 37 + 11) % 251 for i in range(size))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def write(target, name, content):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(content)


def read(path):
    with open(path, "rb") as f:
        return f.read()


SHARD_A = [("a.w", "BF16", [3, 4]), ("a.f16", "F16", [5]), ("a.empty", "F32", [0, 7])]
SHARD_B = [("b.w", "F32", [2, 2]), ("b.d", "F64", [3]), ("b.i", "I32", [4])]

write("safetensors", "every-dtype.safetensors",
      safetensors([("bf16", "BF16", [2, 3]), ("f16", "F16", [4]), ("f32", "F32", [2, 2]), ("f64", "F64", [3]),
                   ("i32", "I32", [5]), ("i64", "I64", [2]), ("f8", "F8_E4M3", [8]), ("scalar", "F32", []),
                   ("empty", "BF16", [0, 4])], {"format": "pt"}))
write("safetensors", "shard-a.safetensors", safetensors(SHARD_A))
write("safetensors", "tiny-mha-trace.safetensors", read(f"{ORACLE}/tiny-mha/trace.safetensors"))

index = {"metadata": {"total_size": 0},
         "weight_map": {**{n: "a.safetensors" for n, _, _ in SHARD_A}, **{n: "b.safetensors" for n, _, _ in SHARD_B}}}
index_text = json.dumps(index, indent=1).encode()
shard_a = safetensors(SHARD_A)
write("sharded_index", "two-shards",
      struct.pack("<I", len(index_text)) + index_text + struct.pack("<I", len(shard_a)) + shard_a +
      safetensors(SHARD_B))

for fixture in sorted(os.listdir(ORACLE)):
    config = f"{ORACLE}/{fixture}/drafter/config.json"
    if os.path.exists(config):
        write("config", f"{fixture}.json", read(config))

base = f"{ORACLE}/tiny-mha"
write("fixture", "manifest", b"\x00" + read(f"{base}/fixture.json"))
write("fixture", "config", b"\x01" + read(f"{base}/drafter/config.json"))
write("fixture", "trace", b"\x02" + read(f"{base}/trace.safetensors"))
