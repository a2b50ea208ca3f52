//! The collector of the kernel's flow tables. Every interval, which adapts
//! to what it finds ([`interval`]), it removes dead flows; whenever the
//! kernel refused a new flow for want of room, or the peers changed, it
//! also evicts flows never answered to make room ([`plan`]) and sets each
//! owner's room, within a second. Refusals and evictions go to a
//! [`FlowReport`] (the agent's metrics), per owner, and are logged once
//! per shortest interval (`--conntrack-gc-interval`). Each second it also
//! keeps the fragment table's budgets ([`budget`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    marker::PhantomData,
    sync::Arc,
    time::{Duration, Instant},
};

use aya::maps::MapError;
use isthmus_common::{
    conntrack::Timeouts,
    isolation::SEGREGATED,
    room::{ALL_PEERS, FlowTable, OWNER_LOCAL, Room, SHORTS, Short, owner_of},
};
use tokio::sync::watch;
use tracing::{debug, error, warn};

use crate::kernel::{
    conntrack::{self, Conntrack, PeerFlows, SweptTable},
    peer_table::PeerMap,
    room::Rooms,
    table::KernelTable,
};

mod budget;
mod interval;
mod plan;

pub use budget::{FRAGMENTS, FragmentBudgets};
pub use interval::{SweepInterval, Swept};
pub use plan::{Limits, Plan, Pressure, Share, plan};

/// How the flow tables are shared and swept.
#[derive(Clone, Copy, Debug)]
pub struct Sharing {
    /// The shortest wait between two sweeps of dead flows.
    pub every: Duration,
    /// The longest.
    pub longest: Duration,
    /// Percentage of the conntrack kept for the gateway's own flows.
    pub reserve_percent: u8,
    /// What one peer may hold.
    pub share: Share,
}

/// Where the collector reports what it found.
pub trait FlowReport: Send + Sync {
    /// How logs and metrics name `owner`.
    fn owner_name(&self, owner: u32) -> String;
    /// The kernel refused `count` more new flows (or fragment table
    /// entries) of `owner` in `table` (as metrics name it), for `reason`.
    fn refused(&self, table: &str, owner: u32, reason: Short, count: u64);
    /// `owner` holds `held` flows of `table`, after `evicted` were evicted
    /// by this pass.
    fn held(&self, table: FlowTable, owner: u32, held: u64, evicted: u64);
    /// The conntrack holds `entries` flows in all.
    fn conntrack_entries(&self, entries: u64);
    /// A sweep of dead flows ran on its interval; the next is `next` after.
    fn swept(&self, next: Duration);
}

/// Pressure is looked for this often between sweeps.
const PRESSURE_CHECK: Duration = Duration::from_secs(1);

/// What the collector remembers of one table between passes.
pub struct Sweeper<T> {
    table: PhantomData<T>,
    capacity: u64,
    reserve: u64,
    /// Owners whose room the collector keeps: the peers, the gateway, and
    /// any that held entries at the last pass.
    owners: BTreeSet<u32>,
    /// Refusals counted so far, by owner and reason.
    refused: RefusalsSeen,
    /// What each owner held when the last pass ended.
    left: BTreeMap<u32, u64>,
    /// Refusals and evictions since the last log line, by owner.
    unlogged: BTreeMap<u32, (u64, usize)>,
}

/// The kernel's flow tables, their rooms and the peers they are shared by.
pub struct FlowTables {
    /// Masqueraded flows, with the table's capacity.
    pub conntrack: (Conntrack, u32),
    /// Flows towards segregated peers, with the table's capacity.
    pub peer_flows: (PeerFlows, u32),
    /// Each owner's room.
    pub rooms: Rooms,
    /// The peers, as the kernel holds them.
    pub peers: PeerMap,
    /// Changes when the run loop may have written the peers.
    pub peers_written: watch::Receiver<()>,
}

