//! RFC 8267 at the XDR level: which items are DDP-eligible, where they sit, reply-size bounds,
//! COMPOUND scanning and Write-chunk pairing, short Reply chunk retry.

use bytes::Bytes;
use nfs::nfs3::*;
use nfs::ulb::{self, ChunkUse, NfsBinding, op4};
use rpcrdma::ulb::UpperLayerBinding;
use xdr::{DdpPolicy, Encoder, XdrEncode};

const REDUCE: DdpPolicy = DdpPolicy::Reduce {
    min_len: 0,
    max_items: 8,
};

fn fh() -> Fh3 {
    Fh3(Bytes::from_static(&[7u8; 32]))
}

fn attr() -> Fattr3 {
    Fattr3 {
        ftype: Ftype3::Reg,
        mode: 0o644,
        nlink: 1,
        uid: 1,
        gid: 2,
        size: 3,
        used: 4,
        rdev: Specdata3::default(),
        fsid: 5,
        fileid: 6,
        atime: Nfstime3::default(),
        mtime: Nfstime3::default(),
        ctime: Nfstime3::default(),
    }
}

fn reduce<T: XdrEncode>(v: &T) -> xdr::Encoded {
    let mut e = Encoder::new().with_policy(REDUCE);
    v.encode(&mut e);
    e.finish()
}

#[test]
fn nfs3_write_and_symlink_args_are_the_only_eligible_call_items() {
    let b = NfsBinding::new();
    let w = WriteArgs {
        file: fh(),
        offset: 9,
        count: 5,
        stable: StableHow::Unstable,
        data: Data(Bytes::from_static(b"hello")),
    };
    let enc = reduce(&w);
    assert_eq!(enc.reduced.len(), 1);
    let inline = xdr::to_bytes(&w);
    let items = b.call_ddp_items(3, proc_::WRITE, &inline).unwrap();
    assert_eq!(
        items,
        vec![enc.reduced[0].position..enc.reduced[0].position + 5]
    );
    assert_eq!(&inline[items[0].clone()], b"hello");

    let s = SymlinkArgs {
        where_: DirOpArgs3 {
            dir: fh(),
            name: Filename3(Bytes::from_static(b"ln")),
        },
        symlink_attributes: Sattr3::default(),
        symlink_data: NfsPath(Bytes::from_static(b"../target")),
    };
    let enc = reduce(&s);
    assert_eq!(enc.reduced.len(), 1);
    let inline = xdr::to_bytes(&s);
    let items = b.call_ddp_items(3, proc_::SYMLINK, &inline).unwrap();
    assert_eq!(&inline[items[0].clone()], b"../target");
    assert_eq!(items[0].start, enc.reduced[0].position);

    // Nothing else is eligible, even large names.
    let c = CreateArgs {
        where_: DirOpArgs3 {
            dir: fh(),
            name: Filename3(Bytes::from(vec![b'n'; 1000])),
        },
        how: CreateHow3::Unchecked(Sattr3::default()),
    };
    assert!(reduce(&c).reduced.is_empty());
    assert!(
        b.call_ddp_items(3, proc_::CREATE, &xdr::to_bytes(&c))
            .unwrap()
            .is_empty()
    );
    // Garbage is reported, not guessed at.
    assert!(b.call_ddp_items(3, proc_::WRITE, &inline[..10]).is_err());
    assert!(b.call_ddp_items(7, 1, &[]).is_err());
}

