"""Which dumped tensor is which drafter input and which stage (docs/spec/drafter.md §7), for
importing an engine's dumps (docs/capture.md, "From an engine's dumps").

A map has `inputs` and `taps`, each naming a source per key. A source is a dumped name (`{l}`
stands for the layer), a list of names (the first one dumped wins), or an object:
`{"name": ..., "where": {tag: value}}` also requires the dump's tags (`{l}` allowed),
`{"name": ..., "part": "q"|"k"|"v"}` takes that block of columns of a fused [q | k | v] tensor,
`{"sum": [source, ...]}` adds sources (a residual stream an engine keeps in two halves).

Inputs: `ctx` (the context rows [N, nT·Ht] entering the drafter), `ctx_positions` ([N]),
`block_ids` ([bs·B]: each block's anchor then mask tokens), `block_positions` ([bs·B]), and
optionally `seq_ids` ([bs], one id per running sequence), `logits` ([bs·(B-1), V]) and
`draft_tokens` ([bs·(B-1)]). `ctx` and `block_ids` also mark where a forward pass's context phase
and block phase begin (dump them first).
"""
import copy

from .errors import CaptureError
from .json_file import read_json_object
from .stages import CONTEXT_TAP, LAYER_STAGES

INPUTS = ("ctx", "ctx_positions", "block_ids", "block_positions", "seq_ids", "logits", "draft_tokens")
REQUIRED_INPUTS = ("ctx", "ctx_positions", "block_ids", "block_positions")
CONTEXT_INPUTS = ("ctx", "ctx_positions")
PARTS = ("q", "k", "v")
FORMAT_NAME = "dflash-dump-map"


class Source:
    """One source, with `{l}` still in it (at(l) fills it)."""

    def __init__(self, spec, what):
        self.what = what
        self.names, self.where, self.part, self.sum = [], {}, None, None
        if isinstance(spec, str):
            self.names = [spec]
        elif isinstance(spec, list) and spec and all(isinstance(n, str) for n in spec):
            self.names = list(spec)
        elif isinstance(spec, dict) and set(spec) == {"sum"}:
            if not isinstance(spec["sum"], list) or len(spec["sum"]) < 2:
                raise CaptureError(f"{what}: 'sum' must list two or more sources")
            self.sum = [Source(s, f"{what}.sum[{i}]") for i, s in enumerate(spec["sum"])]
        elif isinstance(spec, dict) and "name" in spec and set(spec) <= {"name", "where", "part"}:
            self.names = Source(spec["name"], what + ".name").names
            self.where = spec.get("where", {})
            if not isinstance(self.where, dict) or not all(isinstance(k, str) for k in self.where):
                raise CaptureError(f"{what}: 'where' must be an object of tag values")
            self.part = spec.get("part")
            if self.part is not None and self.part not in PARTS:
                raise CaptureError(f"{what}: 'part' must be one of {', '.join(PARTS)}, got {self.part!r}")
        else:
            raise CaptureError(f"{what}: a source is a dumped name, a list of names, an object with 'name' "
                               f"(and 'where', 'part'), or an object with 'sum'; got {spec!r}")

    def at(self, layer):
        """A copy with `{l}` replaced by the layer."""
        out = copy.copy(self)
        if layer is not None:
            fill = lambda text: text.replace("{l}", str(layer))  # noqa: E731
            out.names = [fill(n) for n in self.names]
            out.where = {k: fill(str(v)) for k, v in self.where.items()}
            out.sum = None if self.sum is None else [s.at(layer) for s in self.sum]
        return out

    def all_names(self):
        return list(self.names) + [n for s in (self.sum or []) for n in s.all_names()]


def _check_tap_name(name, what):
    if name in (CONTEXT_TAP, "embed", "final_norm"):
        return
    if name.startswith("L{l}.") and name[len("L{l}."):] in LAYER_STAGES:
        return
    raise CaptureError(f"{what}: '{name}' is not a tap (ctx_proj, embed, L{{l}}.attn_norm|q|k|v|attn|o_proj|"
                       f"mlp_norm|mlp|out, final_norm)")


