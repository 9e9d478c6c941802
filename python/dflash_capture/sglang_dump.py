"""Reading the files of SGLang's dumper (facts from sglang 0.5.14,
python/sglang/srt/debug_utils/dumper.py): one `.pt` file per dumped tensor, named by its tags
joined with `___` (`step=S___rank=R___dump_index=I___name=N___...`), holding
`{"value": tensor, "meta": {...}}`. The meta repeats the tags and adds `dims` (when the dump gave
them), `world_rank`/`world_size`, and the framework's parallel info (`sglang_parallel_info`:
tp_rank, tp_size, ...). Every rank writes its files into the same folder.

The tensors of several ranks are merged into one per (step, name, occurrence) by their `dims`
(dims.py)."""
import os

import torch

from .dims import first_difference, gather_tp
from .errors import CaptureError

_PARALLEL_INFO_KEYS = ("sglang_parallel_info", "megatron_parallel_info")


class Record:
    """One dumped tensor, merged over the ranks that dumped it. `order` sorts a step's records in
    dump order; `dtype` is the dtype as dumped (a partial sum is gathered wider); `gathered` says
    whether shards were concatenated or summed."""

    def __init__(self, step, name, order, value, dtype, meta, files, gathered=False):
        self.step, self.name, self.order = step, name, order
        self.value, self.dtype, self.meta, self.files = value, dtype, meta, files
        self.gathered = gathered

    @property
    def where(self):
        more = f" (and {len(self.files) - 1} more ranks)" if len(self.files) > 1 else ""
        return self.files[0] + more


def dump_folder(path):
    """The folder holding the `.pt` files: `path` itself, or its one subfolder that holds them (the
    dumper writes into DUMPER_DIR/<exp_name>/)."""
    if not os.path.isdir(path):
        raise CaptureError(f"{path}: no such dump directory")
    if any(n.endswith(".pt") for n in os.listdir(path)):
        return path
    subs = sorted(d for d in os.listdir(path)
                  if os.path.isdir(os.path.join(path, d)) and any(n.endswith(".pt") for n in os.listdir(os.path.join(path, d))))
    if len(subs) == 1:
        return os.path.join(path, subs[0])
    if not subs:
        raise CaptureError(f"{path}: holds no dumper files (*.pt), nor does any folder in it")
    raise CaptureError(f"{path}: holds the dumps of {len(subs)} runs ({', '.join(subs)}); give one of them")


def _filename_tags(filename):
    """{tag: text} of a dumper file name; a `___` inside a value stays in it."""
    tags, last = {}, None
    for part in filename[:-len(".pt")].split("___"):
        key, eq, value = part.partition("=")
        if eq and key:
            tags[key], last = value, key
        elif last is not None:
            tags[last] += "___" + part
    return tags


def _load(path, name):
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged or foreign pickle
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(f"{path}: not a readable dumper file ({first})") from None
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict) or "value" not in data:
        raise CaptureError(f"{path}: not a dumper file (expected a dict with 'value' and 'meta')")
    meta = data["meta"]
    for key in ("step", "rank", "dump_index"):
        if not isinstance(meta.get(key), int) or isinstance(meta.get(key), bool):
            raise CaptureError(f"{path}: field 'meta.{key}' must be an integer, got {meta.get(key)!r}")
    if meta.get("name") != name:
        raise CaptureError(f"{path}: field 'meta.name' is {meta.get('name')!r}, but the file name says {name!r}")
    value = data["value"]
    if not isinstance(value, torch.Tensor):
        raise CaptureError(f"{path}: field 'value' is {type(value).__name__}, not a tensor")
    if "dims" in meta and not isinstance(meta["dims"], str):
        raise CaptureError(f"{path}: field 'meta.dims' must be a string, got {meta['dims']!r}")
    return value.detach(), meta


