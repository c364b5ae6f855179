//! The gate's unit tests.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};

use super::*;
use crate::packages::compile::PackagePolicy;
use crate::packages::decide::PackageReason;
use crate::packages::filter::{FilterError, MAX_INDEX_BYTES};
use crate::packages::Ecosystem;
use crate::policy::host::parse_target;
use crate::proxy::respond::BoxError;

mod unit {
    use super::*;
    use crate::packages::compile::tests::compile_yaml;
    use std::io::Write;

    fn sha(b: &[u8]) -> [u8; 32] {
        ring::digest::digest(&ring::digest::SHA256, b)
            .as_ref()
            .try_into()
            .unwrap()
    }

    /// A body of ready data frames.
    struct Chunks(std::collections::VecDeque<Bytes>);
    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }
    fn chunks(parts: &[&'static [u8]]) -> Chunks {
        Chunks(parts.iter().map(|p| Bytes::from_static(p)).collect())
    }

    /// The data frames a body yields, and how it ended.
    async fn drain(mut b: impl Body<Data = Bytes, Error = BoxError> + Unpin) -> (Vec<u8>, bool) {
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            match f {
                Ok(f) => out.extend_from_slice(f.data_ref().unwrap()),
                Err(_) => return (out, false),
            }
        }
        (out, true)
    }

    #[tokio::test]
    async fn a_pinned_download_ends_only_when_its_hash_matches() {
        let file: &[&[u8]] = &[b"first ", b"second ", b"last"];
        let good = sha(b"first second last");
        let v = Verified::new(chunks(file), vec![[0; 32], good], true);
        let outcome = v.outcome.clone();
        let (got, ok) = drain(v).await;
        assert!(ok);
        assert_eq!(got, b"first second last");
        assert_eq!(outcome.load(Ordering::Relaxed), INTEGRITY_OK);

        // Not the pinned file: everything but the last frame, then an
        // error — never a complete body.
        let v = Verified::new(chunks(file), vec![sha(b"another file")], true);
        let outcome = v.outcome.clone();
        let (got, ok) = drain(v).await;
        assert!(!ok, "the transfer is cut");
        assert_eq!(got, b"first second ");
        assert_eq!(outcome.load(Ordering::Relaxed), INTEGRITY_MISMATCH);

        // Report mode: delivered, and noted.
        let v = Verified::new(chunks(file), vec![sha(b"another file")], false);
        let outcome = v.outcome.clone();
        let (got, ok) = drain(v).await;
        assert!(ok);
        assert_eq!(got, b"first second last");
        assert_eq!(outcome.load(Ordering::Relaxed), INTEGRITY_MISMATCH);
    }

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn index_bodies_decode_within_the_bound() {
        let gz = HeaderValue::from_static("gzip");
        assert_eq!(decode(Some(&gz), gzip(b"{\"a\":1}")).unwrap(), b"{\"a\":1}");
        assert_eq!(decode(None, b"plain".to_vec()).unwrap(), b"plain");
        let br = HeaderValue::from_static("br");
        assert!(matches!(
            decode(Some(&br), b"x".to_vec()),
            Err(FilterError::Unfilterable(w)) if w.contains("\"br\"")
        ));
        assert!(decode(Some(&gz), b"not gzip".to_vec()).is_err());
        // A small body that inflates past the bound is refused.
        let bomb = gzip(&vec![b' '; MAX_INDEX_BYTES + 1]);
        assert!(bomb.len() < 1 << 20);
        assert!(matches!(
            decode(Some(&gz), bomb),
            Err(FilterError::Unfilterable(w)) if w.contains("64 MiB")
        ));
        assert!(decode(Some(&gz), gzip(&vec![b' '; MAX_INDEX_BYTES])).is_ok());
    }

    fn mirror_policy() -> PackagePolicy {
        compile_yaml(
            r#"
packages:
  - id: py
    owner: team
    reason: deps
    ecosystem: pypi
    allow: [requests]
settings:
  packages:
    enforce: [pypi]
    mirrors:
      pypi: { url: "https://mirror.corp:8443/api/pypi/simple/", inject: { headers: { Authorization: "Bearer ${env:TOKEN}" } } }
"#,
            &[],
        )
        .unwrap()
    }

    #[test]
    fn mirror_paths_and_urls_map_to_the_public_names() {
        let p = mirror_policy();
        let m = p.settings.mirror(Ecosystem::Pypi).unwrap();
        assert_eq!(
            mirror_path(m, Ecosystem::Pypi, "pypi.org", "/simple/requests/"),
            "/api/pypi/simple/requests/"
        );
        // File URLs came from the mirror's documents with its own path.
        let f = "/api/pypi/packages/ab/cd/requests-2.32.3-py3-none-any.whl";
        assert_eq!(
            mirror_path(m, Ecosystem::Pypi, "files.pythonhosted.org", f),
            f
        );
        assert_eq!(
            public_path(Some(m), f),
            "/packages/ab/cd/requests-2.32.3-py3-none-any.whl"
        );
        assert_eq!(public_path(None, f), f);
        assert_eq!(public_path(Some(m), "/simple/x/"), "/simple/x/");
        let doc = br#"<a href="https://mirror.corp:8443/api/pypi/packages/x.whl#sha256=00">x</a> https://mirror.corporate/ https://mirror.corp:8443"#;
        assert_eq!(
            String::from_utf8(rewrite_mirror_urls(m, doc)).unwrap(),
            r#"<a href="https://files.pythonhosted.org/api/pypi/packages/x.whl#sha256=00">x</a> https://mirror.corporate/ https://mirror.corp:8443"#
        );
        // Any case, either scheme, JSON's escaped slashes; not another
        // port, host or a look-alike.
        let doc = br#"HTTPS://Mirror.Corp:8443/a http://mirror.corp/b "https:\/\/mirror.corp:8443\/c" https://mirror.corp:8444/d https://mirror.corp.evil/e https://xmirror.corp/f http:/mirror.corp/g"#;
        assert_eq!(
            String::from_utf8(rewrite_mirror_urls(m, doc)).unwrap(),
            r#"https://files.pythonhosted.org/a https://files.pythonhosted.org/b "https:\/\/files.pythonhosted.org\/c" https://mirror.corp:8444/d https://mirror.corp.evil/e https://xmirror.corp/f http:/mirror.corp/g"#
        );
        // Relative references from pypi.org's index pages land under the
        // mirror's path as the index does.
        assert_eq!(
            mirror_path(
                m,
                Ecosystem::Pypi,
                "pypi.org",
                "/packages/packages/ab/x.whl"
            ),
            "/api/pypi/packages/packages/ab/x.whl"
        );
        // A redirect into the mirror is named as the public registry.
        let mut h = http::HeaderMap::new();
        for (from, to) in [
            (
                "https://mirror.corp:8443/api/pypi/simple/requests/",
                "https://pypi.org/simple/requests/",
            ),
            (
                "https://mirror.corp:8443/api/pypi/packages/x.whl",
                "https://files.pythonhosted.org/api/pypi/packages/x.whl",
            ),
            ("https://blobs.example/x.whl", "https://blobs.example/x.whl"),
        ] {
            h.insert(http::header::LOCATION, from.parse().unwrap());
            rewrite_mirror_location(m, &mut h);
            assert_eq!(h[http::header::LOCATION], to);
        }
    }

    #[test]
    fn denials_name_the_package_the_set_and_a_close_name() {
        let d = Denied {
            eco: Ecosystem::Pypi,
            reason: PackageReason::NotApproved,
            name: Some("reqests"),
            version: Some("2.0"),
            did_you_mean: Some("requests"),
            set: None,
            detail: None,
        };
        assert_eq!(
            d.phrase(),
            "Forbidden (egressd: package_not_approved reqests@2.0; did you mean requests?)"
        );
        let t = d.text("GET https://files.pythonhosted.org/x", "#security");
        assert!(t.starts_with("egressd denied GET https://files.pythonhosted.org/x (package_not_approved): no approved package set for this client lists reqests; did you mean requests?\n"), "{t}");
        assert!(t.contains("ask #security"), "{t}");
        let n = Denied {
            eco: Ecosystem::Npm,
            reason: PackageReason::TooNew,
            name: Some("left-pad"),
            version: Some("1.3.0"),
            did_you_mean: None,
            set: Some(("js", "web")),
            detail: None,
        };
        let v: serde_json::Value =
            serde_json::from_str(&n.npm_json("GET https://registry.npmjs.org/left-pad", "#sec"))
                .unwrap();
        let e = v["error"].as_str().unwrap();
        assert!(
            e.contains("package_too_new") && e.contains("left-pad 1.3.0"),
            "{e}"
        );
        assert!(e.contains("package set js") && e.contains("#sec"), "{e}");
        assert_eq!(v["set"], "js");
        // 502 for an index egressd could not filter: no "ask to approve".
        let u = Denied {
            reason: PackageReason::IndexUnfilterable,
            ..n
        };
        assert!(!u.text("x", "#sec").contains("ask"));
        assert_eq!(
            u.phrase(),
            "Bad Gateway (egressd: package_index_unfilterable left-pad@1.3.0)"
        );
    }

    #[test]
    fn index_requests_go_upstream_without_validators_and_only_gzip() {
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"x\""));
        h.insert(header::IF_MODIFIED_SINCE, HeaderValue::from_static("Mon"));
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("br, zstd"),
        );
        h.insert(header::ACCEPT, HeaderValue::from_static("text/html"));
        prepare_index_request(&mut h);
        assert!(h.get(header::IF_NONE_MATCH).is_none());
        assert!(h.get(header::IF_MODIFIED_SINCE).is_none());
        assert_eq!(h[header::ACCEPT_ENCODING], "gzip");
        assert_eq!(h[header::ACCEPT], "text/html");
    }
}

mod path_tests {
    use super::*;

    #[test]
    fn npm_scope_separators_are_slashes_for_path_rules() {
        let npm = parse_target("registry.npmjs.org").unwrap();
        let other = parse_target("api.test").unwrap();
        assert_eq!(policy_path(&npm, "/@lab%2fscoped").unwrap(), "/@lab/scoped");
        assert_eq!(policy_path(&npm, "/@lab%2Fscoped").unwrap(), "/@lab/scoped");
        assert!(policy_path(&other, "/@lab%2fscoped").is_err());
        // Dot segments stay refused however they are spelled.
        assert!(policy_path(&npm, "/a%2f..%2fb").is_err());
    }
}
