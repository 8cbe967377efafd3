"""The pure core shared by the agent, the extender and the trace simulator.

No I/O, no asyncio, no grpc/aiohttp/pynvml/kubernetes: the layer contract in pyproject.toml
(import-linter) enforces it.
"""

VERSION = "0.1.0"
