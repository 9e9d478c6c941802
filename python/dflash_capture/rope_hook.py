"""q and k after RoPE, for the L{l}.q and L{l}.k taps.

RoPE is usually a function (Hugging Face's `apply_rotary_pos_emb(q, k, cos, sin, ...)`), so a
forward hook cannot see its output. Two ways in, both no-ops when nothing is recording:

- `rope_tap(q, k)`: call it in your attention code on the rotated q and k (it returns them);
- `patch_rope_function(namespace, name)`: replaces a module-level function that returns
  (q_rotated, k_rotated) with a wrapper that reports them, for as long as the `with` lasts.

`layout` is how q and k are laid out: "bhld" ([batch, heads, positions, head_dim], Hugging Face's)
or "blhd" ([batch, positions, heads, head_dim]).
"""
import contextlib
import functools

from .errors import CaptureError

_LAYOUTS = ("bhld", "blhd")
_sink = None  # the recording in progress (set by the Recorder around each forward)


def set_sink(sink):
    global _sink
    previous, _sink = _sink, sink
    return previous


def as_rows(t, layout):
    """[positions, heads·head_dim] of one sequence's q or k."""
    if layout not in _LAYOUTS:
        raise CaptureError(f"rope hook: layout must be one of {_LAYOUTS}, got {layout!r}")
    if t.dim() != 4 or t.shape[0] != 1:
        raise CaptureError(f"rope hook: expected a [1, ., ., head_dim] tensor in layout {layout}, "
                           f"got shape {list(t.shape)}")
    if layout == "bhld":
        t = t.transpose(1, 2)
    return t.reshape(t.shape[1], t.shape[2] * t.shape[3])


def rope_tap(q, k, layout="bhld"):
    """Reports q and k after RoPE to the recording in progress; returns (q, k) unchanged."""
    if _sink is not None:
        _sink.rope(None if q is None else as_rows(q, layout), None if k is None else as_rows(k, layout))
    return q, k


@contextlib.contextmanager
def patch_rope_function(namespace, name="apply_rotary_pos_emb", layout="bhld"):
    """Within the `with`, `name` in `namespace` (a function returning (q_rotated, k_rotated))
    reports its results through rope_tap. `namespace` is the Python module that calls the function
    by that name (or that module's globals dict)."""
    table = namespace if isinstance(namespace, dict) else vars(namespace)
    original = table.get(name)
    if not callable(original):
        label = table.get("__name__", "namespace") if isinstance(namespace, dict) else namespace.__name__
        raise CaptureError(f"rope hook: {label} has no function '{name}'")

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        q, k = original(*args, **kwargs)
        return rope_tap(q, k, layout)

    table[name] = wrapper
    try:
        yield
    finally:
        table[name] = original


@contextlib.contextmanager
def patch_model_rope(model, name="apply_rotary_pos_emb"):
    """patch_rope_function on every namespace whose module classes of `model` call `name` (the
    globals of their forward), Hugging Face layout."""
    tables = {}
    for module in model.modules():
        table = getattr(type(module).forward, "__globals__", {})
        if callable(table.get(name)):
            tables[id(table)] = table
    with contextlib.ExitStack() as stack:
        for table in tables.values():
            stack.enter_context(patch_rope_function(table, name))
        yield
