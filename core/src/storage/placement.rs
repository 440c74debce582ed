//! Placement of new copies and the low-space guard (reference-facts.md "Placement";
//! spec "Nearly full volumes").
//!
//! A volume takes a copy of `size` bytes only when it is writable (not removed, read-only,
//! evacuating or low on space), its node is usable (ONLINE or DEGRADED, not DRAINING or in
//! MAINTENANCE) and it has `size + size/10 + 64 MiB` free. The nodes are ranked by the shared
//! scorer ([`crate::sched`]) with the writer's locality 1, so the writer's own volume wins
//! unless it is loaded or DEGRADED; on the winning node: the file's existing primary volume,
//! then the most free space, then id.

use crate::ids::{NodeId, VolumeId};
use crate::membership::NodeState;
use crate::meta::records::Volume;
use crate::sched::{rank, Inputs, Ranked, Weights};
use std::collections::BTreeMap;

pub const HEADROOM_BYTES: u64 = 64 * 1024 * 1024;
/// Below this free fraction a volume goes read-only (low space)...
pub const LOW_SPACE_ENTER: f64 = 0.05;
/// ...and above this it is writable again.
pub const LOW_SPACE_LEAVE: f64 = 0.07;

/// Free bytes a volume needs to take a copy of `size` bytes.
pub fn needed_bytes(size: u64) -> u64 {
    size.saturating_add(size / 10).saturating_add(HEADROOM_BYTES)
}

pub fn node_usable(state: NodeState) -> bool {
    matches!(state, NodeState::Online | NodeState::Degraded)
}

pub fn writable(v: &Volume) -> bool {
    !v.removed && !v.read_only && !v.evacuating && !v.low_space
}

pub fn fits(v: &Volume, size: u64) -> bool {
    writable(v) && v.free >= needed_bytes(size)
}

/// The low-space flag after a usage reading, with hysteresis (5 % in, 7 % out). `enabled` is
/// the cluster-wide switch; turning it off clears the flag. An admin's read-only is a separate
/// flag and never touched here.
pub fn low_space_next(current: bool, free: u64, capacity: u64, enabled: bool) -> bool {
    low_space_next_at(current, free, capacity, enabled, LOW_SPACE_ENTER, LOW_SPACE_LEAVE)
}

/// [`low_space_next`] with the thresholds (fractions of capacity) from the config.
pub fn low_space_next_at(current: bool, free: u64, capacity: u64, enabled: bool, enter: f64, leave: f64) -> bool {
    if !enabled || capacity == 0 {
        return false;
    }
    let frac = free as f64 / capacity as f64;
    if frac < enter {
        true
    } else if frac > leave.max(enter) {
        false
    } else {
        current
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("no volume has room for {0} bytes (a volume needs the size plus 10 % plus 64 MiB free)")]
    NothingFits(u64),
}

/// What a new copy needs: its size, who writes it, the file's primary volume if it has one,
/// and nodes that must not take it (they hold a copy already).
#[derive(Clone, Copy, Debug)]
pub struct PlaceAsk<'a> {
    pub size: u64,
    pub writer: &'a NodeId,
    pub primary: Option<&'a VolumeId>,
    pub exclude: &'a [NodeId],
    /// The cluster's latency matrix: with the excluded nodes as holders, a further copy is
    /// worth more in another site ([`crate::sched::site_diversity`]).
    pub latency: Option<&'a crate::latency::LatencyMatrix>,
}

