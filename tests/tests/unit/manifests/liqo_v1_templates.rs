//! `manifests/liqo-v1/templates`: Liqo v1's gateway templates with Isthmus
//! as the `wireguard` container. Rendered as Liqo v1.2's controllers render
//! them, for the fixtures' GatewayServer and GatewayClient, they fit Liqo's
//! CRDs and Kubernetes' schemas, keep the labels, volume and containers
//! Liqo's controllers rely on, and give `isthmus-agent liqo-wireguard`
//! flags it takes.

use std::net::Ipv4Addr;

use clap::Parser;
use isthmus_agent::{
    commands::liqo_wireguard::{LiqoWireguardArgs, Settings},
    model::peer::{Endpoint, GatewayRole},
};

use super::{liqo_v1_crds::liqo_schema, *};

/// What Liqo's GatewayServer and GatewayClient controllers give their
/// templates (`server-operator/server_controller.go:52-59,177-185` at
/// v1.2.0): the gateway object's name, namespace, UID, spec, the peer's
/// cluster ID, and the Secret it names (none from `liqoctl peer`).
pub(super) fn template_data(gateway: &Value) -> Value {
    serde_json::json!({
        "Name": gateway["metadata"]["name"],
        "Namespace": gateway["metadata"]["namespace"],
        "GatewayUID": gateway["metadata"]["uid"],
        "ClusterID": gateway["metadata"]["labels"]["liqo.io/remote-cluster-id"],
        "SecretName": gateway["spec"]["secretRef"]["name"].as_str().unwrap_or(""),
        "Spec": gateway["spec"],
    })
}

/// The value of one template action: `.Name`, `.Spec.Endpoint.Port` (Go's
/// field names, read in the spec's JSON names), or `index .X 0`.
fn action(expression: &str, data: &Value) -> String {
    let (path, index) = match expression.strip_prefix("index ") {
        Some(rest) => {
            let (path, index) = rest.rsplit_once(' ').unwrap();
            (path, Some(index.parse::<usize>().unwrap()))
        }
        None => (expression, None),
    };
    let mut value = data;
    for (depth, field) in path.trim_start_matches('.').split('.').enumerate() {
        let json_name = match (depth, field.chars().all(|c| c.is_ascii_uppercase())) {
            (0, _) => field.to_owned(),
            (_, true) => field.to_ascii_lowercase(),
            (_, false) => field[..1].to_ascii_lowercase() + &field[1..],
        };
        value = &value[json_name.as_str()];
    }
    if let Some(i) = index {
        value = &value[i];
    }
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A string with its `{{ ... }}` actions replaced.
fn render_text(text: &str, data: &Value) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let end = rest[start..].find("}}").unwrap() + start;
        out.push_str(&rest[..start]);
        out.push_str(&action(rest[start + 2..end].trim(), data));
        rest = &rest[end + 2..];
    }
    out + rest
}

