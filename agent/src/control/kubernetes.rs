//! What the agent asks of the Kubernetes API besides the objects it
//! watches: a client, its node's role, the gateway's key Secret, and its
//! public key for Liqo v1's peers.

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

/// The Secret key holding the private key: base64 text in the Secrets the
/// agent creates, the raw 32 bytes in Liqo v1's (`KeyEncoding`).
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
        "Secret {secret}: field data.{PRIVATE_KEY} is neither a 32-byte WireGuard private key nor its base64 text"
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
            let (pair, encoding) = private_key(&secret).ok_or_else(|| KubeError::BadKey {
                secret: secret_name.clone(),
            })?;
            let public = key_text::encode(pair.public.as_bytes());
            let published = encoding.encode(pair.public.as_bytes());
            if secret.data.as_ref().and_then(|d| d.get(PUBLIC_KEY)) != Some(&published) {
                let patch = serde_json::json!({ "data": { PUBLIC_KEY: published } });
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
        let secret = agent_secret(
            name,
            [
                (
                    PRIVATE_KEY,
                    ByteString(key_text::encode(&private).into_bytes()),
                ),
                (PUBLIC_KEY, ByteString(public.clone().into_bytes())),
            ],
        );
        match api.create(&PostParams::default(), &secret).await {
            Ok(_) => {
                info!(secret = %secret_name, public_key = %public, "new WireGuard key stored");
                return Ok(pair);
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => return Err(failed("creating")(e)),
        }
    }
    Err(KubeError::Vanished {
        secret: secret_name,
    })
}

/// Publishes `public`, the gateway's WireGuard key, in Secret
/// `namespace/name` as `publicKey`, 32 raw bytes, as Liqo v1's gateways
/// keep theirs: the status of Isthmus's gateway objects names this Secret,
/// and `liqoctl` copies the key from it to the peer's `PublicKey`. It holds
/// no private key, so that reading it reveals nothing.
pub async fn publish_public_key(
    client: &Client,
    namespace: &str,
    name: &str,
    public: &[u8; 32],
) -> Result<(), KubeError> {
    let api = Api::<Secret>::namespaced(client.clone(), namespace);
    let secret_name = format!("{namespace}/{name}");
    let failed = |what: &str| {
        let what = format!("{what} Secret {secret_name}");
        move |source| KubeError::Api { what, source }
    };
    let published = KeyEncoding::Raw.encode(public);
    let patch = Patch::Merge(serde_json::json!({ "data": { PUBLIC_KEY: published } }));
    match api.get_opt(name).await.map_err(failed("reading"))? {
        Some(secret)
            if secret.data.as_ref().and_then(|d| d.get(PUBLIC_KEY)) == Some(&published) =>
        {
            return Ok(());
        }
        Some(_) => {
            api.patch(name, &PatchParams::default(), &patch)
                .await
                .map_err(failed("publishing the public key in"))?;
        }
        None => {
            let secret = agent_secret(name, [(PUBLIC_KEY, published)]);
            // Another gateway of the cluster, with the same key, may create
            // it first.
            match api.create(&PostParams::default(), &secret).await {
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    api.patch(name, &PatchParams::default(), &patch)
                        .await
                        .map_err(failed("publishing the public key in"))?;
                }
                created => created.map(drop).map_err(failed("creating"))?,
            }
        }
    }
    info!(secret = %secret_name, public_key = %key_text::encode(public), "public key published for Liqo v1's peers");
    Ok(())
}

/// A Secret of the agent's, `name`, holding `data`.
fn agent_secret<const N: usize>(name: &str, data: [(&str, ByteString); N]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".into(),
                "isthmus".into(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()),
        ..Secret::default()
    }
}

/// How a Secret holds its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyEncoding {
    /// The base64 text, as `wg genkey` prints it: the Secrets the agent
    /// creates.
    Text,
    /// The raw 32 bytes: Liqo v1's gateway Secrets, `gw-<gateway>`
    /// (`pkg/gateway/tunnel/wireguard/k8s.go:59-87` at v1.2.0), which the
    /// peer's PublicKey is copied from.
    Raw,
}

impl KeyEncoding {
    /// The key in `data`, and how it was held.
    fn decode(data: &[u8]) -> Option<([u8; 32], Self)> {
        if let Ok(raw) = <[u8; 32]>::try_from(data) {
            return Some((raw, Self::Raw));
        }
        let text = std::str::from_utf8(data).ok()?.trim();
        Some((key_text::decode(text)?, Self::Text))
    }

    /// `key`, held this way.
    fn encode(self, key: &[u8; 32]) -> ByteString {
        ByteString(match self {
            Self::Text => key_text::encode(key).into_bytes(),
            Self::Raw => key.to_vec(),
        })
    }
}

/// The key pair of the private key `secret` holds, and how it holds it.
/// The key pair of a private key held as a Secret's data holds one: the
/// raw 32 bytes (Liqo v1's) or their base64 text (ours).
pub fn key_pair(data: &[u8]) -> Option<KeyPair> {
    KeyEncoding::decode(data).map(|(private, _)| KeyPair::from_private(private))
}

fn private_key(secret: &Secret) -> Option<(KeyPair, KeyEncoding)> {
    let data = secret.data.as_ref()?.get(PRIVATE_KEY)?;
    let (private, encoding) = KeyEncoding::decode(&data.0)?;
    Some((KeyPair::from_private(private), encoding))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_as_text_or_as_liqo_v1s_raw_bytes() {
        let key = [7u8; 32];
        for encoding in [KeyEncoding::Text, KeyEncoding::Raw] {
            let held = encoding.encode(&key);
            assert_eq!(KeyEncoding::decode(&held.0), Some((key, encoding)));
        }
        // A trailing newline, as `wg genkey > file` leaves it.
        let line = format!("{}\n", key_text::encode(&key));
        assert_eq!(
            KeyEncoding::decode(line.as_bytes()),
            Some((key, KeyEncoding::Text))
        );
        for bad in [
            &b"short"[..],
            &[0u8; 31],
            &[0u8; 33],
            b"not base64 at all, and long enough!!",
        ] {
            assert_eq!(KeyEncoding::decode(bad), None, "{bad:?}");
        }
    }
}
