"""`dflash serve` on the embedded demo pair, driven by the official `openai` client and raw HTTP: greedy output
equals `dflash generate`, streaming, statistics, stop sequences, prefix reuse, errors, disconnects, the queue
limit and flat memory."""

import json
import signal
import socket
import threading
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from serve_server import Server, free_port  # noqa: E402

KEY = "sk-test"
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def server():
    srv = Server("demo", "--api-key", KEY, "--max-queue", "2")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def post(server, path, body=None, key=KEY, raw=None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = raw if raw is not None else json.dumps(body)
    kw.setdefault("timeout", 60)
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, **kw)


def local(cli, *args):
    res = cli("generate", "--model", "demo", "--temperature", "0", "--json", *args)
    assert res.code == 0, res.err
    return res.json()


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == ["demo"]
    assert client.models.retrieve("demo").id == "demo"  # was a 404: the route did not exist
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"


def test_greedy_completion_equals_generate_token_for_token(server, client, cli):
    want = local(cli, "--raw", "--prompt", PROMPT, "-n", "24")
    r = post(server, "/v1/completions", {"model": "demo", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                                         "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == want["tokens"] and choice["text"] == want["text"]
    res = client.completions.create(model="demo", prompt=PROMPT, max_tokens=24, temperature=0)
    assert res.choices[0].text == want["text"]
    assert res.usage.prompt_tokens == want["prompt_tokens"] and res.usage.completion_tokens == len(want["tokens"])
    assert res.usage.total_tokens == res.usage.prompt_tokens + res.usage.completion_tokens


def test_greedy_chat_equals_generate_and_streams_the_same_text(server, client, cli):
    want = local(cli, "--prompt", "def add(a, b):", "-n", "20")
    messages = [{"role": "user", "content": "def add(a, b):"}]
    res = client.chat.completions.create(model="demo", messages=messages, max_tokens=20, temperature=0)
    assert res.choices[0].message.content == want["text"] and res.choices[0].message.role == "assistant"
    stats = res.model_extra["dflash"]
    assert stats["draft"] == "dflash" and stats["tau"] >= 1 and stats["steps"] >= 1
    assert sum(stats["accepted_length_histogram"]) == stats["steps"]
    assert len(stats["acceptance_by_position"]) == stats["draft_len"]
    assert stats["ttft_s"] > 0 and stats["decode_tokens_per_s"] > 0
    chunks = list(client.chat.completions.create(model="demo", messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want["text"]
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason in ("stop", "length") and last.model_extra["dflash"]["steps"] >= 1
    assert chunks[-1].usage.completion_tokens == res.usage.completion_tokens
    assert sum(c.usage is not None for c in chunks) == 1  # was 2: a client adding them up counted double


def test_streamed_completion_assembles_to_the_whole_text(client):
    whole = client.completions.create(model="demo", prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    parts = list(client.completions.create(model="demo", prompt=PROMPT, max_tokens=30, temperature=0, stream=True))
    assert len(parts) > 2 and "".join(p.choices[0].text for p in parts) == whole
    assert parts[-1].model_extra["dflash"]["draft"] == "dflash" and parts[-1].usage.completion_tokens == 30


def test_raw_sse_ends_with_done(server):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5, "stream": True})
    lines = [ln for ln in r.text.splitlines() if ln]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_cut_the_text(client, stream):
    whole = client.completions.create(model="demo", prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    stop = whole.strip()[4:7]  # occurs after the first few characters
    cut = whole[: whole.index(stop)]
    for value in (stop, [stop, "never-there"]):
        res = client.completions.create(model="demo", prompt=PROMPT, max_tokens=30, temperature=0, stop=value,
                                        stream=stream)
        if stream:
            parts = list(res)
            text, finish = "".join(p.choices[0].text for p in parts), parts[-1].choices[0].finish_reason
        else:
            text, finish = res.choices[0].text, res.choices[0].finish_reason
        assert text == cut and finish == "stop"


def test_a_stop_sequence_ends_the_token_ids_and_usage_where_it_was_written(server):
    """Before: token_ids and completion_tokens ran on to the end of the speculative step that wrote the stop sequence
    (here 4 tokens more: the drafter knows a licence header by heart)."""
    from dflash_cli.registry import Registry
    from dflash_cli.runtime.bundle import open_bundle

    tok = open_bundle(Registry.load().resolve("demo"), "cpu", None).tokenizer
    body = {"prompt": "# Licensed under the Apache License", "max_tokens": 40, "temperature": 0,
            "return_token_ids": True}
    full = post(server, "/v1/completions", body).json()["choices"][0]["token_ids"]
    res = post(server, "/v1/completions", {**body, "stop": "Version"}).json()
    ids = res["choices"][0]["token_ids"]
    assert ids == full[: len(ids)] and res["usage"]["completion_tokens"] == len(ids)
    assert "Version" in tok.decode(ids) and "Version" not in tok.decode(ids[:-1])
    last = json.loads(post(server, "/v1/completions", {**body, "stop": "Version", "stream": True}).text
                      .split("data: ")[-2])
    assert last["usage"]["completion_tokens"] == len(ids)


def test_sampling_with_a_seed_repeats(client):
    kw = dict(model="demo", prompt=PROMPT, max_tokens=12, temperature=0.9, top_p=0.9, seed=7,
              extra_body={"top_k": 50})
    assert client.completions.create(**kw).choices[0].text == client.completions.create(**kw).choices[0].text


def test_a_conversation_reuses_its_cached_prefix(client):
    messages = [{"role": "user", "content": "def add(a, b):"}]
    first = client.chat.completions.create(model="demo", messages=messages, max_tokens=8, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "def sub(a, b):"}]
    second = client.chat.completions.create(model="demo", messages=messages, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens
    assert second.model_extra["dflash"]["prefill_tokens"] <= second.usage.prompt_tokens - cached + 1


def test_reused_and_rolled_back_prefixes_still_match_generate(server, cli):
    """A prompt that extends the previous request's tokens prefills only its new part; one that leaves them
    part-way rolls the cache and the drafter back to the shared start. Both give what a fresh `dflash generate`
    gives, token for token."""
    def both(text):
        want = local(cli, "--raw", "--prompt", text, "-n", "12")
        r = post(server, "/v1/completions", {"prompt": text, "max_tokens": 12, "temperature": 0,
                                             "return_token_ids": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == want["tokens"], text
        return r.json(), want

    first, _ = both(PROMPT)
    held = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]  # the tokens the session keeps
    extended, _ = both(PROMPT + first["choices"][0]["text"] + "\n\ndef add(a, b):")
    assert extended["usage"]["prompt_tokens_details"]["cached_tokens"] == held - 1  # the last one was pending
    assert extended["dflash"]["prefill_tokens"] == extended["usage"]["prompt_tokens"] - (held - 1)
    diverged, _ = both(PROMPT + "\n    return 1\n")
    assert 0 < diverged["usage"]["prompt_tokens_details"]["cached_tokens"] < diverged["usage"]["prompt_tokens"]
    both("import os\n")


def test_eagle3_server_matches_generate(cli):
    srv = Server("demo", "--draft", "eagle3")
    try:
        want = local(cli, "--raw", "--prompt", PROMPT, "-n", "20", "--draft", "eagle3")
        r = post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 20, "return_token_ids": True}, key=None)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["token_ids"] == want["tokens"]
        assert r.json()["dflash"]["draft"] == "eagle3"
    finally:
        srv.stop()


def test_bad_requests_get_openai_errors(server, client):
    def error(r, status, code=None):
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        if code:
            assert err["code"] == code
        return err

    error(post(server, "/v1/completions", raw="{not json"), 400, "invalid_json")
    error(post(server, "/v1/chat/completions", raw="[1, 2"), 400, "invalid_json")
    error(post(server, "/v1/completions", {"model": "gpt-4o", "prompt": "x"}), 404, "model_not_found")
    assert post(server, "/v1/completions", {"model": "demo", "prompt": "x", "max_tokens": 1}).status_code == 200
    error(post(server, "/v1/completions", {"prompt": [5] * 1024}), 400, "context_length_exceeded")
    error(post(server, "/v1/completions", {"prompt": "x"}, key="wrong"), 401, "invalid_api_key")
    error(post(server, "/v1/completions", {"prompt": "x"}, key=None), 401, "invalid_api_key")
    for bad in ({"temperature": -1}, {"top_p": 0}, {"max_tokens": 0}, {"n": 2}, {"best_of": 3}, {"stop": 5},
                {"top_k": "x"},
                {"prompt": 3}, {"prompt": ["a", "b"]}, {"stream": "yes"}, {"seed": 10**23}, {"top_k": 10**23},  # seed: was a 500, top_k: named no param
                {"ignore_eos": "false"}, {"return_token_ids": 1}, {"stream_options": {"include_usage": "no"}}):
        err = error(post(server, "/v1/completions", {"prompt": "x", **bad}), 400, "invalid_value")
        assert err["param"] == next(iter(bad))
    error(post(server, "/v1/completions", {"prompt": "x", "logprobs": 2}), 400, "unsupported_parameter")
    error(post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                "presence_penalty": 0.5}), 400, "unsupported_parameter")
    assert post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1, "logprobs": None,
                                            "presence_penalty": 0, "best_of": 1}).status_code == 200
    error(post(server, "/v1/chat/completions", {"messages": []}), 400, "invalid_value")
    for path, body in (("/v1/completions", '{"prompt": "a\\ud800"}'),  # lone surrogates: were a 500
                       ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\udfff"}]}')):
        assert "lone surrogate" in error(post(server, path, raw=body), 400, "invalid_value")["message"]
    error(post(server, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}), 400)
    error(httpx.get(f"{server.url}/v1/nothing-here", headers={"Authorization": f"Bearer {KEY}"}), 404)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="demo", prompt="x", max_tokens=1, temperature=5)


