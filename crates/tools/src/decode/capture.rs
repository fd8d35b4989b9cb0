//! The capture container and the layers under TCP: classic pcap and pcapng files (`pcap-file`),
//! then Ethernet, Linux cooked captures (v1 and v2), BSD loopback (`tcpdump -i lo` on BSDs and
//! macOS writes LINKTYPE_NULL / LINKTYPE_LOOP) and raw IP, down to IPv4/IPv6 and TCP
//! (`etherparse`). What is not TCP is counted and skipped.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use pcap_file::pcap::PcapParser;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionOption;
use pcap_file::pcapng::{Block, PcapNgParser};
use pcap_file::{DataLink, TsResolution};

use super::DecodeError;

/// One TCP segment of the capture.
#[derive(Debug, Clone)]
pub struct TcpSegment<'a> {
    /// Frame number, 1-based, as Wireshark counts.
    pub frame: u64,
    /// Seconds since the epoch.
    pub time: f64,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    /// The payload as captured (shorter than sent when the capture was cut by its snap length).
    pub payload: &'a [u8],
    /// Payload bytes the segment carried on the wire (from the IP length).
    pub wire_len: usize,
}

/// What the container held besides TCP segments.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrameStats {
    /// Frames in the file.
    pub frames: u64,
    /// Frames that were not TCP over IPv4/IPv6 (ARP, UDP, ...).
    pub not_tcp: u64,
    /// Frames whose link type this decoder does not read.
    pub unknown_link: u64,
    /// Frames whose headers did not parse.
    pub malformed: u64,
    /// Set when the file ended in the middle of a record or block.
    pub truncated_file: bool,
}

/// A captured frame before the link layer is read.
struct RawFrame<'a> {
    time: f64,
    link: DataLink,
    data: &'a [u8],
}

/// Every TCP segment of a pcap or pcapng file held in `file`, in file order.
pub fn segments(file: &[u8]) -> Result<(Vec<TcpSegment<'_>>, FrameStats), DecodeError> {
    let mut stats = FrameStats::default();
    let frames = if file.len() >= 4 && file[..4] == [0x0a, 0x0d, 0x0d, 0x0a] {
        pcapng_frames(file, &mut stats)?
    } else {
        pcap_frames(file, &mut stats)?
    };
    let mut out = Vec::new();
    for (i, f) in frames.into_iter().enumerate() {
        stats.frames += 1;
        let frame = i as u64 + 1;
        match link_to_tcp(f.link, f.data) {
            Link::Tcp(seg) => out.push(TcpSegment {
                frame,
                time: f.time,
                ..seg
            }),
            Link::NotTcp => stats.not_tcp += 1,
            Link::Unsupported => stats.unknown_link += 1,
            Link::Malformed => stats.malformed += 1,
        }
    }
    Ok((out, stats))
}

fn pcap_frames<'a>(
    file: &'a [u8],
    stats: &mut FrameStats,
) -> Result<Vec<RawFrame<'a>>, DecodeError> {
    let (mut rest, parser) = PcapParser::new(file)
        .map_err(|e| DecodeError::Container(format!("not a pcap or pcapng file: {e}")))?;
    let header = parser.header();
    let mut out = Vec::new();
    while !rest.is_empty() {
        // The raw record, not the checked one: a frame longer than the snap length is still
        // read (the crate refuses it).
        let Ok((next, raw)) = parser.next_raw_packet(rest) else {
            stats.truncated_file = true;
            break;
        };
        rest = next;
        let frac = f64::from(raw.ts_frac);
        let frac = match header.ts_resolution {
            TsResolution::MicroSecond => frac / 1e6,
            TsResolution::NanoSecond => frac / 1e9,
        };
        let data: &'a [u8] = match raw.data {
            Cow::Borrowed(b) => b,
            // The slice parser always borrows.
            Cow::Owned(_) => continue,
        };
        out.push(RawFrame {
            time: f64::from(raw.ts_sec) + frac,
            link: header.datalink,
            data,
        });
    }
    Ok(out)
}

