#!/usr/bin/python3
"""s3_fault_proxy.py --verify-sigv4 against botocore's S3 signer, an independent SigV4
implementation: requests botocore signs pass through to the upstream server; a request
changed after signing, signed with the wrong secret or an unknown key id, or not signed at
all is answered with S3's error and never reaches the upstream. Real HTTP through the proxy,
so the request is checked as the proxy receives it. Needs Debian's python3-botocore
(deploy/install-deps.sh installs python3-boto3), hence /usr/bin/python3."""
import http.client
import http.server
import os
import sys
import tempfile
import threading
import unittest
import urllib.parse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import s3_fault_proxy  # noqa: E402

KEY_ID = "TESTKEYID"
SECRET = "test/secret+key"
REGION = "eu-west-3"  # not the default: the verifier must take it from the Credential scope
# Spaces, a plus, non-ASCII letters: what the path encoding must get right.
ODD_KEY = "data set/class 01/ünïcødé ключ+1.bin"


class Upstream(http.server.BaseHTTPRequestHandler):
    """Stands in for the S3 server: answers 200 and records what reached it."""
    protocol_version = "HTTP/1.1"
    seen = []

    def log_message(self, *a):
        pass

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        Upstream.seen.append((self.command, self.path, body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b"ok")

    do_GET = do_PUT = do_HEAD = handle_any


def serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class VerifySigV4Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.upstream = serve(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream))
        cls.tmp = tempfile.TemporaryDirectory()
        args = s3_fault_proxy.parse_args([
            "--upstream", "http://127.0.0.1:%d" % cls.upstream.server_address[1],
            "--port-file", os.path.join(cls.tmp.name, "port"), "--verify-sigv4", "%s:%s" % (KEY_ID, SECRET)])
        cls.proxy = serve(s3_fault_proxy.make_server(args))
        cls.netloc = "127.0.0.1:%d" % cls.proxy.server_address[1]

    @classmethod
    def tearDownClass(cls):
        for server in (cls.proxy, cls.upstream):
            server.shutdown()
            server.server_close()
        cls.tmp.cleanup()

    def setUp(self):
        Upstream.seen.clear()
        self.before = dict(self.proxy.counters)

    def sign(self, method, key, params=None, headers=None, body=b"", key_id=KEY_ID, secret=SECRET):
        """botocore's signature for METHOD /bucket/KEY: (request target, headers, body) as sent."""
        url = "http://%s/bucket/%s" % (self.netloc, urllib.parse.quote(key, safe="/~"))
        request = AWSRequest(method=method, url=url, params=params or {}, headers=headers or {}, data=body)
        S3SigV4Auth(Credentials(key_id, secret), "s3", REGION).add_auth(request)
        prepared = request.prepare()
        parts = urllib.parse.urlsplit(prepared.url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        sent_headers = dict(prepared.headers.items())
        sent_headers["Host"] = self.netloc  # what botocore signed; http.client then sends it as is
        return target, sent_headers, body

    def send(self, method, target, headers, body):
        conn = http.client.HTTPConnection(self.netloc, timeout=30)
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    def counted(self, name):
        return self.proxy.counters[name] - self.before[name]

    def test_accepts_what_botocore_signs(self):
        listing = self.sign("GET", "", params={"list-type": "2", "prefix": "data set/ü+&=x",
                                               "continuation-token": "1/ab+cd==", "max-keys": "1000"})
        ranged = self.sign("GET", ODD_KEY, headers={"Range": "bytes=100-199"})
        put = self.sign("PUT", ODD_KEY, headers={"Content-Type": "application/octet-stream"},
                        body=b"\x00sample bytes\xff" * 100)
        head = self.sign("HEAD", "plain/key.tar")
        for method, request in (("GET", listing), ("GET", ranged), ("PUT", put), ("HEAD", head)):
            with self.subTest(method=method, target=request[0]):
                status, text = self.send(method, *request)
                self.assertEqual(status, 200, text)
        self.assertIn("%2F", listing[0], "the listing's prefix was not encoded as a SigV4 client would")
        self.assertEqual([(m, t) for m, t, _ in Upstream.seen],
                         [("GET", listing[0]), ("GET", ranged[0]), ("PUT", put[0]), ("HEAD", head[0])])
        self.assertEqual(Upstream.seen[2][2], put[2])
        self.assertEqual(self.counted("sigv4_verified"), 4)
        self.assertEqual(self.counted("sigv4_mismatch"), 0)

    def expect_rejected(self, method, request, status, code, counter):
        got_status, text = self.send(method, *request)
        self.assertEqual(got_status, status, text)
        self.assertIn("<Code>%s</Code>" % code, text)
        self.assertEqual(self.counted(counter), 1)
        self.assertEqual(self.counted("sigv4_verified"), 0)
        self.assertEqual(Upstream.seen, [], "a rejected request reached the upstream server")

    def test_rejects_a_tampered_path(self):
        target, headers, body = self.sign("GET", ODD_KEY)
        tampered = target.replace("1.bin", "2.bin")
        self.assertNotEqual(tampered, target)
        self.expect_rejected("GET", (tampered, headers, body), 403, "SignatureDoesNotMatch", "sigv4_mismatch")

    def test_rejects_a_tampered_query(self):
        target, headers, body = self.sign("GET", "", params={"list-type": "2", "prefix": "a"})
        self.expect_rejected("GET", (target.replace("prefix=a", "prefix=b"), headers, body), 403,
                             "SignatureDoesNotMatch", "sigv4_mismatch")

    def test_rejects_a_tampered_signed_header(self):
        target, headers, body = self.sign("GET", ODD_KEY, headers={"Range": "bytes=0-99"})
        self.expect_rejected("GET", (target, dict(headers, Range="bytes=0-9999"), body), 403,
                             "SignatureDoesNotMatch", "sigv4_mismatch")

    def test_rejects_a_tampered_body(self):
        target, headers, body = self.sign("PUT", ODD_KEY, body=b"the signed bytes")
        self.expect_rejected("PUT", (target, headers, b"other  bytes here"), 400, "XAmzContentSHA256Mismatch",
                             "sigv4_mismatch")

    def test_rejects_the_wrong_secret(self):
        request = self.sign("GET", ODD_KEY, secret=SECRET + "x")
        self.expect_rejected("GET", request, 403, "SignatureDoesNotMatch", "sigv4_mismatch")

    def test_rejects_an_unknown_access_key_id(self):
        request = self.sign("GET", ODD_KEY, key_id="OTHERKEYID")
        self.expect_rejected("GET", request, 403, "InvalidAccessKeyId", "sigv4_unknown_key")

    def test_rejects_an_unsigned_request(self):
        self.expect_rejected("GET", ("/bucket/key", {"Host": self.netloc}, b""), 403, "AccessDenied",
                             "sigv4_unsigned")


if __name__ == "__main__":
    unittest.main()
