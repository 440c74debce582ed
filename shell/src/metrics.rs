//! `/metrics` in the OpenMetrics text format (which Prometheus reads), through the maintained
//! `prometheus-client` crate (issue 17 "Operators"). Owns the shell's own counters (HTTP
//! requests by route, method and status with a latency histogram, bytes read and written on
//! the node's connections) and renders them beside the node's figures read from the core at
//! each scrape ([`shoal_core::node::metrics::NodeGauges`]).
//!
//! Latency is measured to the answer's head: a streamed file body is not in it.

use crate::disk::sync::SyncFigures;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use shoal_core::node::metrics::NodeGauges;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    method: String,
}

type Latency = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.5 ms to about 33 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 17))
}

/// The shell's counters, shared by the router (requests) and the listener (bytes).
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    latency: Latency,
    /// Bytes read from and written to the node's HTTP connections (heads and bodies).
    pub bytes_in: Counter,
    pub bytes_out: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
        }
    }
}

/// A count as a gauge's value (saturating).
fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A gauge of a whole number.
fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(as_i64(v));
    g
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    volume: String,
    node: String,
    local: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HowLabel {
    how: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

impl Metrics {
    /// One request answered: `route` is the router's pattern (`/v1/files/{*path}`), never the
    /// path itself, so the label set stays bounded.
    pub fn request(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let method = method.to_string();
        self.requests.get_or_create(&RequestLabels { route: route.to_string(), method: method.clone(), status }).inc();
        self.latency.get_or_create(&RouteLabels { route: route.to_string(), method }).observe(seconds);
    }

    /// The whole text: the shell's counters, then the node's figures, how the copies' fsyncs
    /// went, then how long resolving this node's configuration took at this scrape.
    pub fn render(&self, g: &NodeGauges, sync: &SyncFigures, config_resolve_seconds: f64) -> String {
        let mut r = Registry::with_prefix("shoal");
        r.register(
            "http_requests",
            "HTTP requests answered, by route pattern, method and status",
            self.requests.clone(),
        );
        r.register_with_unit(
            "http_request_duration",
            "Time to the answer's head, by route pattern and method",
            Unit::Seconds,
            self.latency.clone(),
        );
        r.register_with_unit("http_received", "Bytes read from HTTP connections", Unit::Bytes, self.bytes_in.clone());
        r.register_with_unit("http_sent", "Bytes written to HTTP connections", Unit::Bytes, self.bytes_out.clone());

        r.register("in_cluster", "1 when this node is in a cluster", gauge(u64::from(g.in_cluster)));
        let members = Family::<StateLabel, Gauge>::default();
        for (state, n) in &g.members_by_state {
            members.get_or_create(&StateLabel { state: state.to_string() }).set(*n as i64);
        }
        r.register("members", "Members of this node's cluster by computed state", members);
        r.register("heartbeats_sent", "Heartbeat rounds this node sent", const_counter(g.heartbeats_sent));
        r.register("acn_nonces", "Nonces of verified node-to-node requests kept against replays", gauge(g.acn_nonces));
        r.register(
            "acn_refused",
            "Signed node-to-node requests refused (bad signature, replay, skew, stranger)",
            const_counter(g.acn_refused),
        );

        r.register("meta_term", "Highest metadata lease term known", gauge(g.term));
        r.register("meta_is_leader", "1 when this node holds the metadata lease", gauge(u64::from(g.is_leader)));
        r.register(
            "meta_leader_changes",
            "Times the lease (term or holder) changed since start",
            const_counter(g.leader_changes),
        );
        r.register("meta_applied_index", "Last metadata log index applied here", gauge(g.log_applied));
        r.register("meta_log_entries", "Metadata log entries kept (not compacted)", gauge(g.log_entries));
        r.register("meta_records", "Metadata records held", gauge(g.records));
        r.register(
            "meta_pending_submits",
            "Records submitted here not yet taken by the leader",
            gauge(g.pending_submits),
        );
        let lag = Family::<PeerLabel, Gauge>::default();
        for (peer, behind) in &g.log_lag {
            lag.get_or_create(&PeerLabel { peer: peer.clone() }).set(as_i64(*behind));
        }
        r.register("meta_log_lag_entries", "Leader: entries each follower is behind", lag);

        r.register("repl_passes", "Planner passes run here (leader)", const_counter(g.repl_passes));
        r.register("repl_dispatched", "Replication tasks dispatched (leader)", const_counter(g.repl_dispatched));
        r.register(
            "repl_backlog_dispatched",
            "Replication tasks dispatched from the backlog as others ended, no full pass (leader)",
            const_counter(g.repl_backlog_dispatched),
        );
        r.register("repl_backlog", "Files a planner pass left for the task limits (leader)", gauge(g.repl_backlog));
        let outcomes = Family::<OutcomeLabel, Counter>::default();
        for (outcome, n) in [
            ("succeeded", g.repl_succeeded),
            ("failed", g.repl_failed),
            ("deferred", g.repl_deferred),
            ("expired", g.repl_expired),
        ] {
            outcomes.get_or_create(&OutcomeLabel { outcome: outcome.into() }).inc_by(n);
        }
        r.register("repl_tasks_ended", "Replication tasks ended, by outcome", outcomes);
        r.register("repl_tasks_leased", "Replication tasks under lease (leader)", gauge(g.repl_tasks));
        r.register("repl_working", "Files this node is copying now", gauge(g.repl_working));
        r.register("repl_backoffs", "Files waiting out a replication backoff", gauge(g.repl_backoffs));

        r.register("scrub_copies", "Copies checked by the scrub", const_counter(g.scrubbed_copies));
        r.register_with_unit("scrub", "Bytes hashed by the scrub", Unit::Bytes, const_counter(g.scrubbed_bytes));
        r.register("scrub_mismatches", "Copies the scrub found not to match", const_counter(g.scrub_mismatches));
        r.register(
            "scrub_overdue_copies",
            "Local copies whose last check is older than the scrub bound",
            gauge(g.scrub_overdue),
        );
        let age = Gauge::<f64, AtomicU64>::default();
        age.set(g.scrub_oldest_age_ms.map_or(0.0, |ms| ms as f64 / 1000.0));
        r.register_with_unit(
            "scrub_oldest_check_age",
            "Age of the oldest check among local copies",
            Unit::Seconds,
            age,
        );

        let capacity = Family::<VolumeLabels, Gauge>::default();
        let free = Family::<VolumeLabels, Gauge>::default();
        let low = Family::<VolumeLabels, Gauge>::default();
        for v in &g.volumes {
            let l = VolumeLabels { volume: v.id.clone(), node: v.node.clone(), local: v.local.to_string() };
            capacity.get_or_create(&l).set(as_i64(v.capacity));
            free.get_or_create(&l).set(as_i64(v.free));
            low.get_or_create(&l).set(i64::from(v.low_space || v.read_only));
        }
        r.register_with_unit("volume_capacity", "Volume size, as its node reports it", Unit::Bytes, capacity);
        r.register_with_unit("volume_free", "Volume free space, as its node reports it", Unit::Bytes, free);
        r.register("volume_unwritable", "1 when a volume takes no new copies (low space or read-only)", low);

        let load = |c: &AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let syncs = Family::<HowLabel, Counter>::default();
        for (how, n) in [("lone", load(&sync.lone)), ("grouped", load(&sync.grouped))] {
            syncs.get_or_create(&HowLabel { how: how.into() }).inc_by(n);
        }
        r.register(
            "disk_syncs",
            "Copies' files and folders made durable: fsynced on their own (lone) or by a flush shared with others (grouped)",
            syncs,
        );
        r.register(
            "disk_sync_groups",
            "Flushes of a volume shared by several files",
            const_counter(load(&sync.groups)),
        );
        r.register(
            "disk_sync_slow_groups",
            "Shared flushes slow enough to turn grouping off for a while (another writer's data flushed too)",
            const_counter(load(&sync.slow_groups)),
        );

        let resolve = Gauge::<f64, AtomicU64>::default();
        resolve.set(config_resolve_seconds);
        r.register_with_unit(
            "config_resolve",
            "Time to resolve this node's configuration, at this scrape",
            Unit::Seconds,
            resolve,
        );

        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &r);
        out
    }
}

