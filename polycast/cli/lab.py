"""``polycast lab up|run|status|down``: an emulated leaf-spine cluster in network namespaces
(root only; see :mod:`polycast.lab`)."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import InvalidArgument


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "lab", help="an emulated leaf-spine cluster in network namespaces (root)",
        description="Hosts are network namespaces, leaves and the spine are bridges, links "
                    "are veth pairs shaped by tbf in both directions. Root only; nothing "
                    "outside the lab's own namespaces is touched.")
    sub = p.add_subparsers(dest="lab_command", metavar="up|run|status|down")
    sub.required = True

    up = sub.add_parser("up", help="build a lab")
    _name(up)
    up.add_argument("--hosts", default="8", help="host namespaces (default 8)")
    up.add_argument("--leaves", default="2", help="leaf switches; hosts fill them in order "
                                                 "(default 2; 1 = one flat LAN)")
    up.add_argument("--link", default="1Gbps",
                    help="host link rate each way, e.g. 200Mbps, 1Gbps, or 'none' (default 1Gbps)")
    up.add_argument("--uplink", default=None,
                    help="leaf uplink rate (e.g. 1Gbps) or oversubscription (e.g. 4:1); "
                         "default 1:1. With --link none a rate shapes the uplinks alone")
    up.add_argument("--mtu", default="9000", help="MTU of every link (default 9000)")
    up.add_argument("--buffer", default=None,
                    help="egress queue of every port, as time at its rate (default 50ms)")
    up.add_argument("--json", action="store_true", help="print the lab as JSON")
    up.set_defaults(func=_up)

    run = sub.add_parser("run", help="run a command as ranks on the lab's hosts: lab run "
                                     "[--ranks-per-host R] -- python script.py ARGS")
    _name(run)
    run.add_argument("-n", "--nranks", type=int, default=None,
                     help="ranks (default: every host, --ranks-per-host each)")
    run.add_argument("--ranks-per-host", type=int, default=1, metavar="R",
                     help="consecutive ranks per host (default 1); each gets LOCAL_RANK "
                          "0..R-1 of LOCAL_WORLD_SIZE R (and the POLYCAST_ ones)")
    run.add_argument("--placement", default="linear",
                     help="node -> host: linear, interleave (alternate leaves), random:SEED, "
                          "or a host list 0,4,1,5,... (one host per R ranks)")
    run.add_argument("--timeout", type=float, default=None, help="end the job after S seconds")
    run.add_argument("--counters", action="store_true",
                     help="print the bytes each link moved during the run")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- python script.py ARGS")
    run.set_defaults(func=_run)

    st = sub.add_parser("status", help="hosts, links and their byte counters")
    _name(st)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_status)

    down = sub.add_parser("down", help="remove the lab (exactly what `up` made)")
    _name(down)
    down.set_defaults(func=_down)


def _name(p) -> None:
    from ..lab.plan import DEFAULT_NAME
    p.add_argument("--name", default=DEFAULT_NAME,
                   help=f"the lab's name, prefix of its namespaces (default {DEFAULT_NAME})")


def _up(args) -> int:
    from ..lab import LabPlan, netns
    plan = LabPlan.parse(name=args.name, hosts=args.hosts, leaves=args.leaves, link=args.link,
                         uplink=args.uplink, mtu=args.mtu, buffer=args.buffer)
    netns.up(plan)
    _cpu_note(plan)
    if args.json:
        print(json.dumps({"plan": plan.to_json(), "namespaces": plan.namespaces()}))
    else:
        print(plan.describe())
        print(f"up: {len(plan.namespaces())} namespaces ({plan.host_ns(0)} .. "
              f"{plan.host_ns(plan.hosts - 1)}, hosts {plan.addr(0)}..{plan.addr(plan.hosts - 1)}); "
              f"`polycast lab run -- python script.py`, `polycast lab down`")
    return 0


# Measured with bench/lab.py: 8 ranks moving 8 x 100 Mbit/s each way kept about one core
# busy (Python ranks, kernel bridges and tbf included).
HOST_TRAFFIC_BPS_PER_CORE = 0.8e9


def _cpu_note(plan) -> None:
    """Say so when the lab's links are faster than this machine's cores can feed."""
    import os
    if plan.link_bps is None:
        return
    need = plan.hosts * plan.link_bps / HOST_TRAFFIC_BPS_PER_CORE
    cores = os.cpu_count() or 1
    if need > 0.75 * cores:
        print(f"note: {plan.hosts} hosts x {plan.link_bps / 1e9:g} Gbit/s would need about "
              f"{need:.1f} cores of the {cores} here (about "
              f"{HOST_TRAFFIC_BPS_PER_CORE / 1e9:g} Gbit/s of host traffic per core, "
              "bench/lab.py); runs will be CPU-bound, not link-bound: lower --link",
              file=sys.stderr)


def _run(args) -> int:
    from ..lab import counters, runner
    from ..lab.netns import current
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise InvalidArgument("nothing to run: `polycast lab run -- python script.py ARGS`")
    if args.timeout is not None and args.timeout <= 0:
        raise InvalidArgument(f"--timeout {args.timeout}: must be > 0 seconds")
    plan = current(args.name)
    runner.placement(plan, args.placement, args.nranks,        # bad input fails before work
                     args.ranks_per_host)
    before = counters.read(plan) if args.counters else None
    status, _ = runner.run(command, name=args.name, nranks=args.nranks, where=args.placement,
                           timeout_s=args.timeout, ranks_per_host=args.ranks_per_host)
    if before is not None:
        moved = counters.diff(counters.read(plan), before)
        print(_link_table(plan, moved, None), file=sys.stderr)
    return status


def _link_table(plan, snap, drops) -> str:
    from ..lab import counters
    lines = [f"{'link':18} {'layer':10} {'rate':>10} {'bytes':>14} {'packets':>10}"
             + (f" {'drops':>7}" if drops is not None else "")]
    for link in plan.links():
        rate = "-" if link.rate_bps is None else f"{link.rate_bps / 1e6:g}Mbps"
        line = (f"{link.name:18} {link.layer:10} {rate:>10} {snap.nbytes[link.name]:14,d} "
                f"{snap.packets[link.name]:10,d}")
        if drops is not None:
            line += f" {drops.get(link.name, 0):7d}"
        lines.append(line)
    for layer, n in counters.by_layer(plan, snap).items():
        lines.append(f"{'total ' + layer:29} {'':>10} {n:14,d}")
    return "\n".join(lines)


def _status(args) -> int:
    from ..lab import counters, netns
    state = netns.read_state(args.name)
    if state is None:
        others = netns.labs_up()
        print(f"no lab named {args.name!r} is up" + (f" (up: {', '.join(others)})" if others else ""))
        return 1
    from ..lab import LabPlan
    plan = LabPlan.from_json(state["plan"])
    if state.get("status") != "up":
        print(f"lab {args.name!r}: {state.get('status')} (pid {state.get('pid')}); "
              f"`polycast lab down --name {args.name}` removes it")
        return 1
    snap = counters.read(plan)
    drops = counters.qdisc_drops(plan)
    if args.json:
        print(json.dumps({"plan": plan.to_json(), "namespaces": state["namespaces"],
                          "link_bytes": snap.nbytes, "link_packets": snap.packets,
                          "drops": drops, "by_layer": counters.by_layer(plan, snap)}))
        return 0
    print(plan.describe())
    for k in range(plan.hosts):
        print(f"  host {k}: {plan.host_ns(k)} {plan.addr(k)} on leaf{plan.leaf_of(k)}")
    print(_link_table(plan, snap, drops))
    return 0


def _down(args) -> int:
    from ..lab import netns
    gone = netns.down(args.name)
    print(f"lab {args.name!r} down: {len(gone)} namespaces removed")
    return 0
