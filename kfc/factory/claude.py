"""The Claude policy: a planner that proposes pipelines and a critic that writes lessons, both
through the Messages API with a forced tool call whose input has a JSON schema.

Nothing the model says bypasses the factory: a proposal is a pipeline string that must parse
(`parse_pipeline`), and it is then verified, compiled, checked and timed like any other. A reply
that does not match the tool's schema, or names a pipeline that does not parse, is answered in
the same conversation with a `tool_result` block (`is_error: true`) that says exactly what was
wrong, up to `max_repairs` times. API failures are retried by the SDK (`max_retries`) and then
turned into one `KfcError`.

`anthropic` is imported when a policy is made, so importing this module needs no SDK.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from ..diagnostics import KfcError
from ..passes.base import PASSES, PassError
from ..passes.pipeline import parse_pipeline
from .model import TuneContext
from ..model.records import Outcome, Proposal, Trial
from ..kb.graph import paying_steps

PLANNER_TOOL = "propose_pipelines"
CRITIC_TOOL = "write_lessons"
MAX_LESSON_CHARS = 300
MAX_HISTORY = 40          # trials of this run shown to the planner (the best and the latest)
MAX_PRIOR = 20            # trials from the knowledge base shown to the planner
MAX_LESSONS = 30          # lessons shown to the planner

PLANNER_SYSTEM = """\
You tune kfc, a compiler that turns an op description into a GPU kernel. The kernel's code \
depends on a pass pipeline: passes separated by commas, options in braces, e.g. \
"canonicalize,tile{threads=256,vec=8},lower-ptx{stream=none}". For one op, target GPU and \
shape you propose pipelines to try. Every candidate is parsed, verified, compiled (ptxas \
reports registers and spills), checked for correctness against a reference and timed; a wrong \
or invalid candidate is simply rejected, so your job is speed. Write pipelines in the form the \
search space shows (other pass orders are allowed but rarely help). Do not repeat a pipeline \
from the history. Use the history, the prior trials and the lessons: move the options that \
helped further, avoid what failed, and keep some candidates exploratory. Give each a one-line \
rationale. Answer only by calling propose_pipelines."""

CRITIC_SYSTEM = """\
You are the critic of kfc's pipeline tuner. You read the latest trials of one GPU kernel - \
failures with their errors, ptxas reports (registers, spills, shared memory) and timings - and \
write lessons the planner will read on later runs. Each lesson is one line of at most 300 \
characters, concrete (name the pass option, the shape or the target, and the effect), and \
cites the candidate ids it rests on as evidence. Write no lesson the trials do not support, \
and do not repeat a known lesson; an empty list is fine. Answer only by calling write_lessons."""

PLANNER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "candidates": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "pipeline": {"type": "string", "description": "a pipeline string, e.g. in the space's form"},
                    "rationale": {"type": "string", "description": "one line: why this could be faster"},
                },
                "required": ["pipeline", "rationale"],
            },
            "minItems": 1,
        }
    },
    "required": ["candidates"],
}

CRITIC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "lessons": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": f"one line, at most {MAX_LESSON_CHARS} characters"},
                    "evidence": {"type": "array", "items": {"type": "integer"},
                                 "description": "ids of the candidates the lesson rests on"},
                },
                "required": ["text", "evidence"],
            },
        }
    },
    "required": ["lessons"],
}

PLANNER_TOOLS = [{"name": PLANNER_TOOL, "input_schema": PLANNER_SCHEMA,
                  "description": "Propose pass pipelines to compile, check and time for this kernel."}]
CRITIC_TOOLS = [{"name": CRITIC_TOOL, "input_schema": CRITIC_SCHEMA,
                 "description": "Record short lessons drawn from the trials, each with the candidate ids it rests on."}]


class _Malformed(Exception):
    """A reply that cannot be used; the message says what was wrong, for the model to fix."""


DEFAULT_MODEL = "claude-sonnet-5-5"  # KFC_CLAUDE_MODEL chooses another


