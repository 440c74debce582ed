//! Signed user assertions (issue 15 "One sign-on"; reference-facts.md "User assertion",
//! weakness 10): node A acting on node B for a signed-in user carries `X-Aroz-User:
//! base64url(payload) "." base64url(Ed25519 signature over the payload bytes)` with the
//! reference's fields `{u, g, i, c, t, e}` plus an audience `a` (the receiving node) and a
//! nonce `n`, and lives 60 s (the reference: 5 minutes, replayable to any member).
//!
//! The receiver refuses a wrong cluster, an unknown or removed issuer, a bad signature, an
//! expired or future assertion, another audience, and a replay; the nonce is spent only after
//! the signature holds, so a forger cannot use up an honest node's nonces.

use crate::ids::{ClusterId, NodeId};
use crate::time::Millis;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The header's name.
pub const ASSERTION_HEADER: &str = "x-aroz-user";
/// How long an assertion lives.
pub const ASSERTION_TTL_MS: u64 = 60_000;
/// How far ahead of the receiver's clock (after the issuer's known offset) `t` may be.
pub const ASSERTION_AHEAD_MS: u64 = 5_000;
/// Nonces remembered at most (each until its assertion expires).
pub const NONCES_MAX: usize = 100_000;
/// Longest header taken.
pub const ASSERTION_MAX_BYTES: usize = 8 * 1024;

/// What an assertion says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserAssertion {
    /// The user.
    pub u: String,
    /// Their groups.
    pub g: Vec<String>,
    /// The issuing node.
    pub i: NodeId,
    /// The cluster.
    pub c: ClusterId,
    /// Issued, unix seconds (the reference's unit) ...
    pub t: u64,
    /// ... and expiry.
    pub e: u64,
    /// The audience: the node it is for.
    pub a: NodeId,
    /// A nonce, spent at the audience.
    pub n: String,
    /// Issued, unix ms (a finer clock beside `t`, for the 60 s lifetime).
    #[serde(default)]
    pub tm: u64,
    /// The user's role as the issuer knows it.
    #[serde(default)]
    pub r: Option<super::Role>,
}

/// Why an assertion was refused (each a 401).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AssertionError {
    #[error("the user assertion is malformed")]
    Malformed,
    #[error("the user assertion is for another cluster")]
    WrongCluster,
    #[error("the user assertion's issuer is not a member")]
    UnknownIssuer,
    #[error("the user assertion's signature does not hold")]
    BadSignature,
    #[error("the user assertion expired")]
    Expired,
    #[error("the user assertion was issued in the future")]
    Future,
    #[error("the user assertion is for another node")]
    WrongAudience,
    #[error("the user assertion was used already")]
    Replayed,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// Sign `a` with the issuer's node key: the header's value.
pub fn issue(key: &SigningKey, a: &UserAssertion) -> String {
    let payload = serde_json::to_vec(a).expect("an assertion serialises");
    let sig = key.sign(&payload);
    format!("{}.{}", b64().encode(&payload), b64().encode(sig.to_bytes()))
}

/// The receiver's side: the nonces it has spent, each until its assertion expires.
#[derive(Clone, Debug, Default)]
pub struct AssertionVerifier {
    spent: BTreeMap<(NodeId, String), Millis>,
    /// The same nonces by expiry, so the expired ones go in order (no scan per request).
    by_expiry: BTreeSet<(Millis, NodeId, String)>,
}

impl AssertionVerifier {
    /// Check `header` at wall time `now` as node `me` of `cluster`; `key_of` gives a current
    /// member's key, `offset_of` its clock's offset from ours (ms, theirs minus ours).
    pub fn verify(
        &mut self,
        now: Millis,
        header: &str,
        me: &NodeId,
        cluster: &ClusterId,
        key_of: impl Fn(&NodeId) -> Option<VerifyingKey>,
        offset_of: impl Fn(&NodeId) -> i64,
    ) -> Result<UserAssertion, AssertionError> {
        if header.len() > ASSERTION_MAX_BYTES {
            return Err(AssertionError::Malformed);
        }
        let (p, s) = header.trim().split_once('.').ok_or(AssertionError::Malformed)?;
        let payload = b64().decode(p).map_err(|_| AssertionError::Malformed)?;
        let sig: [u8; 64] = b64().decode(s).ok().and_then(|b| b.try_into().ok()).ok_or(AssertionError::Malformed)?;
        let a: UserAssertion = serde_json::from_slice(&payload).map_err(|_| AssertionError::Malformed)?;
        if &a.c != cluster {
            return Err(AssertionError::WrongCluster);
        }
        let key = key_of(&a.i).ok_or(AssertionError::UnknownIssuer)?;
        key.verify(&payload, &Signature::from_bytes(&sig)).map_err(|_| AssertionError::BadSignature)?;
        if &a.a != me {
            return Err(AssertionError::WrongAudience);
        }
        // On our clock: the issuer's time minus its known offset (wide arithmetic: any u64).
        let ours = |theirs: u64| {
            Millis((i128::from(theirs) - i128::from(offset_of(&a.i))).clamp(0, i128::from(u64::MAX)) as u64)
        };
        let issued_ms = if a.tm > 0 { a.tm } else { a.t.saturating_mul(1000) };
        let issued = ours(issued_ms);
        let expires = ours(a.e.saturating_mul(1000).min(issued_ms.saturating_add(ASSERTION_TTL_MS)));
        if issued > now.plus(ASSERTION_AHEAD_MS) {
            return Err(AssertionError::Future);
        }
        if now >= expires {
            return Err(AssertionError::Expired);
        }
        // Spent only now that the signature holds.
        while let Some(first) = self.by_expiry.first().filter(|(until, _, _)| *until <= now).cloned() {
            self.by_expiry.remove(&first);
            self.spent.remove(&(first.1, first.2));
        }
        let nonce = (a.i.clone(), a.n.clone());
        if self.spent.contains_key(&nonce) {
            return Err(AssertionError::Replayed);
        }
        if self.spent.len() >= NONCES_MAX {
            // Full of live nonces: refuse rather than forget one that could then be replayed.
            return Err(AssertionError::Replayed);
        }
        // Kept as long as any clock offset we might learn could make it valid again.
        let keep = expires.max(now.plus(ASSERTION_TTL_MS + ASSERTION_AHEAD_MS));
        self.by_expiry.insert((keep, nonce.0.clone(), nonce.1.clone()));
        self.spent.insert(nonce, keep);
        Ok(a)
    }

