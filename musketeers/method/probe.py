"""How far zero context tokens move an untrained policy, per placement of C.

Eq. 11 initialises W_out near zero so that C ≈ 0 leaves the initial policy where it was. This
measures whether it does: the KL of the first completion token between π(·|x) and
π(·|[x ‖ 0]), averaged over prompts, for each ``context_position`` (musketeers.method.policy).

    python -m musketeers.method.probe --policy qwen2.5-coder-0.5b-instruct --task arithmetic -n 8
"""

from __future__ import annotations

import argparse

import torch

from musketeers.config import CONTEXT_POSITIONS


def first_token_kl(policy, prompt_ids: list[list[int]], m: int, position: str) -> float:
    """Mean KL(π(·|x) ‖ π(·|[x ‖ 0_m])) over the prompts, in nats, with C at ``position``."""
    saved = policy.context_position

    def log_probs(context: torch.Tensor | None) -> torch.Tensor:
        inp = policy.build_inputs(prompt_ids, context)
        with torch.no_grad():
            # the LM head at the prefix's last position only, as Policy's prefill does
            logits = policy.model(inputs_embeds=inp.inputs_embeds,
                                  attention_mask=inp.attention_mask,
                                  position_ids=inp.position_ids, logits_to_keep=1).logits[:, -1]
        return torch.log_softmax(logits.float(), -1)

    try:
        base = log_probs(None)
        policy.context_position = position
        moved = log_probs(torch.zeros(len(prompt_ids), m, policy.embed_dim))
    finally:
        policy.context_position = saved
    return float((base.exp() * (base - moved)).sum(-1).mean())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m musketeers.method.probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--task", default="arithmetic")
    p.add_argument("-n", type=int, default=8, help="validation prompts")
    p.add_argument("--latents", default="1,8", help="comma list of m")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args(argv)

    from musketeers.config import resolve_config
    from musketeers.run.build import build_policy
    from musketeers.tasks import build_items

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
