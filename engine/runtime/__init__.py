"""The Kafka runtime: exactly-once consume-fold-produce around the pure core.

Read COMMIT_PROTOCOL.md first: it fixes the order in which state, outputs and offsets become
durable, and every crash test refers to its numbered steps.
"""
