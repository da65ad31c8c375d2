"""Where `--executor ray` finds its cluster, and whether anything there answers, before Ray is asked.

Ray's driver does not fail on an address nobody serves: on a closed port it retries for minutes
with C++ warnings on stderr, and on an open port that is not a GCS (the dashboard's 8265, say) it
ends the whole process from C++ ("Failed to connect to GCS ... The program will terminate"), no
exception to catch. So before `ray.init` the address is checked here, within
`D.RAY_CONNECT_TIMEOUT_S`: HOST:PORT (or ray://HOST:PORT, the Ray Client's) must accept a TCP
connection and answer an HTTP/2 connection preface with a SETTINGS frame, as every gRPC server
does (with RAY_USE_TLS=1 the cluster speaks TLS first, so only the TCP connection is checked).
Anything else is exit 2 with one line naming the address and where it came from.

Knows the address forms Ray's `init` takes (HOST:PORT, ray://HOST[:PORT], "auto", "local", none);
passes "auto", "local" and none through to Ray (it finds or starts a local cluster itself). Does
not know whether the gRPC server found is a Ray GCS of a compatible version: Ray says that.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError

RAY_CLIENT_PORT = 10001  # ray://HOST without a port: the Ray Client server's default
GCS_PORT = 6379          # what `ray start --head` listens on unless told otherwise
HINT = f"start one with: ray start --head (it prints the address, HOST:{GCS_PORT} by default), and pass --ray-address HOST:PORT"
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + an empty SETTINGS frame
_SETTINGS = 4


@dataclass(frozen=True)
class RayAddress:
    """The address `ray.init` gets (None = start a new local Ray) and where it came from, for messages."""

    address: str | None
    source: str  # "--ray-address", "RAY_ADDRESS" or "default"

    def describe(self) -> str:
        return f"{self.address} (from {self.source})" if self.address else "(a new local one)"


def resolve(flag: str | None) -> RayAddress:
    """`--ray-address` wins over $RAY_ADDRESS; neither = a new local Ray."""
    if flag:
        return RayAddress(flag, "--ray-address")
    env = os.environ.get("RAY_ADDRESS")
    return RayAddress(env, "RAY_ADDRESS") if env else RayAddress(None, "default")


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of HOST:PORT / ray://HOST[:PORT] / [v6]:PORT; None for "auto", "local".
    UsageError for a dashboard URL (http://...) or a form Ray does not take."""
    if address in ("auto", "local"):
        return None
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    if scheme in ("http", "https"):
        raise UsageError(f"--executor ray: {address} is a dashboard / job-submission URL, not a cluster address",
                         hint=f"pass the GCS address, HOST:PORT ({GCS_PORT} unless the head was started with --port)")
    if scheme not in ("", "ray"):
        raise UsageError(f"--executor ray: {address}: unknown scheme {scheme}://", hint="use HOST:PORT or ray://HOST:PORT")
    rest = rest.rstrip("/")
    if rest.startswith("["):  # [v6]:port
        host, _, tail = rest[1:].partition("]")
        port_s = tail[1:] if tail.startswith(":") else ""
    else:
        host, colon, port_s = rest.rpartition(":")
        if not colon:
            host, port_s = rest, ""
    if not port_s and scheme == "ray":
        port_s = str(RAY_CLIENT_PORT)
    if not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise UsageError(f"--executor ray: {address} is not HOST:PORT", hint=HINT)
    return host, int(port_s)


def check(where: RayAddress, timeout_s: float = D.RAY_CONNECT_TIMEOUT_S) -> None:
    """UsageError unless a gRPC server answers at `where` (nothing to check for none / auto / local)."""
    hp = host_port(where.address) if where.address else None
    if hp is None:
        return
    host, port = hp
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")   # Ray's own switch; its handshake is Ray's
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            if tls:
                return
            s.settimeout(timeout_s)
            s.sendall(_H2_PREFACE)
            head = _read(s, 9)
    except socket.timeout:
        raise UsageError(f"cannot reach the Ray cluster at {where.describe()}: no answer within {timeout_s:g} s",
                         hint=HINT) from None
    except OSError as e:
        raise UsageError(f"cannot reach the Ray cluster at {where.describe()}: {e.strerror or e}", hint=HINT) from None
    if len(head) < 9 or head[3] != _SETTINGS:
        http1 = head.startswith(b"HTTP/") or head.startswith(b"<")  # a status line, or HTML with none (HTTP/0.9 style)
        what = "an HTTP/1 server (the dashboard?)" if http1 else "something that is not a gRPC server"
        raise UsageError(f"cannot use the Ray cluster at {where.describe()}: {host}:{port} is {what}", hint=HINT)


def _read(s: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = s.recv(n - len(got))
        if not chunk:
            break
        got += chunk
    return got
