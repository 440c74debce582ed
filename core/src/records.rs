//! The membership record of one node and its signed registers (spec: cluster-runtime.md
//! "Membership"; reference-facts.md "NodeRecord").
//!
//! A record is not one last-writer-wins blob (reference weakness 4) but separate registers, each
//! merged on its own and each carrying the signature of whoever may write it (weakness 10):
//! - the *owner* register (name, key, URL, version, capabilities, joined): written and signed only
//!   by the node itself; its public key is pinned the first time the record is seen;
//! - the *admission*: the member that let the node in signs `id + public key` at join;
//! - the *admin state* (maintenance / draining): written by any member on an admin's behalf,
//!   signed by that member, last-writer-wins on its HLC version;
//! - the *removal* tombstone: signed by the member that removed it (or by the node that left);
//! - *health*: signed by the owner, newest timestamp wins;
//! - `lastSeen`: local soft state, never signed, always taken as the maximum.

use crate::acn::{parse_public_key, sign_b64, verify_b64};
use crate::hlc::Version;
use crate::ids::{ClusterId, NodeId};
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    pub id: ClusterId,
    pub name: String,
    /// Unix seconds.
    pub created: u64,
}

/// What a node offers (spec: "capability/").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Capabilities {
    pub os: String,
    pub arch: String,
    pub cpu_cores: u32,
    pub total_ram: u64,
    pub hostname: String,
    /// Tools on PATH (`ffmpeg`, `docker`, `nvidia-smi`, ...) and CPU flags (`cpu.avx2`, ...).
    pub features: BTreeMap<String, bool>,
    /// Unix seconds.
    pub detected_at: u64,
    /// MAC addresses of its network interfaces (`aa:bb:cc:dd:ee:ff`), for Wake-on-LAN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<String>,
}

/// A node's own health report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Health {
    /// Percent, 0..=100.
    pub cpu_usage: f64,
    pub ram_used: u64,
    pub ram_total: u64,
    pub disk_free: u64,
    pub disk_total: u64,
    /// Seconds.
    pub uptime: u64,
    /// Unix milliseconds on the owner's clock; newest wins.
    pub timestamp: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AdminState {
    #[default]
    #[serde(rename = "")]
    Active,
    Maintenance,
    Draining,
}

impl AdminState {
    pub fn as_str(self) -> &'static str {
        match self {
            AdminState::Active => "",
            AdminState::Maintenance => "maintenance",
            AdminState::Draining => "draining",
        }
    }

    pub fn parse(s: &str) -> Option<AdminState> {
        match s {
            "" | "active" => Some(AdminState::Active),
            "maintenance" => Some(AdminState::Maintenance),
            "draining" => Some(AdminState::Draining),
            _ => None,
        }
    }
}

/// A change to someone else's record, signed by the member that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mark {
    pub version: Version,
    pub by: NodeId,
    pub sig: String,
}

/// The fields only the node itself writes, in a fixed order: the signed payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerFields {
    pub id: NodeId,
    pub name: String,
    pub public_key: String,
    pub advertise_url: String,
    pub tunnel_via: String,
    pub version: String,
    pub capabilities: Capabilities,
    pub joined: u64,
    /// The node's X25519 public key (base64) that passwords are sealed to (issue 15); signed
    /// with the rest. Absent from the payload when empty, so older records still verify.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub box_key: String,
    /// SHA-256 (lowercase hex) of the certificate the node serves HTTPS with: peers pin it, so
    /// a self-signed certificate needs no CA (issue 15). Absent on plain HTTP.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tls_pin: String,
}

