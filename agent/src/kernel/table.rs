//! The generic diff between what a kernel table should hold and what it
//! holds: every table the agent writes (peers, NatMappings, nodes, the
//! guard's allowlist) goes through [`Mirror`], so each pass writes only what
//! changed, and a restarted agent that wants the same entries writes nothing.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use crate::model::object::ObjectKind;
use crate::sync::Unpoisoned;
use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    isolation::AllowKey,
    nat::{MappingKey, PeerNat},
    wire::{Be32, Be128},
};

/// A kernel map the reconciler keeps in line with the objects: the peer
/// table, the NatMapping table, or a stand-in in tests.
pub trait KernelTable {
    /// What an entry is found by.
    type Key: Ord + Copy;
    /// What an entry holds.
    type Value: PartialEq + Copy;
    /// Failure of the underlying store.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every entry, as the store holds it now.
    fn entries(&self) -> Result<Vec<Entry<Self>>, Self::Error>;
    /// Inserts or replaces the entry for `key`.
    /// `old` is what the entry held, as the caller's mirror knows it: no
    /// store needs to read it back.
    fn put(
        &mut self,
        key: Self::Key,
        value: &Self::Value,
        old: Option<&Self::Value>,
    ) -> Result<(), Self::Error>;
    /// Removes the entry for `key`, which held `old`.
    fn delete(&mut self, key: Self::Key, old: &Self::Value) -> Result<(), Self::Error>;
    /// Whether `error` is a write refused because the store is full.
    fn is_full(error: &Self::Error) -> bool;
}

/// One entry of a table.
pub type Entry<T> = (<T as KernelTable>::Key, <T as KernelTable>::Value);

/// A borrowed table is a table, so a caller can keep it after the reconciler.
impl<T: KernelTable> KernelTable for &mut T {
    type Key = T::Key;
    type Value = T::Value;
    type Error = T::Error;
    fn entries(&self) -> Result<Vec<Entry<T>>, T::Error> {
        (**self).entries()
    }
    fn put(
        &mut self,
        key: T::Key,
        value: &T::Value,
        old: Option<&T::Value>,
    ) -> Result<(), T::Error> {
        (**self).put(key, value, old)
    }
    fn delete(&mut self, key: T::Key, old: &T::Value) -> Result<(), T::Error> {
        (**self).delete(key, old)
    }
    fn is_full(error: &T::Error) -> bool {
        T::is_full(error)
    }
}

/// A table behind a lock is a table, so a reader can watch it while a
/// reconciler on another thread writes it.
impl<T: KernelTable> KernelTable for Arc<Mutex<T>> {
    type Key = T::Key;
    type Value = T::Value;
    type Error = T::Error;
    fn entries(&self) -> Result<Vec<Entry<T>>, T::Error> {
        self.lock().unpoisoned().entries()
    }
    fn put(
        &mut self,
        key: T::Key,
        value: &T::Value,
        old: Option<&T::Value>,
    ) -> Result<(), T::Error> {
        self.lock().unpoisoned().put(key, value, old)
    }
    fn delete(&mut self, key: T::Key, old: &T::Value) -> Result<(), T::Error> {
        self.lock().unpoisoned().delete(key, old)
    }
    fn is_full(error: &T::Error) -> bool {
        T::is_full(error)
    }
}

/// A table in memory: what `check` programs instead of the kernel, and
/// the tests' stand-in. It counts every write, so that a diff shows, and
/// refuses new entries beyond `capacity`, as a full map does.
#[derive(Debug)]
pub struct MemoryTable<K, V> {
    /// What it holds.
    pub entries: BTreeMap<K, V>,
    /// Entries written or removed so far.
    pub writes: usize,
    /// The most entries it takes.
    pub capacity: usize,
}

impl<K, V> Default for MemoryTable<K, V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            writes: 0,
            capacity: usize::MAX,
        }
    }
}

