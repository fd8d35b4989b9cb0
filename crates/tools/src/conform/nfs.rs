//! NFS binding cases (RFC 8267 §4 over RFC 8166): READ data placed in the Write chunk and
//! nowhere else, no XDR round-up in a Write chunk, a Long Reply in the Reply chunk, an
//! unused Write chunk returned empty. They only read: the file the user names is never
//! written, and the root handle comes from MOUNT over TCP.

use std::sync::Arc;

use bytes::Bytes;
use rpcrdma::header::{Body, Chunks, Header, Segment};

use super::link::segment;
use super::msg::{self, nfs3};
use super::{CaseInfo, Ctx, Link, Verdict, fail, na, pass};

pub const CASES: &[CaseInfo] = &[
    CaseInfo {
        id: "nfs-read-write-chunk",
        cite: "RFC 8267 §4; RFC 8166 §4.3.2",
        title: "READ data goes to the Write chunk, none of it inline, the chunk's length is the count",
    },
    CaseInfo {
        id: "nfs-read-roundup",
        cite: "RFC 8166 §3.4.6.2",
        title: "a 1001-byte READ returns a 1001-byte Write chunk and writes no round-up padding",
    },
    CaseInfo {
        id: "nfs-read-reply-chunk",
        cite: "RFC 8166 §3.5.3, §4.3.3",
        title: "a READ reply over the inline threshold goes in the Reply chunk (RDMA_NOMSG), chunk copied",
    },
    CaseInfo {
        id: "nfs-reply-chunk-length",
        cite: "RFC 8166 §4.3.3",
        title: "beside a Write chunk, the returned Reply chunk's length is what was written",
    },
    CaseInfo {
        id: "nfs-unused-write-chunk",
        cite: "RFC 8166 §4.3.2.2",
        title: "a READ failing with no data returns its Write chunk as an unused chunk",
    },
];

const NFS_PROG: u32 = nfs::nfs3::PROGRAM;
const NFS_VERS: u32 = nfs::nfs3::VERSION;
const READ: u32 = nfs::nfs3::proc_::READ;
const LOOKUP: u32 = nfs::nfs3::proc_::LOOKUP;

/// Run case `id` if it is one of this file's.
pub async fn run(ctx: &mut Ctx, id: &str) -> Option<Verdict> {
    if !CASES.iter().any(|c| c.id == id) {
        return None;
    }
    if let Some(why) = &ctx.facts.nfs_missing {
        return Some(na(why.clone()));
    }
    Some(match id {
        "nfs-read-write-chunk" => read_write_chunk(ctx).await,
        "nfs-read-roundup" => read_roundup(ctx).await,
        "nfs-read-reply-chunk" => read_reply_chunk(ctx).await.map_or_else(fail, |(v, _)| v),
        "nfs-unused-write-chunk" => unused_write_chunk(ctx).await,
        "nfs-reply-chunk-length" => reply_chunk_length(ctx).await,
        _ => return None,
    })
}

/// MOUNT the export over TCP and LOOKUP the file over `link` (inline): the handles the cases
/// use. Failures leave the reason in `facts.nfs_missing`.
pub async fn discover(ctx: &mut Ctx, link: &mut Link) {
    let Some(t) = ctx.cfg.nfs.clone() else { return };
    let tcp = match tokio::time::timeout(ctx.cfg.wait, oncrpc::TcpClient::connect(t.mount)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            ctx.facts.nfs_missing = Some(format!("MOUNT at {}: {e}", t.mount));
            return;
        }
        Err(_) => {
            ctx.facts.nfs_missing = Some(format!("MOUNT at {}: connect timed out", t.mount));
            return;
        }
    };
    let tcp: Arc<dyn oncrpc::RpcTransport> = Arc::new(tcp);
    let m = nfs::client::MountClient::new(tcp);
    let root = match tokio::time::timeout(ctx.cfg.wait, m.mnt(&t.export)).await {
        Ok(Ok(fh)) => fh.0.to_vec(),
        Ok(Err(e)) => {
            ctx.facts.nfs_missing = Some(format!("MNT {}: {e}", t.export));
            return;
        }
        Err(_) => {
            ctx.facts.nfs_missing = Some(format!("MNT {}: timed out", t.export));
            return;
        }
    };
    ctx.facts.nfs_root = Some(root.clone());
    let Some(name) = t.file else { return };
    let xid = ctx.xid();
    let call = msg::rpc_call(
        xid,
        NFS_PROG,
        NFS_VERS,
        LOOKUP,
        true,
        &nfs3::lookup_args(&root, name.as_bytes()),
    );
    let m = msg::v1(xid, ctx.cfg.credits, Body::Msg(Chunks::default()), &call);
    let r = match ctx.exchange(link, m).await {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("conform: LOOKUP {name}: {e}");
            return;
        }
    };
    let looked = msg::decode_v1(&r)
        .and_then(|(_, p)| msg::rpc_reply(&p, xid))
        .and_then(|(_, res)| nfs3::lookup_res(&res));
    match looked {
        Ok((fh, Some((1, size)))) => ctx.facts.nfs_file = Some((fh, size)),
        Ok((_, a)) => tracing::warn!("conform: {name} is not a regular file ({a:?})"),
        Err(e) => tracing::warn!("conform: LOOKUP {name}: {e}"),
    }
}

