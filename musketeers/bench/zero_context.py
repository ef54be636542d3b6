"""How far zero context tokens move an untrained policy, per placement of C, measured on a
named policy and task (``musketeers.method.probe.first_token_kl``).

    python -m musketeers.bench.zero_context --policy qwen2.5-coder-0.5b-instruct \
        --task arithmetic -n 8
"""

from __future__ import annotations

import argparse

from musketeers.config import resolve_config
from musketeers.method.placement import CONTEXT_POSITIONS
from musketeers.method.probe import first_token_kl
from musketeers.run.build import build_policy
from musketeers.tasks import build_items


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m musketeers.bench.zero_context", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("-n", type=int, default=8, help="validation prompts")
    p.add_argument("--latents", default="1,8", help="comma list of m")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args(argv)

    cfg = resolve_config(overrides={"policy": args.policy, "task": args.task,
                                    "dtype": args.dtype, "device": "cpu"})
    policy = build_policy(cfg)
    ids = policy.encode_prompts(build_items(args.task, "val", limit=args.n))
    print(f"KL of the first token, π(·|x) vs π(·|[x ‖ 0]), nats: {args.policy}, "
          f"{len(ids)} {args.task} prompts")
    print("m    " + "  ".join(f"{pos:>24}" for pos in CONTEXT_POSITIONS))
    for m in (int(x) for x in args.latents.split(",")):
        kls = [first_token_kl(policy, ids, m, pos) for pos in CONTEXT_POSITIONS]
        print(f"{m:<4} " + "  ".join(f"{kl:>24.3f}" for kl in kls))


if __name__ == "__main__":
    main()
