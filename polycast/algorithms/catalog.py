"""Imports every generator module so that each registers its algorithms."""

from . import allgather  # noqa: F401
from . import broadcast  # noqa: F401
from . import reduce  # noqa: F401
from . import rooted  # noqa: F401
from . import alltoall  # noqa: F401
from . import barrier  # noqa: F401
from . import reduce_scatter  # noqa: F401
from . import allreduce  # noqa: F401
from . import hierarchical  # noqa: F401
from . import innet  # noqa: F401
from . import scan  # noqa: F401
from . import compact  # noqa: F401  (vectorised columns of some of the above)