/// The file to READ, at least `need` bytes long.
fn file(ctx: &Ctx, need: u64) -> Result<Vec<u8>, Verdict> {
    match &ctx.facts.nfs_file {
        Some((fh, size)) if *size >= need => Ok(fh.clone()),
        Some((_, size)) => Err(na(format!(
            "the file has {size} bytes, the case needs {need}"
        ))),
        None => Err(na("no readable regular file (--nfs-file) was found")),
    }
}

/// A READ call on a fresh connection with `chunks`; the reply's header and inline stream.
async fn read(
    ctx: &Ctx,
    l: &mut Link,
    fh: &[u8],
    count: u32,
    chunks: Chunks,
) -> Result<(u32, Header, Bytes), String> {
    let xid = ctx.xid();
    let call = msg::rpc_call(
        xid,
        NFS_PROG,
        NFS_VERS,
        READ,
        true,
        &nfs3::read_args(fh, 0, count),
    );
    let m = msg::v1(xid, ctx.cfg.credits, Body::Msg(chunks), &call);
    let r = ctx.exchange(l, m).await?;
    let (h, p) = msg::decode_v1(&r).map_err(|e| format!("{e}: {}", msg::describe(&r)))?;
    if h.xid != xid {
        return Err(format!("reply XID {:#010x}, call's {xid:#010x}", h.xid));
    }
    Ok((xid, h, p))
}

fn write_list(h: &Header) -> Result<&Chunks, String> {
    match &h.body {
        Body::Msg(c) | Body::NoMsg(c) => Ok(c),
        b => Err(format!("rdma_proc {} in reply to READ", b.proc_())),
    }
}

fn total(c: &[Segment]) -> u64 {
    c.iter().map(|s| u64::from(s.length)).sum()
}

