"""WebSocket peers for crates/cli/tests/websocket.rs.

  websocket_peer.py server
      An echo server (Python's `websockets`) on 127.0.0.1, port printed on the first line.
      A text message `headers?` is answered with the X-Forwarded-For the handshake carried.
  websocket_peer.py h1 URL CA MESSAGE...
      `websockets`' client over HTTP/1.1: sends each message, prints each answer on a line.
  websocket_peer.py h2 PORT CA PATH MESSAGE...
      An RFC 8441 extended CONNECT over HTTP/2 (the `h2` package), then WebSocket frames on
      the stream: prints `status N`, then each answer on a line.
"""

import asyncio
import os
import socket
import ssl
import sys


async def serve():
    from websockets.asyncio.server import serve

    async def echo(ws):
        async for message in ws:
            if message == "headers?":
                await ws.send(ws.request.headers.get("X-Forwarded-For", "-"))
            else:
                await ws.send(message)

    async with serve(echo, "127.0.0.1", 0) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()


async def h1(url, ca, messages):
    from websockets.asyncio.client import connect

    context = ssl.create_default_context(cafile=ca)
    async with connect(url, ssl=context, open_timeout=10, close_timeout=5) as ws:
        for m in messages:
            await ws.send(m)
            print(await asyncio.wait_for(ws.recv(), 10), flush=True)


def frame(payload):
    """A client's text frame (masked, RFC 6455 section 5.2), for payloads under 126 bytes."""
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([0x81, 0x80 | len(payload)]) + mask + masked


def h2_client(port, ca, path, messages):
    import h2.config
    import h2.connection
    import h2.events

    context = ssl.create_default_context(cafile=ca)
    context.set_alpn_protocols(["h2"])
    sock = context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), timeout=10),
        server_hostname="localhost",
    )
    assert sock.selected_alpn_protocol() == "h2", sock.selected_alpn_protocol()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())

    def events():
        data = sock.recv(65536)
        if not data:
            raise SystemExit("connection closed")
        out = conn.receive_data(data)
        sock.sendall(conn.data_to_send())
        return out

    # the server's SETTINGS must allow extended CONNECT before one is sent
    while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events()):
        pass
    stream = conn.get_next_available_stream_id()
    conn.send_headers(
        stream,
        [
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "https"),
            (":path", path),
            (":authority", "localhost:%d" % port),
            ("sec-websocket-version", "13"),
        ],
    )
    sock.sendall(conn.data_to_send())
    status = None
    body = b""
    while status is None:
        for e in events():
            if isinstance(e, h2.events.ResponseReceived):
                status = dict(e.headers)[b":status"].decode()
            elif isinstance(e, h2.events.DataReceived):
                body += e.data
            elif isinstance(e, h2.events.StreamReset) and status is None:
                raise SystemExit("stream reset")
    print("status", status, flush=True)
    if status != "200":
        print(body.decode(errors="replace"), flush=True)
        return
    buf = b""
    for m in messages:
        conn.send_data(stream, frame(m.encode()))
        sock.sendall(conn.data_to_send())
        # the server's frames are not masked: 0x81, a length under 126, the payload
        while len(buf) < 2 or len(buf) < 2 + buf[1]:
            for e in events():
                if isinstance(e, h2.events.DataReceived):
                    conn.acknowledge_received_data(e.flow_controlled_length, stream)
                    buf += e.data
        n = buf[1]
        print(buf[2 : 2 + n].decode(), flush=True)
        buf = buf[2 + n :]
    sock.sendall(conn.data_to_send())


def main():
    mode = sys.argv[1]
    if mode == "server":
        asyncio.run(serve())
    elif mode == "h1":
        asyncio.run(h1(sys.argv[2], sys.argv[3], sys.argv[4:]))
    elif mode == "h2":
        h2_client(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    main()
