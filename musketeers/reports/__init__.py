"""Runs on disk → the paper's tables, figures, claims and report (the analysis).

aggregate.py (runs on disk → mean ± sample std over seeds), tables.py (Tables 1–2),
figures.py (Figures 4–6), claims.py and routing_claims.py (the paper's findings against our
runs), report.py (reports/<grid>/README.md). It imports nothing from the grid runner
(``musketeers.grid``).
"""
