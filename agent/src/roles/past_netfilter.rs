//! `--forward-past-netfilter`: whether the overlay's programs forward what
//! the FIB settles in one step past the node's netfilter, fixed by the
//! operator or, with `auto`, following what the node's rules could do to
//! forwarded packets.

use clap::ValueEnum;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::{
    kernel::netfilter::{self, Hooks, NodeHooks, rules::IpFamily},
    roles::overlay::Overlay,
};

/// Whether packets the FIB settles in one step skip the node's netfilter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PastNetfilter {
    /// Always through the stack.
    Off,
    /// Always past it, whatever its FORWARD chains hold.
    On,
    /// Past it while no netfilter rule at the hooks a forwarded packet
    /// crosses could act on it (iptables-legacy's, iptables-nft's or
    /// nftables'), but to the destinations rules act on; through it while
    /// one could act on any. Decided for each family apart, and followed
    /// every second.
    Auto,
}

/// One family's gauges: whether it goes past netfilter, and how many of
/// its destinations take the stack.
pub struct FamilyGauges {
    /// `isthmus_forward_past_netfilter`, or its `_ipv6` twin.
    pub past: Gauge,
    /// `isthmus_forward_stack_destinations`, or its `_ipv6` twin.
    pub stack_destinations: Gauge,
}

/// The operator's choice, and what the hooks hold if it matters.
pub struct PastNetfilterSetting {
    mode: PastNetfilter,
    /// Followed only in `auto`.
    hooks: Option<watch::Receiver<NodeHooks>>,
    /// Each family's gauges, in [`IpFamily::BOTH`]'s order, once the
    /// metrics exist.
    gauges: Option<[FamilyGauges; 2]>,
}

impl PastNetfilterSetting {
    /// Reads the hooks now, and follows them from then on, in `auto`.
    pub fn new(mode: PastNetfilter) -> Self {
        let hooks = (mode == PastNetfilter::Auto).then(netfilter::watch_hooks);
        let setting = Self {
            mode,
            hooks,
            gauges: None,
        };
        if let Some(hooks) = setting.hooks.as_ref().map(watch::Receiver::borrow) {
            let past = IpFamily::BOTH.map(|family| wants(mode, Some(hooks.of(family))));
            info!(mode = ?mode, ipv4 = past[0], ipv6 = past[1], hooks = %*hooks, "forwarding past netfilter decided by the node's rules");
        } else {
            info!(mode = ?mode, "forwarding past netfilter fixed by the operator");
        }
        setting
    }

    /// The families whose packets should skip netfilter now.
    pub fn wanted(&self) -> Vec<IpFamily> {
        let hooks = self.hooks.as_ref().map(watch::Receiver::borrow);
        IpFamily::BOTH
            .into_iter()
            .filter(|family| wants(self.mode, hooks.as_ref().map(|h| h.of(*family))))
            .collect()
    }

    /// Reports the setting in each family's `gauges`, from now on.
    pub fn report_in(&mut self, gauges: [FamilyGauges; 2]) {
        let wanted = self.wanted();
        for (family, gauges) in IpFamily::BOTH.iter().zip(&gauges) {
            gauges.past.set(i64::from(wanted.contains(family)));
        }
        self.gauges = Some(gauges);
    }

    /// Completes when the hooks changed; never when they are not followed.
    pub async fn changed(&mut self) {
        let followed = match self.hooks.as_mut() {
            Some(hooks) => hooks.changed().await.is_ok(),
            None => false,
        };
        if !followed {
            std::future::pending::<()>().await;
        }
    }

    /// Brings the overlay's programs in line with the setting, saying why
    /// when that changes what they do, for each family. No packet skips
    /// netfilter while the destinations that must take the stack are not
    /// all written: they are written before forwarding past it starts, and
    /// emptied only after it stopped. Called on every pass: unchanged, it
    /// reads and compares only.
    pub fn apply(&self, overlay: &mut Overlay) {
        let hooks = self.hooks.as_ref().map(watch::Receiver::borrow);
        for family in IpFamily::BOTH {
            self.apply_family(overlay, family, hooks.as_ref().map(|h| h.of(family)));
        }
        for (family, gauges) in IpFamily::BOTH.iter().zip(self.gauges.iter().flatten()) {
            gauges.past.set(i64::from(overlay.past_netfilter(*family)));
            let count = overlay.stack_destinations(*family) as i64;
            gauges.stack_destinations.set(count);
        }
    }

    /// [`PastNetfilterSetting::apply`] for `family`, whose hooks are
    /// `hooks` where they are followed.
    fn apply_family(&self, overlay: &mut Overlay, family: IpFamily, hooks: Option<&Hooks>) {
        let reason = || hooks.map(ToString::to_string).unwrap_or_default();
        let destinations = hooks.map_or(&[][..], Hooks::stack_destinations);
        let wanted = wants(self.mode, hooks);
        if !wanted {
            switch(overlay, family, false, reason);
        }
        let written = match overlay.set_stack_destinations(family, destinations) {
            Ok(changed) => {
                if changed {
                    let count = destinations.len();
                    info!(
                        %family,
                        destinations = count,
                        "the destinations the node's rules act on take the stack"
                    );
                }
                true
            }
            Err(e) => {
                error!(%family, error = %e, "writing the destinations that take the stack; forwarding through netfilter until that succeeds");
                false
            }
        };
        if wanted {
            switch(overlay, family, written, reason);
        }
    }
}

/// Whether packets of a family should skip netfilter in `mode`, given what
/// the hooks hold for it where they are followed.
fn wants(mode: PastNetfilter, hooks: Option<&Hooks>) -> bool {
    match (mode, hooks) {
        (PastNetfilter::On, _) => true,
        (PastNetfilter::Auto, Some(hooks)) => hooks.clear(),
        _ => false,
    }
}

/// Starts or stops forwarding `family`'s packets past netfilter, saying
/// so, and why (`hooks`), when it changes.
fn switch(overlay: &mut Overlay, family: IpFamily, past: bool, hooks: impl Fn() -> String) {
    match overlay.set_past_netfilter(family, past) {
        Ok(false) => {}
        Ok(true) if past => info!(%family, hooks = hooks(), "forwarding past netfilter again"),
        Ok(true) => warn!(
            %family,
            hooks = hooks(),
            "forwarding through netfilter: a rule could act on forwarded packets"
        ),
        Err(e) => error!(%family, error = %e, "writing the overlay's settings; will retry"),
    }
}