/// Runs [`collect`] on a thread of its own, with a runtime of its own, for
/// the agent's lifetime. A sweep walks tables of up to millions of entries
/// in blocking system calls: on the runtime that serves the run loop, it
/// would hold one of its workers, and an object's way to the kernel would
/// wait behind it.
pub fn spawn(
    tables: FlowTables,
    sharing: Sharing,
    report: Arc<dyn FlowReport>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("flow-collector".into())
        .spawn(move || runtime.block_on(collect(tables, sharing, report)))?;
    Ok(())
}

/// Sweeps the flow tables until the task is dropped.
async fn collect(tables: FlowTables, sharing: Sharing, report: Arc<dyn FlowReport>) {
    let FlowTables {
        conntrack: (mut conntrack, conntrack_capacity),
        peer_flows: (mut peer_flows, peer_flow_capacity),
        mut rooms,
        peers,
        mut peers_written,
    } = tables;
    let reserve = u64::from(conntrack_capacity) * u64::from(sharing.reserve_percent) / 100;
    let mut conntrack_sweeper = Sweeper::new(conntrack_capacity, reserve);
    // No flow towards a segregated peer is the gateway's own: no reserve.
    let mut peer_flow_sweeper = Sweeper::new(peer_flow_capacity, 0);
    let mut fragment_budgets = FragmentBudgets::new(sharing.reserve_percent);
    let mut ticks = tokio::time::interval(PRESSURE_CHECK);
    let mut last_sweep: Option<Instant> = None;
    // Refusals are logged every shortest interval, however long the
    // sweeps' wait has grown: an operator sees a flood within seconds.
    let mut last_log = Instant::now();
    let mut interval = SweepInterval::new(sharing.every, sharing.longest);
    let mut last_peers = None;
    let mut run_loop_alive = true;
    loop {
        // A pass that wrote peers wakes the collector at once: a new
        // peer's share is bounded from its first flows, not a tick later.
        let written = tokio::select! {
            _ = ticks.tick() => peers_written.has_changed().unwrap_or(true),
            changed = peers_written.changed(), if run_loop_alive => {
                run_loop_alive = changed.is_ok();
                true
            }
        };
        let sweep = last_sweep.is_none_or(|at| at.elapsed() >= interval.now());
        // Read again only after a pass, and at each sweep in case a pass
        // was missed: with thousands of peers, reading the table is most
        // of an idle collector's work.
        let (peers, changed) = match last_peers.take() {
            Some(kept) if !written && !sweep => (kept, false),
            before => {
                peers_written.mark_unchanged();
                match peer_ids(&peers) {
                    Ok(now) => {
                        let changed = before.as_ref() != Some(&now);
                        (now, changed)
                    }
                    Err(e) => {
                        error!(error = %e, "reading the peer table for the flow tables' shares");
                        last_peers = before;
                        continue;
                    }
                }
            }
        };
        let all: Vec<u32> = peers.keys().copied().collect();
        let segregated: Vec<u32> = peers
            .iter()
            .filter(|(_, flags)| *flags & SEGREGATED != 0)
            .map(|(id, _)| *id)
            .collect();
        if let Err(e) = fragment_budgets.pass(&mut rooms, &all, sharing.share, &*report) {
            error!(table = FRAGMENTS, error = %e, "setting the fragment table's budgets");
        }
        let due = sweep || changed;
        let swept = [
            conntrack_sweeper.pass(&mut conntrack, &mut rooms, &all, sharing, due, &*report),
            peer_flow_sweeper.pass(
                &mut peer_flows,
                &mut rooms,
                &segregated,
                sharing,
                due,
                &*report,
            ),
        ];
        if sweep {
            if let [Some(conntrack), Some(peer_flows)] = swept {
                interval.after(&[conntrack, peer_flows]);
                report.swept(interval.now());
            }
            last_sweep = Some(Instant::now());
        }
        if last_log.elapsed() >= sharing.every {
            last_log = Instant::now();
            conntrack_sweeper.log(&*report);
            peer_flow_sweeper.log(&*report);
            fragment_budgets.log(&*report);
        }
        last_peers = Some(peers);
    }
}

