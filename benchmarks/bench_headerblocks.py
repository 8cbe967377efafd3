"""CPU per HTTP/2 header block: `extender.headerblocks` against the `hpack` library's decoder.

    .venv/bin/python benchmarks/bench_headerblocks.py [--blocks 20000]

The blocks are what kube-scheduler's Go client sends the extender, encoded by the `hpack`
library's encoder the way Go's encoder does it (every field indexed when it fits the table):
the filter's and the bind's requests alternately, each with its own Content-Length. Both
decoders read the same sequence, alternately five times; the medians are printed with their ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import hpack

from sharepack.extender import headerblocks


def scheduler_blocks(count: int) -> list[bytes]:
    rng = random.Random(1)
    encoder = hpack.Encoder()
    out = []
    for i in range(count):
        path = b"/filter" if i % 2 == 0 else b"/bind"
        out.append(encoder.encode([
            (b":authority", b"sharepack-extender.kube-system.svc:8888"), (b":method", b"POST"),
            (b":path", path), (b":scheme", b"https"), (b"content-type", b"application/json"),
            (b"content-length", str(rng.randrange(2000, 30000)).encode()),
            (b"accept-encoding", b"gzip"), (b"user-agent", b"kube-scheduler/v1.35.0 (linux/amd64) kubernetes/abcdef0"),
        ], huffman=True))  # fmt: skip
    return out


def cpu_per_block(decode: Callable[[bytes], object], blocks: list[bytes]) -> float:
    t0 = time.process_time()
    for block in blocks:
        decode(block)
    return (time.process_time() - t0) * 1e6 / len(blocks)


def main(count: int) -> None:
    blocks = scheduler_blocks(count)
    runs: dict[str, list[float]] = {"hpack library": [], "extender.headerblocks": []}
    for _ in range(5):  # alternately, so that load from elsewhere hits both alike
        theirs = hpack.Decoder(max_header_list_size=65536)
        runs["hpack library"].append(cpu_per_block(lambda b: theirs.decode(b, raw=True), blocks))
        ours = headerblocks.Decoder(max_list=65536)
        runs["extender.headerblocks"].append(cpu_per_block(ours.decode, blocks))
    lib, own = (statistics.median(r) for r in runs.values())
    print(f"CPU per header block: hpack library {lib:.1f} us, extender.headerblocks {own:.1f} us, ratio {lib / own:.2f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--blocks", type=int, default=20000)
    main(p.parse_args().blocks)
