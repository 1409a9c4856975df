"""Job secrets, keys and handshakes: who may join a job and whose packets count.

Threat model
============

polycast protects a job against **other parties on the network** that are not part of it:
another job (by accident: the same multicast group or port), a port scanner, or someone on
the LAN who sends to the job's multicast group or connects to its rendezvous store or its
ranks' listening ports (on purpose). It does **not** protect against code running as the same
user on a rank's host (it can read the secret from the environment and the shared memory;
it can ptrace the process anyway), against an attacker on the path of an established TCP
connection (who can also just drop it), and it does not keep data confidential: nothing is
encrypted, and anyone who receives the multicast traffic can read it.

Without a secret the handshakes below still run, with keys derived from public values, and
every job and communicator has its own multicast group (from the job id, unique per start,
and the communicator id); a datagram of another job or communicator that reaches a rank
anyway is ignored (communicator id, sequence number, call signature) and counted. A
deliberate forger is not stopped.

With a shared secret (``POLYCAST_SECRET`` on every rank, or ``polycast run --secret``):

* the **rendezvous store** runs a challenge-response handshake with every client (fresh
  nonces both ways, a keyed BLAKE2b MAC over them; the secret never crosses the wire) and
  refuses — and counts — a client that fails it; each store message afterwards carries a MAC
  with a per-connection key and a counter, so it cannot be forged or replayed;
* the **connection between two ranks** starts with the same kind of handshake (either side
  refuses a peer that cannot prove it holds the job key);
* every **message and multicast datagram** carries a 16-byte keyed BLAKE2b MAC over its
  header and payload (:mod:`polycast.engine.wire`); those with a missing or wrong MAC are
  dropped and counted (``stats().drops``: ``unauthenticated``, ``bad_mac``);
* the key is **per job**: derived from the secret and the job id, which rank 0 makes unique
  at every start (the launcher's id plus random bytes). A datagram recorded in an earlier job with the same secret
  fails the MAC; one replayed from an earlier collective of this job carries an old sequence
  number (inside the MAC) and is dropped as stale; one from another communicator carries
  that communicator's id and is dropped as foreign.

The secret is any non-empty string; it is hashed to a 32-byte key, so its length does not
matter (a long random one — ``polycast run --secret`` draws 32 random bytes — is the point).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket

from ...config import read_var
from ...errors import PolycastError

ENV = "POLYCAST_SECRET"
NONCE_NBYTES = 16
MAC_NBYTES = 16


class AuthenticationFailed(PolycastError):
    """A peer or the store could not prove it holds the job's secret (or we could not)."""


def secret_key(text: str | None) -> bytes | None:
    """The 32-byte master key from the job's secret (the configuration's
    ``POLYCAST_SECRET``), or None when there is none."""
    if text is None:
        return None
    return hashlib.blake2b(text.encode(), digest_size=32, person=b"polycast-secret").digest()


def secret_from_env(env=None) -> bytes | None:
    """The master key from ``POLYCAST_SECRET`` in ``env`` (default ``os.environ``), or
    None when it is not set; set but empty is an error."""
    return secret_key(read_var(ENV, env))


def new_secret() -> str:
    """A fresh random secret for a job (what ``polycast run --secret`` hands its ranks)."""
    return secrets.token_urlsafe(32)


def derive(key: bytes | None, purpose: str, *parts: bytes | str) -> bytes:
    """A 32-byte key for one purpose from the master key (or from public values only, when
    there is no secret: then it tells jobs apart but authenticates nothing)."""
    h = hashlib.blake2b(key=key or b"", digest_size=32, person=b"polycast-derive")
    h.update(purpose.encode())
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(4, "big") + b)
    return h.digest()


def mac(key: bytes, *parts) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=MAC_NBYTES)
    for p in parts:
        h.update(p)
    return h.digest()


def job_key(secret: bytes | None, job_id: str) -> bytes | None:
    """The key of every message and datagram of this job (``job_id`` is unique per start,
    runtime/bootstrap/world.py), or None without a secret."""
    if secret is None:
        return None
    return derive(secret, "job", job_id)


# -- challenge-response over a blocking stream socket -----------------------------------------
# Both sides send a nonce; each proves it holds the key by a MAC over both nonces and its
# role. The listener speaks first, so a client that is not ours learns nothing but a nonce.

def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise AuthenticationFailed("the other side closed the connection during the "
                                       "handshake")
        buf += chunk
    return buf


def accept_handshake(sock: socket.socket, key: bytes, context: bytes = b"") -> bytes:
    """Listener side; returns the session key. Raises AuthenticationFailed."""
    mine = secrets.token_bytes(NONCE_NBYTES)
    sock.sendall(mine)
    theirs = recv_exact(sock, NONCE_NBYTES)
    proof = recv_exact(sock, MAC_NBYTES)
    if not hmac.compare_digest(proof, mac(key, b"client", context, mine, theirs)):
        sock.sendall(b"\0" * MAC_NBYTES)
        raise AuthenticationFailed("the client could not prove it holds the job's secret")
    sock.sendall(mac(key, b"server", context, theirs, mine))
    return derive(key, "session", context, mine, theirs)


def connect_handshake(sock: socket.socket, key: bytes, context: bytes = b"") -> bytes:
    """Connecting side; returns the session key. Raises AuthenticationFailed."""
    theirs = recv_exact(sock, NONCE_NBYTES)
    mine = secrets.token_bytes(NONCE_NBYTES)
    sock.sendall(mine + mac(key, b"client", context, theirs, mine))
    proof = recv_exact(sock, MAC_NBYTES)
    if not hmac.compare_digest(proof, mac(key, b"server", context, mine, theirs)):
        raise AuthenticationFailed("the other side refused us or could not prove it holds "
                                   f"the job's secret ({ENV} missing or different on one "
                                   "side)")
    return derive(key, "session", context, theirs, mine)
