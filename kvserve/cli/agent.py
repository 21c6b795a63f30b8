"""`kvserve agent`: a terminal coding agent. Without `--url` it embeds the engine and serves it on a
loopback port, so both modes talk to the model over the same HTTP code path."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from kvserve.cli.serve import _data_dir, add_serve_args

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="terminal coding agent (tools run locally, the model over HTTP)")
    g = p.add_argument_group("agent")
    g.add_argument(
        "-p", "--prompt", default=None, help="run this task non-interactively, print the result, exit"
    )
    g.add_argument(
        "--json", action="store_true", help="with -p: print a JSON transcript instead of the answer"
    )
    g.add_argument("--url", default=None, help="use this server instead of the embedded engine")
    g.add_argument("--api", choices=("openai", "anthropic"), default="openai", help="the --url server's API")
    g.add_argument("--remote-model", default=None, help="model id for --url (default: the first it lists)")
    g.add_argument("--cwd", default=None, help="working directory the tools are confined to (default: .)")
    g.add_argument(
        "--allow-path",
        action="append",
        default=[],
        metavar="DIR",
        help="also allow tools to touch DIR (repeatable)",
    )
    g.add_argument("-y", "--yes", action="store_true", help="run every tool without asking")
    g.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="TOOL",
        help="run TOOL without asking (repeatable, or a,b,c)",
    )
    g.add_argument(
        "--confirm-timeout", type=float, default=10.0, help="seconds before an unanswered prompt denies"
    )
    g.add_argument("--session", default=None, help="session name: resumed if it exists, else created")
    g.add_argument(
        "-c", "--continue", dest="is_continue", action="store_true", help="resume the last session"
    )
    g.add_argument("--system", default=None, help="extra system prompt text")
    g.add_argument("--max-tokens", type=int, default=4096, help="tokens per generation")
    g.add_argument("--max-steps", type=int, default=50, help="model calls per turn")
    g.add_argument("--temperature", type=float, default=None, help="default: the server's")
    g.add_argument("--think", default=None, help="on, off, or an effort: " + ", ".join(REASONING_EFFORTS))
    add_serve_args(p)
    p.set_defaults(func=run)


def options_from_args(args: argparse.Namespace):
    from kvserve.agent.options import AgentOptions

    cwd = Path(args.cwd or os.getcwd()).resolve()
    if not cwd.is_dir():
        sys.exit(f"kvserve agent: --cwd {cwd}: not a directory")
    allowed = frozenset(t.strip() for item in args.allow for t in item.split(",") if t.strip())
    return AgentOptions(
        cwd=cwd,
        sessions_dir=_data_dir(args.data_dir) / "agent" / "sessions",
        prompt=args.prompt,
        is_json=args.json,
        api=args.api,
        api_key=args.api_key,
        model=args.remote_model,
        fallback_ctx=args.ctx or 32768,
        session=args.session,
        is_continue=args.is_continue,
        system=args.system,
        is_yes=args.yes,
        allowed_tools=allowed,
        allowed_paths=tuple(args.allow_path),
        confirm_timeout_s=args.confirm_timeout,
        max_tokens=args.max_tokens,
        max_steps=args.max_steps,
        temperature=args.temperature,
        reasoning_effort=think_effort(args.think),
        is_embedded=args.url is None,
    )


def think_effort(value: str | None) -> str | None:
    if value is None:
        return None
    effort = {"on": "medium", "off": "none"}.get(value, value)
    if effort not in REASONING_EFFORTS:
        sys.exit(f"kvserve agent: --think must be on, off or one of {', '.join(REASONING_EFFORTS)}")
    return effort


def run(args: argparse.Namespace) -> None:
    from kvserve.agent.app import run_print_mode
    from kvserve.agent.session import SessionError

    options = options_from_args(args)
    if args.log_level.upper() == "INFO":  # the default: per-request logs would scribble over the UI
        logging.getLogger().setLevel(logging.WARNING)
    if options.prompt is None:
        from kvserve.agent.tui import run_interactive as runner  # prompt-toolkit and rich: the UI only
    else:
        runner = run_print_mode
    try:
        if args.url:
            code = runner(args.url, options)
        else:
            from kvserve.cli.embedded import embedded_server

            print(f"kvserve agent: loading {args.model} …", file=sys.stderr, flush=True)
            with embedded_server(args) as url:
                code = runner(url, options)
    except SessionError as error:
        sys.exit(f"kvserve agent: {error}")
    sys.exit(code)
