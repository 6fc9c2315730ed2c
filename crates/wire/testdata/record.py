#!/usr/bin/env python3
"""Accept one TCP connection on 127.0.0.1:PORT and save the client's first flight (its
ClientHello records, reassembled up to the end of the handshake message) to OUT, then close.

Usage: record.py PORT OUT
"""
import socket
import sys


def first_flight(conn):
    data = b""
    conn.settimeout(5)
    while True:
        msg = b""
        off = 0
        # Walk the records received so far; stop when the first handshake message is complete.
        while off + 5 <= len(data):
            length = int.from_bytes(data[off + 3:off + 5], "big")
            if off + 5 + length > len(data):
                break
            msg += data[off + 5:off + 5 + length]
            off += 5 + length
            if len(msg) >= 4 and len(msg) >= 4 + int.from_bytes(msg[1:4], "big"):
                return data[:off]
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def main():
    port, out = int(sys.argv[1]), sys.argv[2]
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", port))
        srv.listen(1)
        conn, _ = srv.accept()
        with conn:
            data = first_flight(conn)
    with open(out, "wb") as f:
        f.write(data)
    print(f"{out}: {len(data)} bytes")


if __name__ == "__main__":
    main()
