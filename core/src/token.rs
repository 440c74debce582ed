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
    /// The issuer's certificate pin when it serves HTTPS ([`valid_pin`]): the
    /// joiner pins the issuer with it, so the first contact needs no CA either (issue 15).
    #[serde(rename = "p", default, skip_serializing_if = "String::is_empty")]
    pub issuer_pin: String,
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
    #[error("join token has been used as many times as it allows")]
    UsedUp,
    #[error("a token's uses are between 1 and 1000")]
    BadUses,
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
        if !self.issuer_pin.is_empty() && !valid_pin(&self.issuer_pin) {
            return Err(TokenError::BadField("p (issuer certificate pin)"));
        }
        if self.issuer_url.starts_with("https://") && self.issuer_pin.is_empty() {
            return Err(TokenError::BadField("p (an https:// issuer's certificate pin)"));
        }
        if url_pin_error(&self.issuer_url, &self.issuer_pin).is_some() {
            return Err(TokenError::BadField("p (a pin beside an http:// issuer)"));
        }
        if self.name.len() > 256 {
            return Err(TokenError::BadField("n (cluster name)"));
        }
        Ok(())
    }
}

/// A certificate pin (issue 15): the SHA-256 of its DER bytes as 64 lowercase hex digits.
pub fn valid_pin(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Why a node URL and its certificate pin do not go together (issue 15): an `https://` URL
/// needs the pin peers hold it to, and an `http://` URL beside a pin would have peers talk in
/// clear to a node that serves TLS, never checking the pin (a downgrade). An empty URL (a node
/// behind NAT) goes with either.
pub fn url_pin_error(url: &str, pin: &str) -> Option<&'static str> {
    match (url.starts_with("https://"), url.starts_with("http://"), pin.is_empty()) {
        (true, _, true) => Some("an https:// URL needs the certificate's pin: the node must serve TLS (--tls)"),
        (_, true, false) => Some("this node serves TLS: its URL is https://, not http://"),
        _ => None,
    }
}

/// A node's base URL (an advertised URL, a join token's issuer): exactly
/// `http[s]://host[:port]` — no user, path, query or fragment, so a URL can never point a
/// request at another endpoint than the one shoal appends (issue 11) — with a host that is a
/// DNS name, an IPv4 address or a bracketed IPv6 address, and never a link-local address (the
/// cloud metadata service lives at 169.254.169.254) or an unspecified one.
pub fn valid_base_url(u: &str) -> bool {
    base_url_error(u).is_none()
}

/// Why `u` is not a valid base URL (see [`valid_base_url`]).
pub fn base_url_error(u: &str) -> Option<&'static str> {
    let Some(authority) = u.strip_prefix("http://").or_else(|| u.strip_prefix("https://")) else {
        return Some("a URL starts with http:// or https://");
    };
    if u.len() > 2048 {
        return Some("a URL is at most 2048 bytes");
    }
    if authority.is_empty() {
        return Some("a URL names a host");
    }
    if authority.contains(['/', '?', '#', '@', '\\']) || authority.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Some("a node URL is scheme://host[:port], with no user, path, query or fragment");
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let Some((h, after)) = rest.split_once(']') else { return Some("an IPv6 host is written [addr]") };
        let Ok(ip) = h.parse::<std::net::Ipv6Addr>() else { return Some("not an IPv6 address in brackets") };
        if !ip_allowed(std::net::IpAddr::V6(ip)) {
            return Some("a link-local or unspecified address is not a node URL");
        }
        match after {
            "" => (h, None),
            p => match p.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return Some("junk after the IPv6 address"),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if let Some(p) = port {
        if !p.parse::<u16>().is_ok_and(|p| p > 0) || p.starts_with('+') {
            return Some("a port is a number from 1 to 65535");
        }
    }
    if authority.starts_with('[') {
        return None;
    }
    if host.is_empty() || host.len() > 253 {
        return Some("a host name is 1 to 253 characters");
    }
    if let Ok(ip) = host.parse::<std::net::Ipv4Addr>() {
        return (!ip_allowed(std::net::IpAddr::V4(ip)))
            .then_some("a link-local or unspecified address is not a node URL");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !host.trim_end_matches('.').split('.').all(label_ok) {
        return Some("a host is a DNS name, an IPv4 address or [an IPv6 address]");
    }
    None
}

/// Whether shoal may send a request to `ip`: anything but link-local (169.254.0.0/16,
/// fe80::/10, also IPv4-mapped) and unspecified addresses. The transport checks every address
/// a name resolves to with this too, so a DNS name cannot lead there either.
pub fn ip_allowed(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => !v4.is_link_local() && !v4.is_unspecified() && !v4.is_broadcast(),
        std::net::IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return ip_allowed(std::net::IpAddr::V4(v4));
            }
            (v6.segments()[0] & 0xffc0) != 0xfe80 && !v6.is_unspecified()
        }
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
    /// How many joins it allows (`None`: any number until it expires).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u64>,
}