/// A counter holding a count kept elsewhere (the core's).
fn const_counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_names_each_family_and_keeps_routes_as_patterns() {
        let m = Metrics::default();
        m.request("/v1/files/{*path}", "GET", 200, 0.002);
        m.request("/v1/files/{*path}", "GET", 404, 0.001);
        m.bytes_in.inc_by(10);
        let g = NodeGauges {
            in_cluster: true,
            members_by_state: vec![("ONLINE", 3)],
            log_lag: vec![("node-b".into(), 4)],
            ..Default::default()
        };
        let sync = SyncFigures::default();
        sync.grouped.store(7, std::sync::atomic::Ordering::Relaxed);
        sync.lone_sync();
        let text = m.render(&g, &sync, 0.0001);
        for needle in [
            "shoal_http_requests_total{route=\"/v1/files/{*path}\",method=\"GET\",status=\"200\"} 1",
            "shoal_http_requests_total{route=\"/v1/files/{*path}\",method=\"GET\",status=\"404\"} 1",
            "shoal_http_request_duration_seconds_bucket{",
            "shoal_http_received_bytes_total 10",
            "shoal_members{state=\"ONLINE\"} 3",
            "shoal_meta_log_lag_entries{peer=\"node-b\"} 4",
            "shoal_in_cluster 1",
            "shoal_config_resolve_seconds",
            "shoal_disk_syncs_total{how=\"grouped\"} 7",
            "shoal_disk_syncs_total{how=\"lone\"} 1",
            "shoal_disk_sync_groups_total 0",
            "# EOF",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
