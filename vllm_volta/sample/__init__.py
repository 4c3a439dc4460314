"""Sampling: per-step metadata, logit transforms and the Sampler."""

from vllm_volta.sample.metadata import SamplingMetadata, make_generator
from vllm_volta.sample.sampler import Sampler, SamplerOutput

__all__ = ["Sampler", "SamplerOutput", "SamplingMetadata", "make_generator"]