/// Every node with a volume, ranked for taking a new copy: `known` gives what is known of a
/// node (health, queue, and its round trip as the writer measures it; its locality and free
/// disk are set here), the hard rule is a usable node, not excluded, with a volume that fits.
pub fn place_ranking<'a>(
    volumes: impl IntoIterator<Item = (&'a Volume, NodeState)>,
    known: &BTreeMap<NodeId, Inputs>,
    weights: &Weights,
    ask: PlaceAsk<'_>,
) -> Vec<Ranked> {
    // Per node: its state, whether a volume fits, the largest free fraction.
    let mut nodes: BTreeMap<&NodeId, (NodeState, bool, Option<f64>)> = BTreeMap::new();
    for (v, st) in volumes {
        if v.removed {
            continue;
        }
        let e = nodes.entry(&v.node_id).or_insert((st, false, None));
        e.1 |= fits(v, ask.size);
        if v.capacity > 0 && writable(v) {
            let frac = v.free as f64 / v.capacity as f64;
            e.2 = Some(e.2.map_or(frac, |f: f64| f.max(frac)));
        }
    }
    // Members with no volume are candidates too, so an explanation names them.
    let mut volumeless: Vec<&NodeId> = Vec::new();
    for (id, i) in known {
        if !nodes.contains_key(id) {
            nodes.insert(id, (i.state, false, None));
            volumeless.push(id);
        }
    }
    let rule = |id: &NodeId| {
        let (state, fits_here, _) = nodes[id];
        if !node_usable(state) {
            Err(format!("node is {}", state.as_str()))
        } else if ask.exclude.contains(id) {
            Err("node holds a copy already".to_string())
        } else if volumeless.contains(&id) {
            Err("node has no volume".to_string())
        } else if !fits_here {
            Err(format!("no writable volume with room for {} bytes", ask.size))
        } else {
            Ok(())
        }
    };
    let eligible = nodes.keys().filter(|id| rule(id).is_ok()).count();
    let diverse = ask.latency.is_some()
        && crate::sched::diversity_applies(nodes.len().max(known.len()), ask.exclude.len(), eligible);
    let inputs: Vec<Inputs> = nodes
        .iter()
        .map(|(id, (state, _, disk))| {
            let mut i = known.get(*id).cloned().unwrap_or_else(|| Inputs::new((*id).clone(), *state));
            i.state = *state;
            i.locality = if *id == ask.writer { 1.0 } else { 0.0 };
            i.disk_free = *disk;
            i.features = None;
            i.diversity = None;
            // The round trip the copy travels is the writer's: from the matrix when measured.
            if let Some(d) = ask.latency.map(|m| m.pair(ask.writer, id)).filter(|d| *d >= 0.0) {
                i.latency_ms = d;
            }
            if let (true, Some(m)) = (diverse, ask.latency) {
                i.diversity = crate::sched::site_diversity(m, id, ask.exclude);
                i.latency_ms = 0.0;
            }
            i
        })
        .collect();
    rank(&inputs, weights, |i| rule(&i.node))
}

