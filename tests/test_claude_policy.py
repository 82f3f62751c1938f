"""The Claude policy against a local server that speaks the Messages API: the SDK, HTTP, JSON
and the policy's validation and repair are real; only the model's replies are scripted."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time

import pytest
from mock_anthropic import MockAnthropic, error, text, tool_use

from kfc.diagnostics import KfcError
from kfc.factory.claude import CRITIC_SCHEMA, PLANNER_SCHEMA, ClaudePolicy
from kfc.factory.model import TuneContext
from kfc.model.records import Outcome, Proposal, Stage, Trial
from kfc.factory.space import SearchSpace
from kfc.passes import parse_pipeline

KEY = "sk-ant-test-0123"
MODEL = "claude-test-model"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No real credentials, profiles, base URL or proxies leak into a test."""
    for k in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL", "ANTHROPIC_CUSTOM_HEADERS",
              "ANTHROPIC_PROFILE", "ANTHROPIC_CONFIG_DIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
              "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
def api():
    with MockAnthropic() as server:
        yield server


@pytest.fixture(autouse=True)
def _fast_backoff(monkeypatch):
    """Error replies carry retry-after-ms; a refused connection has no reply, so shorten the SDK's
    base delay (0.5 s) too. Private to the SDK: if it moves, the tests only get slower."""
    import anthropic._base_client as base

    monkeypatch.setattr(base, "INITIAL_RETRY_DELAY", 0.001, raising=False)


SPACE = SearchSpace(4096)
DEFAULT = SPACE.pipeline(SPACE.default())
FAILED = SPACE.pipeline({**SPACE.default(), "threads": 1024, "rows": 1})


def context(**kw) -> TuneContext:
    history = (
        Trial(1, Proposal(DEFAULT, "the default", "baseline"),
              Outcome(Stage.TIMED, registers=40, spills=0, median_us=12.5, speedup=1.0)),
        Trial(2, Proposal(FAILED, "more threads", "offline"),
              Outcome(Stage.VERIFIED, error="ptxas: 96 bytes spill stores")),
    )
    kw.setdefault("history", history)
    kw.setdefault("prior", (Trial(7, Proposal("canonicalize,tile{threads=256,vec=8}"),
                                  Outcome(Stage.TIMED, median_us=9.75, speedup=1.3)),))
    kw.setdefault("lessons", ("vec=8 beats vec=4 for bf16 rows of 4096",))
    return TuneContext(op_name="rmsnorm", op_fingerprint="fp-abc123", features={"kind": "row", "reductions": 1},
                       target="sm_90a", shape={"M": 32768, "N": 4096}, space=SPACE, **kw)


def policy(api: MockAnthropic | None = None, **kw) -> ClaudePolicy:
    kw.setdefault("model", MODEL)
    kw.setdefault("max_retries", 2)
    return ClaudePolicy(api_key=KEY, base_url=api.url if api else kw.pop("base_url"), **kw)


def propose(cands) -> object:
    return tool_use("propose_pipelines", {"candidates": cands})


def cand(pipeline, rationale="why not") -> dict:
    return {"pipeline": pipeline, "rationale": rationale}


A = "canonicalize,cse,dce,tile{threads=256,vec=8},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
B = "canonicalize,cse,dce,tile{threads=64,vec=8,rows=4},lower-reductions,lower-ptx{stream=none}"
C = "tile{threads=512,vec=4},lower-reductions,lower-ptx"


def last_turn(api: MockAnthropic, i: int = -1) -> dict:
    return api.requests[i].body["messages"][-1]


