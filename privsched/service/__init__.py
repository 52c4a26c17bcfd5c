"""The scheduler service: the scheduling loop, compute resources, and the executors that run
granted jobs. It moves budget only through the ledger (docs/design.md §6)."""
