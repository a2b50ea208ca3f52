//! What the gateway tells the API server: the connection status of each
//! TunnelEndpoint, through the status subresource, or of each Liqo v1 peer's
//! `Connection` (which it creates as Liqo's gateway does), and an Event for
//! each object it rejects.
//!
//! Writes are skipped when the object already shows the status, and
//! rate-limited: a change of state goes out within a pass, a new latency
//! only every [`LATENCY_REFRESH`] (a Connection's every ten seconds, as
//! Liqo's), and no pass writes more than [`WRITES_PER_PASS`] objects.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::jiff::Timestamp;
use kube::{Client, api::DynamicObject};
use tokio::sync::{mpsc, watch};

use crate::{
    control::source::KubeSource,
    model::node::Node,
    model::object::{self, ObjectKey, ObjectKind, ReadFor},
    model::peer::{LiqoGateway, Peer},
    model::rejection::Rejection,
    observe::metrics::Metrics,
    roles::gateway::Report,
    roles::gateway::conncheck,
    tunnel::Connection,
};

/// Liqo's `statusMessage` of a peering whose conncheck answers.
pub const CONNECTED_MESSAGE: &str = "VPN connection established";
/// Liqo's `statusMessage` while the tunnel or the conncheck is not up yet.
pub const CONNECTING_MESSAGE: &str = "Waiting VPN connection to be established";
/// Liqo's `statusMessage` once the conncheck went unanswered.
pub const ERROR_MESSAGE: &str = "No network connectivity towards remote cluster";

/// A status already written is written again with a new latency only this often.
pub const LATENCY_REFRESH: Duration = Duration::from_secs(30);
/// A written status the object does not show yet is not written again sooner.
pub const RETRY: Duration = Duration::from_secs(10);
/// Most objects patched in one pass; the rest wait for the next.
pub const WRITES_PER_PASS: usize = 10;
/// The field manager of the agent's patches.
const MANAGER: &str = "isthmus-agent";
/// Longest Event note the API server accepts.
const NOTE_MAX: usize = 1024;
/// Rejection Events waiting for the writer; past this, a pass's Events are
/// dropped and counted, so that a flood of bad objects cannot grow memory.
pub const EVENT_QUEUE: usize = 64;

/// Liqo's connection states (`status.connection.status`); Liqo v0.2–v0.4
/// wrote them in lower case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// A session is up.
    Connected,
    /// Handshaking.
    Connecting,
    /// The object cannot be used.
    Error,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Connected => "Connected",
            State::Connecting => "Connecting",
            State::Error => "Error",
        }
    }
}

/// The object that shows a peer's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShownOn {
    /// The TunnelEndpoint itself, in `status.connection`.
    TunnelEndpoint,
    /// Liqo v1's `Connection` of the peer's gateway, in `status`, which the
    /// agent creates as Liqo's gateway does.
    Connection(LiqoGateway),
}

impl ShownOn {
    /// How long after the last write a status whose state holds is written
    /// again, if at all: a TunnelEndpoint's once its latency moved, after
    /// [`LATENCY_REFRESH`]; a Connection's every ten seconds, moved or
    /// not, as Liqo's gateway stamps it.
    fn refresh(&self, latency_moved: bool) -> Option<Duration> {
        match self {
            ShownOn::TunnelEndpoint => latency_moved.then_some(LATENCY_REFRESH),
            ShownOn::Connection(_) => Some(liqo_connection::UPDATE_STATUS_INTERVAL),
        }
    }
}

impl std::fmt::Display for ShownOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShownOn::TunnelEndpoint => "TunnelEndpoint",
            ShownOn::Connection(_) => "Connection",
        })
    }
}

