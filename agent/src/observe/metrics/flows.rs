//! The flow tables' collector reports into the metrics.

use std::time::Duration;

use isthmus_common::room::{FlowTable, Short};

use super::Metrics;
use crate::roles::flows::FlowReport;

impl FlowReport for Metrics {
    fn owner_name(&self, owner: u32) -> String {
        Metrics::owner_name(self, owner)
    }

    fn refused(&self, table: &str, owner: u32, reason: Short, count: u64) {
        let labels = [
            ("table", table.to_owned()),
            ("owner", self.owner_name(owner)),
            ("reason", reason.as_str().to_owned()),
        ];
        self.flow_refusals.get_or_create(&labels).inc_by(count);
    }

    fn held(&self, table: FlowTable, owner: u32, held: u64, evicted: u64) {
        let labels = [
            ("table", table.as_str().to_owned()),
            ("owner", self.owner_name(owner)),
        ];
        self.flow_entries.get_or_create(&labels).set(held as i64);
        // A series appears with an owner's first eviction, not before.
        if evicted > 0 {
            self.flow_evictions.get_or_create(&labels).inc_by(evicted);
        }
    }

    fn conntrack_entries(&self, entries: u64) {
        self.conntrack_entries.set(entries as i64);
    }

    fn swept(&self, next: Duration) {
        self.conntrack_gc_runs.inc();
        self.conntrack_gc_interval.set(next.as_secs_f64());
    }
}
