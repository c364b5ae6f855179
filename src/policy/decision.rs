//! What a decision is: the value [`Policy::decide`](super::Policy::decide)
//! returns ([`Decision`]: a [`Verdict`], the [`Reason`] and the exception
//! that matched) and the protocol a request came by ([`Proto`]).
//!
//! Owns the vocabulary (the `as_str` names the log, the `X-Egressd-Reason`
//! header and the metrics' labels use). Does not own what happens with a
//! decision: writing it down and counting it is `record`, answering it the
//! front-ends.

use super::raw::Mode;
use super::Exception;
use crate::packages::decide::PackageReason;

/// The one rule for `mode: report`, asked by every place that refuses:
/// whether a denial for `reason` is enforced under `mode`.
///
/// Report mode relaxes the allowlist, nothing else: a request that only
/// the exceptions would refuse (no exception, expired, another client,
/// port, method, path, type, inspection) is logged as that denial and let
/// through. The guards that protect the network egressd runs in stay
/// enforced in both modes, in the resolver and the proxy alike: an answer
/// or connection to a non-public address (`private_address`; rebinding,
/// cloud metadata), a name spending more than its tunnel budget
/// (`dns_tunnel`), egressd itself (`loop_detected`). Each has its own
/// switch (`private_destinations: allow`, `dns.tunnel.action: log`), so a
/// trial of a new allowlist never opens them silently. Edge refusals
/// (malformed input, mismatched host or SNI, overload, an unwritable log)
/// are not policy decisions and are always enforced.
pub fn enforced(mode: Mode, reason: Reason) -> bool {
    match mode {
        Mode::Enforce => reason != Reason::Exception,
        Mode::Report => !reason.is_allowlist(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    Http,
    Connect,
    Tls,
    Dns,
}

impl Proto {
    pub const ALL: [Proto; 4] = [Proto::Http, Proto::Connect, Proto::Tls, Proto::Dns];

    /// Position in [`Proto::ALL`] (a match, so a new variant cannot be
    /// forgotten here).
    pub fn index(self) -> usize {
        match self {
            Proto::Http => 0,
            Proto::Connect => 1,
            Proto::Tls => 2,
            Proto::Dns => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Http => "http",
            Proto::Connect => "connect",
            Proto::Tls => "tls",
            Proto::Dns => "dns",
        }
    }
}

/// What the log line and the metrics say of a request. A report-mode pass
/// is logged as the denial it would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logged {
    Allow,
    Deny,
}

impl Logged {
    pub fn as_str(self) -> &'static str {
        match self {
            Logged::Allow => "allow",
            Logged::Deny => "deny",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Allowed, but only through TLS interception, where each request inside
    /// is decided again with its method and path.
    Intercept,
    Deny,
}

/// Why a decision went the way it did. The `as_str` names are the log's and
/// the `X-Egressd-Reason` header's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    Exception,
    NoException,
    Expired,
    /// A grant allowed it until its uses ran out.
    GrantUsedUp,
    PrivateAddress,
    ClientNotAllowed,
    PortNotAllowed,
    MethodNotAllowed,
    PathNotAllowed,
    InspectionRequired,
    HostMismatch,
    SniMismatch,
    QtypeNotAllowed,
    DnsTunnel,
    Malformed,
    LogUnavailable,
    LoopDetected,
    Overloaded,
    UpstreamError,
    PackageNotApproved,
    PackageVersionNotApproved,
    PackageTooNew,
    PackageTimeUnknown,
    PackageDenied,
    PackageSetExpired,
    PackageNotListed,
    PackageIntegrityMismatch,
    PackageIndexUnfilterable,
    PackageUnparseable,
    GitRepoNotAllowed,
    GitPushNotAllowed,
    GitRefNotAllowed,
    GitNotFastForward,
    GitDeleteNotAllowed,
    GitPathDenied,
    GitTooLarge,
    UploadBudget,
    PackagePublish,
    BodyNotAllowed,
    BodyTooLarge,
}

impl Reason {
    /// Every reason, for pre-creating metric series, in declaration order
    /// (so that `ALL[r.index()] == r`).
    pub const ALL: [Reason; 40] = [
        Reason::Exception,
        Reason::NoException,
        Reason::Expired,
        Reason::GrantUsedUp,
        Reason::PrivateAddress,
        Reason::ClientNotAllowed,
        Reason::PortNotAllowed,
        Reason::MethodNotAllowed,
        Reason::PathNotAllowed,
        Reason::InspectionRequired,
        Reason::HostMismatch,
        Reason::SniMismatch,
        Reason::QtypeNotAllowed,
        Reason::DnsTunnel,
        Reason::Malformed,
        Reason::LogUnavailable,
        Reason::LoopDetected,
        Reason::Overloaded,
        Reason::UpstreamError,
        Reason::PackageNotApproved,
        Reason::PackageVersionNotApproved,
        Reason::PackageTooNew,
        Reason::PackageTimeUnknown,
        Reason::PackageDenied,
        Reason::PackageSetExpired,
        Reason::PackageNotListed,
        Reason::PackageIntegrityMismatch,
        Reason::PackageIndexUnfilterable,
        Reason::PackageUnparseable,
        Reason::GitRepoNotAllowed,
        Reason::GitPushNotAllowed,
        Reason::GitRefNotAllowed,
        Reason::GitNotFastForward,
        Reason::GitDeleteNotAllowed,
        Reason::GitPathDenied,
        Reason::GitTooLarge,
        Reason::UploadBudget,
        Reason::PackagePublish,
        Reason::BodyNotAllowed,
        Reason::BodyTooLarge,
    ];

    /// Position in [`Reason::ALL`]: metrics find a reason's series by it.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Exception => "exception",
            Reason::NoException => "no_exception",
            Reason::Expired => "exception_expired",
            Reason::GrantUsedUp => "grant_used_up",
            Reason::PrivateAddress => "private_address",
            Reason::ClientNotAllowed => "client_not_allowed",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::MethodNotAllowed => "method_not_allowed",
            Reason::PathNotAllowed => "path_not_allowed",
            Reason::InspectionRequired => "inspection_required",
            Reason::HostMismatch => "host_mismatch",
            Reason::SniMismatch => "sni_mismatch",
            Reason::QtypeNotAllowed => "qtype_not_allowed",
            Reason::DnsTunnel => "dns_tunnel",
            Reason::Malformed => "malformed",
            Reason::LogUnavailable => "log_unavailable",
            Reason::LoopDetected => "loop_detected",
            Reason::Overloaded => "overloaded",
            Reason::UpstreamError => "upstream_error",
            Reason::PackageNotApproved
            | Reason::PackageVersionNotApproved
            | Reason::PackageTooNew
            | Reason::PackageTimeUnknown
            | Reason::PackageDenied
            | Reason::PackageSetExpired
            | Reason::PackageNotListed
            | Reason::PackageIntegrityMismatch
            | Reason::PackageIndexUnfilterable
            | Reason::PackageUnparseable
            | Reason::PackagePublish => self.package().expect("a package reason").as_str(),
            Reason::GitRepoNotAllowed => "git_repo_not_allowed",
            Reason::GitPushNotAllowed => "git_push_not_allowed",
            Reason::GitRefNotAllowed => "git_ref_not_allowed",
            Reason::GitNotFastForward => "git_not_fast_forward",
            Reason::GitDeleteNotAllowed => "git_delete_not_allowed",
            Reason::GitPathDenied => "git_path_denied",
            Reason::GitTooLarge => "git_too_large",
            Reason::UploadBudget => "upload_budget",
            Reason::BodyNotAllowed => "body_not_allowed",
            Reason::BodyTooLarge => "body_too_large",
        }
    }

    /// The package gate's reason this is, if it is one.
    pub fn package(self) -> Option<PackageReason> {
        Some(match self {
            Reason::PackageNotApproved => PackageReason::NotApproved,
            Reason::PackageVersionNotApproved => PackageReason::VersionNotApproved,
            Reason::PackageTooNew => PackageReason::TooNew,
            Reason::PackageTimeUnknown => PackageReason::TimeUnknown,
            Reason::PackageDenied => PackageReason::Denied,
            Reason::PackageSetExpired => PackageReason::SetExpired,
            Reason::PackageNotListed => PackageReason::NotListed,
            Reason::PackageIntegrityMismatch => PackageReason::IntegrityMismatch,
            Reason::PackageIndexUnfilterable => PackageReason::IndexUnfilterable,
            Reason::PackageUnparseable => PackageReason::Unparseable,
            Reason::PackagePublish => PackageReason::Publish,
            _ => return None,
        })
    }

    /// The HTTP status of a denial for this reason: a package index egressd
    /// could not filter is the registry's fault (502); a request egressd
    /// refused for overload or an unwritable log is 503; a destination it
    /// could not reach 502; every policy denial 403.
    pub fn status(self) -> u16 {
        if let Some(p) = self.package() {
            return p.status();
        }
        match self {
            Reason::UpstreamError => 502,
            Reason::Overloaded | Reason::LogUnavailable => 503,
            Reason::Malformed => 400,
            Reason::UploadBudget => 429,
            Reason::BodyTooLarge => 413,
            _ => 403,
        }
    }

    /// Whether the reason is the allowlist's (what the exceptions and the
    /// package sets approve), the only denials [`enforced`] relaxes in
    /// report mode. Of the package reasons, those a new set would change
    /// are the allowlist's; an explicit `deny:` (a known-bad release), a
    /// file whose bytes do not match its pin, and registry answers the gate
    /// cannot read are guards and edge refusals, enforced in both modes.
    pub fn is_allowlist(self) -> bool {
        match self {
            Reason::PackageNotApproved
            | Reason::PackageVersionNotApproved
            | Reason::PackageTooNew
            | Reason::PackageTimeUnknown
            | Reason::PackageSetExpired
            | Reason::PackageNotListed
            | Reason::PackagePublish => true,
            Reason::PackageDenied
            | Reason::PackageIntegrityMismatch
            | Reason::PackageIndexUnfilterable
            | Reason::PackageUnparseable => false,
            Reason::NoException
            | Reason::Expired
            | Reason::GrantUsedUp
            | Reason::ClientNotAllowed
            | Reason::PortNotAllowed
            | Reason::MethodNotAllowed
            | Reason::PathNotAllowed
            | Reason::InspectionRequired
            | Reason::QtypeNotAllowed => true,
            Reason::GitRepoNotAllowed => true,
            Reason::GitPushNotAllowed => true,
            Reason::GitRefNotAllowed => true,
            Reason::GitNotFastForward => true,
            Reason::GitDeleteNotAllowed => true,
            Reason::GitPathDenied => true,
            Reason::GitTooLarge => true,
            Reason::UploadBudget => true,
            Reason::BodyNotAllowed => true,
            Reason::BodyTooLarge => true,

            Reason::Exception
            | Reason::PrivateAddress
            | Reason::HostMismatch
            | Reason::SniMismatch
            | Reason::DnsTunnel
            | Reason::Malformed
            | Reason::LogUnavailable
            | Reason::LoopDetected
            | Reason::Overloaded
            | Reason::UpstreamError => false,
        }
    }

    /// One sentence for deny bodies and `explain`.
    pub fn describe(self) -> &'static str {
        match self {
            Reason::Exception => "an exception allows it",
            Reason::NoException => "no exception allows this destination",
            Reason::Expired => "the exception that allowed this destination has expired",
            Reason::GrantUsedUp => "the grant that allowed this destination has used all its uses",
            Reason::PrivateAddress => "the destination is a private, loopback, link-local or otherwise non-public address that no exception lists in cidrs",
            Reason::ClientNotAllowed => "an exception names this destination, but not for this client",
            Reason::PortNotAllowed => "an exception names this destination, but not on this port",
            Reason::MethodNotAllowed => "an exception names this destination, but not for this method",
            Reason::PathNotAllowed => "an exception names this destination, but not for this path",
            Reason::InspectionRequired => "the exceptions for this destination restrict methods or paths or inject credentials, or its registry is behind the package gate, which an opaque tunnel cannot enforce, and TLS interception is not enabled",
            Reason::HostMismatch => "the Host header does not match the request target",
            Reason::SniMismatch => "the TLS server name does not match the CONNECT host",
            Reason::QtypeNotAllowed => "this DNS record type is not allowed for this name",
            Reason::DnsTunnel => "the name looks like data carried over DNS (tunnelling)",
            Reason::Malformed => "the request is malformed",
            Reason::LogUnavailable => "the decision log cannot be written, so egressd refuses new requests until it can",
            Reason::LoopDetected => "the destination is egressd itself",
            Reason::Overloaded => "this client has more connections or queries open than its share",
            Reason::UpstreamError => "the destination could not be reached",
            Reason::PackageNotApproved => "no package set approves this package",
            Reason::PackageVersionNotApproved => "the package is approved, but not this version",
            Reason::PackageTooNew => "this version was published more recently than the policy's min_age",
            Reason::PackageTimeUnknown => "the registry does not say when this version was published, and time_unknown is deny",
            Reason::PackageDenied => "a package set denies this package or version",
            Reason::PackageSetExpired => "the package set that approved this package has expired",
            Reason::PackageNotListed => "the registry's index does not list this version or file",
            Reason::PackageIntegrityMismatch => "the file's sha256 is not one the package set pins",
            Reason::PackageIndexUnfilterable => "the registry's index could not be read to filter it, so it is not passed on",
            Reason::PackageUnparseable => "the package gate cannot tell which package this registry URL asks for",
            Reason::GitRepoNotAllowed => "this repository is not one the exception's git: repos lists",
            Reason::GitPushNotAllowed => "the exception allows fetching this repository, not pushing to it",
            Reason::GitRefNotAllowed => "the push updates a ref the exception's git: push.refs does not list",
            Reason::GitNotFastForward => "the push rewrites a ref (not a fast-forward egressd could prove from the pushed pack) and force is not allowed",
            Reason::GitDeleteNotAllowed => "the push deletes a ref and delete is not allowed",
            Reason::GitPathDenied => "a pushed commit adds or changes a path the exception's git: push.deny_paths denies",
            Reason::GitTooLarge => "the push is larger than the exception's git: push.max_bytes",
            Reason::UploadBudget => "this client has sent what the exception's upload: budget allows in its window",
            Reason::PackagePublish => "publishing to a package registry is not allowed unless an exception names the method and the registry path",
            Reason::BodyNotAllowed => "the request body is not one the exception's body: rules allow",
            Reason::BodyTooLarge => "the request body is larger than the exception's body: max_bytes",
        }
    }
}