class DumpMap:
    """inputs {input: spec} and taps {tap: spec} (see the module's doc); `source` names the map in
    errors."""

    def __init__(self, inputs, taps, source="dump map"):
        self.source = source
        for key in inputs:
            if key not in INPUTS:
                raise CaptureError(f"{source}: input '{key}' is not one of {', '.join(INPUTS)}")
        for key in REQUIRED_INPUTS:
            if key not in inputs:
                raise CaptureError(f"{source}: input '{key}' is missing")
        self.inputs = {k: Source(v, f"{source}: inputs.{k}") for k, v in inputs.items()}
        for name in taps:
            _check_tap_name(name, f"{source}: taps")
        self.taps = {k: Source(v, f"{source}: taps.{k}") for k, v in taps.items()}
        for key, src in list(self.inputs.items()) + list(self.taps.items()):
            if src.part is not None and key in INPUTS:
                raise CaptureError(f"{source}: inputs.{key}: 'part' is for taps only")

    def layer_taps(self, num_layers):
        """{tap name: Source} with every layer's taps filled in."""
        out = {}
        for name, src in self.taps.items():
            if name.startswith("L{l}."):
                for l in range(num_layers):
                    out[name.replace("{l}", str(l))] = src.at(l)
            else:
                out[name] = src.at(None)
        return out

    def names(self, num_layers):
        """Every dumped name the map can use."""
        sources = list(self.inputs.values()) + list(self.layer_taps(num_layers).values())
        return {n for s in sources for n in s.all_names()}


def load_dump_map(path):
    """A map from a JSON file: {"format": "dflash-dump-map", "version": 1, "inputs": {...}, "taps": {...}}."""
    data = read_json_object(path)
    if data.get("format") != FORMAT_NAME:
        raise CaptureError(f"{path}: field 'format' is not '{FORMAT_NAME}'")
    if data.get("version") != 1:
        raise CaptureError(f"{path}: field 'version' is {data.get('version')!r}; this reader knows version 1")
    for key in ("inputs", "taps"):
        if not isinstance(data.get(key), dict):
            raise CaptureError(f"{path}: field '{key}' must be an object")
    return DumpMap(data["inputs"], data["taps"], source=path)


# SGLang's DFlash drafter (sglang 0.5.14, python/sglang/srt/models/dflash.py: DFlashDraftModel with
# fc, hidden_norm, layers.{l}.{input_layernorm, self_attn.{qkv_proj, q_norm, k_norm, rotary_emb, attn,
# o_proj}, post_attention_layernorm, mlp}, norm) as the dumper's non-intrusive hooks name its modules
# (DUMPER_NON_INTRUSIVE_MODE=all: `non_intrusive__{module}.inputs.{i}` and `.output`, `.output.{i}`
# for a tuple). How the DFlash worker (python/sglang/srt/speculative/dflash_worker_v2.py) calls it:
# - context rows: project_target_hidden(target_hidden) runs fc then hidden_norm; their K and V are
#   made by apply_k_rope(positions, k), which calls layers.{l}.self_attn.rotary_emb(positions, q, k)
#   (on CUDA a fused kernel does this instead: dump the positions as dflash_ctx_positions);
# - the block: the root forward's ForwardBatch gives the core fields input_ids (anchor, then mask
#   tokens), positions, req_pool_indices; each layer is called as layer(positions, hidden_states,
#   forward_batch, residual), so layers.0's input 1 is the block's embeddings;
# - RMSNorm with a residual returns (normed, residual + x): input_layernorm of layer 0 gets no
#   residual (one output), later layers and norm get one (two outputs); a layer returns
#   (mlp output, residual), whose sum is the layer's output;
# - qkv_proj's output is [q | k | v]; rotary_emb returns (q, k) after RoPE, flat per token;
# - the lm_head is applied by the worker, outside the module: dump its logits and draft tokens
#   as dflash_draft_logits and dflash_draft_tokens to check them too.
_P = "non_intrusive__"
SGLANG_DFLASH = DumpMap(
    inputs={
        "ctx": _P + "fc.inputs.0",
        "ctx_positions": ["dflash_ctx_positions", _P + "layers.0.self_attn.rotary_emb.inputs.0"],
        "block_ids": "input_ids",
        "block_positions": "positions",
        "seq_ids": "req_pool_indices",
        "logits": "dflash_draft_logits",
        "draft_tokens": "dflash_draft_tokens",
    },
    taps={
        "ctx_proj": _P + "hidden_norm.output",
        "embed": _P + "layers.0.inputs.1",
        "L{l}.attn_norm": [_P + "layers.{l}.input_layernorm.output", _P + "layers.{l}.input_layernorm.output.0"],
        "L{l}.q": _P + "layers.{l}.self_attn.rotary_emb.output.0",
        "L{l}.k": _P + "layers.{l}.self_attn.rotary_emb.output.1",
        "L{l}.v": {"name": _P + "layers.{l}.self_attn.qkv_proj.output", "part": "v"},
        "L{l}.attn": _P + "layers.{l}.self_attn.attn.output",
        "L{l}.o_proj": _P + "layers.{l}.self_attn.o_proj.output",
        "L{l}.mlp_norm": _P + "layers.{l}.post_attention_layernorm.output.0",
        "L{l}.mlp": _P + "layers.{l}.mlp.output",
        "L{l}.out": {"sum": [_P + "layers.{l}.output.0", _P + "layers.{l}.output.1"]},
        "final_norm": [_P + "norm.output.0", _P + "norm.output"],
    },
    source="the default SGLang DFlash map")
