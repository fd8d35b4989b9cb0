//! Property tests for the NFSv3, MOUNT and port mapper codecs: generated values round-trip
//! with exact `encoded_len`; arbitrary bytes never panic, and whatever decodes re-encodes to
//! exactly the bytes consumed.

use bytes::Bytes;
use nfs::mount;
use nfs::nfs3::*;
use nfs::portmap;
use proptest::prelude::*;
use xdr::{Decoder, XdrDecode, XdrEncode};

fn bytes_up_to(n: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..=n).prop_map(Bytes::from)
}

fn fh() -> impl Strategy<Value = Fh3> {
    bytes_up_to(64).prop_map(Fh3)
}

fn name() -> impl Strategy<Value = Filename3> {
    bytes_up_to(40).prop_map(Filename3)
}

fn time() -> impl Strategy<Value = Nfstime3> {
    (any::<u32>(), any::<u32>()).prop_map(|(seconds, nseconds)| Nfstime3 { seconds, nseconds })
}

fn ftype() -> impl Strategy<Value = Ftype3> {
    proptest::sample::select(Ftype3::ALL)
}

fn fattr() -> impl Strategy<Value = Fattr3> {
    (
        ftype(),
        any::<[u32; 4]>(),
        any::<[u64; 4]>(),
        any::<[u32; 2]>(),
        time(),
        time(),
        time(),
    )
        .prop_map(|(ftype, w, d, r, atime, mtime, ctime)| Fattr3 {
            ftype,
            mode: w[0],
            nlink: w[1],
            uid: w[2],
            gid: w[3],
            size: d[0],
            used: d[1],
            rdev: Specdata3 {
                specdata1: r[0],
                specdata2: r[1],
            },
            fsid: d[2],
            fileid: d[3],
            atime,
            mtime,
            ctime,
        })
}

fn settime() -> impl Strategy<Value = SetTime> {
    prop_oneof![
        Just(SetTime::DontChange),
        Just(SetTime::ServerTime),
        time().prop_map(SetTime::ClientTime)
    ]
}

fn sattr() -> impl Strategy<Value = Sattr3> {
    (
        any::<Option<u32>>(),
        any::<Option<u32>>(),
        any::<Option<u32>>(),
        any::<Option<u64>>(),
        settime(),
        settime(),
    )
        .prop_map(|(mode, uid, gid, size, atime, mtime)| Sattr3 {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        })
}

fn wcc() -> impl Strategy<Value = WccData> {
    (
        proptest::option::of(
            (any::<u64>(), time(), time()).prop_map(|(size, mtime, ctime)| WccAttr {
                size,
                mtime,
                ctime,
            }),
        ),
        proptest::option::of(fattr()),
    )
        .prop_map(|(before, after)| WccData { before, after })
}

fn dirop() -> impl Strategy<Value = DirOpArgs3> {
    (fh(), name()).prop_map(|(dir, name)| DirOpArgs3 { dir, name })
}

fn stable() -> impl Strategy<Value = StableHow> {
    proptest::sample::select(StableHow::ALL)
}

fn status_err() -> impl Strategy<Value = Nfsstat3> {
    proptest::sample::select(&Nfsstat3::ALL[1..])
}

fn roundtrip<T: XdrEncode + for<'a> XdrDecode<'a> + PartialEq + std::fmt::Debug>(
    v: &T,
) -> Result<(), TestCaseError> {
    let b = xdr::to_bytes(v);
    prop_assert_eq!(b.len(), v.encoded_len());
    let mut d = Decoder::from_bytes(&b).strict_padding(true);
    let back = T::decode(&mut d).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(d.is_empty());
    prop_assert_eq!(&back, v);
    Ok(())
}

