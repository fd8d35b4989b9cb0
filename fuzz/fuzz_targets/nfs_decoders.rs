//! The client-side and binding decoders of the `nfs` crate: NFSv3 / MOUNT / port mapper
//! and NFSACL results, the RFC 8267 NFSv4 COMPOUND argument scanner and result walker, and the NFSv2/v3
//! DDP item locators. Never panics; every reported range lies inside the input; whatever
//! decodes re-encodes to exactly the bytes consumed.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfs::nfs3::*;
use nfs::ulb::{self, NfsBinding};
use rpcrdma::ulb::UpperLayerBinding;
use xdr::{Decoder, XdrDecode, XdrEncode};

fn consistent<T: XdrEncode + for<'a> XdrDecode<'a>>(b: &Bytes) {
    let mut d = Decoder::from_bytes(b).strict_padding(true);
    if let Ok(v) = T::decode(&mut d) {
        let n = d.position();
        assert_eq!(v.encoded_len(), n);
        assert_eq!(&xdr::to_bytes(&v)[..], &b[..n]);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let b = Bytes::copy_from_slice(rest);
    let binding = NfsBinding::new();
    match sel % 8 {
        0 => {
            if let Ok(s) = ulb::scan_compound(rest) {
                for r in &s.ddp_items {
                    assert!(r.start <= r.end && r.end <= rest.len());
                }
                assert!(s.read_like.iter().all(|&i| i < s.ops.len()));
            }
            let _ = binding.max_reply_size(4, 1, rest);
            let _ = ulb::short_reply_retry(100003, 4, 1, rest);
        }
        1 => {
            if let Ok(offs) = ulb::compound_reply_item_offsets(rest) {
                assert!(offs.iter().flatten().all(|&o| o <= rest.len()));
            }
            let written: Vec<usize> = rest.iter().take(4).map(|&x| usize::from(x & 1)).collect();
            let _ = binding.reply_ddp_positions(4, 1, rest, &written);
        }
        2 => {
            let p = u32::from(sel / 8) % 23;
            for v in [2, 3] {
                if let Ok(items) = binding.call_ddp_items(v, p, rest) {
                    assert!(items.iter().all(|r| r.end <= rest.len()));
                }
            }
            let _ = ulb::nfs3_max_reply(p, rest);
            let _ = ulb::nfs3_reply_expectation(p, rest);
            if let Ok(Some(o)) = ulb::nfs3_reply_item_offset(p, rest) {
                assert!(o <= rest.len());
            }
            let _ = binding.max_reply_size(2, p, rest);
            let _ = ulb::nfs2_reply_expectation(p, rest);
            if let Ok(Some(o)) = ulb::nfs2_reply_item_offset(p, rest) {
                assert!(o <= rest.len());
            }
            let _ = binding.reply_ddp_positions(2, p, rest, &[usize::from(sel & 1)]);
        }
        3 => {
            consistent::<GetattrRes>(&b);
            consistent::<SetattrRes>(&b);
            consistent::<LookupRes>(&b);
            consistent::<AccessRes>(&b);
            consistent::<ReadlinkRes>(&b);
            consistent::<ReadRes>(&b);
        }
        4 => {
            consistent::<WriteRes>(&b);
            consistent::<NewObjRes>(&b);
            consistent::<RemoveRes>(&b);
            consistent::<RenameRes>(&b);
            consistent::<LinkRes>(&b);
            consistent::<CommitRes>(&b);
        }
        5 => {
            consistent::<ReaddirRes>(&b);
            consistent::<ReaddirplusRes>(&b);
            consistent::<FsstatRes>(&b);
            consistent::<FsinfoRes>(&b);
            consistent::<PathconfRes>(&b);
        }
        6 => {
            consistent::<nfs::mount::MountRes>(&b);
            consistent::<nfs::mount::MountList>(&b);
            consistent::<nfs::mount::Exports>(&b);
            consistent::<nfs::portmap::List<nfs::portmap::Mapping>>(&b);
            consistent::<nfs::portmap::List<nfs::portmap::Rpcb>>(&b);
            consistent::<nfs::portmap::RpcbString>(&b);
            // NFSACL (GETACL results and arguments, one ACL).
            consistent::<nfs::nfsacl::GetAclRes>(&b);
            consistent::<nfs::nfsacl::GetAclArgs>(&b);
            consistent::<nfs::nfsacl::Acl>(&b);
        }
        _ => {
            if let Ok(s) = std::str::from_utf8(rest)
                && let Some(a) = nfs::portmap::parse_uaddr(s)
            {
                assert_eq!(nfs::portmap::parse_uaddr(&nfs::portmap::uaddr(a)), Some(a));
            }
            let _ = nfs::vfs::HandleData::from_fh(&Fh3(b.clone()));
        }
    }
});
