"""The node's HTTP port: bound so that a port another process holds is refused, with a message
that says what to do, whichever server then listens on it."""

from __future__ import annotations

import errno
import socket


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (not yet listening); OSError (EADDRINUSE, said plainly)
    when anything holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # like any server: connections of an earlier run in TIME_WAIT must not block a restart
    # (a listener still fails the bind, SO_REUSEADDR or not)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise OSError(e.errno, f"port {port} on {host} is already in use; stop what holds it "
                                   "or pick another --listen port") from None
        raise
    return sock
