//! iptables-legacy's and ip6tables-legacy's tables (`x_tables`, no
//! nftables) at the hooks a forwarded packet crosses, read with the
//! `getsockopt` calls `iptables-legacy -L` makes. Only the tables the
//! namespace already has are read: asking for another would create it, and
//! hook it into every packet's path. Their rules are counted, not read:
//! each counts as acting.

use std::{fs, io, os::fd::AsRawFd};

use socket2::{Domain, Socket, Type};

use super::rules::{Chain, IpFamily, Rule};

/// One family's `x_tables`: where the kernel lists the namespace's, how
/// they are asked for, and how their entries are laid out.
struct Tables {
    family: IpFamily,
    /// The command that shows them, for messages.
    command: &'static str,
    names: &'static str,
    domain: Domain,
    level: libc::c_int,
    layout: Layout,
}

/// Where an entry (`struct ipt_entry`, `struct ip6t_entry`) says its
/// target starts, and where the next entry does.
#[derive(Clone, Copy)]
pub(super) struct Layout {
    target_offset: usize,
    next_offset: usize,
}

/// iptables-legacy's: after a 84-byte `struct ipt_ip` and `nfcache`.
const IPV4: Tables = Tables {
    family: IpFamily::Ipv4,
    command: "iptables-legacy",
    names: "/proc/thread-self/net/ip_tables_names",
    domain: Domain::IPV4,
    level: libc::SOL_IP,
    layout: Layout {
        target_offset: 88,
        next_offset: 90,
    },
};

/// ip6tables-legacy's: after a 136-byte `struct ip6t_ip6` and `nfcache`.
const IPV6: Tables = Tables {
    family: IpFamily::Ipv6,
    command: "ip6tables-legacy",
    names: "/proc/thread-self/net/ip6_tables_names",
    domain: Domain::IPV6,
    level: libc::SOL_IPV6,
    layout: Layout {
        target_offset: 140,
        next_offset: 142,
    },
};

/// `IPT_SO_GET_INFO` and `IP6T_SO_GET_INFO`, and the same for entries.
const SO_GET_INFO: libc::c_int = 64;
const SO_GET_ENTRIES: libc::c_int = 65;
/// The hooks a forwarded packet crosses, and their chains' names.
const HOOKS: [(usize, &str); 3] = [(0, "PREROUTING"), (2, "FORWARD"), (4, "POSTROUTING")];
const TABLE_NAME_LEN: usize = 32;
/// `struct ipt_getinfo`: name, `valid_hooks`, `hook_entry`[5], underflow[5],
/// `num_entries`, size.
const GETINFO_LEN: usize = 84;
const HOOK_ENTRY: usize = 36;
const UNDERFLOW: usize = 56;
const SIZE: usize = 80;
/// `struct ipt_get_entries` up to its entries (8-byte aligned), as
/// `struct ip6t_get_entries`.
const ENTRIES_OFFSET: usize = 40;
/// In a standard target: the verdict, after `struct xt_entry_target`.
const VERDICT: usize = 32;
/// A standard target's verdict for DROP (`-NF_DROP - 1`).
const VERDICT_DROP: i32 = -1;

/// The chains of every table of either family the namespace has at the
/// hooks a forwarded packet crosses.
pub(super) fn chains() -> io::Result<Vec<Chain>> {
    let mut chains = IPV4.chains()?;
    chains.extend(IPV6.chains()?);
    Ok(chains)
}

impl Tables {
    /// This family's chains at the hooks a forwarded packet crosses.
    fn chains(&self) -> io::Result<Vec<Chain>> {
        let names = match fs::read_to_string(self.names) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            other => other?,
        };
        let socket = Socket::new(self.domain, Type::DGRAM, None)?;
        let mut chains = Vec::new();
        for table in names.lines().filter(|name| !name.is_empty()) {
            let info = self.get_info(&socket, table)?;
            chains.extend(self.hooked_chains(&socket, table, &info)?);
        }
        Ok(chains)
    }

    fn get_info(&self, socket: &Socket, table: &str) -> io::Result<Vec<u8>> {
        let mut info = vec![0; GETINFO_LEN];
        info[..TABLE_NAME_LEN].copy_from_slice(&self.table_name(table)?);
        getsockopt(socket, self.level, SO_GET_INFO, &mut info)?;
        Ok(info)
    }

    fn get_entries(&self, socket: &Socket, table: &str, size: u32) -> io::Result<Vec<u8>> {
        let mut request = vec![0; ENTRIES_OFFSET + size as usize];
        request[..TABLE_NAME_LEN].copy_from_slice(&self.table_name(table)?);
        request[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&size.to_ne_bytes());
        getsockopt(socket, self.level, SO_GET_ENTRIES, &mut request)?;
        Ok(request.split_off(ENTRIES_OFFSET))
    }

    fn table_name(&self, table: &str) -> io::Result<[u8; TABLE_NAME_LEN]> {
        table_name(table).ok_or_else(|| invalid(self.command, table))
    }

    /// `table`'s chains at the hooks a forwarded packet crosses.
    fn hooked_chains(&self, socket: &Socket, table: &str, info: &[u8]) -> io::Result<Vec<Chain>> {
        let invalid = || invalid(self.command, table);
        let valid_hooks = word(info, TABLE_NAME_LEN).unwrap_or(0);
        let hooked: Vec<(usize, &str)> = HOOKS
            .into_iter()
            .filter(|(hook, _)| valid_hooks & (1 << hook) != 0)
            .collect();
        if hooked.is_empty() {
            return Ok(Vec::new());
        }
        let size = word(info, SIZE).ok_or_else(invalid)?;
        let entries = self.get_entries(socket, table, size)?;
        let mut chains = Vec::new();
        for (hook, name) in hooked {
            let (entry, policy) = hook_bounds(info, hook).ok_or_else(invalid)?;
            let (rules, drops) =
                read_chain(&entries, entry, policy, self.layout).ok_or_else(invalid)?;
            chains.push(Chain {
                table: format!("{} {table}", self.command),
                family: Some(self.family),
                name: name.into(),
                hooked: true,
                drops,
                rules: (1..=rules as u64)
                    .map(|position| unread_rule(self.command, position))
                    .collect(),
            });
        }
        Ok(chains)
    }
}

