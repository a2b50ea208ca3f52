//! The agent's run loop in-process: a directory source, Liqo's exact object
//! shapes, and kernel tables in memory that the test reads while the loop
//! writes them. No root, no kernel.

use std::{
    collections::BTreeSet,
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::Duration,
};

use ipnet::Ipv4Net;
use isthmus_agent::{
    control::{
        reconcile::{MemoryAllowedTable, Reconciler},
        run::{Host, RunLoop},
        source,
    },
    kernel::table::MemoryTable,
    model::{node::Node, object::ObjectKind, policy::Policy},
    observe::metrics::{BuildInfo, Metrics},
};
use isthmus_common::{
    nat::{MappingKey, PeerNat},
    wire::Be32,
};
use isthmus_tests::eventually;
use tokio::sync::oneshot;

/// Long enough for a loaded machine; a broken loop fails instead of hanging.
const GIVE_UP: Duration = Duration::from_secs(20);

/// A table in memory that the test reads, and resizes, while the loop
/// writes it.
type Shared<K, V> = Arc<Mutex<MemoryTable<K, V>>>;

fn shared<K, V>(capacity: usize) -> Shared<K, V> {
    Arc::new(Mutex::new(MemoryTable {
        capacity,
        ..MemoryTable::default()
    }))
}

fn keys<K: Copy + Ord, V>(table: &Shared<K, V>) -> BTreeSet<K> {
    table.lock().unwrap().entries.keys().copied().collect()
}

/// A node with no devices to follow, no overlay, and Liqo's default policy.
struct NoDevices;

impl Host for NoDevices {
    fn refresh_devices(&mut self) {}
    fn sync_nodes(&mut self, _nodes: &[Node], _active: Option<&str>) -> bool {
        true
    }
    fn policy(&self) -> Policy {
        Policy::default()
    }
}

type Peers = Shared<Ipv4Net, PeerNat>;
type Mappings = Shared<MappingKey, Be32>;

/// The loop, running on a thread of its own until `stop` is sent.
struct Running {
    metrics: Arc<Metrics>,
    peers: Peers,
    mappings: Mappings,
    stop: oneshot::Sender<()>,
    thread: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    fn start(dir: &Path, peer_capacity: usize) -> Self {
        let (peers, mappings): (Peers, Mappings) = (shared(peer_capacity), shared(usize::MAX));
        let metrics = Metrics::new(
            None,
            None,
            BuildInfo {
                node: "test",
                role: "worker",
                attach_mode: "none",
                xdp_mode: "none",
            },
        )
        .unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let mut run_loop = RunLoop {
            reconciler: Reconciler::new(
                peers.clone(),
                mappings.clone(),
                MemoryAllowedTable::default(),
            )
            .unwrap(),
            gateway: None,
            worker_routes: None,
            host: NoDevices,
            feedback: None,
            active: None,
            metrics: metrics.clone(),
            passed: tokio::sync::watch::Sender::new(()),
        };
        let dir = dir.to_owned();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let events = source::watch_dir(&dir)?;
                run_loop
                    .follow(events, async {
                        let _ = stopped.await;
                    })
                    .await
            })
        });
        Self {
            metrics,
            peers,
            mappings,
            stop,
            thread,
        }
    }

    fn finish(self) {
        self.stop.send(()).unwrap();
        self.thread.join().unwrap().unwrap();
    }
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/liqo")
        .join(name)
}

/// A directory holding the named fixtures.
fn objects(names: &[&str]) -> tempfile::TempDir {
    let dir = isthmus_tests::scratch_dir();
    for name in names {
        fs::copy(fixture(name), dir.path().join(name)).unwrap();
    }
    dir
}

fn nets(list: &[&str]) -> BTreeSet<Ipv4Net> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

const MILAN: [&str; 2] = ["10.50.0.0/16", "10.51.0.0/16"];
const TURIN: [&str; 2] = ["10.80.0.0/16", "10.81.0.0/16"];

#[test]
fn the_loop_follows_a_directory_into_the_tables() {
    let dir = objects(&[
        "milan-v0.10.yaml",
        "natmapping-milan.yaml",
        "turin-v0.3.0.yaml",
    ]);
    let running = Running::start(dir.path(), usize::MAX);
    let both = nets(&[MILAN, TURIN].concat());
    eventually(
        GIVE_UP,
        "milan's and turin's views in the peer table",
        || keys(&running.peers) == both,
    );
    // milan's two NatMapping entries: the conncheck and a pod.
    let addr = |a: &str| Be32::from(a.parse::<Ipv4Addr>().unwrap());
    eventually(GIVE_UP, "milan's NatMapping entries", || {
        let mut values: Vec<Be32> = running
            .mappings
            .lock()
            .unwrap()
            .entries
            .values()
            .copied()
            .collect();
        values.sort();
        let mut want = vec![addr("169.254.0.1"), addr("10.70.4.21")];
        want.sort();
        values == want
    });
    assert_eq!(running.metrics.peers.get(), 2);

    fs::remove_file(dir.path().join("turin-v0.3.0.yaml")).unwrap();
    eventually(GIVE_UP, "turin's views removed", || {
        keys(&running.peers) == nets(&MILAN)
    });

    // Another cluster claiming milan's views is rejected; milan stays.
    let rival = fs::read_to_string(fixture("milan-v0.10.yaml"))
        .unwrap()
        .replace("name: milan\n", "name: rival\n")
        .replace("6a0e9f1c-2f3a-4c55-9d0e-8e1b2c3d4e5f", "rival-cluster");
    fs::write(dir.path().join("rival.yaml"), rival).unwrap();
    eventually(GIVE_UP, "the rival rejected", || {
        running.metrics.rejected_objects.get() == 1
    });
    assert_eq!(keys(&running.peers), nets(&MILAN));
    running.finish();
}

#[test]
fn a_failed_write_is_retried_on_a_tick_without_an_object_change() {
    let dir = objects(&["milan-v0.10.yaml", "turin-v0.3.0.yaml"]);
    // Room for one peer's two views: the second peer's write fails.
    let running = Running::start(dir.path(), 2);
    let failed = || {
        running
            .metrics
            .reconcile_errors
            .get_or_create(&[("kind", ObjectKind::TunnelEndpoint.as_str())])
            .get()
    };
    eventually(GIVE_UP, "a full peer table counted", || {
        failed() > 0 && running.metrics.map_full.get() > 0
    });
    assert_eq!(keys(&running.peers).len(), 2);

    // The table grows (as after an operator frees room); no file changes.
    running.peers.lock().unwrap().capacity = usize::MAX;
    eventually(GIVE_UP, "the retry writes the rest", || {
        keys(&running.peers) == nets(&[MILAN, TURIN].concat())
    });
    running.finish();
}
