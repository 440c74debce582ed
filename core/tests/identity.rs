//! Property tests of the identity directory merge (issue 15 "One sign-on"): whatever the
//! origin publishes, a member's local-only accounts never change, the mirrored accounts are
//! exactly the entries the rules take, a merge is idempotent and independent of the entries'
//! order, and the persisted changes rebuild the same table.

use proptest::prelude::*;
use shoal_core::identity::{DirectoryEntry, Identity, IdentityOp, IdentityRestored, Role};
use shoal_core::time::Millis;
use std::collections::{BTreeMap, BTreeSet};

/// Two good hashes, then ones no node keeps: clear text, and a cost beyond the config's bounds.
const HASHES: [&str; 4] = [
    "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
    "$argon2id$v=19$m=8,t=1,p=1$c2FsdHNhbHQ$b3RoZXJvdGhlcm90aGVyMQ",
    "plain-text",
    "$argon2id$v=19$m=99999999,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
];
const NAMES: [&str; 6] = ["anna", "bo", "cy", "dee", "bad/name", ""];
const GROUPS: [&str; 3] = ["staff", "lab", "ops"];

fn entry() -> impl Strategy<Value = DirectoryEntry> {
    (0..NAMES.len(), 0..HASHES.len(), proptest::collection::btree_set(0..GROUPS.len(), 0..3), any::<bool>()).prop_map(
        |(n, h, g, admin)| DirectoryEntry {
            username: NAMES[n].into(),
            password_hash: HASHES[h].into(),
            groups: g.into_iter().map(|i| GROUPS[i].to_string()).collect(),
            role: if admin { Role::Admin } else { Role::User },
            password_changed: Millis(1),
        },
    )
}

/// A directory with each name once (the origin's table is keyed by name).
fn directory() -> impl Strategy<Value = Vec<DirectoryEntry>> {
    proptest::collection::vec(entry(), 0..8).prop_map(|v| {
        let mut seen = BTreeSet::new();
        v.into_iter().filter(|e| seen.insert(e.username.clone())).collect()
    })
}

/// A member with some groups, some local accounts, and (maybe) an earlier directory.
fn member(groups: &BTreeSet<usize>, locals: &BTreeSet<usize>, earlier: &[DirectoryEntry]) -> Identity {
    let mut t = Identity::default();
    for g in groups {
        t.add_group(Millis(0), GROUPS[*g]).unwrap();
    }
    for l in locals {
        t.add_account(Millis(0), NAMES[*l], Role::Admin, BTreeSet::new(), HASHES[0].into()).unwrap();
    }
    t.merge_directory(Millis(1), earlier);
    t
}

fn table(t: &Identity) -> BTreeMap<String, (Role, Vec<String>, String, bool)> {
    t.accounts()
        .into_iter()
        .map(|a| {
            let hash = t.account(&a.name).unwrap().hash.clone();
            (a.name.clone(), (a.role, a.groups.clone(), hash, a.mirrored))
        })
        .collect()
}

/// What the store holds after replaying `ops`: accounts by name.
fn replay(ops: &[IdentityOp], into: &mut BTreeMap<String, shoal_core::identity::Account>) {
    for op in ops {
        match op {
            IdentityOp::PutAccount(a) => {
                into.insert(a.name.clone(), a.clone());
            }
            IdentityOp::DeleteAccount(n) => {
                into.remove(n);
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_merge_follows_the_rules_whatever_the_origin_publishes(
        groups in proptest::collection::btree_set(0..GROUPS.len(), 0..4),
        locals in proptest::collection::btree_set(0..4usize, 0..3),
        earlier in directory(),
        dir in directory(),
        seed in any::<u64>(),
    ) {
        let mut t = member(&groups, &locals, &earlier);
        let mut stored = BTreeMap::new();
        replay(&t.take_ops(), &mut stored);
        let before = table(&t);
        t.merge_directory(Millis(2), &dir);
        replay(&t.take_ops(), &mut stored);
        let after = table(&t);

        // Local-only accounts are never touched.
        for l in &locals {
            prop_assert_eq!(before.get(NAMES[*l]), after.get(NAMES[*l]));
            prop_assert!(!after[NAMES[*l]].3);
        }
        // The mirrored accounts are exactly the entries the rules take, with the groups that
        // exist here only.
        let here: BTreeSet<&str> = groups.iter().map(|g| GROUPS[*g]).collect();
        let taken: BTreeSet<String> = dir
            .iter()
            .filter(|e| shoal_core::identity::valid_username(&e.username))
            .filter(|e| HASHES[..2].contains(&e.password_hash.as_str()))
            .filter(|e| !locals.iter().any(|l| NAMES[*l] == e.username))
            .filter(|e| e.groups.is_empty() || e.groups.iter().any(|g| here.contains(g.as_str())))
            .map(|e| e.username.clone())
            .collect();
        let mirrored: BTreeSet<String> = after.iter().filter(|(_, a)| a.3).map(|(n, _)| n.clone()).collect();
        prop_assert_eq!(&mirrored, &taken);
        for (name, (role, g, hash, _)) in after.iter().filter(|(_, a)| a.3) {
            let e = dir.iter().find(|e| &e.username == name).unwrap();
            prop_assert_eq!(*role, e.role);
            prop_assert_eq!(hash, &e.password_hash);
            prop_assert!(g.iter().all(|g| here.contains(g.as_str()) && e.groups.contains(g)));
        }
        // What was persisted is what is held.
        let held: BTreeMap<String, shoal_core::identity::Account> =
            after.keys().map(|n| (n.clone(), t.account(n).unwrap().clone())).collect();
        prop_assert_eq!(&stored, &held);
        // Idempotent: the same directory again changes nothing, writes nothing.
        t.merge_directory(Millis(3), &dir);
        prop_assert!(t.take_ops().is_empty());
        prop_assert_eq!(table(&t), after.clone());
        // The entries' order does not matter.
        let mut shuffled = dir.clone();
        let mut rng = shoal_core::rng::SeededRng::new(seed);
        for i in (1..shuffled.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            shuffled.swap(i, j);
        }
        let mut u = member(&groups, &locals, &earlier);
        u.merge_directory(Millis(2), &shuffled);
        prop_assert_eq!(table(&u), after);
        // A restart brings back the same table.
        let restored = Identity::restore(IdentityRestored {
            accounts: stored.into_values().collect(),
            groups: t.groups(),
            credentials: Vec::new(),
        });
        prop_assert_eq!(table(&restored), table(&t));
    }
}
