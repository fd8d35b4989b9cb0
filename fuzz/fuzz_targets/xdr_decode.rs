//! Drive the XDR decoder with arbitrary bytes. The first byte picks a script of reads; every
//! read must return Ok or a typed error, never panic, and never move past the end.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use xdr::Decoder;

fuzz_target!(|data: &[u8]| {
    let Some((&script, rest)) = data.split_first() else {
        return;
    };
    let buf = Bytes::copy_from_slice(rest);
    let mut dec = Decoder::from_bytes(&buf).strict_padding(script & 1 == 1);
    let mut op = script;
    for _ in 0..64 {
        let r = match op % 11 {
            0 => dec.u32().map(drop),
            1 => dec.i64().map(drop),
            2 => dec.bool().map(drop),
            3 => dec.opaque(1024).map(drop),
            4 => dec.opaque_bytes(u32::MAX).map(drop),
            5 => dec.string_utf8(255).map(drop),
            6 => dec.array(64, |d| d.u32()).map(drop),
            7 => dec.optional(|d| d.u64()).map(drop),
            8 => dec.list(32, |d| d.opaque(16).map(drop)).map(drop),
            9 => dec.opaque_fixed(usize::from(op)).map(drop),
            _ => dec.enumeration("e", |v| (v < 3).then_some(v)).map(drop),
        };
        assert!(dec.position() <= buf.len());
        if r.is_err() {
            break;
        }
        op = op.wrapping_mul(31).wrapping_add(7);
    }
});
