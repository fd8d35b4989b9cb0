//! The version 1 header codec's unit tests.

use super::*;

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

const H: u32 = 0x1111_2222;
const L: u32 = 0x100;
const OO: u64 = 0x0000_00aa_0000_00bb;

fn seg() -> Segment {
    Segment {
        handle: H,
        length: L,
        offset: OO,
    }
}

fn hloo() -> Vec<u32> {
    vec![H, L, 0xaa, 0xbb]
}

/// RFC 8166 §4.7: "after the four fixed fields ... simply three 32-bit fields that contain
/// zero".
//= specs/rfc8166.txt#section-4.2.2
//= type=test
//# For RPC-over-RDMA version 1, this field MUST contain the value one (1).
//= specs/rfc8166.txt#section-4
//= type=test
//# All RPC-over-RDMA header content is contained in the Transport stream; thus, it MUST be XDR
//# encoded.
#[test]
fn xdr_example_no_chunks() {
    let h = Header::new(7, 32, Body::Msg(Chunks::default()));
    let b = h.to_bytes();
    assert_eq!(words(&b), vec![7, 1, 32, 0, 0, 0, 0]);
    assert_eq!(b.len(), MIN_MSG_LEN);
    assert_eq!(Header::decode(&b).unwrap(), (h, 28));
}

/// RFC 8166 §4.7: a Read chunk of three segments is `1 PHLOO 1 PHLOO 1 PHLOO 0`.
#[test]
fn xdr_example_read_chunk() {
    let mut c = Chunks::default();
    c.set_read_chunks(&[ReadChunk {
        position: 8,
        segments: vec![seg(); 3],
    }]);
    let h = Header::new(1, 1, Body::Msg(c.clone()));
    let b = h.to_bytes();
    let mut want = vec![1, 1, 1, 0];
    for _ in 0..3 {
        want.push(1);
        want.push(8);
        want.extend(hloo());
    }
    want.extend([0, 0, 0]);
    assert_eq!(words(&b), want);
    let (d, n) = Header::decode(&b).unwrap();
    assert_eq!(n, b.len());
    assert_eq!(d.body.chunks().unwrap().read_chunks().len(), 1);
    assert_eq!(d, h);
}

/// RFC 8166 §4.7: a Write list with chunks of three and two segments is
/// `1 3 HLOO HLOO HLOO 1 2 HLOO HLOO 0`; a Reply chunk of two is `1 2 HLOO HLOO`.
#[test]
fn xdr_example_write_list_and_reply_chunk() {
    let c = Chunks {
        reads: vec![],
        writes: vec![vec![seg(); 3], vec![seg(); 2]],
        reply: Some(vec![seg(); 2]),
    };
    let h = Header::new(9, 64, Body::NoMsg(c));
    let b = h.to_bytes();
    let mut want = vec![9, 1, 64, 1, 0, 1, 3];
    for _ in 0..3 {
        want.extend(hloo());
    }
    want.extend([1, 2]);
    for _ in 0..2 {
        want.extend(hloo());
    }
    want.extend([0, 1, 2]);
    for _ in 0..2 {
        want.extend(hloo());
    }
    assert_eq!(words(&b), want);
    assert_eq!(b.len(), h.encoded_len());
    assert_eq!(Header::decode(&b).unwrap().0, h);
}

//= specs/rfc8166.txt#section-4.5
//= type=test
//# o The rdma_xid field MUST contain the same XID that was in the rdma_xid field in the failing
//# request;
//= specs/rfc8166.txt#section-4.5
//= type=test
//# o The rdma_vers field MUST contain the same version that was in the rdma_vers field in the
//# failing request;
//= specs/rfc8166.txt#section-4.5
//= type=test
//# o The rdma_proc field MUST contain the value RDMA_ERROR; and
//= specs/rfc8166.txt#section-4.5.1
//= type=test
//# When a Responder detects an RPC-over-RDMA header version that it does not support (currently
//# this document defines only version 1), it MUST reply with an RDMA_ERROR procedure and set
//# the rdma_err value to ERR_VERS, also providing the low and high inclusive version numbers it
//# does, in fact, support.
//= specs/rfc8166.txt#section-4.5.2
//= type=test
//# If the rdma_vers field contains a recognized value, but an XDR parsing error occurs, the
//# Responder MUST reply with an RDMA_ERROR procedure and set the rdma_err value to ERR_CHUNK.
#[test]
fn error_bodies() {
    let v = Header::error_reply(ErrorResponse::ErrVers { xid: 5, vers: 2 }, 0).unwrap();
    assert_eq!(words(&v.to_bytes()), vec![5, 2, 1, 4, 1, 1, 1]);
    let c = Header::error_reply(ErrorResponse::ErrChunk { xid: 5 }, 64).unwrap();
    assert_eq!(words(&c.to_bytes()), vec![5, 1, 64, 4, 2]);
    assert_eq!(c.to_bytes().len(), 20);
    assert_eq!(Header::decode(&c.to_bytes()).unwrap().0, c);
    assert!(Header::error_reply(ErrorResponse::Discard, 1).is_none());
}

