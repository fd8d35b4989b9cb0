//! Version 1 cases (RFC 8166, RFC 8797): credits, the message forms, the inline threshold,
//! the errors a malformed header must get and the messages a Responder must discard.

use std::collections::HashSet;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use rpcrdma::header::{Body, Chunks, ERR_CHUNK, ERR_VERS, RDMA_ERROR, RDMA_MSG, ReadSegment};

use super::link::segment;
use super::msg::{self, fixed};
use super::{CaseInfo, Ctx, Link, Received, Verdict, fail, na, pass};

pub const CASES: &[CaseInfo] = &[
    CaseInfo {
        id: "v1-short-msg",
        cite: "RFC 8166 §4.2.1, §4.3.1",
        title: "RDMA_MSG call answered in version 1 with the call's XID, Read list empty",
    },
    CaseInfo {
        id: "v1-credit-grant",
        cite: "RFC 8166 §3.3.1",
        title: "the granted credit value is never zero",
    },
    CaseInfo {
        id: "v1-credit-window",
        cite: "RFC 8166 §3.3.1",
        title: "as many calls as granted, sent back to back, are all answered",
    },
    CaseInfo {
        id: "v1-inline-1024",
        cite: "RFC 8166 §3.3.3",
        title: "a 1024-byte call is received (receivers MUST support 1024-byte inline)",
    },
    CaseInfo {
        id: "v1-privdata",
        cite: "RFC 8797 §4",
        title: "private data well formed; a call of the advertised receive size is received",
    },
    CaseInfo {
        id: "v1-long-call",
        cite: "RFC 8166 §3.5.3",
        title: "RDMA_NOMSG call in a Position-Zero Read chunk is answered",
    },
    CaseInfo {
        id: "v1-err-vers",
        cite: "RFC 8166 §4.5.1, §4.5",
        title: "rdma_vers 7 gets RDMA_ERROR/ERR_VERS with a range holding 1, XID and vers copied",
    },
    CaseInfo {
        id: "v1-err-chunk-proc",
        cite: "RFC 8166 §4.5.2",
        title: "an unknown rdma_proc gets RDMA_ERROR/ERR_CHUNK",
    },
    CaseInfo {
        id: "v1-err-chunk-nomsg",
        cite: "RFC 8166 §4.5.2",
        title: "RDMA_NOMSG with no chunks gets RDMA_ERROR/ERR_CHUNK",
    },
    CaseInfo {
        id: "v1-err-chunk-truncated",
        cite: "RFC 8166 §4.5.2",
        title: "a header cut inside its Read list gets RDMA_ERROR/ERR_CHUNK",
    },
    CaseInfo {
        id: "v1-err-chunk-xid",
        cite: "RFC 8166 §4.5.2",
        title: "rdma_xid different from the RPC XID gets RDMA_ERROR/ERR_CHUNK",
    },
    CaseInfo {
        id: "v1-discard-short",
        cite: "RFC 8166 §4.5",
        title: "a message shorter than 28 bytes is silently discarded",
    },
    CaseInfo {
        id: "v1-discard-error",
        cite: "RFC 8166 §4.2.4",
        title: "an RDMA_ERROR from the requester is silently discarded",
    },
    CaseInfo {
        id: "v1-discard-done",
        cite: "RFC 8166 §4.6.2",
        title: "RDMA_DONE is silently discarded",
    },
];

