//! `--forward-past-netfilter`: whether the overlay's programs forward what
//! the FIB settles in one step past the node's netfilter, fixed by the
//! operator or, with `auto`, following what the node's rules could do to
//! forwarded packets.

use clap::ValueEnum;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::{
    kernel::netfilter::{self, Hooks},
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
    /// one could act on any. Followed every second.
    Auto,
}

/// The operator's choice, and what the hooks hold if it matters.
pub struct PastNetfilterSetting {
    mode: PastNetfilter,
    /// Followed only in `auto`.
    hooks: Option<watch::Receiver<Hooks>>,
    /// `isthmus_forward_past_netfilter` and
    /// `isthmus_forward_stack_destinations`, once the metrics exist.
    gauges: Option<(Gauge, Gauge)>,
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
            let past = wants(mode, Some(&hooks));
            info!(mode = ?mode, past, hooks = %*hooks, "forwarding past netfilter decided by the node's rules");
        } else {
            info!(mode = ?mode, "forwarding past netfilter fixed by the operator");
        }
        setting
    }

    /// Whether packets should skip netfilter now.
    pub fn wanted(&self) -> bool {
        let hooks = self.hooks.as_ref().map(watch::Receiver::borrow);
        wants(self.mode, hooks.as_deref())
    }

    /// Reports the setting in `past`, and how many destinations take the
    /// stack in `stack_destinations`, from now on.
    pub fn report_in(&mut self, past: Gauge, stack_destinations: Gauge) {
        past.set(i64::from(self.wanted()));
        self.gauges = Some((past, stack_destinations));
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
    /// when that changes what they do. No packet skips netfilter while the
    /// destinations that must take the stack are not all written: they are
    /// written before forwarding past it starts, and emptied only after it
    /// stopped. Called on every pass: unchanged, it reads and compares only.
    pub fn apply(&self, overlay: &mut Overlay) {
        let hooks = self.hooks.as_ref().map(watch::Receiver::borrow);
        let hooks = hooks.as_deref();
        let reason = || hooks.map(ToString::to_string).unwrap_or_default();
        let destinations = hooks.map_or(&[][..], Hooks::stack_destinations);
        let wanted = wants(self.mode, hooks);
        if !wanted {
            switch(overlay, false, reason);
        }
        let written = match overlay.set_stack_destinations(destinations) {
            Ok(changed) => {
                if changed {
                    let count = destinations.len();
                    info!(
                        destinations = count,
                        "the destinations the node's rules act on take the stack"
                    );
                }
                true
            }
            Err(e) => {
                error!(error = %e, "writing the destinations that take the stack; forwarding through netfilter until that succeeds");
                false
            }
        };
        if wanted {
            switch(overlay, written, reason);
        }
        if let Some((past, stack_destinations)) = &self.gauges {
            past.set(i64::from(overlay.past_netfilter()));
            stack_destinations.set(overlay.stack_destinations() as i64);
        }
    }
}

/// Whether packets should skip netfilter in `mode`, given what the hooks
/// hold where they are followed.
fn wants(mode: PastNetfilter, hooks: Option<&Hooks>) -> bool {
    match (mode, hooks) {
        (PastNetfilter::On, _) => true,
        (PastNetfilter::Auto, Some(hooks)) => hooks.clear(),
        _ => false,
    }
}

/// Starts or stops forwarding past netfilter, saying so, and why
/// (`hooks`), when it changes.
fn switch(overlay: &mut Overlay, past: bool, hooks: impl Fn() -> String) {
    match overlay.set_past_netfilter(past) {
        Ok(false) => {}
        Ok(true) if past => info!(hooks = hooks(), "forwarding past netfilter again"),
        Ok(true) => warn!(
            hooks = hooks(),
            "forwarding through netfilter: a rule could act on forwarded packets"
        ),
        Err(e) => error!(error = %e, "writing the overlay's settings; will retry"),
    }
}
