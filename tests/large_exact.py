"""A rank of tests/test_cma.py's large-message checks: allgather, allreduce and broadcast of
100 KiB .. 12 MiB on the engine path, exact against numpy; prints one ``LARGE OK`` line with
this rank's single-copy and TCP lazy/streamed counts."""

import sys

import numpy as np

import polycast.comm as pc


def main() -> int:
    pc.init()
    comm = pc.world()
    P, r = comm.size, comm.rank
    bad = []
    for nbytes in (100 << 10, 3 << 20, 12 << 20):
        n = nbytes // 4 // P
        send = (np.arange(n, dtype=np.float32) + r * n)
        got = np.empty(n * P, np.float32)
        comm.Allgather(send, got, algorithm="ring")
        if not (got == np.arange(n * P, dtype=np.float32)).all():
            bad.append(f"allgather {nbytes}")
        x = np.full(n * P, r + 1, np.float32)
        y = np.empty_like(x)
        comm.Allreduce(x, y, algorithm="ring")
        if not (y == P * (P + 1) / 2).all():
            bad.append(f"allreduce {nbytes}")
        b = np.arange(n * P, dtype=np.float32) if r == 1 else np.zeros(n * P, np.float32)
        comm.Bcast(b, root=1, algorithm="binomial")
        if not (b == np.arange(n * P, dtype=np.float32)).all():
            bad.append(f"broadcast {nbytes}")
    peers = comm._driver.peers
    lazy = sum(p.tcp.lazy_frames for p in peers.world.peers.values())
    streamed = sum(p.tcp.streamed_frames for p in peers.world.peers.values())
    comm.Barrier()
    print(f"LARGE {'OK' if not bad else 'FAILED ' + ','.join(bad)} single_copy={peers.cma_sent}"
          f"/{peers.cma_read} tcp_lazy={lazy} tcp_streamed={streamed}", flush=True)
    pc.finalize()
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
