//! RPC message types (RFC 5531 §9) with checked decoding and exact encoding.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrError};

use crate::auth::OpaqueAuth;

/// The only RPC version (RFC 5531 §9: `rpcvers` MUST be 2).
pub const RPC_VERSION: u32 = 2;

/// `msg_type` (RFC 5531 §9).
pub const CALL: u32 = 0;
/// `msg_type` REPLY.
pub const REPLY: u32 = 1;

/// `accept_stat` (RFC 5531 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AcceptStat {
    /// RPC executed successfully.
    Success,
    /// Remote hasn't exported the program.
    ProgUnavail,
    /// Remote can't support the version number; carries the supported range.
    ProgMismatch { low: u32, high: u32 },
    /// Program can't support the procedure.
    ProcUnavail,
    /// Procedure can't decode its arguments.
    GarbageArgs,
    /// Memory allocation failure or other system error.
    SystemErr,
}

impl AcceptStat {
    /// Wire value of the discriminant.
    pub fn code(self) -> u32 {
        match self {
            AcceptStat::Success => 0,
            AcceptStat::ProgUnavail => 1,
            AcceptStat::ProgMismatch { .. } => 2,
            AcceptStat::ProcUnavail => 3,
            AcceptStat::GarbageArgs => 4,
            AcceptStat::SystemErr => 5,
        }
    }
}

/// `auth_stat` (RFC 5531 §9, RFC 2203 §5.3.3.3 for the RPCSEC_GSS values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuthStat {
    Ok,
    BadCred,
    RejectedCred,
    BadVerf,
    RejectedVerf,
    TooWeak,
    InvalidResp,
    Failed,
    KerbGeneric,
    TimeExpire,
    TktFile,
    Decode,
    NetAddr,
    RpcsecGssCredProblem,
    RpcsecGssCtxProblem,
    /// A value this implementation does not name.
    Other(u32),
}

impl AuthStat {
    /// Wire value.
    pub fn code(self) -> u32 {
        use AuthStat::*;
        match self {
            Ok => 0,
            BadCred => 1,
            RejectedCred => 2,
            BadVerf => 3,
            RejectedVerf => 4,
            TooWeak => 5,
            InvalidResp => 6,
            Failed => 7,
            KerbGeneric => 8,
            TimeExpire => 9,
            TktFile => 10,
            Decode => 11,
            NetAddr => 12,
            RpcsecGssCredProblem => 13,
            RpcsecGssCtxProblem => 14,
            Other(v) => v,
        }
    }

    /// From the wire value.
    pub fn from_code(v: u32) -> Self {
        use AuthStat::*;
        match v {
            0 => Ok,
            1 => BadCred,
            2 => RejectedCred,
            3 => BadVerf,
            4 => RejectedVerf,
            5 => TooWeak,
            6 => InvalidResp,
            7 => Failed,
            8 => KerbGeneric,
            9 => TimeExpire,
            10 => TktFile,
            11 => Decode,
            12 => NetAddr,
            13 => RpcsecGssCredProblem,
            14 => RpcsecGssCtxProblem,
            v => Other(v),
        }
    }
}

/// `rejected_reply` (RFC 5531 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectedReply {
    /// RPC version number != 2; carries the supported range.
    RpcMismatch { low: u32, high: u32 },
    /// Authentication failed.
    AuthError(AuthStat),
}

/// The header of a CALL message up to (not including) the procedure arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallHeader {
    pub xid: u32,
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
    pub cred: OpaqueAuth,
    pub verf: OpaqueAuth,
}

/// The header of a REPLY message up to (not including) the procedure results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyHeader {
    /// MSG_ACCEPTED: the verifier and the accept status. Results follow only for Success.
    Accepted {
        xid: u32,
        verf: OpaqueAuth,
        stat: AcceptStat,
    },
    /// MSG_DENIED.
    Denied { xid: u32, reason: RejectedReply },
}

impl ReplyHeader {
    /// The reply's XID.
    pub fn xid(&self) -> u32 {
        match self {
            ReplyHeader::Accepted { xid, .. } | ReplyHeader::Denied { xid, .. } => *xid,
        }
    }
}

/// A decoded RPC message header: which kind, and the header fields. The procedure arguments
/// or results are the rest of the stream ([`Decoder::position`] after decoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageHeader {
    Call(CallHeader),
    Reply(ReplyHeader),
}

/// Errors decoding an RPC message header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The bytes are not valid XDR for an RPC header.
    #[error("malformed RPC header: {0}")]
    Xdr(#[from] XdrError),
    /// `msg_type` was neither CALL nor REPLY.
    #[error("invalid RPC msg_type {0}")]
    BadMsgType(u32),
    /// A CALL with `rpcvers` != 2: answer with RPC_MISMATCH (RFC 5531 §9).
    #[error("RPC version {vers} is not supported (xid {xid:#010x})")]
    RpcVersion { xid: u32, vers: u32 },
    /// `reply_stat` was neither MSG_ACCEPTED nor MSG_DENIED.
    #[error("invalid RPC reply_stat {0}")]
    BadReplyStat(u32),
    /// `accept_stat` outside RFC 5531's values.
    #[error("invalid RPC accept_stat {0}")]
    BadAcceptStat(u32),
    /// `reject_stat` outside RFC 5531's values.
    #[error("invalid RPC reject_stat {0}")]
    BadRejectStat(u32),
}

