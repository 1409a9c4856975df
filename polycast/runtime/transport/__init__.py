"""How bytes move between ranks: the framing (``frames``), TCP links (``tcp``),
shared-memory rings (``shm``, with the compiled hot path ``_ring.c`` chosen by
``native``), single-copy reads (``cma``) and payloads read late (``lazy``), futex
wake-ups (``futex``), how a rank waits for its peers (``wait``: one policy, and its
compiled twin ``wait.h``), UDP multicast groups (``mcast``) and the fault injection applied
where datagrams are read (``faults``). Nothing here knows about collectives."""
