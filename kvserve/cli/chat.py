"""`kvserve chat`: a terminal REPL over the model's chat template.

Each turn re-renders the whole conversation; the paged KV cache's prefix sharing makes
the earlier turns free (the status line shows how many prompt tokens were cached).
"""

from __future__ import annotations

import argparse
import sys

from kvserve.cli.engine_args import add_engine_args, engine_config_from_args
from kvserve.cli.generate import stream_tokens
from kvserve.cli.sampling_args import add_sampling_args, sampling_params_from_args
from kvserve.engine.build import build_engine

_HELP = "commands: /clear (forget the conversation), /quit"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive chat with the model's chat template")
    p.add_argument("--system", default=None, help="system prompt")
    add_sampling_args(p)
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    engine = build_engine(engine_config_from_args(args))
    tok = engine.loaded.tokenizer
    if not tok.chat_template:
        sys.exit("kvserve: this model has no chat template (a base model?); use `kvserve generate`")
    params = sampling_params_from_args(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    print(_HELP, file=sys.stderr)
    while True:
        try:
            line = input(">>> ").strip()
        except EOFError:
            print()
            return
        if line in ("/quit", "/exit"):
            return
        if line == "/clear":
            messages = list(system)
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        token_ids = tok.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(token_ids, list):  # transformers 5 returns a BatchEncoding
            token_ids = list(token_ids["input_ids"])
        try:
            reply = stream_tokens(engine, token_ids, params)
        except ValueError as error:  # PromptTooLongError: the conversation outgrew --ctx
            print(f"kvserve: {error}; use /clear", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})
