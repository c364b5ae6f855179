//! Just enough TLS to read the server name a client is about to ask for:
//! the ClientHello's SNI and whether it carries Encrypted Client Hello
//! ([`parse`]), and what it must name to pass (`SniRule`). Used to refuse
//! domain fronting through an allowed CONNECT, an intercepted tunnel and a
//! captured connection alike.

use std::time::Duration;

use super::dest::Dest;
use crate::policy::host::{parse_host, HostPattern, Target};
use crate::policy::{Exception, MissingSni, Reason};

/// Largest ClientHello we buffer (handshake messages may span records).
pub const MAX_HELLO: usize = 64 << 10;
/// Longest wait for the client's ClientHello where one is due: an opaque
/// tunnel to port 443, a captured connection to it, and the rest of one
/// that has begun (on any port).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// Need more bytes.
    Incomplete,
    /// Not a TLS handshake.
    NotTls,
    /// A ClientHello; `sni` as sent (not normalised), `ech` if the
    /// encrypted_client_hello extension is present (the real name is hidden).
    ClientHello { sni: Option<String>, ech: bool },
    /// A TLS record that is not a well-formed ClientHello.
    Malformed,
}

const EXT_SERVER_NAME: u16 = 0;
const EXT_ECH: u16 = 0xfe0d;

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.b.len() < n {
            return None;
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (b[0] as usize) << 16 | (b[1] as usize) << 8 | b[2] as usize)
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()? as usize;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()? as usize;
        self.take(n)
    }
}

/// Parses the start of a client's byte stream.
pub fn parse(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Incomplete;
    }
    // A TLS record of type handshake, major version 3: anything else is
    // not TLS (off port 443 such bytes pass; a binary protocol may well
    // start with 0x16).
    if buf[0] != 0x16 || buf.get(1).is_some_and(|v| *v != 0x03) {
        return Hello::NotTls;
    }
    // Reassemble the handshake payload from consecutive handshake records.
    let mut hs = Vec::new();
    let mut rest = buf;
    loop {
        if rest.len() < 5 {
            break;
        }
        if rest[0] != 0x16 || rest[1] != 0x03 {
            return Hello::Malformed;
        }
        let len = u16::from_be_bytes([rest[3], rest[4]]) as usize;
        if len == 0 || len > 16384 + 2048 {
            return Hello::Malformed;
        }
        if rest.len() < 5 + len {
            break;
        }
        hs.extend_from_slice(&rest[5..5 + len]);
        rest = &rest[5 + len..];
        if hs.len() >= 4 {
            let need = 4 + ((hs[1] as usize) << 16 | (hs[2] as usize) << 8 | hs[3] as usize);
            if hs.len() >= need {
                break;
            }
        }
    }
    if hs.len() < 4 {
        return if buf.len() >= MAX_HELLO {
            Hello::Malformed
        } else {
            Hello::Incomplete
        };
    }
    if hs[0] != 1 {
        return Hello::Malformed;
    }
    let mut r = Reader { b: &hs[1..] };
    let Some(len) = r.u24() else {
        return Hello::Incomplete;
    };
    if len > MAX_HELLO {
        return Hello::Malformed;
    }
    if r.b.len() < len {
        return if buf.len() >= MAX_HELLO {
            Hello::Malformed
        } else {
            Hello::Incomplete
        };
    }
    let mut r = Reader { b: &r.b[..len] };
    parse_hello_body(&mut r).unwrap_or(Hello::Malformed)
}

fn parse_hello_body(r: &mut Reader<'_>) -> Option<Hello> {
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.b.is_empty() {
        return Some(Hello::ClientHello {
            sni: None,
            ech: false,
        });
    }
    let mut exts = Reader { b: r.vec16()? };
    let mut sni = None;
    let mut ech = false;
    while !exts.b.is_empty() {
        let ty = exts.u16()?;
        let body = exts.vec16()?;
        match ty {
            EXT_SERVER_NAME => {
                if sni.is_some() {
                    return None; // duplicate extension
                }
                let mut l = Reader { b: body };
                let mut list = Reader { b: l.vec16()? };
                while !list.b.is_empty() {
                    let kind = list.u8()?;
                    let name = list.vec16()?;
                    if kind == 0 {
                        if sni.is_some() {
                            return None; // two host names: ambiguous
                        }
                        sni = Some(String::from_utf8(name.to_vec()).ok()?);
                    }
                }
            }
            EXT_ECH => ech = true,
            _ => {}
        }
    }
    Some(Hello::ClientHello { sni, ech })
}

/// What a tunnel's ClientHello must name: the CONNECT host, or nothing at
/// all when `settings.tls.missing_sni` allows it for this destination.
pub(crate) struct SniRule {
    /// Port 443: only TLS may pass. Elsewhere bytes that are not TLS pass
    /// (a ClientHello, on any port, must name the host).
    tls_only: bool,
    target: Target,
    missing: MissingSni,
    exact_host: bool,
}

