#!/usr/bin/env python3
"""Bounded soak test for egressd (issue 6, item 5).

Starts egressd on loopback with a local origin, a TCP echo server and a fake
upstream DNS server, drives mixed allowed/denied HTTP, CONNECT and DNS traffic
from several clients while the policy is rewritten and SIGHUP'd, and stops by
itself after --duration seconds. Then it checks:

  * requests sent = decision-log lines = egressd_requests_total, per protocol
    and per decision;
  * no 5xx (and nothing but the expected answer) on allowed traffic, and every
    denied request refused;
  * resident memory flat: after warm-up, RSS grows by less than --rss-slack-mb.

Everything binds 127.0.0.1; nothing leaves the machine. Exit status 0 when
every check passes, 1 otherwise, 2 when the run could not be set up.

    cargo build --release
    benches/soak/soak.py --duration 60
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------- servers


def serve_forever(listener, handler):
    def loop():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handler, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def origin_conn(conn):
    """HTTP/1.1 keep-alive origin: reads a head (and a Content-Length body), answers 200."""
    buf = b""
    try:
        while True:
            while b"\r\n\r\n" not in buf:
                d = conn.recv(65536)
                if not d:
                    return
                buf += d
            head, buf = buf.split(b"\r\n\r\n", 1)
            m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            need = int(m.group(1)) if m else 0
            while len(buf) < need:
                d = conn.recv(65536)
                if not d:
                    return
                buf += d
            buf = buf[need:]
            body = b"soak origin\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    except OSError:
        pass
    finally:
        conn.close()


def echo_conn(conn):
    try:
        while True:
            d = conn.recv(65536)
            if not d:
                conn.shutdown(socket.SHUT_WR)
                return
            conn.sendall(d)
    except OSError:
        pass
    finally:
        conn.close()


def dns_name(n):
    return b"".join(bytes([len(l)]) + l.encode() for l in n.split(".") if l) + b"\x00"


def parse_question(q):
    i, labels = 12, []
    while True:
        n = q[i]
        if n == 0:
            break
        labels.append(q[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    return ".".join(labels).lower(), qtype, q[12:i + 5]


def fake_upstream(sock):
    """Answers every A question with 127.0.0.1, everything else with NOERROR/no data."""
    while True:
        try:
            q, peer = sock.recvfrom(4096)
            _, qtype, question = parse_question(q)
        except (OSError, IndexError, struct.error):
            continue
        an = 1 if qtype == 1 else 0
        r = q[:2] + b"\x81\x80" + struct.pack(">HHHH", 1, an, 0, 0) + question
        if an:
            r += b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + bytes([127, 0, 0, 1])
        try:
            sock.sendto(r, peer)
        except OSError:
            pass


# ---------------------------------------------------------------- clients


def recv_response(f):
    """Reads one HTTP response from a file object; returns (status, body)."""
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    status = int(line.split()[1])
    length, chunked = None, False
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin-1").partition(":")
        if k.strip().lower() == "content-length":
            length = int(v.strip())
        if k.strip().lower() == "transfer-encoding" and "chunked" in v.lower():
            chunked = True
    body = b""
    if length is not None:
        body = f.read(length)
    elif chunked:
        while True:
            n = int(f.readline().split(b";")[0], 16)
            body += f.read(n + 2)[:n]
            if n == 0:
                break
    return status, body


def dns_query(name, qtype, qid):
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + dns_name(name) + struct.pack(">HH", qtype, 1)


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = {}  # (proto, decision) -> count
        self.bad = []  # unexpected answers

    def count(self, proto, decision):
        with self.lock:
            self.sent[(proto, decision)] = self.sent.get((proto, decision), 0) + 1

    def fail(self, what):
        with self.lock:
            if len(self.bad) < 50:
                self.bad.append(what)
            else:
                self.bad[-1] = "... and more"


def worker(env, stats, stop, seed):
    rng = random.Random(seed)
    proxy = ("127.0.0.1", env["proxy"])
    o, e = env["origin_port"], env["echo_port"]
    http = None  # a keep-alive connection for plain HTTP
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.settimeout(10)
    qid = seed * 1000
    while not stop.is_set():
        action = rng.choice(["http_ok", "http_ok", "http_deny", "connect_ok", "connect_deny", "dns_ok", "dns_ok", "dns_deny"])
        try:
            if action in ("http_ok", "http_deny"):
                host = "ok.soak.test" if action == "http_ok" else "evil.soak.test"
                if http is None:
                    http = socket.create_connection(proxy, timeout=10)
                    http_f = http.makefile("rb")
                req = "GET http://%s:%d/soak/%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host, o, rng.randrange(1000), host, o)
                http.sendall(req.encode())
                stats.count("http", "allow" if action == "http_ok" else "deny")
                status, _ = recv_response(http_f)
                want = 200 if action == "http_ok" else 403
                if status != want:
                    stats.fail("%s: %d" % (action, status))
            elif action in ("connect_ok", "connect_deny"):
                host = "tun.soak.test" if action == "connect_ok" else "evil.soak.test"
                s = socket.create_connection(proxy, timeout=10)
                f = s.makefile("rb")
                s.sendall(b"CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n" % (host.encode(), e, host.encode(), e))
                stats.count("connect", "allow" if action == "connect_ok" else "deny")
                status, _ = recv_response(f)
                if action == "connect_ok":
                    if status != 200:
                        stats.fail("connect_ok: %d" % status)
                    else:
                        payload = os.urandom(rng.randrange(1, 4096))
                        s.sendall(payload)
                        s.shutdown(socket.SHUT_WR)
                        back = b""
                        while len(back) < len(payload):
                            d = f.read1(65536)
                            if not d:
                                break
                            back += d
                        if back != payload:
                            stats.fail("connect_ok: echo lost bytes")
                elif status != 403:
                    stats.fail("connect_deny: %d" % status)
                f.close()
                s.close()
            else:
                qid = (qid + 1) & 0xFFFF
                if action == "dns_ok":
                    name, qtype = "n%d.dns.soak.test" % rng.randrange(10), rng.choice([1, 28])
                else:
                    name, qtype = rng.choice([("evil.soak.test", 1), ("n1.dns.soak.test", 255)])
                udp.sendto(dns_query(name, qtype, qid), ("127.0.0.1", env["dns"]))
                stats.count("dns", "allow" if action == "dns_ok" else "deny")
                while True:
                    r, _ = udp.recvfrom(65535)
                    if struct.unpack(">H", r[:2])[0] == qid:
                        break
                rcode = r[3] & 0x0F
                want = 0 if action == "dns_ok" else 5
                if rcode != want:
                    stats.fail("%s %s: rcode %d" % (action, name, rcode))
        except (OSError, ValueError, IndexError, ConnectionError) as ex:
            stats.fail("%s: %r" % (action, ex))
            if action.startswith("http") and http is not None:
                http.close()
                http = None
    if http is not None:
        http.close()
    udp.close()


# ---------------------------------------------------------------- egressd


def policy_text(origin_port, echo_port, generation):
    churn = "".join(
        "  - id: churn-%d-%d\n    owner: soak\n    reason: reload churn\n    hosts: [c%d.churn.test]\n" % (generation, i, i)
        for i in range(generation % 5)
    )
    return """settings:
  contact: "#soak"
