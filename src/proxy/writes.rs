//! The serving step of `git:` rules (DESIGN "Writes on allowed hosts"):
//! after the policy allowed a smart-HTTP endpoint of a listed repository,
//! `info/refs` is held to its service and a push is read whole (bounded
//! by `max_bytes`) and judged before any byte of it goes upstream. A
//! refused push is answered in git's own channel, as a server-side hook's
//! refusal would be: `200` with `report-status` `ng … egressd: <reason>`
//! and, in side-band, `remote: egressd: …` naming the rule and contact.
//!
//! The parsing and the judgement are pure (`crate::writes`); this module
//! reads bodies, answers and notes the line's `git` field.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::held::ReqBody;
use super::respond::{self, ProxyBody, Responder};
use crate::policy::git::{self as git_rules, Endpoint, PushRules};
use crate::policy::{Decision, Exception, Mode, Reason};
use crate::record::{Event, GitLine, GitRefLine};
use crate::writes::git::{self, Head, Judgement};
use crate::writes::pack::{self, Arrived, Limits, Pack, PackError};

/// How much of a push past `max_bytes` is read and dropped, so that the
/// client (which sends the whole body before it reads an answer) sees
/// the refusal rather than a reset connection.
const DRAIN_MAX: u64 = 64 << 20;
/// How long that drain may take.
const DRAIN_TIME: Duration = Duration::from_secs(10);
/// How long reading a push's body may take.
const READ_TIME: Duration = Duration::from_secs(300);

/// What the step decided.
pub(crate) enum Judged {
    /// Forward this request (its body streamed, or held when it was read).
    Forward(Request<ReqBody>, Event),
    /// Forward this `info/refs?service=git-receive-pack`, and pass its
    /// answer through [`answered`]: the advertisement gains `no-thin`.
    Advertise(Request<ReqBody>, Event),
    /// Answered here, the line recorded.
    Answered(Response<ProxyBody>),
}

/// Applies the allowing exception's `git:` or `body:` rules to `req`, an
/// allowed request for `path`; any other request passes untouched.
/// `body_cands` are the exceptions that allow the request when the first
/// has `body:` (else empty): the body may hand the request to a later
/// one, and `d` becomes that exception's decision.
pub(crate) async fn judge<'p>(
    req: Request<Incoming>,
    ev: Event,
    path: &str,
    body_cands: Vec<&'p Exception>,
    d: &mut Decision<'p>,
    mode: Mode,
    responder: &Responder<'_>,
) -> Judged {
    if !body_cands.is_empty() {
        let step = super::body_rules::step(req, ev, d, body_cands, mode, responder);
        return match Box::pin(step).await {
            super::body_rules::Stepped::Forward(req, ev) => Judged::Forward(req, ev),
            super::body_rules::Stepped::Answered(resp) => Judged::Answered(resp),
        };
    }
    git_step(req, ev, path, d, mode, responder).await
}

/// `git:` rules.
async fn git_step(
    req: Request<Incoming>,
    mut ev: Event,
    path: &str,
    d: &Decision<'_>,
    mode: Mode,
    responder: &Responder<'_>,
) -> Judged {
    let Some((e, g)) = d.exception.and_then(|e| e.git().map(|g| (e, g))) else {
        return Judged::Forward(req.map(ReqBody::Stream), ev);
    };
    // The policy allowed only the endpoints of listed repositories (a
    // report-mode pass may bring any other path here: nothing to judge).
    let Some((repo, ep)) = git_rules::endpoint(path) else {
        return Judged::Forward(req.map(ReqBody::Stream), ev);
    };
    let line = |service| {
        Some(Box::new(GitLine {
            repo: repo.to_string(),
            service,
            refs: Vec::new(),
            pack_bytes: None,
        }))
    };
    match ep {
        Endpoint::InfoRefs => match git_rules::service(req.uri().query()) {
            Some("git-upload-pack") => {
                ev.git = line("fetch");
                Judged::Forward(req.map(ReqBody::Stream), ev)
            }
            Some("git-receive-pack") => {
                ev.git = line("push");
                if g.push.is_some() {
                    return Judged::Advertise(req.map(ReqBody::Stream), ev);
                }
                let detail = format!("{repo} is listed for fetching only");
                refuse_http(
                    req,
                    ev,
                    e,
                    Reason::GitPushNotAllowed,
                    detail,
                    mode,
                    responder,
                )
            }
            _ => {
                // Dumb HTTP (or no service): not a smart-HTTP endpoint.
                let detail = "git: allows smart-HTTP git only (info/refs?service=git-upload-pack or git-receive-pack)".to_string();
                refuse_http(req, ev, e, Reason::PathNotAllowed, detail, mode, responder)
            }
        },
        Endpoint::UploadPack => {
            ev.git = line("fetch");
            Judged::Forward(req.map(ReqBody::Stream), ev)
        }
        Endpoint::ReceivePack => {
            ev.git = line("push");
            match &g.push {
                Some(push) => Box::pin(push_step(req, ev, e, push, mode, responder)).await,
                None => {
                    let detail = format!("{repo} is listed for fetching only");
                    refuse_http(
                        req,
                        ev,
                        e,
                        Reason::GitPushNotAllowed,
                        detail,
                        mode,
                        responder,
                    )
                }
            }
        }
    }
}

