//! The node's one redb database (`DATA/cluster.redb`), shared by the membership tables
//! ([`crate::persist::store`]) and the metadata store ([`crate::persist::meta_store`]).
//!
//! redb refuses every transaction after one I/O error ("Previous I/O error occurred") until the
//! database is closed and opened again: a data dir that filled up once would leave the node
//! unable to store anything until a restart, and what it had acknowledged into memory would
//! wait for that restart. [`Db::reopen`] closes and reopens the file in place (issue 17 "Disk
//! faults"); the metadata flusher calls it when a flush fails that way.

use redb::{Database, ReadTransaction, StorageError, TransactionError, WriteTransaction};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

pub struct Db {
    /// The file, for reopening (`None`: a database given whole, e.g. in memory in tests).
    path: Option<PathBuf>,
    /// `None` only while a reopen is under way.
    inner: RwLock<Option<Arc<Database>>>,
}

/// What converts into the shared database handle (a [`Db`], or a redb database given whole).
pub trait IntoDb {
    fn into_db(self) -> Arc<Db>;
}

impl IntoDb for Arc<Db> {
    fn into_db(self) -> Arc<Db> {
        self
    }
}

impl IntoDb for Arc<Database> {
    fn into_db(self) -> Arc<Db> {
        Arc::new(Db { path: None, inner: RwLock::new(Some(self)) })
    }
}

/// redb's page cache. Its default (1 GiB) let a node's RSS follow the database file up to a
/// gigabyte (issue 17's soak); the metadata is served from the core's memory, so the cache
/// only speeds up flushes, folds and the rare read of a table (catch-up, load).
const CACHE_BYTES: usize = 32 << 20;

fn builder() -> redb::Builder {
    let mut b = Database::builder();
    b.set_cache_size(CACHE_BYTES);
    b
}

fn closed() -> StorageError {
    StorageError::Io(std::io::Error::other("the database is being reopened after an I/O error"))
}

impl Db {
    /// Open (or create) the database file at `path`.
    pub fn open(path: impl Into<PathBuf>) -> Result<Db, redb::DatabaseError> {
        let path = path.into();
        let db = builder().create(&path)?;
        Ok(Db { path: Some(path), inner: RwLock::new(Some(Arc::new(db))) })
    }

    fn get(&self) -> Result<Arc<Database>, StorageError> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone().ok_or_else(closed)
    }

    // The same signature as redb's own `Database::begin_write` (its error type is large).
    #[allow(clippy::result_large_err)]
    pub fn begin_write(&self) -> Result<WriteTransaction, TransactionError> {
        self.get()?.begin_write()
    }

    #[allow(clippy::result_large_err)]
    pub fn begin_read(&self) -> Result<ReadTransaction, TransactionError> {
        self.get()?.begin_read()
    }

    /// Close the database and open it again (after an I/O error). Gives up at once, leaving
    /// the old handle in place, while a call holds it (the flusher tries again at its next
    /// tick); on a failed open the handle stays closed until a later try works.
    pub fn reopen(&self) -> Result<(), String> {
        let Some(path) = &self.path else { return Err("an in-memory database is not reopened".into()) };
        let mut slot = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.take() {
            match Arc::try_unwrap(old) {
                Ok(db) => drop(db),
                Err(still) => {
                    *slot = Some(still);
                    return Err("the database is in use".into());
                }
            }
        }
        match builder().create(path) {
            Ok(db) => {
                *slot = Some(Arc::new(db));
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{ReadableTableMetadata, TableDefinition};

    const T: TableDefinition<&str, u64> = TableDefinition::new("t");

    #[test]
    fn a_reopened_database_keeps_its_data_and_a_busy_one_is_left_usable() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("x.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(T).unwrap().insert("a", 1).unwrap();
        txn.commit().unwrap();
        db.reopen().unwrap();
        assert_eq!(db.begin_read().unwrap().open_table(T).unwrap().len().unwrap(), 1);
        // A transaction in flight holds the old handle: the reopen gives up and changes nothing.
        let held = db.get().unwrap();
        assert!(db.reopen().is_err());
        drop(held);
        assert_eq!(db.begin_read().unwrap().open_table(T).unwrap().len().unwrap(), 1);
        // In memory: never reopened.
        let mem: Arc<Db> =
            Arc::new(Database::builder().create_with_backend(redb::backends::InMemoryBackend::new()).unwrap())
                .into_db();
        assert!(mem.reopen().is_err());
    }
}
