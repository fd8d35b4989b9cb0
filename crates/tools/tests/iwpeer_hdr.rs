//! The iwpeer control header: property round trips, a decoder that never panics, and the seed
//! corpus of the `iwpeer_hdr` fuzz target (`fuzz/corpus/iwpeer_hdr`: one valid header of each
//! message type; `OXRDMA_WRITE_FUZZ_SEEDS=1` rewrites it).

use std::path::PathBuf;

use proptest::prelude::*;
use tools::iwpeer::hdr::{HdrError, MAGIC, msg};
use tools::iwpeer::{HDR_LEN, Hdr};

fn any_hdr() -> impl Strategy<Value = Hdr> {
    (
        any::<u16>(),
        any::<u8>(),
        any::<u8>(),
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(typ, op, flags, iter, len, addr, rkey, arg)| Hdr {
            typ,
            op,
            flags,
            iter,
            len,
            addr,
            rkey,
            arg,
        })
}

proptest! {
    #[test]
    fn header_round_trips(h in any_hdr(), tail in proptest::collection::vec(any::<u8>(), 0..64)) {
        let b = h.encode();
        prop_assert_eq!(b.len(), Hdr::encoded_len());
        prop_assert_eq!(u32::from_be_bytes([b[0], b[1], b[2], b[3]]), MAGIC);
        prop_assert_eq!(Hdr::decode(&b), Ok(h));
        // The header opens a Send: whatever follows it is the payload, not the header's.
        let mut with_payload = b.to_vec();
        with_payload.extend_from_slice(&tail);
        prop_assert_eq!(Hdr::decode(&with_payload), Ok(h));
    }

    #[test]
    fn decoder_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
        match Hdr::decode(&b) {
            Ok(h) => prop_assert_eq!(&h.encode()[..], &b[..HDR_LEN]),
            Err(HdrError::Short(n)) => prop_assert!(n < HDR_LEN && n == b.len()),
            Err(HdrError::Magic(m)) => prop_assert_ne!(m, MAGIC),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }
}

/// One valid header of each message type, as the protocol uses them.
fn seeds() -> Vec<(&'static str, Hdr)> {
    let h = |typ, op, flags, iter, len, addr, rkey, arg| Hdr {
        typ,
        op,
        flags,
        iter,
        len,
        addr,
        rkey,
        arg,
    };
    vec![
        ("hello", h(msg::HELLO, 0, 3, 2, 65536, 0x1000, 0x1234, 0x1e)),
        ("data", h(msg::DATA, 1, 0, 0, 4093, 0, 0, 0)),
        ("data-sendinv", h(msg::DATA, 2, 0, 1, 100, 0, 0xabcd, 0)),
        ("ack", h(msg::ACK, 3, 0, 1, 0, 0, 0, 0)),
        ("invkey-req", h(msg::INVKEY_REQ, 2, 0, 0, 0, 0, 0, 0)),
        ("invkey", h(msg::INVKEY, 2, 0, 0, 64, 0x2000, 0x5678, 0)),
        ("wrote", h(msg::WROTE, 3, 0, 0, 4096, 0, 0, 0)),
        ("fill", h(msg::FILL, 4, 0, 0, 4096, 0, 0, 0)),
        ("filled", h(msg::FILLED, 4, 0, 0, 0, 0, 0, 0)),
        ("done", h(msg::DONE, 0, 0, 0, 0, 0, 0, 0)),
        ("nak", h(msg::NAK, 1, 0, 0, 65536, 0, 0, 1)),
    ]
}

#[test]
fn fuzz_seed_corpus_is_the_seed_headers() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/iwpeer_hdr");
    let write = std::env::var_os("OXRDMA_WRITE_FUZZ_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).expect("corpus directory");
    }
    for (name, h) in seeds() {
        let path = dir.join(name);
        if write {
            std::fs::write(&path, h.encode()).expect("seed written");
        }
        let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(Hdr::decode(&b), Ok(h), "{name}");
    }
}
