"""The tensor a module returned, whatever shape its output takes."""
import torch

from .errors import CaptureError


def output_tensor(value, what, field):
    """`value` itself when it is a tensor, the first element of a tuple or list that starts with
    one, or its `field` attribute (an output object, e.g. `.logits`, `.last_hidden_state`);
    a CaptureError naming `what` otherwise."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    attribute = getattr(value, field, None)
    if isinstance(attribute, torch.Tensor):
        return attribute
    raise CaptureError(f"{what}: expected a tensor, a tuple starting with one, or an output with .{field}, "
                       f"got {type(value).__name__}")
