#!/usr/bin/env python3
"""mpa-dump: decode MPA/DDP/RDMAP (iWARP, RFC 5044/5041/5040 + RFC 6581) from a pcap.
  mpa-dump.py FILE.pcap [PORT]
  mpa-dump.py --check FILE.pcap   framing only: one summary line; exit 1 if any FPDU is bad
                                  (a stream is walked up to the first bytes the capture lost)
Reassembles each TCP direction (in-order capture assumed: loopback; a retransmitted segment
contributes only its bytes past the ones already seen, a gap is reported), prints the MPA
Request/Reply (flags, revision, IRD/ORD, P2P/RTR bits), then every FPDU: ULPDU length,
DDP/RDMAP control, opcode, STag/TO or QN/MSN/MO, Send-with-Invalidate STag, and whether
the 4-byte CRC field holds CRC32c of the FPDU (and in which byte order) or zero.
Written for the oxrdma interop lab; no markers support (Linux siw never uses them)."""
import struct, sys

def crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t
T = crc32c_table()
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF

def packets(path):
    d = open(path, "rb").read()
    magic = struct.unpack_from("<I", d)[0]
    e = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    link = struct.unpack_from(e + "I", d, 20)[0]
    off = 24; n = 0
    while off + 16 <= len(d):
        ts, tu, caplen, _ = struct.unpack_from(e + "IIII", d, off); off += 16
        fr = d[off:off + caplen]; off += caplen; n += 1
        if link == 1: ip = fr[14:] if fr[12:14] == b"\x08\x00" else None
        elif link == 113: ip = fr[16:] if fr[14:16] == b"\x08\x00" else None
        elif link in (101, 228): ip = fr
        elif link == 0: ip = fr[4:]
        else: ip = None
        if not ip or ip[0] >> 4 != 4 or ip[9] != 6: continue
        ihl = (ip[0] & 15) * 4; tot = struct.unpack_from("!H", ip, 2)[0]
        tcp = ip[ihl:tot]
        sp, dp, seq = struct.unpack_from("!HHI", tcp)
        doff = (tcp[12] >> 4) * 4; flags = tcp[13]
        src = ".".join(map(str, ip[12:16])); dst = ".".join(map(str, ip[16:20]))
        yield n, (src, sp, dst, dp), seq, flags, tcp[doff:]

OPS = {0: "Write", 1: "ReadReq", 2: "ReadResp", 3: "Send", 4: "SendInv", 5: "SendSE",
       6: "SendSEInv", 7: "Terminate"}

def check_all(streams, order):
    """Walks every MPA stream's FPDUs (no CRC): each must carry DDP version 1, RDMAP version
    1, an opcode of RFC 5040 (0-7) and the Tagged flag that opcode requires."""
    tot = bad = gaps = resent = nmpa = cut = 0
    for k in order:
        s = streams[k]; b = s["buf"]
        gaps += s.get("gaps", 0); resent += s.get("resent", 0)
        if b[:16] not in (b"MPA ID Req Frame", b"MPA ID Rep Frame"):
            continue
        nmpa += 1
        # Bytes the capture missed (tcpdump dropped them): without markers nothing after the
        # gap can be framed again, so the walk stops there (the stream counts as cut short).
        limit = s.get("gap_at", len(b))
        if limit < len(b): cut += 1
        off = 20 + struct.unpack_from("!H", b, 18)[0]
        while off + 4 <= limit:
            ulen = struct.unpack_from("!H", b, off)[0]
            end = off + 2 + ulen + (-(2 + ulen)) % 4 + 4
            if end > limit: break             # the capture ended (or has a gap) inside an FPDU
            ddp, rdmap = b[off + 2], b[off + 3]
            op = rdmap & 15
            if ddp & 3 != 1 or rdmap >> 6 != 1 or op > 7 or (ddp >> 7) != (op in (0, 2)):
                bad += 1
                if bad <= 3:
                    print(f"bad FPDU: {k[0]}:{k[1]} -> {k[2]}:{k[3]} stream offset {off}: "
                          f"ddp 0x{ddp:02x} rdmap 0x{rdmap:02x} ulpdu {ulen}")
            tot += 1; off = end
    print(f"mpa_streams={nmpa} fpdus={tot} bad_fpdus={bad} gaps={gaps} resent_segments={resent} "
          f"streams_cut_at_a_gap={cut}")
    return 1 if bad else 0

