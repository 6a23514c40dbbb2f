"""`dflash generate --url` / `dflash chat --url` against `dflash serve` (the `dflash` statistics field) and against a
stand-in for a vLLM server (statistics from the difference of its /metrics spec-decode counters)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_server import Server  # noqa: E402

KEY = "sk-remote"


@pytest.fixture(scope="module")
def server():
    srv = Server("demo", "--api-key", KEY)
    yield srv
    srv.stop()


def ok(res):
    assert res.code == 0, (res.out, res.err)
    assert "Traceback" not in res.err
    return res


def test_generate_url_matches_the_local_engine(cli, server):
    args = ("--prompt", "def fibonacci(n):", "--temperature", "0", "-n", "20")
    want = ok(cli("generate", "--model", "demo", "--raw", "--json", *args)).json()
    got = ok(cli("generate", "--url", server.url, "--api-key", KEY, "--raw", "--json", *args)).json()
    assert got["text"] == want["text"] and got["completion_tokens"] == len(want["tokens"])
    assert got["stats"]["source"] == "dflash" and got["stats"]["draft_kind"] == "dflash"
    # One vocabulary for scripts: the local --json's names for what both report.
    same = {"tau_tokens_per_step", "accepted_drafts_hist", "accept_rate_by_position", "draft_kind", "decode_tok_per_s",
            "steps", "ttft_s"}
    assert same <= set(got["stats"]) and same <= set(want["stats"])
    assert got["stats"]["tau_tokens_per_step"] == want["stats"]["tau_tokens_per_step"]
    assert got["completion_tokens"] == want["completion_tokens"]
    streamed = ok(cli("generate", "--url", f"{server.url}/v1", "--api-key", KEY, "--raw", *args))
    assert streamed.out == want["text"] + "\n"
    assert "20 tok" in streamed.err and "τ" in streamed.err and "ttft" in streamed.err
    stop = want["text"][5:9]  # --stop goes to the server as `stop`: the same cut as here
    cut = ok(cli("generate", "--url", server.url, "--api-key", KEY, "--raw", "--json", "--stop", stop, *args)).json()
    assert cut["text"] == ok(cli("generate", "--model", "demo", "--raw", "--json", "--stop", stop, *args)).json()["text"]
    assert cut["text"] == want["text"][: want["text"].index(stop)] and cut["finish_reason"] == "stop"
    chat = ok(cli("generate", "--url", server.url, "--api-key", KEY, "--json", "--model", "demo", *args)).json()
    local_chat = ok(cli("generate", "--model", "demo", "--json", *args)).json()
    assert chat["text"] == local_chat["text"]


def test_chat_url_keeps_the_conversation(cli, server, tmp_path):
    saved = tmp_path / "c.json"
    cached = server.metrics()["dflash:prefix_cached_tokens_total"]
    res = ok(cli("chat", "--url", server.url, "--api-key", KEY, "--temperature", "0", "-n", "6",
                 stdin=f"def add(a, b):\ndef sub(a, b):\n/save {saved}\n/exit\n"))
    data = json.loads(saved.read_text())
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"] * 2
    assert data["messages"][1]["content"] in res.out
    assert server.metrics()["dflash:prefix_cached_tokens_total"] > cached  # the second turn reused the first's tokens


def test_chat_url_keeps_an_answer_stopped_with_ctrl_c(cli, monkeypatch, tmp_path):
    """Before: Ctrl-C dropped the turn and the answer written so far from the conversation (the local chat keeps
    them)."""
    from dflash_cli.remote.client import Remote

    def complete(self, path, body, on_text=None):
        on_text("partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(Remote, "_first_model", lambda self: "m")
    monkeypatch.setattr(Remote, "counters", lambda self: None)
    monkeypatch.setattr(Remote, "complete", complete)
    saved = tmp_path / "c.json"
    res = ok(cli("chat", "--url", "http://127.0.0.1:9", stdin=f"hello\n/save {saved}\n"))
    assert "[stopped]" in res.out
    assert json.loads(saved.read_text())["messages"] == [{"role": "user", "content": "hello"},
                                                         {"role": "assistant", "content": "partial"}]


def test_url_errors_are_one_line(cli, server):
    cases = [
        (["generate", "--url", server.url, "--api-key", "wrong", "-p", "x"], "answered 401"),
        (["generate", "--url", "http://127.0.0.1:9", "-p", "x"], "cannot reach"),
        (["generate", "--url", "localhost:8000", "-p", "x"], "--url must look like"),
        (["generate", "--url", server.url, "--api-key", KEY, "--draft", "eagle3", "-p", "x"], "--draft applies"),
        (["generate", "--url", server.url, "--api-key", KEY, "--model", "other", "-p", "x"], "answered 404"),
    ]
    for args, needle in cases:
        res = cli(*args)
        assert res.code == 1 and res.err.startswith("error: ") and needle in res.err, res.err
        assert len(res.err.strip().splitlines()) == 1


class FakeVllm(BaseHTTPRequestHandler):
    """Answers like vLLM: no `dflash` field; its /metrics counters move by a fixed step per request."""

    requests = 0

    def log_message(self, *a):
        pass

    def _send(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send(200, json.dumps({"data": [{"id": "Qwen/Qwen3-8B"}]}))
        n = FakeVllm.requests
        lines = [f'vllm:spec_decode_num_drafts_total{{model_name="q"}} {10 * n}.0',
                 f'vllm:spec_decode_num_draft_tokens_total{{model_name="q"}} {40 * n}.0',
                 f'vllm:spec_decode_num_accepted_tokens_total{{model_name="q"}} {15 * n}.0']
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="q",position="{i}"}} {v * n}.0'
                  for i, v in enumerate([8, 4, 2, 1])]
        return self._send(200, "\n".join(lines) + "\n", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["model"] == "Qwen/Qwen3-8B"
        FakeVllm.requests += 1
        if not body["stream"]:
            return self._send(200, json.dumps({"choices": [{"index": 0, "message": {"content": "Hello"},
                                                            "finish_reason": "stop"}],
                                               "usage": {"prompt_tokens": 3, "completion_tokens": 2}}))
        chunks = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in ("Hel", "lo")]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        self._send(200, "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n",
                   "text/event-stream")


def test_statistics_from_a_vllm_servers_metrics(cli):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        res = ok(cli("generate", "--url", f"http://127.0.0.1:{httpd.server_port}", "-p", "hi"))
        assert res.out == "Hello\n"
        assert "τ 2.50" in res.err and "by pos 80 40 20 10" in res.err and "(server /metrics)" in res.err
        res = ok(cli("chat", "--url", f"http://127.0.0.1:{httpd.server_port}", stdin="hi\n/exit\n"))
        assert "Hello" in res.out
    finally:
        httpd.shutdown()


class FakeSglang(FakeVllm):
    """SGLang's /metrics: a gauge of the recent mean committed length instead of vLLM's counters."""

    def do_GET(self):
        if self.path == "/metrics":
            return self._send(200, 'sglang:spec_accept_length{model_name="q"} 3.25\n', "text/plain")
        return super().do_GET()


def test_statistics_from_an_sglang_servers_gauge(cli):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeSglang)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        res = ok(cli("generate", "--url", f"http://127.0.0.1:{httpd.server_port}", "-p", "hi", "--json"))
        assert res.json()["stats"]["tau_tokens_per_step"] == 3.25 and res.json()["stats"]["source"] == "gauge"
    finally:
        httpd.shutdown()
