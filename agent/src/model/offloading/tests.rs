//! Pods, EndpointSlices and NamespaceOffloadings in the shapes Kubernetes
//! and Liqo v0.10 write them, and the errors of broken ones.

use std::path::Path;

use super::*;
use crate::model::object::{Object, parse_documents};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn raw(yaml: &str) -> RawObject {
    match parse_documents(Path::new("objects.yaml"), yaml).pop() {
        Some(Ok(
            Object::Pod(raw) | Object::EndpointSlice(raw) | Object::NamespaceOffloading(raw),
        )) => raw,
        other => panic!("{other:?}"),
    }
}

/// A pod as Liqo's virtual kubelet creates it in the provider cluster,
/// trimmed of its containers.
const OFFLOADED_POD: &str = r"
apiVersion: v1
kind: Pod
metadata:
  name: web-7d4b9c-xk2lp
  namespace: shop-a-34ab3e
  labels:
    app: web
    liqo.io/managed-by: shadowpod
    virtualkubelet.liqo.io/destination: cluster-b
    virtualkubelet.liqo.io/origin: cluster-a
spec:
  nodeName: b-gw
status:
  phase: Running
  podIP: 10.244.0.133
  podIPs:
  - ip: 10.244.0.133
  - ip: fd00:10:244::85
";

#[test]
fn an_offloaded_pod_names_its_origin_and_addresses_of_both_families() {
    let pod = OffloadedPod::from_raw(&raw(OFFLOADED_POD), "objects.yaml")
        .unwrap()
        .unwrap();
    assert_eq!(pod.origin_cluster, "cluster-a");
    assert_eq!(pod.addresses, [ip("10.244.0.133"), ip("fd00:10:244::85")]);
    assert_eq!(pod.key.to_string(), "shop-a-34ab3e/web-7d4b9c-xk2lp");
}

#[test]
fn pods_not_offloaded_ended_or_on_the_host_network_open_nothing() {
    let local = OFFLOADED_POD.replace("    virtualkubelet.liqo.io/origin: cluster-a\n", "");
    assert_eq!(OffloadedPod::from_raw(&raw(&local), "f").unwrap(), None);
    for (from, to) in [
        ("phase: Running", "phase: Succeeded"),
        ("phase: Running", "phase: Failed"),
        ("nodeName: b-gw", "hostNetwork: true"),
    ] {
        let pod = OffloadedPod::from_raw(&raw(&OFFLOADED_POD.replace(from, to)), "f")
            .unwrap()
            .unwrap();
        assert!(pod.addresses.is_empty(), "{to}");
    }
    // Pending, with no address yet.
    let pending = OFFLOADED_POD
        .replace("phase: Running", "phase: Pending")
        .split("  podIP:")
        .next()
        .unwrap()
        .to_owned();
    let pod = OffloadedPod::from_raw(&raw(&pending), "f")
        .unwrap()
        .unwrap();
    assert!(pod.addresses.is_empty());
}

#[test]
fn a_pod_with_only_the_single_address_field_is_read() {
    let single = OFFLOADED_POD.split("  podIPs:").next().unwrap().to_owned();
    let pod = OffloadedPod::from_raw(&raw(&single), "f").unwrap().unwrap();
    assert_eq!(pod.addresses, [ip("10.244.0.133")]);
}

#[test]
fn a_broken_pod_is_refused_naming_the_field() {
    let error = |yaml: &str| {
        OffloadedPod::from_raw(&raw(yaml), "objects.yaml")
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error(&OFFLOADED_POD.replace("- ip: 10.244.0.133", "- ip: 10.244.0.333")),
        "objects.yaml: Pod shop-a-34ab3e/web-7d4b9c-xk2lp: field status.podIPs[0].ip: \"10.244.0.333\" is not an IP address"
    );
    assert!(
        error(&OFFLOADED_POD.replace("origin: cluster-a", "origin: \"\""))
            .ends_with("field metadata.labels.virtualkubelet.liqo.io/origin: empty")
    );
    assert!(
        error(&OFFLOADED_POD.replace("- ip: 10.244.0.133", "- {}"))
            .ends_with("field status.podIPs[0].ip: Null is not a string")
    );
}

/// An EndpointSlice as Kubernetes' endpointslice controller writes it.
const SLICE: &str = r"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-8x2kq
  namespace: shop
  generateName: web-
  labels:
    endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
    kubernetes.io/service-name: web
  ownerReferences:
  - apiVersion: v1
    kind: Service
    name: web
    uid: 0f1c5e6a-3c1d-4b8e-9a7d-2f4c6e8a1b3d
    controller: true
    blockOwnerDeletion: true
addressType: IPv4
endpoints:
- addresses:
  - 10.244.0.5
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: b-gw
  targetRef:
    kind: Pod
    name: web-0
    namespace: shop
- addresses:
  - 10.244.0.6
  conditions:
    ready: false
    serving: true
    terminating: true
ports:
- name: http
  port: 18080
  protocol: TCP
- name: dns
  port: 53
  protocol: UDP
";

#[test]
fn a_managed_slice_exports_every_address_on_its_ports() {
    let slice = ExportedSlice::from_raw(&raw(SLICE), "f").unwrap().unwrap();
    assert_eq!(slice.addresses, [ip("10.244.0.5"), ip("10.244.0.6")]);
    assert_eq!(
        slice.ports,
        [
            ExportedPort::Exact {
                proto: PROTO_TCP,
                port: 18080
            },
            ExportedPort::Exact {
                proto: PROTO_UDP,
                port: 53
            }
        ]
    );
    // A port with no number is every port; a protocol left out is TCP.
    let any = SLICE.replace("  port: 53\n  protocol: UDP\n", "  port: null\n");
    let slice = ExportedSlice::from_raw(&raw(&any), "f").unwrap().unwrap();
    assert_eq!(slice.ports[1], ExportedPort::Any);
}

