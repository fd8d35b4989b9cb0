//! Version 2 cases (draft-cel-nfsv4-rpcrdma-version-two-05): the probe and its answer, replies
//! in the caller's version, the 4096-byte inline threshold, RDMA2_CONNPROP, and the version 2
//! errors. A server that answers the probe with ERR_VERS for version 1 only makes every case
//! but the probe not applicable.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use rpcrdma::header::{Chunks, ReadSegment};
use rpcrdma::header_v2::{Body2, Direction, Header2, RDMA2_CONNPROP, err};
use rpcrdma::props::{ConnProp, PropSet, PropSubset, PropVal};

use super::link::segment;
use super::msg::{self, fixed};
use super::{CaseInfo, Ctx, Link, Received, Verdict, fail, na, pass};

pub const CASES: &[CaseInfo] = &[
    CaseInfo {
        id: "v2-probe",
        cite: "cel-05 §8, §8.1, §8.2",
        title: "a version 2 call as first message gets a version 2 reply or ERR_VERS, same XID",
    },
    CaseInfo {
        id: "v2-reply-version",
        cite: "cel-05 §8.3, §7.2.2",
        title: "version 2 calls get version 2 replies with direction REPLY",
    },
    CaseInfo {
        id: "v2-inline-4096",
        cite: "cel-05 §3.3",
        title: "a 4096-byte version 2 call is received",
    },
    CaseInfo {
        id: "v2-long-call",
        cite: "cel-05 §7.2.1; RFC 8166 §3.5.3",
        title: "RDMA2_NOMSG call in a Position-Zero Read chunk is answered",
    },
    CaseInfo {
        id: "v2-connprop",
        cite: "cel-05 §6.3, §6.3.1",
        title: "RDMA2_CONNPROP is taken (or refused with INVAL_OPTION) and the connection goes on",
    },
    CaseInfo {
        id: "v2-err-vers",
        cite: "cel-05 §7.2.4",
        title: "rdma_vers 3 gets RDMA2_ERR_VERS with a range holding 2",
    },
    CaseInfo {
        id: "v2-err-inval-proc",
        cite: "cel-05 §7.2.4",
        title: "an unknown version 2 rdma_proc gets RDMA2_ERR_INVAL_PROC, XID and vers copied",
    },
    CaseInfo {
        id: "v2-err-bad-xdr",
        cite: "cel-05 §7.2.4",
        title: "a version 2 header cut inside its Read list gets RDMA2_ERR_BAD_XDR",
    },
];

/// Run case `id` if it is one of this file's.
pub async fn run(ctx: &mut Ctx, id: &str) -> Option<Verdict> {
    if id != "v2-probe" && id.starts_with("v2-") && !ctx.facts.v2 {
        return Some(na(match ctx.facts.v2_range {
            Some((lo, hi)) => format!("the server supports versions {lo}..{hi} only"),
            None => "the version 2 probe was not answered in version 2".into(),
        }));
    }
    Some(match id {
        "v2-probe" => probe(ctx).await,
        "v2-reply-version" => reply_version(ctx).await,
        "v2-inline-4096" => inline_4096(ctx).await,
        "v2-long-call" => long_call(ctx).await,
        "v2-connprop" => connprop(ctx).await,
        "v2-err-vers" => err_case(ctx, Bad::Vers).await,
        "v2-err-inval-proc" => err_case(ctx, Bad::Proc).await,
        "v2-err-bad-xdr" => err_case(ctx, Bad::Xdr).await,
        _ => return None,
    })
}

fn null_v2(ctx: &Ctx, xid: u32) -> Bytes {
    msg::v2(
        xid,
        ctx.cfg.credits,
        false,
        Chunks::default(),
        &ctx.null_call(xid),
    )
}

