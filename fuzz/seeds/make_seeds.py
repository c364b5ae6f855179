#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets (fuzz/seeds/<target>/).

Seeds are committed; run this again only to change them. They are small on
purpose: libFuzzer grows its own corpus (fuzz/corpus/, not committed) from
them, and tests/it/fuzz_regressions.rs replays every seed under `cargo test`.
"""

import hashlib
import os
import random
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def write(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- policies

for base in ("policy", os.path.join("policy", "examples")):
    d = os.path.join(ROOT, base)
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if f.endswith((".yaml", ".yml")):
            with open(os.path.join(d, f), "rb") as fh:
                write("policy_load", fh.read())

POLICIES = [
    """exceptions:
  - id: a
    owner: o
    reason: r
    hosts: [a.test, "*.b.test", "api-*.c.test", "bücher.test"]
    cidrs: [10.0.0.0/8, "fd00::/8"]
    ports: [80, 443]
    methods: [GET]
    paths: ["/x/**", "/y/*"]
    clients: ["ci-*"]
    expires: 2030-01-01
    dns_types: [TXT]
""",
    """settings:
  mode: report
  private_destinations: allow
  contact: "#sec"
  stale_after: 30d
  clients:
    - id: ci-runner
      sources: [10.8.0.0/16]
    - id: agent
      token_sha256: "0000000000000000000000000000000000000000000000000000000000000000"
  dns:
    deny_rcode: nxdomain
    cache_min_ttl: 1s
    cache_max_ttl: 1h
    tunnel: { action: log, max_name_len: 100, block_bytes: 10 }
  tls:
    missing_sni: deny
exceptions:
  - { id: x, owner: o, reason: r, hosts: [x.test], clients: [agent] }