/// A dual-stack Service gets one slice per family: the IPv6 one is read
/// as the IPv4 one.
#[test]
fn an_ipv6_slice_exports_its_ipv6_addresses() {
    let v6 = SLICE
        .replace("addressType: IPv4", "addressType: IPv6")
        .replace("  - 10.244.0.5", "  - fd00:10:244::5")
        .replace("  - 10.244.0.6", "  - fd00:10:244::6");
    let slice = ExportedSlice::from_raw(&raw(&v6), "f").unwrap().unwrap();
    assert_eq!(
        slice.addresses,
        [ip("fd00:10:244::5"), ip("fd00:10:244::6")]
    );
    assert_eq!(slice.ports.len(), 2);
    let mixed = v6.replace("  - fd00:10:244::6", "  - 10.244.0.6");
    let error = ExportedSlice::from_raw(&raw(&mixed), "f").unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("field endpoints[1].addresses[0]: not IPv6, as addressType says"),
        "{error}"
    );
}

#[test]
fn slices_of_other_managers_or_families_are_not_exported() {
    // Liqo's reflected slices carry the peer's endpoints, not ours.
    let reflected = SLICE.replace(
        "endpointslice-controller.k8s.io",
        "endpointslice.reflection.liqo.io",
    );
    assert_eq!(
        ExportedSlice::from_raw(&raw(&reflected), "f").unwrap(),
        None
    );
    let names = SLICE.replace("addressType: IPv4", "addressType: FQDN");
    assert_eq!(ExportedSlice::from_raw(&raw(&names), "f").unwrap(), None);
    let empty = SLICE.split("endpoints:").next().unwrap().to_owned() + "endpoints: null\n";
    let slice = ExportedSlice::from_raw(&raw(&empty), "f").unwrap().unwrap();
    assert!(slice.addresses.is_empty() && slice.ports.is_empty());
}

#[test]
fn a_broken_slice_is_refused_naming_the_field() {
    let error = |yaml: String| {
        ExportedSlice::from_raw(&raw(&yaml), "f")
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error(SLICE.replace("protocol: UDP", "protocol: QUIC")),
        "f: EndpointSlice shop/web-8x2kq: field ports[1].protocol: String(\"QUIC\") is not TCP, UDP or SCTP"
    );
    assert!(
        error(SLICE.replace("port: 18080", "port: 70000"))
            .ends_with("field ports[0].port: Number(70000) is not a port")
    );
    assert!(
        error(SLICE.replace("  - 10.244.0.6", "  - fd00::6"))
            .ends_with("field endpoints[1].addresses[0]: not IPv4, as addressType says")
    );
    assert!(
        error(SLICE.replace("endpoints:\n", "endpoints: 3\nx:\n"))
            .ends_with("field endpoints: not a list")
    );
}

/// A NamespaceOffloading as Liqo v0.10's controller writes its status:
/// every peer is listed, by its NamespaceMap's name, and only those whose
/// `OffloadingRequired` is `True` were selected.
const OFFLOADING: &str = r#"
apiVersion: offloading.liqo.io/v1alpha1
kind: NamespaceOffloading
metadata:
  name: offloading
  namespace: shop
spec:
  clusterSelector:
    nodeSelectorTerms:
    - matchExpressions:
      - key: liqo.io/remote-cluster-id
        operator: In
        values: [cluster-a]
  namespaceMappingStrategy: DefaultName
  podOffloadingStrategy: LocalAndRemote
status:
  observedGeneration: 1
  offloadingPhase: Ready
  remoteNamespaceName: shop-b-ebe9fb
  remoteNamespacesConditions:
    a-34ab3e:
    - lastTransitionTime: "2024-05-01T10:00:00Z"
      message: The remote cluster has been selected through the ClusterSelector field
      reason: ClusterSelected
      status: "True"
      type: OffloadingRequired
    - lastTransitionTime: "2024-05-01T10:00:02Z"
      message: Namespace correctly offloaded on this cluster
      reason: NamespaceCreated
      status: "True"
      type: Ready
    c-9ad7dd:
    - lastTransitionTime: "2024-05-01T10:00:00Z"
      message: The remote cluster has not been selected through the ClusterSelector field
      reason: ClusterNotSelected
      status: "False"
      type: OffloadingRequired
"#;

#[test]
fn an_offloading_selects_the_peers_whose_offloading_is_required() {
    let offloading = Offloading::from_raw(&raw(OFFLOADING), "f").unwrap();
    assert_eq!(offloading.key.namespace, "shop");
    assert_eq!(offloading.selected, BTreeSet::from(["a-34ab3e".to_owned()]));
    let fresh = OFFLOADING.split("status:").next().unwrap();
    assert!(
        Offloading::from_raw(&raw(fresh), "f")
            .unwrap()
            .selected
            .is_empty()
    );
    let broken = OFFLOADING.replace("    c-9ad7dd:\n", "    c-9ad7dd: 1\n    d:\n");
    assert_eq!(
        Offloading::from_raw(&raw(&broken), "f")
            .unwrap_err()
            .to_string(),
        "f: NamespaceOffloading shop/offloading: field status.remoteNamespacesConditions.c-9ad7dd: not a list"
    );
}
