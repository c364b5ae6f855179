#!/usr/bin/env bash
# pip, npm, cargo and git through egressd with the shipped policy (policy/):
# each registry is one exception there (pypi, npm-registry, crates-io,
# github-git/github-downloads). Run egressd first (`egressd serve`), then:
#
#   bash examples/clients/installs.sh [PROXY]
#
# Everything is fetched into a temporary directory and removed afterwards.
set -euo pipefail
proxy=${1:-http://127.0.0.1:3128}
# Both cases: curl reads only the lower-case http_proxy, most tools either.
export HTTP_PROXY=$proxy HTTPS_PROXY=$proxy http_proxy=$proxy https_proxy=$proxy
export NO_PROXY=localhost,127.0.0.1,::1 no_proxy=localhost,127.0.0.1,::1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "pip (pypi: pypi.org + files.pythonhosted.org)"
python3 -m pip download --no-deps --no-cache-dir -d "$work/pip" six

step "npm (npm-registry: registry.npmjs.org)"
(cd "$work" && npm pack --silent left-pad@1.3.0)

step "cargo (crates-io: index.crates.io + static.crates.io)"
mkdir -p "$work/cargo" && (cd "$work/cargo" && cargo init --quiet --name probe && cargo add --quiet itoa@1 && CARGO_HOME="$work/cargo-home" cargo fetch --quiet)

step "git (github-git: github.com)"
git ls-remote https://github.com/rust-lang/rustlings.git HEAD

step "and what is not excepted is refused"
curl -s -o /dev/null -w 'CONNECT example.com:443 answered %{http_connect}\n' https://example.com/ || true
