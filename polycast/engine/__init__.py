"""polycast.engine: the sans-I/O per-rank state machine, its wire format and actions."""

from .actions import (Action, CancelTimer, Complete, Copy, Deliver, Fail, Multicast, Region,
                      Send, SetTimer)
from .engine import Engine, EngineConfig, EngineStats
from .wire import (HEADER_NBYTES, MAC_NBYTES, Header, MsgKind, header_nbytes, parse_datagram,
                   parse_header, verify_mac)

__all__ = ["Action", "CancelTimer", "Complete", "Copy", "Deliver", "Fail", "Multicast",
           "Region", "Send", "SetTimer", "Engine", "EngineConfig", "EngineStats",
           "HEADER_NBYTES", "MAC_NBYTES", "Header", "MsgKind", "header_nbytes",
           "parse_datagram", "parse_header", "verify_mac"]
