//! What a sandbox will look like, decided before anything is created: the
//! mounts in order, the environment, the limits, where egress goes. Pure
//! (no I/O, no root needed): the facts it needs about the host are
//! gathered first into [`HostFacts`], so every rule here is unit-tested.
//!
//! Filesystem model: the host's tree is visible **read-only**; `/tmp`,
//! `/var/tmp`, `/run`, `/dev/shm` and HOME are fresh tmpfs (so host sockets
//! under `/run` — nscd, D-Bus, systemd-resolved, an SSH agent — which would
//! resolve or connect on CMD's behalf from outside the network namespace,
//! are not reachable); `--ro`/`--rw` bind host paths back in at the same
//! place; `/proc` is the sandbox's own; `/etc/resolv.conf` names only the
//! resolver inside.
//!
//! Network model: only `lo`. By default nothing routes anywhere else, so a
//! program that ignores the proxy variables fails (`ENETUNREACH`). With
//! `--transparent`, a default route through `lo` plus the nftables rules of
//! [`capture_rules`] (loaded inside the sandbox's own network namespace)
//! send every TCP connection to the capture listener (127.0.0.1 / [::1],
//! port [`CAPTURE_PORT`]), DNS to the resolver inside, and drop everything
//! else: the sandbox still has no route of its own.

use std::ffi::{CString, OsString};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::env::{self, EnvSpec};
use super::limits::Limits;

/// The sandbox's own loopback address, where its proxy and resolver listen.
pub const INSIDE_IP: Ipv4Addr = Ipv4Addr::LOCALHOST;
/// A second loopback address. glibc's `AI_ADDRCONFIG` ignores 127.0.0.1 when
/// deciding whether IPv4 is configured: with only that address, a lookup
/// asking for IPv4 with `AI_ADDRCONFIG` (Node's `dns.lookup({family: 4})`,
/// `getaddrinfo(AF_INET, AI_ADDRCONFIG)`) fails without sending a query.
pub const SECOND_LOOPBACK: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
pub const PROXY_PORT: u16 = 3128;
pub const DNS_PORT: u16 = 53;
/// `--transparent`: where the sandbox's redirected TCP connections arrive.
pub const CAPTURE_PORT: u16 = 3129;
/// Where `nft` is looked for when `--nft` is not given and PATH has none.
pub const NFT_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin"];
/// `--connect` without `--connect-dns`: the serving egressd's default DNS port.
pub const SERVE_DNS_PORT: u16 = 8053;
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// Where the CA files appear inside (on the fresh /run, or /tmp without one).
pub const CA_DIR_INSIDE: &str = "/run/egressd";
pub const CA_DIR_INSIDE_NO_RUN: &str = "/tmp/.egressd";
pub const CA_BUNDLE_NAME: &str = "ca-bundle.pem";
pub const CA_CERT_NAME: &str = "ca.pem";
/// HOME when the launcher's own HOME cannot be hidden by a tmpfs.
pub const FALLBACK_HOME: &str = "/tmp/home";

/// Directories a HOME may not be or contain: a tmpfs over HOME would hide
/// the programs and data CMD needs.
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev",
    "/sys", "/boot", "/var", "/opt", "/nix", "/snap",
];
/// Trees a HOME may not lie in (`/var/lib/…` and `/opt/…` may hold homes).
const SYSTEM_TREES: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev",
    "/sys", "/boot", "/nix", "/snap",
];
/// Fresh tmpfs mounts (besides HOME) when the host has the directory, with
/// their modes.
pub const SCRATCH: &[(&str, u32)] = &[
    ("/tmp", 0o1777),
    ("/var/tmp", 0o1777),
    ("/run", 0o755),
    ("/dev/shm", 0o1777),
];

/// Facts about the host, gathered (impurely) by the caller.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    pub uid: u32,
    pub gid: u32,
    /// The launcher's working directory (canonical).
    pub cwd: PathBuf,
    /// `$HOME` if it is an absolute path to an existing directory (canonical).
    pub home: Option<PathBuf>,
    /// Which of [`SCRATCH`]'s directories exist on the host (as directories).
    pub scratch: Vec<PathBuf>,
    /// Where `/etc/resolv.conf` leads (symlinks followed), if anywhere.
    pub resolv_conf: Option<PathBuf>,
    /// The launcher's environment.
    pub env: Vec<(OsString, OsString)>,
    /// `--ro`/`--rw` sources, canonicalised, with `true` for `--rw`.
    pub binds: Vec<(PathBuf, bool)>,
    /// The `--client` token (from `EGRESSD_TOKEN` or `--token-file`).
    pub token: Option<String>,
    /// With `--ca-dir`: the interception CA the sandbox must trust.
    pub ca: Option<CaTrust>,
    /// The `nft` program (`--nft`, else found in PATH or [`NFT_DIRS`]).
    pub nft: Option<PathBuf>,
}

