//! `isthmus-agent check`: validates a directory of objects exactly as `run`
//! would, against tables in memory, and says what it would program and
//! what it would reject. It needs no root and no kernel, so operators run it
//! before applying objects, and tests run it on Liqo's shapes.

use std::net::Ipv4Addr;

use ipnet::{Ipv4Net, Ipv6Net};
use isthmus_common::{
    nat::{MappingKey, PeerNat},
    wire::Be32,
};

use crate::{
    commands::policy::PolicyArgs,
    control::{
        reconcile::{MemoryAllowedTable, Reconciler},
        source::{self, SourceEvent, SourceSpec},
    },
    kernel::table::MemoryTable,
    model::{
        peer::{Endpoint, Peer},
        policy::Policy,
        rejection::Rejection,
    },
    observe::inspect::Table,
};

/// `isthmus-agent check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// Where the objects are: `dir:PATH`.
    #[arg(long)]
    pub source: SourceSpec,
    /// One JSON object instead of aligned tables.
    #[arg(long)]
    pub json: bool,
    /// What objects may ask of this node.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// What `run` would do with a set of objects.
#[derive(Debug)]
pub struct Verdict {
    /// One row per accepted peer: its object, where it came from, the
    /// layout read, its views, ours as it sees them, and its endpoint.
    pub peers: Table,
    /// One row per NatMapping entry programmed.
    pub mappings: Table,
    /// One row per rejection, naming the file, the object and the field.
    pub rejected: Table,
}

impl Verdict {
    /// Whether anything was rejected (or held).
    pub fn clean(&self) -> bool {
        self.rejected.rows.is_empty()
    }

    /// The three tables, aligned, under headings.
    pub fn text(&self) -> String {
        let section = |title: &str, table: &Table| match table.rows.is_empty() {
            true => format!("{title}: none\n"),
            false => format!("{title}:\n{}", table.aligned()),
        };
        [
            section("peers", &self.peers),
            section("NatMapping entries", &self.mappings),
            section("rejected", &self.rejected),
        ]
        .join("\n")
    }

    /// The three tables as one JSON object of arrays.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "peers": self.peers.json(),
            "natMappings": self.mappings.json(),
            "rejected": self.rejected.json(),
        })
    }
}

/// Validates the objects of `events` (as the directory source reads them)
/// under `policy`.
/// `isthmus-agent check`: prints the verdict on `args.source`. Returns
/// whether it is clean. The machine it runs on is not a gateway, so its own
/// addresses are not protected.
pub fn run(args: &CheckArgs) -> anyhow::Result<bool> {
    let SourceSpec::Dir(dir) = &args.source else {
        anyhow::bail!("check reads --source dir:PATH only");
    };
    let verdict = check(source::read_dir(dir)?, args.policy.policy_with(&[]));
    match args.json {
        true => println!("{}", serde_json::to_string_pretty(&verdict.json())?),
        false => print!("{}", verdict.text()),
    }
    Ok(verdict.clean())
}

/// What `run` would do with `events`, under `policy`.
pub fn check(events: Vec<SourceEvent>, policy: Policy) -> Verdict {
    let mut reconciler = Reconciler::new(
        MemoryTable::<Ipv4Net, PeerNat>::default(),
        MemoryTable::<MappingKey, Be32>::default(),
        MemoryAllowedTable::default(),
    )
    .expect("a table in memory always reads");
    reconciler.set_policy(policy);
    for event in events {
        if let SourceEvent::Origin { origin, documents } = event {
            reconciler.set_origin(origin, documents);
        }
    }
    let (report, _) = reconciler.reconcile();
    let peers = reconciler.peer_ids();
    Verdict {
        peers: peer_table(peers.iter().map(|(_, p)| *p)),
        mappings: mapping_table(&peers, &reconciler.mapping_entries()),
        rejected: rejection_table(&report.new_errors),
    }
}

