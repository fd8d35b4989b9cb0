//! A minimal NFSv4.1/4.2 client (RFC 8881) over any [`oncrpc::RpcTransport`]: EXCHANGE_ID,
//! CREATE_SESSION and RECLAIM_COMPLETE to start; every later COMPOUND starts with SEQUENCE on
//! a free slot of the session's fore channel (§2.10.6), so calls run concurrently up to the
//! slots the server granted; PUTROOTFH/LOOKUP, OPEN/READ/WRITE/COMMIT/CLOSE, GETATTR and
//! REMOVE; DESTROY_SESSION and DESTROY_CLIENTID to end. It asks for no back channel.
//!
//! RFC 8267 on RPC-over-RDMA: WRITE data is encoded DDP-eligible (a Read chunk can carry it)
//! and a READ's reply expectation names its data as the one DDP-eligible item (§6.1, §6.4.1:
//! one READ per COMPOUND here, so the pairing with the Write chunk is trivial).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use oncrpc::{CallRequest, OpaqueAuth, ReplyExpectation, RpcError, RpcTransport};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use xdr::Encoder;

use crate::nfs3;
use crate::nfs4::args::{CreateHow, CreateSessionArgs, OpArgs, OpenArgs, OpenClaim, SequenceArgs};
use crate::nfs4::client_codec::encode_compound;
use crate::nfs4::compound::{CompoundHeader, CompoundReply};
use crate::nfs4::consts::{attr, op, proc4, share};
use crate::nfs4::res::OpRes;
use crate::nfs4::status::Nfsstat4;
use crate::nfs4::types::{
    Bitmap4, ChannelAttrs4, ClientOwner4, Component4, Fattr4, Fh4, Opaque1024, SessionId4,
    StateOwner4, StateProtectA, Stateid4, Tag4, Verifier4,
};

/// Slots asked for on the fore channel (the server may grant fewer).
pub const SLOTS: u32 = 64;
/// Largest READ or WRITE this client asks the session to carry.
pub const MAX_IO: u32 = 1 << 20;
/// Bytes of a COMPOUND reply around a READ's data, at most (SEQUENCE, PUTFH, READ headers).
const READ_REPLY_OVERHEAD: usize = 512;

/// Why an NFSv4 call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Nfs4Error {
    /// The RPC layer failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The COMPOUND results did not decode.
    #[error("malformed COMPOUND results: {0}")]
    Decode(#[from] xdr::XdrError),
    /// An operation failed.
    #[error("{op} failed: {status}")]
    Status { op: &'static str, status: Nfsstat4 },
    /// The server answered something this client did not ask for.
    #[error("unexpected reply: {0}")]
    Unexpected(String),
}

/// An open file: its handle and open stateid.
#[derive(Debug, Clone)]
pub struct Open4 {
    pub fh: Fh4,
    pub stateid: Stateid4,
}

/// One operation of a COMPOUND as this client sends it.
#[derive(Debug, Clone)]
enum Op {
    Args(OpArgs),
    /// WRITE with its data DDP-eligible (RFC 8267 §6.1).
    Write {
        stateid: Stateid4,
        offset: u64,
        stable: u32,
        data: Bytes,
    },
}

/// An upper bound on the reply to SEQUENCE and `ops` (no tag), when each has one
/// ([`crate::ulb::v4_reply`]).
fn reply_bound(sequence: &OpArgs, ops: &[Op]) -> Option<usize> {
    use crate::ulb::v4_reply::{WRITE_REPLY_MAX, op_reply_max, ops_reply_bound};
    ops.iter()
        .try_fold(ops_reply_bound(0, [sequence])?, |size, o| {
            Some(
                size + match o {
                    Op::Args(a) => op_reply_max(a)?,
                    Op::Write { .. } => WRITE_REPLY_MAX,
                },
            )
        })
}

impl Op {
    fn encode(&self, e: &mut Encoder) {
        match self {
            Op::Args(a) => a.encode(e),
            Op::Write {
                stateid,
                offset,
                stable,
                data,
            } => {
                e.put_u32(op::WRITE);
                xdr::XdrEncode::encode(stateid, e);
                e.put_u64(*offset);
                e.put_u32(*stable);
                e.put_ddp_opaque(data.clone());
            }
        }
    }
}

/// The NFSv4.1 client of one session.
pub struct Nfs4Client {
    rpc: Arc<dyn RpcTransport>,
    cred: OpaqueAuth,
    timeout: Option<Duration>,
    minor: u32,
    clientid: u64,
    session: SessionId4,
    /// The fore channel's free slots with the sequence id each used last.
    free: Mutex<Vec<(u32, u32)>>,
    slots: Semaphore,
    highest_slot: u32,
    owner_seq: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Nfs4Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nfs4Client")
            .field("minor", &self.minor)
            .field("clientid", &format_args!("{:#x}", self.clientid))
            .field("slots", &(self.highest_slot + 1))
            .finish_non_exhaustive()
    }
}

