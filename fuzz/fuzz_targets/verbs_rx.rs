//! Drive the verbs soft-iWARP receive path (MPA FPDU framing -> DDP/RDMAP engine) with arbitrary
//! bytes, plus the MPA connection-setup frame decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use verbs::engine::RxHarness;
use verbs::wire::mpa::MpaFrame;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let _ = MpaFrame::decode(rest);
    let mut h = RxHarness::new(mode & 1 != 0, mode & 2 != 0);
    if mode & 4 != 0 {
        h = h.with_direct_placement();
    }
    // Split the stream at points chosen by the mode byte so partial FPDUs are exercised.
    let step = usize::from(mode >> 3).max(1) * 7;
    for chunk in rest.chunks(step) {
        h.feed(chunk);
    }
});
