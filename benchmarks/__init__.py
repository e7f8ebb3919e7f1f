"""The benchmarks, run as modules from the repository's root: `.venv/bin/python -m benchmarks.<name>` (they import
the demos' data helpers as `examples.<demo>`, and the peers' runner as `benchmarks.peers`, with no sys.path edits)."""
