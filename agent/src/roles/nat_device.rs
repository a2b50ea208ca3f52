//! The gateway's device the NAT programs translate on, followed as it is
//! recreated. An external tunnel (wireguard-go, Liqo's way) deletes its
//! device when it restarts and creates a new one under the same name; the
//! programs stay loaded, so attaching them again takes milliseconds.

use tracing::{error, info, warn};

use crate::kernel::{
    dataplane::{AttachMode, Dataplane, DataplaneError},
    link,
};

/// The NAT device and the ifindex our programs were attached to.
pub struct NatDevice {
    dev: String,
    attached_to: Option<u32>,
    /// A previous agent's programs translate here until ours replace them.
    inherited: bool,
}

impl NatDevice {
    /// Attaches the NAT programs to `dev`, unless a previous agent's are
    /// attached there (a restart): verifying ours takes seconds, so theirs
    /// keep translating until [`NatDevice::replace_inherited`].
    pub fn start(
        dataplane: &mut Dataplane,
        dev: &str,
        mode: AttachMode,
    ) -> Result<Self, DataplaneError> {
        let inherited = dataplane.nat_attached(dev);
        if !inherited {
            dataplane.attach_nat(dev, mode)?;
        }
        Ok(Self {
            dev: dev.to_owned(),
            attached_to: link::ifindex(dev).ok(),
            inherited,
        })
    }

    /// Replaces a previous agent's programs with ours.
    pub fn replace_inherited(&mut self, dataplane: &mut Dataplane, mode: AttachMode) {
        if !std::mem::take(&mut self.inherited) {
            return;
        }
        if let Err(e) = self.attach(dataplane, mode) {
            error!(dev = %self.dev, error = %e,
                "replacing the NAT programs a previous agent attached; they stay, and translate as they did");
        }
    }

    /// Attaches the programs again if the device was recreated since; a
    /// device that is gone is waited for.
    pub fn refresh(&mut self, dataplane: &mut Dataplane, mode: AttachMode) {
        let Ok(now) = link::ifindex(&self.dev) else {
            return;
        };
        if self.attached_to == Some(now) {
            return;
        }
        match self.attach(dataplane, mode) {
            Ok(()) => {
                info!(dev = %self.dev, ifindex = now, "NAT device recreated; programs attached again");
            }
            Err(e) => {
                warn!(dev = %self.dev, error = %e, "attaching the NAT programs to a recreated device; will retry");
            }
        }
    }

    /// Attaches our programs and records the device they are on.
    fn attach(
        &mut self,
        dataplane: &mut Dataplane,
        mode: AttachMode,
    ) -> Result<(), DataplaneError> {
        dataplane.attach_nat(&self.dev, mode)?;
        self.attached_to = link::ifindex(&self.dev).ok();
        Ok(())
    }
}
