"""A plain HTTP/1.1 backend for the reverse proxy tests: answers every request with its own
name, the method, the path, the body's length and the request headers it got (one per line),
so a test sees what the agent sent. `/healthz` answers 200 `ok`.

    python3 proxy_backend.py NAME PORT
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/healthz":
            out = b"ok\n"
        else:
            lines = [f"{NAME} {self.command} {self.path} {len(body)}"]
            lines += [f"{k.lower()}: {v}" for k, v in self.headers.items()]
            out = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Backend", NAME)
        self.send_header("X-Internal", "secret")
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = answer

    def log_message(self, *args):
        pass


NAME = sys.argv[1]
ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.allow_reuse_address = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), Echo).serve_forever()