impl<K: Ord + Copy, V: PartialEq + Copy> KernelTable for MemoryTable<K, V> {
    type Key = K;
    type Value = V;
    type Error = std::io::Error;
    fn entries(&self) -> std::io::Result<Vec<(K, V)>> {
        Ok(self.entries.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn put(&mut self, key: K, value: &V, _old: Option<&V>) -> std::io::Result<()> {
        if !self.entries.contains_key(&key) && self.entries.len() == self.capacity {
            return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
        }
        self.entries.insert(key, *value);
        self.writes += 1;
        Ok(())
    }
    fn delete(&mut self, key: K, _old: &V) -> std::io::Result<()> {
        self.entries.remove(&key);
        self.writes += 1;
        Ok(())
    }
    fn is_full(error: &std::io::Error) -> bool {
        error.raw_os_error() == Some(libc::E2BIG)
    }
}

/// The peer table: a peer's network as we see it → its rules.
pub trait PeerTable: KernelTable<Key = Ipv4Net, Value = PeerNat> {}
impl<T: KernelTable<Key = Ipv4Net, Value = PeerNat>> PeerTable for T {}

/// The IPv6 peer table, or a stand-in: IPv6 view → rules.
pub trait PeerTable6: KernelTable<Key = Ipv6Net, Value = PeerNat<Be128>> {}
impl<T: KernelTable<Key = Ipv6Net, Value = PeerNat<Be128>>> PeerTable6 for T {}

/// The NatMapping table: (peer, externalIP) → endpointIP.
pub trait MappingTable: KernelTable<Key = MappingKey, Value = Be32> {}
impl<T: KernelTable<Key = MappingKey, Value = Be32>> MappingTable for T {}

/// The IPv6 NatMapping table, or a stand-in: (peer, externalIP) →
/// endpointIP.
pub trait MappingTable6: KernelTable<Key = MappingKey<Be128>, Value = Be128> {}
impl<T: KernelTable<Key = MappingKey<Be128>, Value = Be128>> MappingTable6 for T {}

/// The allowed table: what segregated peers may open connections to.
pub trait AllowedTable: KernelTable<Key = AllowKey, Value = u8> {}
impl<T: KernelTable<Key = AllowKey, Value = u8>> AllowedTable for T {}

/// The IPv6 allowed table, or a stand-in.
pub trait AllowedTable6: KernelTable<Key = AllowKey<Be128>, Value = u8> {}
impl<T: KernelTable<Key = AllowKey<Be128>, Value = u8>> AllowedTable6 for T {}

/// A kernel table and a mirror of what it holds, so that a pass writes
/// only what changed.
pub(crate) struct Mirror<T: KernelTable> {
    table: T,
    applied: BTreeMap<T::Key, T::Value>,
}

impl<T: KernelTable> Mirror<T> {
    pub(crate) fn new(table: T) -> Result<Self, T::Error> {
        let applied = table.entries()?.into_iter().collect();
        Ok(Self { table, applied })
    }

    /// Writes new and changed entries, then removes stale ones: longest-prefix
    /// match keeps traffic flowing while both exist. A failed write (a full
    /// map) does not stop the others, and is retried on the next pass; the
    /// first failure is returned once everything was tried.
    pub(crate) fn apply(
        &mut self,
        desired: &BTreeMap<T::Key, T::Value>,
    ) -> (usize, usize, Option<T::Error>) {
        let (mut written, mut removed, mut failure) = (0, 0, None);
        // One walk along both sorted maps finds what changed: a pass on
        // every object change compares tables of tens of thousands.
        let (mut changed, mut stale) = (Vec::new(), Vec::new());
        let mut held = self.applied.iter().peekable();
        for (key, value) in desired {
            while let Some((old_key, old)) = held.next_if(|(old_key, _)| *old_key < key) {
                stale.push((*old_key, *old));
            }
            match held.next_if(|(old_key, _)| *old_key == key) {
                Some((_, old)) if old == value => {}
                old => changed.push((*key, *value, old.map(|(_, old)| *old))),
            }
        }
        stale.extend(held.map(|(key, value)| (*key, *value)));
        for (key, value, old) in changed {
            match self.table.put(key, &value, old.as_ref()) {
                Ok(()) => {
                    self.applied.insert(key, value);
                    written += 1;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        for (key, old) in stale {
            match self.table.delete(key, &old) {
                Ok(()) => {
                    self.applied.remove(&key);
                    removed += 1;
                }
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        (written, removed, failure)
    }

    /// What the table holds, as far as this agent knows.
    pub(crate) fn applied(&self) -> &BTreeMap<T::Key, T::Value> {
        &self.applied
    }
}

/// A kernel table a reconcile pass could not bring up to date; the next
/// pass tries again.
#[derive(Debug, thiserror::Error)]
#[error("the {kind} table: {source}")]
pub struct TableFailure<E: std::error::Error + 'static> {
    /// The kind of object whose table failed (Pod for the allowed table,
    /// which Pods and EndpointSlices feed).
    pub kind: ObjectKind,
    /// Whether the table refused a write because it is full.
    pub full: bool,
    /// What the kernel said.
    #[source]
    pub source: E,
}
