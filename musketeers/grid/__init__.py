"""The grid runner (``musketeers ablate``): precompute what a grid needs, run its runs,
publish each as it ends, and time every call.

needs.py (what the stores must hold), run.py (resumable execution), status.py (a run's state
on disk, stale runs), ledger.py (measured wall time per call), walltime.py (the report's
wall-time lines), publish.py (finished runs' artefacts under reports/<grid>/runs/), fake.py
(a stand-in trainer for tests). The grid's declaration is ``musketeers.design.gridspec``; the
analysis (``musketeers.reports``) imports nothing from here.
"""
