"""polycast.runtime: the real-process driver of the engine, in layers a reader can take
one at a time (each imports only the ones below it; pyproject.toml's import-linter
contracts check it):

=============== ==========================================================================
package         what it holds
=============== ==========================================================================
offload/        the per-host offload process: carries every local rank's communication
symm/           symmetric memory on one host: peers read each other's buffers
driver/         the engines' driver: progress thread, actions, peer I/O, datagrams,
                timers, Request, the compiled replay of a repeated call (``_replay.c``)
bootstrap/      the job: its environment (polycast run, torchrun, mpiexec, srun), the
                rendezvous store and its authentication, the connected world, the
                engine configuration, the rank's failure report to its launcher
transport/      moving bytes: framing, TCP links, shared-memory rings (``_ring.c``),
                single-copy reads, futex wake-ups, the one wait policy every waiter
                follows (``wait.py``, ``wait.h``), UDP multicast, fault injection
=============== ==========================================================================

The user API is :mod:`polycast.comm` (``polycast.init()``); which path runs a call is
:mod:`polycast.dispatch`'s; the launcher, doctor, self-test and benchmark ranks are
programs around the library (:mod:`polycast.tools`).
"""
