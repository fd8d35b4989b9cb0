//! The bytes the conformance cases send and the checks of what comes back: RPC calls, the
//! fixed fields of any transport header (also of versions the decoders refuse), and the few
//! NFSv3 arguments and results the binding cases need (RFC 1813 §3.3.3, §3.3.6).

use bytes::{BufMut, Bytes, BytesMut};
use oncrpc::message::{MessageHeader, ReplyHeader};
use rpcrdma::header::{Body, Chunks, Header};
use rpcrdma::header_v2::{Body2, ChunkLists, Direction, Header2};

/// XDR round-up of `n` to a multiple of four.
pub fn pad4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

/// An RPC Call: `xid, CALL, 2, prog, vers, proc`, AUTH_SYS (uid/gid 0, machine name
/// "conform") or AUTH_NONE, then `args`.
pub fn rpc_call(
    xid: u32,
    prog: u32,
    vers: u32,
    proc_: u32,
    auth_sys: bool,
    args: &[u8],
) -> Vec<u8> {
    let mut b = BytesMut::with_capacity(64 + args.len());
    b.put_u32(xid);
    b.put_u32(0); // CALL
    b.put_u32(2);
    b.put_u32(prog);
    b.put_u32(vers);
    b.put_u32(proc_);
    if auth_sys {
        let name = b"conform";
        b.put_u32(1); // AUTH_SYS
        b.put_u32((4 + 4 + pad4(name.len()) + 4 + 4 + 4) as u32);
        b.put_u32(0); // stamp
        b.put_u32(name.len() as u32);
        b.put_slice(name);
        b.put_bytes(0, pad4(name.len()) - name.len());
        b.put_u32(0); // uid
        b.put_u32(0); // gid
        b.put_u32(0); // no gids
    } else {
        b.put_u64(0); // AUTH_NONE, empty body
    }
    b.put_u64(0); // verifier AUTH_NONE
    b.put_slice(args);
    b.to_vec()
}

/// A version 1 transport header followed by `payload`.
pub fn v1(xid: u32, credits: u32, body: Body, payload: &[u8]) -> Bytes {
    let mut b = BytesMut::from(&Header::new(xid, credits, body).to_bytes()[..]);
    b.put_slice(payload);
    b.freeze()
}

/// A version 2 RDMA2_MSG/NOMSG header of a call followed by `payload`.
pub fn v2(xid: u32, credits: u32, nomsg: bool, chunks: Chunks, payload: &[u8]) -> Bytes {
    let lists = ChunkLists::new(Direction::Call, chunks);
    let body = if nomsg {
        Body2::NoMsg(lists)
    } else {
        Body2::Msg(lists)
    };
    let mut b = BytesMut::from(&Header2::new(xid, credits, body).to_bytes()[..]);
    b.put_slice(payload);
    b.freeze()
}

/// The four fixed words of a transport header (RFC 8166 §4.2), whatever the version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    pub xid: u32,
    pub vers: u32,
    pub credits: u32,
    pub proc_: u32,
}