#[test]
fn nfs3_read_and_readlink_results_are_reduced_and_located() {
    let b = NfsBinding::new();
    let r: ReadRes = Res::Ok(ReadOk {
        file_attributes: Some(attr()),
        count: 6,
        eof: true,
        data: Data(Bytes::from_static(b"abcdef")),
    });
    let enc = reduce(&r);
    assert_eq!(enc.reduced.len(), 1);
    let reduced = enc.to_bytes();
    let pos = b
        .reply_ddp_positions(3, proc_::READ, &reduced, &[6])
        .unwrap();
    assert_eq!(pos, vec![enc.reduced[0].position]);
    assert_eq!(
        ulb::nfs3_reply_item_offset(proc_::READ, &reduced).unwrap(),
        Some(enc.reduced[0].position)
    );

    let rl: ReadlinkRes = Res::Ok(ReadlinkOk {
        symlink_attributes: None,
        data: NfsPath(Bytes::from_static(b"/x/y")),
    });
    let enc = reduce(&rl);
    assert_eq!(enc.reduced.len(), 1);
    assert_eq!(
        b.reply_ddp_positions(3, proc_::READLINK, &enc.to_bytes(), &[4])
            .unwrap(),
        vec![enc.reduced[0].position]
    );
    // An error result has no item; a filled chunk then is an error.
    let e: ReadRes = Res::Err(Nfsstat3::Acces, AttrOnly { attributes: None });
    assert!(reduce(&e).reduced.is_empty());
    assert!(
        b.reply_ddp_positions(3, proc_::READ, &xdr::to_bytes(&e), &[6])
            .is_err()
    );
    assert_eq!(
        b.reply_ddp_positions(3, proc_::READ, &xdr::to_bytes(&e), &[0])
            .unwrap(),
        Vec::<usize>::new()
    );
    // READDIRPLUS with many names: nothing reduced.
    let rd: ReaddirplusRes = Res::Ok(ReaddirplusOk {
        dir_attributes: None,
        cookieverf: [0; 8],
        entries: EntryList(vec![
            Entryplus3 {
                fileid: 1,
                name: Filename3(Bytes::from(vec![b'a'; 600])),
                cookie: 1,
                name_attributes: Some(attr()),
                name_handle: Some(fh()),
            };
            3
        ]),
        eof: true,
    });
    assert!(reduce(&rd).reduced.is_empty());
}