/// Most uses a token can be issued with.
pub const USES_MAX: u64 = 1_000;

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
        max_uses: Option<u64>,
        cluster: &ClusterId,
        cluster_name: &str,
        issuer_url: Option<&str>,
        rng: &mut SeededRng,
    ) -> Result<(JoinToken, TokenRecord), TokenError> {
        let ttl = ttl_hours.unwrap_or(TTL_DEFAULT_HOURS);
        if !(TTL_MIN_HOURS..=TTL_MAX_HOURS).contains(&ttl) {
            return Err(TokenError::BadTtl);
        }
        if max_uses.is_some_and(|m| !(1..=USES_MAX).contains(&m)) {
            return Err(TokenError::BadUses);
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
            issuer_pin: String::new(),
        };
        let record = TokenRecord {
            id: token.token_id.clone(),
            hash: secret_hash(&token.secret),
            created: now.as_secs(),
            expires: now.plus(ttl * HOUR_MS).as_secs(),
            uses: 0,
            revoked: false,
            max_uses,
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
        if rec.max_uses.is_some_and(|m| rec.uses >= m) {
            return Err(TokenError::UsedUp);
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
            .create(now, ttl, None, &ClusterId::new(C), "home", Some("http://10.0.0.1:7000/"), &mut SeededRng::new(1))
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
        assert_eq!(book.create(Millis(0), Some(0), None, &c, "", url, &mut rng).unwrap_err(), TokenError::BadTtl);
        assert_eq!(book.create(Millis(0), Some(721), None, &c, "", url, &mut rng).unwrap_err(), TokenError::BadTtl);
        assert!(book.create(Millis(0), Some(720), None, &c, "", url, &mut rng).is_ok());
        assert!(book.create(Millis(0), Some(1), None, &c, "", url, &mut rng).is_ok());
        assert_eq!(book.create(Millis(0), None, None, &c, "", None, &mut rng).unwrap_err(), TokenError::NoIssuerUrl);
    }

    #[test]
    fn a_token_with_a_use_cap_is_refused_once_used_up() {
        let (c, url, mut rng) = (ClusterId::new(C), Some("http://10.0.0.1:7000"), SeededRng::new(3));
        let mut book = TokenBook::default();
        assert_eq!(book.create(Millis(0), None, Some(0), &c, "", url, &mut rng).unwrap_err(), TokenError::BadUses);
        assert_eq!(book.create(Millis(0), None, Some(1001), &c, "", url, &mut rng).unwrap_err(), TokenError::BadUses);
        let (t, _) = book.create(Millis(0), None, Some(2), &c, "", url, &mut rng).unwrap();
        for _ in 0..2 {
            assert_eq!(book.check(Millis(1_000), &t.token_id, &t.secret), Ok(()));
            book.count_use(&t.token_id);
        }
        assert_eq!(book.check(Millis(1_000), &t.token_id, &t.secret), Err(TokenError::UsedUp));
    }

    /// Issue 11: an issuer or advertised URL with a path or query pointed the joiner's POST at
    /// another endpoint; a link-local address reached the cloud metadata service.
    #[test]
    fn node_urls_are_scheme_host_and_port_only_and_never_link_local() {
        for good in [
            "http://10.0.0.1:7000",
            "https://a.lan",
            "http://node-1.example.org:443",
            "http://127.0.0.1:7300",
            "http://[::1]:7300",
            "http://[fd00::5]",
            "http://host.",
        ] {
            assert_eq!(base_url_error(good), None, "{good}");
        }
        for bad in [
            "http://10.0.0.1:7000/evil",
            "http://10.0.0.1:7000?x=1",
            "http://10.0.0.1:7000#f",
            "http://user@10.0.0.1",
            "http://10.0.0.1:7000/",
            "http://169.254.169.254",
            "http://169.254.1.1:80",
            "http://[fe80::1]:7000",
            "http://[::ffff:169.254.169.254]",
            "http://0.0.0.0:7000",
            "http://[::]:7000",
            "http://h:0",
            "http://h:65536",
            "http://h:+80",
            "http://bad_host-.lan",
            "http://a b",
            "ftp://h",
            "http://",
            "http://[::1",
            "http://[::1]x",
        ] {
            assert!(base_url_error(bad).is_some(), "{bad}");
        }
        // A token naming such an issuer does not parse.
        let t = JoinToken {
            cluster: ClusterId::new(C),
            name: "x".into(),
            issuer_url: "http://10.0.0.1:7000/cluster/acn/heartbeat?x=".into(),
            token_id: TokenId::new("0011223344556677"),
            secret: "00".repeat(32),
            issuer_pin: String::new(),
        };
        assert_eq!(JoinToken::parse(&t.encode()).unwrap_err(), TokenError::BadField("u (issuer URL)"));
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
        // An https:// issuer is pinned by the token: a pin that is no SHA-256, or none, is refused.
        let mut bad = t.clone();
        bad.issuer_pin = "AB".repeat(32);
        assert_eq!(JoinToken::parse(&bad.encode()), Err(TokenError::BadField("p (issuer certificate pin)")));
        let mut bad = t.clone();
        bad.issuer_url = "https://10.0.0.1:7000".into();
        assert_eq!(
            JoinToken::parse(&bad.encode()),
            Err(TokenError::BadField("p (an https:// issuer's certificate pin)"))
        );
        bad.issuer_pin = "ab".repeat(32);
        assert_eq!(JoinToken::parse(&bad.encode()).unwrap(), bad);
        // A pin beside an http:// issuer would have the joiner talk in clear: refused.
        bad.issuer_url = "http://10.0.0.1:7000".into();
        assert_eq!(JoinToken::parse(&bad.encode()), Err(TokenError::BadField("p (a pin beside an http:// issuer)")));
        assert!(url_pin_error("", "ab").is_none() && url_pin_error("http://h", "").is_none());
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
            let (t, _) = book.create(Millis(5_000), Some(ttl), None, &ClusterId::new(C), &name, Some(&url), &mut SeededRng::new(seed)).unwrap();
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
