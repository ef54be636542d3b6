"""Ablation grids → runs → the paper's tables and figures (``musketeers ablate``).

grid.py (YAML grids, resumable execution), needs.py (what the cache must hold), aggregate.py
(runs on disk → mean ± sample std over seeds), tables.py (Tables 1–2), figures.py
(Figures 4–6), report.py (reports/<budget>/README.md), fake.py (a stand-in trainer for tests).
"""
