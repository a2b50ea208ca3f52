//! iptables-legacy's tables (`x_tables`, no nftables) at the hooks a
//! forwarded packet crosses, read with the `getsockopt` calls
//! `iptables-legacy -L` makes. Only the tables the namespace already has
//! are read: asking for another would create it, and hook it into every
//! packet's path. Their rules are counted, not read: each counts as acting.

use std::{fs, io, os::fd::AsRawFd};

use socket2::{Domain, Socket, Type};

use super::rules::{Chain, Rule};

/// Where the kernel lists the namespace's `x_tables`.
const TABLE_NAMES: &str = "/proc/thread-self/net/ip_tables_names";
const IPT_SO_GET_INFO: libc::c_int = 64;
const IPT_SO_GET_ENTRIES: libc::c_int = 65;
/// The hooks a forwarded packet crosses, and their chains' names.
const HOOKS: [(usize, &str); 3] = [(0, "PREROUTING"), (2, "FORWARD"), (4, "POSTROUTING")];
const TABLE_NAME_LEN: usize = 32;
/// `struct ipt_getinfo`: name, `valid_hooks`, `hook_entry`[5], underflow[5],
/// `num_entries`, size.
const GETINFO_LEN: usize = 84;
const HOOK_ENTRY: usize = 36;
const UNDERFLOW: usize = 56;
const SIZE: usize = 80;
/// `struct ipt_get_entries` up to its entries (8-byte aligned).
const ENTRIES_OFFSET: usize = 40;
/// In `struct ipt_entry`: where its target starts, and where the next entry.
const TARGET_OFFSET: usize = 88;
const NEXT_OFFSET: usize = 90;
/// In a standard target: the verdict, after `struct xt_entry_target`.
const VERDICT: usize = 32;
/// A standard target's verdict for DROP (`-NF_DROP - 1`).
const VERDICT_DROP: i32 = -1;

/// The chains of every table the namespace has at the hooks a forwarded
/// packet crosses.
pub(super) fn chains() -> io::Result<Vec<Chain>> {
    let names = match fs::read_to_string(TABLE_NAMES) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other?,
    };
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, None)?;
    let mut chains = Vec::new();
    for table in names.lines().filter(|name| !name.is_empty()) {
        let info = get_info(&socket, table)?;
        chains.extend(hooked_chains(&socket, table, &info)?);
    }
    Ok(chains)
}

/// `table`'s chains at the hooks a forwarded packet crosses.
fn hooked_chains(socket: &Socket, table: &str, info: &[u8]) -> io::Result<Vec<Chain>> {
    let valid_hooks = word(info, TABLE_NAME_LEN).unwrap_or(0);
    let hooked: Vec<(usize, &str)> = HOOKS
        .into_iter()
        .filter(|(hook, _)| valid_hooks & (1 << hook) != 0)
        .collect();
    if hooked.is_empty() {
        return Ok(Vec::new());
    }
    let size = word(info, SIZE).ok_or_else(|| invalid(table))?;
    let entries = get_entries(socket, table, size)?;
    let mut chains = Vec::new();
    for (hook, name) in hooked {
        let (entry, policy) = hook_bounds(info, hook).ok_or_else(|| invalid(table))?;
        let (rules, drops) = read_chain(&entries, entry, policy).ok_or_else(|| invalid(table))?;
        chains.push(Chain {
            table: format!("iptables-legacy {table}"),
            name: name.into(),
            hooked: true,
            drops,
            rules: (1..=rules as u64).map(unread_rule).collect(),
        });
    }
    Ok(chains)
}

