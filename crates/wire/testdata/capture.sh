#!/bin/sh
# Regenerates the captured first flights in this directory from the clients on this machine
# (Debian 12: openssl 3.0, curl 7.88, chromium). Each client connects to record.py, which saves
# what the client sent first and hangs up; the client then fails, which is expected.
# Resumption captures first get a session from a real `openssl s_server`.
# The tests assert fields, not bytes, so regenerating with other versions should still pass
# unless a client changed what it offers.
set -eu
cd "$(dirname "$0")"
PORT=${PORT:-47443}
tmp=$(mktemp -d)
trap 'kill $server 2>/dev/null || true; rm -rf "$tmp"' EXIT

record() { # OUT CLIENT-COMMAND...
    out=$1; shift
    python3 record.py "$PORT" "$out" & rec=$!
    sleep 0.5
    "$@" >/dev/null 2>&1 </dev/null || true
    wait $rec
}

record openssl-tls12.bin openssl s_client -connect 127.0.0.1:$PORT -tls1_2 -servername tls12.example -alpn http/1.1
record openssl-tls13.bin openssl s_client -connect 127.0.0.1:$PORT -tls1_3 -servername tls13.example -alpn h2,http/1.1
record curl.bin curl -sk --max-time 5 --resolve curl.example:$PORT:127.0.0.1 https://curl.example:$PORT/

# Sessions from a real server: a TLS 1.3 ticket (PSK identity) and a TLS 1.2 ticket.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=resume.example \
    -keyout "$tmp/key.pem" -out "$tmp/cert.pem" 2>/dev/null
SPORT=$((PORT + 1))
openssl s_server -accept $SPORT -cert "$tmp/cert.pem" -key "$tmp/key.pem" -www >/dev/null 2>&1 & server=$!
sleep 0.5
(sleep 1; echo Q) | openssl s_client -connect 127.0.0.1:$SPORT -tls1_3 -servername resume.example -sess_out "$tmp/s13" >/dev/null 2>&1 || true
(sleep 1; echo Q) | openssl s_client -connect 127.0.0.1:$SPORT -tls1_2 -servername resume.example -sess_out "$tmp/s12" >/dev/null 2>&1 || true
kill $server
record openssl-tls13-resume.bin openssl s_client -connect 127.0.0.1:$PORT -tls1_3 -servername resume.example -sess_in "$tmp/s13"
record openssl-tls12-resume.bin openssl s_client -connect 127.0.0.1:$PORT -tls1_2 -servername resume.example -sess_in "$tmp/s12"

if command -v chromium >/dev/null; then
    record chromium.bin timeout 15 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
        --disable-background-networking --disable-component-update --disable-sync \
        --host-resolver-rules="MAP chromium.example 127.0.0.1" \
        --user-data-dir="$tmp/chromium" "https://chromium.example:$PORT/"
fi
