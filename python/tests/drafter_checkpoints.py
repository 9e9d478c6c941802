"""Seeded random drafter checkpoints and targets for the capture tests and the bundled capture
fixtures: bf16-valued weights in the Hugging Face layout (optionally sharded, with "model.")."""
import json
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from dflash_capture.safetensors_io import write_safetensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tiny_dflash import DFlashDrafter  # noqa: E402


def tiny_config(**overrides):
    """Two layers, GQA 2:1, H 64, d 16, V 256: every path of docs/spec/drafter.md §3 at a size that replays
    in well under a second."""
    c = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256, "rms_norm_eps": 1e-6,
        "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 40960,
        "rope_theta": 10000.0, "block_size": 8, "num_target_layers": 12, "tie_word_embeddings": False,
        "dflash_config": {"mask_token_id": 255, "target_layer_ids": [1, 5]},
    }
    c.update(overrides)
    return c


def random_tensors(config, seed):
    """Parameters of the drafter (names as the module has them) and the target, bf16-valued:
    weights ~ N(0, 1/fan_in), norm weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.02^2)."""
    g = torch.Generator().manual_seed(seed)
    model = DFlashDrafter(config)
    params = {}
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(p.shape, generator=g)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(p.shape, generator=g)
        else:
            t = torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5
        params[name] = t.to(torch.bfloat16)
    V, H = config["vocab_size"], config["hidden_size"]
    target = {"embed_tokens.weight": torch.randn(V, H, generator=g).to(torch.bfloat16),
              "lm_head.weight": (torch.randn(V, H, generator=g) / H ** 0.5).to(torch.bfloat16)}
    return params, target


def write_checkpoint(directory, config, seed, shards=1, prefix=""):
    """A Hugging Face layout checkpoint: config.json and model.safetensors, or `shards` files
    model-0000i-of-0000n.safetensors with model.safetensors.index.json; tensor names get `prefix`.
    Returns the target tensors (embed_tokens.weight, lm_head.weight)."""
    os.makedirs(directory, exist_ok=True)
    params, target = random_tensors(config, seed)
    params = {prefix + name: t for name, t in params.items()}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if shards == 1:
        write_safetensors(os.path.join(directory, "model.safetensors"), params)
        return target
    names = sorted(params)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: params[n] for n in names[i::shards]}
        write_safetensors(os.path.join(directory, shard), part)
        weight_map.update({n: shard for n in part})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=1)
    return target


def write_target(path, target):
    write_safetensors(path, target)


class CheckpointWorkspace(unittest.TestCase):
    """A temporary folder, per test class, with the tiny drafter's checkpoint (seed `seed`) in
    `checkpoint` and its target in `target`."""

    seed = 11
    prefix = "dflash-test-"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix=cls.prefix)
        cls.dir = cls.tmp.name
        cls.config = tiny_config()
        cls.checkpoint = os.path.join(cls.dir, "ckpt")
        cls.target = os.path.join(cls.dir, "target.safetensors")
        write_target(cls.target, write_checkpoint(cls.checkpoint, cls.config, cls.seed))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
