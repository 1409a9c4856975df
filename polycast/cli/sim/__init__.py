"""``polycast sim``: run collectives, an FSDP step, Chakra traces or a sweep on the simulated
network.

    polycast sim allgather --algo ring --nodes 188 --size 64MiB --topology fattree:radix=32
    polycast sim allgather --compare ring,mcast --nodes 188 --json
    polycast sim fsdp --model llama2-7b --nodes 64 --ag mcast --rs innet [--compare] [--plot F]
    polycast sim fsdp --model llama3-405b --nodes 1024 --shard 64 --ag mcast --rs innet
    polycast sim workload traces/llama --nodes 16 --algo allgather=mcast
    polycast sim sweep --collective allgather --algos ring,mcast --nodes 16,64 --sizes 1MiB,64MiB
    polycast sim sweep --algos mcast --link 100Gbps,400Gbps,1.6Tbps --nic 'bf3-dpa;host-python'

Each of its subcommands is a module of this package holding its arguments and its runner
(collective: one per collective; fsdp; workload; sweep); common.py holds what they share
(the network arguments, KEY=VALUE options, the progress spinner, the --stats figures).
"""

from __future__ import annotations

from . import collective, fsdp, sweep, workload


def add_parser(sub) -> None:
    p = sub.add_parser("sim", help="simulate collectives on a modelled datacenter network",
                       description="Run the real engine, one per rank, on a flow-level "
                                   "network model: any collective and algorithm, an FSDP "
                                   "training step, or a sweep.")
    ssub = p.add_subparsers(dest="what", metavar="COLLECTIVE|fsdp|workload|sweep")
    collective.add_parser(ssub)
    fsdp.add_parser(ssub)
    workload.add_parser(ssub)
    sweep.add_parser(ssub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