/// `status.connection` of one TunnelEndpoint, or the status of a Liqo v1
/// peer's `Connection`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionStatus {
    /// The kind of the object that shows it: a TunnelEndpoint, or Liqo
    /// v1's Connection.
    pub shown_on: ShownOn,
    /// The state.
    pub state: State,
    /// Why, for people.
    pub message: String,
    /// Round trip of the conncheck, as Liqo writes it ("640μs", "3ms",
    /// "N/A"); None for an object that is not a peering.
    pub latency: Option<String>,
    /// `peerConfiguration`: what the tunnel was given (`allowedIPs`,
    /// `endpointIP`, `port`, `publicKey`), which `liqoctl status peer` shows.
    /// Shared with the gateway's report, which every tick rebuilds.
    pub peer_configuration: Option<Arc<BTreeMap<String, String>>>,
}

impl ConnectionStatus {
    fn same_state(&self, other: &Self) -> bool {
        self.state == other.state
            && self.message == other.message
            && self.peer_configuration == other.peer_configuration
    }

    /// What an object shows now, if anything.
    fn shown(object: &DynamicObject) -> Option<Self> {
        let connection = object.data.get("status")?.get("connection")?;
        let text = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_str()).map(str::to_owned);
        let state = match connection
            .get("status")?
            .as_str()?
            .to_ascii_lowercase()
            .as_str()
        {
            "connected" => State::Connected,
            "connecting" => State::Connecting,
            "error" => State::Error,
            _ => return None,
        };
        let peer_configuration = connection
            .get("peerConfiguration")
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .map(Arc::new);
        Some(Self {
            shown_on: ShownOn::TunnelEndpoint,
            state,
            message: text(connection.get("statusMessage")).unwrap_or_default(),
            latency: text(connection.get("latency").and_then(|l| l.get("value"))),
            peer_configuration,
        })
    }

    fn patch(&self, now: Timestamp) -> serde_json::Value {
        let latency = self
            .latency
            .as_ref()
            .map(|value| serde_json::json!({ "value": value, "timestamp": now.to_string() }));
        serde_json::json!({ "status": { "connection": {
            "status": self.state.as_str(),
            "statusMessage": self.message,
            "latency": latency,
            "peerConfiguration": self.peer_configuration.as_deref(),
        }}})
    }
}

/// The status each TunnelEndpoint should show, as Liqo's gateway writes
/// it: `Connected` while the conncheck answers, `Error` once it has not for
/// [`conncheck::LOSSES_FOR_ERROR`] intervals, `Connecting` before. Without
/// a gateway (`gateway` is None), only rejected objects get one: the
/// connection belongs to whatever carries it.
pub fn desired(
    peers: &[Peer],
    gateway: Option<&Report>,
    rejections: &BTreeSet<Rejection>,
) -> BTreeMap<ObjectKey, ConnectionStatus> {
    let mut statuses = BTreeMap::new();
    for rejection in rejections {
        let Some((ObjectKind::TunnelEndpoint, key)) = &rejection.object else {
            continue;
        };
        statuses
            .entry(key.clone())
            .and_modify(|s: &mut ConnectionStatus| {
                s.message = format!("{}; {}", s.message, rejection.problem);
            })
            .or_insert_with(|| ConnectionStatus {
                shown_on: ShownOn::TunnelEndpoint,
                state: State::Error,
                message: rejection.problem.clone(),
                latency: None,
                peer_configuration: None,
            });
    }
    let Some(gateway) = gateway else {
        return statuses;
    };
    let sessions: HashMap<&ObjectKey, Connection> = gateway
        .sessions
        .iter()
        .map(|s| (&s.key, s.connection))
        .collect();
    for peer in peers {
        let session = sessions.get(&peer.key).copied();
        let status = of_peer(peer, session, gateway);
        let object = match &status.shown_on {
            ShownOn::Connection(gateway) => gateway.connection(),
            ShownOn::TunnelEndpoint => peer.key.clone(),
        };
        statuses.insert(object, status);
    }
    statuses
}