def _long_stream(server, max_tokens, got_first=None, holder=None):
    """A streaming request that would run for max_tokens; returns the open response (or its status)."""
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    c = httpx.Client(timeout=60)
    resp = c.send(c.build_request("POST", f"{server.url}/v1/completions", json=body,
                                  headers={"Authorization": f"Bearer {KEY}"}), stream=True)
    if holder is not None:
        holder.append((c, resp))
    return c, resp


def _wait_for(server, pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = server.metrics()
        if pred(m):
            return m
        time.sleep(0.05)
    raise AssertionError(f"timed out; metrics: {server.metrics()}")


def test_a_client_that_leaves_mid_stream_stops_its_generation(server):
    before = server.metrics()
    c, resp = _long_stream(server, 600)
    lines = resp.iter_lines()
    got = [next(lines) for _ in range(6)]
    assert any(ln.startswith("data: ") for ln in got)
    resp.close()
    c.close()
    after = _wait_for(server, lambda m: m["dflash:requests_cancelled_total"] > before["dflash:requests_cancelled_total"]
                      and m["vllm:num_requests_running"] == 0)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 0 < generated < 300  # well before max_tokens
    assert post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3}).status_code == 200  # still serving
    before = server.metrics()
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 600, "ignore_eos": True}, timeout=1.0)
    after = _wait_for(server, lambda m: m["dflash:requests_cancelled_total"] > before["dflash:requests_cancelled_total"]
                      and m["vllm:num_requests_running"] == 0)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 300


