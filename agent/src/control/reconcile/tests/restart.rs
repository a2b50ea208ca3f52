//! Restarts that meet the objects a previous agent arbitrated: the kernel
//! says which object each view was written for, so the restarted agent
//! keeps its predecessor's choice between peers that claim the same
//! networks, and writes nothing. The cases the reconciler fuzz target
//! found are here in its shapes.

use super::*;

/// The fuzz target's TunnelEndpoint: our networks as it writes them, the
/// peer's `views` remapped or not, its tunnel (`key` a repeated byte).
fn fuzz_tep(
    name: &str,
    views: (&str, &str),
    remapped: bool,
    tunnel: (&str, u8),
    cluster: &str,
) -> String {
    let remote = match remapped {
        true => ["10.244.0.0/24", views.0, "192.168.0.0/24", views.1],
        false => [views.0, "None", views.1, "None"],
    };
    TunnelEndpoint::new(name, "liqo-tenant-x")
        .cluster_id(cluster)
        .local([
            "10.244.0.0/24",
            "10.0.40.0/24",
            "192.168.0.0/24",
            "10.0.41.0/24",
        ])
        .remote(remote)
        .endpoint(tunnel.0)
        .public_key(&crate::model::key_text::encode(&[tunnel.1; 32]))
        .to_string()
}

/// The names of the peers `r` accepted, with their origins.
fn accepted(r: &Reconciler<&mut Peers, &mut Mappings>) -> Vec<(String, String)> {
    r.peers()
        .iter()
        .map(|p| (p.origin.clone(), p.key.name.clone()))
        .collect()
}

/// Feeds `files` to a live agent one by one, then to a restarted one all
/// at once; returns what each accepted, and checks the restart wrote
/// nothing.
fn live_then_restart(files: &[(&str, String)]) -> [Vec<(String, String)>; 2] {
    live_then_restart_reading(files, files.iter())
}

/// As [`live_then_restart`], the restarted agent reading the files in the
/// order `restart` gives.
fn live_then_restart_reading<'a>(
    files: &[(&str, String)],
    restart: impl Iterator<Item = &'a (&'a str, String)>,
) -> [Vec<(String, String)>; 2] {
    let (mut peers, mut mappings) = (Peers::default(), Mappings::default());
    let live = {
        let mut r =
            Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
        for (file, yaml) in files {
            r.set_origin((*file).into(), docs(file, yaml));
            r.reconcile();
        }
        accepted(&r)
    };
    let mut r = Reconciler::new(&mut peers, &mut mappings, MemoryAllowedTable::default()).unwrap();
    for (file, yaml) in restart {
        r.set_origin((*file).into(), docs(file, yaml));
    }
    let report = r.reconcile().0;
    let writes = (
        report.written,
        report.removed,
        report.mappings_written,
        report.mappings_removed,
    );
    assert_eq!(writes, (0, 0, 0, 0), "a restart rewrote the tables");
    [live, accepted(&r)]
}

/// A twin of the senior peer (same views, another file that sorts first)
/// would, if it won the restart, free a third peer the senior one blocks
/// by its key: that peer's views would be written.
#[test]
fn a_twin_that_would_free_a_blocked_peer_does_not_win_a_restart() {
    let senior = fuzz_tep(
        "t1",
        ("10.0.0.0/24", "10.0.1.0/24"),
        true,
        ("198.51.100.1", 3),
        "c1",
    );
    let swapped = fuzz_tep(
        "t5",
        ("10.0.1.0/24", "10.0.0.0/24"),
        false,
        ("203.0.113.2", 1),
        "c0",
    );
    let same_key = fuzz_tep(
        "t0",
        ("192.168.2.0/24", "10.1.0.0/24"),
        true,
        ("198.51.100.1", 3),
        "c2",
    );
    let twin = fuzz_tep(
        "t5",
        ("10.0.0.0/24", "10.0.1.0/24"),
        false,
        ("203.0.113.2", 1),
        "c0",
    );
    let [live, restarted] = live_then_restart(&[
        ("f1.yaml", format!("{senior}---\n{swapped}")),
        ("f0.yaml", format!("{same_key}---\n{twin}")),
    ]);
    assert_eq!(live, [("f1.yaml".to_owned(), "t1".to_owned())]);
    assert_eq!(restarted, live);
}

