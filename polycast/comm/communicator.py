"""The user's communicator, assembled from modules each readable alone."""

from __future__ import annotations

from .collectives import BufferCollectives
from .core import CommCore
from .objects import ObjectMethods
from .ordered import OrderedReductions
from .p2p import PointToPointMethods
from .persistent import PersistentCollectives
from .vector import VectorCollectives


class Comm(BufferCollectives, VectorCollectives, PersistentCollectives, PointToPointMethods,
           OrderedReductions, ObjectMethods, CommCore):
    """A communicator. Made by :func:`polycast.init` (the world), :meth:`Split` and
    :meth:`Dup`. mpi4py's buffer methods (:mod:`.collectives`), vector and scan
    collectives (:mod:`.vector`), persistent ones (:mod:`.persistent`), point-to-point
    (:mod:`.p2p`), lowercase object methods (:mod:`.objects`); identity, posting and
    Split/Dup/Free in :mod:`.core`; which algorithm a call runs in :mod:`.choice`."""
