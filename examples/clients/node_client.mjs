#!/usr/bin/env node
// A Node.js program behind egressd, with no dependencies.
//
//   export HTTPS_PROXY=http://127.0.0.1:3128 HTTP_PROXY=http://127.0.0.1:3128
//   node examples/clients/node_client.mjs [ALLOWED_URL [DENIED_URL]]
//
// Node's built-in fetch (20, 22) ignores the *_PROXY variables, so a Node
// program inside a sandbox that only egressd lets out must be told about the
// proxy: on Node >= 24 run with NODE_USE_ENV_PROXY=1; with undici, use
// `setGlobalDispatcher(new EnvHttpProxyAgent())`; npm itself reads
// HTTPS_PROXY. This file shows the protocol underneath, with node:http and
// node:tls: https:// goes through a CONNECT tunnel (TLS end to end, egressd
// sees only the host), http:// as an absolute-form request. A refusal is a
// 403 with X-Egressd-Reason and an explanation naming whom to ask.
// Exit status: 0 when the first URL was fetched and the second refused.

import http from "node:http";
import tls from "node:tls";

const ALLOWED = process.argv[2] ?? "https://registry.npmjs.org/left-pad";
const DENIED = process.argv[3] ?? "https://example.com/";

function proxyFor(url) {
  const env = process.env;
  const p = url.protocol === "https:"
    ? env.HTTPS_PROXY ?? env.https_proxy
    : env.HTTP_PROXY ?? env.http_proxy;
  if (!p) {
    console.error(`no ${url.protocol.slice(0, -1)} proxy set: point HTTPS_PROXY/HTTP_PROXY at egressd`);
    process.exit(2);
  }
  return new URL(p);
}

function readAll(res) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    res.on("data", (c) => chunks.push(c));
    res.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    res.on("error", reject);
  });
}

/** Resolves to { status, reason, body } for one GET through egressd. */
function get(target) {
  const url = new URL(target);
  const proxy = proxyFor(url);
  const port = Number(proxy.port || 3128);
  return new Promise((resolve, reject) => {
    if (url.protocol === "http:") {
      const req = http.request({ host: proxy.hostname, port, method: "GET", path: url.href, headers: { host: url.host } });
      req.on("response", async (res) => resolve({ status: res.statusCode, reason: res.headers["x-egressd-reason"], body: await readAll(res) }));
      req.on("error", reject);
      req.setTimeout(20000, () => req.destroy(new Error("timeout")));
      return req.end();
    }
    const authority = `${url.hostname}:${url.port || 443}`;
    const connect = http.request({ host: proxy.hostname, port, method: "CONNECT", path: authority, headers: { host: authority } });
    connect.on("connect", (res, socket, head) => {
      if (res.statusCode !== 200) {
        // egressd's refusal: the tunnel was never opened, and egressd
        // closes the connection after the explanation.
        const chunks = [head];
        socket.on("data", (c) => chunks.push(c));
        socket.on("error", reject);
        socket.on("end", () =>
          resolve({ status: res.statusCode, reason: res.headers["x-egressd-reason"], body: Buffer.concat(chunks).toString("utf8") }),
        );
        return;
      }
      const req = http.request({
        method: "GET",
        path: url.pathname + url.search,
        headers: { host: url.host, "user-agent": "egressd-example/1" },
        // TLS to the origin, inside the tunnel: certificates are checked by Node as usual.
        createConnection: () => tls.connect({ socket, servername: url.hostname }),
      });
      req.on("response", async (r) => resolve({ status: r.statusCode, reason: undefined, body: await readAll(r) }));
      req.on("error", reject);
      req.end();
    });
    connect.on("error", reject);
    connect.setTimeout(20000, () => connect.destroy(new Error("timeout")));
    connect.end();
  });
}

async function fetchAndSay(target) {
  const r = await get(target);
  if (r.status === 403 && r.reason) {
    console.log(`DENIED  ${target}: ${r.status} ${r.reason}`);
    console.log(`        ${r.body.trim()}`);
    console.log(`        why, in full: egressd explain ${target}`);
    return false;
  }
  console.log(`ALLOWED ${target}: ${r.status}, ${Buffer.byteLength(r.body)} bytes`);
  return r.status < 400;
}

const ok = await fetchAndSay(ALLOWED);
const refused = !(await fetchAndSay(DENIED));
process.exit(ok && refused ? 0 : 1);
