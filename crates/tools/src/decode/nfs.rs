//! ONC RPC message headers (the `oncrpc` decoder) and, for NFS, the procedure or COMPOUND
//! operation names and key arguments (the `nfs` crate's decoders: `nfs3` argument types,
//! `nfs4::args::OpArgs`, `nfs4::res::OpRes`).

use bytes::Bytes;
use oncrpc::message::{AcceptStat, MessageHeader, RejectedReply, ReplyHeader};
use xdr::Decoder;

use nfs::nfs3::{DirOpArgs3, Fh3, proc_ as p3};
use nfs::nfs4::args::OpArgs;
use nfs::nfs4::compound::CompoundHeader;
use nfs::nfs4::consts::{op as op4, proc4};
use nfs::nfs4::res::OpRes;

use super::model::{NfsInfo, NfsOp, RpcInfo};

const NFS_PROGRAM: u32 = nfs::nfs3::PROGRAM;
const MOUNT_PROGRAM: u32 = 100005;
const PORTMAP_PROGRAM: u32 = 100000;
const NFSACL_PROGRAM: u32 = 100227;

/// NFSv3 procedure names (RFC 1813 §3.3).
const NFS3_NAMES: [&str; 22] = nfs::nfs3::proc_::NAMES;

/// MOUNT v3 procedure names (RFC 1813 Appendix I).
const MOUNT3_NAMES: [&str; 6] = nfs::mount::proc_::NAMES;

/// The hash a file handle is shown by: CRC-32C of its bytes.
pub fn fh_hash(fh: &[u8]) -> String {
    format!("{:08x}", crc32c::crc32c(fh))
}

/// The name of procedure `proc_` of `prog` version `vers`.
pub fn proc_name(prog: u32, vers: u32, proc_: u32) -> String {
    let idx = proc_ as usize;
    match (prog, vers) {
        (NFS_PROGRAM, 3) if idx < NFS3_NAMES.len() => format!("NFSv3 {}", NFS3_NAMES[idx]),
        (NFS_PROGRAM, 4) if proc_ == proc4::NULL => "NFSv4 NULL".to_string(),
        (NFS_PROGRAM, 4) if proc_ == proc4::COMPOUND => "NFSv4 COMPOUND".to_string(),
        (MOUNT_PROGRAM, 3) if idx < MOUNT3_NAMES.len() => format!("MOUNT {}", MOUNT3_NAMES[idx]),
        (PORTMAP_PROGRAM, _) => format!("PORTMAP v{vers} proc {proc_}"),
        (NFSACL_PROGRAM, _) => format!("NFSACL v{vers} proc {proc_}"),
        _ if proc_ == 0 => format!("prog {prog} v{vers} NULL"),
        _ => format!("prog {prog} v{vers} proc {proc_}"),
    }
}

/// What a reply needs from its call to be decoded: the program, version and procedure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallKey {
    pub prog: u32,
    pub vers: u32,
    pub proc_: u32,
}

/// Decode an RPC message; `call_of` gives the call a reply answers (by XID), if it was seen.
pub fn decode_rpc(msg: &[u8], call_of: impl Fn(u32) -> Option<CallKey>) -> RpcInfo {
    let buf = Bytes::copy_from_slice(msg);
    let mut info = RpcInfo {
        xid: 0,
        kind: "call",
        prog: None,
        vers: None,
        proc_num: None,
        proc_name: None,
        reply_stat: None,
        nfs: None,
        malformed: None,
    };
    let (hdr, body) = match MessageHeader::decode_message(&buf) {
        Ok(x) => x,
        Err(e) => {
            info.malformed = Some(e.to_string());
            return info;
        }
    };
    match hdr {
        MessageHeader::Call(c) => {
            info.xid = c.xid;
            info.prog = Some(c.prog);
            info.vers = Some(c.vers);
            info.proc_num = Some(c.proc_);
            info.proc_name = Some(proc_name(c.prog, c.vers, c.proc_));
            if c.prog == NFS_PROGRAM {
                let (nfs, err) = match c.vers {
                    3 => nfs3_call(c.proc_, &body),
                    4 if c.proc_ == proc4::COMPOUND => nfs4_call(&body),
                    _ => (NfsInfo::default(), None),
                };
                info.nfs = Some(nfs);
                info.malformed = err;
            }
        }
        MessageHeader::Reply(r) => {
            info.kind = "reply";
            info.xid = r.xid();
            info.reply_stat = Some(reply_stat(&r));
            if let Some(k) = call_of(info.xid) {
                info.prog = Some(k.prog);
                info.vers = Some(k.vers);
                info.proc_num = Some(k.proc_);
                info.proc_name = Some(proc_name(k.prog, k.vers, k.proc_));
                let success = matches!(
                    r,
                    ReplyHeader::Accepted {
                        stat: AcceptStat::Success,
                        ..
                    }
                );
                if success && k.prog == NFS_PROGRAM && k.proc_ != 0 {
                    let (nfs, err) = match k.vers {
                        3 => (nfs3_reply(&body), None),
                        4 => nfs4_reply(&body),
                        _ => (NfsInfo::default(), None),
                    };
                    info.nfs = Some(nfs);
                    info.malformed = err;
                }
            }
        }
    }
    info
}

fn reply_stat(r: &ReplyHeader) -> String {
    match r {
        ReplyHeader::Accepted { stat, .. } => match stat {
            AcceptStat::Success => "accepted success".into(),
            AcceptStat::ProgUnavail => "accepted prog_unavail".into(),
            AcceptStat::ProgMismatch { low, high } => {
                format!("accepted prog_mismatch {low}-{high}")
            }
            AcceptStat::ProcUnavail => "accepted proc_unavail".into(),
            AcceptStat::GarbageArgs => "accepted garbage_args".into(),
            AcceptStat::SystemErr => "accepted system_err".into(),
            other => format!("accepted {}", other.code()),
        },
        ReplyHeader::Denied { reason, .. } => match reason {
            RejectedReply::RpcMismatch { low, high } => format!("denied rpc_mismatch {low}-{high}"),
            RejectedReply::AuthError(a) => format!("denied auth_error {}", a.code()),
        },
    }
}