/// Run case `id` if it is one of this file's.
pub async fn run(ctx: &mut Ctx, id: &str) -> Option<Verdict> {
    Some(match id {
        "v1-short-msg" => short_msg(ctx).await,
        "v1-credit-grant" => credit_grant(ctx).await,
        "v1-credit-window" => credit_window(ctx).await,
        "v1-inline-1024" => inline_size(ctx, None).await,
        "v1-privdata" => privdata(ctx).await,
        "v1-long-call" => long_call(ctx).await,
        "v1-err-vers" => err_vers(ctx).await,
        "v1-err-chunk-proc" => err_chunk(ctx, Malformed::Proc).await,
        "v1-err-chunk-nomsg" => err_chunk(ctx, Malformed::EmptyNomsg).await,
        "v1-err-chunk-truncated" => err_chunk(ctx, Malformed::Truncated).await,
        "v1-err-chunk-xid" => err_chunk(ctx, Malformed::XidMismatch).await,
        "v1-discard-short" => discard(ctx, Discarded::Short).await,
        "v1-discard-error" => discard(ctx, Discarded::Error).await,
        "v1-discard-done" => discard(ctx, Discarded::Done).await,
        _ => return None,
    })
}

/// A NULL call in an RDMA_MSG.
fn null_msg(ctx: &Ctx, xid: u32) -> Bytes {
    msg::v1(
        xid,
        ctx.cfg.credits,
        Body::Msg(Chunks::default()),
        &ctx.null_call(xid),
    )
}

/// Check a version 1 reply to a call of `xid`: header decodes, version 1, the XID, a
/// nonzero grant, Read list empty, and an RPC reply with the same XID inline (RDMA_MSG).
fn check_reply(r: &Bytes, xid: u32) -> Result<(), String> {
    let (h, payload) = msg::decode_v1(r).map_err(|e| format!("{e}: {}", msg::describe(r)))?;
    if h.xid != xid {
        return Err(format!(
            "reply rdma_xid {:#010x}, call's {xid:#010x}",
            h.xid
        ));
    }
    if h.credits == 0 {
        return Err("reply grants zero credits".into());
    }
    match &h.body {
        Body::Msg(c) => {
            //= specs/rfc8166.txt#section-4.3.1
            //# Responders MUST leave the Read list empty in all replies.
            if !c.reads.is_empty() {
                return Err("the reply's Read list is not empty".into());
            }
            msg::rpc_reply(&payload, xid).map(|_| ())
        }
        b => Err(format!(
            "expected RDMA_MSG, got rdma_proc {} ({})",
            b.proc_(),
            msg::describe(r)
        )),
    }
}

async fn short_msg(ctx: &mut Ctx) -> Verdict {
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let v = match ctx.exchange(&mut l, null_msg(ctx, xid)).await {
        Ok(r) => match check_reply(&r, xid) {
            Ok(()) => pass(format!("NULL answered: {}", msg::describe(&r))),
            Err(e) => fail(e),
        },
        Err(e) => fail(e),
    };
    l.close().await;
    v
}

async fn credit_grant(ctx: &mut Ctx) -> Verdict {
    //= specs/rfc8166.txt#section-3.3.1
    //# The granted value MUST NOT be zero, since such a value would result in deadlock.
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    // Ask for one credit, then for zero: the grant must stay at least one either way.
    let mut seen = Vec::new();
    for asked in [1, 0] {
        let xid = ctx.xid();
        let m = msg::v1(
            xid,
            asked,
            Body::Msg(Chunks::default()),
            &ctx.null_call(xid),
        );
        match ctx.exchange(&mut l, m).await {
            Ok(r) => match fixed(&r) {
                Some(f) if f.credits == 0 => {
                    l.close().await;
                    return fail(format!("asked {asked}, granted 0"));
                }
                Some(f) => seen.push((asked, f.credits)),
                None => {
                    l.close().await;
                    return fail(format!("reply of {} bytes", r.len()));
                }
            },
            Err(e) => {
                l.close().await;
                return fail(format!("asked {asked}: {e}"));
            }
        }
    }
    l.close().await;
    pass(
        seen.iter()
            .map(|(a, g)| format!("asked {a}, granted {g}"))
            .collect::<Vec<_>>()
            .join("; "),
    )
}

