//! One direction of an iWARP stream: the MPA Request or Reply frame, then FPDUs (RFC 5044 §4,
//! the `verbs::wire::mpa` view and CRC), each holding one DDP segment (RFC 5041, the
//! `verbs::wire::ddp` decoder) whose segments are put back together into RDMAP messages.
//!
//! MPA without markers has nothing that marks where an FPDU starts, so after a gap (or bytes
//! that do not decode) the decoder resynchronises conservatively: it takes a position as an
//! FPDU boundary only if the FPDU there is whole with a valid DDP/RDMAP header and either its
//! CRC matches (when CRCs are in use) or the next two FPDUs after it are valid too.

use std::collections::HashMap;

use verbs::wire::ddp::{BufferModel, DdpHeader, Opcode};
use verbs::wire::mpa::{Fpdu, MpaFrame, REP_KEY, REQ_KEY, crc_bytes};

/// Bytes kept of a tagged message's data (enough for an RPC header and its arguments).
pub const KEEP_TAGGED: usize = 64 << 10;
/// Bytes kept of an untagged message.
pub const KEEP_UNTAGGED: usize = 1 << 20;
/// Untagged messages being put together at once, per direction.
const MAX_OPEN_UNTAGGED: usize = 64;
/// Bytes scanned for an FPDU boundary before the scanned part is dropped.
const RESYNC_WINDOW: usize = 1 << 20;

/// One reassembled RDMAP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmapMsg {
    pub opcode: Opcode,
    pub segments: u32,
    pub len: u64,
    pub model: BufferModel,
    pub crc_error: bool,
    /// The first bytes of the payload (all of it up to the keep limits).
    pub data: Vec<u8>,
    /// False when segments were missing (a gap inside the message).
    pub complete: bool,
}

/// What a direction produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IwEvent {
    Mpa(MpaFrame),
    Msg(RdmapMsg),
    Resync { skipped: u64, how: &'static str },
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// The MPA frame comes first.
    Frame,
    Fpdus,
    /// Looking for an FPDU boundary.
    Lost,
    /// Decoding stopped for good (markers, or not MPA at all).
    Stopped,
}

#[derive(Debug)]
struct Partial {
    msg: RdmapMsg,
}

/// One direction's decoder.
#[derive(Debug)]
pub struct Half {
    state: State,
    buf: Vec<u8>,
    /// CRC-32C in use: `None` until both MPA frames were seen.
    pub crc: Option<bool>,
    skipped: u64,
    tagged: Option<Partial>,
    untagged: HashMap<(u32, u32), Partial>,
}

impl Half {
    /// A direction that starts with an MPA frame (`from_start`), or that was joined mid-stream.
    pub fn new(from_start: bool) -> Self {
        Half {
            state: if from_start {
                State::Frame
            } else {
                State::Lost
            },
            buf: Vec::new(),
            crc: None,
            skipped: 0,
            tagged: None,
            untagged: HashMap::new(),
        }
    }

    /// Stop decoding this direction.
    pub fn stop(&mut self) {
        self.state = State::Stopped;
        self.buf.clear();
    }

    /// Bytes of the stream went missing.
    pub fn gap(&mut self) {
        if self.state != State::Stopped {
            self.state = State::Lost;
        }
        self.buf.clear();
        // Messages cut by the gap are lost with it.
        self.tagged = None;
        self.untagged.clear();
    }

