"""Reading a JSON object from a file, with errors that name the file."""
import json

from .errors import CaptureError


def read_json_object(path):
    try:
        with open(path) as f:
            value = json.load(f)
    except OSError as e:
        raise CaptureError(f"{path}: cannot read ({e.strerror})") from None
    except ValueError as e:
        raise CaptureError(f"{path}: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise CaptureError(f"{path}: not a JSON object")
    return value
