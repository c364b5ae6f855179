//! curl through a [`Lab`]'s intercepting egressd, as the package gate's
//! tests drive it: the whole answer (status line, headers, body) and the
//! decision lines and metrics it left.

use std::process::Command;

use super::Lab;
use crate::support::eventually;

/// What curl got back.
#[derive(Debug)]
pub struct Curl {
    /// curl's exit code (18/56: the transfer was cut).
    pub code: i32,
    pub status: u16,
    /// The status line as received (`HTTP/1.1 403 Forbidden (egressd: …)`).
    pub status_line: String,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Curl {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

/// curl through a lab's intercepting egressd (a lab with a registry).
impl Lab {
    /// curl through egressd, HTTP/1.1 (so the reason phrase is on the wire).
    pub fn curl(&self, args: &[&str], url: &str) -> Curl {
        let dir = self.scratch_dir();
        let (h, b) = (dir.join("h"), dir.join("b"));
        let _ = std::fs::remove_file(&h);
        let _ = std::fs::remove_file(&b);
        let out = Command::new(crate::support::tool("curl"))
            .args(["-sS", "--http1.1", "--max-time", "30", "--noproxy", ""])
            .arg("--proxy")
            .arg(format!("http://{}", self.e.proxy))
            .arg("--cacert")
            .arg(self.ca_pem())
            .arg("-D")
            .arg(&h)
            .arg("-o")
            .arg(&b)
            .args(["-w", "%{http_code}"])
            .args(args)
            .arg(url)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .output()
            .expect("run curl");
        let headers = std::fs::read_to_string(&h).unwrap_or_default();
        // The last response's head (after a 100 Continue or the CONNECT's).
        let status_line = headers
            .lines()
            .rfind(|l| l.starts_with("HTTP/"))
            .unwrap_or("")
            .to_string();
        Curl {
            code: out.status.code().unwrap_or(-1),
            status: String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0),
            status_line,
            headers,
            body: std::fs::read(&b).unwrap_or_default(),
        }
    }

    pub fn get(&self, url: &str) -> Curl {
        self.curl(&[], url)
    }

    /// The `tls` lines whose path is `path`, once there are `n` of them.
    pub fn lines_for(&self, path: &str, n: usize) -> Vec<serde_json::Value> {
        eventually(&format!("{n} line(s) for {path}"), || {
            let l: Vec<_> = self
                .e
                .log_lines()
                .into_iter()
                .filter(|l| l["proto"] == "tls" && l["path"] == path)
                .collect();
            (l.len() >= n).then_some(l)
        })
    }

    /// The one line for `path` (and proof there is only one).
    pub fn line_for(&self, path: &str) -> serde_json::Value {
        let l = self.lines_for(path, 1);
        assert_eq!(l.len(), 1, "one request, one line: {l:?}");
        l.into_iter().next().unwrap()
    }

    /// A sample of `name` whose labels include all of `labels`.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self.e.metrics_text();
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
            .find(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .and_then(|l| l.rsplit_once(' '))
            .map_or(0.0, |(_, v)| v.parse().unwrap())
    }
}