    pub fn spent(&self) -> usize {
        self.spent.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> (SigningKey, SigningKey) {
        (SigningKey::from_bytes(&[1; 32]), SigningKey::from_bytes(&[2; 32]))
    }

    fn assertion(now: Millis) -> UserAssertion {
        UserAssertion {
            u: "anna".into(),
            g: vec!["staff".into()],
            i: NodeId::new("n-a"),
            c: ClusterId::new("c-1"),
            t: now.0 / 1000,
            e: (now.0 + ASSERTION_TTL_MS) / 1000,
            a: NodeId::new("n-b"),
            n: "nonce-1".into(),
            tm: now.0,
            r: None,
        }
    }

    fn check(
        v: &mut AssertionVerifier,
        now: Millis,
        h: &str,
        key: &SigningKey,
    ) -> Result<UserAssertion, AssertionError> {
        let k = key.verifying_key();
        v.verify(now, h, &NodeId::new("n-b"), &ClusterId::new("c-1"), |id| (id.as_str() == "n-a").then_some(k), |_| 0)
    }

    #[test]
    fn every_refusal_of_the_issue_and_nothing_more() {
        let (a_key, stranger) = keys();
        let t0 = Millis(1_000_000_000);
        let good = assertion(t0);
        let mut v = AssertionVerifier::default();
        let h = issue(&a_key, &good);
        assert_eq!(check(&mut v, t0, &h, &a_key).unwrap().u, "anna");
        assert_eq!(check(&mut v, t0, &h, &a_key), Err(AssertionError::Replayed));
        let with = |f: &dyn Fn(&mut UserAssertion)| {
            let mut x = assertion(t0);
            x.n = format!("n-{}", rand_tag(&x));
            f(&mut x);
            x
        };
        let mut v = AssertionVerifier::default();
        let cases: Vec<(UserAssertion, SigningKey, Millis, AssertionError)> = vec![
            (with(&|x| x.c = ClusterId::new("c-2")), a_key.clone(), t0, AssertionError::WrongCluster),
            (with(&|x| x.i = NodeId::new("n-gone")), a_key.clone(), t0, AssertionError::UnknownIssuer),
            (with(&|_| {}), stranger.clone(), t0, AssertionError::BadSignature),
            (with(&|x| x.a = NodeId::new("n-c")), a_key.clone(), t0, AssertionError::WrongAudience),
            (with(&|_| {}), a_key.clone(), t0.plus(ASSERTION_TTL_MS), AssertionError::Expired),
            (with(&|x| x.e += 3_600), a_key.clone(), t0.plus(ASSERTION_TTL_MS), AssertionError::Expired),
            (with(&|x| x.tm += 60_000), a_key.clone(), t0, AssertionError::Future),
        ];
        for (x, key, now, want) in cases {
            assert_eq!(check(&mut v, now, &issue(&key, &x), &a_key), Err(want.clone()), "{want:?}");
        }
        assert_eq!(v.spent(), 0, "no refused assertion spends a nonce");
        for bad in ["", "x", "a.b", &"a".repeat(ASSERTION_MAX_BYTES + 1)] {
            assert_eq!(check(&mut v, t0, bad, &a_key), Err(AssertionError::Malformed));
        }
        // A forged assertion with an honest nonce does not spend it.
        let honest = with(&|x| x.n = "shared".into());
        assert_eq!(check(&mut v, t0, &issue(&stranger, &honest), &a_key), Err(AssertionError::BadSignature));
        assert!(check(&mut v, t0, &issue(&a_key, &honest), &a_key).is_ok());
        // Spent nonces are forgotten once no clock offset could make their assertion valid.
        let at = t0.plus(ASSERTION_TTL_MS + ASSERTION_AHEAD_MS);
        let later = with(&|x| {
            x.n = "later".into();
            x.tm = at.0;
            x.t = x.tm / 1000;
            x.e = (x.tm + ASSERTION_TTL_MS) / 1000;
        });
        assert!(check(&mut v, at, &issue(&a_key, &later), &a_key).is_ok());
        assert_eq!(v.spent(), 1);
    }

    fn rand_tag(x: &UserAssertion) -> String {
        format!("{}-{}", x.u.len(), x.tm)
    }
}
