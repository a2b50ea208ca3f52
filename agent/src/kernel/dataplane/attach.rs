//! Attaching the programs to devices: TCX links where the kernel has them
//! (6.6+), netlink filters on a clsact qdisc elsewhere, each replaced in
//! place when a previous agent attached one.

use std::path::Path;

use aya::{
    Ebpf,
    maps::ProgramArray,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::{FdLink, PinnedLink},
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcHandle},
    },
};
use isthmus_common::{names, pins::Direction};
use tracing::{info, warn};

use crate::kernel::{
    link::{self, DeviceError},
    maps::gone_is_fine,
};

use super::{
    Dataplane, DataplaneError, NL_PRIORITY, direction, nl_handle, remove_pin, unpin_link, verify,
};

/// Any failure of a load or an attach, which the caller names.
type BoxedError = Box<dyn std::error::Error + Send + Sync>;

/// How to attach TC programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// TCX links where the kernel has them (6.6+), clsact otherwise.
    Auto,
    /// TCX links only.
    Tcx,
    /// A clsact qdisc with netlink filters only.
    Clsact,
}

impl AttachMode {
    /// The mode this kernel gets.
    pub fn resolve(self) -> Attached {
        match self {
            AttachMode::Auto if tcx_supported() => Attached::Tcx,
            AttachMode::Auto | AttachMode::Clsact => Attached::Clsact,
            AttachMode::Tcx => Attached::Tcx,
        }
    }
}

/// How the programs ended up attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// Through pinned TCX links.
    Tcx,
    /// Through netlink filters on a clsact qdisc.
    Clsact,
}

impl Attached {
    /// Lower-case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Attached::Tcx => "tcx",
            Attached::Clsact => "clsact",
        }
    }
}

impl Dataplane {
    /// Attaches the NAT programs to both directions of `dev`, replacing
    /// whatever a previous agent attached there.
    pub fn attach_nat(&mut self, dev: &str, mode: AttachMode) -> Result<(), DataplaneError> {
        let (egress, ingress) = nat_programs(dev, self.serves_liqo_v1)?;
        load_nat_stages(&mut self.ebpf)?;
        let mode = mode.resolve();
        self.attach(egress, dev, TcAttachType::Egress, mode)?;
        self.attach(ingress, dev, TcAttachType::Ingress, mode)?;
        info!(
            dev,
            mode = mode.as_str(),
            egress,
            ingress,
            "NAT programs attached"
        );
        Ok(())
    }

    /// Unpins the NAT programs' links to `dev`, a tunnel device going
    /// away: its pins would otherwise outlive it.
    pub fn detach_nat(&mut self, dev: &str) -> Result<(), DataplaneError> {
        for attach_type in [TcAttachType::Egress, TcAttachType::Ingress] {
            for program in names::PROGRAMS {
                unpin_link(&self.pins.link(dev, direction(attach_type), program))?;
            }
        }
        Ok(())
    }

    /// Whether the NAT programs for `dev` (a previous agent's) are
    /// attached to both its directions through the TCX links pinned for
    /// them, as the kernel says: pins can outlive the device they were
    /// made for.
    pub fn nat_attached(&self, dev: &str) -> bool {
        let (Ok((egress, ingress)), Ok(ifindex)) =
            (nat_programs(dev, self.serves_liqo_v1), link::ifindex(dev))
        else {
            return false;
        };
        [
            (TcAttachType::Egress, egress),
            (TcAttachType::Ingress, ingress),
        ]
        .into_iter()
        .all(|(attach_type, program)| {
            let pin = self.pins.link(dev, direction(attach_type), program);
            let Ok(pinned) = PinnedLink::from_pin(&pin) else {
                return false;
            };
            let Ok(info) = FdLink::from(pinned).info() else {
                return false;
            };
            tcx_link_ids(ifindex, attach_type).is_ok_and(|ids| ids.contains(&info.id()))
        })
    }

    /// Attaches the overlay's receiving program to the VXLAN device `dev`.
    pub fn attach_accept(&mut self, dev: &str, mode: AttachMode) -> Result<(), DataplaneError> {
        self.attach(
            names::PROG_ACCEPT,
            dev,
            TcAttachType::Ingress,
            mode.resolve(),
        )
    }

