//! Policies as tests write them: `policy().exception("origin").host("a.test")
//! .cidr("127.0.0.0/8").port(p)`, rendered as the YAML an operator would
//! write, so what egressd loads goes through the real parser. Package sets
//! too: `.package_set("py", "pypi").allow("requests >=2.31,<3")`. Every
//! entry (an exception, a package set, an entry of any other top-level list
//! through [`PolicyYaml::entry`]) gets an owner and a reason unless the test
//! names them (the parser refuses one without). Anything the builder has no
//! word for is written through [`PolicyYaml::with`] and
//! [`PolicyYaml::setting`] as YAML.
//!
//! Owns the text of a policy; not what it means (that is egressd's).

use std::fmt;

/// The owner an exception gets when the test does not say.
pub const OWNER: &str = "t";
/// The reason an exception gets when the test does not say.
pub const REASON: &str = "a test exception";

/// A policy being built; `Display` renders it.
#[derive(Clone, Debug, Default)]
pub struct PolicyYaml {
    settings: Vec<(String, String)>,
    clients: Vec<String>,
    /// Exceptions, package sets and any other list's entries, in the order
    /// started; rendered grouped by list.
    entries: Vec<Entry>,
}

/// One entry of a top-level list: `exceptions:`, `packages:`, or another.
#[derive(Clone, Debug)]
struct Entry {
    /// The top-level key of its list.
    list: &'static str,
    id: String,
    owner: String,
    reason: String,
    /// Keys in the order first set; a list key gathers every value given.
    fields: Vec<(&'static str, Field)>,
}

#[derive(Clone, Debug)]
enum Field {
    List(Vec<String>),
    Yaml(String),
}

pub fn policy() -> PolicyYaml {
    PolicyYaml::default()
}

/// A YAML double-quoted string (JSON's escapes are YAML's): host patterns
/// such as `*.x.test` would otherwise be read as aliases.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

impl PolicyYaml {
    /// Starts exception `id`; the calls after it describe it.
    pub fn exception(self, id: &str) -> Self {
        self.entry("exceptions", id)
    }

    /// Starts package set `id` for `ecosystem` (`pypi`, `npm`, `cargo`,
    /// `go`); [`allow`](Self::allow), [`deny`](Self::deny),
    /// [`min_age`](Self::min_age) and the common calls describe it.
    pub fn package_set(self, id: &str, ecosystem: &str) -> Self {
        self.entry("packages", id).with("ecosystem", ecosystem)
    }

    /// Starts entry `id` of the top-level list `list` (a list whose entries
    /// carry `id`, `owner` and `reason`, as `exceptions:` and `packages:`
    /// do); the calls after it describe it.
    pub fn entry(mut self, list: &'static str, id: &str) -> Self {
        self.entries.push(Entry {
            list,
            id: id.to_string(),
            owner: OWNER.to_string(),
            reason: REASON.to_string(),
            fields: Vec::new(),
        });
        self
    }

    fn last(&mut self) -> &mut Entry {
        self.entries
            .last_mut()
            .expect("call .exception(id) or .package_set(id, eco) before describing one")
    }

    /// Adds `items` to list `key` of the current exception.
    fn push(mut self, key: &'static str, items: impl IntoIterator<Item = String>) -> Self {
        let e = self.last();
        let list = match e.fields.iter().position(|(k, _)| *k == key) {
            Some(i) => &mut e.fields[i].1,
            None => {
                e.fields.push((key, Field::List(Vec::new())));
                &mut e.fields.last_mut().unwrap().1
            }
        };
        match list {
            Field::List(l) => l.extend(items),
            Field::Yaml(_) => panic!("{key} was given as YAML already"),
        }
        self
    }

    pub fn owner(mut self, owner: &str) -> Self {
        self.last().owner = owner.to_string();
        self
    }
    pub fn reason(mut self, reason: &str) -> Self {
        self.last().reason = reason.to_string();
        self
    }
    pub fn ticket(self, ticket: &str) -> Self {
        self.with("ticket", &quoted(ticket))
    }
    /// An RFC 3339 instant or a date, as the policy file takes it.
    pub fn expires(self, when: &str) -> Self {
        self.with("expires", &quoted(when))
    }
    pub fn host(self, pattern: &str) -> Self {
        self.hosts(&[pattern])
    }
    pub fn hosts(self, patterns: &[&str]) -> Self {
        self.push("hosts", patterns.iter().map(|h| quoted(h)))
    }
    pub fn cidr(self, net: &str) -> Self {
        self.push("cidrs", [quoted(net)])
    }
    pub fn port(self, port: u16) -> Self {
        self.ports(&[port])
    }
    pub fn ports(self, ports: &[u16]) -> Self {
        self.push("ports", ports.iter().map(u16::to_string))
    }
    pub fn method(self, m: &str) -> Self {
        self.methods(&[m])
    }
    pub fn methods(self, ms: &[&str]) -> Self {
        self.push("methods", ms.iter().map(|m| quoted(m)))
    }
    pub fn path(self, glob: &str) -> Self {
        self.push("paths", [quoted(glob)])
    }
    /// A client id (or pattern) the exception is limited to.
    pub fn client(self, id: &str) -> Self {
        self.push("clients", [quoted(id)])
    }
    pub fn dns_type(self, t: &str) -> Self {
        self.push("dns_types", [t.to_string()])
    }