async fn credit_window(ctx: &mut Ctx) -> Verdict {
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    // One call first (RFC 8166 §3.3.3: assume one credit until a reply grants more).
    let xid = ctx.xid();
    let grant = match ctx.exchange(&mut l, null_msg(ctx, xid)).await {
        Ok(r) => match fixed(&r) {
            Some(f) => f.credits,
            None => return fail("first reply too short"),
        },
        Err(e) => return fail(e),
    };
    // Never more outstanding than granted, nor than we asked or can receive.
    let n = grant.min(ctx.cfg.credits).min(32) as usize;
    if n < 2 {
        l.close().await;
        return na(format!("granted {grant}: no window to fill"));
    }
    let xids: Vec<u32> = (0..n).map(|_| ctx.xid()).collect();
    let burst = xids.iter().map(|&x| null_msg(ctx, x)).collect();
    if let Err(e) = l.send_burst(burst, ctx.cfg.wait).await {
        l.close().await;
        return fail(format!("sending {n} calls: {e}"));
    }
    let mut want: HashSet<u32> = xids.iter().copied().collect();
    while !want.is_empty() {
        match ctx.next(&mut l).await {
            Ok(r) => {
                let Some(f) = fixed(&r) else {
                    l.close().await;
                    return fail("a reply shorter than the fixed header");
                };
                if let Err(e) = check_reply(&r, f.xid) {
                    l.close().await;
                    return fail(e);
                }
                if !want.remove(&f.xid) {
                    l.close().await;
                    return fail(format!("a reply for XID {:#010x}, not outstanding", f.xid));
                }
            }
            Err(e) => {
                l.close().await;
                return fail(format!("{} of {n} calls unanswered: {e}", want.len()));
            }
        }
    }
    l.close().await;
    pass(format!(
        "granted {grant}; {n} calls in flight, all answered"
    ))
}

/// A NULL call padded with arguments to exactly `size` bytes (transport header included).
/// Servers may refuse the arguments (GARBAGE_ARGS): any RPC reply proves the receive.
fn padded_null(ctx: &Ctx, xid: u32, size: usize) -> Option<Bytes> {
    let base = msg::v1(xid, ctx.cfg.credits, Body::Msg(Chunks::default()), &[]).len()
        + ctx.null_call(xid).len();
    let extra = size.checked_sub(base)?;
    if extra % 4 != 0 {
        return None;
    }
    let mut call = BytesMut::from(&ctx.null_call(xid)[..]);
    call.put_bytes(0, extra);
    Some(msg::v1(
        xid,
        ctx.cfg.credits,
        Body::Msg(Chunks::default()),
        &call,
    ))
}

