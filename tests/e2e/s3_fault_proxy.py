#!/usr/bin/env python3
"""An HTTP proxy in front of the local S3 server that adds latency and injects faults.

Used by tests/e2e/s3_e2e.sh (faults the S3 client must ride out or report) and by
bench/s3.sh (a fixed delay per request, as an object store's round trip). Only object
GETs (a key in the path, no listing query) get faults; listings and uploads pass.

  s3_fault_proxy.py --upstream http://127.0.0.1:PORT --port-file FILE [--delay-ms D]
                    [--slowdown-every N] [--error-every N] [--reset-every N] [--budget K]
                    [--missing SUBSTRING] [--failing SUBSTRING] [--keyed-faults-after FILE]
                    [--stats FILE] [--verify-sigv4 KEY_ID:SECRET]

--slowdown-every N: every Nth object GET is answered 503 SlowDown; --error-every N: 500
InternalError; --reset-every N: the headers and half the body, then a TCP reset. --budget K
stops each kind after K injections, so every request succeeds in the end. --missing: GETs of
keys containing SUBSTRING answer 404 NoSuchKey, as for an object deleted after the listing;
--failing: GETs of keys containing SUBSTRING answer 500 InternalError every time (a store
that keeps failing for some objects: every retry fails too). --keyed-faults-after FILE:
--missing and --failing act only once FILE exists, so that a test can start them after
the daemons have loaded (a deletion while serving).
--stats: a JSON file of the object GETs and the injected faults, rewritten after each, so
that a test can check the faults really happened.

--verify-sigv4 KEY_ID:SECRET (repeatable) checks every request's AWS Signature Version 4,
since the local server does not: the signature is recomputed from the request as received
(region and service from its Credential scope) and a mismatch is answered 403
SignatureDoesNotMatch, an unknown key id 403 InvalidAccessKeyId, an unsigned request 403
AccessDenied, a body that does not hash to its x-amz-content-sha256 400
XAmzContentSHA256Mismatch, before any fault. The stats count them (sigv4_verified,
sigv4_mismatch, sigv4_unknown_key, sigv4_unsigned). The path is signed as sent (S3 does not
normalise it); the query is re-encoded and sorted, so a client that signs another encoding
than it sends fails. Presigned URLs and chunk-signed (STREAMING-...) bodies are not checked.
"""
import argparse
import hashlib
import hmac
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

SIGV4_ALGORITHM = "AWS4-HMAC-SHA256"
SIGV4_COUNTERS = ("sigv4_verified", "sigv4_mismatch", "sigv4_unknown_key", "sigv4_unsigned")


class SigV4Rejection(Exception):
    """A request the store would refuse: the HTTP status, S3's error code and a message."""

    def __init__(self, status, code, message, counter):
        super().__init__(message)
        self.status, self.code, self.message, self.counter = status, code, message, counter


def sigv4_encode(text):
    """SigV4's URI encoding: everything but A-Z a-z 0-9 - _ . ~ as %XY of its UTF-8 bytes."""
    return urllib.parse.quote(text, safe="-_.~")


def sigv4_canonical_query(query):
    """The query's parameters decoded ('+' is a space, as S3 reads a query; botocore sends
    spaces so), re-encoded the SigV4 way and sorted by name, then value."""
    pairs = []
    for item in query.split("&") if query else []:
        name, _, value = item.partition("=")
        pairs.append((sigv4_encode(urllib.parse.unquote_plus(name)), sigv4_encode(urllib.parse.unquote_plus(value))))
    return "&".join("%s=%s" % pair for pair in sorted(pairs))


