"""Builds the optional compiled helpers: the shared-memory rings' (polycast/runtime/transport/_ring.c,
with the compiled replay of a memoized small call, polycast/runtime/driver/_replay.c), the
multicast datagram path's (polycast/runtime/transport/_dgram*.c, parts listed in _dgram.h),
the symm barrier's and kept calls' (polycast/runtime/symm/_symm*.c, parts listed in
_symm.h), and the simulator's network model (polycast/sim/_network*.c, parts listed in
_network.h).

Everything else is declared in pyproject.toml. ``optional=True``: where no C compiler (or no
Python headers) is found, pip still installs polycast and the rings and the symm path run
in pure Python (runtime/transport/native.py and runtime/symm/barrier.py say which is in use at
POLYCAST_DEBUG=INFO; so does the simulator, for its network model).
"""
import sys

from setuptools import Extension, setup

ext_modules = []
if sys.platform.startswith("linux"):       # futexes and the ring layout are Linux-only
    ext_modules.append(Extension("polycast.runtime.transport._ring",
                                 ["polycast/runtime/transport/_ring.c",
                                  "polycast/runtime/driver/_replay.c"],
                                 depends=["polycast/runtime/transport/_ring.h", "polycast/runtime/transport/wait.h",
                                          "polycast/runtime/transport/ring_layout.h"],
                                 extra_compile_args=["-O2", "-std=gnu11"], optional=True))
    # The multicast datagram path (recvmmsg/GRO, sendmmsg/GSO, placement, BLAKE2b MACs).
    dgram = "polycast/runtime/transport/_dgram"
    ext_modules.append(Extension("polycast.runtime.transport._dgram",
                                 [f"{dgram}{part}.c" for part in ("", "_blake2b", "_place",
                                                                  "_read", "_send")],
                                 depends=[f"{dgram}.h", f"{dgram}_abi.h"],
                                 extra_compile_args=["-O3", "-std=gnu11", "-fvisibility=hidden"],
                                 optional=True))
    symm = "polycast/runtime/symm/_symm"
    ext_modules.append(Extension("polycast.runtime.symm._symm",
                                 [f"{symm}{part}.c" for part in ("", "_wait", "_fold", "_slots",
                                                                 "_fast", "_single")],
                                 depends=[f"{symm}.h", "polycast/runtime/transport/wait.h"],
                                 # (its parts share names like publish and release: not exported)
                                 extra_compile_args=["-O3", "-std=gnu11", "-fvisibility=hidden"],
                                 optional=True))

# The simulator's network model (polycast/sim/_network*.c; network.py runs the same model in
# Python without it). Portable C: built on every platform.
ext_modules.append(Extension("polycast.sim._network",
                             ["polycast/sim/_network.c", "polycast/sim/_network_settle.c",
                              "polycast/sim/_events.c"],
                             depends=["polycast/sim/_network.h"],
                             extra_compile_args=["-O2", "-std=gnu11", "-fvisibility=hidden"]
                             if sys.platform != "win32" else [],
                             optional=True))

setup(ext_modules=ext_modules)