#[test]
fn nfs3_max_reply_bounds_every_result() {
    let hdr = ulb::RPC_REPLY_HEADER_MAX;
    let big_fh = Fh3(Bytes::from(vec![1u8; 64]));
    let wcc = WccData {
        before: Some(WccAttr {
            size: 1,
            mtime: Nfstime3::default(),
            ctime: Nfstime3::default(),
        }),
        after: Some(attr()),
    };
    let newobj: NewObjRes = Res::Ok(NewObjOk {
        obj: Some(big_fh.clone()),
        obj_attributes: Some(attr()),
        dir_wcc: wcc.clone(),
    });
    let cases: Vec<(u32, Vec<u8>, usize)> = vec![
        (
            proc_::GETATTR,
            vec![],
            Res::<_, nfs::Void>::Ok(GetattrOk {
                obj_attributes: attr(),
            })
            .encoded_len(),
        ),
        (
            proc_::LOOKUP,
            vec![],
            LookupRes::Ok(LookupOk {
                object: big_fh.clone(),
                obj_attributes: Some(attr()),
                dir_attributes: Some(attr()),
            })
            .encoded_len(),
        ),
        (proc_::CREATE, vec![], newobj.encoded_len()),
        (proc_::MKDIR, vec![], newobj.encoded_len()),
        (
            proc_::WRITE,
            vec![],
            WriteRes::Ok(WriteOk {
                file_wcc: wcc.clone(),
                count: 1,
                committed: StableHow::FileSync,
                verf: [0; 8],
            })
            .encoded_len(),
        ),
        (
            proc_::RENAME,
            vec![],
            RenameRes::Ok(RenameWcc {
                fromdir_wcc: wcc.clone(),
                todir_wcc: wcc.clone(),
            })
            .encoded_len(),
        ),
        (
            proc_::READ,
            xdr::to_bytes(&ReadArgs {
                file: fh(),
                offset: 0,
                count: 1001,
            })
            .to_vec(),
            ReadRes::Ok(ReadOk {
                file_attributes: Some(attr()),
                count: 1001,
                eof: false,
                data: Data(Bytes::from(vec![0; 1001])),
            })
            .encoded_len(),
        ),
        (
            proc_::COMMIT,
            vec![],
            CommitRes::Ok(CommitOk {
                file_wcc: wcc.clone(),
                verf: [0; 8],
            })
            .encoded_len(),
        ),
    ];
    for (p, args, len) in cases {
        let max = ulb::nfs3_max_reply(p, &args).unwrap();
        assert!(hdr + len <= max, "proc {p}: {len} > {max}");
        assert!(
            max - hdr - len < 64,
            "proc {p}: bound {max} is loose for {len}"
        );
    }
    let e = ulb::nfs3_reply_expectation(
        proc_::READ,
        &xdr::to_bytes(&ReadArgs {
            file: fh(),
            offset: 0,
            count: 65536,
        }),
    );
    assert_eq!(e.ddp_items, vec![65536]);
    assert!(e.max_len.unwrap() > 65536);
    let e = ulb::nfs3_reply_expectation(proc_::READLINK, &[]);
    assert_eq!(e.ddp_items, vec![ulb::NFS3_MAXPATHLEN]);
    assert!(
        ulb::nfs3_reply_expectation(proc_::GETATTR, &[])
            .ddp_items
            .is_empty()
    );
    // Every procedure has a bound.
    let rd = xdr::to_bytes(&ReaddirArgs {
        dir: fh(),
        cookie: 0,
        cookieverf: [0; 8],
        count: 4096,
    });
    let rdp = xdr::to_bytes(&ReaddirplusArgs {
        dir: fh(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 1,
        maxcount: 32768,
    });
    for p in 0..proc_::COUNT {
        let args: &[u8] = match p {
            proc_::READ => &xdr::to_bytes(&ReadArgs {
                file: fh(),
                offset: 0,
                count: 1,
            }),
            proc_::READDIR => &rd,
            proc_::READDIRPLUS => &rdp,
            _ => &[],
        };
        assert!(ulb::nfs3_max_reply(p, args).is_some(), "proc {p}");
    }
    assert_eq!(
        ulb::nfs3_max_reply(proc_::READDIRPLUS, &rdp),
        Some(hdr + 4 + 32768)
    );
}

// ---- NFSv4 COMPOUND ----

struct C(Encoder, u32);

impl C {
    fn new(minor: u32) -> Self {
        let mut e = Encoder::new();
        e.put_opaque(b"tag");
        e.put_u32(minor);
        C(e, 0)
    }
    fn op(mut self, op: u32, body: impl FnOnce(&mut Encoder)) -> Self {
        self.0.put_u32(op);
        body(&mut self.0);
        self.1 += 1;
        self
    }
    fn finish(self) -> Vec<u8> {
        // Re-assemble: tag, minorversion, count, ops.
        let body = self.0.into_bytes();
        let head = 4 + xdr::padded(3) + 4;
        let mut out = body[..head].to_vec();
        out.extend_from_slice(&self.1.to_be_bytes());
        out.extend_from_slice(&body[head..]);
        out
    }
}

fn stateid(e: &mut Encoder) {
    e.put_u32(1);
    e.put_opaque_fixed(&[0; 12]);
}

fn fattr4(e: &mut Encoder) {
    e.put_array(&[0x10u32, 0x2], |e, v| e.put_u32(*v));
    e.put_opaque(&[1, 2, 3, 4, 5]);
}

#[test]
fn compound_scanner_finds_write_and_nf4lnk_items() {
    let sid = [9u8; 16];
    let args = C::new(1)
        .op(op4::SEQUENCE, |e| {
            e.put_opaque_fixed(&sid);
            e.put_u32(1);
            e.put_u32(0);
            e.put_u32(0);
            e.put_bool(false);
        })
        .op(op4::PUTFH, |e| e.put_opaque(&[1; 40]))
        .op(18, |e| {
            // OPEN with CREATE / GUARDED4 and CLAIM_NULL
            e.put_u32(0);
            e.put_u32(2);
            e.put_u32(0);
            e.put_u64(77);
            e.put_opaque(b"owner");
            e.put_u32(1);
            e.put_u32(1);
            fattr4(e);
            e.put_u32(0);
            e.put_opaque(b"file");
        })
        .op(op4::WRITE, |e| {
            stateid(e);
            e.put_u64(0);
            e.put_u32(2);
            e.put_opaque(b"payload!!");
        })
        .op(op4::CREATE, |e| {
            e.put_u32(op4::NF4LNK);
            e.put_opaque(b"/link/target");
            e.put_opaque(b"lnk");
            fattr4(e);
        })
        .op(op4::GETATTR, |e| {
            e.put_array(&[1u32, 2], |e, v| e.put_u32(*v))
        })
        .op(op4::READ, |e| {
            stateid(e);
            e.put_u64(0);
            e.put_u32(4096);
        })
        .op(op4::READLINK, |_| {})
        .finish();
    let scan = ulb::scan_compound(&args).unwrap();
    assert_eq!(scan.minorversion, 1);
    assert_eq!(
        scan.ops,
        vec![
            op4::SEQUENCE,
            op4::PUTFH,
            18,
            op4::WRITE,
            op4::CREATE,
            op4::GETATTR,
            op4::READ,
            op4::READLINK
        ]
    );
    assert_eq!(scan.ddp_items.len(), 2);
    assert_eq!(&args[scan.ddp_items[0].clone()], b"payload!!");
    assert_eq!(&args[scan.ddp_items[1].clone()], b"/link/target");
    assert_eq!(scan.read_like, vec![6, 7]);
    assert_eq!(scan.sessionid, Some(sid));
    assert!(!scan.stopped_at_unknown);

    let b = NfsBinding::new();
    assert_eq!(b.call_ddp_items(4, 1, &args).unwrap(), scan.ddp_items);
    // v4.1 reply bound from the session's ca_maxresponsesize (RFC 8267 §6.2.2).
    assert_eq!(b.max_reply_size(4, 1, &args), None);
    b.set_session_limit(sid, 1 << 20);
    assert_eq!(
        b.max_reply_size(4, 1, &args),
        Some(ulb::RPC_REPLY_HEADER_MAX + (1 << 20))
    );
    // Non-symlink CREATE has no item; a truncated COMPOUND is garbage.
    let dir = C::new(0)
        .op(op4::CREATE, |e| {
            e.put_u32(2);
            e.put_opaque(b"d");
            fattr4(e);
        })
        .finish();
    assert!(ulb::scan_compound(&dir).unwrap().ddp_items.is_empty());
    assert!(ulb::scan_compound(&args[..args.len() - 8]).is_err());
    // An unknown operation stops the scan (the server would stop there with OP_ILLEGAL).
    let unk = C::new(2)
        .op(op4::PUTROOTFH, |_| {})
        .op(999, |_| {})
        .finish();
    let s = ulb::scan_compound(&unk).unwrap();
    assert!(s.stopped_at_unknown);
    assert_eq!(s.ops, vec![op4::PUTROOTFH]);
}

#[test]
fn create_session_exposes_ca_maxresponsesize() {
    let args = C::new(1)
        .op(op4::CREATE_SESSION, |e| {
            e.put_u64(5);
            e.put_u32(1);
            e.put_u32(0);
            for maxresp in [262_144u32, 4096] {
                e.put_u32(0);
                e.put_u32(1 << 20);
                e.put_u32(maxresp);
                e.put_u32(8192);
                e.put_u32(16);
                e.put_u32(64);
                e.put_u32(0);
            }
            e.put_u32(0x4000_0000);
            e.put_u32(1);
            e.put_u32(0); // AUTH_NONE
        })
        .finish();
    assert_eq!(ulb::create_session_fore_attrs(&args), Some(262_144));
}

#[test]
fn compound_results_locate_read_and_readlink_data() {
    // SEQUENCE, PUTFH, READ (ok), READLINK (ok) — with the data reduced.
    let mut e = Encoder::new().with_policy(REDUCE);
    e.put_u32(0);
    e.put_opaque(b"t");
    e.put_u32(4);
    e.put_u32(op4::SEQUENCE);
    e.put_u32(0);
    e.put_opaque_fixed(&[1; 16]);
    for _ in 0..5 {
        e.put_u32(0);
    }
    e.put_u32(op4::PUTFH);
    e.put_u32(0);
    e.put_u32(op4::READ);
    e.put_u32(0);
    e.put_bool(true);
    e.put_ddp_opaque(Bytes::from_static(b"file data"));
    e.put_u32(op4::READLINK);
    e.put_u32(0);
    e.put_ddp_opaque(Bytes::from_static(b"/target"));
    let enc = e.finish();
    let reduced = enc.to_bytes();
    let b = NfsBinding::new();
    let pos = b.reply_ddp_positions(4, 1, &reduced, &[9, 7]).unwrap();
    assert_eq!(pos, vec![enc.reduced[0].position, enc.reduced[1].position]);
    // Only the first chunk written.
    assert_eq!(
        b.reply_ddp_positions(4, 1, &reduced, &[9]).unwrap(),
        vec![enc.reduced[0].position]
    );
}

#[test]
fn write_chunk_pairing_follows_rfc8267_6_4_1() {
    //= specs/rfc8267.txt#section-6.4.1
    //= type=test
    //# o  The first chunk in the Write list MUST be used by the first READ
    //# operation in an NFS version 4 COMPOUND procedure.
    //= specs/rfc8267.txt#section-6.4.1
    //= type=test
    //# o  If an NFS version 4 client has provided a matching non-empty Write
    //# chunk, then the corresponding READ operation MUST return its
    //# DDP-eligible data item using that chunk.
    //= specs/rfc8267.txt#section-6.4.1
    //= type=test
    //# o  If an NFS version 4 client has provided an empty matching Write
    //# chunk, then the corresponding READ operation MUST return all of
    //# its result data items inline.
    //= specs/rfc8267.txt#section-6.4.1
    //= type=test
    //# o  If a READ operation returns a union arm that does not contain a
    //# DDP-eligible result, and the NFS version 4 client has provided a
    //# matching non-empty Write chunk, an NFS version 4 server MUST
    //# return an empty Write chunk in that Write list position.
    //= specs/rfc8267.txt#section-6.4.1
    //= type=test
    //# o  If there are more READ operations than Write chunks, then
    //# remaining NFS READ operations in an NFS version 4 COMPOUND that
    //# have no matching Write chunk MUST return their results inline.
    // No Write list: everything inline.
    assert_eq!(
        ulb::pair_write_chunks(&[true, true], &[]),
        vec![ChunkUse::Inline, ChunkUse::Inline]
    );
    // First chunk with first READ, next with next.
    assert_eq!(
        ulb::pair_write_chunks(&[true, true, true], &[4096, 8192, 100]),
        vec![
            ChunkUse::Fill { chunk: 0 },
            ChunkUse::Fill { chunk: 1 },
            ChunkUse::Fill { chunk: 2 }
        ]
    );
    // An empty matching chunk means inline.
    assert_eq!(
        ulb::pair_write_chunks(&[true, true], &[0, 4096]),
        vec![ChunkUse::Inline, ChunkUse::Fill { chunk: 1 }]
    );
    // A result without a DDP-eligible item returns its non-empty chunk empty.
    assert_eq!(
        ulb::pair_write_chunks(&[false, true], &[4096, 4096]),
        vec![
            ChunkUse::ReturnEmpty { chunk: 0 },
            ChunkUse::Fill { chunk: 1 }
        ]
    );
    // More READs than chunks: the rest inline.
    assert_eq!(
        ulb::pair_write_chunks(&[true, true, true], &[4096]),
        vec![
            ChunkUse::Fill { chunk: 0 },
            ChunkUse::Inline,
            ChunkUse::Inline
        ]
    );
}

#[test]
fn limits_retry_policy_and_auxiliary_protocols() {
    //= specs/rfc8267.txt#section-6.4.2
    //= type=test
    //# NFS version 4 servers
    //# MUST accept and process such requests.
    //= specs/rfc8267.txt#section-6.4.2
    //= type=test
    //# An NFS version 4 server SHOULD return one of the following responses
    //# to a client that has sent an RPC transaction via RPC-over-RDMA
    //# version 1, which cannot be processed due to chunk list complexity
    //# limits on the server:
    //= specs/rfc8267.txt#section-5.1
    //= type=test
    //# To enable interoperation of
    //# these protocols when NFS/RDMA is in use, a Legacy NFS server MUST
    //# provide support for these protocols via TCP.
    let b = NfsBinding::new();
    let l = b.chunk_limits();
    assert_eq!(
        (
            l.max_read_chunks,
            l.max_position_zero_chunks,
            l.max_write_chunks,
            l.max_segments
        ),
        (1, 1, 1, 16)
    );
    assert_eq!(
        ulb::ComplexityViolation::for_stage(true),
        ulb::ComplexityViolation::ErrChunk
    );
    assert_eq!(
        ulb::ComplexityViolation::for_stage(false),
        ulb::ComplexityViolation::GarbageArgs
    );
    assert_eq!(ulb::NFS_RDMA_PORT, 20049);
    assert!(ulb::tcp_only(100005) && ulb::tcp_only(100021) && ulb::tcp_only(100024));
    assert!(!ulb::tcp_only(100003));
    // Short Reply chunk retry: NFSACL GETACL and v4.0 GETATTR only.
    assert!(ulb::short_reply_retry(ulb::NFSACL_PROGRAM, 3, 1, &[]));
    let ga = C::new(0)
        .op(op4::PUTROOTFH, |_| {})
        .op(op4::GETATTR, |e| e.put_array(&[1u32], |e, v| e.put_u32(*v)))
        .finish();
    assert!(ulb::short_reply_retry(100003, 4, 1, &ga));
    let ga1 = C::new(1)
        .op(op4::GETATTR, |e| e.put_array(&[1u32], |e, v| e.put_u32(*v)))
        .finish();
    assert!(!ulb::short_reply_retry(100003, 4, 1, &ga1));
    for p in 0..22 {
        assert!(!ulb::short_reply_retry(100003, 3, p, &[]));
    }
    assert_eq!(ulb::short_reply_next_size(1, 1024), Some(4096));
    assert_eq!(ulb::short_reply_next_size(2, 8192), Some(16384));
    assert_eq!(ulb::short_reply_next_size(3, 8192), None);
    assert_eq!(ulb::short_reply_next_size(1, 1 << 20), None);
    // NFSv2 WRITE: the item is where the data is.
    let mut e = Encoder::new();
    e.put_opaque_fixed(&[0; 32]);
    e.put_u32(0);
    e.put_u32(0);
    e.put_u32(0);
    e.put_opaque(b"v2data");
    let v2 = e.into_bytes();
    let it = b.call_ddp_items(2, ulb::nfs2_proc::WRITE, &v2).unwrap();
    assert_eq!(&v2[it[0].clone()], b"v2data");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn scanners_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512), p in 0u32..24) {
            let b = NfsBinding::new();
            let _ = ulb::scan_compound(&data);
            let _ = ulb::compound_reply_item_offsets(&data);
            let _ = b.call_ddp_items(3, p, &data);
            let _ = b.call_ddp_items(2, p, &data);
            let _ = b.max_reply_size(3, p, &data);
            let _ = b.reply_ddp_positions(3, p, &data, &[1]);
            let _ = b.reply_ddp_positions(4, 1, &data, &[1, 0, 1]);
            let _ = b.max_reply_size(2, p, &data);
            let _ = b.reply_ddp_positions(2, p, &data, &[1]);
            let _ = ulb::nfs2_reply_expectation(p, &data);
            if let Ok(Some(o)) = ulb::nfs2_reply_item_offset(p, &data) {
                prop_assert!(o <= data.len());
            }
        }

        #[test]
        fn compound_op_prefixes_scan(ops in proptest::collection::vec(0u32..80, 0..6), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            // Arbitrary operation numbers with arbitrary bodies: never panics, and a scan that
            // succeeds reports at most as many operations as were declared.
            let mut e = Encoder::new();
            e.put_opaque(b"");
            e.put_u32(2);
            e.put_u32(ops.len() as u32);
            for op in &ops {
                e.put_u32(*op);
                e.put_raw(&tail);
            }
            let b = e.into_bytes();
            if let Ok(s) = ulb::scan_compound(&b) {
                prop_assert!(s.ops.len() <= ops.len());
                for r in s.ddp_items {
                    prop_assert!(r.end <= b.len());
                }
            }
        }
    }
}

