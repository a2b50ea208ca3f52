//! The command line of `isthmus-agent liqo-wireguard`: the flags Liqo
//! v1.2's gateway templates pass to their `wireguard` container
//! (`pkg/gateway/flags.go`, `pkg/gateway/tunnel/wireguard/flags.go`), under
//! the same names and defaults, so that a template swaps only the image
//! and the command. Each flag is checked here, and a refusal names it.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use clap::{ArgAction, ValueEnum};
use thiserror::Error;

use crate::model::{
    go_duration,
    object::ObjectKey,
    peer::{Endpoint, GatewayImplementation, GatewayRole, LiqoGateway},
};

/// Which side of the tunnel the gateway object puts us on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// A `GatewayServer`: the peer makes contact.
    Server,
    /// A `GatewayClient`: we contact the peer.
    Client,
}

/// Liqo's `--implementation`: which WireGuard Liqo would run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Implementation {
    /// The kernel module.
    Kernel,
    /// wireguard-go.
    Userspace,
}

/// `isthmus-agent liqo-wireguard`.
#[derive(clap::Args, Debug)]
pub struct LiqoWireguardArgs {
    /// The gateway object (`GatewayServer` or `GatewayClient`) this pod
    /// serves: the template's `{{ .Name }}`.
    #[arg(long)]
    pub name: String,
    /// Its namespace, the peer's tenant namespace.
    #[arg(long)]
    pub namespace: String,
    /// The peer's cluster ID: its `PublicKey` carries it as the label
    /// `liqo.io/remote-cluster-id`.
    #[arg(long)]
    pub remote_cluster_id: String,
    /// The gateway object's UID, the owner of the `Connection`.
    #[arg(long)]
    pub gateway_uid: Option<String>,
    /// Our side of the tunnel.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// Liqo's name of this container, for its leader election; unused.
    #[arg(long)]
    pub container_name: Option<String>,
    /// The tunnel device's MTU (`spec.mtu`).
    #[arg(long, default_value_t = 1340)]
    pub mtu: u32,
    /// The UDP port the tunnel listens on (`spec.endpoint.port` of a server).
    #[arg(long, default_value_t = 51840)]
    pub listen_port: u16,
    /// Client: the peer gateway's address or host name.
    #[arg(long)]
    pub endpoint_address: Option<String>,
    /// Client: the peer gateway's UDP port.
    #[arg(long, default_value_t = 51840)]
    pub endpoint_port: u16,
    /// Where the Secret with our private key (`privateKey`, 32 bytes) is mounted.
    #[arg(long, default_value = "/etc/wireguard/keys")]
    pub keys_dir: PathBuf,
    /// Client: how often a host name is looked up again (Go's duration text).
    #[arg(long, default_value = "5m")]
    pub dns_check_interval: String,
    /// Where `/metrics` is served (`:8084`, `host:port`; `0`: nowhere).
    #[arg(long, default_value = "0")]
    pub metrics_address: String,
    /// Where `/healthz` and `/readyz` are served (`0`: nowhere).
    #[arg(long, default_value = ":8085")]
    pub health_probe_bind_address: String,
    /// Liqo's leader election among replicas: not followed, so refused.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", require_equals = true)]
    pub leader_election: bool,
    /// Which WireGuard Liqo would run: Isthmus always runs its own.
    #[arg(long, value_enum, default_value_t = Implementation::Userspace)]
    pub implementation: Implementation,
    /// Server: keep the peer's endpoint across a reconfiguration, as
    /// Isthmus's tunnel always does.
    #[arg(long, action = ArgAction::Set, default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", require_equals = true)]
    pub preserve_client_endpoint: bool,
    /// The tunnel's TUN device, Liqo's name unless told otherwise.
    #[arg(long, default_value = "liqo-tunnel")]
    pub tunnel_dev: String,
    /// Datapath threads (default: one per CPU).
    #[arg(long)]
    pub tunnel_workers: Option<usize>,
    /// A kubeconfig file; by default the pod's service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The node, for `isthmus_build_info`.
    #[arg(long, env = "NODE_NAME", default_value = "")]
    pub node: String,
}

/// What the flags ask for, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The gateway object, our side and the peer's cluster ID.
    pub gateway: LiqoGateway,
    /// The gateway object's UID, if given.
    pub gateway_uid: Option<String>,
    /// Where the peer is: an address or name and its port, or `Learned`
    /// for a server.
    pub endpoint: Endpoint,
    /// The port of the peer's gateway (a client's).
    pub endpoint_port: u16,
    /// The TUN device.
    pub dev: String,
    /// Its MTU.
    pub mtu: u32,
    /// The port the tunnel listens on.
    pub listen_port: u16,
    /// The private key's file.
    pub key_file: PathBuf,
    /// How often a host name is looked up again.
    pub dns_check_interval: Duration,
    /// Where the metrics and health endpoints are served.
    pub serve_on: Vec<SocketAddr>,
    /// Datapath threads.
    pub workers: usize,
}

