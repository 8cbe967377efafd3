"""Only kube-scheduler talks to the extender: the verbs are served over mutual TLS, and a client
without a certificate, or with one another CA signed, is turned away in the TLS layer before any
HTTP is read. The extender runs as a real process (`python -m sharepack.extender`, as deployed: TLS flags,
--metrics-listen); the client side is raw TLS, so each refusal is pinned to where it happens.

TLS 1.2 checks the client certificate inside the handshake; TLS 1.3 finishes the client's side
of the handshake first and the server then drops the connection: either way no HTTP comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from sharepack.extender.__main__ import Options, Service, main, tls_context
from sharepack.sandbox.controlplane.certificates import write_tls_files
from tests.security.stack import SERVED, Stack, create_pod, http_request, metrics, node_of, stack, tls_exchange, tls_server
from tests.security.stack import client_context as tls_client

pytestmark = pytest.mark.timeout(120)

TLS12, TLS13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3


@pytest.fixture
async def served(tmp_short: Path) -> AsyncIterator[Stack]:
    async with stack(tmp_short, {"node-0": [(4, 0), (4, 0)]}) as s:
        yield s


def bind_body(pod: dict[str, object]) -> bytes:
    meta = pod["metadata"]
    assert isinstance(meta, dict)
    return orjson.dumps({"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "node-0"})


async def verb_requests(s: Stack) -> int:
    """Requests that reached a verb handler, whatever their answer."""
    return int(sum(v for k, v in (await metrics(s.extender)).items() if k.startswith("sharepack_extender_requests_total")))


async def test_the_schedulers_certificate_gets_an_http_answer(served: Stack) -> None:
    ctx = tls_client(served.tls.ca_cert, served.tls, TLS13)
    stage, reply = await asyncio.to_thread(tls_exchange, served.extender.port, ctx, http_request("/healthz"))
    assert stage == "reply" and reply.startswith(b"HTTP/1.1 200 OK") and reply.endswith(b"ok\n")


@pytest.mark.parametrize(("version", "stage"), [(TLS12, "handshake"), (TLS13, "reply")], ids=["TLS 1.2", "TLS 1.3"])
@pytest.mark.parametrize("who", ["no client certificate", "a certificate from another CA"])
async def test_a_client_the_ca_did_not_sign_is_refused_in_tls_before_any_http(
    served: Stack, who: str, version: ssl.TLSVersion, stage: str
) -> None:
    victim = create_pod(served.server, "victim", 0, nodeSelector={"no-such-label": "x"})
    cert = served.stranger if who.startswith("a certificate") else None
    ctx = tls_client(served.tls.ca_cert, cert, version)
    before = await verb_requests(served)
    got = await asyncio.to_thread(tls_exchange, served.extender.port, ctx, http_request("/bind", bind_body(victim)))
    assert got == (stage, b"")
    assert await verb_requests(served) == before  # no handler ran
    assert node_of(served.server, "victim") == ""
    # The same request with the scheduler's certificate does reach /bind (and is refused there).
    ctx = tls_client(served.tls.ca_cert, served.tls, version)
    stage_ok, reply = await asyncio.to_thread(tls_exchange, served.extender.port, ctx, http_request("/bind", bind_body(victim)))
    assert stage_ok == "reply" and b"bind refused (no-gpu-request)" in reply


async def test_plain_http_on_the_tls_port_gets_no_answer(served: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            async with http.get(f"http://127.0.0.1:{served.extender.port}/healthz") as resp:
                await resp.read()


async def test_the_metrics_listener_serves_probes_and_metrics_in_plain_http_but_no_verb(served: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        for path in ("/healthz", "/readyz", "/metrics"):
            async with http.get(served.extender.probes_url + path) as resp:
                assert resp.status == 200, path
        for verb in ("filter", "prioritize", "bind"):
            async with http.post(f"{served.extender.probes_url}/{verb}", data=b"{}") as resp:
                assert resp.status == 404, verb


async def test_the_system_ca_store_does_not_vouch_for_clients(tmp_short: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenSSL's default trust store (here pointed at another CA through SSL_CERT_FILE) must not
    let that CA's clients in: only --client-ca-file counts."""
    ours, theirs = write_tls_files(tmp_short / "ours"), write_tls_files(tmp_short / "theirs", ca_name="public CA")
    monkeypatch.setenv("SSL_CERT_FILE", str(theirs.ca_cert))

    async def serve(ctx: ssl.SSLContext) -> tuple[str, bytes]:
        async with tls_server(ctx) as port:
            return await asyncio.to_thread(tls_exchange, port, tls_client(ours.ca_cert, theirs, TLS12), b"hi")

    assert await serve(tls_context(str(ours.server_cert), str(ours.server_key), str(ours.ca_cert))) == ("handshake", b"")
    # What the check guards against: a context that also loads OpenSSL's default paths.
    lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    lax.load_cert_chain(str(ours.server_cert), str(ours.server_key))
    lax.load_verify_locations(cafile=str(ours.ca_cert))
    lax.set_default_verify_paths()
    lax.verify_mode = ssl.CERT_REQUIRED
    assert await serve(lax) == ("reply", SERVED)


