"""polycast.sim: the network simulator. It runs the real engine, one per rank, on a
flow-level model of a datacenter network (see :mod:`polycast.sim.network` for what is and
is not modelled).

* :func:`simulate` — one collective call -> :class:`SimResult`
* :func:`parse_topology`, :func:`single_switch`, :func:`leaf_spine`, :func:`fat_tree`
* :class:`Simulation` — the event clock, for several collectives at once
* :func:`run_workload` — a workload graph (polycast.workload: Chakra traces, FSDP/HSDP)
  on the simulated network (polycast.sim.pipeline)
* :func:`simulate_fsdp`, :func:`compare_fsdp` — an FSDP/HSDP step, layer by layer
* :mod:`polycast.sim.sweep`, :mod:`polycast.sim.trace`, :mod:`polycast.sim.plots`
"""

from .driver import SimConfig, Simulation, SimulationError
from .fsdp import MODELS, FsdpResult, compare_fsdp, simulate_fsdp
from .pipeline import PipelineResult, run_workload
from .simulate import SimResult, simulate
from .topology import Topology, fat_tree, leaf_spine, parse_topology, single_switch

__all__ = ["SimConfig", "Simulation", "SimulationError", "MODELS", "FsdpResult",
           "compare_fsdp", "simulate_fsdp", "PipelineResult", "run_workload", "SimResult",
           "simulate", "Topology", "fat_tree", "leaf_spine", "parse_topology", "single_switch"]