impl From<PackageReason> for Reason {
    fn from(r: PackageReason) -> Reason {
        match r {
            PackageReason::NotApproved => Reason::PackageNotApproved,
            PackageReason::VersionNotApproved => Reason::PackageVersionNotApproved,
            PackageReason::TooNew => Reason::PackageTooNew,
            PackageReason::TimeUnknown => Reason::PackageTimeUnknown,
            PackageReason::Denied => Reason::PackageDenied,
            PackageReason::SetExpired => Reason::PackageSetExpired,
            PackageReason::NotListed => Reason::PackageNotListed,
            PackageReason::IntegrityMismatch => Reason::PackageIntegrityMismatch,
            PackageReason::IndexUnfilterable => Reason::PackageIndexUnfilterable,
            PackageReason::Unparseable => Reason::PackageUnparseable,
            PackageReason::Publish => Reason::PackagePublish,
        }
    }
}

/// The outcome of `Policy::decide`: a pure value that carries its reason
/// and, when one matched, the exception (borrowed from the policy snapshot
/// the request holds).
#[derive(Debug, Clone, Copy)]
pub struct Decision<'p> {
    pub verdict: Verdict,
    pub reason: Reason,
    pub exception: Option<&'p Exception>,
    /// `mode: report` turned a denial into an allow; the log says deny.
    pub report_only: bool,
}

