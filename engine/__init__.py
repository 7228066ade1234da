"""dspark-serve's engine: a PyTorch + Triton LLM engine with DSpark speculative decoding."""

from engine.config import EngineConfig, ModelConfig, SpeculativeConfig
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "ModelConfig", "RequestOutput", "SamplingParams", "SpeculativeConfig"]


def __getattr__(name: str) -> object:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(name)