def main():
    check = len(sys.argv) > 1 and sys.argv[1] == "--check"
    if check: del sys.argv[1]
    path = sys.argv[1]; port = int(sys.argv[2]) if len(sys.argv) > 2 else None
    streams = {}   # key -> dict(next_seq, buf, state, crc)
    order = []
    for n, k, seq, fl, pl in packets(path):
        if port and port not in (k[1], k[3]): continue
        s = streams.get(k)
        if s is None:
            s = streams[k] = {"next": None, "chunks": [], "state": "hs", "frames": [], "first": n}
            order.append(k)
        if fl & 0x02: s["next"] = (seq + 1) & 0xFFFFFFFF; continue
        if not pl: continue
        if s["next"] is None: s["next"] = seq
        if seq != s["next"]:
            behind = (s["next"] - seq) & 0xFFFFFFFF
            if behind < 0x80000000:
                # A retransmission (or a repeated segment): keep only what is new.
                s["resent"] = s.get("resent", 0) + 1
                if behind >= len(pl): continue
                pl = pl[behind:]; seq = s["next"]
            else:
                s["frames"].append(f"  !! gap at frame {n} (seq {seq}, expected {s['next']})")
                s["gaps"] = s.get("gaps", 0) + 1
                s.setdefault("gap_at", s.get("len", 0))
        s["next"] = (seq + len(pl)) & 0xFFFFFFFF
        s["chunks"].append(pl)
        s["len"] = s.get("len", 0) + len(pl)
    for k in order:
        streams[k]["buf"] = b"".join(streams[k].pop("chunks"))
    if check:
        return check_all(streams, order)
    conns = {}
    for k in order:
        rk = (k[2], k[3], k[0], k[1])
        conns.setdefault(tuple(sorted([k, rk])), []).append(k)
    for c, dirs in conns.items():
        hs = {}
        for k in dirs:
            b = streams[k]["buf"]
            if b[:16] in (b"MPA ID Req Frame", b"MPA ID Rep Frame"):
                hs[k] = b[:16]
        for k in dirs:
            decode(k, streams[k], hs)

def decode(k, s, hs):
    b = s["buf"]; name = f"{k[0]}:{k[1]} -> {k[2]}:{k[3]}"
    print(f"== {name}: {len(b)} bytes")
    for f in s["frames"]: print(f)
    off = 0; crc_on = None
    if b[:16] in (b"MPA ID Req Frame", b"MPA ID Rep Frame"):
        fl, rev, pdl = b[16], b[17], struct.unpack_from("!H", b, 18)[0]
        pd = b[20:20 + pdl]
        desc = [("M" if fl & 0x80 else "-") + ("C" if fl & 0x40 else "-") + ("R" if fl & 0x20 else "-") + ("S" if fl & 0x10 else "-")]
        print(f"  MPA {b[4:16].decode()!r}: flags 0x{fl:02x} [{desc[0]}: M=markers C=crc R=reject S=enhanced(v2)] rev {rev} "
              f"pd_len {pdl} pd {pd.hex()}")
        if fl & 0x10 and pdl >= 4:
            ird, ord_ = struct.unpack_from("!HH", pd)
            print(f"    MPAv2 IRD {ird & 0x3FFF} (P2P={ird >> 15 & 1}, Z/L={ird >> 14 & 1})  "
                  f"ORD {ord_ & 0x3FFF} (WRITE_RTR={ord_ >> 15 & 1}, READ_RTR={ord_ >> 14 & 1})"
                  f"  ULP private data {pd[4:].hex() or '-'}")
        off = 20 + pdl
        s["crc_flag"] = bool(fl & 0x40)
    nfp = 0
    while off + 2 <= len(b):
        ulen = struct.unpack_from("!H", b, off)[0]
        pad = (-(2 + ulen)) % 4
        end = off + 2 + ulen + pad + 4
        if end > len(b):
            print(f"  (truncated FPDU at stream offset {off}: ulpdu {ulen}, have {len(b) - off})"); break
        u = b[off + 2: off + 2 + ulen]
        crcf = b[end - 4:end]
        calc = crc32c(b[off:end - 4])
        if crcf == b"\0\0\0\0": crcs = "crc field 0 (CRC off)"
        elif crcf == struct.pack(">I", calc): crcs = f"CRC32c ok, big-endian on the wire ({crcf.hex()})"
        elif crcf == struct.pack("<I", calc): crcs = f"CRC32c ok, little-endian on the wire ({crcf.hex()})"
        else: crcs = f"CRC MISMATCH field {crcf.hex()} calc {calc:08x}"
        if len(u) < 2: print(f"  FPDU ulpdu {ulen} too short"); off = end; continue
        ddp, rdmap = u[0], u[1]
        t, l, dv = ddp >> 7 & 1, ddp >> 6 & 1, ddp & 3
        rv, op = rdmap >> 6, rdmap & 15
        opn = OPS.get(op, f"op{op}")
        if t:
            stag, to = struct.unpack_from("!IQ", u, 2); hl = 14
            body = f"tagged STag 0x{stag:08x} TO 0x{to:x}"
        else:
            inv, qn, msn, mo = struct.unpack_from("!IIII", u, 2); hl = 18
            body = f"untagged QN {qn} MSN {msn} MO {mo}" + (f" inv/rsvd 0x{inv:08x}" if inv or op in (4, 6) else "")
            if op == 1 and len(u) >= 18 + 28:
                sst, sto, sz, srs, srto = struct.unpack_from("!IQIIQ", u, 18)
                body += f" | ReadReq sink STag 0x{sst:08x} TO 0x{sto:x} size {sz} src STag 0x{srs:08x} TO 0x{srto:x}"
                hl += 28
            if op == 7:
                body += f" | Terminate {u[18:].hex()}"
        print(f"  FPDU #{nfp}: ulpdu {ulen} pad {pad} ddp 0x{ddp:02x} (T={t} L={l} DV={dv}) rdmap 0x{rdmap:02x} "
              f"(RV={rv} {opn}) {body} payload {ulen - hl} | {crcs}")
        nfp += 1; off = end
    if off < len(b) and off + 2 > len(b): print(f"  {len(b) - off} trailing bytes")

sys.exit(main())