/// Host paths of the interception CA's public files (all canonical).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaTrust {
    /// The CA directory: hidden inside, since it holds `ca.key`.
    pub dir: PathBuf,
    /// egressd's CA certificate alone.
    pub cert: PathBuf,
    /// The system roots followed by egressd's CA.
    pub bundle: PathBuf,
    /// The distribution's CA bundle, which the sandbox's copy replaces.
    pub system_bundle: Option<PathBuf>,
}

/// The options of `egressd run` that shape the sandbox (the CLI's view of
/// them, minus what [`HostFacts`] already resolved).
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub command: Vec<OsString>,
    pub env: Vec<EnvSpec>,
    pub limits: Limits,
    pub timeout: Option<Duration>,
    pub connect: Option<SocketAddr>,
    pub connect_dns: Option<SocketAddr>,
    pub client: Option<String>,
    pub transparent: bool,
}

/// Where the sandbox's proxy and resolver sockets lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// An egressd started by the launcher serves them.
    Embedded,
    /// Relayed to an egressd that is already serving.
    Connect { proxy: SocketAddr, dns: SocketAddr },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tmpfs {
    pub path: PathBuf,
    pub mode: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Source and target: host paths appear at the same place inside.
    pub path: PathBuf,
    pub writable: bool,
}

/// `--transparent`: how the sandbox's own network namespace captures what
/// leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transparent {
    /// The `nft` program, run inside (with the sandbox's capabilities,
    /// before CMD loses them).
    pub nft: PathBuf,
    /// The ruleset it loads ([`capture_rules`]).
    pub rules: String,
}

/// A host file shown read-only at another path inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBind {
    pub source: PathBuf,
    pub target: PathBuf,
}

/// Everything the sandbox will be; built once, then carried out.
#[derive(Debug, Clone)]
pub struct Plan {
    pub argv: Vec<CString>,
    /// `NAME=VALUE` entries, in order.
    pub env: Vec<CString>,
    pub dropped_credentials: Vec<String>,
    pub dropped_other: usize,
    pub missing_env: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub cwd: PathBuf,
    pub home: PathBuf,
    /// Parents before children.
    pub tmpfs: Vec<Tmpfs>,
    /// tmpfs size cap (`--memory`, so scratch space cannot outgrow it).
    pub tmpfs_size: Option<u64>,
    /// Parents before children.
    pub binds: Vec<Bind>,
    /// Directories covered by an empty read-only tmpfs after the binds
    /// (the CA directory: its key must not be readable inside).
    pub masks: Vec<PathBuf>,
    /// Mounted after the masks.
    pub file_binds: Vec<FileBind>,
    /// Where to mount the generated resolv.conf (None: the host has none,
    /// and glibc's default, 127.0.0.1, is the resolver inside anyway).
    pub resolv_conf: Option<PathBuf>,
    pub resolv_conf_text: String,
    pub limits: Limits,
    pub timeout: Option<Duration>,
    pub egress: Egress,
    pub proxy_url: String,
    /// `--transparent`.
    pub transparent: Option<Transparent>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("no command given (egressd run [OPTIONS] -- CMD [ARGS…])")]
    NoCommand,
    #[error("an argument or environment value contains a NUL byte")]
    Nul,
    #[error("--client {0} needs its token: set EGRESSD_TOKEN or pass --token-file")]
    NoToken(String),
    #[error("the token for --client is empty or contains spaces or control characters")]
    BadToken,
    #[error("--client, --token-file and --connect-dns need --connect")]
    ClientWithoutConnect,
    #[error(
        "--transparent works with the embedded egressd only, not with --connect: a relay cannot \
         pass the original destination of a captured connection on"
    )]
    TransparentWithConnect,
    #[error(
        "--transparent needs nft (the nftables package) to redirect the sandbox's traffic, and \
         none was found in PATH or {dirs}; install nftables or pass --nft PATH \
         (without it the sandbox is not started: there is no weaker fallback)",
        dirs = NFT_DIRS.join(", ")
    )]
    NoNft,
    #[error(
        "--pids cannot be enforced when egressd run runs as host root (the kernel exempts uid 0 \
         from RLIMIT_NPROC); run it as an unprivileged user"
    )]
    PidsAsRoot,
    #[error("{0}: binding it would cover the sandbox's own {1}")]
    BindCovers(PathBuf, &'static str),
    #[error("{0} is given more than once in --ro/--rw")]
    DuplicateBind(PathBuf),
    #[error("/tmp does not exist on this host")]
    NoTmp,
    #[error(
        "the working directory {0} is hidden inside the sandbox by the fresh {1}; \
         pass --ro {0} or --rw {0}, or run from another directory"
    )]
    CwdHidden(PathBuf, String),
}

