//! Test-side NFSv4.1 client over TCP: COMPOUNDs built with the crate's client codec
//! (`nfs::nfs4::client_codec`), a session with one slot.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nfs::nfs4::args::{
    CreateHow, CreateSessionArgs, Locker, OpArgs, OpenArgs, OpenClaim, SequenceArgs,
};
use nfs::nfs4::client_codec::encode_compound;
use nfs::nfs4::compound::CompoundReply;
use nfs::nfs4::consts::attr;
use nfs::nfs4::consts::{lock_type, share, stable};
use nfs::nfs4::res::OpRes;
use nfs::nfs4::server::Nfs4Config;
use nfs::nfs4::types::{
    Bitmap4, ChannelAttrs4, ClientOwner4, Fattr4, Opaque1024, StateOwner4, StateProtectA, Stateid4,
};
use nfs::nfs4::{Nfsstat4, consts::op};
use nfs::serve::{ServeConfig, Served, start};
use oncrpc::auth::{AuthSys, OpaqueAuth};
use oncrpc::client::ReplyExpectation;
use oncrpc::{RpcClient, TcpClient};
use rpcrdma::{RdmaClient, TransportConfig};

pub fn local() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A server on loopback with NFSv3 and NFSv4 (no grace period: nothing to reclaim).
pub async fn serve(dir: &std::path::Path) -> Served {
    let mut cfg = ServeConfig::new(dir);
    cfg.tcp = Some(local());
    cfg.portmap = None;
    cfg.nfs4 = Some(Nfs4Config::default().with_grace(std::time::Duration::ZERO));
    start(cfg).await.unwrap()
}

/// An RPC-over-RDMA connection to `served` with the NFS binding and the default settings,
/// answering backward-direction calls with `back` when given.
pub async fn rdma_client(served: &Served, back: Option<oncrpc::Dispatcher>) -> Arc<RdmaClient> {
    let ulb: Arc<dyn rpcrdma::ulb::UpperLayerBinding> = Arc::new(nfs::ulb::NfsBinding::new());
    Arc::new(
        RdmaClient::connect_with(
            served.rdma_addr.unwrap(),
            TransportConfig::default(),
            vec![ulb],
            back,
        )
        .await
        .unwrap(),
    )
}

pub fn me() -> (u32, u32) {
    (
        rustix::process::getuid().as_raw(),
        rustix::process::getgid().as_raw(),
    )
}

/// An RPC client for NFS version `vers` with the test process's AUTH_SYS identity.
pub async fn rpc(addr: SocketAddr, vers: u32) -> RpcClient {
    let t = Arc::new(TcpClient::connect(addr).await.unwrap());
    let (uid, gid) = me();
    RpcClient::new(t, 100003, vers).with_cred(OpaqueAuth::sys(&AuthSys {
        stamp: 1,
        machinename: Bytes::from_static(b"test"),
        uid,
        gid,
        gids: vec![],
    }))
}

/// One COMPOUND, raw.
pub async fn compound(rpc: &RpcClient, tag: &[u8], minor: u32, ops: &[OpArgs]) -> Bytes {
    let args = encode_compound(tag, minor, ops);
    rpc.call(1, move |e| e.put_raw(&args), ReplyExpectation::default())
        .await
        .unwrap()
}

pub async fn compound_reply(rpc: &RpcClient, minor: u32, ops: &[OpArgs]) -> CompoundReply {
    CompoundReply::decode(&compound(rpc, b"t", minor, ops).await).unwrap()
}

pub fn fore(maxops: u32) -> ChannelAttrs4 {
    ChannelAttrs4 {
        headerpadsize: 0,
        maxrequestsize: 1 << 20,
        maxresponsesize: 2 << 20,
        maxresponsesize_cached: 4096,
        maxoperations: maxops,
        maxrequests: 4,
        rdma_ird: None,
    }
}

/// A client with a session (slot 0).
pub struct Client {
    pub rpc: RpcClient,
    pub clientid: u64,
    pub session: [u8; 16],
    pub seq: u32,
    pub minor: u32,
}

