#!/usr/bin/env python3
"""Opens N TLS connections to HOST:PORT, makes one keep-alive request on each (MODE `request`)
or none (MODE `handshake`), then holds them idle until stdin closes. Prints `held N` once all are established. Used by scripts/bench-agent
to measure a server's memory per idle established TLS connection."""
import asyncio, resource, ssl, sys

async def one(host, port, ctx, sem, held, request):
    async with sem:
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname="localhost")
        if not request:
            held.append(writer)
            return
        writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length"))
        await reader.readexactly(length)
    held.append(writer)

async def main():
    host, port, n, cafile, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 1024), hard))
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    held, sem = [], asyncio.Semaphore(64)
    await asyncio.gather(*(one(host, port, ctx, sem, held, mode == "request") for _ in range(n)))
    print(f"held {len(held)}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for w in held:
        w.close()

asyncio.run(main())
