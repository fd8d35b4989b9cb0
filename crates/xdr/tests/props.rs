//! Property tests: every XDR type round-trips, reduction is reversible, and arbitrary bytes
//! never panic the decoder.

use bytes::Bytes;
use proptest::prelude::*;
use xdr::{DdpPolicy, Decoder, Encoder, XdrError, from_slice, padded, to_bytes};

/// One value of every XDR type, for mixed streams.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Int(i32),
    Uint(u32),
    Hyper(i64),
    Uhyper(u64),
    Float(u32),  // bit pattern, so NaNs compare
    Double(u64), // bit pattern
    Bool(bool),
    Enum(i32),
    Fixed(Vec<u8>),
    Opaque(Vec<u8>),
    Str(String),
    Array(Vec<u32>),
    FixedArray([i64; 3]),
    Optional(Option<u64>),
    Union(u32, Vec<u8>),
    List(Vec<u32>),
}

fn item() -> impl Strategy<Value = Item> {
    prop_oneof![
        any::<i32>().prop_map(Item::Int),
        any::<u32>().prop_map(Item::Uint),
        any::<i64>().prop_map(Item::Hyper),
        any::<u64>().prop_map(Item::Uhyper),
        any::<u32>().prop_map(Item::Float),
        any::<u64>().prop_map(Item::Double),
        any::<bool>().prop_map(Item::Bool),
        (0i32..5).prop_map(Item::Enum),
        proptest::collection::vec(any::<u8>(), 7).prop_map(Item::Fixed),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Item::Opaque),
        "[a-zA-Z0-9 ./é]{0,40}".prop_map(Item::Str),
        proptest::collection::vec(any::<u32>(), 0..20).prop_map(Item::Array),
        any::<[i64; 3]>().prop_map(Item::FixedArray),
        any::<Option<u64>>().prop_map(Item::Optional),
        (0u32..3, proptest::collection::vec(any::<u8>(), 0..9)).prop_map(|(d, b)| match d {
            // Canonical forms: arm 0 is void, arm 1 carries only a count.
            0 => Item::Union(0, vec![]),
            1 => Item::Union(1, vec![0; b.len()]),
            _ => Item::Union(d, b),
        }),
        proptest::collection::vec(any::<u32>(), 0..10).prop_map(Item::List),
    ]
}

fn put(enc: &mut Encoder, it: &Item) {
    match it {
        Item::Int(v) => enc.put_i32(*v),
        Item::Uint(v) => enc.put_u32(*v),
        Item::Hyper(v) => enc.put_i64(*v),
        Item::Uhyper(v) => enc.put_u64(*v),
        Item::Float(v) => enc.put_f32(f32::from_bits(*v)),
        Item::Double(v) => enc.put_f64(f64::from_bits(*v)),
        Item::Bool(v) => enc.put_bool(*v),
        Item::Enum(v) => enc.put_enum(*v),
        Item::Fixed(b) => enc.put_opaque_fixed(b),
        Item::Opaque(b) => enc.put_opaque_bytes(Bytes::copy_from_slice(b)),
        Item::Str(s) => enc.put_string(s.as_bytes()),
        Item::Array(v) => enc.put_array(v, |e, x| e.put_u32(*x)),
        Item::FixedArray(v) => v.iter().for_each(|x| enc.put_i64(*x)),
        Item::Optional(v) => enc.put_optional(v.as_ref(), |e, x| e.put_u64(*x)),
        Item::Union(d, b) => {
            // union switch (unsigned d) { case 0: void; case 1: unsigned; default: opaque<> }
            enc.put_u32(*d);
            match d {
                0 => {}
                1 => enc.put_u32(b.len() as u32),
                _ => enc.put_opaque(b),
            }
        }
        Item::List(v) => enc.put_list(v, |e, x| e.put_u32(*x)),
    }
}

