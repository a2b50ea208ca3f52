//! The reconciler, driven by a scripted stream of files coming, changing
//! and going, over in-memory kernel tables. After every pass: no two
//! accepted peers' views overlap, the tables hold exactly what the
//! accepted objects describe, and a fresh reconciler (a restarted agent)
//! reading the same files writes nothing.
#![no_main]

use std::{cell::RefCell, collections::BTreeMap, convert::Infallible, rc::Rc};

use arbitrary::Arbitrary;
use ipnet::Ipv4Net;
use isthmus_agent::{
    control::reconcile::{Ipv6Tables, Reconciler},
    kernel::table::{Entry, KernelTable},
    model::{isolation::SecurityMode, object::parse_documents, policy::overlaps},
};
use isthmus_common::{
    isolation::AllowKey,
    nat::{MappingKey, NO_MAPPINGS, PeerNat},
    wire::Be32,
};
use isthmus_lab::objects::TunnelEndpoint;
use libfuzzer_sys::fuzz_target;

/// A kernel table stand-in, shared as the kernel's is by every agent.
struct Table<K, V>(Rc<RefCell<BTreeMap<K, V>>>);

impl<K, V> Clone for Table<K, V> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K: Ord + Copy, V: PartialEq + Copy> KernelTable for Table<K, V> {
    type Key = K;
    type Value = V;
    type Error = Infallible;
    fn entries(&self) -> Result<Vec<Entry<Self>>, Infallible> {
        Ok(self.0.borrow().iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn put(&mut self, key: K, value: &V, _old: Option<&V>) -> Result<(), Infallible> {
        self.0.borrow_mut().insert(key, *value);
        Ok(())
    }
    fn delete(&mut self, key: K, _old: &V) -> Result<(), Infallible> {
        self.0.borrow_mut().remove(&key);
        Ok(())
    }
    fn is_full(error: &Infallible) -> bool {
        match *error {}
    }
}

type Peers = Table<Ipv4Net, PeerNat>;
type Peers6 = Table<ipnet::Ipv6Net, PeerNat<isthmus_common::wire::Be128>>;
type Mappings = Table<MappingKey, Be32>;
type Mappings6 = Table<MappingKey<isthmus_common::wire::Be128>, isthmus_common::wire::Be128>;
type Allowed = Table<AllowKey, u8>;
type Allowed6 = Table<AllowKey<isthmus_common::wire::Be128>, u8>;

const NETS: [&str; 9] = [
    "10.0.0.0/24",
    "10.0.1.0/24",
    "10.0.0.0/16",
    "10.1.0.0/24",
    "10.0.0.128/25",
    "192.168.2.0/24",
    "172.16.1.0/24",
    "0.0.0.0/1",
    "None",
];
const ENDPOINTS: [&str; 4] = ["203.0.113.2", "203.0.113.3", "10.0.0.7", "198.51.100.1"];
const VALUES: [&str; 3] = ["10.0.41.45", "192.168.0.45", "10.0.41.46"];
/// IPv6 externalIPs, one of the wrong family.
const VALUES6: [&str; 3] = ["fd00:192:168::45", "fd00:10:0:41::45", "10.0.41.45"];

#[derive(Arbitrary, Debug)]
struct Tep {
    name: u8,
    pod: u8,
    external: u8,
    remapped: bool,
    endpoint: u8,
    key: u8,
    cluster: u8,
    created: Option<u8>,
}

#[derive(Arbitrary, Debug)]
struct Mapping {
    cluster: u8,
    entries: Vec<(bool, u8)>,
    ipv6: Option<Vec<(bool, u8)>>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Put {
        file: u8,
        peers: Vec<Tep>,
        mapping: Option<Mapping>,
    },
    Remove {
        file: u8,
    },
}

fn pick<'a>(pool: &[&'a str], i: u8) -> &'a str {
    pool[usize::from(i) % pool.len()]
}

fn tep_yaml(t: &Tep) -> String {
    let namespace = if t.name % 5 == 4 {
        "default"
    } else {
        "liqo-tenant-x"
    };
    let (pod, external) = (pick(&NETS, t.pod), pick(&NETS, t.external));
    let remote = match t.remapped {
        true => ["10.244.0.0/24", pod, "192.168.0.0/24", external],
        false => [pod, "None", external, "None"],
    };
    let key = ["AQ", "Ag", "Aw", "BA"][usize::from(t.key % 4)].to_owned() + &"A".repeat(41) + "=";
    let tep = TunnelEndpoint::new(&format!("t{}", t.name % 6), namespace)
        .cluster_id(&format!("c{}", t.cluster % 3))
        .local([
            "10.244.0.0/24",
            "10.0.40.0/24",
            "192.168.0.0/24",
            "10.0.41.0/24",
        ])
        .remote(remote)
        .endpoint(pick(&ENDPOINTS, t.endpoint))
        .public_key(&key);
    match t.created {
        Some(c) => tep.created(&format!("2024-05-{:02}T10:00:00Z", 1 + c % 28)),
        None => tep,
    }
    .to_string()
}

fn mapping_yaml(m: &Mapping) -> String {
    let mut yaml = format!(
        "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata: {{name: nm{}}}\nspec:\n  clusterID: c{}\n  clusterMappings:\n",
        m.cluster % 3,
        m.cluster % 3
    );
    for (second, value) in m.entries.iter().take(4) {
        let endpoint = if *second { "10.1.0.6" } else { "10.1.0.5" };
        yaml.push_str(&format!("    {endpoint}: {}\n", pick(&VALUES, *value)));
    }
    if let Some(entries) = &m.ipv6 {
        yaml.push_str("  ipv6:\n    clusterMappings:\n");
        for (second, value) in entries.iter().take(4) {
            let endpoint = if *second {
                "fd00:10:1::6"
            } else {
                "fd00:10:1::5"
            };
            yaml.push_str(&format!(
                "      '{endpoint}': '{}'\n",
                pick(&VALUES6, *value)
            ));
        }
    }
    yaml
}

