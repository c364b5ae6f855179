//! The package gate (DESIGN "Packages"): approved package sets, the
//! classification of registry URLs, the one package decision, index
//! filtering and lockfile import. PURE: no I/O, no clock, no logging —
//! everything is a function of its arguments, so the proxy can call it per
//! request and tests call it with tables.
//!
//! | module | owns |
//! |---|---|
//! | [`raw`] | serde mirror of `packages:` and `settings.packages` (unknown keys rejected, located errors) |
//! | [`compile`] | raw → validated [`compile::PackagePolicy`]; lints for `egressd check` |
//! | [`name`] | per-ecosystem name normalisation (PEP 503, npm scopes, cargo `-`/`_`, Go `!`) |
//! | [`version`] | versions and constraints in each ecosystem's syntax |
//! | [`classify`] | (ecosystem?, host, method, path, Accept) → what is asked for |
//! | [`decide`] | the one package decision and its reasons; [`decide::NameRules`] |
//! | [`view`] | the registry's facts about a package (times, files, digests) |
//! | [`filter`] | byte-preserving index filters for every index form |
//! | [`import`] | lockfiles → an approved set as YAML |
//! | [`stamp`] | registry timestamps (RFC 3339, HTTP dates) |
//!
//! # Wiring it (what the integration calls, in order)
//!
//! **Load.** `RawFile` gets `#[serde(default)] packages: Vec<raw::RawPackageSet>`
//! and `RawSettings` gets `packages: Option<raw::RawPackageSettings>`. After
//! compiling exceptions and clients, the main compile calls
//! [`compile::compile`] with a [`compile::CompileInput`]: each file's
//! (path, text, sets), the settings' (path, text, raw), the client ids in
//! `Policy::clients` order, a closure giving the file of an exception id
//! (ids are unique across both), its `${env:…}`/`${file:…}` expander
//! (`expand_secret`) for mirror headers, and `settings.contact`. Errors
//! come back as [`compile::PackageDiagnostic`]s (file, line, column,
//! message) to turn into `Diagnostic`s; `Policy` keeps the
//! [`compile::PackagePolicy`]. `egressd check` adds [`compile::lints`].
//!
//! **Connect.** A CONNECT or request to a host of an enforced ecosystem
//! ([`classify::registry_ecosystem`], [`compile::PackageSettings::enforces`])
//! needs interception (`inspection_required` without a CA). A mirror
//! ([`compile::PackageSettings::mirror`]) is where the request is sent
//! instead (its headers injected, never shown to the sandbox).
//!
//! **Each request** inside the interception:
//! 1. [`classify::classify`]`(None, host, method, path, accept)`:
//!    `NotRegistry` → not the gate's; `Registry(..)` → allowed (one line,
//!    no package field); `Unparseable` → deny `package_unparseable`;
//!    `Package(r)` → step 2.
//! 2. `policy.packages.decide(client_idx, &r, now, view)` →
//!    [`decide::PackageDecision`]. `Verdict::Deny(reason)`: answer with
//!    [`decide::PackageReason::status`], `X-Egressd-Reason`, the reason
//!    phrase [`decide::deny_phrase`] (pip shows only that), an npm JSON
//!    `{"error": …}` body or a text body (cargo, go), naming `set` and
//!    `did_you_mean`. `Verdict::NeedIndex` (a download, `.metadata`, or
//!    per-version document, and no view cached): fetch
//!    [`classify::index_location`]`(eco, &name)` as egressd's own logged
//!    request (`"origin": "egressd"`; Go: also each version's `.mod`
//!    [`classify::go_mod_path`] for `Last-Modified` →
//!    [`stamp::parse_http_date`]), filter it (step 3) to get its
//!    [`view::IndexView`], cache the view per (ecosystem, name), and decide
//!    again. `Verdict::Allow` with `filter: Some(form)`: step 3 on the
//!    response. Allow with `verify_sha256` non-empty: hash the body as it
//!    streams and cut the transfer (log `package_integrity_mismatch`) if
//!    its sha256 is not one of them.
//! 3. For an index: decompress (gzip/br) up to [`filter::MAX_INDEX_BYTES`]
//!    (over: `package_index_unfilterable`), take the form from the
//!    response's `Content-Type` ([`classify::IndexForm::from_content_type`]),
//!    and call [`filter::filter`]`(&policy.packages.rules(client, eco,
//!    &name, now), form, body, times)`. `times` is the view of the timed
//!    form for PEP 503 HTML and npm abbreviated (fetch the JSON / full form
//!    when [`decide::NameRules::needs_times`]) and the `.mod` times for Go
//!    `@v/list`/`@latest`. Send `Filtered::body` with `Filtered::etag`
//!    (every gated index, rewritten or not: strip the client's conditional
//!    headers towards the registry and answer `304` yourself when its
//!    `If-None-Match` equals the etag, so a reload never leaves a client on
//!    an old filtering; drop `Last-Modified` and `Content-Length`/encoding
//!    of the upstream). `Filtered::hidden` is the line's `versions_hidden`
//!    ([`filter::Hidden::total`]) and the metric's per-reason counts.
//!    `FilterError::Unfilterable` → 502 `package_index_unfilterable`;
//!    `FilterError::NothingAllowed(reason)` (Go `@latest`) → 403 with it.
//! 4. The log line's `package`: `{ecosystem, name: r.name (normalised),
//!    version: r.version (null for an index), set: decision.set.id,
//!    versions_hidden}`; metrics `egressd_package_decisions_total{ecosystem,
//!    set, decision, reason}` and `egressd_package_versions_hidden_total`.
//!
//! **Mirrors**: URL rewriting of mirror documents back to public names is
//! the integration's (it is I/O-adjacent string work on the filtered body).
//!
//! **Import**: `egressd packages import` reads the files and calls
//! [`import::import`]`(&[(path, text)], &ImportSet { id, owner, reason })`,
//! printing the YAML.

pub mod classify;
pub mod compile;
pub mod decide;
pub mod filter;
pub mod import;
pub mod name;
pub mod raw;
pub mod stamp;
pub mod version;
pub mod view;

#[cfg(test)]
pub(crate) mod testutil;

use schemars::JsonSchema;
use serde::Deserialize;

/// The four registries the gate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    Pypi,
    Npm,
    Cargo,
    Go,
}

impl Ecosystem {
    pub const ALL: [Ecosystem; 4] = [
        Ecosystem::Pypi,
        Ecosystem::Npm,
        Ecosystem::Cargo,
        Ecosystem::Go,
    ];

    /// The policy's and the log's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Ecosystem::Pypi => "pypi",
            Ecosystem::Npm => "npm",
            Ecosystem::Cargo => "cargo",
            Ecosystem::Go => "go",
        }
    }

    /// Position in [`Ecosystem::ALL`].
    pub fn index(self) -> usize {
        match self {
            Ecosystem::Pypi => 0,
            Ecosystem::Npm => 1,
            Ecosystem::Cargo => 2,
            Ecosystem::Go => 3,
        }
    }
}
