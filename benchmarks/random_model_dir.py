"""A Llama-3-8B-shaped checkpoint (8k context, RoPE theta 500k, no scaling) of random
weights, in Hugging Face layout, for serving benchmarks that load a model from disk
(`dspark-serve up --model DIR`): speed does not depend on weight values. The tokenizer
comes from a real model's directory, so prompts and chat templates are real; the
vocabulary is that tokenizer's.

    python benchmarks/random_model_dir.py --tokenizer TOKENIZER_DIR --out DIR [--device cuda]

Weights are N(0, 0.02) in bf16 (norms 1), drawn on `--device` and written one safetensors
file per layer.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128


def config(vocab_size: int, layers: int, bos: int | None, eos: int | None) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    }


def layer_shapes(i: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{i}."
    return {
        p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        p + "mlp.gate_proj.weight": (INTER, HIDDEN),
        p + "mlp.up_proj.weight": (INTER, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTER),
        p + "input_layernorm.weight": (HIDDEN,),
        p + "post_attention_layernorm.weight": (HIDDEN,),
    }


def random_tensors(shapes: dict[str, tuple[int, ...]], gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, 0.02, generator=gen)
            out[name] = t.cpu()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="a model directory holding tokenizer files")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=32, help="fewer for a quick check of the layout")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.tokenizer.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, args.out / f.name)
    vocab = len(tokenizer)
    cfg = config(vocab, args.layers, tokenizer.bos_token_id, tokenizer.eos_token_id)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    outer = {
        "model.embed_tokens.weight": (vocab, HIDDEN),
        "lm_head.weight": (vocab, HIDDEN),
        "model.norm.weight": (HIDDEN,),
    }
    save_file(random_tensors(outer, gen, args.device), str(args.out / "model-outer.safetensors"))
    for i in range(args.layers):
        save_file(random_tensors(layer_shapes(i), gen, args.device), str(args.out / f"model-layer{i:02d}.safetensors"))
    print(f"{args.out}: Llama-3-8B shape, vocabulary {vocab}, random bf16 weights")


if __name__ == "__main__":
    main()