/// `peer`'s status, its tunnel session in state `session` if it has one.
fn of_peer(peer: &Peer, session: Option<Connection>, gateway: &Report) -> ConnectionStatus {
    let status = |state, message: String, rtt| ConnectionStatus {
        shown_on: match &peer.liqo_gateway {
            Some(gateway) => ShownOn::Connection(gateway.clone()),
            None => ShownOn::TunnelEndpoint,
        },
        state,
        message,
        latency: Some(conncheck::format_latency(rtt)),
        peer_configuration: gateway.configurations.get(&peer.key).cloned(),
    };
    if let Err(field) = &peer.tunnel {
        return ConnectionStatus {
            latency: None,
            ..status(
                State::Error,
                format!("field {field} is missing: no tunnel to this peer"),
                None,
            )
        };
    }
    if let Some(why) = gateway.unresolved.get(&peer.key) {
        return status(
            State::Connecting,
            format!("{CONNECTING_MESSAGE}: {why}"),
            None,
        );
    }
    let health = gateway.health.get(&peer.key);
    match (session, health) {
        (Some(Connection::Connected), Some(h)) if h.connected => {
            status(State::Connected, CONNECTED_MESSAGE.into(), h.rtt)
        }
        (_, Some(h)) if h.failed => status(State::Error, ERROR_MESSAGE.into(), None),
        _ => status(State::Connecting, CONNECTING_MESSAGE.into(), None),
    }
}

/// Logs each TunnelEndpoint's or Connection's status when its state or
/// message changes, whatever the source: with `dir:`, the log is where it
/// shows.
#[derive(Default)]
pub struct StatusLog {
    last: BTreeMap<ObjectKey, ConnectionStatus>,
}

impl StatusLog {
    /// Logs what changed in `statuses` since the last call.
    pub fn record(&mut self, statuses: &BTreeMap<ObjectKey, ConnectionStatus>) {
        for (key, status) in statuses {
            if self
                .last
                .get(key)
                .is_none_or(|last| !last.same_state(status))
            {
                tracing::info!(
                    object = %key,
                    status = status.state.as_str(),
                    status_message = %status.message,
                    latency = status.latency.as_deref().unwrap_or(""),
                    "{} status",
                    status.shown_on
                );
            }
        }
        self.last = statuses.clone();
    }
}

/// What was last written to one object, and when.
struct Written {
    status: ConnectionStatus,
    at: Instant,
}

/// Whether `desired` should be written now to an object that shows `shown`.
fn due(
    shown: Option<&ConnectionStatus>,
    desired: &ConnectionStatus,
    last: Option<&Written>,
    now: Instant,
) -> bool {
    let since_last = |limit| last.is_none_or(|w| now.duration_since(w.at) >= limit);
    match shown {
        Some(shown) if shown.same_state(desired) => desired
            .shown_on
            .refresh(shown.latency != desired.latency)
            .is_some_and(since_last),
        // Changed: write, unless this very status went out moments ago
        // and the watch has not brought it back yet.
        _ => last.is_none_or(|w| !w.status.same_state(desired)) || since_last(RETRY),
    }
}

/// The handle the follow loop feeds: the statuses it wants shown, and the
/// rejections it made.
pub struct Feedback {
    statuses: watch::Sender<Wanted>,
    rejected: mpsc::Sender<ObjectRejection>,
    metrics: Arc<Metrics>,
    /// Where a gateway that serves Liqo v1 peers through Isthmus's own
    /// gateway objects says what they should show.
    home: Option<GatewayHome>,
}

/// What the writer should make the API server show.
#[derive(Clone, Debug, Default)]
struct Wanted {
    /// Each TunnelEndpoint's or Connection's status.
    connections: BTreeMap<ObjectKey, ConnectionStatus>,
    /// Each of Isthmus's gateway objects' status.
    gateway_objects: Vec<gateway_object::GatewayObject>,
}

/// Every problem one pass found with one object, for one Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRejection {
    /// The object.
    pub kind: ObjectKind,
    /// Its key.
    pub key: ObjectKey,
    /// What is wrong, one problem each, in order.
    pub problems: Vec<String>,
}

