//! The DNS codec of the common query: read and answered without building
//! hickory messages.
//!
//! Almost every query a sandbox sends is one question for a host name, with
//! or without an EDNS(0) OPT record. [`parse`] recognises exactly that shape
//! and nothing else; [`encode`] writes the answer to it. Anything unusual (a
//! compression pointer, a label byte outside `[A-Za-z0-9_-]`, a second
//! question, records in the answer or authority sections, EDNS other than
//! version 0, an opcode other than QUERY, trailing bytes) returns `None`,
//! and the query takes the general path through hickory's `Request`, which
//! also logs and answers malformed input. Both paths decide through the same
//! code in `answer.rs`; only the wire work differs, and the tests there hold
//! the two to the same answers.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, Name, RData, Record};
use hickory_proto::serialize::binary::{BinEncodable, BinEncoder};

/// The EDNS option code of Extended DNS Errors (RFC 8914), and the
/// INFO-CODEs egressd sends.
pub(super) const EDNS_EDE: u16 = 15;
pub(super) const EDE_OTHER: u16 = 0;
pub(super) const EDE_BLOCKED: u16 = 15;
/// The OPT record's type (RFC 6891).
const TYPE_OPT: u16 = 41;
const CLASS_IN: u16 = 1;
const HEADER: usize = 12;
/// Header flag bits.
const QR: u16 = 0x8000;
const OPCODE: u16 = 0x7800;
const TC: u16 = 0x0200;
const RD: u16 = 0x0100;
const RA: u16 = 0x0080;
const CD: u16 = 0x0010;

/// A query of the common shape, borrowing the packet.
#[derive(Debug)]
pub(super) struct Query<'a> {
    pub id: u16,
    /// The header's flags word as sent.
    pub flags: u16,
    /// The question as sent (name, type, class): echoed byte for byte, so a
    /// client's 0x20 case randomisation comes back unchanged.
    pub question: &'a [u8],
    /// The name in wire form (length-prefixed labels, no root byte).
    name: &'a [u8],
    pub qtype: u16,
    /// The client spoke EDNS(0): the UDP payload size it offered.
    pub edns: Option<u16>,
}

impl Query<'_> {
    /// The name as a host name, labels lower-cased and joined by dots,
    /// written into `buf` (a name of at most 254 wire bytes is at most 253
    /// characters): no allocation. Every byte was checked by [`parse`] to
    /// be `[A-Za-z0-9_-]`.
    pub fn host_text<'b>(&self, buf: &'b mut [u8; 256]) -> &'b str {
        let mut n = 0;
        let mut rest = self.name;
        while let Some((&len, tail)) = rest.split_first() {
            if n > 0 {
                buf[n] = b'.';
                n += 1;
            }
            let (label, after) = tail.split_at(len as usize);
            buf[n..n + label.len()].copy_from_slice(label);
            n += label.len();
            rest = after;
        }
        buf[..n].make_ascii_lowercase();
        std::str::from_utf8(&buf[..n]).expect("parse admits ASCII label bytes only")
    }

    /// The name in wire form, as sent (no root byte).
    pub fn name_wire(&self) -> &[u8] {
        self.name
    }

    /// The largest UDP answer the client takes, as hickory reckons it.
    pub fn max_payload(&self) -> u16 {
        self.edns.unwrap_or(512).max(512)
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn host_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A query of the common shape that owns its packet: what a query that
/// waits for an upstream carries, parsed once ([`Packet::query`] reads it
/// again without parsing).
pub(super) struct Packet {
    raw: Vec<u8>,
    id: u16,
    flags: u16,
    name_len: u16,
    question_len: u16,
    qtype: u16,
    edns: Option<u16>,
}

impl Packet {
    /// `q`, parsed from `raw`, with a copy of `raw`.
    pub fn own(q: &Query<'_>, raw: &[u8]) -> Packet {
        Packet {
            raw: raw.to_vec(),
            id: q.id,
            flags: q.flags,
            name_len: q.name.len() as u16,
            question_len: q.question.len() as u16,
            qtype: q.qtype,
            edns: q.edns,
        }
    }

    /// The query as [`parse`] read it.
    pub fn query(&self) -> Query<'_> {
        let question = &self.raw[HEADER..HEADER + usize::from(self.question_len)];
        Query {
            id: self.id,
            flags: self.flags,
            question,
            name: &question[..usize::from(self.name_len)],
            qtype: self.qtype,
            edns: self.edns,
        }
    }

    /// The packet as received.
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }
}