/// The next message that is not an RDMA2_CONNPROP (a server may send one at any time after
/// the version is settled, cel-05 §6.3.1); the CONNPROPs skipped are counted.
async fn next_skipping_props(ctx: &Ctx, l: &mut Link, props: &mut u32) -> Result<Bytes, String> {
    loop {
        let r = ctx.next(l).await?;
        match fixed(&r) {
            Some(f) if f.vers == 2 && f.proc_ == RDMA2_CONNPROP => *props += 1,
            _ => return Ok(r),
        }
    }
}

/// A version 2 reply to `xid`: version 2, same XID, direction REPLY, an RPC reply inline.
fn check_v2_reply(r: &Bytes, xid: u32) -> Result<(), String> {
    let (h, payload) = msg::decode_v2(r).map_err(|e| format!("{e}: {}", msg::describe(r)))?;
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
        Body2::Msg(c) => {
            // cel-05 §7.2.2 (the draft is not among duvet's specs/):
            // the value of the rdma_direction field MUST be the same as the value of the
            // associated RPC message's msg_type field.
            if c.direction != Direction::Reply {
                return Err(format!("rdma_direction {:?} on a reply", c.direction));
            }
            msg::rpc_reply(&payload, xid).map(|_| ())
        }
        b => Err(format!("expected RDMA2_MSG, got rdma_proc {}", b.proc_())),
    }
}

/// A fresh connection settled in version 2 (one NULL answered in version 2).
async fn settled(ctx: &Ctx) -> Result<(Link, u32), String> {
    let mut l = ctx.connect().await?;
    let xid = ctx.xid();
    let mut props = 0;
    l.send(null_v2(ctx, xid), ctx.cfg.wait)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let r = next_skipping_props(ctx, &mut l, &mut props).await?;
    check_v2_reply(&r, xid)?;
    Ok((l, props))
}

async fn probe(ctx: &mut Ctx) -> Verdict {
    let mut l = match ctx.connect().await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let m = null_v2(ctx, xid);
    // cel-05 §8 (the draft is not among duvet's specs/):
    // Because the server might support only RPC-over-RDMA version 1, this initial message
    // can be no larger than the version 1 default inline threshold of 1024 bytes.
    debug_assert!(m.len() <= 1024);
    let mut props = 0;
    let v = match l.send(m, ctx.cfg.wait).await {
        Err(e) => fail(format!("send: {e}")),
        Ok(()) => match next_skipping_props(ctx, &mut l, &mut props).await {
            Err(e) => fail(e),
            Ok(r) => match fixed(&r) {
                None => fail(format!("a reply of {} bytes", r.len())),
                Some(f) if f.vers == 2 && f.proc_ != rpcrdma::header_v2::RDMA2_ERROR => {
                    match check_v2_reply(&r, xid) {
                        Ok(()) => {
                            ctx.facts.v2 = true;
                            pass(format!(
                                "answered in version 2 ({props} RDMA2_CONNPROP before it)"
                            ))
                        }
                        Err(e) => fail(e),
                    }
                }
                Some(f) => match msg::error_body(&r) {
                    // cel-05 §8.2 (the draft is not among duvet's specs/):
                    // If the server does not support RPC-over-RDMA version 2, it MUST send an
                    // RPC-over-RDMA message to the client with the same XID, with RDMA2_ERROR
                    // in the rdma_proc field, and with the error code RDMA2_ERR_VERS.
                    Some((err::VERS, Some((lo, hi)))) if f.xid == xid => {
                        ctx.facts.v2_range = Some((lo, hi));
                        if (lo..=hi).contains(&2) {
                            fail(format!(
                                "ERR_VERS {lo}..{hi} names version 2 yet refused it"
                            ))
                        } else {
                            pass(format!(
                                "version 2 refused: ERR_VERS {lo}..{hi} (rdma_vers {})",
                                f.vers
                            ))
                        }
                    }
                    _ => fail(format!(
                        "neither a version 2 reply nor ERR_VERS: {}",
                        msg::describe(&r)
                    )),
                },
            },
        },
    };
    l.close().await;
    v
}

