"""The goal judgements and the option handling of ``specserve bench`` (no torch, milliseconds)."""

from __future__ import annotations

import pytest

from specserve.bench.options import DEFAULT_SECTIONS, SECTIONS, options_from_args
from specserve.bench.report import Column, Section, at_least, at_most, markdown_table, within
from specserve.server.cli import build_parser


@pytest.mark.parametrize("value,limit,expected", [
    (1.05, 1.10, "met"), (1.10, 1.10, "met"), (1.21, 1.10, "missed: 10% above the limit"),
    (3.0, 1.5, "missed: 100% above the limit"), (None, 1.1, "n/a"), (float("nan"), 1.1, "n/a")])
def test_at_most(value, limit, expected):
    assert at_most(value, limit) == expected


@pytest.mark.parametrize("value,limit,expected", [
    (0.90, 0.85, "met"), (0.68, 0.85, "missed: 20% below the goal"), (1.5, 3.0, "missed: 50% below the goal")])
def test_at_least(value, limit, expected):
    assert at_least(value, limit) == expected


def test_within_says_which_side_and_by_how_much():
    assert within(1.05, 1.0, 0.10) == "met (+5%)"
    assert within(0.95, 1.0, 0.10) == "met (-5%)"
    assert within(1.25, 1.0, 0.10) == "missed: 25% above (allowed 10%)"
    assert within(0.5, 1.0, 0.10) == "missed: 50% below (allowed 10%)"
    assert within(None, 1.0, 0.1) == "n/a" and within(1.0, None, 0.1) == "n/a"


def test_markdown_table_formats_per_column_and_per_row():
    s = Section("x", "X", [Column("label", "Q", "str"), Column("value", "V", "row"),
                           Column("t", "T", "ms"), Column("r", "R", "x")],
                rows=[{"label": "bw", "value": 3.0e12, "kind": "gbps", "t": 0.0123, "r": 1.234},
                      {"label": "a|b", "value": 0.8512, "kind": "pct"}])
    lines = markdown_table(s).splitlines()
    assert lines[0] == "| Q | V | T | R |"
    assert lines[2] == "| bw | 3,000.0 GB/s | 12.3 ms | 1.23x |"
    assert lines[3] == "| a\\|b | 85.1% | – | – |"


def _parse(*argv: str):
    return build_parser().parse_args(["bench", *argv])


def test_bench_is_a_specserve_subcommand_with_quick_preset():
    opts = options_from_args(_parse("--out", "/tmp/x", "--quick", "--k", "3"))
    assert opts.quick and opts.k == 3 and opts.batch_sizes == (1, 4) and opts.cpu_threads == 1
    full = options_from_args(_parse("--out", "/tmp/x", "--batch-sizes", "1,8", "--sections", "roofline,e2e"))
    assert full.batch_sizes == (1, 8) and full.sections == ("roofline", "e2e")
    assert full.serve_concurrency == (1, 16, 64) and full.output_len == 128
    assert options_from_args(_parse("--out", "/tmp/x")).sections == DEFAULT_SECTIONS
    assert set(SECTIONS) - set(DEFAULT_SECTIONS) == {"adaptive"}      # asked for by name only
    ada = options_from_args(_parse("--out", "/tmp/x", "--sections", "adaptive", "--adaptive-ks", "1,2",
                                   "--no-adaptive-exact-widths"))
    assert ada.sections == ("adaptive",) and ada.adaptive_ks == (1, 2) and not ada.adaptive_exact_widths
    assert ada.adaptive_batch_sizes == (1, 4, 16, 64, 256)


def test_bad_options_are_refused():
    with pytest.raises(SystemExit):
        _parse("--out", "/tmp/x", "--sections", "roofline,nope")
    with pytest.raises(ValueError, match="pair-draft"):
        options_from_args(_parse("--out", "/tmp/x", "--pair-target", "/tmp/t"))
    with pytest.raises(ValueError, match="--k"):
        options_from_args(_parse("--out", "/tmp/x", "--k", "0"))


def test_requests_per_level_are_bounded():
    opts = options_from_args(_parse("--out", "/tmp/x"))
    assert [opts.requests_for(c) for c in (1, 16, 64, 256)] == [8, 32, 128, 128]