fn get(dec: &mut Decoder<'_>, like: &Item) -> Result<Item, XdrError> {
    Ok(match like {
        Item::Int(_) => Item::Int(dec.i32()?),
        Item::Uint(_) => Item::Uint(dec.u32()?),
        Item::Hyper(_) => Item::Hyper(dec.i64()?),
        Item::Uhyper(_) => Item::Uhyper(dec.u64()?),
        Item::Float(_) => Item::Float(dec.f32()?.to_bits()),
        Item::Double(_) => Item::Double(dec.f64()?.to_bits()),
        Item::Bool(_) => Item::Bool(dec.bool()?),
        Item::Enum(_) => {
            Item::Enum(dec.enumeration("test_enum", |v| (0..5).contains(&v).then_some(v))?)
        }
        Item::Fixed(_) => Item::Fixed(dec.opaque_fixed(7)?.to_vec()),
        Item::Opaque(_) => Item::Opaque(dec.opaque_bytes(300)?.to_vec()),
        Item::Str(_) => Item::Str(dec.string_utf8(1024)?.to_owned()),
        Item::Array(_) => Item::Array(dec.array(20, |d| d.u32())?),
        Item::FixedArray(_) => {
            let v = dec.array_fixed(3, |d| d.i64())?;
            Item::FixedArray([v[0], v[1], v[2]])
        }
        Item::Optional(_) => Item::Optional(dec.optional(|d| d.u64())?),
        Item::Union(..) => {
            let d = dec.u32()?;
            match d {
                0 => Item::Union(0, vec![]),
                1 => Item::Union(1, vec![0; dec.u32()? as usize]),
                _ => Item::Union(d, dec.opaque(8)?.to_vec()),
            }
        }
        Item::List(_) => Item::List(dec.list(10, |d| d.u32())?),
    })
}

fn expected_len(it: &Item) -> usize {
    match it {
        Item::Int(_) | Item::Uint(_) | Item::Float(_) | Item::Bool(_) | Item::Enum(_) => 4,
        Item::Hyper(_) | Item::Uhyper(_) | Item::Double(_) => 8,
        Item::Fixed(b) => padded(b.len()),
        Item::Opaque(b) => 4 + padded(b.len()),
        Item::Str(s) => 4 + padded(s.len()),
        Item::Array(v) => 4 + 4 * v.len(),
        Item::FixedArray(_) => 24,
        Item::Optional(v) => 4 + if v.is_some() { 8 } else { 0 },
        Item::Union(d, b) => {
            4 + match d {
                0 => 0,
                1 => 4,
                _ => 4 + padded(b.len()),
            }
        }
        Item::List(v) => 4 + 8 * v.len(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_type_round_trips(items in proptest::collection::vec(item(), 0..24), threshold in 1usize..600) {
        let mut enc = Encoder::new().with_ref_threshold(threshold);
        for it in &items { put(&mut enc, it); }
        let encoded = enc.finish();
        prop_assert_eq!(encoded.len(), items.iter().map(expected_len).sum::<usize>());
        prop_assert_eq!(encoded.len() % 4, 0);
        let flat = encoded.to_bytes();
        prop_assert_eq!(flat.len(), encoded.len());
        // Appended after a header, the same bytes.
        let mut after = bytes::BytesMut::from(&b"hdr:"[..]);
        encoded.put_into(&mut after);
        prop_assert_eq!(&after[..4], b"hdr:");
        prop_assert_eq!(&after[4..], &flat[..]);
        let mut dec = Decoder::from_bytes(&flat).strict_padding(true);
        for it in &items {
            let got = get(&mut dec, it).expect("decodes what it encoded");
            prop_assert_eq!(&got, it);
        }
        prop_assert!(dec.finish().is_ok());
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..256),
                                script in proptest::collection::vec(item(), 1..16)) {
        let b = Bytes::from(data);
        let mut dec = Decoder::from_bytes(&b).strict_padding(true);
        for it in &script {
            if get(&mut dec, it).is_err() { break; }
        }
        prop_assert!(dec.position() <= b.len());
    }

    #[test]
    fn reduction_removes_items_and_padding_and_is_reversible(
        before in proptest::collection::vec(any::<u32>(), 0..6),
        chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..5),
        min_len in 0usize..20,
        max_items in 0usize..4,
    ) {
        let build = |policy| {
            let mut enc = Encoder::new().with_policy(policy).with_ref_threshold(8);
            for v in &before { enc.put_u32(*v); }
            for c in &chunks { enc.put_ddp_opaque(Bytes::copy_from_slice(c)); enc.put_u32(0xdead_beef); }
            enc.finish()
        };
        let inline = build(DdpPolicy::Inline);
        let reduced = build(DdpPolicy::Reduce { min_len, max_items });
        prop_assert!(inline.reduced.is_empty());
        let expect_reduced: Vec<&Vec<u8>> = chunks.iter().filter(|c| c.len() >= min_len).take(max_items).collect();
        prop_assert_eq!(reduced.reduced.len(), expect_reduced.len());
        let removed: usize = reduced.reduced.iter().map(|r| r.padded_len()).sum();
        prop_assert_eq!(reduced.len() + removed, inline.len());
        for (r, c) in reduced.reduced.iter().zip(expect_reduced) {
            prop_assert_eq!(&r.data[..], &c[..]);
            prop_assert_eq!(r.position % 4, 0);
            // The length word stays in the stream right before the Position.
            let flat = reduced.to_bytes();
            let w = &flat[r.position - 4..r.position];
            prop_assert_eq!(u32::from_be_bytes([w[0], w[1], w[2], w[3]]) as usize, c.len());
        }
        prop_assert_eq!(reduced.unreduced(), inline.to_bytes());
    }
}

