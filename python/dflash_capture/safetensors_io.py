"""Safetensors files read and written with numpy and json only (the format is an 8-byte
little-endian header length, a JSON header, then raw little-endian data), so the package needs no
`safetensors` wheel. BF16 travels as its raw 16 bits; torch tensors convert through them exactly."""
import json
import os
import struct

import numpy as np
import torch

from .errors import CaptureError
from .json_file import read_json_object

# Safetensors dtype name -> (numpy storage dtype, torch dtype). BF16 is stored as uint16 bits.
_DTYPES = {
    "BF16": (np.dtype("<u2"), torch.bfloat16),
    "F16": (np.dtype("<f2"), torch.float16),
    "F32": (np.dtype("<f4"), torch.float32),
    "F64": (np.dtype("<f8"), torch.float64),
    "I32": (np.dtype("<i4"), torch.int32),
    "I64": (np.dtype("<i8"), torch.int64),
}
_TORCH_TO_NAME = {torch_dtype: name for name, (_, torch_dtype) in _DTYPES.items()}
# A header larger than this is refused before it is read (no unbounded allocation).
_MAX_HEADER_BYTES = 100 * 1024 * 1024
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def dtype_name(tensor):
    """The safetensors name of a torch tensor's dtype, or a CaptureError naming the dtype."""
    try:
        return _TORCH_TO_NAME[tensor.dtype]
    except KeyError:
        raise CaptureError(f"dtype {tensor.dtype} has no safetensors name here "
                           f"(supported: {', '.join(_DTYPES)})") from None


def _to_bytes(tensor):
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    return t.numpy().astype(_DTYPES[dtype_name(t)][0]).tobytes()


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: torch tensor} to `path` in name order (deterministic bytes), atomically."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        data = _to_bytes(t)
        header[name] = {"dtype": dtype_name(t), "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data starts 8-byte aligned
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    os.replace(partial, path)


def read_safetensors(path):
    """{name: torch tensor} of one safetensors file; every header field checked against the file."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise CaptureError(f"{path}: shorter than the 8-byte header length")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                raise CaptureError(f"{path}: header length {header_len} exceeds the file ({size} bytes)")
            try:
                header = json.loads(f.read(header_len))
            except ValueError as e:
                raise CaptureError(f"{path}: header is not JSON ({e})") from None
            body = f.read()
    except OSError as e:
        raise CaptureError(f"{path}: cannot read ({e.strerror})") from None
    if not isinstance(header, dict):
        raise CaptureError(f"{path}: header is not a JSON object")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
            raise CaptureError(f"{where}: dtype {info.get('dtype') if isinstance(info, dict) else info!r} "
                               f"is not one of {', '.join(_DTYPES)}")
        shape = info.get("shape")
        offsets = info.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)):
            raise CaptureError(f"{where}: malformed 'shape' or 'data_offsets'")
        np_dtype, torch_dtype = _DTYPES[info["dtype"]]
        begin, end = offsets
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not 0 <= begin <= end <= len(body) or end - begin != count * np_dtype.itemsize:
            raise CaptureError(f"{where}: data_offsets {offsets} do not hold {info['dtype']} {shape} "
                               f"inside the {len(body)}-byte data section")
        array = np.frombuffer(body, dtype=np_dtype, count=count, offset=begin).reshape(shape)
        if torch_dtype == torch.bfloat16:
            tensors[name] = torch.from_numpy(array.astype(np.int16)).view(torch.bfloat16)
        else:
            tensors[name] = torch.from_numpy(array.copy())
    return tensors


def read_checkpoint_tensors(directory):
    """Every tensor of a Hugging Face checkpoint directory: `model.safetensors`, or the shards a
    `model.safetensors.index.json` lists in its weight_map (each tensor from its named shard)."""
    index_path = os.path.join(directory, INDEX_NAME)
    if os.path.exists(index_path):
        weight_map = read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CaptureError(f"{index_path}: field 'weight_map' must be a non-empty object")
        shards = {}
        tensors = {}
        for name, shard in weight_map.items():
            if not isinstance(shard, str):
                raise CaptureError(f"{index_path}: field 'weight_map.{name}' must be a file name")
            if shard not in shards:
                shards[shard] = read_safetensors(os.path.join(directory, shard))
            if name not in shards[shard]:
                raise CaptureError(f"{index_path}: tensor '{name}' is mapped to {shard}, which does not hold it")
            tensors[name] = shards[shard][name]
        for shard, held in shards.items():
            unmapped = sorted(set(held) - set(weight_map))
            if unmapped:
                raise CaptureError(f"{os.path.join(directory, shard)}: tensor '{unmapped[0]}' is in no "
                                   f"weight_map entry of {index_path}")
        return tensors
    single = os.path.join(directory, SINGLE_NAME)
    if not os.path.exists(single):
        raise CaptureError(f"{directory}: neither {SINGLE_NAME} nor {INDEX_NAME} is there")
    return read_safetensors(single)
