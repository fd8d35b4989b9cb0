//! The raw-TCP ceiling on the same path as the RDMA measurements: in one process, or against
//! the sink of a [`serve`](super::serve) process.

use std::net::SocketAddr;
use std::time::Instant;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use verbs::VerbsError;

use super::mbs;

/// Read a u64 byte count, then that many bytes, then answer one byte.
pub(crate) async fn tcp_sink(mut s: tokio::net::TcpStream) -> std::io::Result<()> {
    tune(&s);
    let total = s.read_u64().await?;
    let mut buf = vec![0u8; 4 << 20];
    let mut got = 0u64;
    while got < total {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        got += n as u64;
    }
    s.write_all(&[1]).await
}

/// Raw TCP bandwidth on 127.0.0.1 (TCP_NODELAY, 4 MiB socket buffers, like the soft-iWARP
/// provider): `iterations` writes of `size` bytes, timed until the reader has them all.
pub async fn tcp_ceiling(size: usize, iterations: usize) -> Result<f64, VerbsError> {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = l.local_addr()?;
    let total = size * iterations;
    let reader = tokio::spawn(async move {
        let (mut s, _) = l.accept().await?;
        tune(&s);
        // Read into a message-sized buffer, as the soft-iWARP side reads into the region.
        let mut buf = vec![0u8; size.clamp(64 * 1024, 4 << 20)];
        let mut got = 0;
        while got < total {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>(Instant::now())
    });
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    tune(&s);
    let data = vec![0x5au8; size];
    let start = Instant::now();
    for _ in 0..iterations {
        s.write_all(&data).await?;
    }
    let end = reader.await.map_err(|_| VerbsError::Disconnected)??;
    Ok(mbs(total as u64, end - start))
}

/// Raw TCP bandwidth to a [`serve`](super::serve) process's sink: the byte count, `iterations` writes of
/// `size` bytes, timed until the sink's one-byte answer arrives.
pub async fn tcp_ceiling_to(
    sink: SocketAddr,
    size: usize,
    iterations: usize,
) -> Result<f64, VerbsError> {
    let mut s = tokio::net::TcpStream::connect(sink).await?;
    tune(&s);
    let total = (size * iterations) as u64;
    let data = vec![0x5au8; size];
    let start = Instant::now();
    s.write_u64(total).await?;
    for _ in 0..iterations {
        s.write_all(&data).await?;
    }
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await?;
    Ok(mbs(total, start.elapsed()))
}

pub(crate) fn tune(s: &tokio::net::TcpStream) {
    let _ = s.set_nodelay(true);
    let r = socket2::SockRef::from(s);
    let _ = r.set_send_buffer_size(4 << 20);
    let _ = r.set_recv_buffer_size(4 << 20);
}
