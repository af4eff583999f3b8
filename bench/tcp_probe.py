#!/usr/bin/env python3
"""Raw TCP throughput over one link, the reference for bench/thinlink.sh's alpha-beta fits: what
one TCP stream gets through a shaped link, with nothing of MPI in the way.

  tcp_probe.py serve PORT            accept one connection, read to EOF, print "recv BYTES SECONDS"
  tcp_probe.py send HOST PORT MIB    send MIB MiB, print "send BYTES SECONDS GB/s"

The receiver's seconds run from the first byte to EOF, so connection set-up and slow start on an
idle link count as they would for an all-reduce's first bucket.
"""
import socket
import sys
import time


def serve(port):
    with socket.create_server(("0.0.0.0", port)) as s:
        conn, _ = s.accept()
        with conn:
            buf = bytearray(1 << 20)
            total, t0 = 0, None
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                if t0 is None:
                    t0 = time.perf_counter()
                total += n
            dt = time.perf_counter() - t0 if t0 else 0.0
            print(f"recv {total} {dt:.4f} {total / dt / 1e9 if dt > 0 else 0:.4f}", flush=True)


def send(host, port, mib):
    data = b"\0" * (1 << 20)
    for attempt in range(50):  # the server may still be starting
        try:
            conn = socket.create_connection((host, port))
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    else:
        sys.exit(f"tcp_probe: no server at {host}:{port}")
    with conn:
        t0 = time.perf_counter()
        for _ in range(mib):
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the server closes after reading everything
        dt = time.perf_counter() - t0
    print(f"send {mib << 20} {dt:.4f} {(mib << 20) / dt / 1e9:.4f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 5 and sys.argv[1] == "send":
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(__doc__)
