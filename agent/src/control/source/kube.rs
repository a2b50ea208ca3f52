//! The Kubernetes source: TunnelEndpoints in every namespace, the
//! cluster-scoped NatMappings, the Nodes the overlay needs and, on a
//! gateway, what isolation reads (offloaded Pods, managed EndpointSlices,
//! NamespaceOffloadings), through kube-rs's watcher and reflector.
//!
//! Each object is an origin of its own. The watcher relists after a `410
//! Gone` or a broken watch, and backs off with jitter while the API server
//! is away; objects missing from a relist are removed only once the relist
//! is complete, so the kernel never sees a gap.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream::BoxStream};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, TypeMeta},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store},
        watcher,
    },
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::SourceEvent;
use crate::model::{
    object::{self, Object, ObjectKey, ObjectKind},
    offloading::{ENDPOINTSLICE_CONTROLLER, MANAGED_BY_LABEL, ORIGIN_LABEL},
};

/// The objects as the API server last sent them, for writing back status
/// and events.
#[derive(Clone, Default)]
pub struct KubeSource {
    stores: BTreeMap<ObjectKind, Store<DynamicObject>>,
}

impl KubeSource {
    /// Every object of `kind`, if the agent keeps them
    /// ([`ObjectKind::stored`]).
    pub fn store(&self, kind: ObjectKind) -> Option<&Store<DynamicObject>> {
        self.stores.get(&kind)
    }
}

/// The API resource of `kind`.
pub fn api_resource(kind: ObjectKind) -> ApiResource {
    api_resource_of(kind.api_version(), kind.as_str(), kind.plural())
}

/// The API resource of `kind` (whose resource name is `plural`) in
/// `api_version`, also of a kind the agent writes without reading it.
pub fn api_resource_of(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    // The core group has no name: `v1`.
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The origin an object is kept under: one per object.
pub fn origin(kind: ObjectKind, key: &ObjectKey) -> String {
    format!("kube:{}/{key}", kind.plural())
}

/// The one Lease the source reads: the gateways' election's.
#[derive(Clone, Debug)]
pub struct ElectionLease {
    /// Its namespace (the agent's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// Watches `kinds` (of Leases, `lease` alone) and sends their changes;
/// `Synced` follows once each was listed in full. Events stop when the
/// receiver is dropped.
pub fn watch_kube(
    client: Client,
    kinds: &[ObjectKind],
    lease: &ElectionLease,
) -> (mpsc::Receiver<SourceEvent>, KubeSource) {
    let mut source = KubeSource::default();
    let streams: Vec<(ObjectKind, BoxStream<'static, WatchResult>)> = kinds
        .iter()
        .map(|&kind| {
            let watch = watcher(api(&client, kind, lease), config(kind, lease)).default_backoff();
            let stream = match kind.stored() {
                true => {
                    let writer = reflector::store::Writer::new(api_resource(kind));
                    source.stores.insert(kind, writer.as_reader());
                    watch.reflect(writer).boxed()
                }
                false => watch.boxed(),
            };
            (kind, stream)
        })
        .collect();
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut listings: Vec<Listing> = streams
            .iter()
            .map(|(kind, _)| Listing::new(*kind))
            .collect();
        let mut synced = false;
        let mut events = futures::stream::select_all(
            streams
                .into_iter()
                .enumerate()
                .map(|(i, (_, stream))| stream.map(move |e| (i, e))),
        );
        while let Some((index, event)) = events.next().await {
            let listing = &mut listings[index];
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    warn!(kind = %listing.kind, error = %e, "watching the API server; retrying with backoff, and the kernel keeps what it has");
                    continue;
                }
            };
            for out in listing.apply(event) {
                if tx.send(out).await.is_err() {
                    return;
                }
            }
            if !synced && listings.iter().all(|k| k.synced) {
                synced = true;
                if tx.send(SourceEvent::Synced).await.is_err() {
                    return;
                }
            }
        }
    });
    (rx, source)
}

type WatchResult = watcher::Result<watcher::Event<DynamicObject>>;

