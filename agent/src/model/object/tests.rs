//! Documents read in every shape Liqo wrote, and the errors of those it
//! did not.

use super::*;

#[test]
fn reads_both_layouts_liqo_wrote() {
    let docs = parse_documents(
        Path::new("peers.yaml"),
        "apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata: {name: a, namespace: liqo}\nspec: {remotePodCIDR: 10.0.0.0/24, podCIDR: 10.9.0.0/24}\nstatus: {remotePodCIDR: 10.8.0.0/24}\n---\n\
         apiVersion: net.liqo.io/v1alpha1\nkind: TunnelEndpoint\nmetadata: {name: b}\nspec: {podCIDR: 10.2.0.0/24, externalCIDR: 10.3.0.0/24}\nstatus: {localPodCIDR: 10.1.0.0/24, remotePodCIDR: 10.8.0.0/24}\n",
    );
    assert_eq!(docs.len(), 2);
    let Ok(Object::TunnelEndpoint(a)) = &docs[0] else {
        panic!("{docs:?}")
    };
    assert_eq!(a.key.to_string(), "liqo/a");
    assert_eq!(a.layout(), Layout::Spec);
    let (path, value) = a.network("remotePodCIDR");
    assert_eq!(
        (path, value.and_then(Value::as_str)),
        ("remotePodCIDR", Some("10.0.0.0/24"))
    );
    // The invented "everything in status" layout is not read.
    assert_eq!(a.network("localPodCIDR").1, None);
    let Ok(Object::TunnelEndpoint(b)) = &docs[1] else {
        panic!("{docs:?}")
    };
    assert_eq!(b.layout(), Layout::Legacy);
    let read = |f| {
        let (path, value) = b.network(f);
        (path, value.and_then(Value::as_str))
    };
    assert_eq!(
        read("localPodCIDR"),
        ("status.localPodCIDR", Some("10.1.0.0/24"))
    );
    assert_eq!(read("remotePodCIDR"), ("spec.podCIDR", Some("10.2.0.0/24")));
    assert_eq!(
        read("remoteExternalCIDR"),
        ("spec.externalCIDR", Some("10.3.0.0/24"))
    );
}

