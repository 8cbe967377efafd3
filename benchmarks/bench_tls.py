"""Server CPU per TLS handshake of the extender's context (`extender.__main__.tls_context`,
mutual TLS, the sandbox's ECDSA P-256 certificates), against the same context issuing session
tickets, as Python's default does: both in one process, the ratio printed last.

    .venv/bin/python benchmarks/bench_tls.py [--handshakes 500]

kube-scheduler's client never resumes a session (client-go's TLS config has no session cache),
so a ticket is work for nothing; the extender's context issues none.
"""

from __future__ import annotations

import argparse
import ssl
import tempfile
import time
from pathlib import Path

from sharepack.extender.__main__ import tls_context
from sharepack.sandbox.controlplane.certificates import TlsFiles, write_tls_files


def _client(files: TlsFiles) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    ctx.check_hostname = False
    ctx.load_cert_chain(str(files.client_cert), str(files.client_key))
    return ctx


def server_cpu_per_handshake(server: ssl.SSLContext, client: ssl.SSLContext, n: int) -> float:
    """Mean server-side CPU seconds of `n` full handshakes over memory BIOs (no sockets, no loop)."""
    spent = 0.0
    for _ in range(n):
        s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        s = server.wrap_bio(s_in, s_out, server_side=True)
        c = client.wrap_bio(c_in, c_out, server_side=False)
        for _ in range(10):  # flights back and forth until the server is done
            try:
                c.do_handshake()
            except ssl.SSLWantReadError:
                pass
            s_in.write(c_out.read())
            t = time.process_time()
            try:
                s.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            spent += time.process_time() - t
            c_in.write(s_out.read())
            if done:
                break
        else:
            raise RuntimeError("the handshake did not finish")
    return spent / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--handshakes", type=int, default=500)
    opts = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        files = write_tls_files(Path(d))
        shipped = tls_context(str(files.server_cert), str(files.server_key), str(files.ca_cert))
        tickets = tls_context(str(files.server_cert), str(files.server_key), str(files.ca_cert))
        tickets.num_tickets = 2  # OpenSSL's default for TLS 1.3
        tickets.options &= ~ssl.OP_NO_TICKET
        client = _client(files)
        server_cpu_per_handshake(shipped, client, 20)  # warm up
        rounds = [(server_cpu_per_handshake(tickets, client, opts.handshakes),
                   server_cpu_per_handshake(shipped, client, opts.handshakes)) for _ in range(3)]  # fmt: skip
    with_t = sorted(r[0] for r in rounds)[1]
    without = sorted(r[1] for r in rounds)[1]
    print(f"server CPU per handshake (median of 3 x {opts.handshakes}): with session tickets {with_t * 1e3:.3f} ms, "
          f"as shipped (none) {without * 1e3:.3f} ms")  # fmt: skip
    print(f"tls handshake: as shipped / with tickets = {without / with_t:.2f}")


if __name__ == "__main__":
    main()
