//! The HTTP endpoints: `/metrics` in OpenMetrics or the classic text
//! format, `/healthz`, `/readyz`, and the readiness of each Liqo v1
//! gateway served.

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
};

use axum::{
    Router,
    extract::{Path, State},
    http::{
        HeaderMap, StatusCode,
        header::{ACCEPT, CONTENT_TYPE},
    },
    response::IntoResponse,
    routing::get,
};
use tracing::warn;

use super::Metrics;
use crate::model::object::ObjectKey;

/// The port of the metrics and health endpoints unless told otherwise.
pub const DEFAULT_PORT: u16 = 9873;

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until the
/// process exits. Binding happens before returning, so a busy port fails here.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/readyz/gateways/{namespace}/{name}", get(gateway_ready))
        .with_state(metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            warn!(error = %e, "metrics server stopped");
        }
    });
    Ok(())
}

/// Serves OpenMetrics to a scraper that asks for it (Prometheus does), and
/// the classic text format to anything else (`curl`, `promtool`). Reading
/// the kernel's counters takes system calls: done on a blocking thread, so
/// that scrapes, however many, never hold up `/healthz`.
async fn scrape(State(metrics): State<Arc<Metrics>>, headers: HeaderMap) -> impl IntoResponse {
    let Ok(Ok(body)) = tokio::task::spawn_blocking(move || metrics.text()).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let openmetrics = headers
        .get(ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains(OPENMETRICS));
    let (content_type, body) = match openmetrics {
        true => (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        ),
        false => (
            "text/plain; version=0.0.4; charset=utf-8",
            classic_text(&body),
        ),
    };
    (StatusCode::OK, [(CONTENT_TYPE, content_type)], body).into_response()
}

const OPENMETRICS: &str = "application/openmetrics-text";

/// The classic Prometheus text format of an OpenMetrics exposition: a
/// counter's HELP and TYPE lines name it with its `_total` suffix, as its
/// samples do, and the `# EOF` and `# UNIT` lines go.
fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let described = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(described.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Healthy unless a datapath thread of the tunnel is down: Kubernetes then
/// restarts the agent if the thread does not come back.
async fn health(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    match metrics.tunnels.as_ref().is_none_or(|t| t.healthy()) {
        true => (StatusCode::OK, "ok"),
        false => (StatusCode::SERVICE_UNAVAILABLE, "a tunnel thread is down"),
    }
}

async fn ready(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Ready while this agent is the active gateway and serves the Liqo v1
/// gateway `namespace/name`: the readiness of its `gw-<name>` Deployment.
async fn gateway_ready(
    State(metrics): State<Arc<Metrics>>,
    Path((namespace, name)): Path<(String, String)>,
) -> impl IntoResponse {
    let key = ObjectKey { namespace, name };
    if metrics.serves_gateway(&key) {
        (StatusCode::OK, "serving")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not serving")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_with_their_samples_suffix() {
        let openmetrics = "# HELP isthmus_peers Peers.\n# TYPE isthmus_peers gauge\nisthmus_peers 2\n\
            # HELP isthmus_map_full Full passes.\n# TYPE isthmus_map_full counter\n# UNIT isthmus_map_full passes\n\
            isthmus_map_full_total 0\n# EOF\n";
        assert_eq!(
            classic_text(openmetrics),
            "# HELP isthmus_peers Peers.\n# TYPE isthmus_peers gauge\nisthmus_peers 2\n\
             # HELP isthmus_map_full_total Full passes.\n# TYPE isthmus_map_full_total counter\n\
             isthmus_map_full_total 0\n"
        );
    }
}