    /// A package set's `allow:` entry, `name [constraint]`
    /// (`"requests >=2.31,<3"`); a mapping entry goes through
    /// [`allow_yaml`](Self::allow_yaml).
    pub fn allow(self, item: &str) -> Self {
        self.push("allow", [quoted(item)])
    }

    /// A package set's `allow:` entry written as YAML
    /// (`"{ name: certifi, versions: \"==2024.8.30\" }"`).
    pub fn allow_yaml(self, yaml: &str) -> Self {
        self.push("allow", [yaml.to_string()])
    }

    /// A package set's `deny:` entry, `name [constraint]`.
    pub fn deny(self, item: &str) -> Self {
        self.push("deny", [quoted(item)])
    }

    /// A package set's (or an entry's) `min_age` (`"3d"`).
    pub fn min_age(self, age: &str) -> Self {
        self.with("min_age", age)
    }
    /// `git:` (DESIGN "Writes on allowed hosts"), as a YAML flow mapping:
    /// `.git(r#"{ repos: ["acme/widgets"], push: { refs: ["refs/heads/agent/**"] } }"#)`.
    pub fn git(self, yaml: &str) -> Self {
        self.with("git", yaml)
    }
    /// `body:`, as a YAML flow mapping:
    /// `.body(r#"{ json: { "/draft": true } }"#)`.
    pub fn body(self, yaml: &str) -> Self {
        self.with("body", yaml)
    }
    /// `upload:`: `.upload("10MiB", "1h")`.
    pub fn upload(self, bytes: &str, per: &str) -> Self {
        self.with("upload", &format!("{{ bytes: {bytes}, per: {per} }}"))
    }
    /// Any other key of the exception, its value written as YAML (a flow
    /// mapping or sequence, or a scalar).
    pub fn with(mut self, key: &'static str, yaml: &str) -> Self {
        self.last()
            .fields
            .push((key, Field::Yaml(yaml.to_string())));
        self
    }

    /// One key under `settings:`, its value written as YAML
    /// (`.setting("dns", "{ cache_min_ttl: 1s }")`).
    pub fn setting(mut self, key: &str, yaml: &str) -> Self {
        self.settings.push((key.to_string(), yaml.to_string()));
        self
    }
    /// `settings.contact`, shown in every deny page.
    pub fn contact(self, who: &str) -> Self {
        self.setting("contact", &quoted(who))
    }
    /// `settings.mode` (`enforce` or `report`).
    pub fn mode(self, mode: &str) -> Self {
        self.setting("mode", mode)
    }
    /// A named client known by its source addresses.
    pub fn client_from(mut self, id: &str, sources: &[&str]) -> Self {
        let list: Vec<String> = sources.iter().map(|s| quoted(s)).collect();
        self.clients.push(format!(
            "{{ id: {}, sources: [{}] }}",
            quoted(id),
            list.join(", ")
        ));
        self
    }
    /// A named client known by the SHA-256 (hex) of its proxy token.
    pub fn client_token(mut self, id: &str, token_sha256: &str) -> Self {
        self.clients.push(format!(
            "{{ id: {}, token_sha256: {} }}",
            quoted(id),
            quoted(token_sha256)
        ));
        self
    }

    /// The YAML text.
    pub fn yaml(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for PolicyYaml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.settings.is_empty() || !self.clients.is_empty() {
            writeln!(f, "settings:")?;
            for (k, v) in &self.settings {
                writeln!(f, "  {k}: {v}")?;
            }
            if !self.clients.is_empty() {
                writeln!(f, "  clients:")?;
                for c in &self.clients {
                    writeln!(f, "    - {c}")?;
                }
            }
        }
        // `exceptions:` always, first; then every other list in the order
        // its first entry was started.
        let mut lists = vec!["exceptions"];
        for e in &self.entries {
            if !lists.contains(&e.list) {
                lists.push(e.list);
            }
        }
        for list in lists {
            let entries: Vec<&Entry> = self.entries.iter().filter(|e| e.list == list).collect();
            if entries.is_empty() {
                writeln!(f, "{list}: []")?;
                continue;
            }
            writeln!(f, "{list}:")?;
            for e in entries {
                writeln!(f, "  - id: {}", quoted(&e.id))?;
                writeln!(f, "    owner: {}", quoted(&e.owner))?;
                writeln!(f, "    reason: {}", quoted(&e.reason))?;
                for (k, v) in &e.fields {
                    match v {
                        Field::List(items) => writeln!(f, "    {k}: [{}]", items.join(", "))?,
                        Field::Yaml(y) => writeln!(f, "    {k}: {y}")?,
                    }
                }
            }
        }
        Ok(())
    }
}
