//! What a Terminate message's layer, error type and code mean (RFC 5040 §4.8, RFC 5041 §7,
//! RFC 5044 §8; the constants of `verbs::wire::ddp::term`).

use verbs::wire::ddp::term as t;

/// The layer's name and a description of the error.
pub fn describe(layer: u8, etype: u8, code: u8) -> (&'static str, String) {
    match layer {
        0 => {
            let ty = match etype {
                t::RDMAP_ETYPE_CATASTROPHIC => "local catastrophic",
                t::RDMAP_ETYPE_REMOTE_PROTECTION => "remote protection",
                t::RDMAP_ETYPE_REMOTE_OPERATION => "remote operation",
                _ => "unknown type",
            };
            let what = match code {
                t::RDMAP_INVALID_STAG => "invalid STag",
                t::RDMAP_BASE_BOUNDS => "base or bounds violation",
                t::RDMAP_ACCESS_RIGHTS => "access rights violation",
                t::RDMAP_STAG_NOT_ASSOC => "STag not associated with RDMAP stream",
                0x04 => "TO wrap",
                t::RDMAP_VERSION => "invalid RDMAP version",
                t::RDMAP_UNEXPECTED_OPCODE => "unexpected opcode",
                t::RDMAP_CATASTROPHIC_STREAM => "catastrophic error, localized to stream",
                0x08 => "catastrophic error, global",
                t::RDMAP_CANNOT_INVALIDATE => "STag cannot be invalidated",
                0xff => "unspecified error",
                _ => "unknown code",
            };
            ("RDMAP", format!("{ty}: {what}"))
        }
        1 => {
            let (ty, what) = match etype {
                t::DDP_ETYPE_CATASTROPHIC => ("local catastrophic", "unspecified"),
                t::DDP_ETYPE_TAGGED => (
                    "tagged buffer",
                    match code {
                        t::DDP_T_INVALID_STAG => "invalid STag",
                        t::DDP_T_BASE_BOUNDS => "base or bounds violation",
                        t::DDP_T_STAG_NOT_ASSOC => "STag not associated with DDP stream",
                        t::DDP_T_TO_WRAP => "TO wrap",
                        t::DDP_T_VERSION => "invalid DDP version",
                        _ => "unknown code",
                    },
                ),
                t::DDP_ETYPE_UNTAGGED => (
                    "untagged buffer",
                    match code {
                        t::DDP_U_INVALID_QN => "invalid QN",
                        t::DDP_U_NO_BUFFER => "invalid MSN, no buffer available",
                        t::DDP_U_MSN_RANGE => "invalid MSN, MSN range not valid",
                        t::DDP_U_INVALID_MO => "invalid MO",
                        t::DDP_U_TOO_LONG => "message too long for the buffer",
                        t::DDP_U_VERSION => "invalid DDP version",
                        _ => "unknown code",
                    },
                ),
                _ => ("unknown type", "unknown code"),
            };
            ("DDP", format!("{ty}: {what}"))
        }
        2 => {
            // LLP codes as Linux siw's iwarp.h (llp_ecode) numbers them.
            let what = match (etype, code) {
                (t::LLP_ETYPE_MPA, 0x01) => "TCP stream lost",
                (t::LLP_ETYPE_MPA, t::MPA_CRC) => "MPA CRC error",
                (t::LLP_ETYPE_MPA, 0x03) => "FPDU start / marker error",
                (t::LLP_ETYPE_MPA, t::MPA_INVALID_REQ_REP) => "MPA invalid request/reply",
                (t::LLP_ETYPE_MPA, 0x05) => "local catastrophic",
                (t::LLP_ETYPE_MPA, 0x06) => "insufficient IRD",
                (t::LLP_ETYPE_MPA, 0x07) => "no matching RTR",
                _ => "unknown LLP error",
            };
            ("LLP", what.to_string())
        }
        _ => ("unknown", format!("layer {layer} type {etype} code {code}")),
    }
}
