//! Encrypted Client Hello stripping (DESIGN "ECH"): the `ech` parameter is
//! removed from every HTTPS and SVCB record an upstream answers with, before
//! the answer is cached or served, so clients have no ECH configuration and
//! send the real server name in the ClientHello, where the proxy checks it
//! against the CONNECT target.
//!
//! Owns that one rewrite. Every other parameter stays as it came, in its
//! order; `mandatory` loses `ech` from its list too (a record whose
//! `mandatory` names a key it does not carry is malformed and clients would
//! drop it), and goes when nothing else is left in it. Does not own the
//! ClientHello side: a client that brings its own ECH configuration meets
//! `settings.tls.missing_sni` in the proxy.

use hickory_proto::rr::rdata::svcb::{Mandatory, SvcParamKey, SvcParamValue, SVCB};
use hickory_proto::rr::{RData, Record};

/// Removes `ech` from the HTTPS and SVCB records in `records`; returns how
/// many records it changed.
pub(super) fn strip_ech(records: &mut [Record]) -> usize {
    let mut changed = 0;
    for r in records {
        let stripped = match &mut r.data {
            RData::HTTPS(h) => strip(&mut h.0),
            RData::SVCB(s) => strip(s),
            _ => false,
        };
        changed += stripped as usize;
    }
    changed
}

fn strip(s: &mut SVCB) -> bool {
    let before = s.svc_params.len();
    s.svc_params
        .retain(|(k, _)| *k != SvcParamKey::EchConfigList);
    if s.svc_params.len() == before {
        return false;
    }
    s.svc_params.retain_mut(|(_, v)| match v {
        SvcParamValue::Mandatory(Mandatory(keys)) => {
            keys.retain(|k| *k != SvcParamKey::EchConfigList);
            !keys.is_empty()
        }
        _ => true,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::svcb::{Alpn, EchConfigList, IpHint};
    use hickory_proto::rr::rdata::{A, HTTPS};
    use hickory_proto::rr::Name;

    fn svcb(params: Vec<(SvcParamKey, SvcParamValue)>) -> SVCB {
        SVCB::new(1, Name::root(), params)
    }

    fn alpn() -> (SvcParamKey, SvcParamValue) {
        (
            SvcParamKey::Alpn,
            SvcParamValue::Alpn(Alpn(vec!["h2".into(), "h3".into()])),
        )
    }

    fn ech() -> (SvcParamKey, SvcParamValue) {
        (
            SvcParamKey::EchConfigList,
            SvcParamValue::EchConfigList(EchConfigList(vec![0xfe, 0x0d, 0, 4, 1, 2, 3, 4])),
        )
    }

    fn hint() -> (SvcParamKey, SvcParamValue) {
        (
            SvcParamKey::Ipv4Hint,
            SvcParamValue::Ipv4Hint(IpHint(vec![A::new(192, 0, 2, 1)])),
        )
    }

    fn mandatory(keys: Vec<SvcParamKey>) -> (SvcParamKey, SvcParamValue) {
        (
            SvcParamKey::Mandatory,
            SvcParamValue::Mandatory(Mandatory(keys)),
        )
    }

    fn record(data: RData) -> Record {
        Record::from_rdata(Name::from_ascii("www.example.test.").unwrap(), 60, data)
    }

    #[test]
    fn ech_goes_and_everything_else_stays_in_order() {
        let mut rs = vec![
            record(RData::HTTPS(HTTPS(svcb(vec![alpn(), ech(), hint()])))),
            record(RData::SVCB(svcb(vec![ech(), alpn()]))),
            record(RData::HTTPS(HTTPS(svcb(vec![alpn(), hint()])))),
            record(RData::A(A::new(192, 0, 2, 1))),
        ];
        let untouched = rs[2..].to_vec();
        assert_eq!(strip_ech(&mut rs), 2);
        assert_eq!(rs[0].data, RData::HTTPS(HTTPS(svcb(vec![alpn(), hint()]))));
        assert_eq!(rs[1].data, RData::SVCB(svcb(vec![alpn()])));
        assert_eq!(&rs[2..], &untouched[..]);
    }

    #[test]
    fn mandatory_loses_ech_and_goes_when_empty() {
        let mut rs = vec![
            record(RData::HTTPS(HTTPS(svcb(vec![
                mandatory(vec![SvcParamKey::Alpn, SvcParamKey::EchConfigList]),
                alpn(),
                ech(),
            ])))),
            record(RData::HTTPS(HTTPS(svcb(vec![
                mandatory(vec![SvcParamKey::EchConfigList]),
                alpn(),
                ech(),
            ])))),
        ];
        assert_eq!(strip_ech(&mut rs), 2);
        assert_eq!(
            rs[0].data,
            RData::HTTPS(HTTPS(svcb(vec![
                mandatory(vec![SvcParamKey::Alpn]),
                alpn()
            ])))
        );
        assert_eq!(rs[1].data, RData::HTTPS(HTTPS(svcb(vec![alpn()]))));
    }

    #[test]
    fn a_record_without_ech_keeps_its_mandatory() {
        let params = vec![mandatory(vec![SvcParamKey::Alpn]), alpn()];
        let mut rs = vec![record(RData::SVCB(svcb(params.clone())))];
        assert_eq!(strip_ech(&mut rs), 0);
        assert_eq!(rs[0].data, RData::SVCB(svcb(params)));
    }
}