pub fn owner(name: &[u8]) -> Opaque1024 {
    Opaque1024::from_slice(name)
}

impl Client {
    /// EXCHANGE_ID, CREATE_SESSION and RECLAIM_COMPLETE (nothing to reclaim) for client owner
    /// `name`, as the Linux client does before its first OPEN (RFC 8881 §18.51.3).
    pub async fn new(addr: SocketAddr, name: &str, maxops: u32) -> Client {
        let mut c = Client::before_reclaim_complete(addr, name, maxops).await;
        c.ok(vec![OpArgs::ReclaimComplete(false)]).await;
        c
    }

    /// EXCHANGE_ID and CREATE_SESSION for client owner `name`, without RECLAIM_COMPLETE.
    pub async fn before_reclaim_complete(addr: SocketAddr, name: &str, maxops: u32) -> Client {
        let rpc = rpc(addr, 4).await;
        let r = compound_reply(
            &rpc,
            1,
            &[OpArgs::ExchangeId {
                owner: ClientOwner4 {
                    verifier: [7; 8],
                    ownerid: owner(name.as_bytes()),
                },
                flags: 0,
                protect: StateProtectA::None,
                impl_id: None,
            }],
        )
        .await;
        let OpRes::ExchangeId(x) = &r.results[0] else {
            panic!("EXCHANGE_ID: {r:?}");
        };
        let clientid = x.clientid;
        let r = compound_reply(
            &rpc,
            1,
            &[OpArgs::CreateSession(Box::new(CreateSessionArgs {
                clientid,
                sequence: x.sequenceid,
                flags: 0,
                fore: fore(maxops),
                back: fore(4),
                cb_program: 0,
                sec: vec![],
            }))],
        )
        .await;
        let OpRes::CreateSession(cs) = &r.results[0] else {
            panic!("CREATE_SESSION: {r:?}");
        };
        Client {
            rpc,
            clientid,
            session: cs.session,
            seq: 0,
            minor: 1,
        }
    }

    pub fn sequence(&self, seq: u32, cachethis: bool) -> OpArgs {
        OpArgs::Sequence(SequenceArgs {
            session: self.session,
            sequenceid: seq,
            slotid: 0,
            highest_slotid: 0,
            cachethis,
        })
    }

    /// SEQUENCE (next sequence id) + `ops`.
    pub async fn call(&mut self, ops: Vec<OpArgs>) -> CompoundReply {
        self.seq += 1;
        let mut all = vec![self.sequence(self.seq, false)];
        all.extend(ops);
        compound_reply(&self.rpc, self.minor, &all).await
    }

    /// SEQUENCE + `ops`, all expected to succeed; the results after SEQUENCE.
    pub async fn ok(&mut self, ops: Vec<OpArgs>) -> Vec<OpRes> {
        let r = self.call(ops).await;
        assert_eq!(r.status, Nfsstat4::OK, "{r:?}");
        r.results[1..].to_vec()
    }

    /// SEQUENCE + `ops`, expected to fail with `s` at the last operation.
    pub async fn fails(&mut self, ops: Vec<OpArgs>, s: Nfsstat4) -> Vec<OpRes> {
        let r = self.call(ops).await;
        assert_eq!(r.status, s, "{r:?}");
        r.results
    }
}

/// The status of the last result.
pub fn last_status(r: &CompoundReply) -> Nfsstat4 {
    r.results.last().map_or(Nfsstat4::OK, OpRes::status)
}

pub fn name(s: &str) -> nfs::nfs4::types::Component4 {
    nfs::nfs4::types::Component4::from_slice(s.as_bytes())
}

pub fn mask(bits: &[u32]) -> Bitmap4 {
    Bitmap4::from_bits(bits)
}

/// A `fattr4` with a mode.
pub fn mode_attr(mode: u32) -> Fattr4 {
    let mut e = xdr::Encoder::new();
    e.put_u32(mode);
    Fattr4 {
        mask: mask(&[attr::MODE]),
        vals: e.into_bytes(),
    }
}

