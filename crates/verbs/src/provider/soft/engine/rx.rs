//! The receive half of the engine: received ULPDUs (RFC 5041 §5 / RFC 5040 §4-§7), direct
//! placement, and the Terminates that malformed or forbidden segments draw.

use super::*;
use crate::wire::ddp::Segment;

/// Where the payload of a tagged segment goes when the driver places it straight from the
/// socket ([`Engine::direct_target`]).
#[derive(Debug)]
pub(crate) struct DirectTarget {
    /// The region and the offset in it of the payload's first byte.
    pub(crate) mr: Arc<MrInner>,
    pub(crate) off: usize,
    /// For a Read Response: how many bytes of the Read's sink follow this segment's payload
    /// (0 for a Write, and for the Read's last segment). They lie just after it in the same
    /// region (the sink is one contiguous range), nothing but this Read's later segments may
    /// be placed there, and their contents are undefined until the Read completes, so the
    /// driver may read the stream ahead into them as long as it checks each segment's header
    /// before counting its payload placed.
    pub(crate) read_rest: usize,
}

impl Engine {
    /// Process one received ULPDU (one DDP segment).
    pub(crate) fn on_ulpdu(&mut self, u: &[u8]) {
        if self.closing || self.state != QpState::Rts {
            return;
        }
        let (h, n) = match DdpHeader::decode(u) {
            Ok(x) => x,
            Err(e) => {
                let (layer, etype, code) = match e {
                    WireError::BadDdpVersion(_)
                        if Segment::new_checked(u).is_ok_and(|s| s.is_tagged()) =>
                    {
                        (1, term::DDP_ETYPE_TAGGED, term::DDP_T_VERSION)
                    }
                    WireError::BadDdpVersion(_) => {
                        (1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_VERSION)
                    }
                    WireError::BadRdmapVersion(_) => {
                        (0, term::RDMAP_ETYPE_REMOTE_OPERATION, term::RDMAP_VERSION)
                    }
                    WireError::BadOpcode(_) => (
                        0,
                        term::RDMAP_ETYPE_REMOTE_OPERATION,
                        term::RDMAP_UNEXPECTED_OPCODE,
                    ),
                    _ => (1, term::DDP_ETYPE_CATASTROPHIC, 0),
                };
                self.terminate(layer, etype, code, None);
                return;
            }
        };
        let data = &u[n..];
        if self.awaiting_rtr {
            self.on_rtr(&h, data, u);
            return;
        }
        match h.model {
            BufferModel::Tagged { stag, to } => match h.opcode {
                Opcode::Write => self.on_write(stag, to, data, u),
                _ => self.on_read_response(&h, stag, to, data, u),
            },
            BufferModel::Untagged {
                inv_stag,
                qn,
                msn,
                mo,
            } => match qn {
                QN_SEND => self.on_send(&h, inv_stag, msn, mo, data, u),
                QN_READ_REQ => self.on_read_request(&h, msn, mo, data, u),
                QN_TERMINATE => self.on_terminate(&h, msn, mo, data, u),
                // RFC 5041 §7.2: invalid QN.
                _ => self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_INVALID_QN, Some(u)),
            },
        }
    }

    fn on_rtr(&mut self, h: &DdpHeader, data: &[u8], u: &[u8]) {
        // RFC 6581 §3: the first FPDU must be the zero-length RTR.
        let ok = match (h.opcode, h.model) {
            (Opcode::Write, BufferModel::Tagged { .. }) => data.is_empty() && h.last,
            (
                Opcode::ReadRequest,
                BufferModel::Untagged {
                    qn: QN_READ_REQ,
                    msn: 1,
                    mo: 0,
                    ..
                },
            ) => match ReadRequest::decode(data) {
                Ok(rr) if rr.size == 0 => {
                    self.expect_rreq += 1;
                    self.inbound.push_back(InRead {
                        sink_stag: rr.sink_stag,
                        sink_to: rr.sink_to,
                        src: None,
                        len: 0,
                        sent: 0,
                    });
                    true
                }
                _ => false,
            },
            (
                Opcode::Send,
                BufferModel::Untagged {
                    qn: QN_SEND,
                    msn: 1,
                    mo: 0,
                    ..
                },
            ) => {
                self.expect_send += 1;
                data.is_empty() && h.last
            }
            _ => false,
        };
        if ok {
            self.awaiting_rtr = false;
            self.outbox.push_event(EngineEvent::Established);
        } else if h.opcode == Opcode::Terminate {
            let BufferModel::Untagged { msn, mo, .. } = h.model else {
                return;
            };
            self.awaiting_rtr = false;
            self.on_terminate(h, msn, mo, data, u);
        } else {
            // RFC 6581 §3: anything else is a protocol error.
            self.terminate(2, term::LLP_ETYPE_MPA, term::MPA_INVALID_REQ_REP, Some(u));
        }
    }

    fn tagged_fault(&mut self, f: AccessFault, u: &[u8]) {
        // Faults found while placing a tagged segment: DDP tagged-buffer errors (RFC 5041 §7.2),
        // except access rights: RFC 5041 has no code for them, RFC 5040 §4.8 has "access rights
        // violation" at the RDMAP layer, which we use. (Linux siw instead reports DDP / tagged /
        // invalid STag for this case; both are decoded the same way by our peers.)
        let (layer, etype, code) = match f {
            AccessFault::InvalidStag => (1, term::DDP_ETYPE_TAGGED, term::DDP_T_INVALID_STAG),
            AccessFault::Bounds => (1, term::DDP_ETYPE_TAGGED, term::DDP_T_BASE_BOUNDS),
            AccessFault::WrongPd => (1, term::DDP_ETYPE_TAGGED, term::DDP_T_STAG_NOT_ASSOC),
            AccessFault::Rights => (
                0,
                term::RDMAP_ETYPE_REMOTE_PROTECTION,
                term::RDMAP_ACCESS_RIGHTS,
            ),
        };
        self.terminate(layer, etype, code, Some(u));
    }

    fn on_write(&mut self, stag: u32, to: u64, data: &[u8], u: &[u8]) {
        // siw: a zero-length Write is not checked against the STag.
        if data.is_empty() {
            return;
        }
        match self
            .table
            .check(stag, self.pd, Access::REMOTE_WRITE, to, data.len() as u64)
        {
            Ok(mr) => place(&mr, (to - mr.base) as usize, data),
            Err(f) => self.tagged_fault(f, u),
        }
    }

    fn on_read_response(&mut self, h: &DdpHeader, stag: u32, to: u64, data: &[u8], u: &[u8]) {
        let Some(r) = self.reads_out.front_mut() else {
            // RFC 5040 §4.8: a Read Response with no matching request.
            self.unexpected_opcode(u);
            return;
        };
        if stag != r.sink_stag
            || to != r.sink_to.wrapping_add(r.got)
            || r.got + data.len() as u64 > r.len
        {
            let code = if stag != r.sink_stag {
                term::DDP_T_INVALID_STAG
            } else {
                term::DDP_T_BASE_BOUNDS
            };
            self.terminate(1, term::DDP_ETYPE_TAGGED, code, Some(u));
            return;
        }
        if let Some((mr, off)) = &r.sink {
            place(mr, off + r.got as usize, data);
        }
        r.got += data.len() as u64;
        if h.last {
            if r.got != r.len {
                self.terminate(1, term::DDP_ETYPE_TAGGED, term::DDP_T_BASE_BOUNDS, Some(u));
                return;
            }
            self.read_done();
        }
    }

    /// The last Read Response segment of the oldest outstanding read arrived: it leaves the
    /// queue, with a completion when the work request asked for one (an RTR probe has none).
    fn read_done(&mut self) {
        let Some(r) = self.reads_out.pop_front() else {
            return;
        };
        if !r.rtr && r.signaled {
            self.outbox.push_send(self.wc(
                r.wr_id,
                WcOpcode::RdmaRead,
                WcStatus::Success,
                r.got as u32,
            ));
        }
    }

    /// Terminate for a message of the wrong kind for where it arrived (RFC 5040 §4.8, remote
    /// operation error: unexpected opcode). `u` is the offending ULPDU.
    fn unexpected_opcode(&mut self, u: &[u8]) {
        self.terminate(
            0,
            term::RDMAP_ETYPE_REMOTE_OPERATION,
            term::RDMAP_UNEXPECTED_OPCODE,
            Some(u),
        );
    }

    /// Terminate for an untagged message out of sequence (RFC 5041 §7.2, untagged buffer
    /// error: MSN range). `u` is the offending ULPDU.
    fn msn_out_of_range(&mut self, u: &[u8]) {
        self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_MSN_RANGE, Some(u));
    }

    fn on_send(&mut self, h: &DdpHeader, inv_stag: u32, msn: u32, mo: u32, data: &[u8], u: &[u8]) {
        if !h.opcode.is_send() {
            self.unexpected_opcode(u);
            return;
        }
        // RFC 5041 §5.3: MSN and MO are checked strictly, segments arrive in order on TCP.
        if msn != self.expect_send {
            self.msn_out_of_range(u);
            return;
        }
        let cur_got = self.rx_send.as_ref().map_or(0, |r| r.got);
        if mo as usize != cur_got {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_INVALID_MO, Some(u));
            return;
        }
        if self.rx_send.is_none() {
            let Some(wr) = self.rq.pop_front() else {
                // RFC 5041 §7.2: no buffer available (iWARP has no RNR retry; siw terminates).
                self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_NO_BUFFER, Some(u));
                return;
            };
            match resolve_sgl(&self.table, self.pd, &wr.sgl, Access::LOCAL_WRITE) {
                Ok(sges) => {
                    let cap = sges.iter().map(|s| s.2).sum();
                    self.rx_send = Some(RxSend {
                        wr: Some(wr),
                        sges,
                        cap,
                        got: 0,
                        msn,
                    });
                }
                Err(_) => {
                    self.outbox.push_recv(self.wc(
                        wr.wr_id,
                        WcOpcode::Recv,
                        WcStatus::LocalProtectionError,
                        0,
                    ));
                    self.terminate(
                        0,
                        term::RDMAP_ETYPE_CATASTROPHIC,
                        term::RDMAP_CATASTROPHIC_STREAM,
                        Some(u),
                    );
                    return;
                }
            }
        }
        let Some(rx) = self.rx_send.as_mut() else {
            return;
        };
        if rx.got + data.len() > rx.cap {
            let wr_id = rx.wr.take().map(|w| w.wr_id);
            if let Some(id) = wr_id {
                self.outbox
                    .push_recv(self.wc(id, WcOpcode::Recv, WcStatus::LocalLengthError, 0));
            }
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_TOO_LONG, Some(u));
            return;
        }
        scatter(&rx.sges, rx.got, data);
        rx.got += data.len();
        debug_assert_eq!(rx.msn, msn);
        if !h.last {
            return;
        }
        let Some(rx) = self.rx_send.take() else {
            return;
        };
        self.expect_send = self.expect_send.wrapping_add(1);
        let mut c = self.wc(
            rx.wr.as_ref().map_or(0, |w| w.wr_id),
            WcOpcode::Recv,
            WcStatus::Success,
            rx.got as u32,
        );
        c.solicited = matches!(h.opcode, Opcode::SendSe | Opcode::SendSeInvalidate);
        if matches!(h.opcode, Opcode::SendInvalidate | Opcode::SendSeInvalidate) {
            // RFC 5040 §5.3: invalidate when the message completes.
            if self.table.invalidate(inv_stag, self.pd).is_err() {
                self.outbox.push_recv(c);
                self.terminate(
                    0,
                    term::RDMAP_ETYPE_REMOTE_PROTECTION,
                    term::RDMAP_CANNOT_INVALIDATE,
                    Some(u),
                );
                return;
            }
            c.invalidated_rkey = Some(inv_stag);
        }
        self.outbox.push_recv(c);
    }

    fn on_read_request(&mut self, h: &DdpHeader, msn: u32, mo: u32, data: &[u8], u: &[u8]) {
        if h.opcode != Opcode::ReadRequest {
            self.unexpected_opcode(u);
            return;
        }
        if msn != self.expect_rreq {
            self.msn_out_of_range(u);
            return;
        }
        if mo != 0 || !h.last {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_INVALID_MO, Some(u));
            return;
        }
        let Ok(rr) = ReadRequest::decode(data) else {
            self.terminate(
                0,
                term::RDMAP_ETYPE_REMOTE_OPERATION,
                term::RDMAP_CATASTROPHIC_STREAM,
                Some(u),
            );
            return;
        };
        // RFC 5040 §6.4 / RFC 6581: more outstanding Read Requests than IRD is an error; the
        // untagged Read Request queue has no buffer for it.
        if self.inbound.len() as u32 >= self.params.ird.max(1) {
            self.terminate(1, term::DDP_ETYPE_UNTAGGED, term::DDP_U_NO_BUFFER, Some(u));
            return;
        }
        self.expect_rreq = self.expect_rreq.wrapping_add(1);
        let src = if rr.size == 0 {
            // siw: a zero-length Read gets a zero-length response without an STag check.
            None
        } else {
            match self.table.check(
                rr.src_stag,
                self.pd,
                Access::REMOTE_READ,
                rr.src_to,
                u64::from(rr.size),
            ) {
                Ok(mr) => {
                    let off = (rr.src_to - mr.base) as usize;
                    Some((mr, off))
                }
                Err(f) => {
                    let code = match f {
                        AccessFault::InvalidStag => term::RDMAP_INVALID_STAG,
                        AccessFault::Bounds => term::RDMAP_BASE_BOUNDS,
                        AccessFault::Rights => term::RDMAP_ACCESS_RIGHTS,
                        AccessFault::WrongPd => term::RDMAP_STAG_NOT_ASSOC,
                    };
                    self.terminate(0, term::RDMAP_ETYPE_REMOTE_PROTECTION, code, Some(u));
                    return;
                }
            }
        };
        self.inbound.push_back(InRead {
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
            src,
            len: u64::from(rr.size),
            sent: 0,
        });
    }

    fn on_terminate(&mut self, h: &DdpHeader, msn: u32, mo: u32, data: &[u8], _u: &[u8]) {
        if h.opcode != Opcode::Terminate || msn != self.expect_term || mo != self.term_mo {
            self.enter_error();
            self.closing = true;
            return;
        }
        self.term_buf.put_slice(data);
        self.term_mo += data.len() as u32;
        if !h.last {
            if self.term_buf.len() > 4096 {
                self.enter_error();
                self.closing = true;
            }
            return;
        }
        let t = Terminate::decode(&self.term_buf).unwrap_or(Terminate {
            layer: 0,
            etype: 0,
            code: 0xff,
            ddp_seg_len: None,
            ddp_hdr: None,
            rdma_hdr: None,
        });
        // A Terminate naming one of our Read Requests fails that Read with the remote error.
        let read_failed = t
            .ddp_hdr
            .as_deref()
            .and_then(|d| DdpHeader::decode(d).ok())
            .is_some_and(|(dh, _)| {
                matches!(
                    dh.model,
                    BufferModel::Untagged {
                        qn: QN_READ_REQ,
                        ..
                    }
                )
            });
        if read_failed && let Some(r) = self.reads_out.pop_front() {
            {
                let protection = (t.layer == 0 && t.etype == term::RDMAP_ETYPE_REMOTE_PROTECTION)
                    || (t.layer == 1 && t.etype == term::DDP_ETYPE_TAGGED);
                let status = if protection {
                    WcStatus::RemoteAccessError
                } else {
                    WcStatus::RemoteOperationError
                };
                if !r.rtr {
                    self.outbox
                        .push_send(self.wc(r.wr_id, WcOpcode::RdmaRead, status, 0));
                }
            }
        }
        self.outbox.push_event(EngineEvent::TerminateReceived(t));
        self.enter_error();
        self.closing = true;
    }

    /// Direct placement, step 1: for a tagged segment whose header has arrived but whose payload
    /// has not, return where its `len` payload bytes go if the segment is valid. The driver then
    /// reads the payload from the socket straight into the region and calls [`Self::on_placed`].
    /// `None` means "take the normal path" (which reports any error with a Terminate).
    pub(crate) fn direct_target(&mut self, hdr: &[u8], len: usize) -> Option<DirectTarget> {
        if self.closing || self.state != QpState::Rts || self.awaiting_rtr || len == 0 {
            return None;
        }
        let (h, n) = DdpHeader::decode(hdr).ok()?;
        let BufferModel::Tagged { stag, to } = h.model else {
            return None;
        };
        if n != hdr.len() {
            return None;
        }
        match h.opcode {
            Opcode::Write => {
                let mr = self
                    .table
                    .check(stag, self.pd, Access::REMOTE_WRITE, to, len as u64)
                    .ok()?;
                let off = (to - mr.base) as usize;
                Some(DirectTarget {
                    mr,
                    off,
                    read_rest: 0,
                })
            }
            Opcode::ReadResponse => {
                let r = self.reads_out.front()?;
                let ok = stag == r.sink_stag
                    && to == r.sink_to.wrapping_add(r.got)
                    && r.got + len as u64 <= r.len
                    && (!h.last || r.got + len as u64 == r.len);
                let (mr, off) = r.sink.as_ref().filter(|_| ok)?;
                Some(DirectTarget {
                    mr: mr.clone(),
                    off: off + r.got as usize,
                    read_rest: (r.len - r.got - len as u64) as usize,
                })
            }
            _ => None,
        }
    }

    /// Whether the oldest outstanding RDMA Read, of at least `min` bytes into a sink, has had
    /// none of its response yet (the driver then reads the next FPDU's header alone, to place
    /// the response directly from its first segment on).
    pub(crate) fn awaits_read_response(&self, min: usize) -> bool {
        self.reads_out
            .front()
            .is_some_and(|r| r.got == 0 && r.sink.is_some() && r.len >= min as u64)
    }

    /// Direct placement, step 2: the payload of the segment with header `hdr` (validated by
    /// [`Self::direct_target`]) has been placed; do the bookkeeping (Read completion).
    pub(crate) fn on_placed(&mut self, hdr: &[u8], len: usize) {
        let Ok((h, _)) = DdpHeader::decode(hdr) else {
            return;
        };
        if h.opcode != Opcode::ReadResponse {
            return;
        }
        let Some(r) = self.reads_out.front_mut() else {
            return;
        };
        r.got += len as u64;
        if h.last {
            self.read_done();
        }
    }

    /// A CRC or framing error was detected by the MPA layer (RFC 5044 §8).
    pub(crate) fn on_llp_error(&mut self, code: u8) {
        self.terminate(2, term::LLP_ETYPE_MPA, code, None);
    }
}