#[cfg(test)]
thread_local! {
    /// Packets this thread parsed (common shape or hickory's general
    /// way): what the tests count a query's parses by.
    pub(super) static PARSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one parse of a packet (tests only).
#[inline]
pub(super) fn counted_parse() {
    #[cfg(test)]
    PARSES.with(|n| n.set(n.get() + 1));
}

/// Recognises a query of the common shape; `None` sends it the general way.
pub(super) fn parse(raw: &[u8]) -> Option<Query<'_>> {
    counted_parse();
    let flags = be16(raw, 2)?;
    if flags & (QR | OPCODE | TC) != 0 {
        return None;
    }
    let (qd, an, ns, ar) = (be16(raw, 4)?, be16(raw, 6)?, be16(raw, 8)?, be16(raw, 10)?);
    if qd != 1 || an != 0 || ns != 0 || ar > 1 {
        return None;
    }
    let mut at = name_end(raw)?;
    let name = &raw[HEADER..at];
    at += 1;
    let qtype = be16(raw, at)?;
    if be16(raw, at + 2)? != CLASS_IN || qtype == TYPE_OPT {
        return None;
    }
    at += 4;
    let question = &raw[HEADER..at];
    let edns = if ar == 1 {
        Some(opt_payload(raw, at)?)
    } else if at == raw.len() {
        None
    } else {
        return None;
    };
    Some(Query {
        id: be16(raw, 0)?,
        flags,
        question,
        name,
        qtype,
        edns,
    })
}

/// Where the question's name ends (its zero byte): plain labels of host
/// bytes only, no compression, at most 255 bytes, not the root.
fn name_end(raw: &[u8]) -> Option<usize> {
    let mut at = HEADER;
    loop {
        let len = *raw.get(at)? as usize;
        if len == 0 {
            break;
        }
        // 0xC0.. are compression pointers, 0x40.. reserved label types.
        if len > 63 {
            return None;
        }
        let label = raw.get(at + 1..at + 1 + len)?;
        if !label.iter().all(|b| host_byte(*b)) {
            return None;
        }
        at += 1 + len;
        if at - HEADER > 254 {
            return None;
        }
    }
    // The root has no host name to decide.
    (at != HEADER).then_some(at)
}

/// The UDP payload size of the OPT record at `at`, the last thing in the
/// packet: exactly one, version 0, its options well framed.
fn opt_payload(raw: &[u8], mut at: usize) -> Option<u16> {
    if *raw.get(at)? != 0 || be16(raw, at + 1)? != TYPE_OPT {
        return None;
    }
    let payload = be16(raw, at + 3)?;
    let version = *raw.get(at + 6)?;
    if version != 0 {
        return None;
    }
    let rdlen = be16(raw, at + 9)? as usize;
    at += 11;
    let end = at.checked_add(rdlen)?;
    if end != raw.len() {
        return None;
    }
    while at < end {
        let olen = be16(raw, at + 2)? as usize;
        at += 4 + olen;
    }
    (at == end).then_some(payload)
}

/// The answer to `q`: header, the question as sent, the records, and an
/// OPT record (with an Extended DNS Error when `ede` is set) to a client
/// that spoke EDNS. `None` when it does not fit `max_size` or the rcode
/// needs extended bits: the caller then encodes through hickory, which
/// truncates as a UDP answer must.
pub(super) fn encode(
    q: &Query<'_>,
    rcode: ResponseCode,
    answers: &[Record],
    authority: &[Record],
    ede: Option<(u16, &str)>,
    max_size: u16,
    edns_payload: u16,
) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(512);
    encode_into(
        &mut buf,
        q,
        rcode,
        (answers, authority),
        ede,
        max_size,
        edns_payload,
    )
    .then_some(buf)
}

/// The flags word of an answer to `q` with response code `rcode`: QR, RA,
/// and the client's RD and CD.
pub(super) fn answer_flags(q: &Query<'_>, rcode: u16) -> u16 {
    QR | (q.flags & (RD | CD)) | RA | (rcode & 0xf)
}

