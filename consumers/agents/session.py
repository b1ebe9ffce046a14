"""openai-agents integration: a Session wrapper that makes every append reconcilable.

`ReconciledSession` wraps any SDK `Session`. Each ``add_items`` call:

1. reads the tail the SDK just read (``len(items) + 1`` items) and publishes a REGISTER intent
   with those ``before`` digests, waiting until it is durable (acks=all): the engine knows the
   write before the Session is touched, even if the process dies before the app saves a
   checkpoint;
2. appends through the wrapped Session;
3. publishes the acknowledgement: COMMITTED after success, UNKNOWN when the append raised
   (the outcome is hidden), NOT_WRITTEN when the store says nothing was written
   (`AppendNotWrittenError`: a stale fence or a rolled-back transaction).

After a restore, `consumers.agents.resume.resume_from_checkpoint` asks the engine and calls
`adopt`: a grant hands this wrapper the fence token (claimed in a fencing store at once); a
withholding makes every later append raise `ContinuationWithheldError` before anything is sent.

Held batches (openai-agents' held pending write: output guardrails with a non-default
``tool_use_behavior``): `checkpoint` registers them as HELD intents; the append that settles
them (held items first) is published as their RELEASE.

Not covered: ``pop_item`` and ``clear_session`` pass through without intents.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING, Any

from agents.items import TResponseInputItem
from agents.memory import OpenAIConversationsSession
from agents.memory.session import Session, SessionABC
from agents.run_state import CURRENT_SCHEMA_VERSION

from consumers.checkpoint import Checkpoint, CheckpointCause
from consumers.client import ReconcilerApi
from consumers.errors import (
    AppendNotWrittenError,
    ContinuationWithheldError,
    NotResumedError,
    PublishError,
)
from consumers.outcomes import AppendOnce, ResumeOutcome, Withheld
from consumers.sdk_checkpoint import PENDING_WRITE_KEY
from engine.core.digest import digests
from engine.core.events import AckOutcome, Binding, IntentKind

if TYPE_CHECKING:
    from agents.run_state import RunState

log = logging.getLogger(__name__)

CONVERSATIONS_CHUNK = 20
"""Items per request when OpenAIConversationsSession appends (SDK 0.24.0)."""


class ReconciledSession(SessionABC):
    """An SDK Session whose appends are registered with the reconciler before they happen."""

    def __init__(
        self,
        inner: Session,
        client: ReconcilerApi,
        *,
        backend_id: str,
        namespace: str = "default",
        ignore_ids: bool | None = None,
        restored: bool = False,
    ) -> None:
        """``restored=True`` for a runner built from a checkpoint: it may not append until a
        resume through the reconciler granted it authority."""
        self.inner = inner
        self.client = client
        self.session_id = inner.session_id
        self.session_settings = inner.session_settings
        conversations = isinstance(inner, OpenAIConversationsSession)
        ignore = (
            conversations or bool(getattr(inner, "_ignore_ids_for_matching", False))
            if ignore_ids is None
            else ignore_ids
        )
        # Read by the SDK (same attribute name) so its digests and ours use one ids policy.
        self._ignore_ids_for_matching = ignore
        self.binding = Binding(
            backend_id=backend_id,
            namespace=namespace,
            ignore_ids=ignore,
            store_enforces_fence=bool(getattr(inner, "store_enforces_fence", False)),
            # Conversations splits an append into requests of 20 items: prefixes can land.
            chunk_size=CONVERSATIONS_CHUNK if conversations else None,
            # The label this SDK writes into every checkpoint it saves.
            checkpoint_schema_version=CURRENT_SCHEMA_VERSION,
            # Conversations stores what the server makes of an item (ids, status): its stored
            # items need not digest like the appended ones. Other stores may say so themselves.
            items_digest_stable=(
                not conversations and bool(getattr(inner, "items_digest_stable", True))
            ),
        )
        self.sequence = -1
        self.fence_token: int | None = None
        self.open_intent_id: str | None = None
        self._granted_append: tuple[str, list[str]] | None = None
        # A held batch (the SDK parked it in the RunState, not the Session): its intent id and
        # digests; the append that settles it is published as its RELEASE.
        self._held: tuple[str, list[str]] | None = None
        self._withheld: Withheld | None = None
        self._awaiting_grant = restored
        self.appends = 0

    # --- the Session protocol ------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The wrapped Session's items (reads need no authority)."""
        return await self.inner.get_items(limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Register a durable intent, append through the wrapped Session, then acknowledge the
        outcome (COMMITTED, NOT_WRITTEN or UNKNOWN). Refused without continuation authority."""
        if not items:
            await self.inner.add_items(items)
            return
        self._require_authority()
        batch = list(items)
        tail = await self.inner.get_items(limit=len(batch) + 1)
        batch_digests = digests(batch, ignore_ids=self.binding.ignore_ids)
        kind, reuse = IntentKind.REGISTER, None
        held = self._held
        if held is not None and batch_digests[: len(held[1])] == held[1]:
            # The SDK settles the held batch ahead of the resolved items in one append.
            kind, reuse = IntentKind.RELEASE, held[0]
        elif self._granted_append is not None and self._granted_append[1] == batch_digests:
            # The SDK appending a granted batch re-arms the granted intent, not a new one.
            reuse = self._granted_append[0]
        self._granted_append = None
        sequence = self.sequence + 1
        intent_id = await asyncio.to_thread(
            lambda: self.client.register_intent(
                session_id=self.session_id,
                binding=self.binding,
                items=batch,
                before_tail=tail,
                sequence=sequence,
                fence_token=self.fence_token,
                intent_id=reuse,
                kind=kind,
            )
        )
        if kind is IntentKind.RELEASE:
            self._held = None
        self.sequence = sequence
        self.open_intent_id = intent_id
        try:
            await self.inner.add_items(items)
        except AppendNotWrittenError:  # the store says so: a stale fence or a rollback
            await self._ack(intent_id, AckOutcome.NOT_WRITTEN)
            raise
        except BaseException:
            await self._ack(intent_id, AckOutcome.UNKNOWN)
            raise
        self.appends += 1
        await self._ack(intent_id, AckOutcome.COMMITTED)
        self.open_intent_id = None

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the wrapped Session's last item (passed through, not reconciled)."""
        return await self.inner.pop_item()

    async def clear_session(self) -> None:
        """Clear the wrapped Session (not reconciled)."""
        await self.inner.clear_session()

    # --- reconciler side -----------------------------------------------------------------

    async def _ack(self, intent_id: str, outcome: AckOutcome) -> None:
        try:
            await asyncio.to_thread(
                lambda: self.client.acknowledge(
                    session_id=self.session_id,
                    intent_id=intent_id,
                    outcome=outcome,
                    fence_token=self.fence_token,
                    ignore_ids=self.binding.ignore_ids,
                )
            )
        except PublishError:
            # The intent is durable; without the ack the engine classifies from the tail on the
            # next resume, which is the lost-ack case it handles. Failing the append here would
            # misreport a write that landed.
            log.warning("ack %s for intent %s not delivered", outcome.value, intent_id)

    def _require_authority(self) -> None:
        if self._withheld is not None:
            decision = self._withheld.decision
            raise ContinuationWithheldError(
                session_id=self.session_id,
                request_id=decision.in_reply_to,
                reason=self._withheld.reason,
                holder=self._withheld.holder,
                operator_action=self._withheld.operator_action,
            )
        if self._awaiting_grant:
            raise NotResumedError(session_id=self.session_id)

    def checkpoint(self, state: RunState[Any, Any]) -> Checkpoint:
        """The envelope to store for ``state`` (instead of ``state.to_json()`` alone).

        When the RunState holds a held batch the SDK never showed the Session, this registers it
        as a HELD intent first (blocking until durable), so the engine knows it before the
        checkpoint exists. Call it after every run, completed ones too: a held batch the SDK
        dropped without settling it (a detached run) is reported to the engine as DISCARD.
        """
        run_state = state.to_json()
        record = run_state.get(PENDING_WRITE_KEY)
        pending = self.open_intent_id if record is not None else None
        if record is not None and record.get("held") is True:
            pending = self._register_held(record["items"], record["persisted_count"])
        elif self._held is not None:
            self._discard_held()
        last = self.client.last_published(self.session_id)
        return Checkpoint(
            checkpoint_id=uuid.uuid4().hex,
            session_id=self.session_id,
            sequence=self.sequence,
            pending_intent_id=pending,
            after=[] if last is None else [CheckpointCause(producer=last.producer, seq=last.seq)],
            run_state=run_state,
        )

    def _register_held(self, items: list[dict[str, Any]], persisted_count: int) -> str:
        held_digests = digests(items, ignore_ids=self.binding.ignore_ids)
        if self._held is not None and self._held[1] == held_digests:
            return self._held[0]  # already registered (a second checkpoint of the same park)
        self._require_authority()
        sequence = self.sequence + 1
        intent_id = self.client.register_intent(
            session_id=self.session_id,
            binding=self.binding,
            items=items,
            before_tail=None,
            sequence=sequence,
            fence_token=self.fence_token,
            kind=IntentKind.HELD,
            persisted_count=persisted_count,
        )
        self.sequence = sequence
        self._held = (intent_id, held_digests)
        return intent_id

    def _discard_held(self) -> None:
        """The SDK dropped the held batch without settling it through this Session (a detached
        run): tell the engine, which alerts, since the batch's calls and outputs are lost."""
        held, self._held = self._held, None
        if held is None:
            return
        sequence = self.sequence + 1
        self.client.register_intent(
            session_id=self.session_id,
            binding=self.binding,
            items=[],
            before_tail=None,
            sequence=sequence,
            fence_token=self.fence_token,
            intent_id=held[0],
            kind=IntentKind.DISCARD,
            # Whether the approved tools ran is not visible here; a false alarm beats a
            # silent loss.
            tools_ran=True,
        )
        self.sequence = sequence

    def adopt(self, outcome: ResumeOutcome, checkpoint: Checkpoint) -> None:
        """Take on the engine's answer to a resume of ``checkpoint`` (blocking: SQLite I/O)."""
        if isinstance(outcome, Withheld):
            self._withheld = outcome
            return
        self._withheld = None
        self._awaiting_grant = False
        self.sequence = max(self.sequence, checkpoint.sequence)
        self.open_intent_id = checkpoint.pending_intent_id
        token = outcome.fence_token
        if token is not None:
            self.fence_token = token
            claim = getattr(self.inner, "claim_fence", None)
            if callable(claim):
                claim(token)
        write = checkpoint.run_state.get(PENDING_WRITE_KEY)
        if write is not None and write.get("held") is True and checkpoint.pending_intent_id:
            self._held = (
                checkpoint.pending_intent_id,
                digests(write["items"], ignore_ids=self.binding.ignore_ids),
            )
        if isinstance(outcome, AppendOnce) and checkpoint.pending_intent_id and write is not None:
            self._granted_append = (
                checkpoint.pending_intent_id,
                digests(write["items"], ignore_ids=self.binding.ignore_ids),
            )
