//! Talks to a kernel rds_tcp peer (used with the vmlab QEMU guest): sends COUNT datagrams from
//! RDS port 4000 to PEER:4001, then waits for one datagram back on port 4000.
//!
//! `rds_kernel_peer PEER_IP VIA_ADDR COUNT [LISTEN_PORT]`, e.g.
//! `rds_kernel_peer 10.0.2.15 127.0.0.1:16400 100 16385` where 127.0.0.1:16400 is forwarded to
//! the guest's 16385. Our node is 10.0.2.2 (what the guest sees; sockets on 127.0.0.1): the
//! smaller address, so we dial.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rds::{RdsStack, StackConfig};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 3 {
        return Err("usage: rds_kernel_peer PEER_IP VIA_ADDR COUNT [LISTEN_PORT]".into());
    }
    let peer: Ipv4Addr = a[0].parse()?;
    let via: SocketAddrV4 = a[1].parse()?;
    let count: u32 = a[2].parse()?;
    // The guest sees the host as 10.0.2.2 (smaller than 10.0.2.15: we connect); our sockets
    // live on 127.0.0.1.
    let mut cfg = StackConfig::new(Ipv4Addr::new(10, 0, 2, 2));
    cfg.bind_ip = Some(Ipv4Addr::LOCALHOST);
    cfg.tcp_port = a.get(3).map(|p| p.parse()).transpose()?.unwrap_or(16385);
    cfg.peer_addrs.insert(peer, via);
    let stack = RdsStack::start(cfg).await?;
    let sock = stack.bind(4000)?;
    let t0 = Instant::now();
    for i in 0..count {
        let msg = Bytes::from(format!("oxrdma-{i}"));
        tokio::time::timeout(
            Duration::from_secs(240),
            sock.send_to(SocketAddrV4::new(peer, 4001), msg),
        )
        .await??;
        if i == 0 {
            println!("first send accepted after {:?}", t0.elapsed());
        }
    }
    println!("sent {count}");
    let got = sock.recv_timeout(Duration::from_secs(300)).await?;
    match got {
        Some((p, src)) => println!("received {:?} from {src}", String::from_utf8_lossy(&p)),
        None => println!("received nothing"),
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !stack.idle_to(peer) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("all acknowledged by TCP: {}", stack.idle_to(peer));
    println!("{:#?}", stack.info());
    Ok(())
}