fn word(b: &[u8], i: usize) -> Option<u32> {
    let w = b.get(i * 4..i * 4 + 4)?;
    Some(u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
}

/// The fixed words, if the message has them.
pub fn fixed(b: &[u8]) -> Option<Fixed> {
    Some(Fixed {
        xid: word(b, 0)?,
        vers: word(b, 1)?,
        credits: word(b, 2)?,
        proc_: word(b, 3)?,
    })
}

/// An RDMA_ERROR's `rdma_err` and, for ERR_VERS, the range (RFC 8166 §4.1.2; the same
/// layout in version 2, §7.2).
pub fn error_body(b: &[u8]) -> Option<(u32, Option<(u32, u32)>)> {
    let f = fixed(b)?;
    if f.proc_ != rpcrdma::header::RDMA_ERROR {
        return None;
    }
    let err = word(b, 4)?;
    if err == rpcrdma::header::ERR_VERS {
        return Some((err, Some((word(b, 5)?, word(b, 6)?))));
    }
    Some((err, None))
}

/// A short description of a received message, for case details.
pub fn describe(b: &[u8]) -> String {
    match fixed(b) {
        None => format!("{} bytes, shorter than the fixed header", b.len()),
        Some(f) => {
            let err = error_body(b)
                .map(|(e, r)| match r {
                    Some((lo, hi)) => format!(" err {e} vers {lo}..{hi}"),
                    None => format!(" err {e}"),
                })
                .unwrap_or_default();
            format!(
                "xid {:#010x} vers {} credits {} proc {}{err} ({} bytes)",
                f.xid,
                f.vers,
                f.credits,
                f.proc_,
                b.len()
            )
        }
    }
}

/// A decoded version 1 reply: its header, and the inline Payload stream after it.
pub fn decode_v1(b: &Bytes) -> Result<(Header, Bytes), String> {
    let (h, n) = Header::decode(b).map_err(|e| format!("reply header: {e}"))?;
    Ok((h, b.slice(n..)))
}

/// A decoded version 2 reply and its inline Payload stream.
pub fn decode_v2(b: &Bytes) -> Result<(Header2, Bytes), String> {
    let (h, n) = Header2::decode(b).map_err(|e| format!("version 2 reply header: {e}"))?;
    Ok((h, b.slice(n..)))
}

/// The RPC reply header of a Payload stream and the results after it; only accepted
/// replies with SUCCESS give results.
pub fn rpc_reply(payload: &Bytes, xid: u32) -> Result<(ReplyHeader, Bytes), String> {
    match MessageHeader::decode_message(payload) {
        Ok((MessageHeader::Reply(r), rest)) => {
            if r.xid() != xid {
                return Err(format!(
                    "RPC reply XID {:#010x}, the call's was {xid:#010x}",
                    r.xid()
                ));
            }
            Ok((r, rest))
        }
        Ok((MessageHeader::Call(_), _)) => Err("the Payload stream is an RPC Call".into()),
        Err(e) => Err(format!("RPC reply: {e}")),
    }
}

/// Whether an RPC reply header is an accepted SUCCESS.
pub fn is_success(r: &ReplyHeader) -> bool {
    matches!(
        r,
        ReplyHeader::Accepted {
            stat: oncrpc::message::AcceptStat::Success,
            ..
        }
    )
}

/// The reply's status, short: `SUCCESS`, `GARBAGE_ARGS`, `denied ...`.
pub fn stat_name(r: &ReplyHeader) -> String {
    use oncrpc::message::AcceptStat;
    match r {
        ReplyHeader::Accepted { stat, .. } => match stat {
            AcceptStat::Success => "SUCCESS".into(),
            AcceptStat::GarbageArgs => "GARBAGE_ARGS".into(),
            s => format!("accepted, {s:?}"),
        },
        ReplyHeader::Denied { reason, .. } => format!("denied, {reason:?}"),
    }
}

/// NFSv3 LOOKUP3args / READ3args (RFC 1813 §3.3.3, §3.3.6).
pub mod nfs3 {
    use super::*;

    /// `nfs_fh3` then `filename3`.
    pub fn lookup_args(dir: &[u8], name: &[u8]) -> Vec<u8> {
        let mut b = BytesMut::new();
        opaque(&mut b, dir);
        opaque(&mut b, name);
        b.to_vec()
    }

    /// `nfs_fh3 file; offset3 offset; count3 count`.
    pub fn read_args(fh: &[u8], offset: u64, count: u32) -> Vec<u8> {
        let mut b = BytesMut::new();
        opaque(&mut b, fh);
        b.put_u64(offset);
        b.put_u32(count);
        b.to_vec()
    }

    fn opaque(b: &mut BytesMut, v: &[u8]) {
        b.put_u32(v.len() as u32);
        b.put_slice(v);
        b.put_bytes(0, pad4(v.len()) - v.len());
    }

    /// Bytes of an encoded `fattr3` (RFC 1813 §2.6).
    pub const FATTR3_LEN: usize = 84;

    /// An object handle and, when the attributes came, its `ftype3` and size.
    pub type Looked = (Vec<u8>, Option<(u32, u64)>);

    /// A LOOKUP3resok's object handle and, when present, its type and size.
    pub fn lookup_res(r: &[u8]) -> Result<Looked, String> {
        let mut d = xdr::Decoder::new(r);
        let e = |e: xdr::XdrError| format!("LOOKUP3res: {e}");
        let status = d.u32().map_err(e)?;
        if status != 0 {
            return Err(format!("LOOKUP status {status}"));
        }
        let fh = d.opaque(64).map_err(e)?.to_vec();
        let attrs = if d.bool().map_err(e)? {
            let a = d.opaque_fixed(FATTR3_LEN).map_err(e)?;
            let ty = u32::from_be_bytes([a[0], a[1], a[2], a[3]]);
            let size = u64::from_be_bytes(a[20..28].try_into().unwrap_or([0; 8]));
            Some((ty, size))
        } else {
            None
        };
        Ok((fh, attrs))
    }

    /// A READ3res as it arrives inline: status, then for NFS3_OK the count, eof, the data's
    /// length word and whatever inline data bytes follow (none when the data went to a Write
    /// chunk), and the number of bytes after the length word.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct ReadRes {
        pub status: u32,
        pub count: u32,
        pub eof: bool,
        pub data_len: u32,
        /// Bytes of the Payload stream after the data's length word.
        pub inline_after_len: usize,
    }

    /// Parse the READ3res at the start of `r`.
    pub fn read_res(r: &[u8]) -> Result<ReadRes, String> {
        let mut d = xdr::Decoder::new(r);
        let e = |e: xdr::XdrError| format!("READ3res: {e}");
        let status = d.u32().map_err(e)?;
        if d.bool().map_err(e)? {
            d.skip(FATTR3_LEN).map_err(e)?;
        }
        if status != 0 {
            return Ok(ReadRes {
                status,
                count: 0,
                eof: false,
                data_len: 0,
                inline_after_len: d.remaining(),
            });
        }
        let count = d.u32().map_err(e)?;
        let eof = d.bool().map_err(e)?;
        let data_len = d.u32().map_err(e)?;
        Ok(ReadRes {
            status,
            count,
            eof,
            data_len,
            inline_after_len: d.remaining(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_decodes_as_the_rpc_call_it_claims_to_be() {
        let c = Bytes::from(rpc_call(7, 100003, 3, 6, true, &[0, 0, 0, 1]));
        let Ok((MessageHeader::Call(h), rest)) = MessageHeader::decode_message(&c) else {
            panic!("not a call")
        };
        assert_eq!((h.xid, h.prog, h.vers, h.proc_), (7, 100003, 3, 6));
        assert_eq!(h.cred.flavor, 1);
        assert_eq!(&rest[..], &[0, 0, 0, 1]);
    }

    #[test]
    fn fixed_words_and_error_bodies_read_any_version() {
        let e = rpcrdma::header_v2::error_vers_bytes(9, 7, 3, 1, 2);
        assert_eq!(
            fixed(&e),
            Some(Fixed {
                xid: 9,
                vers: 7,
                credits: 3,
                proc_: 4
            })
        );
        assert_eq!(error_body(&e), Some((1, Some((1, 2)))));
        assert_eq!(fixed(&e[..15]), None);
    }

    #[test]
    fn a_short_read_result_is_an_error_not_a_panic() {
        assert!(nfs3::read_res(&[0, 0, 0, 0, 0, 0, 0, 1]).is_err());
        let ok = nfs3::read_res(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 5]);
        assert_eq!(
            ok,
            Ok(nfs3::ReadRes {
                status: 0,
                count: 5,
                eof: true,
                data_len: 5,
                inline_after_len: 0
            })
        );
    }
}
