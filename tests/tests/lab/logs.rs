//! `--log-format json`: a-gw's agent, restarted with it, writes one JSON
//! object per line, and its lines about objects and peers carry them as
//! fields: a peer programmed and connected, and an object rejected.

use std::{fs, path::PathBuf, time::Duration};

use isthmus_lab::{lab, topology::A};
use isthmus_tests::require_lab;
use serde_json::Value;

/// A TunnelEndpoint whose PodCIDR is not a CIDR.
const BAD: &str = "apiVersion: net.liqo.io/v1alpha1
kind: TunnelEndpoint
metadata:
  name: tep-bad
  namespace: liqo-tenant-x
spec:
  clusterIdentity: {clusterID: cluster-x, clusterName: x}
  localPodCIDR: 10.244.0/24
";
const BAD_FILE: &str = "bad-for-logs.yaml";

/// Restores a-gw's usual agent and objects when the test ends.
struct Restore {
    pid: u32,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let gw = A.gw();
        let _ = fs::remove_file(lab::object_dir(&gw).join(BAD_FILE));
        let restored = lab::stop_pid(self.pid)
            .and_then(|()| lab::start_agent(&gw))
            .and_then(|_| lab::wait_ready(&gw));
        if let Err(e) = restored {
            eprintln!("restoring {gw}'s agent: {e:#}");
        }
    }
}

/// The log's lines, each parsed; panics on one that is not JSON.
fn lines(log: &PathBuf) -> Vec<Value> {
    fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Waits for a line with `message` and every field of `fields`.
fn wait_for(log: &PathBuf, message: &str, fields: &[(&str, &str)]) -> Value {
    let line = || {
        lines(log).into_iter().find(|l| {
            let f = &l["fields"];
            f["message"] == message && fields.iter().all(|(k, v)| f[*k] == *v)
        })
    };
    let what = format!("a {message:?} line with {fields:?}");
    isthmus_lab::wait::poll(Duration::from_secs(20), isthmus_tests::POLL, &what, line)
        .unwrap_or_else(|e| {
            panic!(
                "{e} in {}:\n{}",
                log.display(),
                fs::read_to_string(log).unwrap()
            )
        })
}

#[test]
fn json_logs_name_the_object_and_the_peer() {
    require_lab();
    let gw = A.gw();
    let log = lab::log_file(&format!("{gw}-json"));
    let _ = fs::remove_file(&log);
    lab::stop_agent(&gw).unwrap();
    let mut args = lab::agent_args(&gw).unwrap();
    args.insert(0, "--log-format=json".into());
    let pid = lab::spawn_agent(&gw, &args, &log).unwrap();
    let _restore = Restore { pid };
    lab::wait_ready_in(&gw, pid, &log).unwrap();

    let peer = [("object", "liqo-tenant-b/tep-b"), ("peer", "cluster-b")];
    wait_for(&log, "peer programmed", &peer);
    wait_for(&log, "peer connected", &peer);
    fs::write(lab::object_dir(&gw).join(BAD_FILE), BAD).unwrap();
    let rejected = wait_for(
        &log,
        "object rejected",
        &[
            ("kind", "TunnelEndpoint"),
            ("object", "liqo-tenant-x/tep-bad"),
        ],
    );
    let error = rejected["fields"]["error"].as_str().unwrap();
    assert!(
        error.contains("localPodCIDR"),
        "the error names the field: {error}"
    );
    for line in lines(&log) {
        assert!(
            line["level"].is_string() && line["timestamp"].is_string(),
            "a line without level or timestamp: {line}"
        );
    }
}