def _resumes(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    """Whether a second connection of `client` resumes the first one's session (memory BIOs)."""
    session = None
    for _ in range(2):
        s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
        s = server.wrap_bio(s_in, s_out, server_side=True)
        c = client.wrap_bio(c_in, c_out, server_side=False, server_hostname="localhost", session=session)
        for _ in range(3):  # flights back and forth (a finished handshake ignores the extra calls)
            with contextlib.suppress(ssl.SSLWantReadError):
                c.do_handshake()
            s_in.write(c_out.read())
            with contextlib.suppress(ssl.SSLWantReadError):
                s.do_handshake()
            c_in.write(s_out.read())
        s.write(b"x")  # TLS 1.3 tickets come after the handshake: read past them
        c_in.write(s_out.read())
        assert c.read() == b"x"
        if c.session_reused:
            return True
        session = c.session
    return False


def test_no_session_tickets_kube_schedulers_client_never_resumes(tmp_short: Path) -> None:
    """client-go keeps no TLS session cache: a ticket would be server CPU spent at every handshake."""
    files = write_tls_files(tmp_short)
    client = tls_client(files.ca_cert, files, TLS13)
    shipped = tls_context(str(files.server_cert), str(files.server_key), str(files.ca_cert))
    assert not _resumes(shipped, client)
    # What the check can see: the same context issuing tickets is resumed.
    tickets = tls_context(str(files.server_cert), str(files.server_key), str(files.ca_cert))
    tickets.num_tickets, tickets.options = 2, tickets.options & ~ssl.OP_NO_TICKET
    assert _resumes(tickets, client)


# --- flags ----------------------------------------------------------------------------------------


def test_without_tls_flags_the_extender_refuses_to_start_unless_told_to_serve_plain_http(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--listen", "127.0.0.1:0"]) == 2
    assert capsys.readouterr().err == (
        "sharepack-extender: error: refusing to serve /bind without client authentication: pass --tls-cert-file, "
        "--tls-private-key-file and --client-ca-file, or --insecure-http to serve plain HTTP\n"
    )


@pytest.mark.parametrize(("extra", "named"), [
    pytest.param([], "--tls-cert-file without --client-ca-file lets any client call /bind", id="TLS without a client CA"),
    pytest.param(["--client-ca-file", "EMPTY"], "invalid --client-ca-file option: EMPTY: ", id="a CA file with no certificate"),
    pytest.param(["--client-ca-file", "/nonexistent/ca.crt"], "invalid --client-ca-file option: /nonexistent/ca.crt: No such file",
                 id="a missing CA file"),
    pytest.param(["--client-ca-file", "CA", "--insecure-http"], "--insecure-http contradicts --tls-cert-file",
                 id="TLS and plain HTTP at once"),
])  # fmt: skip
def test_a_tls_flag_problem_is_a_usage_error_naming_it(
    tmp_short: Path, capsys: pytest.CaptureFixture[str], extra: list[str], named: str
) -> None:
    tls = write_tls_files(tmp_short / "tls")
    empty = tmp_short / "empty.pem"
    empty.write_text("")
    extra = [str(empty) if a == "EMPTY" else str(tls.ca_cert) if a == "CA" else a for a in extra]
    named = named.replace("EMPTY", str(empty))
    with pytest.raises(SystemExit) as exit_info:
        main(["--tls-cert-file", str(tls.server_cert), "--tls-private-key-file", str(tls.server_key), *extra])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_client_ca_alone_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--client-ca-file", "/etc/ca.crt"])
    assert "--client-ca-file needs --tls-cert-file and --tls-private-key-file" in capsys.readouterr().err


async def test_plain_http_is_served_only_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    svc = Service(Options(listen="127.0.0.1:0", in_cluster=False, insecure_http=True), api=None)
    with caplog.at_level(logging.WARNING, logger="extender"):
        await svc.start()
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [f"serving plain HTTP on 127.0.0.1:{svc.port} without client authentication "
                            "(--insecure-http): anyone who reaches this port can ask /bind to bind pods"]  # fmt: skip
    finally:
        await svc.stop()


def test_the_help_names_the_security_flags() -> None:
    usage = subprocess.run([sys.executable, "-m", "sharepack.extender", "--help"], capture_output=True, text=True,
                           timeout=60, check=True).stdout  # fmt: skip
    for flag in ("--client-ca-file", "--insecure-http", "--metrics-listen", "--scheduler-name", "--unscored-binds"):
        assert flag in usage