    /// Attaches the program that sends the node's own traffic for peers to
    /// the gateway node to the VXLAN device `dev`, on a worker.
    pub fn attach_own(&mut self, dev: &str, mode: AttachMode) -> Result<(), DataplaneError> {
        self.attach(names::PROG_OWN, dev, TcAttachType::Egress, mode.resolve())
    }

    /// Unpins the TCX links of `dev`, a device that is gone: the kernel
    /// detached them with it.
    pub fn forget_device(&mut self, dev: &str) -> Result<(), DataplaneError> {
        for program in names::PROGRAMS {
            for attach_type in [TcAttachType::Ingress, TcAttachType::Egress] {
                remove_pin(&self.pins.link(dev, direction(attach_type), program))?;
            }
        }
        Ok(())
    }

    /// Attaches the overlay's decapsulation to the uplink `dev`.
    pub fn attach_decap(&mut self, dev: &str, mode: AttachMode) -> Result<(), DataplaneError> {
        self.attach(
            names::PROG_DECAP,
            dev,
            TcAttachType::Ingress,
            mode.resolve(),
        )
    }

    /// Detaches the overlay's decapsulation from `dev`, which is no longer
    /// the uplink.
    pub fn detach_decap(&mut self, dev: &str) -> Result<(), DataplaneError> {
        let _ = tc::qdisc_detach_program(dev, TcAttachType::Ingress, names::PROG_DECAP);
        unpin_link(&self.pins.link(dev, Direction::Ingress, names::PROG_DECAP))
    }

    /// Loads the steering program before any pod device appears: a kernel
    /// that refuses it (for want of `CAP_PERFMON`, say) stops the agent at
    /// start, with the reason, where each device's attach would only be
    /// retried.
    pub fn load_steer(&mut self) -> Result<(), DataplaneError> {
        let program = names::PROG_STEER;
        loaded_classifier(&mut self.ebpf, program)
            .map(drop)
            .map_err(|source| DataplaneError::Verify { program, source })
    }

    /// Attaches the worker's steering program to pod-facing device `dev`.
    pub fn attach_steer(&mut self, dev: &str, mode: AttachMode) -> Result<(), DataplaneError> {
        self.attach(
            names::PROG_STEER,
            dev,
            TcAttachType::Ingress,
            mode.resolve(),
        )
    }

    fn attach(
        &mut self,
        program: &'static str,
        dev: &str,
        attach_type: TcAttachType,
        mode: Attached,
    ) -> Result<(), DataplaneError> {
        self.attach_program(program, dev, attach_type, mode)
            .map_err(|source| DataplaneError::Program {
                program,
                dev: dev.into(),
                source,
            })
    }

    fn attach_program(
        &mut self,
        program: &'static str,
        dev: &str,
        attach_type: TcAttachType,
        mode: Attached,
    ) -> Result<(), BoxedError> {
        let link = self.pins.link(dev, direction(attach_type), program);
        let pin = self.pins.program(program);
        let prog = loaded_classifier(&mut self.ebpf, program)?;
        // Attach first, then drop what an agent in the other mode left: the
        // device is never without the program.
        match mode {
            Attached::Tcx => {
                attach_tcx(prog, dev, attach_type, &link)?;
                let _ = tc::qdisc_detach_program(dev, attach_type, program);
            }
            Attached::Clsact => {
                attach_clsact(prog, dev, attach_type, nl_handle(program))?;
                unpin_link(&link)?;
            }
        }
        remove_pin(&pin)?;
        prog.pin(&pin)?;
        Ok(())
    }
}

