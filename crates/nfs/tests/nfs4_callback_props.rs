//! Property tests for the callback wire formats (RFC 8881 §20): generated CB_COMPOUND
//! arguments and results round-trip through their encoders and checked decoders; the
//! client's callback program answers every CB_SEQUENCE-led CB_COMPOUND with an echo of the
//! slot and sequence id; arbitrary bytes never panic either decoder.

use bytes::Bytes;
use nfs::nfs4::Nfsstat4;
use nfs::nfs4::callback::program::CallbackProgram;
use nfs::nfs4::callback::wire::{
    CbCompoundArgs, CbCompoundRes, CbOpArgs, CbOpRes, CbSequenceArgs, CbSequenceOk, ReferringCall,
    ReferringCallList,
};
use nfs::nfs4::types::{Fh4, Opaque1024, StateOwner4, Tag4};
use proptest::prelude::*;

fn bytes_up_to(n: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..=n).prop_map(Bytes::from)
}

fn cb_sequence() -> impl Strategy<Value = CbSequenceArgs> {
    (
        any::<[u8; 16]>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        any::<bool>(),
        proptest::collection::vec(
            (
                any::<[u8; 16]>(),
                proptest::collection::vec((any::<u32>(), any::<u32>()), 0..3),
            ),
            0..3,
        ),
    )
        .prop_map(
            |(session, sequenceid, slotid, highest_slotid, cachethis, refs)| CbSequenceArgs {
                session,
                sequenceid,
                slotid,
                highest_slotid,
                cachethis,
                referring: refs
                    .into_iter()
                    .map(|(session, calls)| ReferringCallList {
                        session,
                        calls: calls
                            .into_iter()
                            .map(|(sequenceid, slotid)| ReferringCall { sequenceid, slotid })
                            .collect(),
                    })
                    .collect(),
            },
        )
}

fn notify_lock() -> impl Strategy<Value = CbOpArgs> {
    (bytes_up_to(128), any::<u64>(), bytes_up_to(64)).prop_map(|(fh, clientid, o)| {
        CbOpArgs::NotifyLock {
            fh: Fh4(fh),
            owner: StateOwner4 {
                clientid,
                owner: Opaque1024(o),
            },
        }
    })
}

fn cb_args() -> impl Strategy<Value = CbCompoundArgs> {
    (
        bytes_up_to(32),
        0u32..3,
        any::<u32>(),
        proptest::option::of(cb_sequence()),
        proptest::collection::vec(notify_lock(), 0..4),
    )
        .prop_map(|(tag, minorversion, callback_ident, seq, rest)| {
            let mut ops: Vec<CbOpArgs> = seq.into_iter().map(CbOpArgs::Sequence).collect();
            ops.extend(rest);
            CbCompoundArgs {
                tag: Tag4(tag),
                minorversion,
                callback_ident,
                ops,
            }
        })
}

fn cb_res() -> impl Strategy<Value = CbCompoundRes> {
    let op = prop_oneof![
        (any::<[u8; 16]>(), any::<[u32; 4]>()).prop_map(|(session, v)| {
            CbOpRes::Sequence(Ok(CbSequenceOk {
                session,
                sequenceid: v[0],
                slotid: v[1],
                highest_slotid: v[2],
                target_highest_slotid: v[3],
            }))
        }),
        (1u32..20000).prop_map(|s| CbOpRes::Sequence(Err(Nfsstat4(s)))),
        any::<u32>().prop_map(|s| CbOpRes::NotifyLock(Nfsstat4(s))),
        (3u32..11, 1u32..20000).prop_map(|(n, s)| CbOpRes::Other(n, Nfsstat4(s))),
    ];
    (
        any::<u32>(),
        bytes_up_to(32),
        proptest::collection::vec(op, 0..5),
    )
        .prop_map(|(status, tag, results)| CbCompoundRes {
            status: Nfsstat4(status),
            tag: Tag4(tag),
            results,
        })
}

proptest! {
    #[test]
    fn cb_compound_args_round_trip(a in cb_args()) {
        prop_assert_eq!(CbCompoundArgs::decode(&a.to_bytes()).unwrap(), a);
    }

    #[test]
    fn cb_compound_res_round_trip(r in cb_res()) {
        prop_assert_eq!(CbCompoundRes::decode(&r.to_bytes()).unwrap(), r);
    }

    #[test]
    fn the_callback_program_answers_cb_sequence(a in cb_args()) {
        let (prog, _events) = CallbackProgram::new(1);
        let res = prog.answer(&a);
        let res = CbCompoundRes::decode(&res.to_bytes()).unwrap();
        prop_assert_eq!(&res.tag, &a.tag);
        match a.ops.first() {
            Some(CbOpArgs::Sequence(s)) => {
                let Some(CbOpRes::Sequence(Ok(ok))) = res.results.first() else {
                    return Err(TestCaseError::fail(format!("{res:?}")));
                };
                prop_assert_eq!(ok.session, s.session);
                prop_assert_eq!(ok.sequenceid, s.sequenceid);
                prop_assert_eq!(ok.slotid, s.slotid);
                // Every CB_NOTIFY_LOCK after it is answered NFS4_OK.
                prop_assert_eq!(res.results.len(), a.ops.len());
                prop_assert_eq!(res.status, Nfsstat4::OK);
            }
            // §20.9.3: an operation before any CB_SEQUENCE is refused.
            Some(_) => prop_assert_eq!(res.status, Nfsstat4::OP_NOT_IN_SESSION),
            None => prop_assert!(res.results.is_empty()),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in bytes_up_to(512)) {
        let _ = CbCompoundArgs::decode(&b);
        let _ = CbCompoundRes::decode(&b);
    }
}
