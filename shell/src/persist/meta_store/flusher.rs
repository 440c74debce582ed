//! The task that commits the metadata store's buffer every 50 ms and folds the journal.

use super::*;

/// Flush `store` every `every` (50 ms in a node) until `stop` turns true (or its sender is
/// dropped), then flush a last time. After a flush, folds the journal once it holds more than
/// 100,000 ops or 16 MiB (see the module doc). A failed flush or fold is logged and retried at the next
/// tick.
///
/// A durable store commits on the blocking pool (its fsync must not hold up a runtime worker); a
/// non-durable one (simulation) commits inline, so a simulated run stays on the simulated clock.
pub fn spawn_flusher(store: Arc<MetaStore>, every: Duration, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        let mut failures = Failures::default();
        loop {
            if *stop.borrow_and_update() {
                break;
            }
            tokio::select! {
                _ = tick.tick() => {
                    flush_logged(&store, &mut failures).await;
                    fold_logged(&store, &mut failures).await;
                }
                _ = store.kick.notified() => {
                    flush_logged(&store, &mut failures).await;
                }
                changed = stop.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        if let Err(e) = run_on(&store, MetaStore::flush).await {
            tracing::error!(error = %e, buffered = store.buffered(), "final metadata flush failed; queued writes lost");
        }
        fold_logged(&store, &mut failures).await;
    })
}

#[derive(Default)]
struct Failures {
    flush: u64,
    fold: u64,
    /// The flush error last reported to the node.
    reported: Option<String>,
}

/// `f` (a flush or a fold) on the blocking pool if the store is durable, else inline.
async fn run_on(
    store: &Arc<MetaStore>,
    f: fn(&MetaStore) -> Result<usize, MetaStoreError>,
) -> Result<usize, MetaStoreError> {
    if store.offload {
        let s = store.clone();
        match tokio::task::spawn_blocking(move || f(&s)).await {
            Ok(r) => r,
            Err(e) => Err(MetaStoreError::Db(format!("flush task: {e}"))),
        }
    } else {
        f(store)
    }
}

async fn flush_logged(store: &Arc<MetaStore>, failures: &mut Failures) {
    match run_on(store, MetaStore::flush).await {
        Ok(_) => {
            if failures.flush > 0 {
                tracing::info!(failures = failures.flush, "metadata flush works again");
                failures.flush = 0;
                failures.reported = None;
                store.report_health(None);
            }
        }
        Err(e) => {
            failures.flush += 1;
            let why = e.to_string();
            if store.offload {
                let (s, w) = (store.clone(), why.clone());
                let _ = tokio::task::spawn_blocking(move || s.reopen_if_poisoned(&w)).await;
            } else {
                store.reopen_if_poisoned(&why);
            }
            if failures.reported.as_ref() != Some(&why) {
                failures.reported = Some(why.clone());
                store.report_health(Some(why));
            }
            // Every tick retries; the log gets the first failure and then one in a hundred.
            if failures.flush % 100 == 1 {
                tracing::error!(error = %e, failures = failures.flush, buffered = store.buffered(), "metadata flush failed; retrying");
            }
        }
    }
}

/// Fold if the journal is over its op or byte threshold.
async fn fold_logged(store: &Arc<MetaStore>, failures: &mut Failures) {
    if !store.fold_due() {
        return;
    }
    match run_on(store, MetaStore::fold).await {
        Ok(_) => {
            if failures.fold > 0 {
                tracing::info!(failures = failures.fold, "metadata journal fold works again");
                failures.fold = 0;
            }
        }
        Err(e) => {
            failures.fold += 1;
            if failures.fold % 100 == 1 {
                tracing::error!(error = %e, failures = failures.fold, journal_ops = store.journal_ops(), "metadata journal fold failed; retrying");
            }
        }
    }
}
