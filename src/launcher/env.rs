//! The sandbox's environment, built from an allowlist rather than by
//! removing known secrets: a variable reaches CMD only if its name is on
//! [`ALLOWED`], starts with an allowed prefix, or was named with `--env`.
//! Names that look like credentials are reported (names only, never values)
//! so the user sees what was kept out. Pure: no I/O.

use std::ffi::{OsStr, OsString};

/// Passed through from the launcher's environment when set.
pub const ALLOWED: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "COLUMNS",
    "LINES",
    "USER",
    "LOGNAME",
    "TZ",
    "SHELL",
];

/// Passed through by prefix (locale categories).
pub const ALLOWED_PREFIXES: &[&str] = &["LC_"];

/// `--env NAME` (pass the launcher's value) or `--env NAME=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSpec {
    Pass(String),
    Set(String, OsString),
}

impl EnvSpec {
    pub fn name(&self) -> &str {
        match self {
            EnvSpec::Pass(n) | EnvSpec::Set(n, _) => n,
        }
    }
}

/// Parses one `--env` argument.
pub fn parse_env_spec(s: &str) -> Result<EnvSpec, String> {
    let (name, value) = match s.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (s, None),
    };
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "{name:?} is not a variable name (letters, digits, _; not starting with a digit)"
        ));
    }
    Ok(match value {
        Some(v) => EnvSpec::Set(name.to_string(), v.into()),
        None => EnvSpec::Pass(name.to_string()),
    })
}

/// Whether a variable name looks like it holds a credential: cloud and
/// forge tokens, keys, passwords, agent sockets, connection strings. Names
/// of public CA certificate paths are not ([`names_certificates`]).
pub fn looks_like_credential(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    if names_certificates(&n) {
        return false;
    }
    const EXACT: &[&str] = &[
        "SSH_AUTH_SOCK",
        "GPG_AGENT_INFO",
        "KUBECONFIG",
        "NETRC",
        "DATABASE_URL",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "DOCKER_AUTH_CONFIG",
    ];
    const PREFIXES: &[&str] = &["AWS_", "AZURE_", "ARM_", "GOOGLE_", "GCP_", "VAULT_"];
    const SUFFIXES: &[&str] = &[
        "_KEY", "_PASS", "_PWD", "_DSN", "_AUTH", "_COOKIE", "_SESSION",
    ];
    const INFIXES: &[&str] = &[
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "APIKEY",
        "API_KEY",
        "PRIVATE_KEY",
        "AUTH_",
    ];
    EXACT.contains(&n.as_str())
        || PREFIXES.iter().any(|p| n.starts_with(p))
        || SUFFIXES.iter().any(|s| n.ends_with(s))
        || INFIXES.iter().any(|i| n.contains(i))
}

/// `*_CA_BUNDLE`, `*_CERT_FILE`, `*_CA_CERTS*`, `SSL_CERT_DIR` (an
/// uppercase name): paths of public CA certificates, which the prefixes
/// above would take for credentials (`AWS_CA_BUNDLE` starts with `AWS_`).
fn names_certificates(n: &str) -> bool {
    n.ends_with("_CA_BUNDLE")
        || n.ends_with("_CERT_FILE")
        || n.contains("_CA_CERTS")
        || n == "SSL_CERT_DIR"
}

fn allowed(name: &str) -> bool {
    ALLOWED.contains(&name) || ALLOWED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The environment CMD gets, and what the launcher tells the user about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scrubbed {
    /// In a stable order: allowlisted variables as found, then `--env`.
    pub vars: Vec<(OsString, OsString)>,
    /// Credential-looking names that were not passed (sorted).
    pub dropped_credentials: Vec<String>,
    /// How many other variables were left out (not on the allowlist).
    pub dropped_other: usize,
    /// `--env NAME` whose NAME the launcher's environment does not have.
    pub missing: Vec<String>,
}

/// Builds CMD's environment from the launcher's (`outside`) and `--env`.
/// Later `--env` entries win over earlier ones and over the allowlist.
pub fn scrub<I, K, V>(outside: I, requested: &[EnvSpec]) -> Scrubbed
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    let outside: Vec<(OsString, OsString)> = outside
        .into_iter()
        .map(|(k, v)| (k.as_ref().to_owned(), v.as_ref().to_owned()))
        .collect();
    let named = |n: &str| requested.iter().any(|r| r.name() == n);
    let mut out = Scrubbed::default();
    for (k, v) in &outside {
        let Some(name) = k.to_str() else {
            // A name that is not UTF-8 cannot be on the allowlist.
            out.dropped_other += 1;
            continue;
        };
        if named(name) {
            continue; // placed below, in --env order
        }
        if allowed(name) {
            out.vars.push((k.clone(), v.clone()));
        } else if looks_like_credential(name) {
            out.dropped_credentials.push(name.to_string());
        } else {
            out.dropped_other += 1;
        }
    }
    for r in requested {
        let value = match r {
            EnvSpec::Set(_, v) => Some(v.clone()),
            EnvSpec::Pass(n) => {
                let found = outside
                    .iter()
                    .find(|(k, _)| k.to_str() == Some(n.as_str()))
                    .map(|(_, v)| v.clone());
                if found.is_none() && !out.missing.contains(n) {
                    out.missing.push(n.clone());
                }
                found
            }
        };
        if let Some(v) = value {
            set(&mut out.vars, r.name(), v);
        }
    }
    out.dropped_credentials.sort();
    out.dropped_credentials.dedup();
    out
}

