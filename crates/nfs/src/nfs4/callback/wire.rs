//! The callback program's wire formats (RFC 8881 §20): CB_COMPOUND arguments and results for
//! the operations this server sends (CB_SEQUENCE §20.9, CB_NOTIFY_LOCK §20.11), with checked
//! decoders for both halves: the server decodes results, a client decodes arguments.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrEncode};

use super::super::status::{Nfsstat4, Res4};
use super::super::types::{Fh4, MAX_SMALL_ARRAY, SessionId4, StateOwner4, Tag4};

/// The callback program's version (RFC 8881 §20: `NFS_CB` = 1, for every minor version).
pub const CB_VERSION: u32 = 1;
/// `CB_NULL` (§20.1) and `CB_COMPOUND` (§20.2).
pub const CB_NULL: u32 = 0;
pub const CB_COMPOUND: u32 = 1;

/// Callback operation numbers (RFC 8881 §20.2, `nfs_cb_opnum4`).
pub mod cb_op {
    pub const CB_SEQUENCE: u32 = 11;
    pub const CB_NOTIFY_LOCK: u32 = 13;
    pub const CB_ILLEGAL: u32 = 10044;
}

/// Most operations in one CB_COMPOUND a decoder accepts (we send two).
pub const MAX_CB_OPS: u32 = 16;

/// `referring_call4` (RFC 8881 §20.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferringCall {
    pub sequenceid: u32,
    pub slotid: u32,
}

/// `referring_call_list4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferringCallList {
    pub session: SessionId4,
    pub calls: Vec<ReferringCall>,
}

/// `CB_SEQUENCE4args` (RFC 8881 §20.9.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbSequenceArgs {
    pub session: SessionId4,
    pub sequenceid: u32,
    pub slotid: u32,
    pub highest_slotid: u32,
    pub cachethis: bool,
    pub referring: Vec<ReferringCallList>,
}

/// `CB_SEQUENCE4resok` (RFC 8881 §20.9.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbSequenceOk {
    pub session: SessionId4,
    pub sequenceid: u32,
    pub slotid: u32,
    pub highest_slotid: u32,
    pub target_highest_slotid: u32,
}

/// One operation of a CB_COMPOUND.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbOpArgs {
    Sequence(CbSequenceArgs),
    /// `CB_NOTIFY_LOCK4args` (RFC 8881 §20.11.1): the file and the lock owner that waited.
    NotifyLock {
        fh: Fh4,
        owner: StateOwner4,
    },
    /// An operation this codec does not decode; decoding stops after its number.
    Other(u32),
}

/// `CB_COMPOUND4args` (RFC 8881 §20.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbCompoundArgs {
    pub tag: Tag4,
    pub minorversion: u32,
    /// Ignored for minor versions above 0 (§20.2.3).
    pub callback_ident: u32,
    pub ops: Vec<CbOpArgs>,
}

/// One operation's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CbOpRes {
    Sequence(Res4<CbSequenceOk>),
    NotifyLock(Nfsstat4),
    /// Any other operation: its number and status (an OK one ends the decoding, whose body
    /// is unknown here).
    Other(u32, Nfsstat4),
}

/// `CB_COMPOUND4res`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CbCompoundRes {
    pub status: Nfsstat4,
    pub tag: Tag4,
    pub results: Vec<CbOpRes>,
}

fn session(d: &mut Decoder<'_>) -> xdr::Result<SessionId4> {
    let mut s = [0u8; 16];
    s.copy_from_slice(d.opaque_fixed(16)?);
    Ok(s)
}

impl CbOpArgs {
    /// The operation number.
    pub fn opnum(&self) -> u32 {
        match self {
            CbOpArgs::Sequence(_) => cb_op::CB_SEQUENCE,
            CbOpArgs::NotifyLock { .. } => cb_op::CB_NOTIFY_LOCK,
            CbOpArgs::Other(n) => *n,
        }
    }

    fn encode(&self, e: &mut Encoder) {
        e.put_u32(self.opnum());
        match self {
            CbOpArgs::Sequence(s) => {
                e.put_opaque_fixed(&s.session);
                e.put_u32(s.sequenceid);
                e.put_u32(s.slotid);
                e.put_u32(s.highest_slotid);
                e.put_bool(s.cachethis);
                e.put_u32(s.referring.len() as u32);
                for l in &s.referring {
                    e.put_opaque_fixed(&l.session);
                    e.put_u32(l.calls.len() as u32);
                    for c in &l.calls {
                        e.put_u32(c.sequenceid);
                        e.put_u32(c.slotid);
                    }
                }
            }
            CbOpArgs::NotifyLock { fh, owner } => {
                fh.encode(e);
                owner.encode(e);
            }
            CbOpArgs::Other(_) => {}
        }
    }

