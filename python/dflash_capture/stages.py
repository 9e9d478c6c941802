"""The taps of one propose (docs/spec/drafter.md §7) as the capture package writes them: their
forward order and the width of each tap's rows."""

LAYER_STAGES = ("attn_norm", "q", "k", "v", "attn", "o_proj", "mlp_norm", "mlp", "out")
CONTEXT_TAP = "ctx_proj"  # the one tap over context rows; every other tap is over the block's rows


def tap_order(num_layers):
    """Every tap name in forward order: ctx_proj, embed, L{l}.attn_norm ... L{l}.out, final_norm."""
    order = [CONTEXT_TAP, "embed"]
    for l in range(num_layers):
        order += [f"L{l}.{s}" for s in LAYER_STAGES]
    order.append("final_norm")
    return order


def tap_width(tap, facts):
    """Features per row of `tap` (docs/spec/drafter.md §7): nh·d for q and attn, nkv·d for k and
    v, H for every other tap. `facts` is a DrafterFacts."""
    stage = tap.split(".", 1)[1] if tap.startswith("L") else tap
    if stage in ("q", "attn"):
        return facts.num_heads * facts.head_dim
    if stage in ("k", "v"):
        return facts.num_kv_heads * facts.head_dim
    return facts.hidden_size
