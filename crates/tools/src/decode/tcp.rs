//! TCP stream reassembly, per direction, by sequence number: retransmitted bytes are dropped,
//! out-of-order segments wait in a bounded queue, and what never arrives is reported as a gap
//! (the byte count missing) so that the stream decoders can resynchronise after it.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use super::capture::TcpSegment;

/// Out-of-order segments held per direction before the hole in front of them is declared a gap.
pub const MAX_OOO_SEGMENTS: usize = 64;
/// Out-of-order bytes held per direction before the hole in front of them is declared a gap.
pub const MAX_OOO_BYTES: usize = 4 << 20;

/// What reassembly hands the stream decoders, in stream order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// In-order bytes, with the frame that carried them.
    Data {
        frame: u64,
        time: f64,
        data: Vec<u8>,
    },
    /// `missing` bytes of the stream were not in the capture.
    Gap { frame: u64, time: f64, missing: u64 },
}

/// Which way a segment went: from the side that opened the connection (or was seen first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Side {
    /// From the initiator (the SYN's sender).
    Client,
    /// From the responder.
    Server,
}

impl Side {
    /// 0 for the client's direction, 1 for the server's.
    pub fn index(self) -> usize {
        match self {
            Side::Client => 0,
            Side::Server => 1,
        }
    }
}

/// One direction of a connection.
#[derive(Debug, Default)]
struct Half {
    /// The next sequence number expected, once known.
    next: Option<u32>,
    /// Segments ahead of `next`, by sequence number relative to `next` when queued.
    ooo: BTreeMap<u32, (u64, f64, Vec<u8>)>,
    ooo_bytes: usize,
    /// Bytes dropped as retransmissions.
    retransmitted: u64,
    /// The FIN's sequence number, frame and time: bytes before it that never came are a gap.
    fin: Option<(u32, u64, f64)>,
}

/// Signed distance from `b` to `a` in sequence space.
fn seq_diff(a: u32, b: u32) -> i64 {
    i64::from(a.wrapping_sub(b) as i32)
}

impl Half {
    fn push(&mut self, seg: &TcpSegment<'_>, out: &mut Vec<Event>) {
        if seg.syn {
            self.next = Some(seg.seq.wrapping_add(1));
            if seg.payload.is_empty() {
                return;
            }
        }
        if seg.fin {
            let end = seg.seq.wrapping_add(seg.wire_len as u32);
            self.fin.get_or_insert((end, seg.frame, seg.time));
        }
        if seg.payload.is_empty() && seg.wire_len == 0 {
            return;
        }
        // A segment cut by the snap length: what is missing is a gap right after it.
        let seq = if seg.syn {
            seg.seq.wrapping_add(1)
        } else {
            seg.seq
        };
        let next = *self.next.get_or_insert(seq);
        let d = seq_diff(seq, next);
        if d > 0 {
            self.queue(seq, seg, out);
            return;
        }
        self.deliver(seq, seg.frame, seg.time, seg.payload.to_vec(), out);
        let cut = seg.wire_len.saturating_sub(seg.payload.len());
        if cut > 0 && seq_diff(seq.wrapping_add(seg.payload.len() as u32), next) >= 0 {
            out.push(Event::Gap {
                frame: seg.frame,
                time: seg.time,
                missing: cut as u64,
            });
            self.next = Some(seq.wrapping_add(seg.wire_len as u32));
        }
        self.drain(out);
    }

    /// Deliver what of `data` (starting at `seq`) is new.
    fn deliver(&mut self, seq: u32, frame: u64, time: f64, data: Vec<u8>, out: &mut Vec<Event>) {
        let Some(next) = self.next else { return };
        let d = seq_diff(seq, next);
        let skip = usize::try_from(-d.min(0)).unwrap_or(usize::MAX);
        if skip >= data.len() {
            self.retransmitted += data.len() as u64;
            return;
        }
        self.retransmitted += skip as u64;
        let data = data[skip..].to_vec();
        self.next = Some(next.wrapping_add(data.len() as u32));
        out.push(Event::Data { frame, time, data });
    }

    fn queue(&mut self, seq: u32, seg: &TcpSegment<'_>, out: &mut Vec<Event>) {
        if self.ooo.contains_key(&seq) {
            self.retransmitted += seg.payload.len() as u64;
            return;
        }
        self.ooo_bytes += seg.payload.len();
        self.ooo
            .insert(seq, (seg.frame, seg.time, seg.payload.to_vec()));
        if self.ooo.len() > MAX_OOO_SEGMENTS || self.ooo_bytes > MAX_OOO_BYTES {
            self.skip_hole(out);
        }
    }

