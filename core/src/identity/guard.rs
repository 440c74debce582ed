//! The backoff of failed logins (issue 15 "Accounts and sessions"): per account and per source
//! address, free for the first [`FAILURES_FREE`] failures, then exponential (1 s doubling to
//! 15 min). A success clears the account's count (not the source's: one address guessing many
//! accounts stays slowed). Time is `now`; state is bounded ([`SOURCES_MAX`] sources, the
//! quietest forgotten first; anything quiet for an hour is forgotten).

use crate::time::Millis;
use std::collections::BTreeMap;

/// Failures allowed before any wait.
pub const FAILURES_FREE: u32 = 5;
const FIRST_WAIT_MS: u64 = 1_000;
const WAIT_MAX_MS: u64 = 15 * 60 * 1_000;
const FORGET_AFTER_MS: u64 = 60 * 60 * 1_000;
/// Most accounts and most sources remembered, each.
pub const SOURCES_MAX: usize = 10_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Count {
    failures: u32,
    /// Tries begun whose password check has not ended: counted as failures until they end, so
    /// a burst of parallel guesses cannot all pass one check.
    pending: u32,
    last: Millis,
}

impl Count {
    /// When the next try is allowed.
    fn free_at(&self) -> Millis {
        let counted = self.failures.saturating_add(self.pending);
        if counted < FAILURES_FREE {
            return Millis::ZERO;
        }
        let doublings = (counted - FAILURES_FREE).min(20);
        self.last.plus((FIRST_WAIT_MS << doublings).min(WAIT_MAX_MS))
    }
}

/// A login refused before its password is checked: try again after `retry_after_ms` (HTTP 429
/// with `Retry-After`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub retry_after_ms: u64,
}

#[derive(Clone, Debug, Default)]
pub struct LoginGuard {
    accounts: BTreeMap<String, Count>,
    sources: BTreeMap<String, Count>,
}

impl LoginGuard {
    /// May a login for `account` from `source` be tried at `now`?
    pub fn check(&self, now: Millis, account: &str, source: &str) -> Result<(), Refused> {
        let at = [self.accounts.get(account), self.sources.get(source)]
            .into_iter()
            .flatten()
            .map(Count::free_at)
            .max()
            .unwrap_or(Millis::ZERO);
        if now < at {
            Err(Refused { retry_after_ms: at.since(now) })
        } else {
            Ok(())
        }
    }

    /// [`LoginGuard::check`], and if allowed the try is counted as pending until
    /// [`LoginGuard::end`].
    pub fn begin(&mut self, now: Millis, account: &str, source: &str) -> Result<(), Refused> {
        self.check(now, account, source)?;
        for (map, key) in [(&mut self.accounts, account), (&mut self.sources, source)] {
            let c = map.entry(key.to_string()).or_default();
            c.pending = c.pending.saturating_add(1);
            c.last = now;
            bound(map, now);
        }
        Ok(())
    }

    /// A try begun with [`LoginGuard::begin`] ended: a failure counts, a success clears the
    /// account.
    pub fn end(&mut self, now: Millis, account: &str, source: &str, ok: bool) {
        for (map, key) in [(&mut self.accounts, account), (&mut self.sources, source)] {
            if let Some(c) = map.get_mut(key) {
                c.pending = c.pending.saturating_sub(1);
            }
        }
        if ok {
            self.succeeded(account);
        } else {
            self.failed(now, account, source);
        }
    }

    /// A wrong password (or unknown account) for `account` from `source`.
    pub fn failed(&mut self, now: Millis, account: &str, source: &str) {
        for (map, key) in [(&mut self.accounts, account), (&mut self.sources, source)] {
            let c = map.entry(key.to_string()).or_default();
            c.failures = c.failures.saturating_add(1);
            c.last = now;
            bound(map, now);
        }
    }

    /// A login that worked: the account's count starts over.
    pub fn succeeded(&mut self, account: &str) {
        self.accounts.remove(account);
    }

    pub fn len(&self) -> (usize, usize) {
        (self.accounts.len(), self.sources.len())
    }
}

/// Forget entries quiet for an hour, then the quietest beyond the bound.
fn bound(map: &mut BTreeMap<String, Count>, now: Millis) {
    if map.len() <= SOURCES_MAX {
        return;
    }
    map.retain(|_, c| now.since(c.last) < FORGET_AFTER_MS);
    while map.len() > SOURCES_MAX {
        let Some(quietest) = map.iter().min_by(|a, b| (a.1.last, a.0).cmp(&(b.1.last, b.0))).map(|(k, _)| k.clone())
        else {
            break;
        };
        map.remove(&quietest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_failures_are_free_then_the_wait_doubles_to_fifteen_minutes() {
        let mut g = LoginGuard::default();
        let t = Millis(1_000_000);
        for _ in 0..FAILURES_FREE {
            assert_eq!(g.check(t, "anna", "10.0.0.1"), Ok(()));
            g.failed(t, "anna", "10.0.0.1");
        }
        assert_eq!(g.check(t, "anna", "10.0.0.1"), Err(Refused { retry_after_ms: 1_000 }));
        // From another address the account is still slowed; another account from this address too.
        assert!(g.check(t, "anna", "10.0.0.2").is_err());
        assert!(g.check(t, "bob", "10.0.0.1").is_err());
        assert_eq!(g.check(t, "bob", "10.0.0.2"), Ok(()));
        let mut waits = vec![];
        let mut now = t.plus(1_000);
        for _ in 0..12 {
            assert_eq!(g.check(now, "anna", "10.0.0.1"), Ok(()));
            g.failed(now, "anna", "10.0.0.1");
            let Err(r) = g.check(now, "anna", "10.0.0.1") else { panic!("not slowed") };
            waits.push(r.retry_after_ms);
            now = now.plus(r.retry_after_ms);
        }
        assert_eq!(&waits[..4], &[2_000, 4_000, 8_000, 16_000]);
        assert_eq!(*waits.last().unwrap(), WAIT_MAX_MS);
        // A success clears the account, not the address.
        g.succeeded("anna");
        assert!(g.check(now, "anna", "10.0.0.9").is_ok());
        g.failed(now, "dave", "10.0.0.1");
        assert!(g.check(now, "carol", "10.0.0.1").is_err(), "the address guessing accounts stays slowed");
    }

    #[test]
    fn parallel_tries_count_while_they_run() {
        let mut g = LoginGuard::default();
        let t = Millis(5_000);
        for _ in 0..FAILURES_FREE {
            assert!(g.begin(t, "anna", "s").is_ok());
        }
        // Five checks under way: a sixth in parallel waits, whatever their outcome will be.
        assert!(g.begin(t, "anna", "s").is_err());
        for _ in 0..FAILURES_FREE {
            g.end(t, "anna", "s", true);
        }
        assert!(g.begin(t, "anna", "s2").is_ok(), "successes clear the account");
    }

    #[test]
    fn a_flood_of_sources_stays_bounded() {
        let mut g = LoginGuard::default();
        for i in 0..(SOURCES_MAX + 500) {
            g.failed(Millis(i as u64), "anna", &format!("src-{i}"));
        }
        let (_, sources) = g.len();
        assert_eq!(sources, SOURCES_MAX);
        // The newest are kept.
        assert!(g.sources.contains_key(&format!("src-{}", SOURCES_MAX + 499)));
        assert!(!g.sources.contains_key("src-0"));
    }
}
