"""The few facts of a drafter's config.json (docs/spec/drafter.md §1) the recorder needs to drive it."""
from .errors import CaptureError


class DrafterFacts:
    """Geometry, block size and mask token of a drafter config; missing required keys are refused
    naming the key and `source`."""

    def __init__(self, config, source="config.json"):
        if not isinstance(config, dict):
            raise CaptureError(f"{source}: the config is not a JSON object")
        self.config = config

        def need(key):
            if key not in config:
                raise CaptureError(f"{source}: key '{key}' is missing")
            value = config[key]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CaptureError(f"{source}: key '{key}' must be a positive integer, got {value!r}")
            return value

        self.hidden_size = need("hidden_size")
        self.num_layers = need("num_hidden_layers")
        self.num_heads = need("num_attention_heads")
        self.num_kv_heads = need("num_key_value_heads") if "num_key_value_heads" in config else self.num_heads
        self.head_dim = need("head_dim") if config.get("head_dim") is not None else self.hidden_size // self.num_heads
        self.vocab_size = need("vocab_size")
        dflash = config.get("dflash_config")
        if not isinstance(dflash, dict):
            raise CaptureError(f"{source}: key 'dflash_config' is missing (it carries mask_token_id)")
        block = dflash.get("block_size", config.get("block_size"))
        if not isinstance(block, int) or block < 1:
            raise CaptureError(f"{source}: key 'block_size' (top level or dflash_config.block_size) must be a "
                               f"positive integer, got {block!r}")
        self.block_size = block
        mask = dflash.get("mask_token_id")
        if not isinstance(mask, int) or not 0 <= mask < self.vocab_size:
            raise CaptureError(f"{source}: key 'dflash_config.mask_token_id' must be a token id below vocab_size "
                               f"{self.vocab_size}, got {mask!r}")
        self.mask_token_id = mask
        ids = dflash.get("target_layer_ids")
        # Without target_layer_ids, one target layer per drafter layer is derived (docs/spec/drafter.md §1).
        self.num_target_layers = len(ids) if isinstance(ids, list) else self.num_layers
        self.ctx_features = self.num_target_layers * self.hidden_size  # nT·Ht, Ht = H

    def clamp_width(self, width, gamma):
        """The width a propose runs at: clamp(width, 2, max(gamma, 2)) (docs/spec/drafter.md §5)."""
        return min(max(width, 2), max(gamma, 2))