/// NFSv3 arguments: the file handle, offset and count, or the directory and name.
fn nfs3_call(proc_: u32, args: &[u8]) -> (NfsInfo, Option<String>) {
    let mut n = NfsInfo::default();
    let mut d = Decoder::new(args);
    let r: xdr::Result<()> = (|| {
        match proc_ {
            p3::NULL => {}
            p3::READ | p3::WRITE | p3::COMMIT => {
                let fh: Fh3 = d.get()?;
                n.fh = Some(fh_hash(&fh.0));
                n.offset = Some(d.u64()?);
                n.count = Some(d.u32()?);
            }
            p3::LOOKUP
            | p3::CREATE
            | p3::MKDIR
            | p3::SYMLINK
            | p3::MKNOD
            | p3::REMOVE
            | p3::RMDIR
            | p3::RENAME => {
                let w: DirOpArgs3 = d.get()?;
                n.fh = Some(fh_hash(&w.dir.0));
                n.name = Some(String::from_utf8_lossy(&w.name.0).into_owned());
            }
            p3::LINK => {
                let fh: Fh3 = d.get()?;
                n.fh = Some(fh_hash(&fh.0));
                let w: DirOpArgs3 = d.get()?;
                n.name = Some(String::from_utf8_lossy(&w.name.0).into_owned());
            }
            p3::READDIR | p3::READDIRPLUS => {
                let fh: Fh3 = d.get()?;
                n.fh = Some(fh_hash(&fh.0));
                n.offset = Some(d.u64()?);
            }
            _ => {
                let fh: Fh3 = d.get()?;
                n.fh = Some(fh_hash(&fh.0));
            }
        }
        Ok(())
    })();
    (n, r.err().map(|e| format!("NFSv3 arguments: {e}")))
}

/// NFSv3 results: the status word.
fn nfs3_reply(results: &[u8]) -> NfsInfo {
    NfsInfo {
        status: Decoder::new(results).u32().ok(),
        ..NfsInfo::default()
    }
}

fn op_name(opnum: u32) -> String {
    op4::name(opnum).to_string()
}

/// NFSv4 COMPOUND arguments: every operation, with its file handle, offset/count or name.
fn nfs4_call(args: &[u8]) -> (NfsInfo, Option<String>) {
    let mut n = NfsInfo::default();
    let mut d = Decoder::new(args);
    let hdr: CompoundHeader = match d.get() {
        Ok(h) => h,
        Err(e) => return (n, Some(format!("COMPOUND header: {e}"))),
    };
    for _ in 0..hdr.nops {
        let opnum = match d.u32() {
            Ok(v) => v,
            Err(e) => return (n, Some(format!("COMPOUND operation: {e}"))),
        };
        let mut o = NfsOp {
            op: op_name(opnum),
            fh: None,
            offset: None,
            count: None,
            name: None,
            status: None,
        };
        let args = match OpArgs::decode(opnum, hdr.minorversion, &mut d) {
            Ok(a) => a,
            Err(e) => {
                n.ops.push(o);
                return (n, Some(format!("{} arguments: {e}", op_name(opnum))));
            }
        };
        match &args {
            OpArgs::Putfh(fh) => o.fh = Some(fh_hash(&fh.0)),
            OpArgs::Read { offset, count, .. } | OpArgs::Commit { offset, count } => {
                o.offset = Some(*offset);
                o.count = Some(*count);
            }
            OpArgs::Write { offset, data, .. } => {
                o.offset = Some(*offset);
                o.count = Some(u32::try_from(data.len()).unwrap_or(u32::MAX));
            }
            OpArgs::Lookup(c) | OpArgs::Remove(c) | OpArgs::Link(c) | OpArgs::Secinfo(c) => {
                o.name = Some(String::from_utf8_lossy(&c.0).into_owned())
            }
            _ => {}
        }
        let stop = matches!(args, OpArgs::Illegal(_) | OpArgs::Unsupported(_));
        n.ops.push(o);
        if stop {
            // The arguments of an operation this decoder does not know cannot be skipped.
            return (n, Some(format!("operation {opnum} not decoded")));
        }
    }
    // The first PUTFH's handle is the call's file handle; the first READ/WRITE/COMMIT its range.
    n.fh = n.ops.iter().find_map(|o| o.fh.clone());
    if let Some(o) = n.ops.iter().find(|o| o.offset.is_some()) {
        n.offset = o.offset;
        n.count = o.count;
    }
    (n, None)
}

/// NFSv4 COMPOUND results: the status and each operation's status.
fn nfs4_reply(results: &[u8]) -> (NfsInfo, Option<String>) {
    let mut n = NfsInfo::default();
    let mut d = Decoder::new(results);
    let r: xdr::Result<()> = (|| {
        n.status = Some(d.u32()?);
        d.opaque(nfs::nfs4::types::MAX_TAG)?;
        let count = d.length(nfs::nfs4::compound::MAX_OPS_WIRE)?;
        for _ in 0..count {
            let res = OpRes::decode(&mut d)?;
            n.ops.push(NfsOp {
                op: op_name(res.opnum()),
                fh: None,
                offset: None,
                count: None,
                name: None,
                status: Some(res.status().0),
            });
        }
        Ok(())
    })();
    (
        n,
        r.err()
            .map(|e| format!("COMPOUND results (later ones may sit in a Write chunk): {e}")),
    )
}
