"""The `--secure` mode of tools/kafka_local.py: SASL/SCRAM-SHA-512 and StandardAuthorizer ACLs.

Three principals, with passwords generated per instance into `<instance>/credentials.json`
(mode 0600) and written into the KRaft metadata at format time:

- `admin`: super user; creates topics and ACLs (what an operator's tooling would hold).
- `engine`: reads the input topics and its own changelog (restore), writes `decisions`,
  `changelog` and `dead-letters`, uses its consumer group and transactional ids.
- `runner`: writes `intents`, `acks`, `resumes`, reads `decisions` with its client groups;
  nothing else, so a runner cannot forge a decision or read another session's state.

The controller listener stays PLAINTEXT on 127.0.0.1 with its principal (ANONYMOUS) a super
user, which a single-node development broker needs for broker-to-controller traffic; clients
get the SASL listener's address only.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from confluent_kafka.admin import AclBinding

MECHANISM = "SCRAM-SHA-512"
USERS = ("admin", "engine", "runner")
DEFAULT_PREFIX = "reconciler."
DEFAULT_ENGINE_GROUP = "reconciler-engine"
RUNNER_GROUP_PREFIX = "reconciler-client-"
CLI_GROUP_PREFIX = "reconciler-cli-"
ACL_TIMEOUT_S = 30.0


def credentials_path(home: Path) -> Path:
    return home / "credentials.json"


def is_secure(home: Path) -> bool:
    return credentials_path(home).exists()


def ensure_credentials(home: Path) -> dict[str, str]:
    path = credentials_path(home)
    if path.exists():
        return read_credentials(home)
    home.mkdir(parents=True, exist_ok=True)
    creds = {user: secrets.token_urlsafe(18) for user in USERS}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(creds, out)
    return creds


def read_credentials(home: Path) -> dict[str, str]:
    loaded: dict[str, str] = json.loads(credentials_path(home).read_text())
    return loaded


def client_config(home: Path, user: str) -> dict[str, str]:
    """librdkafka settings that log in as one of the instance's principals."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": read_credentials(home)[user],
    }


def broker_settings(home: Path, port: int, controller_port: int) -> dict[str, str]:
    admin_password = read_credentials(home)["admin"]
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{admin_password}";'
    )
    return {
        "listeners": f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": (
            f"SASL_PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}"
        ),
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": jaas,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin;User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }


def format_args(home: Path) -> list[str]:
    args: list[str] = []
    for user, password in read_credentials(home).items():
        args += ["--add-scram", f"{MECHANISM}=[name={user},password={password}]"]
    return args


def acl_bindings(
    prefix: str = DEFAULT_PREFIX, engine_group: str = DEFAULT_ENGINE_GROUP
) -> list[AclBinding]:
    """The ACLs of the engine and runner principals for one topic prefix and engine group.

    The README's "Security" section gives the same list as kafka-acls.sh commands.
    """
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    allow = AclPermissionType.ALLOW
    topic, group, txn = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    op = AclOperation
    rules: list[tuple[str, ResourceType, str, ResourcePatternType, AclOperation]] = []
    for name in ("intents", "acks", "resumes"):
        rules.append(("engine", topic, prefix + name, literal, op.READ))
        rules.append(("runner", topic, prefix + name, literal, op.WRITE))
    rules += [
        ("engine", topic, prefix + "changelog", literal, op.READ),  # restore
        ("engine", topic, prefix + "changelog", literal, op.WRITE),
        ("engine", topic, prefix + "decisions", literal, op.WRITE),
        ("engine", topic, prefix + "dead-letters", literal, op.WRITE),
        # `reconciler run` checks the topic layout (partitions, cleanup.policy) at start.
        ("engine", topic, prefix, prefixed, op.DESCRIBE_CONFIGS),
        ("engine", group, engine_group, literal, op.READ),
        # The restore consumer only assigns, but librdkafka still looks up its group.
        ("engine", group, f"restore-{prefix}changelog", literal, op.READ),
        ("engine", txn, engine_group + "-", prefixed, op.WRITE),
        ("runner", topic, prefix + "decisions", literal, op.READ),
        ("runner", group, RUNNER_GROUP_PREFIX, prefixed, op.READ),
    ]
    return [
        AclBinding(kind, name, pattern, f"User:{user}", "*", operation, allow)
        for user, kind, name, pattern, operation in rules
    ]


def create_acls(
    home: Path,
    bootstrap: str,
    prefix: str = DEFAULT_PREFIX,
    engine_group: str = DEFAULT_ENGINE_GROUP,
) -> None:
    """Create the ACLs as `admin` (idempotent: an existing binding is not an error), and
    return once the broker's authorizer answers with all of them: it applies new ACLs from
    the metadata log asynchronously, and a client right after creation could still be denied."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, **client_config(home, "admin")})
    wanted = acl_bindings(prefix, engine_group)
    for future in admin.create_acls(wanted).values():
        future.result(timeout=ACL_TIMEOUT_S)
    # None matches any name, principal and host (the stubs only allow str).
    anything: Any = None
    every = AclBindingFilter(
        ResourceType.ANY,
        anything,
        ResourcePatternType.ANY,
        anything,
        anything,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    deadline = time.monotonic() + ACL_TIMEOUT_S
    while True:
        present = set(admin.describe_acls(every).result(timeout=ACL_TIMEOUT_S))
        missing = [binding for binding in wanted if binding not in present]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} ACLs not visible after {ACL_TIMEOUT_S:.0f}s")
        time.sleep(0.2)