def test_the_queue_limit_gives_503(server):
    held = []
    try:
        _long_stream(server, 800, holder=held)  # runs
        _wait_for(server, lambda m: m["vllm:num_requests_running"] == 1)
        for _ in range(2):  # --max-queue 2: these wait
            threading.Thread(target=_long_stream, args=(server, 800), kwargs={"holder": held}, daemon=True).start()
        _wait_for(server, lambda m: m["vllm:num_requests_waiting"] == 2)
        r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "queue_full"
        assert server.metrics()["dflash:requests_rejected_total"] >= 1
    finally:
        for c, resp in held:
            resp.close()
            c.close()
    _wait_for(server, lambda m: m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0)
    assert post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1}).status_code == 200


def test_metrics_count_speculation_like_vllm(server):
    m = server.metrics()
    drafts, accepted = m["vllm:spec_decode_num_drafts_total"], m["vllm:spec_decode_num_accepted_tokens_total"]
    per_pos = [v for k, v in m.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")]
    assert drafts > 0 and m["vllm:spec_decode_num_draft_tokens_total"] >= drafts
    assert sum(per_pos) == accepted and all(p <= drafts for p in per_pos)
    assert m["vllm:generation_tokens_total"] > 0 and m["vllm:prompt_tokens_total"] > 0


def test_sequential_requests_leave_memory_flat(server):
    body = {"prompt": PROMPT, "max_tokens": 2}
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as c:
        for i in range(10):
            c.post(f"{server.url}/v1/completions", json={**body, "prompt": f"{PROMPT} # {i}"})
        start = server.rss_mb()
        for i in range(100):
            r = c.post(f"{server.url}/v1/completions", json={**body, "prompt": f"{PROMPT} # warm {i}", "stream": i % 2 == 1})
            assert r.status_code == 200
        grown = server.rss_mb() - start
    assert grown < 50, f"RSS grew {grown:.1f} MB over 100 requests"


def test_serve_flags_fail_with_one_line(cli, monkeypatch):
    from dflash_cli.commands import serve as serve_cmd

    for args, needle in ((["--port", "0"], "--port"), (["--max-queue", "-1"], "--max-queue"),
                         (["--engine", "tgi"], "--engine"), (["--print"], "--print"),
                         (["--draft-len", "99", "--port", free_port()], "at most 15")):  # was served with 15
        res = cli("serve", "demo", *args)
        assert res.code == 1 and res.err.startswith("error: ") and needle in res.err, res.err
        assert len(res.err.strip().splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        res = cli("serve", "demo", "--port", taken.getsockname()[1])
    assert res.code == 1 and res.err.startswith("error: cannot listen on 127.0.0.1:"), res.err
    monkeypatch.setattr(serve_cmd, "serve_deps_installed", lambda: False)
    res = cli("serve", "demo")
    assert res.code == 1 and res.err.strip() == (
        "error: dflash serve needs FastAPI and uvicorn: pip install fastapi uvicorn "
        "(from a clone: pip install -e '.[serve]')")


def test_ctrl_c_ends_running_streams_and_exits_cleanly():
    srv = Server("demo", "--max-queue", "4")
    try:
        c, resp = _long_stream(srv, 900)
        lines = resp.iter_lines()
        next(lines)
        waiting = threading.Thread(target=lambda: post(srv, "/v1/completions", {"prompt": PROMPT, "max_tokens": 900,
                                                                               "ignore_eos": True}, key=None))
        waiting.start()
        _wait_for(srv, lambda m: m["vllm:num_requests_waiting"] == 1)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(20) == 130 and time.monotonic() - t0 < 15  # the CLI's exit code for Ctrl-C
        out = srv.proc.stdout.read()
        assert "Traceback" not in out and "ERROR" not in out, out
        assert not any(ln.startswith("data: [DONE]") for ln in lines)  # the stream ended early
        resp.close()
        c.close()
        waiting.join(10)
    finally:
        srv.stop()
