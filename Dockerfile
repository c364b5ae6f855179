# egressd container image.
#
#   docker build -t egressd .
#   docker run --rm -p 3128:3128 -p 8053:8053/udp -p 8053:8053/tcp -p 9464:9464 \
#     -v "$PWD/policy:/etc/egressd/policy:ro" egressd
#
# Inside the container egressd listens on all interfaces; the ports are set
# by the EGRESSD_* variables below (every `serve` flag has one):
#   3128/tcp       HTTP proxy and CONNECT      EGRESSD_LISTEN
#   8053/udp+tcp   DNS resolver                EGRESSD_DNS_LISTEN
#   9464/tcp       /metrics /healthz /readyz   EGRESSD_METRICS_LISTEN
# The decision log goes to stdout (EGRESSD_LOG=-), one JSON object a line.
# The policy is a directory mounted at /etc/egressd/policy (a ConfigMap in
# Kubernetes); edits are picked up within 2 s, no restart. The image carries
# the shipped example policy there until one is mounted over it.
# TLS interception: mount the CA directory and set EGRESSD_CA_DIR.

# ---- build ------------------------------------------------------------------
# Any stable Rust >= the rust-version in Cargo.toml builds egressd.
FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# The whole tree minus .dockerignore: Cargo.toml names bench targets whose
# files must exist for the manifest to load.
COPY . .
# --locked: exactly the dependency versions in Cargo.lock.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release --bin egressd \
    && cp target/release/egressd /usr/local/bin/egressd

# ---- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim
# ca-certificates: origins are verified against the system roots. Versions
# are left to the bookworm security channel rather than pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --user-group --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin egressd \
    && mkdir -p /etc/egressd/policy
COPY --from=build /usr/local/bin/egressd /usr/local/bin/egressd
COPY policy/*.yaml /etc/egressd/policy/

ENV EGRESSD_POLICY=/etc/egressd/policy \
    EGRESSD_LISTEN=0.0.0.0:3128 \
    EGRESSD_DNS_LISTEN=0.0.0.0:8053 \
    EGRESSD_METRICS_LISTEN=0.0.0.0:9464 \
    EGRESSD_LOG=-
EXPOSE 3128/tcp 8053/udp 8053/tcp 9464/tcp

# Unprivileged: no port below 1024 is bound (map 53 -> 8053 outside).
USER 10001:10001

# /healthz over bash's /dev/tcp: the image needs no curl or wget.
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${EGRESSD_METRICS_LISTEN##*:} && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]

ENTRYPOINT ["/usr/local/bin/egressd"]
CMD ["serve"]
