//! Downloads are authorised by the whole place the filtered index lists
//! (issue 37, item 6): the approved wheel's file name under another hash
//! path is `403 package_not_listed`, with `curl` through egressd and with
//! `pip download` of that URL, and never reaches the registry.

use super::*;

const OLD: std::time::Duration = DAY.saturating_mul(30);

#[test]
fn an_approved_file_name_under_another_path_is_not_listed() {
    let l = run_lab("packages::listed::pypi");
    l.reg().publish(Eco::Pypi, "ls-pkg", "1.0", OLD, &[]);
    let wheel = wheel_name("ls-pkg", "1.0");
    let listed = l.reg().pypi_url("ls-pkg", &wheel);
    let listed_path = &listed["https://files.pythonhosted.org".len()..];
    // The registry serves the same bytes under another hash path too: only
    // egressd stands between the client and them.
    let other_path = format!("/packages/00/00/{}/{wheel}", "0".repeat(60));
    for suffix in ["", ".metadata"] {
        let b = l
            .reg()
            .doc_body(
                "files.pythonhosted.org",
                &format!("{listed_path}{suffix}"),
                None,
            )
            .unwrap();
        l.reg().put_raw(
            "files.pythonhosted.org",
            &format!("{other_path}{suffix}"),
            "application/octet-stream",
            b,
        );
    }
    let other = format!("https://files.pythonhosted.org{other_path}");
    let policy = gated(&set("py-lab", "pypi", &["ls-pkg"]));
    let script = format!(
        "for u in '{listed}' '{listed}.metadata' '{other}' '{other}.metadata'; do\n  \
         curl -s -o /dev/null -D /tmp/h -w \"%{{http_code}} \" \"$u\"\n  \
         echo \"$(grep -i '^x-egressd-reason' /tmp/h | tr -d '\\r' | tr A-Z a-z)\"\ndone\n\
         if /usr/bin/python3 -m pip download --no-cache-dir --disable-pip-version-check \
         --no-input --no-deps -d /tmp/d '{other}' 2>/tmp/pip.err; then echo pip-ok; \
         else echo pip-failed; cat /tmp/pip.err; fi\n"
    );
    let r = l.run(&policy, &script);
    assert_eq!(r.code, 0, "{}", ctx(&r));
    let got: Vec<&str> = r.stdout.lines().take(4).collect();
    assert_eq!(
        got,
        [
            "200 ",
            "200 ",
            "403 x-egressd-reason: package_not_listed",
            "403 x-egressd-reason: package_not_listed",
        ],
        "{}",
        ctx(&r)
    );
    assert!(r.stdout.contains("pip-failed"), "{}", ctx(&r));
    assert!(
        r.stdout.contains("package_not_listed ls-pkg@1.0"),
        "pip shows the reason\n{}",
        ctx(&r)
    );
    assert_eq!(
        l.reg().hits_for("/packages/00/00/").len(),
        0,
        "an unlisted path reached the registry"
    );
    let denied: Vec<_> = r
        .log_lines()
        .into_iter()
        .filter(|l| {
            l["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(&other_path))
        })
        .collect();
    // curl's two and pip's.
    assert!(denied.len() >= 3, "{}", ctx(&r));
    for d in &denied {
        assert_eq!(d["reason"], "package_not_listed", "{d}");
        assert_eq!(d["package"]["name"], "ls-pkg", "{d}");
        assert_eq!(d["package"]["version"], "1.0", "{d}");
    }
}
