"""Record PyTorch DFlash drafters, or import an engine's dumps, into fixture format v1 for
dflash-harness (docs/capture.md)."""
from .dump_map import SGLANG_DFLASH, DumpMap, load_dump_map
from .errors import CaptureError
from .recorder import PRECISIONS, Recorder, upstream_call
from .rope_hook import patch_rope_function, rope_tap
from .tap_map import BLOCK, NEW_CONTEXT, UPSTREAM, Tap, TapMap, detect_tap_map

__all__ = ["CaptureError", "Recorder", "PRECISIONS", "upstream_call", "rope_tap", "patch_rope_function", "Tap",
           "TapMap", "UPSTREAM", "BLOCK", "NEW_CONTEXT", "detect_tap_map", "DumpMap", "SGLANG_DFLASH", "load_dump_map"]
