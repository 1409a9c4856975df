"""Which path runs a call: the one dispatch of every communicator's calls (``call``: the
kept compiled calls, the route to symmetric memory, the engine; and what is kept for it),
the planner's answers for a communicator (``choice``) and the symmetric-memory route on one
host (``routing``)."""

from .call import Dispatch, Form, methods

__all__ = ["Dispatch", "Form", "methods"]