exceptions:
  - id: http-ok
    owner: soak
    reason: the soak origin
    hosts: [ok.soak.test]
    cidrs: [127.0.0.0/8]
    ports: [%d]
  - id: tunnel
    owner: soak
    reason: the soak echo server
    hosts: [tun.soak.test]
    cidrs: [127.0.0.0/8]
    ports: [%d]
  - id: dns-ok
    owner: soak
    reason: names the soak resolves
    hosts: ["*.dns.soak.test"]
    cidrs: [127.0.0.0/8]
%s""" % (origin_port, echo_port, churn)


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metrics(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
    _, body = recv_response(s.makefile("rb"))
    s.close()
    out = {}
    for line in body.decode().splitlines():
        m = re.match(r'egressd_requests_total\{(.*)\} (\S+)$', line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out[(labels["proto"], labels["decision"])] = int(float(m.group(2)))
    return out


def log_counts(path):
    counts, lines = {}, 0
    with open(path, "rb") as f:
        data = f.read()
    for line in data.split(b"\n"):
        if not line:
            continue
        ev = json.loads(line)
        lines += 1
        k = (ev["proto"], ev["decision"])
        counts[k] = counts.get(k, 0) + 1
    return lines, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "egressd"))
    ap.add_argument("--duration", type=float, default=60, help="seconds of traffic (default 60)")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--reload-every", type=float, default=0.5, help="seconds between policy rewrites")
    ap.add_argument("--warmup", type=float, default=0.25, help="fraction of the run before RSS is judged")
    ap.add_argument("--rss-slack-mb", type=float, default=16)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if not os.access(args.binary, os.X_OK):
        print("no egressd binary at %s (cargo build --release)" % args.binary, file=sys.stderr)
        return 2

    work = tempfile.mkdtemp(prefix="egressd-soak.")
    procs = []
    # A hard stop: whatever happens, nothing outlives duration + 2 minutes.
    deadline = threading.Timer(args.duration + 120, lambda: (print("soak: hard deadline hit", file=sys.stderr), [p.kill() for p in procs], os._exit(2)))
    deadline.daemon = True
    deadline.start()
    try:
        origin = socket.socket()
        origin.bind(("127.0.0.1", 0))
        origin.listen(256)
        serve_forever(origin, origin_conn)
        echo = socket.socket()
        echo.bind(("127.0.0.1", 0))
        echo.listen(256)
        serve_forever(echo, echo_conn)
        up = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        up.bind(("127.0.0.1", 0))
        threading.Thread(target=fake_upstream, args=(up,), daemon=True).start()
        env = {"origin_port": origin.getsockname()[1], "echo_port": echo.getsockname()[1]}

        pdir = os.path.join(work, "policy")
        os.mkdir(pdir)
        ppath = os.path.join(pdir, "soak.yaml")
        with open(ppath, "w") as f:
            f.write(policy_text(env["origin_port"], env["echo_port"], 0))
        log = os.path.join(work, "decisions.log")
        egressd = subprocess.Popen(
            [args.binary, "serve", "--policy", pdir, "--listen", "127.0.0.1:0", "--dns-listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--upstream-dns", "127.0.0.1:%d" % up.getsockname()[1], "--log", log],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(egressd)
        stderr_lines = []
        started = threading.Event()

        def read_stderr():
            for raw in egressd.stderr:
                line = raw.decode(errors="replace").rstrip()
                stderr_lines.append(line)
                m = re.match(r"egressd: listening proxy=\S+:(\d+) dns=\S+:(\d+) metrics=\S+:(\d+)", line)
                if m:
                    env["proxy"], env["dns"], env["metrics"] = map(int, m.groups())
                    started.set()

        threading.Thread(target=read_stderr, daemon=True).start()
        if not started.wait(30):
            print("egressd did not start:\n" + "\n".join(stderr_lines), file=sys.stderr)
            return 2

        stats = Stats()
        stop = threading.Event()
        workers = [threading.Thread(target=worker, args=(env, stats, stop, i + 1)) for i in range(args.clients)]
        for w in workers:
            w.start()
        rss = []
        t0 = time.time()
        gen = 0
        next_reload = t0 + args.reload_every
        while time.time() - t0 < args.duration:
            time.sleep(0.1)
            now = time.time()
            if now >= next_reload:
                gen += 1
                tmp = ppath + ".tmp~"
                with open(tmp, "w") as f:
                    f.write(policy_text(env["origin_port"], env["echo_port"], gen))
                os.rename(tmp, ppath)
                if gen % 3 == 0:
                    egressd.send_signal(signal.SIGHUP)
                next_reload = now + args.reload_every
            if not rss or now - rss[-1][0] >= 1:
                rss.append((now - t0, rss_kb(egressd.pid)))
        stop.set()
        for w in workers:
            w.join(30)
        sent = dict(stats.sent)
        total = sum(sent.values())

        # Every line reaches the log (bounded wait), then compare.
        end = time.time() + 15
        while True:
            lines, by_line = log_counts(log)
            if lines >= total or time.time() > end:
                break
            time.sleep(0.2)
        by_metric = metrics(env["metrics"])
        reload_ok = 0
        failed = []
        keys = sorted(set(sent) | set(by_line) | set(by_metric))
        print("%-8s %-6s %10s %10s %10s" % ("proto", "decis", "sent", "log", "metric"))
        for k in keys:
            row = (sent.get(k, 0), by_line.get(k, 0), by_metric.get(k, 0))
            print("%-8s %-6s %10d %10d %10d%s" % (k[0], k[1], row[0], row[1], row[2], "" if len(set(row)) == 1 else "   MISMATCH"))
            if len(set(row)) != 1:
                failed.append("counts differ for %s/%s: sent %d, log %d, metric %d" % (k + row))
        print("%-15s %10d %10d %10d" % ("total", total, lines, sum(by_metric.values())))
        if stats.bad:
            failed.append("%d unexpected answers, e.g. %s" % (len(stats.bad), stats.bad[:5]))
        judged = [kb for (t, kb) in rss if t >= args.warmup * args.duration]
        growth_mb = (max(judged) - judged[0]) / 1024 if judged else 0
        print("rss: start %.1f MiB, after warm-up %.1f MiB, end %.1f MiB, growth after warm-up %.1f MiB (slack %.0f)"
              % (rss[0][1] / 1024, judged[0] / 1024 if judged else 0, rss[-1][1] / 1024, growth_mb, args.rss_slack_mb))
        if growth_mb > args.rss_slack_mb:
            failed.append("RSS grew %.1f MiB after warm-up" % growth_mb)
        for line in stderr_lines:
            if "reload" in line and "error" in line.lower():
                failed.append("a reload failed: " + line)
            if "panicked" in line:
                failed.append("egressd panicked: " + line)
        m = re.search(r'egressd_policy_reloads_total\{result="ok"\} (\S+)', metrics_text(env["metrics"]))
        reload_ok = int(float(m.group(1))) if m else 0
        print("reloads: %d policy rewrites, %d reloads counted ok; %d requests in %.0f s (%.0f/s) from %d clients"
              % (gen, reload_ok, total, args.duration, total / args.duration, args.clients))
        if gen > 0 and reload_ok == 0:
            failed.append("no reload took effect")
        if failed:
            print("FAIL")
            for f in failed:
                print("  - " + f)
            return 1
        print("PASS")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if args.keep:
            print("work directory: %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def metrics_text(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n")
    _, body = recv_response(s.makefile("rb"))
    s.close()
    return body.decode()


if __name__ == "__main__":
    sys.exit(main())
