"""Speed and memory benchmarks of kvpop_compile against what a user would run instead.

``python benchmarks/run_all.py`` runs every family and writes ``benchmarks/results/``;
``python benchmarks/decode_engines.py`` compares the KVpop decode paths with each other.
"""