/// Two objects named t3 with the same views: the first's endpoint,
/// 10.0.0.7, lies in 10.0.0.0/24, the second's does not.
fn t3_twice() -> (String, String) {
    let t3 = |endpoint, cluster| {
        fuzz_tep(
            "t3",
            ("10.244.0.0/24", "10.1.0.0/24"),
            false,
            (endpoint, 1),
            cluster,
        )
    };
    (t3("10.0.0.7", "c2"), t3("203.0.113.2", "c1"))
}

/// A NatMapping whose only entry lies outside our ExternalCIDR writes
/// nothing: its peer held no entries, like a peer with no NatMapping, and
/// must still win over the peer it blocked by its endpoint. That peer's
/// twin of the same name is its duplicate, refused too: only the first
/// object of a name may stand, accepted or not.
#[test]
fn a_natmapping_that_wrote_nothing_does_not_demote_its_peer_on_restart() {
    let mapped = fuzz_tep(
        "t1",
        ("10.0.1.0/24", "10.0.0.0/24"),
        true,
        ("198.51.100.1", 3),
        "c0",
    );
    let (under, twin) = t3_twice();
    let outside = natmapping("c0", &[("10.1.0.6".into(), "192.168.0.45".into())]);
    let [live, restarted] = live_then_restart(&[(
        "f1.yaml",
        format!("{mapped}---\n{under}---\n{twin}---\n{outside}"),
    )]);
    assert_eq!(live, [("f1.yaml".to_owned(), "t1".to_owned())]);
    assert_eq!(restarted, live);
}

/// Two objects of one name in a file, the first refused for its endpoint
/// in a senior peer's view: the second is its duplicate whatever the
/// agent accepted before, so a restarted agent keeps the same peers (a
/// case the reconciler's fuzz target found).
#[test]
fn the_second_object_of_a_name_stays_a_duplicate_when_the_first_is_refused() {
    let senior = fuzz_tep(
        "t5",
        ("10.0.1.0/24", "10.0.0.0/24"),
        false,
        ("203.0.113.2", 2),
        "c0",
    );
    let (hidden, twin) = t3_twice();
    let [live, restarted] = live_then_restart(&[
        ("f1.yaml", senior),
        ("f0.yaml", format!("{hidden}---\n{twin}")),
    ]);
    assert_eq!(live, [("f1.yaml".to_owned(), "t5".to_owned())]);
    assert_eq!(restarted, live);
}

/// Twins: two peers with the same views, neither created by the API server,
/// one with NatMapping entries. A restart that meets the files the other
/// way round keeps the one the first agent accepted, and writes nothing.
#[test]
fn a_restart_keeps_the_twin_its_predecessor_accepted() {
    let twin = |name: &str, cluster: &str| {
        peer(name, "10.0.0.0/24", "10.0.1.0/24")
            .cluster_id(cluster)
            .to_string()
    };
    let entry = [("10.1.0.5".to_owned(), "192.168.0.45".to_owned())];
    let files = [
        (
            "z-mapped.yaml",
            format!(
                "{}---\n{}",
                twin("m", "cluster-m"),
                natmapping("cluster-m", &entry)
            ),
        ),
        ("a-plain.yaml", twin("p", "cluster-p")),
    ];
    let [live, restarted] = live_then_restart_reading(&files, files.iter().rev());
    let winner = |accepted: &[(String, String)]| accepted[0].1.clone();
    assert_eq!(winner(&live), "m", "the first to arrive wins");
    assert_eq!(winner(&restarted), "m");
}
