"""``initpipe check-weights``: whether a running vLLM server serves your model's weights.

What belongs here: the command line over :func:`initpipe_vllm.live.refit.server_check.check_server`:
the server's prompt log-probabilities of a text (its OpenAI route, ``prompt_logprobs``)
against those of a model folder loaded with transformers (the trainer's saved weights),
within the dtype's tolerance; and the server's prefix cache: tokens generated from the text
(reading the blocks an earlier check left there) against the same tokens scored without the
cache. Nothing of initpipe needs to run inside the server.

Exit status: 0 when they agree, 1 when they do not (the line names the first position and
token), 2 on bad input (no reference, no text, a server that cannot be asked).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..live.refit.server_check import CACHE_TOKENS
from ._cli import Parser, command_parser, parse


def build_parser() -> Parser:
    p = command_parser(__doc__)
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument(
        "--reference",
        required=True,
        metavar="DIR",
        help="a model folder of the weights the server should serve (transformers loads it "
        "in float32); its tokenizer encodes --text",
    )
    p.add_argument(
        "--text",
        action="append",
        required=True,
        help="a text like your training data's, 64 tokens or more (repeatable)",
    )
    p.add_argument("--dtype", default="bfloat16", help="the server's dtype (default bfloat16)")
    p.add_argument(
        "--tolerance",
        nargs=2,
        type=float,
        metavar=("PER_POSITION", "MEAN"),
        help="the largest difference at one position and on average (default: the dtype's)",
    )
    p.add_argument("--model", help="the served model's name (default: the first it lists)")
    p.add_argument(
        "--cache-tokens",
        type=int,
        default=CACHE_TOKENS,
        metavar="N",
        help=f"tokens generated per text for the prefix-cache check (default {CACHE_TOKENS}; "
        "0 skips it). Run the check before each sync too: what it leaves in the cache is "
        "what the next one reads",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``initpipe check-weights``; returns the exit status (0 agree, 1 not, 2 bad input)."""
    from ..live.refit.reference import BadReference
    from ..live.refit.server_check import ServerCheckError, check_server

    args = parse(build_parser(), argv)
    if isinstance(args, int):
        return args
    if args.cache_tokens < 0:
        print(
            f"Error: --cache-tokens {args.cache_tokens}: give 0 (no cache check) or more",
            file=sys.stderr,
        )
        return 2
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.reference)
        model = AutoModelForCausalLM.from_pretrained(args.reference, dtype=torch.float32)
    except (OSError, ValueError) as err:
        print(f"Error: --reference {args.reference}: cannot load it ({err})", file=sys.stderr)
        return 2
    prompts = [tokenizer(t)["input_ids"] for t in args.text]
    try:
        found = check_server(
            args.url,
            model,
            prompts,
            dtype=args.dtype,
            tolerance=args.tolerance,
            model=args.model,
            cache_tokens=args.cache_tokens,
        )
    except (ServerCheckError, BadReference) as err:
        print(f"Error: {err}", file=sys.stderr)
        return 2
    print(found.summary())
    return 0 if found.ok else 1