fn status_of(r: &CompoundReply) -> Result<(), Nfs4Error> {
    if r.status.is_ok() {
        return Ok(());
    }
    let op = r.results.last().map_or(0, OpRes::opnum);
    Err(Nfs4Error::Status {
        op: op::name(op),
        status: r.status,
    })
}

fn fore_attrs(maxrequests: u32) -> ChannelAttrs4 {
    ChannelAttrs4 {
        headerpadsize: 0,
        maxrequestsize: MAX_IO + 8192,
        maxresponsesize: MAX_IO + 8192,
        maxresponsesize_cached: 4096,
        maxoperations: 16,
        maxrequests,
        rdma_ird: None,
    }
}

/// One call of procedure `proc_` (NULL or COMPOUND) outside any session.
async fn raw_call(
    rpc: &Arc<dyn RpcTransport>,
    cred: &OpaqueAuth,
    timeout: Option<Duration>,
    proc_: u32,
    args: Bytes,
    reply: ReplyExpectation,
) -> Result<Bytes, Nfs4Error> {
    let mut req = CallRequest::new(nfs3::PROGRAM, 4, proc_, move |e| e.put_raw(&args))
        .with_cred(cred.clone())
        .with_reply(reply);
    req.timeout = timeout;
    Ok(rpc.call(req).await?)
}

impl Nfs4Client {
    /// Start a session with minor version `minor` (1 or 2) as client owner `owner`:
    /// EXCHANGE_ID (SP4_NONE), CREATE_SESSION, and RECLAIM_COMPLETE (nothing to reclaim;
    /// RFC 8881 §18.51.3: before it no OPEN is granted).
    pub async fn connect(
        rpc: Arc<dyn RpcTransport>,
        cred: OpaqueAuth,
        minor: u32,
        owner: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Self, Nfs4Error> {
        let one = |ops: &[OpArgs]| encode_compound(b"", minor, ops);
        let out = raw_call(
            &rpc,
            &cred,
            timeout,
            proc4::COMPOUND,
            one(&[OpArgs::ExchangeId {
                owner: ClientOwner4 {
                    verifier: rand::random(),
                    ownerid: Opaque1024::from_slice(owner),
                },
                flags: 0,
                protect: StateProtectA::None,
                impl_id: None,
            }]),
            ReplyExpectation::default(),
        )
        .await?;
        let r = CompoundReply::decode(&out)?;
        status_of(&r)?;
        let Some(OpRes::ExchangeId(x)) = r.results.first() else {
            return Err(Nfs4Error::Unexpected(format!("{r:?}")));
        };
        let (clientid, sequence) = (x.clientid, x.sequenceid);
        let out = raw_call(
            &rpc,
            &cred,
            timeout,
            proc4::COMPOUND,
            one(&[OpArgs::CreateSession(Box::new(CreateSessionArgs {
                clientid,
                sequence,
                flags: 0,
                fore: fore_attrs(SLOTS),
                back: ChannelAttrs4 {
                    maxresponsesize_cached: 0,
                    ..fore_attrs(1)
                },
                cb_program: 0,
                sec: Vec::new(),
            }))]),
            ReplyExpectation::default(),
        )
        .await?;
        let r = CompoundReply::decode(&out)?;
        status_of(&r)?;
        let Some(OpRes::CreateSession(cs)) = r.results.first() else {
            return Err(Nfs4Error::Unexpected(format!("{r:?}")));
        };
        let n = cs.fore.maxrequests.clamp(1, SLOTS);
        let c = Nfs4Client {
            rpc,
            cred,
            timeout,
            minor,
            clientid,
            session: cs.session,
            free: Mutex::new((0..n).rev().map(|s| (s, 0)).collect()),
            slots: Semaphore::new(n as usize),
            highest_slot: n - 1,
            owner_seq: std::sync::atomic::AtomicU64::new(1),
        };
        c.compound(vec![Op::Args(OpArgs::ReclaimComplete(false))], None)
            .await?;
        Ok(c)
    }

    /// The RPC transport under the session.
    pub fn transport(&self) -> &Arc<dyn RpcTransport> {
        &self.rpc
    }

    /// The minor version this client speaks.
    pub fn minor(&self) -> u32 {
        self.minor
    }

    /// The session's slots (calls that can run at once).
    pub fn slots(&self) -> u32 {
        self.highest_slot + 1
    }

    /// SEQUENCE on a free slot, then `ops`; the results after SEQUENCE, all successful.
    async fn compound(&self, ops: Vec<Op>, read: Option<u32>) -> Result<Vec<OpRes>, Nfs4Error> {
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|_| Nfs4Error::Unexpected("slot table closed".into()))?;
        let (slot, last) = self
            .free
            .lock()
            .pop()
            .ok_or_else(|| Nfs4Error::Unexpected("no free slot".into()))?;
        let seq = last.wrapping_add(1);
        let header = CompoundHeader {
            tag: Tag4::from_slice(b""),
            minorversion: self.minor,
            nops: ops.len() as u32 + 1,
        };
        let sequence = OpArgs::Sequence(SequenceArgs {
            session: self.session,
            sequenceid: seq,
            slotid: slot,
            highest_slotid: self.highest_slot,
            cachethis: false,
        });
        let reply = match read {
            // RFC 8267 §6.4.1: the READ's data is the reply's one DDP-eligible item.
            Some(count) => ReplyExpectation {
                max_len: Some(count as usize + READ_REPLY_OVERHEAD),
                ddp_items: vec![count as usize],
            },
            // A bound of its own when every operation's reply has one (RFC 8267 §6.2.2: the
            // session's ca_maxresponsesize is for what cannot be bounded): over RPC-over-RDMA
            // no Reply chunk is then registered for a reply that fits inline.
            None => ReplyExpectation {
                max_len: reply_bound(&sequence, &ops).map(|b| crate::ulb::RPC_REPLY_HEADER_MAX + b),
                ddp_items: Vec::new(),
            },
        };
        let mut req = CallRequest::new(nfs3::PROGRAM, 4, proc4::COMPOUND, move |e| {
            xdr::XdrEncode::encode(&header, e);
            sequence.encode(e);
            for o in &ops {
                o.encode(e);
            }
        })
        .with_cred(self.cred.clone())
        .with_reply(reply);
        req.timeout = self.timeout;
        let out = self.rpc.call(req).await;
        let r = out
            .map_err(Nfs4Error::from)
            .and_then(|b| Ok(CompoundReply::decode(&b)?));
        // The slot's sequence id moves on once the server took the request (SEQUENCE
        // succeeded, RFC 8881 §2.10.6.1); otherwise it is reused.
        let advanced = matches!(&r, Ok(r) if matches!(r.results.first(), Some(OpRes::Sequence(_))));
        self.free
            .lock()
            .push((slot, if advanced { seq } else { last }));
        let r = r?;
        status_of(&r)?;
        Ok(r.results.into_iter().skip(1).collect())
    }