/// A refusal answered as HTTP (403 with the text body), or in report
/// mode logged and forwarded.
fn refuse_http(
    req: Request<Incoming>,
    mut ev: Event,
    e: &Exception,
    reason: Reason,
    detail: String,
    mode: Mode,
    responder: &Responder<'_>,
) -> Judged {
    let d = Decision::deny(reason, Some(e)).under(mode);
    ev.set_decision(&d, mode);
    if d.is_allowed() {
        ev.add_note(Some(detail));
        return Judged::Forward(req.map(ReqBody::Stream), ev);
    }
    Judged::Answered(responder.deny(ev, reason, Some(detail)))
}

/// Reads, judges and either forwards (held) or refuses a push.
async fn push_step(
    req: Request<Incoming>,
    mut ev: Event,
    e: &Exception,
    push: &PushRules,
    mode: Mode,
    responder: &Responder<'_>,
) -> Judged {
    let (parts, body) = req.into_parts();
    let encoding = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.as_bytes().to_ascii_lowercase());
    // A plain body's pack is read as it arrives; a gzipped one (git
    // compresses only bodies small enough to send in one piece) once it
    // is whole and inflated.
    let arriving = matches!(encoding.as_deref(), None | Some(b"identity"));
    let read = read_bounded(body, push.max_bytes, arriving);
    let read = match tokio::time::timeout(READ_TIME, read).await {
        Ok(r) => r,
        Err(_) => Read::Failed("the push body did not arrive in time".into()),
    };
    let (raw, reading) = match read {
        Read::Whole(b, reading) => (b, reading),
        Read::TooLarge { seen, head } => {
            if let Some(g) = ev.git.as_mut() {
                g.pack_bytes = Some(seen);
            }
            let why = format!(
                "the push is larger than max_bytes ({} bytes)",
                push.max_bytes
            );
            return Judged::Answered(too_large(ev, e, &head, why, mode, responder));
        }
        Read::Failed(why) => {
            return Judged::Answered(responder.deny(ev, Reason::Malformed, Some(why)));
        }
    };
    if let Some(g) = ev.git.as_mut() {
        g.pack_bytes = Some(raw.len() as u64);
    }
    let (Head { commands, caps, .. }, pack) = match reading {
        Some(r) => r.finish(&raw).await,
        None => match whole_push(&raw, encoding.as_deref(), push.max_bytes) {
            Ok(parts) => parts,
            Err(why) => return Judged::Answered(responder.deny(ev, Reason::Malformed, Some(why))),
        },
    };
    if commands.is_empty() {
        // git's probe before a large push (a lone flush): it asks whether
        // the endpoint answers; upstream needs to see nothing of it.
        ev.add_note(Some("push probe answered by egressd".into()));
        ev.status = Some(200);
        responder.rec.record(ev);
        return Judged::Answered(git_answer(Vec::new()));
    }
    let j = git::judge_read(push, &commands, pack);
    if let Some(g) = ev.git.as_mut() {
        g.refs = ref_lines(&j);
    }
    let Some((reason, why)) = j.refused.clone() else {
        return forward_held(parts, raw, ev);
    };
    let d = Decision::deny(reason, Some(e)).under(mode);
    ev.set_decision(&d, mode);
    ev.add_note(Some(why.clone()));
    if d.is_allowed() {
        return forward_held(parts, raw, ev);
    }
    let message = refusal_lines(&j, &why, e, responder.contact);
    let body = git::refusal(&j, git::sideband(&caps), &message);
    ev.status = Some(200);
    responder.rec.record(ev);
    Judged::Answered(git_answer(body))
}

/// A push's commands and capabilities, and its pack as read (`None`: it
/// carried none).
type Push = (Head, Option<Result<Pack, PackError>>);