impl<'p> Decision<'p> {
    pub fn allow(e: &'p Exception) -> Self {
        Decision {
            verdict: Verdict::Allow,
            reason: Reason::Exception,
            exception: Some(e),
            report_only: false,
        }
    }
    pub fn deny(reason: Reason, e: Option<&'p Exception>) -> Self {
        Decision {
            verdict: Verdict::Deny,
            reason,
            exception: e,
            report_only: false,
        }
    }
    /// This decision under `mode` ([`enforced`]): a denial report mode
    /// relaxes becomes an allow that the log still calls a denial.
    pub fn under(mut self, mode: Mode) -> Self {
        if self.verdict == Verdict::Deny && !enforced(mode, self.reason) {
            self.verdict = Verdict::Allow;
            self.report_only = true;
        }
        self
    }
    pub fn is_allowed(&self) -> bool {
        self.verdict != Verdict::Deny
    }
    /// What the log says: a report-mode pass is logged as the denial it would be.
    pub fn logged(&self) -> Logged {
        if self.verdict == Verdict::Deny || self.report_only {
            Logged::Deny
        } else {
            Logged::Allow
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_mode_relaxes_the_allowlist_only() {
        for r in Reason::ALL {
            assert_eq!(enforced(Mode::Enforce, r), r != Reason::Exception, "{r:?}");
        }
        for r in [
            Reason::NoException,
            Reason::PathNotAllowed,
            Reason::QtypeNotAllowed,
        ] {
            assert!(!enforced(Mode::Report, r), "{r:?}");
            let d = Decision::deny(r, None).under(Mode::Report);
            assert!(d.is_allowed() && d.report_only && d.logged() == Logged::Deny);
        }
        for r in [
            Reason::PrivateAddress,
            Reason::DnsTunnel,
            Reason::LoopDetected,
            Reason::SniMismatch,
        ] {
            assert!(enforced(Mode::Report, r), "{r:?}");
            assert!(!Decision::deny(r, None).under(Mode::Report).is_allowed());
        }
    }

    #[test]
    fn package_reasons_keep_their_wire_names_and_statuses() {
        for p in PackageReason::ALL {
            let r = Reason::from(p);
            assert_eq!(r.as_str(), p.as_str());
            assert_eq!(r.package(), Some(p));
            // Pinned here, not compared with a copy: the one table says so.
            let want = if p == PackageReason::IndexUnfilterable {
                502
            } else {
                403
            };
            assert_eq!(r.status(), want, "{p:?}");
        }
        assert_eq!(Reason::PackageIndexUnfilterable.status(), 502);
        assert_eq!(Reason::PackageNotApproved.status(), 403);
        assert_eq!(Reason::NoException.package(), None);
        // Report mode relaxes what a new set would approve, not the guards.
        assert!(!enforced(Mode::Report, Reason::PackageNotApproved));
        assert!(!enforced(Mode::Report, Reason::PackageTooNew));
        for r in [
            Reason::PackageDenied,
            Reason::PackageIntegrityMismatch,
            Reason::PackageIndexUnfilterable,
            Reason::PackageUnparseable,
        ] {
            assert!(enforced(Mode::Report, r), "{r:?}");
        }
    }

    #[test]
    fn proto_and_reason_tables_are_complete() {
        for (i, p) in Proto::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
        }
        let names: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len(), "reason names are unique");
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
    }
}