/// Where `kind` is watched: every namespace, but the election's Lease in
/// the agent's alone.
fn api(client: &Client, kind: ObjectKind, lease: &ElectionLease) -> Api<DynamicObject> {
    let resource = api_resource(kind);
    match kind {
        ObjectKind::Lease => Api::namespaced_with(client.clone(), &lease.namespace, &resource),
        _ => Api::all_with(client.clone(), &resource),
    }
}

/// Which objects of `kind` are watched: of Pods and EndpointSlices only
/// what isolation reads (offloaded pods, the slices Kubernetes' own
/// controller manages; the reader checks the same labels again), and of
/// Leases only the election's, since every node renews one of its own.
fn config(kind: ObjectKind, lease: &ElectionLease) -> watcher::Config {
    let config = watcher::Config::default();
    match kind {
        ObjectKind::Pod => config.labels(ORIGIN_LABEL),
        ObjectKind::EndpointSlice => {
            config.labels(&format!("{MANAGED_BY_LABEL}={ENDPOINTSLICE_CONTROLLER}"))
        }
        ObjectKind::Lease => config.fields(&format!("metadata.name={}", lease.name)),
        _ => config,
    }
}

/// What one kind's watch has delivered so far.
struct Listing {
    kind: ObjectKind,
    /// Origins sent and not removed since.
    known: BTreeSet<String>,
    /// Origins seen by a relist under way.
    relisting: Option<BTreeSet<String>>,
    /// A full list has completed at least once.
    synced: bool,
}

impl Listing {
    fn new(kind: ObjectKind) -> Self {
        Self {
            kind,
            known: BTreeSet::new(),
            relisting: None,
            synced: false,
        }
    }

    /// Turns one watcher event into source events.
    fn apply(&mut self, event: watcher::Event<DynamicObject>) -> Vec<SourceEvent> {
        match event {
            watcher::Event::Init => {
                debug!(kind = %self.kind, "listing");
                self.relisting = Some(BTreeSet::new());
                Vec::new()
            }
            // Outside a relist, `relisting` is None.
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => {
                let (origin, document) = self.read(object);
                if let Some(seen) = &mut self.relisting {
                    seen.insert(origin.clone());
                }
                self.known.insert(origin.clone());
                vec![SourceEvent::Origin {
                    origin,
                    documents: vec![document],
                }]
            }
            watcher::Event::InitDone => {
                let seen = self.relisting.take().unwrap_or_default();
                let gone: Vec<String> = self.known.difference(&seen).cloned().collect();
                self.known = seen;
                self.synced = true;
                debug!(
                    kind = %self.kind,
                    objects = self.known.len(),
                    removed = gone.len(),
                    "listed"
                );
                gone.into_iter()
                    .map(|origin| SourceEvent::Removed { origin })
                    .collect()
            }
            watcher::Event::Delete(object) => {
                let origin = origin(self.kind, &key(&object));
                self.known.remove(&origin);
                vec![SourceEvent::Removed { origin }]
            }
        }
    }

    fn read(&self, object: DynamicObject) -> (String, Result<Object, object::DocumentError>) {
        read(self.kind, object)
    }
}

/// A watched `object` of `kind`: its origin and its document, read as the
/// directory source reads a file.
pub fn read(
    kind: ObjectKind,
    mut object: DynamicObject,
) -> (String, Result<Object, object::DocumentError>) {
    let origin = origin(kind, &key(&object));
    // List items need not carry their type; the watch says what they are.
    object.types = Some(TypeMeta {
        api_version: kind.api_version().into(),
        kind: kind.as_str().into(),
    });
    let document = object::from_decoded(&origin, &object);
    (origin, document)
}

