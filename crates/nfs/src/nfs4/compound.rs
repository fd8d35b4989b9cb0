//! The COMPOUND procedure's envelope (RFC 8881 §16.2): the header the executor reads before
//! the operations, and the reply it writes after them.

use bytes::Bytes;
use xdr::{Decoder, Encoder, XdrDecode, XdrEncode};

use super::res::OpRes;
use super::status::Nfsstat4;
use super::types::Tag4;

/// Most operations a COMPOUND may announce before the session's `ca_maxoperations` is known
/// (the header is read before SEQUENCE): a count above it is NFS4ERR_RESOURCE-free garbage.
pub const MAX_OPS_WIRE: u32 = 1 << 12;

/// `COMPOUND4args` up to the operations: the tag, the minor version and how many operations
/// follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompoundHeader {
    pub tag: Tag4,
    pub minorversion: u32,
    pub nops: u32,
}

impl<'a> XdrDecode<'a> for CompoundHeader {
    fn decode(d: &mut Decoder<'a>) -> xdr::Result<Self> {
        let tag = d.get()?;
        let minorversion = d.u32()?;
        let nops = d.length(MAX_OPS_WIRE)?;
        Ok(CompoundHeader {
            tag,
            minorversion,
            nops,
        })
    }
}

impl XdrEncode for CompoundHeader {
    fn encode(&self, e: &mut Encoder) {
        self.tag.encode(e);
        e.put_u32(self.minorversion);
        e.put_u32(self.nops);
    }
    fn encoded_len(&self) -> usize {
        self.tag.encoded_len() + 8
    }
}

/// `COMPOUND4res`: the status of the last operation evaluated, the tag echoed (RFC 8881
/// §16.2.3: "the tag ... is returned in the reply"), and the results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompoundReply {
    pub status: Nfsstat4,
    pub tag: Bytes,
    pub results: Vec<OpRes>,
}

impl CompoundReply {
    /// Bytes of the reply with nothing reduced.
    pub fn encoded_len(&self) -> usize {
        4 + xdr::opaque_len(self.tag.len())
            + 4
            + self.results.iter().map(OpRes::encoded_len).sum::<usize>()
    }

    /// Write the reply into `e` (which carries the transport's reduction policy).
    pub fn encode(&self, e: &mut Encoder) {
        self.status.encode(e);
        e.put_opaque(&self.tag);
        e.put_u32(self.results.len() as u32);
        for r in &self.results {
            r.encode(e);
        }
    }
}
