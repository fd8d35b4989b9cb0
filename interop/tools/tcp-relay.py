#!/usr/bin/env python3
"""tcp-relay: forward every TCP connection accepted on 127.0.0.1:LISTEN to 127.0.0.1:TARGET.
  tcp-relay.py LISTEN TARGET SECONDS
Used to route a guest-internal kernel siw connection through the host (guest -> 10.0.2.2:LISTEN
-> relay -> 127.0.0.1:TARGET -> QEMU hostfwd -> guest), so that the host's loopback capture
sees exactly what kernel siw sends over the QEMU user network path oxrdma will use."""
import socket, sys, threading, time
lp, tp, secs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", lp)); ls.listen(16); ls.settimeout(1)
def pipe(a, b):
    try:
        while True:
            d = a.recv(1 << 16)
            if not d: break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try: s.shutdown(socket.SHUT_RDWR)
        except OSError: pass
end = time.time() + secs; n = 0
print(f"[relay] 127.0.0.1:{lp} -> 127.0.0.1:{tp}", flush=True)
while time.time() < end:
    try: c, _ = ls.accept()
    except socket.timeout: continue
    n += 1
    try: u = socket.create_connection(("127.0.0.1", tp), timeout=5)
    except OSError as e:
        print(f"[relay] conn {n}: target: {e}", flush=True); c.close(); continue
    for s in (c, u): s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
    print(f"[relay] conn {n} relayed", flush=True)