/// `true` if `a` is `b` or one of its ancestors.
fn covers(a: &Path, b: &Path) -> bool {
    b.starts_with(a)
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// Builds the plan. Pure.
pub fn build(opts: &Options, host: &HostFacts) -> Result<Plan, PlanError> {
    if opts.command.is_empty() {
        return Err(PlanError::NoCommand);
    }
    if opts.connect.is_none() && (opts.client.is_some() || opts.connect_dns.is_some()) {
        return Err(PlanError::ClientWithoutConnect);
    }
    if opts.limits.pids.is_some() && host.uid == 0 {
        return Err(PlanError::PidsAsRoot);
    }
    let transparent = if opts.transparent {
        if opts.connect.is_some() {
            return Err(PlanError::TransparentWithConnect);
        }
        Some(Transparent {
            nft: host.nft.clone().ok_or(PlanError::NoNft)?,
            rules: capture_rules(),
        })
    } else {
        None
    };
    let egress = match opts.connect {
        None => Egress::Embedded,
        Some(proxy) => Egress::Connect {
            proxy,
            dns: opts
                .connect_dns
                .unwrap_or_else(|| SocketAddr::new(proxy.ip(), SERVE_DNS_PORT)),
        },
    };
    let credentials = match &opts.client {
        None => None,
        Some(id) => {
            let token = host
                .token
                .as_deref()
                .ok_or_else(|| PlanError::NoToken(id.clone()))?;
            if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(PlanError::BadToken);
            }
            Some((id.as_str(), token))
        }
    };
    let proxy_url = proxy_url(credentials);

    // Scratch space and HOME.
    let mut tmpfs: Vec<Tmpfs> = SCRATCH
        .iter()
        .filter(|(p, _)| host.scratch.iter().any(|s| s == Path::new(p)))
        .map(|(p, mode)| Tmpfs {
            path: PathBuf::from(p),
            mode: *mode,
        })
        .collect();
    if !tmpfs.iter().any(|t| t.path == Path::new("/tmp")) {
        return Err(PlanError::NoTmp);
    }
    let home = match &host.home {
        Some(h) if home_is_hideable(h) => h.clone(),
        _ => PathBuf::from(FALLBACK_HOME),
    };
    if !tmpfs.iter().any(|t| t.path == home) {
        tmpfs.push(Tmpfs {
            path: home.clone(),
            mode: 0o700,
        });
    }
    tmpfs.sort_by_key(|t| depth(&t.path));

    // The interception CA: its bundle over the distribution's, both files
    // at a fixed place for the variables below, its directory masked.
    let mut masks = Vec::new();
    let mut file_binds = Vec::new();
    let mut ca_env: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(ca) = &host.ca {
        let inside = if tmpfs.iter().any(|t| t.path == Path::new("/run")) {
            PathBuf::from(CA_DIR_INSIDE)
        } else {
            PathBuf::from(CA_DIR_INSIDE_NO_RUN)
        };
        let (bundle, cert) = (inside.join(CA_BUNDLE_NAME), inside.join(CA_CERT_NAME));
        masks.push(ca.dir.clone());
        if let Some(sys) = &ca.system_bundle {
            file_binds.push(FileBind {
                source: ca.bundle.clone(),
                target: sys.clone(),
            });
        }
        file_binds.push(FileBind {
            source: ca.bundle.clone(),
            target: bundle.clone(),
        });
        file_binds.push(FileBind {
            source: ca.cert.clone(),
            target: cert.clone(),
        });
        for n in crate::tls::roots::BUNDLE_ENV {
            ca_env.push((n, bundle.clone()));
        }
        for n in crate::tls::roots::CA_ONLY_ENV {
            ca_env.push((n, cert.clone()));
        }
    }

    // Binds: never over what keeps the sandbox closed.
    let mut protected: Vec<(PathBuf, &'static str)> = vec![
        (PathBuf::from("/proc"), "/proc"),
        (PathBuf::from("/run"), "/run (host daemons' sockets)"),
        (PathBuf::from("/etc/resolv.conf"), "resolv.conf"),
    ];
    if let Some(r) = &host.resolv_conf {
        protected.push((r.clone(), "resolv.conf"));
    }
    for f in &file_binds {
        protected.push((f.target.clone(), "CA bundle"));
    }
    let mut binds: Vec<Bind> = Vec::new();
    for (path, writable) in &host.binds {
        for (p, what) in &protected {
            if covers(path, p) || (*what == "/proc" && path.starts_with(p)) {
                return Err(PlanError::BindCovers(path.clone(), what));
            }
        }
        if binds.iter().any(|b| &b.path == path) {
            return Err(PlanError::DuplicateBind(path.clone()));
        }
        binds.push(Bind {
            path: path.clone(),
            writable: *writable,
        });
    }
    binds.sort_by_key(|b| depth(&b.path));

    // The working directory must still exist inside: a fresh tmpfs over it
    // (HOME, /tmp) hides it unless a bind brings it back.
    let cwd = host.cwd.clone();
    if let Some(t) = tmpfs
        .iter()
        .filter(|t| cwd.starts_with(&t.path) && cwd != t.path)
        .max_by_key(|t| depth(&t.path))
    {
        let rebound = binds
            .iter()
            .any(|b| cwd.starts_with(&b.path) && b.path.starts_with(&t.path));
        if !rebound {
            let what = if t.path == home {
                "HOME".to_string()
            } else {
                t.path.display().to_string()
            };
            return Err(PlanError::CwdHidden(cwd, what));
        }
    }

    // Environment.
    let scrubbed = env::scrub(host.env.iter().cloned(), &opts.env);
    let mut vars = scrubbed.vars;
    let named = |n: &str| opts.env.iter().any(|e| e.name() == n);
    let mut fixed: Vec<(&str, OsString)> = vec![
        ("HOME", home.clone().into_os_string()),
        ("PWD", cwd.clone().into_os_string()),
    ];
    for n in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        fixed.push((n, proxy_url.clone().into()));
    }
    fixed.push(("NO_PROXY", NO_PROXY.into()));
    fixed.push(("no_proxy", NO_PROXY.into()));
    for (n, p) in ca_env {
        fixed.push((n, p.into_os_string()));
    }
    for (n, v) in fixed {
        if !named(n) {
            env::set(&mut vars, n, v);
        }
    }
    let env = vars
        .into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).map_err(|_| PlanError::Nul)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let argv = opts
        .command
        .iter()
        .map(|a| CString::new(a.as_bytes()).map_err(|_| PlanError::Nul))
        .collect::<Result<Vec<_>, _>>()?;

    Ok(Plan {
        argv,
        env,
        dropped_credentials: scrubbed.dropped_credentials,
        dropped_other: scrubbed.dropped_other,
        missing_env: scrubbed.missing,
        uid: host.uid,
        gid: host.gid,
        cwd,
        home,
        tmpfs,
        tmpfs_size: opts.limits.memory,
        binds,
        masks,
        file_binds,
        resolv_conf: host.resolv_conf.clone(),
        resolv_conf_text: resolv_conf_text(),
        limits: opts.limits.clone(),
        timeout: opts.timeout,
        egress,
        proxy_url,
        transparent,
    })
}

