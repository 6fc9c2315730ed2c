#!/usr/bin/env python3
"""HTTP/2 clients that abuse a server, for crates/cli/tests/h2_bounds.rs, built on the `h2`
library (a real HTTP/2 stack: it encodes the frames, the abuse is only in how they are sent).

Each mode makes one normal request first (the connection's first-request deadline is met), then:

  trickle HOST PORT CA INTERVAL LIMIT
      sends a second request's HEADERS frame one byte every INTERVAL seconds, for at most
      LIMIT seconds;
  idle HOST PORT CA LIMIT
      sends nothing more, but answers the server's PINGs, for at most LIMIT seconds;
  reset HOST PORT CA COUNT
      opens COUNT streams, each cancelled (RST_STREAM) right after its HEADERS, a few pairs per
      write, until the server ends the connection.

Prints one JSON line: the first response's status, whether the server sent a GOAWAY, whether
it closed the connection, after how long (seconds from the abuse's start), how much was sent.
"""

import json
import select
import socket
import ssl
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events

PING = 0x6
GOAWAY = 0x7


class Server:
    """The server's side of the bytes once the abuse starts: frame heads only, raw."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.goaway = False
        self.closed = False

    def poll(self, wait):
        """Reads what has come within `wait` seconds; notes GOAWAY and the close."""
        if self.closed:
            return
        ready, _, _ = select.select([self.sock], [], [], wait)
        if not ready and self.sock.pending() == 0:
            return
        try:
            data = self.sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            return
        except (OSError, ssl.SSLError):
            self.closed = True
            return
        if not data:
            self.closed = True
            return
        self.buf += data
        while len(self.buf) >= 9:
            length = struct.unpack(">I", b"\0" + self.buf[:3])[0]
            if len(self.buf) < 9 + length:
                break
            if self.buf[3] == GOAWAY:
                self.goaway = True
            self.buf = self.buf[9 + length :]


def connect(host, port, ca):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    raw = socket.create_connection((host, port), timeout=10)
    sock = ctx.wrap_socket(raw, server_hostname="localhost")
    assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
    conn = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    return sock, conn


HEADERS = [
    (":method", "GET"),
    (":path", "/"),
    (":scheme", "https"),
    (":authority", "localhost"),
    ("user-agent", "h2-abuse"),
]


def first_request(sock, conn):
    """A normal request on stream 1: its status, once its response has ended."""
    conn.send_headers(1, HEADERS, end_stream=True)
    sock.sendall(conn.data_to_send())
    status, deadline = None, time.monotonic() + 10
    while time.monotonic() < deadline:
        data = sock.recv(65536)
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                status = int(dict(event.headers)[":status"])
            if isinstance(event, h2.events.DataReceived):
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if isinstance(event, h2.events.StreamEnded) and event.stream_id == 1:
                sock.sendall(conn.data_to_send())
                return status
        sock.sendall(conn.data_to_send())
    return status


def trickle(sock, conn, interval, limit):
    conn.send_headers(3, HEADERS, end_stream=True)
    head = conn.data_to_send()
    server = Server(sock)
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < limit and not server.closed and sent < len(head):
        try:
            sock.sendall(head[sent : sent + 1])
        except OSError:
            server.closed = True
            break
        sent += 1
        next_at = time.monotonic() + interval
        while time.monotonic() < next_at and not server.closed:
            server.poll(next_at - time.monotonic())
    # a head sent whole gets its answer; wait a little to see it, or the close
    end = time.monotonic() + 1.0
    while time.monotonic() < end and not server.closed:
        server.poll(end - time.monotonic())
    return server, start, {"sent": sent, "head": len(head)}


def reset(sock, conn, count):
    server = Server(sock)
    start = time.monotonic()
    opened = 0
    stream = 3
    while opened < count and not server.closed:
        for _ in range(5):
            conn.send_headers(stream, HEADERS, end_stream=True)
            conn.reset_stream(stream)
            stream += 2
            opened += 1
        try:
            sock.sendall(conn.data_to_send())
        except OSError:
            server.closed = True
            break
        server.poll(0.005)
    # the server's verdict, if any
    end = time.monotonic() + 3.0
    while time.monotonic() < end and not server.closed:
        server.poll(end - time.monotonic())
    return server, start, {"opened": opened}


def idle(sock, limit):
    """Not abuse: a client that sends nothing more but answers the server's PINGs (by hand:
    the library will not once it has seen a GOAWAY, and the server's graceful close waits for
    an answer)."""
    start = time.monotonic()
    pings, goaway, closed, buf = 0, False, False, b""
    sock.settimeout(0.2)
    while time.monotonic() - start < limit and not closed:
        try:
            data = sock.recv(65536)
        except (socket.timeout, ssl.SSLWantReadError):
            continue
        except (OSError, ssl.SSLError):
            closed = True
            break
        if not data:
            closed = True
            break
        buf += data
        while len(buf) >= 9:
            length = struct.unpack(">I", b"\0" + buf[:3])[0]
            if len(buf) < 9 + length:
                break
            kind, flags, payload = buf[3], buf[4], buf[9 : 9 + length]
            buf = buf[9 + length :]
            if kind == GOAWAY:
                goaway = True
            if kind == PING and not flags & 0x1:
                pings += 1
                try:
                    sock.sendall(struct.pack(">I", 8)[1:] + bytes([PING, 0x1]) + b"\0" * 4 + payload)
                except OSError:
                    closed = True
    server = Server(sock)
    server.goaway, server.closed = goaway, closed
    return server, start, {"pings": pings}


def main():
    mode, host, port, ca = sys.argv[1:5]
    sock, conn = connect(host, int(port), ca)
    status = first_request(sock, conn)
    if mode == "trickle":
        server, start, extra = trickle(sock, conn, float(sys.argv[5]), float(sys.argv[6]))
    elif mode == "idle":
        server, start, extra = idle(sock, float(sys.argv[5]))
    elif mode == "reset":
        server, start, extra = reset(sock, conn, int(sys.argv[5]))
    else:
        sys.exit(f"unknown mode {mode}")
    out = {
        "status": status,
        "goaway": server.goaway,
        "closed": server.closed,
        "seconds": round(time.monotonic() - start, 2),
    }
    out.update(extra)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
