//! `isthmus-agent check`: validates a directory of objects exactly as `run`
//! would, against tables in memory, and says what it would program and
//! what it would reject. It needs no root and no kernel, so operators run it
//! before applying objects, and tests run it on Liqo's shapes.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
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
            let fields =
                |views: [(&str, Ipv4Net); 2]| views.map(|(f, n)| format!("{f}={n}")).join(" ");
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
                fields(p.views()),
                fields(p.local_views()),
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
            let seen = peer.local_external.seen_of(real)?;
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