class ClaudePolicy:
    """A Policy backed by Claude: `propose` asks the planner, `reflect` asks the critic."""

    name = "claude"

    def __init__(self, model: str | None = None, api_key: str | None = None, base_url: str | None = None,
                 max_retries: int = 3, timeout: float = 60.0, max_repairs: int = 2):
        model = model or os.environ.get("KFC_CLAUDE_MODEL") or DEFAULT_MODEL
        api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or None
        if not api_key:
            raise KfcError("the Claude policy needs ANTHROPIC_API_KEY",
                           hint="export ANTHROPIC_API_KEY=... (or pass api_key=), or use the offline policy")
        try:
            import anthropic  # lazy: anthropic (~1.5 s), only --policy claude
        except ImportError:
            raise KfcError("the Claude policy needs the anthropic package",
                           hint="pip install anthropic, or use the offline policy") from None
        self._anthropic = anthropic
        self.model = model
        self.max_retries = max_retries
        self.max_repairs = max_repairs
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        self.client = anthropic.Anthropic(api_key=api_key, base_url=self.base_url, max_retries=max_retries,
                                          timeout=timeout)
        self.transcript: list[dict[str, Any]] = []
        self.last_error: str | None = None

    # --- the planner ----------------------------------------------------------------------------
    def propose(self, ctx: TuneContext, n: int) -> list[Proposal]:
        self.last_error = None
        if n <= 0:
            return []
        tried = {}
        for t in ctx.history:
            try:
                tried.setdefault(str(parse_pipeline(t.proposal.pipeline)), t.candidate_id)
            except PassError:
                pass
        messages: list[dict[str, Any]] = [{"role": "user", "content": planner_prompt(ctx, n)}]
        found: dict[str, Proposal] = {}
        problems: list[str] = []
        for attempt in range(self.max_repairs + 1):
            reply = self._call("planner", PLANNER_SYSTEM, messages, PLANNER_TOOLS, PLANNER_TOOL, max_tokens=4096)
            results, problems = [], []
            uses = _tool_uses(reply, PLANNER_TOOL)
            for use in uses:
                try:
                    good, bad = _read_candidates(use["input"], tried, found)
                except _Malformed as e:
                    good, bad = [], [str(e)]
                for p in good:
                    if len(found) < n:
                        found[p.pipeline] = p
                problems += bad
                results.append((use, good, bad))
            if not uses:
                problems.append(f"you answered without calling {PLANNER_TOOL}")
            if len(found) >= n or not problems:
                break
            if attempt == self.max_repairs:
                break
            need = n - len(found)
            messages = messages + [_assistant_turn(reply), _repair_turn(results, problems, PLANNER_TOOL,
                                                                        f"Call {PLANNER_TOOL} again with {need} new "
                                                                        f"valid pipeline{'s' if need > 1 else ''}.")]
        if not found:
            why = "; ".join(problems) or "no candidates"
            self.last_error = why
            raise KfcError(f"Claude proposed no usable pipeline after {self.max_repairs} "
                           f"repair{'s' if self.max_repairs != 1 else ''}: {_clip(why, 600)}",
                           hint="see the policy's transcript, or use the offline policy")
        return list(found.values())[:n]

    # --- the critic -----------------------------------------------------------------------------
    def reflect(self, ctx: TuneContext, trials: Sequence[Trial]) -> list[str]:
        """Lessons from the trials; [] (with `last_error` set) if the critic fails in any way."""
        self.last_error = None
        trials = list(trials)
        if not trials:
            return []
        ids = {t.candidate_id for t in trials}
        known = {x.strip().lower() for x in ctx.lessons}
        messages: list[dict[str, Any]] = [{"role": "user", "content": critic_prompt(ctx, trials)}]
        try:
            for attempt in range(self.max_repairs + 1):
                reply = self._call("critic", CRITIC_SYSTEM, messages, CRITIC_TOOLS, CRITIC_TOOL, max_tokens=2048)
                uses = _tool_uses(reply, CRITIC_TOOL)
                lessons: list[str] = []
                problems: list[str] = []
                results = []
                offered, whole_bad = 0, not uses
                for use in uses:
                    try:
                        good, bad, count = _read_lessons(use["input"], ids)
                    except _Malformed as e:
                        good, bad, count, whole_bad = [], [str(e)], 0, True
                    lessons += [t for t in good if t not in lessons and t.lower() not in known]
                    problems += bad
                    offered += count
                    results.append((use, good, bad))
                if not uses:
                    problems.append(f"you answered without calling {CRITIC_TOOL}")
                # a well-formed reply is used even if some lessons were dropped as invalid (an empty list is
                # fine too); one that is malformed as a whole, or offered lessons and all were invalid, is repaired
                if not whole_bad and (lessons or not offered):
                    if problems:
                        self.last_error = "dropped: " + "; ".join(problems)
                    return lessons
                if attempt == self.max_repairs:
                    break
                messages = messages + [_assistant_turn(reply), _repair_turn(results, problems, CRITIC_TOOL,
                                                                            f"Call {CRITIC_TOOL} again.")]
            self.last_error = (f"the critic's reply stayed malformed after {self.max_repairs} repairs: "
                               + "; ".join(problems))
        except KfcError as e:
            self.last_error = e.message
        return []

    # --- the API --------------------------------------------------------------------------------
    def _call(self, role: str, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
              tool: str, max_tokens: int):
        anthropic = self._anthropic
        request = {"model": self.model, "max_tokens": max_tokens, "system": system, "messages": messages,
                   "tools": tools, "tool_choice": {"type": "tool", "name": tool}}
        entry: dict[str, Any] = {"role": role, "request": request}
        self.transcript.append(entry)
        try:
            reply = self.client.messages.create(**request)
        except anthropic.APIStatusError as e:
            retries = _retries_taken(e.response.request)
            message = e.api_message or _clip(str(e.message), 300)
            kind = f" {e.type}" if e.type else ""
            entry["error"] = f"{e.status_code}{kind}: {message}"
            raise KfcError(f"the Claude API failed after {retries} {_plural(retries, 'retry', 'retries')}: "
                           f"{e.status_code}{kind} {message}", hint=_status_hint(e.status_code)) from None
        except anthropic.APIConnectionError as e:
            retries = _retries_taken(getattr(e, "request", None))
            cause = e.__cause__ or e.__context__
            why = f"{e.message} ({cause})" if cause else e.message
            entry["error"] = why
            raise KfcError(f"the Claude API failed after {retries} {_plural(retries, 'retry', 'retries')}: {why}",
                           hint=f"check the network and ANTHROPIC_BASE_URL (now {self.client.base_url})") from None
        except anthropic.AnthropicError as e:  # a response that does not parse, credentials, ...
            entry["error"] = str(e)
            raise KfcError(f"the Claude API failed: {type(e).__name__}: {_clip(str(e), 300)}") from None
        entry["response"] = reply.model_dump(mode="json", exclude_none=True, warnings=False)
        return reply