async fn inline_size(ctx: &mut Ctx, size: Option<u32>) -> Verdict {
    let size = size.unwrap_or(1024) as usize;
    let xid = ctx.xid();
    let Some(m) = padded_null(ctx, xid, size) else {
        return na(format!("cannot build a {size}-byte call"));
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let v = match ctx.exchange(&mut l, m).await {
        Ok(r) => match msg::decode_v1(&r) {
            Ok((h, p)) if h.xid == xid && h.body.proc_() == RDMA_MSG => {
                match msg::rpc_reply(&p, xid) {
                    Ok((rh, _)) => pass(format!(
                        "{size}-byte call answered ({})",
                        msg::stat_name(&rh)
                    )),
                    Err(e) => fail(e),
                }
            }
            _ => fail(format!("{size}-byte call: {}", msg::describe(&r))),
        },
        Err(e) => fail(format!("{size}-byte call: {e}")),
    };
    l.close().await;
    v
}

async fn privdata(ctx: &mut Ctx) -> Verdict {
    let Some(p) = ctx.facts.peer_private else {
        return if ctx.facts.peer_private_len == 0 {
            na("the server sent no private data (RFC 8797 is optional: 1024 bytes both ways)")
        } else {
            na(format!(
                "the server's {} bytes of private data are not RFC 8797 (wrong magic or version)",
                ctx.facts.peer_private_len
            ))
        };
    };
    let cap = 64 * 1024;
    let size = p.recv_size.min(cap);
    let (o, d) = inline_size(ctx, Some(size)).await;
    let desc = format!(
        "send {} recv {} remote-invalidate {}",
        p.send_size, p.recv_size, p.remote_invalidate
    );
    (o, format!("{desc}; {d}"))
}

async fn long_call(ctx: &mut Ctx) -> Verdict {
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let call = ctx.null_call(xid);
    let len = call.len() as u32;
    let src = match l.source(call) {
        Ok(m) => m,
        Err(e) => return fail(e.to_string()),
    };
    //= specs/rfc8166.txt#section-3.5.3
    //# Every RDMA read segment in this chunk MUST contain zero in its Position field.
    let chunks = Chunks {
        reads: vec![ReadSegment {
            position: 0,
            target: segment(&src, len),
        }],
        ..Chunks::default()
    };
    let m = msg::v1(xid, ctx.cfg.credits, Body::NoMsg(chunks), &[]);
    let v = match ctx.exchange(&mut l, m).await {
        Ok(r) => match check_reply(&r, xid) {
            Ok(()) => pass(format!("Long Call answered: {}", msg::describe(&r))),
            Err(e) => fail(e),
        },
        Err(e) => fail(e),
    };
    l.close().await;
    v
}

/// Check an RDMA_ERROR answer: XID and version copied (RFC 8166 §4.5), the error code.
fn check_error(r: &Bytes, xid: u32, vers: u32, want: u32) -> Result<Option<(u32, u32)>, String> {
    let f = fixed(r).ok_or_else(|| format!("a reply of {} bytes", r.len()))?;
    if f.proc_ != RDMA_ERROR {
        return Err(format!("expected RDMA_ERROR, got {}", msg::describe(r)));
    }
    let (err, range) = msg::error_body(r).ok_or("RDMA_ERROR without rdma_err")?;
    //= specs/rfc8166.txt#section-4.5
    //# The rdma_xid field MUST contain the same XID that was in the rdma_xid field in the
    //# failing request;
    if f.xid != xid {
        return Err(format!(
            "rdma_xid {:#010x}, the request's {xid:#010x}",
            f.xid
        ));
    }
    //= specs/rfc8166.txt#section-4.5
    //# The rdma_vers field MUST contain the same version that was in the rdma_vers field in
    //# the failing request;
    if f.vers != vers {
        return Err(format!(
            "rdma_vers {}, the request's {vers} ({})",
            f.vers,
            msg::describe(r)
        ));
    }
    if err != want {
        return Err(format!(
            "rdma_err {err}, expected {want} ({})",
            msg::describe(r)
        ));
    }
    Ok(range)
}

async fn err_vers(ctx: &mut Ctx) -> Verdict {
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let mut m = BytesMut::from(&null_msg(ctx, xid)[..]);
    m[4..8].copy_from_slice(&7u32.to_be_bytes());
    let v = match ctx.exchange(&mut l, m.freeze()).await {
        Ok(r) => match check_error(&r, xid, 7, ERR_VERS) {
            Ok(Some((lo, hi))) if lo <= 1 && 1 <= hi && lo <= hi => {
                pass(format!("ERR_VERS {lo}..{hi}"))
            }
            Ok(range) => fail(format!("ERR_VERS range {range:?} does not hold version 1")),
            Err(e) => fail(e),
        },
        Err(e) => fail(e),
    };
    l.close().await;
    v
}

#[derive(Debug, Clone, Copy)]
enum Malformed {
    Proc,
    EmptyNomsg,
    Truncated,
    XidMismatch,
}

async fn err_chunk(ctx: &mut Ctx, what: Malformed) -> Verdict {
    let xid = ctx.xid();
    let credits = ctx.cfg.credits;
    let m = match what {
        Malformed::Proc => {
            let mut b = BytesMut::from(&null_msg(ctx, xid)[..]);
            b[12..16].copy_from_slice(&9u32.to_be_bytes());
            b.freeze()
        }
        Malformed::EmptyNomsg => msg::v1(xid, credits, Body::NoMsg(Chunks::default()), &[]),
        Malformed::Truncated => {
            // A Read list entry with its position, handle and length but no offset: 32
            // bytes, above the 28-byte minimum, so it must not be discarded as too short.
            let mut b = BytesMut::new();
            for w in [xid, 1, credits, 0, 1, 0, 0x1234_5678, 64] {
                b.put_u32(w);
            }
            b.freeze()
        }
        Malformed::XidMismatch => {
            let call = ctx.null_call(xid ^ 0x5a5a_0000);
            msg::v1(xid, credits, Body::Msg(Chunks::default()), &call)
        }
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let v = match ctx.exchange(&mut l, m).await {
        Ok(r) => match check_error(&r, xid, 1, ERR_CHUNK) {
            Ok(_) => pass(format!("ERR_CHUNK: {}", msg::describe(&r))),
            Err(e) => fail(e),
        },
        Err(e) => fail(e),
    };
    l.close().await;
    v
}

#[derive(Debug, Clone, Copy)]
enum Discarded {
    Short,
    Error,
    Done,
}

/// Send something the Responder must drop without a word, then a NULL call: the first
/// message back must be the NULL's reply.
async fn discard(ctx: &mut Ctx, what: Discarded) -> Verdict {
    let bad_xid = ctx.xid();
    let m = match what {
        //= specs/rfc8166.txt#section-4.5
        //# If an incoming RPC-over-RDMA message is not as long as a minimal size RPC-over-RDMA
        //# header (28 bytes), the receiver cannot trust the value of the XID field; therefore,
        //# it MUST silently discard the message before performing any parsing.
        Discarded::Short => {
            let mut b = BytesMut::new();
            for w in [bad_xid, 1, ctx.cfg.credits, 0, 0] {
                b.put_u32(w);
            }
            b.freeze()
        }
        //= specs/rfc8166.txt#section-4.2.4
        //# A Responder MUST silently discard RDMA_ERROR procedures.
        Discarded::Error => msg::v1(
            bad_xid,
            ctx.cfg.credits,
            Body::Error(rpcrdma::header::ErrorBody::Chunk),
            &[0; 12],
        ),
        //= specs/rfc8166.txt#section-4.6.2
        //# Receivers MUST silently discard RDMA_DONE messages.
        Discarded::Done => msg::v1(bad_xid, ctx.cfg.credits, Body::Done, &[0; 12]),
    };
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if let Err(e) = l.send(m, ctx.cfg.wait).await {
        l.close().await;
        return fail(format!("send: {e}"));
    }
    // Anything within a short while is an answer to the discarded message (with a nudge,
    // as in `Ctx::next`, so that a server that has not read it yet gets to).
    let quiet = Duration::from_millis(300).min(ctx.cfg.wait);
    let mut r = l.recv(quiet).await;
    if matches!(r, Ok(Received::Timeout)) {
        if let Err(e) = l.nudge() {
            l.close().await;
            return fail(format!("nudge: {e}"));
        }
        r = l.recv(quiet).await;
    }
    let v = match r {
        Ok(Received::Msg(r)) => fail(format!("answered: {}", msg::describe(&r))),
        Ok(Received::Failed(s)) => fail(format!("the connection broke ({s:?})")),
        Err(e) => fail(e.to_string()),
        Ok(Received::Timeout) => {
            let xid = ctx.xid();
            match ctx.exchange(&mut l, null_msg(ctx, xid)).await {
                Ok(r) => match check_reply(&r, xid) {
                    Ok(()) => pass("no answer; the next call on the connection was answered"),
                    Err(e) => fail(format!("after it: {e}")),
                },
                Err(e) => fail(format!("the call after it: {e}")),
            }
        }
    };
    l.close().await;
    v
}

/// Whether a link still answers a NULL call (used after cases that may break it).
pub async fn still_answers(ctx: &Ctx, l: &mut Link) -> bool {
    let xid = ctx.xid();
    matches!(ctx.exchange(l, null_msg(ctx, xid)).await, Ok(r) if check_reply(&r, xid).is_ok())
}