/// NFSv2 results as RFC 1094 §2.3 lays them out: `stat`, then (READ) `fattr` and `nfsdata`, or
/// (READLINK) `path`, with `item` the opaque's contents.
fn nfs2_result(proc_: u32, item: &[u8], reduced: bool) -> Vec<u8> {
    let mut v = 0u32.to_be_bytes().to_vec();
    if proc_ == ulb::nfs2_proc::READ {
        v.extend((0..17u32).flat_map(|w| w.to_be_bytes()));
    }
    v.extend((item.len() as u32).to_be_bytes());
    if !reduced {
        v.extend_from_slice(item);
        v.resize(v.len() + (4 - item.len() % 4) % 4, 0);
    }
    v
}

#[test]
fn nfs2_read_and_readlink_results_are_located() {
    let b = NfsBinding::new();
    // READ: stat (4) + fattr (68) + length word: the data starts at byte 76.
    let r = nfs2_result(ulb::nfs2_proc::READ, b"abcdef", true);
    assert_eq!(
        ulb::nfs2_reply_item_offset(ulb::nfs2_proc::READ, &r).unwrap(),
        Some(76)
    );
    assert_eq!(
        b.reply_ddp_positions(2, ulb::nfs2_proc::READ, &r, &[6])
            .unwrap(),
        vec![76]
    );
    // READLINK: stat + length word.
    let r = nfs2_result(ulb::nfs2_proc::READLINK, b"/x/y", true);
    assert_eq!(
        b.reply_ddp_positions(2, ulb::nfs2_proc::READLINK, &r, &[4])
            .unwrap(),
        vec![8]
    );
    // An error status has no item: a filled Write chunk is then an error, an unused one is not.
    let err = 13u32.to_be_bytes(); // NFSERR_ACCES
    assert_eq!(
        ulb::nfs2_reply_item_offset(ulb::nfs2_proc::READ, &err).unwrap(),
        None
    );
    assert!(
        b.reply_ddp_positions(2, ulb::nfs2_proc::READ, &err, &[6])
            .is_err()
    );
    assert_eq!(
        b.reply_ddp_positions(2, ulb::nfs2_proc::READ, &err, &[0])
            .unwrap(),
        Vec::<usize>::new()
    );
    // Nothing else in NFSv2 has a DDP-eligible result (RFC 8267 §4).
    assert_eq!(ulb::nfs2_reply_item_offset(1, &r).unwrap(), None);
    // A truncated stream is an XDR error, not a panic.
    assert!(ulb::nfs2_reply_item_offset(ulb::nfs2_proc::READ, &[0, 0, 0, 0, 1]).is_err());
}