/// [`encode`] into `buf` (emptied first; its capacity is reused, so a
/// denial allocates nothing once it has grown), the answer and authority
/// sections as a pair. `false`: see [`encode`].
pub(super) fn encode_into(
    buf: &mut Vec<u8>,
    q: &Query<'_>,
    rcode: ResponseCode,
    (answers, authority): (&[Record], &[Record]),
    ede: Option<(u16, &str)>,
    max_size: u16,
    edns_payload: u16,
) -> bool {
    buf.clear();
    let code = u16::from(rcode);
    if code > 0xf {
        return false;
    }
    let (Ok(an), Ok(ns)) = (u16::try_from(answers.len()), u16::try_from(authority.len())) else {
        return false;
    };
    for word in [
        q.id,
        answer_flags(q, code),
        1,
        an,
        ns,
        u16::from(q.edns.is_some()),
    ] {
        buf.extend_from_slice(&word.to_be_bytes());
    }
    buf.extend_from_slice(q.question);
    for r in answers.iter().chain(authority) {
        if !address_for_question(buf, q, r) {
            let at = buf.len();
            let mut enc = BinEncoder::with_offset(buf, at as u32);
            enc.set_max_size(max_size);
            if r.emit(&mut enc).is_err() {
                return false;
            }
        }
    }
    if q.edns.is_some() {
        // Root name, type OPT, class = our payload size, TTL = extended
        // rcode 0, version 0, no flags; then the options.
        buf.push(0);
        buf.extend_from_slice(&TYPE_OPT.to_be_bytes());
        buf.extend_from_slice(&edns_payload.max(512).to_be_bytes());
        buf.extend_from_slice(&[0, 0, 0, 0]);
        match ede {
            Some((info, text)) => {
                let Ok(olen) = u16::try_from(2 + text.len()) else {
                    return false;
                };
                buf.extend_from_slice(&(4 + olen).to_be_bytes());
                buf.extend_from_slice(&EDNS_EDE.to_be_bytes());
                buf.extend_from_slice(&olen.to_be_bytes());
                buf.extend_from_slice(&info.to_be_bytes());
                buf.extend_from_slice(text.as_bytes());
            }
            None => buf.extend_from_slice(&[0, 0]),
        }
    }
    buf.len() <= usize::from(max_size)
}

/// Writes `r` when it is an A or AAAA record of the question's own name
/// (the common answer), its owner a pointer to the question (offset 12, as
/// RFC 1035 §4.1.4 compression allows). Anything else returns `false` and
/// goes through hickory's encoder.
fn address_for_question(buf: &mut Vec<u8>, q: &Query<'_>, r: &Record) -> bool {
    let rdata: &[u8] = match &r.data {
        RData::A(a) => &a.0.octets(),
        RData::AAAA(a) => &a.0.octets(),
        _ => return false,
    };
    if r.dns_class != DNSClass::IN || !same_name(q.name, &r.name) {
        return false;
    }
    let rtype: u16 = if rdata.len() == 4 { 1 } else { 28 };
    buf.extend_from_slice(&[0xc0, HEADER as u8]);
    buf.extend_from_slice(&rtype.to_be_bytes());
    buf.extend_from_slice(&CLASS_IN.to_be_bytes());
    buf.extend_from_slice(&r.ttl.to_be_bytes());
    buf.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    buf.extend_from_slice(rdata);
    true
}

