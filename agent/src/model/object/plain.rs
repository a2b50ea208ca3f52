//! The fast path for the one shape of NatMapping that is large: a plain
//! block of `endpoint: external` lines, read without the YAML scanner.

use serde_yaml_ng::{Mapping, Value};

use super::ObjectKind;

/// A NatMapping of 10,000 entries spends 9 ms in the YAML scanner, nearly
/// all of it on `spec.clusterMappings`. In the plain shape kubectl and Liqo
/// write (one `a.b.c.d: e.f.g.h` per line), that block is read here and the
/// scanner reads the rest. Any other shape, or a file of several documents,
/// returns None and goes to the scanner whole, which also reports errors.
///
/// The block's key is replaced by a sentinel before the scanner reads the
/// rest, and the result is kept only if the scanner finds that sentinel as
/// `spec.clusterMappings` and nowhere else: a look-alike block inside a
/// quoted or block scalar, or under another key, sends the file to the
/// scanner whole. Where it answers, it answers as the scanner would.
pub fn plain_natmapping(text: &str) -> Option<Value> {
    let lines: Vec<&str> = text.lines().collect();
    // YAML refuses a tab where it would indent, and any other control
    // character anywhere, and this reader does not tell where those are:
    // one anywhere sends the text to the scanner.
    if refuses_any(text)
        || lines
            .iter()
            .any(|l| l.starts_with("---") || l.starts_with("..."))
    {
        return None;
    }
    // The first `clusterMappings:` met while `spec:` is the open top-level
    // key, in one pass; the sentinel checks it is really spec's.
    let mut top = "";
    let start = lines.iter().position(|l| {
        if indent_of(l) == 0 && !l.trim().is_empty() {
            top = l.trim_end();
        }
        top == "spec:" && l.trim() == "clusterMappings:"
    })?;
    let indent = indent_of(lines[start]);
    let mut entries = Mapping::new();
    let mut end = start + 1;
    let entry_indent = indent_of(lines.get(end)?);
    while let Some(line) = lines
        .get(end)
        .filter(|l| indent_of(l) > indent && !l.trim().is_empty())
    {
        let (endpoint, external) = plain_pair(line)?;
        if indent_of(line) != entry_indent
            || entries
                .insert(
                    Value::String(endpoint.into()),
                    Value::String(external.into()),
                )
                .is_some()
        {
            return None;
        }
        end += 1;
    }
    // `clusterMappings:` with nothing under it is null to the scanner.
    if entries.is_empty() {
        return None;
    }
    // After a blank line, nothing may continue the block.
    if lines[end..]
        .iter()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| indent_of(l) > indent)
    {
        return None;
    }
    let placeholder = format!(
        "{}clusterMappings: {{{SENTINEL}: 0}}",
        &lines[start][..indent]
    );
    let rest = [&lines[..start], &[placeholder.as_str()], &lines[end..]]
        .concat()
        .join("\n");
    if rest.matches(SENTINEL).count() != 1 {
        return None;
    }
    let mut value: Value = serde_yaml_ng::from_str(&rest).ok()?;
    if value.get("kind").and_then(Value::as_str) != Some(ObjectKind::NatMapping.as_str()) {
        return None;
    }
    let slot = value.get_mut("spec")?.get_mut("clusterMappings")?;
    let sentinel = Mapping::from_iter([(Value::String(SENTINEL.into()), Value::from(0))]);
    if *slot != Value::Mapping(sentinel) {
        return None;
    }
    *slot = Value::Mapping(entries);
    Some(value)
}

/// Whether YAML may refuse some character of `text`; ASCII, as most
/// objects are, is checked a byte at a time.
fn refuses_any(text: &str) -> bool {
    match text.is_ascii() {
        true => text.bytes().any(|b| (b < b' ' && b != b'\n') || b == 0x7f),
        false => text.chars().any(refused_by_yaml),
    }
}

/// Whether YAML may refuse `c` where this reader would take it: outside
/// YAML 1.2's printable set (a tab is in it, but not where it indents).
fn refused_by_yaml(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{fffe}' | '\u{ffff}')
}

/// The key the fast path puts in place of the block it read.
const SENTINEL: &str = "isthmus-fast-path-sentinel";

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// `a.b.c.d: e.f.g.h`, both plain dotted quads, which YAML reads as strings.
fn plain_pair(line: &str) -> Option<(&str, &str)> {
    let (key, value) = line.trim().split_once(": ")?;
    let (key, value) = (key.trim_end(), value.trim_start());
    (dotted_quad(key) && dotted_quad(value)).then_some((key, value))
}

fn dotted_quad(s: &str) -> bool {
    let (mut parts, mut digits) = (1, 0);
    for b in s.bytes() {
        match b {
            b'0'..=b'9' if digits < 3 => digits += 1,
            b'.' if digits > 0 => (parts, digits) = (parts + 1, 0),
            _ => return false,
        }
    }
    parts == 4 && digits > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dotted_quad_is_four_groups_of_one_to_three_digits() {
        for quad in ["10.0.0.1", "999.1.1.1", "0.0.0.0"] {
            assert!(dotted_quad(quad), "{quad}");
        }
        for other in [
            "",
            "1.2.3",
            "1.2.3.4.5",
            "1..2.3",
            ".1.2.3",
            "1.2.3.",
            "1234.1.1.1",
            "a.b.c.d",
            "1.2.3.4 ",
            "1.2.3.-4",
        ] {
            assert!(!dotted_quad(other), "{other:?}");
        }
    }

    #[test]
    fn what_yaml_refuses_is_found_in_ascii_and_beyond() {
        for refused in ["a\tb", "a\r\n", "\u{7f}", "\u{85}", "é\u{1}", "\u{ffff}"] {
            assert!(refuses_any(refused), "{refused:?}");
        }
        for taken in ["ok\n", "é: ü\n", ""] {
            assert!(!refuses_any(taken), "{taken:?}");
        }
    }
}
