//! The package gate's URL classifier (`packages::classify`) on
//! arbitrary requests. Input: one byte choosing the host, one the method,
//! then the path, a newline, and the Accept header. Invariants: it never
//! panics; only GET/HEAD without a query string reach a package; a package
//! is of the host's ecosystem and its name is already normal (normalising
//! it again changes nothing); an artifact's filename is one path segment;
//! the index location the gate would fetch for that name classifies back
//! to an index of the same name; and the three npm scope encodings of a
//! path classify alike.

use egressd::packages::classify::{classify, index_location, registry_ecosystem, Classified, Kind};
use egressd::packages::name::normalize;

const HOSTS: &[&str] = &[
    "pypi.org",
    "files.pythonhosted.org",
    "registry.npmjs.org",
    "registry.yarnpkg.com",
    "index.crates.io",
    "static.crates.io",
    "crates.io",
    "proxy.golang.org",
    "sum.golang.org",
    "example.com",
];
const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "get", "DELETE"];

pub fn run(data: &[u8]) {
    if data.len() < 2 || data.len() > 8192 {
        return;
    }
    let host = HOSTS[data[0] as usize % HOSTS.len()];
    let method = METHODS[data[1] as usize % METHODS.len()];
    let text = String::from_utf8_lossy(&data[2..]);
    let (path, accept) = match text.split_once('\n') {
        Some((p, a)) => (p, Some(a)),
        None => (text.as_ref(), None),
    };
    let got = classify(None, host, method, path, accept);
    if registry_ecosystem(host).is_none() {
        assert_eq!(got, Classified::NotRegistry, "{host}{path}");
        return;
    }
    let Classified::Package(p) = &got else {
        return;
    };
    assert!(
        method.eq_ignore_ascii_case("GET") || method.eq_ignore_ascii_case("HEAD"),
        "{method} {host}{path} reached a package"
    );
    assert!(!path.contains('?'), "{host}{path}: query reached a package");
    assert_eq!(Some(p.ecosystem), registry_ecosystem(host), "{host}{path}");
    assert_eq!(
        normalize(p.ecosystem, p.name.as_str()).as_ref(),
        Ok(&p.name),
        "{host}{path}: name not normal"
    );
    match &p.kind {
        Kind::Artifact(a) => {
            assert!(
                !a.filename.is_empty() && !a.filename.contains('/'),
                "{host}{path}"
            );
            assert!(
                p.version.is_some(),
                "{host}{path}: artifact without version"
            );
        }
        Kind::Index(_) => assert!(p.version.is_none(), "{host}{path}"),
        Kind::Meta(_) => assert!(p.version.is_some(), "{host}{path}"),
    }
    let loc = index_location(p.ecosystem, &p.name);
    match classify(None, loc.host, "GET", &loc.path, Some(loc.accept)) {
        Classified::Package(q) => {
            assert_eq!(
                (&q.name, q.kind),
                (&p.name, Kind::Index(loc.form)),
                "{host}{path}"
            )
        }
        other => panic!("{host}{path}: index location {loc:?} classifies as {other:?}"),
    }
    // `@s/n`, `@s%2fn` and `@s%2Fn` are one package (DESIGN).
    if p.ecosystem == egressd::packages::Ecosystem::Npm {
        if let Some(rest) = path.strip_prefix("/@") {
            // Only a path that spells the separator as `/`: re-encoding a
            // slash after an already encoded one would name another path.
            let plain = rest.split('/').next().is_some_and(|s| !s.contains('%'));
            if let Some((scope, tail)) = rest.split_once('/').filter(|_| plain) {
                for sep in ["%2f", "%2F"] {
                    let alt = format!("/@{scope}{sep}{tail}");
                    assert_eq!(
                        classify(None, host, method, &alt, accept),
                        got,
                        "{path} vs {alt}"
                    );
                }
            }
        }
    }
}