/// Decode arbitrary bytes as `T`: never panics; a success re-encodes to the consumed prefix.
fn consistent<T: XdrEncode + for<'a> XdrDecode<'a>>(b: &Bytes) -> Result<(), TestCaseError> {
    let mut d = Decoder::from_bytes(b).strict_padding(true);
    if let Ok(v) = T::decode(&mut d) {
        let n = d.position();
        prop_assert_eq!(v.encoded_len(), n);
        prop_assert_eq!(&xdr::to_bytes(&v)[..], &b[..n]);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn nfs3_arguments_roundtrip(
        f in fh(), d in dirop(), d2 in dirop(), s in sattr(), t in proptest::option::of(time()),
        n in any::<[u64; 2]>(), c in any::<[u32; 2]>(), st in stable(), data in bytes_up_to(700),
        v in any::<[u8; 8]>(), how in 0..3u32,
    ) {
        roundtrip(&GetattrArgs { object: f.clone() })?;
        roundtrip(&SetattrArgs { object: f.clone(), new_attributes: s.clone(), guard: t })?;
        roundtrip(&LookupArgs { what: d.clone() })?;
        roundtrip(&AccessArgs { object: f.clone(), access: c[0] })?;
        roundtrip(&ReadlinkArgs { symlink: f.clone() })?;
        roundtrip(&ReadArgs { file: f.clone(), offset: n[0], count: c[1] })?;
        roundtrip(&WriteArgs { file: f.clone(), offset: n[0], count: data.len() as u32, stable: st, data: Data(data.clone()) })?;
        let how = match how { 0 => CreateHow3::Unchecked(s.clone()), 1 => CreateHow3::Guarded(s.clone()), _ => CreateHow3::Exclusive(v) };
        roundtrip(&CreateArgs { where_: d.clone(), how })?;
        roundtrip(&MkdirArgs { where_: d.clone(), attributes: s.clone() })?;
        roundtrip(&SymlinkArgs { where_: d.clone(), symlink_attributes: s.clone(), symlink_data: NfsPath(data.clone()) })?;
        for what in [
            MknodData3::Chr(s.clone(), Specdata3 { specdata1: c[0], specdata2: c[1] }),
            MknodData3::Blk(s.clone(), Specdata3 { specdata1: 1, specdata2: 2 }),
            MknodData3::Sock(s.clone()),
            MknodData3::Fifo(s.clone()),
            MknodData3::Other(Ftype3::Dir),
        ] {
            roundtrip(&MknodArgs { where_: d.clone(), what })?;
        }
        roundtrip(&RemoveArgs { object: d.clone() })?;
        roundtrip(&RenameArgs { from: d.clone(), to: d2.clone() })?;
        roundtrip(&LinkArgs { file: f.clone(), link: d2.clone() })?;
        roundtrip(&ReaddirArgs { dir: f.clone(), cookie: n[1], cookieverf: v, count: c[0] })?;
        roundtrip(&ReaddirplusArgs { dir: f.clone(), cookie: n[1], cookieverf: v, dircount: c[0], maxcount: c[1] })?;
        roundtrip(&FsArgs { fsroot: f.clone() })?;
        roundtrip(&CommitArgs { file: f, offset: n[0], count: c[0] })?;
    }

    #[test]
    fn nfs3_results_roundtrip(
        a in fattr(), w in wcc(), w2 in wcc(), f in proptest::option::of(fh()), err in status_err(),
        data in bytes_up_to(700), names in proptest::collection::vec((any::<u64>(), name(), any::<u64>()), 0..5),
        x in any::<[u32; 7]>(), y in any::<[u64; 6]>(), b in any::<[bool; 4]>(), v in any::<[u8; 8]>(), st in stable(),
    ) {
        let pa = Some(a.clone());
        roundtrip(&GetattrRes::Ok(GetattrOk { obj_attributes: a.clone() }))?;
        roundtrip(&GetattrRes::Err(err, nfs::Void))?;
        roundtrip(&SetattrRes::Err(err, WccOnly { wcc: w.clone() }))?;
        roundtrip(&LookupRes::Ok(LookupOk { object: f.clone().unwrap_or_default(), obj_attributes: pa.clone(), dir_attributes: None }))?;
        roundtrip(&LookupRes::Err(err, AttrOnly { attributes: pa.clone() }))?;
        roundtrip(&AccessRes::Ok(AccessOk { obj_attributes: pa.clone(), access: x[0] }))?;
        roundtrip(&ReadlinkRes::Ok(ReadlinkOk { symlink_attributes: pa.clone(), data: NfsPath(data.clone()) }))?;
        roundtrip(&ReadRes::Ok(ReadOk { file_attributes: pa.clone(), count: data.len() as u32, eof: b[0], data: Data(data.clone()) }))?;
        roundtrip(&WriteRes::Ok(WriteOk { file_wcc: w.clone(), count: x[1], committed: st, verf: v }))?;
        roundtrip(&NewObjRes::Ok(NewObjOk { obj: f.clone(), obj_attributes: pa.clone(), dir_wcc: w.clone() }))?;
        roundtrip(&RemoveRes::Ok(WccOnly { wcc: w.clone() }))?;
        roundtrip(&RenameRes::Err(err, RenameWcc { fromdir_wcc: w.clone(), todir_wcc: w2.clone() }))?;
        roundtrip(&LinkRes::Ok(LinkWcc { file_attributes: pa.clone(), linkdir_wcc: w2.clone() }))?;
        let entries: Vec<Entry3> = names.iter().map(|(fileid, name, cookie)| Entry3 { fileid: *fileid, name: name.clone(), cookie: *cookie }).collect();
        roundtrip(&ReaddirRes::Ok(ReaddirOk { dir_attributes: pa.clone(), cookieverf: v, entries: EntryList(entries), eof: b[1] }))?;
        let plus: Vec<Entryplus3> = names.iter().map(|(fileid, name, cookie)| Entryplus3 {
            fileid: *fileid, name: name.clone(), cookie: *cookie, name_attributes: pa.clone(), name_handle: f.clone(),
        }).collect();
        roundtrip(&ReaddirplusRes::Ok(ReaddirplusOk { dir_attributes: None, cookieverf: v, entries: EntryList(plus), eof: b[2] }))?;
        roundtrip(&FsstatRes::Ok(FsstatOk { obj_attributes: pa.clone(), tbytes: y[0], fbytes: y[1], abytes: y[2], tfiles: y[3], ffiles: y[4], afiles: y[5], invarsec: x[2] }))?;
        roundtrip(&FsinfoRes::Ok(FsinfoOk {
            obj_attributes: pa.clone(), rtmax: x[0], rtpref: x[1], rtmult: x[2], wtmax: x[3], wtpref: x[4], wtmult: x[5], dtpref: x[6],
            maxfilesize: y[0], time_delta: Nfstime3 { seconds: 0, nseconds: 1 }, properties: x[3],
        }))?;
        roundtrip(&PathconfRes::Ok(PathconfOk { obj_attributes: pa, linkmax: x[0], name_max: x[1], no_trunc: b[0], chown_restricted: b[1], case_insensitive: b[2], case_preserving: b[3] }))?;
        roundtrip(&CommitRes::Ok(CommitOk { file_wcc: w, verf: v }))?;
    }

    #[test]
    fn mount_and_portmap_roundtrip(
        f in bytes_up_to(64), path in bytes_up_to(100), flavors in proptest::collection::vec(any::<u32>(), 0..4),
        hosts in proptest::collection::vec((bytes_up_to(20), bytes_up_to(30)), 0..4), m in any::<[u32; 4]>(),
        s in proptest::collection::vec(bytes_up_to(30), 3..=3),
    ) {
        roundtrip(&mount::MountRes::Ok(mount::MountOk { fhandle: mount::Fhandle3(f), auth_flavors: flavors }))?;
        roundtrip(&mount::MountRes::Err(mount::Mountstat3::Acces))?;
        roundtrip(&mount::DirPath(path.clone()))?;
        let ml: mount::MountList = mount::List(Vec::new());
        roundtrip(&ml)?;
        roundtrip(&mount::List(hosts.iter().map(|(h, d)| mount::MountBody { hostname: mount::Name(h.clone()), directory: mount::DirPath(d.clone()) }).collect()))?;
        roundtrip(&mount::List(vec![mount::ExportNode {
            dir: mount::DirPath(path),
            groups: mount::List(hosts.iter().map(|(h, _)| mount::Name(h.clone())).collect()),
        }]))?;
        let mapping = portmap::Mapping { prog: m[0], vers: m[1], prot: m[2], port: m[3] };
        roundtrip(&mapping)?;
        roundtrip(&portmap::List(vec![mapping.clone(), mapping]))?;
        let rpcb = portmap::Rpcb {
            prog: m[0], vers: m[1],
            netid: portmap::RpcbString(s[0].clone()), addr: portmap::RpcbString(s[1].clone()), owner: portmap::RpcbString(s[2].clone()),
        };
        roundtrip(&rpcb)?;
        roundtrip(&portmap::List(vec![rpcb]))?;
    }

    #[test]
    fn arbitrary_bytes_decode_consistently(raw in proptest::collection::vec(any::<u8>(), 0..600)) {
        let b = Bytes::from(raw);
        consistent::<GetattrArgs>(&b)?;
        consistent::<SetattrArgs>(&b)?;
        consistent::<LookupArgs>(&b)?;
        consistent::<AccessArgs>(&b)?;
        consistent::<ReadArgs>(&b)?;
        consistent::<WriteArgs>(&b)?;
        consistent::<CreateArgs>(&b)?;
        consistent::<MkdirArgs>(&b)?;
        consistent::<SymlinkArgs>(&b)?;
        consistent::<MknodArgs>(&b)?;
        consistent::<RemoveArgs>(&b)?;
        consistent::<RenameArgs>(&b)?;
        consistent::<LinkArgs>(&b)?;
        consistent::<ReaddirArgs>(&b)?;
        consistent::<ReaddirplusArgs>(&b)?;
        consistent::<CommitArgs>(&b)?;
        consistent::<GetattrRes>(&b)?;
        consistent::<SetattrRes>(&b)?;
        consistent::<LookupRes>(&b)?;
        consistent::<AccessRes>(&b)?;
        consistent::<ReadlinkRes>(&b)?;
        consistent::<ReadRes>(&b)?;
        consistent::<WriteRes>(&b)?;
        consistent::<NewObjRes>(&b)?;
        consistent::<RenameRes>(&b)?;
        consistent::<LinkRes>(&b)?;
        consistent::<ReaddirRes>(&b)?;
        consistent::<ReaddirplusRes>(&b)?;
        consistent::<FsstatRes>(&b)?;
        consistent::<FsinfoRes>(&b)?;
        consistent::<PathconfRes>(&b)?;
        consistent::<CommitRes>(&b)?;
        consistent::<mount::MountRes>(&b)?;
        consistent::<mount::MountList>(&b)?;
        consistent::<mount::Exports>(&b)?;
        consistent::<portmap::Mapping>(&b)?;
        consistent::<portmap::Rpcb>(&b)?;
        consistent::<portmap::List<portmap::Rpcb>>(&b)?;
        for p in 0..23 {
            let _ = nfs::server::Args::decode(p, &b);
            let _ = nfs::nfs3::args_ddp_item(p, &b);
        }
    }

    #[test]
    fn uaddr_roundtrip(ip in any::<[u8; 4]>(), ip6 in any::<[u16; 8]>(), port in any::<u16>()) {
        let a = std::net::SocketAddr::from((ip, port));
        prop_assert_eq!(portmap::parse_uaddr(&portmap::uaddr(a)), Some(a));
        let a6 = std::net::SocketAddr::from((std::net::Ipv6Addr::from(ip6), port));
        prop_assert_eq!(portmap::parse_uaddr(&portmap::uaddr(a6)), Some(a6));
    }
}

#[test]
fn bounds_are_enforced() {
    // A 65-byte handle is refused; a 64-byte one accepted.
    let mut e = xdr::Encoder::new();
    e.put_opaque(&[0; 65]);
    assert!(xdr::from_slice::<GetattrArgs>(&e.into_bytes()).is_err());
    let mut e = xdr::Encoder::new();
    e.put_opaque(&[0; 64]);
    assert!(xdr::from_slice::<GetattrArgs>(&e.into_bytes()).is_ok());
    // Unknown nfsstat3, ftype3, stable_how and createmode values are refused.
    assert!(xdr::from_slice::<GetattrRes>(&[0, 0, 0, 3]).is_err());
    let mut e = xdr::Encoder::new();
    e.put_opaque(&[1; 8]);
    e.put_opaque(b"n");
    e.put_u32(3);
    assert!(xdr::from_slice::<CreateArgs>(&e.into_bytes()).is_err());
    // A MOUNT path longer than MNTPATHLEN is refused.
    let mut e = xdr::Encoder::new();
    e.put_opaque(&[b'a'; 1025]);
    assert!(xdr::from_slice::<mount::DirPath>(&e.into_bytes()).is_err());
}
