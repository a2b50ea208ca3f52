//! What the agent may ask of the kernel: the capabilities it needs, checked
//! before it touches anything, and the system calls it makes, to which it
//! confines itself before it reads any input.
//!
//! The agent installs its own seccomp filter because the runtimes' default
//! profiles disagree about `bpf(2)`: Debian bookworm's containers-common
//! (podman, and CRI-O of that age) allows it only with `CAP_SYS_ADMIN`, so
//! under `RuntimeDefault` an agent holding `CAP_BPF` cannot open a map. The
//! DaemonSet therefore asks the runtime for no profile, and the agent
//! applies this one, the same on every runtime and outside containers.

use std::{collections::BTreeMap, fmt};

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
use thiserror::Error;

/// A capability the agent needs, and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Capability {
    /// Its name, as `capabilities(7)` spells it.
    pub name: &'static str,
    bit: u32,
    why: &'static str,
}

/// The capabilities `run` needs, the DaemonSets' `add` list.
pub const NEEDED: [Capability; 3] = [
    Capability {
        name: "CAP_NET_ADMIN",
        bit: 12,
        why: "attaching the TC programs, the TUN device and routes",
    },
    Capability {
        name: "CAP_BPF",
        bit: 39,
        why: "creating maps and loading programs",
    },
    Capability {
        name: "CAP_PERFMON",
        bit: 38,
        why: "the verifier allows the NAT programs' pointer arithmetic only with it",
    },
];

/// `CAP_SYS_ADMIN`, which the kernel counts as `CAP_BPF` and `CAP_PERFMON`.
const SYS_ADMIN_BIT: u32 = 21;

/// What the agent could not learn or set about its privileges.
#[derive(Debug, Error)]
pub enum PrivilegeError {
    /// /proc/self/status could not be read or has no `CapEff` line.
    #[error("reading the agent's capabilities from /proc/self/status: {0}")]
    Unreadable(String),
    /// The kernel refused the syscall filter.
    #[error("installing the agent's seccomp filter: {0}")]
    Filter(String),
}

/// The capabilities missing, each with what needs it.
#[derive(Debug, Error)]
pub struct MissingCapabilities(pub Vec<&'static Capability>);

impl fmt::Display for MissingCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, cap) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(f, "{sep}missing capability {}: {}", cap.name, cap.why)?;
        }
        write!(
            f,
            " (the agent needs CAP_NET_ADMIN, CAP_BPF and CAP_PERFMON, as the DaemonSets add them)"
        )
    }
}

/// The needed capabilities absent from `status` (the text of
/// /proc/self/status).
pub fn missing_in(status: &str) -> Result<Vec<&'static Capability>, PrivilegeError> {
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .ok_or_else(|| PrivilegeError::Unreadable("no CapEff line".into()))?;
    let holds = |bit: u32| effective & (1 << bit) != 0;
    // The kernel's bpf_capable() and perfmon_capable() accept CAP_SYS_ADMIN.
    let granted =
        |cap: &Capability| holds(cap.bit) || (cap.name != "CAP_NET_ADMIN" && holds(SYS_ADMIN_BIT));
    Ok(NEEDED.iter().filter(|cap| !granted(cap)).collect())
}

/// The capabilities `run` needs that this process lacks. The agent does
/// not refuse to start on them: the kernel is the judge, and the agent
/// names them beside the kernel's refusal.
pub fn missing_capabilities() -> Result<MissingCapabilities, PrivilegeError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| PrivilegeError::Unreadable(e.to_string()))?;
    Ok(MissingCapabilities(missing_in(&status)?))
}

/// Whether a seccomp filter confined this process before the agent's own
/// (a container runtime's profile, say).
pub fn runtime_filter_present() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.replace(char::is_whitespace, "") == "Seccomp:2")
    })
}

/// What the agent's seccomp filter does with a system call it does not
/// make.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SyscallFilter {
    /// Refuse it with EPERM, and log it to the kernel log.
    Enforce,
    /// Allow it, and log it to the kernel log: to find what a new code
    /// path needs.
    Log,
    /// Install no filter.
    Off,
}

/// Confines every thread of the agent to the system calls it makes. The
/// kernel logs each call the filter refuses (or, with `Log`, would refuse)
/// as an audit record of type 1326 naming the call.
pub fn confine(mode: SyscallFilter) -> Result<(), PrivilegeError> {
    let unlisted = match mode {
        SyscallFilter::Enforce => SeccompAction::Errno(libc::EPERM as u32),
        SyscallFilter::Log => SeccompAction::Log,
        SyscallFilter::Off => return Ok(()),
    };
    let program = filter(unlisted)?;
    install(&program)
}

