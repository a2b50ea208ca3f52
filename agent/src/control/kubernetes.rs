//! What the agent asks of the Kubernetes API besides the objects it
//! watches: a client, its node's role, and the gateway's key Secret.

use std::{collections::BTreeMap, path::Path};

use k8s_openapi::{
    ByteString,
    api::core::v1::{Node, Secret},
};
use kube::{
    Api, Client, Config,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use thiserror::Error;
use tracing::info;

use crate::{
    model::key_text,
    tunnel::key::{KeyError, KeyPair, generate},
};

/// The Secret key holding the private key, as text (base64).
pub const PRIVATE_KEY: &str = "privateKey";
/// The Secret key the public key is published under.
pub const PUBLIC_KEY: &str = "publicKey";

/// A failure talking to the API server, naming what was asked for.
#[derive(Debug, Error)]
pub enum KubeError {
    /// No usable configuration.
    #[error("Kubernetes client configuration ({origin}): {reason}")]
    Config {
        /// The kubeconfig file, or "in-cluster or default kubeconfig".
        origin: String,
        /// What was wrong.
        reason: String,
    },
    /// A request failed.
    #[error("{what}: {source}")]
    Api {
        /// What was asked for.
        what: String,
        /// What the client said.
        source: kube::Error,
    },
    /// A Secret holding something other than a key.
    #[error(
        "Secret {secret}: field data.{PRIVATE_KEY} is not a base64-encoded 32-byte WireGuard private key"
    )]
    BadKey {
        /// `namespace/name`.
        secret: String,
    },
    /// Another writer created the Secret, and it was gone again when read.
    #[error(
        "Secret {secret}: created by another writer, then gone; not guessing which key is current"
    )]
    Vanished {
        /// `namespace/name`.
        secret: String,
    },
    /// No randomness for a new key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A label selector not in `key=value` form.
    #[error("--gateway-label {0:?}: expected key=value")]
    BadLabel(String),
}

/// A client from `kubeconfig`, or else from the pod's service account or
/// the default kubeconfig, as kubectl finds them.
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, KubeError> {
    let config = match kubeconfig {
        Some(path) => {
            let config_error = |reason: String| KubeError::Config {
                origin: path.display().to_string(),
                reason,
            };
            let file = Kubeconfig::read_from(path).map_err(|e| config_error(e.to_string()))?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|e| config_error(e.to_string()))?
        }
        None => Config::infer().await.map_err(|e| KubeError::Config {
            origin: "in-cluster or default kubeconfig".into(),
            reason: e.to_string(),
        })?,
    };
    Client::try_from(config).map_err(|e| KubeError::Config {
        origin: "client".into(),
        reason: e.to_string(),
    })
}

/// Whether node `node` carries `label` (`key=value`).
pub async fn node_has_label(client: &Client, node: &str, label: &str) -> Result<bool, KubeError> {
    let (key, value) = label
        .split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| KubeError::BadLabel(label.into()))?;
    let found = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .map_err(|source| KubeError::Api {
            what: format!("reading Node {node}"),
            source,
        })?;
    Ok(found.metadata.labels.and_then(|l| l.get(key).cloned()) == Some(value.into()))
}

/// The gateway's key pair from Secret `namespace/name`, which is created
/// with a new key if it does not exist. The public key is published in the
/// same Secret under `publicKey`.
pub async fn key_from_secret(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<KeyPair, KubeError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let secret_name = format!("{namespace}/{name}");
    let failed = |what: &str| {
        let what = format!("{what} Secret {secret_name}");
        move |source| KubeError::Api { what, source }
    };
    // A gateway starting at the same time may create it first: then read theirs.
    for _ in 0..2 {
        if let Some(secret) = api.get_opt(name).await.map_err(failed("reading"))? {
            let pair = private_key(&secret).ok_or_else(|| KubeError::BadKey {
                secret: secret_name.clone(),
            })?;
            let public = key_text::encode(pair.public.as_bytes());
            if published_key(&secret).as_deref() != Some(public.as_str()) {
                let patch = serde_json::json!({ "stringData": { PUBLIC_KEY: public } });
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map_err(failed("publishing the public key in"))?;
                info!(secret = %secret_name, public_key = %public, "public key published");
            }
            return Ok(pair);
        }
        let private = generate()?;
        let pair = KeyPair::from_private(private);
        let public = key_text::encode(pair.public.as_bytes());
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".into(),
                    "isthmus".into(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".into()),
            data: Some(BTreeMap::from([
                (
                    PRIVATE_KEY.into(),
                    ByteString(key_text::encode(&private).into_bytes()),
                ),
                (PUBLIC_KEY.into(), ByteString(public.clone().into_bytes())),
            ])),
            ..Secret::default()
        };
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                info!(secret = %secret_name, public_key = %public, "new WireGuard key stored");
                return Ok(pair);
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => continue,
            Err(e) => return Err(failed("creating")(e)),
        }
    }
    Err(KubeError::Vanished {
        secret: secret_name,
    })
}

fn private_key(secret: &Secret) -> Option<KeyPair> {
    let text = secret.data.as_ref()?.get(PRIVATE_KEY)?;
    let bytes = key_text::decode(std::str::from_utf8(&text.0).ok()?)?;
    Some(KeyPair::from_private(bytes))
}

fn published_key(secret: &Secret) -> Option<String> {
    let text = secret.data.as_ref()?.get(PUBLIC_KEY)?;
    Some(String::from_utf8_lossy(&text.0).trim().to_owned())
}
