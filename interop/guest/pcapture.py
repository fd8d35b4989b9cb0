#!/usr/bin/python3
"""pcapture: minimal packet capture for the guest (its image has no tcpdump).
  pcapture.py IFACE OUTFILE [TCPPORT] [SECONDS]
Captures Ethernet frames on IFACE with an AF_PACKET socket into a classic pcap file,
keeping only TCP segments to/from TCPPORT if given, until SIGTERM/SIGINT or SECONDS.
On a loopback device every frame is seen twice (out and in); only the inbound copy is
kept, as tcpdump does.  Prints "pcapture: N packets" on exit."""
import signal, socket, struct, sys, time
ETH_P_ALL, PACKET_OUTGOING = 0x0003, 4
iface, out = sys.argv[1], sys.argv[2]
port = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "0" else None
secs = float(sys.argv[4]) if len(sys.argv) > 4 else 3600.0
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
s.bind((iface, 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.settimeout(0.2)
f = open(out, "wb")
f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))
f.flush()
stop = False
def _stop(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, _stop); signal.signal(signal.SIGINT, _stop)
is_lo = iface == "lo"
def wanted(fr):
    if port is None: return True
    if len(fr) < 34 or fr[12:14] != b"\x08\x00" or fr[23] != 6: return False
    ihl = (fr[14] & 0x0F) * 4
    if len(fr) < 14 + ihl + 4: return False
    sp, dp = struct.unpack_from("!HH", fr, 14 + ihl)
    return port in (sp, dp)
n = 0; end = time.time() + secs
print(f"pcapture: capturing on {iface} port {port} -> {out}", flush=True)
while not stop and time.time() < end:
    try:
        fr, addr = s.recvfrom(262144)
    except socket.timeout:
        continue
    except InterruptedError:
        continue
    if is_lo and addr[2] == PACKET_OUTGOING: continue
    if not wanted(fr): continue
    t = time.time()
    f.write(struct.pack("<IIII", int(t), int((t % 1) * 1e6), len(fr), len(fr)) + fr)
    f.flush(); n += 1
f.close()
print(f"pcapture: {n} packets", flush=True)