/// The nftables ruleset of `--transparent`, for the sandbox's own network
/// namespace (so no root is needed, and nothing on the host changes).
/// Loopback stays loopback; TCP and UDP to port 53 anywhere (IPv4) reach
/// the resolver inside; every other TCP connection reaches the capture
/// listener, whose egressd recovers the original destination
/// (`SO_ORIGINAL_DST`); and the filter drops whatever is still not
/// addressed to loopback after that — all other UDP (QUIC included), ICMP,
/// IPv6 DNS — so the default route through `lo` leads nowhere but egressd.
pub fn capture_rules() -> String {
    format!(
        "# written by egressd run --transparent
table inet egressd {{
  chain capture {{
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    ip6 daddr ::1 return
    meta nfproto ipv4 udp dport {DNS_PORT} redirect to :{DNS_PORT}
    meta nfproto ipv4 tcp dport {DNS_PORT} redirect to :{DNS_PORT}
    meta l4proto tcp redirect to :{CAPTURE_PORT}
  }}
  chain only_loopback {{
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
  }}
}}
"
    )
}

/// A HOME that a tmpfs may cover: not `/`, not in or over a system tree.
fn home_is_hideable(h: &Path) -> bool {
    h.is_absolute()
        && depth(h) > 1
        && !SYSTEM_DIRS.iter().any(|s| covers(h, Path::new(s)))
        && !SYSTEM_TREES.iter().any(|s| h.starts_with(s))
}