#[test]
fn rfc4506_examples_encode_exactly() {
    // RFC 4506 §4.10: opaque of 5 bytes is length 5, 5 bytes, 3 zero bytes.
    let mut enc = Encoder::new();
    enc.put_opaque(b"hello");
    assert_eq!(&enc.into_bytes()[..], b"\0\0\0\x05hello\0\0\0");
    // §4.4: bool TRUE is 1; §4.5: hyper is big-endian two's complement.
    assert_eq!(&to_bytes(&true)[..], &[0, 0, 0, 1]);
    assert_eq!(
        &to_bytes(&-2i64)[..],
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]
    );
    // §4.19: optional-data absent is a single FALSE.
    assert_eq!(&to_bytes(&Option::<u32>::None)[..], &[0, 0, 0, 0]);
}

#[test]
fn decoder_errors_are_typed() {
    assert_eq!(
        from_slice::<u64>(&[0, 0, 0, 1]),
        Err(XdrError::Truncated {
            offset: 0,
            needed: 8,
            available: 4
        })
    );
    assert_eq!(
        from_slice::<bool>(&[0, 0, 0, 2]),
        Err(XdrError::InvalidBool {
            offset: 0,
            value: 2
        })
    );
    assert_eq!(
        from_slice::<u32>(&[0, 0, 0, 1, 9]),
        Err(XdrError::TrailingBytes { count: 1 })
    );
    let mut d = Decoder::new(&[0, 0, 1, 0]);
    assert_eq!(
        d.opaque(255),
        Err(XdrError::TooLong {
            offset: 0,
            len: 256,
            max: 255
        })
    );
    let mut d = Decoder::new(&[0, 0, 0, 1, b'a', 1, 0, 0]).strict_padding(true);
    assert_eq!(d.opaque(8), Err(XdrError::NonZeroPadding { offset: 5 }));
    let mut d = Decoder::new(&[0, 0, 0, 1, b'a', 1, 0, 0]);
    assert_eq!(d.opaque(8), Ok(&b"a"[..]), "lenient padding by default");
    let mut d = Decoder::new(&[0, 0, 0, 2, 0xff, 0xfe, 0, 0]);
    assert_eq!(d.string_utf8(8), Err(XdrError::InvalidUtf8 { offset: 0 }));
    let mut d = Decoder::new(&[0, 0, 0, 7]);
    assert_eq!(
        d.optional(|d| d.u32()),
        Err(XdrError::InvalidOptional {
            offset: 0,
            value: 7
        })
    );
    let mut d = Decoder::new(&[0, 0, 0, 9]);
    assert_eq!(
        d.enumeration("stable_how", |v| (0..3).contains(&v).then_some(v)),
        Err(XdrError::InvalidDiscriminant {
            type_name: "stable_how",
            value: 9
        })
    );
}

