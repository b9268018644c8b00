"""Engines: in-process torch sampling, OpenAI-compatible servers, and a scripted engine for tests."""

from looprl.engines.base import Engine, GenerationRequest

__all__ = ["Engine", "GenerationRequest"]
