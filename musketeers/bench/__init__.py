"""`make bench`: side-by-side measurements of the hot paths, written to BENCHMARKS.md.

Sections, each a module: ``matmul`` (this machine's ceiling), ``precompute_bench`` (batched
backbone vs a naive loop), ``reads_bench`` (cache reads), ``train_bench`` (cached vs live
experts), ``trl_bench`` (``single`` vs TRL's GRPOTrainer), ``gpu`` (the same on CUDA when
present). ``report`` turns the measurements into a Rich table and the markdown file.
"""
