"""polycast's configuration: every ``POLYCAST_*`` parameter, typed, validated and documented
in one frozen dataclass, read from the environment once.

When a job or a communicator is made (``polycast.init()``, a polycast.torch process group,
the offload process, a CLI command) it takes a :class:`Config` -- :func:`current`: the
innermost :func:`override`, else the environment read then -- and hands it down: Comm,
dispatch, driver, symmetric memory and offload take their settings from it and never read
the environment again, so a variable set later changes nothing for a communicator that
exists (NCCL reads each parameter once the same way). A bad value is a one-line
:class:`~polycast.errors.InvalidArgument` naming the variable and what it accepts; a set
``POLYCAST_*`` name polycast does not know gets a warning naming the nearest known one;
with ``POLYCAST_DEBUG=INFO`` each variable that is set is logged once.
``polycast config`` prints the effective settings and where each came from;
docs/configuration.md is generated from this module (``polycast config --markdown``).

Test hooks: ``POLYCAST_TEST_HOOKS="native=0,replay=0"`` switches implementations so tests
and benchmarks can compare paths in one run (:class:`Hooks`). They are not settings for
users; rank processes a test starts inherit the variable like any other.

The package, by what each module holds:

* ``params``: the table -- :class:`Config`'s fields (variable, default, parser, doc),
  :class:`Hooks`, the launcher's job variables and the retired switches. To add a
  parameter: a field there with ``_param`` (variable, doc, parser), then read it from the
  Config the code is handed (``comm.config``, ``driver.config``...), never from the
  environment; regenerate the doc (``polycast config --markdown > docs/configuration.md``).
* ``parse``: text -> value for each kind of parameter, and how a value is shown.
* ``environment``: :func:`load`, :func:`current`, :func:`override`, :func:`read_var`; the
  warning for an unknown name and the INFO log of the set ones.
* ``page``: docs/configuration.md (:func:`markdown`).
"""

from .environment import current, load, override, read_var, reset_logged
from .page import markdown
from .params import (ALGO_VARS, HOOKS_VAR, JOB_VARIABLES, PREFIX, RETIRED, Config, Hooks,
                     algorithm_var, known_variables)
from .parse import DEBUG_LEVELS, parse_bool

__all__ = ["ALGO_VARS", "DEBUG_LEVELS", "HOOKS_VAR", "JOB_VARIABLES", "PREFIX", "RETIRED",
           "Config", "Hooks", "algorithm_var", "current", "known_variables", "load",
           "markdown", "override", "parse_bool", "read_var", "reset_logged"]