/// The `position`th rule of a chain of `command`'s, which could do
/// anything.
fn unread_rule(command: &str, position: u64) -> Rule {
    Rule {
        handle: position,
        effects: vec![format!("an {command} rule, which is not read")],
        ..Rule::default()
    }
}

/// Where `hook`'s chain's first rule and its policy are, in the table.
fn hook_bounds(info: &[u8], hook: usize) -> Option<(usize, usize)> {
    let entry = word(info, HOOK_ENTRY + 4 * hook)?;
    let policy = word(info, UNDERFLOW + 4 * hook)?;
    Some((entry as usize, policy as usize))
}

/// The rules between `entry` and `policy` in a table's entries, and
/// whether the policy drops; none if the entries do not hold together.
pub(super) fn read_chain(
    entries: &[u8],
    entry: usize,
    policy: usize,
    layout: Layout,
) -> Option<(usize, bool)> {
    let mut rules = 0;
    let mut at = entry;
    while at < policy {
        let next = usize::from(half(entries, at + layout.next_offset)?);
        if next == 0 {
            return None;
        }
        at += next;
        rules += 1;
    }
    if at != policy {
        return None;
    }
    let target = usize::from(half(entries, policy + layout.target_offset)?);
    let verdict = word(entries, policy + target + VERDICT)? as i32;
    Some((rules, verdict == VERDICT_DROP))
}

fn getsockopt(
    socket: &Socket,
    level: libc::c_int,
    option: libc::c_int,
    buffer: &mut [u8],
) -> io::Result<()> {
    let mut len = buffer.len() as libc::socklen_t;
    // SAFETY: `buffer` is valid for writes of `len` bytes, and `len` is a
    // valid socklen_t the kernel may lower.
    let done = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            level,
            option,
            buffer.as_mut_ptr().cast(),
            &raw mut len,
        )
    };
    match done {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// A table's name as the kernel takes it: NUL-padded to 32 bytes; none
/// if it is longer.
fn table_name(table: &str) -> Option<[u8; TABLE_NAME_LEN]> {
    let mut name = [0; TABLE_NAME_LEN];
    name.get_mut(..table.len())
        .filter(|_| table.len() < TABLE_NAME_LEN)?
        .copy_from_slice(table.as_bytes());
    Some(name)
}

fn invalid(command: &str, table: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the {command} table {table:?} does not hold together"),
    )
}

fn word(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn half(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry of `len` bytes laid out as `tables` lay theirs, whose
    /// standard target carries `verdict`.
    fn entry(tables: &Tables, len: u16, verdict: i32) -> Vec<u8> {
        let Layout {
            target_offset,
            next_offset,
        } = tables.layout;
        let mut e = vec![0; usize::from(len)];
        let target: u16 = 168;
        e[target_offset..target_offset + 2].copy_from_slice(&target.to_ne_bytes());
        e[next_offset..next_offset + 2].copy_from_slice(&len.to_ne_bytes());
        let at = usize::from(target) + VERDICT;
        e[at..at + 4].copy_from_slice(&verdict.to_ne_bytes());
        e
    }

    #[test]
    fn rules_are_counted_up_to_the_policy_and_its_verdict_read_in_either_family() {
        for tables in [&IPV4, &IPV6] {
            let entry = |len, verdict| entry(tables, len, verdict);
            let rules = [entry(208, 0), entry(256, 0)].concat();
            let table = [rules.clone(), entry(208, VERDICT_DROP), entry(208, -2)].concat();
            let read = |table: &[u8], policy| read_chain(table, 0, policy, tables.layout);
            assert_eq!(
                read(&table, rules.len()),
                Some((2, true)),
                "{}",
                tables.command
            );
            let accepting = [entry(208, -2), entry(208, -2)].concat();
            assert_eq!(read(&accepting, 0), Some((0, false)), "{}", tables.command);
        }
    }

    #[test]
    fn entries_that_do_not_hold_together_are_refused() {
        let table = [entry(&IPV4, 208, 0), entry(&IPV4, 208, -2)].concat();
        let read = |table: &[u8], policy| read_chain(table, 0, policy, IPV4.layout);
        assert_eq!(read(&table, 100), None, "the policy mid-entry");
        assert_eq!(read(&table, 4000), None, "beyond the table");
        assert_eq!(read(&vec![0; 400], 208), None, "a zero-length entry");
        assert_eq!(read(&table[..250], 208), None, "a truncated policy");
        // An IPv6 table read with IPv4's layout finds its lengths elsewhere.
        let ipv6 = [entry(&IPV6, 208, 0), entry(&IPV6, 208, -2)].concat();
        assert_eq!(read(&ipv6, 208), None, "another family's layout");
    }

    #[test]
    fn table_names_are_padded_and_bounded() {
        assert_eq!(&table_name("filter").unwrap()[..7], b"filter\0");
        assert!(table_name(&"x".repeat(32)).is_none());
        let error = IPV6.table_name(&"x".repeat(32)).unwrap_err();
        assert!(error.to_string().contains("ip6tables-legacy"), "{error}");
    }
}