    /// PUTROOTFH, GETFH: the root's handle.
    pub async fn root(&self) -> Result<Fh4, Nfs4Error> {
        let r = self
            .compound(
                vec![Op::Args(OpArgs::Putrootfh), Op::Args(OpArgs::Getfh)],
                None,
            )
            .await?;
        match r.get(1) {
            Some(OpRes::Getfh(f)) => Ok(f.clone()),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// PUTFH `dir`, LOOKUP `name`, GETFH.
    pub async fn lookup(&self, dir: &Fh4, name: &[u8]) -> Result<Fh4, Nfs4Error> {
        let r = self
            .compound(
                vec![
                    Op::Args(OpArgs::Putfh(dir.clone())),
                    Op::Args(OpArgs::Lookup(Component4::from_slice(name))),
                    Op::Args(OpArgs::Getfh),
                ],
                None,
            )
            .await?;
        match r.get(2) {
            Some(OpRes::Getfh(f)) => Ok(f.clone()),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// OPEN `name` in `dir` for reading and writing (created, mode `mode`, when `create`):
    /// CLAIM_NULL, a fresh open owner, no delegation asked.
    pub async fn open(
        &self,
        dir: &Fh4,
        name: &[u8],
        create: Option<u32>,
    ) -> Result<Open4, Nfs4Error> {
        let n = self
            .owner_seq
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let create = create.map(|mode| {
            let mut e = Encoder::new();
            e.put_u32(mode);
            CreateHow::Unchecked(Fattr4 {
                mask: Bitmap4::from_bits(&[attr::MODE]),
                vals: e.into_bytes(),
            })
        });
        let r = self
            .compound(
                vec![
                    Op::Args(OpArgs::Putfh(dir.clone())),
                    Op::Args(OpArgs::Open(Box::new(OpenArgs {
                        seqid: 0,
                        share_access: share::ACCESS_BOTH,
                        share_deny: share::DENY_NONE,
                        owner: StateOwner4 {
                            clientid: self.clientid,
                            owner: Opaque1024::from_slice(format!("open-{n}").as_bytes()),
                        },
                        create,
                        claim: OpenClaim::Null(Component4::from_slice(name)),
                    }))),
                    Op::Args(OpArgs::Getfh),
                ],
                None,
            )
            .await?;
        match (r.get(1), r.get(2)) {
            (Some(OpRes::Open(o)), Some(OpRes::Getfh(fh))) => Ok(Open4 {
                fh: fh.clone(),
                stateid: o.stateid,
            }),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// READ `count` bytes at `offset`: the data and whether it reached the end of the file.
    pub async fn read(
        &self,
        f: &Open4,
        offset: u64,
        count: u32,
    ) -> Result<(Bytes, bool), Nfs4Error> {
        let r = self
            .compound(
                vec![
                    Op::Args(OpArgs::Putfh(f.fh.clone())),
                    Op::Args(OpArgs::Read {
                        stateid: f.stateid,
                        offset,
                        count,
                    }),
                ],
                Some(count),
            )
            .await?;
        match r.into_iter().nth(1) {
            Some(OpRes::Read { eof, data }) => Ok((data, eof)),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// WRITE `data` at `offset` with `stable` (UNSTABLE4, DATA_SYNC4, FILE_SYNC4): the bytes
    /// written, how they were committed and the write verifier.
    pub async fn write(
        &self,
        f: &Open4,
        offset: u64,
        data: Bytes,
        stable: u32,
    ) -> Result<(u32, u32, Verifier4), Nfs4Error> {
        let r = self
            .compound(
                vec![
                    Op::Args(OpArgs::Putfh(f.fh.clone())),
                    Op::Write {
                        stateid: f.stateid,
                        offset,
                        stable,
                        data,
                    },
                ],
                None,
            )
            .await?;
        match r.get(1) {
            Some(OpRes::Write {
                count,
                committed,
                verf,
            }) => Ok((*count, *committed, *verf)),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// COMMIT the whole file: the write verifier.
    pub async fn commit(&self, fh: &Fh4) -> Result<Verifier4, Nfs4Error> {
        let r = self
            .compound(
                vec![
                    Op::Args(OpArgs::Putfh(fh.clone())),
                    Op::Args(OpArgs::Commit {
                        offset: 0,
                        count: 0,
                    }),
                ],
                None,
            )
            .await?;
        match r.get(1) {
            Some(OpRes::Commit(v)) => Ok(*v),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// GETATTR of `bits` (attribute numbers).
    pub async fn getattr(&self, fh: &Fh4, bits: &[u32]) -> Result<Fattr4, Nfs4Error> {
        let r = self
            .compound(
                vec![
                    Op::Args(OpArgs::Putfh(fh.clone())),
                    Op::Args(OpArgs::Getattr(Bitmap4::from_bits(bits))),
                ],
                None,
            )
            .await?;
        match r.into_iter().nth(1) {
            Some(OpRes::Getattr(a)) => Ok(a),
            other => Err(Nfs4Error::Unexpected(format!("{other:?}"))),
        }
    }

    /// The size of a file (GETATTR size).
    pub async fn size(&self, fh: &Fh4) -> Result<u64, Nfs4Error> {
        let a = self.getattr(fh, &[attr::SIZE]).await?;
        let b: [u8; 8] = a
            .vals
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| Nfs4Error::Unexpected(format!("no size in {a:?}")))?;
        Ok(u64::from_be_bytes(b))
    }

    /// CLOSE an open file.
    pub async fn close(&self, f: &Open4) -> Result<(), Nfs4Error> {
        self.compound(
            vec![
                Op::Args(OpArgs::Putfh(f.fh.clone())),
                Op::Args(OpArgs::Close {
                    seqid: 0,
                    stateid: f.stateid,
                }),
            ],
            None,
        )
        .await?;
        Ok(())
    }

    /// REMOVE `name` from `dir`.
    pub async fn remove(&self, dir: &Fh4, name: &[u8]) -> Result<(), Nfs4Error> {
        self.compound(
            vec![
                Op::Args(OpArgs::Putfh(dir.clone())),
                Op::Args(OpArgs::Remove(Component4::from_slice(name))),
            ],
            None,
        )
        .await?;
        Ok(())
    }

    /// DESTROY_SESSION, then DESTROY_CLIENTID (RFC 8881 §18.37, §18.50).
    pub async fn destroy(self) -> Result<(), Nfs4Error> {
        for o in [
            OpArgs::DestroySession(self.session),
            OpArgs::DestroyClientid(self.clientid),
        ] {
            let out = raw_call(
                &self.rpc,
                &self.cred,
                self.timeout,
                proc4::COMPOUND,
                encode_compound(b"", self.minor, &[o]),
                ReplyExpectation::default(),
            )
            .await?;
            status_of(&CompoundReply::decode(&out)?)?;
        }
        Ok(())
    }
}