fn peer_table<'p>(peers: impl Iterator<Item = &'p Peer>) -> Table {
    let rows = peers
        .map(|p| {
            // Both families in one column, IPv6 after IPv4.
            let fields = |ipv4: [(&str, Ipv4Net); 2], ipv6: Option<[(&str, Ipv6Net); 2]>| {
                let ipv4 = ipv4.iter().map(|(f, n)| format!("{f}={n}"));
                let ipv6 = ipv6.into_iter().flatten().map(|(f, n)| format!("{f}={n}"));
                ipv4.chain(ipv6).collect::<Vec<_>>().join(" ")
            };
            let ipv6 = p.ipv6.as_ref();
            let endpoint = match &p.tunnel {
                Ok(t) if t.endpoint == Endpoint::Learned => {
                    format!("learned: the peer makes contact on port {}", t.port)
                }
                Ok(t) => format!("{}:{}", t.endpoint, t.port),
                Err(field) => format!("none ({field} missing)"),
            };
            vec![
                p.key.to_string(),
                p.origin.clone(),
                p.layout.to_string(),
                p.label().to_owned(),
                fields(p.views(), ipv6.map(|n| n.views(p.layout))),
                fields(p.local_views(), ipv6.map(|n| n.local_views(p.layout))),
                endpoint,
            ]
        })
        .collect();
    Table {
        columns: vec![
            "object",
            "file",
            "layout",
            "cluster",
            "views",
            "ours_seen_as",
            "endpoint",
        ],
        rows,
    }
}

fn mapping_table(peers: &[(u32, &Peer)], entries: &[(MappingKey, Be32)]) -> Table {
    let rows = entries
        .iter()
        .filter_map(|(key, endpoint)| {
            let (_, peer) = peers.iter().find(|(id, _)| *id == key.peer_id)?;
            let real = Ipv4Addr::from(key.addr);
            let seen = peer.ipv4.local_external.seen_of(real)?;
            Some(vec![
                peer.label().to_owned(),
                seen.to_string(),
                Ipv4Addr::from(*endpoint).to_string(),
                real.to_string(),
            ])
        })
        .collect();
    Table {
        columns: vec!["cluster", "external_ip", "endpoint_ip", "kernel_key"],
        rows,
    }
}

fn rejection_table(rejections: &[Rejection]) -> Table {
    let rows = rejections
        .iter()
        .map(|r| {
            let (kind, object) = r.kind_and_key();
            vec![kind.to_owned(), object, r.message.clone()]
        })
        .collect();
    Table {
        columns: vec!["kind", "object", "error"],
        rows,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use isthmus_lab::objects::TunnelEndpoint;

    use super::*;
    use crate::model::object::parse_documents;

    #[test]
    fn a_dual_stack_peer_shows_both_families_of_its_networks() {
        let yaml = TunnelEndpoint::new("b", "liqo-tenant-b")
            .cluster_id("cluster-b")
            .remote(["10.1.0.0/24", "10.0.0.0/24", "192.168.2.0/24", "None"])
            .ipv6(
                ["fd00:10:244::/64", "None", "fd00:192:168::/64", "None"],
                [
                    "fd00:10:1::/64",
                    "fd00:10::/64",
                    "fd00:192:168:2::/64",
                    "None",
                ],
            )
            .to_string();
        let events = vec![SourceEvent::Origin {
            origin: "b.yaml".into(),
            documents: parse_documents(Path::new("b.yaml"), &yaml),
        }];
        let verdict = check(events, Policy::default());
        assert!(verdict.clean(), "{}", verdict.text());
        let row = &verdict.peers.rows[0];
        assert_eq!(
            row[4],
            "remoteNATPodCIDR=10.0.0.0/24 remoteExternalCIDR=192.168.2.0/24 \
             ipv6.remoteNATPodCIDR=fd00:10::/64 ipv6.remoteExternalCIDR=fd00:192:168:2::/64"
        );
        assert_eq!(
            row[5],
            "localPodCIDR=10.244.0.0/24 localExternalCIDR=192.168.0.0/24 \
             ipv6.localPodCIDR=fd00:10:244::/64 ipv6.localExternalCIDR=fd00:192:168::/64"
        );
    }
}