async fn reply_version(ctx: &mut Ctx) -> Verdict {
    let (mut l, mut props) = match settled(ctx).await {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    // cel-05 §8.3 (the draft is not among duvet's specs/):
    // If the server supports the RPC-over-RDMA protocol version used in Call messages from a
    // client, it MUST send Replies with the same RPC-over-RDMA protocol version that the
    // client uses to send its Calls.
    let mut v = pass("");
    for _ in 0..3 {
        let xid = ctx.xid();
        if let Err(e) = l.send(null_v2(ctx, xid), ctx.cfg.wait).await {
            v = fail(format!("send: {e}"));
            break;
        }
        match next_skipping_props(ctx, &mut l, &mut props).await {
            Ok(r) => {
                if let Err(e) = check_v2_reply(&r, xid) {
                    v = fail(e);
                    break;
                }
            }
            Err(e) => {
                v = fail(e);
                break;
            }
        }
    }
    if v.0 == super::Outcome::Pass {
        v.1 = format!("4 calls, 4 version 2 replies ({props} RDMA2_CONNPROP seen)");
    }
    l.close().await;
    v
}

async fn inline_4096(ctx: &mut Ctx) -> Verdict {
    let (mut l, mut props) = match settled(ctx).await {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let base = null_v2(ctx, xid).len();
    let mut call = BytesMut::from(&ctx.null_call(xid)[..]);
    call.put_bytes(0, 4096 - base);
    let m = msg::v2(xid, ctx.cfg.credits, false, Chunks::default(), &call);
    let v = match l.send(m, ctx.cfg.wait).await {
        Err(e) => fail(format!("send: {e}")),
        Ok(()) => match next_skipping_props(ctx, &mut l, &mut props).await {
            Ok(r) => match msg::decode_v2(&r) {
                Ok((h, p)) if h.xid == xid && matches!(h.body, Body2::Msg(_)) => {
                    match msg::rpc_reply(&p, xid) {
                        Ok((rh, _)) => {
                            pass(format!("4096-byte call answered ({})", msg::stat_name(&rh)))
                        }
                        Err(e) => fail(e),
                    }
                }
                _ => fail(format!("4096-byte call: {}", msg::describe(&r))),
            },
            Err(e) => fail(format!("4096-byte call: {e}")),
        },
    };
    l.close().await;
    v
}

async fn long_call(ctx: &mut Ctx) -> Verdict {
    let (mut l, mut props) = match settled(ctx).await {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let call = ctx.null_call(xid);
    let len = call.len() as u32;
    let src = match l.source(call) {
        Ok(m) => m,
        Err(e) => return fail(e.to_string()),
    };
    let chunks = Chunks {
        reads: vec![ReadSegment {
            position: 0,
            target: segment(&src, len),
        }],
        ..Chunks::default()
    };
    let m = msg::v2(xid, ctx.cfg.credits, true, chunks, &[]);
    let v = match l.send(m, ctx.cfg.wait).await {
        Err(e) => fail(format!("send: {e}")),
        Ok(()) => match next_skipping_props(ctx, &mut l, &mut props).await {
            Ok(r) => match check_v2_reply(&r, xid) {
                Ok(()) => pass("Long Call answered in version 2"),
                Err(e) => fail(e),
            },
            Err(e) => fail(e),
        },
    };
    l.close().await;
    v
}

async fn connprop(ctx: &mut Ctx) -> Verdict {
    let (mut l, mut props) = match settled(ctx).await {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let cp = ConnProp {
        start: PropSet(vec![PropVal::rbsiz(l.recv_size())]),
        nochg: PropSubset::from_positions([0]),
    };
    let xid = ctx.xid();
    let m = Header2::new(xid, ctx.cfg.credits, Body2::ConnProp(cp)).to_bytes();
    if let Err(e) = l.send(m, ctx.cfg.wait).await {
        l.close().await;
        return fail(format!("send: {e}"));
    }
    // cel-05 §6.3 (the draft is not among duvet's specs/):
    // RPC-over-RDMA version 2 implementations that receive an operation that is not supported
    // MUST respond with RDMA_ERROR message with an error code of RDMA_ERR_INVAL_OPTION.
    let mut refused = false;
    loop {
        match l.recv(Duration::from_millis(300).min(ctx.cfg.wait)).await {
            Ok(Received::Timeout) => break,
            Ok(Received::Msg(r)) => match fixed(&r) {
                Some(f) if f.vers == 2 && f.proc_ == RDMA2_CONNPROP => props += 1,
                Some(f)
                    if f.xid == xid
                        && msg::error_body(&r).map(|e| e.0) == Some(err::INVAL_OPTION) =>
                {
                    refused = true
                }
                _ => {
                    l.close().await;
                    return fail(format!("answered with {}", msg::describe(&r)));
                }
            },
            Ok(Received::Failed(s)) => {
                l.close().await;
                return fail(format!("the connection broke ({s:?})"));
            }
            Err(e) => {
                l.close().await;
                return fail(e.to_string());
            }
        }
    }
    let xid = ctx.xid();
    let v = match l.send(null_v2(ctx, xid), ctx.cfg.wait).await {
        Err(e) => fail(format!("send: {e}")),
        Ok(()) => match next_skipping_props(ctx, &mut l, &mut props).await {
            Ok(r) => match check_v2_reply(&r, xid) {
                Ok(()) => pass(format!(
                    "{}; {props} RDMA2_CONNPROP from the server; the next call answered",
                    if refused {
                        "refused with INVAL_OPTION"
                    } else {
                        "taken silently"
                    }
                )),
                Err(e) => fail(e),
            },
            Err(e) => fail(e),
        },
    };
    l.close().await;
    v
}

#[derive(Debug, Clone, Copy)]
enum Bad {
    Vers,
    Proc,
    Xdr,
}

async fn err_case(ctx: &mut Ctx, what: Bad) -> Verdict {
    let (mut l, mut props) = match settled(ctx).await {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let xid = ctx.xid();
    let credits = ctx.cfg.credits;
    let (m, vers, want) = match what {
        Bad::Vers => {
            let mut b = BytesMut::from(&null_v2(ctx, xid)[..]);
            b[4..8].copy_from_slice(&3u32.to_be_bytes());
            (b.freeze(), 3, err::VERS)
        }
        Bad::Proc => {
            let mut b = BytesMut::from(&null_v2(ctx, xid)[..]);
            b[12..16].copy_from_slice(&42u32.to_be_bytes());
            (b.freeze(), 2, err::INVAL_PROC)
        }
        Bad::Xdr => {
            // RDMA2_MSG: direction and inv_handle, then a Read list entry without its
            // offset (36 bytes).
            let mut b = BytesMut::new();
            for w in [xid, 2, credits, 0, 0, 0, 1, 0, 0x1234_5678] {
                b.put_u32(w);
            }
            (b.freeze(), 2, err::BAD_XDR)
        }
    };
    let v = match l.send(m, ctx.cfg.wait).await {
        Err(e) => fail(format!("send: {e}")),
        Ok(()) => match next_skipping_props(ctx, &mut l, &mut props).await {
            Err(e) => fail(e),
            Ok(r) => {
                let f = fixed(&r);
                let e = msg::error_body(&r);
                match (f, e) {
                    (Some(f), Some((code, range)))
                        if f.xid == xid && f.vers == vers && code == want =>
                    {
                        match (what, range) {
                            (Bad::Vers, Some((lo, hi))) if !(lo..=hi).contains(&2) => {
                                fail(format!("ERR_VERS {lo}..{hi} does not hold version 2"))
                            }
                            _ => pass(msg::describe(&r)),
                        }
                    }
                    _ => fail(format!(
                        "expected rdma_err {want} with XID {xid:#010x} and vers {vers}: {}",
                        msg::describe(&r)
                    )),
                }
            }
        },
    };
    l.close().await;
    v
}
