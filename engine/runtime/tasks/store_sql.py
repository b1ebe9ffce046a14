"""The SQL of the local store (store.py): its schema and the statements of its writes."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    state BLOB NOT NULL,
    pending_status TEXT,        -- status of an unresolved pending write, else NULL
    pending_since_ms INTEGER,   -- event time it became unresolved
    health TEXT,                -- AMBIGUOUS or VIOLATED, else NULL (CLEAR)
    park_deadline_ms INTEGER    -- watermark answering its earliest parked resume, else NULL
);
CREATE INDEX IF NOT EXISTS sessions_pending ON sessions(pending_status)
    WHERE pending_status IS NOT NULL;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
# An upsert updates a stored row in place; INSERT OR REPLACE deleted it and inserted it again,
# index entries included: ~2x the CPU per changed session (7-10 against 16-21 us per row, 150-row
# commits into 4,000 stored sessions).
UPSERT = (
    "INSERT INTO sessions(session_id, state, pending_status, pending_since_ms, health,"
    " park_deadline_ms) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET"
    " state = excluded.state, pending_status = excluded.pending_status,"
    " pending_since_ms = excluded.pending_since_ms, health = excluded.health,"
    " park_deadline_ms = excluded.park_deadline_ms"
)
SET_OFFSET = "INSERT OR REPLACE INTO meta(key, value) VALUES ('changelog_offset', ?)"
SET_OFFSET_AND_WATERMARK = (
    "INSERT INTO meta(key, value) VALUES ('changelog_offset', ?), ('watermark', ?)"
    " ON CONFLICT(key) DO UPDATE SET value = CASE WHEN key = 'watermark'"
    " THEN MAX(value, excluded.value) ELSE excluded.value END"
)