fn key(object: &DynamicObject) -> ObjectKey {
    ObjectKey {
        namespace: object.namespace().unwrap_or_default(),
        name: object.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(kind: ObjectKind, name: &str, spec: serde_json::Value) -> DynamicObject {
        let namespace = (kind == ObjectKind::TunnelEndpoint).then_some("liqo");
        let mut object =
            DynamicObject::new(name, &api_resource(kind)).data(serde_json::json!({ "spec": spec }));
        object.metadata.namespace = namespace.map(Into::into);
        object.types = None;
        object
    }

    fn origins(events: &[SourceEvent]) -> Vec<(&str, &str)> {
        events
            .iter()
            .map(|e| match e {
                SourceEvent::Origin { origin, .. } => ("set", origin.as_str()),
                SourceEvent::Removed { origin } => ("removed", origin.as_str()),
                SourceEvent::Synced => ("synced", ""),
            })
            .collect()
    }

    #[test]
    fn names_resources_as_the_crds_do() {
        let resource = api_resource(ObjectKind::TunnelEndpoint);
        assert_eq!(
            (
                resource.group.as_str(),
                resource.version.as_str(),
                resource.plural.as_str()
            ),
            ("net.liqo.io", "v1alpha1", "tunnelendpoints")
        );
        assert_eq!(api_resource(ObjectKind::NatMapping).plural, "natmappings");
        let nodes = api_resource(ObjectKind::Node);
        assert_eq!(
            (
                nodes.group.as_str(),
                nodes.version.as_str(),
                nodes.plural.as_str()
            ),
            ("", "v1", "nodes")
        );
    }

    #[test]
    fn a_relist_removes_only_what_it_no_longer_lists_and_only_at_its_end() {
        let mut listing = Listing::new(ObjectKind::TunnelEndpoint);
        let spec = serde_json::json!({});
        let mut events = Vec::new();
        events.extend(listing.apply(watcher::Event::Init));
        for name in ["a", "b"] {
            events.extend(listing.apply(watcher::Event::InitApply(object(
                ObjectKind::TunnelEndpoint,
                name,
                spec.clone(),
            ))));
        }
        events.extend(listing.apply(watcher::Event::InitDone));
        assert!(listing.synced);
        // The watch broke; while the relist runs, nothing is removed.
        events.extend(listing.apply(watcher::Event::Init));
        events.extend(listing.apply(watcher::Event::InitApply(object(
            ObjectKind::TunnelEndpoint,
            "b",
            spec.clone(),
        ))));
        let before_done = events.len();
        events.extend(listing.apply(watcher::Event::InitDone));
        events.extend(listing.apply(watcher::Event::Delete(object(
            ObjectKind::TunnelEndpoint,
            "b",
            spec,
        ))));
        assert_eq!(
            origins(&events),
            [
                ("set", "kube:tunnelendpoints/liqo/a"),
                ("set", "kube:tunnelendpoints/liqo/b"),
                ("set", "kube:tunnelendpoints/liqo/b"),
                ("removed", "kube:tunnelendpoints/liqo/a"),
                ("removed", "kube:tunnelendpoints/liqo/b"),
            ]
        );
        assert_eq!(before_done, 3);
    }

    /// The API server's creationTimestamp survives decoding, in the shape
    /// seniority compares.
    #[test]
    fn reads_the_creation_timestamp_the_api_server_wrote() {
        let listing = Listing::new(ObjectKind::TunnelEndpoint);
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "net.liqo.io/v1alpha1",
            "kind": "TunnelEndpoint",
            "metadata": {
                "name": "tep-b",
                "namespace": "liqo-tenant-b-7f2c9a",
                "creationTimestamp": "2024-05-01T10:00:00Z",
            },
            "spec": {},
        }))
        .unwrap();
        match listing.read(object).1 {
            Ok(Object::TunnelEndpoint(raw)) => {
                assert_eq!(raw.created.as_deref(), Some("2024-05-01T10:00:00Z"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_objects_without_type_as_their_kind() {
        let listing = Listing::new(ObjectKind::NatMapping);
        let spec =
            serde_json::json!({"clusterID": "x", "clusterMappings": {"10.0.0.1": "10.1.0.1"}});
        let (origin, document) = listing.read(object(ObjectKind::NatMapping, "nm", spec));
        assert_eq!(origin, "kube:natmappings/nm");
        match document {
            Ok(Object::NatMapping(raw)) => {
                assert_eq!(raw.key.name, "nm");
                assert!(raw.spec.contains_key("clusterMappings"));
            }
            other => panic!("{other:?}"),
        }
    }
}