@pytest.mark.parametrize("value,kind,text", [
    (4.46e6, "count", "4.46 M"), (8.19e9, "count", "8.19 B"), (0.0123, "time", "12.3 ms"),
    (1.31e-4, "time", "131 µs"), (2.5, "time", "2.5 s"), (21000, "bytes", "21 kB"),
    (1.64e10, "bytes", "16.4 GB"), (3.35e12, "bw", "3,350 GB/s"), (0.851, "pct", "85.1%"),
    (None, "time", "–"), ("skipped: why", "time", "skipped: why"), (True, "bool", "yes")])
def test_units(value, kind, text):
    from specserve.bench.report import fmt

    assert fmt(value, kind) == text


def test_the_header_lists_the_settings_of_the_sections_that_ran():
    """Section adaptive alone used the adaptive_* options, not the decode ones it never read."""
    from specserve.bench.report import header_markdown

    base = {"quick": False, "dtype": "bfloat16", "kernel_backend": "auto", "execution_mode": "graphs",
            "k": 4, "prompt_len": 128, "output_len": 128, "batch_sizes": (1, 16, 64),
            "adaptive_batch_sizes": (1, 4), "adaptive_ks": (1, 2, 8), "adaptive_variants": ()}
    alone = header_markdown({}, {**base, "sections": ("adaptive",)})
    assert "adaptive_batch_sizes=(1, 4)" in alone and "prompt_len=" not in alone.replace("adaptive_prompt_len", "")
    assert "execution_mode" not in alone
    both = header_markdown({}, {**base, "sections": ("roofline", "adaptive")})
    assert "batch_sizes=(1, 16, 64)" in both and "adaptive_ks=(1, 2, 8)" in both
    decode = header_markdown({}, {**base, "sections": ("roofline",)})
    assert "execution_mode=graphs" in decode and "adaptive_" not in decode


def test_the_flags_variant_names_are_the_controllers_variants():
    """--adaptive-variants checks names against options.ADAPTIVE_VARIANTS (no torch import at
    parse time); the controllers come from bench.adaptive.VARIANTS: the two lists must agree."""
    from specserve.bench.adaptive import VARIANTS
    from specserve.bench.options import ADAPTIVE_VARIANTS

    assert tuple(VARIANTS) == ADAPTIVE_VARIANTS


def test_tcp_counters_read_the_named_counters_of_both_files(tmp_path):
    """The serve section's per-level TCP counters come from /proc/net/snmp and /proc/net/netstat:
    header and value lines in pairs, only the counters it names; None where a file is missing."""
    from specserve.bench.serve_load import tcp_counters

    snmp = tmp_path / "snmp"
    snmp.write_text("Ip: Forwarding InReceives\nIp: 1 99\n"
                    "Tcp: RtoAlgorithm ActiveOpens PassiveOpens RetransSegs\nTcp: 1 7 8 3\n")
    netstat = tmp_path / "netstat"
    netstat.write_text("TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPSynRetrans TCPTimeouts TCPLossProbes\n"
                       "TcpExt: 5 2 2 4 1 6\nIpExt: InNoRoutes\nIpExt: 0\n")
    assert tcp_counters((str(snmp), str(netstat))) == {
        "ActiveOpens": 7, "PassiveOpens": 8, "RetransSegs": 3, "ListenOverflows": 2, "ListenDrops": 2,
        "TCPSynRetrans": 4, "TCPTimeouts": 1, "TCPLossProbes": 6}
    assert tcp_counters((str(snmp), str(tmp_path / "missing"))) is None


def test_serve_load_clients_default_to_raw():
    """The raw client by default, streams or bodies; both may be named; nothing else."""
    assert options_from_args(_parse("--out", "/tmp/x")).load_clients == ("raw",)
    assert options_from_args(_parse("--out", "/tmp/x", "--serve-no-stream")).load_clients == ("raw",)
    both = options_from_args(_parse("--out", "/tmp/x", "--serve-no-stream", "--serve-clients", "httpx,raw"))
    assert both.load_clients == ("httpx", "raw")
    with pytest.raises(ValueError, match="httpx, raw"):
        options_from_args(_parse("--out", "/tmp/x", "--serve-no-stream", "--serve-clients", "curl"))


