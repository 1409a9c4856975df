"""polycast's exceptions.

Every error polycast raises on purpose is a :class:`PolycastError`. Errors that come from
bad arguments also derive from :class:`ValueError`, so code written against numpy/mpi4py
conventions (``except ValueError``) keeps working.
"""

from __future__ import annotations


class PolycastError(Exception):
    """Base class of every polycast error.

    ``caused_by``: the rank whose failure made this one happen (it aborted the collective
    here, or was lost), or None when the error is this rank's own."""

    caused_by: int | None = None


class InvalidArgument(PolycastError, ValueError):
    """An argument is out of range, malformed or inconsistent with the others."""


class UnknownName(InvalidArgument):
    """A name (collective, algorithm, op, topology, model, unit...) that polycast does not know.

    The message lists the valid choices.
    """

    def __init__(self, what: str, name: object, choices) -> None:
        self.what, self.name, self.choices = what, name, sorted(choices)
        super().__init__(f"unknown {what} {name!r}; valid choices: {', '.join(self.choices)}")


class Unsupported(InvalidArgument):
    """A valid name used where it does not apply (an algorithm for a collective or rank count)."""


class ScheduleError(PolycastError):
    """A schedule violates the IR's rules (found by the builder or the verifier)."""


class ProtocolError(PolycastError):
    """A message or datagram that cannot be accepted: malformed, forged, stale or unexpected."""


class MismatchError(PolycastError):
    """Ranks called a collective differently (collective, size, dtype, op, root or algorithm)."""


class PeerLost(PolycastError):
    """A peer rank died or stopped answering."""

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = self.caused_by = rank
        super().__init__(f"lost rank {rank}" + (f": {detail}" if detail else ""))


class CollectiveTimeout(PolycastError, TimeoutError):
    """A bounded wait ran out."""


class OffloadLost(PolycastError):
    """The offload process that carries this rank's communication (``progress="offload"``)
    died, or could not be started or reached."""
