//! Errors the Responder reports to the peer: RDMA_ERROR in either version, and GARBAGE_ARGS
//! replies.

use oncrpc::AcceptStat;

use super::{Action, Incoming, Responder};
use crate::header::{Body, Chunks, ErrorResponse, Header};
use crate::header_v2::{Direction, ErrorBody2, ErrorResponse2, Header2, error_vers_bytes};

impl Responder {
    /// Answer with a version 2 RDMA2_ERROR. cel-05 §7.2.4: "the rdma_credit field is set to
    /// the credit grant value for this connection"; never with Send With Invalidate.
    pub(super) fn error2(&mut self, resp: ErrorResponse2) -> Incoming {
        let data = match resp {
            ErrorResponse2::Discard => {
                self.stats.dropped += 1;
                return Incoming::Nothing;
            }
            ErrorResponse2::ErrVers { xid, vers } => {
                self.stats.err_vers += 1;
                error_vers_bytes(xid, vers, self.grant(), 1, self.cfg.max_version.number())
            }
            ErrorResponse2::Error { .. } => {
                self.stats.err_chunk += 1;
                match Header2::error_reply(resp, self.grant()) {
                    Some(h) => h.to_bytes(),
                    None => return Incoming::Nothing,
                }
            }
        };
        Incoming::Respond(vec![Action::Send {
            data,
            invalidate: None,
        }])
    }

    pub(super) fn error(&mut self, resp: ErrorResponse) -> Incoming {
        if self.v2() {
            // cel-05 §7.2.4: RDMA2_ERR_BAD_XDR has version 1's ERR_CHUNK code and meaning.
            return self.error2(match resp {
                ErrorResponse::ErrVers { xid, vers } => ErrorResponse2::ErrVers { xid, vers },
                ErrorResponse::ErrChunk { xid } => ErrorResponse2::Error {
                    xid,
                    body: ErrorBody2::BadXdr,
                },
                ErrorResponse::Discard => ErrorResponse2::Discard,
            });
        }
        match resp {
            ErrorResponse::ErrVers { .. } => self.stats.err_vers += 1,
            ErrorResponse::ErrChunk { .. } => self.stats.err_chunk += 1,
            ErrorResponse::Discard => self.stats.dropped += 1,
        }
        match Header::error_reply(resp, self.grant()) {
            // RFC 8166 §4.5: RDMA_ERROR is never sent with Send With Invalidate (Linux does
            // the same).
            Some(h) => Incoming::Respond(vec![Action::Send {
                data: h.to_bytes(),
                invalidate: None,
            }]),
            None => Incoming::Nothing,
        }
    }

    pub(super) fn garbage(&mut self, xid: u32) -> Incoming {
        self.stats.garbage_args += 1;
        // RFC 8166 §4.5.2: GARBAGE_ARGS travels in an RDMA_MSG.
        //= specs/rfc8166.txt#section-4.5.2
        //# When a Responder receives a valid RPC-over-RDMA header but the Responder's ULP
        //# implementation cannot parse the RPC arguments in the RPC Call message, the Responder
        //# SHOULD return an RPC Reply message with status GARBAGE_ARGS, using an RDMA_MSG
        //# procedure.
        let r = oncrpc::service::accepted(xid, AcceptStat::GarbageArgs, None);
        let body = r.message.to_bytes();
        let mut data = self.header_bytes(
            xid,
            self.grant(),
            Body::Msg(Chunks::default()),
            Direction::Reply,
            body.len(),
        );
        data.extend_from_slice(&body);
        Incoming::Respond(vec![Action::Send {
            data: data.freeze(),
            invalidate: None,
        }])
    }

    pub(super) fn error2_actions(&mut self, xid: u32, body: ErrorBody2) -> Vec<Action> {
        match self.error2(ErrorResponse2::Error { xid, body }) {
            Incoming::Respond(a) => a,
            _ => Vec::new(),
        }
    }

    pub(super) fn error_actions(&mut self, resp: ErrorResponse) -> Vec<Action> {
        match self.error(resp) {
            Incoming::Respond(a) => a,
            _ => Vec::new(),
        }
    }
}
