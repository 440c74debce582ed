//! Placement of new copies and the low-space guard (reference-facts.md "Placement";
//! spec "Nearly full volumes").
//!
//! A volume takes a copy of `size` bytes only when it is writable (not removed, read-only,
//! evacuating or low on space), its node is usable (ONLINE or DEGRADED, not DRAINING or in
//! MAINTENANCE) and it has `size + size/10 + 64 MiB` free. Among those: a volume on the writing
//! node first, then the file's existing primary volume, then the most free space, then id. The
//! shared scorer of the scheduling milestone will rank nodes behind [`place`].

use crate::ids::{NodeId, VolumeId};
use crate::membership::NodeState;
use crate::meta::records::Volume;

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

/// Pick the volume for a new copy of `size` bytes written on `writer`.
pub fn place<'a>(
    volumes: impl IntoIterator<Item = (&'a Volume, NodeState)>,
    size: u64,
    writer: &NodeId,
    primary: Option<&VolumeId>,
    exclude_nodes: &[NodeId],
) -> Result<&'a Volume, PlaceError> {
    volumes
        .into_iter()
        .filter(|(v, st)| node_usable(*st) && fits(v, size) && !exclude_nodes.contains(&v.node_id))
        .map(|(v, _)| v)
        .min_by(|a, b| {
            let key = |v: &Volume| (v.node_id != *writer, primary != Some(&v.id), std::cmp::Reverse(v.free));
            key(a).cmp(&key(b)).then_with(|| a.id.cmp(&b.id))
        })
        .ok_or(PlaceError::NothingFits(size))
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

    #[test]
    fn local_then_primary_then_most_free() {
        let vs = [vol("a", "n1", 10 * G), vol("b", "n2", 50 * G), vol("c", "n3", 20 * G)];
        let on = |v: &Volume| (v.clone(), NodeState::Online);
        let list: Vec<(Volume, NodeState)> = vs.iter().map(on).collect();
        let pick = |writer: &str, primary: Option<&str>| {
            let p = primary.map(VolumeId::new);
            place(list.iter().map(|(v, s)| (v, *s)), G, &NodeId::new(writer), p.as_ref(), &[]).unwrap().id.to_string()
        };
        assert_eq!(pick("n1", None), "a");
        assert_eq!(pick("n9", Some("c")), "c");
        assert_eq!(pick("n9", None), "b");
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
        let v = place(list, G / 2, &NodeId::new("n1"), None, &[]).unwrap();
        assert_eq!(v.id.as_str(), "ok");
        assert_eq!(place(list, 10 * G, &NodeId::new("n1"), None, &[]), Err(PlaceError::NothingFits(10 * G)));
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