/// A flag that cannot be taken, named.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum OptionError {
    /// A flag's value is wrong.
    #[error("--{flag}={value}: {reason}")]
    Bad {
        /// The flag, without its dashes.
        flag: &'static str,
        /// What it was given.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// A flag the mode needs is missing.
    #[error("--{flag} is required with --mode=client, as Liqo's wireguard container requires it")]
    Missing {
        /// The flag, without its dashes.
        flag: &'static str,
    },
}

/// The smallest MTU an IPv4 link may have.
const MIN_MTU: u32 = 576;

impl LiqoWireguardArgs {
    /// The settings the flags give, or the first flag that is wrong.
    pub fn settings(&self) -> Result<Settings, OptionError> {
        if self.leader_election {
            return Err(bad(
                "leader-election",
                "true",
                "this container does not take part in Liqo's leader election; run the gateway with one replica (networking.gatewayTemplates.replicas: 1)",
            ));
        }
        if !(MIN_MTU..=u32::from(u16::MAX)).contains(&self.mtu) {
            return Err(bad(
                "mtu",
                &self.mtu.to_string(),
                &format!("outside {MIN_MTU}..=65535"),
            ));
        }
        if self.listen_port == 0 {
            return Err(bad("listen-port", "0", "the peer needs a port to reach"));
        }
        if self.tunnel_workers == Some(0) {
            return Err(bad("tunnel-workers", "0", "at least one thread"));
        }
        let dns_check_interval = go_duration::parse(&self.dns_check_interval)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                bad(
                    "dns-check-interval",
                    &self.dns_check_interval,
                    "expected a positive duration as Go writes one, such as 30s or 5m",
                )
            })?;
        let (role, endpoint) = match self.mode {
            Mode::Server => (GatewayRole::Server, Endpoint::Learned),
            Mode::Client => (GatewayRole::Client, self.client_endpoint()?),
        };
        let serve_on = [
            ("metrics-address", &self.metrics_address),
            ("health-probe-bind-address", &self.health_probe_bind_address),
        ]
        .into_iter()
        .map(|(flag, value)| bind_address(value).map_err(|reason| bad(flag, value, &reason)))
        .filter_map(Result::transpose)
        .collect::<Result<Vec<_>, _>>()?;
        Ok(Settings {
            gateway: LiqoGateway {
                role,
                implementation: GatewayImplementation::LiqoWireGuard,
                key: ObjectKey {
                    namespace: self.namespace.clone(),
                    name: self.name.clone(),
                },
                cluster_id: self.remote_cluster_id.clone(),
                port: match role {
                    GatewayRole::Server => self.listen_port,
                    GatewayRole::Client => self.endpoint_port,
                },
            },
            gateway_uid: self.gateway_uid.clone().filter(|uid| !uid.is_empty()),
            endpoint,
            endpoint_port: self.endpoint_port,
            dev: self.tunnel_dev.clone(),
            mtu: self.mtu,
            listen_port: self.listen_port,
            key_file: self.keys_dir.join("privateKey"),
            dns_check_interval,
            serve_on,
            workers: self.tunnel_workers.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
            }),
        })
    }

    /// A client's peer: `--endpoint-address` and `--endpoint-port`.
    fn client_endpoint(&self) -> Result<Endpoint, OptionError> {
        let text = self
            .endpoint_address
            .as_deref()
            .filter(|t| !t.is_empty())
            .ok_or(OptionError::Missing {
                flag: "endpoint-address",
            })?;
        if self.endpoint_port == 0 {
            return Err(bad("endpoint-port", "0", "the peer listens on a port"));
        }
        match Endpoint::parse(text) {
            Some(Endpoint::Addr(ip))
                if ip.is_unspecified() || ip.is_multicast() || is_broadcast(ip) =>
            {
                Err(bad("endpoint-address", text, "no gateway listens there"))
            }
            Some(endpoint) => Ok(endpoint),
            None => Err(bad(
                "endpoint-address",
                text,
                "neither an IP address nor a host name",
            )),
        }
    }
}

/// A bind address as Go's servers take it: `:port` for every address,
/// `host:port`, or `0` for none.
fn bind_address(text: &str) -> Result<Option<SocketAddr>, String> {
    if text == "0" {
        return Ok(None);
    }
    let expected = || "expected :PORT, HOST:PORT or 0 (none), as Liqo's flags take".to_owned();
    if let Some(port) = text.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| expected())?;
        return Ok(Some(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))));
    }
    text.parse().map(Some).map_err(|_| expected())
}

fn bad(flag: &'static str, value: &str, reason: &str) -> OptionError {
    OptionError::Bad {
        flag,
        value: value.into(),
        reason: reason.into(),
    }
}