/// The filter: every call of [`ALLOWED`] allowed, any other `unlisted`.
fn filter(unlisted: SeccompAction) -> Result<BpfProgram, PrivilegeError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| PrivilegeError::Filter(format!("{e:?}")))?;
    let rules: BTreeMap<i64, Vec<_>> = ALLOWED.iter().map(|call| (*call, Vec::new())).collect();
    SeccompFilter::new(rules, unlisted, SeccompAction::Allow, arch)
        .and_then(std::convert::TryInto::try_into)
        .map_err(|e| PrivilegeError::Filter(e.to_string()))
}

/// Installs `program` on every thread, with logging of what it refuses:
/// seccompiler's own `apply_filter_all_threads` sets no log flag.
fn install(program: &BpfProgram) -> Result<(), PrivilegeError> {
    let last =
        |what: &str| PrivilegeError::Filter(format!("{what}: {}", std::io::Error::last_os_error()));
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(last("PR_SET_NO_NEW_PRIVS"));
    }
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).map_err(|_| PrivilegeError::Filter("too long".into()))?,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    let flags = libc::SECCOMP_FILTER_FLAG_TSYNC | libc::SECCOMP_FILTER_FLAG_LOG;
    // SAFETY: `fprog` points into `program`, which outlives the call; the
    // kernel copies the filter. seccompiler's sock_filter has the layout of
    // the kernel's.
    let result = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &raw const fprog,
        )
    };
    match result {
        0 => Ok(()),
        // TSYNC returns the ID of a thread it could not synchronise.
        tid if tid > 0 => Err(PrivilegeError::Filter(format!(
            "thread {tid} could not be confined"
        ))),
        _ => Err(last("seccomp(SECCOMP_SET_MODE_FILTER)")),
    }
}

/// Every system call the agent makes, found by running it under the
/// `log` filter through the whole lab suite (`cargo xtask test`), which
/// fails if the kernel logs any other.
const ALLOWED: &[i64] = &[
    // Memory, threads and signals (std, glibc, tokio).
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_tgkill,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_prctl,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_prlimit64,
    libc::SYS_uname,
    libc::SYS_restart_syscall,
    // Files: objects, keys, /proc, /sys, the bpffs.
    libc::SYS_openat,
    libc::SYS_close,
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_lseek,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_getdents64,
    libc::SYS_readlinkat,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_mkdirat,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_linkat,
    libc::SYS_fchmod,
    libc::SYS_fsync,
    libc::SYS_ftruncate,
    libc::SYS_fcntl,
    libc::SYS_ioctl,
    libc::SYS_getcwd,
    libc::SYS_inotify_init1,
    libc::SYS_inotify_add_watch,
    libc::SYS_inotify_rm_watch,
    // Waiting.
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
    libc::SYS_pipe2,
    libc::SYS_ppoll,
    libc::SYS_dup,
    libc::SYS_dup3,
    // Sockets: netlink, the tunnel's UDP, metrics, the API server.
    libc::SYS_socket,
    libc::SYS_socketpair,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    // The dataplane.
    libc::SYS_bpf,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_arch_prctl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_stat,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_poll,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_epoll_wait,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_access,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_readlink,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_dup2,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_mkdir,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_unlink,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_rename,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_link,
];

#[cfg(test)]
mod tests {
    use super::*;

    fn status(eff: &str) -> String {
        format!("Name:\tisthmus-agent\nCapInh:\t0000000000000000\nCapEff:\t{eff}\n")
    }

    #[test]
    fn the_daemonsets_capabilities_are_enough() {
        // NET_ADMIN (12), PERFMON (38), BPF (39).
        assert!(missing_in(&status("000000c000001000")).unwrap().is_empty());
    }

    #[test]
    fn each_missing_capability_is_named_with_what_needs_it() {
        let missing = missing_in(&status("0000008000001000")).unwrap();
        assert_eq!(
            missing.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["CAP_PERFMON"]
        );
        let text = MissingCapabilities(missing).to_string();
        assert!(
            text.contains("missing capability CAP_PERFMON: the verifier"),
            "{text}"
        );
        let none = missing_in(&status("0000000000000000")).unwrap();
        assert_eq!(none.len(), 3);
    }

    #[test]
    fn sys_admin_stands_for_bpf_and_perfmon_but_not_net_admin() {
        let missing = missing_in(&status("0000000000200000")).unwrap();
        assert_eq!(
            missing.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["CAP_NET_ADMIN"]
        );
    }

    #[test]
    fn a_status_without_capabilities_is_an_error_not_a_pass() {
        assert!(missing_in("Name:\tx\n").is_err());
    }

    #[test]
    fn the_filter_compiles_for_this_machine() {
        assert!(filter(SeccompAction::Errno(1)).unwrap().len() > ALLOWED.len());
    }
}