/// Pick the volume for a new copy: the best node of [`place_ranking`], then on it the file's
/// primary volume, then the most free space, then id.
pub fn place<'a>(
    volumes: impl IntoIterator<Item = (&'a Volume, NodeState)> + Clone,
    known: &BTreeMap<NodeId, Inputs>,
    weights: &Weights,
    ask: PlaceAsk<'_>,
) -> Result<&'a Volume, PlaceError> {
    let ranked = place_ranking(volumes.clone(), known, weights, ask);
    let winner = crate::sched::best(&ranked).map_err(|_| PlaceError::NothingFits(ask.size))?;
    volumes
        .into_iter()
        .map(|(v, _)| v)
        .filter(|v| v.node_id == winner.node && fits(v, ask.size))
        .min_by(|a, b| {
            let key = |v: &Volume| (ask.primary != Some(&v.id), std::cmp::Reverse(v.free));
            key(a).cmp(&key(b)).then_with(|| a.id.cmp(&b.id))
        })
        .ok_or(PlaceError::NothingFits(ask.size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Version;

    fn vol(id: &str, node: &str, free: u64) -> Volume {
        Volume {
            id: VolumeId::new(id),
            node_id: NodeId::new(node),
            name: String::new(),
            fsh_uuid: String::new(),
            subpath: String::new(),
            read_only: false,
            evacuating: false,
            removed: false,
            version: Version::default(),
            capacity: 1 << 40,
            free,
            low_space: false,
            usage_version: Version::default(),
        }
    }

    const G: u64 = 1 << 30;

    #[test]
    fn a_volume_needs_the_size_plus_ten_percent_plus_64_mib() {
        let v = vol("v", "n", needed_bytes(G));
        assert!(fits(&v, G));
        let v = vol("v", "n", needed_bytes(G) - 1);
        assert!(!fits(&v, G));
    }

    fn ask<'a>(size: u64, writer: &'a NodeId, primary: Option<&'a VolumeId>) -> PlaceAsk<'a> {
        PlaceAsk { size, writer, primary, exclude: &[], latency: None }
    }

    /// The writer's node first (locality 1), else the node the scorer ranks best (here: the
    /// most free disk); on the winner, the primary volume, then the most free.
    #[test]
    fn writer_then_best_scored_node_then_primary_then_most_free() {
        let vs = [vol("a", "n1", 10 * G), vol("b", "n2", 50 * G), vol("c", "n3", 20 * G), vol("d", "n3", 30 * G)];
        let on = |v: &Volume| (v.clone(), NodeState::Online);
        let list: Vec<(Volume, NodeState)> = vs.iter().map(on).collect();
        let none = BTreeMap::new();
        let pick = |writer: &str, primary: Option<&str>| {
            let p = primary.map(VolumeId::new);
            let w = NodeId::new(writer);
            let vols = list.iter().map(|(v, s)| (v, *s));
            place(vols, &none, &Weights::default(), ask(G, &w, p.as_ref())).unwrap().id.to_string()
        };
        assert_eq!(pick("n1", None), "a");
        assert_eq!(pick("n9", None), "b");
        assert_eq!(pick("n3", None), "d", "most free on the winner");
        assert_eq!(pick("n3", Some("c")), "c", "the primary on the winner");
        assert_eq!(pick("n9", Some("c")), "b", "a primary on another node does not outrank the scorer");
    }

    /// A further copy goes to another site: with the holders excluded and a latency matrix,
    /// the node far from every holder wins over a near one with more room; the round trip
    /// from the scorer is left out (it would cancel the distance).
    #[test]
    fn a_further_copy_goes_to_another_site() {
        let vs = [vol("a", "n0", 10 * G), vol("b", "n1", 90 * G), vol("c", "n2", 30 * G)];
        let list: Vec<(Volume, NodeState)> = vs.iter().map(|v| (v.clone(), NodeState::Online)).collect();
        let n0 = NodeId::new("n0");
        let mut m = crate::latency::LatencyMatrix::default();
        let row = |pairs: &[(&str, f64)]| pairs.iter().map(|(n, ms)| (NodeId::new(*n), *ms)).collect();
        m.insert_row(n0.clone(), row(&[("n1", 2.0), ("n2", 500.0)]));
        let mut known = BTreeMap::new();
        let mut far = Inputs::new(NodeId::new("n2"), NodeState::Online);
        far.latency_ms = 500.0;
        known.insert(far.node.clone(), far);
        let holders = [n0.clone()];
        let mut a = ask(G, &n0, None);
        a.exclude = &holders;
        let w = Weights::default();
        let pick = |a: PlaceAsk<'_>| place(list.iter().map(|(v, s)| (v, *s)), &known, &w, a).unwrap().id.to_string();
        assert_eq!(pick(a), "b", "no matrix: the roomiest near node");
        a.latency = Some(&m);
        assert_eq!(pick(a), "c", "the far site");
    }

    /// A busy writer loses to an idle node: the scorer, not a fixed order, decides.
    #[test]
    fn a_loaded_writer_loses_to_an_idle_node() {
        let vs = [vol("a", "n1", 10 * G), vol("b", "n2", 10 * G)];
        let list: Vec<(Volume, NodeState)> = vs.iter().map(|v| (v.clone(), NodeState::Online)).collect();
        let n1 = NodeId::new("n1");
        let mut known = BTreeMap::new();
        let mut busy = Inputs::new(n1.clone(), NodeState::Online);
        busy.cpu_pct = Some(100.0);
        busy.queue = 8;
        busy.latency_ms = 1000.0;
        known.insert(n1.clone(), busy);
        let mut w = Weights::default();
        w.set("locality", 0.1);
        let v = place(list.iter().map(|(v, s)| (v, *s)), &known, &w, ask(G, &n1, None)).unwrap();
        assert_eq!(v.id.as_str(), "b");
        let v = place(list.iter().map(|(v, s)| (v, *s)), &known, &Weights::default(), ask(G, &n1, None)).unwrap();
        assert_eq!(v.id.as_str(), "a", "with the shipped weights locality still wins");
    }

    #[test]
    fn read_only_evacuating_low_space_and_unusable_nodes_take_nothing() {
        let mut ro = vol("ro", "n1", 100 * G);
        ro.read_only = true;
        let mut ev = vol("ev", "n2", 100 * G);
        ev.evacuating = true;
        let mut low = vol("low", "n3", 100 * G);
        low.low_space = true;
        let drain = vol("dr", "n4", 100 * G);
        let ok = vol("ok", "n5", 2 * G);
        let list = [
            (&ro, NodeState::Online),
            (&ev, NodeState::Online),
            (&low, NodeState::Online),
            (&drain, NodeState::Draining),
            (&ok, NodeState::Online),
        ];
        let n1 = NodeId::new("n1");
        let none = BTreeMap::new();
        let w = Weights::default();
        let v = place(list, &none, &w, ask(G / 2, &n1, None)).unwrap();
        assert_eq!(v.id.as_str(), "ok");
        assert_eq!(place(list, &none, &w, ask(10 * G, &n1, None)), Err(PlaceError::NothingFits(10 * G)));
        let why: Vec<Option<String>> = place_ranking(list, &none, &w, ask(G / 2, &n1, None))
            .into_iter()
            .map(|r| r.reason.map(|c| c.into_owned()))
            .collect();
        assert_eq!(why[0], None, "n5 takes it");
        assert!(why[1..].iter().all(|r| r.is_some()), "every other node says why not: {why:?}");
    }

    #[test]
    fn low_space_guard_has_hysteresis_and_a_switch() {
        assert!(low_space_next(false, 4, 100, true));
        assert!(low_space_next(true, 6, 100, true), "stays low between 5 and 7 %");
        assert!(!low_space_next(false, 6, 100, true));
        assert!(!low_space_next(true, 8, 100, true));
        assert!(!low_space_next(true, 1, 100, false), "switched off cluster-wide");
    }
}
