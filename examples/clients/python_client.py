#!/usr/bin/env python3
"""A Python program behind egressd, with nothing but the standard library.

    export HTTPS_PROXY=http://127.0.0.1:3128 HTTP_PROXY=http://127.0.0.1:3128
    export https_proxy=$HTTPS_PROXY http_proxy=$HTTP_PROXY
    python3 examples/clients/python_client.py [ALLOWED_URL [DENIED_URL]]

urllib (like requests, httpx and pip) reads the *_PROXY variables and sends
https:// requests as a CONNECT tunnel through egressd, http:// ones as
absolute-form requests. When egressd refuses, it answers 403 with the header
X-Egressd-Reason and a one-paragraph explanation naming whom to ask. For
https:// the 403 answers the CONNECT, which urllib reports only as "Tunnel
connection failed: 403"; explain_denial() asks egressd directly to read the
reason. Exit status: 0 when the first URL was fetched and the second refused.
"""

import http.client
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

ALLOWED = "https://pypi.org/simple/requests/"
DENIED = "https://example.com/"


def proxy_for(url):
    scheme = urllib.parse.urlsplit(url).scheme
    proxy = urllib.request.getproxies().get(scheme)
    if not proxy:
        sys.exit(f"no {scheme}_proxy set: point it at egressd (http://127.0.0.1:3128)")
    return urllib.parse.urlsplit(proxy)


def explain_denial(url):
    """Asks egressd the same question the client asked, and returns
    (status, reason header, body) of its answer."""
    u = urllib.parse.urlsplit(url)
    proxy = proxy_for(url)
    conn = http.client.HTTPConnection(proxy.hostname, proxy.port or 3128, timeout=10)
    if u.scheme == "https":
        authority = f"{u.hostname}:{u.port or 443}"
        # The Host of a CONNECT is its authority (egressd refuses others).
        conn.request("CONNECT", authority, headers={"Host": authority})
    else:
        conn.request("GET", url, headers={"Host": u.netloc})
    resp = conn.getresponse()
    body = resp.read().decode("utf-8", "replace").strip()
    conn.close()
    return resp.status, resp.getheader("X-Egressd-Reason"), body


def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:
            data = resp.read()
            print(f"ALLOWED {url}: {resp.status}, {len(data)} bytes")
            return True
    except urllib.error.HTTPError as e:
        # http:// through the proxy: egressd's own 403 arrives as the response.
        reason = e.headers.get("X-Egressd-Reason")
        if reason:
            print(f"DENIED  {url}: {e.code} {reason}")
            print(f"        {e.read().decode('utf-8', 'replace').strip()}")
            return False
        raise
    except urllib.error.URLError as e:
        # https://: the CONNECT was refused before any TLS.
        status, reason, body = explain_denial(url)
        if status == 403 and reason:
            print(f"DENIED  {url}: {status} {reason} (urllib said: {e.reason})")
            print(f"        {body}")
            return False
        raise


def main():
    allowed = sys.argv[1] if len(sys.argv) > 1 else ALLOWED
    denied = sys.argv[2] if len(sys.argv) > 2 else DENIED
    ok = fetch(allowed)
    refused = not fetch(denied)
    if refused:
        print(f"        why, in full: egressd explain {denied}")
    sys.exit(0 if ok and refused else 1)


if __name__ == "__main__":
    if not any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")):
        sys.exit("set HTTPS_PROXY/HTTP_PROXY (and the lower-case forms) to egressd first")
    main()
