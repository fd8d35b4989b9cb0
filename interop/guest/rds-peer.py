#!/usr/bin/python3
"""rds-peer: AF_RDS test peer for the oxrdma interop lab (guest side; kernel rds_tcp).
  rds-peer.py echo   LOCAL_IP PORT [COUNT] [TIMEOUT]        echo COUNT datagrams back to sender
  rds-peer.py ping   LOCAL_IP PORT DEST_IP DPORT COUNT SIZE [TIMEOUT]
                     send COUNT datagrams of SIZE bytes, wait for each echo, verify it
  rds-peer.py send   LOCAL_IP PORT DEST_IP DPORT COUNT SIZE [LINGER]
                     blocking sends, no answer expected; keeps the socket open LINGER s (10)
                     afterwards, because closing an RDS socket drops its still-queued messages
  rds-peer.py recv   LOCAL_IP PORT COUNT SIZE [DELAY] [TIMEOUT] [RCVBUF]
                     sleep DELAY s first (lets the sender hit congestion), then receive COUNT
                     datagrams and check they arrive complete and in order
Payload of datagram number SEQ (0-based) with SIZE >= 8 bytes: 8-byte big-endian SEQ, then
byte i (i >= 8) = (SEQ + i) & 0xff.  Prints "OK ..." / "FAIL ..." and a rate line; exit 0/1.
(Sends retry on ENOBUFS; the first send to a new peer blocks until the multipath probe is
answered, see vmlab's README.)"""
import errno, signal, socket, struct, sys, time

def payload(seq, size):
    if size < 8:
        return bytes((seq + i) & 0xFF for i in range(size))
    return struct.pack("!Q", seq) + bytes((seq + i) & 0xFF for i in range(8, size))

def check(data, size):
    if len(data) != size: return None, f"length {len(data)} != {size}"
    if size < 8: return None, "ok"
    seq = struct.unpack_from("!Q", data)[0]
    return (seq, "ok") if data == payload(seq, size) else (seq, "payload mismatch")

def sock(ip, port, rcvbuf=None):
    s = socket.socket(socket.AF_RDS, socket.SOCK_SEQPACKET, 0)
    if rcvbuf: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((ip, int(port)))
    return s

def send(s, data, dest, deadline):
    while True:
        try:
            s.sendto(data, dest); return
        except OSError as e:
            if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED, errno.ENOTCONN) or time.time() > deadline:
                raise
            time.sleep(0.01)

def main(a):
    mode = a[0] if a else ""
    if mode == "echo":
        s = sock(a[1], a[2]); n = int(a[3]) if len(a) > 3 else 1 << 30
        s.settimeout(float(a[4]) if len(a) > 4 else 300)
        print(f"echo bound {a[1]}:{a[2]}", flush=True)
        done = 0
        try:
            while done < n:
                data, peer = s.recvfrom(1 << 20)
                send(s, data, peer, time.time() + 30); done += 1
        except socket.timeout:
            pass
        print(f"OK echo {done} datagrams", flush=True); return 0
    if mode in ("ping", "send"):
        s = sock(a[1], a[2]); dest = (a[3], int(a[4])); n, size = int(a[5]), int(a[6])
        tmo = float(a[7]) if len(a) > 7 else 60
        s.settimeout(tmo); t0 = time.time()
        for seq in range(n):
            send(s, payload(seq, size), dest, time.time() + tmo)
            if mode == "ping":
                try:
                    data, peer = s.recvfrom(1 << 20)
                except socket.timeout:
                    print(f"FAIL ping {size}: no echo for #{seq} within {tmo}s", flush=True); return 1
                got, why = check(data, size)
                if why != "ok" or (size >= 8 and got != seq):
                    print(f"FAIL ping {size}: echo #{seq} {why} (seq {got})", flush=True); return 1
        dt = max(time.time() - t0, 1e-6)
        print(f"OK {mode} {size} count={n} {n / dt:.0f} msg/s {n * size / dt / 1e6:.2f} MB/s", flush=True)
        if mode == "send":
            # A blocking RDS send returns once the message is queued; closing the socket drops
            # whatever it still has queued (rds_release -> rds_send_drop_to), so linger.
            time.sleep(float(a[7]) if len(a) > 7 else 10)
        return 0
    if mode == "recv":
        n, size = int(a[3]), int(a[4]); delay = float(a[5]) if len(a) > 5 else 0
        tmo = float(a[6]) if len(a) > 6 else 120; rcvbuf = int(a[7]) if len(a) > 7 else None
        s = sock(a[1], a[2], rcvbuf); s.settimeout(tmo)
        print(f"recv bound {a[1]}:{a[2]}, reading after {delay}s", flush=True)
        time.sleep(delay); t0 = None
        for i in range(n):
            try:
                data, peer = s.recvfrom(1 << 20)
            except socket.timeout:
                print(f"FAIL recv: got {i} of {n} datagrams", flush=True); return 1
            t0 = t0 or time.time()
            got, why = check(data, size)
            if why != "ok" or (size >= 8 and got != i):
                print(f"FAIL recv #{i}: {why} (seq {got})", flush=True); return 1
        dt = max(time.time() - (t0 or time.time()), 1e-6)
        print(f"OK recv {size} count={n} in order, {n / dt:.0f} msg/s {n * size / dt / 1e6:.2f} MB/s", flush=True)
        return 0
    sys.exit(__doc__)

sys.exit(main(sys.argv[1:]))