# --- prompts --------------------------------------------------------------------------------------
def planner_prompt(ctx: TuneContext, n: int) -> str:
    parts = [_header(ctx),
             "Search space:\n" + ctx.space.describe(),
             "Passes (name{options with defaults}):\n" + _passes(),
             "This run's trials (id, pipeline -> furthest stage, time or error):\n" + _history(ctx.history)]
    if ctx.prior:
        prior = _best(ctx.prior, MAX_PRIOR)
        parts.append("Prior trials from the knowledge base (this op and similar ops):\n"
                     + "\n".join(_trial_line(t) for t in prior))
    payoffs = _step_payoffs(ctx)
    if payoffs:
        parts.append("Pass steps that paid off (from the pass-sequence graph over these trials; speedup over each "
                     "op's default pipeline):\n" + payoffs)
    if ctx.lessons:
        parts.append("Lessons:\n" + "\n".join(f"- {x}" for x in ctx.lessons[-MAX_LESSONS:]))
    parts.append(f"Propose {n} new pipeline{'s' if n > 1 else ''} by calling {PLANNER_TOOL}.")
    return "\n\n".join(parts)


def _step_payoffs(ctx: TuneContext, per_pass: int = 4) -> str:
    """The best steps of each pass with options, by mean speedup, one line each."""
    graph = ctx.graph()
    lines = []
    for name in ("tile", "lower-ptx"):
        lines += [f"- {n}: mean {d['mean_speedup']:.3f}x, best {d['best_speedup']:.3f}x over {d['timed']} timed "
                  f"of {d['count']}" for n, d in paying_steps(graph, name)[:per_pass]]
    return "\n".join(lines)


