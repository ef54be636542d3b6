"""Where the context tokens C enter the policy's prefix, declared without torch.

The policy (``musketeers.method.policy.Policy.build_inputs``) places C by these names, and
``musketeers.config_checks.validate`` checks a run's ``context_position`` against them before
anything heavy is imported. Why the default is the default: ``musketeers.method.policy``.
"""

from __future__ import annotations

# [x ‖ C ‖ assistant header], [x ‖ assistant header ‖ C], [C ‖ x ‖ assistant header]
CONTEXT_POSITIONS = ("before_generation_prompt", "after_prompt", "before_prompt")
