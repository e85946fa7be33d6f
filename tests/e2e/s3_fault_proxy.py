#!/usr/bin/env python3
"""An HTTP proxy in front of the local S3 server that adds latency and injects faults.

Used by tests/e2e/s3_e2e.sh (faults the S3 client must ride out or report) and by
bench/s3.sh (a fixed delay per request, as an object store's round trip). Only object
GETs (a key in the path, no listing query) get faults; listings and uploads pass.

  s3_fault_proxy.py --upstream http://127.0.0.1:PORT --port-file FILE [--delay-ms D]
                    [--slowdown-every N] [--error-every N] [--reset-every N] [--budget K]
                    [--missing SUBSTRING] [--stats FILE]

--slowdown-every N: every Nth object GET is answered 503 SlowDown; --error-every N: 500
InternalError; --reset-every N: the headers and half the body, then a TCP reset. --budget K
stops each kind after K injections, so every request succeeds in the end. --missing: GETs of
keys containing SUBSTRING answer 404 NoSuchKey, as for an object deleted after the listing.
--stats: a JSON file of the object GETs and the injected faults, rewritten after each, so
that a test can check the faults really happened.
"""
import argparse
import http.client
import http.server
import json
import os
import socket
import struct
import threading
import time
import urllib.parse

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def make_handler(args, counters, lock):
    upstream = urllib.parse.urlsplit(args.upstream)
    local = threading.local()

    def count(kind):
        with lock:
            counters[kind] += 1
            if args.stats:  # every object GET is counted, so the file always has the total
                tmp = args.stats + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(counters, f)
                os.replace(tmp, args.stats)

    def inject(kind, every, n):
        return every > 0 and n % every == 0 and counters[kind] < args.budget

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet: the test prints its own summary
            pass

        def upstream_conn(self):
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
            return local.conn

        def send_error_xml(self, status, code, message):
            body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
                    % (code, message)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            for attempt in range(2):  # a kept-alive upstream connection may have been closed
                conn = self.upstream_conn()
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    return resp.status, resp.getheaders(), resp.read()
                except (http.client.HTTPException, OSError):
                    conn.close()
                    local.conn = None
                    if attempt == 1:
                        raise

        def handle_any(self):
            if args.delay_ms > 0:
                time.sleep(args.delay_ms / 1000.0)
            path = urllib.parse.urlsplit(self.path)
            is_object_get = (self.command == "GET" and "list-type" not in path.query
                             and path.path.strip("/").count("/") >= 1)
            if is_object_get:
                count("object_gets")
                with lock:
                    n = counters["object_gets"]
                if args.missing and args.missing in urllib.parse.unquote(path.path):
                    count("missing")
                    return self.send_error_xml(404, "NoSuchKey", "The specified key does not exist.")
                if inject("slowdown", args.slowdown_every, n):
                    count("slowdown")
                    return self.send_error_xml(503, "SlowDown", "Please reduce your request rate.")
                if inject("server_error", args.error_every, n):
                    count("server_error")
                    return self.send_error_xml(500, "InternalError", "We encountered an internal error.")
                reset = inject("reset", args.reset_every, n)
            else:
                reset = False
            status, headers, body = self.forward()
            if reset and len(body) >= 2:
                count("reset")
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in HOP_BY_HOP:
                        self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                # SO_LINGER 0: close with a reset, as a dropped connection mid-object.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()
                return
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in HOP_BY_HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_any

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True)
    p.add_argument("--port-file", required=True, help="the chosen port is written here once listening")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--slowdown-every", type=int, default=0)
    p.add_argument("--error-every", type=int, default=0)
    p.add_argument("--reset-every", type=int, default=0)
    p.add_argument("--budget", type=int, default=1 << 62)
    p.add_argument("--missing", default="")
    p.add_argument("--stats", default="")
    args = p.parse_args()
    counters = {"object_gets": 0, "slowdown": 0, "server_error": 0, "reset": 0, "missing": 0}
    lock = threading.Lock()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(args, counters, lock))
    server.daemon_threads = True
    server.request_queue_size = 1024
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.replace(tmp, args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