def tool_results(turn: dict) -> list[dict]:
    return [b for b in turn["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def sent_key(headers: dict) -> str | None:
    """The API key as this SDK version sends it (x-api-key, or Authorization: Bearer in 2.x)."""
    if "x-api-key" in headers:
        return headers["x-api-key"]
    auth = headers.get("authorization", "")
    return auth[len("Bearer "):] if auth.startswith("Bearer ") else None


# --- the wiring -------------------------------------------------------------------------------------
def test_module_imports_without_the_sdk():
    code = "import sys, kfc.factory.claude; assert 'anthropic' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_sdk_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic -> ImportError
    with pytest.raises(KfcError, match="needs the anthropic package"):
        ClaudePolicy(api_key=KEY)


def test_valid_reply_gives_canonical_proposals(api):
    spaced = "canonicalize , cse,dce, tile{vec=8, threads=256},lower-reductions,fuse-reductions,lower-ptx," \
             "canonicalize,cse,dce"
    api.script(propose([cand(spaced, "more threads hide latency"), cand(B, "rows per CTA"), cand(C, "a third")]))
    p = policy(api)
    out = p.propose(context(), 2)
    assert out == [Proposal(A, "more threads hide latency", "claude:planner"),
                   Proposal(str(parse_pipeline(B)), "rows per CTA", "claude:planner")]
    assert len(api.requests) == 1 and api.pending == 0

    req = api.requests[0]
    assert req.method == "POST" and req.path == "/v1/messages"
    body = req.body
    assert body["model"] == MODEL
    assert isinstance(body["max_tokens"], int) and body["max_tokens"] > 0
    assert body["tool_choice"] == {"type": "tool", "name": "propose_pipelines"}
    [tool] = body["tools"]
    assert tool["name"] == "propose_pipelines" and tool["description"]
    assert tool["input_schema"] == PLANNER_SCHEMA
    assert tool["input_schema"]["required"] == ["candidates"]
    assert tool["input_schema"]["properties"]["candidates"]["items"]["required"] == ["pipeline", "rationale"]
    assert "pass pipeline" in body["system"] and "propose_pipelines" in body["system"]
    [msg] = body["messages"]
    assert msg["role"] == "user"
    user = msg["content"]
    assert SPACE.describe() in user
    for needle in ("rmsnorm", "sm_90a", "M=32768, N=4096", f"#1 {DEFAULT}", "12.50 us", f"#2 {FAILED}",
                   "ptxas: 96 bytes spill stores", "canonicalize,tile{threads=256,vec=8}", "9.75 us",
                   "vec=8 beats vec=4", "lower-ptx{approx: auto|on|off=auto", "Propose 2 new pipelines",
                   "Pass steps that paid off", "- tile{threads=256,vec=8}: mean 1.300x, best 1.300x over 1 timed of 1"):
        assert needle in user, needle

    # what this SDK version sends, checked rather than assumed
    h = req.headers
    assert sent_key(h) == KEY
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", h["anthropic-version"])
    assert h["content-type"] == "application/json"
    assert h["x-stainless-retry-count"] == "0"

    [entry] = p.transcript
    assert entry["role"] == "planner" and entry["request"]["model"] == MODEL
    assert entry["response"]["content"][0]["name"] == "propose_pipelines"


def test_installed_sdk_headers(api):
    """Pin what anthropic 2.x sends, so an SDK upgrade that changes it is noticed here."""
    import anthropic

    api.script(propose([cand(A)]))
    policy(api).propose(context(), 1)
    h = api.requests[0].headers
    if anthropic.__version__.startswith("2."):
        assert h["authorization"] == f"Bearer {KEY}" and "x-api-key" not in h
    else:
        assert h["x-api-key"] == KEY
    assert h["user-agent"] == f"Anthropic/Python {anthropic.__version__}"


def test_env_key_base_url_and_default_model(api, monkeypatch):
    api.script(propose([cand(A)]))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    assert ClaudePolicy().propose(context(), 1)[0].pipeline == A
    assert sent_key(api.requests[0].headers) == "sk-from-env"
    assert api.requests[0].body["model"] == "claude-sonnet-5-5"


def test_no_api_key_is_a_clear_error():
    with pytest.raises(KfcError) as e:
        ClaudePolicy()
    assert e.value.message == "the Claude policy needs ANTHROPIC_API_KEY"
    assert "export ANTHROPIC_API_KEY" in e.value.hint and "offline" in e.value.hint


# --- validation and repair --------------------------------------------------------------------------
def _repaired(api, first, expect: str, n: int = 1) -> list[Proposal]:
    api.script(first, propose([cand(A, "fixed")]))
    out = policy(api).propose(context(), n)
    assert len(api.requests) == 2
    msgs = api.requests[1].body["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[0] == api.requests[0].body["messages"][0]           # the same conversation
    use = next(b for b in msgs[1]["content"] if b["type"] == "tool_use")
    assert use["input"] == first.body["content"][-1]["input"]       # the model's own reply, echoed
    [res] = tool_results(msgs[2])
    assert res["tool_use_id"] == use["id"] and res["is_error"] is True
    assert expect in res["content"], res["content"]
    assert api.requests[1].body["tool_choice"] == {"type": "tool", "name": "propose_pipelines"}
    return out


def test_missing_candidates_is_repaired(api):
    out = _repaired(api, tool_use("propose_pipelines", {"pipelines": [A]}),
                    'the input has no "candidates" key')
    assert out == [Proposal(A, "fixed", "claude:planner")]


def test_unknown_pass_is_repaired_with_the_parse_error(api):
    out = _repaired(api, propose([cand("canonicalize,tiel{threads=256},lower-ptx")]),
                    "candidates[0].pipeline 'canonicalize,tiel{threads=256},lower-ptx' does not parse: "
                    "unknown pass 'tiel' (did you mean tile?")
    assert [p.pipeline for p in out] == [A]


def test_bad_option_is_repaired_with_the_parse_error(api):
    _repaired(api, propose([cand("tile{threads=lots}")]),
              "bad value 'lots' for tile's option threads (int)")


def test_non_string_pipeline_is_repaired(api):
    _repaired(api, propose([cand(42)]), "candidates[0].pipeline must be a string, not a number")


def test_missing_rationale_and_wrong_types_are_named(api):
    _repaired(api, propose([{"pipeline": A}]), "candidates[0] has no 'rationale'")


def test_candidates_not_an_array_is_repaired(api):
    _repaired(api, tool_use("propose_pipelines", {"candidates": A}),
              '"candidates" must be an array, not a string')


def test_already_tried_pipeline_is_named(api):
    respelled = DEFAULT.replace(",", ", ")
    _repaired(api, propose([cand(respelled)]), "was already tried (candidate #1)")


def test_no_tool_call_is_asked_again(api):
    api.script(text("Here are some ideas: more threads."), propose([cand(A)]))
    assert [p.pipeline for p in policy(api).propose(context(), 1)] == [A]
    turn = last_turn(api)
    assert turn["role"] == "user" and not tool_results(turn)
    assert "You must answer by calling propose_pipelines" in turn["content"][-1]["text"]


def test_partly_valid_reply_keeps_the_valid_and_asks_for_the_rest(api):
    api.script(propose([cand(A, "good"), cand("tiel", "typo"), cand(7, "number")]),
                                propose([cand(B, "second try")]))
    out = policy(api).propose(context(), 2)
    assert [(p.pipeline, p.rationale) for p in out] == [(A, "good"), (str(parse_pipeline(B)), "second try")]
    [res] = tool_results(last_turn(api))
    assert res["is_error"] is True
    assert "candidates[1].pipeline 'tiel' does not parse: unknown pass 'tiel'" in res["content"]
    assert "candidates[2].pipeline must be a string" in res["content"]
    assert "Kept 1 valid item" in res["content"]
    assert "with 1 new valid pipeline" in last_turn(api)["content"][-1]["text"]


def test_partly_valid_reply_with_enough_valid_is_not_repaired(api):
    api.script(propose([cand("tiel"), cand(A, "good")]))
    assert [p.pipeline for p in policy(api).propose(context(), 1)] == [A]
    assert len(api.requests) == 1


def test_malformed_every_time_is_a_clear_error(api):
    api.script(*[propose([cand("tiel")]) for _ in range(3)])
    p = policy(api, max_repairs=2)
    with pytest.raises(KfcError) as e:
        p.propose(context(), 2)
    assert len(api.requests) == 3 and api.pending == 0
    assert "Claude proposed no usable pipeline after 2 repairs" in e.value.message
    assert "unknown pass 'tiel'" in e.value.message
    assert p.last_error and "tiel" in p.last_error
    # each repair carried the conversation so far
    assert [m["role"] for m in api.requests[2].body["messages"]] == ["user", "assistant", "user", "assistant", "user"]


def test_max_repairs_zero_asks_once(api):
    api.script(propose([cand("tiel")]))
    with pytest.raises(KfcError, match="after 0 repairs"):
        policy(api, max_repairs=0).propose(context(), 1)
    assert len(api.requests) == 1


# --- API errors ---------------------------------------------------------------------------------------
def test_overloaded_and_server_error_are_retried_by_the_sdk(api):
    api.script(error(529, "Overloaded"), error(500, "Internal"), propose([cand(A)]))
    t = time.perf_counter()
    out = policy(api, max_retries=2).propose(context(), 1)
    assert [p.pipeline for p in out] == [A]
    assert len(api.requests) == 3
    assert [r.headers["x-stainless-retry-count"] for r in api.requests] == ["0", "1", "2"]
    assert all(r.body == api.requests[0].body for r in api.requests)  # the same request, resent
    assert time.perf_counter() - t < 5


def test_server_error_every_time_is_one_kfc_error(api):
    api.script(*[error(500, "something broke") for _ in range(3)])
    p = policy(api, max_retries=2)
    with pytest.raises(KfcError) as e:
        p.propose(context(), 1)
    assert e.value.message == "the Claude API failed after 2 retries: 500 api_error something broke"
    assert e.value.__cause__ is None and e.value.__suppress_context__  # no SDK traceback for the user
    assert len(api.requests) == 3
    assert p.transcript[-1]["error"].startswith("500")


def test_overloaded_every_time_names_the_status(api):
    api.script(*[error(529, "Overloaded") for _ in range(2)])
    with pytest.raises(KfcError, match=r"failed after 1 retry: 529 overloaded_error Overloaded"):
        policy(api, max_retries=1).propose(context(), 1)
    assert len(api.requests) == 2


def test_authentication_error_is_not_retried(api):
    api.script(error(401, "invalid x-api-key"))
    with pytest.raises(KfcError) as e:
        policy(api, max_retries=3).propose(context(), 1)
    assert "401 authentication_error invalid x-api-key" in e.value.message
    assert "ANTHROPIC_API_KEY" in e.value.hint
    assert len(api.requests) == 1


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_connection_refused_is_one_kfc_error():
    url = f"http://127.0.0.1:{_free_port()}"
    t = time.perf_counter()
    with pytest.raises(KfcError) as e:
        policy(base_url=url, max_retries=1).propose(context(), 1)
    # the SDK's own wording of a refused connection varies between its releases
    assert re.match(r"the Claude API failed after 1 retry: Connection (error\.|to \S+ failed)", e.value.message)
    assert url in e.value.hint
    assert e.value.__cause__ is None
    assert time.perf_counter() - t < 5


# --- the critic ---------------------------------------------------------------------------------------
def trials() -> list[Trial]:
    return [
        Trial(11, Proposal(A, "more threads", "claude:planner"),
              Outcome(Stage.TIMED, registers=32, spills=0, smem_bytes=256, median_us=10.25, spread_us=0.3,
                      speedup=1.22, roofline_fraction=0.81)),
        Trial(12, Proposal("tile{threads=1024,rows=4}", "wide", "claude:planner"),
              Outcome(Stage.PARSED, error="tile: rows*threads = 4096 exceeds 1024 threads per CTA")),
        Trial(13, Proposal(B, "rows", "claude:planner"),
              Outcome(Stage.COMPILED, registers=255, spills=96, error="ptxas: 96 bytes spill stores")),
    ]


def lessons(*items) -> object:
    return tool_use("write_lessons", {"lessons": [{"text": t, "evidence": ev} for t, ev in items]})


def test_critic_returns_lessons(api):
    api.script(lessons(("threads=256,vec=8 gave 1.22x at N=4096 on sm_90a", [11]),
                                        ("rows=4 with 64 threads spills 96 bytes: keep rows<=2", [13, 12])))
    p = policy(api)
    out = p.reflect(context(), trials())
    assert out == ["threads=256,vec=8 gave 1.22x at N=4096 on sm_90a",
                   "rows=4 with 64 threads spills 96 bytes: keep rows<=2"]
    assert p.last_error is None
    body = api.requests[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "write_lessons"}
    [tool] = body["tools"]
    assert tool["name"] == "write_lessons" and tool["input_schema"] == CRITIC_SCHEMA
    assert "critic" in body["system"]
    user = body["messages"][0]["content"]
    for needle in ("#11", "registers 32", "median 10.25 us", "roofline 81%", "#12", "exceeds 1024 threads",
                   "#13", "spills 96", "ptxas: 96 bytes spill stores", "among: 11, 12, 13",
                   "vec=8 beats vec=4"):
        assert needle in user, needle
    assert p.transcript[-1]["role"] == "critic"


def test_critic_drops_invalid_lessons(api):
    api.script(lessons(("grounded", [11]),
                                        ("cites a candidate that does not exist", [11, 99]),
                                        ("x" * 301, [11]),
                                        ("two\nlines", [12]),
                                        ("no evidence", []),
                                        ("ids as strings", ["11"])))
    p = policy(api)
    assert p.reflect(context(), trials()) == ["grounded"]
    assert len(api.requests) == 1
    assert "#99" in p.last_error and "301 characters" in p.last_error and "one line" in p.last_error


def test_critic_with_only_invalid_lessons_is_repaired(api):
    api.script(lessons(("hallucinated", [42])), lessons(("grounded", [13])))
    p = policy(api)
    assert p.reflect(context(), trials()) == ["grounded"]
    [res] = tool_results(last_turn(api))
    assert res["is_error"] is True and "lessons[0].evidence cites #42, not among the trials" in res["content"]


def test_critic_empty_lesson_list_is_fine(api):
    api.script(tool_use("write_lessons", {"lessons": []}))
    p = policy(api)
    assert p.reflect(context(), trials()) == [] and p.last_error is None
    assert len(api.requests) == 1


def test_critic_malformed_every_time_returns_nothing(api):
    api.script(*[tool_use("write_lessons", {"notes": "x"}) for _ in range(3)])
    p = policy(api, max_repairs=2)
    assert p.reflect(context(), trials()) == []
    assert len(api.requests) == 3
    assert "malformed after 2 repairs" in p.last_error and 'no "lessons" key' in p.last_error


def test_critic_api_failure_returns_nothing(api):
    api.script(*[error(500, "down") for _ in range(2)])
    p = policy(api, max_retries=1)
    assert p.reflect(context(), trials()) == []
    assert p.last_error == "the Claude API failed after 1 retry: 500 api_error down"


def test_critic_without_trials_makes_no_call(api):
    p = policy(api)
    assert p.reflect(context(), []) == []
    assert api.requests == []


def test_input_not_an_object_is_repaired(api):
    _repaired(api, tool_use("propose_pipelines", [A]), "the input must be an object")


def test_every_tool_use_gets_a_tool_result(api):
    """Two calls in one reply: the repair answers both, the good one without is_error."""
    first = tool_use("propose_pipelines", {"candidates": [cand("tiel")]},
                     more=[{"type": "tool_use", "id": "toolu_second", "name": "propose_pipelines",
                            "input": {"candidates": [cand(A, "good")]}}])
    api.script(first, propose([cand(B)]))
    out = policy(api).propose(context(), 2)
    assert [p.pipeline for p in out] == [A, str(parse_pipeline(B))]
    bad, good = tool_results(last_turn(api))
    assert bad["is_error"] is True and "unknown pass 'tiel'" in bad["content"]
    assert good["tool_use_id"] == "toolu_second" and "is_error" not in good and "Accepted 1" in good["content"]


def test_critic_drops_lessons_already_known(api):
    api.script(lessons(("Vec=8 beats vec=4 for bf16 rows of 4096", [11]), ("new and grounded", [11])))
    assert policy(api).reflect(context(), trials()) == ["new and grounded"]
