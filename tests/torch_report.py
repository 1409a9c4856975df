"""How the multi-rank torch test workers report: one JSON file per rank (stdout lines of
several ranks interleave), read back by torch_helpers.results."""

from __future__ import annotations

import json
import os
from pathlib import Path


def report(obj, rank: int) -> None:
    path = Path(os.environ["RESULT_DIR"]) / f"rank-{rank}.json"
    path.write_text(json.dumps(obj))
