"""Workloads as graphs of compute and communication nodes per rank (Chakra's shape).

* :mod:`.graph` -- :class:`Node`, :class:`Workload`, :func:`validate`
* :mod:`.models` -- transformer presets (Llama 2/3, GPT-3) and their FLOPs
* :mod:`.fsdp` -- an FSDP/HSDP training step as a graph, in FSDP2's order
* :mod:`.chakra` -- MLCommons Chakra execution traces in and out (the chakra extra)

Pure data: running a workload is :mod:`polycast.sim.pipeline`'s.
"""

from .graph import Node, Workload, WorkloadError, validate

__all__ = ["Node", "Workload", "WorkloadError", "validate"]