impl SniRule {
    pub(crate) fn new(dest: &Dest, exception: Option<&Exception>, missing: MissingSni) -> SniRule {
        // What a ClientHello without a usable server name may do.
        let exact_host = match (&dest.target, exception) {
            (Target::Name(h), Some(e)) => e
                .hosts
                .iter()
                .any(|p| matches!(p, HostPattern::Exact(x) if x == h)),
            _ => false,
        };
        SniRule {
            tls_only: dest.port == 443,
            target: dest.target.clone(),
            missing,
            exact_host,
        }
    }

    /// Whether the client must speak TLS first (port 443): then it is
    /// waited for, and anything else closes the tunnel.
    pub(crate) fn tls_only(&self) -> bool {
        self.tls_only
    }

    /// `None` when the hello may pass; else the reason and a note.
    pub(crate) fn judge(&self, hello: &Hello) -> Option<(Reason, String)> {
        match hello {
            Hello::ClientHello { sni, ech } => {
                let missing_ok = match self.missing {
                    MissingSni::Allow => true,
                    MissingSni::Deny => false,
                    MissingSni::ExactOnly => {
                        self.exact_host || matches!(self.target, Target::Ip(_))
                    }
                };
                if *ech && !missing_ok {
                    return Some((
                        Reason::SniMismatch,
                        "encrypted ClientHello hides the server name".into(),
                    ));
                }
                match sni {
                    None if missing_ok => None,
                    None => Some((
                        Reason::SniMismatch,
                        "ClientHello without a server name".into(),
                    )),
                    Some(name) => {
                        let ok = match (&self.target, parse_host(name)) {
                            (Target::Name(h), Ok(s)) => *h == s,
                            _ => false,
                        };
                        if ok || *ech && missing_ok {
                            None
                        } else {
                            Some((
                                Reason::SniMismatch,
                                format!("ClientHello names {:?}", truncate(name, 255)),
                            ))
                        }
                    }
                }
            }
            Hello::NotTls if !self.tls_only => None,
            Hello::NotTls => Some((
                Reason::SniMismatch,
                "the client sent non-TLS bytes to port 443".into(),
            )),
            Hello::Malformed | Hello::Incomplete => {
                Some((Reason::SniMismatch, "malformed TLS ClientHello".into()))
            }
        }
    }
}

fn truncate(s: &str, n: usize) -> &str {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Builds a minimal ClientHello (tests and benches).
pub fn build_client_hello(sni: Option<&str>, ech: bool) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let mut list = vec![0u8];
        list.extend_from_slice(&(n.len() as u16).to_be_bytes());
        list.extend_from_slice(n);
        let mut body = (list.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(&list);
        exts.extend_from_slice(&EXT_SERVER_NAME.to_be_bytes());
        exts.extend_from_slice(&(body.len() as u16).to_be_bytes());
        exts.extend_from_slice(&body);
    }
    if ech {
        exts.extend_from_slice(&EXT_ECH.to_be_bytes());
        exts.extend_from_slice(&4u16.to_be_bytes());
        exts.extend_from_slice(&[0, 0, 1, 0]);
    }
    let mut hello = vec![3, 3];
    hello.extend_from_slice(&[7u8; 32]);
    hello.push(0);
    hello.extend_from_slice(&[0, 2, 0x13, 0x01]);
    hello.extend_from_slice(&[1, 0]);
    hello.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    hello.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&hello);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sni() {
        let h = build_client_hello(Some("Pypi.org"), false);
        assert_eq!(
            parse(&h),
            Hello::ClientHello {
                sni: Some("Pypi.org".into()),
                ech: false
            }
        );
        for cut in 0..h.len() {
            assert_eq!(parse(&h[..cut]), Hello::Incomplete, "cut at {cut}");
        }
        assert_eq!(
            parse(&build_client_hello(None, true)),
            Hello::ClientHello {
                sni: None,
                ech: true
            }
        );
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(parse(&[0x16, 3, 1, 0, 0]), Hello::Malformed);
        assert_eq!(parse(&[0x16, 0x17, 0x18]), Hello::NotTls);
        assert_eq!(parse(&[0x16]), Hello::Incomplete);
    }

    #[test]
    fn split_across_records() {
        let h = build_client_hello(Some("a.test"), false);
        let payload = &h[5..];
        let (p1, p2) = payload.split_at(10);
        let mut two = vec![0x16, 3, 1];
        two.extend_from_slice(&(p1.len() as u16).to_be_bytes());
        two.extend_from_slice(p1);
        two.extend_from_slice(&[0x16, 3, 1]);
        two.extend_from_slice(&(p2.len() as u16).to_be_bytes());
        two.extend_from_slice(p2);
        assert_eq!(
            parse(&two),
            Hello::ClientHello {
                sni: Some("a.test".into()),
                ech: false
            }
        );
    }
}
