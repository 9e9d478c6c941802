"""The one exception type of dflash_capture: bad input, named by file, tensor or field."""


class CaptureError(Exception):
    """A refusal with a message that names what was wrong (file, tensor, field, module)."""