/// One member as it travels between nodes (camelCase wire names of the reference plus the
/// per-register versions and signatures).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: String,
    pub public_key: String,
    #[serde(default)]
    pub advertise_url: String,
    #[serde(default)]
    pub tunnel_via: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub capabilities: Capabilities,
    /// Unix seconds, set by the node when it created or joined the cluster.
    pub joined: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub box_key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tls_pin: String,
    /// Unix ms of the owner register's version (the reference's `updated`).
    pub updated: u64,
    pub owner_version: Version,
    pub owner_sig: String,
    pub admitted: Option<Mark>,
    #[serde(default)]
    pub admin_state: AdminState,
    #[serde(default)]
    pub admin: Option<Mark>,
    #[serde(default)]
    pub removed: bool,
    #[serde(default)]
    pub removal: Option<Mark>,
    #[serde(default)]
    pub health: Option<Health>,
    #[serde(default)]
    pub health_sig: String,
    /// Unix seconds on the sender's clock (reference field).
    #[serde(default)]
    pub last_seen: u64,
    /// Unix ms on the sender's clock; receivers translate it by the sender's `time`.
    #[serde(default)]
    pub last_seen_ms: u64,
    /// How long ago the sender last heard from this node, on the sender's monotonic clock.
    /// Receivers prefer it to `lastSeenMs`: it survives clock steps on either side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_age_ms: Option<u64>,
}

fn owner_payload(f: &OwnerFields, v: &Version) -> Vec<u8> {
    let mut out = b"shoal-owner\n".to_vec();
    out.extend(serde_json::to_vec(f).expect("owner fields serialise"));
    out.push(b'\n');
    out.extend(serde_json::to_vec(v).expect("version serialises"));
    out
}

fn admission_payload(id: &NodeId, public_key: &str) -> Vec<u8> {
    format!("shoal-admit\n{id}\n{public_key}").into_bytes()
}

fn admin_payload(target: &NodeId, state: AdminState, v: &Version) -> Vec<u8> {
    format!("shoal-admin\n{target}\n{}\n{}.{}.{}", state.as_str(), v.wall_ms, v.counter, v.node).into_bytes()
}

fn removal_payload(target: &NodeId, v: &Version) -> Vec<u8> {
    format!("shoal-remove\n{target}\n{}.{}.{}", v.wall_ms, v.counter, v.node).into_bytes()
}

fn health_payload(id: &NodeId, h: &Health) -> Vec<u8> {
    let mut out = format!("shoal-health\n{id}\n").into_bytes();
    out.extend(serde_json::to_vec(h).expect("health serialises"));
    out
}

impl NodeRecord {
    /// A fresh record for the node owning `key`, signed at `version`.
    pub fn new_signed(fields: OwnerFields, version: Version, key: &SigningKey) -> NodeRecord {
        let sig = sign_b64(key, &owner_payload(&fields, &version));
        NodeRecord {
            id: fields.id,
            name: fields.name,
            public_key: fields.public_key,
            advertise_url: fields.advertise_url,
            tunnel_via: fields.tunnel_via,
            version: fields.version,
            capabilities: fields.capabilities,
            joined: fields.joined,
            box_key: fields.box_key,
            tls_pin: fields.tls_pin,
            updated: version.wall_ms,
            owner_version: version,
            owner_sig: sig,
            admitted: None,
            admin_state: AdminState::Active,
            admin: None,
            removed: false,
            removal: None,
            health: None,
            health_sig: String::new(),
            last_seen: 0,
            last_seen_ms: 0,
            last_seen_age_ms: None,
        }
    }

    /// Bounds on what a node may say about itself, so a member cannot make every node store
    /// and resend megabytes: names and labels short, URLs well-formed, at most 256 features.
    pub fn shape_ok(&self) -> bool {
        let short = |s: &str, n: usize| s.len() <= n && !s.chars().any(|c| c.is_control());
        let c = &self.capabilities;
        short(&self.name, 128)
            && (self.advertise_url.is_empty() || crate::token::valid_base_url(&self.advertise_url))
            && short(&self.tunnel_via, 64)
            && short(&self.version, 64)
            && short(&c.os, 64)
            && short(&c.arch, 64)
            && short(&c.hostname, 256)
            && c.features.len() <= 256
            && c.features.keys().all(|k| short(k, 64))
            && c.macs.len() <= crate::wake::MACS_MAX
            && c.macs.iter().all(|m| crate::wake::parse_mac(m).is_some())
            && (self.tls_pin.is_empty() || crate::token::valid_pin(&self.tls_pin))
            && crate::token::url_pin_error(&self.advertise_url, &self.tls_pin).is_none()
            && self.key().is_some()
    }

