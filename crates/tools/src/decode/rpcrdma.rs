//! RPC-over-RDMA transport headers, versions 1 (RFC 8166, the `rpcrdma::header` decoder) and 2
//! (draft-cel-nfsv4-rpcrdma-version-two-05, `rpcrdma::header_v2`), with their chunk lists,
//! errors and properties; and the Payload stream of an RDMA_MSG rebuilt around the chunks it
//! names, so that the RPC message under it can be decoded.

use rpcrdma::header::{Body, Chunks, ErrorBody, Header, HeaderError};
use rpcrdma::header_v2::{Body2, Direction, ErrorBody2, Header2, Header2Error};
use rpcrdma::props::{PropSet, PropSubset, Property};

use super::model::{ReadChunkInfo, RpcRdmaInfo, Seg};

fn seg(s: &rpcrdma::header::Segment) -> Seg {
    Seg {
        handle: s.handle,
        length: s.length,
        offset: s.offset,
    }
}

fn empty(vers: u32, xid: u32) -> RpcRdmaInfo {
    RpcRdmaInfo {
        vers,
        xid,
        credits: 0,
        proc_name: "?",
        direction: None,
        inv_handle: None,
        reads: Vec::new(),
        writes: Vec::new(),
        reply_chunk: None,
        error: None,
        opttype: None,
        properties: Vec::new(),
        hdr_len: 0,
        malformed: None,
        rpc: None,
        rpc_from: None,
    }
}

fn fill_chunks(info: &mut RpcRdmaInfo, c: &Chunks) {
    info.reads = c
        .read_chunks()
        .iter()
        .map(|rc| ReadChunkInfo {
            position: rc.position,
            segments: rc.segments.iter().map(seg).collect(),
        })
        .collect();
    info.writes = c
        .writes
        .iter()
        .map(|w| w.iter().map(seg).collect())
        .collect();
    info.reply_chunk = c.reply.as_ref().map(|w| w.iter().map(seg).collect());
}

/// Decode a transport header at the start of a Send's payload.
pub fn decode_header(msg: &[u8]) -> RpcRdmaInfo {
    match Header::decode(msg) {
        Ok((h, len)) => v1(h, len),
        Err(HeaderError::Version { xid, vers: 2 }) => v2(msg, xid),
        Err(e) => {
            let (xid, vers) = match e {
                HeaderError::Version { xid, vers } => (xid, vers),
                HeaderError::BadProc { xid, .. }
                | HeaderError::Truncated { xid }
                | HeaderError::BadFlag { xid, .. }
                | HeaderError::TooManySegments { xid, .. }
                | HeaderError::NoMsgWithoutChunks { xid }
                | HeaderError::MalformedError { xid } => (xid, 1),
                _ => (0, 0),
            };
            let mut i = empty(vers, xid);
            fixed_words(&mut i, msg);
            i.malformed = Some(e.to_string());
            i
        }
    }
}