/// The resolv.conf inside: the sandbox's resolver only, no search domains
/// (a host's search list would turn every short name into a query that
/// egressd must refuse).
pub fn resolv_conf_text() -> String {
    format!("# written by egressd run: every lookup goes to egressd\nnameserver {INSIDE_IP}\n")
}

/// `http://127.0.0.1:3128`, with `ID:TOKEN@` when a client is named (the
/// token is what egressd checks; clients send it as Proxy-Authorization).
pub fn proxy_url(credentials: Option<(&str, &str)>) -> String {
    match credentials {
        None => format!("http://{INSIDE_IP}:{PROXY_PORT}"),
        Some((id, token)) => format!(
            "http://{}:{}@{INSIDE_IP}:{PROXY_PORT}",
            userinfo_escape(id),
            userinfo_escape(token)
        ),
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn userinfo_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> HostFacts {
        HostFacts {
            uid: 1000,
            gid: 1000,
            cwd: "/srv/project".into(),
            home: Some("/home/me".into()),
            scratch: ["/tmp", "/var/tmp", "/run", "/dev/shm"]
                .iter()
                .map(PathBuf::from)
                .collect(),
            resolv_conf: Some("/etc/resolv.conf".into()),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/home/me".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "x".into()),
                ("HTTP_PROXY".into(), "http://corp:8080".into()),
            ],
            binds: vec![],
            token: None,
            ca: None,
            nft: None,
        }
    }

    fn opts() -> Options {
        Options {
            command: vec!["curl".into(), "-sS".into()],
            ..Options::default()
        }
    }

    fn env_of<'a>(p: &'a Plan, name: &str) -> Option<&'a str> {
        p.env
            .iter()
            .find_map(|kv| kv.to_str().ok()?.strip_prefix(name)?.strip_prefix('='))
    }

    #[test]
    fn default_sandbox() {
        let p = build(&opts(), &host()).unwrap();
        assert_eq!(p.egress, Egress::Embedded);
        assert_eq!(p.home, Path::new("/home/me"));
        let mounts: Vec<_> = p.tmpfs.iter().map(|t| t.path.to_str().unwrap()).collect();
        assert_eq!(mounts, ["/tmp", "/run", "/var/tmp", "/dev/shm", "/home/me"]);
        assert_eq!(env_of(&p, "HOME"), Some("/home/me"));
        assert_eq!(env_of(&p, "PATH"), Some("/usr/bin:/bin"));
        assert_eq!(env_of(&p, "PWD"), Some("/srv/project"));
        assert_eq!(env_of(&p, "AWS_SECRET_ACCESS_KEY"), None);
        for n in ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"] {
            assert_eq!(env_of(&p, n), Some("http://127.0.0.1:3128"), "{n}");
        }
        assert_eq!(env_of(&p, "no_proxy"), Some("localhost,127.0.0.1,::1"));
        assert_eq!(p.dropped_credentials, ["AWS_SECRET_ACCESS_KEY"]);
        assert_eq!(
            p.resolv_conf_text.lines().last(),
            Some("nameserver 127.0.0.1")
        );
        assert!(!p.resolv_conf_text.contains("search"));
        assert_eq!(p.argv[0].to_str().unwrap(), "curl");
    }

    #[test]
    fn home_falls_back_when_it_cannot_be_hidden() {
        for h in [
            None,
            Some("/"),
            Some("/usr/local"),
            Some("/var"),
            Some("/etc/x"),
        ] {
            let mut hf = host();
            hf.home = h.map(PathBuf::from);
            let p = build(&opts(), &hf).unwrap();
            assert_eq!(p.home, Path::new(FALLBACK_HOME), "{h:?}");
            assert!(p.tmpfs.iter().any(|t| t.path == Path::new(FALLBACK_HOME)));
        }
        for h in ["/root", "/var/lib/jenkins", "/opt/agent/home"] {
            let mut hf = host();
            hf.home = Some(h.into());
            assert_eq!(build(&opts(), &hf).unwrap().home, Path::new(h));
        }
    }

    #[test]
    fn cwd_hidden_by_fresh_home_needs_a_bind() {
        let mut hf = host();
        hf.cwd = "/home/me/proj".into();
        assert_eq!(
            build(&opts(), &hf).unwrap_err(),
            PlanError::CwdHidden("/home/me/proj".into(), "HOME".into())
        );
        hf.binds = vec![("/home/me/proj".into(), true)];
        assert!(build(&opts(), &hf).is_ok());
        hf.cwd = "/home/me".into();
        hf.binds.clear();
        assert!(build(&opts(), &hf).is_ok(), "the fresh HOME itself is fine");
        hf.cwd = "/tmp/build".into();
        assert!(matches!(
            build(&opts(), &hf),
            Err(PlanError::CwdHidden(_, w)) if w == "/tmp"
        ));
    }

    #[test]
    fn binds_are_ordered_and_never_cover_the_closed_parts() {
        let mut hf = host();
        hf.binds = vec![("/srv/project/out".into(), true), ("/srv".into(), false)];
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(
            p.binds,
            [
                Bind {
                    path: "/srv".into(),
                    writable: false
                },
                Bind {
                    path: "/srv/project/out".into(),
                    writable: true
                }
            ]
        );
        for bad in ["/", "/etc", "/etc/resolv.conf", "/run", "/proc", "/proc/1"] {
            hf.binds = vec![(bad.into(), true)];
            assert!(
                matches!(build(&opts(), &hf), Err(PlanError::BindCovers(..))),
                "{bad}"
            );
        }
        hf.resolv_conf = Some("/run/systemd/resolve/stub-resolv.conf".into());
        hf.binds = vec![("/run/systemd".into(), false)];
        assert!(matches!(
            build(&opts(), &hf),
            Err(PlanError::BindCovers(..))
        ));
        hf.binds = vec![("/run/postgresql".into(), true)];
        assert!(
            build(&opts(), &hf).is_ok(),
            "a chosen socket dir may be bound"
        );
        hf.binds = vec![("/srv".into(), true), ("/srv".into(), false)];
        assert_eq!(
            build(&opts(), &hf).unwrap_err(),
            PlanError::DuplicateBind("/srv".into())
        );
    }

    #[test]
    fn connect_mode_and_client_token() {
        let mut o = opts();
        o.connect = Some("10.0.0.5:3128".parse().unwrap());
        o.client = Some("agent-a".into());
        let mut hf = host();
        assert_eq!(
            build(&o, &hf).unwrap_err(),
            PlanError::NoToken("agent-a".into())
        );
        hf.token = Some("s3:cr/t".into());
        let p = build(&o, &hf).unwrap();
        assert_eq!(
            p.egress,
            Egress::Connect {
                proxy: "10.0.0.5:3128".parse().unwrap(),
                dns: "10.0.0.5:8053".parse().unwrap()
            }
        );
        assert_eq!(p.proxy_url, "http://agent-a:s3%3Acr%2Ft@127.0.0.1:3128");
        assert_eq!(env_of(&p, "https_proxy"), Some(p.proxy_url.as_str()));
        hf.token = Some("has space".into());
        assert_eq!(build(&o, &hf).unwrap_err(), PlanError::BadToken);

        let mut o = opts();
        o.client = Some("agent-a".into());
        assert_eq!(
            build(&o, &host()).unwrap_err(),
            PlanError::ClientWithoutConnect
        );
    }

    #[test]
    fn explicit_env_wins_and_pids_as_root_is_refused() {
        let mut o = opts();
        o.env = vec![
            EnvSpec::Pass("AWS_SECRET_ACCESS_KEY".into()),
            EnvSpec::Set("NO_PROXY".into(), "internal".into()),
        ];
        let p = build(&o, &host()).unwrap();
        assert_eq!(env_of(&p, "AWS_SECRET_ACCESS_KEY"), Some("x"));
        assert_eq!(env_of(&p, "NO_PROXY"), Some("internal"));
        assert_eq!(env_of(&p, "no_proxy"), Some(NO_PROXY));

        let mut o = opts();
        o.limits.pids = Some(10);
        let mut hf = host();
        assert!(build(&o, &hf).is_ok());
        hf.uid = 0;
        assert_eq!(build(&o, &hf).unwrap_err(), PlanError::PidsAsRoot);
    }

    #[test]
    fn interception_ca_is_trusted_and_its_key_hidden() {
        let mut hf = host();
        hf.ca = Some(CaTrust {
            dir: "/home/me/certs".into(),
            cert: "/home/me/certs/ca.pem".into(),
            bundle: "/home/me/certs/sandbox-bundle.pem".into(),
            system_bundle: Some("/etc/ssl/certs/ca-certificates.crt".into()),
        });
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(p.masks, [PathBuf::from("/home/me/certs")]);
        let targets: Vec<_> = p
            .file_binds
            .iter()
            .map(|b| b.target.to_str().unwrap())
            .collect();
        assert_eq!(
            targets,
            [
                "/etc/ssl/certs/ca-certificates.crt",
                "/run/egressd/ca-bundle.pem",
                "/run/egressd/ca.pem"
            ]
        );
        assert_eq!(
            env_of(&p, "SSL_CERT_FILE"),
            Some("/run/egressd/ca-bundle.pem")
        );
        assert_eq!(
            env_of(&p, "REQUESTS_CA_BUNDLE"),
            Some("/run/egressd/ca-bundle.pem")
        );
        assert_eq!(
            env_of(&p, "NODE_EXTRA_CA_CERTS"),
            Some("/run/egressd/ca.pem")
        );

        hf.binds = vec![("/etc/ssl".into(), false)];
        assert!(matches!(
            build(&opts(), &hf),
            Err(PlanError::BindCovers(_, "CA bundle"))
        ));
        hf.binds.clear();

        hf.scratch.retain(|s| s != Path::new("/run"));
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(
            env_of(&p, "SSL_CERT_FILE"),
            Some("/tmp/.egressd/ca-bundle.pem")
        );
    }

    #[test]
    fn transparent_needs_nft_and_the_embedded_egressd() {
        let mut o = opts();
        o.transparent = true;
        let mut hf = host();
        assert_eq!(build(&o, &hf).unwrap_err(), PlanError::NoNft);
        hf.nft = Some("/usr/sbin/nft".into());
        let p = build(&o, &hf).unwrap();
        let t = p.transparent.clone().expect("transparent");
        assert_eq!(t.nft, Path::new("/usr/sbin/nft"));
        assert_eq!(t.rules, capture_rules());
        // The proxy variables stay: programs that honour them keep the
        // proxy's full semantics; capture is for the others.
        assert_eq!(env_of(&p, "https_proxy"), Some("http://127.0.0.1:3128"));
        assert!(build(&opts(), &hf).unwrap().transparent.is_none());

        o.connect = Some("10.0.0.5:3128".parse().unwrap());
        assert_eq!(
            build(&o, &hf).unwrap_err(),
            PlanError::TransparentWithConnect
        );
    }

    #[test]
    fn capture_rules_redirect_tcp_and_dns_and_drop_the_rest() {
        let r = capture_rules();
        let nat = r.find("type nat hook output").unwrap();
        let filter = r.find("type filter hook output").unwrap();
        let pos = |line: &str| r.find(line).unwrap_or_else(|| panic!("{line}"));
        // Loopback is left alone before anything is redirected.
        assert!(nat < pos("ip daddr 127.0.0.0/8 return"));
        assert!(pos("ip6 daddr ::1 return") < pos("udp dport 53 redirect to :53"));
        assert!(pos("tcp dport 53 redirect to :53") < pos("meta l4proto tcp redirect to :3129"));
        // Whatever is not addressed to loopback after redirection is dropped.
        assert!(r[filter..].contains("policy drop;"));
        assert!(r[filter..].contains("ip daddr 127.0.0.0/8 accept"));
        assert!(r[filter..].contains("ip6 daddr ::1 accept"));
        assert_eq!(r[filter..].matches("accept").count(), 2);
        assert!(
            !r.contains("udp dport 443"),
            "no UDP besides DNS is let out"
        );
    }

    #[test]
    fn nul_in_arguments_is_refused() {
        let mut o = opts();
        o.command.push("a\0b".into());
        assert_eq!(build(&o, &host()).unwrap_err(), PlanError::Nul);
    }
}
