"""The commit protocol (COMMIT_PROTOCOL.md): one `Commit` per transaction, its status table,
the producer's classified calls (`Transactions`), the steps around them (`Committer`) and A0."""
