//! Fuzz `tools::decode` (`oxrdma decode`): whole capture files (pcap, pcapng, or anything), and
//! single connections' byte streams on the iWARP and RDS-over-TCP decoders. Nothing may panic;
//! the per-RPC timeline is built from whatever decoded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tools::decode::{self, timeline};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let messages = match mode % 4 {
        // A whole file.
        0 | 1 => match decode::decode(rest) {
            Ok(d) => d.messages,
            Err(_) => return,
        },
        // One connection: the second byte says where the client's stream ends and how the
        // bytes are cut into pieces.
        m => {
            let Some((&split, rest)) = rest.split_first() else {
                return;
            };
            let at = rest.len() * usize::from(split) / 255;
            let (c, s) = rest.split_at(at.min(rest.len()));
            let port = if m == 2 { 20049 } else { 16385 };
            // Pieces of 16 bytes to 4 KiB (byte by byte is covered by the proptests).
            let piece = 16 + usize::from(mode >> 2) * 64;
            decode::decode_stream(c, s, port, piece)
        }
    };
    let (rpcs, _) = timeline::build(&messages);
    for r in &rpcs {
        let _ = timeline::render(r, 0.0);
    }
    // Every message's one-line summary (the per-kind code), and the detailed tree for the first
    // few and the last: the tree is a generic walk of the serialised model whose paths do not
    // depend on how many messages there are, and rendering it for every message of a 20 KB
    // capture cost more than the decoding (a quarter of the 86 execs/s this target once ran at).
    let last = messages.len().saturating_sub(1);
    for (i, m) in messages.iter().enumerate() {
        let _ = decode::text::line(m, 0.0);
        if i < 4 || i == last {
            let _ = decode::text::detailed(m, 0.0);
        }
    }
});