/// The kernel's refusal counts as last read, by owner and reason.
#[derive(Default)]
struct RefusalsSeen(BTreeMap<(u32, Short), u64>);

impl RefusalsSeen {
    /// What `owner` was refused for `short` since the last read, the
    /// kernel having counted `now` in all. The first read counts from
    /// there: what an agent before this one saw is not this one's to
    /// report.
    fn since(&mut self, owner: u32, short: Short, now: u64) -> u64 {
        let before = self.0.insert((owner, short), now).unwrap_or(now);
        now.saturating_sub(before)
    }
}

/// The peers' IDs in the kernel's peer table, with their flags.
fn peer_ids(peers: &PeerMap) -> Result<BTreeMap<u32, u32>, MapError> {
    Ok(peers
        .entries()?
        .into_iter()
        .map(|(_, nat)| (nat.peer_id, nat.flags))
        .collect())
}

impl<T: SweptTable> Sweeper<T> {
    /// Sweeps a table of `capacity` entries, `reserve` of them kept for
    /// the gateway's own flows.
    pub fn new(capacity: u32, reserve: u64) -> Self {
        Self {
            table: PhantomData,
            capacity: u64::from(capacity),
            reserve,
            owners: BTreeSet::from([OWNER_LOCAL]),
            refused: RefusalsSeen::default(),
            left: BTreeMap::new(),
            unlogged: BTreeMap::new(),
        }
    }

    /// One pass over `table`, sharing it among `peers` (their IDs): only
    /// when due (`due`), when the kernel refused flows since the last one,
    /// or when a peer's flows are [`Sweeper::filling`] its share. Returns
    /// what the pass found, if it swept.
    pub fn pass(
        &mut self,
        table: &mut T,
        rooms: &mut Rooms,
        peers: &[u32],
        sharing: Sharing,
        due: bool,
        report: &dyn FlowReport,
    ) -> Option<Swept> {
        self.owners.extend(peers.iter().map(|id| owner_of(*id)));
        let pressure = match self.pressure(rooms, report) {
            Ok(pressure) => pressure,
            Err(e) => {
                error!(table = T::TABLE.as_str(), error = %e, "reading refusals");
                return None;
            }
        };
        let limits = Limits::new(self.capacity, self.reserve, sharing.share, peers.len());
        let filling = || {
            self.filling(rooms, &limits).unwrap_or_else(|e| {
                error!(table = T::TABLE.as_str(), error = %e, "reading the rooms");
                false
            })
        };
        if !due && pressure == Pressure::default() && !filling() {
            return None;
        }
        match self.sweep(table, rooms, &limits, &pressure, report) {
            Ok((held, swept)) => {
                // An owner that holds nothing and is no peer any more needs
                // no room.
                self.owners.retain(|o| {
                    *o == OWNER_LOCAL
                        || held.contains_key(o)
                        || peers.iter().any(|p| owner_of(*p) == *o)
                });
                self.left = held;
                Some(swept)
            }
            Err(e) => {
                error!(table = T::TABLE.as_str(), error = %e, "collecting a flow table");
                None
            }
        }
    }

