"""``polycast lab``: an emulated leaf-spine cluster in network namespaces (root only).

* :mod:`.plan` — the shape (hosts, leaves, rates, MTU), names, links, and the simulator's
  topology of the same lab; pure, nothing touched.
* :mod:`.netns` — building and removing it with ``ip``/``tc``, the state file that makes
  ``down`` exact even after a crash.
* :mod:`.counters` — kernel byte counters per link direction, grouped by layer.
* :mod:`.runner` — ranks placed on the host namespaces (``lab run``, R ranks per host),
  counter marks.
* :mod:`.marks` — the rank side of counter marks.
"""

from .netns import LabError, current, down, unavailable_reason, up
from .plan import LabPlan, Link

__all__ = ["LabError", "LabPlan", "Link", "current", "down", "unavailable_reason", "up"]