def critic_prompt(ctx: TuneContext, trials: Sequence[Trial]) -> str:
    parts = [_header(ctx), "Search space:\n" + ctx.space.describe()]
    best = _best(ctx.history, 3)
    if best:
        parts.append("Best so far this run:\n" + "\n".join(_trial_line(t) for t in best))
    parts.append("Latest trials (read these):\n" + "\n".join(_trial_detail(t) for t in trials))
    if ctx.lessons:
        parts.append("Known lessons (do not repeat):\n" + "\n".join(f"- {x}" for x in ctx.lessons[-MAX_LESSONS:]))
    ids = ", ".join(str(t.candidate_id) for t in trials)
    parts.append(f"Write lessons by calling {CRITIC_TOOL}; evidence ids must be among: {ids}.")
    return "\n\n".join(parts)


def _header(ctx: TuneContext) -> str:
    shape = ", ".join(f"{k}={v}" for k, v in ctx.shape.items()) or "-"
    lines = [f"Op: {ctx.op_name} (fingerprint {ctx.op_fingerprint})", f"Target: {ctx.target}", f"Shape: {shape}"]
    if ctx.features:
        lines.append("Features: " + json.dumps(ctx.features, sort_keys=True, default=str))
    return "\n".join(lines)


def _passes() -> str:
    out = []
    for name, cls in sorted(PASSES.items()):
        opts = cls.describe_options()
        needs = f" [needs {', '.join(sorted(cls.REQUIRES))}]" if cls.REQUIRES else ""
        out.append(f"  {name}{'{' + opts + '}' if opts else ''}: {cls.SUMMARY}{needs}")
    return "\n".join(out)