#[test]
fn nfs2_max_reply_bounds_every_procedure() {
    let b = NfsBinding::new();
    let hdr = ulb::RPC_REPLY_HEADER_MAX;
    // readargs / readdirargs: fhandle[32], then a word, then count.
    let with_count = |count: u32| {
        let mut a = vec![0u8; 32 + 4];
        a.extend(count.to_be_bytes());
        a.extend(0u32.to_be_bytes());
        a
    };
    for p in 0..=17u32 {
        let args = with_count(100);
        let max = b
            .max_reply_size(2, p, &args)
            .unwrap_or_else(|| panic!("proc {p}"));
        assert!(max >= hdr, "proc {p}");
    }
    assert_eq!(b.max_reply_size(2, 18, &[]), None);
    // READ of 100 bytes: the whole reply fits the estimate exactly.
    let read = nfs2_result(ulb::nfs2_proc::READ, &[7u8; 100], false);
    assert_eq!(
        b.max_reply_size(2, ulb::nfs2_proc::READ, &with_count(100)),
        Some(hdr + read.len())
    );
    // The count is capped at NFS_MAXDATA (8192), and a READ without a count has no estimate.
    assert_eq!(
        b.max_reply_size(2, ulb::nfs2_proc::READ, &with_count(1 << 20)),
        Some(hdr + 4 + 68 + 4 + 8192)
    );
    assert_eq!(b.max_reply_size(2, ulb::nfs2_proc::READ, &[0u8; 8]), None);
    // READLINK: the longest path (1024) fits.
    let rl = nfs2_result(ulb::nfs2_proc::READLINK, &[b'a'; 1024], false);
    assert_eq!(
        b.max_reply_size(2, ulb::nfs2_proc::READLINK, &[0u8; 32]),
        Some(hdr + rl.len())
    );
    // READDIR: count bytes of entries plus stat, end of list and eof.
    assert_eq!(
        b.max_reply_size(2, 16, &with_count(4096)),
        Some(hdr + 4096 + 12)
    );
}

#[test]
fn nfs2_reply_expectation_asks_for_one_write_chunk_for_read_and_readlink() {
    let mut read = vec![0u8; 36];
    read.extend(3000u32.to_be_bytes());
    read.extend(0u32.to_be_bytes());
    let e = ulb::nfs2_reply_expectation(ulb::nfs2_proc::READ, &read);
    assert_eq!(e.ddp_items, vec![3000]);
    assert_eq!(
        e.max_len,
        Some(ulb::RPC_REPLY_HEADER_MAX + 4 + 68 + 4 + 3000)
    );
    let e = ulb::nfs2_reply_expectation(ulb::nfs2_proc::READLINK, &[0u8; 32]);
    assert_eq!(e.ddp_items, vec![1024]);
    let e = ulb::nfs2_reply_expectation(1, &[0u8; 32]);
    assert!(e.ddp_items.is_empty());
    assert_eq!(e.max_len, Some(ulb::RPC_REPLY_HEADER_MAX + 72));
}
