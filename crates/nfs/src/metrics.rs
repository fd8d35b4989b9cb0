//! A Prometheus endpoint (`--metrics ADDR`): the counters of [`crate::status::Status`] in the
//! Prometheus text format (version 0.0.4), encoded by the `prometheus-client` crate from a
//! snapshot taken at each scrape.
//!
//! Metrics carry no client addresses (a label per client would grow without bound); the
//! per-client view is `oxrdma nfs status`'s. The HTTP side is the least a scraper needs:
//! `GET /metrics` (or `/`) answers 200 with the text, anything else 404, one request per
//! connection; the request head is read up to 8 KiB within 5 s, and at most 16 scrapes are
//! answered at once.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::status::StatusSource;

const MAX_REQUEST: usize = 8 << 10;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const MAX_SCRAPES: usize = 16;

/// Encodes a fresh [`crate::status::Status`] at each scrape.
#[derive(Debug)]
struct StatusCollector(Arc<StatusSource>);

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, u64)],
) -> Result<(), std::fmt::Error> {
    let proto = ConstCounter::new(0u64);
    let mut m = enc.encode_descriptor(name, help, None, proto.metric_type())?;
    for (labels, v) in rows {
        let fam = m.encode_family(labels)?;
        ConstCounter::new(*v).encode(fam)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, i64)],
) -> Result<(), std::fmt::Error> {
    let proto = ConstGauge::new(0i64);
    let mut m = enc.encode_descriptor(name, help, None, proto.metric_type())?;
    for (labels, v) in rows {
        let fam = m.encode_family(labels)?;
        ConstGauge::new(*v).encode(fam)?;
    }
    Ok(())
}

fn i(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl Collector for StatusCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let s = self.0.status();
        let t = |name: &str| vec![("transport", name.to_string())];
        counter(
            &mut enc,
            "oxrdma_nfs_calls",
            "RPC calls of NFS and MOUNT, per transport, program and procedure.",
            &s.procedures
                .iter()
                .map(|p| {
                    (
                        vec![
                            ("transport", p.transport.to_string()),
                            ("program", p.program.to_string()),
                            ("procedure", p.procedure.to_string()),
                        ],
                        p.calls,
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        counter(
            &mut enc,
            "oxrdma_nfs4_operations",
            "NFSv4 operations inside COMPOUND calls, per transport and operation.",
            &s.nfs4_operations
                .iter()
                .map(|p| {
                    (
                        vec![
                            ("transport", p.transport.to_string()),
                            ("operation", p.procedure.to_string()),
                        ],
                        p.calls,
                    )
                })
                .collect::<Vec<_>>(),
        )?;
        counter(
            &mut enc,
            "oxrdma_nfs_received_bytes",
            "Argument bytes of the calls received (chunk payloads included).",
            &s.totals
                .iter()
                .map(|x| (t(x.transport), x.bytes_in))
                .collect::<Vec<_>>(),
        )?;
        counter(
            &mut enc,
            "oxrdma_nfs_sent_bytes",
            "Result bytes of the replies sent (chunk payloads included).",
            &s.totals
                .iter()
                .map(|x| (t(x.transport), x.bytes_out))
                .collect::<Vec<_>>(),
        )?;
        gauge(
            &mut enc,
            "oxrdma_nfs_calls_executing",
            "Calls executing now, per transport.",
            &s.totals
                .iter()
                .map(|x| (t(x.transport), i(x.executing)))
                .collect::<Vec<_>>(),
        )?;
        gauge(
            &mut enc,
            "oxrdma_nfs_connected_clients",
            "Client connections open now, per transport.",
            &[
                (t("tcp"), i(s.connected("tcp"))),
                (t("rdma"), i(s.connected("rdma"))),
            ],
        )?;
        gauge(
            &mut enc,
            "oxrdma_nfs_rdma_credits_in_use",
            "RPC-over-RDMA calls executing now, each holding one credit of its connection.",
            &[(vec![], i(s.rdma_credits_in_use))],
        )?;
        if let Some(limit) = s.rdma_credit_limit {
            gauge(
                &mut enc,
                "oxrdma_nfs_rdma_credit_limit",
                "The credits one RPC-over-RDMA connection may be granted.",
                &[(vec![], i(limit))],
            )?;
        }
        gauge(
            &mut enc,
            "oxrdma_nfs_exports",
            "Exports served.",
            &[(vec![], i(s.exports.len()))],
        )?;
        gauge(
            &mut enc,
            "oxrdma_nfs_memory_used_bytes",
            "Memory held for clients from the server's budget.",
            &[(vec![], i(s.memory_used))],
        )?;
        gauge(
            &mut enc,
            "oxrdma_nfs_memory_limit_bytes",
            "The server's memory budget.",
            &[(vec![], i(s.memory_limit))],
        )?;
        gauge(
            &mut enc,
            "oxrdma_nfs_start_time_seconds",
            "When the server started, in seconds since the Unix epoch.",
            &[(
                vec![],
                i(s.started
                    .duration_since(std::time::SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())),
            )],
        )?;
        Ok(())
    }
}

/// The Prometheus text of `source` now.
pub fn render(source: &Arc<StatusSource>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StatusCollector(source.clone())));
    let mut out = String::new();
    // Writing to a String cannot fail; an encoder error leaves what was written.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
    out
}

/// A metrics endpoint being served; stops when dropped.
#[derive(Debug)]
pub struct MetricsEndpoint {
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MetricsEndpoint {
    /// Serve the metrics of `source` on `addr`.
    pub async fn bind(addr: SocketAddr, source: Arc<StatusSource>) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_SCRAPES));
        let task = tokio::spawn(async move {
            loop {
                let Ok((s, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    continue; // too many scrapes at once: close this one
                };
                let src = source.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(s, &src)).await;
                    drop(permit);
                });
            }
        });
        Ok(MetricsEndpoint { local, task })
    }

    /// Where the endpoint listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

/// The path of an HTTP request head, once the head is complete.
fn request_path(head: &[u8]) -> Option<&str> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end();
    let mut words = line.split(' ');
    let method = words.next()?;
    let path = words.next()?;
    (method == "GET" || method == "HEAD").then_some(path)
}

async fn answer(mut s: TcpStream, source: &Arc<StatusSource>) -> io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= MAX_REQUEST {
            return Ok(());
        }
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n.min(MAX_REQUEST - head.len())]);
    }
    let (status, ctype, body) = match request_path(&head).map(|p| p.split('?').next()) {
        Some(Some("/metrics" | "/")) => (
            "200 OK",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            render(source),
        ),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
        ),
    };
    let head_only = head.starts_with(b"HEAD ");
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(&body);
    }
    s.write_all(out.as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::request_path;

    #[test]
    fn request_lines_give_their_path() {
        assert_eq!(
            request_path(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/metrics")
        );
        assert_eq!(request_path(b"HEAD / HTTP/1.0\r\n\r\n"), Some("/"));
        assert_eq!(request_path(b"POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_path(b"\xff\xfe\r\n\r\n"), None);
        assert_eq!(request_path(b""), None);
    }
}