/// Puts the programs every NAT program goes on in into their program
/// arrays ([`names::MAP_ONWARD`], [`names::MAP_ICMP_ERROR`],
/// [`names::MAP_MASQUERADE`]), each loaded once.
pub fn load_nat_stages(ebpf: &mut Ebpf) -> Result<(), DataplaneError> {
    load_program_array(ebpf, names::MAP_ONWARD, names::ONWARD_PROGRAMS)?;
    load_program_array(ebpf, names::MAP_ICMP_ERROR, names::ICMP_ERROR_PROGRAMS)?;
    load_program_array(ebpf, names::MAP_MASQUERADE, names::MASQUERADE_PROGRAMS)?;
    load_program_array(
        ebpf,
        names::MAP_MASQUERADE_IN,
        names::MASQUERADE_IN_PROGRAMS,
    )?;
    load_program_array(ebpf, names::MAP_NAT6, names::NAT6_PROGRAMS)?;
    load_program_array(ebpf, names::MAP_ICMP6_ERROR, names::ICMP6_ERROR_PROGRAMS)?;
    load_program_array(ebpf, names::MAP_MASQUERADE6, names::MASQUERADE6_PROGRAMS)
}

/// Puts `programs` into the program array `array`, in its order, each
/// loaded once.
pub(super) fn load_program_array<const N: usize>(
    ebpf: &mut Ebpf,
    array: &'static str,
    programs: [&'static str; N],
) -> Result<(), DataplaneError> {
    for (index, program) in programs.into_iter().enumerate() {
        let load = |ebpf: &mut Ebpf| -> Result<(), BoxedError> {
            let fd = loaded_classifier(ebpf, program)?.fd()?.try_clone()?;
            let map = ebpf
                .map_mut(array)
                .ok_or("its program array is missing from the object")?;
            ProgramArray::try_from(map)?.set(index as u32, &fd, 0)?;
            Ok(())
        };
        load(ebpf).map_err(|source| DataplaneError::Onward {
            array,
            program,
            source,
        })?;
    }
    Ok(())
}

/// Empties the program array `array`, whose programs a previous agent may
/// have left pinned there, so that none stays loaded for nothing.
pub(super) fn clear_program_array(
    ebpf: &mut Ebpf,
    array: &'static str,
) -> Result<(), DataplaneError> {
    let map = ebpf
        .map_mut(array)
        .ok_or(DataplaneError::MissingMap(array))?;
    let mut programs = ProgramArray::try_from(map).map_err(|e| DataplaneError::Map(array, e))?;
    // Every array is indexed by link kind.
    for link in isthmus_common::counters::LINKS {
        gone_is_fine(programs.clear_index(&(link as u32)))
            .map_err(|e| DataplaneError::Map(array, e))?;
    }
    Ok(())
}

/// TC program `program`, loaded: one program serves every device it is
/// attached to, so it is loaded (and verified) once.
fn loaded_classifier<'a>(
    ebpf: &'a mut Ebpf,
    program: &'static str,
) -> Result<&'a mut SchedClassifier, BoxedError> {
    let prog: &mut SchedClassifier = ebpf
        .program_mut(program)
        .ok_or("missing from the object")?
        .try_into()?;
    if prog.fd().is_err() {
        verify::uninterrupted(|| prog.load())?;
    }
    Ok(prog)
}

/// The NAT programs, egress and ingress, for `dev`'s link type; when
/// serving Liqo v1 peers, packets come in through the peer SNAT.
fn nat_programs(dev: &str, liqo_v1: bool) -> Result<(&'static str, &'static str), DeviceError> {
    let ingress = |nat, peer_snat| if liqo_v1 { peer_snat } else { nat };
    match link::link_type(dev)? {
        link::ARPHRD_ETHER => Ok((
            names::PROG_EGRESS_ETH,
            ingress(names::PROG_INGRESS_ETH, names::PROG_PEER_SNAT_ETH),
        )),
        link::ARPHRD_NONE => Ok((
            names::PROG_EGRESS_IP,
            ingress(names::PROG_INGRESS_IP, names::PROG_PEER_SNAT_IP),
        )),
        other => Err(DeviceError {
            dev: dev.into(),
            reason: format!("link type {other} is neither Ethernet nor a raw L3 device"),
        }),
    }
}

