"""Record PyTorch DFlash drafters into fixture format v1 for dflash-harness (docs/capture.md)."""
from .errors import CaptureError
from .recorder import PRECISIONS, Recorder, upstream_call
from .rope_hook import patch_rope_function, rope_tap
from .tap_map import BLOCK, NEW_CONTEXT, UPSTREAM, Tap, TapMap, detect_tap_map

__all__ = ["CaptureError", "Recorder", "PRECISIONS", "upstream_call", "rope_tap", "patch_rope_function", "Tap",
           "TapMap", "UPSTREAM", "BLOCK", "NEW_CONTEXT", "detect_tap_map"]