async fn read_write_chunk(ctx: &mut Ctx) -> Verdict {
    const COUNT: u32 = 8192;
    let fh = match file(ctx, u64::from(COUNT)) {
        Ok(f) => f,
        Err(v) => return v,
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let v = async {
        let sink = l.sink(COUNT as usize).map_err(|e| e.to_string())?;
        let chunks = Chunks {
            writes: vec![vec![segment(&sink, COUNT)]],
            ..Chunks::default()
        };
        let (xid, h, p) = read(ctx, &mut l, &fh, COUNT, chunks).await?;
        let c = write_list(&h)?;
        if !matches!(h.body, Body::Msg(_)) {
            return Err("expected RDMA_MSG".to_string());
        }
        let (rh, res) = msg::rpc_reply(&p, xid)?;
        if !msg::is_success(&rh) {
            return Err(format!("RPC reply {rh:?}"));
        }
        let rr = nfs3::read_res(&res)?;
        if rr.status != 0 {
            return Err(format!("READ status {}", rr.status));
        }
        //= specs/rfc8166.txt#section-4.3.2
        //# When a Requester provides a Write list, the Responder MUST push data corresponding
        //# to DDP-eligible result data items to Requester memory referenced in the Write list.
        if rr.inline_after_len != 0 {
            return Err(format!(
                "{} bytes of the Payload stream follow the data's length: the data (or its \
                 padding) is inline although a Write chunk was given",
                rr.inline_after_len
            ));
        }
        let [wc] = c.writes.as_slice() else {
            return Err(format!("{} Write chunks returned, 1 given", c.writes.len()));
        };
        if wc.first().map(|s| s.handle) != Some(sink.rkey()) {
            return Err(format!("the returned chunk names {wc:?}, not our segment"));
        }
        if total(wc) != u64::from(rr.data_len) || rr.data_len != rr.count {
            return Err(format!(
                "chunk length {}, READ count {}, data length {}",
                total(wc),
                rr.count,
                rr.data_len
            ));
        }
        // The same bytes through a Long Reply, to check what was placed.
        let (_, inline) = read_reply_chunk_data(ctx, &mut l, &fh, COUNT).await?;
        let placed = sink.read(0, rr.data_len as usize).map_err(|e| e.to_string())?;
        if placed != inline {
            return Err("the Write chunk's bytes differ from the same READ in a Reply chunk".into());
        }
        Ok(format!(
            "{} bytes in the Write chunk, same as in a Reply chunk; nothing after the length inline",
            rr.data_len
        ))
    }
    .await;
    l.close().await;
    v.map_or_else(fail, pass)
}

async fn read_roundup(ctx: &mut Ctx) -> Verdict {
    const COUNT: u32 = 1001;
    let fh = match file(ctx, u64::from(COUNT)) {
        Ok(f) => f,
        Err(v) => return v,
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let v = async {
        // Room for the padding, filled with a marker the server must leave alone.
        let sink = l.sink(1004).map_err(|e| e.to_string())?;
        sink.write(0, &[0xee; 1004]).map_err(|e| e.to_string())?;
        let chunks = Chunks {
            writes: vec![vec![segment(&sink, 1004)]],
            ..Chunks::default()
        };
        let (xid, h, p) = read(ctx, &mut l, &fh, COUNT, chunks).await?;
        let c = write_list(&h)?;
        let (_, res) = msg::rpc_reply(&p, xid)?;
        let rr = nfs3::read_res(&res)?;
        if rr.status != 0 || rr.count != COUNT {
            return Err(format!("READ status {} count {}", rr.status, rr.count));
        }
        let [wc] = c.writes.as_slice() else {
            return Err(format!("{} Write chunks returned, 1 given", c.writes.len()));
        };
        //= specs/rfc8166.txt#section-3.4.6.2
        //# A Responder MUST NOT write XDR roundup padding into a Write chunk, even if the
        //# Requester made space available for it.  Therefore, when returning a single
        //# variable-length result data item, a returned Write chunk's total length MUST be the
        //# same as the encoded length of the result data item.
        if total(wc) != u64::from(COUNT) {
            return Err(format!(
                "returned Write chunk length {}, data {COUNT}",
                total(wc)
            ));
        }
        let tail = sink.read(COUNT as usize, 3).map_err(|e| e.to_string())?;
        if tail[..] != [0xee; 3] {
            return Err(format!(
                "the 3 bytes after the data were written: {tail:02x?}"
            ));
        }
        Ok(format!("chunk length {COUNT}; the padding room untouched"))
    }
    .await;
    l.close().await;
    v.map_or_else(fail, pass)
}

/// READ `count` bytes with no Write list and a Reply chunk: checks the Long Reply, returns
/// the header and the data bytes.
async fn read_reply_chunk_data(
    ctx: &Ctx,
    l: &mut Link,
    fh: &[u8],
    count: u32,
) -> Result<(String, Bytes), String> {
    let room = count + 1024;
    let sink = l.sink(room as usize).map_err(|e| e.to_string())?;
    let chunks = Chunks {
        reply: Some(vec![segment(&sink, room)]),
        ..Chunks::default()
    };
    let (xid, h, inline) = read(ctx, l, fh, count, chunks).await?;
    let c = write_list(&h)?;
    //= specs/rfc8166.txt#section-3.5.3
    //# If a Reply chunk was provided and the reduced Payload stream is larger than the reply
    //# inline threshold, the Responder MUST use the Requester-provided Reply chunk for the
    //# reply.
    if !matches!(h.body, Body::NoMsg(_)) {
        return Err(format!(
            "a {count}-byte READ reply over our {}-byte inline threshold came as rdma_proc {} \
             ({} bytes inline)",
            l.recv_size(),
            h.body.proc_(),
            inline.len()
        ));
    }
    //= specs/rfc8166.txt#section-4.3.3
    //# When a Requester provides a Reply chunk in an RPC Call message, the Responder MUST copy
    //# that chunk into the Transport header of the RPC Reply message.
    let Some(rc) = &c.reply else {
        return Err("RDMA_NOMSG reply without a Reply chunk".into());
    };
    if rc.first().map(|s| s.handle) != Some(sink.rkey()) {
        return Err(format!("the Reply chunk returned is {rc:?}, not ours"));
    }
    let len = total(rc) as usize;
    if len > room as usize {
        return Err(format!(
            "Reply chunk length {len} exceeds the {room} offered"
        ));
    }
    let stream = sink.read(0, len).map_err(|e| e.to_string())?;
    let (rh, res) = msg::rpc_reply(&stream, xid)?;
    if !msg::is_success(&rh) {
        return Err(format!("RPC reply {rh:?}"));
    }
    let rr = nfs3::read_res(&res)?;
    if rr.status != 0 || rr.count != count {
        return Err(format!("READ status {} count {}", rr.status, rr.count));
    }
    let data_at = res.len() - rr.inline_after_len;
    let data = res.slice(data_at..data_at + (rr.data_len as usize).min(rr.inline_after_len));
    Ok((format!("Reply chunk of {len} bytes"), data))
}

async fn read_reply_chunk(ctx: &mut Ctx) -> Result<(Verdict, ()), String> {
    let fh = match file(ctx, 4000) {
        Ok(f) => f,
        Err(v) => return Ok((v, ())),
    };
    let mut l = ctx.connect().await?;
    let r = read_reply_chunk_data(ctx, &mut l, &fh, 4000).await;
    l.close().await;
    let (what, data) = r?;
    if data.len() != 4000 {
        return Err(format!(
            "{} data bytes in the Reply chunk, 4000 read",
            data.len()
        ));
    }
    Ok((pass(format!("{what}, RDMA_NOMSG, 4000 data bytes")), ()))
}

async fn unused_write_chunk(ctx: &mut Ctx) -> Verdict {
    let Some(root) = ctx.facts.nfs_root.clone() else {
        return na("no root handle");
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let v = async {
        let sink = l.sink(4096).map_err(|e| e.to_string())?;
        let chunks = Chunks {
            writes: vec![vec![segment(&sink, 4096)]],
            ..Chunks::default()
        };
        // READ of a directory: an error result, whose arm has no data.
        let (xid, h, p) = read(ctx, &mut l, &root, 4096, chunks).await?;
        let c = write_list(&h)?;
        let (_, res) = msg::rpc_reply(&p, xid)?;
        let rr = nfs3::read_res(&res)?;
        if rr.status == 0 {
            return Ok(na("READ of the root directory succeeded: no unused chunk to see"));
        }
        //= specs/rfc8166.txt#section-4.3.2.2
        //# If this is the last or only Write chunk available and it remains unconsumed, the
        //# Responder MUST return this Write chunk as an unused Write chunk (see Section 3.4.6).
        //# The Responder sets the segment count to a value matching the Requester-provided
        //# Write chunk, but returns only empty segments in that Write chunk.
        match c.writes.as_slice() {
            [wc] if wc.len() == 1 && total(wc) == 0 => Ok(pass(format!(
                "READ status {}; Write chunk returned with 1 empty segment",
                rr.status
            ))),
            w => Err(format!(
                "READ status {}; Write list returned {w:?}, expected one chunk of one empty segment",
                rr.status
            )),
        }
    }
    .await;
    l.close().await;
    v.unwrap_or_else(fail)
}

async fn reply_chunk_length(ctx: &mut Ctx) -> Verdict {
    const COUNT: u32 = 1001;
    let fh = match file(ctx, u64::from(COUNT)) {
        Ok(f) => f,
        Err(v) => return v,
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let v = async {
        let data = l.sink(1004).map_err(|e| e.to_string())?;
        let reply = l.sink(2048).map_err(|e| e.to_string())?;
        let chunks = Chunks {
            writes: vec![vec![segment(&data, 1004)]],
            reply: Some(vec![segment(&reply, 2048)]),
            ..Chunks::default()
        };
        let (xid, h, inline) = read(ctx, &mut l, &fh, COUNT, chunks).await?;
        let c = write_list(&h)?;
        let stream = match (&h.body, &c.reply) {
            (Body::NoMsg(_), Some(rc)) => {
                let len = total(rc) as usize;
                if len > 2048 {
                    return Err(format!("Reply chunk length {len}, 2048 offered"));
                }
                reply.read(0, len).map_err(|e| e.to_string())?
            }
            (Body::Msg(_), _) => inline,
            _ => return Err("RDMA_NOMSG without a Reply chunk".into()),
        };
        let (_, res) = msg::rpc_reply(&stream, xid)?;
        let rr = nfs3::read_res(&res)?;
        if rr.status != 0 || rr.count != COUNT {
            return Err(format!("READ status {} count {}", rr.status, rr.count));
        }
        //= specs/rfc8166.txt#section-4.3.3
        //# As with Write chunks, the Responder modifies the copied Reply chunk in the RPC Reply
        //# message to reflect the actual amount of data that is being returned in the Reply
        //# chunk.
        if rr.inline_after_len != 0 {
            return Err(format!(
                "the reply stream has {} bytes after the READ result's last field ({} in all): \
                 the Reply chunk's length counts bytes that went to the Write chunk",
                rr.inline_after_len,
                stream.len()
            ));
        }
        Ok(format!(
            "{} with a {}-byte stream, ending at the READ result",
            if matches!(h.body, Body::NoMsg(_)) {
                "Reply chunk"
            } else {
                "inline reply"
            },
            stream.len()
        ))
    }
    .await;
    l.close().await;
    v.map_or_else(fail, pass)
}