/// A push read whole (gzipped, or whose commands did not read while it
/// arrived), parsed here.
fn whole_push(raw: &Bytes, encoding: Option<&[u8]>, max: u64) -> Result<Push, String> {
    let plain = match encoding {
        None | Some(b"identity") => raw.clone(),
        Some(b"gzip") | Some(b"x-gzip") => gunzip(raw, max.saturating_mul(32))?,
        Some(_) => return Err("a push body in an encoding egressd does not read".into()),
    };
    let parsed = git::parse_request(&plain)?;
    let pack = (!parsed.pack.is_empty())
        .then(|| Pack::parse(parsed.pack, Limits::for_pack(parsed.pack.len())));
    let head = Head {
        commands: parsed.commands,
        caps: parsed.caps,
        pack_at: plain.len() - parsed.pack.len(),
    };
    Ok((head, pack))
}

/// A push's pack being read as its body arrives: the commands read from
/// the body's start, and a reader on a blocking thread fed each chunk as
/// it comes, so that the pack's reading (inflating, hashing, applying
/// tree deltas) ends with the upload instead of starting after it.
struct PackReading {
    head: Head,
    feed: std::sync::mpsc::Sender<Bytes>,
    reader: tokio::task::JoinHandle<Result<Arrived, PackError>>,
}

impl PackReading {
    fn start(head: Head, first: Bytes, max: u64) -> Self {
        let (feed, rx) = std::sync::mpsc::channel();
        let _ = feed.send(first);
        let limits = Limits::for_pack(usize::try_from(max).unwrap_or(usize::MAX));
        let reader = tokio::task::spawn_blocking(move || {
            Pack::read_arriving(
                Chunks {
                    rx,
                    cur: Bytes::new(),
                },
                limits,
            )
        });
        PackReading { head, feed, reader }
    }

    /// The push, once all of `raw` is in: the pack as read arriving, or,
    /// when it holds a REF_DELTA, read again whole.
    async fn finish(self, raw: &Bytes) -> Push {
        let PackReading { head, feed, reader } = self;
        drop(feed);
        let at = head.pack_at;
        if raw.len() == at {
            return (head, None);
        }
        let read = match reader.await {
            Ok(r) => r,
            Err(_) => Err(PackError::BadObject(at, "the pack's reader failed")),
        };
        let pack = match read {
            Ok(Arrived::Read(p)) => Ok(p),
            Ok(Arrived::NeedsWhole) => {
                let whole = raw.slice(at..);
                tokio::task::spawn_blocking(move || {
                    Pack::parse_whole(&whole, Limits::for_pack(whole.len()))
                })
                .await
                .unwrap_or(Err(PackError::BadObject(at, "the pack's reader failed")))
            }
            Err(e) => Err(e),
        };
        (head, Some(pack))
    }
}

/// The chunks of a body, handed over from the task that reads it, as a
/// blocking `BufRead`: at its end when the sender is dropped.
struct Chunks {
    rx: std::sync::mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl std::io::Read for Chunks {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        pack::read_through_buffer(self, out)
    }
}

impl std::io::BufRead for Chunks {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        while self.cur.is_empty() {
            match self.rx.recv() {
                Ok(b) => self.cur = b,
                Err(_) => break,
            }
        }
        Ok(&self.cur)
    }

    fn consume(&mut self, n: usize) {
        bytes::Buf::advance(&mut self.cur, n);
    }
}

fn forward_held(parts: http::request::Parts, raw: Bytes, ev: Event) -> Judged {
    Judged::Forward(Request::from_parts(parts, ReqBody::held(raw)), ev)
}

/// What `remote: egressd: …` says: the refusal, the rule, whom to ask.
fn refusal_lines(j: &Judgement, why: &str, e: &Exception, contact: &str) -> Vec<String> {
    let (reason, _) = j.refused.as_ref().expect("refused");
    vec![
        format!("push refused ({}): {why}", reason.as_str()),
        format!("{}.", reason.describe()),
        format!(
            "rule: exception {} (owner {}); nothing was sent upstream; ask {contact} to change it",
            e.id, e.owner
        ),
    ]
}

/// A push past `max_bytes`, refused in git's channel with the refs its
/// first bytes name (the commands come before the pack); when even those
/// do not read, as HTTP. Report mode cannot forward what was not kept:
/// the bound holds in both modes.
fn too_large(
    mut ev: Event,
    e: &Exception,
    head: &[u8],
    why: String,
    mode: Mode,
    responder: &Responder<'_>,
) -> Response<ProxyBody> {
    let reason = Reason::GitTooLarge;
    ev.set_decision(&Decision::deny(reason, Some(e)), mode);
    let Ok(parsed) = git::parse_request(head) else {
        return responder.deny(ev, reason, Some(why));
    };
    let j = Judgement {
        refs: parsed
            .commands
            .iter()
            .map(|c| git::RefVerdict {
                command: c.clone(),
                refused: Some(reason),
            })
            .collect(),
        refused: Some((reason, why.clone())),
    };
    if let Some(g) = ev.git.as_mut() {
        g.refs = ref_lines(&j);
    }
    ev.add_note(Some(why.clone()));
    let message = refusal_lines(&j, &why, e, responder.contact);
    let body = git::refusal(&j, parsed.sideband(), &message);
    ev.status = Some(200);
    responder.rec.record(ev);
    git_answer(body)
}