    /// Whether a peer holds more than [`Limits::closed_kept`] and grew by
    /// an eighth of its share since the last pass: a pass then collects its
    /// connections that are over before they cost it refusals. With no
    /// peer busy, one read of the peers' total rules it out.
    fn filling(&self, rooms: &Rooms, limits: &Limits) -> Result<bool, MapError> {
        let kept = limits.closed_kept();
        let held = |owner| {
            rooms
                .room(T::TABLE, owner)
                .map(|room| room.used(room.charged))
        };
        if held(ALL_PEERS)? <= kept {
            return Ok(false);
        }
        for &owner in self.owners.iter().filter(|o| **o != OWNER_LOCAL) {
            let before = self.left.get(&owner).copied().unwrap_or(0);
            let now = held(owner)?;
            if now > kept && now > before + limits.per_peer / 8 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// What the kernel refused since the last pass; counts it.
    fn pressure(&mut self, rooms: &Rooms, report: &dyn FlowReport) -> Result<Pressure, MapError> {
        let mut pressure = Pressure::default();
        let last = self.owners.last().copied().unwrap_or(OWNER_LOCAL);
        let refusals = rooms.refusals(T::TABLE, last)?;
        for &owner in &self.owners {
            for short in SHORTS {
                let new = self.refused.since(owner, short, refusals.get(owner, short));
                if new == 0 {
                    continue;
                }
                self.unlogged.entry(owner).or_default().0 += new;
                report.refused(T::TABLE.as_str(), owner, short, new);
                match (short, owner) {
                    (Short::Share, _) => *pressure.share.entry(owner).or_default() += new,
                    (Short::Table, OWNER_LOCAL) => pressure.table += new,
                    (Short::Table, _) => pressure.peers_room += new,
                }
            }
        }
        Ok(pressure)
    }

    /// Removes what [`plan`] says, then sets each owner's room: its limit,
    /// and as released whatever the kernel charged beyond what it holds.
    /// What the kernel charged is read before the table is, so a flow
    /// added meanwhile counts twice until the next pass: never none.
    /// Returns what each owner holds, and what the sweep found.
    fn sweep(
        &mut self,
        swept: &mut T,
        rooms: &mut Rooms,
        limits: &Limits,
        pressure: &Pressure,
        report: &dyn FlowReport,
    ) -> Result<(BTreeMap<u32, u64>, Swept), MapError> {
        let table = T::TABLE;
        let read: BTreeMap<u32, Room> = self
            .owners
            .iter()
            .map(|owner| Ok((*owner, rooms.room(table, *owner)?)))
            .collect::<Result<_, MapError>>()?;
        let all = rooms.room(table, ALL_PEERS)?;
        let flows = swept.flows(conntrack::now(), &Timeouts::DEFAULT)?;
        let plan = plan(table, &flows, limits, pressure);
        swept.remove(&plan.remove);
        swept.remove_closed(&plan.remove_closed);
        debug!(
            table = table.as_str(),
            expired = plan.expired,
            evicted = plan.evicted.values().sum::<usize>(),
            "flow table collected"
        );
        for (owner, evicted) in &plan.evicted {
            self.unlogged.entry(*owner).or_default().1 += evicted;
        }
        let mut peers_held = 0;
        for (&owner, &room) in &read {
            let held = plan.held.get(&owner).copied().unwrap_or(0);
            let limit = if owner == OWNER_LOCAL {
                0
            } else {
                peers_held += held;
                limits.per_peer
            };
            rooms.set(table, owner, room, limit, held)?;
            let evicted = plan.evicted.get(&owner).copied().unwrap_or(0);
            report.held(table, owner, held, evicted as u64);
        }
        rooms.set(table, ALL_PEERS, all, limits.all_peers, peers_held)?;
        if table == FlowTable::Conntrack {
            report.conntrack_entries(plan.held.values().sum());
        }
        let swept = Swept {
            flows: flows.len(),
            expired: plan.expired,
        };
        Ok((plan.held, swept))
    }

    /// One line per owner refused or evicted since the last, and the
    /// refusals counted in the metrics.
    fn log(&mut self, report: &dyn FlowReport) {
        for (owner, (refused, evicted)) in std::mem::take(&mut self.unlogged) {
            warn!(
                table = T::TABLE.as_str(),
                owner = report.owner_name(owner),
                refused,
                evicted,
                "new flows refused for want of room, and flows never answered evicted to make room"
            );
        }
    }
}
