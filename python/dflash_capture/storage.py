"""Tensors stored exactly: each in the narrowest dtype of the fixture format that holds its
values without rounding (BF16, else F32), so the replay sees the very values the drafter used."""
import torch

from .errors import CaptureError


def exact_storage(tensor, what):
    """`tensor` as BF16 or F32 holding the same values; a CaptureError naming `what` otherwise."""
    t = tensor.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.contiguous()
    if not t.is_floating_point():
        raise CaptureError(f"{what}: dtype {t.dtype} is not a floating type")
    if not torch.isfinite(t).all():
        raise CaptureError(f"{what}: holds NaN or Inf")
    for dtype in (torch.bfloat16, torch.float32):
        narrowed = t.to(dtype)
        if torch.equal(narrowed.to(t.dtype), t):
            return narrowed.contiguous()
    raise CaptureError(f"{what}: its {t.dtype} values are not exactly representable in F32, the widest dtype of "
                       f"fixture format v1 (load the module from its bf16 checkpoint, then cast)")