/// What a malformed header's fixed words still say: the credits, and the procedure when it is
/// a known one (RFC 8166 §4.2; the same words in version 2, cel-05 §7.2).
fn fixed_words(i: &mut RpcRdmaInfo, msg: &[u8]) {
    let word = |n: usize| {
        msg.get(n * 4..n * 4 + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    };
    if let Some(c) = word(2) {
        i.credits = c;
    }
    let names: &[&'static str] = if i.vers == 2 {
        &[
            "RDMA2_MSG",
            "RDMA2_NOMSG",
            "?",
            "?",
            "RDMA2_ERROR",
            "RDMA2_OPTIONAL",
            "RDMA2_CONNPROP",
            "RDMA2_REQPROP",
            "RDMA2_RESPROP",
            "RDMA2_UPDPROP",
        ]
    } else {
        &[
            "RDMA_MSG",
            "RDMA_NOMSG",
            "RDMA_MSGP",
            "RDMA_DONE",
            "RDMA_ERROR",
        ]
    };
    if let Some(&n) = word(3).and_then(|p| names.get(p as usize)) {
        i.proc_name = n;
    }
}

fn v1(h: Header, len: usize) -> RpcRdmaInfo {
    let mut i = empty(h.vers, h.xid);
    i.credits = h.credits;
    i.hdr_len = len;
    match &h.body {
        Body::Msg(c) => {
            i.proc_name = "RDMA_MSG";
            fill_chunks(&mut i, c);
        }
        Body::NoMsg(c) => {
            i.proc_name = "RDMA_NOMSG";
            fill_chunks(&mut i, c);
        }
        Body::MsgP {
            align,
            thresh,
            chunks,
        } => {
            i.proc_name = "RDMA_MSGP";
            i.properties = vec![format!("align={align}"), format!("thresh={thresh}")];
            fill_chunks(&mut i, chunks);
        }
        Body::Done => i.proc_name = "RDMA_DONE",
        Body::Error(e) => {
            i.proc_name = "RDMA_ERROR";
            i.error = Some(match e {
                ErrorBody::Vers { low, high } => format!("ERR_VERS {low}-{high}"),
                ErrorBody::Chunk => "ERR_CHUNK".to_string(),
            });
        }
    }
    i
}

fn props(set: &PropSet) -> Vec<String> {
    set.0
        .iter()
        .map(|p| match p.interpret() {
            Ok(Property::ReceiveBufferSize(n)) => format!("RBSIZ={n}"),
            Ok(Property::BackwardRequestSupport(b)) => format!("BRS={b:?}"),
            // The experimental capability of responder-provided Read chunks (rpcrdma::rrc).
            Ok(Property::Unknown { which, data }) if which == rpcrdma::rrc::PROPID_RRC => {
                match &data[..] {
                    [0, 0, 0, v] if *v <= 1 => format!("RRC={v}"),
                    _ => format!("{which:#x}=<{} bytes>", data.len()),
                }
            }
            Ok(Property::Unknown { which, data }) => format!("{which:#x}=<{} bytes>", data.len()),
            Err(e) => format!("{}: {e}", p.which),
        })
        .collect()
}

fn subset(name: &str, s: &PropSubset) -> String {
    let v: Vec<String> = s.positions().map(|p| p.to_string()).collect();
    format!("{name}={{{}}}", v.join(","))
}

fn v2(msg: &[u8], xid: u32) -> RpcRdmaInfo {
    let (h, len) = match Header2::decode(msg) {
        Ok(x) => x,
        Err(e) => {
            let mut i = empty(2, xid);
            fixed_words(&mut i, msg);
            if let Header2Error::BadProc { proc_, .. } = e {
                i.properties.push(format!("proc={proc_}"));
            }
            i.malformed = Some(e.to_string());
            return i;
        }
    };
    let mut i = empty(2, h.xid);
    i.credits = h.credits;
    i.hdr_len = len;
    i.direction = h.body.direction().map(|d| match d {
        Direction::Call => "call",
        Direction::Reply => "reply",
    });
    match &h.body {
        Body2::Msg(l) | Body2::NoMsg(l) => {
            i.proc_name = if matches!(h.body, Body2::Msg(_)) {
                "RDMA2_MSG"
            } else {
                "RDMA2_NOMSG"
            };
            i.inv_handle = Some(l.inv_handle);
            fill_chunks(&mut i, &l.chunks);
        }
        Body2::Error(e) => {
            i.proc_name = "RDMA2_ERROR";
            i.error = Some(match e {
                ErrorBody2::Vers { low, high } => format!("ERR_VERS {low}-{high}"),
                ErrorBody2::BadXdr => "ERR_BAD_XDR".into(),
                ErrorBody2::InvalProc => "ERR_INVAL_PROC".into(),
                ErrorBody2::ReadChunks { max_chunks } => {
                    format!("ERR_READ_CHUNKS max={max_chunks}")
                }
                ErrorBody2::WriteChunks { max_chunks } => {
                    format!("ERR_WRITE_CHUNKS max={max_chunks}")
                }
                ErrorBody2::Segments { max_segments } => format!("ERR_SEGMENTS max={max_segments}"),
                ErrorBody2::WriteResource {
                    chunk_index,
                    length_needed,
                } => format!("ERR_WRITE_RESOURCE chunk={chunk_index} needed={length_needed}"),
                ErrorBody2::ReplyResource { length_needed } => {
                    format!("ERR_REPLY_RESOURCE needed={length_needed}")
                }
                ErrorBody2::InvalOption => "ERR_INVAL_OPTION".into(),
                ErrorBody2::System => "ERR_SYSTEM".into(),
            });
        }
        Body2::Optional(o) => {
            i.proc_name = "RDMA2_OPTIONAL";
            i.opttype = Some(o.opttype);
            // The pull-completion notification of responder-provided Read chunks.
            match rpcrdma::rrc::PullDone::from_optional(h.xid, o) {
                Some(Ok(n)) => i.properties.push(format!("PULL_DONE {:?}", n.status)),
                _ => i
                    .properties
                    .push(format!("optinfo=<{} bytes>", o.optinfo.len())),
            }
        }
        Body2::ConnProp(c) => {
            i.proc_name = "RDMA2_CONNPROP";
            i.properties = props(&c.start);
            i.properties.push(subset("nochg", &c.nochg));
        }
        Body2::ReqProp(r) => {
            i.proc_name = "RDMA2_REQPROP";
            i.properties = props(&r.want);
        }
        Body2::ResProp(r) => {
            i.proc_name = "RDMA2_RESPROP";
            i.properties = vec![subset("done", &r.done), subset("rejected", &r.rejected)];
            i.properties.extend(props(&r.other));
        }
        Body2::UpdProp(u) => {
            i.proc_name = "RDMA2_UPDPROP";
            i.properties = props(&u.now);
        }
    }
    i
}

/// True when the message carries an RPC message inline after its header.
pub fn has_inline_payload(i: &RpcRdmaInfo) -> bool {
    i.malformed.is_none() && matches!(i.proc_name, "RDMA_MSG" | "RDMA2_MSG" | "RDMA_MSGP")
}

/// The Payload stream of an RDMA_MSG with the items its Read chunks reduced put back (as
/// zeros: their bytes travelled by RDMA Read), so that the RPC arguments after them decode.
/// At most 2 MiB is put back in all (a 1 MiB NFS WRITE fits); arguments after more than that
/// do not decode and are reported so.
/// RFC 8166 §3.4.5: a Read chunk's position is its item's offset in the Payload stream; the
/// item is XDR-padded in the stream but not in the chunk (§3.4.6), so the length put back is
/// rounded up to four.
pub fn rebuild_payload(inline: &[u8], reads: &[ReadChunkInfo]) -> Vec<u8> {
    const MAX_FILL: u64 = 2 << 20;
    let mut out = Vec::with_capacity(inline.len());
    let mut taken = 0usize;
    // What is put back, over all chunks, is bounded: a capture may name any lengths.
    let mut budget = MAX_FILL;
    for rc in reads.iter().filter(|r| r.position != 0) {
        // Positions count in the rebuilt stream; the inline bytes before it are those not yet
        // taken.
        let pos = rc.position as usize;
        let want_inline = pos.saturating_sub(out.len());
        let end = taken.saturating_add(want_inline).min(inline.len());
        out.extend_from_slice(&inline[taken..end]);
        taken = end;
        let len: u64 = rc.segments.iter().map(|s| u64::from(s.length)).sum();
        let fill = (len.div_ceil(4) * 4).min(budget);
        budget -= fill;
        out.resize(out.len() + fill as usize, 0);
    }
    out.extend_from_slice(&inline[taken..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpcrdma::rrc::{PullDone, PullStatus};

    #[test]
    fn responder_read_chunk_messages_are_named() {
        let n = PullDone {
            xid: 9,
            status: PullStatus::UnknownXid,
        }
        .to_bytes(4);
        let i = decode_header(&n);
        assert_eq!(i.proc_name, "RDMA2_OPTIONAL");
        assert_eq!(i.properties, vec!["PULL_DONE UnknownXid".to_string()]);
        let p = rpcrdma::version::V2Properties::new(4096, rpcrdma::props::BackwardSupport::Inline)
            .with_rrc(true);
        let c = Header2::new(1, 1, Body2::ConnProp(p.connprop())).to_bytes();
        let i = decode_header(&c);
        assert!(
            i.properties.contains(&"RRC=1".to_string()),
            "{:?}",
            i.properties
        );
    }
}
