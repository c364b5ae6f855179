//! What a sandbox will look like, decided before anything is created: the
//! filesystem view, CMD's identity, the environment, the limits, where
//! egress goes. Pure (no I/O, no root needed): the facts it needs about the
//! host are gathered first into [`HostFacts`], so every rule here is
//! unit-tested.
//!
//! Filesystem model ([`View`]): a fresh root holding only the read-only
//! system, the working directory (`--cwd`), the `--ro`/`--rw` paths, fresh
//! `/tmp`, `/var/tmp`, `/run` and HOME, a minimal `/dev` and the sandbox's
//! own `/proc`, with `/etc`'s secrets and the CA directory masked. So host
//! sockets anywhere else — nscd, D-Bus, a Docker or kubelet socket, a
//! database's — which would resolve or connect on CMD's behalf from outside
//! the network namespace, are not there to reach. `/etc/resolv.conf` names
//! only the resolver inside.
//!
//! Identity model ([`Identity`]): CMD is a non-root uid inside, and never
//! host root.
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
use super::identity::{self, Account, Caller, Identity, IdentityError};
use super::limits::Limits;
use super::view::{FileBind, Layer, Mask, Origin, SystemEntry, View, SCRATCH, SYSTEM};

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
/// Where the CA files appear inside (on the fresh /run).
pub const CA_DIR_INSIDE: &str = "/run/egressd";
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
/// Places a working directory may not be or contain: showing it would show
/// what the sandbox exists to hide (every host socket, HOME's secrets, the
/// host's scratch directories) or make the system writable.
const CWD_FORBIDDEN: &[&str] = &["/tmp", "/var/tmp", "/run", "/dev", "/proc", "/sys"];

/// `--cwd`: how the working directory is shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CwdMode {
    /// Read-write at the same place (the default).
    #[default]
    Rw,
    /// Read-only at the same place.
    Ro,
    /// Not shown; CMD starts in HOME.
    None,
}

/// Parses `--cwd`.
pub fn parse_cwd_mode(s: &str) -> Result<CwdMode, String> {
    match s {
        "rw" => Ok(CwdMode::Rw),
        "ro" => Ok(CwdMode::Ro),
        "none" => Ok(CwdMode::None),
        _ => Err(format!("{s:?}: use rw, ro or none")),
    }
}

/// Facts about the host, gathered (impurely) by the caller.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// The launcher's own ids.
    pub caller: Caller,
    /// `--owner`, looked up.
    pub owner: Option<Account>,
    /// The launcher's working directory (canonical).
    pub cwd: PathBuf,
    /// `$HOME` if it is an absolute path to an existing directory (canonical).
    pub home: Option<PathBuf>,
    /// Which of [`SYSTEM`] exist, and how.
    pub system: Vec<(PathBuf, SystemEntry)>,
    /// The `/etc` secrets that exist ([`view::is_etc_secret`]), canonical,
    /// with `true` for directories.
    pub etc_secrets: Vec<(PathBuf, bool)>,
    /// Whether `/tmp` is a directory (the sandbox's root is built there).
    pub has_tmp: bool,
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
    /// Everything the embedded egressd reads or writes ([`super::guard`]).
    pub guarded: Vec<super::guard::Guarded>,
    /// The working directory's `.git` when it is a directory, and the
    /// entries in it git runs code from or reads its configuration from
    /// (`config`, `hooks`, `info`, `commondir`), those that exist.
    pub git: Option<(PathBuf, Vec<PathBuf>)>,
}

/// The interception CA's public files, as the launcher read them, and the
/// host paths that matter (all canonical).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaTrust {
    /// The CA directory: hidden inside, since it holds `ca.key`.
    pub dir: PathBuf,
    /// egressd's CA certificate alone (PEM).
    pub cert: Vec<u8>,
    /// The system roots followed by egressd's CA (PEM).
    pub bundle: Vec<u8>,
    /// The distribution's CA bundle, which the sandbox's copy replaces.
    pub system_bundle: Option<PathBuf>,
    /// The files of an NSS database trusting the CA (`nss::database`;
    /// empty when none could be made), written into HOME's
    /// [`nss::NSSDB_DIR`](super::nss::NSSDB_DIR).
    pub nssdb: Vec<(String, Vec<u8>)>,
}

