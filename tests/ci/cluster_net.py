"""TCP probes for the test cluster's tests (tests/ci/test_cluster.sh), run
inside its hosts:

  cluster_net.py serve PORT N          accept N connections, read each to
                                       EOF, print "PEER BYTES SECONDS TEXT"
                                       for each (TEXT: its first 64 bytes)
  cluster_net.py send HOST PORT TEXT [BYTES]
                                       send TEXT, padded to BYTES
  cluster_net.py rtt HOST PORT N       connect N times; print the fastest
                                       connect (one round trip) in ms

Every socket times out after 20 s, and a client retries its first connect
for 10 s (the server may still be starting), so nothing here hangs.
"""
import socket
import sys
import time

TIMEOUT = 20


def connect(host, port):
    deadline = time.monotonic() + 10
    while True:
        try:
            return socket.create_connection((host, port), timeout=TIMEOUT)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def serve(port, n):
    with socket.create_server(("0.0.0.0", port)) as srv:
        srv.settimeout(TIMEOUT)
        for _ in range(n):
            conn, (peer, _) = srv.accept()
            with conn:
                conn.settimeout(TIMEOUT)
                t0, data = time.monotonic(), bytearray()
                while chunk := conn.recv(1 << 16):
                    data += chunk
                took = time.monotonic() - t0
            text = data[:64].rstrip(b"\0").decode(errors="replace") or "-"
            print(peer, len(data), f"{took:.3f}", text, flush=True)


def send(host, port, text, nbytes=0):
    msg = text.encode()
    with connect(host, port) as s:
        s.sendall(msg + b"\0" * max(0, nbytes - len(msg)))


def rtt(host, port, n):
    connect(host, port).close()  # the server is up, and ARP resolved
    best = float("inf")
    for _ in range(n - 1):
        t0 = time.monotonic()
        s = socket.create_connection((host, port), timeout=TIMEOUT)
        best = min(best, time.monotonic() - t0)
        s.close()
    print(f"{best * 1000:.3f}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "serve":
        serve(int(args[0]), int(args[1]))
    elif cmd == "send":
        send(args[0], int(args[1]), args[2], int(args[3]) if len(args) > 3 else 0)
    elif cmd == "rtt":
        rtt(args[0], int(args[1]), int(args[2]))
    else:
        sys.exit(f"cluster_net.py: unknown command {cmd!r}")
