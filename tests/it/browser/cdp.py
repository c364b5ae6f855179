#!/usr/bin/env python3
"""Drives Chromium over the DevTools protocol on --remote-debugging-pipe.

No debugging port is opened and nothing is downloaded: Chromium reads
commands on fd 3 and writes replies on fd 4, NUL-delimited JSON.

    cdp.py [--trust PEM] [--url URL] [--eval JS] [--idle SECS] [--timeout SECS] -- CHROMIUM ARGS...

With --url: opens a tab, navigates there, waits for the load event, then
prints the JSON value of JS (awaited when it is a promise) on stdout as
`RESULT <json>`. With --idle: leaves Chromium alone for SECS first (to
see what it sends by itself). With --trust: the CA certificate in PEM is added to the NSS database in
$HOME/.pki/nssdb first (made if missing), as trusted for TLS servers.
Exit status 0 once the result is printed;
2 when Chromium exited or did not answer in time.
"""

import argparse
import fcntl
import json
import os
import select
import subprocess
import sys
import time


class Pipe:
    def __init__(self, argv):
        # Chromium's ends: it reads fd 3, writes fd 4. Ours: the other ends.
        cmd_r, our_w = os.pipe()
        our_r, cmd_w = os.pipe()
        # Move Chromium's ends out of the way of 3 and 4 before dup2 onto
        # them, so that no end is closed by the dup2 of the other.
        cmd_r2 = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        cmd_w2 = fcntl.fcntl(cmd_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(cmd_w)

        def child():
            os.dup2(cmd_r2, 3)
            os.dup2(cmd_w2, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            argv + ["--remote-debugging-pipe"],
            preexec_fn=child,
            pass_fds=(),
            close_fds=False,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,
        )
        os.close(cmd_r2)
        os.close(cmd_w2)
        self.r, self.w = our_r, our_w
        self.buf = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def read_one(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from Chromium in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise EOFError("Chromium closed the pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=None, deadline=None):
        i = self.send(method, params, session)
        while True:
            m = self.read_one(deadline)
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_event(self, method, session, deadline):
        for k, m in enumerate(self.events):
            if m.get("method") == method and m.get("sessionId") == session:
                del self.events[k]
                return m
        while True:
            m = self.read_one(deadline)
            if m.get("method") == method and m.get("sessionId") == session:
                return m
            self.events.append(m)


def trust(pem):
    db = "sql:" + os.path.join(os.environ["HOME"], ".pki", "nssdb")
    if not os.path.exists(os.path.join(db[4:], "cert9.db")):
        os.makedirs(db[4:], mode=0o700, exist_ok=True)
        subprocess.run(["certutil", "-N", "-d", db, "--empty-password"], check=True)
    subprocess.run(
        ["certutil", "-A", "-d", db, "-t", "C,,", "-n", os.path.basename(pem), "-i", pem],
        check=True,
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--eval", default="null")
    ap.add_argument("--idle", type=float, default=0)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--trust", action="append", default=[])
    ap.add_argument("argv", nargs="+")
    a = ap.parse_args()
    for pem in a.trust:
        trust(pem)
    deadline = time.monotonic() + a.timeout + a.idle
    p = Pipe(a.argv)
    try:
        p.call("Browser.getVersion", deadline=deadline)
        if a.idle:
            time.sleep(a.idle)
        result = None
        if a.url:
            t = p.call("Target.createTarget", {"url": "about:blank"}, deadline=deadline)
            s = p.call(
                "Target.attachToTarget",
                {"targetId": t["targetId"], "flatten": True},
                deadline=deadline,
            )["sessionId"]
            for d in ("Page", "Network", "Runtime"):
                p.call(f"{d}.enable", session=s, deadline=deadline)
            p.call("Page.navigate", {"url": a.url}, session=s, deadline=deadline)
            p.wait_event("Page.loadEventFired", s, deadline)
            r = p.call(
                "Runtime.evaluate",
                {"expression": a.eval, "awaitPromise": True, "returnByValue": True},
                session=s,
                deadline=deadline,
            )
            if "exceptionDetails" in r:
                raise RuntimeError(f"evaluation failed: {r['exceptionDetails']}")
            result = r["result"].get("value")
        print("RESULT " + json.dumps(result), flush=True)
        try:
            p.call("Browser.close", deadline=time.monotonic() + 10)
        except (EOFError, TimeoutError, RuntimeError):
            pass
    except (EOFError, TimeoutError, RuntimeError) as e:
        print(f"cdp.py: {e}", file=sys.stderr, flush=True)
        p.proc.kill()
        p.proc.wait()
        return 2
    try:
        p.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.proc.kill()
        p.proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