#[test]
fn rejects_other_kinds_naming_file_and_field() {
    let docs = parse_documents(
        Path::new("x.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\n",
    );
    let err = docs[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("x.yaml"), "{err}");
    assert!(err.contains("cm"), "{err}");
    assert!(err.contains("kind"), "{err}");
}

#[test]
fn reads_a_json_document() {
    let docs = parse_documents(
        Path::new("nm.json"),
        r#"{"apiVersion": "net.liqo.io/v1alpha1", "kind": "NatMapping", "metadata": {"name": "nm"}, "spec": {"clusterID": "a", "clusterMappings": {"10.1.0.5": "192.168.0.45"}}}"#,
    );
    let Ok(Object::NatMapping(raw)) = &docs[0] else {
        panic!("{docs:?}")
    };
    assert_eq!(raw.key.name, "nm");
    let broken = parse_documents(Path::new("b.json"), "{\"kind\": ");
    assert!(
        broken[0]
            .as_ref()
            .unwrap_err()
            .to_string()
            .starts_with("b.json: document 1: invalid YAML")
    );
}

/// The fast path must read a NatMapping exactly as the scanner does, or
/// step aside.
#[test]
fn the_plain_natmapping_reader_agrees_with_the_scanner_or_steps_aside() {
    let head = "apiVersion: net.liqo.io/v1alpha1\nkind: NatMapping\nmetadata:\n  name: nm\n  labels: {clusterID: a}\nspec:\n  clusterID: a\n";
    let block = "  clusterMappings:\n    10.1.0.5: 192.168.0.45\n    10.1.0.6:   192.168.0.46\n";
    let cases = [
        (format!("{head}{block}"), true),
        (format!("{head}{block}  podCIDR: 10.0.40.0/24\n"), true),
        (
            format!("{head}{block}\n  externalCIDR: 10.0.41.0/24\n"),
            true,
        ),
        (
            format!("{head}{block}    10.1.0.7: \"192.168.0.47\"\n"),
            false,
        ),
        (format!("{head}{block}    # a comment\n"), false),
        (format!("{head}{block}    10.1.0.5: 192.168.0.48\n"), false),
        (
            format!("{head}{block}    10.1.0.7: 192.168.0.47 # why\n"),
            false,
        ),
        (
            format!("{head}{block}      10.1.0.8: 192.168.0.48\n"),
            false,
        ),
        (
            format!("{head}{block}\n    10.1.0.9: 192.168.0.49\n"),
            false,
        ),
        (format!("---\n{head}{block}"), false),
        // A tab in an entry's indentation: YAML refuses it (found by the
        // objects fuzz target).
        (
            format!("{head}  clusterMappings:\n   \t 10.1.0.5: 192.168.0.45\n"),
            false,
        ),
        // Control characters in an entry's indentation: YAML refuses them
        // anywhere (found by the objects fuzz target, after the tab).
        (
            format!("{head}  clusterMappings:\n    \x0b\x0b10.1.0.5: 192.168.0.45\n"),
            false,
        ),
        (
            format!("{head}{block}    10.1.0.6: 192.168.0.46\x7f\n"),
            false,
        ),
        (
            format!("{head}  clusterMappings: {{10.1.0.5: 192.168.0.45}}\n"),
            false,
        ),
        (
            head.replace(
                "labels: {clusterID: a}",
                "annotations:\n    clusterMappings:\n      1.2.3.4: 5.6.7.8",
            ) + block,
            true,
        ),
        (
            format!("{head}{block}").replace("NatMapping", "TunnelEndpoint"),
            false,
        ),
        // The block libyaml reads as the inside of a quoted annotation:
        // the real one must win.
        (
            head.replace(
                "labels: {clusterID: a}",
                "annotations:\n    note: \"\nspec:\n  clusterMappings:\n    1.2.3.4: 5.6.7.8\n\"",
            ) + block,
            false,
        ),
        (
            head.replace(
                "labels: {clusterID: a}",
                "annotations:\n    note: |\n      spec:\n        clusterMappings:\n          1.2.3.4: 5.6.7.8",
            ) + block,
            true,
        ),
    ];
    for (text, fast) in &cases {
        let scanned: Result<Value, _> = serde_yaml_ng::from_str(text);
        match plain_natmapping(text) {
            Some(value) => {
                assert!(*fast, "fast path taken for:\n{text}");
                assert_eq!(Some(&value), scanned.as_ref().ok(), "for:\n{text}");
            }
            None => assert!(!*fast, "fast path refused:\n{text}"),
        }
    }
}

#[test]
fn reports_broken_yaml_with_its_position() {
    let docs = parse_documents(Path::new("y.yaml"), "a: [1, 2\n");
    let err = docs[0].as_ref().unwrap_err().to_string();
    assert!(err.starts_with("y.yaml: document 1: invalid YAML"), "{err}");
}

#[test]
fn every_kind_has_its_one_entry_and_the_error_names_them_all() {
    for (index, kind) in ObjectKind::ALL.into_iter().enumerate() {
        assert_eq!(kind as usize, index, "{kind}: out of the registry's order");
    }
    let wanted = ObjectKind::wanted();
    for kind in ObjectKind::ALL {
        assert!(wanted.contains(kind.as_str()), "{wanted}: {kind}");
    }
    assert!(
        wanted.starts_with("net.liqo.io/v1alpha1 TunnelEndpoint or NatMapping, v1 Node or Pod, "),
        "{wanted}"
    );
    let gateways_write: Vec<_> = ObjectKind::ALL.into_iter().filter(|k| k.stored()).collect();
    assert_eq!(
        gateways_write,
        [
            ObjectKind::TunnelEndpoint,
            ObjectKind::NatMapping,
            ObjectKind::IsthmusGatewayServer,
            ObjectKind::IsthmusGatewayClient
        ]
    );
}

#[test]
fn a_kind_is_known_only_with_its_own_api_version() {
    for kind in ObjectKind::ALL {
        assert_eq!(
            ObjectKind::of(kind.api_version(), kind.as_str()),
            Some(kind)
        );
        assert_eq!(kind.to_string(), kind.as_str());
    }
    assert_eq!(ObjectKind::of("v1", "TunnelEndpoint"), None);
    assert_eq!(ObjectKind::of(API_VERSION, "Node"), None);
    assert_eq!(ObjectKind::of(API_VERSION, "tunnelendpoint"), None);
    assert_eq!(ObjectKind::NatMapping.plural(), "natmappings");
}
