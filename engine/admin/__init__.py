"""Operator commands, one module per job: `topics` (create, verify), `explain`, `repair`.

They run in the operator's shell, never inside the engine loop, and raise `EngineError` with a
cause and a fix on anything they cannot do.
"""
