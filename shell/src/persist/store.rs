//! Persistence of the node's cluster state in redb (`DATA/cluster.redb`): the cluster info,
//! member records, join tokens, purged ids and the folders this node contributed as volumes
//! (its own list, which no replicated record can change). The core says what to write
//! ([`PersistOp`]); this module writes each drained batch in one transaction.
//!
//! Leaving the cluster (`ClearCluster`) empties these tables only.
//!
//! After every batch the same cluster state is also copied, whole, to
//! `DATA/cluster.recovery.json` (mode 0600, written to a temporary file and renamed, only when
//! it changed): what `shoal serve --rebuild-meta` needs to rejoin its peers when `cluster.redb`
//! itself is damaged ([`rebuild`]). The metadata comes back from the peers, not from here.

use super::db::Db;
use redb::{Durability, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use shoal_core::node::{PersistOp, Restored};
use shoal_core::records::{ClusterInfo, NodeRecord};
use shoal_core::token::TokenRecord;
use shoal_core::{NodeId, VolumeId};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The copy of the cluster state beside the database (see the module doc).
pub const RECOVERY_FILE: &str = "cluster.recovery.json";

#[derive(Serialize, Deserialize)]
struct Recovery {
    cluster: ClusterInfo,
    records: Vec<NodeRecord>,
    tokens: Vec<TokenRecord>,
    purged: Vec<NodeId>,
    own_volumes: Option<Vec<(VolumeId, String)>>,
}

const CLUSTER: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
const PURGED: TableDefinition<&str, u64> = TableDefinition::new("purged");
/// Volume id -> folder, for this node's own volumes.
const OWN_VOLUMES: TableDefinition<&str, &str> = TableDefinition::new("own_volumes");
/// This node's accounts (`a/NAME`), groups (`g/NAME`) and credentials (`c/DIGEST`), JSON. Not
/// the cluster's: kept when the node leaves.
const IDENTITY: TableDefinition<&str, &[u8]> = TableDefinition::new("identity");
/// Key in `cluster` saying `own_volumes` was written (an empty list is a list).
const OWN_VOLUMES_KEPT: &str = "own_volumes_kept";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(String),
    #[error("stored record {0} is corrupt: {1}")]
    Corrupt(String, String),
}

macro_rules! db_err {
    ($($t:ty),*) => { $( impl From<$t> for StoreError { fn from(e: $t) -> Self { StoreError::Db(e.to_string()) } } )* };
}
db_err!(redb::DatabaseError, redb::TransactionError, redb::TableError, redb::StorageError, redb::CommitError);

pub struct Store {
    db: Arc<Db>,
    durable: bool,
    /// Where the recovery copy goes, and its last bytes written.
    recovery: PathBuf,
    recovery_written: Mutex<Vec<u8>>,
}

impl Store {
    /// Open (or create) the database. `durable: false` skips fsync (simulation only).
    pub fn open(path: &Path, durable: bool) -> Result<Store, StoreError> {
        let db = Db::open(path)?;
        let txn = db.begin_write()?;
        {
            txn.open_table(CLUSTER)?;
            txn.open_table(NODES)?;
            txn.open_table(TOKENS)?;
            txn.open_table(PURGED)?;
            txn.open_table(OWN_VOLUMES)?;
            txn.open_table(IDENTITY)?;
        }
        txn.commit()?;
        let recovery = path.parent().unwrap_or(Path::new(".")).join(RECOVERY_FILE);
        let written = std::fs::read(&recovery).unwrap_or_default();
        Ok(Store { db: Arc::new(db), durable, recovery, recovery_written: Mutex::new(written) })
    }

    /// The database, shared with the other tables of `cluster.redb` (the metadata store's,
    /// [`crate::persist::meta_store`]).
    pub fn database(&self) -> Arc<Db> {
        self.db.clone()
    }

    pub fn load(&self) -> Result<Restored, StoreError> {
        let txn = self.db.begin_read()?;
        let mut out = Restored::default();
        let cluster = txn.open_table(CLUSTER)?;
        if let Some(v) = cluster.get("info")? {
            out.cluster = Some(
                serde_json::from_slice(v.value()).map_err(|e| StoreError::Corrupt("cluster".into(), e.to_string()))?,
            );
        }
        for row in txn.open_table(NODES)?.iter()? {
            let (k, v) = row?;
            let rec = serde_json::from_slice(v.value())
                .map_err(|e| StoreError::Corrupt(format!("node {}", k.value()), e.to_string()))?;
            out.records.push(rec);
        }
        for row in txn.open_table(TOKENS)?.iter()? {
            let (k, v) = row?;
            let rec = serde_json::from_slice(v.value())
                .map_err(|e| StoreError::Corrupt(format!("token {}", k.value()), e.to_string()))?;
            out.tokens.push(rec);
        }
        for row in txn.open_table(PURGED)?.iter()? {
            let (k, _) = row?;
            out.purged.push(shoal_core::NodeId::new(k.value()));
        }
        if cluster.get(OWN_VOLUMES_KEPT)?.is_some() {
            let mut own = Vec::new();
            for row in txn.open_table(OWN_VOLUMES)?.iter()? {
                let (k, v) = row?;
                own.push((shoal_core::VolumeId::new(k.value()), v.value().to_string()));
            }
            out.own_volumes = Some(own);
        }
        out.identity = self.load_identity(&txn)?;
        Ok(out)
    }