    fn decode(d: &mut Decoder<'_>) -> xdr::Result<Self> {
        Ok(match d.u32()? {
            cb_op::CB_SEQUENCE => CbOpArgs::Sequence(CbSequenceArgs {
                session: session(d)?,
                sequenceid: d.u32()?,
                slotid: d.u32()?,
                highest_slotid: d.u32()?,
                cachethis: d.bool()?,
                referring: d.array(MAX_SMALL_ARRAY, |d| {
                    Ok(ReferringCallList {
                        session: session(d)?,
                        calls: d.array(MAX_SMALL_ARRAY, |d| {
                            Ok(ReferringCall {
                                sequenceid: d.u32()?,
                                slotid: d.u32()?,
                            })
                        })?,
                    })
                })?,
            }),
            cb_op::CB_NOTIFY_LOCK => CbOpArgs::NotifyLock {
                fh: d.get()?,
                owner: d.get()?,
            },
            n => CbOpArgs::Other(n),
        })
    }
}

impl CbCompoundArgs {
    /// Encode (the operation count is the length of `ops`).
    pub fn encode(&self, e: &mut Encoder) {
        self.tag.encode(e);
        e.put_u32(self.minorversion);
        e.put_u32(self.callback_ident);
        e.put_u32(self.ops.len() as u32);
        for o in &self.ops {
            o.encode(e);
        }
    }

    /// The arguments as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut e = Encoder::new();
        self.encode(&mut e);
        e.into_bytes()
    }

    /// Decode; an operation this codec does not know ends the list (as
    /// [`CbOpArgs::Other`]), the rest is left unread.
    pub fn decode(buf: &Bytes) -> xdr::Result<Self> {
        let mut d = Decoder::from_bytes(buf);
        let tag = d.get()?;
        let minorversion = d.u32()?;
        let callback_ident = d.u32()?;
        let n = d.length(MAX_CB_OPS)?;
        let mut ops = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let o = CbOpArgs::decode(&mut d)?;
            let stop = matches!(o, CbOpArgs::Other(_));
            ops.push(o);
            if stop {
                break;
            }
        }
        Ok(CbCompoundArgs {
            tag,
            minorversion,
            callback_ident,
            ops,
        })
    }
}

impl CbOpRes {
    /// The operation number.
    pub fn opnum(&self) -> u32 {
        match self {
            CbOpRes::Sequence(_) => cb_op::CB_SEQUENCE,
            CbOpRes::NotifyLock(_) => cb_op::CB_NOTIFY_LOCK,
            CbOpRes::Other(n, _) => *n,
        }
    }

    /// The operation's status.
    pub fn status(&self) -> Nfsstat4 {
        match self {
            CbOpRes::Sequence(Ok(_)) => Nfsstat4::OK,
            CbOpRes::Sequence(Err(s)) | CbOpRes::NotifyLock(s) | CbOpRes::Other(_, s) => *s,
        }
    }

    fn encode(&self, e: &mut Encoder) {
        e.put_u32(self.opnum());
        self.status().encode(e);
        if let CbOpRes::Sequence(Ok(s)) = self {
            e.put_opaque_fixed(&s.session);
            e.put_u32(s.sequenceid);
            e.put_u32(s.slotid);
            e.put_u32(s.highest_slotid);
            e.put_u32(s.target_highest_slotid);
        }
    }
}

impl CbCompoundRes {
    /// Encode.
    pub fn encode(&self, e: &mut Encoder) {
        self.status.encode(e);
        self.tag.encode(e);
        e.put_u32(self.results.len() as u32);
        for r in &self.results {
            r.encode(e);
        }
    }

    /// The results as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut e = Encoder::new();
        self.encode(&mut e);
        e.into_bytes()
    }

    /// Decode. A successful result of an operation whose body this codec does not know ends
    /// the list.
    pub fn decode(buf: &Bytes) -> xdr::Result<Self> {
        let mut d = Decoder::from_bytes(buf);
        let status = d.get()?;
        let tag = d.get()?;
        let n = d.length(MAX_CB_OPS)?;
        let mut results = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let op = d.u32()?;
            let st: Nfsstat4 = d.get()?;
            let r = match op {
                cb_op::CB_SEQUENCE if st.is_ok() => CbOpRes::Sequence(Ok(CbSequenceOk {
                    session: session(&mut d)?,
                    sequenceid: d.u32()?,
                    slotid: d.u32()?,
                    highest_slotid: d.u32()?,
                    target_highest_slotid: d.u32()?,
                })),
                cb_op::CB_SEQUENCE => CbOpRes::Sequence(Err(st)),
                cb_op::CB_NOTIFY_LOCK => CbOpRes::NotifyLock(st),
                other => CbOpRes::Other(other, st),
            };
            let stop = matches!(r, CbOpRes::Other(_, s) if s.is_ok());
            results.push(r);
            if stop {
                break;
            }
        }
        Ok(CbCompoundRes {
            status,
            tag,
            results,
        })
    }
}