/// The stateid of an OPEN, LOCK, LOCKU or CLOSE result.
pub fn stateid_of(r: &OpRes) -> Stateid4 {
    match r {
        OpRes::Open(o) => o.stateid,
        OpRes::Lock(s) | OpRes::Locku(s) | OpRes::Close(s) | OpRes::OpenDowngrade(s) => *s,
        other => panic!("no stateid in {other:?}"),
    }
}

pub fn fh_of(r: &OpRes) -> nfs::nfs4::types::Fh4 {
    match r {
        OpRes::Getfh(f) => f.clone(),
        other => panic!("not GETFH: {other:?}"),
    }
}

pub const ILLEGAL_OP: u32 = op::ILLEGAL;

/// Deterministic test data.
pub fn pattern(len: usize, seed: u32) -> Bytes {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

pub fn open_args(owner_name: &[u8], file: &str, access: u32, deny: u32, create: bool) -> OpArgs {
    OpArgs::Open(Box::new(OpenArgs {
        seqid: 0,
        share_access: access,
        share_deny: deny,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(owner_name),
        },
        create: create.then(|| CreateHow::Unchecked(mode_attr(0o644))),
        claim: OpenClaim::Null(name(file)),
    }))
}

pub fn write(sid: Stateid4, offset: u64, data: Bytes) -> OpArgs {
    OpArgs::Write {
        stateid: sid,
        offset,
        stable: stable::FILE_SYNC4,
        data,
    }
}

pub fn read(sid: Stateid4, offset: u64, count: u32) -> OpArgs {
    OpArgs::Read {
        stateid: sid,
        offset,
        count,
    }
}

/// OPEN `file` in the root for read and write (created if missing); its stateid and handle.
pub async fn open_rw(
    c: &mut Client,
    owner_name: &[u8],
    file: &str,
    deny: u32,
) -> (Stateid4, Fattr4) {
    let r = c
        .ok(vec![
            OpArgs::Putrootfh,
            open_args(owner_name, file, share::ACCESS_BOTH, deny, true),
            OpArgs::Getfh,
        ])
        .await;
    let fh = fh_of(&r[2]);
    (
        stateid_of(&r[1]),
        Fattr4 {
            mask: Default::default(),
            vals: Bytes::copy_from_slice(fh.as_bytes()),
        },
    )
}

pub fn fh4(f: &Fattr4) -> nfs::nfs4::types::Fh4 {
    nfs::nfs4::types::Fh4::from_slice(&f.vals)
}

pub fn u32_attr(r: &OpRes) -> u32 {
    let OpRes::Getattr(f) = r else {
        panic!("not GETATTR: {r:?}")
    };
    u32::from_be_bytes(f.vals[..4].try_into().unwrap())
}

pub fn lock(sid: Stateid4, who: &[u8], offset: u64, length: u64) -> OpArgs {
    OpArgs::Lock {
        locktype: lock_type::WRITE_LT,
        reclaim: false,
        offset,
        length,
        locker: Locker::New {
            open_seqid: 0,
            open_stateid: sid,
            lock_seqid: 0,
            owner: StateOwner4 {
                clientid: 0,
                owner: owner(who),
            },
        },
    }
}

pub fn size_attr(size: u64) -> Fattr4 {
    let mut e = xdr::Encoder::new();
    e.put_u64(size);
    Fattr4 {
        mask: mask(&[attr::SIZE]),
        vals: e.into_bytes(),
    }
}

pub fn open_how(owner_name: &[u8], file: &str, deny: u32, how: CreateHow) -> OpArgs {
    OpArgs::Open(Box::new(OpenArgs {
        seqid: 0,
        share_access: share::ACCESS_BOTH,
        share_deny: deny,
        owner: StateOwner4 {
            clientid: 0,
            owner: owner(owner_name),
        },
        create: Some(how),
        claim: OpenClaim::Null(name(file)),
    }))
}
