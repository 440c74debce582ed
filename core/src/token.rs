//! Join tokens (spec: cluster-runtime.md "Joining"; reference-facts.md "Join token").
//!
//! Wire form: `aroz-join:` + base64url (no padding) of `{"c":cluster,"n":name,"u":issuerURL,
//! "t":tokenId,"s":secret}` with an 8-byte hex token id and a 32-byte hex secret. The issuer keeps
//! only the SHA-256 of the secret, compares in constant time, counts uses and can revoke.
//! TTL 24 h by default, 1..=720 h allowed; only a node with an advertised URL can issue.

use crate::ids::{is_hex_of_len, is_uuid, ClusterId, TokenId};
use crate::rng::SeededRng;
use crate::time::{Millis, HOUR_MS};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use subtle::ConstantTimeEq;

pub const TOKEN_PREFIX: &str = "aroz-join:";
pub const TTL_DEFAULT_HOURS: u64 = 24;
pub const TTL_MIN_HOURS: u64 = 1;
pub const TTL_MAX_HOURS: u64 = 720;
/// Longest token string accepted by the parser (a real one is about 250 bytes).
pub const TOKEN_MAX_BYTES: usize = 4096;
/// Most tokens one issuer keeps (expired ones are purged first).
pub const TOKENS_MAX: usize = 1000;

/// The decoded contents of a join token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    #[serde(rename = "c")]
    pub cluster: ClusterId,
    #[serde(rename = "n")]
    pub name: String,
    #[serde(rename = "u")]
    pub issuer_url: String,
    #[serde(rename = "t")]
    pub token_id: TokenId,
    #[serde(rename = "s")]
    pub secret: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("a join token starts with \"aroz-join:\"")]
    MissingPrefix,
    #[error("join token is too long")]
    TooLong,
    #[error("join token is not valid base64url")]
    NotBase64,
    #[error("join token does not hold the expected JSON: {0}")]
    BadJson(String),
    #[error("join token field {0} is malformed")]
    BadField(&'static str),
    #[error("token lifetime must be between 1 and 720 hours")]
    BadTtl,
    #[error("this node has no advertised URL, so it cannot issue join tokens")]
    NoIssuerUrl,
    #[error("unknown join token")]
    Unknown,
    #[error("join token has expired")]
    Expired,
    #[error("join token was revoked")]
    Revoked,
    #[error("join token secret does not match")]
    BadSecret,
    #[error("too many join tokens; revoke some first")]
    TooMany,
}

impl JoinToken {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).expect("token serialises");
        format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    pub fn parse(s: &str) -> Result<JoinToken, TokenError> {
        let s = s.trim();
        if s.len() > TOKEN_MAX_BYTES {
            return Err(TokenError::TooLong);
        }
        let body = s.strip_prefix(TOKEN_PREFIX).ok_or(TokenError::MissingPrefix)?;
        let bytes = URL_SAFE_NO_PAD.decode(body).map_err(|_| TokenError::NotBase64)?;
        let t: JoinToken = serde_json::from_slice(&bytes).map_err(|e| TokenError::BadJson(e.to_string()))?;
        t.validate_shape()?;
        Ok(t)
    }

    fn validate_shape(&self) -> Result<(), TokenError> {
        if !is_uuid(self.cluster.as_str()) {
            return Err(TokenError::BadField("c (cluster id)"));
        }
        if !is_hex_of_len(self.token_id.as_str(), 8) {
            return Err(TokenError::BadField("t (token id)"));
        }
        if !is_hex_of_len(&self.secret, 32) {
            return Err(TokenError::BadField("s (secret)"));
        }
        if !valid_base_url(&self.issuer_url) {
            return Err(TokenError::BadField("u (issuer URL)"));
        }
        if self.name.len() > 256 {
            return Err(TokenError::BadField("n (cluster name)"));
        }
        Ok(())
    }
}

/// `http://` or `https://`, a host, no trailing slash, no whitespace.
pub fn valid_base_url(u: &str) -> bool {
    let rest = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://"));
    match rest {
        Some(r) => !r.is_empty() && !u.ends_with('/') && !u.chars().any(|c| c.is_whitespace()) && u.len() <= 2048,
        None => false,
    }
}

pub fn secret_hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// What the issuer stores for a token: never the secret itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRecord {
    pub id: TokenId,
    pub hash: String,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds.
    pub expires: u64,
    pub uses: u64,
    #[serde(default)]
    pub revoked: bool,
}

