"""How often a model ends its answer by itself on a real client's first request, under the server's
sampling defaults: the first request Claude Code 2.1.332 or Codex 0.171.0 sends as installed
(tests/fixtures/clients), sent N times with only its output limit lowered to --max-tokens (an answer
that reaches it counts as a runaway). The prompt is prefilled once and then served from the prefix
cache, so each run costs its decode only.

    .venv/bin/python scripts/client_stop_rate.py --url http://127.0.0.1:8000 --client claude --runs 20

Used to choose `make serve`'s sampling defaults for SmolLM2 (docs/clients.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import httpx

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "clients"
CLIENTS = {
    # client: (fixture, route, output-limit field, how the answer says it stopped by itself)
    "claude": ("claude-code-2.1.332_messages.json", "/v1/messages", "max_tokens"),
    "codex": ("codex-0.171.0_responses.json", "/v1/responses", "max_output_tokens"),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--client", choices=sorted(CLIENTS), default="claude")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=400, help="an answer this long counts as a runaway")
    parser.add_argument("--body", default="{}", help="JSON merged into the request body (e.g. a temperature)")
    parser.add_argument(
        "--question",
        action="append",
        default=[],
        help="ask this instead of the fixture's question (repeat: in turn)",
    )
    parser.add_argument("--show", action="store_true", help="print each answer's text")
    parser.add_argument("--json", type=Path, default=None, help="write the runs here")
    args = parser.parse_args()

    fixture, route, limit_field = CLIENTS[args.client]
    body = json.loads((FIXTURES / fixture).read_text())
    body |= {"stream": False, limit_field: args.max_tokens} | json.loads(args.body)
    headers = {"x-api-key": "dummy", "authorization": "Bearer dummy", "anthropic-version": "2023-06-01"}
    runs = []
    with httpx.Client(base_url=args.url, timeout=3600, headers=headers) as client:
        for index in range(args.runs):
            if args.question:
                body = _ask(args.client, body, args.question[index % len(args.question)])
            started = time.monotonic()
            response = client.post(route, json=body)
            elapsed = time.monotonic() - started
            response.raise_for_status()
            run = _summary(args.client, response.json()) | {"seconds": round(elapsed, 2)}
            if args.question:
                run["question"] = args.question[index % len(args.question)]
            runs.append(run)
            print(
                f"run {index + 1:2d}: {json.dumps({k: v for k, v in run.items() if k != 'text'})}", flush=True
            )
            if args.show:
                print("   ", json.dumps(run["text"][:600]), flush=True)
    stopped = [r for r in runs if r["stopped"]]
    lengths = [r["output_tokens"] for r in runs]
    print(
        f"{args.client}: {len(stopped)}/{len(runs)} ended by themselves within {args.max_tokens} tokens; "
        f"output tokens median {statistics.median(lengths):.0f}, max {max(lengths)}; "
        f"seconds median {statistics.median(r['seconds'] for r in runs):.1f}"
    )
    if args.json is not None:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=1)
        )


def _ask(client: str, body: dict, question: str) -> dict:
    """The fixture with its last user text (the question) replaced."""
    body = json.loads(json.dumps(body))
    messages = body["messages"] if client == "claude" else body["input"]
    last_user = [m for m in messages if m.get("role") == "user"][-1]
    last_user["content"][-1]["text"] = question
    return body


def _summary(client: str, answer: dict) -> dict:
    if client == "claude":
        blocks = answer["content"]
        text = "".join(b.get("text", "") for b in blocks if b["type"] == "text")
        tools = [b["name"] for b in blocks if b["type"] == "tool_use"]
        usage = answer["usage"]
        return {
            "stopped": answer["stop_reason"] in ("end_turn", "tool_use", "stop_sequence"),
            "stop_reason": answer["stop_reason"],
            "output_tokens": usage["output_tokens"],
            "cached": usage.get("cache_read_input_tokens", 0),
            "tools": tools,
            "text": text,
        }
    items = answer["output"]
    text = "".join(
        part.get("text", "")
        for item in items
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    tools = [item["name"] for item in items if item["type"] == "function_call"]
    usage = answer["usage"]
    return {
        "stopped": answer["status"] == "completed",
        "stop_reason": answer["status"]
        + (f"/{answer['incomplete_details']}" if answer.get("incomplete_details") else ""),
        "output_tokens": usage["output_tokens"],
        "cached": usage.get("input_tokens_details", {}).get("cached_tokens", 0),
        "tools": tools,
        "text": text,
    }


if __name__ == "__main__":
    main()