/// The options of `egressd run` that shape the sandbox (the CLI's view of
/// them, minus what [`HostFacts`] already resolved).
#[derive(Debug, Clone)]
pub struct Options {
    pub command: Vec<OsString>,
    pub env: Vec<EnvSpec>,
    pub limits: Limits,
    pub timeout: Option<Duration>,
    pub connect: Option<SocketAddr>,
    pub connect_dns: Option<SocketAddr>,
    pub client: Option<String>,
    pub transparent: bool,
    pub cwd: CwdMode,
    /// `--uid`, `--gid`: CMD's ids inside.
    pub uid: u32,
    pub gid: u32,
    /// `--git-writable`: `.git/config`, `.git/hooks`… writable inside.
    pub git_writable: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            command: Vec::new(),
            env: Vec::new(),
            limits: Limits::default(),
            timeout: None,
            connect: None,
            connect_dns: None,
            client: None,
            transparent: false,
            cwd: CwdMode::default(),
            uid: identity::DEFAULT_ID,
            gid: identity::DEFAULT_ID,
            git_writable: false,
        }
    }
}

/// Where the sandbox's proxy and resolver sockets lead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Egress {
    /// An egressd started by the launcher serves them.
    Embedded,
    /// Relayed to an egressd that is already serving.
    Connect { proxy: SocketAddr, dns: SocketAddr },
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

/// Everything the sandbox will be; built once, then carried out.
#[derive(Debug, Clone)]
pub struct Plan {
    pub argv: Vec<CString>,
    /// `NAME=VALUE` entries, in order.
    pub env: Vec<CString>,
    pub dropped_credentials: Vec<String>,
    pub dropped_other: usize,
    pub missing_env: Vec<String>,
    pub identity: Identity,
    /// CMD's working directory inside (the host's, or HOME with `--cwd none`).
    pub cwd: PathBuf,
    pub home: PathBuf,
    pub view: View,
    /// tmpfs size cap (`--memory`, so scratch space cannot outgrow it).
    pub tmpfs_size: Option<u64>,
    pub resolv_conf_text: String,
    pub limits: Limits,
    pub timeout: Option<Duration>,
    pub egress: Egress,
    pub proxy_url: String,
    /// `--transparent`.
    pub transparent: Option<Transparent>,
    /// Files written into the fresh HOME before CMD starts, owned by CMD
    /// (paths relative to HOME; directories made as needed, mode 0700).
    pub home_files: Vec<(PathBuf, Vec<u8>)>,
}

impl Plan {
    /// The sandbox's PATH (what it searches for CMD).
    pub fn path_var(&self) -> OsString {
        self.env
            .iter()
            .find_map(|kv| kv.as_bytes().strip_prefix(b"PATH="))
            .map(|v| OsString::from_vec(v.to_vec()))
            .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into())
    }
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
    #[error("--token-file and --connect-dns need --connect")]
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
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("{0}: binding it would cover the sandbox's own {1}")]
    BindCovers(PathBuf, &'static str),
    #[error(
        "--rw {0}: the sandbox could change the host's system files there; \
         pass --ro {0}, or --rw a directory of your own"
    )]
    WritableSystem(PathBuf),
    #[error("{0} is given more than once in --ro/--rw")]
    DuplicateBind(PathBuf),
    #[error("/tmp does not exist on this host (the sandbox's root is built there)")]
    NoTmp,
    #[error(
        "the working directory {0} would show {1} inside the sandbox; run egressd run from a \
         project directory, or pass --cwd none (CMD then starts in HOME)"
    )]
    CwdTooBroad(PathBuf, String),
    #[error(
        "{1} {0} holds {2}, which the sandbox shows; egressd's own files are hidden inside, \
         so keep them apart from what the sandbox works on"
    )]
    GuardedHoldsShown(PathBuf, String, PathBuf),
    #[error(
        "the policy {0} is inside {1}, which the sandbox may write: it could move a directory \
         above the policy and put a policy of its own in its place; keep the policy outside \
         the working directory and --rw paths (or directly in one of them)"
    )]
    PolicyWritable(PathBuf, PathBuf),
}

