//! Persistence of the node's cluster state in redb (`DATA/cluster.redb`): the cluster info,
//! member records, join tokens, purged ids and the folders this node contributed as volumes
//! (its own list, which no replicated record can change). The core says what to write
//! ([`PersistOp`]); this module writes each drained batch in one transaction.
//!
//! Leaving the cluster (`ClearCluster`) empties these tables only.

use redb::{Database, Durability, ReadableTable, TableDefinition};
use shoal_core::node::{PersistOp, Restored};
use std::path::Path;
use std::sync::Arc;

const CLUSTER: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
const PURGED: TableDefinition<&str, u64> = TableDefinition::new("purged");
/// Volume id -> folder, for this node's own volumes.
const OWN_VOLUMES: TableDefinition<&str, &str> = TableDefinition::new("own_volumes");
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
    db: Arc<Database>,
    durable: bool,
}

impl Store {
    /// Open (or create) the database. `durable: false` skips fsync (simulation only).
    pub fn open(path: &Path, durable: bool) -> Result<Store, StoreError> {
        let db = Database::create(path)?;
        let txn = db.begin_write()?;
        {
            txn.open_table(CLUSTER)?;
            txn.open_table(NODES)?;
            txn.open_table(TOKENS)?;
            txn.open_table(PURGED)?;
            txn.open_table(OWN_VOLUMES)?;
        }
        txn.commit()?;
        Ok(Store { db: Arc::new(db), durable })
    }

    /// The database, shared with the other tables of `cluster.redb` (the metadata store's,
    /// [`crate::persist::meta_store`]).
    pub fn database(&self) -> Arc<Database> {
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
                }
            }
        }
        txn.commit()?;
        Ok(())
    }
}