/// The issuer's join tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenBook {
    tokens: BTreeMap<TokenId, TokenRecord>,
}

impl TokenBook {
    pub fn from_records(records: impl IntoIterator<Item = TokenRecord>) -> TokenBook {
        TokenBook { tokens: records.into_iter().map(|r| (r.id.clone(), r)).collect() }
    }

    pub fn list(&self) -> impl Iterator<Item = &TokenRecord> {
        self.tokens.values()
    }

    pub fn get(&self, id: &TokenId) -> Option<&TokenRecord> {
        self.tokens.get(id)
    }

    /// Make a new token. Returns it and the record to persist.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &mut self,
        now: Millis,
        ttl_hours: Option<u64>,
        cluster: &ClusterId,
        cluster_name: &str,
        issuer_url: Option<&str>,
        rng: &mut SeededRng,
    ) -> Result<(JoinToken, TokenRecord), TokenError> {
        let ttl = ttl_hours.unwrap_or(TTL_DEFAULT_HOURS);
        if !(TTL_MIN_HOURS..=TTL_MAX_HOURS).contains(&ttl) {
            return Err(TokenError::BadTtl);
        }
        let url = issuer_url.map(|u| u.trim_end_matches('/')).filter(|u| valid_base_url(u));
        let url = url.ok_or(TokenError::NoIssuerUrl)?;
        self.purge_expired(now);
        if self.tokens.len() >= TOKENS_MAX {
            return Err(TokenError::TooMany);
        }
        let token = JoinToken {
            cluster: cluster.clone(),
            name: cluster_name.to_string(),
            issuer_url: url.to_string(),
            token_id: TokenId::new(rng.hex(8)),
            secret: rng.hex(32),
        };
        let record = TokenRecord {
            id: token.token_id.clone(),
            hash: secret_hash(&token.secret),
            created: now.as_secs(),
            expires: now.plus(ttl * HOUR_MS).as_secs(),
            uses: 0,
            revoked: false,
        };
        self.tokens.insert(record.id.clone(), record.clone());
        Ok((token, record))
    }

    /// Check a presented id and secret. Constant-time on the secret's hash.
    pub fn check(&self, now: Millis, id: &TokenId, secret: &str) -> Result<(), TokenError> {
        let rec = self.tokens.get(id).ok_or(TokenError::Unknown)?;
        let presented = secret_hash(secret);
        let matches: bool = presented.as_bytes().ct_eq(rec.hash.as_bytes()).into();
        if !matches {
            return Err(TokenError::BadSecret);
        }
        if rec.revoked {
            return Err(TokenError::Revoked);
        }
        if now.as_secs() >= rec.expires {
            return Err(TokenError::Expired);
        }
        Ok(())
    }

    /// Count one successful use; returns the updated record to persist.
    pub fn count_use(&mut self, id: &TokenId) -> Option<TokenRecord> {
        let rec = self.tokens.get_mut(id)?;
        rec.uses += 1;
        Some(rec.clone())
    }

    /// Revoke; the record stays (listed as revoked) until it expires.
    pub fn revoke(&mut self, id: &TokenId) -> Result<TokenRecord, TokenError> {
        let rec = self.tokens.get_mut(id).ok_or(TokenError::Unknown)?;
        rec.revoked = true;
        Ok(rec.clone())
    }

    /// Drop expired tokens; returns their ids.
    pub fn purge_expired(&mut self, now: Millis) -> Vec<TokenId> {
        let gone: Vec<TokenId> =
            self.tokens.values().filter(|r| now.as_secs() >= r.expires).map(|r| r.id.clone()).collect();
        for id in &gone {
            self.tokens.remove(id);
        }
        gone
    }

    pub fn clear(&mut self) {
        self.tokens.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C: &str = "22222222-2222-4222-8222-222222222222";

    fn book_with_token(now: Millis, ttl: Option<u64>) -> (TokenBook, JoinToken) {
        let mut book = TokenBook::default();
        let (t, _) = book
            .create(now, ttl, &ClusterId::new(C), "home", Some("http://10.0.0.1:7000/"), &mut SeededRng::new(1))
            .unwrap();
        (book, t)
    }

    #[test]
    fn created_token_round_trips_and_checks() {
        let now = Millis(1_000_000);
        let (mut book, t) = book_with_token(now, None);
        assert_eq!(t.issuer_url, "http://10.0.0.1:7000");
        let parsed = JoinToken::parse(&t.encode()).unwrap();
        assert_eq!(parsed, t);
        assert_eq!(book.check(now, &t.token_id, &t.secret), Ok(()));
        assert_eq!(book.count_use(&t.token_id).unwrap().uses, 1);
        let rec = book.get(&t.token_id).unwrap();
        assert_eq!(rec.expires - rec.created, 24 * 3600);
        assert_ne!(rec.hash, t.secret, "the secret itself is never stored");
    }

    #[test]
    fn ttl_is_bounded_and_issuer_needs_a_url() {
        let mut book = TokenBook::default();
        let c = ClusterId::new(C);
        let mut rng = SeededRng::new(1);
        let url = Some("http://h:1");
        assert_eq!(book.create(Millis(0), Some(0), &c, "", url, &mut rng).unwrap_err(), TokenError::BadTtl);
        assert_eq!(book.create(Millis(0), Some(721), &c, "", url, &mut rng).unwrap_err(), TokenError::BadTtl);
        assert!(book.create(Millis(0), Some(720), &c, "", url, &mut rng).is_ok());
        assert!(book.create(Millis(0), Some(1), &c, "", url, &mut rng).is_ok());
        assert_eq!(book.create(Millis(0), None, &c, "", None, &mut rng).unwrap_err(), TokenError::NoIssuerUrl);
    }

    #[test]
    fn expired_revoked_wrong_secret_and_unknown_are_refused() {
        let now = Millis(1_000_000);
        let (mut book, t) = book_with_token(now, Some(1));
        assert_eq!(book.check(now.plus(3_600_000), &t.token_id, &t.secret), Err(TokenError::Expired));
        let mut wrong = t.secret.clone();
        wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
        assert_eq!(book.check(now, &t.token_id, &wrong), Err(TokenError::BadSecret));
        assert_eq!(book.check(now, &TokenId::new("0000000000000000"), &t.secret), Err(TokenError::Unknown));
        book.revoke(&t.token_id).unwrap();
        assert_eq!(book.check(now, &t.token_id, &t.secret), Err(TokenError::Revoked));
        assert_eq!(book.purge_expired(now.plus(3_600_000)), vec![t.token_id.clone()]);
    }

    #[test]
    fn malformed_tokens_say_what_is_wrong() {
        assert_eq!(JoinToken::parse("hello"), Err(TokenError::MissingPrefix));
        assert_eq!(JoinToken::parse("aroz-join:***"), Err(TokenError::NotBase64));
        assert!(matches!(JoinToken::parse("aroz-join:e30"), Err(TokenError::BadJson(_))));
        let (_, t) = book_with_token(Millis(0), None);
        let mut bad = t.clone();
        bad.secret = "abc".into();
        assert_eq!(JoinToken::parse(&bad.encode()), Err(TokenError::BadField("s (secret)")));
        let mut bad = t.clone();
        bad.issuer_url = "ftp://x".into();
        assert_eq!(JoinToken::parse(&bad.encode()), Err(TokenError::BadField("u (issuer URL)")));
        let mut bad = t;
        bad.cluster = ClusterId::new("nope");
        assert_eq!(JoinToken::parse(&bad.encode()), Err(TokenError::BadField("c (cluster id)")));
        assert_eq!(JoinToken::parse(&format!("aroz-join:{}", "A".repeat(5000))), Err(TokenError::TooLong));
    }

    proptest! {
        #[test]
        fn any_issued_token_round_trips(seed in any::<u64>(), name in "[ -~]{0,40}", port in 1u16..65535, ttl in 1u64..=720) {
            let mut book = TokenBook::default();
            let url = format!("http://127.0.0.1:{port}");
            let (t, _) = book.create(Millis(5_000), Some(ttl), &ClusterId::new(C), &name, Some(&url), &mut SeededRng::new(seed)).unwrap();
            let s = t.encode();
            prop_assert!(s.starts_with(TOKEN_PREFIX));
            prop_assert_eq!(JoinToken::parse(&s).unwrap(), t);
        }

        #[test]
        fn arbitrary_strings_never_panic_the_parser(s in ".{0,300}") {
            let _ = JoinToken::parse(&s);
            let _ = JoinToken::parse(&format!("aroz-join:{s}"));
        }

        #[test]
        fn arbitrary_base64_payloads_are_rejected_or_well_formed(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let s = format!("aroz-join:{}", URL_SAFE_NO_PAD.encode(&bytes));
            if let Ok(t) = JoinToken::parse(&s) {
                prop_assert!(is_hex_of_len(&t.secret, 32));
            }
        }
    }
}