    /// Declare the hole before the earliest queued segment lost, and go on from there.
    fn skip_hole(&mut self, out: &mut Vec<Event>) {
        let Some(next) = self.next else { return };
        // The queued segment closest ahead of `next` in sequence space.
        let first = self
            .ooo
            .iter()
            .map(|(s, (f, t, _))| (seq_diff(*s, next), *s, *f, *t))
            .min_by_key(|(d, ..)| *d);
        let Some((d, seq, frame, time)) = first else {
            return;
        };
        if d > 0 {
            out.push(Event::Gap {
                frame,
                time,
                missing: d as u64,
            });
            self.next = Some(seq);
        }
        self.drain(out);
    }

    /// Deliver queued segments that are now in order.
    fn drain(&mut self, out: &mut Vec<Event>) {
        loop {
            let Some(next) = self.next else { return };
            let ready = self.ooo.keys().copied().find(|s| seq_diff(*s, next) <= 0);
            let Some(seq) = ready else { return };
            if let Some((frame, time, data)) = self.ooo.remove(&seq) {
                self.ooo_bytes -= data.len();
                self.deliver(seq, frame, time, data, out);
            }
        }
    }

    /// End of capture: every hole left is a gap.
    fn finish(&mut self, out: &mut Vec<Event>) {
        while !self.ooo.is_empty() {
            let before = self.ooo.len();
            self.skip_hole(out);
            if self.ooo.len() == before {
                // Only segments behind `next` remain (cannot happen after drain): drop them.
                self.ooo.clear();
            }
        }
        self.ooo_bytes = 0;
        if let (Some(next), Some((end, frame, time))) = (self.next, self.fin)
            && seq_diff(end, next) > 0
        {
            out.push(Event::Gap {
                frame,
                time,
                missing: seq_diff(end, next) as u64,
            });
            self.next = Some(end);
        }
    }
}

/// One TCP connection seen in the capture.
#[derive(Debug)]
pub struct Connection {
    /// Stream number, from 0 in order of first appearance (as tshark's `tcp.stream`).
    pub id: u32,
    pub client: SocketAddr,
    pub server: SocketAddr,
    /// True when the capture holds the client's SYN.
    pub saw_syn: bool,
    halves: [Half; 2],
}

impl Connection {
    fn new(id: u32, seg: &TcpSegment<'_>) -> Self {
        // The SYN's sender is the client; a SYN-ACK's receiver is; otherwise (joined in the
        // middle) the side with the higher port is taken as the client.
        let src_is_client = if seg.syn {
            true
        } else {
            seg.src.port() > seg.dst.port()
        };
        let (client, server) = if src_is_client {
            (seg.src, seg.dst)
        } else {
            (seg.dst, seg.src)
        };
        Connection {
            id,
            client,
            server,
            saw_syn: seg.syn,
            halves: Default::default(),
        }
    }

    /// Which side sent a segment from `src`.
    pub fn side(&self, src: SocketAddr) -> Side {
        if src == self.client {
            Side::Client
        } else {
            Side::Server
        }
    }

    /// Bytes dropped as retransmissions, per side.
    pub fn retransmitted(&self) -> [u64; 2] {
        [self.halves[0].retransmitted, self.halves[1].retransmitted]
    }
}

/// Every connection of a capture.
#[derive(Debug, Default)]
pub struct Reassembler {
    conns: Vec<Connection>,
    index: std::collections::HashMap<(SocketAddr, SocketAddr), usize>,
}

impl Reassembler {
    /// Feed one segment; returns the connection's index and side, and what became in order.
    pub fn push(&mut self, seg: &TcpSegment<'_>) -> (usize, Side, Vec<Event>) {
        let key = if seg.src <= seg.dst {
            (seg.src, seg.dst)
        } else {
            (seg.dst, seg.src)
        };
        // One stream per address pair: a later connection reusing the same pair continues it
        // (its SYN restarts the sequence tracking; the decoders see its bytes as more of the
        // same stream).
        let idx = match self.index.get(&key) {
            Some(&i) => i,
            None => {
                let id = self.conns.len() as u32;
                let mut c = Connection::new(id, seg);
                if seg.syn && seg.src != c.client {
                    // A SYN-ACK seen first: its sender is the server.
                    std::mem::swap(&mut c.client, &mut c.server);
                }
                self.conns.push(c);
                self.index.insert(key, self.conns.len() - 1);
                self.conns.len() - 1
            }
        };
        let conn = &mut self.conns[idx];
        let side = conn.side(seg.src);
        let mut out = Vec::new();
        conn.halves[side.index()].push(seg, &mut out);
        (idx, side, out)
    }

    /// End of capture: the gaps still open, per connection and side.
    pub fn finish(&mut self) -> Vec<(usize, Side, Vec<Event>)> {
        let mut all = Vec::new();
        for (i, c) in self.conns.iter_mut().enumerate() {
            for side in [Side::Client, Side::Server] {
                let mut out = Vec::new();
                c.halves[side.index()].finish(&mut out);
                if !out.is_empty() {
                    all.push((i, side, out));
                }
            }
        }
        all
    }

    /// The connections, by index.
    pub fn connections(&self) -> &[Connection] {
        &self.conns
    }
}