/// Whether the wire name `wire` (length-prefixed labels) and `name` are the
/// same name, ignoring ASCII case.
fn same_name(wire: &[u8], name: &Name) -> bool {
    let mut rest = wire;
    for label in name.iter() {
        let Some((&len, tail)) = rest.split_first() else {
            return false;
        };
        let len = len as usize;
        if len != label.len() || !tail[..len].eq_ignore_ascii_case(label) {
            return false;
        }
        rest = &tail[len..];
    }
    rest.is_empty()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A query for `name` of `qtype`, with an OPT record when `edns` is set.
    pub(crate) fn query(id: u16, flags: u16, name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
        let mut p = Vec::new();
        for w in [id, flags, 1, 0, 0, u16::from(edns.is_some())] {
            p.extend_from_slice(&w.to_be_bytes());
        }
        for label in name.split('.').filter(|l| !l.is_empty()) {
            p.push(label.len() as u8);
            p.extend_from_slice(label.as_bytes());
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&CLASS_IN.to_be_bytes());
        if let Some(size) = edns {
            p.push(0);
            p.extend_from_slice(&TYPE_OPT.to_be_bytes());
            p.extend_from_slice(&size.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0x80, 0]); // DO set
            p.extend_from_slice(&8u16.to_be_bytes());
            // a cookie option: skipped, not echoed
            p.extend_from_slice(&10u16.to_be_bytes());
            p.extend_from_slice(&4u16.to_be_bytes());
            p.extend_from_slice(&[1, 2, 3, 4]);
        }
        p
    }

    #[test]
    fn the_common_shape_is_recognised() {
        let raw = query(0x1234, RD, "WwW.Example.test", 1, Some(1232));
        let q = parse(&raw).expect("common shape");
        assert_eq!(q.id, 0x1234);
        assert_eq!(q.qtype, 1);
        assert_eq!(q.edns, Some(1232));
        assert_eq!(q.host_text(&mut [0; 256]), "www.example.test");
        assert_eq!(&q.question[..4], b"\x03WwW");
        let raw = query(7, 0, "a.test", 28, None);
        let q = parse(&raw).unwrap();
        assert_eq!((q.edns, q.max_payload()), (None, 512));
    }

    #[test]
    fn anything_else_takes_the_general_path() {
        let ok = query(1, RD, "a.test", 1, None);
        assert!(parse(&ok).is_some());
        let mut cases: Vec<Vec<u8>> = Vec::new();
        // a response, another opcode, truncated flag
        for flags in [QR, 0x2800, TC] {
            let mut p = ok.clone();
            p[2..4].copy_from_slice(&(flags | RD).to_be_bytes());
            cases.push(p);
        }
        // two questions; an answer record count; two additionals
        for (at, v) in [(4, 2u16), (6, 1), (8, 1), (10, 2)] {
            let mut p = ok.clone();
            p[at..at + 2].copy_from_slice(&v.to_be_bytes());
            cases.push(p);
        }
        // odd bytes in a label, a compression pointer, the root name
        cases.push(query(1, RD, "a b.test", 1, None));
        cases.push(query(1, RD, "a\\.test", 1, None));
        let mut p = ok[..12].to_vec();
        p.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
        cases.push(p);
        cases.push(query(1, RD, "", 1, None));
        // class CH, trailing garbage, cut short, EDNS version 1
        let mut p = ok.clone();
        let n = p.len();
        p[n - 1] = 3;
        cases.push(p);
        let mut p = ok.clone();
        p.push(0);
        cases.push(p);
        cases.push(ok[..ok.len() - 1].to_vec());
        let mut p = query(1, RD, "a.test", 1, Some(1232));
        let opt = ok.len();
        p[opt + 6] = 1;
        cases.push(p);
        // an option running past the OPT record
        let mut p = query(1, RD, "a.test", 1, Some(1232));
        let n = p.len();
        p[n - 5] = 9;
        cases.push(p);
        for (i, c) in cases.iter().enumerate() {
            assert!(parse(c).is_none(), "case {i}: {c:?}");
        }
    }

    #[test]
    fn address_records_of_the_question_point_to_it_others_are_encoded() {
        use hickory_proto::op::Message;
        use hickory_proto::rr::rdata::{A, AAAA, CNAME};
        let raw = query(3, RD, "WwW.Example.test", 1, None);
        let q = parse(&raw).unwrap();
        let name = |s: &str| Name::from_ascii(s).unwrap();
        let records = vec![
            Record::from_rdata(
                name("www.example.test."),
                60,
                RData::A(A::new(192, 0, 2, 1)),
            ),
            Record::from_rdata(
                name("WWW.EXAMPLE.TEST."),
                61,
                RData::AAAA(AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            ),
            Record::from_rdata(
                name("www.example.test."),
                62,
                RData::CNAME(CNAME(name("cdn.example.test."))),
            ),
            Record::from_rdata(
                name("cdn.example.test."),
                63,
                RData::A(A::new(192, 0, 2, 2)),
            ),
            Record::from_rdata(name("example.test."), 64, RData::A(A::new(192, 0, 2, 3))),
        ];
        let out = encode(&q, ResponseCode::NoError, &records, &[], None, 512, 1232).unwrap();
        let at = 12 + q.question.len();
        assert_eq!(&out[at..at + 2], &[0xc0, 0x0c], "first owner is a pointer");
        let m = Message::from_vec(&out).unwrap();
        assert_eq!(m.answers.len(), records.len());
        for (got, want) in m.answers.iter().zip(&records) {
            assert_eq!(got.name, want.name);
            assert_eq!(got.ttl, want.ttl);
            assert_eq!(got.data, want.data);
            assert_eq!(got.dns_class, DNSClass::IN);
        }
        assert!(!same_name(
            b"\x03www\x07example\x04test",
            &name("www.example.test.x.")
        ));
        assert!(!same_name(
            b"\x03www\x07example",
            &name("www.example.test.")
        ));
        assert!(same_name(b"\x01A", &name("a.")));
    }

    #[test]
    fn an_answer_echoes_the_question_and_fits_or_declines() {
        let raw = query(9, RD | CD, "X.test", 1, Some(4096));
        let q = parse(&raw).unwrap();
        let out = encode(
            &q,
            ResponseCode::Refused,
            &[],
            &[],
            Some((15, "egressd: no_exception")),
            4096,
            1232,
        )
        .unwrap();
        assert_eq!(be16(&out, 0), Some(9));
        assert_eq!(be16(&out, 2), Some(QR | RD | CD | RA | 5));
        assert_eq!(&out[12..12 + q.question.len()], q.question);
        assert!(out.ends_with(b"egressd: no_exception"));
        assert!(encode(&q, ResponseCode::Refused, &[], &[], None, 20, 1232).is_none());
        assert!(encode(&q, ResponseCode::BADVERS, &[], &[], None, 4096, 1232).is_none());
    }
}
