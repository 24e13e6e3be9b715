"""The one free-port helper of the test suite.

`free_port()` binds port 0 on 127.0.0.1, reads the port the kernel chose and
closes the socket: a port nothing listens on (for a moment), to start a private
server on, or to point a client at so that its connection is refused for real.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


__all__ = ["free_port"]