fn feed<P, M, A, P6, M6, A6>(
    r: &mut Reconciler<P, M, A, P6, M6, A6>,
    files: &BTreeMap<String, String>,
) where
    P: isthmus_agent::kernel::table::PeerTable<Error = Infallible>,
    M: isthmus_agent::kernel::table::MappingTable<Error = Infallible>,
    A: isthmus_agent::kernel::table::AllowedTable<Error = Infallible>,
    P6: isthmus_agent::kernel::table::PeerTable6<Error = Infallible>,
    M6: isthmus_agent::kernel::table::MappingTable6<Error = Infallible>,
    A6: isthmus_agent::kernel::table::AllowedTable6<Error = Infallible>,
{
    for (file, text) in files {
        r.set_origin(file.clone(), parse_documents(file.as_ref(), text));
    }
}

/// The tables a reconciler writes, which a restarted one shares.
struct Tables {
    peers: Peers,
    peers6: Peers6,
    mappings: Mappings,
    mappings6: Mappings6,
    allowed: Allowed,
    allowed6: Allowed6,
}

/// A reconciler over `tables`.
fn reconciler(
    tables: &Tables,
) -> Reconciler<Peers, Mappings, Allowed, Peers6, Mappings6, Allowed6> {
    let ipv6 = Ipv6Tables {
        peers: tables.peers6.clone(),
        mappings: tables.mappings6.clone(),
        allowed: tables.allowed6.clone(),
    };
    Reconciler::dual_stack(
        tables.peers.clone(),
        tables.mappings.clone(),
        tables.allowed.clone(),
        ipv6,
    )
    .expect("infallible")
}

fuzz_target!(|ops: Vec<Op>| {
    let tables = Tables {
        peers: Table(Rc::default()),
        peers6: Table(Rc::default()),
        mappings: Table(Rc::default()),
        mappings6: Table(Rc::default()),
        allowed: Table(Rc::default()),
        allowed6: Table(Rc::default()),
    };
    let (peers, mappings) = (&tables.peers, &tables.mappings);
    let mut live = reconciler(&tables);
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for op in ops.into_iter().take(32) {
        match op {
            Op::Put {
                file,
                peers: teps,
                mapping,
            } => {
                let mut docs: Vec<String> = teps.iter().take(3).map(tep_yaml).collect();
                docs.extend(mapping.as_ref().map(mapping_yaml));
                let name = format!("f{}.yaml", file % 4);
                let text = docs.join("---\n");
                live.set_origin(name.clone(), parse_documents(name.as_ref(), &text));
                files.insert(name, text);
            }
            Op::Remove { file } => {
                let name = format!("f{}.yaml", file % 4);
                live.remove_origin(&name);
                files.remove(&name);
            }
        }
        let (_, failure) = live.reconcile();
        assert!(failure.is_none(), "an infallible table failed");
        let views: Vec<(Ipv4Net, PeerNat)> = live
            .peer_ids()
            .iter()
            .flat_map(|(id, p)| {
                p.views()
                    .map(|(_, net)| (net, p.nat(*id, SecurityMode::default())))
            })
            .collect();
        assert_eq!(
            views.len(),
            2 * live.peers().len(),
            "an accepted peer has no ID"
        );
        for (i, (a, _)) in views.iter().enumerate() {
            for (b, _) in &views[i + 1..] {
                assert!(!overlaps(*a, *b), "accepted views {a} and {b} overlap");
            }
        }
        let ids4 = mappings
            .0
            .borrow()
            .keys()
            .map(|k| k.peer_id)
            .collect::<Vec<_>>();
        // A peer without an entry in the IPv4 NatMapping table has its
        // IPv4 views marked so.
        let mut want: Vec<(Ipv4Net, PeerNat)> = (views.iter())
            .map(|(net, nat)| {
                let flags = match ids4.contains(&nat.peer_id) {
                    true => nat.flags,
                    false => nat.flags | NO_MAPPINGS,
                };
                (*net, PeerNat { flags, ..*nat })
            })
            .collect();
        want.sort_by_key(|(net, _)| *net);
        let table: Vec<(Ipv4Net, PeerNat)> =
            peers.0.borrow().iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            table, want,
            "the peer table is not what the accepted peers and their mappings say"
        );
        let ids6 = tables
            .mappings6
            .0
            .borrow()
            .keys()
            .map(|k| k.peer_id)
            .collect::<Vec<_>>();
        for peer_id in ids4.into_iter().chain(ids6) {
            assert!(
                views.iter().any(|(_, nat)| nat.peer_id == peer_id),
                "a mapping of no accepted peer"
            );
        }
        // A restarted agent reading the same files writes nothing.
        let mut restarted = reconciler(&tables);
        feed(&mut restarted, &files);
        let (report, _) = restarted.reconcile();
        assert_eq!(
            (
                report.written,
                report.removed,
                report.mappings_written,
                report.mappings_removed,
                report.allowed_written,
                report.allowed_removed,
            ),
            (0, 0, 0, 0, 0, 0),
            "a restart rewrote the tables"
        );
    }
});
