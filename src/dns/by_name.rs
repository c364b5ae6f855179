//! A table of values per (name, record type), shared by the resolver's
//! answer cache and its failure memory: by name, then the name's few types,
//! so a lookup by `&Host` allocates nothing; it counts its entries, which
//! both bound.

use std::collections::HashMap;

use crate::policy::host::Host;

pub(super) struct ByNameType<V> {
    map: HashMap<Host, Vec<(u16, V)>>,
    len: usize,
}

impl<V> Default for ByNameType<V> {
    fn default() -> Self {
        ByNameType {
            map: HashMap::new(),
            len: 0,
        }
    }
}

impl<V> ByNameType<V> {
    /// Entries, every type of every name counted.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, host: &Host, qtype: u16) -> Option<&V> {
        let slots = self.map.get(host)?;
        slots.iter().find(|(t, _)| *t == qtype).map(|(_, v)| v)
    }

    /// Sets the value for `host`/`qtype`, replacing one there was; the
    /// name is copied only when it is new to the table.
    pub(super) fn insert(&mut self, host: &Host, qtype: u16, value: V) {
        if let Some(slots) = self.map.get_mut(host) {
            if let Some(slot) = slots.iter_mut().find(|(t, _)| *t == qtype) {
                slot.1 = value;
                return;
            }
            slots.push((qtype, value));
        } else {
            self.map.insert(host.clone(), vec![(qtype, value)]);
        }
        self.len += 1;
    }

    pub(super) fn remove(&mut self, host: &Host, qtype: u16) {
        let Some(slots) = self.map.get_mut(host) else {
            return;
        };
        let before = slots.len();
        slots.retain(|(t, _)| *t != qtype);
        self.len -= before - slots.len();
        if slots.is_empty() {
            self.map.remove(host);
        }
    }

    /// Keeps only the entries `keep` accepts.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        let mut removed = 0;
        self.map.retain(|_, slots| {
            let before = slots.len();
            slots.retain(|(_, v)| keep(v));
            removed += before - slots.len();
            !slots.is_empty()
        });
        self.len -= removed;
    }

    /// Drops whole names, in no particular order, until at least `n`
    /// entries are gone (or none is left).
    pub(super) fn shed(&mut self, n: usize) {
        let mut left = n;
        let mut removed = 0;
        self.map.retain(|_, slots| {
            if left == 0 {
                return true;
            }
            left = left.saturating_sub(slots.len());
            removed += slots.len();
            false
        });
        self.len -= removed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::host::parse_host;

    #[test]
    fn entries_are_counted_through_every_change() {
        let mut m = ByNameType::default();
        let (a, b) = (parse_host("a.test").unwrap(), parse_host("b.test").unwrap());
        m.insert(&a, 1, "a1");
        m.insert(&a, 28, "a28");
        m.insert(&a, 1, "a1 again");
        m.insert(&b, 1, "b1");
        assert_eq!(m.len(), 3);
        assert_eq!(m.get(&a, 1), Some(&"a1 again"));
        assert_eq!(m.get(&a, 5), None);
        m.remove(&a, 28);
        m.remove(&a, 28);
        assert_eq!((m.len(), m.get(&a, 28)), (2, None));
        m.retain(|v| v.starts_with('b'));
        assert_eq!(
            (m.len(), m.get(&a, 1), m.get(&b, 1)),
            (1, None, Some(&"b1"))
        );
        for i in 0..10 {
            m.insert(&parse_host(&format!("n{i}.test")).unwrap(), 1, "n");
        }
        m.shed(4);
        assert!((4..=7).contains(&(11 - m.len())), "{}", m.len());
        m.shed(usize::MAX);
        assert_eq!(m.len(), 0);
    }
}
