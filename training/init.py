"""Starting weights for a new drafter, taken from the target where the shapes allow.

The drafter's output goes through the target's final norm and LM head, so it has to land
in the residual space of the target's last layers, and its context K/V are projections of
a late residual stream. So drafter layer i starts as a copy of target layer
`L - num_drafter_layers + i` (the last layers: attention, MLP, norms), and:

- `fc` starts as the identity on the deepest captured layer and zero on the others, and
  `hidden_norm` as the copied layer's input norm: the context vector of a token is then
  what that target layer would normalise as its input, had it followed the captured layer,
  so the copied k/v projections give meaningful context K/V from the first step;
- the final `norm` is the target's final norm;
- q_norm/k_norm (which SmolLM2/Llama lack) stay 1, the Markov head adds nothing (w2 = 0),
  the confidence head keeps its default initialisation.

Shapes must match (a drafter made with `DrafterConfig.for_target` without overriding the
attention or MLP sizes); otherwise the drafter keeps its random initialisation. q/k/v biases
(Qwen2) have no place in the drafter and are dropped.

`init_from_drafter` then warm-starts from a trained checkpoint: every tensor the checkpoint
has is copied, and layers beyond its depth keep their initialisation but start with their
residual outputs (o_proj, down_proj) at zero. A layer whose branches add nothing passes the
residual stream through, so a deeper drafter starts as exactly the trained one and training
only has to find what the new layer adds.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from engine.config import ModelConfig
from engine.speculative.checkpoint import read_drafter_config, read_drafter_state
from engine.speculative.drafter import DSparkDrafter

log = logging.getLogger(__name__)


def copyable_from_target(drafter: DSparkDrafter, target_config: ModelConfig) -> bool:
    """True when every drafter layer has the shapes of a target layer."""
    cfg = drafter.config
    return (
        cfg.hidden_size == target_config.hidden_size
        and cfg.num_heads == target_config.num_heads
        and cfg.num_kv_heads == target_config.num_kv_heads
        and cfg.head_dim == target_config.head_dim
        and cfg.intermediate_size == target_config.intermediate_size
        and cfg.num_layers <= target_config.num_layers
    )


@torch.no_grad()
def init_from_target(drafter: DSparkDrafter, target: nn.Module, target_config: ModelConfig) -> list[int]:
    """Copy target weights into `drafter` as described in the module doc. Returns the target
    layer ids copied (empty when the shapes do not allow it; the drafter is then unchanged)."""
    cfg = drafter.config
    if not copyable_from_target(drafter, target_config):
        log.warning("drafter shapes differ from the target's layers: keeping the random initialisation")
        return []
    model: Any = target
    layers = model.model.layers
    first = target_config.num_layers - cfg.num_layers
    copied = list(range(first, target_config.num_layers))
    q_size = cfg.q_size
    for i, source_id in enumerate(copied):
        source: Any = layers[source_id]
        layer: Any = drafter.layers[i]
        qkv = source.self_attn.qkv_proj.weight  # [(Hq + 2 Hkv) * D, H]: q rows, k rows, v rows
        layer.self_attn.q_proj.weight.copy_(qkv[:q_size])
        drafter.kv_proj[i].copy_(qkv[q_size:])  # [k heads | v heads], the drafter's layout
        layer.self_attn.o_proj.weight.copy_(source.self_attn.o_proj.weight)
        for name in ("q_norm", "k_norm"):
            norm = getattr(source.self_attn, name, None)
            if norm is not None:
                getattr(layer.self_attn, name).weight.copy_(norm.weight)
        layer.gate_up_proj.weight.copy_(source.mlp.gate_up_proj.weight)  # [gate | up] in both
        layer.down_proj.weight.copy_(source.mlp.down_proj.weight)
        layer.input_layernorm.weight.copy_(source.input_layernorm.weight)
        layer.post_attention_layernorm.weight.copy_(source.post_attention_layernorm.weight)
    drafter.norm.weight.copy_(model.model.norm.weight)
    hidden = cfg.hidden_size
    drafter.fc.weight.zero_()
    drafter.fc.weight[:, -hidden:].copy_(torch.eye(hidden))  # the deepest captured layer
    drafter.hidden_norm.weight.copy_(layers[first].input_layernorm.weight)
    return copied


# Fields a warm start must share with the checkpoint; num_layers may grow, gamma may change.
WARM_START_FIELDS = (
    "target_vocab_size",
    "target_hidden_size",
    "target_num_layers",
    "capture_layers",
    "markov_rank",
    "confidence_head",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "mask_token_id",
)


@torch.no_grad()
def init_from_drafter(drafter: DSparkDrafter, checkpoint: str, device: torch.device | str) -> dict[str, Any]:
    """Copy the trained drafter at `checkpoint` into `drafter` as described in the module doc.
    Returns what was done, for the run's metadata. Raises ValueError when the two differ in
    anything but depth (deeper only) and gamma."""
    cfg = drafter.config
    source_cfg, _ = read_drafter_config(checkpoint)
    for field in WARM_START_FIELDS:
        mine, theirs = getattr(cfg, field), getattr(source_cfg, field)
        if mine != theirs:
            raise ValueError(f"init_from {checkpoint}: {field} is {theirs!r} there but {mine!r} here")
    if source_cfg.num_layers > cfg.num_layers:
        raise ValueError(
            f"init_from {checkpoint}: it has {source_cfg.num_layers} layers, more than the {cfg.num_layers} here"
        )
    state = read_drafter_state(checkpoint, device, torch.float32)
    own = drafter.state_dict()
    for name, tensor in state.items():
        if name == "kv_proj":  # [num_layers, 2 * kv_size, H]: the checkpoint's layers come first
            own[name][: tensor.shape[0]].copy_(tensor)
        elif name not in own or own[name].shape != tensor.shape:
            raise ValueError(f"init_from {checkpoint}: {name} does not fit this drafter")
        else:
            own[name].copy_(tensor)
    added = list(range(source_cfg.num_layers, cfg.num_layers))
    for i in added:
        layer: Any = drafter.layers[i]
        layer.self_attn.o_proj.weight.zero_()
        layer.down_proj.weight.zero_()
    return {"checkpoint": str(checkpoint), "layers_copied": source_cfg.num_layers, "layers_added": added}
