"""The paper's Figure 4 layout for one run: utilisation per expert (top), entropy and reward.

Rendered with matplotlib's Agg backend (no display needed) from ``metrics.jsonl`` rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_run(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Utilisation u_i over steps, routing entropy H and reward over steps, as a PNG."""
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    u_ax, h_ax, r_ax = axes
    names = list(rows[0].get("utilisation", {})) if rows else []
    for name in names:
        u_ax.plot(steps, [r["utilisation"][name] for r in rows], label=name)
    u_ax.set(title="expert utilisation $u_i$", xlabel="step")
    if names:
        u_ax.legend(fontsize=7)
    else:
        u_ax.text(0.5, 0.5, "no attention matrix\nfor this method", ha="center",
                  transform=u_ax.transAxes)
    if rows and "entropy" in rows[0]:
        h_ax.plot(steps, [r["entropy"] for r in rows], color="tab:purple")
    h_ax.set(title="routing entropy $H$", xlabel="step")
    r_ax.plot(steps, [r["reward_mean"] for r in rows], color="tab:green",
              label="score (mean reward)")
    r_ax.plot(steps, [r["exact"] for r in rows], color="tab:olive", alpha=0.6,
              label="exact (share scoring 1)")
    r_ax.set(title="reward", xlabel="step")
    r_ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
