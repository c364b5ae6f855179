#!/usr/bin/env python3
"""The probe page's origin for the browser tests: plain HTTP on ADDR:PORT.

    origin.py ADDR PORT SEEN_FILE

Serves probe.html at /, an image, a JSON document, a service worker, a
redirect to a denied host and a WebSocket echo (/ws and every path under
it), and appends `METHOD HOST PATH` to SEEN_FILE for every request, so the
test sees exactly what reached it.
"""

import base64
import hashlib
import os
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'
SW = b"self.addEventListener('fetch', () => {});\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def seen(self):
        with open(SEEN, "a") as f:
            f.write(f"{self.command} {self.headers.get('Host', '-')} {self.path}\n")

    def reply(self, status, ctype, body, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.seen()
        n = int(self.headers.get("Content-Length", "0") or 0)
        self.rfile.read(n)
        self.reply(200, "text/plain", b"posted\n")

    def do_GET(self):
        self.seen()
        path = self.path.split("?", 1)[0]
        if self.headers.get("Upgrade", "").lower() == "websocket" and path.startswith("/ws"):
            return self.websocket()
        if path == "/":
            with open(os.path.join(HERE, "probe.html"), "rb") as f:
                return self.reply(200, "text/html; charset=utf-8", f.read())
        if path == "/img.svg":
            return self.reply(200, "image/svg+xml", SVG)
        if path == "/data":
            return self.reply(200, "application/json", b'{"data": "from the origin"}')
        if path == "/sw.js":
            return self.reply(200, "text/javascript", SW)
        if path == "/redirect":
            return self.reply(302, "text/plain", b"", [("Location", "http://redirected.test/redirected")])
        self.reply(404, "text/plain", b"not here\n")

    def websocket(self):
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r = self.rfile
        while True:
            head = r.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 0x0F, head[1] & 0x7F
            if n == 126:
                n = struct.unpack("!H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", r.read(8))[0]
            mask = r.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                return
            if op in (1, 2) and n < 126:
                self.wfile.write(bytes([0x80 | op, n]) + data)
                self.wfile.flush()
        self.close_connection = True


if __name__ == "__main__":
    addr, port, SEEN = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    srv = ThreadingHTTPServer((addr, port), Handler)
    srv.daemon_threads = True
    print("listening", flush=True)
    srv.serve_forever()