/// `template` rendered as Liqo's `RenderTemplate` does
/// (`external-network/utils/template.go` at v1.2.0): every string's
/// actions; a string that is a number becomes one, except in labels and
/// annotations; a `?key` is kept, as `key`, only if its value is not empty.
pub(super) fn render(template: &Value, data: &Value, force_string: bool) -> Value {
    match template {
        Value::String(text) => {
            let text = render_text(text, data);
            match (force_string, text.parse::<i64>()) {
                (false, Ok(n)) => Value::from(n),
                _ => Value::String(text),
            }
        }
        Value::Object(map) => {
            let force =
                force_string || map.contains_key("labels") || map.contains_key("annotations");
            let mut out = serde_json::Map::new();
            for (key, value) in map {
                let rendered = render(value, data, force);
                match key.strip_prefix('?') {
                    Some(_) if rendered == "" || rendered == 0 => {}
                    Some(key) => {
                        out.insert(key.to_owned(), rendered);
                    }
                    None => {
                        out.insert(key.clone(), rendered);
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| render(v, data, force_string))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The Deployment (and a server's Service) Liqo makes from `template` for
/// the fixture `gateway`: the template's object rendered, then the keys
/// Secret Liqo generates put in the `wireguard-config` volume
/// (`wggatewayclient_controller.go:249-258`).
fn rendered(template: &str, gateway: &str) -> (Value, Option<Value>) {
    let template = &yaml_file(&format!("liqo-v1/templates/{template}"))[0];
    let gateway = &yaml_file(&format!("../tests/fixtures/liqo-v1/{gateway}"))[0];
    let object = render(
        &template["spec"]["template"],
        &template_data(gateway),
        false,
    );
    let mut deployment = object["spec"]["deployment"].clone();
    deployment["apiVersion"] = "apps/v1".into();
    deployment["kind"] = "Deployment".into();
    let volumes = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap();
    let keys = volumes
        .iter_mut()
        .find(|v| v["name"] == "wireguard-config")
        .unwrap();
    keys["secret"]["secretName"] = gateway["status"]["secretRef"]["name"].clone();
    let service = object["spec"].get("service").map(|service| {
        let mut service = service.clone();
        service["apiVersion"] = "v1".into();
        service["kind"] = "Service".into();
        service
    });
    (deployment, service)
}

fn container<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The settings `isthmus-agent` takes from the `wireguard` container's args.
fn isthmus_settings(deployment: &Value) -> Settings {
    #[derive(Parser)]
    struct Agent {
        #[command(subcommand)]
        command: Subcommand,
    }
    #[derive(clap::Subcommand)]
    enum Subcommand {
        LiqoWireguard(LiqoWireguardArgs),
    }
    let args = container(deployment, "wireguard")["args"]
        .as_array()
        .unwrap();
    let argv = std::iter::once("isthmus-agent").chain(args.iter().map(|a| a.as_str().unwrap()));
    let Subcommand::LiqoWireguard(args) = Agent::try_parse_from(argv).unwrap().command;
    args.settings().unwrap()
}

#[test]
fn the_templates_fit_liqo_v1_2s_crds() {
    for (file, crd) in [
        (
            "wireguard-server-template.yaml",
            "networking.liqo.io_wggatewayservertemplates.yaml",
        ),
        (
            "wireguard-client-template.yaml",
            "networking.liqo.io_wggatewayclienttemplates.yaml",
        ),
    ] {
        let template = &yaml_file(&format!("liqo-v1/templates/{file}"))[0];
        let schema = liqo_schema(crd, "v1beta1");
        let errors: Vec<String> = schema
            .iter_errors(template)
            .map(|e| e.to_string())
            .collect();
        assert_eq!(errors, Vec::<String>::new(), "{file}");
    }
    assert_eq!(
        kustomize("liqo-v1/templates"),
        [
            "liqo-v1/templates/wireguard-server-template.yaml",
            "liqo-v1/templates/wireguard-client-template.yaml"
        ]
    );
}

#[test]
fn rendered_for_a_peering_they_give_what_liqo_and_kubernetes_accept() {
    let (server, service) = rendered("wireguard-server-template.yaml", "gatewayserver-rome.yaml");
    let (client, none) = rendered("wireguard-client-template.yaml", "gatewayclient-rome.yaml");
    assert!(none.is_none(), "a client has no Service");
    let service = service.unwrap();
    let report = validate_objects("templates", [&server, &service, &client]);
    assert_eq!(passed(&report), 3, "resources checked:\n{report}");

    // The Service: the port of the GatewayServer, none of the optional
    // fields it leaves empty.
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(service["spec"]["ports"][0]["port"], 51840);
    assert!(service["spec"].get("loadBalancerIP").is_none());
    assert!(service["spec"]["ports"][0].get("nodePort").is_none());

    for (deployment, mode) in [(&server, "server"), (&client, "client")] {
        let pod = &deployment["spec"]["template"];
        let labels = &pod["metadata"]["labels"];
        // What Liqo's fabric and controllers select the active gateway pod by.
        assert_eq!(labels["networking.liqo.io/component"], "gateway");
        assert_eq!(labels["networking.liqo.io/active"], "true");
        assert_eq!(labels["networking.liqo.io/gateway-name"], "rome");
        for (key, value) in deployment["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap()
        {
            assert_eq!(
                &labels[key], value,
                "the Deployment selects its pod by {key}"
            );
        }
        if mode == "server" {
            for (key, value) in service["spec"]["selector"].as_object().unwrap() {
                assert_eq!(&labels[key], value, "the Service selects the pod by {key}");
            }
        }
        assert_eq!(deployment["spec"]["replicas"], 1);
        let names: Vec<&str> = pod["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["gateway", "wireguard", "geneve"]);
        // Liqo's own containers, from its v1.2.0 images, on our side.
        for (name, image) in [
            ("gateway", "ghcr.io/liqotech/gateway:v1.2.0"),
            ("geneve", "ghcr.io/liqotech/gateway/geneve:v1.2.0"),
        ] {
            let liqo = container(deployment, name);
            assert_eq!(liqo["image"], image);
            assert!(
                liqo["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|a| a == "--leader-election=false")
            );
        }
        assert!(
            container(deployment, "gateway")["args"]
                .as_array()
                .unwrap()
                .contains(&Value::from(format!("--mode={mode}")))
        );
        // Ours: the agent's image, NET_ADMIN alone, the key where it reads it.
        let ours = container(deployment, "wireguard");
        assert_eq!(ours["image"], "ghcr.io/isthmus/isthmus-agent:0.2.0-dev");
        assert_eq!(ours["securityContext"]["privileged"], false);
        assert_eq!(
            ours["securityContext"]["capabilities"]["drop"],
            serde_json::json!(["ALL"])
        );
        assert_eq!(
            ours["securityContext"]["capabilities"]["add"],
            serde_json::json!(["NET_ADMIN"])
        );
        let mounts = ours["volumeMounts"].as_array().unwrap();
        assert!(mounts.iter().any(|m| m["name"] == "wireguard-config"
            && m["mountPath"] == "/etc/wireguard/keys"));
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        let keys = volumes
            .iter()
            .find(|v| v["name"] == "wireguard-config")
            .unwrap();
        assert_eq!(keys["secret"]["secretName"], "gw-rome");
    }

    // The agent takes the flags Liqo rendered, and they say what the
    // gateway objects say.
    let served = isthmus_settings(&server);
    assert_eq!(served.gateway.role, GatewayRole::Server);
    assert_eq!(served.gateway.key.name, "rome");
    assert_eq!(served.gateway.cluster_id, "rome");
    assert_eq!(
        served.gateway_uid.as_deref(),
        Some("9a4c2e7b-3f1d-4a8e-b6c0-1e5d7f9a2b83")
    );
    assert_eq!(
        (served.listen_port, served.mtu, served.endpoint.clone()),
        (51840, 1340, Endpoint::Learned)
    );
    let client_gateway = &yaml_file("../tests/fixtures/liqo-v1/gatewayclient-rome.yaml")[0];
    let contacting = isthmus_settings(&client);
    assert_eq!(contacting.gateway.role, GatewayRole::Client);
    let address: Ipv4Addr = client_gateway["spec"]["endpoint"]["addresses"][0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(contacting.endpoint, Endpoint::Addr(address.into()));
    assert_eq!(
        u64::from(contacting.endpoint_port),
        client_gateway["spec"]["endpoint"]["port"].as_u64().unwrap()
    );
    assert_eq!(contacting.serve_on.len(), 2, "metrics and health");
}
