"""Models of the hardware polycast runs on or simulates (DESIGN.md's "models" layer).

``nic``  the SmartNIC's (or a host's) chunk rate on the multicast receive path: cores,
         hardware threads, clock and cycles per chunk -> sustainable link rate.

The network topologies the simulator uses live in :mod:`polycast.sim.topology`.
"""

from .nic import PRESETS, NicModel, NicSizing, nic_preset, parse_nic

__all__ = ["PRESETS", "NicModel", "NicSizing", "nic_preset", "parse_nic"]
