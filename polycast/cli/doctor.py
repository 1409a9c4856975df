"""``polycast doctor``: check this machine for polycast and say what to change.

    polycast doctor                      # shm, loopback multicast, socket buffers, open files
    polycast doctor --iface eth0         # also the interface facing the other hosts
    polycast doctor --iface eth0 --probe # ... and join a group there (IGMP on that LAN)
    polycast doctor --json

Exit status 0 when nothing FAILs (warnings are advice), 1 otherwise, 2 for bad input.
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor", help="check this machine (shm, multicast, socket buffers, open files)",
        description="Check shared memory, multicast on loopback (and on --iface), socket "
                    "buffer limits and the open-file limit; say what to change.")
    p.add_argument("--iface", default=None, metavar="NAME",
                   help="also check this interface for multi-host multicast (e.g. eth0)")
    p.add_argument("--probe", action="store_true",
                   help="with --iface: join a group there and send one datagram (TTL 0)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import InvalidArgument
    from ..tools.doctor import FAIL, run_checks
    if args.probe and args.iface is None:
        raise InvalidArgument("--probe needs --iface (loopback is always probed)")
    checks = run_checks(args.iface, args.probe)
    if args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=1))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{c.status:4s}  {c.name:{width}s}  {c.found}")
            if c.change:
                print(f"{'':4s}  {'':{width}s}  -> {c.change}")
    return 1 if any(c.status == FAIL for c in checks) else 0
