//! Property tests for the transport header and private data codecs.

use proptest::prelude::*;
use rpcrdma::header::{Body, Chunks, ErrorBody, Header, ReadSegment, Segment};
use rpcrdma::privdata::PrivateData;

fn segment() -> impl Strategy<Value = Segment> {
    (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(handle, length, offset)| Segment {
        handle,
        length,
        offset,
    })
}

fn chunks() -> impl Strategy<Value = Chunks> {
    (
        prop::collection::vec(
            (any::<u32>(), segment())
                .prop_map(|(position, target)| ReadSegment { position, target }),
            0..8,
        ),
        prop::collection::vec(prop::collection::vec(segment(), 0..6), 0..5),
        prop::option::of(prop::collection::vec(segment(), 0..6)),
    )
        .prop_map(|(reads, writes, reply)| Chunks {
            reads,
            writes,
            reply,
        })
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        chunks().prop_map(Body::Msg),
        chunks()
            .prop_filter("NOMSG needs a chunk", |c| !c.is_empty())
            .prop_map(Body::NoMsg),
        (any::<u32>(), any::<u32>(), chunks()).prop_map(|(align, thresh, chunks)| Body::MsgP {
            align,
            thresh,
            chunks
        }),
        Just(Body::Done),
        Just(Body::Error(ErrorBody::Chunk)),
        (any::<u32>(), any::<u32>())
            .prop_map(|(low, high)| Body::Error(ErrorBody::Vers { low, high })),
    ]
}

proptest! {
    //= specs/rfc8166.txt#section-2.3.2
    //= type=test
    //# The RPC-over-RDMA version 1 protocol assumes that each region of registered memory MUST be
    //# identified with a steering tag of no more than 32 bits and memory addresses of up to 64 bits
    //# in length.
    //= specs/rfc8166.txt#section-4
    //= type=test
    //# All RPC-over-RDMA header content is contained in the Transport stream; thus, it MUST be XDR
    //# encoded.
    #[test]
    fn header_round_trip(xid in any::<u32>(), credits in any::<u32>(), body in body(), tail in prop::collection::vec(any::<u8>(), 0..16)) {
        let h = Header::new(xid, credits, body);
        let mut b = h.to_bytes().to_vec();
        prop_assert_eq!(b.len(), h.encoded_len());
        let n = b.len();
        b.extend(tail);
        let (d, len) = Header::decode(&b).unwrap();
        prop_assert_eq!(len, n);
        prop_assert_eq!(d, h);
    }

    #[test]
    fn random_bytes_never_panic(b in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok((h, n)) = Header::decode(&b) {
            prop_assert!(n <= b.len());
            // What decodes re-encodes to the same prefix.
            prop_assert_eq!(&h.to_bytes()[..], &b[..n]);
        }
    }

    #[test]
    fn mutated_headers_never_panic(body in body(), flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..6)) {
        let mut b = Header::new(1, 1, body).to_bytes().to_vec();
        for (i, v) in flips {
            let n = b.len();
            b[i % n] ^= v;
        }
        let _ = Header::decode(&b).map_err(|e| e.response());
    }

    #[test]
    fn private_data_round_trip(ri in any::<bool>(), s in 0u8..=255, r in 0u8..=255) {
        let p = PrivateData { remote_invalidate: ri, send_size: (u32::from(s) + 1) << 10, recv_size: (u32::from(r) + 1) << 10 };
        prop_assert_eq!(PrivateData::decode(&p.encode()), Some(p));
    }

    #[test]
    fn private_data_random_never_panics(b in prop::collection::vec(any::<u8>(), 0..16)) {
        let _ = PrivateData::decode(&b);
    }
}