def sigv4_hmac(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class SigV4Verifier:
    """Recomputes a request's AWS Signature Version 4 with the secret of its access key id."""

    def __init__(self, secrets):
        self.secrets = secrets  # access key id -> secret access key

    def check(self, method, target, headers, body):
        """Raises SigV4Rejection unless the request as received (method, request target as
        on the request line, (name, value) header pairs, body bytes) is signed correctly."""
        values = {}
        for name, value in headers:
            values.setdefault(name.lower(), []).append(value)
        auth = values.get("authorization", [""])[0]
        if not auth.startswith(SIGV4_ALGORITHM + " "):
            raise SigV4Rejection(403, "AccessDenied", "The request is not signed with %s." % SIGV4_ALGORITHM,
                                 "sigv4_unsigned")
        fields = {}
        for part in auth[len(SIGV4_ALGORITHM) + 1:].split(","):
            name, _, value = part.strip().partition("=")
            fields[name] = value
        scope = fields.get("Credential", "").split("/")
        if len(scope) != 5 or scope[4] != "aws4_request" or not fields.get("SignedHeaders") \
                or not fields.get("Signature"):
            raise SigV4Rejection(400, "AuthorizationHeaderMalformed", "The authorization header is malformed.",
                                 "sigv4_mismatch")
        key_id, date, region, service = scope[:4]
        if key_id not in self.secrets:
            raise SigV4Rejection(403, "InvalidAccessKeyId",
                                 "The AWS Access Key Id you provided does not exist in our records.",
                                 "sigv4_unknown_key")
        signed = fields["SignedHeaders"].split(";")
        unsigned_amz = [n for n in values if n.startswith("x-amz-") and n not in signed]
        if signed != sorted(signed) or "host" not in signed or unsigned_amz:
            raise SigV4Rejection(403, "SignatureDoesNotMatch",
                                 "SignedHeaders must be sorted lowercase names including host and every x-amz-* "
                                 "header (unsigned: %s)." % ", ".join(unsigned_amz), "sigv4_mismatch")
        missing = [n for n in signed if n not in values]
        if missing:
            raise SigV4Rejection(403, "SignatureDoesNotMatch",
                                 "Signed headers absent from the request: %s." % ", ".join(missing), "sigv4_mismatch")
        timestamp = values.get("x-amz-date", values.get("date", [""]))[0]
        payload_hash = values.get("x-amz-content-sha256", [hashlib.sha256(body).hexdigest()])[0]
        if len(payload_hash) == 64 and payload_hash != hashlib.sha256(body).hexdigest():
            raise SigV4Rejection(400, "XAmzContentSHA256Mismatch",
                                 "The provided 'x-amz-content-sha256' header does not match what was computed.",
                                 "sigv4_mismatch")
        path, _, query = target.partition("?")
        # Each header's values joined by commas, spaces trimmed and runs of spaces made one.
        canonical_headers = "".join("%s:%s\n" % (n, ",".join(" ".join(v.split()) for v in values[n]))
                                    for n in signed)
        canonical_request = "\n".join([method, path, sigv4_canonical_query(query), canonical_headers,
                                       ";".join(signed), payload_hash])
        string_to_sign = "\n".join([SIGV4_ALGORITHM, timestamp, "/".join(scope[1:]),
                                    hashlib.sha256(canonical_request.encode()).hexdigest()])
        key = ("AWS4" + self.secrets[key_id]).encode()
        for part in (date, region, service, "aws4_request"):
            key = sigv4_hmac(key, part)
        expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
        if not timestamp.startswith(date) or not hmac.compare_digest(expected, fields["Signature"]):
            raise SigV4Rejection(403, "SignatureDoesNotMatch",
                                 "The request signature we calculated does not match the signature you provided. "
                                 "Check your key and signing method.", "sigv4_mismatch")


def make_handler(args, counters, lock):
    upstream = urllib.parse.urlsplit(args.upstream)
    local = threading.local()
    verifier = SigV4Verifier(dict(pair.split(":", 1) for pair in args.verify_sigv4)) if args.verify_sigv4 else None

    def count(kind):
        with lock:
            counters[kind] += 1
            if args.stats:  # every count is written, so the file always has the totals
                tmp = args.stats + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(counters, f)
                os.replace(tmp, args.stats)

    def inject(kind, every, n):
        return every > 0 and n % every == 0 and counters[kind] < args.budget

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # The headers and the body go out in two writes; with Nagle's algorithm the body
        # waits for the client's delayed ACK of the headers (40 ms on Linux), which made
        # every request cost about 45 ms more than --delay-ms.
        disable_nagle_algorithm = True

        def log_message(self, *a):  # quiet: the test prints its own summary
            pass

        def upstream_conn(self):
            if getattr(local, "conn", None) is None:
                local.conn = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=60)
                local.conn.connect()
                local.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as above, for uploads
            return local.conn

        def send_error_xml(self, status, code, message):
            body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
                    % (code, message)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def forward(self, body):
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            for attempt in range(2):  # a kept-alive upstream connection may have been closed
                conn = self.upstream_conn()
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
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
            length = int(self.headers.get("Content-Length") or 0)
            request_body = self.rfile.read(length) if length else b""
            if verifier is not None:  # the store authenticates first, then may fail
                try:
                    verifier.check(self.command, self.path, self.headers.items(), request_body)
                except SigV4Rejection as rejection:
                    count(rejection.counter)
                    return self.send_error_xml(rejection.status, rejection.code, rejection.message)
                count("sigv4_verified")
            path = urllib.parse.urlsplit(self.path)
            is_object_get = (self.command == "GET" and "list-type" not in path.query
                             and path.path.strip("/").count("/") >= 1)
            if is_object_get:
                count("object_gets")
                with lock:
                    n = counters["object_gets"]
                key = urllib.parse.unquote(path.path)
                keyed = not args.keyed_faults_after or os.path.exists(args.keyed_faults_after)
                if keyed and args.missing and args.missing in key:
                    count("missing")
                    return self.send_error_xml(404, "NoSuchKey", "The specified key does not exist.")
                if keyed and args.failing and args.failing in key:
                    count("failing")
                    return self.send_error_xml(500, "InternalError", "We encountered an internal error.")
                if inject("slowdown", args.slowdown_every, n):
                    count("slowdown")
                    return self.send_error_xml(503, "SlowDown", "Please reduce your request rate.")
                if inject("server_error", args.error_every, n):
                    count("server_error")
                    return self.send_error_xml(500, "InternalError", "We encountered an internal error.")
                reset = inject("reset", args.reset_every, n)
            else:
                reset = False
            status, headers, body = self.forward(request_body)
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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", required=True)
    p.add_argument("--port-file", required=True, help="the chosen port is written here once listening")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--slowdown-every", type=int, default=0)
    p.add_argument("--error-every", type=int, default=0)
    p.add_argument("--reset-every", type=int, default=0)
    p.add_argument("--budget", type=int, default=1 << 62)
    p.add_argument("--missing", default="")
    p.add_argument("--failing", default="")
    p.add_argument("--keyed-faults-after", default="", metavar="FILE")
    p.add_argument("--stats", default="")
    p.add_argument("--verify-sigv4", action="append", default=[], metavar="KEY_ID:SECRET",
                   type=credential_pair, help="check every request's SigV4 signature against this key pair")
    return p.parse_args(argv)


def credential_pair(text):
    if ":" not in text or text.startswith(":"):
        raise argparse.ArgumentTypeError("expected ACCESS_KEY_ID:SECRET, got a value without a key id")
    return text


class ProxyServer(http.server.ThreadingHTTPServer):
    # A class attribute, because the constructor calls listen() with it: set on the instance
    # afterwards (as this proxy once did) the backlog stays 5, and a client opening 64
    # connections at once has SYNs dropped and retried after 1, 3, 7... s.
    request_queue_size = 1024
    daemon_threads = True


def make_server(args):
    """The proxy listening on a free port of 127.0.0.1; its counters are server.counters."""
    counters = dict.fromkeys(("object_gets", "slowdown", "server_error", "reset", "missing", "failing") + SIGV4_COUNTERS, 0)
    lock = threading.Lock()
    server = ProxyServer(("127.0.0.1", 0), make_handler(args, counters, lock))
    server.counters = counters
    return server


def main():
    args = parse_args()
    server = make_server(args)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.replace(tmp, args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