def parallel_axes(meta):
    """{axis: (rank, size)} from the meta's parallel info (or its top-level `{axis}_rank`/`_size`)."""
    info = {}
    for key in _PARALLEL_INFO_KEYS:
        value = meta.get(key)
        if isinstance(value, dict) and value and not any(k.endswith("_error") for k in value):
            info = value
            break
    axes = {}
    for source in (info, meta):
        for key, size in source.items():
            if key.endswith("_size") and isinstance(size, int):
                axis = key[:-len("_size")]
                rank = source.get(axis + "_rank")
                if isinstance(rank, int) and axis not in axes and axis != "world":
                    axes[axis] = (rank, size)
    return axes


def read_dump(path, wanted):
    """The records of the dumped tensors whose name is in `wanted`, merged over ranks, sorted by
    (step, order). Files of other names are not opened."""
    folder = dump_folder(path)
    by_rank = {}  # rank -> {(step, name): [(dump_index, value, meta, path)]}
    for filename in sorted(os.listdir(folder)):
        if not filename.endswith(".pt"):
            continue
        tags = _filename_tags(filename)
        if "name" not in tags:
            raise CaptureError(f"{os.path.join(folder, filename)}: not a dumper file name "
                               f"(step=S___rank=R___dump_index=I___name=N___...)")
        if tags["name"] not in wanted:
            continue
        file = os.path.join(folder, filename)
        value, meta = _load(file, tags["name"])
        by_rank.setdefault(meta["rank"], {}).setdefault((meta["step"], meta["name"]), []).append(
            (meta["dump_index"], value, meta, file))
    ranks = sorted(by_rank)
    for per_key in by_rank.values():
        for items in per_key.values():
            items.sort(key=lambda item: item[0])
    records = []
    keys = sorted({key for per_key in by_rank.values() for key in per_key})
    for step, name in keys:
        counts = {rank: len(by_rank[rank].get((step, name), [])) for rank in ranks}
        if len(set(counts.values())) != 1:
            shown = ", ".join(f"rank {r}: {c}" for r, c in counts.items())
            raise CaptureError(f"{folder}: step {step}: the ranks dumped '{name}' a different number of times ({shown})")
        for k in range(counts[ranks[0]]):
            records.append(_merge([by_rank[rank][(step, name)][k] for rank in ranks], step, name))
    records.sort(key=lambda r: (r.step, r.order))
    return records


def _merge(items, step, name):
    """One record from the same dump of every rank (in world-rank order)."""
    order, value, meta, file = items[0]
    files = [item[3] for item in items]
    if len(items) == 1:
        return Record(step, name, order, value, value.dtype, meta, files)
    where = f"{file} (step {step}, '{name}', {len(items)} ranks)"
    axes = [parallel_axes(item[2]) for item in items]
    tp = [a.get("tp") for a in axes]
    dtypes = {item[1].dtype for item in items}
    if len(dtypes) != 1:
        raise CaptureError(f"{where}: the ranks dumped it in different dtypes {sorted(map(str, dtypes))}")
    if None in tp or tp[0][1] == 1:
        # No tensor parallelism to gather over: the ranks must agree.
        different = first_difference([item[1] for item in items])
        if different is not None:
            raise CaptureError(f"{where}: differs between {files[0]} and {files[different]}, and their meta names no "
                               f"tp_rank/tp_size above 1 to gather it by")
        return Record(step, name, order, value, value.dtype, meta, files)
    size = tp[0][1]
    if sorted(rank for rank, _ in tp) != list(range(size)) or any(s != size for _, s in tp):
        shown = ", ".join(f"rank {item[2]['rank']}: tp {r}/{s}" for item, (r, s) in zip(items, tp))
        raise CaptureError(f"{where}: the ranks are not the tp ranks 0..{size - 1} once each ({shown}); dumps of "
                           f"data-parallel or pipeline ranks are not merged")
    dims = {item[2].get("dims") for item in items}
    if len(dims) != 1:
        raise CaptureError(f"{where}: the ranks give different field 'dims': {sorted(map(str, dims))}")
    shards = [value for _, value in sorted(((r, item[1]) for item, (r, _) in zip(items, tp)), key=lambda x: x[0])]
    sizes = {axis: s for axis, (_, s) in axes[0].items()}
    gathered = gather_tp(shards, dims.pop(), sizes, where)
    return Record(step, name, order, gathered, value.dtype, meta, files, gathered is not shards[0])
