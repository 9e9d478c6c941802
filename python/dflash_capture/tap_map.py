"""Which module of a drafter produces which tap (docs/spec/drafter.md §7).

A TapMap links tap names to module names (with `{l}` standing for the layer index) and says whether
the tap is the module's output or its input. q and k after RoPE come from the RoPE hook instead
(rope_hook.py), because RoPE is usually a function, not a module; `attention` names each layer's
attention module, whose call tells the RoPE hook which layer it is in.
"""
from .errors import CaptureError

# Rows a tap keeps of what its module saw in one forward (all calls concatenated in order):
BLOCK = "block"              # the last B rows: the block rows
NEW_CONTEXT = "new_context"  # the last min(C, ctx_cap) rows: the context rows entering the window


class Tap:
    """One tap's source: `module` (a name, `{l}` for the layer), `where` "output" or "input"
    (the first positional argument), and which rows to keep."""

    def __init__(self, module, where="output", rows=BLOCK):
        if where not in ("output", "input"):
            raise CaptureError(f"tap source '{module}': where must be 'output' or 'input', got {where!r}")
        if rows not in (BLOCK, NEW_CONTEXT):
            raise CaptureError(f"tap source '{module}': rows must be '{BLOCK}' or '{NEW_CONTEXT}', got {rows!r}")
        self.module, self.where, self.rows = module, where, rows

    def __repr__(self):
        return f"Tap({self.module!r}, where={self.where!r}, rows={self.rows!r})"


class TapMap:
    """Tap name (with `{l}` for per-layer taps) -> Tap, plus the attention module per layer that
    the RoPE hook uses to know the layer of the q and k it receives (None: no q/k taps)."""

    def __init__(self, taps, attention=None):
        self.taps = dict(taps)
        self.attention = attention

    def with_prefix(self, prefix):
        """The same map for a module nested under `prefix` (e.g. "model.")."""
        taps = {name: Tap(prefix + tap.module, tap.where, tap.rows) for name, tap in self.taps.items()}
        return TapMap(taps, None if self.attention is None else prefix + self.attention)

    def resolve(self, module_names, num_layers):
        """{tap name: Tap with a concrete module name} for every layer; a module the model lacks is
        refused naming the tap and the module."""
        known = set(module_names)
        resolved = {}
        for name, tap in self.taps.items():
            layers = range(num_layers) if "{l}" in name or "{l}" in tap.module else [None]
            for l in layers:
                tap_name = name.replace("{l}", str(l)) if l is not None else name
                module = tap.module.replace("{l}", str(l)) if l is not None else tap.module
                if module not in known:
                    raise CaptureError(f"tap map: tap '{tap_name}' names module '{module}', which the model "
                                       f"does not have")
                resolved[tap_name] = Tap(module, tap.where, tap.rows)
        return resolved

    def attention_modules(self, module_names, num_layers):
        """{module name: layer} of the attention modules (empty without `attention`)."""
        if self.attention is None:
            return {}
        out = {}
        for l in range(num_layers):
            module = self.attention.replace("{l}", str(l))
            if module not in set(module_names):
                raise CaptureError(f"tap map: attention module '{module}' of layer {l} is not in the model")
            out[module] = l
        return out


# The layout of the upstream PyTorch DFlash drafter (Qwen3 modules plus fc and hidden_norm).
UPSTREAM = TapMap({
    "ctx_proj": Tap("hidden_norm", rows=NEW_CONTEXT),
    "L{l}.attn_norm": Tap("layers.{l}.input_layernorm"),
    "L{l}.v": Tap("layers.{l}.self_attn.v_proj"),
    "L{l}.attn": Tap("layers.{l}.self_attn.o_proj", where="input"),
    "L{l}.o_proj": Tap("layers.{l}.self_attn.o_proj"),
    "L{l}.mlp_norm": Tap("layers.{l}.post_attention_layernorm"),
    "L{l}.mlp": Tap("layers.{l}.mlp"),
    "L{l}.out": Tap("layers.{l}"),
    "final_norm": Tap("norm"),
}, attention="layers.{l}.self_attn")

# Modules whose presence identifies the upstream layout.
_UPSTREAM_SIGNATURE = ("fc", "hidden_norm", "norm", "layers.0.input_layernorm", "layers.0.self_attn.q_proj",
                       "layers.0.self_attn.k_norm", "layers.0.mlp")


def detect_tap_map(module_names):
    """The built-in map for a recognized layout (the upstream one, bare or under "model."), or a
    CaptureError that lists the module names seen."""
    names = set(module_names)
    for prefix in ("", "model."):
        if all(prefix + m in names for m in _UPSTREAM_SIGNATURE):
            return UPSTREAM if not prefix else UPSTREAM.with_prefix(prefix)
    seen = [n for n in module_names if n]
    shown = ", ".join(seen[:60]) + (f", ... ({len(seen)} in all)" if len(seen) > 60 else "")
    raise CaptureError("the drafter's module layout is not one dflash_capture recognizes (the upstream DFlash "
                       "layout: fc, hidden_norm, norm, layers.{l}.input_layernorm, layers.{l}.self_attn.q_proj "
                       "... k_norm, layers.{l}.mlp); give a TapMap (docs/capture.md). Modules seen: " +
                       (shown or "(none)"))