    fn load_identity(&self, txn: &redb::ReadTransaction) -> Result<shoal_core::identity::IdentityRestored, StoreError> {
        let mut out = shoal_core::identity::IdentityRestored::default();
        for row in txn.open_table(IDENTITY)?.iter()? {
            let (k, v) = row?;
            let key = k.value();
            let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("identity {key}"), e.to_string());
            match key.split_once('/') {
                Some(("a", _)) => out.accounts.push(serde_json::from_slice(v.value()).map_err(corrupt)?),
                Some(("g", _)) => out.groups.push(serde_json::from_slice(v.value()).map_err(corrupt)?),
                Some(("c", _)) => out.credentials.push(serde_json::from_slice(v.value()).map_err(corrupt)?),
                _ => return Err(StoreError::Corrupt(format!("identity {key}"), "unknown row".into())),
            }
        }
        Ok(out)
    }

    /// Write a batch of changes in one transaction.
    pub fn apply(&self, ops: &[PersistOp]) -> Result<(), StoreError> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut txn = self.db.begin_write()?;
        if !self.durable {
            txn.set_durability(Durability::None);
        }
        {
            let mut cluster = txn.open_table(CLUSTER)?;
            let mut nodes = txn.open_table(NODES)?;
            let mut tokens = txn.open_table(TOKENS)?;
            let mut purged = txn.open_table(PURGED)?;
            let mut own_volumes = txn.open_table(OWN_VOLUMES)?;
            let mut identity = txn.open_table(IDENTITY)?;
            for op in ops {
                match op {
                    PersistOp::PutCluster(c) => {
                        cluster.insert("info", serde_json::to_vec(c).expect("serialise").as_slice())?;
                    }
                    PersistOp::ClearCluster => {
                        cluster.retain(|_, _| false)?;
                        nodes.retain(|_, _| false)?;
                        tokens.retain(|_, _| false)?;
                        purged.retain(|_, _| false)?;
                        own_volumes.retain(|_, _| false)?;
                    }
                    PersistOp::PutRecord(r) => {
                        nodes.insert(r.id.as_str(), serde_json::to_vec(r).expect("serialise").as_slice())?;
                    }
                    PersistOp::DeleteRecord(id) => {
                        nodes.remove(id.as_str())?;
                    }
                    PersistOp::PutPurged(id) => {
                        purged.insert(id.as_str(), 0)?;
                    }
                    PersistOp::PutToken(t) => {
                        tokens.insert(t.id.as_str(), serde_json::to_vec(t).expect("serialise").as_slice())?;
                    }
                    PersistOp::DeleteToken(id) => {
                        tokens.remove(id.as_str())?;
                    }
                    PersistOp::PutOwnVolumes(list) => {
                        own_volumes.retain(|_, _| false)?;
                        for (id, folder) in list {
                            own_volumes.insert(id.as_str(), folder.as_str())?;
                        }
                        cluster.insert(OWN_VOLUMES_KEPT, b"1".as_slice())?;
                    }
                    PersistOp::Identity(op) => {
                        use shoal_core::identity::IdentityOp as I;
                        match op {
                            I::PutAccount(a) => identity.insert(format!("a/{}", a.name).as_str(), row(a).as_slice())?,
                            I::DeleteAccount(n) => identity.remove(format!("a/{n}").as_str())?,
                            I::PutGroup(g) => identity.insert(format!("g/{}", g.name).as_str(), row(g).as_slice())?,
                            I::DeleteGroup(n) => identity.remove(format!("g/{n}").as_str())?,
                            I::PutCredential(c) => {
                                identity.insert(format!("c/{}", c.digest).as_str(), row(c).as_slice())?
                            }
                            I::DeleteCredential(d) => identity.remove(format!("c/{d}").as_str())?,
                        };
                    }
                }
            }
        }
        txn.commit()?;
        // The recovery copy holds cluster state only.
        if ops.iter().any(|op| !matches!(op, PersistOp::Identity(_))) {
            self.write_recovery();
        }
        Ok(())
    }

    /// Copy the cluster state to the recovery file when it changed (outside a cluster: remove
    /// it). A failure here is logged: the database, written above, is what counts.
    fn write_recovery(&self) {
        let state = match self.load() {
            Ok(s) => s,
            Err(e) => return tracing::warn!(error = %e, "recovery copy not written"),
        };
        let bytes = match state.cluster {
            Some(cluster) => {
                // Without what changes at every heartbeat (health, last seen), so the copy is
                // rewritten only when the membership itself changes; gossip brings those back.
                let records = state
                    .records
                    .into_iter()
                    .map(|mut r| {
                        r.health = None;
                        r.health_sig.clear();
                        r.last_seen = 0;
                        r.last_seen_ms = 0;
                        r.last_seen_age_ms = None;
                        r
                    })
                    .collect();
                let r = Recovery {
                    cluster,
                    records,
                    tokens: state.tokens,
                    purged: state.purged,
                    own_volumes: state.own_volumes,
                };
                serde_json::to_vec(&r).unwrap_or_default()
            }
            None => Vec::new(),
        };
        let mut last = crate::sync::lock(&self.recovery_written);
        if *last == bytes {
            return;
        }
        let result = if bytes.is_empty() {
            std::fs::remove_file(&self.recovery).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
        } else {
            write_private(&self.recovery, &bytes)
        };
        match result {
            Ok(()) => *last = bytes,
            Err(e) => tracing::warn!(file = %self.recovery.display(), error = %e, "recovery copy not written"),
        }
    }
}

