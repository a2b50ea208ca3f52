//! This node's side of the dataplane as the run loop drives it: the
//! devices the programs attach to, the overlay, and what the node's
//! networks allow.

use std::{collections::BTreeMap, net::Ipv4Addr};

use tracing::{error, warn};

use crate::{
    commands::policy::PolicyArgs,
    control::run::Host,
    kernel::{
        dataplane::{AttachMode, Dataplane},
        link::LinkEvents,
    },
    model::{node::Node, object::ObjectKind, peer::Peer, policy::Policy},
    roles::{
        masquerade::MasqueradeAddress,
        nat_device::NatDevice,
        overlay::{Overlay, PodDevices},
        past_netfilter::PastNetfilterSetting,
    },
};

/// This host's side of the dataplane: the loaded programs, the overlay and
/// the pod devices it steers from.
pub(super) struct NodeHost {
    /// Kept for the agent's lifetime: the XDP guard's link lives with it.
    pub(super) dataplane: Dataplane,
    pub(super) overlay: Option<Overlay>,
    pub(super) pods: PodDevices,
    pub(super) attach: AttachMode,
    /// What objects may ask of this node; its addresses may change.
    pub(super) policy: PolicyArgs,
    /// The gateway's NAT devices, by name.
    pub(super) nat: BTreeMap<String, NatDevice>,
    /// Whether the NAT devices are the tunnel's, one per Liqo v1 peer,
    /// rather than `--nat-dev`.
    pub(super) nat_follows_tunnels: bool,
    /// Device changes, to follow them at once.
    pub(super) links: LinkEvents,
    /// Whether the overlay's programs skip netfilter, and what decides it.
    pub(super) past_netfilter: PastNetfilterSetting,
    /// Where flows that need it are masqueraded to.
    pub(super) masquerade: MasqueradeAddress,
}

impl Host for NodeHost {
    /// Follows the devices the programs attach to: the NAT device, pods',
    /// and the overlay's uplink.
    fn refresh_devices(&mut self) {
        for nat in self.nat.values_mut() {
            nat.refresh(&mut self.dataplane, self.attach);
        }
        self.pods.refresh(&mut self.dataplane, self.attach);
        if let Some(overlay) = self.overlay.as_mut() {
            self.past_netfilter.apply(overlay);
            overlay.refresh_uplink(&mut self.dataplane, self.attach);
        }
    }

    /// Brings the overlay's tables up to date. Returns whether it could;
    /// it logs why not.
    fn sync_nodes(&mut self, nodes: &[Node], active: Option<&str>) -> bool {
        let mut synced = true;
        if let Some(overlay) = self.overlay.as_mut()
            && let Err(e) = overlay.sync(nodes, active)
        {
            error!(kind = %ObjectKind::Node, error = %e, "updating the overlay's node table; will retry");
            synced = false;
        }
        self.refresh_devices();
        synced
    }

    fn address(&self) -> Option<Ipv4Addr> {
        self.overlay.as_ref().and_then(Overlay::local_address)
    }

    fn policy(&self) -> Policy {
        self.policy.policy()
    }

    fn follow_peers(&mut self, peers: &[Peer]) {
        self.masquerade.follow(peers);
    }

    fn follow_tunnel_devices(&mut self, devices: &[String]) {
        if !self.nat_follows_tunnels {
            return;
        }
        self.nat.retain(|device, _| {
            let kept = devices.contains(device);
            if !kept && let Err(e) = self.dataplane.detach_nat(device) {
                warn!(dev = %device, error = %e, "unpinning the NAT programs' links to a deleted tunnel device");
            }
            kept
        });
        let new: Vec<&String> = devices
            .iter()
            .filter(|d| !self.nat.contains_key(*d))
            .collect();
        for device in new {
            match NatDevice::start(&mut self.dataplane, device, self.attach) {
                Ok(nat) => {
                    self.nat.insert(device.clone(), nat);
                }
                Err(e) => {
                    error!(dev = %device, error = %e, "attaching the NAT programs to a tunnel device; will retry");
                }
            }
        }
    }

    fn after_first_pass(&mut self) {
        for nat in self.nat.values_mut() {
            nat.replace_inherited(&mut self.dataplane, self.attach);
        }
    }

    /// A device changed, or the netfilter rules that decide whether packets
    /// skip netfilter.
    fn devices_changed(&mut self) -> impl Future<Output = ()> + Send {
        let (links, past_netfilter) = (&mut self.links, &mut self.past_netfilter);
        async move {
            tokio::select! {
                () = links.changed() => {}
                () = past_netfilter.changed() => {}
            }
        }
    }
}
