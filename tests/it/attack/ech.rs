//! Encrypted Client Hello (issue 14, DESIGN "ECH"): a client given an ECH
//! configuration could hide the server name the proxy checks. The resolver
//! strips `ech` from HTTPS and SVCB answers; every other parameter reaches
//! the client as the upstream sent it.

use hickory_proto::rr::rdata::svcb::{
    Alpn, EchConfigList, IpHint, Mandatory, SvcParamKey, SvcParamValue, Unknown, SVCB,
};
use hickory_proto::rr::rdata::{A, AAAA, HTTPS};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

use super::*;

fn ech() -> (SvcParamKey, SvcParamValue) {
    (
        SvcParamKey::EchConfigList,
        SvcParamValue::EchConfigList(EchConfigList(b"\xfe\x0d\x00\x06public".to_vec())),
    )
}

/// What an upstream serves for `www.ech.test`, `ech` included.
fn served(mandatory: bool) -> Vec<(SvcParamKey, SvcParamValue)> {
    let mut p = Vec::new();
    if mandatory {
        p.push((
            SvcParamKey::Mandatory,
            SvcParamValue::Mandatory(Mandatory(vec![
                SvcParamKey::Alpn,
                SvcParamKey::EchConfigList,
            ])),
        ));
    }
    p.extend([
        (
            SvcParamKey::Alpn,
            SvcParamValue::Alpn(Alpn(vec!["h3".into(), "h2".into()])),
        ),
        (SvcParamKey::Port, SvcParamValue::Port(8443)),
        (
            SvcParamKey::Ipv4Hint,
            SvcParamValue::Ipv4Hint(IpHint(vec![A::new(1, 1, 1, 1)])),
        ),
        ech(),
        (
            SvcParamKey::Ipv6Hint,
            SvcParamValue::Ipv6Hint(IpHint(vec![AAAA::new(
                0x2606, 0x4700, 0, 0, 0, 0, 0, 0x1111,
            )])),
        ),
        (
            SvcParamKey::from(65001),
            SvcParamValue::Unknown(Unknown(b"opaque".to_vec())),
        ),
    ]);
    p
}

/// `served` as the client must get it: no `ech`, and no `ech` in `mandatory`.
fn expected(mandatory: bool) -> Vec<(SvcParamKey, SvcParamValue)> {
    served(mandatory)
        .into_iter()
        .filter(|(k, _)| *k != SvcParamKey::EchConfigList)
        .map(|(k, v)| match v {
            SvcParamValue::Mandatory(Mandatory(keys)) => (
                k,
                SvcParamValue::Mandatory(Mandatory(
                    keys.into_iter()
                        .filter(|k| *k != SvcParamKey::EchConfigList)
                        .collect(),
                )),
            ),
            v => (k, v),
        })
        .collect()
}

fn params_of(r: &Message) -> Vec<Vec<(SvcParamKey, SvcParamValue)>> {
    r.answers
        .iter()
        .filter_map(|a| match &a.data {
            RData::HTTPS(h) => Some(h.0.svc_params.clone()),
            RData::SVCB(s) => Some(s.svc_params.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn ech_is_stripped_from_https_and_svcb_answers() {
    let up = scripted_dns(|q, _tcp| {
        let mut m = response_to(q);
        let owner = format!("{}.", qname(q));
        match q.queries[0].query_type() {
            RecordType::HTTPS => {
                m.add_answer(rr(
                    &owner,
                    RData::HTTPS(HTTPS(SVCB::new(1, Name::root(), served(false)))),
                ));
                // A second endpoint whose `mandatory` names `ech`.
                m.add_answer(rr(
                    &owner,
                    RData::HTTPS(HTTPS(SVCB::new(2, name("alt.ech.test"), served(true)))),
                ));
            }
            RecordType::SVCB => {
                m.add_answer(rr(
                    &owner,
                    RData::SVCB(SVCB::new(1, name("svc.ech.test"), served(true))),
                ));
            }
            _ => {}
        }
        DnsAct::Answer(m)
    });
    let e = egressd()
        .policy(
            "p.yaml",
            "exceptions:\n  - { id: ech, owner: o, reason: r, hosts: [\"*.ech.test\"] }\n",
        )
        .dns(up.addr)
        .start();

    let https = || vec![expected(false), expected(true)];
    for (how, r) in [
        (
            "UDP",
            ask_udp(e.dns, &dns_query("www.ech.test", RecordType::HTTPS)),
        ),
        (
            "UDP, cached",
            ask_udp(e.dns, &dns_query("www.ech.test", RecordType::HTTPS)),
        ),
        (
            "TCP",
            ask_tcp(e.dns, &dns_query("www.ech.test", RecordType::HTTPS)),
        ),
    ] {
        assert_eq!(r.metadata.response_code, ResponseCode::NoError, "{how}");
        assert_eq!(params_of(&r), https(), "{how}");
    }
    let r = ask_udp(e.dns, &dns_query("svc.ech.test", RecordType::SVCB));
    assert_eq!(params_of(&r), vec![expected(true)]);
    // The upstream really sent `ech` (so the test can fail), once per name.
    assert!(served(false).contains(&ech()));
    assert_eq!((up.count("www.ech.test"), up.count("svc.ech.test")), (1, 1));
}