    pub fn owner_fields(&self) -> OwnerFields {
        OwnerFields {
            id: self.id.clone(),
            name: self.name.clone(),
            public_key: self.public_key.clone(),
            advertise_url: self.advertise_url.clone(),
            tunnel_via: self.tunnel_via.clone(),
            version: self.version.clone(),
            capabilities: self.capabilities.clone(),
            joined: self.joined,
            box_key: self.box_key.clone(),
            tls_pin: self.tls_pin.clone(),
        }
    }

    pub fn key(&self) -> Option<VerifyingKey> {
        parse_public_key(&self.public_key)
    }

    /// Re-sign the owner register with new fields (the key never changes).
    pub fn resign_owner(&mut self, fields: OwnerFields, version: Version, key: &SigningKey) {
        let sig = sign_b64(key, &owner_payload(&fields, &version));
        self.take_owner_fields(fields);
        self.updated = version.wall_ms;
        self.owner_version = version;
        self.owner_sig = sig;
    }

    fn take_owner_fields(&mut self, f: OwnerFields) {
        self.name = f.name;
        self.public_key = f.public_key;
        self.advertise_url = f.advertise_url;
        self.tunnel_via = f.tunnel_via;
        self.version = f.version;
        self.capabilities = f.capabilities;
        self.joined = f.joined;
        self.box_key = f.box_key;
        self.tls_pin = f.tls_pin;
    }

    /// The owner's signature checks out against `key` (the pinned key, or the record's own).
    pub fn owner_sig_valid(&self, key: &VerifyingKey) -> bool {
        verify_b64(key, &owner_payload(&self.owner_fields(), &self.owner_version), &self.owner_sig)
    }

    pub fn admit(&mut self, by: &NodeId, version: Version, key: &SigningKey) {
        let sig = sign_b64(key, &admission_payload(&self.id, &self.public_key));
        self.admitted = Some(Mark { version, by: by.clone(), sig });
    }

    pub fn admission_valid(&self, author_key: &VerifyingKey) -> bool {
        match &self.admitted {
            Some(m) => verify_b64(author_key, &admission_payload(&self.id, &self.public_key), &m.sig),
            None => false,
        }
    }

    pub fn set_admin(&mut self, state: AdminState, version: Version, key: &SigningKey) {
        let sig = sign_b64(key, &admin_payload(&self.id, state, &version));
        self.admin_state = state;
        self.admin = Some(Mark { by: version.node.clone(), version, sig });
    }

    pub fn admin_valid(&self, author_key: &VerifyingKey) -> bool {
        match &self.admin {
            Some(m) => verify_b64(author_key, &admin_payload(&self.id, self.admin_state, &m.version), &m.sig),
            None => self.admin_state == AdminState::Active,
        }
    }

    pub fn set_removed(&mut self, version: Version, key: &SigningKey) {
        let sig = sign_b64(key, &removal_payload(&self.id, &version));
        self.removed = true;
        self.removal = Some(Mark { by: version.node.clone(), version, sig });
    }

    pub fn removal_valid(&self, author_key: &VerifyingKey) -> bool {
        match &self.removal {
            Some(m) => verify_b64(author_key, &removal_payload(&self.id, &m.version), &m.sig),
            None => !self.removed,
        }
    }

    pub fn set_health(&mut self, h: Health, key: &SigningKey) {
        self.health_sig = sign_b64(key, &health_payload(&self.id, &h));
        self.health = Some(h);
    }

    pub fn health_valid(&self, key: &VerifyingKey) -> bool {
        match &self.health {
            Some(h) => verify_b64(key, &health_payload(&self.id, h), &self.health_sig),
            None => true,
        }
    }

    /// The versions that must agree across nodes once membership has converged.
    pub fn register_versions(&self) -> (Version, Option<Version>, Option<Version>) {
        (
            self.owner_version.clone(),
            self.admin.as_ref().map(|m| m.version.clone()),
            self.removal.as_ref().map(|m| m.version.clone()),
        )
    }