/// The `position`th rule of a chain, which could do anything.
fn unread_rule(position: u64) -> Rule {
    Rule {
        handle: position,
        effects: vec!["an iptables-legacy rule, which is not read".into()],
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
pub(super) fn read_chain(entries: &[u8], entry: usize, policy: usize) -> Option<(usize, bool)> {
    let mut rules = 0;
    let mut at = entry;
    while at < policy {
        let next = usize::from(half(entries, at + NEXT_OFFSET)?);
        if next == 0 {
            return None;
        }
        at += next;
        rules += 1;
    }
    if at != policy {
        return None;
    }
    let target = usize::from(half(entries, policy + TARGET_OFFSET)?);
    let verdict = word(entries, policy + target + VERDICT)? as i32;
    Some((rules, verdict == VERDICT_DROP))
}

fn get_info(socket: &Socket, table: &str) -> io::Result<Vec<u8>> {
    let mut info = vec![0; GETINFO_LEN];
    info[..TABLE_NAME_LEN].copy_from_slice(&table_name(table)?);
    getsockopt(socket, IPT_SO_GET_INFO, &mut info)?;
    Ok(info)
}

fn get_entries(socket: &Socket, table: &str, size: u32) -> io::Result<Vec<u8>> {
    let mut request = vec![0; ENTRIES_OFFSET + size as usize];
    request[..TABLE_NAME_LEN].copy_from_slice(&table_name(table)?);
    request[TABLE_NAME_LEN..TABLE_NAME_LEN + 4].copy_from_slice(&size.to_ne_bytes());
    getsockopt(socket, IPT_SO_GET_ENTRIES, &mut request)?;
    Ok(request.split_off(ENTRIES_OFFSET))
}

fn getsockopt(socket: &Socket, option: libc::c_int, buffer: &mut [u8]) -> io::Result<()> {
    let mut len = buffer.len() as libc::socklen_t;
    // SAFETY: `buffer` is valid for writes of `len` bytes, and `len` is a
    // valid socklen_t the kernel may lower.
    let done = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_IP,
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

/// A table's name as the kernel takes it: NUL-padded to 32 bytes.
fn table_name(table: &str) -> io::Result<[u8; TABLE_NAME_LEN]> {
    let mut name = [0; TABLE_NAME_LEN];
    name.get_mut(..table.len())
        .filter(|_| table.len() < TABLE_NAME_LEN)
        .ok_or_else(|| invalid(table))?
        .copy_from_slice(table.as_bytes());
    Ok(name)
}

fn invalid(table: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the iptables-legacy table {table:?} does not hold together"),
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

    /// An entry of `len` bytes whose standard target carries `verdict`.
    fn entry(len: u16, verdict: i32) -> Vec<u8> {
        let mut e = vec![0; usize::from(len)];
        let target: u16 = 112;
        e[TARGET_OFFSET..TARGET_OFFSET + 2].copy_from_slice(&target.to_ne_bytes());
        e[NEXT_OFFSET..NEXT_OFFSET + 2].copy_from_slice(&len.to_ne_bytes());
        let at = usize::from(target) + VERDICT;
        e[at..at + 4].copy_from_slice(&verdict.to_ne_bytes());
        e
    }

    #[test]
    fn rules_are_counted_up_to_the_policy_and_its_verdict_read() {
        let rules = [entry(152, 0), entry(200, 0)].concat();
        let table = [rules.clone(), entry(152, VERDICT_DROP), entry(152, -2)].concat();
        assert_eq!(read_chain(&table, 0, rules.len()), Some((2, true)));
        let accepting = [entry(152, -2), entry(152, -2)].concat();
        assert_eq!(read_chain(&accepting, 0, 0), Some((0, false)));
    }

    #[test]
    fn entries_that_do_not_hold_together_are_refused() {
        let table = [entry(152, 0), entry(152, -2)].concat();
        assert_eq!(read_chain(&table, 0, 100), None, "the policy mid-entry");
        assert_eq!(read_chain(&table, 0, 4000), None, "beyond the table");
        assert_eq!(
            read_chain(&vec![0; 300], 0, 152),
            None,
            "a zero-length entry"
        );
        assert_eq!(
            read_chain(&table[..200], 0, 152),
            None,
            "a truncated policy"
        );
    }

    #[test]
    fn table_names_are_padded_and_bounded() {
        assert_eq!(&table_name("filter").unwrap()[..7], b"filter\0");
        assert!(table_name(&"x".repeat(32)).is_err());
    }
}
