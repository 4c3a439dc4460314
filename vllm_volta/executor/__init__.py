"""Executors: how the engine reaches its model workers."""
from vllm_volta.executor.abstract import Executor

__all__ = ["Executor"]