/// Swaps `prog` into the TCX link pinned at `pin`, or creates and pins one.
fn attach_tcx(
    prog: &mut SchedClassifier,
    dev: &str,
    attach_type: TcAttachType,
    pin: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if pin.exists() {
        let link = SchedClassifierLink::try_from(FdLink::from(PinnedLink::from_pin(pin)?))?;
        match prog.attach_to_link(link) {
            Ok(id) => {
                // The pin keeps the link; closing our descriptor detaches nothing.
                drop(FdLink::try_from(prog.take_link(id)?)?);
                return Ok(());
            }
            // The device was recreated since: the old link is defunct.
            Err(e) => {
                warn!(dev, pin = %pin.display(), error = %e, "replacing a stale TCX link");
                remove_pin(pin)?;
            }
        }
    }
    let id = prog.attach_with_options(
        dev,
        attach_type,
        TcAttachOptions::TcxOrder(LinkOrder::default()),
    )?;
    FdLink::try_from(prog.take_link(id)?)?.pin(pin)?;
    Ok(())
}

/// Replaces our netlink filter on `dev`, or creates it.
fn attach_clsact(
    prog: &mut SchedClassifier,
    dev: &str,
    attach_type: TcAttachType,
    handle: TcHandle,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Err(e) = tc::qdisc_add_clsact(dev)
        && !matches!(&e, tc::TcError::NetlinkError(n) if n.raw_os_error() == Some(libc::EEXIST))
    {
        return Err(e.into());
    }
    let ours = SchedClassifierLink::attached(dev, attach_type, NL_PRIORITY, handle, None)?;
    let id = match prog.attach_to_link(ours) {
        Ok(id) => id,
        Err(_) => prog.attach_with_options(
            dev,
            attach_type,
            TcAttachOptions::Netlink(NlOptions {
                priority: NL_PRIORITY,
                handle,
                classid: None,
            }),
        )?,
    };
    // A netlink filter outlives the process unless detached: keep it, so the
    // dataplane forwards while the agent restarts.
    std::mem::forget(prog.take_link(id)?);
    Ok(())
}

fn tcx_supported() -> bool {
    aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 6, 0))
}

/// The IDs of the links attached to device `ifindex` through TCX in
/// `attach_type`'s direction. `BPF_PROG_QUERY` itself needs only
/// `CAP_NET_ADMIN`; aya's `query_tcx` also opens each program by its ID,
/// which takes `CAP_SYS_ADMIN`, which the DaemonSets do not grant.
fn tcx_link_ids(ifindex: u32, attach_type: TcAttachType) -> std::io::Result<Vec<u32>> {
    /// The `query` member of the kernel's `union bpf_attr`, as of 6.6.
    #[repr(C)]
    #[derive(Default)]
    struct ProgQuery {
        target_ifindex: u32,
        attach_type: u32,
        query_flags: u32,
        attach_flags: u32,
        prog_ids: u64,
        count: u32,
        _pad: u32,
        prog_attach_flags: u64,
        link_ids: u64,
        link_attach_flags: u64,
        revision: u64,
    }
    const BPF_PROG_QUERY: libc::c_long = 16;
    const BPF_TCX_INGRESS: u32 = 46;
    const BPF_TCX_EGRESS: u32 = 47;
    const MAX_LINKS: usize = 64;
    let mut prog_ids = [0u32; MAX_LINKS];
    let mut link_ids = [0u32; MAX_LINKS];
    let mut query = ProgQuery {
        target_ifindex: ifindex,
        attach_type: match attach_type {
            TcAttachType::Egress => BPF_TCX_EGRESS,
            _ => BPF_TCX_INGRESS,
        },
        prog_ids: prog_ids.as_mut_ptr() as u64,
        count: MAX_LINKS as u32,
        link_ids: link_ids.as_mut_ptr() as u64,
        ..ProgQuery::default()
    };
    // SAFETY: `query` has the layout of bpf_attr's query member, its
    // pointers name arrays of `count` u32s that outlive the call, and the
    // kernel reads no more than the size passed.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_QUERY,
            &raw mut query,
            std::mem::size_of::<ProgQuery>(),
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let count = (query.count as usize).min(MAX_LINKS);
    Ok(link_ids[..count].to_vec())
}
