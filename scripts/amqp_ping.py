"""Exit 0 when an AMQP 0-9-1 broker answers our protocol header with Connection.Start.

Used by ``scripts/ensure-broker``; depends on nothing but the standard library.
"""

from __future__ import annotations

import socket
import sys


def main() -> int:
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 5672
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            sock.settimeout(5)
            data = b""
            while len(data) < 11:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        print(f"amqp_ping: {host}:{port}: {exc}", file=sys.stderr)
        return 1
    # A method frame (type 1) on channel 0 whose class/method is Connection.Start (10, 10).
    if len(data) >= 11 and data[0] == 1 and data[7:11] == b"\x00\x0a\x00\x0a":
        return 0
    print(f"amqp_ping: {host}:{port} answered {data[:16]!r}, not Connection.Start", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