/// Sets `name` in `vars`, replacing an earlier value in place.
pub fn set(vars: &mut Vec<(OsString, OsString)>, name: &str, value: impl Into<OsString>) {
    let value = value.into();
    match vars.iter_mut().find(|(k, _)| k == name) {
        Some(slot) => slot.1 = value,
        None => vars.push((name.into(), value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(s: &'a Scrubbed, k: &str) -> Option<&'a OsStr> {
        s.vars
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_os_str())
    }

    #[test]
    fn allowlist_and_credentials() {
        let outside = [
            ("PATH", "/usr/bin"),
            ("LC_ALL", "C.UTF-8"),
            ("AWS_SECRET_ACCESS_KEY", "s3cr3t"),
            ("GH_TOKEN", "ghp_x"),
            ("SSH_AUTH_SOCK", "/run/user/1/ssh"),
            ("EDITOR", "vi"),
            ("GIT_AUTHOR_NAME", "me"),
        ];
        let s = scrub(outside, &[]);
        assert_eq!(get(&s, "PATH"), Some(OsStr::new("/usr/bin")));
        assert_eq!(get(&s, "LC_ALL"), Some(OsStr::new("C.UTF-8")));
        for gone in [
            "AWS_SECRET_ACCESS_KEY",
            "GH_TOKEN",
            "SSH_AUTH_SOCK",
            "EDITOR",
        ] {
            assert_eq!(get(&s, gone), None, "{gone} passed");
        }
        assert_eq!(
            s.dropped_credentials,
            ["AWS_SECRET_ACCESS_KEY", "GH_TOKEN", "SSH_AUTH_SOCK"]
        );
        assert_eq!(s.dropped_other, 2, "EDITOR and GIT_AUTHOR_NAME");
    }

    #[test]
    fn named_explicitly_passes_even_a_credential() {
        let outside = [("GH_TOKEN", "ghp_x"), ("PATH", "/bin")];
        let req = [
            parse_env_spec("GH_TOKEN").unwrap(),
            parse_env_spec("PATH=/opt/bin").unwrap(),
            parse_env_spec("FOO=a=b").unwrap(),
            parse_env_spec("NOT_SET_OUTSIDE").unwrap(),
        ];
        let s = scrub(outside, &req);
        assert_eq!(get(&s, "GH_TOKEN"), Some(OsStr::new("ghp_x")));
        assert_eq!(get(&s, "PATH"), Some(OsStr::new("/opt/bin")));
        assert_eq!(get(&s, "FOO"), Some(OsStr::new("a=b")));
        assert!(s.dropped_credentials.is_empty());
        assert_eq!(s.missing, ["NOT_SET_OUTSIDE"]);
    }

    #[test]
    fn credential_names() {
        for yes in [
            "AWS_ACCESS_KEY_ID",
            "GITHUB_TOKEN",
            "npm_token",
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "DB_PASSWORD",
            "MYSQL_PWD",
            "CLIENT_SECRET",
            "SENTRY_DSN",
            "NPM_CONFIG__AUTH",
            "KUBECONFIG",
            "GOOGLE_APPLICATION_CREDENTIALS",
        ] {
            assert!(looks_like_credential(yes), "{yes}");
        }
        for no in [
            "PATH",
            "HOME",
            "GIT_AUTHOR_NAME",
            "OLDPWD",
            "KEYBOARD",
            "EDITOR",
            "AWS_CA_BUNDLE",
            "REQUESTS_CA_BUNDLE",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "NODE_EXTRA_CA_CERTS",
            "GOOGLE_CA_CERTS_PATH",
        ] {
            assert!(!looks_like_credential(no), "{no}");
        }
    }

    #[test]
    fn env_specs() {
        assert_eq!(parse_env_spec("A"), Ok(EnvSpec::Pass("A".into())));
        assert_eq!(
            parse_env_spec("A="),
            Ok(EnvSpec::Set("A".into(), "".into()))
        );
        for bad in ["", "=x", "1A", "A-B", "A B=c"] {
            assert!(parse_env_spec(bad).is_err(), "{bad:?}");
        }
    }
}
