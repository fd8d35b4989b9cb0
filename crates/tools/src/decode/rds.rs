//! RDS messages (RDS 3.1 as Linux puts it on the wire, the `rds::wire` decoders): on an
//! RDS-over-TCP byte stream (port 16385) they follow each other, a 48-byte header and its
//! payload; over iWARP each Send is one fragment, a header and at most 4096 payload bytes.

use ::rds::wire::{CONG_MAP_LEN, CongMap, Extension, Header, HeaderView, flags};
pub use ::rds::wire::{HEADER_LEN, MAX_MSG_LEN};

use super::model::RdsInfo;

fn ext_name(e: &Extension) -> String {
    match e {
        Extension::Version(v) => format!("VERSION({v:#x})"),
        Extension::Rdma { rkey } => format!("RDMA(rkey={rkey:#x})"),
        Extension::RdmaDest { rkey, offset } => format!("RDMA_DEST(rkey={rkey:#x},off={offset})"),
        Extension::RdmaBytes { bytes, flags } => format!("RDMA_BYTES({bytes},flags={flags})"),
        Extension::Npaths(n) => format!("NPATHS({n})"),
        Extension::GenNum(g) => format!("GEN_NUM({g:#x})"),
        Extension::SportIdx(i) => format!("SPORT_IDX({i})"),
        Extension::Unknown(t) => format!("UNKNOWN({t})"),
        other => format!("{other:?}"),
    }
}

fn kind(h: &Header) -> &'static str {
    if h.is_cong_map() {
        "cong_map"
    } else if h.is_probe() {
        "probe"
    } else if h.is_ack_only() {
        "ack"
    } else if h.is_ping() {
        "ping"
    } else if h.sport == 0 && h.len == 0 {
        // A pong answers a ping: from port 0 to the pinger's port.
        "pong"
    } else if h.flags & flags::HB_PING != 0 {
        "heartbeat_ping"
    } else if h.flags & flags::HB_PONG != 0 {
        "heartbeat_pong"
    } else {
        "data"
    }
}

/// Describe one message from its header and payload (`payload` may be a fragment of it).
pub fn describe(h: &Header, payload: &[u8]) -> RdsInfo {
    let mut info = RdsInfo {
        seq: h.seq,
        ack: h.ack,
        len: h.len,
        sport: h.sport,
        dport: h.dport,
        flags: h.flags,
        credit: h.credit,
        csum: h.csum,
        kind: kind(h),
        extensions: h.ext.items.iter().map(ext_name).collect(),
        congested_ports: None,
        fragment_len: (payload.len() != h.len as usize)
            .then(|| u32::try_from(payload.len()).unwrap_or(u32::MAX)),
        malformed: None,
    };
    if h.is_cong_map() && payload.len() == CONG_MAP_LEN {
        match CongMap::decode(payload) {
            Ok(m) => info.congested_ports = Some(m.congested_ports().take(64).collect()),
            Err(e) => info.malformed = Some(e.to_string()),
        }
    }
    info
}

/// One RDS-over-iWARP Send: a header and its fragment.
pub fn decode_fragment(send: &[u8]) -> RdsInfo {
    match HeaderView::new_checked(send).and_then(|v| Header::from_view(&v).map(|h| (h, v))) {
        Ok((h, v)) => describe(&h, v.payload()),
        Err(e) => RdsInfo {
            seq: 0,
            ack: 0,
            len: 0,
            sport: 0,
            dport: 0,
            flags: 0,
            credit: 0,
            csum: 0,
            kind: "malformed",
            extensions: Vec::new(),
            congested_ports: None,
            fragment_len: None,
            malformed: Some(e.to_string()),
        },
    }
}

/// What the head of an RDS-over-TCP stream holds.
#[derive(Debug)]
pub enum Next {
    /// A whole message of `total` bytes (header included).
    Message { info: RdsInfo, total: usize },
    /// More bytes are needed: the message is this long in all.
    Partial(usize),
    /// The bytes are not an RDS header.
    Bad(String),
}

/// Decode the message at the head of `buf`.
pub fn next_message(buf: &[u8]) -> Next {
    if buf.len() < HEADER_LEN {
        return Next::Partial(HEADER_LEN);
    }
    let h = match Header::decode(buf) {
        Ok(h) => h,
        Err(e) => return Next::Bad(e.to_string()),
    };
    let total = HEADER_LEN + h.len as usize;
    match buf.get(HEADER_LEN..total) {
        Some(p) => Next::Message {
            info: describe(&h, p),
            total,
        },
        None => Next::Partial(total),
    }
}

/// Whether `buf` plausibly starts an RDS header (for resynchronising after a gap): it decodes,
/// is not all zeros, its length is within RDS's limit (a congestion map is 8 KiB), `h_ack` and
/// `h_credit` are 0 as on TCP, and the header after its payload decodes too. `None` when the
/// bytes to tell are not there yet.
pub fn plausible_at(buf: &[u8]) -> Option<bool> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let Ok(h) = Header::decode(buf) else {
        return Some(false);
    };
    // A run of zeros decodes as an ack-only header: never resync on one.
    if buf[..HEADER_LEN].iter().all(|b| *b == 0)
        || h.len as usize > MAX_MSG_LEN
        || (h.is_cong_map() && h.len as usize != CONG_MAP_LEN)
        || h.ack != 0
        || h.credit != 0
    {
        return Some(false);
    }
    let next = HEADER_LEN + h.len as usize;
    match buf.get(next..) {
        Some(rest) if rest.len() >= HEADER_LEN => {
            Some(Header::decode(rest).is_ok_and(|n| n.ack == 0))
        }
        _ => None,
    }
}