impl ObjectRejection {
    /// The NatMappings and Liqo v1 objects among `rejections`, each with
    /// all its problems: an object with many bad entries makes one Event,
    /// not one each. They come one namespace at a time, round after round,
    /// so that when the Event queue fills, a namespace with many bad
    /// objects has not taken the others' places.
    pub fn evented(rejections: &[Rejection]) -> Vec<Self> {
        let mut by_namespace: BTreeMap<String, Vec<Self>> = BTreeMap::new();
        for event in Self::by_object(rejections) {
            by_namespace
                .entry(event.key.namespace.clone())
                .or_default()
                .push(event);
        }
        let mut queues: Vec<_> = by_namespace.into_values().map(Vec::into_iter).collect();
        let mut events = Vec::new();
        while !queues.is_empty() {
            queues.retain_mut(|queue| queue.next().map(|e| events.push(e)).is_some());
        }
        events
    }

    /// The NatMappings and Liqo v1 objects among `rejections`, each with
    /// all its problems.
    fn by_object(rejections: &[Rejection]) -> Vec<Self> {
        let mut by_object: BTreeMap<(ObjectKind, &ObjectKey), Vec<String>> = BTreeMap::new();
        for rejection in rejections {
            if let Some((kind, key)) = &rejection.object
                && (*kind == ObjectKind::NatMapping || kind.read_for() == ReadFor::LiqoV1)
            {
                by_object
                    .entry((*kind, key))
                    .or_default()
                    .push(rejection.problem.clone());
            }
        }
        by_object
            .into_iter()
            .map(|((kind, key), problems)| Self {
                kind,
                key: key.clone(),
                problems,
            })
            .collect()
    }

    /// The Event's note: the problem, or how many there are and each.
    pub fn note(&self) -> String {
        match self.problems.as_slice() {
            [one] => one.clone(),
            many => format!("{} problems: {}", many.len(), many.join("; ")),
        }
    }
}

/// `note` cut to [`NOTE_MAX`] bytes on a character boundary, marked.
fn truncate_note(note: String) -> String {
    object::bounded(note, NOTE_MAX)
}

impl Feedback {
    /// Starts the writer. `instance` names this agent in Events. With
    /// `home`, the gateway also writes the status of Isthmus's gateway
    /// objects of the peers it serves.
    pub fn spawn(
        client: Client,
        source: KubeSource,
        instance: &str,
        metrics: Arc<Metrics>,
        home: Option<GatewayHome>,
    ) -> Self {
        let (statuses, statuses_rx) = watch::channel(Wanted::default());
        let (rejected, rejected_rx) = mpsc::channel(EVENT_QUEUE);
        let writer = writer::Writer::new(client, source, instance, metrics.clone(), home.clone());
        tokio::spawn(writer.run(statuses_rx, rejected_rx));
        Self {
            statuses,
            rejected,
            metrics,
            home,
        }
    }

    /// The statuses every TunnelEndpoint and Connection should show now,
    /// and those of the gateway objects of `peers`, served from this node
    /// as `nodes` list it.
    pub fn show(
        &self,
        connections: BTreeMap<ObjectKey, ConnectionStatus>,
        peers: &[Peer],
        nodes: &[Node],
    ) {
        let gateway_objects = self
            .home
            .as_ref()
            .map(|home| home.desired(peers, nodes))
            .unwrap_or_default();
        self.statuses.send_replace(Wanted {
            connections,
            gateway_objects,
        });
    }

    /// Rejections new in the last pass: each NatMapping or Liqo v1 object
    /// with any becomes one Event. A TunnelEndpoint gets its Event when its
    /// status turns to Error, which also covers a peer accepted without a
    /// tunnel. When the writer is behind, the Events that do not fit are
    /// dropped and counted.
    pub fn rejected(&self, rejections: &[Rejection]) {
        for rejection in ObjectRejection::evented(rejections) {
            if self.rejected.try_send(rejection).is_err() {
                self.metrics
                    .status_writes
                    .get_or_create(&[("outcome", "event_dropped")])
                    .inc();
            }
        }
    }
}

pub mod gateway_object;
pub mod gateway_pod;
pub mod liqo_connection;
mod writer;

pub use gateway_object::GatewayHome;

#[cfg(test)]
mod tests;
