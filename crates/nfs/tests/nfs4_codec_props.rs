//! Property tests for the NFSv4 codec's two halves: generated operation arguments encoded by
//! the client half decode (server half) to the same value, consuming every byte; generated
//! results encoded by the server half decode (client half) to the same value with exact
//! `encoded_len`; arbitrary bytes never panic either decoder.

use bytes::Bytes;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::args::{Locker, OpArgs, SequenceArgs};
use nfs::nfs4::compound::CompoundReply;
use nfs::nfs4::consts::op;
use nfs::nfs4::res::{Entry4, LockDenied, OpRes, SequenceOk};
use nfs::nfs4::types::{
    Bitmap4, ChangeInfo4, Component4, Fattr4, Fh4, Linktext4, Opaque1024, StateOwner4, Stateid4,
};
use proptest::prelude::*;
use xdr::{Decoder, Encoder};

fn bytes_up_to(n: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..=n).prop_map(Bytes::from)
}

fn stateid() -> impl Strategy<Value = Stateid4> {
    (any::<u32>(), any::<[u8; 12]>()).prop_map(|(seqid, other)| Stateid4 { seqid, other })
}

fn component() -> impl Strategy<Value = Component4> {
    bytes_up_to(40).prop_map(Component4)
}

fn bitmap() -> impl Strategy<Value = Bitmap4> {
    proptest::collection::vec(any::<u32>(), 0..4).prop_map(Bitmap4)
}

fn fattr() -> impl Strategy<Value = Fattr4> {
    (bitmap(), bytes_up_to(64)).prop_map(|(mask, vals)| Fattr4 { mask, vals })
}

fn owner() -> impl Strategy<Value = StateOwner4> {
    (any::<u64>(), bytes_up_to(32)).prop_map(|(clientid, o)| StateOwner4 {
        clientid,
        owner: Opaque1024(o),
    })
}

fn cinfo() -> impl Strategy<Value = ChangeInfo4> {
    (any::<bool>(), any::<u64>(), any::<u64>()).prop_map(|(atomic, before, after)| ChangeInfo4 {
        atomic,
        before,
        after,
    })
}

fn args() -> impl Strategy<Value = OpArgs> {
    prop_oneof![
        any::<u32>().prop_map(OpArgs::Access),
        (any::<u32>(), stateid()).prop_map(|(seqid, stateid)| OpArgs::Close { seqid, stateid }),
        component().prop_map(OpArgs::Lookup),
        component().prop_map(OpArgs::Remove),
        (component(), component()).prop_map(|(old, new)| OpArgs::Rename { old, new }),
        bytes_up_to(128).prop_map(|b| OpArgs::Putfh(Fh4(b))),
        Just(OpArgs::Putrootfh),
        Just(OpArgs::Getfh),
        Just(OpArgs::Savefh),
        bitmap().prop_map(OpArgs::Getattr),
        fattr().prop_map(OpArgs::Verify),
        (stateid(), fattr()).prop_map(|(stateid, attrs)| OpArgs::Setattr { stateid, attrs }),
        (stateid(), any::<u64>(), any::<u32>()).prop_map(|(stateid, offset, count)| {
            OpArgs::Read {
                stateid,
                offset,
                count,
            }
        }),
        (stateid(), any::<u64>(), 0..3u32, bytes_up_to(300)).prop_map(
            |(stateid, offset, stable, data)| OpArgs::Write {
                stateid,
                offset,
                stable,
                data,
            }
        ),
        (
            any::<u64>(),
            any::<[u8; 8]>(),
            any::<u32>(),
            any::<u32>(),
            bitmap()
        )
            .prop_map(
                |(cookie, verf, dircount, maxcount, attrs)| OpArgs::Readdir {
                    cookie,
                    verf,
                    dircount,
                    maxcount,
                    attrs,
                }
            ),
        (
            1..5u32,
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            stateid(),
            owner(),
            any::<bool>()
        )
            .prop_map(|(locktype, reclaim, offset, length, sid, owner, new)| {
                OpArgs::Lock {
                    locktype,
                    reclaim,
                    offset,
                    length,
                    locker: if new {
                        Locker::New {
                            open_seqid: 1,
                            open_stateid: sid,
                            lock_seqid: 2,
                            owner,
                        }
                    } else {
                        Locker::Existing {
                            lock_stateid: sid,
                            lock_seqid: 3,
                        }
                    },
                }
            }),
        (any::<[u8; 16]>(), any::<u32>(), any::<u32>(), any::<bool>()).prop_map(
            |(session, sequenceid, slotid, cachethis)| OpArgs::Sequence(SequenceArgs {
                session,
                sequenceid,
                slotid,
                highest_slotid: slotid,
                cachethis,
            })
        ),
        proptest::collection::vec(stateid(), 0..5).prop_map(OpArgs::TestStateid),
        (stateid(), any::<u64>(), any::<u64>()).prop_map(|(stateid, offset, length)| {
            OpArgs::Deallocate {
                stateid,
                offset,
                length,
            }
        }),
    ]
}