fn enc(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

//= specs/rfc8166.txt#section-4.2.4
//= type=test
//# Though any of these MAY be marked as not present, one MUST be present and MUST hold the
//# Payload stream for this RPC-over-RDMA message.
//= specs/rfc8166.txt#section-4.5.1
//= type=test
//# When a Responder detects an RPC-over-RDMA header version that it does not support (currently
//# this document defines only version 1), it MUST reply with an RDMA_ERROR procedure and set
//# the rdma_err value to ERR_VERS, also providing the low and high inclusive version numbers it
//# does, in fact, support.
//= specs/rfc8166.txt#section-4.5.2
//= type=test
//# If the rdma_vers field contains a recognized value, but an XDR parsing error occurs, the
//# Responder MUST reply with an RDMA_ERROR procedure and set the rdma_err value to ERR_CHUNK.
//= specs/rfc8166.txt#section-4.5
//= type=test
//# A receiver MUST silently discard an RDMA_ERROR procedure that it cannot decode.
#[test]
fn decode_errors_map_to_responses() {
    assert_eq!(
        Header::decode(&[0; 7]).unwrap_err().response(),
        ErrorResponse::Discard
    );
    assert_eq!(
        Header::decode(&enc(&[3, 2])).unwrap_err().response(),
        ErrorResponse::ErrVers { xid: 3, vers: 2 }
    );
    assert_eq!(
        Header::decode(&enc(&[3, 1, 1, 9, 0, 0, 0]))
            .unwrap_err()
            .response(),
        ErrorResponse::ErrChunk { xid: 3 }
    );
    assert_eq!(
        Header::decode(&enc(&[3, 1, 1, 0, 0, 0]))
            .unwrap_err()
            .response(),
        ErrorResponse::ErrChunk { xid: 3 }
    );
    assert_eq!(
        Header::decode(&enc(&[3, 1, 1, 0, 2, 0, 0])).unwrap_err(),
        HeaderError::BadFlag { xid: 3, value: 2 }
    );
    assert_eq!(
        Header::decode(&enc(&[3, 1, 1, 1, 0, 0, 0])).unwrap_err(),
        HeaderError::NoMsgWithoutChunks { xid: 3 }
    );
    // A malformed RDMA_ERROR is silently discarded (RFC 8166 §4.5).
    for w in [&[3, 1, 1, 4][..], &[3, 1, 1, 4, 9], &[3, 1, 1, 4, 1, 1]] {
        assert_eq!(
            Header::decode(&enc(w)).unwrap_err().response(),
            ErrorResponse::Discard
        );
    }
    // A huge segment count does not allocate.
    assert_eq!(
        Header::decode(&enc(&[3, 1, 1, 0, 0, 1, 0xffff_ffff]))
            .unwrap_err()
            .response(),
        ErrorResponse::ErrChunk { xid: 3 }
    );
    let lim = DecodeLimits {
        max_segments: 100_000_000,
        ..DecodeLimits::default()
    };
    assert_eq!(
        Header::decode_with(&enc(&[3, 1, 1, 0, 0, 1, 50_000_000]), &lim).unwrap_err(),
        HeaderError::Truncated { xid: 3 }
    );
}

#[test]
fn msgp_and_done_are_recognised() {
    let (h, _) = Header::decode(&enc(&[3, 1, 1, 3])).unwrap();
    assert_eq!(h.body, Body::Done);
    let (h, n) = Header::decode(&enc(&[3, 1, 1, 2, 4, 1024, 0, 0, 0])).unwrap();
    assert_eq!(n, 36);
    assert!(matches!(h.body, Body::MsgP { align: 4, .. }));
}
