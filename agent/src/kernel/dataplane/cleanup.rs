//! Removing everything the agent attached or pinned: `isthmus-agent
//! cleanup`. What is already gone counts as removed, so it can run twice.

use std::path::Path;

use aya::programs::{TcAttachType, tc};
use isthmus_common::{names, pins::Pins};

use crate::kernel::link;

use super::{DataplaneError, direction, pin_entries, remove_dir, remove_pin, unpin_link};

/// Detaches and unpins everything under `root`. Returns what was removed.
pub fn cleanup(root: &Path) -> Result<Vec<String>, DataplaneError> {
    let pins = Pins::new(root);
    let mut removed = Vec::new();
    for link in pin_entries(&pins.links())? {
        unpin_link(&link)?;
        removed.push(format!("link {}", link.display()));
    }
    let devices = link::devices().map_err(|source| DataplaneError::Io {
        path: link::SYS_CLASS_NET.into(),
        source,
    })?;
    for dev in devices {
        for program in names::PROGRAMS {
            for attach_type in [TcAttachType::Egress, TcAttachType::Ingress] {
                if tc::qdisc_detach_program(&dev, attach_type, program).is_ok() {
                    removed.push(format!(
                        "clsact filter {program} on {dev} {}",
                        direction(attach_type).as_str()
                    ));
                }
            }
        }
    }
    for dir in pins.dirs() {
        for pin in pin_entries(&dir)? {
            remove_pin(&pin)?;
            removed.push(format!("pin {}", pin.display()));
        }
        remove_dir(&dir)?;
    }
    remove_dir(pins.root())?;
    Ok(removed)
}