/// egressd's files against the layers: a mask must not hide what the
/// sandbox is to show, and no policy file may sit where the sandbox could
/// move a directory above it (a mount point itself cannot be moved, so a
/// policy directly in a writable tree stays put).
fn guard_check(guarded: &[super::guard::Guarded], layers: &[Layer]) -> Result<(), PlanError> {
    for g in guarded {
        for l in layers {
            if let Layer::Bind { path, .. } = l {
                if covers(&g.path, path) {
                    return Err(PlanError::GuardedHoldsShown(
                        g.path.clone(),
                        g.what.clone(),
                        path.clone(),
                    ));
                }
            }
        }
        if !g.policy {
            continue;
        }
        for l in layers {
            if let Layer::Bind {
                path,
                writable: true,
                ..
            } = l
            {
                let Ok(below) = g.path.strip_prefix(path) else {
                    continue;
                };
                // The first directory below the layer is a mount point
                // (a mask) when it is guarded itself.
                let first = below.components().next().map(|c| path.join(c));
                let pinned = first
                    .is_none_or(|f| f == g.path || guarded.iter().any(|h| h.path == f && h.dir));
                if !pinned {
                    return Err(PlanError::PolicyWritable(g.path.clone(), path.clone()));
                }
            }
        }
    }
    Ok(())
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
    let (egress, transparent, proxy_url) = egress(opts, host)?;
    let sudo = identity::sudo_ids(
        host.env
            .iter()
            .filter_map(|(k, v)| Some((k.to_str()?, v.to_str()?))),
    );
    let identity = Identity::resolve(host.caller, (opts.uid, opts.gid), host.owner.as_ref(), sudo)?;
    let idmap = identity.bind_idmap().is_some();
    if !host.has_tmp {
        return Err(PlanError::NoTmp);
    }
    let (mut layers, home) = scratch(host);
    let shown_cwd = opts.cwd != CwdMode::None;
    let workdir = if shown_cwd {
        check_cwd(&host.cwd, host, &home)?;
        host.cwd.clone()
    } else {
        home.clone()
    };
    let trust = ca_trust(host);
    let seen = bind_layers(host, &trust.files, idmap, &mut layers)?;
    // A --ro/--rw of the working directory itself replaces --cwd.
    if shown_cwd && !seen.contains(&host.cwd) {
        let writable = opts.cwd == CwdMode::Rw;
        layers.push(Layer::Bind {
            path: host.cwd.clone(),
            writable,
            idmapped: writable && idmap,
            origin: Origin::Cwd,
        });
    }
    if shown_cwd {
        git_layers(opts, host, &seen, idmap, &mut layers);
    }
    guard_check(&host.guarded, &layers)?;
    let mut view = View {
        system: host.system.clone(),
        layers,
        resolv_conf: host.resolv_conf.clone(),
        masks: trust.masks,
        files: trust.files,
    };
    view.order();
    let scrubbed = env::scrub(host.env.iter().cloned(), &opts.env);
    let env = environment(opts, scrubbed.vars, &home, &workdir, &proxy_url, trust.env)?;
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
        identity,
        cwd: workdir,
        home,
        view,
        tmpfs_size: opts.limits.memory,
        resolv_conf_text: resolv_conf_text(),
        limits: opts.limits.clone(),
        timeout: opts.timeout,
        egress,
        proxy_url,
        transparent,
        home_files: trust.home_files,
    })
}