def _history(history: Sequence[Trial]) -> str:
    if not history:
        return "  (none yet)"
    shown = list(history)
    if len(shown) > MAX_HISTORY:
        best = _best(shown, MAX_HISTORY // 4)
        recent = shown[-(MAX_HISTORY - len(best)):]
        keep = {t.candidate_id for t in best} | {t.candidate_id for t in recent}
        left = len(shown) - len(keep)
        shown = [t for t in shown if t.candidate_id in keep]
        return f"  ({left} older trials left out)\n" + "\n".join(_trial_line(t) for t in shown)
    return "\n".join(_trial_line(t) for t in shown)


def _best(trials: Sequence[Trial], k: int) -> list[Trial]:
    timed = [t for t in trials if t.outcome.median_us is not None]
    return sorted(timed, key=lambda t: t.outcome.median_us)[:k]


def _trial_line(t: Trial) -> str:
    return f"  #{t.candidate_id} {t.proposal.pipeline} -> {_result(t.outcome)}"


def _result(o: Outcome) -> str:
    if o.median_us is not None:
        s = f"{o.stage.value}, {o.median_us:.2f} us"
        if o.speedup is not None:
            s += f" ({o.speedup:.2f}x the default)"
        return s
    if o.error:
        return f"failed after {o.stage.value}: {_clip(o.error, 200)}"
    return o.stage.value


def _trial_detail(t: Trial) -> str:
    o = t.outcome
    facts = [f"stage {o.stage.value}"]
    for label, v, fmt in (("registers", o.registers, "{}"), ("spills", o.spills, "{}"),
                          ("smem", o.smem_bytes, "{} B"), ("median", o.median_us, "{:.2f} us"),
                          ("spread p10-p90", o.spread_us, "{:.2f} us"), ("speedup", o.speedup, "{:.2f}x"),
                          ("roofline", o.roofline_fraction, "{:.0%}")):
        if v is not None:
            facts.append(f"{label} {fmt.format(v)}")
    lines = [f"  #{t.candidate_id} {t.proposal.pipeline}", "    " + ", ".join(facts)]
    if t.proposal.rationale:
        lines.append(f"    proposed because: {_clip(t.proposal.rationale, 200)}")
    if o.error:
        lines.append(f"    error: {_clip(o.error, 400)}")
    if o.notes:
        lines.append(f"    notes: {_clip(o.notes, 300)}")
    return "\n".join(lines)


# --- reading replies ------------------------------------------------------------------------------
def _tool_uses(reply, tool: str) -> list[dict[str, Any]]:
    return [{"id": b.id, "name": b.name, "input": b.input} for b in reply.content
            if getattr(b, "type", None) == "tool_use" and b.name == tool]


def _read_candidates(data: Any, tried: dict[str, int], found: dict[str, Proposal]) -> tuple[list[Proposal], list[str]]:
    """The valid proposals in one tool input and a reason for each invalid part; raises _Malformed for the whole."""
    if not isinstance(data, dict):
        raise _Malformed(f"the input must be an object with a \"candidates\" array, not {_json_type(data)}")
    if "candidates" not in data:
        raise _Malformed("the input has no \"candidates\" key; it must be {\"candidates\": [{\"pipeline\": ..., "
                         "\"rationale\": ...}, ...]}")
    cands = data["candidates"]
    if not isinstance(cands, list):
        raise _Malformed(f"\"candidates\" must be an array, not {_json_type(cands)}")
    if not cands:
        raise _Malformed("\"candidates\" is empty; give at least one")
    good: list[Proposal] = []
    bad: list[str] = []
    seen = set(found)
    for i, c in enumerate(cands):
        where = f"candidates[{i}]"
        if not isinstance(c, dict):
            bad.append(f"{where} must be an object with \"pipeline\" and \"rationale\", not {_json_type(c)}")
            continue
        missing = [k for k in ("pipeline", "rationale") if k not in c]
        if missing:
            bad.append(f"{where} has no {' or '.join(repr(k) for k in missing)}")
            continue
        pipeline, rationale = c["pipeline"], c["rationale"]
        if not isinstance(pipeline, str):
            bad.append(f"{where}.pipeline must be a string, not {_json_type(pipeline)}")
            continue
        if not isinstance(rationale, str):
            bad.append(f"{where}.rationale must be a string, not {_json_type(rationale)}")
            continue
        try:
            canonical = str(parse_pipeline(pipeline))
        except PassError as e:
            hint = e.hint.replace("`kfc passes` lists them", "the prompt lists them").strip() if e.hint else ""
            bad.append(f"{where}.pipeline {_clip(pipeline, 120)!r} does not parse: {e.message}"
                       + (f" ({hint})" if hint else ""))
            continue
        if not canonical:
            bad.append(f"{where}.pipeline is empty")
            continue
        if canonical in tried:
            bad.append(f"{where}.pipeline {canonical!r} was already tried (candidate #{tried[canonical]})")
            continue
        if canonical in seen:
            continue  # the same pipeline twice in one answer: keep the first, no need to complain
        seen.add(canonical)
        good.append(Proposal(pipeline=canonical, rationale=_clip(" ".join(rationale.split()), 500),
                             proposer="claude:planner"))
    return good, bad


def _read_lessons(data: Any, ids: set[int]) -> tuple[list[str], list[str], int]:
    """(valid lesson texts, reasons for the dropped ones, number offered); raises _Malformed for the whole."""
    if not isinstance(data, dict):
        raise _Malformed(f"the input must be an object with a \"lessons\" array, not {_json_type(data)}")
    if "lessons" not in data:
        raise _Malformed("the input has no \"lessons\" key; it must be {\"lessons\": [{\"text\": ..., "
                         "\"evidence\": [candidate ids]}, ...]}")
    lessons = data["lessons"]
    if not isinstance(lessons, list):
        raise _Malformed(f"\"lessons\" must be an array, not {_json_type(lessons)}")
    good: list[str] = []
    bad: list[str] = []
    for i, x in enumerate(lessons):
        where = f"lessons[{i}]"
        if not isinstance(x, dict):
            bad.append(f"{where} must be an object with \"text\" and \"evidence\", not {_json_type(x)}")
            continue
        text, evidence = x.get("text"), x.get("evidence")
        if not isinstance(text, str) or not text.strip():
            bad.append(f"{where}.text must be a non-empty string")
            continue
        text = text.strip()
        if "\n" in text:
            bad.append(f"{where}.text must be one line")
            continue
        if len(text) > MAX_LESSON_CHARS:
            bad.append(f"{where}.text has {len(text)} characters; the limit is {MAX_LESSON_CHARS}")
            continue
        if not isinstance(evidence, list) or not evidence \
                or not all(isinstance(e, int) and not isinstance(e, bool) for e in evidence):
            bad.append(f"{where}.evidence must be a non-empty array of candidate ids (integers)")
            continue
        unknown = [e for e in evidence if e not in ids]
        if unknown:
            bad.append(f"{where}.evidence cites {', '.join(f'#{e}' for e in unknown)}, not among the trials "
                       f"({', '.join(f'#{e}' for e in sorted(ids))})")
            continue
        good.append(text)
    return good, bad, len(lessons)


def _assistant_turn(reply) -> dict[str, Any]:
    content = []
    for b in reply.content:
        if b.type == "tool_use":
            content.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
        elif b.type == "text" and b.text:
            content.append({"type": "text", "text": b.text})
    return {"role": "assistant", "content": content or [{"type": "text", "text": "(no answer)"}]}


def _repair_turn(results, problems: list[str], tool: str, ask: str) -> dict[str, Any]:
    """The user turn that answers every tool_use of the last reply and asks again."""
    content: list[dict[str, Any]] = []
    for use, good, bad in results:
        if bad:
            kept = f"\nKept {len(good)} valid item{'s' if len(good) != 1 else ''}." if good else ""
            content.append({"type": "tool_result", "tool_use_id": use["id"], "is_error": True,
                            "content": "Invalid input:\n" + "\n".join(f"- {b}" for b in bad) + kept})
        else:
            content.append({"type": "tool_result", "tool_use_id": use["id"],
                            "content": f"Accepted {len(good)} item{'s' if len(good) != 1 else ''}."})
    if not results:
        ask = f"You must answer by calling {tool}. {ask}"
    content.append({"type": "text", "text": ask})
    return {"role": "user", "content": content}


# --- small helpers --------------------------------------------------------------------------------
def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _clip(s: str, k: int) -> str:
    s = str(s)
    return s if len(s) <= k else s[:k - 1] + "…"


def _plural(k: int, one: str, many: str) -> str:
    return one if k == 1 else many


def _retries_taken(request) -> int:
    """How many retries the SDK made before this request (its x-stainless-retry-count header)."""
    try:
        return int(request.headers.get("x-stainless-retry-count", "0"))
    except (AttributeError, TypeError, ValueError):
        return 0


def _status_hint(status: int) -> str:
    if status == 401:
        return "check ANTHROPIC_API_KEY"
    if status == 403:
        return "the key may lack access to this model"
    if status == 404:
        return "check the model name and ANTHROPIC_BASE_URL"
    if status in (429, 529) or status >= 500:
        return "the API is busy or failing; try again later, or use the offline policy"
    return "see the policy's transcript for the request"


__all__ = ["CRITIC_SCHEMA", "PLANNER_SCHEMA", "ClaudePolicy", "critic_prompt", "planner_prompt"]
