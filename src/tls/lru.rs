//! A small bounded map that forgets the least recently used entry when
//! full. Eviction scans the map (O(n)); it only happens when a new entry is
//! made, which for the users here (a minted certificate, a new origin) costs
//! far more than the scan at the capacities used.

use std::collections::HashMap;
use std::hash::Hash;

pub struct Lru<K, V> {
    map: HashMap<K, (V, u64)>,
    tick: u64,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// A map holding at most `capacity` (at least 1) entries.
    pub fn new(capacity: usize) -> Lru<K, V> {
        Lru {
            map: HashMap::new(),
            tick: 0,
            capacity: capacity.max(1),
        }
    }

    pub fn get(&mut self, k: &K) -> Option<&V> {
        self.tick += 1;
        let tick = self.tick;
        self.map.get_mut(k).map(|(v, t)| {
            *t = tick;
            &*v
        })
    }

    /// Inserts or replaces `k`, evicting the least recently used entry if
    /// the map is full.
    pub fn insert(&mut self, k: K, v: V) {
        self.tick += 1;
        if !self.map.contains_key(&k) && self.map.len() >= self.capacity {
            if let Some(old) = self
                .map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
            {
                self.map.remove(&old);
            }
        }
        self.map.insert(k, (v, self.tick));
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        self.map.remove(k).map(|(v, _)| v)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut l = Lru::new(2);
        l.insert("a", 1);
        l.insert("b", 2);
        assert_eq!(l.get(&"a"), Some(&1));
        l.insert("c", 3);
        assert_eq!(l.len(), 2);
        assert!(l.get(&"b").is_none(), "b was least recently used");
        assert_eq!(l.get(&"a"), Some(&1));
        assert_eq!(l.get(&"c"), Some(&3));
        l.insert("c", 4);
        assert_eq!(l.len(), 2);
        assert_eq!(l.get(&"c"), Some(&4));
    }
}
