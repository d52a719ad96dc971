#!/usr/bin/env python3
"""Scrapes a megatron.cpp --metrics-port endpoint and checks Prometheus' text exposition format.

usage: check_prometheus.py PORT [TIMEOUT_S]
Waits until the run has logged (megatron:iteration_time_seconds present), then checks every line
(HELP/TYPE comments before their sample, metric names, float values), the metrics Megatron
alert rules use, that the port listens on 127.0.0.1 only, and that an oversized request is
refused without stopping the server. Exit 0 on success, 1 with the reason otherwise.
"""
import re
import socket
import sys
import time
import urllib.request

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
REQUIRED = ["megatron:iteration_time_seconds", "megatron:tokens_per_second", "megatron:tflops_per_gpu",
            "megatron:lm_loss", "megatron:grad_norm", "megatron:loss_scale", "megatron:memory_max_allocated_bytes",
            "megatron:skipped_iterations_total", "megatron:nan_iterations_total", "megatron:iteration"]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        ctype = r.headers.get("Content-Type", "")
        return ctype, r.read().decode()


def parse(text):
    """Returns {name: (type, value)}; raises ValueError on a malformed line."""
    types, helps, samples = {}, set(), {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            helps.add(name)
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[3] not in ("gauge", "counter", "untyped"):
                raise ValueError(f"line {n}: bad TYPE line: {line!r}")
            types[parts[2]] = parts[3]
        elif line.startswith("#") or not line:
            continue
        else:
            parts = line.split(" ")
            if len(parts) != 2 or not NAME.match(parts[0]):
                raise ValueError(f"line {n}: bad sample: {line!r}")
            if parts[0] not in types or parts[0] not in helps:
                raise ValueError(f"line {n}: {parts[0]} has no HELP/TYPE before its sample")
            samples[parts[0]] = (types[parts[0]], float(parts[1]))  # float() takes NaN, +Inf
    return samples


def listening_addresses(port):
    found = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for l in lines:
            f = l.split()
            addr, p = f[1].split(":")
            if int(p, 16) == port and f[3] == "0A":  # LISTEN
                found.append(addr)
    return found


def main():
    port = int(sys.argv[1])
    deadline = time.time() + (float(sys.argv[2]) if len(sys.argv) > 2 else 120)
    samples, last_err = {}, "no answer"
    while time.time() < deadline:
        try:
            ctype, text = scrape(port)
            samples = parse(text)
            if "megatron:iteration_time_seconds" in samples:
                break
        except (OSError, ValueError) as e:
            last_err = str(e)
            if isinstance(e, ValueError):
                print(f"malformed exposition: {e}")
                return 1
        time.sleep(0.2)
    else:
        print(f"no metrics from port {port}: {last_err}")
        return 1
    if not ctype.startswith("text/plain"):
        print(f"content type {ctype!r}")
        return 1
    missing = [m for m in REQUIRED if m not in samples]
    if missing:
        print("missing metrics:", missing)
        return 1
    if samples["megatron:iteration"][1] < 1 or not samples["megatron:iteration_time_seconds"][1] > 0:
        print("implausible values:", samples)
        return 1
    if samples["megatron:skipped_iterations_total"][0] != "counter":
        print("skipped iterations should be a counter")
        return 1
    addrs = listening_addresses(port)
    if addrs != ["0100007F"]:
        print(f"port {port} listens on {addrs}, expected 127.0.0.1 only")
        return 1
    # An oversized request: refused (or the connection closed), and the server goes on serving.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        s.recv(100)
    except OSError:
        pass
    s.close()
    _, text = scrape(port)
    parse(text)
    for name, (kind, value) in sorted(samples.items()):
        print(f"{name} {kind} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