    /// In-order bytes.
    pub fn push(&mut self, data: &[u8], out: &mut Vec<IwEvent>) {
        if self.state == State::Stopped {
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.extend_from_slice(data);
        let mut pos = 0;
        loop {
            let rest = &buf[pos..];
            match self.state {
                State::Stopped => {
                    pos = buf.len();
                    break;
                }
                State::Frame => {
                    let n = rest.len().min(16);
                    if rest[..n] != REQ_KEY[..n] && rest[..n] != REP_KEY[..n] {
                        out.push(IwEvent::Error(
                            "stream does not start with an MPA frame".into(),
                        ));
                        self.state = State::Lost;
                        continue;
                    }
                    match MpaFrame::decode(rest) {
                        Ok(Some((f, used))) => {
                            pos += used;
                            let markers = f.markers;
                            out.push(IwEvent::Mpa(f));
                            self.state = State::Fpdus;
                            if markers {
                                out.push(IwEvent::Error(
                                    "MPA markers requested: this decoder does not remove markers"
                                        .into(),
                                ));
                                self.state = State::Stopped;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            out.push(IwEvent::Error(format!("MPA frame: {e}")));
                            self.state = State::Lost;
                        }
                    }
                }
                State::Fpdus => match self.fpdu(rest, out) {
                    Step::Used(n) => pos += n,
                    Step::More => break,
                    Step::Bad(why) => {
                        out.push(IwEvent::Error(why));
                        self.state = State::Lost;
                        self.tagged = None;
                        self.untagged.clear();
                    }
                },
                State::Lost => match resync(rest, self.crc) {
                    Resync::At(skip, how) => {
                        pos += skip;
                        out.push(IwEvent::Resync {
                            skipped: self.skipped + skip as u64,
                            how,
                        });
                        self.skipped = 0;
                        self.state = State::Fpdus;
                    }
                    Resync::NeedMore(skip) => {
                        pos += skip;
                        self.skipped += skip as u64;
                        if rest.len() - skip > RESYNC_WINDOW {
                            let drop = rest.len() - skip - RESYNC_WINDOW;
                            pos += drop;
                            self.skipped += drop as u64;
                        }
                        break;
                    }
                },
            }
        }
        buf.drain(..pos.min(buf.len()));
        if self.state != State::Stopped {
            self.buf = buf;
        }
    }

    /// One FPDU at the head of `b`.
    fn fpdu(&mut self, b: &[u8], out: &mut Vec<IwEvent>) -> Step {
        let Ok(f) = Fpdu::new_checked(b) else {
            return Step::More;
        };
        if !f.is_complete() {
            return Step::More;
        }
        let total = f.total_len();
        let crc_error = match self.crc {
            Some(true) => b[total - 4..total] != crc_bytes(&[&b[..total - 4]]),
            _ => false,
        };
        let ulpdu = f.ulpdu();
        let (hdr, hlen) = match DdpHeader::decode(ulpdu) {
            Ok(x) => x,
            Err(e) => return Step::Bad(format!("DDP/RDMAP header: {e}")),
        };
        self.segment(hdr, &ulpdu[hlen..], crc_error, out);
        Step::Used(total)
    }

    fn segment(&mut self, h: DdpHeader, payload: &[u8], crc_error: bool, out: &mut Vec<IwEvent>) {
        match h.model {
            BufferModel::Tagged { stag, to } => {
                let continues = self.tagged.as_ref().is_some_and(|p| {
                    matches!(p.msg.model, BufferModel::Tagged { stag: s, to: t }
                        if s == stag && t.wrapping_add(p.msg.len) == to)
                        && p.msg.opcode == h.opcode
                });
                if !continues && let Some(p) = self.tagged.take() {
                    // A new message started before the last one's final segment.
                    let mut m = p.msg;
                    m.complete = false;
                    out.push(IwEvent::Msg(m));
                }
                let p = self.tagged.get_or_insert_with(|| Partial {
                    msg: new_msg(h, crc_error),
                });
                add(&mut p.msg, payload, KEEP_TAGGED, crc_error);
                if h.last
                    && let Some(p) = self.tagged.take()
                {
                    out.push(IwEvent::Msg(p.msg));
                }
            }
            BufferModel::Untagged { qn, msn, mo, .. } => {
                let key = (qn, msn);
                if !self.untagged.contains_key(&key) && self.untagged.len() >= MAX_OPEN_UNTAGGED {
                    // Too many messages open: the oldest is reported as it is.
                    if let Some(k) = self.untagged.keys().min().copied()
                        && let Some(p) = self.untagged.remove(&k)
                    {
                        let mut m = p.msg;
                        m.complete = false;
                        out.push(IwEvent::Msg(m));
                    }
                }
                let p = self.untagged.entry(key).or_insert_with(|| Partial {
                    msg: new_msg(h, crc_error),
                });
                if u64::from(mo) != p.msg.len {
                    p.msg.complete = false;
                }
                add(&mut p.msg, payload, KEEP_UNTAGGED, crc_error);
                if h.last
                    && let Some(p) = self.untagged.remove(&key)
                {
                    out.push(IwEvent::Msg(p.msg));
                }
            }
        }
    }
}

fn new_msg(h: DdpHeader, crc_error: bool) -> RdmapMsg {
    RdmapMsg {
        opcode: h.opcode,
        segments: 0,
        len: 0,
        model: h.model,
        crc_error,
        data: Vec::new(),
        complete: true,
    }
}

fn add(m: &mut RdmapMsg, payload: &[u8], keep: usize, crc_error: bool) {
    m.segments += 1;
    m.len += payload.len() as u64;
    m.crc_error |= crc_error;
    let room = keep.saturating_sub(m.data.len());
    m.data
        .extend_from_slice(&payload[..room.min(payload.len())]);
}

enum Step {
    Used(usize),
    More,
    Bad(String),
}

enum Resync {
    /// An FPDU boundary this many bytes in.
    At(usize, &'static str),
    /// No boundary in the first this-many bytes; more data is needed to decide after them.
    NeedMore(usize),
}

/// Whether a whole, valid FPDU starts at the head of `b`: `Some(len)` if so, `None` if not,
/// `Err(())` if more bytes are needed to tell.
fn valid_fpdu(b: &[u8], crc: Option<bool>) -> Result<Option<(usize, bool)>, ()> {
    let Ok(f) = Fpdu::new_checked(b) else {
        return Err(());
    };
    // Cheap checks first: a DDP header must fit, and its first bytes must decode.
    let ulen = f.ulpdu_len();
    if ulen < verbs::wire::ddp::TAGGED_HDR_LEN {
        return Ok(None);
    }
    let Some(head) = b.get(2..2 + ulen.min(verbs::wire::ddp::UNTAGGED_HDR_LEN)) else {
        return Err(());
    };
    if DdpHeader::decode(head).is_err() {
        return Ok(None);
    }
    if !f.is_complete() {
        return Err(());
    }
    let total = f.total_len();
    if DdpHeader::decode(f.ulpdu()).is_err() {
        return Ok(None);
    }
    let crc_ok = b[total - 4..total] == crc_bytes(&[&b[..total - 4]]);
    if crc == Some(true) && !crc_ok {
        return Ok(None);
    }
    Ok(Some((total, crc_ok)))
}

fn resync(b: &[u8], crc: Option<bool>) -> Resync {
    for p in 0..b.len() {
        match valid_fpdu(&b[p..], crc) {
            Ok(None) => continue,
            Err(()) => return Resync::NeedMore(p),
            Ok(Some((len, crc_ok))) => {
                if crc_ok && crc != Some(false) {
                    return Resync::At(p, "FPDU with a matching CRC");
                }
                // Without a CRC to vouch for it, the next two FPDUs must be valid as well.
                let mut q = p + len;
                let mut ok = true;
                for _ in 0..2 {
                    match valid_fpdu(&b[q.min(b.len())..], crc) {
                        Ok(Some((l, _))) => q += l,
                        Ok(None) => {
                            ok = false;
                            break;
                        }
                        Err(()) => return Resync::NeedMore(p),
                    }
                }
                if ok {
                    return Resync::At(p, "three consecutive valid FPDUs");
                }
            }
        }
    }
    Resync::NeedMore(b.len())
}
