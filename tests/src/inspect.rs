//! `isthmus-agent inspect` as an operator runs it on a lab node's pins,
//! for the tests to read its rows.

use std::process::Command;

use isthmus_lab::lab;
use serde_json::Value;

/// `inspect VIEW --json` on `node`'s pins: one object per row.
pub fn inspect_on(node: &str, view: &str) -> Vec<serde_json::Map<String, Value>> {
    let bpffs = lab::bpffs(node);
    let out = Command::new(lab::agent_binary())
        .args(["inspect", view, "--json", "--bpffs"])
        .arg(&bpffs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "inspect {view}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    rows.as_array()
        .unwrap_or_else(|| panic!("inspect {view} printed no array: {rows}"))
        .iter()
        .map(|r| r.as_object().unwrap().clone())
        .collect()
}

/// The text in `column` of `row`.
pub fn cell<'a>(row: &'a serde_json::Map<String, Value>, column: &str) -> &'a str {
    row[column].as_str().unwrap()
}