/// The way out: embedded or `--connect`, `--transparent`'s capture, and
/// the proxy URL the sandbox's variables name (with `--client`'s
/// credentials when connecting).
fn egress(
    opts: &Options,
    host: &HostFacts,
) -> Result<(Egress, Option<Transparent>, String), PlanError> {
    if opts.connect.is_none() && opts.connect_dns.is_some() {
        return Err(PlanError::ClientWithoutConnect);
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
    // Embedded, `--client` only names the sandbox's client: no token.
    let credentials = match opts.connect.and(opts.client.as_ref()) {
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
    Ok((egress, transparent, proxy_url(credentials)))
}

/// Scratch space and HOME: the tmpfs layers, and where HOME is.
fn scratch(host: &HostFacts) -> (Vec<Layer>, PathBuf) {
    let mut layers: Vec<Layer> = SCRATCH
        .iter()
        .map(|(p, mode)| Layer::Tmpfs {
            path: PathBuf::from(p),
            mode: *mode,
            cmd_owned: false,
        })
        .collect();
    let home = match &host.home {
        Some(h) if home_is_hideable(h) => h.clone(),
        _ => PathBuf::from(FALLBACK_HOME),
    };
    if !layers.iter().any(|l| l.path() == home) {
        layers.push(Layer::Tmpfs {
            path: home.clone(),
            mode: 0o700,
            cmd_owned: true,
        });
    }
    (layers, home)
}

/// The working directory shown: never one that would show what the
/// sandbox hides.
fn check_cwd(cwd: &Path, host: &HostFacts, home: &Path) -> Result<(), PlanError> {
    let mut forbidden: Vec<(PathBuf, String)> = SYSTEM
        .iter()
        .chain(CWD_FORBIDDEN)
        .map(|p| (PathBuf::from(p), (*p).to_string()))
        .collect();
    forbidden.push((home.to_path_buf(), format!("HOME ({})", home.display())));
    if let Some(h) = &host.home {
        forbidden.push((h.clone(), format!("HOME ({})", h.display())));
    }
    if cwd.parent().is_none() {
        return Err(PlanError::CwdTooBroad(
            cwd.to_path_buf(),
            "the whole host filesystem".into(),
        ));
    }
    // Nor one inside the kernel's own trees (the sandbox has its own).
    let kernel = ["/proc", "/sys", "/dev"].map(Path::new);
    let inside_kernel = kernel.iter().find(|k| cwd.starts_with(k));
    if let Some(k) = inside_kernel {
        return Err(PlanError::CwdTooBroad(
            cwd.to_path_buf(),
            format!("the host's {}", k.display()),
        ));
    }
    if let Some((_, what)) = forbidden.iter().find(|(p, _)| covers(cwd, p)) {
        return Err(PlanError::CwdTooBroad(cwd.to_path_buf(), what.clone()));
    }
    Ok(())
}

/// What the interception CA and egressd's own files put in the view.
struct Trust {
    masks: Vec<Mask>,
    files: Vec<FileBind>,
    env: Vec<(&'static str, PathBuf)>,
    home_files: Vec<(PathBuf, Vec<u8>)>,
}

/// The interception CA: its bundle over the distribution's, both files at
/// a fixed place for the variables, its directory masked; and the masks
/// over `/etc` secrets and egressd's own files (wherever a layer shows
/// them).
fn ca_trust(host: &HostFacts) -> Trust {
    let mut t = Trust {
        masks: Vec::new(),
        files: Vec::new(),
        env: Vec::new(),
        home_files: Vec::new(),
    };
    if let Some(ca) = &host.ca {
        for (name, bytes) in &ca.nssdb {
            t.home_files
                .push((Path::new(super::nss::NSSDB_DIR).join(name), bytes.clone()));
        }
        let inside = PathBuf::from(CA_DIR_INSIDE);
        let (bundle, cert) = (inside.join(CA_BUNDLE_NAME), inside.join(CA_CERT_NAME));
        t.masks.push(Mask {
            path: ca.dir.clone(),
            dir: true,
        });
        if let Some(sys) = &ca.system_bundle {
            t.files.push(FileBind {
                contents: ca.bundle.clone(),
                target: sys.clone(),
            });
        }
        t.files.push(FileBind {
            contents: ca.bundle.clone(),
            target: bundle.clone(),
        });
        t.files.push(FileBind {
            contents: ca.cert.clone(),
            target: cert.clone(),
        });
        for n in crate::tls::roots::BUNDLE_ENV {
            t.env.push((n, bundle.clone()));
        }
        for n in crate::tls::roots::CA_ONLY_ENV {
            t.env.push((n, cert.clone()));
        }
    }
    for (p, dir) in &host.etc_secrets {
        t.masks.push(Mask {
            path: p.clone(),
            dir: *dir,
        });
    }
    for g in &host.guarded {
        if !t.masks.iter().any(|m| m.path == g.path) {
            t.masks.push(Mask {
                path: g.path.clone(),
                dir: g.dir,
            });
        }
    }
    t
}

/// The `--ro`/`--rw` binds as layers: never over what keeps the sandbox
/// closed (nor over `files`), never writable over the system, each once.
/// Returns the paths bound.
fn bind_layers(
    host: &HostFacts,
    files: &[FileBind],
    idmap: bool,
    layers: &mut Vec<Layer>,
) -> Result<Vec<PathBuf>, PlanError> {
    let mut protected: Vec<(PathBuf, &'static str)> = vec![
        (PathBuf::from("/proc"), "/proc"),
        (PathBuf::from("/dev"), "/dev"),
        (PathBuf::from("/run"), "/run (host daemons' sockets)"),
        (PathBuf::from("/etc/resolv.conf"), "resolv.conf"),
    ];
    if let Some(r) = &host.resolv_conf {
        protected.push((r.clone(), "resolv.conf"));
    }
    for f in files {
        protected.push((f.target.clone(), "CA bundle"));
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    for (path, writable) in &host.binds {
        for (p, what) in &protected {
            if covers(path, p) || (*what == "/proc" && path.starts_with(p)) {
                return Err(PlanError::BindCovers(path.clone(), what));
            }
        }
        if *writable && SYSTEM.iter().any(|s| covers(path, Path::new(s))) {
            return Err(PlanError::WritableSystem(path.clone()));
        }
        if seen.contains(path) {
            return Err(PlanError::DuplicateBind(path.clone()));
        }
        seen.push(path.clone());
        layers.push(Layer::Bind {
            path: path.clone(),
            writable: *writable,
            idmapped: *writable && idmap,
            origin: Origin::Flag,
        });
    }
    Ok(seen)
}

/// `.git` pinned in place (a mount cannot be renamed away), and what git
/// runs code from read-only in it: the box plants no hook or
/// `core.fsmonitor` for the host's next git command.
fn git_layers(
    opts: &Options,
    host: &HostFacts,
    seen: &[PathBuf],
    idmap: bool,
    layers: &mut Vec<Layer>,
) {
    let (CwdMode::Rw, false, Some((git, ro))) = (opts.cwd, opts.git_writable, &host.git) else {
        return;
    };
    if seen.contains(git) || git.parent() != Some(host.cwd.as_path()) {
        return;
    }
    layers.push(Layer::Bind {
        path: git.clone(),
        writable: true,
        idmapped: idmap,
        origin: Origin::Cwd,
    });
    for p in ro {
        layers.push(Layer::Bind {
            path: p.clone(),
            writable: false,
            idmapped: false,
            origin: Origin::Cwd,
        });
    }
}

/// The sandbox's environment: the scrubbed host variables, then HOME,
/// PWD, the proxy and CA variables (unless `--env` names them).
fn environment(
    opts: &Options,
    mut vars: Vec<(OsString, OsString)>,
    home: &Path,
    workdir: &Path,
    proxy_url: &str,
    ca_env: Vec<(&str, PathBuf)>,
) -> Result<Vec<CString>, PlanError> {
    let named = |n: &str| opts.env.iter().any(|e| e.name() == n);
    let mut fixed: Vec<(&str, OsString)> = vec![
        ("HOME", home.as_os_str().to_os_string()),
        ("PWD", workdir.as_os_str().to_os_string()),
    ];
    for n in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ] {
        fixed.push((n, proxy_url.into()));
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
    vars.into_iter()
        .map(|(k, v)| {
            let mut kv = k.into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).map_err(|_| PlanError::Nul)
        })
        .collect()
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
    use crate::launcher::view;

    fn host() -> HostFacts {
        HostFacts {
            caller: Caller {
                uid: 1000,
                gid: 1000,
                privileged: false,
            },
            cwd: "/srv/project".into(),
            home: Some("/home/me".into()),
            system: vec![
                ("/usr".into(), SystemEntry::Dir),
                ("/bin".into(), SystemEntry::Symlink("usr/bin".into())),
                ("/etc".into(), SystemEntry::Dir),
            ],
            has_tmp: true,
            resolv_conf: Some("/etc/resolv.conf".into()),
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("HOME".into(), "/home/me".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "x".into()),
                ("HTTP_PROXY".into(), "http://corp:8080".into()),
            ],
            ..HostFacts::default()
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

    fn layers(p: &Plan) -> Vec<String> {
        p.view
            .layers
            .iter()
            .map(|l| match l {
                Layer::Tmpfs { path, .. } => format!("tmpfs {}", path.display()),
                Layer::Bind {
                    path,
                    writable,
                    idmapped,
                    ..
                } => format!(
                    "{} {}{}",
                    if *writable { "rw" } else { "ro" },
                    path.display(),
                    if *idmapped { " idmapped" } else { "" }
                ),
            })
            .collect()
    }

    #[test]
    fn default_sandbox() {
        let p = build(&opts(), &host()).unwrap();
        assert_eq!(p.egress, Egress::Embedded);
        assert_eq!(p.home, Path::new("/home/me"));
        assert_eq!(p.cwd, Path::new("/srv/project"));
        assert_eq!(
            layers(&p),
            [
                "tmpfs /tmp",
                "tmpfs /run",
                "tmpfs /var/tmp",
                "tmpfs /home/me",
                "rw /srv/project"
            ]
        );
        assert_eq!(p.view.system, host().system);
        assert_eq!(
            p.view.shows(Path::new("/srv/other")),
            Err(view::Hidden::NotShown)
        );
        assert_eq!((p.identity.uid, p.identity.gid), (1000, 1000));
        assert_eq!(env_of(&p, "HOME"), Some("/home/me"));
        assert_eq!(env_of(&p, "PATH"), Some("/usr/bin:/bin"));
        assert_eq!(p.path_var(), "/usr/bin:/bin");
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
            assert!(p
                .view
                .layers
                .iter()
                .any(|l| l.path() == Path::new(FALLBACK_HOME)));
        }
        for h in ["/root", "/var/lib/jenkins", "/opt/agent/home"] {
            let mut hf = host();
            hf.home = Some(h.into());
            assert_eq!(build(&opts(), &hf).unwrap().home, Path::new(h));
        }
    }

    #[test]
    fn the_working_directory_is_shown_unless_it_would_show_what_is_hidden() {
        let mut hf = host();
        hf.cwd = "/home/me/proj".into();
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(
            layers(&p).last().unwrap(),
            "rw /home/me/proj",
            "over the fresh HOME"
        );
        hf.cwd = "/tmp/build".into();
        assert!(layers(&build(&opts(), &hf).unwrap()).contains(&"rw /tmp/build".to_string()));

        for (cwd, what) in [
            ("/", "the whole host filesystem"),
            ("/home", "HOME (/home/me)"),
            ("/home/me", "HOME (/home/me)"),
            ("/tmp", "/tmp"),
            ("/var", "/var/tmp"),
            ("/usr", "/usr"),
            ("/etc", "/etc"),
            ("/dev/shm", "the host's /dev"),
            ("/proc/self/cwd", "the host's /proc"),
        ] {
            hf.cwd = cwd.into();
            assert_eq!(
                build(&opts(), &hf).unwrap_err(),
                PlanError::CwdTooBroad(cwd.into(), what.into()),
                "{cwd}"
            );
        }

        let mut o = opts();
        o.cwd = CwdMode::None;
        let p = build(&o, &hf).unwrap();
        assert_eq!(p.cwd, Path::new("/home/me"), "CMD starts in HOME");
        assert_eq!(env_of(&p, "PWD"), Some("/home/me"));
        assert!(!layers(&p).iter().any(|l| l.contains("/etc")));

        hf.cwd = "/srv/project".into();
        o.cwd = CwdMode::Ro;
        assert_eq!(
            layers(&build(&o, &hf).unwrap()).last().unwrap(),
            "ro /srv/project"
        );
        // An explicit --rw of the working directory replaces --cwd.
        hf.binds = vec![("/srv/project".into(), true)];
        let p = build(&o, &hf).unwrap();
        assert_eq!(
            layers(&p)
                .iter()
                .filter(|l| l.contains("/srv/project"))
                .count(),
            1
        );
        assert_eq!(layers(&p).last().unwrap(), "rw /srv/project");
    }

    #[test]
    fn binds_are_ordered_and_never_cover_the_closed_parts() {
        let mut hf = host();
        hf.binds = vec![("/srv/project/out".into(), true), ("/srv".into(), false)];
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(
            layers(&p)[2..],
            [
                "ro /srv",
                "tmpfs /var/tmp",
                "tmpfs /home/me",
                "rw /srv/project",
                "rw /srv/project/out"
            ]
        );
        for bad in [
            "/",
            "/etc",
            "/etc/resolv.conf",
            "/run",
            "/proc",
            "/proc/1",
            "/dev",
        ] {
            hf.binds = vec![(bad.into(), false)];
            assert!(
                matches!(build(&opts(), &hf), Err(PlanError::BindCovers(..))),
                "{bad}"
            );
        }
        for bad in ["/usr", "/opt", "/lib64"] {
            hf.binds = vec![(bad.into(), true)];
            assert_eq!(
                build(&opts(), &hf).unwrap_err(),
                PlanError::WritableSystem(bad.into())
            );
            hf.binds = vec![(bad.into(), false)];
            assert!(build(&opts(), &hf).is_ok(), "--ro {bad}");
        }
        hf.binds = vec![
            ("/usr/local/share/data".into(), true),
            ("/dev/kvm".into(), true),
        ];
        assert!(build(&opts(), &hf).is_ok(), "a directory below the system");
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
        hf.has_tmp = false;
        hf.binds.clear();
        assert_eq!(build(&opts(), &hf).unwrap_err(), PlanError::NoTmp);
    }

    #[test]
    fn started_as_root_cmd_is_nobody_and_writable_binds_are_idmapped() {
        let mut hf = host();
        hf.caller = Caller {
            uid: 0,
            gid: 0,
            privileged: true,
        };
        hf.binds = vec![("/srv/in".into(), false), ("/srv/out".into(), true)];
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(p.identity.host_uid, identity::NOBODY);
        assert_eq!(p.identity.owner_uid, 0);
        let l = layers(&p);
        assert!(l.contains(&"ro /srv/in".to_string()), "{l:?}");
        assert!(l.contains(&"rw /srv/out idmapped".to_string()), "{l:?}");
        assert!(l.contains(&"rw /srv/project idmapped".to_string()), "{l:?}");

        // Through sudo: CMD is the invoking user, nothing needs an idmap.
        hf.env.push(("SUDO_UID".into(), "1000".into()));
        hf.env.push(("SUDO_GID".into(), "1000".into()));
        let p = build(&opts(), &hf).unwrap();
        assert_eq!((p.identity.host_uid, p.identity.owner_uid), (1000, 1000));
        assert!(!layers(&p).iter().any(|l| l.ends_with("idmapped")));

        let mut o = opts();
        o.uid = 0;
        assert!(matches!(
            build(&o, &hf),
            Err(PlanError::Identity(IdentityError::Root("uid")))
        ));
    }

    #[test]
    fn etc_secrets_and_the_ca_directory_are_masked_last() {
        let mut hf = host();
        hf.etc_secrets = vec![
            ("/etc/shadow".into(), false),
            ("/etc/ssl/private".into(), true),
        ];
        hf.binds = vec![("/etc/ssl".into(), false)];
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(
            p.view.masks,
            [
                Mask {
                    path: "/etc/shadow".into(),
                    dir: false
                },
                Mask {
                    path: "/etc/ssl/private".into(),
                    dir: true
                }
            ]
        );
        assert_eq!(
            p.view.shows(Path::new("/etc/ssl/private/host.key")),
            Err(view::Hidden::Masked("/etc/ssl/private".into())),
            "a --ro of the parent does not unmask it"
        );
        assert_eq!(p.view.shows(Path::new("/etc/ssl/certs/x.pem")), Ok(()));
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

        // Embedded, --client only names the sandbox's client: no token, no
        // credentials in the proxy URL.
        let mut o = opts();
        o.client = Some("agent-a".into());
        let p = build(&o, &host()).unwrap();
        assert_eq!(p.egress, Egress::Embedded);
        assert!(!p.proxy_url.contains("agent-a"), "{}", p.proxy_url);
        o.connect_dns = Some("10.0.0.5:8053".parse().unwrap());
        assert_eq!(
            build(&o, &host()).unwrap_err(),
            PlanError::ClientWithoutConnect
        );
    }

    #[test]
    fn explicit_env_wins_and_pids_as_root_is_accepted() {
        let mut o = opts();
        o.env = vec![
            EnvSpec::Pass("AWS_SECRET_ACCESS_KEY".into()),
            EnvSpec::Set("NO_PROXY".into(), "internal".into()),
        ];
        let p = build(&o, &host()).unwrap();
        assert_eq!(env_of(&p, "AWS_SECRET_ACCESS_KEY"), Some("x"));
        assert_eq!(env_of(&p, "NO_PROXY"), Some("internal"));
        assert_eq!(env_of(&p, "no_proxy"), Some(NO_PROXY));

        // CMD is never host root, so even RLIMIT_NPROC binds it.
        let mut o = opts();
        o.limits.pids = Some(10);
        let mut hf = host();
        hf.caller = Caller {
            uid: 0,
            gid: 0,
            privileged: true,
        };
        assert_eq!(build(&o, &hf).unwrap().limits.pids, Some(10));
    }

    #[test]
    fn interception_ca_is_trusted_and_its_key_hidden() {
        let mut hf = host();
        hf.ca = Some(CaTrust {
            dir: "/home/me/certs".into(),
            cert: b"ca".to_vec(),
            bundle: b"roots and ca".to_vec(),
            system_bundle: Some("/etc/ssl/certs/ca-certificates.crt".into()),
            nssdb: vec![("cert9.db".into(), b"db".to_vec())],
        });
        let p = build(&opts(), &hf).unwrap();
        assert_eq!(
            p.home_files,
            [(PathBuf::from(".pki/nssdb/cert9.db"), b"db".to_vec())],
            "the NSS database goes into HOME"
        );
        assert_eq!(
            p.view.masks,
            [Mask {
                path: "/home/me/certs".into(),
                dir: true
            }]
        );
        let targets: Vec<_> = p
            .view
            .files
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
