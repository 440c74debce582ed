//! Joining a cluster with a token (spec: "Membership", "Join tokens"): the core prepares the
//! request and judges the answer; this module only carries it to the token's issuer.

use crate::env::Env;
use crate::node::handle::{cluster_enabled, Shared};
use shoal_core::node::{ApiError, NodeStatus};
use std::sync::Arc;

/// Join the cluster a token names: ask its issuer, then adopt the answer.
pub async fn join_with_token<E: Env>(s: &Arc<Shared<E>>, token: &str) -> Result<NodeStatus, ApiError> {
    cluster_enabled(s)?;
    let plan = s.with_node(|n, now| n.prepare_join(now, token))?;
    let (base, target) = match plan.url.find("/cluster/acn/") {
        Some(i) => (plan.url[..i].to_string(), plan.url[i..].to_string()),
        None => return Err(ApiError::invalid("bad_token", "token issuer URL is malformed")),
    };
    match s.client.request_pinned(&base, &plan.pin, "POST", &target, &[], plan.body, 20_000).await {
        Ok(resp) => {
            let answer = crate::wire::error::peer_answer(resp.status, resp.body.to_vec());
            s.with_node(|n, now| n.finish_join(now, &answer))
        }
        Err(e) => {
            s.with_node(|n, _| n.abort_join());
            Err(ApiError::peer_failed("issuer_unreachable", format!("could not reach the token's issuer: {e}")))
        }
    }
}