""",
    "exceptions:\n  - id: a\n    owner: o\n    reason: r\n    hosts: [a.test]\n    hostz: [b]\n",
    "exceptions:\n  - id: a\n    owner: o\n    reason: r\n    hosts: [\"*\", \"*.com\", \"a.*.b\"]\n",
    "exceptions:\n  - id: a\n    owner: o\n    reason: r\n    cidrs: [10.0.0.1/8, 300.0.0.0/8]\n    ports: [0, 65536]\n",
    "exceptions:\n  - &e { id: a, owner: o, reason: r, hosts: [a.test] }\n  - *e\n",
    "exceptions:\n  - id: a\n    owner: o\n    reason: r\n    hosts: [a.test]\n    inject:\n      headers: { Authorization: \"Bearer ${env:NOPE}\" }\n",
    "settings: {}\nsettings: {}\n",
    "exceptions: []\n",
    "# only a comment\n",
    "\t- broken: [\n",
    "exceptions:\n  - id: a\n    owner: o\n    reason: r\n    hosts: [a.test]\n    expires: 2020-13-45\n",
]
for p in POLICIES:
    write("policy_load", p)

# ---------------------------------------------------------------- hosts

HOSTS = [
    "127.0.0.1", "127.0.0.1.", "2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1",
    "127.1", "0", "0.0.0.0", "0x", "00", "08.0.0.1", "1.2.3.256", "4294967296",
    "0xa9fea9fe", "169.254.43518", "[::1]", "[::]", "[::ffff:127.0.0.1]",
    "[fe80::1%25eth0]", "[64:ff9b::a9fe:a9fe]", "[2002:7f00:1::]", "::1",
    "example.com", "EXAMPLE.COM.", "b\u00fccher.test", "xn--bcher-kva.test",
    "allowed\u3002test", "\uff41llowed.test", "\uff11\uff12\uff17.\uff10.\uff10.\uff11",
    "a..b", ".a", "a b", "a\u0000b", "a%2eb", "-a.test", "_dmarc.a.test",
    "*.a.test", "api-*.a.test", "*.*.a", "a.*.b", "*", "*.", "*x*.a.b",
    "a.test:80", "a.test:0080", "a.test:65616", "a.test:", "[::1]:443", "u@a.test:1",
    "/a/b", "/a/../b", "/a/%2e%2e/b", "/a/..;/b", "/a//b", "/a/%2fb", "/a\\b",
    "/%41%42", "/a?x=../y", "a" * 64, ".".join(["a" * 63] * 4),
]
for h in HOSTS:
    write("host_parse", h)


# ---------------------------------------------------------------- DNS


def name(n):
    out = b""
    for label in n.split("."):
        if label:
            out += bytes([len(label)]) + label.encode()
    return out + b"\x00"


def query(n, qtype=1, qid=0x1234, flags=0x0100, extra=b"", qd=1, ar=0):
    return struct.pack(">HHHHHH", qid, flags, qd, 0, 0, ar) + name(n) + struct.pack(">HH", qtype, 1) + extra


OPT = b"\x00" + struct.pack(">HHIH", 41, 1232, 0, 0)


def rr(rtype, rdata, owner=b"\xc0\x0c", ttl=30):
    return owner + struct.pack(">HHIH", rtype, 1, ttl, len(rdata)) + rdata


QUERIES = [
    query("a.test"),
    query("x.a.test", 28),
    query("b.test", 16),
    query("evil.test"),
    query("a.test.evil.test"),
    query("A.TEST", 1, ar=1, extra=OPT),
    query("a.test", 255),
    query("a.test", 10),
    query("a.test", 252),
    query("a.test", 65),
    query("a.test") + name("evil.test") + struct.pack(">HH", 1, 1),
    struct.pack(">HHHHHH", 0xbeef, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01",
    struct.pack(">HHHHHH", 0xbeef, 0x8100, 1, 0, 0, 0) + name("a.test") + b"\x00\x01\x00\x01",
    b"\x12\x34\x01",
]
TAILS = [
    b"",
    b"\x01" + rr(1, bytes([93, 184, 216, 34])),
    b"\x02" + rr(1, bytes([10, 0, 0, 1])) + rr(1, bytes([127, 0, 0, 1])),
    b"\x02" + rr(5, name("x.a.test")) + rr(1, bytes([8, 8, 8, 8]), owner=name("x.a.test")),
    b"\x01" + rr(28, bytes(15) + b"\x01"),
    b"\x01" + rr(16, b"\x05hello"),
    b"\x01" + rr(65, b"\x00\x01\x00" + struct.pack(">HH", 4, 4) + bytes([10, 0, 0, 1])),
    b"\x03" + rr(1, bytes([1, 2, 3, 4]), owner=name("victim.test")) + rr(5, b"\xc0\x0c") + rr(1, b"\x01"),
    b"\x0f" + b"\xc0\x0c" * 40,
]
for q in QUERIES:
    for t in TAILS:
        write("dns_packet", bytes([len(q)]) + q + t)

# ---------------------------------------------------------------- decide

rng = random.Random(6)
for _ in range(40):
    write("decide_model", bytes(rng.randrange(256) for _ in range(rng.randrange(8, 96))))

# ---------------------------------------------------------------- http1_fast

# Request heads as clients send them through a forward proxy, and the
# shapes at the fast path's edges (hop-by-hop headers, obs-text, no Host,
# IPv6, close).
for head in [
    b"GET http://origin.test/simple/ HTTP/1.1\r\nHost: origin.test\r\nUser-Agent: curl/7.88.1\r\n"
    b"Accept: */*\r\nProxy-Connection: Keep-Alive\r\n\r\n",
    b"GET http://pypi.test/simple/requests/ HTTP/1.1\r\nHost: pypi.test\r\nUser-Agent: pip/23.2\r\n"
    b"Accept-Encoding: gzip, deflate\r\nAccept: application/vnd.pypi.simple.v1+json\r\n"
    b"Connection: keep-alive\r\nCache-Control: max-age=0\r\n\r\n",
    b"HEAD http://a.test:8080/x?y=1 HTTP/1.1\r\nhost: a.test:8080\r\nconnection: close\r\n\r\n",
    b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTE: trailers\r\nKeep-Alive: timeout=5\r\n"
    b"X-A: 1\r\nX-A: 2\r\n\r\n",
    b"GET http://[::1]:81/p HTTP/1.1\r\nHost: [::1]:81\r\n\r\n",
    b"GET http://a.test HTTP/1.1\r\n\r\n",
    b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-T: caf\xc3\xa9 \x80\t ok\r\n\r\n",
]:
    write("http1_fast", head)


# ---------------------------------------------------------------- graphql_op

GRAPHQL = [
    "query { viewer { login } }",
    "{ repository(owner: \"acme\", name: \"widgets\") { pullRequest(number: 7) { title } } }",
    "mutation CreatePR($input: CreatePullRequestInput!) { createPullRequest(input: $input) { pullRequest { number } } }",
    "mutation { createPullRequest: mergePullRequest(input: {pullRequestId: \"x\"}) { clientMutationId } }",
    "mutation { ...F } fragment F on Mutation { addComment(input: {}) { x } ... on Mutation { mergePullRequest(input: {}) { x } } }",
    "#op A\nquery A { a } mutation B { mergePullRequest(input: {}) { x } }",
    "query A { a } mutation B { createPullRequest(input: {}) { x } }",
    "subscription { events { id } }",
    "query { a(x: [[[1]]], y: {a: {b: \"\"\"block { [ (\"\"\"}}) # { [\n }",
    "query { " + "a { " * 70 + "}" * 70 + " }",
    '{"query":"query { a }","query":"mutation { b }"}',
    '[{"query":"{ a }"},{"query":"{ b }"}]',
    '{"head":"agent/x","HEAD":"main","draft":true}',
]
for g in GRAPHQL:
    write("graphql_op", g)