    // -- register merges; each returns true when it changed `self` --

    /// Take `other`'s owner register when it is newer and signed by the pinned key.
    pub fn merge_owner(&mut self, other: &NodeRecord) -> bool {
        if other.owner_version <= self.owner_version || other.public_key != self.public_key || !other.shape_ok() {
            return false;
        }
        let Some(key) = self.key() else { return false };
        if !other.owner_sig_valid(&key) {
            return false;
        }
        self.take_owner_fields(other.owner_fields());
        self.updated = other.updated;
        self.owner_version = other.owner_version.clone();
        self.owner_sig = other.owner_sig.clone();
        true
    }

    pub fn merge_admin(&mut self, other: &NodeRecord, author_key: impl Fn(&NodeId) -> Option<VerifyingKey>) -> bool {
        let Some(theirs) = &other.admin else { return false };
        if let Some(ours) = &self.admin {
            if theirs.version <= ours.version {
                return false;
            }
        }
        let Some(key) = author_key(&theirs.by) else { return false };
        if theirs.version.node != theirs.by || !other.admin_valid(&key) {
            return false;
        }
        self.admin_state = other.admin_state;
        self.admin = other.admin.clone();
        true
    }

    pub fn merge_removal(&mut self, other: &NodeRecord, author_key: impl Fn(&NodeId) -> Option<VerifyingKey>) -> bool {
        let Some(theirs) = &other.removal else { return false };
        if let Some(ours) = &self.removal {
            if theirs.version <= ours.version {
                return false;
            }
        }
        let Some(key) = author_key(&theirs.by) else { return false };
        if theirs.version.node != theirs.by || !other.removal_valid(&key) {
            return false;
        }
        self.removed = true;
        self.removal = other.removal.clone();
        true
    }

    pub fn merge_health(&mut self, other: &NodeRecord) -> bool {
        let Some(theirs) = &other.health else { return false };
        if let Some(ours) = &self.health {
            if theirs.timestamp <= ours.timestamp {
                return false;
            }
        }
        let Some(key) = self.key() else { return false };
        if !other.health_valid(&key) {
            return false;
        }
        self.health = other.health.clone();
        self.health_sig = other.health_sig.clone();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, url: &str, features: usize) -> NodeRecord {
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let fields = OwnerFields {
            id: NodeId::new("n"),
            name: name.into(),
            public_key: crate::acn::public_key_b64(&key.verifying_key()),
            advertise_url: url.into(),
            tunnel_via: String::new(),
            version: "1".into(),
            capabilities: Capabilities {
                features: (0..features).map(|i| (format!("f{i}"), true)).collect(),
                ..Capabilities::default()
            },
            joined: 1,
            box_key: String::new(),
            tls_pin: String::new(),
        };
        NodeRecord::new_signed(fields, Version { wall_ms: 1, counter: 0, node: NodeId::new("n") }, &key)
    }

    #[test]
    fn a_record_that_says_too_much_about_itself_is_refused() {
        assert!(rec("home-1", "http://10.0.0.2:7300", 10).shape_ok());
        assert!(!rec(&"x".repeat(129), "http://10.0.0.2:7300", 0).shape_ok());
        assert!(!rec("n", "ftp://x", 0).shape_ok());
        assert!(!rec("n", "http://x", 257).shape_ok());
        assert!(!rec("bad\nname", "", 0).shape_ok());
        // A certificate pin is a SHA-256 in lowercase hex, or nothing.
        let mut r = rec("n", "https://10.0.0.2:7300", 0);
        assert!(!r.shape_ok(), "an https:// URL with no pin");
        r.tls_pin = "ab".repeat(32);
        assert!(r.shape_ok());
        let mut downgrade = r.clone();
        downgrade.advertise_url = "http://10.0.0.2:7300".into();
        assert!(!downgrade.shape_ok(), "a pin beside an http:// URL");
        r.tls_pin = "AB".repeat(32);
        assert!(!r.shape_ok());
        r.tls_pin = "ab".into();
        assert!(!r.shape_ok());
    }
}
