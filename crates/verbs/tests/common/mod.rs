#![allow(dead_code)]
//! Shared test scaffolding: two endpoints on either provider.

use std::net::SocketAddr;

use verbs::{
    CompletionQueue, ConnParams, Connection, Device, LoopbackFabric, ProtectionDomain, QueuePair,
    VerbsError,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    Mem,
}

pub const KINDS: [Kind; 2] = [Kind::Tcp, Kind::Mem];

pub struct Side {
    pub dev: Device,
    pub pd: ProtectionDomain,
    pub scq: CompletionQueue,
    pub rcq: CompletionQueue,
    pub qp: QueuePair,
}

impl Side {
    pub fn new(dev: Device) -> Self {
        let pd = dev.alloc_pd();
        let scq = dev.create_cq();
        let rcq = dev.create_cq();
        let qp = dev.create_qp(&pd, &scq, &rcq);
        Self {
            dev,
            pd,
            scq,
            rcq,
            qp,
        }
    }
}

pub struct Ends {
    pub c: Side,
    pub s: Side,
}

pub fn ends(kind: Kind) -> Ends {
    let (dc, ds) = match kind {
        Kind::Tcp => (Device::soft_iwarp(), Device::soft_iwarp()),
        Kind::Mem => {
            let f = LoopbackFabric::new();
            (Device::loopback(&f), Device::loopback(&f))
        }
    };
    Ends {
        c: Side::new(dc),
        s: Side::new(ds),
    }
}

pub fn any_addr() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub struct Connected {
    pub c: Connection,
    pub s: Connection,
}

/// Connect c → s, accepting with `ps`.
pub async fn connect(e: &Ends, pc: ConnParams, ps: ConnParams) -> Result<Connected, VerbsError> {
    let mut l = e.s.dev.listen(any_addr()).await?;
    let addr = l.local_addr();
    let sqp = e.s.qp.clone();
    let server = tokio::spawn(async move {
        let req = l.accept().await?;
        req.accept(&sqp, ps).await
    });
    let c = e.c.dev.connect(&e.c.qp, addr, pc).await?;
    let s = server.await.expect("server task")?;
    Ok(Connected { c, s })
}

pub async fn up(kind: Kind) -> (Ends, Connected) {
    let e = ends(kind);
    let k = connect(&e, ConnParams::default(), ConnParams::default())
        .await
        .expect("connect");
    (e, k)
}

/// Run an async test body with a hard time limit.
pub async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(20), f)
        .await
        .expect("test timed out")
}

/// A hand-written MPA initiator (revision 2, no markers, IRD and ORD 4, CRC as asked) connects
/// to `addr` and takes the Reply; returns the stream, what it read after the Reply, and the
/// Reply.
pub async fn raw_mpa_initiator(
    addr: SocketAddr,
    crc: bool,
) -> (
    tokio::net::TcpStream,
    bytes::BytesMut,
    verbs::wire::mpa::MpaFrame,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use verbs::wire::mpa::{FrameKind, IrdOrd, MpaFrame};
    let mut t = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = MpaFrame {
        kind: FrameKind::Request,
        markers: false,
        crc,
        reject: false,
        revision: 2,
        enhanced: Some(IrdOrd {
            ird: 4,
            ord: 4,
            ..Default::default()
        }),
        private_data: bytes::Bytes::new(),
    };
    t.write_all(&req.encode().unwrap()).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let rep = loop {
        assert!(t.read_buf(&mut buf).await.unwrap() > 0, "listener closed");
        if let Some((f, n)) = MpaFrame::decode(&buf).unwrap() {
            let _ = buf.split_to(n);
            break f;
        }
    };
    (t, buf, rep)
}

/// `n` bytes of test data that do not repeat every 256 bytes (a block of 2 KiB shifts the
/// sequence), so that data landing at a wrong offset does not compare equal by chance.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                .wrapping_add((i >> 11) as u8)
        })
        .collect()
}