async def _request_body(reader) -> bytes:
    """A scripted server's read of one request: its head, then its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


def _raw_client_against(handle, body_of, prompts: list, timeout: float):
    """The raw load client, one worker, against a scripted asyncio server ``handle`` on a free port."""
    import asyncio

    from specserve.bench.serve_load import _drive_raw

    async def run():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await _drive_raw(f"http://127.0.0.1:{port}", body_of, prompts, concurrency=1, timeout=timeout)

    records, _, _ = asyncio.run(run())
    return records


def test_the_raw_load_client_records_failures_and_reconnects():
    """The serve section's raw client against a scripted server, one worker: an error status is
    a failed request on a kept connection; Connection: close, a chunked reply that is not JSON
    and a timeout each cost a new connection; the requests after them still succeed; no
    exception ends the level."""
    import asyncio
    import json as json_

    ok = json_.dumps({"choices": [{"token_ids": [1, 2, 3]}], "usage": {"completion_tokens": 3}}).encode()
    replies = [b"200 OK\r\ncontent-length: %d\r\n\r\n" % len(ok) + ok,
               b"500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom",
               b"200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(ok) + ok,
               b"200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
               None,                                                   # never answered: a timeout
               b"200 OK\r\ncontent-length: %d\r\n\r\n" % len(ok) + ok]
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while True:
                await _request_body(reader)
                reply = replies.pop(0)
                if reply is None:
                    await asyncio.sleep(5)
                    return
                writer.write(b"HTTP/1.1 " + reply)
                await writer.drain()
                if b"connection: close" in reply:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    records = _raw_client_against(handle, lambda p: {"prompt": p}, [[i] for i in range(6)], timeout=0.5)
    assert [r.error is None for r in records] == [True, False, True, False, False, True]
    assert records[1].error.startswith("HTTP 500") and "JSONDecodeError" in records[3].error   # chunks read
    assert "Timeout" in records[4].error
    assert [r.num_tokens for r in records] == [3, 0, 3, 0, 0, 3]
    assert len(connections) == 4   # the first; after the close, the unreadable reply and the timeout


def test_the_raw_load_client_reads_a_chunked_event_stream():
    """A streamed completion through the raw client: SSE events split across chunks that arrive
    50 ms apart, each event with tokens timed when its chunk arrives; \\r\\n line ends, trailers
    and a last event without its blank line read too; the usage event's count; an error event
    fails its request; every reply read whole, so one connection serves them all."""
    import asyncio
    import json as json_

    def event(obj, end: bytes = b"\n\n") -> bytes:
        return b"data: " + json_.dumps(obj).encode() + end

    first, second = event({"choices": [{"token_ids": [1, 2]}]}), event({"choices": [{"token_ids": [3]}]})
    usage = event({"choices": [], "usage": {"completion_tokens": 3}})
    plain = [first[:10], first[10:], second + usage + b"data: [DONE]\n\n"]      # cut inside an event
    crlf = [first.replace(b"\n", b"\r\n")[:-1], b"\n",                    # \r | \n across chunks
            (second + usage).replace(b"\n", b"\r\n")]
    unterminated = [first, second, event({"choices": [], "usage": {"completion_tokens": 3}}, end=b"")]
    failing = [event({"error": {"message": "boom"}}) + b"data: [DONE]\n\n"]
    replies = [(plain, b""), (failing, b""), (crlf, b"x-trailer: 1\r\n"), (unterminated, b"")]
    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        try:
            while replies:
                assert json_.loads(await _request_body(reader))["stream"] is True
                pieces, trailer = replies.pop(0)
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for piece in pieces:
                    writer.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                    await writer.drain()
                    await asyncio.sleep(0.05)
                writer.write(b"0\r\n" + trailer + b"\r\n")
                await writer.drain()
        finally:
            writer.close()

    records = _raw_client_against(handle, lambda p: {"prompt": p, "stream": True}, [[0], [1], [2], [3]],
                                  timeout=5.0)
    assert [r.error is None for r in records] == [True, False, True, True] and "boom" in records[1].error
    for r in (records[0], records[2], records[3]):
        assert [n for _, n in r.chunks] == [2, 1] and r.completion_tokens == 3 == r.num_tokens
        (t1, _), (t2, _) = r.chunks
        assert r.start <= t1 and t2 - t1 >= 0.04 and t2 <= r.end   # timed on arrival, not at the end
    assert len(connections) == 1
