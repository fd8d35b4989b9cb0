//! Sans-IO MPA connection setup (RFC 5044 §7.1, enhanced by RFC 6581): builds the Request,
//! answers it, and interprets the Reply. Timers are the driver's: [`INITIATOR_TIMEOUT`] and
//! [`RESPONDER_TIMEOUT`].

use std::time::Duration;

use bytes::Bytes;

use super::engine::RtrKind;
use crate::wire::mpa::{FrameKind, IrdOrd, MAX_ULP_PRIVATE_DATA, MpaFrame};

/// Linux siw: the initiator waits 10 s for the MPA Reply.
pub const INITIATOR_TIMEOUT: Duration = Duration::from_secs(10);
/// Linux siw: the responder waits 5 s for the MPA Request.
pub const RESPONDER_TIMEOUT: Duration = Duration::from_secs(5);
/// Linux siw: IRD/ORD are at most 128.
pub const MAX_IRD_ORD: u16 = 128;

/// What one side asks for.
#[derive(Debug, Clone)]
pub struct LocalSetup {
    /// Request/offer CRC-32C.
    pub crc: bool,
    /// Request markers (only used to test that peers reject them).
    pub markers: bool,
    /// MPA revision to send (1 or 2). Revision 2 carries IRD/ORD.
    pub revision: u8,
    /// Inbound RDMA Read depth.
    pub ird: u16,
    /// Outbound RDMA Read depth.
    pub ord: u16,
    /// Ask for peer-to-peer mode (an RTR is exchanged).
    pub peer_to_peer: bool,
    /// RTR kinds this side can send/accept (Write, Read, Send).
    pub rtr_kinds: [bool; 3],
    /// ULP private data.
    pub private_data: Bytes,
}

/// The result of a successful setup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC in use.
    pub crc: bool,
    /// Our effective IRD.
    pub ird: u16,
    /// Our effective ORD.
    pub ord: u16,
    /// Initiator: the RTR to send. Responder: None.
    pub send_rtr: Option<RtrKind>,
    /// Responder: wait for the RTR before reporting Established.
    pub await_rtr: bool,
    /// The peer's ULP private data.
    pub peer_private_data: Bytes,
    /// The peer's IRD/ORD words (None for revision 1 / no S).
    pub peer_ird_ord: Option<IrdOrd>,
}

/// Setup failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The peer rejected the connection (R bit), with its private data.
    #[error("rejected by peer ({} bytes of private data)", .0.len())]
    Rejected(Bytes),
    /// The frame was not acceptable (markers, wrong kind, ...).
    #[error("invalid MPA frame: {0}")]
    Invalid(&'static str),
    /// Private data over the 256-byte limit.
    #[error("private data too long")]
    PrivateDataTooLong,
}

fn words(s: &LocalSetup, ird: u16, ord: u16) -> IrdOrd {
    IrdOrd {
        ird: ird.min(MAX_IRD_ORD),
        ord: ord.min(MAX_IRD_ORD),
        peer_to_peer: s.peer_to_peer,
        write_rtr: s.peer_to_peer && s.rtr_kinds[0],
        read_rtr: s.peer_to_peer && s.rtr_kinds[1],
        send_rtr: s.peer_to_peer && s.rtr_kinds[2],
    }
}

/// Build the initiator's MPA Request.
pub fn build_request(s: &LocalSetup) -> Result<MpaFrame, SetupError> {
    if s.private_data.len() > MAX_ULP_PRIVATE_DATA {
        return Err(SetupError::PrivateDataTooLong);
    }
    Ok(MpaFrame {
        kind: FrameKind::Request,
        markers: s.markers,
        crc: s.crc,
        reject: false,
        revision: s.revision,
        enhanced: (s.revision == 2).then(|| words(s, s.ird, s.ord)),
        private_data: s.private_data.clone(),
    })
}

/// Check an incoming Request before it is shown to the user. Returns a rejecting Reply to send
/// when the Request cannot be served at all (RFC 5044 §7.1: markers are not supported here).
pub fn screen_request(req: &MpaFrame) -> Result<(), (SetupError, MpaFrame)> {
    if req.kind != FrameKind::Request {
        return Err((
            SetupError::Invalid("expected MPA Request"),
            reject_reply(req, Bytes::new()),
        ));
    }
    if req.markers {
        // siw: markers are refused with a Reply carrying R.
        return Err((
            SetupError::Invalid("markers requested"),
            reject_reply(req, Bytes::new()),
        ));
    }
    Ok(())
}

