"""docs/configuration.md, generated from the parameter table (``polycast config
--markdown``; tests/test_config.py fails when the committed page is stale)."""

from __future__ import annotations

import dataclasses

from ..collectives import Collective
from .params import ALGO_VARS, BY_VAR, HOOKS_VAR, JOB_VARIABLES, PARAMS, Config, Hooks
from .parse import as_text


def markdown() -> str:
    """docs/configuration.md: every parameter, generated from :class:`Config`."""
    lines = ["# Configuration", "",
             "<!-- Generated from polycast/config/params.py by `polycast config --markdown > "
             "docs/configuration.md`; tests/test_config.py fails when it is stale. -->", "",
             "polycast reads its `POLYCAST_*` variables once, when a job or communicator is "
             "made, and hands them down; setting one later changes nothing for a "
             "communicator that exists. A bad value is an error naming the variable; an "
             "unknown `POLYCAST_*` name is warned about. `polycast config` prints the "
             "effective settings and where each came from; `POLYCAST_DEBUG=INFO` logs each "
             "set variable once. Booleans take 1/true/yes/on or 0/false/no/off; sizes take "
             "bytes or units (64KiB, 8MiB).", "",
             "| variable | default | what it does |", "|---|---|---|"]
    cfg = Config()
    for var, value, _ in cfg.settings():
        if var in ALGO_VARS:
            continue
        f = BY_VAR[var]
        if f.name == "hooks":
            continue
        lines.append(f"| `{var}` | {value} | {f.metadata['doc']} |")
    algo = next(f for f in PARAMS if f.name == "algorithms")
    lines.append(f"| `POLYCAST_<COLLECTIVE>_ALGO` | auto | {algo.metadata['doc']}; "
                 f"collectives: {', '.join(c.name for c in Collective)} |")
    lines += ["", "## Set by the launcher", "",
              "`polycast run` sets these for each rank (torchrun's, mpiexec's and srun's own "
              "variables work too); they say where a process sits in the job.", "",
              "| variable | what it says |", "|---|---|"]
    lines += [f"| `{var}` | {doc} |" for var, doc in JOB_VARIABLES.items()]
    lines += ["", "## Test hooks", "",
              f"`{HOOKS_VAR}` takes `name=value` pairs separated by commas; they switch "
              "implementations so tests and benchmarks can compare paths in one run, and "
              "are not settings for users.", "", "| hook | default | what it switches |",
              "|---|---|---|"]
    for f in dataclasses.fields(Hooks):
        d = f.default
        lines.append(f"| `{f.name}` | {as_text(d) if d != '' else '(unset)'} | "
                     f"{f.metadata['doc']} |")
    return "\n".join(lines) + "\n"
