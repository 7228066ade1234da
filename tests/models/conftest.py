"""Fixtures of the model and loader tests: the embedded SmolLM2 (ours and Hugging Face's,
each loaded once per session) and random-weight Hugging Face checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # model_harness, for any import mode
sys.path.insert(0, str(Path(__file__).parents[2]))  # tests.data.prompts

from engine.loader.load import LoadedModel, load_model  # noqa: E402
from engine.loader.resolve import resolve_model  # noqa: E402


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    return load_model("smollm2-135m", dtype="float32", device="cpu", progress=False)


@pytest.fixture(scope="session")
def hf_smollm2() -> torch.nn.Module:
    """transformers' own model from the same GGUF (its dequantisation and q/k un-permutation)."""
    return hf_model_from_gguf(resolve_model("smollm2-135m").path)


def hf_model_from_gguf(path: Path) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        import accelerate  # noqa: F401  (transformers needs it for from_pretrained(gguf_file=))

        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        return model.eval()
    except ImportError:
        pass
    # The same steps from_pretrained takes for a GGUF (its legacy-architecture path), without
    # the accelerate dependency.
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.eval()
