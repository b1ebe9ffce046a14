"""The Kafka runtime: exactly-once consume-fold-produce around the pure core.

Read commit/COMMIT_PROTOCOL.md first: it fixes the order in which state, outputs and offsets
become durable, and every crash test refers to its numbered steps. The parts, composed (no
runtime class inherits from another):

- `engine.py`: the process's outer loop (clients, rejoin backoff, stop); `loop.py`: one
  iteration of steps 1-6 per pass; `rebalance.py`: A0-A3, revoke and lost; `fold_step.py`:
  step 2 for one record; `parts.py`: what they share; `clients.py`: the Kafka clients.
- `commit/`: `Commit` (one per transaction, steps 1-6 as methods, a checked status table),
  `Transactions` (the producer's classified calls), `Committer` (what surrounds the steps).
- `tasks/`: a partition task and its lifecycle, its SQLite store, the changelog restore.
- `intake/`: consume, decode and time-order the inputs.
- `process/`: supervisor, watchdog, metrics and health endpoints, memory, tracing.
"""