#[test]
fn huge_declared_array_does_not_allocate_or_panic() {
    // A count of 2^32 - 1 with no elements behind it must fail on truncation, quickly.
    let mut d = Decoder::new(&[0xff, 0xff, 0xff, 0xff]);
    assert!(matches!(
        d.array(u32::MAX, |d| d.u32()),
        Err(XdrError::Truncated { .. })
    ));
    let mut d = Decoder::new(&[0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
    assert!(matches!(
        d.list(2, |d| d.u32()),
        Err(XdrError::Truncated { .. })
    ));
    let mut d = Decoder::new(&[0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 6, 0, 0, 0, 1]);
    assert!(matches!(
        d.list(2, |d| d.u32()),
        Err(XdrError::TooLong { .. })
    ));
}

#[test]
fn large_opaques_are_referenced_not_copied() {
    let big = Bytes::from(vec![7u8; 4096]);
    let mut enc = Encoder::new();
    enc.put_u32(1);
    enc.put_opaque_bytes(big.clone());
    let e = enc.finish();
    // [header word + length], [the big body itself], no padding part needed.
    assert_eq!(e.parts.len(), 2);
    assert_eq!(
        e.parts[1].as_ptr(),
        big.as_ptr(),
        "body is the caller's buffer, not a copy"
    );
    // And the zero-copy decode hands back a slice of the same allocation.
    let flat = e.to_bytes();
    let mut d = Decoder::from_bytes(&flat);
    d.u32().unwrap();
    let got = d.opaque_bytes(8192).unwrap();
    assert_eq!(got.len(), 4096);
    assert!(std::ptr::eq(got.as_ptr(), flat[8..].as_ptr()));
}

#[test]
fn ddp_item_under_inline_policy_is_plain_opaque() {
    let mut a = Encoder::new();
    assert!(!a.put_ddp_opaque(Bytes::from_static(b"abc")));
    let mut b = Encoder::new();
    b.put_opaque(b"abc");
    assert_eq!(a.into_bytes(), b.into_bytes());
}

proptest! {
    /// `PutWords` (inlined stores) writes exactly what `bytes::BufMut` writes, and the
    /// encoder's words decode back.
    #[test]
    fn put_words_match_bufmut(words in proptest::collection::vec(any::<u32>(), 0..16), h in any::<u64>()) {
        use bytes::{BufMut, BytesMut};
        let mut ours = BytesMut::new();
        let mut theirs = BytesMut::new();
        for &w in &words {
            xdr::PutWords::put_u32(&mut ours, w);
            theirs.put_u32(w);
        }
        xdr::PutWords::put_u64(&mut ours, h);
        theirs.put_u64(h);
        prop_assert_eq!(&ours[..], &theirs[..]);

        let mut e = Encoder::new();
        for &w in &words {
            e.put_u32(w);
            e.put_i32(w as i32);
        }
        e.put_u64(h);
        e.put_i64(h as i64);
        e.put_bool(h & 1 == 1);
        let b = e.into_bytes();
        let mut d = Decoder::new(&b);
        for &w in &words {
            prop_assert_eq!(d.u32().unwrap(), w);
            prop_assert_eq!(d.i32().unwrap(), w as i32);
        }
        prop_assert_eq!(d.u64().unwrap(), h);
        prop_assert_eq!(d.i64().unwrap(), h as i64);
        prop_assert_eq!(d.bool().unwrap(), h & 1 == 1);
        prop_assert!(d.is_empty());
    }
}
