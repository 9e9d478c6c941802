"""Loading a user's drafter class from a Hugging Face layout checkpoint (config.json plus
model.safetensors or a sharded model.safetensors.index.json), and the target's embedding and
lm_head."""
import importlib.util
import os
import sys

import torch

from .errors import CaptureError
from .json_file import read_json_object
from .safetensors_io import read_checkpoint_tensors, read_safetensors

PREFIX = "model."


def read_config(directory):
    return read_json_object(os.path.join(directory, "config.json"))


def import_class(model_file, class_name):
    """The class `class_name` of the Python file `model_file` (imported as a module named after the
    file, with the file's folder on sys.path so its own imports resolve)."""
    if not os.path.isfile(model_file):
        raise CaptureError(f"{model_file}: no such model file")
    name = os.path.splitext(os.path.basename(model_file))[0]
    folder = os.path.dirname(os.path.abspath(model_file))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, model_file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise CaptureError(f"{model_file}: has no class '{class_name}'")
    return cls


def checkpoint_name_map(param_names, checkpoint_names, directory):
    """{parameter name: checkpoint tensor name}, matching names with or without the "model."
    prefix; a parameter without a tensor, or a tensor no parameter takes, is refused by name."""
    available = set(checkpoint_names)
    mapping = {}
    for p in param_names:
        candidates = [p, PREFIX + p] + ([p[len(PREFIX):]] if p.startswith(PREFIX) else [])
        found = [c for c in candidates if c in available]
        if not found:
            raise CaptureError(f"{directory}: the module's parameter '{p}' has no tensor in the checkpoint "
                               f"(also tried with/without the '{PREFIX}' prefix)")
        mapping[p] = found[0]
    unused = sorted(available - set(mapping.values()))
    if unused:
        raise CaptureError(f"{directory}: checkpoint tensor '{unused[0]}' is used by no parameter of the module"
                           + (f" ({len(unused)} unused in all)" if len(unused) > 1 else ""))
    return mapping


def load_drafter(cls, directory, dtype, device):
    """An instance of `cls` built from the checkpoint's config and filled with its tensors, cast to
    `dtype` on `device`. A Hugging Face PreTrainedModel subclass gets its config_class built from the
    dict; any other class gets the dict."""
    config = read_config(directory)
    config_class = getattr(cls, "config_class", None)
    model = cls(config_class.from_dict(config) if config_class is not None else config)
    tensors = read_checkpoint_tensors(directory)
    params = dict(model.named_parameters())
    mapping = checkpoint_name_map(list(params), list(tensors), directory)
    with torch.no_grad():
        for p, name in mapping.items():
            t = tensors[name]
            if list(t.shape) != list(params[p].shape):
                raise CaptureError(f"{directory}: tensor '{name}' has shape {list(t.shape)}; the module's "
                                   f"parameter '{p}' is {list(params[p].shape)}")
            params[p].copy_(t.to(params[p].dtype))
    model.eval()
    return model.to(device=device, dtype=dtype), config


def load_target(path, config):
    """(embed_tokens, lm_head) from a safetensors file or a checkpoint directory, named
    embed_tokens.weight / lm_head.weight with or without "model."; a tied target uses the embedding
    for both."""
    tensors = read_checkpoint_tensors(path) if os.path.isdir(path) else read_safetensors(path)

    def find(name):
        for candidate in (name, PREFIX + name):
            if candidate in tensors:
                return tensors[candidate]
        return None

    embed = find("embed_tokens.weight")
    if embed is None:
        raise CaptureError(f"{path}: no tensor 'embed_tokens.weight' (or 'model.embed_tokens.weight')")
    lm_head = find("lm_head.weight")
    if lm_head is None:
        if not config.get("tie_word_embeddings", False):
            raise CaptureError(f"{path}: no tensor 'lm_head.weight', and the config does not set "
                               f"tie_word_embeddings")
        lm_head = embed
    return embed, lm_head
