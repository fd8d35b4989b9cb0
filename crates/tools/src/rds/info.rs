//! The short exchange behind `rds info`: RDS state is per process, so two in-process nodes
//! exchange a few datagrams (each answered) before their state is shown.

use std::net::SocketAddrV4;
use std::time::Duration;

use bytes::Bytes;
use rds::{RdsError, RdsStack};

/// Why the exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The RDS stack failed.
    #[error(transparent)]
    Rds(#[from] RdsError),
    /// A send failed.
    #[error(transparent)]
    Send(#[from] rds::SendError),
    /// No datagram within 10 s.
    #[error("no datagram within 10 s")]
    NoDatagram,
    /// No reply within 10 s.
    #[error("no reply within 10 s")]
    NoReply,
}

/// Sends `count` datagrams from a socket on `a` to one on `b`, each answered by `b`; returns the
/// two sockets' addresses.
pub async fn exchange(
    a: &RdsStack,
    b: &RdsStack,
    count: u32,
) -> Result<(SocketAddrV4, SocketAddrV4), ExchangeError> {
    let xa = a.bind(0)?;
    let xb = b.bind(0)?;
    let (da, db) = (xa.local_addr(), xb.local_addr());
    for i in 0..count {
        let m = Bytes::from(i.to_be_bytes().to_vec());
        xa.send_to(db, m.clone()).await?;
        let (_, src) = tokio::time::timeout(Duration::from_secs(10), xb.recv_from())
            .await
            .map_err(|_| ExchangeError::NoDatagram)??;
        xb.send_to(src, m).await?;
        tokio::time::timeout(Duration::from_secs(10), xa.recv_from())
            .await
            .map_err(|_| ExchangeError::NoReply)??;
    }
    Ok((da, db))
}