/// A value as its JSON row.
fn row<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("serialise")
}

/// Write `bytes` to `path` through a temporary file renamed over it, mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("json.tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    // The rename itself is durable once the folder is.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Why a rebuild could not start.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    #[error("{0} is missing or unreadable ({1}): this node cannot find its cluster again; move {2} away and join with a new token (`shoal cluster join TOKEN`)")]
    NoRecovery(PathBuf, String, PathBuf),
    #[error("cannot keep the damaged database aside ({0}): {1}")]
    Aside(PathBuf, std::io::Error),
    #[error("cannot write a new database at {0}: {1}")]
    Fresh(PathBuf, StoreError),
    #[error("{0} opens and reads fine: --rebuild-meta is for a damaged one (remove the flag)")]
    Healthy(PathBuf),
}

/// `shoal serve --rebuild-meta`: keep the database at `db_path` aside as
/// `cluster.redb.damaged-SECS` (if it is there) and write a new one holding only the cluster
/// state of the recovery file; the metadata then comes back from the peers. Returns the name
/// the damaged file was kept under.
pub fn rebuild(db_path: &Path, now_secs: u64) -> Result<Option<PathBuf>, RebuildError> {
    let dir = db_path.parent().unwrap_or(Path::new("."));
    let recovery_path = dir.join(RECOVERY_FILE);
    let recovery: Recovery = std::fs::read(&recovery_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        .map_err(|e| RebuildError::NoRecovery(recovery_path.clone(), e, db_path.to_path_buf()))?;
    // A flag left in a service unit must not throw a healthy database away at every start.
    let healthy = |s: Store| {
        s.load().is_ok() && super::meta_store::MetaStore::open(s.database(), true).is_ok_and(|m| m.load().is_ok())
    };
    if db_path.exists() && Store::open(db_path, true).is_ok_and(healthy) {
        return Err(RebuildError::Healthy(db_path.to_path_buf()));
    }
    let aside = if db_path.exists() {
        let name =
            format!("{}.damaged-{now_secs}", db_path.file_name().and_then(|n| n.to_str()).unwrap_or("cluster.redb"));
        let to = dir.join(name);
        std::fs::rename(db_path, &to).map_err(|e| RebuildError::Aside(to.clone(), e))?;
        Some(to)
    } else {
        None
    };
    let store = Store::open(db_path, true).map_err(|e| RebuildError::Fresh(db_path.to_path_buf(), e))?;
    let mut ops = vec![PersistOp::PutCluster(recovery.cluster)];
    ops.extend(recovery.records.into_iter().map(|r| PersistOp::PutRecord(Box::new(r))));
    ops.extend(recovery.tokens.into_iter().map(PersistOp::PutToken));
    ops.extend(recovery.purged.into_iter().map(PersistOp::PutPurged));
    if let Some(own) = recovery.own_volumes {
        ops.push(PersistOp::PutOwnVolumes(own));
    }
    store.apply(&ops).map_err(|e| RebuildError::Fresh(db_path.to_path_buf(), e))?;
    Ok(aside)
}