/// A Reply that rejects `req` with `private_data`.
pub fn reject_reply(req: &MpaFrame, private_data: Bytes) -> MpaFrame {
    MpaFrame {
        kind: FrameKind::Reply,
        markers: false,
        crc: req.crc,
        reject: true,
        revision: req.revision.clamp(1, 2),
        enhanced: (req.revision == 2 && req.enhanced.is_some()).then(IrdOrd::default),
        private_data,
    }
}

/// Answer an accepted Request: the Reply to send and what was negotiated.
pub fn accept_request(
    req: &MpaFrame,
    s: &LocalSetup,
) -> Result<(MpaFrame, Negotiated), SetupError> {
    if s.private_data.len() > MAX_ULP_PRIVATE_DATA {
        return Err(SetupError::PrivateDataTooLong);
    }
    // RFC 5044 §7.1: CRC is used if either side asks; the responder echoes C.
    let crc = req.crc || s.crc;
    let ird = s.ird.min(MAX_IRD_ORD);
    let (enhanced, ord, await_rtr) = match req.enhanced {
        Some(w) => {
            // RFC 6581 §3: never more outstanding Reads than the peer's IRD.
            let ord = s.ord.min(w.ird).min(MAX_IRD_ORD);
            let mut rw = IrdOrd {
                ird,
                ord,
                ..Default::default()
            };
            let p2p = w.peer_to_peer;
            if p2p {
                // RFC 6581 §3: echo A and choose one RTR kind the initiator offered.
                rw.peer_to_peer = true;
                if w.write_rtr {
                    rw.write_rtr = true;
                } else if w.read_rtr {
                    rw.read_rtr = true;
                } else if w.send_rtr {
                    rw.send_rtr = true;
                } else {
                    return Err(SetupError::Invalid("peer-to-peer without an RTR kind"));
                }
            }
            (Some(rw), ord, p2p)
        }
        None => (None, s.ord.min(MAX_IRD_ORD), false),
    };
    let reply = MpaFrame {
        kind: FrameKind::Reply,
        markers: false,
        crc,
        reject: false,
        revision: req.revision.clamp(1, 2),
        enhanced,
        private_data: s.private_data.clone(),
    };
    Ok((
        reply,
        Negotiated {
            crc,
            ird,
            ord,
            send_rtr: None,
            await_rtr,
            peer_private_data: req.private_data.clone(),
            peer_ird_ord: req.enhanced,
        },
    ))
}

/// Interpret the Reply on the initiator side.
pub fn on_reply(s: &LocalSetup, rep: &MpaFrame) -> Result<Negotiated, SetupError> {
    if rep.kind != FrameKind::Reply {
        return Err(SetupError::Invalid("expected MPA Reply"));
    }
    if rep.reject {
        return Err(SetupError::Rejected(rep.private_data.clone()));
    }
    if rep.markers {
        return Err(SetupError::Invalid("markers in reply"));
    }
    if s.crc && !rep.crc {
        return Err(SetupError::Invalid("responder did not echo CRC"));
    }
    let (ord, send_rtr) = match rep.enhanced {
        Some(w) => {
            let ord = s.ord.min(w.ird).min(MAX_IRD_ORD);
            let rtr = if s.peer_to_peer && w.peer_to_peer {
                // Use the kind the responder chose (prefer Write, like siw).
                if w.write_rtr && s.rtr_kinds[0] {
                    Some(RtrKind::Write)
                } else if w.read_rtr && s.rtr_kinds[1] {
                    Some(RtrKind::Read)
                } else if w.send_rtr && s.rtr_kinds[2] {
                    Some(RtrKind::Send)
                } else {
                    return Err(SetupError::Invalid("no common RTR kind"));
                }
            } else {
                None
            };
            (ord, rtr)
        }
        // Revision 1 peers: no IRD/ORD exchange, keep ours.
        None => (s.ord.min(MAX_IRD_ORD), None),
    };
    Ok(Negotiated {
        crc: rep.crc,
        ird: s.ird.min(MAX_IRD_ORD),
        ord,
        send_rtr,
        await_rtr: false,
        peer_private_data: rep.private_data.clone(),
        peer_ird_ord: rep.enhanced,
    })
}
