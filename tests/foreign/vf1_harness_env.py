"""A verifiers v1 taskset module that also exports a Harness of its own (the adapter refuses it)."""

from __future__ import annotations

import verifiers.v1 as vf
from vf1_envs import SumTaskset


class OwnHarness(vf.Harness[vf.HarnessConfig]):
    """A harness that would drive the model itself."""


__all__ = ["OwnHarness", "SumTaskset"]