impl CallHeader {
    /// Encode `xid, CALL, rpcvers=2, prog, vers, proc, cred, verf`.
    pub fn encode(&self, enc: &mut Encoder) {
        enc.put_u32(self.xid);
        enc.put_u32(CALL);
        enc.put_u32(RPC_VERSION);
        enc.put_u32(self.prog);
        enc.put_u32(self.vers);
        enc.put_u32(self.proc_);
        self.cred.encode(enc);
        self.verf.encode(enc);
    }

    /// Exact encoded length.
    pub fn encoded_len(&self) -> usize {
        24 + self.cred.encoded_len() + self.verf.encoded_len()
    }
}

impl ReplyHeader {
    /// Encode the reply header; the caller appends results after a Success.
    pub fn encode(&self, enc: &mut Encoder) {
        match self {
            ReplyHeader::Accepted { xid, verf, stat } => {
                enc.put_u32(*xid);
                enc.put_u32(REPLY);
                enc.put_u32(0); // MSG_ACCEPTED
                verf.encode(enc);
                enc.put_u32(stat.code());
                if let AcceptStat::ProgMismatch { low, high } = stat {
                    enc.put_u32(*low);
                    enc.put_u32(*high);
                }
            }
            ReplyHeader::Denied { xid, reason } => {
                enc.put_u32(*xid);
                enc.put_u32(REPLY);
                enc.put_u32(1); // MSG_DENIED
                match reason {
                    RejectedReply::RpcMismatch { low, high } => {
                        enc.put_u32(0);
                        enc.put_u32(*low);
                        enc.put_u32(*high);
                    }
                    RejectedReply::AuthError(stat) => {
                        enc.put_u32(1);
                        enc.put_u32(stat.code());
                    }
                }
            }
        }
    }

    /// Exact encoded length.
    pub fn encoded_len(&self) -> usize {
        match self {
            ReplyHeader::Accepted { verf, stat, .. } => {
                12 + verf.encoded_len()
                    + 4
                    + if matches!(stat, AcceptStat::ProgMismatch { .. }) {
                        8
                    } else {
                        0
                    }
            }
            ReplyHeader::Denied { reason, .. } => {
                12 + match reason {
                    RejectedReply::RpcMismatch { .. } => 12,
                    RejectedReply::AuthError(_) => 8,
                }
            }
        }
    }
}

impl MessageHeader {
    /// Decode an RPC header; the decoder is left at the start of the arguments or results.
    pub fn decode(dec: &mut Decoder<'_>) -> Result<Self, MessageError> {
        let xid = dec.u32()?;
        match dec.u32()? {
            CALL => {
                let vers = dec.u32()?;
                if vers != RPC_VERSION {
                    return Err(MessageError::RpcVersion { xid, vers });
                }
                let prog = dec.u32()?;
                let vers = dec.u32()?;
                let proc_ = dec.u32()?;
                let cred = OpaqueAuth::decode(dec)?;
                let verf = OpaqueAuth::decode(dec)?;
                Ok(MessageHeader::Call(CallHeader {
                    xid,
                    prog,
                    vers,
                    proc_,
                    cred,
                    verf,
                }))
            }
            REPLY => match dec.u32()? {
                0 => {
                    let verf = OpaqueAuth::decode(dec)?;
                    let stat = match dec.u32()? {
                        0 => AcceptStat::Success,
                        1 => AcceptStat::ProgUnavail,
                        2 => AcceptStat::ProgMismatch {
                            low: dec.u32()?,
                            high: dec.u32()?,
                        },
                        3 => AcceptStat::ProcUnavail,
                        4 => AcceptStat::GarbageArgs,
                        5 => AcceptStat::SystemErr,
                        v => return Err(MessageError::BadAcceptStat(v)),
                    };
                    Ok(MessageHeader::Reply(ReplyHeader::Accepted {
                        xid,
                        verf,
                        stat,
                    }))
                }
                1 => {
                    let reason = match dec.u32()? {
                        0 => RejectedReply::RpcMismatch {
                            low: dec.u32()?,
                            high: dec.u32()?,
                        },
                        1 => RejectedReply::AuthError(AuthStat::from_code(dec.u32()?)),
                        v => return Err(MessageError::BadRejectStat(v)),
                    };
                    Ok(MessageHeader::Reply(ReplyHeader::Denied { xid, reason }))
                }
                v => Err(MessageError::BadReplyStat(v)),
            },
            v => Err(MessageError::BadMsgType(v)),
        }
    }

    /// Decode a whole message held in `buf`: the header and the body (arguments or results)
    /// as a zero-copy slice.
    pub fn decode_message(buf: &Bytes) -> Result<(Self, Bytes), MessageError> {
        let mut dec = Decoder::from_bytes(buf);
        let h = Self::decode(&mut dec)?;
        let body = dec.take_rest();
        Ok((h, body))
    }
}
