"""The `dims` of an SGLang dump and gathering a tensor's TP shards by them.

The syntax follows SGLang's comparator (sglang 0.5.14,
python/sglang/srt/debug_utils/comparator/dims_spec/): the part before `#` names each tensor dim,
separated by spaces; `name[mods]` marks the dim sharded, `(a*b)` is one dim fused from two names,
`1` a dim of size 1; a modifier is `axis` or `axis:qualifier+qualifier`; the part after `#` may
declare `axis:replicated`. Gathering here knows the `tp` axis: a `tp` dim is concatenated in
tp_rank order, a `tp:partial` dim summed, and a `# tp:replicated` tensor must be equal on every
rank. Other axes are refused when their size is above 1.
"""
import re

import torch

from .errors import CaptureError

_DIM = re.compile(r"^(?P<name>[A-Za-z_]\w*|\([^)]+\)|1)(?:\[(?P<mods>[^\]]+)\])?$")
_QUALIFIERS = ("sharded", "natural", "partial", "zigzag")


class Dim:
    def __init__(self, name, modifiers):
        self.name = name
        self.modifiers = modifiers  # {axis: set of qualifiers}


class Dims:
    """A parsed dims string: `dims` (one Dim per tensor dim) and the `replicated` axes."""

    def __init__(self, text, where):
        self.text = text
        shape, _, declarations = text.partition("#")
        tokens = shape.split()
        if not tokens:
            raise CaptureError(f"{where}: field 'dims' {text!r} names no dimension")
        self.dims = [self._dim(token, where) for token in tokens]
        self.replicated = set()
        for token in declarations.split():
            axis, _, what = token.partition(":")
            if what == "replicated":
                self.replicated.add(axis)
            elif not what.startswith("="):  # `dp:=group` aliases a DP group; nothing to gather here
                raise CaptureError(f"{where}: field 'dims' {text!r}: declaration {token!r} is not 'axis:replicated'")

    def _dim(self, token, where):
        match = _DIM.match(token)
        if match is None:
            raise CaptureError(f"{where}: field 'dims' {self.text!r}: {token!r} is not a dimension")
        modifiers = {}
        for mod in (match.group("mods") or "").split(","):
            if not mod.strip():
                continue
            axis, _, quals = mod.strip().partition(":")
            qualifiers = {q.strip() for q in quals.split("+") if q.strip()}
            unknown = qualifiers - set(_QUALIFIERS)
            if unknown or axis in modifiers:
                raise CaptureError(f"{where}: field 'dims' {self.text!r}: modifier {mod.strip()!r} is not understood")
            modifiers[axis] = qualifiers
        return Dim(match.group("name"), modifiers)

    def sharded_over(self, axis):
        """[(tensor dim index, qualifiers)] of the dims sharded over `axis`."""
        return [(i, d.modifiers[axis]) for i, d in enumerate(self.dims) if axis in d.modifiers]

    def axes(self):
        return {axis for d in self.dims for axis in d.modifiers} | self.replicated


def first_difference(tensors):
    """Index of the first tensor that differs from tensors[0] in shape, dtype or bits; None if all equal."""
    for i, t in enumerate(tensors[1:], 1):
        if t.shape != tensors[0].shape or t.dtype != tensors[0].dtype or not torch.equal(t, tensors[0]):
            return i
    return None


def gather_tp(shards, dims_text, axis_sizes, where):
    """One tensor from its shards, listed in tp_rank order. `dims_text` is the dump's dims (None
    when it has none), `axis_sizes` the sizes of the parallel axes of the run ({axis: size})."""
    if dims_text is None:
        different = first_difference(shards)
        if different is not None:
            raise CaptureError(f"{where}: differs between tp ranks 0 and {different} and has no field 'dims' to "
                               f"gather it by (dump it with dims=..., docs/capture.md)")
        return shards[0]
    dims = Dims(dims_text, where)
    for axis in sorted(dims.axes() - {"tp"}):
        if axis_sizes.get(axis, 1) > 1:
            raise CaptureError(f"{where}: field 'dims' {dims_text!r} shards axis '{axis}' of size "
                               f"{axis_sizes[axis]}; only 'tp' is gathered")
    for i, t in enumerate(shards):
        if t.dim() != len(dims.dims):
            raise CaptureError(f"{where}: field 'dims' {dims_text!r} names {len(dims.dims)} dimensions; the tensor "
                               f"of tp rank {i} has shape {list(t.shape)}")
    sharded = dims.sharded_over("tp")
    if len(sharded) > 1:
        raise CaptureError(f"{where}: field 'dims' {dims_text!r} shards more than one dimension over tp")
    if not sharded:
        different = first_difference(shards)
        if different is not None:
            declared = "declares it tp:replicated" if "tp" in dims.replicated else "does not shard it over tp"
            raise CaptureError(f"{where}: differs between tp ranks 0 and {different}, but field 'dims' "
                               f"{dims_text!r} {declared}")
        return shards[0]
    index, qualifiers = sharded[0]
    if "zigzag" in qualifiers:
        raise CaptureError(f"{where}: field 'dims' {dims_text!r}: zigzag ordering is not gathered over tp")
    if "partial" in qualifiers:
        if any(t.shape != shards[0].shape for t in shards):
            raise CaptureError(f"{where}: the partial sums of the tp ranks differ in shape: "
                               f"{[list(t.shape) for t in shards]}")
        wide = torch.float64 if shards[0].dtype == torch.float64 else torch.float32
        return torch.stack([t.to(wide) for t in shards]).sum(0)
    rest = [list(t.shape[:index]) + list(t.shape[index + 1:]) for t in shards]
    if any(r != rest[0] for r in rest):
        raise CaptureError(f"{where}: the tp shards' shapes {[list(t.shape) for t in shards]} differ outside "
                           f"dimension {index} ('{dims.dims[index].name}')")
    return torch.cat(shards, dim=index)