/// Whether `ip` is IPv4's limited broadcast address.
fn is_broadcast(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V4(ip) if ip.is_broadcast())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LiqoWireguardArgs,
    }

    /// The flags as Liqo v1.2's templates render them
    /// (`deployments/liqo/templates/liqo-wireguard-gateway-*-template.yaml`),
    /// replicas 1, metrics on.
    fn liqo_renders(mode: &str, extra: &[&str]) -> Result<Settings, String> {
        let mut argv = vec![
            "test",
            "--name=rome",
            "--namespace=liqo-tenant-rome",
            "--remote-cluster-id=rome",
            "--gateway-uid=3b0d3f34-5a4e-4a59-9a39-0e0c7a3b9e11",
            "--container-name=wireguard",
            "--mtu=1340",
            "--metrics-address=:8084",
            "--health-probe-bind-address=:8085",
            "--leader-election=false",
            "--implementation=userspace",
        ];
        let mode = format!("--mode={mode}");
        argv.push(&mode);
        // A flag the test gives replaces the template's.
        let flag = |arg: &str| arg.split('=').next().unwrap_or_default().to_owned();
        argv.retain(|base| !extra.iter().any(|e| flag(e) == flag(base)));
        argv.extend(extra);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.args.settings().map_err(|e| e.to_string())
    }

    #[test]
    fn takes_the_flags_liqos_server_template_passes() {
        let settings = liqo_renders(
            "server",
            &["--listen-port=51840", "--preserve-client-endpoint=false"],
        )
        .unwrap();
        assert_eq!(settings.gateway.role, GatewayRole::Server);
        assert_eq!(settings.gateway.connection().name, "gw-rome");
        assert_eq!(settings.gateway.cluster_id, "rome");
        assert_eq!(
            settings.gateway_uid.as_deref(),
            Some("3b0d3f34-5a4e-4a59-9a39-0e0c7a3b9e11")
        );
        assert_eq!(settings.endpoint, Endpoint::Learned);
        assert_eq!((settings.listen_port, settings.mtu), (51840, 1340));
        assert_eq!(settings.dev, "liqo-tunnel");
        assert_eq!(
            settings.key_file,
            PathBuf::from("/etc/wireguard/keys/privateKey")
        );
        assert_eq!(
            settings.serve_on,
            vec![
                "0.0.0.0:8084".parse().unwrap(),
                "0.0.0.0:8085".parse().unwrap()
            ]
        );
    }

    #[test]
    fn takes_the_flags_liqos_client_template_passes() {
        let settings = liqo_renders(
            "client",
            &["--endpoint-address=203.0.113.1", "--endpoint-port=32000"],
        )
        .unwrap();
        assert_eq!(settings.gateway.role, GatewayRole::Client);
        assert_eq!(
            settings.endpoint,
            Endpoint::Addr(Ipv4Addr::new(203, 0, 113, 1).into())
        );
        assert_eq!(settings.endpoint_port, 32000);
        assert_eq!(settings.dns_check_interval, Duration::from_mins(5));
        let named = liqo_renders("client", &["--endpoint-address=GW.Rome.example"]).unwrap();
        assert_eq!(named.endpoint, Endpoint::Name("gw.rome.example".into()));
    }

    #[test]
    fn a_refused_flag_is_named_with_its_value() {
        let cases: [(&str, &[&str], &str); 9] = [
            (
                "server",
                &["--leader-election=true"],
                "--leader-election=true: this container does not take part in Liqo's leader election",
            ),
            (
                "client",
                &[],
                "--endpoint-address is required with --mode=client",
            ),
            (
                "client",
                &["--endpoint-address=203.0.113.300"],
                "--endpoint-address=203.0.113.300: neither an IP address nor a host name",
            ),
            (
                "client",
                &["--endpoint-address=0.0.0.0"],
                "--endpoint-address=0.0.0.0: no gateway listens there",
            ),
            (
                "client",
                &["--endpoint-address=gw", "--endpoint-port=0"],
                "--endpoint-port=0: the peer listens on a port",
            ),
            ("server", &["--mtu=100"], "--mtu=100: outside 576..=65535"),
            (
                "server",
                &["--listen-port=0"],
                "--listen-port=0: the peer needs a port to reach",
            ),
            (
                "server",
                &["--dns-check-interval=soon"],
                "--dns-check-interval=soon: expected a positive duration",
            ),
            (
                "server",
                &["--health-probe-bind-address=8085"],
                "--health-probe-bind-address=8085: expected :PORT, HOST:PORT or 0",
            ),
        ];
        for (mode, extra, expected) in cases {
            let error = liqo_renders(mode, extra).unwrap_err();
            assert!(error.starts_with(expected), "{extra:?}: {error}");
        }
    }

    #[test]
    fn zero_serves_nothing_and_a_bare_flag_is_true() {
        let settings = liqo_renders("server", &["--health-probe-bind-address=0"]).unwrap();
        assert_eq!(settings.serve_on, vec!["0.0.0.0:8084".parse().unwrap()]);
        let error = liqo_renders("server", &["--leader-election"]).unwrap_err();
        assert!(error.starts_with("--leader-election=true"), "{error}");
    }
}
