//! What isolation costs: b's gateway segregating a, with
//! `ENDPOINTS` endpoints exported to it beside b-pod2 (offloaded from a,
//! which the NAT flow reaches), and how soon a change of the objects
//! reaches b-gw's kernel.

use std::{
    fs,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::Result;
use aya::maps::{HashMap, MapData};
use isthmus_common::{
    isolation::AllowKey,
    names,
    nat::{PeerKey, PeerNat},
    wire::Be32,
};
use isthmus_lab::{
    lab::{self, segregation},
    offloading::endpoint_slice,
    topology::{A, B, PEERINGS},
    wait,
};

use super::{gateways::peer_id, stats::percentile};

/// The endpoints exported to a in the segregated setup.
pub(super) const ENDPOINTS: u32 = 10_000;
/// The budget of an update's trip to the kernel, at p99.
pub(super) const UPDATE_BUDGET_MS: f64 = 100.0;
/// Changes timed: the pod's label removed, then restored, each half.
const UPDATES: usize = 40;
const SLICE_FILE: &str = "isolation-bench-slice.yaml";

/// Turns b's segregation on, with `ENDPOINTS` endpoints exported to a;
/// returns once b-gw's allowed table holds them all.
pub(super) fn segregate() -> Result<()> {
    let addresses: Vec<Ipv4Addr> = (0..ENDPOINTS)
        .map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 64, 0)) + i))
        .collect();
    let slice = endpoint_slice(
        "bench",
        segregation::NAMESPACE,
        &addresses,
        &[("http", 8080, "TCP")],
    );
    lab::write_object(&B.gw(), SLICE_FILE, &slice)?;
    segregation::set(true)?;
    let table = allowed_table()?;
    // b-pod2, b-pod1's service, and the bench's endpoints.
    let want = ENDPOINTS as usize + 2;
    wait::poll(
        Duration::from_mins(1),
        Duration::from_millis(50),
        &format!("b-gw holds {want} allowed entries"),
        || (table.keys().count() == want).then_some(()),
    )
}

/// Turns b's segregation off and removes the bench's endpoints.
pub(super) fn unsegregate() -> Result<()> {
    let _ = fs::remove_file(lab::object_dir(&B.gw()).join(SLICE_FILE));
    segregation::set(false)
}

/// Times `UPDATES` changes of b-pod2's label, from the write of its file
/// until b-gw's allowed table shows it, in milliseconds; returns their p99.
pub(super) fn update_p99_ms() -> Result<f64> {
    let table = allowed_table()?;
    let peers: HashMap<MapData, PeerKey, PeerNat> =
        lab::pinned_hash(&lab::bpffs(&B.gw()), names::MAP_PEERS)?;
    let a_view = PEERINGS
        .iter()
        .find(|p| p.local.name == B.name && p.remote.name == A.name)
        .expect("b peers with a")
        .remote_views()[0];
    let a = peer_id(&peers, a_view).ok_or_else(|| anyhow::anyhow!("b-gw holds no peer a"))?;
    let key = AllowKey::any_port(a, Be32::from(B.pod_addr(2)));
    let mut times = Vec::with_capacity(UPDATES);
    for i in 0..UPDATES {
        let offloaded = i % 2 == 1;
        let start = Instant::now();
        segregation::write_pod(offloaded)?;
        wait::poll(
            Duration::from_secs(10),
            Duration::from_micros(500),
            "b-gw's allowed table follows b-pod2's label",
            || (table.get(&key, 0).is_ok() == offloaded).then_some(()),
        )?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(percentile(&times, 99))
}

fn allowed_table() -> Result<HashMap<MapData, AllowKey, u8>> {
    lab::pinned_hash(&lab::bpffs(&B.gw()), names::MAP_ALLOWED)
}
