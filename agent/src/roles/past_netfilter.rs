//! `--forward-past-netfilter`: whether the overlay's programs forward what
//! the FIB settles in one step past the node's netfilter, fixed by the
//! operator or, with `auto`, following what the node's forward hook holds.

use clap::ValueEnum;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tracing::{error, info, warn};

use crate::{
    kernel::netfilter::{self, ForwardHooks},
    roles::overlay::Overlay,
};

/// Whether packets the FIB settles in one step skip the node's netfilter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PastNetfilter {
    /// Always through the stack.
    Off,
    /// Always past it, whatever its FORWARD chains hold.
    On,
    /// Past it while no base chain at the forward hook (iptables-legacy,
    /// iptables-nft or nftables) holds a rule or drops; through it while
    /// one does, followed every second.
    Auto,
}

/// The operator's choice, and what the forward hook holds if it matters.
pub struct PastNetfilterSetting {
    mode: PastNetfilter,
    /// Followed only in `auto`.
    hooks: Option<watch::Receiver<ForwardHooks>>,
    /// `isthmus_forward_past_netfilter`, once the metrics exist.
    gauge: Option<Gauge>,
}

impl PastNetfilterSetting {
    /// Reads the forward hook now, and follows it from then on, in `auto`.
    pub fn new(mode: PastNetfilter) -> Self {
        let hooks = (mode == PastNetfilter::Auto).then(netfilter::watch_forward_hooks);
        let setting = Self {
            mode,
            hooks,
            gauge: None,
        };
        if let Some(hooks) = &setting.hooks {
            let hooks = hooks.borrow();
            info!(mode = ?mode, past = setting.wanted(), forward_hook = %*hooks, "forwarding past netfilter decided by the forward hook");
        } else {
            info!(mode = ?mode, "forwarding past netfilter fixed by the operator");
        }
        setting
    }

    /// Whether packets should skip netfilter now.
    pub fn wanted(&self) -> bool {
        match (self.mode, &self.hooks) {
            (PastNetfilter::On, _) => true,
            (PastNetfilter::Auto, Some(hooks)) => hooks.borrow().clear(),
            _ => false,
        }
    }

    /// Reports the setting in `gauge` from now on.
    pub fn report_in(&mut self, gauge: Gauge) {
        gauge.set(i64::from(self.wanted()));
        self.gauge = Some(gauge);
    }

    /// Completes when the forward hook changed; never when it is not followed.
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
    /// when that changes what they do.
    pub fn apply(&mut self, overlay: &mut Overlay) {
        let wanted = self.wanted();
        match overlay.set_past_netfilter(wanted) {
            Ok(false) => {}
            Ok(true) => {
                let hooks = self.hooks.as_ref().map(|h| h.borrow().to_string());
                let reason = hooks.unwrap_or_default();
                match wanted {
                    true => info!(forward_hook = %reason, "forwarding past netfilter again"),
                    false => {
                        warn!(forward_hook = %reason, "forwarding through netfilter: a forward-hook chain could act on forwarded packets");
                    }
                }
            }
            Err(e) => error!(error = %e, "writing the overlay's settings; will retry"),
        }
        if let Some(gauge) = &self.gauge {
            gauge.set(i64::from(overlay.past_netfilter()));
        }
    }
}
