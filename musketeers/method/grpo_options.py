"""The names of GRPO's registered options, declared without torch.

``musketeers.config.validate`` checks a run's ``advantage``, ``reward_norm`` and ``loss_norm``
against these before anything heavy is imported; ``musketeers.method.grpo`` registers one
function under each name, and refuses to register a name not declared here.
"""

from __future__ import annotations

ADVANTAGES = ("group", "loo")
REWARD_NORMS = ("group", "task", "none")
LOSS_NORMS = ("token", "sequence", "constant")
