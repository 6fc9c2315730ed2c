"""A real gRPC server and client (grpcio) for the reverse proxy tests, without generated code:
the methods take and return raw bytes.

    python3 grpc_echo.py server PORT        # plaintext HTTP/2 (h2c), prints `ready`
    python3 grpc_echo.py client ADDR CA     # over TLS to ADDR (the agent), trusting CA

`/echo.Echo/Say` answers `echo: <request>` with trailing metadata `x-trailer: yes`;
`/echo.Echo/Fail` aborts with NOT_FOUND and details `no such thing`. The client prints one
line per call: `say <reply> <trailer>` and `fail <code> <details>`, then exits 0.
"""

import sys
from concurrent import futures

import grpc


def say(request, context):
    context.set_trailing_metadata((("x-trailer", "yes"),))
    return b"echo: " + request


def fail(request, context):
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")


def serve(port):
    handlers = {
        "Say": grpc.unary_unary_rpc_method_handler(say),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def client(addr, ca):
    with open(ca, "rb") as f:
        creds = grpc.ssl_channel_credentials(root_certificates=f.read())
    options = (("grpc.ssl_target_name_override", "localhost"),)
    with grpc.secure_channel(addr, creds, options=options) as channel:
        call = channel.unary_unary("/echo.Echo/Say")
        reply, state = call.with_call(b"hello", timeout=10)
        trailer = dict(state.trailing_metadata()).get("x-trailer", "-")
        print(f"say {reply.decode()} {trailer}", flush=True)
        try:
            channel.unary_unary("/echo.Echo/Fail")(b"x", timeout=10)
            print("fail OK -", flush=True)
        except grpc.RpcError as e:
            print(f"fail {e.code().name} {e.details()}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "server":
        serve(int(sys.argv[2]))
    else:
        client(sys.argv[2], sys.argv[3])