fn results() -> impl Strategy<Value = OpRes> {
    prop_oneof![
        (any::<u32>(), any::<u32>())
            .prop_map(|(supported, access)| OpRes::Access { supported, access }),
        stateid().prop_map(OpRes::Close),
        fattr().prop_map(OpRes::Getattr),
        bytes_up_to(128).prop_map(|b| OpRes::Getfh(Fh4(b))),
        cinfo().prop_map(OpRes::Remove),
        (cinfo(), cinfo()).prop_map(|(source, target)| OpRes::Rename { source, target }),
        (any::<bool>(), bytes_up_to(300)).prop_map(|(eof, data)| OpRes::Read { eof, data }),
        bytes_up_to(100).prop_map(|b| OpRes::Readlink(Linktext4(b))),
        (
            any::<[u8; 8]>(),
            proptest::collection::vec((any::<u64>(), component(), fattr()), 0..5),
            any::<bool>()
        )
            .prop_map(|(verf, es, eof)| OpRes::Readdir {
                verf,
                entries: es
                    .into_iter()
                    .map(|(cookie, name, attrs)| Entry4 {
                        cookie,
                        name,
                        attrs,
                    })
                    .collect(),
                eof,
            }),
        (any::<u64>(), any::<u64>(), 1..3u32, owner()).prop_map(|(offset, length, lt, owner)| {
            OpRes::Denied(
                op::LOCKT,
                LockDenied {
                    offset,
                    length,
                    locktype: lt,
                    owner,
                },
            )
        }),
        bitmap().prop_map(|b| OpRes::Setattr(Nfsstat4::OK, b)),
        (any::<u32>(), 0..3u32, any::<[u8; 8]>()).prop_map(|(count, committed, verf)| {
            OpRes::Write {
                count,
                committed,
                verf,
            }
        }),
        (any::<[u8; 16]>(), any::<u32>(), any::<u32>()).prop_map(|(session, s, f)| {
            OpRes::Sequence(SequenceOk {
                session,
                sequenceid: s,
                slotid: 0,
                highest_slotid: 3,
                target_highest_slotid: 3,
                status_flags: f,
            })
        }),
        (any::<bool>(), any::<u64>()).prop_map(|(eof, offset)| OpRes::Seek { eof, offset }),
        (10001..10096u32).prop_map(|s| OpRes::Status(op::LOOKUP, Nfsstat4(s))),
    ]
}

proptest! {
    #[test]
    fn arguments_roundtrip(a in args()) {
        let mut e = Encoder::new();
        a.encode(&mut e);
        let b = e.into_bytes();
        let mut d = Decoder::from_bytes(&b);
        let opnum = d.u32().unwrap();
        let back = OpArgs::decode(opnum, 2, &mut d).unwrap();
        prop_assert!(d.is_empty());
        prop_assert_eq!(back, a);
    }

    #[test]
    fn results_roundtrip(r in proptest::collection::vec(results(), 0..6), tag in bytes_up_to(20)) {
        let reply = CompoundReply {
            status: r.last().map_or(Nfsstat4::OK, OpRes::status),
            tag,
            results: r,
        };
        let mut e = Encoder::new();
        reply.encode(&mut e);
        let b = e.into_bytes();
        prop_assert_eq!(b.len(), reply.encoded_len());
        prop_assert_eq!(CompoundReply::decode(&b).unwrap(), reply);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in bytes_up_to(200), opnum in 0..80u32, minor in 0..3u32) {
        let mut d = Decoder::from_bytes(&b);
        let _ = OpArgs::decode(opnum, minor, &mut d);
        let _ = CompoundReply::decode(&b);
    }
}
