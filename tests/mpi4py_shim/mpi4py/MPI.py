"""``mpi4py.MPI`` as far as polycast offers it: COMM_WORLD is ``polycast.init()``, the
constants and ops are polycast's, datatypes are numpy dtypes with mpi4py's few methods.
What polycast declines (derived datatypes, intercommunicators, one-sided, MPI handle
conversions, mpi4py's internal lock table...) is missing here on purpose: the tests that
need it fail with AttributeError and are reported (tests/test_mpi4py_interop.py lists them
with the reason)."""

from __future__ import annotations

import pickle as _pickle

import numpy as np

import polycast
from polycast import ops as _ops
from polycast.comm.persistent import Prequest  # noqa: F401
from polycast.errors import PolycastError

Exception = PolycastError  # noqa: A001
SUCCESS = 0
ERR_ROOT = 7
ERR_TYPE = 3
UNDEFINED = polycast.UNDEFINED
IN_PLACE = polycast.IN_PLACE
ANY_SOURCE, ANY_TAG, PROC_NULL = polycast.ANY_SOURCE, polycast.ANY_TAG, polycast.PROC_NULL
TAG_UB = polycast.TAG_UB
Status = polycast.Status
Request = polycast.Request
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
BOTTOM = object()
BSEND_OVERHEAD = 0
KEYVAL_INVALID = APPNUM = -1
ERR_ARG = 12
ERR_OTHER = 15
REQUEST_NULL = polycast.REQUEST_NULL
Message = polycast.Message
MESSAGE_NULL, MESSAGE_NO_PROC = polycast.MESSAGE_NULL, polycast.MESSAGE_NO_PROC


def _error_class(exc) -> int:
    """mpi4py's MPI.Exception.Get_error_class, for the tests that check which error."""
    return ERR_ROOT if "root" in str(exc) else ERR_ARG


PolycastError.Get_error_class = _error_class
PolycastError.Get_error_code = _error_class
OP_NULL = None


class Datatype:
    def __init__(self, name, code):
        self.name = name
        self.dtype = np.dtype(code) if code is not None else None

    def Get_size(self):
        return 0 if self.dtype is None else self.dtype.itemsize

    def Get_extent(self):
        return 0, self.Get_size()

    def Free(self):
        pass

    def __eq__(self, other):
        return isinstance(other, Datatype) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return f"<Datatype {self.name}>"


DATATYPE_NULL = Datatype("DATATYPE_NULL", None)
_TYPES = dict(BYTE="u1", CHAR="i1", SIGNED_CHAR="i1", UNSIGNED_CHAR="u1", SHORT="h",
              UNSIGNED_SHORT="H", INT="i", UNSIGNED="I", UNSIGNED_INT="I", LONG="l",
              UNSIGNED_LONG="L", LONG_LONG="q", UNSIGNED_LONG_LONG="Q", FLOAT="f",
              DOUBLE="d", LONG_DOUBLE="g", C_BOOL="?", BOOL="?", C_FLOAT_COMPLEX="F",
              C_DOUBLE_COMPLEX="D", C_LONG_DOUBLE_COMPLEX="G", INT8_T="i1", INT16_T="i2",
              INT32_T="i4", INT64_T="i8", UINT8_T="u1", UINT16_T="u2", UINT32_T="u4",
              UINT64_T="u8")
for _n, _c in _TYPES.items():
    globals()[_n] = Datatype(_n, _c)

SUM, PROD, MIN, MAX = _ops.SUM, _ops.PROD, _ops.MIN, _ops.MAX
LAND, LOR, LXOR, BAND, BOR, BXOR = _ops.LAND, _ops.LOR, _ops.LXOR, _ops.BAND, _ops.BOR, \
    _ops.BXOR
MAXLOC, MINLOC = _ops.MAXLOC, _ops.MINLOC
Op = polycast.Op
# MPI's REPLACE and NO_OP exist for one-sided accumulate; mpi4py's object methods take
# them as ``b`` and ``a``: here they are plain callables, which those methods accept.
REPLACE = staticmethod(lambda a, b: b).__func__
NO_OP = staticmethod(lambda a, b: a).__func__

COMM_WORLD = polycast.init()
COMM_SELF = COMM_WORLD.Split(COMM_WORLD.rank, 0)
COMM_NULL = None


_attached = [None]


def Attach_buffer(buf):
    """Bsend's buffer: polycast copies a buffered message itself, so this is only kept."""
    _attached[0] = buf


def Detach_buffer():
    buf, _attached[0] = _attached[0], None
    return buf


def Alloc_mem(nbytes, info=None):
    """MPI's memory for one-sided windows and registered transfers: plain host memory
    here (polycast registers nothing; a Bsend buffer is only kept, see above)."""
    return bytearray(int(nbytes))


def Free_mem(mem):
    pass


class Pickle:
    """mpi4py's ``MPI.pickle``: how object messages are serialised. polycast's object
    messages are plain pickles (highest protocol), so these are interchangeable with a
    buffer message of ``pickle.dumps(obj)``."""

    PROTOCOL = _pickle.HIGHEST_PROTOCOL

    def dumps(self, obj):
        return _pickle.dumps(obj, protocol=self.PROTOCOL)

    def loads(self, data):
        return _pickle.loads(data)


pickle = Pickle()


def Get_version():
    return (4, 0)


def Get_library_version():
    return f"polycast {getattr(polycast, '__version__', '')}"


def get_vendor():
    return ("polycast", (0, 0, 0))


def Query_thread():
    return THREAD_MULTIPLE


def Is_initialized():
    return True


def Is_finalized():
    return False


def Wtime():
    import time
    return time.monotonic()
