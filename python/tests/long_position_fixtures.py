"""Makes the bundled long-position capture fixtures (fixtures/recorded/) with dflash-capture from
the PyTorch drafter of tiny_dflash.py, whose RoPE forms inv_freq and the angles as Hugging Face's
rotary code does:

  rope-default-32k   default RoPE, theta 1e6, head_dim 128, positions 32760..32806
  yarn-gptoss-32k    YaRN gpt-oss style (factor 32 from 4096, beta 32/1, theta 150000),
                     head_dim 64, attention biases, eps 1e-5, positions 32760..32806

Both are small (two layers, H 64, one target layer, V 256) with a 16-token window (ctx_cap), so they
replay in seconds; the prompt's rows outside the first window are zeros (never attended).

Usage: /usr/bin/python3 python/tests/long_position_fixtures.py OUT_ROOT [--dtype float64]
"""
import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import drafter_checkpoints as dc  # noqa: E402
from dflash_capture.cli import main as capture_main  # noqa: E402

POSITIONS_FROM = 32760

FIXTURES = {
    "rope-default-32k": dict(
        seed=101,
        description="default RoPE theta 1e6, head_dim 128, positions 32760..32806 across 2^15",
        config=dc.tiny_config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                              rope_theta=1000000.0, dflash_config={"mask_token_id": 255, "target_layer_ids": [1]})),
    "yarn-gptoss-32k": dict(
        seed=102,
        description="YaRN x32 from 4096 (beta 32/1, theta 150000), head_dim 64, biases, eps 1e-5, "
                    "positions 32760..32806",
        config=dc.tiny_config(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                              attention_bias=True, rms_norm_eps=1e-5, rope_theta=150000.0,
                              max_position_embeddings=131072,
                              rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "original_max_position_embeddings": 4096,
                                            "truncate": False},
                              dflash_config={"mask_token_id": 255, "target_layer_ids": [1]})),
}


def make(out_root, dtype):
    with tempfile.TemporaryDirectory(prefix="dflash-long-") as tmp:
        for name, spec in FIXTURES.items():
            checkpoint = os.path.join(tmp, name)
            target = os.path.join(tmp, name + "-target.safetensors")
            dc.write_target(target, dc.write_checkpoint(checkpoint, spec["config"], spec["seed"]))
            argv = ["record", "--model-file", os.path.join(HERE, "tiny_dflash.py"), "--class", "DFlashDrafter",
                    "--checkpoint", checkpoint, "--target", target, "--out", os.path.join(out_root, name),
                    "--dtype", dtype, "--seed", str(spec["seed"]), "--positions-from", str(POSITIONS_FROM),
                    "--prompt", "16", "--steps", "8", "--widths", "8,3,16", "--ctx-cap", "16", "--page-size", "8",
                    "--name", name, "--description", spec["description"]]
            if capture_main(argv) != 0:
                return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_root")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32", "bfloat16"])
    args = parser.parse_args()
    sys.exit(make(args.out_root, args.dtype))
