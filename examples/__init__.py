"""The demos `./dev demo` runs (scripts); benchmarks/ imports their data helpers as `examples.<demo>`."""
