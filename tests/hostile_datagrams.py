"""A rank script for tests/test_auth.py: 4 ranks run multicast allgathers while rank 0 also
plays an attacker on the job's multicast group. It records the authentic datagrams of the
first collective, then before every later one sends them again (replays of an earlier
collective), forged copies (no MAC, wrong MAC), datagrams of another communicator and
garbage; with a secret it also hands its own driver forged control frames. Every rank
checks its results exactly and prints one ``HOSTILE {json}`` line with its drop counters."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import polycast
from polycast.engine import wire
from polycast.runtime.transport.mcast import open_group

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 4
COUNT = 4096                        # float32 per rank: 16 KiB shards, a few datagrams each


def main() -> None:
    comm = polycast.init()
    drv = comm._driver
    world = drv.world
    secret = drv.engine_config.secret
    P, r = comm.size, comm.rank
    sniffer = group = None
    if r == 0:
        sniffer, group = open_group(world.job_id, 0, world.single_host)
    send = np.full(COUNT, r + 1, np.float32)
    recv = np.zeros(COUNT * P, np.float32)
    comm.Allgather(send, recv, algorithm="mcast")
    recorded = []
    if r == 0:
        while True:
            try:
                recorded.append(sniffer.recv(65536))
            except BlockingIOError:
                break
        assert recorded, "the sniffer saw no datagrams"
    comm.Barrier()
    forged_frames = 0
    for k in range(1, ROUNDS + 1):
        if r == 0:
            forged_frames += attack(sniffer, group, recorded, secret, drv, k)
        comm.Barrier()
        send[:] = (r + 1) * (k + 1)
        comm.Allgather(send, recv, algorithm="mcast")
        want = np.repeat(np.arange(1, P + 1, dtype=np.float32) * (k + 1), COUNT)
        assert np.array_equal(recv, want), f"round {k}: wrong allgather result"
    comm.Barrier()
    drops = dict(comm.stats().drops)
    print("HOSTILE " + json.dumps({"rank": r, "drops": drops, "rounds": ROUNDS,
                                   "recorded": len(recorded), "secret": secret is not None,
                                   "frames_dropped": forged_frames}), flush=True)
    if sniffer is not None:
        sniffer.close()


def attack(sock, group, recorded, secret, drv, k: int) -> int:
    """One burst on the group before round k; returns how many forged control frames the
    driver dropped and counted (2 per round)."""
    n = 0
    for data in recorded:                               # replays of collective 1
        sock.sendto(data, group)
    nranks = drv.world.size
    for i, data in enumerate(recorded[:12]):
        h, payload = wire.parse_datagram(data, secret)
        src = 1 + i % (nranks - 1)          # every rank but the sender's own hears some
        if secret:
            # Altered (the source rank, or a payload byte): the MAC no longer matches.
            bad = wire.make_header(h.kind, h.comm, h.seq, src, h.tag, h.offset, h.length,
                                   h.sig, h.stream, wire.F_MAC)
            sock.sendto(bad._fixed(wire.F_MAC) + h.mac + bytes(payload), group)
            # A forger without the secret: a MAC-less header for the *next* collective.
            fake = wire.make_header(h.kind, h.comm, h.seq + 2 * k + 1, src, h.tag,
                                    h.offset, h.length, h.sig, h.stream)
            sock.sendto(fake.pack() + bytes(payload), group)
        else:
            # Another communicator's datagram reaching this group (ignored, counted).
            other = wire.make_header(h.kind, h.comm + 7, h.seq, src, h.tag, h.offset,
                                     h.length, h.sig, h.stream)
            sock.sendto(other.pack() + bytes(payload), group)
    sock.sendto(os.urandom(60), group)                  # garbage
    if secret:
        # Control frames as a peer link would hand them over: missing and wrong MAC.
        fin = wire.make_header(wire.MsgKind.FIN, 0, 10_000 + k, 1, 0, 0, 0, 0)
        with drv.progress.lock:
            drops = drv.stats(0).drops
            before = drops.get("unauthenticated", 0) + drops.get("bad_mac", 0)
            drv._on_frame(1, fin.pack(), b"")
            drv._on_frame(1, fin.pack(b"not the job key"), b"")
            n += drops.get("unauthenticated", 0) + drops.get("bad_mac", 0) - before
    return n


if __name__ == "__main__":
    main()