fn ref_lines(j: &Judgement) -> Vec<GitRefLine> {
    j.refs
        .iter()
        .map(|v| GitRefLine {
            name: v.command.name.clone(),
            old: pack::hex(&v.command.old),
            new: pack::hex(&v.command.new),
            verdict: match (v.refused, &j.refused) {
                (Some(r), _) => r.as_str(),
                (None, Some(_)) => "not_updated",
                (None, None) => "allow",
            },
        })
        .collect()
}

/// `200` with a `git-receive-pack` result body.
fn git_answer(body: Vec<u8>) -> Response<ProxyBody> {
    let mut r = Response::new(respond::full(body));
    *r.status_mut() = StatusCode::OK;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-git-receive-pack-result"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

enum Read {
    /// All of it, and the pack's reading when it was read arriving.
    Whole(Bytes, Option<PackReading>),
    /// More than the bound arrived: how much was seen, and the first
    /// bytes (where the commands are).
    TooLarge {
        seen: u64,
        head: Bytes,
    },
    Failed(String),
}

/// What of a too-large push is kept to name its refs.
const HEAD_KEPT: usize = 1 << 20;

/// The body, whole, if it is at most `max` bytes; when `arriving`, its
/// pack read as it comes ([`PackReading`]). Past the bound the rest is
/// read and dropped (at most [`DRAIN_MAX`], for [`DRAIN_TIME`]) so the
/// client reads the answer.
async fn read_bounded(mut body: Incoming, max: u64, arriving: bool) -> Read {
    let mut buf = BytesMut::new();
    let mut seen = 0u64;
    let mut reading: Option<PackReading> = None;
    let mut head_read = !arriving;
    loop {
        let d = match body.frame().await {
            None => return Read::Whole(buf.freeze(), reading),
            Some(Err(e)) => return Read::Failed(format!("the push body: {e}")),
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => d,
                Err(_) => continue,
            },
        };
        seen += d.len() as u64;
        if seen > max {
            drop(reading);
            return too_much(body, buf, d, seen, max).await;
        }
        buf.extend_from_slice(&d);
        if let Some(r) = &reading {
            let _ = r.feed.send(d);
        } else if !head_read {
            match git::read_head(&buf, false) {
                Ok(None) => {}
                // The commands carry nothing to judge (git's probe) or
                // do not read: judged once the body is whole.
                Ok(Some(h)) if h.commands.is_empty() => head_read = true,
                Err(_) => head_read = true,
                Ok(Some(head)) => {
                    head_read = true;
                    let first = Bytes::copy_from_slice(&buf[head.pack_at..]);
                    reading = Some(PackReading::start(head, first, max));
                }
            }
        }
    }
}

