//! Test support (feature `testing`): helpers that the integration tests of this crate and of
//! the crates built on it share. Loopback addresses only.

use std::net::Ipv4Addr;

use crate::{RdsStack, StackConfig};

/// The smaller loopback address (it connects: facts "RDS over TCP").
pub const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
/// The larger loopback address.
pub const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Two stacks on [`A`] and [`B`] sharing one free TCP port number, with up to `paths` paths
/// per connection. A port taken between probing and binding is retried, 20 times at most;
/// `None` when every try failed.
pub async fn loopback_pair(paths: u16) -> Option<(RdsStack, RdsStack)> {
    for _ in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0);
        let mut ca = StackConfig::new(A);
        ca.tcp_port = port;
        ca.max_paths = paths;
        let mut cb = StackConfig::new(B);
        cb.tcp_port = port;
        cb.max_paths = paths;
        let Ok(a) = RdsStack::start(ca).await else {
            continue;
        };
        match RdsStack::start(cb).await {
            Ok(b) => return Some((a, b)),
            Err(_) => a.shutdown(),
        }
    }
    None
}