fn pcapng_frames<'a>(
    file: &'a [u8],
    stats: &mut FrameStats,
) -> Result<Vec<RawFrame<'a>>, DecodeError> {
    let (mut rest, mut parser) = PcapNgParser::new(file)
        .map_err(|e| DecodeError::Container(format!("bad pcapng section header: {e}")))?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let Ok((next, block)) = parser.next_block(rest) else {
            stats.truncated_file = true;
            break;
        };
        rest = next;
        let (iface, ts, data) = match block {
            Block::EnhancedPacket(p) => (Some(p.interface_id), p.timestamp, p.data),
            Block::SimplePacket(p) => (Some(0), std::time::Duration::ZERO, p.data),
            Block::Packet(p) => (
                Some(u32::from(p.interface_id)),
                std::time::Duration::from_nanos(p.timestamp),
                p.data,
            ),
            _ => (None, std::time::Duration::ZERO, Default::default()),
        };
        let Some(iface) = iface else { continue };
        let Some(idb) = parser.interfaces().get(iface as usize) else {
            stats.frames += 1;
            stats.malformed += 1;
            continue;
        };
        // pcapng timestamps are in units of the interface's if_tsresol (default 10^-6 s);
        // `pcap-file` hands back the raw count as nanoseconds.
        let units = ts.as_nanos() as f64;
        let resol = idb
            .options
            .iter()
            .find_map(|o| match o {
                InterfaceDescriptionOption::IfTsResol(r) => Some(*r),
                _ => None,
            })
            .unwrap_or(6);
        let per_sec = if resol & 0x80 != 0 {
            2f64.powi(i32::from(resol & 0x7f))
        } else {
            10f64.powi(i32::from(resol))
        };
        let link = idb.linktype;
        let data: &'a [u8] = match data {
            Cow::Borrowed(b) => b,
            // The slice parser borrows; an owned block would be a crate change: skip it.
            Cow::Owned(_) => continue,
        };
        out.push(RawFrame {
            time: units / per_sec,
            link,
            data,
        });
    }
    Ok(out)
}

enum Link<'a> {
    Tcp(TcpSegment<'a>),
    NotTcp,
    Unsupported,
    Malformed,
}

/// BSD loopback address families for IPv4 and IPv6 (DLT_NULL / DLT_LOOP: 2, and 24, 28 or 30).
fn null_family_is_ip(family: u32) -> bool {
    matches!(family, 2 | 24 | 28 | 30)
}

fn link_to_tcp(link: DataLink, data: &[u8]) -> Link<'_> {
    let sliced = match link {
        DataLink::ETHERNET => SlicedPacket::from_ethernet(data),
        DataLink::LINUX_SLL => SlicedPacket::from_linux_sll(data),
        // LINKTYPE_LINUX_SLL2: protocol type (be16) at 0, 20-byte header.
        DataLink::LINUX_SLL2 => match data.get(20..) {
            Some(ip) if data[..2] == [0x08, 0x00] || data[..2] == [0x86, 0xdd] => {
                SlicedPacket::from_ip(ip)
            }
            Some(_) => return Link::NotTcp,
            None => return Link::Malformed,
        },
        // LINKTYPE_NULL: the family in host order of the capturing machine; LINKTYPE_LOOP:
        // network order. Either order is accepted for both.
        DataLink::NULL | DataLink::LOOP => {
            let Some(fam) = data.get(..4) else {
                return Link::Malformed;
            };
            let le = u32::from_le_bytes([fam[0], fam[1], fam[2], fam[3]]);
            let be = u32::from_be_bytes([fam[0], fam[1], fam[2], fam[3]]);
            if !null_family_is_ip(le) && !null_family_is_ip(be) {
                return Link::NotTcp;
            }
            SlicedPacket::from_ip(&data[4..])
        }
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => SlicedPacket::from_ip(data),
        _ => return Link::Unsupported,
    };
    let Ok(p) = sliced else {
        return Link::Malformed;
    };
    let (src_ip, dst_ip, ip_payload_len): (IpAddr, IpAddr, usize) = match &p.net {
        Some(NetSlice::Ipv4(v4)) => (
            v4.header().source_addr().into(),
            v4.header().destination_addr().into(),
            v4.payload().payload.len(),
        ),
        Some(NetSlice::Ipv6(v6)) => (
            v6.header().source_addr().into(),
            v6.header().destination_addr().into(),
            v6.payload().payload.len(),
        ),
        _ => return Link::NotTcp,
    };
    let Some(TransportSlice::Tcp(t)) = &p.transport else {
        return Link::NotTcp;
    };
    let payload = t.payload();
    let wire_len = ip_payload_len.saturating_sub(t.header_len());
    Link::Tcp(TcpSegment {
        frame: 0,
        time: 0.0,
        src: SocketAddr::new(src_ip, t.source_port()),
        dst: SocketAddr::new(dst_ip, t.destination_port()),
        seq: t.sequence_number(),
        syn: t.syn(),
        fin: t.fin(),
        rst: t.rst(),
        payload,
        wire_len: wire_len.max(payload.len()),
    })
}