/// Past the bound: the first bytes kept, the rest read and dropped.
async fn too_much(
    mut body: Incoming,
    mut buf: BytesMut,
    d: Bytes,
    mut seen: u64,
    max: u64,
) -> Read {
    buf.truncate(HEAD_KEPT);
    let keep = HEAD_KEPT.saturating_sub(buf.len()).min(d.len());
    buf.extend_from_slice(&d[..keep]);
    let head = buf.freeze();
    let drain = async {
        while let Some(Ok(f)) = body.frame().await {
            if let Ok(d) = f.into_data() {
                seen += d.len() as u64;
                if seen > max + DRAIN_MAX {
                    break;
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
    Read::TooLarge { seen, head }
}

/// A gzip body inflated, at most `max` bytes.
fn gunzip(raw: &[u8], max: u64) -> Result<Bytes, String> {
    use std::io::Read as _;
    let mut out = Vec::new();
    let mut d = flate2::read::GzDecoder::new(raw).take(max + 1);
    d.read_to_end(&mut out)
        .map_err(|e| format!("the push body does not inflate: {e}"))?;
    if out.len() as u64 > max {
        return Err("the push body inflates past egressd's bound".into());
    }
    Ok(out.into())
}

/// The origin's answer, on its way to the client; for an advertisement
/// ([`Judged::Advertise`]) the first ref line's capabilities gain
/// `no-thin`, so git sends a pack that holds every base its deltas need
/// (a thin pack's deltas against objects upstream has cannot be read, and
/// the push would be refused as unprovable).
pub(crate) fn answered(resp: Response<ProxyBody>, advert: bool) -> Response<ProxyBody> {
    if !advert || resp.status() != StatusCode::OK {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    let body = NoThin {
        inner: body,
        head: Some(BytesMut::new()),
    };
    Response::from_parts(parts, BodyExt::boxed(body))
}

/// The most of an advertisement held to find its first ref line.
const ADVERT_HEAD_MAX: usize = 128 << 10;

struct NoThin {
    inner: ProxyBody,
    /// `None` once the head went out.
    head: Option<BytesMut>,
}

impl hyper::body::Body for NoThin {
    type Data = Bytes;
    type Error = respond::BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        loop {
            let this = &mut *self;
            let frame = match std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(f) => f,
            };
            let Some(head) = this.head.as_mut() else {
                return Poll::Ready(frame);
            };
            match frame {
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => {
                        head.extend_from_slice(&d);
                        if let Some(out) = add_no_thin(head) {
                            this.head = None;
                            return Poll::Ready(Some(Ok(hyper::body::Frame::data(out))));
                        }
                        if head.len() > ADVERT_HEAD_MAX {
                            let out = this.head.take().expect("head").freeze();
                            return Poll::Ready(Some(Ok(hyper::body::Frame::data(out))));
                        }
                    }
                    Err(f) => return Poll::Ready(Some(Ok(f))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    let out = this.head.take().expect("head").freeze();
                    return Poll::Ready(if out.is_empty() {
                        None
                    } else {
                        Some(Ok(hyper::body::Frame::data(out)))
                    });
                }
            }
        }
    }
}

/// `head` with `no-thin` added to the first ref line's capabilities, once
/// that line is whole; the head unchanged when it is not a v0
/// `git-receive-pack` advertisement; `None` while more is needed.
fn add_no_thin(head: &[u8]) -> Option<Bytes> {
    use crate::writes::pktline::{self, Pkt, Reader};
    let mut r = Reader::new(head);
    let mut out = Vec::with_capacity(head.len() + 16);
    let unchanged = || Some(Bytes::copy_from_slice(head));
    match r.next_pkt() {
        Ok(Some(Pkt::Data(d))) if d.starts_with(b"# service=git-receive-pack") => {
            pktline::write(&mut out, d)
        }
        Ok(None) | Err(crate::writes::pktline::PktError::Truncated) => return None,
        _ => return unchanged(),
    }
    match r.next_pkt() {
        Ok(Some(Pkt::Flush)) => pktline::flush(&mut out),
        Ok(None) | Err(crate::writes::pktline::PktError::Truncated) => return None,
        _ => return unchanged(),
    }
    let line = match r.next_pkt() {
        Ok(Some(Pkt::Data(d))) => d,
        Ok(None) | Err(crate::writes::pktline::PktError::Truncated) => return None,
        _ => return unchanged(),
    };
    let Some(nul) = line.iter().position(|&b| b == 0) else {
        return unchanged();
    };
    let caps = line[nul + 1..]
        .strip_suffix(b"\n")
        .unwrap_or(&line[nul + 1..]);
    if caps.split(|&b| b == b' ').any(|c| c == b"no-thin") {
        return unchanged();
    }
    let mut new = line[..=nul].to_vec();
    new.extend_from_slice(caps);
    if !caps.is_empty() {
        new.push(b' ');
    }
    new.extend_from_slice(b"no-thin\n");
    pktline::write(&mut out, &new);
    out.extend_from_slice(r.rest());
    Some(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertisement_gains_no_thin() {
        let mut adv = Vec::new();
        crate::writes::pktline::write(&mut adv, b"# service=git-receive-pack\n");
        crate::writes::pktline::flush(&mut adv);
        let first = format!(
            "{} refs/heads/main\0report-status ofs-delta\n",
            "a".repeat(40)
        );
        crate::writes::pktline::write(&mut adv, first.as_bytes());
        crate::writes::pktline::flush(&mut adv);
        assert_eq!(add_no_thin(&adv[..10]), None);
        let out = add_no_thin(&adv).unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("report-status ofs-delta no-thin\n"), "{text}");
        assert!(text.ends_with("0000"));
        // An upload-pack advertisement is left alone.
        let mut up = Vec::new();
        crate::writes::pktline::write(&mut up, b"# service=git-upload-pack\n");
        assert_eq!(add_no_thin(&up).unwrap(), Bytes::from(up));
    }
}
